"""The torch.compile backend: route selection (SPEC §1.2), fusion, Inductor or fused aten ops, stats and logs.

Data flow of the default route::

    Dynamo FX graph -> aot_autograd (inference, functionalized, Inductor's decompositions)
        -> redundant-node pass -> pattern families to a fixpoint (fusegraph.fusion.passes)
        -> inductor=True:  Inductor codegen (the fusion runs as Inductor's post_grad_custom_pre_pass; freezing
                           via Inductor's own ``freezing`` option)
        -> inductor=False: the fused aten graph runs as is (freezing via torch._inductor.freezing.freeze)

The graph routes (graph_only / graph_with_compile) hand the (fused) aten graph to ``fusegraph.graph``'s
GraphRunner when a device graph is available; otherwise the default route runs and the reason is logged
once and counted in ``stats.fallbacks``.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import itertools
import logging
import threading
import time
from typing import Optional

import torch

from . import freezing
from ._core import torch_dispatcher
from ._core.torch_dispatcher import pytree
from ._core.torch_dynamo import capture_lock, fx_tracing_window
from .config import CompilationConfig
from .fusion import PATTERN_NAMES, choice, passes
from .fusion.inductor_pass import FusionPass
from .graph import compile_graph_route, device_graph_available
from .stats import Stats

log = logging.getLogger("fusegraph")

_logged_reasons: set = set()
_logged_lock = threading.Lock()


def _log_once(reason: str) -> None:
    with _logged_lock:
        if reason in _logged_reasons:
            return
        _logged_reasons.add(reason)
    log.warning("fusegraph: %s", reason)


def _input_device(example_inputs) -> torch.device:
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


class _CompileJob:
    """One compiled graph: its counts, its log, its route."""

    def __init__(self, backend: "Backend", graph_id: int):
        self.backend = backend
        self.graph_id = graph_id
        self.counts: Optional[dict] = None
        self.fusing = True
        self.freeze = backend.config.enable_freezing is True  # fold parameters into constants (False: the unfrozen re-compile)
        self.count = True  # add fused counts to stats (False: a re-compile of a graph already counted)
        self.fallbacks: list = []
        self.glog = passes.GraphLog(backend._log_dir, f"fusegraph Backend {id(backend):#x}, Dynamo graph {graph_id}")
        self.pass_ran = False  # Inductor ran the fusion pass (False on a cache hit)
        self.pass_fallbacks: list = []  # fallbacks noted by the pass (replayed on a cache hit)
        self.real_inputs: Optional[list] = None  # Dynamo's real example inputs (after freezing), for verify
        self.lowered: Optional[dict] = None  # {family: sites lowered back to aten for Inductor} (Inductor route)
        self.ops: collections.Counter = collections.Counter()  # op name -> count in the graph handed on
        self.params: list = []  # the parameters this compile freezes

    def fuse(self, graph_or_gm, reshape_views: bool = False) -> None:
        verify_inputs = None
        if self.backend.config.verify:
            verify_inputs, why = passes.verify_inputs_for(graph_or_gm, self.real_inputs)
            if why:
                self.note_fallback(why)
        counts = passes.fuse_graph(graph_or_gm, self.backend.config, stats=self.backend.stats if self.count else None,
                                   graph_log=self.glog, verify_inputs=verify_inputs, reshape_views=reshape_views)
        if self.counts is None:
            self.counts = counts
        else:
            for k, v in counts.items():
                self.counts[k] += v
        self.record_ops(graph_or_gm)

    def choose(self, graph) -> None:
        """Inductor route: fused sites Inductor's own code is predicted to beat are lowered back (choice.py)."""
        self.lowered = choice.choose(graph, stats=self.backend.stats if self.count else None)
        self.record_ops(graph)

    def record_ops(self, graph_or_gm) -> None:
        """What the backend hands on: op name -> count in the final graph (``Backend.last_graph_ops``)."""
        graph = graph_or_gm.graph if isinstance(graph_or_gm, torch.fx.GraphModule) else graph_or_gm
        self.ops = collections.Counter(str(n.target) if n.op == "call_function" else n.op for n in graph.nodes
                                       if n.op in ("call_function", "get_attr", "placeholder"))
        self.backend.last_graph_ops = self.ops

    def note_fallback(self, reason: str) -> None:
        self.fallbacks.append(reason)
        self.backend._fallback(reason)


# ---------------------------------------------------------------------------------------------------------


class Backend:
    """A ``torch.compile`` backend: ``torch.compile(model, backend=fusegraph.Backend(config))``.

    The config (a CompilationConfig, a dict of overrides, or None for the process defaults) is snapshotted
    here; ``stats`` accumulates over every graph this backend compiles.
    """

    def __init__(self, config: Optional[CompilationConfig] = None):
        if config is None:
            config = CompilationConfig()
        elif isinstance(config, dict):
            config = CompilationConfig(**config)
        elif not isinstance(config, CompilationConfig):
            raise TypeError(f"config must be a CompilationConfig, a dict of overrides or None, "
                            f"got {type(config).__name__}")
        self.config = copy.deepcopy(config)
        self.stats = Stats()
        self._log_dir = passes.prepare_log_dir(self.config.graph_log_url)
        self._ids = itertools.count()
        self.last_route: Optional[str] = None
        # The last compiled graph as handed on (after fusion; freezing too on the aten route): op name -> count.
        # Op names are str(target), e.g. "fusegraph.gelu_tanh.default", "aten.tanh.default"; plus "get_attr".
        self.last_graph_ops: collections.Counter = collections.Counter()

    # copy.deepcopy / pickle of a compiled model carry the backend: its config and counters (a copied Stats carries
    # the values, in counters of its own); the graph-id counter continues where it was (itertools.count does not pickle on Python >= 3.14)
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_ids"] = next(copy.copy(self._ids))
        return state

    def __setstate__(self, state):
        state = dict(state)
        state["_ids"] = itertools.count(state["_ids"])
        self.__dict__.update(state)

    # route selection (SPEC §1.2)
    def select_route(self, example_inputs) -> tuple[str, Optional[str]]:
        """('graph_with_compile' | 'graph_only' | 'default', why the wanted graph route is unavailable)."""
        cfg = self.config
        wanted = "graph_with_compile" if cfg.graph_with_compile else "graph_only" if cfg.graph_only else None
        if wanted is None:
            return "default", None
        ok, why = device_graph_available(_input_device(example_inputs), cfg)
        if ok:
            return wanted, None
        return "default", f"{wanted} requested but {why}; running the default route"

    def _fallback(self, reason: str) -> None:
        self.stats.add_fallback(reason)
        _log_once(reason)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        t0 = time.perf_counter()
        captured_before, seconds_before = self.stats.graphs_captured, self.stats.capture_seconds
        # The graph and aten routes freeze by default, the Inductor route when asked (enable_freezing): weights
        # become constants of the graph, so a captured graph holds them instead of copying them into static
        # buffers on each replay. Dynamo reuses this graph for every module
        # instance of the same class, so the frozen graph is guarded per call (freezing.FrozenGraph).
        # A graph with symbolic shapes is not frozen: a re-compile on a guard miss would run outside Dynamo and
        # specialise its shapes.
        freeze = self._freezes(example_inputs) and not torch.is_grad_enabled()
        if freeze and freezing.has_symbolic_inputs(gm, example_inputs):
            log.debug("fusegraph: graph with symbolic shapes: compiled without freezing")
            freeze = False
        params = freezing.frozen_parameters(gm, example_inputs) if freeze else {}
        job, compiled = self._compile(gm, example_inputs, params, freeze=freeze)
        if params:
            compiled = freezing.FrozenGraph(self, gm, example_inputs, params, compiled, job.graph_id,
                                            copies=freezing.holds_copies(self.config))
        if self.last_route == "default" and self.config.inductor and job.counts is not None:
            kept = sum(job.counts.values()) - sum((job.lowered or {}).values())
            self.stats.add_graph_choice("fused" if kept > 0 else "inductor")
        seconds = time.perf_counter() - t0
        self.stats.add(graphs_compiled=1, compile_seconds=seconds)
        log.info(self._summary(job, self.stats.graphs_captured - captured_before,
                               self.stats.capture_seconds - seconds_before))
        log.debug("fusegraph: graph %d compiled in %.2f s on the %s route (%s)", job.graph_id, seconds,
                  self.last_route, "Inductor" if self.last_route == "default" and self.config.inductor else "aten graph")
        return compiled

    def _freezes(self, example_inputs) -> bool:
        """``enable_freezing``, 'auto' (default) read as: every route but Inductor's (config.py says why)."""
        if self.config.enable_freezing == "auto":
            return not (self.select_route(example_inputs)[0] == "default" and self.config.inductor)
        return self.config.enable_freezing

    def _compile(self, gm, example_inputs, params: dict, *, freeze: bool, graph_id: Optional[int] = None):
        """One compile of the Dynamo graph on the selected route; ``params`` ({input position: tensor}) are folded
        into the graph as constants. Returns (job, callable taking every original input).

        Under Dynamo's compile lock (a frozen graph's re-compile runs outside Dynamo), with other threads'
        compiled calls running on while aot_autograd and the pattern matcher trace (fx_tracing_window)."""
        with capture_lock(), fx_tracing_window("compile"):
            return self._compile_locked(gm, example_inputs, params, freeze=freeze, graph_id=graph_id)

    def _compile_locked(self, gm, example_inputs, params: dict, *, freeze: bool, graph_id: Optional[int]):
        job = _CompileJob(self, next(self._ids) if graph_id is None else graph_id)
        job.freeze = freeze
        job.count = graph_id is None  # a re-compile fuses the same sites of the same Dynamo graph again
        route, why = self.select_route(example_inputs)
        if why:
            job.note_fallback(why)
        self.last_route = route
        job.fusing = route != "graph_only"
        keep = None
        job.params = list(params.values())
        if params:
            gm, keep = freezing.parameters_to_attributes(gm, params)
            example_inputs = [example_inputs[i] for i in keep]
        with freezing.opaque_inputs_stay_inputs():  # Inductor's own freezing too
            if route == "default" and self.config.inductor:
                compiled = self._compile_inductor(gm, example_inputs, job)
            else:
                compiled = self._compile_aten(gm, example_inputs, job, route)
        if keep is not None:
            compiled = freezing.pass_kept_args(compiled, keep)
        job.params = []  # the compiled graph holds aliases of them, nothing here holds the user's parameters
        return job, compiled

    # default route, inductor=True
    def _compile_inductor(self, gm, example_inputs, job):
        """Inductor's compile with fusegraph's pass; on CPU through Inductor's C++ wrapper (``config.cpp_wrapper``),
        and where that fails to compile, again with its Python wrapper (logged, in ``stats.fallbacks``)."""
        cpp = self.config.cpp_wrapper and _cpp_wrapper_fits(gm, example_inputs)
        try:
            return self._compile_inductor_with(gm, example_inputs, job, cpp)
        except Exception as e:
            if not cpp:
                raise
            if isinstance(e, _ProxyExecutorOps):
                log.info("fusegraph: graph %d: %s; compiled with Inductor's Python wrapper", job.graph_id, e)
            else:
                first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                job.note_fallback(f"Inductor's C++ wrapper failed to compile graph {job.graph_id} "
                                  f"({type(e).__name__}: {first[:200]}); compiled with its Python wrapper")
            job.count = job.count and not job.pass_ran  # the pass already counted its sites
            job.counts, job.lowered, job.pass_ran, job.pass_fallbacks = None, None, False, []
            return self._compile_inductor_with(gm, example_inputs, job, False)

    def _compile_inductor_with(self, gm, example_inputs, job, cpp_wrapper: bool):
        from ._core.torch_inductor import compile_fx

        fusion_pass = FusionPass(self.config, job)
        if self.config.verify:  # the post-grad graph's placeholders once Inductor froze the rest
            job.real_inputs = list(example_inputs)
        patches = {"post_grad_custom_pre_pass": fusion_pass, "freezing": job.freeze, "cpp_wrapper": cpp_wrapper}
        with freezing.weight_policy(self.config, job.params), _refuse_proxy_executor(cpp_wrapper), \
                freezing.released_with_the_graph(job.params):
            compiled = compile_fx(gm, example_inputs, config_patches=patches)
        if job.pass_ran:
            fusion_pass.after_compile(gm, example_inputs, job.freeze)  # stores the record
            return compiled
        # Inductor served the graph from its cache without running the pass: the counts, the fallbacks the pass
        # noted, the graph logs and the final ops come from the record of the compile that ran it.
        record = fusion_pass.after_compile(gm, example_inputs, job.freeze)
        if record is None:
            job.glog.write_cached(None, gm.code)
            self.last_graph_ops = collections.Counter()  # unknown: not the previous graph's
            return compiled
        if record["counts"] is not None:
            job.counts = dict(record["counts"])
            if job.count:
                self.stats.add_patterns(job.counts)
        if record["lowered"] is not None:
            job.lowered = dict(record["lowered"])
            if job.count:
                self.stats.add_lowered(job.lowered)
        job.ops = self.last_graph_ops = collections.Counter(record["ops"])
        for reason in record["fallbacks"]:
            job.note_fallback(reason)
        job.glog.write_cached(record["log"], gm.code)
        return compiled

    # default route with inductor=False, and the graph routes: an aten graph, fused or not, run or captured
    def _compile_aten(self, gm, example_inputs, job, route):
        from ._core.torch_dynamo import aot_autograd
        from functorch.compile import make_boxed_func

        fuse = route != "graph_only"
        if self.config.verify:  # the aot graph's placeholders after the lifted parameters
            job.real_inputs = list(example_inputs)

        def plain(aot_gm, aot_inputs):
            if fuse:
                job.note_fallback("autograd graph: fusion skipped (fused ops have no backward)")
            return make_boxed_func(aot_gm.forward)

        def inference(aot_gm, aot_inputs):
            layouts = _output_layouts(aot_gm)  # as traced, before fusion and freezing: eager's strides
            return _with_traced_strides(compile_inference(aot_gm, aot_inputs), layouts)

        def compile_inference(aot_gm, aot_inputs):
            if fuse:
                job.fuse(aot_gm, reshape_views=True)  # the graph runs as is: no view traced on eager's strides
            else:
                job.record_ops(aot_gm)
            graph, keep = aot_gm, None
            if job.freeze and not torch.is_grad_enabled():
                graph, keep = freezing.freeze_aot_graph(gm, aot_gm, aot_inputs, self._fallback, self.config,
                                                          job.params)
                if keep is not None:
                    job.record_ops(graph)
            if route != "default":
                inputs = list(aot_inputs) if keep is None else [aot_inputs[i] for i in keep]
                graph, unused = freezing.drop_unused_opaque_inputs(graph, inputs)
                if unused is not None:  # DTensor's DeviceMesh: a graph input no op reads; a runner cannot key it
                    inputs = [inputs[i] for i in unused]
                    keep = unused if keep is None else [keep[i] for i in unused]
                runner = self._capture(graph, inputs)
                return make_boxed_func(runner) if keep is None else freezing.drop_frozen_args(runner, keep)
            return make_boxed_func(graph.forward) if keep is None else freezing.drop_frozen_args(graph, keep)

        backend = aot_autograd(fw_compiler=plain, inference_compiler=inference,
                               decompositions=passes.decompositions())
        # A tracing context, as compile_fx sets up: aot_autograd records the parameters in it, freezing reads them.
        from ._core.torch_fake import FakeTensorMode, TracingContext, detect_fake_mode, tracing

        context = TracingContext.try_get()
        if context is None:
            fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
            context = TracingContext(fake_mode)
        with tracing(context):
            return backend(gm, example_inputs)

    def _capture(self, fn, example_inputs):
        """Hands a graph to the graph runtime (GraphRunner); the one place the routes meet it."""
        return compile_graph_route(fn, example_inputs, self.config, self.stats)

    def _summary(self, job, captured: int, capture_seconds: float) -> str:
        """The SPEC §1.3 line; '?' for a count Inductor served from its cache before fusegraph saw the graph."""
        counts = job.counts or {}
        unknown = job.counts is None and job.fusing
        fused = " ".join(f"{name}×{'?' if unknown else counts.get(name, 0)}" for name in PATTERN_NAMES)
        lowered = sum((job.lowered or {}).values())
        to_inductor = f"; {lowered} of them left to Inductor's code (faster there)" if lowered else ""
        return (f"fusegraph: fused {fused}; captured {captured} graph{'' if captured == 1 else 's'} "
                f"({capture_seconds:.2f} s, {self.stats.graph_memory_bytes / 2**20:.1f} MiB){to_inductor}")


class _ProxyExecutorOps(RuntimeError):
    """The C++ wrapper would call aten ops through its proxy executor (ops without a C shim)."""


class _ProxyExecutorFilter(logging.Filter):
    """Notes (and drops) Inductor's warning that an aten op has no C shim, so the C++ wrapper would call it through
    its proxy executor."""

    def __init__(self):
        super().__init__()
        self.ops: list = []

    def filter(self, record) -> bool:
        if "missing a c-shim implementation" in str(record.msg):
            self.ops.append(str(record.args[0]) if record.args else "?")
            return False
        return True


@contextlib.contextmanager
def _refuse_proxy_executor(active: bool):
    """Inside a C++-wrapper compile: raises _ProxyExecutorOps after it when any aten op would go through the proxy
    executor. That path of the JIT C++ wrapper crashed the process (SIGSEGV at the first call of Z-Image's graph,
    whose select_scatter / full / select / unsqueeze have no C shim), so such graphs keep the Python wrapper."""
    if not active:
        yield
        return
    ir_log = logging.getLogger("torch._inductor.ir")
    seen = _ProxyExecutorFilter()
    ir_log.addFilter(seen)
    try:
        yield
    finally:
        ir_log.removeFilter(seen)
    if seen.ops:
        names = ", ".join(sorted(set(seen.ops)))
        raise _ProxyExecutorOps(f"aten ops without a C shim for Inductor's C++ wrapper ({names})")


def _cpp_wrapper_fits(gm, example_inputs) -> bool:
    """Inductor's C++ wrapper for this graph: CPU, static shapes, every input a tensor, no collectives, no op taking
    an ``Any`` argument, no complex tensor. Its Python entry turns other inputs into tensors (an opaque DeviceMesh
    that DTensor graphs keep as an input fails there at the first call); it cannot pass an ``Any`` argument to the
    ops it calls back in Python (context parallelism's); graphs with collectives, and symbolic shapes, stay with
    the Python wrapper, which more of Inductor is tested with. Inductor generates no code for complex ops: they
    stay aten calls, several without a C shim (``_conj``), which :func:`_refuse_proxy_executor` would refuse only
    after a whole compile."""
    from ._core import ranks

    if _input_device(example_inputs).type != "cpu" or freezing.has_symbolic_inputs(gm, example_inputs):
        return False
    if not all(isinstance(x, torch.Tensor) for x in example_inputs) or ranks.collective_groups(gm) != []:
        return False
    any_type = torch_dispatcher.AnyType.get()
    for node in gm.graph.nodes:
        val = node.meta.get("example_value", node.meta.get("val"))
        if any(isinstance(v, torch.Tensor) and v.dtype.is_complex for v in pytree.tree_leaves(val)):
            return False
        if node.op != "call_function" or not isinstance(node.target, (torch_dispatcher.OpOverload,
                                                                      torch_dispatcher.OpOverloadPacket)):
            continue
        overloads = [node.target] if isinstance(node.target, torch_dispatcher.OpOverload) else \
            [getattr(node.target, name) for name in node.target.overloads()]
        if any(a.type == any_type for op in overloads for a in op._schema.arguments):
            return False
    return True


def _output_layouts(gm: torch.fx.GraphModule) -> list:
    """(index, shape, strides) of each tensor output of an aot graph, from its trace."""
    outputs = gm.graph.output_node().args[0]
    layouts = []
    for i, node in enumerate(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if isinstance(val, torch.Tensor) and not isinstance(val, torch.SymInt) and \
                all(isinstance(d, int) for d in (*val.shape, *val.stride())):
            layouts.append((i, tuple(val.shape), tuple(val.stride())))
    return layouts


def _restride(t: torch.Tensor, shape, stride) -> torch.Tensor:
    """``t`` with the traced ``stride``: a free view where only size-1 dims differ, else a copy."""
    if tuple(t.shape) != shape:
        return t
    if t.is_contiguous() and all(a == b for d, a, b in zip(shape, t.stride(), stride) if d != 1):
        return t.as_strided(shape, stride)
    out = torch.empty_strided(shape, stride, dtype=t.dtype, device=t.device)
    return out.copy_(t)


def _with_traced_strides(boxed, layouts):
    """A boxed callable whose tensor outputs have the strides the graph was traced with (eager's).

    A fused op writes a dense row-major result where eager's op may have kept its input's layout, and freezing's
    CPU weight packing makes convolutions return channels-last tensors (Inductor's codegen restores output
    strides; an aten graph run by FX or captured does not). Dynamo guards the strides of every tensor a later
    frame receives, so a block whose output strides changed made Dynamo recompile the next block (HunyuanVideo
    1.5), and aot_autograd regenerates outputs that are views of an output from the traced strides. One stride
    compare per output per call; a copy only where the memory order really differs."""
    if not layouts:
        return boxed

    def run(args):
        outs = boxed(args)
        fixed = None
        for i, shape, stride in layouts:
            t = outs[i]
            if isinstance(t, torch.Tensor) and t.stride() != stride:
                if fixed is None:
                    fixed = list(outs)
                fixed[i] = _restride(t, shape, stride)
        if fixed is None:
            return outs
        return type(outs)(fixed) if isinstance(outs, tuple) else fixed

    run._boxed_call = True
    return run


def fusegraph_backend(gm, example_inputs):
    """Backend by name (``torch.compile(backend="fusegraph")``): a Backend with the process defaults as they are
    at this compile. Its counters add up in ``fusegraph_backend.stats``."""
    backend = Backend()
    backend.stats = fusegraph_backend.stats
    return backend(gm, example_inputs)


fusegraph_backend.stats = Stats()
