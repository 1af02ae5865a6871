"""The docs stay true to the code and to themselves: the guide's configuration reference is the one generated
from fusegraph/config.py, every relative link and named doc file exists, every file in docs/results is cited by
a benchmark table (and every cited one exists), and BENCHMARKS.md §1 is what scripts/bench_real_tables.py prints
from those files."""
import contextlib
import importlib.util
import io
import os
import re
import unicodedata

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
RESULTS = os.path.join(DOCS, "results")
MARKDOWN = ["README.md"] + sorted(os.path.join("docs", f) for f in os.listdir(DOCS) if f.endswith(".md"))
# The docs that cite runs in docs/results.
CITING = [os.path.join("docs", "BENCHMARKS.md"), os.path.join("docs", "GUIDE.md")]


def _script(name):
    spec = importlib.util.spec_from_file_location(f"_docs_test_{name}", os.path.join(ROOT, "scripts", f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _read(rel):
    with open(os.path.join(ROOT, rel), encoding="utf-8") as f:
        return f.read()


def _without_code_blocks(text):
    return re.sub(r"^```.*?^```", "", text, flags=re.S | re.M)


# --- the configuration reference -----------------------------------------------------------------------------

def test_config_reference_is_generated_from_the_config():
    ref = _script("config_reference")
    section = ref.current(_read(os.path.join("docs", "GUIDE.md")))
    assert section is not None, "docs/GUIDE.md lost the config-reference markers"
    assert section == ref.generate(), \
        "docs/GUIDE.md's config reference is stale: run .venv/bin/python scripts/config_reference.py --write"
    assert ref.check()


def test_config_reference_names_every_field_with_its_doc():
    ref = _script("config_reference")
    config = ref._import_config()
    section = ref.current(_read(os.path.join("docs", "GUIDE.md")))
    flat = " ".join(re.sub(r"^(\s*)\\", r"\1", section, flags=re.M).split())  # wrapped, line starts escaped
    for cls in (config.CompilationConfig, config.FusionPatterns):
        for name, field in cls._fields.items():
            assert f"**`{name}`**" in section, f"{cls.__name__}.{name} is missing from the config reference"
            doc = " ".join((field.__doc__ or "").split())
            assert doc, f"{cls.__name__}.{name} has no doc (fusegraph/config.py)"
            assert doc in flat, f"{cls.__name__}.{name}'s doc is not in the config reference"
        for alias in cls._aliases:
            assert f"`{alias}`" in section, f"alias {alias} is missing from the config reference"


def test_config_reference_check_detects_a_stale_guide(tmp_path):
    ref = _script("config_reference")
    text = _read(os.path.join("docs", "GUIDE.md"))
    stale = tmp_path / "GUIDE.md"
    stale.write_text(text.replace("**`verify`**", "**`verified`**"), encoding="utf-8")
    assert not ref.check(str(stale))
    assert ref.write(str(stale)) and ref.check(str(stale))
    assert stale.read_text(encoding="utf-8") == text


# --- links ---------------------------------------------------------------------------------------------------

def _slug(heading):
    """GitHub's anchor of a Markdown heading."""
    text = re.sub(r"[`*_]|\[([^\]]*)\]\([^)]*\)", lambda m: m.group(1) or "", heading.strip()).lower()
    keep = "".join(c for c in text if c in " -" or unicodedata.category(c)[0] in "LMN" or c == "_")
    return keep.replace(" ", "-")


def _anchors(rel):
    return {_slug(m.group(1)) for m in re.finditer(r"^#+\s+(.*)$", _without_code_blocks(_read(rel)), re.M)}


@pytest.mark.parametrize("doc", MARKDOWN)
def test_relative_links_point_at_files_and_headings_that_exist(doc):
    text = _without_code_blocks(_read(doc))
    broken = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http(s), mailto
        path, _, anchor = target.partition("#")
        rel = os.path.normpath(os.path.join(os.path.dirname(doc), path)) if path else doc
        if not os.path.exists(os.path.join(ROOT, rel)):
            broken.append(f"{target} (no file {rel})")
        elif anchor and rel.endswith(".md") and anchor not in _anchors(rel):
            broken.append(f"{target} (no heading #{anchor} in {rel})")
    assert not broken, f"{doc}: broken links: {broken}"


@pytest.mark.parametrize("doc", MARKDOWN)
def test_named_doc_files_exist(doc):
    """A doc named in prose or code (`docs/X.md`, `X.md` of docs/) exists: a deleted or renamed doc leaves no
    dangling mention."""
    missing = set()
    for name in re.findall(r"(?<![\w/.-])((?:docs/)?[A-Za-z_]+\.md)\b", _read(doc)):
        candidates = [name] if name.startswith("docs/") else [name, os.path.join("docs", name),
                                                              os.path.join("..", "shared", name)]  # SPEC.md
        if not any(os.path.exists(os.path.join(ROOT, c)) for c in candidates):
            missing.add(name)
    assert not missing, f"{doc} names docs that do not exist: {sorted(missing)}"


# --- docs/results holds only what the tables cite ------------------------------------------------------------

def _cited_text():
    return "\n".join(_read(d) for d in CITING)


def test_every_result_file_is_cited():
    text = _cited_text()
    uncited = []
    for name in sorted(os.listdir(RESULTS)):
        stem = re.sub(r"\.(txt|json)$", "", name)
        cite = stem if "_" in stem else name  # a one-word stem (demo) is cited by its file name
        if not re.search(rf"(?<![\w-]){re.escape(cite)}(?![\w-])", text):
            uncited.append(name)
    assert not uncited, f"docs/results files no table cites (delete them; history lives in git): {uncited}"


def test_every_cited_result_file_exists():
    text = _cited_text()
    files = set(os.listdir(RESULTS))
    stems = {re.sub(r"\.(txt|json)$", "", f) for f in files}
    missing = []
    for path in re.findall(r"docs/results/([\w.{},*-]+)", text):
        path = path.rstrip(".,")
        if re.search(r"[A-Z]|[{}*]", path):  # a placeholder (M, DTYPE, N) or a pattern, not a file
            continue
        stem = re.sub(r"\.(txt|json)$", "", path)
        if path not in files and stem not in stems:
            missing.append(path)
    for stem in re.findall(r"`([a-z0-9]+_[a-z0-9_]*_t[12](?:_[a-z0-9_]+)?)(?:\.txt|\.json)?`", text):
        if stem not in stems:  # a run named by its stem, as the tables' *speeds* column does
            missing.append(stem)
    assert not missing, f"cited but not in docs/results: {sorted(set(missing))}"


def test_published_width_tables_are_what_bench_real_tables_prints():
    tables = _script("bench_real_tables")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert tables.main([]) == 0
    text = _read(os.path.join("docs", "BENCHMARKS.md"))
    lines = [line for line in out.getvalue().splitlines() if line.strip()]
    assert lines and "not run" not in out.getvalue(), "a run scripts/bench_real_tables.py reads is missing"
    stale = [line for line in lines if line not in text]
    assert not stale, f"docs/BENCHMARKS.md §1 differs from scripts/bench_real_tables.py's output: {stale}"


def test_class_tables_are_what_bench_real_tables_prints():
    """§1.5's per-class tables are printed from scripts/class_sweep.sh's runs, every cell judged, none missing."""
    tables = _script("bench_real_tables")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert tables.main(["--classes"]) == 0
    text = _read(os.path.join("docs", "BENCHMARKS.md"))
    printed = out.getvalue()
    lines = [line for line in printed.splitlines() if line.strip()]
    assert "**Class `" in printed and "not run" not in printed, "a class table's run is missing"
    assert "no manifest" not in printed, "a class swept without its class_sweep_KEY.txt"
    stale = [line for line in lines if line not in text]
    assert not stale, f"docs/BENCHMARKS.md §1.5 differs from bench_real_tables.py --classes: {stale}"


def test_class_tables_pool_runs_by_each_rounds_own_ratio():
    """A cell's repeats taken under different load: the ratio is the median of each round's t(other) / t(ours), not
    the ratio of the pooled medians (which a slow run's rounds would pull either way)."""
    tables = _script("bench_real_tables")
    fast = {"times_s": {"inductor": [1.00, 1.02, 1.01], "fusegraph": [0.90, 0.91, 0.92]}}
    slow = {"times_s": {"inductor": [2.00, 2.10, 2.05], "fusegraph": [1.80, 1.90, 1.85]}}
    ratio = tables._round_ratio([fast, slow], "inductor", "fusegraph")
    per_round = sorted([1.00 / 0.90, 1.02 / 0.91, 1.01 / 0.92, 2.00 / 1.80, 2.10 / 1.90, 2.05 / 1.85])
    assert ratio == pytest.approx((per_round[2] + per_round[3]) / 2)
    assert tables._round_ratio([fast], "openvino", "fusegraph") is None  # a variant that did not run


def test_class_tables_judge_memory_at_the_deepest_run(tmp_path, monkeypatch):
    """A cell's memory is judged at its deepest ``_mem_xN`` run where one exists: over the limit at the stand-in
    but within at depth is met (and says so), over at depth is a miss, and without a deep run the stand-in rules."""
    import json

    tables = _script("bench_real_tables")
    monkeypatch.setattr(tables, "RESULTS", str(tmp_path))
    stem = "bench_real_wan_fp32_t1_class_intel_amx"
    rounds = {"eager": [1.3, 1.3], "inductor": [1.2, 1.2], "inductor_tuned": [1.2, 1.2], "fusegraph": [1.0, 1.0],
              "openvino": [1.0, 1.0]}

    def write(name, body):
        (tmp_path / f"{name}.json").write_text(json.dumps(body))

    def memory(name, fusegraph_mib, inductor_mib, weights_mib):
        write(name, {"rows": [
            {"variant": "inductor", "resident_mib": inductor_mib, "weights_mib": weights_mib, "first_s": 20.0},
            {"variant": "fusegraph", "resident_mib": fusegraph_mib, "weights_mib": weights_mib, "first_s": 21.0}]})

    def verdict():
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            cells = tables.class_table("intel_amx")
        row = next(line for line in out.getvalue().splitlines() if line.startswith("| Wan 2.1 1.3B, fp32"))
        return [c for m, d, c in cells if (m, d) == ("wan", "fp32")][0], row

    write(stem, {"machine": "CPU class GenuineIntel/amx", "interleaved": {"times_s": rounds}})
    memory(stem + "_mem", 80, 50, 400)  # limit 50 + 20: over
    missed, row = verdict()
    assert missed == ["memory over"]
    memory(stem + "_mem_x15", 240, 250, 5400)  # at depth: within (limit 250 + 270)
    missed, row = verdict()
    assert missed == [] and "met; memory judged at `--layers 15`" in row and "`--layers 15`: 240 / 250 MiB (520)" in row
    memory(stem + "_mem_x15", 600, 250, 5400)  # at depth: over
    missed, row = verdict()
    assert missed == ["memory over at `--layers 15`"]
    memory(stem + "_mem_x15_b", 600, 250, 5400)  # a deep run's file names no class of its own
    assert tables._class_keys() == [("intel_amx", 1)]
