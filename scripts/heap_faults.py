"""Speed and minor page faults per call of one ``bench real`` variant, in a process of its own: what a call of a
compiled model re-faults because glibc's malloc returned it to the system since the last call (it trims the top of
its heap when a free leaves more than its trim threshold there, and maps large requests afresh). One line:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/heap_faults.py --model wan --variant "fusegraph:enable_linear=False"
    # glibc told to keep what it frees (no trim, no fresh mappings below 256 MiB):
    MALLOC_MMAP_THRESHOLD_=268435456 MALLOC_TRIM_THRESHOLD_=536870912 OMP_NUM_THREADS=1 \\
        .venv/bin/python scripts/heap_faults.py --model wan --variant fusegraph

(docs/BENCHMARKS.md §1.4: where the Intel float32 kernel choice's whole-model gain came from.)
"""
import argparse
import resource
import statistics
import time

import torch

from fusegraph.bench import real


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="wan", choices=sorted(real.MODELS))
    p.add_argument("--variant", default="fusegraph")
    p.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    p.add_argument("--calls", type=int, default=6)
    p.add_argument("--layers", type=int, default=1, help="blocks of each kind, as bench real --layers")
    args = p.parse_args()
    torch.set_num_threads(1)
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model, inputs, _ = real.build(args.model, dtype, layers=args.layers)
    with torch.no_grad():
        fn = real._make_fn(model, inputs, dtype, args.variant, 1)
        for _ in range(3):  # compile and warm up
            fn(**inputs)
        r0 = resource.getrusage(resource.RUSAGE_SELF)
        times = []
        for _ in range(args.calls):
            t = time.perf_counter()
            fn(**inputs)
            times.append(time.perf_counter() - t)
        r1 = resource.getrusage(resource.RUSAGE_SELF)
    print(f"{args.model} {args.dtype} x{args.layers} {args.variant}: resident {real._rss_mib():.0f} MiB, median "
          f"{statistics.median(times) * 1e3:.1f} ms, minor faults {(r1.ru_minflt - r0.ru_minflt) / args.calls:.0f} "
          f"a call", flush=True)


if __name__ == "__main__":
    main()
