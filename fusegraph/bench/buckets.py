"""``python -m fusegraph bench buckets``: batch sizes 1..8 through GraphRunner with batch buckets (1, 2, 4, 8),
without buckets (a graph per batch size), and eager. 1 thread; median over interleaved rounds of one sweep
(B = 1..8, one call each); the first sweep (the captures) reported apart.

    OMP_NUM_THREADS=1 python -m fusegraph bench buckets [--rounds 50] [--device cpu] [--seq 4] [--dim 512]
"""
import argparse
import statistics
import time

import torch
import torch.nn as nn
import torch.nn.functional as F

from fusegraph.bench.timing import synchronize
from fusegraph.graph import GraphRunner


class Block(nn.Module):
    """A row-independent decode-step-like block: RMSNorm -> Linear -> tanh-GELU -> Linear, residual."""

    def __init__(self, d=512, h=2048):
        super().__init__()
        self.norm, self.up, self.down = nn.RMSNorm(d), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x)), approximate="tanh"))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fusegraph bench buckets")
    ap.add_argument("--rounds", type=int, default=50)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--seq", type=int, default=4)
    ap.add_argument("--dim", type=int, default=512)
    a = ap.parse_args(argv)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dev = torch.device(a.device)
    m = Block(a.dim, 4 * a.dim).eval().to(dev)
    inputs = {b: torch.randn(b, a.seq, a.dim, device=dev) for b in range(1, 9)}
    runners = {"buckets": GraphRunner(m, {"graph_batch_buckets": (1, 2, 4, 8)}), "per-size": GraphRunner(m)}
    modes = {"eager": m, **runners}

    def sweep(fn):
        synchronize(dev)
        t0 = time.perf_counter()
        for b in range(1, 9):
            fn(inputs[b])
        synchronize(dev)
        return time.perf_counter() - t0

    with torch.no_grad():
        first = {name: sweep(fn) for name, fn in modes.items()}  # includes the captures
        times = {name: [] for name in modes}
        for _ in range(a.rounds):
            for name, fn in modes.items():
                times[name].append(sweep(fn))
    print(f"device {dev}, threads {torch.get_num_threads()}, x [B, {a.seq}, {a.dim}], batch sizes 1..8, "
          f"median of {a.rounds} interleaved rounds")
    print(f"{'mode':10s} {'captures':>8s} {'first sweep ms':>15s} {'sweep us':>10s} {'per call us':>12s}")
    for name in modes:
        caps = runners[name].stats.graphs_captured if name in runners else 0
        med = statistics.median(times[name])
        print(f"{name:10s} {caps:8d} {first[name] * 1e3:15.1f} {med * 1e6:10.0f} {med * 1e6 / 8:12.1f}")
    for name, r in runners.items():
        s = r.stats
        print(f"{name}: replays {s.replays}, padded calls {s.bucket_padded_calls}, overflows {s.bucket_overflows}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
