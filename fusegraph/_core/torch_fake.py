"""Adaptor for fake tensors and the tracing context: ``torch._subclasses.fake_tensor``, ``torch._guards``, the
Python dispatcher and ``torch.utils._python_dispatch``'s modes."""
from __future__ import annotations

from .lazy import module_getattr

__getattr__ = module_getattr(__name__, {
    "FakeTensor": ("torch._subclasses.fake_tensor", "FakeTensor"),
    "FakeTensorMode": ("torch._subclasses.fake_tensor", "FakeTensorMode"),
    "unset_fake_temporarily": ("torch._subclasses.fake_tensor", "unset_fake_temporarily"),
    "detect_fake_mode": ("torch._guards", "detect_fake_mode"),
    "TracingContext": ("torch._guards", "TracingContext"),
    "tracing": ("torch._guards", "tracing"),
    "enable_python_dispatcher": ("torch._dispatch.python", "enable_python_dispatcher"),
    "is_traceable_wrapper_subclass": ("torch.utils._python_dispatch", "is_traceable_wrapper_subclass"),
    "disable_current_modes": ("torch.utils._python_dispatch", "_disable_current_modes"),
})
