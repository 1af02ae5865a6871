"""Tracing a search pattern the way aot_autograd traces the model: decomposed AND functionalized.

``fwd_only`` (Inductor's) decomposes with ``make_fx`` but does not functionalize, so a decomposition that
writes in place (``torch.rms_norm``'s ``add_``) or a source that does (Wan's RoPE fills ``empty_like`` through
slices) would never line up with the model's functional graph. ``fwd_functional`` traces twice: once with the
decompositions, then that graph again under ``torch.func.functionalize``, then the same clean-up as
``fwd_only``.

Under symbolic shapes every trace here ends with :func:`canonical_symbols`, as the pass manager's redundant-node
pass does to the model's graph, so that both sides spell each symbolic size alike (see there).
"""
from __future__ import annotations

import contextvars

import torch
from ..._core.torch_fake import enable_python_dispatcher
from ..._core.torch_inductor import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx

_SYM_TYPES = (torch.SymInt, torch.SymFloat, torch.SymBool)


def _sym_key(node: torch.fx.Node):
    """(type, simplified expression) of a node whose value is a SymInt/SymFloat/SymBool, else None."""
    val = node.meta.get("val", node.meta.get("example_value"))
    if not isinstance(val, _SYM_TYPES):
        return None
    try:
        sym = val.node
        return type(val), sym.shape_env.simplify(sym.expr) if sym.shape_env is not None else sym.expr
    except Exception:  # a symbol without a shape environment: left as it is
        return None


def canonical_symbols(graph: torch.fx.Graph) -> int:
    """One node per symbolic value: every SymInt/SymFloat/SymBool node whose (simplified) expression an earlier
    node already has — a graph input first — is replaced by that node, and the nodes left without users dropped.
    Returns the number of nodes replaced.

    Why: a symbolic size reaches a graph in as many spellings as the program computed it — a ``sym_size`` of an
    intermediate tensor, Dynamo's ``sym_sum`` of two inputs, the input symbol itself — while the exact re-check of
    a pattern match (``register_replacement`` re-traces the search function on the match's own shapes, with the
    sizes' symbols as inputs) spells it one way. Two spellings of one value in a match (Flux 2's RoPE: the pair
    reshape's ``sym_sum``, the flatten's ``sym_size(q, 1)``) failed that check, and a ``sym_size`` read of a
    tensor inside a match is one more user of it, which the first match refuses (``multiple_users``). With one
    node per value on both sides the re-check compares what it compares on static graphs."""
    first: dict = {}
    replaced = 0
    for node in list(graph.nodes):
        key = _sym_key(node)
        if key is None:
            continue
        if key in first and node.op == "call_function":
            node.replace_all_uses_with(first[key])
            graph.erase_node(node)
            replaced += 1
        else:
            first.setdefault(key, node)
    if replaced:
        graph.eliminate_dead_code()
    return replaced


def _canonical(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    if canonical_symbols(gm.graph):
        gm.recompile()
    return gm


def fwd_functional(fn, args, *, get_decomp_fn=select_decomp_table, **_):
    """Drop-in ``trace_fn`` for ``register_replacement`` (accepts the newer ``get_decomp_fn`` keyword)."""
    from ..._core.torch_inductor import remove_noop_ops

    with enable_python_dispatcher():
        decomposed = make_fx(fn, get_decomp_fn(), tracing_mode="real")(*args)
        gm = make_fx(torch.func.functionalize(decomposed), tracing_mode="real")(*args)
    remove_noop_ops(gm.graph)
    gm.graph.eliminate_dead_code()
    canonical_symbols(gm.graph)
    gm.recompile()
    return gm


def fwd_only_canonical(fn, args, **kwargs):
    """Inductor's ``fwd_only``, then :func:`canonical_symbols` (gelu and mul_add trace with it)."""
    from ..._core.torch_pattern_matcher import fwd_only

    return _canonical(fwd_only(fn, args, **kwargs))


def fwd_functional_reshape(fn, args, **kwargs):
    """``fwd_functional`` with every ``view`` written as ``reshape``: the form Inductor's freezing leaves the
    graph in (``view_to_reshape``) when the fusion runs as its post-grad pass."""
    gm = fwd_functional(fn, args, **kwargs)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    gm.recompile()
    return gm


# ---- the exact re-check of a match under symbolic shapes ---------------------------------------------------


def _value(x):
    return x.meta.get("val", x.meta.get("example_value")) if isinstance(x, torch.fx.Node) else x


def _symbolic(x) -> bool:
    if isinstance(x, _SYM_TYPES):
        return True
    return isinstance(x, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in (*x.shape, *x.stride()))


def _same_value(a, b) -> bool:
    """Two sizes or scalars, either possibly symbolic, equal for every value of the symbols."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    if isinstance(a, (bool, torch.SymBool)) or isinstance(b, (bool, torch.SymBool)):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if not isinstance(a, (int, float, torch.SymInt, torch.SymFloat)) or \
            not isinstance(b, (int, float, torch.SymInt, torch.SymFloat)):
        return False
    try:
        return bool(statically_known_true(a == b))
    except Exception:
        return False


def same_structure(traced: torch.fx.GraphModule, match, argnames) -> bool:
    """Whether the search function's trace on a match's own (symbolic) shapes is, op for op and argument for
    argument, the matched subgraph: placeholders are the match's arguments; a symbolic value (a size, a ``sym_size``
    read, Dynamo's ``sym_sum``) equals whatever node or number in the graph has the same value for every value of
    the symbols (``statically_known_true``), however either side spells it; every other argument is compared as
    the pattern matcher compares it (ints, floats, dtypes, lists exactly)."""
    placeholders = traced.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(argnames):
        return False
    bound = {p: match.kwargs.get(name) for p, name in zip(placeholders, argnames)}
    outputs = traced.graph.output_node().args[0]
    outputs = list(outputs) if isinstance(outputs, (list, tuple)) else [outputs]
    roots = match.output_nodes()
    if len(outputs) != len(roots):
        return False
    seen: dict = {}

    def same(p, g) -> bool:
        if isinstance(p, torch.fx.Node):
            if p in bound:
                b = bound[p]
                return g is b if isinstance(b, torch.fx.Node) else (not isinstance(g, torch.fx.Node) and g == b)
            pval = _value(p)
            if isinstance(pval, _SYM_TYPES):  # a symbolic value: compared by value, not by how it is computed
                return _same_value(pval, _value(g))
            if p.op != "call_function" or not isinstance(g, torch.fx.Node) or g.op != "call_function" or \
                    g.target != p.target:
                return False
            if p in seen:
                return seen[p] is g
            seen[p] = g
            return same(list(p.args), list(g.args)) and same(dict(p.kwargs), dict(g.kwargs))
        if isinstance(g, torch.fx.Node):  # a number in the pattern, a symbolic value in the graph
            return isinstance(_value(g), _SYM_TYPES) and _same_value(p, _value(g))
        if isinstance(p, (list, tuple)):
            return isinstance(g, (list, tuple)) and len(p) == len(g) and all(same(a, b) for a, b in zip(p, g))
        if isinstance(p, dict):
            return isinstance(g, dict) and p.keys() == g.keys() and all(same(p[k], g[k]) for k in p)
        if isinstance(p, (torch.SymInt, torch.SymFloat)):
            return _same_value(p, g)
        return p == g

    return all(same(p, g) for p, g in zip(outputs, roots))


def symbolic_recheck(search_fn, replace_fn, example_inputs, trace_fn, check=None):
    """The exact re-check ``register_replacement`` makes of a match, for matches with symbolic shapes: the search
    function traced on the match's own values (its symbolic shapes), compared with the match by
    :func:`same_structure`, then ``check``; on success the replacement traced on the same values
    (``match.replacement_graph``), as ``register_replacement``'s own check leaves it.

    ``register_replacement``'s check compares that trace's symbolic sizes node for node: a size is a
    ``sym_size`` read of a pattern input there (it passes only symbols provably distinct from each other as
    inputs), and whatever the program computed in the model's graph (Dynamo's ``sym_sum`` of two inputs, a read of
    another tensor), so under ``dynamic=True`` RoPE's reshapes never passed it. Returns None for a form this
    cannot re-check (an argument that is no tensor or number): then the matcher's own check decides."""
    import inspect

    from ..._core.torch_fake import detect_fake_mode

    argnames = list(inspect.signature(search_fn).parameters)
    if len(argnames) != len(example_inputs) or not all(
            isinstance(x, (torch.Tensor, int, float)) for x in example_inputs):
        return None

    def run(match) -> bool:
        if any(name not in match.kwargs for name in argnames):
            return False
        values = [_value(match.kwargs[name]) for name in argnames]
        fake_mode = detect_fake_mode(values)
        if fake_mode is None:
            return False
        with fake_mode:
            args = [torch.empty_strided(v.size(), v.stride(), dtype=v.dtype, device=v.device)
                    if isinstance(v, torch.Tensor) else v for v in values]
            try:
                traced = trace_fn(search_fn, args)
            except RuntimeError:
                return False
            if not same_structure(traced, match, argnames):
                return False
            if check is not None and not check(match):
                return False
            match.replacement_graph = trace_fn(replace_fn, args)
        return True

    return run


def is_symbolic_match(match) -> bool:
    """A match whose arguments have symbolic shapes or values, or whose nodes take symbolic arguments."""
    if any(_symbolic(_value(v)) for v in match.kwargs.values()):
        return True
    for node in match.nodes:
        for a in node.args:
            for x in (a if isinstance(a, (list, tuple)) else (a,)):
                if isinstance(x, torch.fx.Node) and isinstance(_value(x), _SYM_TYPES):
                    return True
    return False


# The match an entry's check was called with, while that check runs (see ``kwarg``).
_MATCH = contextvars.ContextVar("fusegraph_match", default=None)


def kwarg(match, name):
    """``match.kwargs[name]``, or the same wildcard of the match the entry's check was called with. torch 2.11's
    ``register_replacement`` re-checks a match on a specific trace of the search function in which a Python
    number (an ``eps``, a scalar factor) is an ignored constant, so the match our check receives leaves that
    wildcard unbound; the match the matcher found binds it (torch 2.13 binds it in both). None when neither has it."""
    if name in match.kwargs:
        return match.kwargs[name]
    outer = _MATCH.get()
    return outer.kwargs.get(name) if outer is not None else None


def on_symbolic(static_check, symbolic_check):
    """An entry's check: ``static_check`` (the matcher's own re-check) on static matches, ``symbolic_check`` on
    symbolic ones (:func:`symbolic_recheck`); the match is kept for ``kwarg`` while either runs."""

    def check(match) -> bool:
        token = _MATCH.set(match)
        try:
            if symbolic_check is not None and is_symbolic_match(match):
                return symbolic_check(match)
            return static_check(match)
        finally:
            _MATCH.reset(token)

    return check

