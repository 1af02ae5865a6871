"""Mul+Add family: ``a * b + c`` -> ``fusegraph.mul_add`` (one read of each input, one write).

Source forms (SPEC §3):
- ``residual + gate.unsqueeze(1) * y`` (Flux/SD3 gated residuals; ``gate`` a chunk view): ``add(c, mul(a, b))``;
- ``x * scalar + y`` for any scalar: ``add(mul(x, scalar), y)``; the scalar is a wildcard of the pattern, captured
  at match time and passed on (never baked in);
- Wan's ``(h.float() + y.float() * gate).type_as(h)``: casts to float32 around the chain and back; replaced by
  ``mul_add(y, gate, h, out_dtype=h.dtype)``, which does the same float32 math and rounds once.

Plain forms fuse only when every tensor operand has the result's dtype (mixed-dtype promotion rounds the
product first in eager, which one fused rounding would not reproduce). ``add(..., alpha=k)`` never matches.
"""
import logging
import numbers

import torch
from ..._core.torch_pattern_matcher import fwd_only, register_replacement

log = logging.getLogger("fusegraph")
_FLOAT = (torch.float32, torch.bfloat16, torch.float16)
_SCALAR_MAGIC = 0.7853981633974483  # an unlikely literal: every occurrence in the traced pattern becomes a wildcard


def _val(x):
    return x.meta.get("val") if isinstance(x, torch.fx.Node) else None


def _tensor_of(x, dtype) -> bool:
    v = _val(x)
    return isinstance(v, torch.Tensor) and v.dtype == dtype


def _same_dtype_check(tensor_names, scalar_name=None):
    def check(match) -> bool:
        first = _val(match.kwargs[tensor_names[0]])
        if not isinstance(first, torch.Tensor) or first.dtype not in _FLOAT:
            return False
        if not all(_tensor_of(match.kwargs[n], first.dtype) for n in tensor_names):
            return False
        if scalar_name is not None:
            # ``x * 1 + y`` is ``x + y``: no product to fuse (Inductor's decomposition of a one-row addmm writes
            # ``sum(...) * 1 + bias``, which is a linear, not a site)
            s = match.kwargs[scalar_name]
            return isinstance(s, numbers.Real) and not isinstance(s, bool) and s != 1
        return True

    return check


# Tensor gate: a * b + c and c + a * b (the add's operand order is kept by tracing, so both are registered).
def _mul_then_add(a, b, c):
    return a * b + c


def _add_of_mul(a, b, c):
    return c + a * b


def _replace_tensor(a, b, c):
    return torch.ops.fusegraph.mul_add(a, b, c)


# Python scalar: x * s + y and y + x * s.
def _scalar_mul_then_add(x, y, scalar):
    return x * scalar + y


def _scalar_add_of_mul(x, y, scalar):
    return y + x * scalar


def _replace_scalar(x, y, scalar):
    return torch.ops.fusegraph.mul_add.Scalar(x, scalar, y)


# Wan: (h.float() + y.float() * gate).type_as(h), gate float32 (or h's dtype).
def _wan(h, y, gate):
    return (h.float() + y.float() * gate).type_as(h)


def _replace_wan(h, y, gate):
    return torch.ops.fusegraph.mul_add(y, gate, h, out_dtype=h.dtype)


def _wan_check(dtype):
    def check(match) -> bool:
        h, y, gate = (_val(match.kwargs[n]) for n in ("h", "y", "gate"))
        if not all(isinstance(v, torch.Tensor) for v in (h, y, gate)):
            return False
        return h.dtype == dtype and y.dtype == dtype and gate.dtype in (torch.float32, dtype)

    return check


def _op_traceable():
    """None when the fused op can be traced (it has a fake kernel), else why not."""
    try:
        x = torch.empty(2, 3, 8)
        torch.ops.fusegraph.mul_add(x, x, x)
        torch.ops.fusegraph.mul_add.Scalar(x, 0.5, x)
        return None
    except (NotImplementedError, RuntimeError) as e:
        return f"{type(e).__name__}: {e}"


def register(pm, opts) -> None:
    why = _op_traceable()
    if why is not None:
        log.warning("fusegraph: mul_add patterns not registered: torch.ops.fusegraph.mul_add cannot be traced (%s)",
                    why)
        return
    # Wan's cast-wrapped form first: its root (the cast back) is visited before the float32 add it contains.
    # Distinct example tensors for distinct arguments: tracing one tensor twice would tie the wildcards together.
    for dtype in (torch.bfloat16, torch.float16):
        h, y = torch.empty(2, 3, 8, dtype=dtype), torch.empty(2, 3, 8, dtype=dtype)
        gate = torch.empty(2, 1, 8, dtype=torch.float32)
        register_replacement(_wan, _replace_wan, [h, y, gate], fwd_only, pm, extra_check=_wan_check(dtype),
                             skip_duplicates=True)

    x, y = torch.empty(2, 3, 8), torch.empty(2, 3, 8)
    for search in (_scalar_mul_then_add, _scalar_add_of_mul):
        register_replacement(search, _replace_scalar, [x, y], fwd_only, pm,
                             extra_check=_same_dtype_check(("x", "y"), "scalar"),
                             scalar_workaround={"scalar": _SCALAR_MAGIC}, skip_duplicates=True)

    g = torch.empty(2, 1, 8)
    for search in (_mul_then_add, _add_of_mul):
        register_replacement(search, _replace_tensor, [x, g, y], fwd_only, pm,
                             extra_check=_same_dtype_check(("a", "b", "c")), skip_duplicates=True)
