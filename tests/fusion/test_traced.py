"""Traced search patterns kept across processes (fusegraph.fusion.traced): the patterns a registration reads back
are the ones tracing gives, node by node, for every family; a registration from the file traces nothing; a bad
file is ignored with one warning and the families trace; ``make build`` leaves the package's file current."""
import json
import logging
import os

import pytest
import torch
import torch._inductor.config as inductor_config
import torch.nn as nn
import torch.nn.functional as F
from torch._inductor import pattern_matcher as pm

from fusegraph import Backend, CompilationConfig
from fusegraph._core import cache
from fusegraph.config import FusionPatterns
from fusegraph.fusion import passes, traced


@pytest.fixture
def files(tmp_path, monkeypatch):
    paths = {"shipped": tmp_path / "shipped.json", "user": tmp_path / "user.json"}
    monkeypatch.setattr(traced, "SHIPPED", str(paths["shipped"]))
    monkeypatch.setattr(traced, "user_path", lambda: str(paths["user"]))
    monkeypatch.setattr(traced, "_entries", None)
    monkeypatch.setattr(traced, "_new", {})
    monkeypatch.setattr(passes, "_passes", {})
    monkeypatch.setattr(cache, "_warned", set())
    return paths


def _traces(monkeypatch) -> list:
    """Counts fusegraph's search patterns actually traced (Inductor's gen_pattern_and_search_gm under the cache).
    Inductor's own pattern sets also register through it, lazily, at the first compile that needs each (which
    depends on what the process compiled before): those are not counted."""
    calls = []
    original = pm.gen_pattern_and_search_gm

    def counting(*args, **kwargs):
        search_fn = args[0] if args else kwargs.get("search_fn")
        if getattr(search_fn, "__module__", "").startswith("fusegraph"):
            calls.append(1)
        return original(*args, **kwargs)

    monkeypatch.setattr(pm, "gen_pattern_and_search_gm", counting)
    return calls


def _register_all() -> dict:
    passes._passes.clear()
    opts = FusionPatterns()
    return {family: passes.pattern_pass(family, opts) for family in passes.FAMILY_NAMES}


def _entries(pm_pass) -> list:
    return [(key, entry.pattern) for key, entries in pm_pass.patterns.items() for entry in entries]


def test_patterns_read_back_are_the_traced_ones(files, monkeypatch):
    calls = _traces(monkeypatch)
    first = _register_all()  # traced, written to the user's file
    traced_count = len(calls)
    stored = json.loads(files["user"].read_text())
    assert stored["key"] == traced.source_key() and len(stored["entries"]) == traced_count > 300
    traced._entries = None  # a new process: everything read from the file
    again = _register_all()
    assert len(calls) == traced_count  # nothing traced the second time
    for family in passes.FAMILY_NAMES:
        a, b = _entries(first[family]), _entries(again[family])
        assert [k for k, _ in a] == [k for k, _ in b], family
        assert all(traced._same(x, y) for (_, x), (_, y) in zip(a, b)), family
        assert len(a) > 0, family


def test_a_changed_pattern_is_caught_by_the_comparison(files):
    """The check that guards what is kept: a pattern that differs in one op or one user count is not equal."""
    _register_all()
    pattern = _entries(passes._passes[passes.family_key("rms_norm", FusionPatterns())])[0][1]
    data = traced._encode(pattern)
    assert traced._same(traced._decode(json.loads(json.dumps(data))), pattern)
    text = json.dumps(data)
    for old, new in (('"mul", "Tensor"', '"div", "Tensor"'), ('"users": 1', '"users": 2')):
        if old in text:
            assert not traced._same(traced._decode(json.loads(text.replace(old, new, 1))), pattern), old


@pytest.mark.parametrize("content", [b"[" * 100000, "wrong types", b"\xff\xfe", b'{"k'])
def test_a_bad_file_is_ignored_and_the_families_trace(files, monkeypatch, caplog, content):
    if content == "wrong types":
        content = json.dumps({"key": traced.source_key(), "entries": {"a": 3}}).encode()
    files["shipped"].write_bytes(content)
    calls = _traces(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="fusegraph"):
        _register_all()
    assert len(calls) > 300
    assert sum(str(files["shipped"]) in r.getMessage() for r in caplog.records) == 1


def test_entries_stay_text_until_looked_up_and_a_bad_one_is_traced(files, monkeypatch, caplog):
    """Read from the file, every entry is still its JSON text (decoded, the package's entries were ~125,000 Python
    objects held for the process's life); an entry with the right tag whose text is not a pattern is traced instead,
    with one warning naming the file, and the others are read back."""
    with open(os.path.join(os.path.dirname(traced.__file__), "traced_patterns.json")) as f:
        real = json.load(f)
    broken = dict(real["entries"])
    bad = sorted(broken)[:3]
    for key in bad:
        broken[key] = ["[{\"nodes\": 1}, 2", traced._tag(key)]
    files["shipped"].write_text(json.dumps({"key": real["key"], "entries": broken}))
    assert all(isinstance(v[0], str) for v in traced._load().values()) and len(traced._load()) == len(broken)
    calls = _traces(monkeypatch)
    with caplog.at_level(logging.WARNING, logger="fusegraph"):
        _register_all()
    assert len(calls) == len(bad)  # each bad entry traced, every other one read back
    assert sum(str(files["shipped"]) in r.getMessage() for r in caplog.records) == 1, caplog.text


def test_a_file_for_other_sources_is_not_read(files, monkeypatch):
    files["shipped"].write_text(json.dumps({"key": "other sources", "entries": {"x": ["[{}, \"\"]", ""]}}))
    calls = _traces(monkeypatch)
    _register_all()
    assert len(calls) > 300


def test_the_package_file_is_current():
    """``make build`` (which ``make test`` runs first) traced the families of these sources and this torch."""
    assert traced.shipped_is_current(), f"{traced.SHIPPED}: missing or stale; run make build"


class _NormGelu(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm = nn.RMSNorm(d)
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return self.proj(F.gelu(self.norm(x), approximate="tanh"))


def _argument_names(entry) -> frozenset:
    """The argument names (KeywordArg nodes) of a stored pattern."""
    return frozenset(fields["name"] for cls, fields in json.loads(entry[0])[0]["nodes"] if cls.endswith("KeywordArg"))


def _moved(entries: dict, retag: bool) -> dict:
    """Each key given another pattern's well-formed entry, one whose pattern takes other arguments (with
    ``retag``, also carrying the tag of the key it now sits under, as if it had been written for it)."""
    keys = sorted(entries)
    moved = {}
    for i, key in enumerate(keys):
        donors = (keys[(i + j) % len(keys)] for j in range(len(keys) // 2, len(keys) + len(keys) // 2))
        donor = next(k for k in donors if _argument_names(entries[k]) != _argument_names(entries[key]))
        moved[key] = list(entries[donor])
        if retag:
            moved[key][1] = traced._tag(key)
    return moved


@pytest.mark.parametrize("case", ["user", "user_over_shipped", "user_retagged"])
def test_entries_stored_under_other_patterns_keys_are_never_used(files, monkeypatch, caplog, case):
    """A well-formed file of the current key whose entries belong to other patterns (each key holds another
    pattern's entry): a model with an RMSNorm and a tanh-GELU compiles on the Inductor route and with
    inductor=False, matches eager and has both sites fused; the misplaced entries are traced instead, with one
    warning naming the file. A correct package file takes precedence over such a user file (nothing traced)."""
    with open(os.path.join(os.path.dirname(traced.__file__), "traced_patterns.json")) as f:
        real = json.load(f)
    assert real["key"] == traced.source_key(), "the package's file is stale; run make build"
    moved = _moved(real["entries"], retag=case == "user_retagged")
    files["user"].write_text(json.dumps({"key": real["key"], "entries": moved}))
    if case == "user_over_shipped":
        files["shipped"].write_text(json.dumps(real))
    calls = _traces(monkeypatch)
    model = _NormGelu().eval()
    x = torch.randn(4, 32)
    with caplog.at_level(logging.WARNING, logger="fusegraph"), inductor_config.patch(fx_graph_cache=False):
        for inductor in (True, False):
            torch._dynamo.reset()
            b = Backend(CompilationConfig(inductor=inductor))
            with torch.no_grad():
                out, ref = torch.compile(model, backend=b)(x), model(x)
            torch.testing.assert_close(out, ref)
            assert b.stats.patterns["rms_norm"] == 1 and b.stats.patterns["gelu"] == 1, (inductor, b.stats.patterns)
    assert sum(str(files["user"]) in r.getMessage() for r in caplog.records) == 1, caplog.text
    assert len(calls) == 0 if case == "user_over_shipped" else len(calls) > 0
