"""float32 linears at the published models' shapes, MKL's ``addmm`` against ``fusegraph.linear`` (oneDNN on the
plain weight), each timed twice: warm (one weight, called over and over, as ``bench gemm`` does) and cold (a
rotation through ~1.5 GiB of weight copies, so each call reads its weight from memory, as inside a model). Medians,
the two kernels interleaved; ratio = aten / fused time.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/gemm_cold_weights.py

(docs/BENCHMARKS.md §1.4: the AMX float32 kernel choice, which whole models decided.)
"""
import statistics
import time

import torch

import fusegraph  # noqa: F401  (registers fusegraph.linear)

SHAPES = ((320, 3072, 3072), (320, 3072, 12288), (320, 12288, 3072), (320, 1536, 8960), (320, 8960, 1536),
          (320, 2432, 2432), (64, 1536, 1536), (256, 1536, 1536))
ROTATION_BYTES = 1536 << 20


def main() -> None:
    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    for m, k, n in SHAPES:
        x = torch.randn(m, k, generator=g)
        copies = max(2, ROTATION_BYTES // (n * k * 4))
        weights = [torch.randn(n, k, generator=g) * k ** -0.5 for _ in range(copies)]
        b = torch.randn(n, generator=g)
        fns = {"aten": lambda w: torch.addmm(b, x, w.t()), "fused": lambda w: torch.ops.fusegraph.linear(x, w, b)}
        warm = {name: [] for name in fns}
        cold = {name: [] for name in fns}
        for _ in range(5):
            for name, fn in fns.items():
                fn(weights[0])
                t = time.perf_counter()
                fn(weights[0])
                warm[name].append(time.perf_counter() - t)
        for r in range(max(5, copies)):
            for name, fn in fns.items():
                w = weights[(2 * r + (name == "fused")) % copies]
                t = time.perf_counter()
                fn(w)
                cold[name].append(time.perf_counter() - t)
        mw = {name: statistics.median(v) for name, v in warm.items()}
        mc = {name: statistics.median(v) for name, v in cold.items()}
        print(f"{m}x{k}x{n} ({copies} copies): warm aten {mw['aten'] * 1e3:7.2f} fused {mw['fused'] * 1e3:7.2f} "
              f"ratio {mw['aten'] / mw['fused']:.3f} | cold aten {mc['aten'] * 1e3:7.2f} fused "
              f"{mc['fused'] * 1e3:7.2f} ratio {mc['aten'] / mc['fused']:.3f}", flush=True)
        del weights


if __name__ == "__main__":
    main()
