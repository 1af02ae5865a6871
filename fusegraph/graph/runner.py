"""GraphRunner: batch dispatch (capture once per input signature, then replay) for any callable of tensors.

    runner = fusegraph.graph.GraphRunner(fn, config=None)   # config: any object with SPEC §1.1's graph_* names
    out = runner(*args, **kwargs)                           # same results as fn(*args, **kwargs)
    runner.stats                                            # fusegraph.stats.Stats

Data flow of a call: the arguments are flattened (pytree); the C++ cache (csrc/graph/cache.h) keys them on
each tensor's shape, dtype and device and each other value; a hit replays the entry in C++ (copy plan, then
the executable, then safe-output clones); a miss captures through the driver of the inputs' device
(drivers.py), inserts the entry (evicting by count or memory) and replays it. A capture that raises leaves no
entry: with ``graph_fallback="eager"`` the signature runs ``fn`` uncaptured from then on, the reason counted
in ``stats.fallbacks``; with "raise" the error propagates. Capture and replay of one runner are serialised by
one lock, so several threads may share a runner.

The backend's graph routes call ``compile_graph_route(gm, example_inputs, config, stats)``. Contract:

- ``gm``: a ``torch.fx.GraphModule`` (Dynamo's graph, or the aten graph after aot_autograd/fusion; fusegraph::
  ops in it are kept whole) or any callable of the flat ``example_inputs``.
- ``example_inputs``: the flat inputs the backend received. With ``graph_lazy_capture=False`` and real
  tensors among them, the first signature is captured right away on ``detach().clone()`` buffers (the
  compile-time capture of the seed); with lazy capture, or fake example inputs (inside aot_autograd), the
  first real call captures, and its static inputs share that call's storage (``detach()``).
- ``config``: any object with the graph_* fields (CompilationConfig); read once, here.
- ``stats``: the backend's ``Stats``; this route adds its captures, replays, copies, evictions and fallbacks.
- returns ``callable(*args)`` with gm's calling convention (positional, unboxed) and gm's output structure.
  A backend needing aot's boxed convention wraps it with ``functorch.compile.make_boxed_func``.
"""
from __future__ import annotations

import logging
import threading
import time

import torch
from torch.utils import _pytree as pytree

from fusegraph import _C
from fusegraph.stats import Stats

from .drivers import select_driver, static_buffers
from .options import GraphOptions

_log = logging.getLogger("fusegraph.graph")

_REPLAYED, _MISS, _FAILED, _NOT_FLAT = 0, 1, 2, 3
_SIMPLE = (torch.Tensor, int, float, bool, str, type(None))


class _EntryInfo:
    """What the Python side keeps per entry (the C++ cache holds it opaquely): the output tree and the
    driver's capture info (the aten graph, for inspection)."""

    __slots__ = ("out_spec", "capture", "driver")

    def __init__(self, out_spec, capture, driver):
        self.out_spec, self.capture, self.driver = out_spec, capture, driver


class GraphRunner:
    """Capture ``fn`` once per input signature into a device graph (CUDA graph, NPUGraph, or the C++ host
    graph on CPU) and replay it afterwards. See the module docstring for the semantics."""

    def __init__(self, fn, config=None, *, stats: Stats | None = None, name: str | None = None):
        if not callable(fn):
            raise TypeError(f"fusegraph: GraphRunner needs a callable; got {type(fn).__name__}")
        self.fn = fn
        self.options = GraphOptions.from_config(config)
        self.stats = stats if stats is not None else Stats()
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        o = self.options
        self._cache = _C.graph.GraphCache(o.graph_max_entries, o.graph_eviction, o.graph_memory_budget,
                                          o.graph_recapture, o.safe_output_mode)
        self._lock = threading.RLock()
        self._memory = 0  # this runner's share of stats.graph_memory_bytes

    # ---- calling ----
    def __call__(self, *args, **kwargs):
        debug = _log.isEnabledFor(logging.DEBUG)
        with self._lock:
            if not kwargs:  # fast path: flat positional tensors go to C++ as they are
                res = self._cache.call(args, debug, True)
                if res[0] != _NOT_FLAT:
                    return self._finish(res, args, None, args, kwargs)
            flat, in_spec = pytree.tree_flatten((args, kwargs))
            leaves = flat + [_SpecKey(in_spec)]  # the argument structure is part of the signature
            return self._finish(self._cache.call(leaves, debug), leaves, in_spec, args, kwargs)

    def _finish(self, res, leaves, in_spec, args, kwargs):
        status, outs, info, copied, skipped, drifted, _ = res
        if status == _REPLAYED:
            s = self.stats
            with s._lock:
                s.replays += 1
                s.inputs_copied += copied
                s.inputs_skipped += skipped
            if drifted:
                self._warn_drift(drifted)
            return outs[0] if info.out_spec is None else pytree.tree_unflatten(outs, info.out_spec)
        if status == _FAILED:
            with self.stats._lock:
                self.stats.eager_calls += 1
            return self.fn(*args, **kwargs)
        return self._capture_and_call(leaves, in_spec, args, kwargs)

    def capture(self, *args, lazy: bool | None = None) -> bool:
        """Captures the signature of ``args`` now (compile-time capture). Returns False when it fell back."""
        if all(isinstance(a, torch.Tensor) for a in args):
            leaves, in_spec = args, None
        else:
            flat, in_spec = pytree.tree_flatten((args, {}))
            leaves = flat + [_SpecKey(in_spec)]
        with self._lock:
            return self._capture(leaves, in_spec, args, {}, lazy=lazy)

    def _capture_and_call(self, leaves, in_spec, args, kwargs):
        if not self._capture(leaves, in_spec, args, kwargs, lazy=None):
            with self.stats._lock:
                self.stats.eager_calls += 1
            return self.fn(*args, **kwargs)
        res = self._cache.call(leaves, False)
        assert res[0] == _REPLAYED, "fusegraph: an entry just inserted was not found"
        return self._finish(res, leaves, in_spec, args, kwargs)

    def _capture(self, leaves, in_spec, args, kwargs, *, lazy) -> bool:
        o = self.options
        if not o.graph_recapture:
            err = self._cache.mismatch_error(leaves)
            if err:
                raise RuntimeError(err)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        device = tensors[0].device if tensors else torch.device("cpu")
        driver, why = select_driver(o.device_graph, device)
        if driver is None:
            return self._fail(leaves, f"no device graph: {why}")
        lazy = o.graph_lazy_capture if lazy is None else lazy
        if lazy != o.graph_lazy_capture:
            o = GraphOptions(**{**o.__dict__, "graph_lazy_capture": lazy})
        flat_fn, out_box = self._flat_fn(leaves, in_spec, args, kwargs)
        t0 = time.perf_counter()
        try:
            cap = driver.capture(flat_fn, tensors, o)
        except Exception as e:  # a host sync, an uncapturable op, out of memory...
            if o.graph_fallback == "raise":
                raise
            first = (str(e).strip().splitlines() or [""])[0][:160]
            return self._fail(leaves, f"{driver.name} capture failed: {type(e).__name__}: {first}")
        seconds = time.perf_counter() - t0
        info = _EntryInfo(out_box.get("spec"), cap, driver.name)
        before = self._cache.counters()
        evicted = self._cache.insert(leaves, cap.static_inputs, cap.executable, int(cap.memory_bytes), info)
        counters = self._cache.counters()
        with self.stats._lock:
            s = self.stats
            for name in ("graphs_captured", "recaptures", "evictions"):
                setattr(s, name, getattr(s, name) + counters[name] - before[name])
            s.capture_seconds += seconds
            s.graph_memory_bytes += counters["graph_memory_bytes"] - self._memory
            if cap.fallback_reason:
                s.fallbacks[cap.fallback_reason] = s.fallbacks.get(cap.fallback_reason, 0) + 1
        self._memory = counters["graph_memory_bytes"]
        _log.info("fusegraph: %s captured %s graph for %s (%.3f s, %.1f MiB)%s", self.name, driver.name,
                  _C.graph.GraphCache.describe_signature(leaves), seconds, cap.memory_bytes / 2**20,
                  f"; evicted {len(evicted)}" if evicted else "")
        return True

    def _fail(self, leaves, reason) -> bool:
        self._cache.record_failure(leaves, reason)
        self.stats.add_fallback(reason)
        _log.warning("fusegraph: %s runs uncaptured for this input signature: %s", self.name, reason)
        return False

    def _flat_fn(self, leaves, in_spec, args, kwargs):
        """``fn`` as a function of the tensor leaves only, returning a flat list; records the output tree."""
        fn, box = self.fn, {}
        positions = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor)]

        def flat_fn(*tensors):
            if in_spec is None:
                out = fn(*tensors)
            else:
                flat = list(leaves[:-1])
                for p, t in zip(positions, tensors):
                    flat[p] = t
                a, k = pytree.tree_unflatten(flat, in_spec)
                out = fn(*a, **k)
            if isinstance(out, torch.Tensor):
                box["spec"] = None
                return [out]
            outs, box["spec"] = pytree.tree_flatten(out)
            return outs

        return flat_fn, box

    # ---- bookkeeping ----
    def _warn_drift(self, positions):
        _log.warning("fusegraph: %s: input(s) at position %s are not at the captured address; copy into the "
                     "static buffer to make this zero-copy", self.name, ", ".join(map(str, positions)))

    @property
    def num_entries(self) -> int:
        return len(self._cache)

    def entry_ids(self) -> list:
        return self._cache.entry_ids()

    def counters(self) -> dict:
        """This runner's own counters, from the C++ cache (stats may be shared with a backend)."""
        return self._cache.counters()

    def clear(self) -> None:
        with self._lock:
            self._cache.clear()
            with self.stats._lock:
                self.stats.graph_memory_bytes -= self._memory
            self._memory = 0


class _SpecKey:
    """The pytree structure of a call's arguments as a signature value (its repr is the key)."""

    __slots__ = ("spec",)

    def __init__(self, spec):
        self.spec = spec

    def __repr__(self):
        return f"args{self.spec}"


def compile_graph_route(gm, example_inputs, config=None, stats: Stats | None = None):
    """The backend's graph route: a callable that captures ``gm`` per input signature and replays it.
    See the module docstring for the contract."""
    runner = GraphRunner(gm, config, stats=stats, name=getattr(gm, "_get_name", lambda: "graph")())
    real = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    fake = any(isinstance(t, torch._subclasses.FakeTensor) for t in real)
    if not runner.options.graph_lazy_capture and not fake and example_inputs is not None:
        runner.capture(*example_inputs, lazy=False)
    return runner


__all__ = ["GraphRunner", "compile_graph_route", "static_buffers"]
