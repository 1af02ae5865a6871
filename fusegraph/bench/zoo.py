"""``python -m fusegraph bench zoo [--models A,B,...] [--reps N] [--threads T] [--json PATH]``

The zoo table (docs/BENCHMARKS.md): every tiny diffusers transformer of ``fusegraph.zoo`` — per model and
pattern family the sites fused / present (present = fused + the candidates ``fusegraph.explain`` reports left
unfused), the graph breaks, and the steady-state time of eager, plain ``torch.compile`` (Inductor) and fusegraph's
default route (fusion + Inductor), measured round-robin after the compiles, with the fused output's max |diff|
against eager.

The tiny configs are for coverage, not speed: a few dozen tokens and hidden sizes of 16–64, so per-call
overhead dominates and the times say more about the routes than about the kernels.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from .timing import (fmt_time, format_table, interleaved_seconds, positive_int, run_facts, setup_device,
                     write_json)


def tensors(out) -> list:
    """Every output tensor of a forward (tensor, tuple/list, dict or diffusers ModelOutput, nested)."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, dict):  # ModelOutput is an OrderedDict
        return [t for v in out.values() for t in tensors(v)]
    if isinstance(out, (list, tuple)):
        return [t for v in out for t in tensors(v)]
    return []


def _max_abs_diff(out, ref) -> float:
    return max((o.float() - r.float()).abs().max().item() for o, r in zip(tensors(out), tensors(ref)))


def bench_one(name: str, reps: int) -> dict:
    """Counts from ``fusegraph.explain``, then eager / Inductor / fusegraph timed round-robin."""
    from fusegraph import Backend, CompilationConfig, explain, zoo

    model, kwargs = zoo.build(name)
    report = explain(model, **kwargs)
    row = dict(model=name, counts=report.counts(), graphs=report.graphs, graph_breaks=len(report.graph_breaks))
    torch.compiler.reset()
    backend = Backend(CompilationConfig())
    fns = {"eager": model, "inductor": torch.compile(model), "fusegraph": torch.compile(model, backend=backend)}
    with torch.no_grad():
        ref = model(**kwargs)
        for variant in ("inductor", "fusegraph"):
            t0 = time.perf_counter()
            out = fns[variant](**kwargs)
            row[f"{variant}_compile_s"] = time.perf_counter() - t0
            row[f"{variant}_max_abs_diff"] = _max_abs_diff(out, ref)
        times = interleaved_seconds({k: (lambda fn=fn: fn(**kwargs)) for k, fn in fns.items()},
                                     warmup=3, reps=reps)
    torch.compiler.reset()
    for variant, ts in times.items():
        row[f"{variant}_s"] = statistics.median(ts)
    row["fusegraph_patterns"] = dict(backend.stats.patterns)
    row["graph_choices"] = dict(backend.stats.graph_choices)
    row["fallbacks"] = dict(backend.stats.fallbacks)
    return row


def _cells(row: dict, families) -> list:
    cells = [row["model"].replace("Transformer", "T.")]
    for f in families:
        c = row["counts"][f]
        present = c["fused"] + c["unfused"]
        cells.append(f"{c['fused']}/{present}" if present else "-")
    cells.append(str(row["graph_breaks"]))
    cells += [fmt_time(row["eager_s"]), fmt_time(row["inductor_s"]), fmt_time(row["fusegraph_s"]),
              f"{row['inductor_s'] / row['fusegraph_s']:.2f}x", f"{row['inductor_max_abs_diff']:.1e}",
              f"{row['fusegraph_max_abs_diff']:.1e}"]
    return cells


def main(argv=None) -> int:
    from fusegraph import zoo
    from fusegraph.fusion import FAMILY_NAMES as FAMILIES

    p = argparse.ArgumentParser(prog="python -m fusegraph bench zoo", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", help="comma-separated class names (default: every model of fusegraph.zoo)")
    p.add_argument("--reps", type=positive_int, default=10, help="timed runs per variant (median reported)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--json", help="also write every number as JSON to this path")
    args = p.parse_args(argv)
    names = zoo.names() if not args.models else [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [n for n in names if n not in zoo.names()]
    if unknown:
        print(f"--models: unknown {unknown}; known: {', '.join(zoo.names())}", file=sys.stderr)
        return 2
    setup_device("cpu", args.threads)
    facts = run_facts("cpu")
    print(f"fusegraph bench zoo: {len(names)} models, fp32, {facts['machine']}, torch {facts['torch']}, "
          f"{facts['threads']} thread(s)")
    rows = []
    headers = ["model", *FAMILIES, "breaks", "eager", "inductor", "fusegraph", "fg vs ind", "ind |diff|",
               "fg |diff|"]
    for name in names:
        try:
            row = bench_one(name, args.reps)
        except Exception as e:  # one model's failure is a row, not the end of the table
            print(f"  {name}: FAILED ({type(e).__name__}: {e})", flush=True)
            rows.append(dict(model=name, error=f"{type(e).__name__}: {e}"))
            continue
        rows.append(row)
        print("  " + " | ".join(_cells(row, FAMILIES)), flush=True)
    ok = [r for r in rows if "error" not in r]
    print()
    print(format_table(headers, [_cells(r, FAMILIES) for r in ok]))
    total = {f: [sum(r["counts"][f]["fused"] for r in ok), sum(sum(r["counts"][f].values()) for r in ok)]
             for f in FAMILIES}
    print("all: " + "  ".join(f"{f} {a}/{b} ({100 * a / b:.1f} %)" if b else f"{f} -" for f, (a, b) in total.items()))
    if ok:
        geo = statistics.geometric_mean([r["inductor_s"] / r["fusegraph_s"] for r in ok])
        print(f"fusegraph vs Inductor, geometric mean of time ratios: {geo:.2f}x "
              f"(>1: fusegraph faster; faster on {sum(r['inductor_s'] > r['fusegraph_s'] for r in ok)} of {len(ok)})")
    if args.json:
        write_json(args.json, dict(facts=facts, rows=rows, totals=total))
    return 1 if len(ok) < len(rows) else 0


if __name__ == "__main__":
    sys.exit(main())
