"""Freezing: parameters folded into the compiled graph as constants, on every route.

The default route with Inductor freezes through Inductor's own ``freezing`` option, the aten and graph routes
through ``torch._inductor.freezing.freeze`` (``freeze_aot_graph``). Either way the Dynamo graph's parameter inputs
first become attributes (``parameters_to_attributes``), so freezing follows the Backend's config rather than
Inductor's global one, and the frozen compile is guarded per call (``FrozenGraph``). Plus what freezing needs
around it: which weights are packed or concatenated (``packing_policy``), opaque inputs (DTensor's DeviceMesh)
kept as inputs, callables that drop the arguments freezing folded.
"""
from __future__ import annotations

import contextlib
import copy
import logging
import operator
import threading

import torch

from . import _C

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
def packing_policy(concat_linear: bool = True):
    """What freezing may do to the weights, for the duration of a frozen compile:

    - float32 linears are not packed (above); bf16/fp16 ones are, as Inductor does it;
    - a convolution is packed for oneDNN only where that is measured faster (``fusegraph.packing``);
    - ``concat_linear``: linears reading the same input become one GEMM on concatenated weights (Inductor's own
      freezing pattern, which Inductor applies on CUDA and leaves off on CPU: ``cpp.enable_concat_linear``).
      Fewer, larger GEMMs: fewer calls and better blocking; the concatenated copy of those weights is held by
      the compiled graph besides the module's own.

    Inductor registers its packing patterns once per process, on the first freezing compile (``lazy_init``,
    which is called here so that the entries exist); their checks are wrapped for the duration. Runs under
    Dynamo's compile lock (``Backend._compile``); another torch's layout of these internals leaves packing as
    Inductor does it."""
    import torch._inductor.config

    from . import packing

    wraps = {"_is_packable_linear": lambda match, check: check(match) and not _is_fp32_linear(match),
             "_is_packable_convolution": lambda match, check: (check(match)
                                                               and packing.conv_packing_pays(match.output_node())),
             "check_concat_weights": lambda match, check: check(match) and _same_weight_shapes(match)}
    entries = []
    try:
        from torch._inductor.fx_passes import freezing_patterns

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
    try:
        with torch._inductor.config.patch({"cpp.enable_concat_linear": bool(concat_linear)}):
            yield
    finally:
        for e, check in zip(entries, saved):
            e.extra_check = check


def frozen_parameters(gm: torch.fx.GraphModule, example_inputs) -> dict:
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
            # Dynamo drops its annotations after this compile; a re-compile (FrozenGraph) needs the source again.
            node.meta["fusegraph_param_source"] = grapharg.source
    return params


def parameters_to_attributes(gm: torch.fx.GraphModule, params: dict):
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


class FrozenGraph:
    """A frozen compile, guarded per call: the parameters it folded must be the tensors passed, unchanged.

    Dynamo compiles a module class's ``forward`` once and reuses the graph for every instance of the class (the
    parameters are graph inputs it does not guard), and it does not see weights updated in place. Inductor's
    own freezing avoids this by making Dynamo guard each parameter's identity while tracing; a backend cannot,
    so the check runs here, in C++ (``FrozenGuard``: identity, version counter and data pointer per parameter).

    On a miss the graph is compiled again, frozen on the parameters of this call (another module instance gets
    its own specialization; changed weights are folded anew), up to ``FROZEN_SPECIALIZATION_LIMIT`` frozen
    compiles; past that one unfrozen compile (parameters passed as inputs) serves every call that matches no
    frozen one. Re-compiles run outside Dynamo on this call's inputs, so only static-shape graphs are frozen.
    Every miss is logged and counted (``stats.frozen_recompiles``; the unfrozen one also in ``stats.fallbacks``).
    ``backend`` is the ``fusegraph.Backend`` that compiled it (its ``_compile`` re-compiles)."""

    def __init__(self, backend, gm, example_inputs, params: dict, compiled, graph_id: int):
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
                stats.add(frozen_recompiles=1)
                return compiled
            if self.unfrozen is None:
                self.backend._fallback(f"frozen graph {what}; {FROZEN_SPECIALIZATION_LIMIT} frozen compiles already: "
                                       "running an unfrozen compile of it for such calls")
                _, self.unfrozen = self.backend._compile(self.gm, list(args), {}, freeze=False, graph_id=self.graph_id)
                stats.add(frozen_recompiles=1)
            return self.unfrozen


def is_opaque(x) -> bool:
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
def opaque_inputs_stay_inputs():
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


def drop_unused_opaque_inputs(gm, inputs):
    """(gm, None), or (gm without the opaque inputs no node reads, indices of the inputs kept)."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    if len(placeholders) != len(inputs):
        return gm, None
    drop = {i for i, (n, x) in enumerate(zip(placeholders, inputs)) if is_opaque(x) and not n.users}
    if not drop:
        return gm, None
    for i in drop:
        gm.graph.erase_node(placeholders[i])
    gm.recompile()
    return gm, [i for i in range(len(inputs)) if i not in drop]


def has_symbolic_inputs(gm, example_inputs) -> bool:
    """Dynamo compiled this graph for symbolic sizes (dynamic shapes): SymInt inputs or symbolic tensor sizes."""
    if any(not isinstance(x, torch.Tensor) and not is_opaque(x) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("example_value")
            if isinstance(val, torch.SymInt) or (
                    isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape)):
                return True
    return False


def _selector(keep):
    """args -> the args at ``keep``, as a tuple (operator.itemgetter: one C call, not a Python loop per call over
    every parameter Dynamo passes)."""
    if not keep:
        return lambda args: ()
    if len(keep) == 1:
        i = keep[0]
        return lambda args: (args[i],)
    return operator.itemgetter(*keep)


def pass_kept_args(compiled, keep):
    """Callers still pass every original input; the frozen graph takes only those that stayed inputs."""
    select = _selector(keep)

    def run(*args):
        return compiled(*select(args))

    return run


def drop_frozen_args(gm, keep):
    """A boxed callable that passes on only the arguments freezing kept (parameters became constants)."""
    select = _selector(keep)

    def run(args):
        kept = select(args)
        args.clear()
        return gm(*kept)

    run._boxed_call = True
    return run


def freeze_aot_graph(dynamo_gm, aot_gm, aot_inputs, on_failure, concat_linear: bool = True):
    """Parameters folded into constants (torch._inductor.freezing.freeze): (gm, kept arg indices), or
    (the unfrozen graph, None) after ``on_failure(reason)`` when freezing fails."""
    from torch._inductor.freezing import freeze

    # freeze edits the graph in place; a failure half-way must not leave the unfrozen fallback a graph with
    # some inputs already turned into constants ("forward() takes 9 positional arguments but 11 were given")
    pristine = torch.fx.GraphModule(aot_gm, copy.deepcopy(aot_gm.graph))
    try:
        with packing_policy(concat_linear), opaque_inputs_stay_inputs():
            frozen, keep = freeze(dynamo_gm, aot_gm, list(aot_inputs))
    except Exception as e:  # freezing is an optimisation: never fail a compile over it
        on_failure(f"freezing failed ({type(e).__name__}: {e}); running unfrozen")
        return pristine, None
    return frozen, keep
