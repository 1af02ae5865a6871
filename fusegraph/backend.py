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
import functools
import hashlib
import itertools
import logging
import operator
import threading
import time
from typing import Optional

import torch

from .config import CompilationConfig
from .fusion import passes
from .graph.runner import capture_lock, fx_tracing_window
from .stats import PATTERN_NAMES, Stats

log = logging.getLogger("fusegraph")

# Freezing packs linear weights (Inductor's weight-pack patterns): float32 ones for MKL's packed sgemm, bf16/fp16
# ones for oneDNN. Measured here, a packed float32 linear of a few rows (a decode step, a batch-1 projection) is
# about 3x slower than aten's addmm (5.4 vs 1.7 us, 1x256 by 256x256), and from 16 to 1024 rows (K, N of
# 128-512) 0.9-1.7x addmm's time; plain torch.compile, which does not freeze, never packs. So float32 linears are
# left to addmm. bf16/fp16 ones stay packed: oneDNN's linear adds the bias before its one rounding, where an
# unpacked mm + bias rounds twice (SD3 bf16: max error vs float64 0.0225 unpacked, as plain torch.compile, vs
# 0.0220 packed; eager 0.0194).


def _is_fp32_linear(match) -> bool:
    node = match.output_node()
    weight = node.args[2 if node.target is torch.ops.aten.addmm.default else 1]
    val = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
    return val is None or val.dtype == torch.float32


@contextlib.contextmanager
def _no_fp32_linear_packing():
    """Freezing that packs no float32 linear weight. Inductor registers its packing patterns once per process, on
    the first freezing compile (``lazy_init``, which is called here so that the entries exist); their checks are
    wrapped for the duration. Runs under Dynamo's compile lock (``Backend._compile``); another torch's layout of
    these internals leaves packing as Inductor does it."""
    entries = []
    try:
        from torch._inductor.fx_passes import freezing_patterns

        freezing_patterns.lazy_init()
        for pm in freezing_patterns.pass_patterns:
            for group in pm.patterns.values():
                entries += [e for e in group if getattr(e.extra_check, "__name__", "") == "_is_packable_linear"]
    except (ImportError, AttributeError, TypeError):
        pass
    saved = [e.extra_check for e in entries]
    for e, check in zip(entries, saved):
        e.extra_check = lambda match, check=check: check(match) and not _is_fp32_linear(match)
    try:
        yield
    finally:
        for e, check in zip(entries, saved):
            e.extra_check = check


_logged_reasons: set = set()
_logged_lock = threading.Lock()


def _log_once(reason: str) -> None:
    with _logged_lock:
        if reason in _logged_reasons:
            return
        _logged_reasons.add(reason)
    log.warning("fusegraph: %s", reason)


# ---------------------------------------------------------------------------------------------------------
# Graph runtime (fusegraph.graph, built on another branch): the only place the backend touches it.


def _graph_runtime():
    """The graph runtime module, or (None, why) when it cannot be used here."""
    import importlib

    try:
        runtime = importlib.import_module(f"{__package__}.graph")
    except ImportError as e:
        return None, f"graph runtime not available ({e})"
    if not hasattr(runtime, "GraphRunner"):
        return None, "graph runtime not available (fusegraph.graph has no GraphRunner)"
    return runtime, None


def _input_device(example_inputs) -> torch.device:
    for x in example_inputs:
        if isinstance(x, torch.Tensor):
            return x.device
    return torch.device("cpu")


def _device_graph_available(example_inputs, config) -> tuple[bool, Optional[str]]:
    """SPEC §1.2: CUDA when torch.cuda.is_available(); NPU when torch.npu.NPUGraph and torch.npu.graph exist;
    host graph on CPU whenever the C++ extension (and the graph runtime) is loaded."""
    runtime, why = _graph_runtime()
    if runtime is None:
        return False, why
    if config.device_graph == "none":
        return False, "device_graph='none'"
    if hasattr(runtime, "device_graph_available"):  # the runtime knows best
        return runtime.device_graph_available(_input_device(example_inputs), config)
    kind = config.device_graph if config.device_graph != "auto" else _input_device(example_inputs).type
    if kind == "cuda" and not torch.cuda.is_available():
        return False, "device_graph 'cuda' but torch.cuda.is_available() is False"
    if kind == "npu" and not (hasattr(torch, "npu") and hasattr(torch.npu, "NPUGraph") and hasattr(torch.npu, "graph")):
        return False, "device_graph 'npu' but torch.npu.NPUGraph / torch.npu.graph are missing"
    return True, None


# ---------------------------------------------------------------------------------------------------------
# Inductor's custom pass: fusion inside compile_fx, keyed for Inductor's caches by the enabled patterns.

try:
    from torch._inductor.custom_graph_pass import CustomInferenceAwareGraphPass as _PassBase
    _INFERENCE_AWARE = True
except ImportError:  # older torch
    from torch._inductor.custom_graph_pass import CustomGraphPass as _PassBase
    _INFERENCE_AWARE = False


@functools.lru_cache(maxsize=None)
def _source_hash() -> str:
    from torch._inductor.custom_graph_pass import get_hash_for_files
    import fusegraph.fusion.patterns as pkg
    import os

    folder = os.path.dirname(pkg.__file__)
    files = [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".py")]
    files.append(passes.__file__)
    files.append(os.path.join(os.path.dirname(passes.__file__), "choice.py"))
    files.append(__file__)  # what the pass records for cache hits, and the linear-packing policy
    return get_hash_for_files(tuple(files)).hex()


class _FusionPass(_PassBase):
    """Runs fusegraph's passes on Inductor's post-grad graph (inference graphs only)."""

    def __init__(self, backend: "Backend", job: "_CompileJob"):
        self.backend = backend
        self.job = job

    def __call__(self, graph: torch.fx.Graph, is_inference: bool = True) -> None:
        self.job.pass_ran = True
        if not is_inference:
            reason = "autograd graph: fusion skipped (fused ops have no backward)"
            self.job.pass_fallbacks.append(reason)
            self.job.note_fallback(reason)
            return
        self.job.fuse(graph)
        if self.backend.config.fusion_choice == "auto":
            self.job.choose(graph)

    def uuid(self):
        fp = self.backend.config.fusion_patterns
        opts = tuple(sorted(fp.as_dict().items())) + (("verify", self.backend.config.verify),
                                                      ("choice", self.backend.config.fusion_choice, _choice_key(),
                                                       torch.get_num_threads()),
                                                      ("linear packing", "bf16/fp16 only"))  # _no_fp32_linear_packing
        return hashlib.sha256(repr((_source_hash(), opts)).encode()).hexdigest()

    def __deepcopy__(self, memo):  # Inductor may deep-copy its config; the pass is stateless as far as it is concerned
        return self


class _CompileJob:
    """One compiled graph: its counts, its log, its route."""

    def __init__(self, backend: "Backend", graph_id: int):
        self.backend = backend
        self.graph_id = graph_id
        self.counts: Optional[dict] = None
        self.fusing = True
        self.freeze = backend.config.enable_freezing  # fold parameters into constants (False: the unfrozen re-compile)
        self.count = True  # add fused counts to stats (False: a re-compile of a graph already counted)
        self.fallbacks: list = []
        self.glog = passes.GraphLog(backend._log_dir, f"fusegraph Backend {id(backend):#x}, Dynamo graph {graph_id}")
        self.pass_ran = False  # Inductor ran the fusion pass (False on a cache hit)
        self.pass_fallbacks: list = []  # fallbacks noted by the pass (replayed on a cache hit)
        self.real_inputs: Optional[list] = None  # Dynamo's real example inputs (after freezing), for verify
        self.lowered: Optional[dict] = None  # {family: sites lowered back to aten for Inductor} (Inductor route)

    def fuse(self, graph_or_gm) -> None:
        verify_inputs = None
        if self.backend.config.verify:
            verify_inputs, why = passes.verify_inputs_for(graph_or_gm, self.real_inputs)
            if why:
                self.note_fallback(why)
        counts = passes.fuse_graph(graph_or_gm, self.backend.config, stats=self.backend.stats if self.count else None,
                                   graph_log=self.glog,
                                   verify_inputs=verify_inputs)
        if self.counts is None:
            self.counts = counts
        else:
            for k, v in counts.items():
                self.counts[k] += v
        self.record_ops(graph_or_gm)

    def choose(self, graph) -> None:
        """Inductor route: fused sites Inductor's own code is predicted to beat are lowered back (choice.py)."""
        from .fusion import choice

        self.lowered = choice.choose(graph, stats=self.backend.stats if self.count else None)
        self.record_ops(graph)

    def record_ops(self, graph_or_gm) -> None:
        """What the backend hands on: op name -> count in the final graph (``Backend.last_graph_ops``)."""
        graph = graph_or_gm.graph if isinstance(graph_or_gm, torch.fx.GraphModule) else graph_or_gm
        self.backend.last_graph_ops = collections.Counter(
            str(n.target) if n.op == "call_function" else n.op for n in graph.nodes
            if n.op in ("call_function", "get_attr", "placeholder"))

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

    # copy.deepcopy / pickle of a compiled model carry the backend: its config and counters (Stats drops its
    # lock); the graph-id counter continues where it was (itertools.count does not pickle on Python >= 3.14)
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
        ok, why = _device_graph_available(example_inputs, cfg)
        if ok:
            return wanted, None
        return "default", f"{wanted} requested but {why}; running the default route"

    def _fallback(self, reason: str) -> None:
        self.stats.add_fallback(reason)
        _log_once(reason)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs):
        t0 = time.perf_counter()
        captured_before, seconds_before = self.stats.graphs_captured, self.stats.capture_seconds
        # Every route freezes when asked (weights become constants of the graph, so a captured graph holds them
        # instead of copying them into static buffers on each replay). Dynamo reuses this graph for every module
        # instance of the same class, so the frozen graph is guarded per call (_FrozenGraph).
        # A graph with symbolic shapes is not frozen: a re-compile on a guard miss would run outside Dynamo and
        # specialise its shapes.
        freeze = self.config.enable_freezing and not torch.is_grad_enabled()
        if freeze and _has_symbolic_inputs(gm, example_inputs):
            log.debug("fusegraph: graph with symbolic shapes: compiled without freezing")
            freeze = False
        params = _frozen_parameters(gm, example_inputs) if freeze else {}
        job, compiled = self._compile(gm, example_inputs, params, freeze=freeze)
        if params:
            compiled = _FrozenGraph(self, gm, example_inputs, params, compiled, job.graph_id)
        seconds = time.perf_counter() - t0
        with self.stats._lock:
            self.stats.graphs_compiled += 1
            self.stats.compile_seconds += seconds
        log.info(self._summary(job, self.stats.graphs_captured - captured_before,
                               self.stats.capture_seconds - seconds_before))
        log.debug("fusegraph: graph %d compiled in %.2f s on the %s route (%s)", job.graph_id, seconds,
                  self.last_route, "Inductor" if self.last_route == "default" and self.config.inductor else "aten graph")
        return compiled

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
        if params:
            gm, keep = _parameters_to_attributes(gm, params)
            example_inputs = [example_inputs[i] for i in keep]
        with _opaque_inputs_stay_inputs():  # Inductor's own freezing too
            if route == "default" and self.config.inductor:
                compiled = self._compile_inductor(gm, example_inputs, job)
            else:
                compiled = self._compile_aten(gm, example_inputs, job, route)
        if keep is not None:
            compiled = _pass_kept_args(compiled, keep)
        return job, compiled

    # default route, inductor=True
    def _compile_inductor(self, gm, example_inputs, job):
        from torch._inductor.compile_fx import compile_fx

        fusion_pass = _FusionPass(self, job)
        if self.config.verify:  # the post-grad graph's placeholders once Inductor froze the rest
            job.real_inputs = list(example_inputs)
        patches = {"post_grad_custom_pre_pass": fusion_pass, "freezing": job.freeze}
        with _no_fp32_linear_packing():
            compiled = compile_fx(gm, example_inputs, config_patches=patches)
        # Inductor's caches skip the custom pass on a hit: the counts, the fallbacks the pass noted and its graph
        # logs then come from the compile that ran it, stored under a key of the graph and the pass options.
        key = _counts_key(gm, example_inputs, fusion_pass.uuid(), job.freeze)
        if job.pass_ran:
            _store_record(key, {"counts": job.counts, "fallbacks": job.pass_fallbacks, "log": job.glog.entries,
                                "lowered": job.lowered, "ops": dict(self.last_graph_ops)})
        else:
            record = _load_record(key)
            if record is None:
                self.last_graph_ops = collections.Counter()  # unknown: not the previous graph's
                job.glog.write_cached(None, gm.code)
            else:
                if record["counts"] is not None:
                    job.counts = dict(record["counts"])
                    if job.count:
                        self.stats.add_patterns(job.counts)
                if record.get("lowered") is not None:
                    job.lowered = dict(record["lowered"])
                    if job.count:
                        self.stats.add_lowered(job.lowered)
                self.last_graph_ops = collections.Counter(record.get("ops") or {})
                for reason in record["fallbacks"]:
                    job.note_fallback(reason)
                job.glog.write_cached(record["log"], gm.code)
        return compiled

    # default route with inductor=False, and the graph routes: an aten graph, fused or not, run or captured
    def _compile_aten(self, gm, example_inputs, job, route):
        from torch._dynamo.backends.common import aot_autograd
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
                job.fuse(aot_gm)
            else:
                job.record_ops(aot_gm)
            graph, keep = aot_gm, None
            if job.freeze and not torch.is_grad_enabled():
                graph, keep = self._freeze(gm, aot_gm, aot_inputs)
                if keep is not None:
                    job.record_ops(graph)
            if route != "default":
                inputs = list(aot_inputs) if keep is None else [aot_inputs[i] for i in keep]
                graph, unused = _drop_unused_opaque_inputs(graph, inputs)
                if unused is not None:  # DTensor's DeviceMesh: a graph input no op reads; a runner cannot key it
                    inputs = [inputs[i] for i in unused]
                    keep = unused if keep is None else [keep[i] for i in unused]
                runner = self._capture(graph, inputs)
                return make_boxed_func(runner) if keep is None else _drop_frozen_args(runner, keep)
            return make_boxed_func(graph.forward) if keep is None else _drop_frozen_args(graph, keep)

        backend = aot_autograd(fw_compiler=plain, inference_compiler=inference,
                               decompositions=passes.decompositions())
        # A tracing context, as compile_fx sets up: aot_autograd records the parameters in it, freezing reads them.
        from torch._guards import TracingContext, detect_fake_mode, tracing

        context = TracingContext.try_get()
        if context is None:
            fake_mode = detect_fake_mode(example_inputs) or torch._subclasses.FakeTensorMode(allow_non_fake_inputs=True)
            context = TracingContext(fake_mode)
        with tracing(context):
            return backend(gm, example_inputs)

    def _freeze(self, dynamo_gm, aot_gm, aot_inputs):
        """Parameters folded into constants (torch._inductor.freezing.freeze); (gm, kept arg indices)."""
        from torch._inductor.freezing import freeze

        # freeze edits the graph in place; a failure half-way must not leave the unfrozen fallback a graph with
        # some inputs already turned into constants ("forward() takes 9 positional arguments but 11 were given")
        pristine = torch.fx.GraphModule(aot_gm, copy.deepcopy(aot_gm.graph))
        try:
            with _no_fp32_linear_packing(), _opaque_inputs_stay_inputs():
                frozen, keep = freeze(dynamo_gm, aot_gm, list(aot_inputs))
        except Exception as e:  # freezing is an optimisation: never fail a compile over it
            self._fallback(f"freezing failed ({type(e).__name__}: {e}); running unfrozen")
            return pristine, None
        return frozen, keep

    def _capture(self, fn, example_inputs):
        """Hands a graph to the graph runtime (GraphRunner); the one place the routes meet it."""
        runtime, _ = _graph_runtime()
        if hasattr(runtime, "compile_graph_route"):  # the runtime's own entry for backends (captures eagerly
            return runtime.compile_graph_route(fn, example_inputs, self.config, self.stats)  # when it can)
        return runtime.GraphRunner(fn, config=self.config, stats=self.stats)

    def _summary(self, job, captured: int, capture_seconds: float) -> str:
        """The SPEC §1.3 line; '?' for a count Inductor served from its cache before fusegraph saw the graph."""
        counts = job.counts or {}
        unknown = job.counts is None and job.fusing
        fused = " ".join(f"{name}×{'?' if unknown else counts.get(name, 0)}" for name in PATTERN_NAMES)
        lowered = sum((job.lowered or {}).values())
        to_inductor = f"; {lowered} of them left to Inductor's code (faster there)" if lowered else ""
        return (f"fusegraph: fused {fused}; captured {captured} graph{'' if captured == 1 else 's'} "
                f"({capture_seconds:.2f} s, {self.stats.graph_memory_bytes / 2**20:.1f} MiB){to_inductor}")


def _choice_key() -> str:
    """The cost model the per-site choice reads (Inductor's cache key must change when it does)."""
    from .fusion import choice

    model = choice.cost_model()
    return hashlib.sha256(repr((model.source, sorted(model.tables.items(), key=str))).encode()).hexdigest()[:16]


def _counts_key(gm, example_inputs, pass_uuid, freezing) -> str:
    """Identifies one Inductor compile of a Dynamo graph as far as fusion is concerned."""
    inputs = [(tuple(x.shape), tuple(x.stride()), str(x.dtype), x.device.type, x.requires_grad)
              if isinstance(x, torch.Tensor) else repr(x) for x in example_inputs]
    text = repr((gm.code, inputs, pass_uuid, freezing, torch.is_grad_enabled(), torch.__version__))
    return hashlib.sha256(text.encode()).hexdigest()


def _counts_path(key: str) -> str:
    import os

    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), "fusegraph_counts", key + ".json")


_counts_memo: dict = {}


def _store_record(key: str, record: dict) -> None:
    """What the fusion pass produced for one graph (counts, fallbacks, log texts), for Inductor cache hits."""
    import json
    import os

    _counts_memo[key] = record
    try:
        path = _counts_path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:  # counts are a report, never worth failing a compile
        pass


def _load_record(key: str) -> Optional[dict]:
    import json

    if key in _counts_memo:
        return _counts_memo[key]
    try:
        with open(_counts_path(key)) as f:
            data = json.load(f)
        counts = data["counts"]
        lowered = data.get("lowered")
        return {"counts": None if counts is None else {k: int(v) for k, v in counts.items()},
                "lowered": None if lowered is None else {k: int(v) for k, v in lowered.items()},
                "ops": {str(k): int(v) for k, v in (data.get("ops") or {}).items()},
                "fallbacks": [str(r) for r in data["fallbacks"]], "log": [[str(a), str(b)] for a, b in data["log"]]}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _frozen_parameters(gm: torch.fx.GraphModule, example_inputs) -> dict:
    """The inputs freezing may fold: {input position: tensor} for each graph input that is an nn.Parameter.
    Dynamo hands parameters over as graph inputs unless torch._inductor.config.freezing was set globally when it
    traced; its per-input annotation (``grapharg``) says which inputs are parameters."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    if len(placeholders) != len(example_inputs):
        return {}
    params = {}
    for i, node in enumerate(placeholders):
        grapharg = node.meta.get("grapharg")
        try:
            real = grapharg.example if grapharg is not None else None
        except Exception:  # an expired weak reference: leave the input alone
            real = None
        if isinstance(real, torch.nn.Parameter) and example_inputs[i] is real:
            params[i] = real
            # Dynamo drops its annotations after this compile; a re-compile (_FrozenGraph) needs the source again.
            node.meta["fusegraph_param_source"] = grapharg.source
    return params


def _parameters_to_attributes(gm: torch.fx.GraphModule, params: dict):
    """Freezing, step one: the inputs at ``params``' positions become attributes (holding ``params``' tensors) of a
    copy of the graph module, the layout Inductor's freezing expects, so freezing follows this Backend's own
    config. Returns (new module, indices of the inputs that stay inputs)."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, val_map := {})
    graph.output(out)
    for old_node, new_node in val_map.items():  # Dynamo's per-node annotations aot_autograd reads
        if hasattr(old_node, "_dynamo_source"):
            new_node._dynamo_source = old_node._dynamo_source
    new = torch.fx.GraphModule(gm, graph)
    new.meta = dict(getattr(gm, "meta", {}))
    name_to_source = dict(getattr(gm, "_param_name_to_source", None) or {})
    keep = []
    for i, node in enumerate(placeholders):
        if i not in params:
            keep.append(i)
            continue
        name = f"_fusegraph_frozen_param_{i}"
        setattr(new, name, params[i])
        name_to_source[name] = node.meta["fusegraph_param_source"]  # aot_autograd maps attributes to sources
        copy_node = val_map[node]
        with graph.inserting_before(copy_node):
            attr = graph.get_attr(name)
        attr.meta.update(copy_node.meta)
        attr.meta.pop("grapharg", None)
        copy_node.replace_all_uses_with(attr)
        graph.erase_node(copy_node)
    new._param_name_to_source = name_to_source
    new.recompile()
    return new, keep


# At most this many frozen compiles per Dynamo graph (module instances sharing it, weight updates after compile);
# past it, one compile without freezing serves every other call. Dynamo's own recompile limit is 8 too.
FROZEN_SPECIALIZATION_LIMIT = 8


class _FrozenGraph:
    """A frozen compile, guarded per call: the parameters it folded must be the tensors passed, unchanged.

    Dynamo compiles a module class's ``forward`` once and reuses the graph for every instance of the class (the
    parameters are graph inputs it does not guard), and it does not see weights updated in place. Inductor's
    own freezing avoids this by making Dynamo guard each parameter's identity while tracing; a backend cannot,
    so the check runs here, in C++ (``FrozenGuard``: identity, version counter and data pointer per parameter).

    On a miss the graph is compiled again, frozen on the parameters of this call (another module instance gets
    its own specialization; changed weights are folded anew), up to ``FROZEN_SPECIALIZATION_LIMIT`` frozen
    compiles; past that one unfrozen compile (parameters passed as inputs) serves every call that matches no
    frozen one. Re-compiles run outside Dynamo on this call's inputs, so only static-shape graphs are frozen.
    Every miss is logged and counted (``stats.frozen_recompiles``; the unfrozen one also in ``stats.fallbacks``)."""

    def __init__(self, backend: Backend, gm, example_inputs, params: dict, compiled, graph_id: int):
        from . import _C

        self._guard_type = _C.graph.FrozenGuard
        self._same = _C.graph.FrozenMatch.SAME
        self._changed = _C.graph.FrozenMatch.CHANGED
        self.backend = backend
        self.gm = gm
        self.graph_id = graph_id
        self.positions = sorted(params)
        self.entries = [(self._guard(params), compiled)]  # most recent first
        self.frozen_compiles = 1
        self.unfrozen = None
        self._lock = threading.Lock()

    def _guard(self, params: dict):
        return self._guard_type(self.positions, [params[i] for i in self.positions])

    def __call__(self, *args):
        guard, compiled = self.entries[0]
        if guard.check(args) == self._same:
            return compiled(*args)
        return self._miss(args)(*args)

    def _miss(self, args):
        with self._lock:
            changed = None
            for k, (guard, compiled) in enumerate(self.entries):
                match = guard.check(args)
                if match == self._same:
                    self.entries.insert(0, self.entries.pop(k))
                    return compiled
                if match == self._changed:
                    changed = k
            what = ("weights changed after compile (in-place update or a new .data)" if changed is not None
                    else "called with other parameter tensors (another module instance, or a replaced parameter)")
            stats = self.backend.stats
            if self.frozen_compiles < FROZEN_SPECIALIZATION_LIMIT:
                params = {i: args[i] for i in self.positions}
                log.info("fusegraph: frozen graph %d %s: compiling it frozen on these parameters (%d of %d)",
                         self.graph_id, what, self.frozen_compiles + 1, FROZEN_SPECIALIZATION_LIMIT)
                _, compiled = self.backend._compile(self.gm, list(args), params, freeze=True, graph_id=self.graph_id)
                if changed is not None:
                    self.entries.pop(changed)
                self.entries.insert(0, (self._guard(params), compiled))
                self.frozen_compiles += 1
                with stats._lock:
                    stats.frozen_recompiles += 1
                return compiled
            if self.unfrozen is None:
                self.backend._fallback(f"frozen graph {what}; {FROZEN_SPECIALIZATION_LIMIT} frozen compiles already: "
                                       "running an unfrozen compile of it for such calls")
                _, self.unfrozen = self.backend._compile(self.gm, list(args), {}, freeze=False, graph_id=self.graph_id)
                with stats._lock:
                    stats.frozen_recompiles += 1
            return self.unfrozen


def _is_opaque(x) -> bool:
    """An opaque object Dynamo passes as a graph input (DTensor's ``DeviceMesh`` under tensor parallelism, a
    ScriptObject): a constant of the program, not a symbolic size."""
    try:
        from torch._library.opaque_object import is_opaque_value
    except ImportError:  # older torch
        is_opaque_value = None
    if is_opaque_value is not None and is_opaque_value(x):
        return True
    return isinstance(x, torch.ScriptObject) or type(x).__name__ in ("DeviceMesh", "FakeScriptObject")


@contextlib.contextmanager
def _opaque_inputs_stay_inputs():
    """Freezing (``torch._inductor.freezing``) turns every lifted parameter into a constant. Under DTensor tensor
    parallelism aot_autograd lifts each DTensor's ``DeviceMesh`` too, as an opaque object ("cannot assign
    FakeScriptObject to buffer"); those stay graph inputs, the tensors are folded. Patched for the compile only
    (under Dynamo's compile lock); Inductor's own freezing calls the same function."""
    from torch._inductor import freezing

    original = freezing.replace_params_with_constants

    def replace(gm, flat_params, fw_metadata):
        if all(isinstance(p, torch.Tensor) for p in flat_params):
            return original(gm, flat_params, fw_metadata)
        # torch's replace_params_with_constants (2.13), with non-tensors preserved like mutated/aliased inputs
        placeholders = gm.graph.find_nodes(op="placeholder")
        aliased = {o.base_idx for o in fw_metadata.output_info if o.base_idx is not None}
        mutated = {i for i, m in enumerate(fw_metadata.input_info)
                   if m.mutation_type in (freezing.MutationType.MUTATED_IN_GRAPH,
                                          freezing.MutationType.MUTATED_OUT_GRAPH)}
        preserved, static_new, offset = [], [], 0
        for i, (real, node) in enumerate(zip(flat_params, placeholders)):
            if i in mutated or i in aliased or not isinstance(real, torch.Tensor):
                preserved.append(i)
                if i in fw_metadata.static_input_indices:
                    static_new.append(i - offset)
            else:
                freezing.replace_node_with_constant(gm, node, real)
                offset += 1
        preserved.extend(range(len(flat_params), len(placeholders)))
        fw_metadata.static_input_indices = static_new
        gm.recompile()
        return preserved

    freezing.replace_params_with_constants = replace
    try:
        yield
    finally:
        freezing.replace_params_with_constants = original


def _drop_unused_opaque_inputs(gm, inputs):
    """(gm, None), or (gm without the opaque inputs no node reads, indices of the inputs kept)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(inputs):
        return gm, None
    drop = {i for i, (n, x) in enumerate(zip(placeholders, inputs)) if _is_opaque(x) and not n.users}
    if not drop:
        return gm, None
    for i in drop:
        gm.graph.erase_node(placeholders[i])
    gm.recompile()
    return gm, [i for i in range(len(inputs)) if i not in drop]


def _has_symbolic_inputs(gm, example_inputs) -> bool:
    """Dynamo compiled this graph for symbolic sizes (dynamic shapes): SymInt inputs or symbolic tensor sizes."""
    if any(not isinstance(x, torch.Tensor) and not _is_opaque(x) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("example_value")
            if isinstance(val, torch.SymInt) or (
                    isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape)):
                return True
    return False


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


def _selector(keep):
    """args -> the args at ``keep``, as a tuple (operator.itemgetter: one C call, not a Python loop per call over
    every parameter Dynamo passes)."""
    if not keep:
        return lambda args: ()
    if len(keep) == 1:
        i = keep[0]
        return lambda args: (args[i],)
    return operator.itemgetter(*keep)


def _pass_kept_args(compiled, keep):
    """Callers still pass every original input; the frozen graph takes only those that stayed inputs."""
    select = _selector(keep)

    def run(*args):
        return compiled(*select(args))

    return run


def _drop_frozen_args(gm, keep):
    """A boxed callable that passes on only the arguments freezing kept (parameters became constants)."""
    select = _selector(keep)

    def run(args):
        kept = select(args)
        args.clear()
        return gm(*kept)

    run._boxed_call = True
    return run


def fusegraph_backend(gm, example_inputs):
    """Backend by name (``torch.compile(backend="fusegraph")``): a Backend with the process defaults as they are
    at this compile. Its counters add up in ``fusegraph_backend.stats``."""
    backend = Backend()
    backend.stats = fusegraph_backend.stats
    return backend(gm, example_inputs)


fusegraph_backend.stats = Stats()
