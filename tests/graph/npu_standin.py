"""A CPU stand-in for the ``torch.npu`` graph surface fusegraph's NPU driver uses (SPEC §8, torch_npu's
``torch_npu/npu/graphs.py``): ``NPUGraph`` (capture_begin/capture_end/replay/reset/pool), ``graph(...)``
context manager, ``graph_pool_handle``, ``Stream``/``stream``/``current_stream``, events, ``empty_cache``,
``synchronize``. Nothing else, so the driver cannot lean on more than real torch_npu offers.

Capture records every aten op run inside ``torch.npu.graph`` (a TorchDispatchMode) with the tensors it
touched; ``replay()`` re-runs the recorded ops on the *same* tensor objects and writes each result into the
tensor the capture produced — fixed addresses, like a device graph. Reading an input's value on the host
during capture (``.item()``, ``.tolist()``...) raises, as a real graph capture does.
"""
from __future__ import annotations

import contextlib
import gc
import types

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils import _pytree as pytree


class _Recorder(TorchDispatchMode):
    def __init__(self, ops):
        super().__init__()
        self.ops = ops

    def __torch_dispatch__(self, func, types_, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in (torch.ops.aten._local_scalar_dense.default,):
            raise RuntimeError("npu stand-in: host synchronisation (.item()) is not allowed during graph capture")
        out = func(*args, **kwargs)
        self.ops.append((func, args, kwargs, out))
        return out


class NPUGraph:
    def __init__(self):
        self._ops = None
        self._pool = None
        self._mode = None
        self.replays = 0

    def capture_begin(self, pool=None, capture_error_mode="global"):
        self._ops, self._pool = [], pool if pool is not None else graph_pool_handle()
        self._mode = _Recorder(self._ops)
        self._mode.__enter__()

    def capture_end(self):
        self._mode.__exit__(None, None, None)
        self._mode = None

    def replay(self):
        if self._ops is None:
            raise RuntimeError("npu stand-in: replay() before a capture")
        # a device graph's replay writes memory with no autograd checks: its outputs, made under the caller's
        # inference_mode at capture, are written whatever mode the replay runs in
        with torch.inference_mode():
            for func, args, kwargs, out in self._ops:
                new = func(*args, **kwargs)
                for dst, src in zip(pytree.tree_leaves(out), pytree.tree_leaves(new)):
                    if isinstance(dst, torch.Tensor) and dst is not src:
                        dst.copy_(src)
        self.replays += 1

    def reset(self):
        self._ops = None

    def pool(self):
        return self._pool


_pool_counter = [0]


def graph_pool_handle():
    _pool_counter[0] += 1
    return ("npu-standin-pool", _pool_counter[0])


class graph:  # noqa: N801  (torch_npu's name)
    def __init__(self, npu_graph, pool=None, stream=None, auto_dispatch_capture=False, capture_error_mode="global"):
        self.npu_graph, self.pool, self.stream_ = npu_graph, pool, stream

    def __enter__(self):  # as torch_npu does: sync, collect, empty the cache (looked up at call time)
        torch.npu.synchronize()
        gc.collect()
        torch.npu.empty_cache()
        self._stream_ctx = stream(self.stream_ if self.stream_ is not None else Stream())
        self._stream_ctx.__enter__()
        self.npu_graph.capture_begin(pool=self.pool)

    def __exit__(self, *exc):
        self.npu_graph.capture_end()
        self._stream_ctx.__exit__(*exc)
        return False


class Event:
    def __init__(self):
        self.recorded_on = None

    def record(self, stream=None):
        self.recorded_on = stream


class Stream:
    def __init__(self, device=None, priority=0):
        self.waited = []

    def record_event(self, event=None):
        event = event or Event()
        event.record(self)
        return event

    def wait_event(self, event):
        self.waited.append(event)

    def wait_stream(self, other):
        self.wait_event(other.record_event())


_default_stream = Stream()
_current = [_default_stream]


def current_stream(device=None):
    return _current[-1]


@contextlib.contextmanager
def stream(s):
    _current.append(s)
    try:
        yield
    finally:
        _current.pop()


empty_cache_calls = [0]


def empty_cache():
    empty_cache_calls[0] += 1


def synchronize(device=None):
    pass


def make_module() -> types.ModuleType:
    """A fresh ``torch.npu`` stand-in module; install it with
    ``monkeypatch.setattr(torch, "npu", make_module(), raising=False)``."""
    mod = types.ModuleType("torch.npu")
    for name in ("NPUGraph", "graph", "graph_pool_handle", "Stream", "Event", "stream", "current_stream",
                 "empty_cache", "synchronize"):
        setattr(mod, name, globals()[name])
    mod.is_available = lambda: True
    return mod
