"""Host graph (CPU "device graph"): an aten-level FX graph turned into a C++ program (csrc/graph/host_graph.*).

``build_host_graph(gm)`` walks the FX graph once: each ``call_function`` node whose target is an
``OpOverload`` (aten::*, fusegraph::*, any dispatcher op) becomes an ``OperatorHandle`` with IValue argument
templates; node results are referenced by slot (``ValueRef``); ``operator.getitem`` on a multi-output op is
resolved to that output's slot, on a list result to an element reference; ``get_attr`` tensors are held as
constants. The C++ loop then replays it with ``callBoxed`` — no Python per op. A node it cannot represent
(a Python callable, a higher-order op, call_module/call_method) makes ``build_host_graph`` return the reason
instead, and the caller runs the FX graph's own Python code.
"""
from __future__ import annotations

import operator

import torch
import torch.fx

from .. import _C
from .._core.torch_dispatcher import pytree, single_overload
from .._core.torch_fake import FakeTensorMode

ValueRef = _C.graph.ValueRef
HostGraph = _C.graph.HostGraph


class Unsupported(Exception):
    """A node the host graph cannot run; the message is the reason logged and counted in stats."""


class DataDependent(RuntimeError):
    """The traced call has an op whose output shape follows the input's values (``nonzero``, a boolean mask
    index...): a real-mode trace fixes that shape, and everything computed from it, to the traced call's, so no
    graph of it is right for other values. The call's signature runs uncaptured."""


def trace_aten(fn, tensors):
    """``fn(*tensors)`` traced to an aten-level FX graph (make_fx, real tensors, no grad): the ops the eager
    call dispatches after autograd, composite ops decomposed, custom (fusegraph::) ops kept whole. Raises
    ``DataDependent`` for a graph whose shapes depend on the inputs' values."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with torch.no_grad():
        gm = make_fx(fn, tracing_mode="real")(*tensors)
    why = data_dependent(gm)
    if why:
        raise DataDependent(why)
    return gm


_DATA_TAGS = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)


def data_dependent(gm: torch.fx.GraphModule) -> str | None:
    """Why ``gm`` (traced with real tensors) holds a value- or shape-from-data op, or None. Integer indexing
    (``aten.index.Tensor`` without a boolean index), ``one_hot`` with ``num_classes`` and ``repeat_interleave``
    with ``output_size`` have shapes from their arguments' shapes and are fine."""
    for n in gm.graph.nodes:
        target = single_overload(n.target) if n.op == "call_function" else None
        if target is None or not any(tag in target.tags for tag in _DATA_TAGS):
            continue
        name = target.name()
        if name == "aten::index.Tensor":
            indices = n.args[1] if len(n.args) > 1 else n.kwargs.get("indices", ())
            vals = [i.meta.get("val") for i in indices if isinstance(i, torch.fx.Node)]
            if all(isinstance(v, torch.Tensor) and v.dtype not in (torch.bool, torch.uint8) for v in vals):
                continue
        elif name == "aten::one_hot":
            classes = n.args[1] if len(n.args) > 1 else n.kwargs.get("num_classes", -1)
            if isinstance(classes, int) and classes >= 0:
                continue
        elif name == "aten::repeat_interleave.Tensor":
            if n.kwargs.get("output_size") is not None:
                continue
        return (f"{target} (node {n.name}) makes a shape or value from the input's data; a graph would fix it to "
                "the captured call's")
    return None


def trace_fused(fn, tensors, fusion_patterns, *, verify=False):
    """``fn(*tensors)`` as a fused aten graph, the form GraphRunner captures: traced (``trace_aten``: the plain
    graph), then traced again functionalized and decomposed with ``passes.decompositions()`` (the graph form the
    backend's passes run on, aot_autograd's), then fused by the backend's passes (``passes.fuse_graph``) with
    ``fusion_patterns``. Returns (fused graph or None when nothing fused, {family: sites fused}, plain graph)."""
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    from ..fusion import passes

    plain = trace_aten(fn, tensors)
    # Tensors fn holds and writes in place (a module's KV cache buffer) are constants of the trace; functionalization
    # cannot write a constant (an internal assert: "mutating a non-functional tensor with a functional tensor"), so
    # they are traced as extra inputs, whose writes it can, and made constants of the fused graph again.
    lifted, state = _lift_written_constants(plain)
    with torch.no_grad():
        try:
            gm = make_fx(torch.func.functionalize(lifted, remove="mutations"), tracing_mode="real",
                         decomposition_table=passes.decompositions())(*tensors, *state)
        except RuntimeError as e:
            if "mutating a non-functional tensor" not in str(e):
                raise
            raise RuntimeError(f"functionalization cannot trace an in-place write to a tensor fn holds (not an input) "
                               f"in {_writes_of(plain) or 'the function'}") from None
        # one fake mode for every node's "val" (the patterns' checks compare them; make_fx's real mode makes one
        # fake mode per node)
        mode = FakeTensorMode(allow_non_fake_inputs=True)
        FakeTensorProp(gm, mode).propagate_dont_convert_inputs(*[mode.from_tensor(t) for t in (*tensors, *state)])
    _constants_again(gm, len(tensors), state)
    counts = passes.fuse_graph(gm, fusion_patterns, stats=None, verify_inputs=list(tensors) if verify else None,
                               reshape_views=True)
    # Functionalized, the graph writes its inputs at its end (copy_ of each input's final value), right only while
    # no two inputs share memory: ``build_host_graph`` builds the plain trace beside it for calls where they do.
    gm.meta[UNFUSED] = plain
    return (gm if any(counts.values()) else None), counts, plain


def _aliases_first_argument(n) -> bool:
    target = single_overload(n.target) if n.op == "call_function" else None
    return target is not None and any(r.alias_info is not None for r in target._schema.returns) and bool(n.args)


def _written(gm):
    """(node, written argument node) for each in-place write in ``gm`` (schema alias annotations)."""
    for n in gm.graph.nodes:
        target = single_overload(n.target) if n.op == "call_function" else None
        if target is None or not target._schema.is_mutable:
            continue
        for i, arg in enumerate(target._schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = n.args[i] if i < len(n.args) and not arg.kwarg_only else n.kwargs.get(arg.name)
            for v in (value if isinstance(value, (list, tuple)) else [value]):
                if isinstance(v, torch.fx.Node):
                    yield n, v


def _writes_of(gm) -> str:
    """The ops of ``gm`` that write a constant (a get_attr tensor, or a view of one), named for an error."""
    names = []
    for n, v in _written(gm):
        while _aliases_first_argument(v) and isinstance(v.args[0], torch.fx.Node):
            v = v.args[0]
        if v.op == "get_attr" and str(n.target) not in names:
            names.append(str(n.target))
    return ", ".join(names)


def _lift_written_constants(plain):
    """(graph, tensors): ``plain`` with each constant tensor it writes in place (directly or through a view) made an
    extra input after its own, and those tensors; ``plain`` itself when it writes none. make_fx gives each access to a
    constant a get_attr node of its own (``_tensor_constant0``, ``_tensor_constant0_1``: a KV cache written through
    a slice, then read): every node of a written tensor becomes the same input, or functionalization would order
    the read before the write. A constant that is another tensor on a written one's memory (a view held apart)
    cannot be lifted with it: fusion is refused for such a graph (the plain trace runs)."""
    def value(node):
        obj = plain
        for part in node.target.split("."):
            obj = getattr(obj, part)
        return obj

    roots = []
    for _, v in _written(plain):
        while _aliases_first_argument(v) and isinstance(v.args[0], torch.fx.Node):
            v = v.args[0]
        if v.op == "get_attr" and v not in roots:
            roots.append(v)
    if not roots:
        return plain, []
    state = []
    for root in roots:
        obj = value(root)
        if not any(obj is t for t in state):
            state.append(obj)
    storages = {t.untyped_storage().data_ptr(): t for t in state if isinstance(t, torch.Tensor)}
    uses = {}  # get_attr node -> index into state
    for node in plain.graph.find_nodes(op="get_attr"):
        obj = value(node)
        if not isinstance(obj, torch.Tensor):
            continue
        k = next((i for i, t in enumerate(state) if t is obj), None)
        if k is None:
            if obj.untyped_storage().data_ptr() in storages:
                raise RuntimeError(f"functionalization cannot trace an in-place write to a tensor fn holds (not an "
                                   f"input) that another constant ({node.target}) views")
            continue
        uses[node] = k
    graph = torch.fx.Graph()
    env: dict = {}
    out = graph.graph_copy(plain.graph, env)
    last = [n for n in graph.nodes if n.op == "placeholder"]
    placeholders = []
    for k in range(len(state)):
        with graph.inserting_after(last[-1] if last else None):
            p = graph.placeholder(f"fusegraph_state_{k}")
        last.append(p)
        placeholders.append(p)
    for node, k in uses.items():
        copy = env[node]
        copy.replace_all_uses_with(placeholders[k])
        graph.erase_node(copy)
    graph.output(out)
    return torch.fx.GraphModule(plain, graph), state  # plain's constants, shared


def _constants_again(gm, num_inputs: int, state) -> None:
    """The inputs past ``num_inputs`` of ``gm`` (``_lift_written_constants``'s) made constants (get_attr) again: the
    functionalized graph's final ``copy_`` into them writes the tensors fn holds, as fn did."""
    placeholders = gm.graph.find_nodes(op="placeholder")[num_inputs:]
    for k, (p, t) in enumerate(zip(placeholders, state)):
        name = f"_fusegraph_state_{k}"
        gm.register_buffer(name, t, persistent=False)  # the tensor itself: its writes are fn's
        with gm.graph.inserting_before(p.next):
            attr = gm.graph.get_attr(name)
        attr.meta = dict(p.meta)
        p.replace_all_uses_with(attr)
        gm.graph.erase_node(p)
    if state:
        gm.graph.lint()
        gm.recompile()


# ``gm.meta`` key of a fused (functionalized) graph: the plain trace of the same call (``trace_fused``)
UNFUSED = "fusegraph_unfused"


def build_host_graph(gm: torch.fx.GraphModule) -> HostGraph:
    """The C++ host graph of ``gm`` (placeholders are its tensor inputs, in order; its output a flat list or
    tuple). Raises ``Unsupported`` naming the first node it cannot represent. A fused graph of ``trace_fused`` that
    writes its inputs also holds the host graph of the plain trace, run instead on a call where an input it writes
    shares storage with another input (``HostGraph.set_alias_fallback``)."""
    graph = _build(gm)
    plain = gm.meta.get(UNFUSED)
    if plain is not None and graph.written_inputs:
        try:
            graph.set_alias_fallback(_build(plain))
        except Unsupported as e:  # then no graph of this call is right for inputs sharing memory
            raise Unsupported(f"the unfused trace of a graph that writes its inputs: {e}") from e
    return graph


def _build(gm: torch.fx.GraphModule) -> HostGraph:
    """``build_host_graph`` of one graph."""
    nodes = list(gm.graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    graph = HostGraph(len(placeholders))
    env = {}  # node -> ValueRef, a constant, or ("multi", first_slot, count) for multi-result ops
    for i, n in enumerate(placeholders):
        env[n] = ValueRef(i)

    def value(a):
        if isinstance(a, torch.fx.Node):
            v = env[a]
            if isinstance(v, tuple):
                raise Unsupported(f"node {a.name} ({a.target}) returns several values and is used whole")
            return v
        if isinstance(a, (list, tuple)):
            return type(a)(value(x) for x in a)
        if isinstance(a, dict):
            raise Unsupported(f"dict argument {a!r}")
        return a

    for n in nodes:
        if n.op == "placeholder":
            continue
        if n.op == "get_attr":
            obj = gm
            for part in n.target.split("."):
                obj = getattr(obj, part)
            if not isinstance(obj, torch.Tensor):
                raise Unsupported(f"get_attr {n.target} is a {type(obj).__name__}, not a tensor")
            env[n] = obj
        elif n.op == "call_function" and n.target is operator.getitem:
            src, idx = n.args
            v = env.get(src) if isinstance(src, torch.fx.Node) else None
            if isinstance(v, tuple):  # an op with several returns: its i-th result slot
                _, first, count = v
                if not isinstance(idx, int) or not 0 <= idx < count:
                    raise Unsupported(f"getitem {idx!r} on {src.name} with {count} results")
                env[n] = ValueRef(first + idx)
            elif isinstance(v, ValueRef) and v.item < 0 and isinstance(idx, int):  # element of a list result
                env[n] = ValueRef(v.slot, idx)
            else:
                raise Unsupported(f"getitem on {src!r}")
        elif n.op == "call_function" and single_overload(n.target) is not None:
            target = single_overload(n.target)
            schema = target._schema
            try:
                first = graph.add_node(schema.name, schema.overload_name, [value(a) for a in n.args],
                                       {k: value(v) for k, v in n.kwargs.items()})
            except Unsupported:
                raise
            except Exception as e:  # an argument the dispatcher's types cannot hold
                raise Unsupported(f"{target}: {str(e).splitlines()[0]}") from e
            count = len(schema.returns)
            env[n] = ValueRef(first) if count == 1 else ("multi", first, count) if count > 1 else None
        elif n.op == "output":
            outs = pytree.tree_leaves(n.args[0])
            if not isinstance(n.args[0], (list, tuple)) or len(outs) != len(n.args[0]):
                raise Unsupported("the graph output is not a flat list or tuple")
            graph.set_outputs([value(o) for o in outs])
        else:
            target = getattr(n.target, "__name__", repr(n.target))
            raise Unsupported(f"unsupported node {n.op} {target}")
    graph.finalize()
    return graph


_SYM = (torch.SymInt, torch.SymFloat, torch.SymBool)


def specialize(gm: torch.fx.GraphModule, args) -> "torch.fx.GraphModule | None":
    """``gm``, an aten graph compiled for symbolic sizes (SymInt and tensor inputs: the backend's graph under
    ``dynamic=True`` or automatic dynamic shapes), as a graph of the tensor inputs alone for the sizes of ``args``
    (the call's values, one per input): every symbol bound from the SymInt inputs and the tensors' sizes, every
    size the graph computes (``sym_size``, ``sym_sum``, arithmetic) written as its number, the SymInt inputs dropped,
    size assertions that hold dropped. The graph's ops and their order are kept: what was fused stays fused. None
    when a size does not follow from the inputs (a data-dependent size) or the inputs contradict the graph's
    sizes; the caller then traces the call (``trace_aten``). No trace, no fake tensors: the host driver builds the
    host graph from the result as it builds a static graph's."""
    import sympy

    placeholders = gm.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(args):
        return None
    bound: dict = {}

    def bind(size, actual) -> bool:
        if isinstance(size, torch.SymInt):
            expr = size.node.expr
            if isinstance(expr, sympy.Symbol):
                if bound.setdefault(expr, sympy.Integer(actual)) != actual:
                    return False
        return True

    for node, a in zip(placeholders, args):
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, _SYM):
            if not isinstance(val, torch.SymInt) or isinstance(a, bool) or not isinstance(a, int) or not bind(val, a):
                return None
        elif isinstance(val, torch.Tensor):
            if not isinstance(a, torch.Tensor) or a.dim() != val.dim():
                return None
            if not all(bind(s, n) for s, n in zip((*val.shape, *val.stride()), (*a.shape, *a.stride()))):
                return None

    def number(val):
        if not isinstance(val, _SYM):
            return val
        try:
            v = val.node.expr.xreplace(bound)
        except Exception:
            return None
        if isinstance(val, torch.SymBool):
            return bool(v) if v in (sympy.true, sympy.false, True, False) else None
        if not isinstance(v, (int, float)) and not getattr(v, "is_number", False):
            return None
        return int(v) if isinstance(val, torch.SymInt) else float(v)

    # the tensors' sizes as the graph computed them must be the call's
    for node, a in zip(placeholders, args):
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, torch.Tensor) and any(number(s) != n for s, n in zip(val.shape, a.shape)):
            return None
    graph = torch.fx.Graph()
    env: dict = {}
    graph.output(graph.graph_copy(gm.graph, env))
    for node in list(graph.nodes):
        if node.op == "output":
            continue
        val = node.meta.get("val", node.meta.get("example_value"))
        if isinstance(val, _SYM):
            n = number(val)
            if n is None:
                return None
            for user in list(node.users):
                user.args = torch.fx.map_arg(user.args, lambda x, node=node, n=n: n if x is node else x)
                user.kwargs = torch.fx.map_arg(user.kwargs, lambda x, node=node, n=n: n if x is node else x)
            graph.erase_node(node)
        elif node.op == "call_function" and node.target is torch.ops.aten._assert_scalar.default:
            if node.args[0] is not True:
                return None  # a size assertion that does not hold for these sizes
            graph.erase_node(node)
    graph.lint()
    return torch.fx.GraphModule(gm, graph)
