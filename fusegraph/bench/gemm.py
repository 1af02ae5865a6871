"""``python -m fusegraph bench gemm``: a linear layer's two CPU kernels side by side, at sizes from tiny to
FLUX.1's: ``aten::addmm`` (what every torch variant calls: MKL's sgemm in float32, oneDNN in bf16/fp16) against
``fusegraph.linear`` (oneDNN's float32 matmul on the plain weight; bf16/fp16 widened to it), interleaved, medians
of warm runs. ``--calibrate`` also times float32 on a weight packed once for oneDNN (the copy ``pack_weights=True``
may make).

It is the evidence behind the linear family's rule (``fusegraph.fusion.patterns.linear``, a table per CPU class in
``fusegraph.fusion.gemm_table``): the last columns say what the fusion pass does with each size on this machine
("linear": routed to fusegraph.linear; "gemv": the few-row kernel; "addmm": left alone) and whether that is the
faster kernel here. ``--calibrate`` measures this machine's table (the published models' GEMM shapes) into the
cache directory, where the pass reads it from the next compile on; ``--ship`` writes it into the table shipped with
the package (for the developers). Run it as another CPU class with ``python -m fusegraph --cpu-class avx2 bench
gemm``.
"""
from __future__ import annotations

import argparse
import statistics

import torch
import torch.nn.functional as F

from fusegraph.bench import timing

# (rows, in, out): a tiny model's projection, decode rows, the pass's smallest site, Wan 2.1 1.3B's and FLUX.1's
SHAPES = [(8, 128, 128), (64, 64, 128), (64, 128, 512), (300, 32, 128), (9, 512, 256), (320, 128, 512),
          (4, 3072, 3072), (64, 3072, 3072), (1024, 1536, 1536), (320, 3072, 3072), (320, 3072, 12288),
          (320, 12288, 3072)]
QUICK = [(64, 128, 512), (320, 128, 512), (320, 1536, 1536)]


def _route(m, k, n, dtype) -> str:
    """What the fusion pass (default config) makes of this linear on this machine."""
    from fusegraph.config import FusionPatterns
    from fusegraph.fusion import gemm_table
    from fusegraph.fusion.patterns import gemv, linear

    if m > gemv.MAX_ROWS and m * k * n >= linear.MIN_MACS \
            and dtype in linear.routed_dtypes(FusionPatterns().enable_linear):
        return "linear"
    if m <= gemv.MAX_ROWS and n * k >= gemv.MIN_WEIGHT and gemm_table.gemv_lookup(dtype, m)[0] == "fused":
        return "gemv"
    return "addmm"


def main(argv=None) -> int:
    from fusegraph.fusion import gemm_table

    p = argparse.ArgumentParser(prog="python -m fusegraph bench gemm", description=__doc__.split("\n\n")[0])
    p.add_argument("--dtype", default=None, help="comma list of fp32, bf16, fp16 (default fp32,bf16; with "
                   "--calibrate every dtype, and a list measures only those, keeping the table's other entries)")
    p.add_argument("--quick", action="store_true", help="three shapes, few reps (a smoke run)")
    p.add_argument("--reps", type=timing.positive_int, default=None, help="timed runs per kernel (default: ~1 s of work, 5-200)")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) before timing")
    p.add_argument("--json", default=None, metavar="PATH", help="write every number (+ machine, date) here")
    p.add_argument("--calibrate", action="store_true", help="measure this CPU class's table (the published models' "
                   "GEMM shapes, every dtype) into the cache directory: the linear family's rule from then on")
    p.add_argument("--part", choices=("all",) + gemm_table.PARTS, default="all",
                   help="with --calibrate: measure the many-row linears (kernel, packing), the few-row ones "
                        "(fusegraph.gemv per row count) or both (default); the table keeps the other part")
    p.add_argument("--ship", action="store_true", help="with --calibrate: write into the shipped table "
                   "(fusegraph/fusion/gemm_cpu.json) instead")
    args = p.parse_args(argv)
    if args.ship and not args.calibrate:
        p.error("--ship: only with --calibrate")
    if args.part != "all" and not args.calibrate:
        p.error("--part: only with --calibrate")
    timing.setup_device("cpu", args.threads)
    dtypes = timing.parse_dtypes(args.dtype or "fp32,bf16")
    from fusegraph.fusion.patterns import linear

    print(timing.machine_summary("cpu"))
    if args.calibrate:
        names = tuple(str(d).replace("torch.", "") for d in dtypes) if args.dtype else gemm_table.DTYPES
        parts = gemm_table.PARTS if args.part == "all" else (args.part,)
        entries = gemm_table.measure(names, reps=args.reps or 5, progress=lambda line: print(" ", line, flush=True),
                                     parts=parts)
        path = gemm_table.save(entries, gemm_table._SHIPPED if args.ship else None)
        for name, e in entries.items():
            if "kernel" in e:
                pack = (f"; with pack_weights=True: {e['pack']} (the faster plain kernel / packed, geometric mean "
                        f"{e['pack_geomean']:.2f}x)") if "pack" in e else ""
                print(f"{name}: {e['kernel']} (aten/fused geometric mean {e['geomean']:.2f}x){pack}")
            if "gemv" in e:
                print(f"{name}, few rows: " + ", ".join(f"{m} rows {k}" for m, k in e["gemv"].items()))
        print(f"wrote {path}")
        linear.machine_rule.cache_clear()
        if args.json:
            timing.write_json(args.json, {**timing.run_facts("cpu"), "calibration": entries})
        return 0
    rules = {str(d): linear.machine_rule(d) for d in dtypes}
    rule, why = rules[str(dtypes[0])]
    print(f"threads {torch.get_num_threads()}; linear family rule: " + "; ".join(
        f"{d.replace('torch.', '')} {'fusegraph.linear' if r else 'addmm'} ({w})" for d, (r, w) in rules.items()))
    pack, pack_why = gemm_table.pack_lookup(torch.float32)
    print(f"float32 linear weights under pack_weights=True: {'packed for oneDNN' if pack == 'onednn' else 'unpacked'} "
          f"({pack_why})")
    rows, records = [], []
    torch.manual_seed(0)
    for dtype in dtypes:
        for m, k, n in (QUICK if args.quick else SHAPES):
            x = torch.randn(m, k, dtype=dtype)
            w = torch.randn(n, k, dtype=dtype) * k ** -0.5
            b = torch.randn(n, dtype=dtype)
            reps = args.reps or (3 if args.quick else max(5, min(200, int(1e9 / (2 * m * k * n)))))
            fns = {"addmm": lambda: torch.addmm(b, x, w.t()),
                   "onednn": lambda: torch.ops.fusegraph.linear(x, w, b)}
            times = timing.interleaved_seconds(fns, warmup=2, reps=reps)
            med = {name: statistics.median(t) for name, t in times.items()}
            ref = F.linear(x.double(), w.double(), b.double())
            err = {name: (fn().double() - ref).abs().max().item() for name, fn in fns.items()}
            route = _route(m, k, n, dtype)
            ratio = med["addmm"] / med["onednn"]
            faster = "onednn" if ratio > 1 else "addmm"
            chosen = {"linear": "onednn", "addmm": "addmm"}.get(route)
            verdict = "-" if chosen is None else ("yes" if chosen == faster or abs(ratio - 1) < 0.05 else "NO")
            gflops = 2 * m * k * n / 1e9
            rows.append([str(dtype).replace("torch.", ""), f"{m}x{k}x{n}", timing.fmt_time(med["addmm"]),
                         timing.fmt_time(med["onednn"]), f"{ratio:.2f}x", f"{gflops / med['onednn']:.1f}",
                         f"{err['addmm']:.1e} / {err['onednn']:.1e}", route, verdict])
            records.append({"dtype": str(dtype), "m": m, "k": k, "n": n, "reps": reps, "times_s": times,
                            "median_s": med, "max_err_vs_float64": err, "route": route, "ratio": ratio})
    print(timing.format_table(["dtype", "M x K x N", "addmm", "fusegraph.linear", "addmm/linear", "GFLOP/s linear",
                               "max err vs f64 (addmm / linear)", "pass routes to", "faster chosen"], rows))
    if args.json:
        timing.write_json(args.json, {**timing.run_facts("cpu"), "rule": [rule, why],
                                      "rules": {d: list(r) for d, r in rules.items()}, "results": records})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
