"""How close FLUX.1-width linears already run to this CPU's GEMM ceiling (issue 23's FLUX.1 bf16 target; issue 38's
fp32 and bf16 per CPU class: run it under ``ONEDNN_MAX_CPU_ISA``/``ATEN_CPU_CAPABILITY``/``MKL_ENABLE_INSTRUCTIONS``,
``fusegraph._core.cpu_class.environment``).

Profiles one eager call of ``bench real``'s FLUX.1-width model (1 double + 1 single block, 256 + 64 tokens) with
FLOP counting, then times each linear shape it ran on its own (interleaved rounds, medians):
``addmm`` on the plain weight (what eager, Inductor and fusegraph's default call), oneDNN's linear on a weight
packed once (``mkldnn._linear_pointwise`` after ``_reorder_linear_weight``: what Inductor freezing with
``pack_weights`` / OpenVINO's blocked copy buy, at the price of a second copy of every weight), ``fusegraph.gemv``
for the few-row ones (what fusegraph runs them as), ``fusegraph.linear`` for the many-row ones (oneDNN on the plain
weight; bf16/fp16 widened to float32), and a large square
GEMM as the machine's practical bf16 ceiling. Prints GFLOP/s for each.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/flux_gemm_roofline.py [--threads N] [--dtype bf16|fp32] [--model M]
"""
import argparse
import collections
import statistics
import sys
import time

import torch


def _time(fn, reps):
    ts = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return ts


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16")
    p.add_argument("--model", default="flux", help="a bench real model (flux, wan, sd35, ...)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from fusegraph._core import cpu_class
    from fusegraph.bench.real import build

    dt = {"bf16": torch.bfloat16, "fp32": torch.float32}[args.dtype]
    model, kw, _ = build(args.model, dt)
    with torch.no_grad():
        model(**kw)
        with torch.profiler.profile(record_shapes=True, with_flops=True) as prof:
            model(**kw)
    shapes = collections.Counter()
    gemm_us = gemm_flops = total_us = 0.0
    for e in prof.events():
        if e.cpu_parent is None:
            total_us += e.cpu_time_total
        if e.name == "aten::addmm":
            gemm_us += e.self_cpu_time_total
            gemm_flops += e.flops
            (_, x, w) = e.input_shapes[:3]
            shapes[(x[0], x[1], w[1])] += 1
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {dt}, {cpu_class.describe()}")
    print(f"eager call {total_us / 1e3:.1f} ms; addmm {gemm_us / 1e3:.1f} ms, {gemm_flops / 1e9:.1f} GFLOP, "
          f"{gemm_flops / gemm_us / 1e3:.0f} GFLOP/s")

    g = torch.Generator().manual_seed(0)
    rows = []
    totals = collections.Counter()
    big = (2048, 4096, 4096)
    for (m, k, n) in list(shapes) + [big]:
        x = torch.randn(m, k, generator=g).to(dt)
        w = torch.randn(n, k, generator=g).to(dt)
        b = torch.randn(n, generator=g).to(dt)
        packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
        fns = {"addmm": lambda: torch.addmm(b, x, w.t()),
               "onednn packed": lambda: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")}
        if m <= 8:  # what fusegraph's gemv family runs such a linear as
            fns["fusegraph.gemv"] = lambda: torch.ops.fusegraph.gemv(x, w, b)
        else:  # what its linear family runs it as, where the class's table says so
            fns["fusegraph.linear"] = lambda: torch.ops.fusegraph.linear(x, w, b)
        ref = fns["addmm"]().float()
        for f in fns.values():
            torch.testing.assert_close(f().float(), ref, rtol=2e-2 if dt != torch.float32 else 1e-4, atol=0.5)
        reps = max(3, int(0.5 / max(1e-6, min(_time(fns["addmm"], 2)))))
        ts = {k: [] for k in fns}
        for _ in range(reps):
            for name, f in fns.items():
                ts[name] += _time(f, 1)
        fl = 2.0 * m * k * n
        rows.append(((m, k, n), shapes.get((m, k, n), 0),
                     {name: fl / statistics.median(v) / 1e9 for name, v in ts.items()}))
        for name, v in ts.items():
            totals[name if name in ("addmm", "onednn packed") else "fusegraph"] += \
                shapes.get((m, k, n), 0) * statistics.median(v)
    cols = ("addmm", "onednn packed", "fusegraph.gemv", "fusegraph.linear")
    print(f"{'M x K x N':>22} {'calls':>5} " + " ".join(f"{c:>14}" for c in cols) + "   (GFLOP/s, medians)")
    for (m, k, n), calls, rate in rows:
        tag = "" if calls else "  <- ceiling (square)"
        if m == 1:  # a GEMV reads its weight once: GFLOP/s x 1 byte per flop (bf16) is GB/s
            tag = f"  (weight {k * n * 2 / 2**20:.0f} MiB: GB/s = GFLOP/s)"
        print(f"{m:>6} x {k:>5} x {n:>5} {calls:>5} "
              + " ".join(f"{rate[c]:>14.0f}" if c in rate else f"{'':>14}" for c in cols) + tag)
    print("one call's linears, each shape timed alone: " + ", ".join(
        f"{name} {t * 1e3:.0f} ms" for name, t in totals.items()) + " (fusegraph: gemv for <= 8 rows, linear above)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
