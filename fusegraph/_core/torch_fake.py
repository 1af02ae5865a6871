"""Adaptor for fake tensors and the tracing context: ``torch._subclasses.fake_tensor``, ``torch._guards``, the
Python dispatcher and ``torch.utils._python_dispatch``'s modes. (Dynamo, imported with fusegraph, imports them all:
bound eagerly.)"""
from __future__ import annotations

from torch._dispatch.python import enable_python_dispatcher  # noqa: F401
from torch._guards import TracingContext, detect_fake_mode, tracing  # noqa: F401
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode, unset_fake_temporarily  # noqa: F401
from torch.utils._python_dispatch import _disable_current_modes as disable_current_modes  # noqa: F401
from torch.utils._python_dispatch import is_traceable_wrapper_subclass  # noqa: F401
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: F401
