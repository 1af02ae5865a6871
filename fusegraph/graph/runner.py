"""GraphRunner: batch dispatch (capture once per input signature, then replay) for any callable of tensors.

    runner = fusegraph.graph.GraphRunner(fn, config=None)   # config: any object with SPEC §1.1's graph_* names
    out = runner(*args, **kwargs)                           # same results as fn(*args, **kwargs)
    runner.stats                                            # fusegraph.stats.Stats
    GraphRunner(fn, {"graph_batch_buckets": (1, 2, 4, 8)})  # one graph per bucket, not per batch (buckets.py)

Data flow of a call: the arguments are flattened (pytree); the C++ cache (csrc/graph/cache.h) keys them on
each tensor's shape, dtype and device, each immutable value's exact value, each module/function's identity,
and grad mode (csrc/python/keys.cpp); a hit replays the entry in C++ (copy plan, then the executable,
then safe-output clones); a miss captures through the driver of the inputs' device (drivers.py), under the
process-wide capture lock, inserts the entry (evicting by count or memory) and replays it. What cannot be keyed
or captured safely runs ``fn`` eagerly, the reason counted: objects that are not values (numpy arrays...),
tensor subclasses with their own ``__torch_function__``, autograd (inputs or outputs requiring grad under grad
mode) and outputs a graph cannot return. A replaced parameter, buffer or submodule of fn's modules (fn itself, a
bound method's object, modules in its closure, and those its code reaches by name through globals, closure objects
and attribute chains: ``_modules_of``), or of a module argument, or a module switched by ``train()``/``eval()``,
drops the captured graphs first (``guard_weights``); fn's in-place writes to that state during a capture are undone
(``drivers.StateWrites``), the random generators put back (the call draws as eagerly), and a trace whose shapes
follow the inputs' values (``host.data_dependent``) is not captured. A capture that raises leaves no entry: with
``graph_fallback="eager"`` the signature runs ``fn`` uncaptured from then on, the reason counted in
``stats.fallbacks``; with "raise" the error propagates. Capture and replay of one runner are serialised by one lock,
so several threads may share a runner. Multi-process (``torch.distributed`` initialised, a graph with
collectives, or any function under ``process_group="auto"``): the ranks' tensor signatures are compared per call
(``graph_rank_check="call"``) or per capture, and each capture's outcome is agreed (ranks.py).

The backend's graph routes call ``compile_graph_route(gm, example_inputs, config, stats)``. Contract:

- ``gm``: a ``torch.fx.GraphModule`` (Dynamo's graph, or the aten graph after aot_autograd/fusion; fusegraph::
  ops in it are kept whole) or any callable of the flat ``example_inputs``.
- ``example_inputs``: the flat inputs the backend received. With ``graph_lazy_capture=False`` and real
  tensors among them, the first signature is captured right away on ``detach().clone()`` buffers (the
  compile-time capture of the seed); with lazy capture, or fake example inputs (inside aot_autograd), the
  first real call captures, and its static inputs share that call's storage (``detach()``).
- ``config``: any object with the graph_* fields (CompilationConfig); read once, here.
- ``stats``: the backend's ``Stats``; this route's cache counts its captures, replays, copies and evictions into
  ``stats.counters``, and the route adds its fallbacks.
- returns ``callable(*args)`` with gm's calling convention (positional, unboxed) and gm's output structure.
  A backend needing aot's boxed convention wraps it with ``functorch.compile.make_boxed_func``.
"""
from __future__ import annotations

import contextlib
import functools
import logging
import threading
import time
import types
import weakref

import torch

from .. import _C
from .._core import ranks
from .._core.torch_dispatcher import disabled_torch_function_impl, internal_overlap, pytree, single_overload
from .._core.torch_dynamo import capture_lock, fx_tracing_window
from .._core.torch_fake import FakeTensor, unset_fake_temporarily
from ..stats import Stats

from .buckets import _BucketsOff, graph_route_batch, make_buckets
from .drivers import StateWrites, select_driver, static_buffers
from .host import DataDependent, specialize
from .options import GraphOptions

_log = logging.getLogger("fusegraph.graph")

_Status = _C.graph.LookupStatus  # what a cache call found (csrc/graph/cache.h)
_REPLAYED, _MISS, _FAILED = _Status.Replayed, _Status.Miss, _Status.Failed
_OUTPUT_TYPES = (torch.Tensor, int, float, bool, str, type(None))  # what a captured graph can return
# Past this many captured graphs for one non-tensor argument position, warn once (a value that changes on
# every call, such as a float timestep, captures a graph per value).
VALUES_PER_POSITION_WARNING = 8


class _Uncapturable(Exception):
    """Raised inside a capture for what a graph cannot represent; the message is the fallback reason."""


class _EntryInfo:
    """What the Python side keeps per entry (the C++ cache holds it opaquely): the output tree and the
    driver's capture info (the aten graph, for inspection)."""

    __slots__ = ("out_spec", "capture", "driver", "constants", "flat_type")

    def __init__(self, out_spec, capture, driver, constants=None):
        self.out_spec, self.capture, self.driver = out_spec, capture, driver
        self.constants = constants  # {flat output index: value}: torch.Size outputs (fixed by the signature)
        # list or tuple when the output is a flat list/tuple of leaves (an aot graph's): rebuilt without pytree
        self.flat_type = None
        if out_spec is not None and out_spec.type in (list, tuple) and not constants and \
                all(c.is_leaf() for c in out_spec.children()):
            self.flat_type = out_spec.type


class GraphRunner:
    """Capture ``fn`` once per input signature into a device graph (CUDA graph, NPUGraph, or the C++ host
    graph on CPU) and replay it afterwards. See the module docstring for the semantics."""

    def __init__(self, fn, config=None, *, stats: Stats | None = None, name: str | None = None,
                 guard_weights: bool = True, batch_args=None, process_group="auto", static_inputs=(),
                 static_by_address: bool = False):
        if not callable(fn):
            raise TypeError(f"fusegraph: GraphRunner needs a callable; got {type(fn).__name__}")
        self.fn = fn
        self.options = GraphOptions.from_config(config)
        self.stats = stats if stats is not None else Stats()
        self.name = name or getattr(fn, "__name__", type(fn).__name__)
        o = self.options
        # tensor inputs (indices among the call's tensors) fn does not mutate, used where they live: never copied
        # for a capture; with static_by_address (static-buffer drivers) replayed in place and keyed by address
        self._static = tuple(static_inputs)
        self._cache = _C.graph.GraphCache(o.graph_max_entries, _C.graph.Eviction[o.graph_eviction],
                                          o.graph_memory_budget, o.graph_recapture, o.safe_output_mode,
                                          self.stats.counters, list(self._static) if static_by_address else [])
        self._lock = threading.RLock()
        # The weights a graph reads are those of the modules it was captured with: fn's own (a module, a bound
        # method of one, modules in its closure or reached by name, _modules_of) and module arguments (keyed by
        # identity). A replaced parameter, buffer or submodule drops the captured graphs (in-place writes are read
        # live). The guard is built once per capture generation; a call checks its slots (~8 ns each) in C++.
        self._guard_weights = guard_weights  # False: the caller guards them (the backend's routes)
        self._fn_guard = _fn_guard(fn) if guard_weights else None
        self._aten_graph = fn if _is_aten_graph(fn) else None  # built by the host driver without a re-trace
        # the backend's graph compiled for symbolic sizes (SymInt inputs): already fused, so a capture only
        # specializes it to the call's sizes (the driver's plain trace), never fuses it again
        self._symbolic_aten_graph = self._aten_graph is None and _is_aten_graph(fn, symbolic=True)
        self._arg_guards: dict = {}  # id(module argument) -> (weakref to the module, SlotGuard)
        self._entry_modules: dict = {}  # entry id -> ids of the module arguments its signature holds
        self._values_seen: dict = {}  # non-tensor leaf position -> set of values captured
        self._warned: set = set()
        self._specs: dict = {}  # argument TreeSpec -> its signature value
        # graph_batch_buckets: pad the batch up to a bucket, replay that bucket's graph, slice back (buckets.py)
        self._buckets = make_buckets(self, o.graph_batch_buckets, batch_args)
        self._bucket_layer = self._buckets  # kept when the row analysis turns buckets off (_buckets = None)
        # Multi-process: the group whose ranks take every capture decision together (ranks.py); None: rank-local
        self._group = ranks.group_for_runner(process_group, fn)
        self._check_calls = self._group is not None and o.graph_rank_check == "call"

    # ---- calling ----
    def __call__(self, *args, **kwargs):
        if self._buckets is not None:
            return self._buckets(args, kwargs)
        return self._call(*args, **kwargs)

    def _call(self, *args, **kwargs):
        debug = _log.isEnabledFor(logging.DEBUG)
        with self._lock:
            if self._check_calls:  # multi-process, graph with collectives: ranks.py
                self._check_ranks(args, kwargs)
            if self._fn_guard is not None:
                self._check_weights(self._fn_guard, "fn")
            if not kwargs:  # fast path: flat positional tensors go to C++ as they are
                res = self._cache.call(args, debug, True)
                status = res.status
                if status is _REPLAYED or status is _MISS or status is _FAILED:
                    return self._finish(res, args, None, args, kwargs)
                if status is _Status.SpecialTensor:
                    return self._special(args, None, args, kwargs)
            flat, in_spec = pytree.tree_flatten((args, kwargs))
            leaves = flat + [self._spec_key(in_spec)]  # the argument structure is part of the signature
            if self._guard_weights:  # module arguments: weights replaced since a capture drop the graphs first
                modules = [i for i, x in enumerate(flat) if isinstance(x, torch.nn.Module)]
                if modules:
                    self._check_module_args(leaves, modules)
            res = self._cache.call(leaves, debug)
            if res.status is _Status.SpecialTensor:
                return self._special(leaves, in_spec, args, kwargs)
            if res.status is _Status.Unkeyable:
                if res.failure.startswith("argument "):  # an argument of a type that keys nothing
                    return self._eager(f"{res.failure}: only tensors, immutable values (numbers, strings, dtypes...) "
                                       "and modules/functions (by identity) key a graph; pass it as a tensor",
                                       args, kwargs)
                return self._eager(res.failure, args, kwargs)
            return self._finish(res, leaves, in_spec, args, kwargs)

    def _check_ranks(self, args, kwargs) -> None:
        """Raises on every rank of the group when the ranks' signatures differ: a rank that would replay while
        another captures would run other collectives (a hang)."""
        leaves = args if not kwargs else pytree.tree_flatten((args, kwargs))[0]
        ranks.check_call(self._group, ranks.tensor_signature(leaves), self.name)

    def _spec_key(self, spec) -> str:
        """The argument structure as a signature value: each distinct TreeSpec (compared exactly) gets a
        number in this runner."""
        key = self._specs.get(spec)
        if key is None:
            key = self._specs[spec] = f"args#{len(self._specs)}: {spec}"
        return key

    def _special(self, leaves, in_spec, args, kwargs):
        """Tensors the cache handed back: a subclass, or one that requires grad under grad mode."""
        grad = torch.is_grad_enabled()
        plain = list(leaves)
        for i, x in enumerate(leaves):
            if not isinstance(x, torch.Tensor):
                continue
            if grad and x.requires_grad:
                return self._eager(f"autograd: input {i} requires grad; a captured graph returns no gradient "
                                   "(call under torch.no_grad() or torch.inference_mode() to replay)", args, kwargs)
            if type(x) not in (torch.Tensor, torch.nn.Parameter):
                if _overrides_torch_function(type(x)):
                    return self._eager(f"input {i} is a tensor subclass ({type(x).__qualname__}) that overrides "
                                       "__torch_function__/__torch_dispatch__; a graph would drop its behaviour",
                                       args, kwargs)
                plain[i] = x.as_subclass(torch.Tensor)  # a subclass without behaviour: a plain tensor
        if in_spec is None:
            args = tuple(plain)
        else:
            args, kwargs = pytree.tree_unflatten(plain[:-1], in_spec)
        return self._call(*args, **kwargs)

    def _eager(self, reason, args, kwargs):
        """Runs the call uncaptured for ``reason`` (counted in stats.fallbacks, logged once), or raises under
        graph_fallback="raise"."""
        if self.options.graph_fallback == "raise":
            raise RuntimeError(f"fusegraph: {self.name}: cannot capture this call: {reason}")
        self.stats.add(eager_calls=1)
        self.stats.add_fallback(reason)
        if reason not in self._warned:
            self._warned.add(reason)
            _log.warning("fusegraph: %s runs uncaptured: %s", self.name, reason)
        return self.fn(*args, **kwargs)

    def _check_weights(self, guard, what) -> bool:
        """Drops every captured graph when a module's weights were replaced; True when it did."""
        changed = guard.changed()
        if not changed:
            return False
        _log.info("fusegraph: %s: %s's '%s' was replaced since capture; dropping %d captured graph(s)", self.name,
                  what, changed, len(self._cache))
        self.stats.add(weight_invalidations=1)
        self.clear()  # the module arguments' guards too: they are made anew from the current weights
        if what == "fn":
            self._fn_guard = _fn_guard(self.fn)
        return True

    def _check_module_args(self, leaves, positions) -> None:
        for p in positions:
            m = leaves[p]
            held = self._arg_guards.get(id(m))
            if held is None or held[0]() is not m:
                self._guard_arg(m)
            elif self._check_weights(held[1], f"argument {p} ({type(m).__name__})"):
                self._guard_arg(m)

    def _guard_arg(self, m) -> None:
        """Guards module argument ``m`` through a weak reference: the guard must not keep a module alive that no
        captured graph holds any more (the cache's entries hold their module arguments while they live); it goes
        when the module dies, and with the entries that held it (``_forget_arg_guards``)."""
        key, guards = id(m), self._arg_guards

        def gone(ref):
            held = guards.get(key)
            if held is not None and held[0] is ref:
                del guards[key]

        guards[key] = (weakref.ref(m, gone), _module_guard([m]))

    def _forget_arg_guards(self, evicted=None) -> None:
        """Drops the guards of module arguments that no resident entry holds any more: the entries ``evicted``
        (every entry when None). A module passed again is guarded anew from its current weights; its captured
        graphs are gone, so nothing replays with stale ones."""
        if evicted is None:
            self._entry_modules.clear()
            self._arg_guards.clear()
            return
        for entry in evicted:
            self._entry_modules.pop(entry, None)
        held = set().union(*self._entry_modules.values()) if self._entry_modules else set()
        for key in [k for k in self._arg_guards if k not in held]:
            del self._arg_guards[key]

    def _finish(self, res, leaves, in_spec, args, kwargs):
        """A cache call's outcome: a replay's outputs in fn's structure (the cache counted the replay), fn run
        uncaptured for a signature whose capture failed (the cache counted the eager call), or a capture."""
        status = res.status
        if status is _REPLAYED:
            outs, info = res.outputs, res.user
            if res.drifted:
                self._warn_drift(res.drifted)
            if info.out_spec is None:
                return outs[0]
            if info.flat_type is not None:
                return outs if info.flat_type is list else tuple(outs)
            if info.constants:
                for j, value in info.constants.items():
                    outs[j] = value
            return pytree.tree_unflatten(outs, info.out_spec)
        if status is _FAILED:
            return self.fn(*args, **kwargs)
        if status is not _MISS:
            raise AssertionError(f"fusegraph: unexpected cache status {status}")
        return self._capture_and_call(leaves, in_spec, args, kwargs)

    def capture(self, *args, lazy: bool | None = None) -> bool:
        """Captures the signature of ``args`` now (compile-time capture). Returns False when it fell back.
        With batch buckets, the signature of ``args`` padded to their bucket (nothing beyond the largest)."""
        try:
            return self._capture_args(args, lazy)
        except _BucketsOff:  # the row analysis turned buckets off: the signature of args as they are
            return self._capture_args(args, lazy)

    def _capture_args(self, args, lazy) -> bool:
        if self._buckets is not None:
            args = self._buckets.capture_args(args)
            if args is None:
                return False
        if all(type(a) in (torch.Tensor, torch.nn.Parameter) for a in args):
            leaves, in_spec = args, None
        else:
            flat, in_spec = pytree.tree_flatten((args, {}))
            leaves = flat + [self._spec_key(in_spec)]
        special = [i for i, x in enumerate(leaves) if isinstance(x, torch.Tensor) and (
            type(x) not in (torch.Tensor, torch.nn.Parameter) or (x.requires_grad and torch.is_grad_enabled()))]
        if special:  # what a call would run eagerly (see _special) is not captured either
            _log.warning("fusegraph: %s: not captured: input(s) %s are tensor subclasses or require grad under grad "
                         "mode", self.name, special)
            return False
        with self._lock:
            return self._capture(leaves, in_spec, args, {}, lazy=lazy)

    def _capture_and_call(self, leaves, in_spec, args, kwargs):
        if not self._capture(leaves, in_spec, args, kwargs, lazy=None):
            self.stats.add(eager_calls=1)
            return self.fn(*args, **kwargs)
        res = self._cache.call(leaves, False)
        assert res.status is _REPLAYED, "fusegraph: an entry just inserted was not found"
        return self._finish(res, leaves, in_spec, args, kwargs)

    def _capture(self, leaves, in_spec, args, kwargs, *, lazy) -> bool:
        o = self.options
        if self._bucket_layer is not None:  # rows independent? (buckets.py; raises _BucketsOff where not)
            self._bucket_layer.check_capture(leaves, in_spec, args, kwargs)
        if self._group is not None:  # every rank captures the same signature now, or all raise (ranks.py)
            ranks.check_signatures(self._group, ranks.tensor_signature(leaves), self.name)
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
        # Static buffers must be plain dense tensors whatever the first caller passed: an input whose elements
        # overlap (an expanded, stride-0 view) is captured on a dense copy, so later inputs can be copied in.
        dense = [t if _free_of_overlap(t) else t.contiguous() for t in tensors]
        if any(d is not t for d, t in zip(dense, tensors)):
            it = iter(dense)
            leaves = [next(it) if isinstance(x, torch.Tensor) else x for x in leaves]
            tensors = dense
        flat_fn, out_box = self._flat_fn(leaves, in_spec, args, kwargs)
        t0 = time.perf_counter()
        failure = None
        # fn's module state (a counter, running statistics, a cache written in place): the capture's trace, warm-up
        # and timing runs would each write it; their writes are undone, so the call's write is the replay's alone
        state_tensors = self._state_tensors(leaves)
        held = list(state_tensors)
        if driver.name != "host" and lazy:  # the static inputs are the caller's tensors: a warm-up's write undone too
            held += tensors
        state = StateWrites(held) if held else contextlib.nullcontext()
        try:
            # real tensors only: a compile-time capture runs inside aot_autograd, whose FakeTensorMode would
            # turn the graph's own factory ops (a graph of constants, like Mochi's position tables) into fakes.
            # The generators are put back afterwards, as the state is, when the captured graph draws random numbers:
            # the capture's runs drew, the call's own draw is the replay's, so a seeded call and everything after it
            # match eager. (Only then: another thread drawing meanwhile would be rewound too.)
            with capture_lock(), fx_tracing_window("capture"), unset_fake_temporarily(), state, \
                    _rng_preserved() as rng:
                graph = self._aten_graph if in_spec is None else None
                if self._symbolic_aten_graph and not kwargs and len(leaves) == len(args) + 1:
                    graph = specialize(self.fn, leaves[:-1])  # None: the driver traces this call instead
                counts = plain = None
                if graph is None and o.fuses and not self._symbolic_aten_graph:
                    graph, counts, plain = self._fuse(flat_fn, tensors, o)
                    if graph is not None and driver.name != "host":  # device graphs capture the fused graph's run
                        flat_fn = _list_outputs(graph)
                if driver.name == "host":  # fn's module state is read where it lives: not the entry's memory
                    cap = driver.capture(flat_fn, tensors, o, graph=graph, static=self._static, shared=state_tensors,
                                         alternative=plain if graph is not None else None)
                else:
                    cap = driver.capture(flat_fn, tensors, o, graph=graph, static=self._static)
                rng["restore"] = _draws_random(cap.info.get("gm") if cap.info.get("gm") is not None else graph)
                if counts is not None:
                    self.stats.add_patterns(counts)
                    if cap.info.get("chose") == "plain":  # the unfused trace replayed faster: its sites unused
                        self.stats.add_lowered(counts)
        except Exception as e:  # a host sync, an uncapturable op, out of memory...
            failure = e
        if self._group is not None:  # the outcome is the same on every rank: all keep the graph, or none does
            failed_ranks, memory = ranks.agree_capture(self._group, failure is not None,
                                                       0 if failure is not None else cap.memory_bytes)
            if failure is None and failed_ranks:
                failure = _Uncapturable(f"capture failed on rank(s) {failed_ranks}; every rank of the group runs "
                                        "this signature uncaptured")
            elif failure is None:
                cap.memory_bytes = memory  # the largest: memory-budget eviction evicts alike on every rank
        if failure is not None:
            e = failure
            if o.graph_fallback == "raise" and not isinstance(e, _Uncapturable):
                raise e
            if isinstance(e, _Uncapturable):
                if o.graph_fallback == "raise":
                    raise RuntimeError(f"fusegraph: {self.name}: cannot capture this call: {e}") from None
                return self._fail(leaves, str(e))
            first = (str(e).strip().splitlines() or [""])[0][:160]
            return self._fail(leaves, f"{driver.name} capture failed: {type(e).__name__}: {first}")
        seconds = time.perf_counter() - t0
        info = _EntryInfo(out_box.get("spec"), cap, driver.name, out_box.get("constants"))
        # the cache counts the capture, the recapture, evictions and memory into stats.counters
        modules = {id(x) for x in leaves if isinstance(x, torch.nn.Module)}
        before = set(self._cache.entry_ids()) if modules else ()
        evicted = self._cache.insert(leaves, cap.static_inputs, cap.executable, int(cap.memory_bytes), info)
        if modules:  # which module arguments the new entry holds: their guards live as long as some entry does
            self._entry_modules.update((e, modules) for e in self._cache.entry_ids() if e not in before)
        if evicted:
            self._forget_arg_guards(evicted)
        self.stats.add(capture_seconds=seconds)
        if cap.fallback_reason:
            self.stats.add_fallback(cap.fallback_reason)
        self._note_values(leaves)
        _log.info("fusegraph: %s captured %s graph for %s (%.3f s, %.1f MiB)%s", self.name, driver.name,
                  _C.graph.GraphCache.describe_signature(leaves), seconds, cap.memory_bytes / 2**20,
                  f"; evicted {len(evicted)}" if evicted else "")
        return True

    def _state_tensors(self, leaves) -> list:
        """The parameters, buffers and tensor attributes of fn's modules and of module arguments."""
        if not self._guard_weights:  # the backend's routes: the state is among the graph's inputs
            return []
        modules = _modules_of(self.fn) + [x for x in leaves if isinstance(x, torch.nn.Module)]
        out, seen = [], set()
        for root in modules:
            for m in root.modules():
                if id(m) in seen:
                    continue
                seen.add(id(m))
                out += [t for t in m._parameters.values() if t is not None]
                out += [t for t in m._buffers.values() if t is not None]
                out += [v for v in m.__dict__.values() if isinstance(v, torch.Tensor)]
        return out

    def _note_values(self, leaves) -> None:
        """Warns once per argument position whose non-tensor value has been captured in more than
        VALUES_PER_POSITION_WARNING graphs (each value is a graph of its own)."""
        for i, x in enumerate(leaves):
            if isinstance(x, torch.Tensor) or i == len(leaves) - 1:
                continue
            seen = self._values_seen.setdefault(i, set())
            if len(seen) <= VALUES_PER_POSITION_WARNING:
                seen.add(_C.graph.GraphCache.describe_signature([x]))
                if len(seen) > VALUES_PER_POSITION_WARNING:
                    _log.warning("fusegraph: %s has captured a graph for each of %d values of non-tensor argument "
                                 "%d (%s); every new value captures another graph. Pass it as a tensor (e.g. "
                                 "torch.tensor(t)) to replay one graph", self.name, len(seen), i, type(x).__name__)

    def _fuse(self, flat_fn, tensors, o):
        """(fused aten graph of this call or None, {family: sites}, the plain trace or None): fusion before capture
        with the backend's passes. The graph is None when nothing fused or the trace/fusion failed (then the plain
        function is captured; the failure is counted)."""
        from .host import trace_fused

        try:
            # a function that mutates its inputs mutates copies here; the static ones it does not mutate
            work = static_buffers(tensors, lazy=False, static=self._static)
        except RuntimeError:
            work = list(tensors)
        try:
            graph, counts, plain = trace_fused(flat_fn, work, o.fusion_patterns, verify=o.verify)
        except _Uncapturable:
            raise
        except DataDependent as e:  # no graph of this call is right: not a fusion problem
            raise _Uncapturable(str(e)) from None
        except Exception as e:  # fusion is an optimisation: capture the function as it is
            first = (str(e).strip().splitlines() or [""])[0][:160]
            self.stats.add_fallback(f"fusion before capture skipped ({type(e).__name__}: {first})")
            _log.warning("fusegraph: %s: fusion before capture skipped: %s: %s", self.name, type(e).__name__, first)
            return None, None, None
        return graph, counts, plain

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
                outs, box["spec"] = [out], None
            else:
                # a torch.Size is a leaf kept as a constant of the entry: its value is fixed by the input shapes
                # of the signature, and pytree would rebuild it as a plain tuple
                outs, box["spec"] = pytree.tree_flatten(out, is_leaf=lambda v: type(v) is torch.Size)
                box["constants"] = {j: o for j, o in enumerate(outs) if type(o) is torch.Size}
                outs = [None if type(o) is torch.Size else o for o in outs]
            for j, o in enumerate(outs):
                if not isinstance(o, _OUTPUT_TYPES):
                    raise _Uncapturable(f"output {j} is a {type(o).__qualname__}: a graph returns tensors, numbers, "
                                        "strings and None (in tuples, lists, dicts or registered pytree nodes)")
                if isinstance(o, torch.Tensor) and o.requires_grad and torch.is_grad_enabled():
                    raise _Uncapturable(f"autograd: output {j} requires grad (parameters with requires_grad under "
                                        "grad mode); a captured graph returns no gradient (call under "
                                        "torch.no_grad() or torch.inference_mode() to capture)")
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

    def clear(self) -> None:
        """Drops every captured graph (their memory leaves stats.graph_memory_bytes)."""
        with self._lock:
            self._cache.clear()
            self._forget_arg_guards()


def _free_of_overlap(t: torch.Tensor) -> bool:
    """No two elements of ``t`` share an address (as ``cache.cpp``'s ``free_of_overlap``, which keys inputs that share
    storage): ATen's quick check, or where it cannot tell (a column slice, a chunk of the last dim) the dims of size
    > 1 sorted by stride each stepping past the extent of those inside it. A strided slice is captured as it is: a
    dense copy would cut its sharing with another input (q, k, v chunks of one tensor)."""
    quick = internal_overlap(t)
    if quick != 2:
        return quick == 0
    extent = 1
    for stride, size in sorted((t.stride(d), t.size(d)) for d in range(t.dim()) if t.size(d) > 1):
        if stride < extent:
            return False
        extent = stride * size
    return True


def _draws_random(gm) -> bool:
    """Whether the graph ``gm`` draws from a generator (an op tagged ``nondeterministic_seeded``: rand, dropout,
    bernoulli...); True when there is no graph to tell (a driver that traced the function itself)."""
    if not isinstance(gm, torch.fx.GraphModule):
        return True
    for node in gm.graph.nodes:
        target = single_overload(node.target) if node.op == "call_function" else None
        if target is not None and torch.Tag.nondeterministic_seeded in target.tags:
            return True
    return False


@contextlib.contextmanager
def _rng_preserved():
    """Restores the CPU generator and the initialised CUDA/NPU devices' generators on exit, unless the body sets
    ``restore`` of the dict it gets to False (the captured graph draws nothing: a restore would only rewind another
    thread's draws made meanwhile)."""
    cpu = torch.get_rng_state()
    devices = []
    for name in ("cuda", "npu"):
        mod = getattr(torch, name, None)
        initialized = getattr(mod, "is_initialized", None)
        try:
            if initialized is not None and initialized():
                devices.append((mod, mod.get_rng_state_all()))
        except Exception:  # a device module that cannot answer here
            continue
    box = {"restore": True}
    try:
        yield box
    finally:
        if box["restore"]:
            torch.set_rng_state(cpu)
            for mod, states in devices:
                mod.set_rng_state_all(states)


def _list_outputs(gm):
    """A traced graph as the flat function a device-graph driver captures (a list of outputs)."""

    def run(*tensors):
        return list(gm(*tensors))

    return run


def _overrides_torch_function(cls) -> bool:
    """A tensor subclass whose __torch_function__ or __torch_dispatch__ adds behaviour a graph would drop."""
    tf = getattr(cls, "__torch_function__", None)
    plain_tf = (torch.Tensor.__torch_function__, disabled_torch_function_impl)
    tf = getattr(tf, "__func__", tf)
    if tf not in tuple(getattr(f, "__func__", f) for f in plain_tf):
        return True
    return getattr(cls, "__torch_dispatch__", None) is not getattr(torch.Tensor, "__torch_dispatch__", None)


def _is_aten_graph(fn, symbolic: bool = False) -> bool:
    """An FX graph of dispatcher ops only (aot_autograd's, after fusion), whose inputs are all tensors;
    ``symbolic``: one with symbolic sizes, whose inputs are tensors and SymInts and whose other nodes may compute
    sizes (``sym_size``, ``sym_sum``, ``operator`` arithmetic on them), and which has at least one SymInt input."""
    import operator

    if not isinstance(fn, torch.fx.GraphModule):
        return False
    symbols = False
    for n in fn.graph.nodes:
        val = n.meta.get("val", n.meta.get("example_value"))
        if n.op == "placeholder":
            if symbolic and isinstance(val, torch.SymInt):
                symbols = True
            elif val is not None and not isinstance(val, torch.Tensor):
                return False
        elif n.op == "call_function":
            if symbolic and isinstance(val, (torch.SymInt, torch.SymBool, torch.SymFloat)):
                continue  # a size computed from sizes
            if single_overload(n.target) is None and n.target is not operator.getitem:
                return False
        elif n.op not in ("get_attr", "output"):
            return False
    return symbols or not symbolic


def _modules_of(fn, slots=None) -> list:
    """The modules whose weights ``fn`` reads: fn itself, the object of a bound method, a partial's arguments,
    modules in its closure, and those its code reaches by name (``_reach``). ``slots``: a list that receives the
    (dict, key, value) slots through which a module was found in a global or an attribute, so that rebinding it
    (``model = other``, ``pipe.transformer = other``) is seen too."""
    found = []

    def add(x):
        if isinstance(x, torch.nn.Module) and all(x is not m for m in found):
            found.append(x)
            return True
        return False

    add(fn)
    add(getattr(fn, "__self__", None))
    if isinstance(fn, functools.partial):
        add(fn.func)
        add(getattr(fn.func, "__self__", None))
        for a in list(fn.args) + list(fn.keywords.values()):
            add(a)
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            add(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    _reach(fn, add, slots if slots is not None else [], set(), _REACH_FUNCTIONS)
    return found


# How far ``_reach`` follows a function's names: functions it calls by name (helpers) and attribute chains
# (``pipe.transformer``, ``app.pipe.transformer``).
_REACH_FUNCTIONS = 2
_REACH_ATTRIBUTES = 2


def _reach(fn, add, slots, visited, functions) -> None:
    """Adds the modules ``fn``'s code reaches by name: a global named in its code (``def step(x): return
    model(x)``), attribute chains of the names in its code from a global or closure object (``pipe.transformer``),
    the modules among the attributes (or dict/list items) of a global, closure or bound-method object that is not
    a module (one level), and the same for the plain functions it names (``functions`` levels deep). Only
    ``__dict__`` entries are read: no property or ``__getattr__`` runs."""
    if isinstance(fn, functools.partial):
        fn = fn.func
    self_obj = getattr(fn, "__self__", None)
    fn = getattr(fn, "__func__", fn)
    if isinstance(fn, torch.nn.Module):  # its forward's globals (a module's own state is guarded already)
        fn = getattr(type(fn).forward, "__func__", type(fn).forward)
    code = getattr(fn, "__code__", None)
    if not isinstance(fn, types.FunctionType) or code is None or id(fn) in visited:
        return
    visited.add(id(fn))
    names, stack = set(), [code]
    while stack:  # the code's names and those of the code nested in it (lambdas, comprehensions)
        c = stack.pop()
        names.update(c.co_names)
        stack += [k for k in c.co_consts if isinstance(k, types.CodeType)]

    def items(seq) -> bool:
        """The modules among a list's or tuple's items (a list's item slots guarded: ``LAYERS[0] = other``)."""
        hit = False
        for i, v in enumerate(seq):
            if isinstance(v, torch.nn.Module):
                add(v)
                if type(seq) is list:
                    slots.append((seq, i, v))
                hit = True
        return hit

    def chains(obj, depth) -> bool:
        """Follows the code's names as attributes of ``obj``; True when a module was found."""
        attrs = _instance_dict(obj)
        if attrs is None or depth == 0:
            return False
        hit = False
        for name in names & attrs.keys():
            value = attrs[name]
            if add(value) or isinstance(value, torch.nn.Module) or chains(value, depth - 1) or \
                    (type(value) in (list, tuple) and items(value)):
                slots.append((attrs, name, value))
                hit = True
        return hit

    def holder(obj) -> bool:
        """A global, closure or bound-method object: the module itself, attribute chains, its modules one level."""
        if isinstance(obj, torch.nn.Module):
            add(obj)
            return True
        if isinstance(obj, types.FunctionType):
            if functions > 0:
                _reach(obj, add, slots, visited, functions - 1)
            return False
        if isinstance(obj, types.MethodType):  # a bound method held as a value (``encode = enc.forward``)
            hit = holder(obj.__self__)
            if functions > 0:
                _reach(obj.__func__, add, slots, visited, functions - 1)
            return hit
        if isinstance(obj, (type, types.BuiltinFunctionType)) or obj is None:
            return False
        hit = chains(obj, _REACH_ATTRIBUTES)
        if isinstance(obj, types.ModuleType):  # a Python module: only the names the code uses
            return hit
        attrs = _instance_dict(obj)
        members = attrs if attrs is not None else obj if type(obj) is dict else None
        if members is not None:
            for k, v in members.items():
                if isinstance(v, torch.nn.Module):
                    add(v)
                    slots.append((members, k, v))
                    hit = True
                elif type(v) in (list, tuple) and items(v):  # a list of modules one level down (pipe.blocks)
                    slots.append((members, k, v))
                    hit = True
        elif type(obj) in (list, tuple):
            hit = items(obj) or hit
        return hit

    if self_obj is not None:
        holder(self_obj)
    for cell in fn.__closure__ or ():
        try:
            holder(cell.cell_contents)
        except ValueError:  # an empty cell
            pass
    scope = fn.__globals__
    for name in names & scope.keys():
        value = scope[name]
        if holder(value):  # rebinding the global is a replaced module too
            slots.append((scope, name, value))


def _instance_dict(obj):
    """``obj.__dict__`` when it is a plain dict, read without running a custom ``__getattr__``/``__getattribute__``;
    else None."""
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except Exception:  # no __dict__ (slots, builtins)
        return None
    return attrs if type(attrs) is dict else None


def _fn_guard(fn):
    slots = []
    return _module_guard(_modules_of(fn, slots), slots)


def _module_guard(modules, slots=()):
    """A C++ SlotGuard over every parameter, buffer, submodule and tensor attribute of ``modules``, and each
    module's ``training`` flag (``train()``/``eval()``: Dropout, BatchNorm and ``if self.training`` branches trace
    otherwise), and over ``slots`` (the globals and attributes the modules were found through); None when there are
    none. Other Python attributes a forward reads are fixed at capture."""
    if not modules:
        return None
    guard = _C.graph.SlotGuard()
    for d, k, v in slots:
        guard.add(d, k, v)
    seen = set()
    for root in modules:
        for m in root.modules():
            if id(m) in seen:
                continue
            seen.add(id(m))
            for d in (m._parameters, m._buffers, m._modules):
                for k, v in d.items():
                    guard.add(d, k, v)
            attrs = m.__dict__
            for k, v in attrs.items():
                if isinstance(v, torch.Tensor) or k == "training":
                    guard.add(attrs, k, v)
    return guard


def compile_graph_route(gm, example_inputs, config=None, stats: Stats | None = None, static_inputs=()):
    """The backend's graph route: a callable that captures ``gm`` per input signature and replays it.
    See the module docstring for the contract. ``static_inputs``: the indices of ``gm``'s inputs that are
    parameters or buffers; those ``gm`` does not mutate are never copied for a capture. The host graph binds every
    input where it lives; a static-buffer driver (CUDA, NPU) replays on them in place and keys them by address
    (another tensor there: a capture of its own)."""
    options, batch = GraphOptions.from_config(config), None
    if options.graph_batch_buckets and isinstance(gm, torch.fx.GraphModule):
        # exact batch rule from the trace (buckets.py): Dynamo's symbolic dim 0, rows independent; a static graph
        # runs as it is
        batch, why = graph_route_batch(gm)
        if batch is None:
            options = GraphOptions(**{**options.__dict__, "graph_batch_buckets": ()})
            if why and stats is not None:
                stats.add_fallback(f"batch buckets off for this graph: {why}")
            if why:
                _log.warning("fusegraph: batch buckets off for this graph: %s", why)
    real = [t for t in example_inputs if isinstance(t, torch.Tensor)]
    driver, _ = select_driver(options.device_graph, real[0].device if real else torch.device("cpu"))
    tensor_index = {i: k for k, i in enumerate(i for i, x in enumerate(example_inputs) if isinstance(x, torch.Tensor))}
    mutated = _mutated_inputs(gm)
    static = tuple(tensor_index[i] for i in static_inputs if i in tensor_index and i not in mutated)
    runner = GraphRunner(gm, options, stats=stats, name=getattr(gm, "_get_name", lambda: "graph")(),
                         guard_weights=False, batch_args=batch, static_inputs=static,
                         static_by_address=driver is not None and driver.name != "host")
    fake = any(isinstance(t, FakeTensor) for t in real)
    if not runner.options.graph_lazy_capture and not fake and example_inputs is not None:
        runner.capture(*example_inputs, lazy=False)
    return runner


def _mutated_inputs(gm) -> set:
    """Indices of the placeholders an op of ``gm`` writes (a mutable schema argument), or every index when ``gm`` is
    not an FX graph."""
    if not isinstance(gm, torch.fx.GraphModule):
        return set(range(1 << 30))
    placeholders = gm.graph.find_nodes(op="placeholder")
    index = {n: i for i, n in enumerate(placeholders)}
    mutated = set()
    for node in gm.graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for arg, value in zip(schema.arguments, node.args):
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.fx.Node) \
                    and value in index:
                mutated.add(index[value])
        for arg in schema.arguments:
            value = node.kwargs.get(arg.name)
            if arg.alias_info is not None and arg.alias_info.is_write and isinstance(value, torch.fx.Node) \
                    and value in index:
                mutated.add(index[value])
    return mutated


__all__ = ["GraphRunner", "compile_graph_route", "static_buffers"]
