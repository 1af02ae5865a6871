"""``python -m fusegraph bench cache``: its arguments, and its eager rows on the tiny pipeline (the compiled rows
compile for minutes: they run in the benchmark itself, docs/BENCHMARKS.md §10; their correctness is
tests/pipelines/test_step_cache.py's)."""
import json

import pytest

from fusegraph.__main__ import main as cli

pytest.importorskip("cache_dit")


@pytest.mark.parametrize("argv, needle", [(["--tokens", "x"], "--tokens"), (["--steps", "0"], "positive"),
                                          (["--variants", "eager,nope"], "unknown nope"),
                                          (["--widths", "huge"], "--widths")])
def test_bench_cache_argument_errors_name_the_argument(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["bench", "cache", *argv])
    assert e.value.code == 2 and needle in capsys.readouterr().err


@pytest.mark.parametrize("cache", ["dbcache", "fbc"])
def test_bench_cache_counts_the_skipped_steps_of_the_eager_rows(cache, tmp_path, capsys):
    path = tmp_path / "cache.json"
    assert cli(["bench", "cache", "--cache", cache, "--variants", "eager", "--rounds", "2",
                "--json", str(path)]) == 0
    rows = json.loads(path.read_text())["rows"]
    assert list(rows) == ["eager", "cache"]
    assert rows["eager"]["skipped"] == 0 and rows["eager"]["max_diff"] == 0
    # tiny Flux, 8 steps, the default thresholds: some calls skipped, some computed, and the image changes
    assert 0 < rows["cache"]["skipped"] < rows["cache"]["calls"], rows["cache"]
    assert rows["cache"]["max_diff"] > 1e-3, rows["cache"]
    assert all(len(r["times_s"]) == 2 and r["median_s"] > 0 for r in rows.values())
    out = capsys.readouterr().out
    assert "tiny Flux" in out and f"{cache}, threshold" in out and "cache " in out
