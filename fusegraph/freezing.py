"""Freezing: parameters folded into the compiled graph as constants, on every route.

The default route with Inductor freezes through Inductor's own ``freezing`` option, the aten and graph routes
through ``torch._inductor.freezing.freeze`` (``freeze_aot_graph``). Either way the Dynamo graph's parameter inputs
first become attributes (``parameters_to_attributes``), so freezing follows the Backend's config rather than
Inductor's global one, and the frozen compile is guarded per call (``FrozenGraph``). Plus what freezing needs
around it: which weights are packed or concatenated (``packing_policy``), opaque inputs (DTensor's DeviceMesh)
kept as inputs, callables that drop the arguments freezing folded.

What freezing may derive from a parameter is the memory and correctness contract (DESIGN §3.2 "Freezing"):
by default (``pack_weights=False``, ``concat_linear=False``) every constant of a frozen graph is a parameter of
the module or a view of one (``aliasing_folds``): no second copy of any weight is held, and a weight edited in
place in any way (``w.data += d``, ``copy_``, a numpy write) is read by the next call. Opting into packed or
concatenated weights gives the graph copies; then every in-place edit must be detected instead (``DataWatch``).
"""
from __future__ import annotations

import contextlib
import copy
import logging
import operator
import sys
import threading
import weakref

import torch

from . import _C
from ._core.torch_dispatcher import TENSOR_DATA, is_opaque_value
from ._core.torch_dynamo import stance_name

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
def packing_policy(concat_linear: bool = False, pack_weights: bool = False):
    """What freezing may do to the weights, for the duration of a frozen compile:

    - ``pack_weights=False`` (the default): no weight is packed, and convolution weights keep their layout
      (Inductor's ``layout_optimization`` would convert them to channels-last copies): the compiled graph holds
      no copy of any weight;
    - ``pack_weights=True``: float32 linears are not packed (above); bf16/fp16 ones are, as Inductor does it; a
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
                                                          and not _is_fp32_linear(match)),
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
        with inductor_config.patch(patches):
            yield
    finally:
        for e, check in zip(entries, saved):
            e.extra_check = check


def _storage_key(t: torch.Tensor):
    try:
        return t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):  # a tensor without storage (a subclass, meta)
        return None


def _derived_from_params(node: torch.fx.Node, gm, storages: set, memo: dict) -> bool:
    """Whether ``node`` reads (through any chain of nodes) a constant held in one of the parameter ``storages``."""
    stack, seen = [node], set()
    while stack:
        n = stack.pop()
        if n in memo:
            if memo[n]:
                return True
            continue
        if n in seen:
            continue
        seen.add(n)
        if n.op == "get_attr":
            value = getattr(gm, n.target, None)
            if isinstance(value, torch.Tensor) and _storage_key(value) in storages:
                memo[node] = True
                return True
        stack.extend(n.all_input_nodes)
    memo[node] = False
    return False


@contextlib.contextmanager
def aliasing_folds(params, active: bool = True):
    """Freezing's constant folding may fold a computation on the frozen ``params`` only where its result is a view of
    one of them (``t``, ``permute``, ``view``, slices): folding anything else (a dtype cast, ``w * c`` of binary
    folding, a concatenation) would make the graph hold a copy that is stale once the weight is edited, and
    that holds memory. Such a computation stays an op of the graph, run at each call as plain ``torch.compile``
    runs it. Computations on other constants (Dynamo's lifted tensors) fold as Inductor folds them.

    Inductor's folding (``torch._inductor.constant_folding.constant_fold``, called by ``freeze`` and its passes)
    replaces each folded node through ``replace_node_with_constant``, which is wrapped here for the compile
    (under Dynamo's compile lock); the parameters themselves become constants through another binding of it."""
    if not active:
        yield
        return
    from ._core.torch_inductor import constant_folding

    storages = {k for k in (_storage_key(p) for p in params) if k is not None}
    original = constant_folding.replace_node_with_constant
    memos: dict = {}

    def replace(gm, node, constant=None, name=None):
        if isinstance(constant, torch.Tensor) and _storage_key(constant) not in storages and \
                _derived_from_params(node, gm, storages, memos.setdefault(id(gm), {})):
            return  # a copy of weight data: the node stays in the graph
        return original(gm, node, constant, name)

    constant_folding.replace_node_with_constant = replace
    try:
        yield
    finally:
        constant_folding.replace_node_with_constant = original


def holds_copies(config) -> bool:
    """Whether a frozen compile under ``config`` may hold copies of weight data (packed or concatenated weights)."""
    return bool(config.pack_weights or config.concat_linear)


@contextlib.contextmanager
def weight_policy(config, params):
    """What a frozen compile may derive from the frozen ``params`` (a list of tensors), for its duration."""
    with packing_policy(config.concat_linear, config.pack_weights), \
            aliasing_folds(params, active=not holds_copies(config)):
        yield


@contextlib.contextmanager
def released_with_the_graph(params):
    """Inductor keeps every module it generated for a frozen graph in ``PyCodeCache.modules`` (and the last one of
    each code key in ``sys.modules``) for the life of the process, with the graph's constants as module attributes: the frozen parameters of a model that was deleted
    stayed alive (plain ``torch.compile`` passes them as inputs). The modules generated during the compile that hold
    one of ``params`` are dropped from that list, so they live as long as the compiled graph that calls them."""
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
        storages = {k for k in (_storage_key(p) for p in params) if k is not None}
        if storages:
            def holds(mod):
                return any(isinstance(v, torch.Tensor) and _storage_key(v) in storages for v in vars(mod).values())

            dropped = [m for m in modules if id(m) not in before and holds(m)]
            modules[:] = [m for m in modules if all(m is not d for d in dropped)]
            for mod in dropped:  # loading registers it in sys.modules too (the last module of each code key)
                if sys.modules.get(mod.__name__) is mod:
                    del sys.modules[mod.__name__]


def _inlined_by_inductor(t: torch.Tensor) -> bool:
    """A constant Inductor writes into the generated code as numbers (0-d, or 1-d of at most 8 elements:
    ``GraphLowering.can_inline_constant``): such a parameter would be read at compile time only, so it is not frozen."""
    return t.dim() == 0 or (t.dim() == 1 and t.shape[0] <= 8)


def frozen_parameters(gm: torch.fx.GraphModule, example_inputs) -> dict:
    """The inputs freezing may fold: {input position: tensor} for each graph input that is an nn.Parameter (but the
    few-element ones Inductor inlines as numbers, which stay inputs so that an edit is read). Dynamo hands parameters over as graph inputs unless torch._inductor.config.freezing was set globally when it
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
        if isinstance(real, torch.nn.Parameter) and example_inputs[i] is real and not _inlined_by_inductor(real):
            params[i] = real
            # Dynamo drops its annotations after this compile; a re-compile (FrozenGraph) needs the source again.
            node.meta["fusegraph_param_source"] = grapharg.source
    return params


def _alias(p: torch.Tensor) -> torch.nn.Parameter:
    """Another Parameter object over ``p``'s storage: what the compiled graph holds as its constant. An edit in place
    is read through it; the user's Parameter object stays owned by the user's module only, so its death (the model
    deleted) tells the frozen graph to let its compiles go (``FrozenGraph``)."""
    return torch.nn.Parameter(p.detach(), requires_grad=False)


def parameters_to_attributes(gm: torch.fx.GraphModule, params: dict):
    """Freezing, step one: the inputs at ``params``' positions become attributes (aliases of ``params``' tensors) of a
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
        setattr(new, name, _alias(params[i]))
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


_TENSOR_DATA = TENSOR_DATA


class DataWatch:
    """Notes ``.data`` reads and writes of the parameters whose values a frozen graph copied (``pack_weights`` or
    ``concat_linear``), so that edits which bypass the version counter (``w.data += d``, ``w.data.copy_(x)``,
    ``w.data.zero_()``: the arithmetic of hand-merged LoRAs) are detected.

    ``torch.nn.Parameter.data`` becomes a property (installed at the first such graph) that delegates to the
    tensor's own and, for a watched parameter, bumps ``epoch`` and records a weak reference to the alias it
    returned. A frozen graph compares ``epoch`` with the one it last checked (one integer compare per call); when it
    moved, the watched parameters touched since are hashed and compared with their hashes at freezing time. A
    parameter whose alias is still alive stays touched (it is hashed again at each call until the alias is freed).
    Writes through other paths that bypass the version counter (numpy views, ``untyped_storage()``, a view of a
    ``.data`` alias that outlives it) are not seen; the default freezing holds no copies and reads them all."""

    epoch = 0
    touched: dict = {}  # id(parameter) -> (epoch of the last touch, [weak refs to the aliases handed out])
    _installed = False
    _lock = threading.Lock()

    @classmethod
    def watch(cls, params) -> None:
        with cls._lock:
            if not cls._installed:
                torch.nn.Parameter.data = property(_watched_data_get, _watched_data_set, None,
                                                   _TENSOR_DATA.__doc__)
                cls._installed = True
        for p in params:
            p.__dict__["_fusegraph_data_watch"] = True

    @classmethod
    def touch(cls, param, alias=None) -> None:
        cls.epoch += 1
        refs = cls.touched.get(id(param), (0, []))[1]
        refs = [r for r in refs if r() is not None]
        if alias is not None:
            refs.append(weakref.ref(alias))
        cls.touched[id(param)] = (cls.epoch, refs)

    @classmethod
    def touched_since(cls, epoch: int, param) -> tuple:
        """(touched after ``epoch``, an alias it handed out is still alive)."""
        last, refs = cls.touched.get(id(param), (0, []))
        return last > epoch, any(r() is not None for r in refs)


def _watched_data_get(self):
    data = _TENSOR_DATA.__get__(self)
    if self.__dict__.get("_fusegraph_data_watch"):
        DataWatch.touch(self, data)
    return data


def _watched_data_set(self, value):
    _TENSOR_DATA.__set__(self, value)
    if self.__dict__.get("_fusegraph_data_watch"):
        DataWatch.touch(self)


def content_hash(t: torch.Tensor) -> int:
    """A 64-bit fingerprint of a tensor's bytes: the sum of its 32-bit words, each times an odd weight that depends
    on its position (a changed, swapped or moved value changes it), in chunks of 16 Mi words."""
    flat = t.detach().reshape(-1)
    raw = flat.view(torch.uint8) if flat.element_size() != 4 and flat.numel() else flat
    if raw.numel() * raw.element_size() % 4:
        raw = torch.cat([raw.view(torch.uint8), raw.new_zeros(4 - raw.numel() * raw.element_size() % 4,
                                                              dtype=torch.uint8)])
    words = raw.view(torch.int32)
    total, chunk = 0, 1 << 24
    for start in range(0, words.numel(), chunk):
        part = words[start:start + chunk].to(torch.int64)
        weights = torch.arange(start, start + part.numel(), dtype=torch.int64, device=part.device) * 2654435761 * 2 + 1
        total = (total + int((part * weights).sum()) + int((part ^ (part >> 7)).sum())) & (2**64 - 1)
    return total


# At most this many frozen compiles per Dynamo graph (module instances sharing it, weight updates after compile);
# past it, one compile without freezing serves every other call. Dynamo's own recompile limit is 8 too.
FROZEN_SPECIALIZATION_LIMIT = 8


class FrozenGraph:
    """A frozen compile, guarded per call: the parameters it folded must be the tensors passed.

    Dynamo compiles a module class's ``forward`` once and reuses the graph for every instance of the class (the
    parameters are graph inputs it does not guard). Inductor's own freezing avoids this by making Dynamo guard
    each parameter's identity while tracing; a backend cannot, so the check runs here, in C++ (``FrozenGuard``:
    identity and data pointer per parameter).

    With ``copies=False`` (the default freezing: every constant is a parameter or a view of one) a weight edited in
    place is read by the next call as it is, so only another tensor or another storage at a frozen position is a
    miss. With ``copies=True`` (packed or concatenated weights) the guard also tracks version counters, and
    ``DataWatch`` plus a content hash detect ``.data`` edits, which bypass them; such a change is a miss too.

    On a miss the graph is compiled again, frozen on the parameters of this call (another module instance gets
    its own specialization; changed weights are folded anew), up to ``FROZEN_SPECIALIZATION_LIMIT`` frozen
    compiles; past that one unfrozen compile (parameters passed as inputs) serves every call that matches no
    frozen one. Re-compiles run outside Dynamo on this call's inputs, so only static-shape graphs are frozen.
    Every miss is logged and counted (``stats.frozen_recompiles``; the unfrozen one also in ``stats.fallbacks``);
    under ``torch.compiler.set_stance("fail_on_recompile")`` a miss raises instead.

    It is the one wrapper around what Dynamo gets: each entry's compile takes only the inputs that stayed inputs
    (``CompiledGraph.keep``), and the call passes those on. ``compile(inputs, params, freeze=...)`` is
    ``pipeline.compile_graph`` bound to the graph and its config; ``record`` is the first compile's
    ``CompiledGraph``; what each re-compile tallies goes into ``stats``."""

    def __init__(self, compile, stats, params: dict, record, copies: bool = False):
        self._guard_type = _C.graph.FrozenGuard
        self._same = _C.graph.FrozenMatch.SAME
        self._changed = _C.graph.FrozenMatch.CHANGED
        self.compile = compile
        self.stats = stats
        self.graph_id = record.graph_id
        self.positions = sorted(params)
        self.copies = copies
        self._epoch = DataWatch.epoch
        self.entries = [self._entry(params, record)]  # most recent first (``_entry``)
        self.frozen_compiles = 1
        self.unfrozen = None
        self.dead = False
        self._lock = threading.Lock()

    def _entry(self, params: dict, record) -> list:
        """[guard, (compiled, argument selector), {position: (weak ref, content hash)} or None, weak refs whose death
        drops the entry].
        Nothing in it keeps a parameter alive: when one dies (the model was deleted) the entry lets its compile go,
        and with it the constants that alias the weights."""
        tensors = [params[i] for i in self.positions]
        hashes = None
        if self.copies:
            DataWatch.watch(tensors)
            hashes = {i: (weakref.ref(params[i]), content_hash(params[i])) for i in self.positions}
        entry = [self._guard_type(self.positions, tensors, self.copies), _callable(record), hashes, None]
        graph = weakref.ref(self)

        def died(_ref):
            entry[0], entry[1], entry[2] = _NEVER, None, None
            owner = graph()
            if owner is not None:
                owner.dead = True

        entry[3] = [weakref.ref(t, died) for t in {id(t): t for t in tensors}.values()]
        return entry

    def __call__(self, *args):
        entries = self.entries
        if entries and entries[0][0].check(args) == self._same and DataWatch.epoch == self._epoch:
            compiled, select = entries[0][1]
        else:
            compiled, select = self._miss(args)
        return compiled(*select(args))

    def _data_edits(self) -> None:
        """``.data`` was touched since the last check: an entry one of whose parameters, touched since (or with an
        alias of its ``.data`` still alive), now hashes differently is marked changed."""
        alive = False
        for entry in self.entries:
            if not isinstance(entry[2], dict):
                continue
            for ref, want in entry[2].values():
                t = ref()
                if t is None:
                    continue
                touched, open_alias = DataWatch.touched_since(self._epoch, t)
                alive = alive or open_alias
                if (touched or open_alias) and content_hash(t) != want:
                    entry[2] = "changed"
                    break
        if not alive:
            self._epoch = DataWatch.epoch

    def _miss(self, args):
        with self._lock:
            if self.dead:  # entries whose parameters died: their compiles are let go
                self.dead = False
                self.entries = [e for e in self.entries if e[1] is not None]
            if DataWatch.epoch != self._epoch:
                self._data_edits()
            changed = None
            for k, (guard, call, hashes, _) in enumerate(self.entries):
                match = guard.check(args)
                if match == self._same and hashes != "changed":
                    self.entries.insert(0, self.entries.pop(k))
                    return call
                if match == self._changed or (match == self._same and hashes == "changed"):
                    changed = k
            what = ("weights changed after compile (a new .data, or an in-place edit of a weight it copied)"
                    if changed is not None
                    else "called with other parameter tensors (another module instance, or a replaced parameter)")
            _refuse_recompile(f"frozen graph {self.graph_id} {what}")
            stats = self.stats
            if self.frozen_compiles < FROZEN_SPECIALIZATION_LIMIT:
                params = {i: args[i] for i in self.positions}
                log.info("fusegraph: frozen graph %d %s: compiling it frozen on these parameters (%d of %d)",
                         self.graph_id, what, self.frozen_compiles + 1, FROZEN_SPECIALIZATION_LIMIT)
                record = self.compile(list(args), params, freeze=True)
                stats.absorb(record.job.tally)
                if changed is not None:
                    self.entries.pop(changed)
                self.entries.insert(0, self._entry(params, record))
                self.frozen_compiles += 1
                stats.add(frozen_recompiles=1)
                return self.entries[0][1]
            if changed is not None:
                self.entries.pop(changed)  # its copies are stale: the unfrozen compile serves those weights now
            if self.unfrozen is None:
                stats.note_fallback(f"frozen graph {what}; {FROZEN_SPECIALIZATION_LIMIT} frozen compiles already: "
                                    "running an unfrozen compile of it for such calls")
                record = self.compile(list(args), {}, freeze=False)
                stats.absorb(record.job.tally)
                self.unfrozen = _callable(record)
                stats.add(frozen_recompiles=1)
            return self.unfrozen


class _Never:
    """The guard of an entry whose parameters died: matches no call."""

    @staticmethod
    def check(args):
        return _C.graph.FrozenMatch.OTHER


_NEVER = _Never()


def _refuse_recompile(what: str) -> None:
    """Under ``torch.compiler.set_stance("fail_on_recompile")`` a re-compile raises as Dynamo's own do."""
    if stance_name() == "fail_on_recompile":
        from ._core.torch_dynamo import RecompileError

        raise RecompileError(f"Detected recompile when torch.compile stance is 'fail_on_recompile': {what}")


def is_opaque(x) -> bool:
    """An opaque object Dynamo passes as a graph input (DTensor's ``DeviceMesh`` under tensor parallelism, a
    ScriptObject): a constant of the program, not a symbolic size."""
    if is_opaque_value(x):
        return True
    return isinstance(x, torch.ScriptObject) or type(x).__name__ in ("DeviceMesh", "FakeScriptObject")


@contextlib.contextmanager
def opaque_inputs_stay_inputs():
    """Freezing (``torch._inductor.freezing``) turns every lifted parameter into a constant. Under DTensor tensor
    parallelism aot_autograd lifts each DTensor's ``DeviceMesh`` too, as an opaque object ("cannot assign
    FakeScriptObject to buffer"); those stay graph inputs, the tensors are folded. Patched for the compile only
    (under Dynamo's compile lock); Inductor's own freezing calls the same function."""
    from ._core.torch_inductor import freezing

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
    """Dynamo compiled this graph for symbolic values: SymInt inputs, symbolic tensor sizes, or scalars read from
    tensors (``.item()``). Such a graph is not frozen (a frozen graph re-compiles outside Dynamo)."""
    if any(not isinstance(x, torch.Tensor) and not is_opaque(x) for x in example_inputs):
        return True
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            val = node.meta.get("example_value")
            if isinstance(val, torch.SymInt) or (
                    isinstance(val, torch.Tensor) and any(isinstance(d, torch.SymInt) for d in val.shape)):
                return True
        # a data-dependent scalar (Dynamo passes a Python float attribute that changed as a 0-d tensor and reads it
        # with .item()): only Dynamo's tracing can compile it, not a frozen graph's re-compile
        elif (node.op == "call_method" and node.target in ("item", "tolist")) or \
                node.target in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.item.default):
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


def _callable(record) -> tuple:
    """(compiled, selector): a compile record's callable and what picks its arguments out of every original
    input (the frozen ones are constants of the graph)."""
    return record.fn, (_all if record.keep is None else _selector(record.keep))


def _all(args):
    return args


def drop_frozen_args(gm, keep):
    """A boxed callable that passes on only the arguments freezing kept (parameters became constants)."""
    select = _selector(keep)

    def run(args):
        kept = select(args)
        args.clear()
        return gm(*kept)

    run._boxed_call = True
    return run


def freeze_aot_graph(dynamo_gm, aot_gm, aot_inputs, on_failure, config, params):
    """Parameters folded into constants (torch._inductor.freezing.freeze) under ``config``'s weight policy:
    (gm, kept arg indices), or (the unfrozen graph, None) after ``on_failure(reason)`` when freezing fails."""
    from ._core.torch_inductor import freeze

    # freeze edits the graph in place; a failure half-way must not leave the unfrozen fallback a graph with
    # some inputs already turned into constants ("forward() takes 9 positional arguments but 11 were given")
    pristine = torch.fx.GraphModule(aot_gm, copy.deepcopy(aot_gm.graph))
    try:
        with weight_policy(config, params), opaque_inputs_stay_inputs():
            frozen, keep = freeze(dynamo_gm, aot_gm, list(aot_inputs))
    except Exception as e:  # freezing is an optimisation: never fail a compile over it
        on_failure(f"freezing failed ({type(e).__name__}: {e}); running unfrozen")
        return pristine, None
    return frozen, keep
