"""Per-call cost of the frozen-graph guard (FrozenGraph.__call__ around a no-op) for 100 and 1,000 parameters, with and
without weight copies. Usage: OMP_NUM_THREADS=1 .venv/bin/python scripts/bench_frozen_guard.py"""
import time, torch
from fusegraph import freezing
class B:  # stand-in backend: never re-compiles here
    stats = None
for n in (100, 1000):
    params = {i: torch.nn.Parameter(torch.randn(16)) for i in range(n)}
    args = tuple(params[i] for i in range(n)) + (torch.randn(2),)
    for copies in (False, True):
        g = freezing.FrozenGraph(B(), None, None, params, lambda *a: None, 0, copies=copies)
        for _ in range(1000): g(*args)
        ts = []
        for _ in range(21):
            t = time.perf_counter()
            for _ in range(1000): g(*args)
            ts.append((time.perf_counter() - t) / 1000)
        base = []
        f = lambda *a: None
        for _ in range(21):
            t = time.perf_counter()
            for _ in range(1000): f(*args)
            base.append((time.perf_counter() - t) / 1000)
        print(f"{n} params copies={copies}: {sorted(ts)[10]*1e6:.2f} us per call ({sorted(base)[10]*1e6:.2f} us for a plain call with those args)")
