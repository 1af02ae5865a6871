"""fusegraph's files next to Inductor's cache (cost table, conv-packing verdicts, fused counts) are
never trusted: a malformed, truncated, deeply nested, wrong-typed or foreign file is ignored with one warning and
rewritten by the next store — never a failed compile."""
import json
import logging

import pytest
import torch
import torch.nn as nn

from fusegraph import Backend, CompilationConfig, packing
from fusegraph._core import cache
from fusegraph.fusion import choice, inductor_pass

# file content -> what is wrong with it
BAD = {
    "truncated": b'{"a": [1, 2',
    "deeply_nested": b"[" * 100000,
    "foreign_binary": b"\xff\xfe\x00\x01garbage\x80",
    "empty": b"",
    "a_string": b'"just a string"',
    "a_list": b"[1, 2, 3]",
    "wrong_types": b'{"version": 2, "tables": {"cpu": {"1": "x"}}, "counts": 3, "k": [true]}',
}


@pytest.fixture
def cache_files(tmp_path, monkeypatch):
    """Every fusegraph cache file moved under tmp_path; this process's memory of them dropped."""
    paths = {"cost": tmp_path / "cost.json", "packing": tmp_path / "packing.json", "counts": tmp_path / "counts"}
    monkeypatch.setattr(choice, "calibration_path", lambda: str(paths["cost"]))
    monkeypatch.setattr(packing, "cache_path", lambda: str(paths["packing"]))
    monkeypatch.setattr(inductor_pass, "_record_path", lambda key: str(paths["counts"] / f"{key}.json"))
    monkeypatch.setattr(cache, "_warned", set())
    packing._verdicts.forget()
    inductor_pass._records.clear()
    yield paths
    packing._verdicts.forget()
    choice.cost_model(reload=True)


def _warnings(caplog, path) -> list:
    return [r for r in caplog.records if r.levelno == logging.WARNING and str(path) in r.getMessage()]


@pytest.mark.parametrize("bad", BAD)
def test_read_json_ignores_a_bad_file_with_one_warning(bad, tmp_path, caplog, monkeypatch):
    monkeypatch.setattr(cache, "_warned", set())
    path = tmp_path / "f.json"
    path.write_bytes(BAD[bad])

    def check(data):
        if not isinstance(data, dict) or not isinstance(data.get("tables", {}).get("cpu", {}).get("1"), dict):
            raise TypeError("not a table")
        return data

    with caplog.at_level(logging.WARNING, logger="fusegraph"):
        assert cache.read_json(str(path), check) is None
        assert cache.read_json(str(path), check) is None
    assert len(_warnings(caplog, path)) == 1, caplog.text
    assert cache.read_json(str(tmp_path / "missing.json")) is None  # missing: no warning
    assert len([r for r in caplog.records if "missing.json" in r.getMessage()]) == 0


@pytest.mark.parametrize("bad", BAD)
def test_cost_table_falls_back_to_the_shipped_one_and_is_rewritten(bad, cache_files, caplog):
    cache_files["cost"].write_bytes(BAD[bad])
    with caplog.at_level(logging.WARNING, logger="fusegraph"):
        model = choice.cost_model(reload=True)
    assert model.source == choice._SHIPPED and model.tables
    assert model.ratio("rms_norm", torch.device("cpu"), torch.float32, 4096) is not None
    assert len(_warnings(caplog, cache_files["cost"])) == 1
    point = [[10.0, 1.5, 2.0], [12.0, 2.0, 3.0]]
    choice.save_calibration({"cpu": {"1": {"rms_norm": {"float32": point}}}})  # rewritten: a valid table
    data = json.loads(cache_files["cost"].read_text())
    assert data["tables"] == {"cpu": {"1": {"rms_norm": {"float32": point}}}}
    assert choice.cost_model().source.startswith(str(cache_files["cost"]))


def test_a_partial_calibration_keeps_the_shipped_table_for_the_rest(cache_files, monkeypatch):
    """bench calibrate --families rms_norm (GUIDE's "+ wide rows" run): the measured entries replace the shipped ones;
    every other family, dtype and row width is still predicted from the shipped table (they all read None)."""
    cpu = torch.device("cpu")
    shipped = choice.cost_model(reload=True)
    key = sorted(k for k in shipped.tables if k.startswith("cpu@"))[0]  # as if this machine were of that class
    monkeypatch.setattr(choice, "_device_key", lambda device: key if device.type == "cpu" else device.type)
    before = {f: shipped.predict(f, cpu, torch.float32, 2 ** 14) for f in ("mul_add", "gelu", "rope")}
    assert all(v[0] is not None for v in before.values()), before
    point = [[10.0, 7.5, 2.0], [20.0, 7.5, 3.0]]
    choice.save_calibration({key: {"1": {"rms_norm": {"float32": point}}}})
    merged = choice.cost_model(reload=True)
    assert {f: merged.predict(f, cpu, torch.float32, 2 ** 14) for f in before} == before
    assert merged.predict("rms_norm", cpu, torch.float32, 2 ** 14, threads=1)[0] == pytest.approx(7.5)
    assert merged.source.startswith(str(cache_files["cost"]))


@pytest.mark.parametrize("table", [
    {"cpu": {"1": "x"}}, {"cpu": {"one": {}}}, {"cpu": {"1": {"rms_norm": {"float32": [[10.0]]}}}},
    {"cpu": {"1": {"rms_norm": {"float32": [[12.0, 1.0], [10.0, 1.0]]}}}},
    {"cpu": {"1": {"rms_norm": {"float32": [[10.0, "fast"]]}}}}, {"cpu": {"1": {"rms_norm": {"float32": []}}}},
    {"cpu": {"1": {"rms_norm": {"float32": [[10.0, -1.0]]}}}}, ["cpu"]])
def test_cost_table_of_the_wrong_shape_is_refused(table, cache_files):
    cache_files["cost"].write_text(json.dumps({"version": choice.TABLE_VERSION, "tables": table}))
    assert choice.cost_model(reload=True).source == choice._SHIPPED


def test_verdict_files_drop_malformed_entries_and_rewrite(cache_files, caplog):
    verdicts, name, good = packing._verdicts, "packing", [True, 1e-3, 2e-3]
    cache_files[name].write_text(json.dumps({"bad1": [True], "bad2": ["fused", "x", 1], "bad3": 7, "bad4": [],
                                             "bad5": [1, 1e-3, 2e-3], "good": good}))
    with caplog.at_level(logging.WARNING, logger="fusegraph"):
        assert verdicts.get("bad1") is None and verdicts.get("bad5") is None
        assert verdicts.get("good") == good
    assert len(_warnings(caplog, cache_files[name])) == 1
    verdicts.put("new", good)
    assert json.loads(cache_files[name].read_text()) == {"good": good, "new": good}
    for content in BAD.values():  # a file not even JSON: ignored, then rewritten by the next store
        verdicts.forget()
        cache_files[name].write_bytes(content)
        assert verdicts.get("good") is None
        verdicts.put("new", good)
        assert json.loads(cache_files[name].read_text()) == {"new": good}


def test_a_malformed_counts_record_is_ignored(cache_files, caplog):
    cache_files["counts"].mkdir()
    for i, content in enumerate(BAD.values()):
        (cache_files["counts"] / f"k{i}.json").write_bytes(content)
        with caplog.at_level(logging.WARNING, logger="fusegraph"):
            assert inductor_pass._load_record(f"k{i}") is None
    warned = [r for r in caplog.records if str(cache_files["counts"]) in r.getMessage() and r.levelno == logging.WARNING]
    assert len(warned) == len(BAD), caplog.text


class _Block(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.conv = nn.Conv2d(4, 4, 3, padding=1)
        self.norm = nn.RMSNorm(d)
        self.proj = nn.Linear(d, d)

    def forward(self, img, x):
        return self.conv(img).sum(), self.proj(nn.functional.gelu(self.norm(x), approximate="tanh"))


@pytest.mark.parametrize("bad", ["deeply_nested", "wrong_types"])
def test_compiles_run_with_every_cache_file_bad(bad, cache_files, caplog):
    """Every cache file bad at once: the default route compiles, chooses per site, packs (pack_weights) and matches
    eager; the packing file is rewritten with the verdict. A counts record is read only when Inductor's FX graph
    cache serves a compile: a second compile of the default route, served from that cache, meets every record the
    first wrote made bad."""
    from torch._dynamo.utils import counters
    from torch._inductor.utils import fresh_inductor_cache

    cache_files["counts"].mkdir()
    for key in ("cost", "packing"):
        cache_files[key].write_bytes(BAD[bad])
    torch._dynamo.reset()
    choice.cost_model(reload=True)
    m = _Block().eval()

    def compile_and_check(config):
        torch._dynamo.reset()
        fn = torch.compile(m, backend=Backend(config))
        for _ in range(3):
            img, x = torch.randn(1, 4, 8, 8), torch.randn(3, 32)
            out, ref = fn(img, x), m(img, x)
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)

    with torch.no_grad(), fresh_inductor_cache():
        for config in (CompilationConfig(), CompilationConfig(pack_weights=True, enable_freezing=True)):
            compile_and_check(config)
        records = list(cache_files["counts"].glob("*.json"))
        assert records, "the first compiles wrote no counts record"
        for record in records:
            record.write_bytes(BAD[bad])
        inductor_pass._records.clear()
        counters.clear()
        with caplog.at_level(logging.WARNING, logger="fusegraph"):
            compile_and_check(CompilationConfig())
        assert counters["inductor"]["fxgraph_cache_hit"] >= 1
    # the served compile read a bad record (one warning) and compiled on
    assert any(str(cache_files["counts"]) in r.getMessage() for r in caplog.records), caplog.text[-2000:]
    stored = json.loads(cache_files["packing"].read_text())
    assert stored and all(isinstance(v[0], bool) for v in stored.values())
