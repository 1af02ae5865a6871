"""The package's shape, enforced: every import in ``fusegraph/`` (lazy ones inside functions included) goes down the
layer order of docs/DESIGN.md §1 or stays in its layer, no modules import each other in a circle, and only the
adaptor modules ``fusegraph/_core/torch_*.py`` touch torch's private names (``torch._inductor``, ``torch.utils._pytree``,
``torch._C``...), so a torch upgrade has one place to look.

The check is a walk over the source's ``ast`` rather than import-linter: import-linter cannot forbid sub-packages
of an external package (``torch._inductor``), which is the third rule, and the walk serves all three."""
from __future__ import annotations

import ast
import pathlib

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "fusegraph"

# Lowest first. A module belongs to the first layer one of whose prefixes it has (a prefix matches the module or its
# submodules). ``fusegraph`` itself, the package's front, is the top: that entry names the module alone (EXACT), so
# a new fusegraph.* module is in no layer until it is listed.
LAYERS = (
    ("core", ("fusegraph._C", "fusegraph._core")),
    ("ops", ("fusegraph.ops",)),
    ("fusion", ("fusegraph.fusion", "fusegraph.config", "fusegraph.stats")),
    ("graph", ("fusegraph.graph",)),
    ("compile", ("fusegraph.packing", "fusegraph.freezing", "fusegraph.pipeline", "fusegraph.backend", "fusegraph.aot")),
    ("tools", ("fusegraph.explain", "fusegraph.zoo", "fusegraph.bench", "fusegraph.__main__", "fusegraph")),
)
EXACT = {"fusegraph"}  # names that match the module itself, not its submodules
ADAPTORS = "fusegraph._core.torch_"  # the modules allowed to name torch's private API


def layer_of(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or (p not in EXACT and module.startswith(p + ".")) for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer of tests/test_layers.py's LAYERS: add it")


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str, root: pathlib.Path) -> bool:
    rel = pathlib.Path(*name.split("."))
    base = root.parent / rel
    return base.with_suffix(".py").exists() or (base / "__init__.py").exists() or name.endswith("._C")


def imports_of(path: pathlib.Path, root: pathlib.Path) -> list:
    """[(imported module, line)] for every import statement in the file, wherever it stands."""
    module = module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                source = ".".join(base + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for a in node.names:  # ``from pkg import mod`` imports the module pkg.mod
                sub = f"{source}.{a.name}"
                found.append((sub if _is_module(sub, root) else source, node.lineno))
    return found


def private_torch_uses(path: pathlib.Path) -> list:
    """[(what, line)]: imports from a private torch module or of a private torch name, and ``torch._x`` attribute
    chains (dunders such as ``torch.__version__`` are public)."""
    def private(dotted: str) -> bool:
        parts = dotted.split(".")
        return parts[0] == "torch" and any(p.startswith("_") and not p.startswith("__") for p in parts[1:])

    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(a.name, node.lineno) for a in node.names if private(a.name)]
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found += [(f"{node.module}.{a.name}", node.lineno) for a in node.names
                      if private(node.module) or (node.module.split(".")[0] == "torch" and a.name.startswith("_"))]
        elif isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "torch":
            if node.attr.startswith("_") and not node.attr.startswith("__"):
                found.append((f"torch.{node.attr}", node.lineno))
    return found


def graph_of(root: pathlib.Path) -> dict:
    """module -> {imported fusegraph module: first line}, the implicit imports of parent packages left out."""
    edges = {}
    for path in sorted(root.rglob("*.py")):
        module = module_name(path, root)
        out = edges.setdefault(module, {})
        for imported, line in imports_of(path, root):
            if imported.split(".")[0] == root.name and imported != module:
                out.setdefault(imported, line)
    return edges


def cycles(edges: dict) -> list:
    """The strongly connected components with more than one module (Tarjan)."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def upward(edges: dict) -> list:
    return [f"{m} (layer {LAYERS[layer_of(m)][0]}) imports {i} (layer {LAYERS[layer_of(i)][0]}) at line {line}"
            for m, out in sorted(edges.items()) for i, line in out.items() if layer_of(i) > layer_of(m)]


def test_every_module_has_a_layer():
    for module in graph_of(PACKAGE):
        layer_of(module)


def test_no_import_goes_up_a_layer():
    assert upward(graph_of(PACKAGE)) == []


def test_no_import_circles():
    assert cycles(graph_of(PACKAGE)) == []


def test_private_torch_only_through_adaptors():
    bad = [f"{path.relative_to(ROOT)}:{line}: {what}" for path in sorted(PACKAGE.rglob("*.py"))
           if not module_name(path, PACKAGE).startswith(ADAPTORS) for what, line in private_torch_uses(path)]
    assert bad == []


def test_the_checks_can_fail(tmp_path):
    """The three checks on a made-up package with one of each fault."""
    pkg = tmp_path / "fusegraph"
    for rel, text in {
        "__init__.py": "",
        "ops/__init__.py": "",
        "ops/a.py": "def f():\n    from ..backend import x\n",  # lazy, and up two layers
        "backend.py": "from .ops import a\nfrom . import freezing\n",
        "freezing.py": "import torch\n\ndef g():\n    from fusegraph import backend\n    return torch._dynamo\n",
        "fusion/__init__.py": "from torch._inductor.pattern_matcher import Match\n",
    }.items():
        (pkg / rel).parent.mkdir(parents=True, exist_ok=True)
        (pkg / rel).write_text(text)
    edges = graph_of(pkg)
    assert upward(edges) == ["fusegraph.ops.a (layer ops) imports fusegraph.backend (layer compile) at line 2"]
    assert cycles(edges) == [["fusegraph.backend", "fusegraph.freezing", "fusegraph.ops.a"]] or \
        ["fusegraph.backend", "fusegraph.freezing"] in cycles(edges)
    assert private_torch_uses(pkg / "freezing.py") == [("torch._dynamo", 5)]
    assert private_torch_uses(pkg / "fusion/__init__.py") == [("torch._inductor.pattern_matcher.Match", 1)]
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("elsewhere.module")
    with pytest.raises(AssertionError, match="in no layer"):
        layer_of("fusegraph.brand_new_module")
