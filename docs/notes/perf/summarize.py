"""Before/after table for docs/notes/perf.md from `python -m fusegraph bench ops --json` files.

usage: python docs/notes/perf/summarize.py BEFORE.json[,BEFORE2.json...] AFTER.json[,AFTER2.json...]
Ratios are taken within each run (the columns of one run are interleaved), then shown per repeat ("a / b").
Targets (fp32 / bf16): x eager >= 2, fused/comp <= 1, fused/copy <= 1.5 / 2.
"""
import json
import statistics
import sys


def load(paths):
    runs = [json.load(open(p)) for p in paths.split(",")]
    return runs


def key(r):
    return (r["label"], r["dtype"])


def ratios(run_rows):
    out = {}
    for r in run_rows:
        out[key(r)] = dict(eager=r["eager_s"], comp=r["compiled_s"], fused=r["fused_s"], copy=r["copy_s"],
                           x_eager=r["eager_s"] / r["fused_s"], f_comp=r["fused_s"] / r["compiled_s"],
                           f_copy=r["fused_s"] / r["copy_s"], f_pre=r["fused_s"] / r["copy_prealloc_s"])
    return out


def fmt_list(vals, f="{:.2f}"):
    return " / ".join(f.format(v) for v in vals)


def main():
    before, after = load(sys.argv[1]), load(sys.argv[2])
    b = [ratios(r["rows"]) for r in before]
    a = [ratios(r["rows"]) for r in after]
    print("runs: before " + ", ".join(f"{r['facts']['date_utc'][11:19]} load {r['facts']['load_avg_1min']:.1f}"
                                       for r in before) + "; after " +
          ", ".join(f"{r['facts']['date_utc'][11:19]} load {r['facts']['load_avg_1min']:.1f}" for r in after) +
          f"; threads {before[0]['facts']['threads']}")
    print()
    print("| op | dtype | eager ms | compiled ms | copy ms | fused ms before -> after | x eager before -> after |"
          " fused/comp before -> after | fused/copy before -> after | fused/copy pre after | targets (after, all repeats) |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in a[0]:
        ms = lambda runs, c: statistics.median(x[k][c] for x in runs) * 1e3
        lim = 1.5 if k[1] == "fp32" else 2.0
        miss = []
        if min(x[k]["x_eager"] for x in a) < 2.0:
            miss.append("x eager<2")
        if max(x[k]["f_comp"] for x in a) > 1.0:
            miss.append("slower than Inductor")
        if max(x[k]["f_copy"] for x in a) > lim:
            miss.append(f"copy>{lim}")
        print(f"| {k[0]} | {k[1]} | {ms(a + b, 'eager'):.1f} | {ms(a + b, 'comp'):.1f} | {ms(a + b, 'copy'):.1f} | "
              f"{ms(b, 'fused'):.1f} -> {ms(a, 'fused'):.1f} | "
              f"{fmt_list([x[k]['x_eager'] for x in b])} -> {fmt_list([x[k]['x_eager'] for x in a])} | "
              f"{fmt_list([x[k]['f_comp'] for x in b])} -> {fmt_list([x[k]['f_comp'] for x in a])} | "
              f"{fmt_list([x[k]['f_copy'] for x in b])} -> {fmt_list([x[k]['f_copy'] for x in a])} | "
              f"{fmt_list([x[k]['f_pre'] for x in a])} | "
              f"{'met' if not miss else 'MISSED: ' + ', '.join(miss)} |")


if __name__ == "__main__":
    main()
