"""Adaptor for ``torch._dynamo``: backend registration, aot_autograd, the compile lock, the stance, the FX-trace
switches and the counters fusegraph reads."""
from __future__ import annotations

import contextlib
import contextvars
import threading

import torch
from torch._dynamo.backends.common import aot_autograd  # noqa: F401
from torch._dynamo.backends.registry import register_backend  # noqa: F401
from torch._dynamo.exc import RecompileError  # noqa: F401
from torch._dynamo.utils import counters, graph_break_reasons  # noqa: F401

# Dynamo is imported with fusegraph anyway (the backend registers by name), so these names are bound eagerly.


def stance_name():
    """The name of the current ``torch.compiler.set_stance`` stance ("default", "fail_on_recompile", ...), or None
    where this torch keeps it elsewhere."""
    try:
        from torch._dynamo.eval_frame import _stance
    except ImportError:  # pragma: no cover - another torch's layout
        return None
    return getattr(_stance, "stance", None)


_CAPTURE_LOCK = None


def capture_lock():
    """Captures are serialised process-wide, with Dynamo's own compile lock: make_fx patches
    ``torch.nn.Module.__call__``/``__getattr__`` for the whole process while it traces, which must not overlap
    another thread's trace or a Dynamo compile; a CUDA/NPU graph capture likewise wants no other capture."""
    global _CAPTURE_LOCK
    if _CAPTURE_LOCK is None:
        try:
            from torch._dynamo.convert_frame import compile_lock
        except ImportError:  # pragma: no cover - another torch's layout
            compile_lock = threading.RLock()
        _CAPTURE_LOCK = compile_lock
    return _CAPTURE_LOCK


@contextlib.contextmanager
def fx_tracing_window(kind: str):
    """While this thread traces with FX (make_fx in a host capture; aot_autograd and the pattern matcher's
    replacements in a compile), ``torch.fx``'s tracing flag is set for the whole process and
    ``torch.nn.Module.__call__`` is patched, and Dynamo makes a compiled function that *another* thread calls
    meanwhile raise ("Detected that you are using FX to symbolically trace a dynamo-optimized function").
    For the window, Dynamo's ``force_compile_during_fx_trace`` is made the process default, so other threads'
    compiled calls run as compiled (the patched ``__call__`` just calls ``forward``). Its per-thread setting
    (a user's ``torch._dynamo.config`` assignment) still wins in each thread; in this thread a capture
    (``kind="capture"``: a user function, which may call compiled functions itself) runs such calls as their
    original Python, which the trace records, instead of compiling inside the trace. Windows are taken under
    the capture lock (Dynamo's compile lock), so they never interleave."""
    entries = getattr(torch._dynamo.config, "_config", {})
    force, nested = entries.get("force_compile_during_fx_trace"), entries.get("error_on_nested_fx_trace")
    if not all(hasattr(e, "default") and hasattr(e, "user_override") for e in (force, nested)):
        yield  # pragma: no cover - another torch's config layout: nothing to adjust
        return
    saved_default = force.default
    tokens, saved = [], []
    if kind == "capture":
        if all(isinstance(e.user_override, contextvars.ContextVar) for e in (force, nested)):
            # torch >= 2.12: this thread only (ContextVar), restored exactly with the tokens
            tokens = [(force, force.user_override.set(False)), (nested, nested.user_override.set(False))]
        else:  # torch 2.11 and older: a process-wide value; other threads' compiled calls in the window then
            # run as their Python (uncompiled, correct), and the values are restored after it
            saved = [(e, e.user_override) for e in (force, nested)]
            for e, _ in saved:
                e.user_override = False
    force.default = True
    try:
        yield
    finally:
        force.default = saved_default
        for entry, token in reversed(tokens):
            entry.user_override.reset(token)
        for entry, value in reversed(saved):
            entry.user_override = value


def recompile_limit(limit: int):
    """A context manager setting Dynamo's per-frame recompile limit (``torch._dynamo.config.recompile_limit``, 8 by
    default) to ``limit`` inside it: for one module compiled with several backends (each compiles its own entries)."""
    return torch._dynamo.config.patch(recompile_limit=limit)
