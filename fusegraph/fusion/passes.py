"""Pass manager: the redundant-node pass, then the pattern families in order, to a fixpoint (SPEC §3).

Input is an aten graph as aot_autograd produces it for inference (functionalized, decomposed with
``decompositions()``: Inductor's ``select_decomp_table()``, the table the patterns are traced with, but for the
matmul/convolution/attention-like ops it keeps whole). Each family is one ``PatternMatcherPass``, built once
per process per relevant option set (registration traces every pattern, which is slow) and shared by every
Backend whose options match.
"""
from __future__ import annotations

import contextlib
import copy
import functools
import logging
import operator
import os
import re
import threading
import time
import warnings
from typing import Optional

import torch
import torch.fx
from .._core.ranks import RanksOutOfStep
from .._core.torch_pattern_matcher import PatternMatcherPass

from . import traced
from .patterns import BY_NAME, FAMILY_NAMES, SWITCHES
from .patterns._trace import canonical_symbols

log = logging.getLogger("fusegraph")

_MAX_ROUNDS = 8

_passes: dict = {}
_passes_lock = threading.RLock()


def _fusion_patterns(config):
    """A FusionPatterns from a CompilationConfig, a FusionPatterns, or None (process defaults)."""
    from ..config import CompilationConfig, FusionPatterns

    if config is None:
        return FusionPatterns()
    if isinstance(config, CompilationConfig):
        return config.fusion_patterns
    if isinstance(config, FusionPatterns):
        return config
    raise TypeError(f"config must be a CompilationConfig, a FusionPatterns or None, got {type(config).__name__}")


# Ops with native kernels that no pattern family contains stay whole. Inductor's table decomposes some of them
# for its codegen (an addmm of one row into a multiply and a sum, a group norm into reductions), which the aten
# route and the host graph, running op by op, would run slower than the native kernel (100 Linear(8, 8) layers
# of one row: 2.3x slower).
_KEEP_WHOLE = re.compile(r"^(_?(add)?mm|addmv|mv|b?addbmm|bmm|v?dot|matmul|linear|_?convolution|conv.*|.*pool.*|"
                         r"upsample.*|_upsample.*|grid_sampler.*|.*batch_norm.*|(native_)?group_norm|instance_norm|"
                         r"embedding.*|index_.*|_unsafe_index_put|im2col|col2im|_?(safe_|log_)?softmax|"
                         r"scaled_dot_product.*|_scaled_dot_product.*|searchsorted|bucketize|argsort|msort|"
                         r"all_gather.*|reduce_scatter.*|.*_pad.*d|pad)$")


@functools.lru_cache(maxsize=None)
def decompositions() -> dict:
    """The decompositions every route traces with (aot_autograd's on the backend's routes, GraphRunner's fusion
    trace): Inductor's ``select_decomp_table()``, the graph form the patterns are written against, but for the ops
    in ``_KEEP_WHOLE``."""
    from .._core.torch_inductor import select_decomp_table

    def name(op):
        return op.name().split("::")[-1].split(".")[0] if hasattr(op, "name") else ""

    return {op: fn for op, fn in select_decomp_table().items() if not _KEEP_WHOLE.match(name(op))}


def family_key(family: str, opts) -> tuple:
    """What a family's registered patterns depend on: its name and its relevant options."""
    return (family,) + tuple((name, getattr(opts, name)) for name in BY_NAME[family].options)


def pattern_pass(family: str, opts) -> PatternMatcherPass:
    """The family's PatternMatcherPass for these options, registered on first use and cached."""
    if family not in BY_NAME:
        raise ValueError(f"unknown pattern family {family!r}; known: {FAMILY_NAMES}")
    key = family_key(family, opts)
    with _passes_lock:
        pm = _passes.get(key)
        if pm is None:
            pm = PatternMatcherPass(pass_name=f"fusegraph_{family}")
            # Trace patterns outside any fake mode / tracing context the caller may be in (as Inductor's own
            # lazily registered patterns do), on fresh fake tensors.
            from .._core.torch_dynamo import counters
            from .._core.torch_fake import FakeTensorMode, tracing, unset_fake_temporarily

            saved = counters["inductor"].copy()
            # Tracing mixed-dtype patterns (e.g. Wan's fp32 LayerNorm of a bf16 input) makes ATen warn about
            # its unfused layer_norm path; that is about the pattern's trace, not the user's model.
            with tracing(None), unset_fake_temporarily(), FakeTensorMode(), \
                    warnings.catch_warnings(), traced.cached(key):
                warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
                BY_NAME[family].module.register(pm, copy.deepcopy(opts))
            counters["inductor"] = saved
            _guard_entries(pm)
            _passes[key] = pm
    return pm


def _has_no_scaled_add(match) -> bool:
    """Inductor's matcher compares a node's positional arguments but not extra keyword arguments, so
    ``add(c, p, alpha=2.5)`` would match a pattern traced from ``c + p``; such a match is refused."""
    for node in match.nodes:
        if node.op == "call_function" and node.kwargs.get("alpha", 1) != 1:
            return False
    return True


def _guard_entries(pm: PatternMatcherPass) -> None:
    """Adds the framework's own checks to every pattern a family registered."""
    for entries in pm.patterns.values():
        for entry in entries:
            check = entry.extra_check
            entry.extra_check = (lambda m, check=check: _has_no_scaled_add(m) and check(m))


# ---------------------------------------------------------------------------------------------------------
# Redundant-node pass


def remove_redundant_nodes(graph: torch.fx.Graph) -> int:
    """Drops no-op clones, identity views/reshapes/slices/casts (Inductor's ``remove_noop_ops``, which never
    creates new input/output aliasing) and single-piece splits, and under symbolic shapes keeps one node per
    symbolic value (``canonical_symbols``: a replacement's re-trace adds its own ``sym_size`` reads). Returns the
    number of nodes removed."""
    from .._core.torch_inductor import remove_noop_ops

    before = len(graph.nodes)
    canonical_symbols(graph)
    _remove_single_piece_splits(graph)
    remove_noop_ops(graph)
    graph.eliminate_dead_code()
    return before - len(graph.nodes)


def views_to_reshapes(graph: torch.fx.Graph) -> int:
    """Every ``aten.view`` of ``graph`` made an ``aten.reshape`` (a view where the strides allow one, else a copy);
    returns how many. A fused op writes a dense row-major result where eager's ops kept their input's layout (an
    RMSNorm of a transposed [B, H, S, D] view), and ops downstream may follow that layout (SDPA's output
    follows its query's): a view traced on eager's strides, such as attention's closing
    ``transpose(1, 2).reshape(B, S, H * D)``, may no longer apply to the tensor the fused graph has there.
    Inductor does the same after its own layout changes (freezing, layout optimisation:
    ``torch._inductor.fx_passes.post_grad.view_to_reshape``); its codegen copies where needed, an aten graph run
    as is raises."""
    views = graph.find_nodes(op="call_function", target=torch.ops.aten.view.default)
    for node in views:
        node.target = torch.ops.aten.reshape.default
    return len(views)


_SPLITS = (torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default, torch.ops.aten.chunk.default)


def _remove_single_piece_splits(graph: torch.fx.Graph) -> None:
    outputs = set()
    out = next(iter(reversed(graph.nodes)))
    torch.fx.node.map_arg(out.args, outputs.add)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _SPLITS:
            continue
        val = node.meta.get("val")
        src = node.args[0]
        src_val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if not isinstance(val, (list, tuple)) or len(val) != 1 or src_val is None:
            continue
        if tuple(val[0].shape) != tuple(src_val.shape) or val[0].stride() != src_val.stride():
            continue
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem and user.args[1] == 0:
                if user in outputs and src.op == "placeholder":
                    continue  # would make an output the input itself
                user.replace_all_uses_with(src)
                graph.erase_node(user)
        if not node.users:
            graph.erase_node(node)


# ---------------------------------------------------------------------------------------------------------
# Graph log (graph_log_url)


def prepare_log_dir(path) -> Optional[str]:
    """Creates the graph_log_url directory; a path that exists and is not a directory is an error."""
    if path is None:
        return None
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"graph_log_url={path!r} exists and is not a directory; expected a directory for graph logs")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"graph_log_url={path!r}: cannot create the directory ({e})") from e
    return path


class GraphLog:
    """Writes the graph before and after each pass as ``<graph>_<step>_<pass>_{before,after}.txt``.

    ``<graph>`` is ``graphNNN``, claimed in the folder when the first file is written: the first free number,
    taken atomically by creating ``graphNNN_info.txt`` (O_EXCL), so backends, graph breaks and processes sharing
    one folder never overwrite each other. The info file says who wrote the graph (``label``, pid, time).
    The texts are also kept (``entries``), so that a graph Inductor later serves from its cache can write them
    again (``write_cached``)."""

    _hints: dict = {}  # folder -> next number to try in it: claims stay O(1) as the folder fills
    _hint_lock = threading.Lock()

    def __init__(self, folder: Optional[str], label: str = ""):
        self.folder = folder
        self.label = label
        self.graph_name: Optional[str] = None
        self.step = 0
        self.entries: list = []  # [file suffix, text] in order

    def _claim(self, note: str = "") -> str:
        if self.graph_name is None:
            with GraphLog._hint_lock:
                n = GraphLog._hints.get(self.folder, 0)
                while True:
                    path = os.path.join(self.folder, f"graph{n:03d}_info.txt")
                    try:
                        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
                        break
                    except FileExistsError:
                        n += 1
                GraphLog._hints[self.folder] = n + 1
            with os.fdopen(fd, "w") as f:
                f.write(f"{self.label}\npid {os.getpid()}, {time.strftime('%Y-%m-%d %H:%M:%S')}\n{note}")
            self.graph_name = f"graph{n:03d}"
        return self.graph_name

    def write(self, pass_name: str, when: str, graph: torch.fx.Graph) -> None:
        if self.folder is None:
            return
        gm = graph.owning_module
        try:
            text = gm.print_readable(print_output=False, include_stride=True) if gm is not None else str(graph)
        except Exception:  # print_readable needs a recompiled module; the IR text is always available
            text = str(graph)
        suffix = f"{self.step:03d}_{pass_name}_{when}"
        self._write(suffix, text)
        if when == "after":
            self.step += 1

    def _write(self, suffix: str, text: str, note: str = "") -> None:
        self.entries.append([suffix, text])
        with open(os.path.join(self.folder, f"{self._claim(note)}_{suffix}.txt"), "w") as f:
            f.write(text)

    def write_cached(self, entries: Optional[list], graph_code: str) -> None:
        """A graph served from Inductor's cache: the pass logs of the compile that fused it (``entries``, kept
        with the cached counts), or, when that compile kept none, the graph handed to Inductor."""
        if self.folder is None:
            return
        if entries:
            note = "Inductor served this graph from its cache; the pass logs below are those of the compile that fused it\n"
            for suffix, text in entries:
                self._write(suffix, text, note)
        else:
            self._write("000_cached_graph", graph_code,
                        "Inductor served this graph from its cache, fused by a compile that kept no pass logs "
                        "(graph_log_url unset); TORCHINDUCTOR_FORCE_DISABLE_CACHES=1 re-runs the passes\n")


# ---------------------------------------------------------------------------------------------------------
# Verification (CompilationConfig.verify): a differential check of the families on the graph's real inputs

# Relative tolerance by output dtype: torch.testing.assert_close's defaults for bf16/fp16/fp64; fp32 is looser
# than its 1.3e-6 because a fused op reassociates sums (a norm's reduction) and a graph repeats that over blocks.
_VERIFY_RTOL = {torch.float64: 1e-7, torch.float32: 1e-4, torch.bfloat16: 1.6e-2, torch.float16: 1e-3}
_VERIFY_ATOL = 1e-5  # all-zero outputs


def verify_inputs_for(graph_or_gm, inputs, params=None) -> tuple:
    """The real tensors for the graph's placeholders, in order, as ``(inputs, None)``; ``(None, why)`` when they
    cannot be matched safely. ``inputs`` are the example inputs the graph was compiled for (a tensor subclass
    among them, such as a DTensor parameter, as its inner tensors); ``params`` the parameters and buffers
    aot_autograd lifted in front of them (default: the current TracingContext's ``params_flat``), which are
    placeholders until (opt-in) freezing folds them into constants.
    Every pair is checked (dtype, device, rank, static sizes; python values for symbolic ints); fake, meta,
    subclass or unhinted symbolic example inputs are refused: verification runs the graph for real."""
    graph = graph_or_gm.graph if isinstance(graph_or_gm, torch.fx.GraphModule) else graph_or_gm
    if inputs is None:
        return None, "verify skipped: no real example inputs for this graph"
    from .._core.torch_fake import TracingContext

    if params is None:
        context = TracingContext.try_get()
        params = (getattr(context, "params_flat", None) or []) if context is not None else []
    placeholders = graph.find_nodes(op="placeholder")
    inputs, params = list(inputs), list(params)
    if len(placeholders) != len(params) + len(inputs):  # tensor subclass parameters (DTensor under tensor
        context = TracingContext.try_get()  # parallelism) are placeholders as their inner parts
        unwrapped = getattr(context, "params_flat_unwrap_subclasses", None) if context is not None else None
        if unwrapped is not None and len(placeholders) == len(unwrapped) + len(inputs):
            params = list(unwrapped)
    if len(placeholders) != len(params) + len(inputs) and len(placeholders) != len(inputs):
        flat = _unwrap_subclasses(inputs)  # tensor subclass inputs (DTensor parameters) as their inner parts
        if len(placeholders) in (len(flat), len(params) + len(flat)):
            inputs = flat
    if len(placeholders) == len(inputs):
        candidates = inputs
    elif len(placeholders) == len(params) + len(inputs):
        candidates = params + inputs
    else:
        return None, (f"verify skipped: the graph has {len(placeholders)} inputs, the example inputs are "
                      f"{len(inputs)} (+{len(params)} lifted parameters)")
    candidates = [_concrete(x) for x in candidates]
    for i, (node, real) in enumerate(zip(placeholders, candidates)):
        why = _input_mismatch(node.meta.get("val"), real)
        if why:
            return None, f"verify skipped: graph input {i} ({node.name}): {why}"
    return candidates, None


def _unwrap_subclasses(inputs) -> list:
    """``inputs`` with each traceable wrapper subclass (DTensor) replaced by its inner tensors, in
    ``__tensor_flatten__`` order: how aot_autograd hands such inputs to the graph."""
    from .._core.torch_fake import is_traceable_wrapper_subclass

    out = []
    for x in inputs:
        if isinstance(x, torch.Tensor) and is_traceable_wrapper_subclass(x):
            attrs, _ = x.__tensor_flatten__()
            out += _unwrap_subclasses([getattr(x, a) for a in attrs])
        else:
            out.append(x)
    return out


def _concrete(x):
    """A symbolic size among dynamic-shape example inputs is its hint: the value Dynamo read from this call's real
    tensors (a symbolic value without one stays symbolic and is refused)."""
    if isinstance(x, torch.SymInt) and x.node.has_hint():
        hint = x.node.hint
        return int(hint) if not isinstance(hint, torch.SymInt) else x
    return x


def _input_mismatch(val, real) -> Optional[str]:
    from .._core.torch_fake import FakeTensor
    from .._core.torch_fake import is_traceable_wrapper_subclass

    if isinstance(real, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return "the example input is symbolic"
    if isinstance(val, torch.Tensor):
        if not isinstance(real, torch.Tensor):
            return f"expected a tensor, the example input is {type(real).__name__}"
        if isinstance(real, FakeTensor) or is_traceable_wrapper_subclass(real) or real.device.type == "meta":
            return f"the example input is not a plain tensor ({type(real).__name__} on {real.device})"
        if (real.dtype, real.device.type, real.dim()) != (val.dtype, val.device.type, val.dim()):
            return (f"expected {val.dtype} rank {val.dim()} on {val.device.type}, the example input is "
                    f"{real.dtype} rank {real.dim()} on {real.device.type}")
        if any(isinstance(d, int) and d != r for d, r in zip(val.shape, real.shape)):
            return f"expected shape {tuple(val.shape)}, the example input has {tuple(real.shape)}"
        return None
    if isinstance(val, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return None if isinstance(real, (int, float, bool)) else f"expected a number, got {type(real).__name__}"
    if isinstance(val, (int, float, bool)):
        return None if real == val else f"expected {val!r}, the example input is {real!r}"
    if type(val).__name__ == "FakeScriptObject" and not isinstance(real, torch.Tensor):
        return None  # an opaque object (DTensor's DeviceMesh): passed through as it is
    return f"no example value of a supported kind in the graph ({type(val).__name__})"


def _only(opts, families):
    """A copy of ``opts`` with the switches of ``families`` on and every other switch off (their other options
    unchanged). Families that share a switch (``enable_adalayernorm``: adaln, adaln_rms, adaln_noshift) are
    then told apart by ``fuse_graph``'s ``only_families``."""
    new = copy.deepcopy(opts)
    on = {BY_NAME[f].switch for f in families}
    for switch in SWITCHES:
        setattr(new, switch, switch in on)
    return new


def _site(node: torch.fx.Node) -> str:
    """``file:line`` of the innermost user frame in the node's stack trace. The matcher gives the node that replaces
    a match's root the root's stack trace; the other nodes of a replacement have none."""
    frames = re.findall(r'File "([^"]+)", line (\d+)', node.meta.get("stack_trace") or "")
    return f"{frames[-1][0]}:{frames[-1][1]}" if frames else "<no source line>"


def _clone_inputs(inputs, keep: set) -> list:
    """Copies of the inputs with their exact layout (the storage is cloned and viewed the same way, so views,
    offsets, expanded strides and inputs that share a storage stay as they were); ``keep`` (positions) are
    passed as they are (parameters the graph never writes: no need to copy a model's weights)."""
    storages, out = {}, []
    for i, x in enumerate(inputs):
        if i in keep or not isinstance(x, torch.Tensor):
            out.append(x)
            continue
        storage = x.untyped_storage()
        key = (storage.data_ptr(), x.device)
        if key not in storages:
            storages[key] = storage.clone()
        y = torch.empty((), dtype=x.dtype, device=x.device)
        y.set_(storages[key], x.storage_offset(), x.size(), x.stride())
        out.append(y)
    return out


def _written_placeholders(graph: torch.fx.Graph) -> set:
    """Positions of the placeholders an op of the graph writes to (functionalized graphs: input mutations as
    ``copy_`` into the input)."""
    position = {node: i for i, node in enumerate(graph.find_nodes(op="placeholder"))}
    written = set()
    for node in graph.nodes:
        schema = getattr(node.target, "_schema", None) if node.op == "call_function" else None
        if schema is None:
            continue
        for j, arg in enumerate(schema.arguments):
            if arg.alias_info is None or not arg.alias_info.is_write:
                continue
            value = node.args[j] if j < len(node.args) else node.kwargs.get(arg.name)
            torch.fx.node.map_arg(value, lambda n: written.add(position[n]) if n in position else None)
    return written


def _mismatch(ref, out) -> Optional[str]:
    """None when ``out`` matches ``ref``; otherwise where and by how much it differs. Floating outputs: elementwise
    ``|out - ref| <= atol + rtol * (|ref| + max|ref|)`` with the dtype's rtol. The fused ops round once where the
    unfused graph rounds several times, so their error is rounding-sized relative to the magnitudes the values
    reach, not to each element (near a cancellation an element's own relative error is unbounded); a wrong
    replacement (another formula, scale, axis) is off by a fraction of those magnitudes. NaN in both, or the
    same infinity, is equal. Other outputs must be equal."""
    from .._core.torch_dispatcher import pytree

    refs, outs = pytree.tree_leaves(ref), pytree.tree_leaves(out)
    if len(refs) != len(outs):
        return f"{len(outs)} outputs instead of {len(refs)}"
    for i, (r, o) in enumerate(zip(refs, outs)):
        if not isinstance(r, torch.Tensor):
            if r != o:
                return f"output {i}: {o!r} instead of {r!r}"
            continue
        if not isinstance(o, torch.Tensor) or (o.dtype, o.shape) != (r.dtype, r.shape):
            what = f"{o.dtype} {tuple(o.shape)}" if isinstance(o, torch.Tensor) else type(o).__name__
            return f"output {i}: {what} instead of {r.dtype} {tuple(r.shape)}"
        if not (r.is_floating_point() or r.is_complex()):
            if not torch.equal(r, o):
                return f"output {i}: {r.dtype} values differ"
            continue
        wide = torch.complex128 if r.is_complex() else torch.float64
        r64, o64 = r.detach().to(wide), o.detach().to(wide)
        finite = r64[torch.isfinite(r64)].abs()
        scale = finite.max().item() if finite.numel() else 0.0
        rtol = _VERIFY_RTOL.get(r.dtype, 1e-4)
        diff = (o64 - r64).abs()
        ok = (diff <= _VERIFY_ATOL + rtol * (r64.abs() + scale)) | (o64 == r64) | (torch.isnan(o64) & torch.isnan(r64))
        if not bool(ok.all()):
            bad = (~ok).nonzero()[0].tolist()
            return (f"output {i} ({r.dtype}): {int((~ok).sum())} of {r.numel()} values off, e.g. at {bad}: "
                    f"{o64[tuple(bad)].item():.6g} instead of {r64[tuple(bad)].item():.6g} (tolerance {rtol:g} of "
                    f"|value| + max|value| {scale:.3g})")
    return None


@contextlib.contextmanager
def _same_random_numbers(inputs):
    """Every run draws the same random numbers (ops tagged nondeterministic_seeded, e.g. attention with its
    dropout_p, are common in inference graphs; fusion leaves them and their order alone), and the caller's
    generators are left as they were: the CPU's and those of the inputs' accelerator devices."""
    devices = {x.device for x in inputs if isinstance(x, torch.Tensor) and x.device.type != "cpu"}
    kinds = {d.type for d in devices}
    kind = kinds.pop() if len(kinds) == 1 else "cuda"
    indices = sorted(d.index if d.index is not None else 0 for d in devices if d.type == kind)
    generators = getattr(getattr(torch, kind, None), "default_generators", ())
    with torch.random.fork_rng(devices=indices, device_type=kind):
        torch.default_generator.manual_seed(0x5EED)
        for i in indices:
            if i < len(generators):
                generators[i].manual_seed(0x5EED)
        yield


class _Verifier:
    """Runs fused copies of a graph (never the graph itself) on copies of its real inputs."""

    def __init__(self, graph: torch.fx.Graph, inputs, redundant: bool):
        self.root = graph.owning_module if graph.owning_module is not None else torch.nn.Module()
        self.pristine = copy.deepcopy(graph)
        self.inputs = list(inputs)
        self.redundant = redundant
        written = _written_placeholders(graph)
        self.keep = {i for i, x in enumerate(self.inputs) if isinstance(x, torch.nn.Parameter) and i not in written}

    def run(self, opts=None, families=None):
        """(outputs or the exception raised, counts, sites per family) of a copy fused with ``opts`` (None:
        the unfused graph), only ``families`` of them when given. Whatever fails, the graph's collectives run once:
        a copy whose fusion raised runs unfused (its result is the fusion's exception), so every rank makes the same
        runs (``_verified``)."""
        from .._core.torch_fake import unset_fake_temporarily

        counts, sites, failed = dict.fromkeys(FAMILY_NAMES, 0), {}, None
        graph = copy.deepcopy(self.pristine)
        gm = torch.fx.GraphModule(self.root, graph)
        if opts is not None:
            try:
                before = set(graph.nodes)
                counts = fuse_graph(gm, opts, redundant=self.redundant, only_families=families, reshape_views=True)
                for node in graph.nodes:
                    if node not in before and node.meta.get("stack_trace"):
                        sites.setdefault(_site(node), None)
            except Exception as e:  # a replacement that breaks the graph is as wrong as one that changes its result
                failed, counts, sites = e, dict.fromkeys(FAMILY_NAMES, 0), {}
                gm = torch.fx.GraphModule(self.root, copy.deepcopy(self.pristine))
        try:
            with torch.no_grad(), unset_fake_temporarily(), _same_random_numbers(self.inputs):
                out = gm(*_clone_inputs(self.inputs, self.keep))
        except Exception as e:
            out = e
        return (failed if failed is not None else out), counts, list(sites)


def _note(stats, reason: str, detail: str = "") -> None:
    log.warning("fusegraph: %s%s", reason, detail)
    if stats is not None:
        stats.add_fallback(reason)


def _verified(graph: torch.fx.Graph, opts, inputs, stats, redundant: bool):
    """(opts, redundant) to fuse the graph with: ``opts`` without the families that changed the result of a fused
    copy of the graph on ``inputs``. The graph itself is not touched here, so it is fused once, with the families
    that passed: never half-fused.

    Ranks in step (a graph with collectives, more than one rank: docs/DESIGN.md "Ranks in step"). Each verifier run
    runs the graph's collectives, so every rank of the group must make the same runs and exchanges in the same
    order, whatever its own data, timings or caches say. Here that sequence is a function of agreed values only:

    - it starts with ``ranks.enter_step``: every rank is verifying a graph with the same collectives, as its n-th
      verify on the group; a rank that verified a graph the others did not (Inductor served the others that compile
      from a cache: ``FusionPass.uuid`` bypasses those caches for this reason), or verifies another graph, makes
      every rank raise ``RanksOutOfStep``; a rank the others never join raises after ``FUSEGRAPH_RANK_TIMEOUT_S``;
    - every exchange has a length that does not depend on the rank (1, or 1 + and then exactly the number of
      families), and which families are run alone is the union over the ranks of those that fused, agreed, not
      this rank's own count;
    - a rank-local failure (a fused copy that raises while fusing or running, a comparison that raises) is a flag
      in the next exchange, never an early exit;
    - nothing measured, timed or read from a cache decides anything here, and a round ends or continues on agreed
      flags only.
    """
    from .._core.ranks import agree_any, collective_sequence, enter_step, group_for_graph

    group = group_for_graph(graph)  # None: single process, or no collectives; nothing is exchanged
    if group is not None:
        enter_step(group, "verify", collective_sequence(graph))
    verifier = _Verifier(graph, inputs, redundant)
    ref, _, _ = verifier.run()
    if agree_any(group, [isinstance(ref, Exception)], "verify: the unfused run")[0]:
        if not isinstance(ref, Exception):
            ref = RuntimeError("the unfused graph raised on another rank")
        _note(stats, f"verify skipped: the unfused graph did not run on the example inputs ({type(ref).__name__})",
              f": {ref}")
        return opts, redundant, None
    allowed = list(opts.enabled_families())
    for round_ in range(len(FAMILY_NAMES) + 1):
        out, counts, _ = verifier.run(_only(opts, allowed), allowed)
        why = _differs(ref, out)
        flags = agree_any(group, [why is not None] + [bool(counts[f]) for f in FAMILY_NAMES],
                          f"verify round {round_ + 1}: the fused run")
        if not flags[0]:
            return _only(opts, allowed), redundant, allowed
        why = why or "the result changed on another rank"
        fused_anywhere = dict(zip(FAMILY_NAMES, flags[1:]))
        active = [f for f in allowed if fused_anywhere[f]]
        if not active:  # only the redundant-node pass ran, on every rank
            _note(stats, "verify: the redundant-node pass changed the result; fusion left off for this graph",
                  f" ({why})")
            return _only(opts, ()), False, []
        culprits, alone_sites = {}, {}
        for family in active:
            alone, _, sites = verifier.run(_only(opts, (family,)), (family,))
            alone_why = _differs(ref, alone)
            alone_sites[family] = sites
            if alone_why is not None:
                culprits[family] = (alone_why, sites)
        agreed = dict(zip(FAMILY_NAMES, agree_any(group, [f in culprits for f in FAMILY_NAMES],
                                                  f"verify round {round_ + 1}: each family alone")))
        culprits = {f: culprits.get(f, ("changed the result on another rank", alone_sites[f]))
                    for f in active if agreed[f]}
        if not culprits:  # wrong only together: undo every family that fused something
            culprits = {f: (f"together with {', '.join(a for a in active if a != f)}: {why}", alone_sites[f])
                        for f in active}
        for family, (family_why, sites) in culprits.items():
            more = f" and {len(sites) - 10} more" if len(sites) > 10 else ""
            _note(stats, f"verify: {family} changed the result beyond the dtype's tolerance; undone",
                  f" for this graph ({family_why}); sites: {', '.join(sites[:10]) or 'unknown'}{more}")
        allowed = [f for f in allowed if f not in culprits]
    return _only(opts, ()), redundant, []  # not reached: each round undoes at least one family


def _differs(ref, out) -> Optional[str]:
    from .._core.torch_fake import unset_fake_temporarily

    if isinstance(out, Exception):
        return f"the fused graph raised {type(out).__name__}: {out}"
    try:
        with torch.no_grad(), unset_fake_temporarily():  # the aten route fuses inside aot_autograd's fake mode
            return _mismatch(ref, out)
    except Exception as e:  # a flag like any other difference: never an early exit (_verified)
        return f"the comparison raised {type(e).__name__}: {e}"


# ---------------------------------------------------------------------------------------------------------
# Entry point


def _run(name, fn, graph, glog, observer=None):
    if glog is not None:
        glog.write(name, "before", graph)
    if observer is not None:
        observer(name, "before", graph)
    n = fn(graph)
    if glog is not None:
        glog.write(name, "after", graph)
    if observer is not None:
        observer(name, "after", graph)
    return n


def fuse_graph(gm_or_graph, config=None, *, stats=None, graph_log: Optional[GraphLog] = None,
               redundant: bool = True, observer=None, verify_inputs=None, only_families=None,
               reshape_views: bool = False) -> dict:
    """Runs the redundant-node pass and the enabled pattern families (in ``patterns.FAMILIES``' order) on the
    graph until nothing changes. ``config`` is a CompilationConfig, a FusionPatterns or None (process defaults).
    Returns ``{family: replacements}`` for every family (0 when disabled) and adds it to ``stats.patterns``.
    ``observer(pass_name, when, graph)``, when given, is told before and after each pass (``when`` "before" /
    "after") and once at the end (``"fuse_graph", "done"``): ``fusegraph.explain`` reads the graph there.
    ``verify_inputs`` (real tensors for the graph's placeholders, in order; see ``verify_inputs_for``), when
    given: fused copies of the graph are first run against the unfused graph on them, and the families that
    change the result are left off for this graph (logged with their sites, counted in ``stats.fallbacks``).
    ``only_families``, when given, further limits the enabled families to those named (verification uses it to
    leave off one of several families that share a switch). ``reshape_views``: for a graph that runs as is (the
    aten and graph routes; not Inductor's, whose lowering copies where a view no longer applies), every
    ``aten.view`` becomes ``aten.reshape`` once a site was fused (``views_to_reshapes``)."""
    opts = _fusion_patterns(config)
    graph = gm_or_graph.graph if isinstance(gm_or_graph, torch.fx.GraphModule) else gm_or_graph
    if verify_inputs is not None:
        try:
            opts, redundant, verified = _verified(graph, opts, verify_inputs, stats, redundant)
            if verified is not None:
                only_families = verified if only_families is None else [f for f in verified if f in only_families]
        except RanksOutOfStep:  # the ranks would pair different collectives from here on: never carry on
            raise
        except Exception as e:  # a safety net must never fail the compile it guards
            _note(stats, f"verify skipped: verification failed ({type(e).__name__})", f": {e}")
    counts = dict.fromkeys(FAMILY_NAMES, 0)
    families = [(f, pattern_pass(f, opts)) for f in opts.enabled_families()
                if only_families is None or f in only_families]
    for _ in range(_MAX_ROUNDS):
        changed = 0
        if redundant:
            changed += _run("redundant", remove_redundant_nodes, graph, graph_log, observer)
        replaced = 0
        for family, pm in families:
            n = _run(family, pm.apply, graph, graph_log, observer)
            counts[family] += n
            replaced += n
        if not replaced:
            break
    else:
        log.warning("fusegraph: fusion did not reach a fixpoint in %d rounds", _MAX_ROUNDS)
    graph.eliminate_dead_code()
    if reshape_views and any(counts.values()):
        views_to_reshapes(graph)
    graph.lint()
    if observer is not None:
        observer("fuse_graph", "done", graph)
    if isinstance(gm_or_graph, torch.fx.GraphModule):
        gm_or_graph.recompile()
    if stats is not None:
        stats.add_patterns(counts)
    return counts


def ship_patterns(argv=None) -> int:
    """The build step (``make build``): every family's search patterns traced with the default options and written
    to the package's file (``traced.SHIPPED``). ``--if-stale``: only when that file is missing or was traced from
    other sources or another torch."""
    import sys

    from ..config import FusionPatterns

    argv = sys.argv[1:] if argv is None else argv
    if "--if-stale" in argv and traced.shipped_is_current():
        print(f"fusegraph: {traced.SHIPPED} is current")
        return 0

    def register_all():
        opts = FusionPatterns()
        for family in FAMILY_NAMES:
            pattern_pass(family, opts)

    print(f"fusegraph: {traced.ship(register_all)} traced search patterns written to {traced.SHIPPED}")
    return 0
