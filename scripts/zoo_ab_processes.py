"""A zoo model's speed under plain Inductor and fusegraph's default, one compiled variant per process.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/zoo_ab_processes.py WanAnimateTransformer3DModel [ROUNDS]

``bench zoo`` times both variants in one process, interleaved. Both are compiled on the same ``forward``, and
Dynamo keeps its compiled entries per code object, newest first: every call of the variant compiled first
runs the other's guards and fails them before its own hit. On a model of a few ms with many inputs that is a
few percent (WanAnimate, 134 graph inputs: the first-compiled variant 0.92x the other with fusegraph compiled
first, 1.015x with Inductor first). Here each variant runs alone in a fresh process (its first call compiles,
10 warm calls, then 300 timed calls; median), processes alternating ROUNDS times (default 3), so the machine's
drift hits both alike. Prints each process's median and the ratio of the medians over the rounds.
"""
import statistics
import subprocess
import sys
import time

VARIANTS = ("inductor", "fusegraph")


def _one(name: str, variant: str) -> float:
    import torch

    from fusegraph import Backend, CompilationConfig, zoo

    torch.set_num_threads(1)
    model, kw = zoo.build(name)
    fn = torch.compile(model) if variant == "inductor" else \
        torch.compile(model, backend=Backend(CompilationConfig()))
    with torch.no_grad():
        for _ in range(10):
            fn(**kw)
        ts = []
        for _ in range(300):
            t0 = time.perf_counter()
            fn(**kw)
            ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main(argv) -> int:
    if len(argv) >= 3 and argv[0] == "--one":
        print(f"{_one(argv[1], argv[2]):.9f}")
        return 0
    if not argv:
        print(__doc__)
        return 2
    name, rounds = argv[0], int(argv[1]) if len(argv) > 1 else 3
    med = {v: [] for v in VARIANTS}
    for r in range(rounds):
        for v in (VARIANTS if r % 2 == 0 else VARIANTS[::-1]):
            out = subprocess.run([sys.executable, __file__, "--one", name, v], capture_output=True, text=True)
            if out.returncode != 0:
                print(f"{v}: failed: {(out.stderr.strip().splitlines() or ['?'])[-1]}")
                return 1
            med[v].append(float(out.stdout.strip().splitlines()[-1]))
            print(f"round {r + 1} {v:10s} {med[v][-1] * 1e3:.3f} ms", flush=True)
    a, b = statistics.median(med["inductor"]), statistics.median(med["fusegraph"])
    print(f"{name}: Inductor {a * 1e3:.3f} ms, fusegraph {b * 1e3:.3f} ms: fusegraph {a / b:.3f}x Inductor "
          f"(medians of {rounds} processes each)")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
