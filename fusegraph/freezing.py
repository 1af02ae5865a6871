"""Opt-in freezing: parameters folded into an Inductor compile as constants, as one stage of the compile pipeline.

No route freezes by default. Measured at FLUX.1 and Wan 2.1 widths, folding parameters buys no speed by itself
(BENCHMARKS §6); parameters stay graph inputs, read where they live, so an in-place edit is read by the next call and
no copy of a weight is held. Freezing is kept for what Inductor does only under it: weight copies that run faster —
``pack_weights`` (bf16/fp16 linears packed for oneDNN, convolutions where measured faster) and ``concat_linear``
(q/k/v as one GEMM) — or Inductor's freezing as it is (``enable_freezing=True``). It applies on the Inductor route
(the default route with ``inductor=True``); the aten and graph routes run the aten graph on the parameters as they
are.

The stage, called by ``pipeline.compile_graph`` and nothing else:

- ``plan``: which graph inputs are folded, or why the graph is compiled unfrozen (autograd on, symbolic shapes,
  opaque inputs, inference tensors as parameters: they have no version counter an edit could be seen by).
- ``compile_frozen``: those inputs become attributes of a copy of the Dynamo graph (aliases of the parameters), the
  compile runs under the weight policy (``packing_policy``), with Inductor's caches off (a cached frozen graph would
  carry another process's weights) and its generated modules released with the graph (``released_with_the_graph``);
  the result is a ``FrozenGraph``.
- ``FrozenGraph``: the frozen compile serves the very parameters it folded, unchanged (C++ ``FrozenGuard``: identity,
  storage and version counter per parameter, per call). Any other call — another module instance sharing the graph,
  a replaced parameter, a weight edited in place since — runs one unfrozen compile of the same graph, made at the
  first such call. A weight edited in place makes the frozen compile stale for good: it is let go.

What the guard cannot see: an edit through ``.data`` (``w.data += d``, PEFT's merge) bypasses the version counter,
so after such an edit a frozen graph serves the weights as they were folded (GUIDE "Weights"). The default routes,
which do not freeze, read every edit.
"""
from __future__ import annotations

import contextlib
import logging
import operator
import sys
import threading
import weakref
from typing import Callable, Optional

import torch

from . import _C
from ._core.torch_dynamo import stance_name

log = logging.getLogger("fusegraph")


def wanted(config) -> bool:
    """Whether ``config`` asks for freezing: ``enable_freezing=True`` (``'auto'`` reads as False), or a weight copy
    only freezing makes."""
    return config.enable_freezing is True or bool(config.pack_weights or config.concat_linear)


def plan(config, route: str, gm: torch.fx.GraphModule, example_inputs, *, symbolic: bool,
         opaque: bool) -> tuple[dict, Optional[str]]:
    """({input position: parameter} to fold, None) or ({}, why not — None when freezing was not asked for)."""
    if not wanted(config):
        return {}, None
    if torch.is_grad_enabled():  # an autograd graph, or one compiled with grad mode on: freezing is for inference
        return {}, ("freezing applies to graphs compiled under torch.no_grad() or torch.inference_mode(); this one "
                    "was compiled with grad mode on: the parameters are read where they live")
    if route != "default" or not config.inductor:
        return {}, (f"freezing applies on the Inductor route only; the {route if route != 'default' else 'aten'} "
                    "route reads the parameters where they live")
    if symbolic:
        return {}, "graph with symbolic shapes: compiled unfrozen"
    if opaque:
        return {}, "graph with opaque inputs (a DeviceMesh): compiled unfrozen"
    params = _parameters(gm, example_inputs)
    if any(p.is_inference() for p in params.values()):
        return {}, ("parameters are inference tensors (created under torch.inference_mode: no version counter shows "
                    "an edit): compiled unfrozen")
    return params, None


def _parameters(gm: torch.fx.GraphModule, example_inputs) -> dict:
    """{input position: parameter} for each graph input that is an nn.Parameter. Dynamo hands parameters over as
    graph inputs; its per-input annotation (``grapharg``) says which inputs are parameters, and their source."""
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
    return params


def compile_frozen(config, stats, gm, example_inputs, params: dict, compile: Callable,
                   compile_unfrozen: Callable, graph_id: int) -> "FrozenGraph":
    """The frozen compile: ``compile(gm, inputs)`` (Inductor's, with its ``freezing`` option on) of a copy of ``gm``
    whose inputs at ``params``' positions are attributes, wrapped in a ``FrozenGraph`` that runs
    ``compile_unfrozen(args)`` (-> a ``CompiledGraph``) for the calls the frozen one does not serve.

    Inductor's FX graph cache is off for it: the cache keys a frozen constant that is not inlined by its metadata
    only, so a second process compiling the same model class with other weights was served the first one's
    (Inductor's AOTAutograd cache already refuses graphs compiled with ``freezing``)."""
    from ._core.torch_inductor import config as inductor_config

    frozen_gm, keep = _parameters_to_attributes(gm, params)
    inputs = [example_inputs[i] for i in keep]
    with packing_policy(config.concat_linear, config.pack_weights, config.fusion_patterns.enable_linear), \
            released_with_the_graph(), \
            inductor_config.patch({"fx_graph_cache": False, "fx_graph_remote_cache": False}):
        compiled = compile(frozen_gm, inputs)
    return FrozenGraph(compiled, keep, params, compile_unfrozen, stats, graph_id)


def _parameters_to_attributes(gm: torch.fx.GraphModule, params: dict):
    """The inputs at ``params``' positions become attributes (aliases of the parameters) of a copy of the graph
    module, the layout Inductor's freezing expects (Dynamo lifts parameters as inputs unless Inductor's global
    ``freezing`` was set while it traced). Returns (new module, indices of the inputs that stay inputs)."""
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
        setattr(new, name, torch.nn.Parameter(params[i].detach(), requires_grad=False))
        name_to_source[name] = node.meta["grapharg"].source  # aot_autograd maps attributes to sources
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


def _packs_linear(match, linear_mode="auto") -> bool:
    """Whether ``pack_weights=True`` packs this linear's weight, from what was measured for the CPU class
    (``gemm_table``): float32 only at a site of the shapes the table measured (more than ``gemv.MAX_ROWS`` rows, at
    least ``linear.MIN_MACS`` multiply-adds) and only where the table says packing for oneDNN beats the plain
    kernel; bf16/fp16 unless the class widens that dtype to float32 (``enable_linear``'s rule)."""
    from .fusion import gemm_table
    from .fusion.patterns import gemv, linear

    node = match.output_node()
    addmm = node.target is torch.ops.aten.addmm.default
    x, weight = node.args[1 if addmm else 0], node.args[2 if addmm else 1]
    xv = x.meta.get("val") if isinstance(x, torch.fx.Node) else None
    wv = weight.meta.get("val") if isinstance(weight, torch.fx.Node) else None
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or xv.dim() != 2 or wv.dim() != 2:
        return False
    if wv.dtype != torch.float32:
        return wv.dtype not in linear.routed_dtypes(linear_mode)
    (m, k), n = xv.shape, wv.shape[1]
    if not all(isinstance(d, int) for d in (m, k, n)) or m <= gemv.MAX_ROWS or m * k * n < linear.MIN_MACS:
        return False
    return gemm_table.pack_lookup(torch.float32)[0] == "onednn"


def _check_name(fn) -> str:
    """The name of a pattern entry's check: the function itself, or for a replacement pattern (which
    ``register_replacement`` wraps in a ``check_fn`` of its own) the check it wraps."""
    name = getattr(fn, "__name__", "")
    if name == "check_fn":
        for cell in getattr(fn, "__closure__", None) or ():
            try:
                inner = cell.cell_contents
            except ValueError:
                continue
            if callable(inner) and getattr(inner, "__name__", "").startswith("check_"):
                return inner.__name__
    return name


def _same_weight_shapes(match) -> bool:
    """Concatenate only projections of one shape (q, k, v): Inductor's check asks for the same input width only,
    so it may group a wide MLP projection with two of them; its consumers then read strided column slices of the
    merged output (copies before the fused ops that need rows), which measured slower than the GEMMs it saves
    (tiny Flux's single blocks)."""
    shapes = {tuple(match.kwargs[w].meta["val"].shape) for w in ("w1", "w2", "w3") if w in match.kwargs}
    return len(shapes) == 1


@contextlib.contextmanager
def packing_policy(concat_linear: bool = False, pack_weights: bool = False, linear_mode="auto"):
    """What freezing may do to the weights, for the duration of a frozen compile:

    - ``pack_weights=False`` (the default): no weight is packed, and convolution weights keep their layout
      (Inductor's ``layout_optimization`` would convert them to channels-last copies): the compiled graph holds
      no copy of any weight;
    - ``pack_weights=True``: a linear's weight is packed where the CPU class's measurements say the copy pays
      (``_packs_linear``): float32 ones of many rows for oneDNN (``mkldnn._reorder_linear_weight``, not Inductor's
      MKL packing, measured level with MKL on the plain weight) where the class's GEMM table says ``pack``
      ``"onednn"``; bf16/fp16 ones as Inductor does it, unless the class's table widens that dtype to float32
      (no native 16-bit dot products: oneDNN's 16-bit matmul on a packed weight is the slow kernel there); a
      convolution is packed for oneDNN only where that is measured faster (``fusegraph.packing``);
    - ``concat_linear``: linears reading the same input become one GEMM on concatenated weights (Inductor's own
      freezing pattern, which Inductor applies on CUDA and leaves off on CPU: ``cpp.enable_concat_linear``).
      Fewer, larger GEMMs: fewer calls and better blocking; the concatenated copy of those weights is held by
      the compiled graph besides the module's own.

    Inductor registers its packing patterns once per process, on the first freezing compile (``lazy_init``,
    which is called here so that the entries exist); their checks are wrapped for the duration. Runs under
    Dynamo's compile lock (``pipeline.compile_graph``); another torch's layout of these internals leaves packing as
    Inductor does it."""
    from . import packing
    from ._core.torch_inductor import config as inductor_config

    wraps = {"_is_packable_linear": lambda match, check: (pack_weights and check(match)
                                                          and _packs_linear(match, linear_mode)),
             "_is_packable_convolution": lambda match, check: (pack_weights and check(match)
                                                               and packing.conv_packing_pays(match.output_node())),
             "check_concat_weights": lambda match, check: check(match) and _same_weight_shapes(match)}
    entries = []
    try:
        from ._core.torch_inductor import freezing_patterns

        freezing_patterns.lazy_init()
        for pm in freezing_patterns.pass_patterns:
            for group in pm.patterns.values():
                entries += [e for e in group if _check_name(e.extra_check) in wraps]
    except (ImportError, AttributeError, TypeError):
        pass
    saved = [e.extra_check for e in entries]
    for e, check in zip(entries, saved):
        wrap = wraps[_check_name(check)]
        e.extra_check = lambda match, check=check, wrap=wrap: wrap(match, check)
    patches = {"cpp.enable_concat_linear": bool(concat_linear)}
    if not pack_weights:
        patches["layout_optimization"] = False
    try:
        with inductor_config.patch(patches), _onednn_packing(pack_weights):
            yield
    finally:
        for e, check in zip(entries, saved):
            e.extra_check = check


@contextlib.contextmanager
def _onednn_packing(active: bool):
    """Every linear weight Inductor packs is packed for oneDNN (``mkldnn._reorder_linear_weight`` +
    ``mkldnn._linear_pointwise``), float32 ones too: Inductor's CPU device op chooses MKL's packed sgemm for
    float32 (``is_lp_weight`` False), which measured no faster than MKL on the plain weight; only float32 sites
    ``_packs_linear`` accepted reach it. Another torch's layout of these internals leaves Inductor's choice."""
    cls = None
    if active:
        try:
            from ._core.torch_inductor import mkldnn_fusion

            cls = mkldnn_fusion.CpuMkldnnDeviceOp
            saved = cls.pack_linear_weight, cls.pack_linear
        except AttributeError:
            cls = None
    if cls is None:
        yield
        return
    weight_fn, linear_fn = saved
    cls.pack_linear_weight = lambda self, graph, is_lp, *rest: weight_fn(self, graph, True, *rest)
    cls.pack_linear = lambda self, graph, is_lp, *rest: linear_fn(self, graph, True, *rest)
    try:
        yield
    finally:
        cls.pack_linear_weight, cls.pack_linear = saved




@contextlib.contextmanager
def released_with_the_graph():
    """Inductor keeps every module it generates in ``PyCodeCache.modules`` (and the last one of each code key in
    ``sys.modules``) for the life of the process, with a frozen graph's constants — the folded parameters, packed
    or concatenated copies — as module attributes: a deleted model's weights would stay alive. The modules generated
    during the frozen compile that hold tensors are dropped from both, so they live as long as the compiled graph
    that calls them."""
    try:
        from ._core.torch_inductor import PyCodeCache

        modules = PyCodeCache.modules
    except (ImportError, AttributeError):
        yield
        return
    before = {id(m) for m in modules}
    try:
        yield
    finally:
        def holds(mod):
            return any(isinstance(v, torch.Tensor) for v in vars(mod).values())

        dropped = [m for m in modules if id(m) not in before and holds(m)]
        modules[:] = [m for m in modules if all(m is not d for d in dropped)]
        for mod in dropped:  # loading registers it in sys.modules too (the last module of each code key)
            if sys.modules.get(mod.__name__) is mod:
                del sys.modules[mod.__name__]


class FrozenGraph:
    """A frozen compile, guarded per call, with one unfrozen compile of the same graph for every other call.

    Dynamo compiles a module class's ``forward`` once and reuses the graph for every instance of the class (the
    parameters are graph inputs it does not guard), and a backend cannot add guards. So the check runs here, in C++
    (``FrozenGuard``: per folded parameter its identity, data pointer and version counter): the frozen compile runs
    only for the very tensors it folded, unchanged since. Any other call — another instance, a replaced parameter,
    an in-place edit (``copy_``, ``load_state_dict``, an optimizer step) — runs the unfrozen compile, made once at the
    first such call (logged, counted in ``stats.fallbacks``; under ``set_stance("fail_on_recompile")`` it raises).
    An edit makes the frozen compile stale for good (a version counter only grows): it is let go, and with it the
    weight copies it holds; so is it when the parameters it folded die (the model was deleted).

    Thread safety: the frozen compile and its guard never change after construction; the unfrozen compile is set
    once under a lock; a call reads each once.

    ``__slots__``: Dynamo wraps the callable a backend returns with ``functools.wraps``, which copies an instance's
    ``__dict__`` into the wrapper; a dict would keep the frozen compile (and the weights it holds) alive there after
    it was let go."""

    __slots__ = ("_guard", "_same", "_changed", "_frozen", "_compile_unfrozen", "_unfrozen", "_lock", "stats",
                 "graph_id", "__weakref__")

    def __init__(self, compiled, keep, params: dict, compile_unfrozen, stats, graph_id: int):
        positions = sorted(params)
        tensors = [params[i] for i in positions]
        self._guard = _C.graph.FrozenGuard(positions, tensors)
        self._same = _C.graph.FrozenMatch.SAME
        self._changed = _C.graph.FrozenMatch.CHANGED
        self._frozen = (compiled, _selector(keep))
        self._compile_unfrozen = compile_unfrozen
        self._unfrozen = None
        self._lock = threading.Lock()
        self.stats = stats
        self.graph_id = graph_id
        # the parameters' death (the model deleted) lets the frozen compile and its constants go
        me = weakref.ref(self)
        weakref.finalize(tensors[0], FrozenGraph._let_go, me)

    @staticmethod
    def _let_go(me) -> None:
        graph = me()
        if graph is not None:
            graph._frozen = None

    @property
    def frozen(self) -> bool:
        """Whether the frozen compile still serves (not let go after an edit or the parameters' death)."""
        return self._frozen is not None

    def __call__(self, *args):
        frozen = self._frozen
        if frozen is not None and self._guard.check(args) == self._same:
            compiled, select = frozen
            return compiled(*select(args))
        return self._other(args)(*args)

    def _other(self, args):
        match = self._guard.check(args)
        if match == self._changed and self._frozen is not None:
            self._frozen = None  # its folded values are gone from the parameters: stale for good
            log.info("fusegraph: frozen graph %d: weights edited in place after compile; the frozen compile is let "
                     "go, the unfrozen one serves them", self.graph_id)
        unfrozen = self._unfrozen
        if unfrozen is not None:
            return unfrozen
        with self._lock:
            if self._unfrozen is None:
                what = ("weights edited in place after compile" if match == self._changed
                        else "called with other parameters (another module instance, or a replaced parameter)")
                _refuse_recompile(f"frozen graph {self.graph_id} {what}")
                self.stats.note_fallback(f"frozen graph {what}: running an unfrozen compile of it for such calls")
                record = self._compile_unfrozen(list(args))
                self.stats.absorb(record.job.tally)
                self.stats.add(frozen_recompiles=1)
                self._unfrozen = record.fn
            return self._unfrozen


def _refuse_recompile(what: str) -> None:
    """Under ``torch.compiler.set_stance("fail_on_recompile")`` a re-compile raises as Dynamo's own do."""
    if stance_name() == "fail_on_recompile":
        from ._core.torch_dynamo import RecompileError

        raise RecompileError(f"Detected recompile when torch.compile stance is 'fail_on_recompile': {what}")


def _selector(keep):
    """args -> the args at ``keep``, as a tuple (operator.itemgetter: one C call, not a Python loop per call over
    every parameter Dynamo passes)."""
    if not keep:
        return lambda args: ()
    if len(keep) == 1:
        i = keep[0]
        return lambda args: (args[i],)
    return operator.itemgetter(*keep)
