"""Adaptor for the dispatcher's Python face: ``torch._ops`` (op overloads), ``torch._C`` (schema types, the
autograd guard, the Python dispatcher's off switch, the tensor ``data`` descriptor), ``torch._library``, the private ops fusegraph calls
(``torch._foreach_copy_``, ``torch._debug_has_internal_overlap``) and ``torch.utils._pytree``."""
from __future__ import annotations

import torch
import torch.utils._pytree as pytree  # noqa: F401

OpOverload = torch._ops.OpOverload
OpOverloadPacket = torch._ops.OpOverloadPacket
AnyType = torch._C.AnyType
disabled_torch_function_impl = torch._C._disabled_torch_function_impl
AutoDispatchBelowAutograd = torch._C._AutoDispatchBelowAutograd
DisablePythonDispatcher = torch._C._DisablePythonDispatcher  # context: ops dispatch without the Python dispatcher
foreach_copy_ = torch._foreach_copy_
internal_overlap = torch._debug_has_internal_overlap  # 0: none, 1: yes, 2: too complex to tell


def has_kernel(op: str, dispatch_key: str) -> bool:
    """Whether the dispatcher holds a kernel of ``op`` (``"fusegraph::rms_norm"``) for ``dispatch_key`` (``"CUDA"``)."""
    return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, dispatch_key))


def single_overload(target):
    """The OpOverload a call_function target names: itself, or the only overload of a packet (freezing's
    weight-packing passes insert packets such as ``mkl._mkl_linear``); None for anything else."""
    if isinstance(target, OpOverload):
        return target
    if isinstance(target, OpOverloadPacket):
        names = target.overloads()
        if len(names) == 1:
            return getattr(target, names[0])
    return None


def is_opaque_value(value) -> bool:
    """Whether ``value`` is an opaque object a graph may take as input (``torch._library.opaque_object``); False
    where this torch has none."""
    try:
        from torch._library.opaque_object import is_opaque_value as check
    except ImportError:  # pragma: no cover - older torch
        return False
    return check(value)


def cpu_capabilities() -> dict:
    """cpuinfo's view of this CPU (``at::cpu::get_cpu_capabilities``): instruction-set names -> bool, cache sizes,
    core counts, the CPU's name."""
    return dict(torch._C._cpu._get_cpu_capability())
