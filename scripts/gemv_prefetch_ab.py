"""fusegraph.gemv against addmm (what eager calls) on 1 and 8 rows at published widths, per dtype, interleaved
medians, 1 thread; ratio = addmm time / gemv time. Run under a CPU class's caps to see that class:

    OMP_NUM_THREADS=1 .venv/bin/python scripts/gemv_prefetch_ab.py
    OMP_NUM_THREADS=1 ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        .venv/bin/python scripts/gemv_prefetch_ab.py

(docs/BENCHMARKS.md §1.3: the few-row kernel's prefetch hint on Intel, and the few-row table.)
"""
import statistics
import time

import torch

import fusegraph  # noqa: F401  (registers fusegraph.gemv)
from fusegraph._core import cpu_class

SHAPES = ((3072, 3072), (3072, 12288), (12288, 3072), (1536, 8960), (2048, 2048), (4096, 4096))  # (in, out)


def medians(fns: dict, reps: int = 15) -> dict:
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(t) for name, t in times.items()}


def main() -> None:
    torch.set_num_threads(1)
    print(cpu_class.key())
    g = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for m in (1, 8):
            for k, n in SHAPES:
                x = torch.randn(m, k, generator=g).to(dtype)
                w = (torch.randn(n, k, generator=g) * k ** -0.5).to(dtype)
                b = torch.randn(n, generator=g).to(dtype)
                r = medians({"aten": lambda: torch.addmm(b, x, w.t()),
                             "gemv": lambda: torch.ops.fusegraph.gemv(x, w, b)})
                print(f"{str(dtype)[6:]:9s} m={m} {k}x{n}: aten {r['aten'] * 1e3:7.3f} ms gemv "
                      f"{r['gemv'] * 1e3:7.3f} ms ratio {r['aten'] / r['gemv']:.2f}", flush=True)


if __name__ == "__main__":
    main()
