"""Batch buckets (``CompilationConfig.graph_batch_buckets``, vLLM's capture sizes): one graph per bucket, not
one per batch size.

    runner = GraphRunner(fn, {"graph_batch_buckets": (1, 2, 4, 8)})            # automatic batch rule
    runner = GraphRunner(fn, {"graph_batch_buckets": (1, 2, 4, 8)}, batch_args=(0, "mask"))   # explicit

Only correct for functions whose rows along dim 0 are independent (row i of every output depends only on row i
of the batched inputs, as in a per-token MLP/norm or a per-sample decode step; not a batch norm, a sum over the
batch, a softmax over dim 0, or attention across the batch). That is checked from the trace (below, "Which
functions are bucketed"); a function that fails the check is captured per batch size exactly. A call of batch
size B:

- B equal to a bucket: runs as it is (no copy, no slicing).
- B below the largest bucket: every batched input is padded up to the smallest bucket >= B by repeating its
  last real row (one ``index_select`` with a cached row index: one new tensor per batched input per call;
  padded rows are real data, so they stay finite: no NaN/inf from zero rows); that bucket's graph is captured
  once and replayed; every tensor output whose dim 0 is the bucket is sliced back to ``[:B]`` (a view of the
  output the runner returns: a fresh clone under ``safe_output_mode``, otherwise the graph's own output
  buffer, overwritten by the next replay of that bucket, as for any output). Counted in
  ``stats.bucket_padded_calls``.
- B above the largest bucket: ``fn`` runs uncaptured (``stats.bucket_overflows`` and ``stats.eager_calls``;
  logged once per runner). B = 0 (no row to repeat) runs uncaptured too, counted in ``stats.fallbacks``.

Which inputs are batched (B is their dim 0):

- ``GraphRunner`` (automatic rule): B is dim 0 of the first tensor with ndim >= 1 among the flattened
  arguments; every tensor with ndim >= 1 and dim 0 == B is batched; outputs: every tensor with ndim >= 1 and
  dim 0 == bucket is sliced (and a ``torch.Size`` output starting with the bucket gets B back). The rule is
  ambiguous where a non-batched tensor's dim 0 happens to equal B (a [B, D] weight, a [B] table), or a
  non-batched output's dim 0 equals the bucket: pass ``batch_args`` then, or order the arguments so the first
  tensor is batched. Numbers are never changed (a function taking B as an int is keyed per value of it).
- ``GraphRunner(..., batch_args=(positions or keyword names))``: only the tensors inside those arguments are
  batched (each with ndim >= 1 must have dim 0 == B, else ValueError); B is the dim 0 of the first of them.
  Cheap (a per-argument choice, no per-leaf mask) and enough to resolve the ambiguity above.
- The backend's graph routes (exact, from the trace): Dynamo compiles a second batch size with a symbolic
  dim 0 (automatic dynamic shapes) and passes the size as a SymInt input. ``graph_batch_spec`` reads the aot
  graph's placeholder and output ``meta['val']``: the batch symbol is the first symbol, in input order, that is
  the whole dim 0 of a tensor input and appears nowhere but as such a dim 0 (of inputs and outputs) and as an
  int input or output of its own (so a sequence length that is also another tensor's dim 1 is skipped, and
  lifted parameters, static, never qualify); batched inputs are the tensors whose dim 0 is that symbol, the int
  inputs carrying it are replaced by the bucket, outputs whose dim 0 is it are sliced and int outputs equal to
  it get B back. A graph where no dim-0 symbol qualifies (the batch also in another dim, or in an expression
  such as 2*s0: a flattened batch) is not bucketed (reason counted in ``stats.fallbacks``); a static graph
  (Dynamo specialises B = 1, and the first batch size it sees) is captured as it is.

Dynamo's guards on the batch size are checked on the real B; the graph then replays at the bucket, possibly
outside the range a guard gave it (a branch on B < 4: the graph for B in [2, 3] replays at bucket 4). The rows
are still those of the side Dynamo chose, as the graph's ops depend on B only through the shapes; a bucket
reached from two such graphs is captured once per graph. A graph whose runtime asserts fail at the bucket size
fails its capture and runs that bucket uncaptured (``graph_fallback``).

Which functions are bucketed (static, from the trace): ``batch_rows_mix`` follows the batch through the aten
graph. Each node is tagged: not batched; batched in dim d with size k*B, batch-major (k = 1, or S after Linear's
[B*S, D] view); a number that is (an expression of) B; or mixed, with the reason. Each op has a rule: pointwise
ops, factories and views that move, insert or drop dims follow the output's shape (B in exactly one dim, as k*B);
reshapes must keep the product of the dims before the batch; reductions, scans, softmax, sort, flip/roll, cat,
index_select and gather must not work over the batch dim; mm/addmm/linear/gemv need the batch in the rows and a
non-batched right-hand side, bmm/matmul batch both sides alike; layer/RMS/group norm, eval batch norm, attention,
conv, pools, pads, embedding and fusegraph's ops need the batch outside the dims they reduce. B used as a value
(``x / x.shape[0]``), or as a size anywhere but a view or factory, mixes; an op without a rule mixes
(conservative). A mixed value that reaches an output, a write into a batched input, a write that depends on the
batch (batched data, or a region or value from B) into memory that the graph did not allocate batched (an input or
constant that is not batched, such as a KV cache written at ``cache[:B]``; which tensors a value may alias is read
from the ops' schema alias annotations), an output without the batch back in dim 0 with k = 1, and (graph routes) an output that is a view of a batched input (aot_autograd rebuilds it
from the caller's unpadded input) refuse the graph. The graph routes check each aot graph once
(``graph_route_batch``; the reason in ``stats.fallbacks`` as "batch buckets off for this graph: ..."). GraphRunner
checks each capture of a bucket that smaller batches pad to: ``fn`` is traced again by make_fx on fakes whose
batched dim 0 is one symbol (``_trace_symbolic``); a trace that fails, a guard on B that some batch size padded to
the bucket fails, or a non-batched output whose dim 0 is the bucket (the automatic slicing would cut it) refuse as
well. A refusal turns the runner's buckets off ("batch buckets off: ...", counted once, logged) and the call runs
unpadded; every batch size is then captured as it is. Replays run no check (a padded call reads one attribute more,
for a refusal made by another thread).

A padded call that raises re-raises the same exception type (RuntimeError where that type takes no message),
chained to the original, naming the padded inputs: "input 0 was padded from batch 3 to bucket 4
(graph_batch_buckets)".

Functions that mutate a batched input in place are refused (a padded call would mutate the padded copy), and so
are those that write batch-dependent rows into a tensor that is not batched (a padded call would write the padding
rows' part of it too, e.g. ``cache[3]`` for a call of batch 3 padded to 4). The graph routes see such a write in
their functional form (``slice_scatter`` sized by B, copied into the input), GraphRunner's trace as a write through
a view (``slice``/``narrow``/``as_strided`` + ``copy_``); the same mutation rule refuses both.
"""
from __future__ import annotations

import bisect
import logging

import torch

from .._core.torch_dispatcher import OpOverload, pytree, single_overload
from .._core.torch_dynamo import capture_lock, fx_tracing_window

_log = logging.getLogger("fusegraph.graph")


def _is_size(v) -> bool:
    return type(v) is torch.Size


class GraphBatchSpec:
    """Where an aot graph's batch symbol is (positions in its flat inputs and outputs)."""

    __slots__ = ("tensors", "ints", "out_slice", "out_ints", "out_auto", "symbol")

    def __init__(self, tensors, ints, out_slice, out_ints, out_auto, symbol):
        self.tensors, self.ints = tuple(tensors), tuple(ints)
        self.out_slice, self.out_ints, self.out_auto = tuple(out_slice), tuple(out_ints), tuple(out_auto)
        self.symbol = symbol

    def __repr__(self):
        return (f"GraphBatchSpec(symbol={self.symbol}, tensors={self.tensors}, ints={self.ints}, "
                f"out_slice={self.out_slice}, out_ints={self.out_ints}, out_auto={self.out_auto})")


def _expr(v):
    return v.node.expr if isinstance(v, torch.SymInt) else None


def graph_batch_spec(gm):
    """(GraphBatchSpec, None) for an FX graph with a symbolic batch dim 0; (None, None) for a graph without one
    (static shapes: captured as it is); (None, why) for one whose batch symbol cannot be padded.

    The batch symbol is the first symbol, in input order, that is the whole dim 0 of a tensor input and appears
    nowhere else than as dim 0 of tensor inputs and outputs and as int inputs/outputs of its own (a sequence
    length that is also dim 1 of another tensor is skipped)."""
    import sympy

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    vals = [n.meta.get("val", n.meta.get("example_value")) for n in placeholders]
    out = gm.graph.output_node().args[0]
    outs = [n.meta.get("val") if isinstance(n, torch.fx.Node) else n
            for n in (out if isinstance(out, (list, tuple)) else [out])]
    candidates = []
    for v in vals:
        if isinstance(v, torch.Tensor) and v.ndim >= 1:
            e = _expr(v.shape[0])
            if isinstance(e, sympy.Symbol) and e not in candidates:
                candidates.append(e)
    first_why = None
    for symbol in candidates:
        spec, why = _spec_for(symbol, vals, outs, out)
        if spec is not None:
            return spec, None
        first_why = first_why or why
    return None, first_why


def _spec_for(symbol, vals, outs, out):
    def uses(d) -> bool:
        e = _expr(d)
        return e is not None and symbol in e.free_symbols

    def scan(values, what):
        tensors, ints = [], []
        for i, v in enumerate(values):
            if isinstance(v, torch.Tensor):
                batched = v.ndim >= 1 and _expr(v.shape[0]) == symbol
                for k, d in enumerate(v.shape):
                    if (k > 0 or not batched) and uses(d):
                        return None, None, f"{what} {i} has the batch size {symbol} in dim {k} ({d})"
                if batched:
                    tensors.append(i)
            elif isinstance(v, torch.SymInt):
                if _expr(v) == symbol:
                    ints.append(i)
                elif uses(v):
                    return None, None, f"int {what} {i} is {v}, an expression of the batch size {symbol}"
        return tensors, ints, None

    tensors, ints, why = scan(vals, "input")
    if why:
        return None, why
    out_slice, out_ints, why = scan(outs, "output")
    if why:
        return None, why
    nodes = out if isinstance(out, (list, tuple)) else [out]
    out_auto = [j for j, (n, v) in enumerate(zip(nodes, outs)) if isinstance(n, torch.fx.Node) and v is None]
    return GraphBatchSpec(tensors, ints, out_slice, out_ints, out_auto, symbol), None


def _first_line(e) -> str:
    return f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:160]}"


# ---- which graphs keep their rows independent (static, from the trace) ----
#
# A tag per FX node: None (does not depend on a batched input), a _Rows (a tensor with the batch in dim d, of size
# k*B, batch-major: the k entries [i*k, (i+1)*k) come from batch row i only; k = 1, or the S of Linear's [B*S, D]
# view), a _Num (a number that is the batch size or an expression of it) or a _Mix (the rows mix, or cannot be
# followed: the reason). Each op maps its inputs' tags to its output's by the rules below; an op without a rule
# mixes whatever batched value reaches it (conservative). A _Mix is reported where it reaches an output or a
# mutation; an output must have the batch back in dim 0 with k = 1.

class _Mix:
    __slots__ = ("reason",)

    def __init__(self, reason):
        self.reason = reason


class _Rows:
    __slots__ = ("dim", "k")

    def __init__(self, dim, k):
        self.dim = dim  # where the batch is
        self.k = k      # an int or an expression of other sizes (a symbolic S), never of the batch symbol


class _Num:
    __slots__ = ("exact",)

    def __init__(self, exact):
        self.exact = exact


_BATCH, _BATCH_EXPR = _Num(True), _Num(False)


class _Refused(Exception):
    """A node that refuses the graph whatever its outputs (a mutation of batched data)."""


_POINTWISE_EXTRA = frozenset({
    "_to_copy", "to", "copy", "fill", "detach", "alias", "lift_fresh_copy", "lift_fresh", "contiguous", "type_as",
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like", "randint_like", "native_dropout",
    "dropout", "bernoulli", "_conj", "conj", "resolve_conj", "resolve_neg", "clone", "real", "imag", "complex",
    "polar", "gelu_tanh", "fast_gelu", "mul_add"})
_LAST_DIM = frozenset({"rms_norm", "adaln", "rope"})  # fusegraph ops over the last dim, operands broadcast
_DIM_OPS = {  # op -> the arguments naming the dims it works over (the batch dim must not be one)
    **dict.fromkeys((
        "sum", "mean", "amax", "amin", "prod", "var", "std", "var_mean", "std_mean", "logsumexp", "any", "all", "max",
        "min", "argmax", "argmin", "aminmax", "nansum", "nanmean", "median", "nanmedian", "mode", "norm",
        "linalg_vector_norm", "count_nonzero", "cumsum", "cumprod", "cummax", "cummin", "logcumsumexp", "_softmax",
        "_log_softmax", "softmax", "log_softmax", "_safe_softmax", "sort", "argsort", "topk", "kthvalue", "glu",
        "diff", "index_select", "gather", "cat"), ("dim",)),
    "flip": ("dims",), "roll": ("dims",),
}
_NORMS = frozenset({"native_layer_norm", "layer_norm", "_fused_rms_norm", "rms_norm"})
_BATCH_NORMS = frozenset({"native_batch_norm", "_native_batch_norm_legit", "_native_batch_norm_legit_functional",
                          "batch_norm", "_native_batch_norm_legit_no_training"})
_CONV = frozenset({"convolution", "_convolution", "conv1d", "conv2d", "conv3d", "conv_transpose1d",
                   "conv_transpose2d", "conv_transpose3d"})
_ATTENTION = frozenset({
    "_scaled_dot_product_flash_attention_for_cpu", "_scaled_dot_product_flash_attention",
    "_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention",
    "_scaled_dot_product_attention_math", "scaled_dot_product_attention",
    "_scaled_dot_product_fused_attention_overrideable", "kv_attention"})
# views that regroup elements (row-major order kept): the batch stays whole only where the product of the dims
# before it is unchanged
_RESHAPES = frozenset({"view", "_unsafe_view", "reshape", "view_copy", "_reshape_alias", "flatten", "unflatten",
                       "view_as_real", "view_as_complex"})
# views that move, insert, drop or cut dims: the output's shape alone says where the batch went (in one dim, as
# k*B: followed; anywhere else: refused); flip and roll reorder a dim without changing its size and are dim ops
# above; as_strided has no rule
_VIEWS = _RESHAPES | frozenset({
    "expand", "expand_copy", "squeeze", "unsqueeze", "permute", "transpose", "t", "movedim", "diagonal", "unfold",
    "select", "slice", "narrow", "split", "split_with_sizes", "unsafe_split", "unsafe_split_with_sizes", "chunk",
    "unsafe_chunk", "tensor_split", "unbind", "squeeze_copy", "unsqueeze_copy", "permute_copy", "transpose_copy",
    "t_copy", "slice_copy", "select_copy", "alias_copy", "stack"})
_FACTORIES = frozenset({
    "empty", "zeros", "ones", "full", "empty_strided", "new_empty", "new_zeros", "new_ones", "new_full",
    "new_empty_strided", "rand", "randn", "randint", "scalar_tensor", "arange", "empty_permuted"})
# arguments that may carry the batch size as a shape (anywhere else it is used as a value)
_SIZE_ARGS = frozenset({"size", "shape", "sizes", "stride", "end", "length", "N", "split_sizes", "split_size",
                        "sections", "indices"})
_ASSERTS = frozenset({"_assert_async", "_assert_scalar", "_functional_assert_async", "_functional_assert_scalar",
                      "sym_constrain_range", "sym_constrain_range_for_size", "_assert_tensor_metadata"})
_SHAPE_QUERIES = frozenset({"sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "size", "stride", "numel",
                            "dim"})
_LAST_K = {"pixel_shuffle": 3, "pixel_unshuffle": 3, "channel_shuffle": 2, "tril": 2, "triu": 2, "im2col": 3}


def _node_val(n):
    return n.meta.get("val", n.meta.get("example_value")) if isinstance(n, torch.fx.Node) else n


def _locate(v, symbol):
    """For a tensor value: _Rows(d, k) when dim d is k*symbol (k free of the symbol) and no other dim holds the
    symbol, None when no dim holds it, False otherwise (the batch in two dims, or in an expression such as B + 1)."""
    found = None
    for d, size in enumerate(v.shape):
        e = _expr(size)
        if e is None or symbol not in e.free_symbols:
            continue
        if found is not None:
            return False
        if e == symbol:
            found = _Rows(d, 1)
            continue
        k, rest = e.as_independent(symbol, as_Add=False)
        if rest != symbol or not (k.is_positive or (k.is_Integer and k > 0)):
            return False
        found = _Rows(d, k)
    return found


def _size_expr(v, d):
    e = _expr(v.shape[d])
    return e if e is not None else int(v.shape[d])


def _outer(v, d):
    """The product of the sizes before dim d (an int or a sympy expression)."""
    p = 1
    for size in v.shape[:d]:
        p = p * (_expr(size) if _expr(size) is not None else int(size))
    return p


def _bind(op, args, kwargs) -> dict:
    """The op's arguments by schema name (defaults filled in)."""
    bound = {}
    positional = iter(args)
    for a in op._schema.arguments:
        if not a.kwarg_only:
            v = next(positional, _bind)
            if v is not _bind:
                bound[a.name] = v
                continue
        if a.name in kwargs:
            bound[a.name] = kwargs[a.name]
        elif a.has_default_value():
            bound[a.name] = a.default_value
    return bound


def _op_name(op) -> str:
    return f"{op.namespace}.{op._schema.name.split('::')[-1]}.{op._overloadname or 'default'}"


class _RowCheck:
    """One pass over an FX graph with ``meta['val']`` on its nodes (an aot graph, or a make_fx symbolic trace)."""

    def __init__(self, gm, batched, symbol):
        self.gm, self.symbol = gm, symbol
        # node -> tag; node -> the batched input it may alias; node -> the tensors it may alias (_roots)
        self.tags, self.views_of, self.roots = {}, {}, {}
        self.inputs = {}  # placeholder -> its position
        placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
        for i, n in enumerate(placeholders):
            self.inputs[n], self.roots[n] = i, frozenset((n,))
            if i in batched:
                self.tags[n], self.views_of[n] = _Rows(0, 1), i
            else:
                self.tags[n] = self._num(_node_val(n))

    def _num(self, v):
        e = v.node.expr if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)) else None
        if e is None or self.symbol not in e.free_symbols:
            return None
        return _BATCH if e == self.symbol else _BATCH_EXPR

    def run(self):
        """The node tags; raises _Refused."""

        for n in self.gm.graph.nodes:
            if n.op == "placeholder":
                continue
            if n.op == "output":
                break
            self.roots[n] = roots = self._roots(n)
            views = sorted(self.views_of[r] for r in roots if r in self.views_of and r.op == "placeholder")
            if views:
                self.views_of[n] = views[0]
            if n.op == "get_attr":
                self.tags[n] = None
            elif n.op == "call_function" and single_overload(n.target) is not None:
                self.tags[n] = self._op(n, single_overload(n.target))
            else:
                self.tags[n] = self._other(n)
        return self.tags

    def _roots(self, n):
        """The tensors whose memory ``n``'s value may be: placeholders, constants (``get_attr``: a module's buffer,
        a closure's tensor) and nodes that allocate. From the op's schema: an output annotated as an alias
        (``Tensor(a)``: a view, or the tensor a mutating op returns) is its annotated arguments' memory, any other
        output is new; a call without a schema may be any of its tensor inputs or new (conservative)."""
        import operator

        own = frozenset((n,))
        if n.op in ("placeholder", "get_attr"):
            return own
        inputs = self._nodes((n.args, n.kwargs))
        if n.target is operator.getitem and inputs:
            parent = n.args[0]
            roots = self.roots.get(parent, frozenset((parent,)))
            return own if roots == {parent} else roots  # an item of new outputs is new itself
        op = single_overload(n.target) if n.op == "call_function" else None
        if op is None:
            return own.union(*(self.roots.get(a, frozenset((a,))) for a in inputs))
        sets, unknown = set(), False
        for r in op._schema.returns:
            if r.alias_info is not None:
                if r.alias_info.before_set:
                    sets |= r.alias_info.before_set
                else:  # an annotated list (Tensor(a)[]): may be any annotated argument
                    unknown = True
        if not sets and not unknown:
            return own
        bound, roots = _bind(op, n.args, n.kwargs), set()
        for a in op._schema.arguments:
            if a.alias_info is not None and (unknown or a.alias_info.before_set & sets):
                for x in self._nodes(bound.get(a.name)):
                    roots |= self.roots.get(x, frozenset((x,)))
        return frozenset(roots) or own

    @staticmethod
    def _nodes(x):
        return [a for a in pytree.tree_leaves(x) if isinstance(a, torch.fx.Node)]

    def _other(self, n):
        import operator

        inputs = self._nodes((n.args, n.kwargs))
        tags = [self.tags.get(a) for a in inputs]
        v = _node_val(n)
        if n.target is operator.getitem and inputs:
            parent = self.tags.get(n.args[0])
            if parent is None or isinstance(parent, _Mix):
                return parent
            if isinstance(parent, _Rows) and isinstance(v, torch.Tensor):
                return _locate(v, self.symbol) or _Mix(
                    f"output {n.args[1]} of {n.args[0].name} does not keep the batch in one dim")
            return _Mix(f"{n.name} takes an item of a batched value")
        for t in tags:
            if isinstance(t, _Mix):
                return t
        if not isinstance(v, (torch.Tensor, list, tuple)):
            if any(isinstance(t, _Rows) for t in tags):
                return _Mix(f"{n.name} ({getattr(n.target, '__name__', n.target)}) reads a batched tensor")
            return self._num(v)  # symbolic arithmetic: an expression of the batch size?
        if all(t is None for t in tags):
            return None
        return _Mix(f"{n.op} {getattr(n.target, '__name__', n.target)} has no row rule")

    def _op(self, n, op):
        name = op._schema.name.split("::")[-1]
        what = _op_name(op)
        tags = {a: self.tags.get(a) for a in self._nodes((n.args, n.kwargs))}
        if name in _ASSERTS:
            return None
        bound = _bind(op, n.args, n.kwargs)
        if op._schema.is_mutable:
            return self._mutation(n, op, name, what, bound, tags)
        for t in tags.values():
            if isinstance(t, _Mix):
                return t
        rows = [a for a, t in tags.items() if isinstance(t, _Rows)]
        nums = [key for key, a in bound.items() if any(isinstance(tags.get(x), _Num) for x in self._nodes(a))]
        if not rows and not nums:
            return None
        v = _node_val(n)
        if isinstance(v, (int, float, bool, torch.SymInt, torch.SymFloat, torch.SymBool)):
            if name in _SHAPE_QUERIES:  # x.shape[0] of a batched x: the batch size
                return self._num(v)
            return _Mix(f"{what} reads a number out of batched data") if rows else self._num(v)
        out = v if isinstance(v, torch.Tensor) else next(
            (x for x in pytree.tree_leaves(v) if isinstance(x, torch.Tensor)), None) if v is not None else None
        if out is None:
            return _Mix(f"{what} on batched data has no tensor output the analysis can follow")
        value_nums = [key for key in nums if key not in _SIZE_ARGS]
        if value_nums:
            return _Mix(f"{what} uses the batch size as a value (argument {value_nums[0]!r})")
        if nums and name not in _VIEWS and name not in _FACTORIES and name != "native_group_norm":
            return _Mix(f"{what} takes the batch size as a size")
        why = self._rule(op, name, bound, tags, rows, out)
        if why is not None:
            return _Mix(f"{what} {why}")
        tag = _locate(out, self.symbol)
        if tag is False:
            return _Mix(f"{what} puts the batch in more than one dim or merges it (output shape {tuple(out.shape)})")
        if tag is None:
            if rows and name not in _FACTORIES:
                return _Mix(f"{what} reduces or selects the batch away (output shape {tuple(out.shape)})")
            return None
        size = _size_expr(out, tag.dim)
        for a in rows:
            av, at = _node_val(a), tags[a]
            if name in _RESHAPES:  # the same elements before the batch: the batch-major blocks stay whole
                if _outer(av, at.dim) != _outer(out, tag.dim):
                    return _Mix(f"{what} regroups the batch with other dims ({tuple(av.shape)} -> {tuple(out.shape)})")
            elif _size_expr(av, at.dim) != size:
                return _Mix(f"{what} changes the batch layout of {a.name} ({tuple(av.shape)} -> {tuple(out.shape)})")
        return tag

    def _rule(self, op, name, bound, tags, rows, out):
        """None when the op keeps the rows of its batched inputs (its output's shape is checked after), else why."""
        def tag(key):
            a = bound.get(key)
            return tags.get(a) if isinstance(a, torch.fx.Node) else None

        def ndim(key):
            a = bound.get(key)
            v = _node_val(a) if isinstance(a, torch.fx.Node) else None
            return v.ndim if isinstance(v, torch.Tensor) else 0

        def bdim(key):
            t = tag(key)
            return t.dim if isinstance(t, _Rows) else None

        def others_free(*keys):
            for key, a in bound.items():
                if key not in keys and any(isinstance(tags.get(x), _Rows) for x in self._nodes(a)):
                    return f"reads batched argument {key!r}"
            return None

        def batch_outside_last(k, *keys):
            """Every batched operand (of ``keys``, or all) has the batch outside its last k dims."""
            for a in rows if not keys else [bound.get(key) for key in keys if isinstance(tag(key), _Rows)]:
                if tags[a].dim >= _node_val(a).ndim - k:
                    return f"works over {a.name}'s dim {tags[a].dim}, its batch dim"
            return None

        if torch.Tag.pointwise in op.tags or name in _POINTWISE_EXTRA or name in _VIEWS or name in _FACTORIES:
            return None  # broadcasting and views: the output's shape decides
        if name in _LAST_DIM:
            return batch_outside_last(1)
        if name in _DIM_OPS:
            src = "tensors" if name == "cat" else "self"
            base = out.ndim if name == "cat" else ndim("self")
            batch = next((tags[a].dim for a in self._nodes(bound.get(src)) if isinstance(tags.get(a), _Rows)), None)
            for key in _DIM_OPS[name]:
                dims = bound.get(key)
                if key not in bound or dims is None or (isinstance(dims, (list, tuple)) and not dims
                                                        and name != "flip"):
                    return "works over every dim, the batch dim included"
                for d in dims if isinstance(dims, (list, tuple)) else (dims,):
                    if not isinstance(d, int):
                        return f"has a symbolic dim {d}"
                    if batch is not None and (d % base if base else d) == batch:
                        verb = {"cat": "concatenates", "index_select": "indexes", "gather": "gathers"}.get(
                            name, "works")
                        return f"{verb} over the batch (dim {batch})"
            if name == "index_select" and isinstance(tag("index"), _Rows) and tag("self") is not None:
                return "indexes a batched tensor with a batched index"
            return None
        if name in ("mm", "addmm", "_addmm_activation"):
            lhs = "mat1" if "mat1" in bound else "self"
            if bdim(lhs) != 0:
                return "multiplies over the batch (contracted, or a batched right-hand side)"
            return others_free(lhs, "input" if lhs == "self" else "self")
        if name in ("mv", "addmv"):
            lhs = "mat" if "mat" in bound else "self"
            if bdim(lhs) != 0:
                return "multiplies over the batch"
            return others_free(lhs, "self" if lhs == "mat" else "input")
        if name in ("bmm", "baddbmm"):
            a, b = ("self", "mat2") if name == "bmm" else ("batch1", "batch2")
            if bdim(a) == 0 and bdim(b) == 0:
                return None
            if bdim(a) == 1 and tag(b) is None:
                return others_free(a, "self")
            return "multiplies over the batch"
        if name == "matmul":
            a, b, na, nb = bdim("self"), bdim("other"), ndim("self"), ndim("other")
            if a is not None and b is None and a < na - 1 and nb <= 2:
                return None
            if a is not None and a == b and a < min(na, nb) - 2 and na == nb:
                return None
            if a is None and tag("self") is None and b is not None and na <= 2 and b < nb - 2:
                return None
            return "multiplies over the batch"
        if name in ("linear", "gemv"):
            key = "input" if "input" in bound else "x"
            if bdim(key) is None or bdim(key) >= ndim(key) - 1:
                return "multiplies over the batch"
            return others_free(key)
        if name in _ATTENTION:
            q = "query" if "query" in bound else "q"
            if not isinstance(tag(q), _Rows):
                return "attends from non-batched queries"
            return batch_outside_last(2)
        if name in _NORMS:
            return batch_outside_last(len(bound.get("normalized_shape") or ()), "input") or others_free("input")
        if name == "native_group_norm":
            nv = bound.get("N")
            e = _expr(_node_val(nv)) if isinstance(nv, torch.fx.Node) else None
            iv = _node_val(bound["input"]) if isinstance(bound.get("input"), torch.fx.Node) else None
            if bdim("input") != 0 or iv is None or e != _expr(iv.shape[0]):
                return "normalises groups across the batch"
            return others_free("input", "N")
        if name in _BATCH_NORMS:
            if name != "_native_batch_norm_legit_no_training" and bound.get("training", True) is not False:
                return "normalises over the batch (batch norm in training mode)"
            if bdim("input") == 1 or ndim("input") < 2:
                return "normalises with the batch as the channel dim"
            return others_free("input")
        if name in _CONV:
            if bdim("input") != 0 or ndim("input") != ndim("weight"):
                return "convolves over the batch dim"
            return others_free("input")
        if name == "embedding":
            return None if tag("weight") is None else "looks up a batched table"
        if name in ("index", "_unsafe_index"):
            indices = list(bound.get("indices") or [])
            batched_index = [i for i, x in enumerate(indices) if isinstance(tags.get(x), _Rows)]
            if isinstance(tag("self"), _Rows):
                d = bdim("self")
                if batched_index or (d < len(indices) and indices[d] is not None):
                    return "indexes the batch dim"
                return None
            if batched_index == [0] and all(x is None for x in indices[1:]):
                return None  # rows of a table picked per batch row
            return "indexes with a batched index"
        if name == "constant_pad_nd":
            return batch_outside_last(len(bound.get("pad") or ()) // 2, "self")
        if name == "repeat":
            reps = list(bound.get("repeats") or ())
            d = bdim("self")
            return None if d is not None and reps[len(reps) - ndim("self") + d] == 1 else "repeats the batch"
        spatial = next((int(c) for c in "123" if f"{c}d" in name), None)
        if spatial is not None and any(w in name for w in ("pool", "upsample", "reflection_pad", "replication_pad")):
            src = "self" if "self" in bound else "input"
            return batch_outside_last(spatial, src) or others_free(src)
        if name in _LAST_K:
            return batch_outside_last(_LAST_K[name], "self")
        if name in ("slice_scatter", "select_scatter"):
            # the functional form of a write through a view (aot graphs): as the mutation rule, the batch-dependent
            # write lands in a batched tensor, each row into its own row (a region sized by B refused above)
            d, dim = bdim("self"), bound.get("dim", 0)
            if d is None:
                return "scatters batched data into a tensor that is not batched"
            if not isinstance(dim, int):
                return f"has a symbolic dim {dim}"
            if dim % max(ndim("self"), 1) == d and not (name == "slice_scatter" and bdim("src") == d):
                return "scatters over the batch dim"  # (a slice_scatter whose source has the whole batch: all of it)
            return None
        return "has no row rule (not known to keep rows independent)"

    def _describe(self, r) -> str:
        if r in self.inputs:
            return f"input {self.inputs[r]}"
        if r.op == "get_attr":
            return f"constant {r.target} (a buffer or captured tensor)"
        return f"{r.name}"

    def _mutation(self, n, op, name, what, bound, tags):
        written = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
        for key in written:
            for a in self._nodes(bound.get(key)):
                if a in self.views_of:
                    raise _Refused(f"{what} writes batched input {self.views_of[a]} in place (a padded call would "
                                   "write the padded copy)")
        # the functional form's rule; the written tensor must already be batched alike
        functional = getattr(getattr(torch.ops.aten, name.rstrip("_"), None), op._overloadname or "default", None)
        if isinstance(functional, OpOverload) and not functional._schema.is_mutable:
            tag = self._op(n, functional)
        else:
            tag = None if all(t is None for t in tags.values()) else _Mix(f"{what} has no row rule")
        if isinstance(tag, _Mix):
            raise _Refused(tag.reason)
        # A write that depends on the batch (batched data, a region or value from the batch size) must land in
        # memory that is batched alike: a tensor the graph allocates with the batch rows (a view of it is one of
        # its rows' views, the view rules keep the batch whole). Anything else, an input or constant that is not
        # batched (a KV cache written at cache[:B]), or a tensor allocated without the batch, would be written at
        # the bucket's size by a padded call: rows that the call itself leaves untouched.
        if tag is not None or any(t is not None for t in tags.values()):
            for key in written:
                for a in self._nodes(bound.get(key)):
                    for r in sorted(self.roots.get(a, (a,)), key=lambda r: r.name):
                        if not isinstance(self.tags.get(r), _Rows):
                            raise _Refused(f"{what} writes batched data or a batch-sized region into "
                                           f"{self._describe(r)}, which is not batched (a padded call would "
                                           "write the padding rows' part of it too)")
        for key in written:
            for a in self._nodes(bound.get(key)):
                t = tags.get(a)
                same = (t is None and tag is None) or (
                    isinstance(t, _Rows) and isinstance(tag, _Rows) and (t.dim, t.k) == (tag.dim, tag.k))
                if not same:
                    raise _Refused(f"{what} writes into {a.name}, batched otherwise than what it writes")
        return tag


def batch_rows_mix(gm, batched, symbol, *, int_outputs: bool, aliased_outputs: bool):
    """Why the rows of ``gm``'s outputs are not each a function of the same row of its batched inputs (the
    placeholders at positions ``batched``, dim 0 = ``symbol``), or None when they are. ``int_outputs``: an output
    that is the batch size itself is allowed (the graph routes give it back as B); ``aliased_outputs``: an output
    may be a view of a batched input (aot_autograd rebuilds such outputs from the caller's unpadded input, so on the
    graph routes it may not)."""
    check = _RowCheck(gm, set(batched), symbol)
    try:
        tags = check.run()
    except _Refused as e:
        return str(e)
    except Exception as e:  # a node the analysis cannot read: not bucketed
        return f"the row analysis failed ({_first_line(e)})"
    out = gm.graph.output_node().args[0]
    for j, node in enumerate(out if isinstance(out, (list, tuple)) else [out]):
        if not isinstance(node, torch.fx.Node):
            continue
        tag = tags.get(node)
        if isinstance(tag, _Mix):
            return tag.reason
        if isinstance(tag, _Rows):
            if tag.dim != 0:
                return f"output {j} has the batch in dim {tag.dim}"
            if tag.k != 1:
                return f"output {j} has the batch merged into dim 0 ({tag.k}*B rows)"
            if not aliased_outputs and node in check.views_of:
                return (f"output {j} is a view of batched input {check.views_of[node]} (aot_autograd rebuilds it from "
                        "the caller's unpadded input)")
        elif isinstance(tag, _Num) and not (tag.exact and int_outputs):
            return f"output {j} is {'the batch size' if tag.exact else 'an expression of the batch size'} as a number"
    return None


def graph_route_batch(gm):
    """The graph routes' bucket decision for an aot graph: (GraphBatchSpec, None) to bucket it, (None, None) for a
    static graph (captured as it is), (None, why) for one that is not bucketed: no batch symbol qualifies
    (``graph_batch_spec``), or its rows are not independent (``batch_rows_mix``)."""
    spec, why = graph_batch_spec(gm)
    if spec is None:
        return None, why
    why = batch_rows_mix(gm, spec.tensors, spec.symbol, int_outputs=True, aliased_outputs=False)
    return (None, why) if why else (spec, None)


class _BucketsOff(Exception):
    """Raised out of a GraphRunner capture whose row analysis turned the runner's buckets off; the bucket layer
    runs the call again, unpadded."""


def _trace_symbolic(flat_fn, tensors, batched):
    """``flat_fn`` traced by make_fx on fake copies of ``tensors`` whose dim 0 is one symbol where ``batched``
    (every other size static): (graph, its ShapeEnv, the symbol). No data is read or written."""
    from .._core.torch_fake import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx
    from torch.fx.experimental.symbolic_shapes import DimDynamic, ShapeEnv, StatelessSymbolicContext

    env = ShapeEnv()
    mode = FakeTensorMode(shape_env=env, allow_non_fake_inputs=True)
    fakes = []
    for t, bt in zip(tensors, batched):
        # DUCK: every batched dim 0 (all of size B) is the same symbol
        dims = [DimDynamic.DUCK if bt and d == 0 else DimDynamic.STATIC for d in range(t.ndim)]
        fakes.append(mode.from_tensor(t, symbolic_context=StatelessSymbolicContext(dynamic_sizes=dims)))
    with torch.no_grad():
        gm = make_fx(flat_fn, tracing_mode="symbolic")(*fakes)
    symbol = _expr(next(f for f, bt in zip(fakes, batched) if bt).shape[0])
    return gm, env, symbol


def _guard_breaks(env, symbol, sizes):
    """Why the trace at the bucket size is not the program of every batch size in ``sizes`` (a guard on the batch
    size that another of them fails), or None."""
    import sympy

    if env.replacements.get(symbol) is not None and env.replacements[symbol] != symbol:
        return f"the function specialises the batch size ({symbol} = {env.replacements[symbol]})"
    exprs = [g.expr for g in env.guards]
    for asserts in getattr(env, "deferred_runtime_asserts", {}).values():
        exprs += [a.expr for a in asserts]
    for e in exprs:
        if symbol not in getattr(e, "free_symbols", ()):
            continue
        if e.free_symbols != {symbol}:
            return f"the function checks the batch size against data ({e})"
        for b in sizes:
            if e.xreplace({symbol: sympy.Integer(b)}) is not sympy.true:
                return f"the function branches on the batch size ({e} does not hold for batch {b})"
    return None

def _check_batch_args(batch_args):
    if isinstance(batch_args, (int, str)):
        batch_args = (batch_args,)
    try:
        items = tuple(batch_args)
    except TypeError:
        raise TypeError(f"batch_args must be a sequence of argument positions (int) and keyword names (str), "
                        f"got {batch_args!r} ({type(batch_args).__name__})") from None
    for a in items:
        if isinstance(a, bool) or not isinstance(a, (int, str)):
            raise TypeError(f"batch_args must be a sequence of argument positions (int) and keyword names (str), "
                            f"got {batch_args!r}: {a!r} is a {type(a).__name__}")
        if isinstance(a, int) and a < 0:
            raise ValueError(f"batch_args positions must be >= 0, got {batch_args!r}")
    if not items:
        raise ValueError("batch_args must name at least one argument")
    return items


class BatchBuckets:
    """The bucket layer in front of a GraphRunner's call (GraphRunner.__call__ -> here -> GraphRunner._call)."""

    def __init__(self, runner, buckets, batch_args=None):
        self.runner = runner
        self.buckets = tuple(buckets)
        self.spec = batch_args if isinstance(batch_args, GraphBatchSpec) else None
        self.batch_args = None if batch_args is None or self.spec is not None else _check_batch_args(batch_args)
        self._overflow_logged = False
        self._row_index: dict = {}
        self.off = None  # why the row analysis turned this runner's buckets off (GraphRunner's rule), or None

    def _rows(self, b: int, bucket: int, device):
        """The row index [0, 1, ..., b-1, b-1, ...] of length bucket (one index_select pads: half a torch.cat's
        host time), cached per (b, device): at most largest-bucket entries per device."""
        key = (b, device)
        rows = self._row_index.get(key)
        if rows is None:
            rows = [min(i, b - 1) for i in range(bucket)]
            rows = self._row_index[key] = torch.tensor(rows, dtype=torch.long, device=device)
        return rows

    def bucket_for(self, b: int):
        i = bisect.bisect_left(self.buckets, b)
        return self.buckets[i] if i < len(self.buckets) else None

    # ---- the batch size ----
    def _marked(self, args, kwargs):
        """The arguments batch_args names, in its order (missing ones skipped)."""
        for a in self.batch_args:
            if isinstance(a, int):
                if a < len(args):
                    yield a, args[a]
            elif a in kwargs:
                yield a, kwargs[a]

    def batch_size(self, args, kwargs):
        """B, or None when the call has no batched tensor."""
        if self.spec is not None:
            for p in self.spec.tensors:
                if p < len(args) and isinstance(args[p], torch.Tensor):
                    return args[p].shape[0]
            return None
        if self.batch_args is not None:
            for _, a in self._marked(args, kwargs):
                for x in pytree.tree_leaves(a):
                    if isinstance(x, torch.Tensor) and x.ndim >= 1:
                        return x.shape[0]
            return None
        flat = not kwargs and all(isinstance(a, torch.Tensor) for a in args)
        for x in args if flat else pytree.tree_leaves((args, kwargs)):
            if isinstance(x, torch.Tensor) and x.ndim >= 1:
                return x.shape[0]
        return None

    # ---- padding and slicing ----
    def pad(self, args, kwargs, b: int, bucket: int):
        """The call's arguments with every batched input padded from b to bucket rows (last row repeated)."""
        def pad(x):
            if isinstance(x, torch.Tensor) and x.ndim >= 1 and x.shape[0] == b:
                return torch.index_select(x, 0, self._rows(b, bucket, x.device))
            return x

        if self.spec is not None:
            args = list(args)
            for p in self.spec.tensors:
                args[p] = pad(args[p])
            for p in self.spec.ints:
                if args[p] != b:  # cannot happen for a graph Dynamo guards; refuse rather than guess
                    raise RuntimeError(f"fusegraph: batch buckets: int input {p} is {args[p]}, expected the batch "
                                       f"size {b}")
                args[p] = bucket
            return tuple(args), kwargs
        if self.batch_args is not None:
            args, kwargs = list(args), dict(kwargs)

            def strict(x, name):
                if isinstance(x, torch.Tensor) and x.ndim >= 1 and x.shape[0] != b:
                    raise ValueError(f"fusegraph: {self.runner.name}: batch_args names argument {name!r}, but a "
                                     f"tensor in it has dim 0 of {x.shape[0]}, not the batch size {b}")
                return pad(x)

            for name, a in list(self._marked(args, kwargs)):
                new = pytree.tree_map(lambda x: strict(x, name), a)
                if isinstance(name, int):
                    args[name] = new
                else:
                    kwargs[name] = new
            return tuple(args), kwargs
        if not kwargs and all(isinstance(a, torch.Tensor) for a in args):
            return tuple(pad(x) for x in args), kwargs
        return pytree.tree_map(pad, (tuple(args), kwargs))

    def unpad(self, out, b: int, bucket: int):
        """Outputs sliced back from bucket to b rows (views)."""
        if self.spec is not None and isinstance(out, (list, tuple)):
            outs = list(out)
            for j in self.spec.out_slice:
                if j < len(outs) and isinstance(outs[j], torch.Tensor):
                    outs[j] = outs[j][:b]
            for j in self.spec.out_ints:
                if j < len(outs) and outs[j] == bucket:
                    outs[j] = b
            for j in self.spec.out_auto:
                if j < len(outs):
                    outs[j] = self._slice_auto(outs[j], b, bucket)
            return type(out)(outs) if isinstance(out, tuple) else outs
        if isinstance(out, torch.Tensor):  # the common case, without pytree
            return self._slice_auto(out, b, bucket)
        return pytree.tree_map(lambda v: self._slice_auto(v, b, bucket), out, is_leaf=_is_size)

    @staticmethod
    def _slice_auto(v, b, bucket):
        if isinstance(v, torch.Tensor):
            return v[:b] if v.ndim >= 1 and v.shape[0] == bucket else v
        if _is_size(v) and len(v) >= 1 and v[0] == bucket:
            return torch.Size((b, *v[1:]))
        return v

    # ---- calls ----
    def __call__(self, args, kwargs):
        runner = self.runner
        b = self.batch_size(args, kwargs)
        if b is None:
            return runner._call(*args, **kwargs)
        bucket = self.bucket_for(b)
        if bucket == b:
            try:
                return runner._call(*args, **kwargs)
            except _BucketsOff:  # its capture found mixed rows: buckets are off, captured as it is
                return runner._call(*args, **kwargs)
        if bucket is None:
            return self._overflow(b, args, kwargs)
        if b == 0:
            return runner._eager("batch buckets: batch size 0 (no row to pad with)", args, kwargs)
        pargs, pkwargs = self.pad(args, kwargs, b, bucket)
        try:
            out = runner._call(*pargs, **pkwargs)
        except _BucketsOff:
            return runner._call(*args, **kwargs)
        except Exception as e:
            if self.off is not None:  # turned off meanwhile (another thread): this call is not padded either
                return runner._call(*args, **kwargs)
            raise self._padded_error(e, args, kwargs, b, bucket) from e
        if self.off is not None:  # another thread turned buckets off after this call padded: run it as it is
            return runner._call(*args, **kwargs)
        runner.stats.add(bucket_padded_calls=1)
        return self.unpad(out, b, bucket)

    def _padded_error(self, e, args, kwargs, b, bucket):
        """``e``, raised by a padded call, as the same exception type (RuntimeError where that type does not take
        a message) saying which inputs were padded."""
        if self.spec is not None:
            where = [str(p) for p in self.spec.tensors if p < len(args) and isinstance(args[p], torch.Tensor)]
        else:
            marked = self.batch_args if self.batch_args is not None else list(range(len(args))) + list(kwargs)
            where = []
            for a in marked:
                value = (args[a] if a < len(args) else None) if isinstance(a, int) else kwargs.get(a)
                if any(isinstance(x, torch.Tensor) and x.ndim >= 1 and x.shape[0] == b
                       for x in pytree.tree_leaves(value)):
                    where.append(str(a) if isinstance(a, int) else repr(a))
        what = (f"input {where[0]} was" if len(where) == 1 else f"inputs {', '.join(where)} were")
        ints = f"; int input(s) {', '.join(map(str, self.spec.ints))} set to {bucket}" if self.spec and \
            self.spec.ints else ""
        msg = (f"fusegraph: {self.runner.name}: this call failed on a padded batch: {what} padded from batch {b} "
               f"to bucket {bucket} (graph_batch_buckets){ints}: {e}")
        try:
            return type(e)(msg)
        except Exception:
            return RuntimeError(msg)

    # ---- the row analysis (GraphRunner's rule; the graph routes decide once per graph: graph_route_batch) ----
    def check_capture(self, leaves, in_spec, args, kwargs) -> None:
        """Called by GraphRunner at each capture: a capture whose batch size is a bucket that smaller batches pad
        to is first traced with a symbolic batch size (``_trace_symbolic``, fakes only) and checked: guards on the
        batch size must hold for every batch size padded to it, and every output row must depend only on the
        same input row (``batch_rows_mix``). Where not, buckets go off for the runner (the reason counted in
        stats.fallbacks, logged once) and ``_BucketsOff`` makes the caller run the call unpadded."""
        if self.spec is not None or self.off is not None:
            return
        b = self.batch_size(args, kwargs)
        i = bisect.bisect_left(self.buckets, b) if b is not None else len(self.buckets)
        if i == len(self.buckets) or self.buckets[i] != b:
            return
        sizes = range((self.buckets[i - 1] if i else 0) + 1, b)
        if not sizes:  # no batch size pads to this bucket
            return
        why = self._rows_why(leaves, in_spec, args, kwargs, b, sizes)
        if why is None:
            return
        runner = self.runner
        self.off, runner._buckets = why, None
        runner.stats.add_fallback(f"batch buckets off: {why}")
        _log.warning("fusegraph: %s: batch buckets off (every batch size is captured as it is): %s", runner.name,
                     why)
        raise _BucketsOff(why)

    def _rows_why(self, leaves, in_spec, args, kwargs, b, sizes):
        from .._core.torch_fake import unset_fake_temporarily


        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        if self.batch_args is None:
            batched = [t.ndim >= 1 and t.shape[0] == b for t in tensors]
        else:
            ids = {id(x) for _, a in self._marked(args, kwargs) for x in pytree.tree_leaves(a)}
            batched = [id(t) in ids and t.ndim >= 1 for t in tensors]
        flat_fn, box = self.runner._flat_fn(leaves, in_spec, args, kwargs)
        try:
            with capture_lock(), fx_tracing_window("capture"), unset_fake_temporarily():
                gm, env, symbol = _trace_symbolic(flat_fn, tensors, batched)
        except Exception as e:
            return f"the function does not trace with a symbolic batch size ({_first_line(e)})"
        why = _guard_breaks(env, symbol, sizes) or batch_rows_mix(
            gm, [j for j, bt in enumerate(batched) if bt], symbol, int_outputs=False, aliased_outputs=True)
        if why:
            return why
        # the automatic slicing of outputs (dim 0 == bucket) must meet exactly the batched ones
        out = gm.graph.output_node().args[0]
        for j, n in enumerate(out if isinstance(out, (list, tuple)) else [out]):
            v = _node_val(n)
            if isinstance(v, torch.Tensor) and v.ndim >= 1 and _locate(v, symbol) is None and v.shape[0] == b:
                return (f"output {j} is not batched, but its dim 0 is {b}, the bucket size: a padded call would "
                        "slice it")
        for j, size in (box.get("constants") or {}).items():
            exprs = [_expr(d) for d in size]
            if any(e is not None and symbol in e.free_symbols for e in exprs[1:]) or \
                    (size and exprs[0] is None and size[0] == b):
                return f"output {j} is a torch.Size that a padded call would give back wrong ({tuple(size)})"
        return None

    def _overflow(self, b, args, kwargs):
        runner = self.runner
        runner.stats.add(bucket_overflows=1, eager_calls=1)
        if not self._overflow_logged:
            self._overflow_logged = True
            _log.warning("fusegraph: %s: batch size %d is beyond the largest bucket %d (graph_batch_buckets=%s): "
                         "such calls run uncaptured (counted in stats.bucket_overflows)", runner.name, b,
                         self.buckets[-1], self.buckets)
        return runner.fn(*args, **kwargs)

    def capture_args(self, args):
        """``args`` padded to their bucket for a compile-time capture; None when the call would not be captured
        (beyond the largest bucket, or batch size 0)."""
        b = self.batch_size(args, {})
        if b is None:
            return args
        bucket = self.bucket_for(b)
        if bucket is None or b == 0:
            return None
        if bucket == b:
            return args
        return self.pad(args, {}, b, bucket)[0]


def make_buckets(runner, buckets, batch_args):
    """The runner's bucket layer, or None when graph_batch_buckets is off."""
    if not buckets:
        if batch_args is not None and not isinstance(batch_args, GraphBatchSpec):
            raise ValueError(f"fusegraph: batch_args={batch_args!r} is given but graph_batch_buckets is off; set "
                             "graph_batch_buckets (e.g. (1, 2, 4, 8)) in the runner's config")
        return None
    return BatchBuckets(runner, buckets, batch_args)
