"""First call (compile) and warm call time of ``bench real``'s fp32 Wan 2.1 (or another model) under fusegraph, with
Inductor's C++ wrapper forced on (``cpp``: ``CPP_WRAPPER_MAX_OPS`` lifted), with its Python wrapper (``py``), and
plain Inductor (``inductor``), at a given depth. Run each in a fresh process on an empty Inductor cache:

    for m in cpp py; do TORCHINDUCTOR_CACHE_DIR=$(mktemp -d) OMP_NUM_THREADS=1 \\
        .venv/bin/python scripts/wrapper_compile_time.py --layers 4 --mode $m; done

(docs/BENCHMARKS.md §2: why graphs of more than ``CPP_WRAPPER_MAX_OPS`` ops take the Python wrapper.)
"""
import argparse
import statistics
import time

import torch

import fusegraph.pipeline
from fusegraph import Backend, CompilationConfig
from fusegraph.bench.real import build


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="wan")
    p.add_argument("--layers", type=int, default=1, help="bench real's --layers (Wan: 2 blocks each)")
    p.add_argument("--mode", choices=("cpp", "py", "inductor"), required=True)
    args = p.parse_args()
    torch.set_num_threads(1)
    model, inputs, _ = build(args.model, torch.float32, layers=args.layers)
    if args.mode == "inductor":
        fn = torch.compile(model)
    else:
        fusegraph.pipeline.CPP_WRAPPER_MAX_OPS = 1 << 30  # the C++ wrapper at any size (cpp); or never (py)
        fn = torch.compile(model, backend=Backend(CompilationConfig(cpp_wrapper=args.mode == "cpp")))
    with torch.no_grad():
        t = time.perf_counter()
        fn(**inputs)
        first = time.perf_counter() - t
        times = []
        for _ in range(3):
            t = time.perf_counter()
            fn(**inputs)
            times.append(time.perf_counter() - t)
    print(f"{args.model} --layers {args.layers} {args.mode}: first call {first:.1f} s, warm "
          f"{statistics.median(times) * 1e3:.1f} ms", flush=True)


if __name__ == "__main__":
    main()
