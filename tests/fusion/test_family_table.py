"""The family table (``fusegraph.fusion.patterns.FAMILIES``) is the only list of pattern families: each family is
one object declared in its own ``patterns/<family>.py`` (name, switch, patterns, fused ops, lowerings,
calibration site, explain candidates), and every per-family list elsewhere (the choice's calibrated families,
op -> family map and lowerings, explain's candidates) is derived from it.

The first test walks the package's source with ``ast``: a tuple, list, set or dict literal holding two or more
family names as strings outside ``fusion/patterns/`` is a second list of families, which the table was meant to
replace. ``ALLOWED`` names the few literals that are lists of something else whose names coincide (fused op names),
each with its reason."""
from __future__ import annotations

import ast
import importlib
import pathlib

import pytest
import torch

from fusegraph._core.torch_dispatcher import OpOverload
from fusegraph.fusion import choice
from fusegraph.fusion.patterns import BY_NAME, FAMILIES, FAMILY_NAMES, PATTERN_NAMES, Candidate, Family
from fusegraph.fusion.patterns._family import overload

ROOT = pathlib.Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "fusegraph"
PATTERNS = PACKAGE / "fusion" / "patterns"

# (file relative to the repository, the family names in the literal) -> why it is no list of families
ALLOWED = {
    ("fusegraph/ops/__init__.py", ("adaln", "gemv", "kv_attention", "linear", "mul_add", "rms_norm", "rope")):
        "__all__: the op functions fusegraph.ops exports (op names; gelu_tanh and fast_gelu are the gelu family's)",
    ("fusegraph/graph/buckets.py", ("adaln", "rms_norm", "rope")):
        "_LAST_DIM: fused op names (ops over the last dim) for the batch-row analysis",
    ("fusegraph/graph/buckets.py", ("gemv", "linear")):
        "op names (aten.linear, fusegraph.gemv) that multiply over rows, for the batch-row analysis",
    ("fusegraph/bench/ops.py", ("adaln", "gemv", "kv_attention", "mul_add", "rms_norm", "rope")):
        "ZOO_SHAPES: benchmark shapes per fused op (keyed by op name: gelu_tanh, adaln, ...)",
}


def family_lists(source: str, names=FAMILY_NAMES) -> list:
    """[(line, sorted family names)] of each tuple/list/set/dict literal in ``source`` holding two or more of
    ``names`` as string constants (a dict's keys and values both count)."""
    names = set(names)
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None] + node.values
        else:
            continue
        hits = sorted({i.value for i in items if isinstance(i, ast.Constant) and i.value in names})
        if len(hits) >= 2:
            found.append((node.lineno, tuple(hits)))
    return found


def _sources():
    for path in sorted(PACKAGE.rglob("*.py")):
        if PATTERNS in path.parents:
            continue  # the table itself
        yield path.relative_to(ROOT).as_posix(), path.read_text()


def test_the_checker_flags_a_family_list():
    assert family_lists('CALIBRATED = ("rms_norm", "rope")\n') == [(1, ("rms_norm", "rope"))]
    assert family_lists('if f in {"gelu", "mul_add", "x"}: pass\n') == [(1, ("gelu", "mul_add"))]
    assert family_lists('D = {"adaln": _a, "linear": _l}\n') == [(1, ("adaln", "linear"))]
    assert family_lists('D = {"k": "gemv", "j": "kv_attention"}\n') == [(1, ("gemv", "kv_attention"))]
    assert family_lists('x = ("rms_norm",)\nif f == "rope": pass\n') == []  # one name is no list


def test_no_module_outside_the_table_lists_families():
    found = [(rel, line, names) for rel, text in _sources() for line, names in family_lists(text)]
    unexplained = [f"{rel}:{line}: {names}" for rel, line, names in found if (rel, names) not in ALLOWED]
    assert not unexplained, "a list of pattern families outside fusegraph/fusion/patterns/ (derive it from " \
                            "patterns.FAMILIES):\n" + "\n".join(unexplained)
    # every allowance is still needed: a stale entry would let a real family list in under its name
    stale = set(ALLOWED) - {(rel, names) for rel, _, names in found}
    assert not stale, f"ALLOWED entries that match nothing any more: {sorted(stale)}"


def test_each_family_is_one_object_in_its_own_module():
    files = {p.stem for p in PATTERNS.glob("*.py") if not p.stem.startswith("_")}
    assert set(FAMILY_NAMES) == files  # a family per module, every family module in the table
    assert sorted(PATTERN_NAMES) == sorted(FAMILY_NAMES)
    for f in FAMILIES:
        assert isinstance(f, Family)
        assert f.module.__name__ == f"fusegraph.fusion.patterns.{f.name}"
        assert f.module.FAMILY is f and BY_NAME[f.name] is f
        assert f.candidates and all(isinstance(c, Candidate) for c in f.candidates), f.name
        assert f.ops, f.name
        for op in f.ops:
            assert isinstance(overload(op), OpOverload), (f.name, op)
        assert set(f.lowerings) <= set(f.ops)
        assert f.calibrated == bool(f.lowerings), f"{f.name}: the choice weighs what it can lower and measure"
        shared = [g for g in FAMILIES if set(g.ops) & set(f.ops)]
        if len(shared) > 1:
            assert all(g.claims is not None for g in shared), f"{f.name}: an op shared without claims"


def test_choice_derives_from_the_table():
    assert choice.CALIBRATED == tuple(f.name for f in FAMILIES if f.calibrated)
    lowerings = choice._lowerings()
    assert set(lowerings) == {overload(op) for f in FAMILIES for op in f.lowerings}
    for f in FAMILIES:
        for op, fn in f.lowerings.items():
            assert lowerings[overload(op)] is fn
    assert set(choice._ops()) == set(lowerings)


@pytest.mark.parametrize("family", [f.name for f in FAMILIES if f.calibrated])
def test_a_calibration_site_is_its_familys(family):
    """The family's calibration site is a call of one of its ops that ``family_of`` gives back to it."""
    target, args, kwargs = choice._site_args(family, 1 << 10, torch.float32, torch.device("cpu"))
    assert target in {overload(op) for op in BY_NAME[family].ops}
    graph = torch.fx.Graph()
    node_args = tuple(graph.placeholder(f"a{i}") if isinstance(a, torch.Tensor) else a for i, a in enumerate(args))
    node = graph.call_function(target, node_args, kwargs)
    assert choice.family_of(node) == family
    assert target(*args, **kwargs).numel() > 0


def test_explain_derives_from_the_table():
    explain = importlib.import_module("fusegraph.explain")  # the module (``fusegraph.explain`` is the function)
    assert list(explain.CANDIDATES) == list(FAMILY_NAMES)
    assert all(explain.CANDIDATES[f.name] == f.candidates for f in FAMILIES)


@pytest.mark.parametrize("family", [f.name for f in FAMILIES if f.forms])
def test_the_forms_are_what_the_family_registers(family):
    """Every pattern the family registers comes from one of its Form records, and every record registers one."""
    from fusegraph.config import CompilationConfig
    from fusegraph.fusion import passes

    explain = importlib.import_module("fusegraph.explain")
    registered = set()
    for approximation in ("tanh", "sigmoid"):  # gelu's option picks the replacement
        opts = CompilationConfig(fusion_patterns={"gelu_approximation": approximation}).fusion_patterns
        pm = passes.pattern_pass(family, opts)
        registered |= {explain._entry_parts(e)[0] for entries in pm.patterns.values() for e in entries}
    assert registered == {form.search for form in BY_NAME[family].forms}
