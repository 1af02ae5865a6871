"""Which prefetch hint the few-row kernel (``fusegraph.gemv``) reads the weight fastest with on this CPU.

Each hint runs in a process of its own (``FUSEGRAPH_GEMV_PREFETCH`` is read once per process), ROUNDS rounds in
turn; each line is one process: the median of 15 calls per shape, as GB/s of weight read (weight bytes / time).
The default (no variable) is the hint csrc/ops/cpu/gemv_kernel.cpp picks for the CPU. BENCHMARKS §1.7.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/gemv_prefetch_hints.py [--rounds 3] [--hints default,nta,t0,t1,t2,none]
"""
import argparse
import os
import subprocess
import sys

# (dtype, rows, in, out): FLUX.1's bf16 and fp32 modulation (1 x 3072 -> 18432), a few-row FFN, Wan 2.1's FFN at
# 8 rows, a 2-row projection from a wide input
SHAPES = (("bfloat16", 1, 3072, 18432), ("float32", 1, 3072, 18432), ("bfloat16", 4, 3072, 12288),
          ("bfloat16", 8, 1536, 8960), ("float32", 2, 12288, 3072))

_CHILD = """
import statistics, sys, time, torch, fusegraph
torch.set_num_threads(1)
g = torch.Generator().manual_seed(0)
rates = []
for dt, m, k, n in SHAPES:
    dt = getattr(torch, dt)
    w, x, b = (torch.randn(*s, generator=g).to(dt) for s in ((n, k), (m, k), (n,)))
    ts = []
    for _ in range(15):
        t = time.perf_counter()
        torch.ops.fusegraph.gemv(x, w, b)
        ts.append(time.perf_counter() - t)
    rates.append(w.numel() * w.element_size() / statistics.median(ts) / 1e9)
print(" ".join(f"{r:6.1f}" for r in rates))
"""


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--hints", default="default,nta,t0,t1,t2,none")
    args = p.parse_args()
    print("GB/s of weight read, one process per line; shapes (dtype rows x in x out): "
          + ", ".join(f"{d} {m}x{k}x{n}" for d, m, k, n in SHAPES))
    for _ in range(args.rounds):
        for hint in args.hints.split(","):
            env = dict(os.environ)
            env.pop("FUSEGRAPH_GEMV_PREFETCH", None)
            if hint != "default":
                env["FUSEGRAPH_GEMV_PREFETCH"] = hint
            out = subprocess.run([sys.executable, "-c", f"SHAPES = {SHAPES!r}\n" + _CHILD], env=env,
                                 capture_output=True, text=True, check=True).stdout.strip()
            print(f"{hint:8s} {out}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
