"""``python -m fusegraph bench overhead [--layers N] [--threads T] [--rounds R]``

The per-call cost of calling through ``torch.compile`` on the graph routes, and where it goes. The model is N
``Linear(8, 8)`` layers on one row (2N parameters, almost no compute), so a call's time is mostly overhead; each
variant is timed in interleaved rounds (the minimum and the median of the rounds' per-call means):

- eager; Dynamo with a backend that returns the graph's own ``forward`` (Dynamo's frame evaluation and guards);
  plain ``torch.compile`` (Inductor);
- fusegraph's graph route (``graph_with_compile``: the parameters are inputs the host graph binds), and under
  ``torch.compiler.set_stance(skip_guard_eval_unsafe=True)`` (Dynamo skips its guards but the ones that tell
  compiled graphs apart);
- ``GraphRunner`` on the module (no Dynamo at all: the same capture, fused before it).

Graph route minus GraphRunner is what calling through torch.compile costs per call; the skip-guards row shows how
much of it is Dynamo's guards.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from .timing import machine_summary


def main(argv=None) -> int:
    import fusegraph

    p = argparse.ArgumentParser(prog="python -m fusegraph bench overhead", description=__doc__.split("\n\n")[1])
    p.add_argument("--layers", type=int, default=100)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--calls", type=int, default=20, help="calls per variant per round")
    args = p.parse_args(argv)
    if args.layers < 1 or args.rounds < 1 or args.calls < 1:
        p.error(f"--layers, --rounds and --calls must be >= 1, got {args.layers}, {args.rounds}, {args.calls}")
    saved = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        torch.compiler.reset()
        model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(args.layers)]).eval()
        x = torch.randn(1, 8)
        route = torch.compile(model, backend=fusegraph.Backend({"graph_with_compile": True}))
        dynamo_only = torch.compile(model, backend=lambda gm, example_inputs: gm.forward)
        inductor = torch.compile(model)
        runner = fusegraph.graph.GraphRunner(model)

        def skip_guards():
            with torch.compiler.set_stance(skip_guard_eval_unsafe=True):
                return route(x)

        variants = {
            "eager": lambda: model(x),
            "Dynamo, graph's own forward": lambda: dynamo_only(x),
            "torch.compile (Inductor)": lambda: inductor(x),
            "fusegraph graph route": lambda: route(x),
            "  skip_guard_eval_unsafe": skip_guards,
            "GraphRunner (no Dynamo)": lambda: runner(x),
        }
        with torch.no_grad():
            want = model(x)
            for name, fn in variants.items():
                for _ in range(3):
                    out = fn()
                torch.testing.assert_close(out, want, msg=lambda m: f"{name}: {m}")
            times = {k: [] for k in variants}
            for _ in range(args.rounds):
                for name, fn in variants.items():
                    t0 = time.perf_counter()
                    for _ in range(args.calls):
                        fn()
                    times[name].append((time.perf_counter() - t0) / args.calls)
        print(f"fusegraph bench overhead: {args.layers} x Linear(8, 8) on one row ({2 * args.layers} parameters), "
              f"{args.rounds} interleaved rounds of {args.calls} calls")
        print(f"# {machine_summary('cpu')}")
        print(f"{'variant':32s} {'min':>10s} {'median':>10s}")
        for name, ts in times.items():
            print(f"{name:32s} {min(ts) * 1e6:8.1f}us {statistics.median(ts) * 1e6:8.1f}us")
        med = {k: statistics.median(v) for k, v in times.items()}
        lo = {k: min(v) for k, v in times.items()}
        route_s, runner_s, skip_s = "fusegraph graph route", "GraphRunner (no Dynamo)", "  skip_guard_eval_unsafe"
        print(f"# per call through torch.compile (graph route - GraphRunner): "
              f"{(lo[route_s] - lo[runner_s]) * 1e6:.1f} us (min), {(med[route_s] - med[runner_s]) * 1e6:.1f} us "
              f"(median); of it Dynamo's guards (graph route - skip_guard_eval_unsafe): "
              f"{(lo[route_s] - lo[skip_s]) * 1e6:.1f} us (min)")
    finally:
        torch.set_num_threads(saved)
    return 0


if __name__ == "__main__":
    sys.exit(main())
