"""Batch buckets (``CompilationConfig.graph_batch_buckets``, vLLM's capture sizes): one graph per bucket, not
one per batch size.

    runner = GraphRunner(fn, {"graph_batch_buckets": (1, 2, 4, 8)})            # automatic batch rule
    runner = GraphRunner(fn, {"graph_batch_buckets": (1, 2, 4, 8)}, batch_args=(0, "mask"))   # explicit

Opt-in, and only correct for functions whose rows along dim 0 are independent (row i of every output depends
only on row i of the batched inputs, as in a per-token MLP/norm or a per-sample decode step; not a batch
norm, a sum over the batch, a softmax over dim 0, or attention across the batch). A call of batch size B:

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

Functions that mutate a batched input in place must not use buckets: a padded call mutates the padded copy.
"""
from __future__ import annotations

import bisect
import logging

import torch
from torch.utils import _pytree as pytree

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
            return runner._call(*args, **kwargs)
        if bucket is None:
            return self._overflow(b, args, kwargs)
        if b == 0:
            return runner._eager("batch buckets: batch size 0 (no row to pad with)", args, kwargs)
        pargs, pkwargs = self.pad(args, kwargs, b, bucket)
        runner.stats.add(bucket_padded_calls=1)
        return self.unpad(runner._call(*pargs, **pkwargs), b, bucket)

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
