"""The compile of one Dynamo graph, as stages that return a record (``CompiledGraph``).

    select_route(config, inputs)                   -> route, why not the wanted graph route
    compile_graph(config, stats, gm, inputs, ...)  -> CompiledGraph
        freezing.plan                                 opt-in only (pack_weights, concat_linear, enable_freezing):
                                                      which parameters the Inductor route folds, or why not
        route "default", inductor=True:  _compile_inductor   Inductor's compile_fx with fusegraph's pass
                                                             (inductor_pass.FusionPass); when planned, through
                                                             freezing.compile_frozen (-> a FrozenGraph)
        otherwise:                       _compile_aten       aot_autograd; the fusion (fusion.job.FusionJob) and,
                                                             on the graph routes, the graph runtime
                                                             (graph.compile_graph_route), parameters as inputs

The record holds the callable (it takes every input of the Dynamo graph), the route, and the ``FusionJob`` with
what the fusion did (counts, sites lowered, final ops, graph log, the tally for the caller's ``Stats``). Nothing here
reports to the backend: ``Backend`` reads the record. ``stats`` is passed only to what counts at run time: the graph
runtime (captures, replays) and a ``FrozenGraph`` (its one unfrozen compile, made by ``compile_graph`` again).
"""
from __future__ import annotations

import contextlib
import copy
import logging
import operator
from dataclasses import dataclass
from typing import Callable, Optional

import torch

from . import freezing
from ._core import torch_dispatcher
from ._core.torch_dispatcher import pytree
from ._core.torch_dynamo import capture_lock, fx_tracing_window
from .fusion import passes, scalar_alpha
from .fusion.inductor_pass import FusionPass
from .fusion.job import FusionJob
from .graph import compile_graph_route, device_graph_available

log = logging.getLogger("fusegraph")


@dataclass
class CompiledGraph:
    """One compile of a Dynamo graph: ``fn`` takes the graph's inputs, on ``route``; ``job`` is what the fusion did."""
    fn: Callable
    route: str
    job: FusionJob

    @property
    def graph_id(self) -> int:
        return self.job.graph_id


def input_device(example_inputs) -> torch.device:
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


# Device type -> the dispatch key its kernels register under (torch_npu registers Ascend as PrivateUse1).
_DISPATCH_KEYS = {"cuda": "CUDA", "npu": "PrivateUse1", "xpu": "XPU", "mps": "MPS"}


def unfusable_why(example_inputs) -> Optional[str]:
    """Why no fused op can run on this graph: its tensors are on a device fusegraph's ops have no kernels for. On
    CUDA that is a fusegraph built without nvcc (CMakeLists.txt then builds the CPU part alone). None: they can."""
    types = {x.device.type for x in example_inputs if isinstance(x, torch.Tensor)} - {"cpu", "meta"}
    for kind in sorted(types):
        key = _DISPATCH_KEYS.get(kind)
        if key is None or not torch_dispatcher.has_kernel("fusegraph::rms_norm", key):
            hint = " (it was built without its CUDA kernels: no nvcc where it was built)" if kind == "cuda" else ""
            return f"fusegraph's ops have no {kind} kernels{hint}: this graph is compiled unfused"
    return None


def _unfused(config):
    """``config`` with every pattern family off, as a new config."""
    new = copy.deepcopy(config)
    for name in type(new.fusion_patterns)._fields:
        if name.startswith("enable_"):
            setattr(new.fusion_patterns, name, False)
    return new


def select_route(config, example_inputs) -> tuple[str, Optional[str]]:
    """('graph_with_compile' | 'graph_only' | 'default', why the wanted graph route is unavailable) (SPEC §1.2)."""
    wanted = "graph_with_compile" if config.graph_with_compile else "graph_only" if config.graph_only else None
    if wanted is None:
        return "default", None
    ok, why = device_graph_available(input_device(example_inputs), config)
    if ok:
        return wanted, None
    return "default", f"{wanted} requested but {why}; running the default route"


def compile_graph(config, stats, gm, example_inputs, *, graph_id: int, count: bool = True,
                  may_freeze: bool = True, log_dir: Optional[str] = None, label: str = "fusegraph") -> CompiledGraph:
    """One compile of the Dynamo graph on the route ``config`` selects. ``count=False``: a re-compile of a graph
    already counted; ``may_freeze=False``: never frozen (a ``FrozenGraph``'s unfrozen compile).

    Under Dynamo's compile lock (a frozen graph's unfrozen compile runs outside Dynamo), with other threads' compiled
    calls running on while aot_autograd and the pattern matcher trace (fx_tracing_window)."""
    with capture_lock(), fx_tracing_window("compile"):
        kept = scalar_alpha.keep_alpha(gm)  # before aot_autograd, which would drop them (scalar_alpha.py)
        if kept:
            log.info("fusegraph: graph %d: %d add/sub alpha(s) of a symbolic float moved into a mul", graph_id, kept)
        route, why = select_route(config, example_inputs)
        unfusable = unfusable_why(example_inputs)
        if unfusable:
            config = _unfused(config)
        params, not_frozen = {}, None
        if may_freeze:
            params, not_frozen = freezing.plan(config, route, gm, example_inputs,
                                               symbolic=has_symbolic_inputs(gm, example_inputs),
                                               opaque=any(is_opaque(x) for x in example_inputs))
        job = FusionJob(config, graph_id, log_dir=log_dir, label=label, count=count, freeze=bool(params))
        unused = None
        if config.inductor_options and not (route == "default" and config.inductor):
            unused = (f"Inductor options {', '.join(sorted(config.inductor_options))} unused: the "
                      f"{'aten' if route == 'default' else route} route compiles no Inductor code")
        for reason in (why, unfusable, not_frozen, unused):
            if reason:
                job.note_fallback(reason)
        job.fusing = route != "graph_only"
        if params:
            def unfrozen(args):
                return compile_graph(config, stats, gm, args, graph_id=graph_id, count=False, may_freeze=False,
                                     log_dir=log_dir, label=label)

            fn = freezing.compile_frozen(config, stats, gm, example_inputs, params,
                                         lambda frozen_gm, inputs: _compile_inductor(config, frozen_gm, inputs, job),
                                         unfrozen, graph_id)
        elif route == "default" and config.inductor:
            fn = _compile_inductor(config, gm, example_inputs, job)
        else:
            fn = _compile_aten(config, stats, gm, example_inputs, job, route)
        return CompiledGraph(fn, route, job)


def _compile_inductor(config, gm, example_inputs, job: FusionJob):
    """Inductor's compile with fusegraph's pass; on CPU through Inductor's C++ wrapper (``config.cpp_wrapper``),
    and where that fails to compile, again with its Python wrapper (logged, in ``stats.fallbacks``)."""
    cpp = config.cpp_wrapper and _cpp_wrapper_fits(gm, example_inputs)
    if cpp and _graph_ops(gm) > CPP_WRAPPER_MAX_OPS:
        cpp = False
        log.info("fusegraph: graph %d has %d ops, more than the C++ wrapper's %d (g++ compiles a whole graph's "
                 "wrapper in time that grows faster than the graph); compiled with Inductor's Python wrapper",
                 job.graph_id, _graph_ops(gm), CPP_WRAPPER_MAX_OPS)
    try:
        return _compile_inductor_with(config, gm, example_inputs, job, cpp)
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
        return _compile_inductor_with(config, gm, example_inputs, job, False)


def _compile_inductor_with(config, gm, example_inputs, job: FusionJob, cpp_wrapper: bool):
    from ._core.torch_inductor import compile_fx

    fusion_pass = FusionPass(config, job)
    if config.verify:  # the post-grad graph's placeholders once Inductor froze the rest
        job.real_inputs = list(example_inputs)
    patches = {**config.inductor_options,
               "post_grad_custom_pre_pass": fusion_pass, "freezing": job.freeze, "cpp_wrapper": cpp_wrapper}
    with _refuse_proxy_executor(cpp_wrapper):
        compiled = compile_fx(gm, example_inputs, config_patches=patches)
    if job.pass_ran:
        fusion_pass.after_compile(gm, example_inputs, job.freeze)  # stores the record
        return compiled
    # Inductor served the graph from its cache without running the pass: the counts, the fallbacks the pass
    # noted, the graph logs and the final ops come from the record of the compile that ran it.
    record = fusion_pass.after_compile(gm, example_inputs, job.freeze)
    if record is None:
        job.glog.write_cached(None, gm.code)  # the counts and final ops unknown
        return compiled
    job.adopt(record)
    job.glog.write_cached(record["log"], gm.code)
    return compiled


def _compile_aten(config, stats, gm, example_inputs, job: FusionJob, route: str):
    from ._core.torch_dynamo import aot_autograd
    from functorch.compile import make_boxed_func

    fuse = route != "graph_only"
    if config.verify:  # the aot graph's placeholders after the lifted parameters
        job.real_inputs = list(example_inputs)

    def plain(aot_gm, aot_inputs):
        if fuse:
            job.note_fallback("autograd graph: fusion skipped (fused ops have no backward)")
        return make_boxed_func(aot_gm.forward)

    def inference(aot_gm, aot_inputs):
        layouts = _output_layouts(aot_gm)  # as traced, before fusion: eager's strides
        return _with_traced_strides(compile_inference(aot_gm, aot_inputs), layouts)

    def compile_inference(aot_gm, aot_inputs):
        if fuse:
            job.fuse(aot_gm, reshape_views=True)  # the graph runs as is: no view traced on eager's strides
        else:
            job.record_ops(aot_gm)
        if route == "default":
            return make_boxed_func(aot_gm.forward)
        graph, inputs, keep = aot_gm, list(aot_inputs), None
        placeholders = graph.graph.find_nodes(op="placeholder")
        drop = [i for i, (n, x) in enumerate(zip(placeholders, inputs)) if is_opaque(x) and not n.users]
        if drop:  # DTensor's DeviceMesh: a graph input no op reads; a runner cannot key it
            for i in drop:
                graph.graph.erase_node(placeholders[i])
            graph.recompile()
            keep = [i for i in range(len(inputs)) if i not in drop]
            inputs = [inputs[i] for i in keep]
        runner = compile_graph_route(graph, inputs, config, stats, static_inputs=_static_input_indices(keep))
        return make_boxed_func(runner) if keep is None else _drop_args(runner, keep)

    backend = aot_autograd(fw_compiler=plain, inference_compiler=inference,
                           decompositions=passes.decompositions())
    # A tracing context, as compile_fx sets up: aot_autograd records in it which inputs are parameters.
    from ._core.torch_fake import FakeTensorMode, TracingContext, detect_fake_mode, tracing

    context = TracingContext.try_get()
    if context is None:
        fake_mode = detect_fake_mode(example_inputs) or FakeTensorMode(allow_non_fake_inputs=True)
        context = TracingContext(fake_mode)
    with tracing(context):
        return backend(gm, example_inputs)


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


# The largest graph (in ops: call nodes of the graph Inductor is handed) that gets Inductor's C++ wrapper. g++
# compiles the wrapper and the graph's kernels as one translation unit, in time that grows faster than the graph:
# fp32 Wan 2.1 widths, first call with the C++ / the Python wrapper (docs/BENCHMARKS.md §2): 2 blocks (305 ops)
# 27.9 / 23.1 s, 4 blocks 33.0 / 28.1 s, 8 blocks (977 ops) 51.0 / 35.2 s, and the published 30 blocks (bf16)
# 948 s against plain Inductor's 122 s. What the C++ wrapper saves (1-3 µs of Python per op and call) stays below
# the measurement's noise at these sizes (371 / 369 ms, 722 / 734 ms, 1408 / 1413 ms a call); it counts in small
# graphs (a decode step, a tiny model), which stay under the limit.
CPP_WRAPPER_MAX_OPS = 600


def _graph_ops(gm) -> int:
    return sum(1 for node in gm.graph.nodes if node.op in ("call_function", "call_method", "call_module"))


def _cpp_wrapper_fits(gm, example_inputs) -> bool:
    """Inductor's C++ wrapper for this graph: CPU, static shapes, every input a tensor, no collectives, no op taking
    an ``Any`` argument, no complex tensor. Its Python entry turns other inputs into tensors (an opaque DeviceMesh
    that DTensor graphs keep as an input fails there at the first call); it cannot pass an ``Any`` argument to the
    ops it calls back in Python (context parallelism's); graphs with collectives, and symbolic shapes, stay with
    the Python wrapper, which more of Inductor is tested with. Inductor generates no code for complex ops: they
    stay aten calls, several without a C shim (``_conj``), which :func:`_refuse_proxy_executor` would refuse only
    after a whole compile."""
    from ._core import ranks

    if input_device(example_inputs).type != "cpu" or has_symbolic_inputs(gm, example_inputs):
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
    """(index, shape, strides) of each tensor output of an aot graph, from its trace. Under symbolic shapes the
    sizes are not known before the call: an output whose traced strides are dense in some memory order (each the
    product of the sizes of the dims inside it, as eager's ops lay out what they allocate) is recorded as
    (index, None, order), the dims innermost first, and its strides are computed from its size at each call
    (:func:`_dense_strides`); an output with symbolic strides of any other form is left as it comes."""
    outputs = gm.graph.output_node().args[0]
    layouts = []
    for i, node in enumerate(outputs if isinstance(outputs, (list, tuple)) else [outputs]):
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        if not isinstance(val, torch.Tensor):
            continue
        if all(isinstance(d, int) for d in (*val.shape, *val.stride())):
            layouts.append((i, tuple(val.shape), tuple(val.stride())))
        else:
            order = _dense_order(tuple(val.shape), tuple(val.stride()))
            if order is not None:
                layouts.append((i, None, order))
    return layouts


def _dense_order(shape, stride):
    """The dims of a tensor innermost first when its (symbolic) strides are provably those of a dense tensor laid
    out in that order — each stride the product of the sizes of the dims before it in the order — else None.
    The order comes from the strides' hints (ties: the size-1 dim first, as TensorIterator orders them); the
    strides are then checked symbolically, so the order only has to be found, not trusted."""
    from torch.fx.experimental.symbolic_shapes import statically_known_true

    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint
    except ImportError:  # torch <= 2.11
        from torch.fx.experimental.symbolic_shapes import size_hint as optimization_hint

    try:
        hints = [(optimization_hint(st), optimization_hint(sz)) for st, sz in zip(stride, shape)]
    except Exception:  # an unbacked size or stride without a hint
        return None
    order = tuple(sorted(range(len(shape)), key=lambda d: hints[d]))
    running = 1
    for d in order:
        if not statically_known_true(stride[d] == running):
            return None
        running = running * shape[d]
    return order


def _dense_strides(shape, order) -> tuple:
    """The strides of a dense tensor of ``shape`` laid out in ``order`` (dims innermost first)."""
    stride = [0] * len(shape)
    running = 1
    for d in order:
        stride[d] = running
        running *= shape[d]
    return tuple(stride)


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
    1.5), and aot_autograd regenerates outputs that are views of an output from the traced strides. Under
    symbolic shapes the strides of a dense output are computed from its size and traced memory order at each call
    (``(index, None, order)``, :func:`_output_layouts`): without that, under ``mark_dynamic`` or ``dynamic=True``
    HunyuanVideo 1.5's second block was compiled again within the first call. One stride compare per output per
    call; a copy only where the memory order really differs."""
    if not layouts:
        return boxed

    def run(args):
        outs = boxed(args)
        fixed = None
        for i, shape, stride in layouts:
            t = outs[i]
            if not isinstance(t, torch.Tensor):
                continue
            if shape is None:  # symbolic sizes: the dense strides of the traced order at this call's sizes
                shape = tuple(t.shape)
                stride = _dense_strides(shape, stride)
            if t.stride() != stride:
                if fixed is None:
                    fixed = list(outs)
                fixed[i] = _restride(t, shape, stride)
        if fixed is None:
            return outs
        return type(outs)(fixed) if isinstance(outs, tuple) else fixed

    run._boxed_call = True
    return run


def _static_input_indices(keep: Optional[list]) -> tuple:
    """The aot graph's inputs that are parameters or buffers (aot_autograd's ``static_input_indices``, what
    cudagraph trees read), renumbered after the inputs ``keep`` retains: the graph runtime holds them where they
    live, never copied."""
    from ._core.torch_fake import TracingContext

    context = TracingContext.try_get()
    meta = getattr(context, "fw_metadata", None) if context is not None else None
    indices = list(getattr(meta, "static_input_indices", None) or ())
    if keep is not None:
        where = {old: new for new, old in enumerate(keep)}
        indices = [where[i] for i in indices if i in where]
    return tuple(sorted(indices))


def _drop_args(runner, keep):
    """A boxed callable that passes on only the arguments at ``keep``."""
    if len(keep) > 1:
        select = operator.itemgetter(*keep)
    else:
        def select(args):
            return tuple(args[i] for i in keep)

    def run(args):
        kept = select(args)
        args.clear()
        return runner(*kept)

    run._boxed_call = True
    return run


def is_opaque(x) -> bool:
    """An opaque object Dynamo passes as a graph input (DTensor's ``DeviceMesh`` under tensor parallelism, a
    ScriptObject): a constant of the program, not a symbolic size."""
    if torch_dispatcher.is_opaque_value(x):
        return True
    return isinstance(x, torch.ScriptObject) or type(x).__name__ in ("DeviceMesh", "FakeScriptObject")


def has_symbolic_inputs(gm, example_inputs) -> bool:
    """Dynamo compiled this graph for symbolic values: SymInt inputs, symbolic tensor sizes, or scalars read from
    tensors (``.item()``)."""
    if any(not isinstance(x, torch.Tensor) and not is_opaque(x) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("example_value")
            if isinstance(val, torch.SymInt) or (
                    isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape)):
                return True
        # a data-dependent scalar (Dynamo passes a Python float attribute that changed as a 0-d tensor and reads it
        # with .item())
        elif (node.op == "call_method" and node.target in ("item", "tolist")) or \
                node.target in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default):
            return True
    return False
