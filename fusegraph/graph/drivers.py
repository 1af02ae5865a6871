"""Drivers: how one signature is captured and replayed on one kind of device (SPEC §4).

A driver turns ``flat_fn(*tensors) -> list`` plus the call's tensors into a ``Capture``: an Executable for
the C++ cache (csrc/graph/cache.h), the static input buffers (empty when the executable binds the caller's
tensors) and the measured memory. The cache, the checks and the copy plan are C++; drivers only capture.

- ``HostDriver`` (CPU): traces to an aten graph with make_fx and builds the C++ host graph.
- ``CudaDriver``: ``torch.cuda.CUDAGraph`` in one process-wide pool per device; replay is one
  ``CUDAGraph.replay()``; input copies batched (``torch._foreach_copy_`` per dtype/shape group, grouped in C++)
  on a dedicated copy stream ordered by events; no host synchronisation.
- ``NpuDriver`` (Ascend): the same through ``torch.npu`` (``NPUGraph``, ``torch.npu.graph(..., pool=)``,
  ``graph_pool_handle``, ``Stream``, events). Untested on real Ascend hardware: tests run it against a CPU
  stand-in of exactly that surface (tests/graph/npu_standin.py).
"""
from __future__ import annotations

import contextlib
import gc
import logging
import os
import threading
from dataclasses import dataclass, field

import torch

from .. import _C
from .._core.measure import decide
from .._core.ranks import COLLECTIVE_NAMESPACES
from .._core.torch_dispatcher import foreach_copy_
from .._core.torch_fake import TorchDispatchMode

from .host import Unsupported, build_host_graph, trace_aten

_log = logging.getLogger("fusegraph.graph")


@dataclass
class Capture:
    executable: object                     # _C.graph.Executable
    static_inputs: list                    # [] when the executable binds the caller's tensors
    memory_bytes: int
    fallback_reason: str | None = None     # set when the host graph fell back to the FX graph's Python code
    info: dict = field(default_factory=dict)


def storage_bytes(tensors) -> int:
    """Bytes of the distinct storages among ``tensors`` (shared storage counted once)."""
    seen, total = set(), 0
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            if st.data_ptr() not in seen:
                seen.add(st.data_ptr())
                total += st.nbytes()
    return total


def static_buffers(tensors, lazy: bool, static=()) -> list:
    """The capture's static inputs. Lazy capture shares the caller's storage (``detach()``): calling again
    with the same tensors is zero-copy. Eager capture owns its buffers (``detach().clone()``, same strides), except
    at the ``static`` positions (a graph's parameters and buffers), which are always the caller's own tensors: the
    cache keys them by address (``static_positions``), so they are never copied and an in-place edit is read.
    An input sharing storage with an earlier one (one tensor passed twice) gets a buffer of its own under lazy
    capture too: later calls copy two tensors into them. Owned buffers are normal tensors even when the capture
    runs under ``torch.inference_mode()``, so a later call outside it can copy into them."""
    static = set(static)
    seen, out = set(), []
    with torch.inference_mode(False):
        for i, t in enumerate(tensors):
            key = t.untyped_storage().data_ptr() if t.device.type != "meta" else None
            shared = key is not None and key in seen and t.untyped_storage().nbytes() > 0
            if i in static or (lazy and not shared):
                out.append(t.detach())
            else:
                out.append(torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device).copy_(t.detach()))
            if key is not None and i not in static:
                seen.add(key)
    return out


class StateWrites(TorchDispatchMode):
    """Active over a capture: the first in-place write to one of ``tensors`` (a module's state) saves a copy of the
    tensor; leaving restores every saved one. A write is an argument the op's schema marks as written, or one of
    ``_UNANNOTATED``'s (batch norm's running statistics in training mode). A capture runs fn several times (the
    fusion trace, warm-up runs, the host graph's timed replays); fn's own writes to the state it holds then happen
    once per call, in the replay, as eagerly. Only what is written is copied. A write made while a CUDA/NPU graph
    captures is not saved: the capture records it without running it (and a copy made then would be recorded too,
    never filled)."""

    def __init__(self, tensors):
        super().__init__()
        self._by_storage: dict = {}
        for t in tensors:
            if type(t) in (torch.Tensor, torch.nn.Parameter) and t.device.type != "meta":
                self._by_storage.setdefault(t.untyped_storage().data_ptr(), []).append(t)
        self._saved: dict = {}  # storage address -> [(tensor, copy)]

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._by_storage and (func._schema.is_mutable or func in _unannotated_writes()) \
                and not _device_capturing():
            for value in _written_arguments(func, args, kwargs):
                if type(value) in (torch.Tensor, torch.nn.Parameter) and value.device.type != "meta":
                    key = value.untyped_storage().data_ptr()
                    if key in self._by_storage and key not in self._saved:
                        with torch.no_grad():
                            self._saved[key] = [(t, t.detach().clone()) for t in self._by_storage[key]]
        return func(*args, **kwargs)

    def __exit__(self, *exc):
        try:
            return super().__exit__(*exc)
        finally:
            with torch.no_grad():
                for pairs in self._saved.values():
                    for t, copy in pairs:
                        t.detach().copy_(copy)
            self._saved.clear()


# Ops that write arguments their schema does not annotate as written (no ``(a!)``): batch norm updates the running
# statistics in place in training mode although ``running_mean``/``running_var`` are plain ``Tensor?``; neither
# ``is_mutable`` nor ``alias_info`` shows it, so the table names them. Overload name -> (the written arguments, the
# bool argument that must be true for the write, or None: always written).
_UNANNOTATED = {
    "native_batch_norm": (("running_mean", "running_var"), "training"),
    "cudnn_batch_norm": (("running_mean", "running_var"), "training"),
    "miopen_batch_norm": (("running_mean", "running_var"), "training"),
    "batch_norm_update_stats": (("running_mean", "running_var"), None),
    "batch_norm_gather_stats_with_counts": (("running_mean", "running_var"), None),
}
_unannotated_table: dict | None = None


def _unannotated_writes() -> dict:
    """{OpOverload: (written argument names, condition)} for the overloads of ``_UNANNOTATED`` this torch has."""
    global _unannotated_table
    if _unannotated_table is None:
        table = {}
        for name, spec in _UNANNOTATED.items():
            packet = getattr(torch.ops.aten, name, None)
            for overload in (packet.overloads() if packet is not None else ()):
                table[getattr(packet, overload)] = spec
        _unannotated_table = table
    return _unannotated_table


def _written_arguments(func, args, kwargs):
    """The argument values ``func`` writes: those its schema annotates as written, and those of the
    unannotated-write table."""
    schema = func._schema

    def value_of(i, arg):
        return args[i] if i < len(args) and not arg.kwarg_only else kwargs.get(arg.name)

    extra = _unannotated_writes().get(func)
    names, condition = extra if extra is not None else ((), None)
    if condition is not None:
        on = [value_of(i, a) for i, a in enumerate(schema.arguments) if a.name == condition]
        if not on or not on[0]:
            names = ()
    for i, arg in enumerate(schema.arguments):
        if (arg.alias_info is not None and arg.alias_info.is_write) or arg.name in names:
            yield value_of(i, arg)


def _device_capturing() -> bool:
    """A CUDA or NPU graph is being captured on this thread's current stream."""
    for name in ("cuda", "npu"):
        mod = getattr(torch, name, None)
        check = getattr(mod, "is_current_stream_capturing", None)
        try:
            if check is not None and (name != "cuda" or torch.cuda.is_available()) and check():
                return True
        except Exception:  # a device module that cannot answer here
            continue
    return False


class HostDriver:
    name = "host"

    def capture(self, flat_fn, tensors, options, graph=None, alternative=None, static=(), shared=()) -> Capture:
        """``alternative``: the plain trace of a fused ``graph`` (GraphRunner's fusion before capture): both are
        built and timed on the capture's inputs, and the faster one is kept (``info["chose"]``). ``static``: inputs
        the function does not mutate (a graph's parameters), used as they are. ``shared``: tensors the graph may
        hold as constants without owning them (the parameters and buffers of fn's modules): not its memory."""
        # warm-up and trace on copies of the same strides, so a function that mutates its inputs still
        # mutates the caller's tensors exactly once (in the replay); overlapping layouts are traced as given; the
        # static inputs (the weights: no copy of the model during a capture) as they are
        try:
            work = static_buffers(tensors, lazy=False, static=static)
        except RuntimeError:
            work = list(tensors)
        for _ in range(options.graph_warmup_runs):
            flat_fn(*work)
        # An aten-level graph (the backend's routes) is built as it is: tracing it again would be redundant, and
        # make_fx patches torch.nn.Module process-wide, which breaks other threads' compiled calls meanwhile.
        gm = graph if graph is not None else trace_aten(flat_fn, work)
        chose = None
        try:
            graph = build_host_graph(gm)
            if alternative is not None:
                gm, graph, chose = _faster(gm, graph, alternative, work)
        except Unsupported as e:
            reason = f"host graph: {e}"
            _log.info("fusegraph: %s; running the FX graph's Python code", reason)
            exe = _C.graph.PyExecutable(lambda ts: list(gm(*ts)), [], binds_inputs=True, outputs_are_fresh=False)
            return Capture(exe, [], 0, fallback_reason=reason, info={"gm": gm})
        info = {"gm": gm, "ops": graph.num_instructions}
        if chose is not None:
            info["chose"] = chose
        return Capture(graph, [], owned_constant_bytes(graph, gm, shared), info=info)


def owned_constant_bytes(graph, gm, shared) -> int:
    """The host graph's constants less those that are ``shared`` tensors: a trace of a module holds its parameters
    and buffers as constants, references to the module's own storage that every entry shares and none copies, so
    counting them would charge the weights once per entry (and a memory budget would evict entries costing
    nothing). Constants derived from them (a fused graph's packed weights) are the entry's own."""
    total = graph.constant_bytes
    if not shared or total == 0:
        return total
    storages = {t.untyped_storage().data_ptr() for t in shared if t.device.type != "meta"}
    held = []
    for node in gm.graph.find_nodes(op="get_attr"):
        if not node.users:
            continue
        value = gm
        for part in node.target.split("."):
            value = getattr(value, part, None)
        if isinstance(value, torch.Tensor) and value.device.type != "meta" \
                and value.untyped_storage().data_ptr() in storages:
            held.append(value)
    return max(0, total - storage_bytes(held))


# The fused host graph is kept unless the plain trace replays this much faster (the median of a few
# interleaved replays each, after one warm-up): fusion decomposes what it cannot fuse (a plain LayerNorm, say) into the ops the
# patterns are written against, which replays slower op by op than the native kernel.
PLAIN_FASTER_BY = 0.10
_TIMED_REPLAYS = 3


def _faster(fused_gm, fused, plain_gm, work):
    """(gm, host graph, "fused" | "plain"): the faster of the fused and the plain host graph on ``work``."""
    if any(n.op == "call_function" and getattr(n.target, "namespace", "") in COLLECTIVE_NAMESPACES
           for n in fused_gm.graph.nodes):
        return fused_gm, fused, "fused"  # timed replays would run its collectives: the other ranks must not differ
    try:
        plain = build_host_graph(plain_gm)
    except Unsupported:
        return fused_gm, fused, "fused"
    plain_wins, t_fused, t_plain = decide(lambda: fused.run(list(work)), lambda: plain.run(list(work)),
                                          by=1 / (1 - PLAIN_FASTER_BY), min_time=0, rounds=_TIMED_REPLAYS)
    best = {"fused": t_fused, "plain": t_plain}
    if plain_wins:
        _log.info("fusegraph: the unfused host graph replays faster (%.1f us vs %.1f us fused): capturing it",
                  best["plain"] * 1e6, best["fused"] * 1e6)
        return plain_gm, plain, "plain"
    return fused_gm, fused, "fused"


@contextlib.contextmanager
def _quiet_memory_hooks(module):
    """During a capture ``gc.collect`` and the device's ``empty_cache`` do nothing (the seed does the same):
    a collection in the middle of a capture could free or move memory the graph has recorded."""
    saved_gc, saved_empty = gc.collect, module.empty_cache
    gc.collect = lambda *a, **k: 0
    module.empty_cache = lambda *a, **k: None
    try:
        yield
    finally:
        gc.collect, module.empty_cache = saved_gc, saved_empty


class _StreamGraphDriver:
    """Shared by the CUDA and NPU drivers; ``_mod`` is ``torch.cuda`` or ``torch.npu``."""

    name = "?"
    _pools: dict = {}
    _pools_lock = threading.Lock()

    def _module(self):
        raise NotImplementedError

    def _new_graph(self, mod):
        raise NotImplementedError

    def _memory_allocated(self, mod, device):
        fn = getattr(mod, "memory_allocated", None)
        return fn(device) if fn is not None else 0

    def _per_device(self, mod, what, device, make):
        """One object per (driver, device, what), shared by every entry of every runner: the memory pool
        (``graph_pool_handle()``), the capture stream and the copy stream (streams are not free to create)."""
        key = (self.name, id(mod), str(device), what)
        with self._pools_lock:
            if key not in self._pools:
                self._pools[key] = make()
            return self._pools[key]

    def pool(self, mod, device):
        return self._per_device(mod, "pool", device, mod.graph_pool_handle)

    def capture(self, flat_fn, tensors, options, graph=None, static=()) -> Capture:
        mod = self._module()
        device = tensors[0].device if tensors else None
        others = sorted({str(t.device) for t in tensors} - {str(device)})
        if others:  # a CPU scalar tensor among CUDA inputs: its value would be read once, at capture
            raise RuntimeError(f"inputs on {others} besides {device}: a {self.name} graph would keep the value the "
                               "capture read from them; move them to the device (or pass a Python number)")
        # streams, pool and graph belong to the inputs' device, whatever the current device is
        on_device = mod.device(device) if device is not None and hasattr(mod, "device") else contextlib.nullcontext()
        with on_device:
            return self._capture_on_device(mod, device, flat_fn, tensors, options, static)

    def _capture_on_device(self, mod, device, flat_fn, tensors, options, held=()) -> Capture:
        static = static_buffers(tensors, options.graph_lazy_capture, held)
        versions = [t._version for t in static]
        side = self._per_device(mod, "capture_stream", device, mod.Stream)
        compute = mod.current_stream()
        side.wait_event(compute.record_event())
        with mod.stream(side):  # warm-up off the capture (lets lazy init / autotuning happen outside it)
            for _ in range(options.graph_warmup_runs):
                flat_fn(*static)
        compute.wait_event(side.record_event())
        before = self._memory_allocated(mod, device)
        graph = self._new_graph(mod)
        with _quiet_memory_hooks(mod):
            with mod.graph(graph, pool=self.pool(mod, device), stream=side):
                outputs = flat_fn(*static)
        written = [i for i, (t, v) in enumerate(zip(static, versions)) if i not in set(held) and t._version != v]
        if written:  # the replay writes the static buffers, never the caller's tensors
            raise RuntimeError(f"the function writes its input(s) {written} in place: a {self.name} graph replays on "
                               "copies of the inputs, so the caller's tensors would not change")
        pool_bytes = max(0, self._memory_allocated(mod, device) - before)
        owned = [] if options.graph_lazy_capture else [t for i, t in enumerate(static) if i not in set(held)]
        output_bytes = storage_bytes([o for o in outputs if isinstance(o, torch.Tensor)])
        memory = storage_bytes(owned) + max(pool_bytes, output_bytes)
        copier = self._per_device(mod, "copy_stream", device, lambda: _CopyStream(mod, device))
        exe = _C.graph.PyExecutable(graph.replay, list(outputs), binds_inputs=False, outputs_are_fresh=False,
                                    copy_fn=copier)
        # the captured function stays alive with its graph: constants only it owns (a fused GraphModule's tensor
        # attributes) are read by the graph's kernels at their captured addresses on every replay
        return Capture(exe, static, memory, info={"graph": graph, "fn": flat_fn})


class _CopyStream:
    """Input copies on a dedicated copy stream, ordered by events against the compute stream, no host sync.
    The C++ copy plan hands over groups of one dtype/shape/stride each: one ``_foreach_copy_`` per group.
    The sources stay safe for the allocator: the compute stream waits for the copies before any later work."""

    def __init__(self, mod, device=None):
        self.mod, self.device = mod, device
        self.stream = mod.Stream(device=device) if device is not None else mod.Stream()

    def __call__(self, dst_groups, src_groups):
        # the graph's device's current stream, whatever device is current: the replay launches there (CUDAGraph
        # replays on its capture device's current stream), so the copies are ordered against that stream
        compute = self.mod.current_stream(self.device) if self.device is not None else self.mod.current_stream()
        self.stream.wait_event(compute.record_event())  # the sources were produced on the compute stream
        with self.mod.stream(self.stream):
            for dsts, srcs in zip(dst_groups, src_groups):
                foreach_copy_(dsts, srcs)
        compute.wait_event(self.stream.record_event())


class CudaDriver(_StreamGraphDriver):
    name = "cuda"

    def _module(self):
        return torch.cuda

    def _new_graph(self, mod):
        return mod.CUDAGraph()


class NpuDriver(_StreamGraphDriver):
    name = "npu"

    def _module(self):
        return torch.npu

    def _new_graph(self, mod):
        return mod.NPUGraph()


def npu_graph_available() -> bool:
    """The seed's detection: both ``torch.npu.NPUGraph`` and ``torch.npu.graph`` exist."""
    npu = getattr(torch, "npu", None)
    return npu is not None and hasattr(npu, "NPUGraph") and hasattr(npu, "graph")


def cuda_graph_available() -> bool:
    return torch.cuda.is_available()


# The first real-GPU run (docs/BENCHMARKS.md §12: H200, torch 2.11) lost every process that captured through the
# CUDA driver to a host segfault whose cause is not found yet. Until a GPU run passes scripts/cuda_graph_probe.py,
# capture on CUDA is off unless this variable is 1: a graph route then runs uncaptured (GraphRunner) or the backend
# takes its default route, the reason counted and logged, as for any device without graphs.
CUDA_GRAPHS_ENV = "FUSEGRAPH_CUDA_GRAPHS"
CUDA_GRAPHS_OFF = (f"fusegraph's CUDA-graph capture is off: it crashed the process on its first real GPU run "
                   f"(docs/BENCHMARKS.md §12); {CUDA_GRAPHS_ENV}=1 turns it on")


def cuda_graphs_enabled() -> bool:
    return os.environ.get(CUDA_GRAPHS_ENV, "") == "1"


def select_driver(device_graph: str, device: torch.device):
    """The driver for ``device_graph`` ("auto" = the inputs' device) or None with the reason."""
    kind = device_graph
    if kind == "auto":
        kind = {"cuda": "cuda", "npu": "npu", "cpu": "host"}.get(device.type, device.type)
    if kind == "none":
        return None, "device_graph='none'"
    if kind == "host":
        return HostDriver(), None
    if kind == "cuda":
        if not cuda_graph_available():
            return None, "CUDA graphs unavailable"
        return (CudaDriver(), None) if cuda_graphs_enabled() else (None, CUDA_GRAPHS_OFF)
    if kind == "npu":
        return (NpuDriver(), None) if npu_graph_available() else (None, "torch.npu.NPUGraph unavailable")
    return None, f"no device graph for device type {device.type!r}"


def device_graph_available(device, config=None):
    """(True, None) when a graph route can capture for ``device`` under ``config.device_graph``, else
    (False, why). What the backend asks before choosing a graph route (SPEC §1.2)."""
    from .options import GraphOptions

    driver, why = select_driver(GraphOptions.from_config(config).device_graph, torch.device(device))
    return (driver is not None), why
