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
from ._trace import fwd_only_canonical, kwarg

from . import _anchors
from ._family import Candidate, Family, Form, overload, register_forms
from ._lowering import ROW, compute_dtype

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
        # .get: torch 2.11's re-check of a match leaves a wildcard that bound a Python number unbound (no site)
        first = _val(match.kwargs.get(tensor_names[0]))
        if not isinstance(first, torch.Tensor) or first.dtype not in _FLOAT:
            return False
        if not all(_tensor_of(match.kwargs.get(n), first.dtype) for n in tensor_names):
            return False
        if scalar_name is not None:
            # ``x * 1 + y`` is ``x + y``: no product to fuse (Inductor's decomposition of a one-row addmm writes
            # ``sum(...) * 1 + bias``, which is a linear, not a site)
            s = kwarg(match, scalar_name)
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
        h, y, gate = (_val(match.kwargs.get(n)) for n in ("h", "y", "gate"))
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


def _wan_examples():
    # Distinct example tensors for distinct arguments: tracing one tensor twice would tie the wildcards together.
    return [[torch.empty(2, 3, 8, dtype=dtype), torch.empty(2, 3, 8, dtype=dtype),
             torch.empty(2, 1, 8, dtype=torch.float32)] for dtype in (torch.bfloat16, torch.float16)]


def _scalar_examples():
    return [[torch.empty(2, 3, 8), torch.empty(2, 3, 8)]]


def _tensor_examples():
    return [[torch.empty(2, 3, 8), torch.empty(2, 1, 8), torch.empty(2, 3, 8)]]


_scalar_check = _same_dtype_check(("x", "y"), "scalar")
_tensor_check = _same_dtype_check(("a", "b", "c"))

# Wan's cast-wrapped form first: its root (the cast back) is visited before the float32 add it contains.
FORMS = (
    Form(_wan, _replace_wan, _wan_examples, check_of=lambda inputs: _wan_check(inputs[0].dtype)),
    Form(_scalar_mul_then_add, _replace_scalar, _scalar_examples, check=_scalar_check,
         scalars={"scalar": _SCALAR_MAGIC}),
    Form(_scalar_add_of_mul, _replace_scalar, _scalar_examples, check=_scalar_check,
         scalars={"scalar": _SCALAR_MAGIC}),
    Form(_mul_then_add, _replace_tensor, _tensor_examples, check=_tensor_check),
    Form(_add_of_mul, _replace_tensor, _tensor_examples, check=_tensor_check),
)


def register(pm, opts) -> None:
    why = _op_traceable()
    if why is not None:
        log.warning("fusegraph: mul_add patterns not registered: torch.ops.fusegraph.mul_add cannot be traced (%s)",
                    why)
        return
    register_forms(pm, FORMS, trace_fn=fwd_only_canonical)


# ---- lowering, calibration, explain ------------------------------------------------------------------


def lower(out_dtype, a, b, c, *, out_dtype_arg=None):
    """``fusegraph.mul_add`` (both overloads: ``b`` a tensor or a scalar) in torch ops."""
    cd = compute_dtype(a, b, c, out_dtype)
    bb = b.to(cd) if isinstance(b, torch.Tensor) else b
    return (a.to(cd) * bb + c.to(cd)).to(out_dtype)


def _calibration_site(numel, rnd):
    rows = max(numel // ROW, 1)
    return overload("mul_add.default"), (rnd(1, rows, ROW), rnd(1, 1, ROW), rnd(1, rows, ROW)), {}


def _anchor(node):
    aten = _anchors.aten
    val = node.meta.get("val")
    if not _anchors.is_op(node, aten.add.Tensor) or not (isinstance(val, torch.Tensor) and val.is_floating_point()):
        return None  # integer index arithmetic (position ids) is no fusion target
    operands = node.args[:2]  # a tensor added: ``x * s + 1.0`` is no mul_add site
    if not all(isinstance(a, torch.fx.Node) for a in operands):
        return None
    # a product by 1 (``y + 1.0 * x``, a one-row addmm's decomposition) is an add, not a mul_add site
    products = [a for a in operands if _anchors.is_op(a, aten.mul.Tensor) and not any(
        isinstance(b, (int, float)) and not isinstance(b, bool) and b == 1 for b in a.args)]
    return "mul→add" if products else None


def _inner(node):
    """The add and its product: from the line of another family's candidate they are that op's inside (a
    LayerNorm's affine step, GELU's polynomial), not a site."""
    return node, next(a for a in node.args[:2] if _anchors.is_op(a, _anchors.aten.mul.Tensor))


FAMILY = Family("mul_add", "enable_mul_add", register, ops=("mul_add.default", "mul_add.Scalar"),
                lowerings={"mul_add.default": lower, "mul_add.Scalar": lower}, calibration=_calibration_site,
                candidates=(Candidate(_anchor, inner=_inner),), forms=FORMS)
