"""BENCHMARKS.md §1's tables, printed from the ``bench real`` JSON files in docs/results (no transcription by hand).

    .venv/bin/python scripts/bench_real_tables.py

``TABLES`` names, for each table, the runs that hold now: per model the per-process run (first call, resident
memory, error; its speeds where no interleaved run exists) and the interleaved run (``--interleave``: every
variant's speed from one process, order rotated each round), if any. A new run replaces its file name here.
"""
import json
import math
import os
import sys

RESULTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "docs", "results")
NAMES = {"flux": "FLUX.1-dev", "sd35": "SD3.5 Large", "wan": "Wan 2.1 1.3B", "hunyuan_video": "HunyuanVideo",
         "ltx": "LTX-Video", "qwenimage": "Qwen-Image"}
MODELS = ("flux", "wan", "sd35", "qwenimage", "hunyuan_video", "ltx")


def _runs(dtype, threads, per_process, interleaved="s12_interleaved"):
    """{model: (per-process file, interleaved file or None)}; ``per_process`` and ``interleaved`` a suffix or
    {model: suffix}."""
    out = {}
    for m in MODELS:
        pp = per_process[m] if isinstance(per_process, dict) else per_process
        ils = interleaved.get(m, "s12_interleaved") if isinstance(interleaved, dict) else interleaved
        il = f"bench_real_{m}_{dtype}_t{threads}_{ils}.json" if ils else None
        out[m] = (f"bench_real_{m}_{dtype}_t{threads}_{pp}.json", il)
    return out


TABLES = [
    ("1 thread, bf16", _runs("bf16", 1, {"flux": "s9", "wan": "s9", "sd35": "s12", "qwenimage": "s12",
                                         "hunyuan_video": "s12", "ltx": "s12"},
                             # after gemv's prefetch, each alone (s12: two at a time; LTX and Qwen-Image alone)
                             {m: "s13_interleaved" for m in ("flux", "wan", "sd35", "hunyuan_video")})),
    ("1 thread, fp32", _runs("fp32", 1, {"flux": "s10", "wan": "s10", "sd35": "s10", "qwenimage": "s10",
                                         "hunyuan_video": "s11", "ltx": "s11"}, interleaved=None)),
    ("2 threads, bf16", _runs("bf16", 2, {"flux": "s9", "wan": "s12", "sd35": "s12", "qwenimage": "s12",
                                          "hunyuan_video": "s12", "ltx": "s12"})),
    ("2 threads, fp32", _runs("fp32", 2, "s12", interleaved=None)),
]
VARIANTS = ("eager", "inductor", "inductor_tuned", "fusegraph", "openvino")


def _load(name):
    path = os.path.join(RESULTS, name)
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _ms(s):
    return f"{s * 1e3:.0f}" if s else "—"


def _x(a, b):
    return f"{a / b:.2f}×" if a and b else "—"


def table(title, runs) -> list:
    """Prints one table and the geometric mean of fusegraph vs Inductor over its models; returns the ratios."""
    print(f"**{title}**\n")
    print("| model | eager | Inductor | tuned | **fusegraph** | OpenVINO | fusegraph vs Inductor / tuned / OpenVINO "
          "| first call: Inductor / tuned / fusegraph / OpenVINO | resident +: fusegraph / OpenVINO "
          "| max\\|diff\\| / max\\|out\\|: fusegraph / OpenVINO | speeds |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratios = []
    for model, (pp_name, il_name) in runs.items():
        pp, il = _load(pp_name), _load(il_name) if il_name else None
        if pp is None:
            print(f"| {NAMES[model]} | not run |||||||||")
            continue
        rows = {r["variant"]: r for r in pp["rows"]}
        if model == "hunyuan_video" and "openvino" not in rows:  # measured alone afterwards (tracing failed)
            extra = _load(pp_name.replace(".json", "_openvino.json"))  # one row, from --one
            if extra:
                rows["openvino"] = extra
        if il and il.get("interleaved"):
            speed, source = dict(il["interleaved"]["median_s"]), f"interleaved, `{il_name[:-5]}`"
        else:
            speed, source = {v: r["median_s"] for v, r in rows.items()}, f"per process, `{pp_name[:-5]}`"
        s = [speed.get(v) for v in VARIANTS]
        first = [rows[v]["first_s"] if v in rows else None for v in ("inductor", "inductor_tuned", "fusegraph",
                                                                      "openvino")]
        err = [rows[v]["max_diff"] / max(rows[v]["ref_max"], 1e-30) if v in rows else None
               for v in ("fusegraph", "openvino")]
        res = [rows[v]["resident_mib"] if v in rows else None for v in ("fusegraph", "openvino")]
        if s[1] and s[3]:
            ratios.append(s[1] / s[3])
        print(f"| {NAMES[model]} | {_ms(s[0])} | {_ms(s[1])} | {_ms(s[2])} | **{_ms(s[3])}** | {_ms(s[4])} "
              f"| **{_x(s[1], s[3])}** / {_x(s[2], s[3])} / {_x(s[4], s[3])} "
              f"| {' / '.join(f'{t:.1f} s' if t else '—' for t in first)} "
              f"| {' / '.join(f'{r:.0f} MiB' if r is not None else '—' for r in res)} "
              f"| {' / '.join(f'{e:.1e}' if e is not None else '—' for e in err)} | {source} |")
    gm = math.exp(sum(map(math.log, ratios)) / len(ratios)) if ratios else float("nan")
    print(f"\nGeometric mean, fusegraph vs Inductor over {len(ratios)} models: **{gm:.2f}×** "
          f"({', '.join(f'{r:.2f}' for r in ratios)}).\n")
    return ratios


def main() -> int:
    by_threads = {}
    for title, runs in TABLES:
        by_threads.setdefault(title.split(" ")[0], []).extend(table(title, runs))
    for threads, rs in by_threads.items():
        gm = math.exp(sum(map(math.log, rs)) / len(rs))
        print(f"{threads} thread(s), both dtypes: geometric mean {gm:.2f}× Inductor over {len(rs)} (model, dtype) "
              f"pairs; minimum {min(rs):.2f}×.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
