"""tanh-GELU family: ``F.gelu(x, approximate="tanh")`` / ``nn.GELU(approximate="tanh")`` -> one fused kernel.

After Inductor's decompositions the op is a chain of ~10 pointwise aten ops
(``0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))``); for bf16/fp16 inputs the chain is wrapped in
``convert_element_type`` to float32 and back, which is also exactly what ``gelu(x.float()).to(bf16)`` traces to.
The constants are GELU's own (not user scalars), so they stay in the pattern.

``opts.gelu_approximation``: "tanh" -> ``fusegraph.gelu_tanh`` (exact); "sigmoid" -> ``fusegraph.fast_gelu``.
``gelu(approximate="none")`` (erf) traces to a different chain and is never matched.
"""
import torch
import torch.nn.functional as F
from ._trace import fwd_only_canonical

from . import _anchors
from ._family import Candidate, Family, Form, overload, register_forms
from ._lowering import ROW, compute_dtype

# Reduced-precision patterns first: their root (the cast back) comes after the float32 chain they contain.
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _search(x):
    return F.gelu(x, approximate="tanh")


def _replace_tanh(x):
    return torch.ops.fusegraph.gelu_tanh(x)


def _replace_sigmoid(x):
    return torch.ops.fusegraph.fast_gelu(x)


def _input_dtype_is(dtype):
    """The cast-wrapped patterns say nothing about x's own dtype: the kernel's output dtype is x's, so it must be
    the dtype the pattern casts back to."""

    def check(match) -> bool:
        val = match.kwargs["x"].meta.get("val") if hasattr(match.kwargs["x"], "meta") else None
        return val is not None and val.dtype == dtype

    return check


def _examples(dtype):
    return [[torch.empty(8, 16, dtype=dtype)]]


def _check_of(inputs):
    return _input_dtype_is(inputs[0].dtype)


# One record per replacement (``opts.gelu_approximation`` picks one); registered per dtype.
FORMS = {
    "tanh": (Form(_search, _replace_tanh, _examples, check_of=_check_of),),
    "sigmoid": (Form(_search, _replace_sigmoid, _examples, check_of=_check_of),),
}


def register(pm, opts) -> None:
    forms = FORMS["sigmoid" if opts.gelu_approximation == "sigmoid" else "tanh"]
    for dtype in _DTYPES:
        register_forms(pm, forms, dtype, trace_fn=fwd_only_canonical)


# ---- lowering, calibration, explain ------------------------------------------------------------------


def lower_tanh(out_dtype, x):
    """``fusegraph.gelu_tanh`` in torch ops."""
    return torch.nn.functional.gelu(x.to(compute_dtype(x)), approximate="tanh").to(out_dtype)


def lower_sigmoid(out_dtype, x):
    """``fusegraph.fast_gelu`` in torch ops."""
    xf = x.to(compute_dtype(x))
    return (xf * torch.sigmoid(1.702 * xf)).to(out_dtype)


def _calibration_site(numel, rnd):
    return overload("gelu_tanh.default"), (rnd(max(numel // ROW, 1), ROW),), {}


def _anchor(node):
    aten = _anchors.aten
    # tanh-GELU's tanh feeds ``1 + tanh(...)``; a tanh gate (Mochi, Lumina2) is no GELU
    if _anchors.is_op(node, aten.tanh.default) and any(_anchors.is_op(u, aten.add.Tensor) and 1 in u.args
                                                       for u in node.users):
        return "tanh"
    if _anchors.is_op(node, aten.gelu.default) and node.kwargs.get("approximate") == "tanh":
        return "gelu(tanh)"
    return None


FAMILY = Family("gelu", "enable_fast_gelu", register, options=("gelu_approximation",),
                ops=("gelu_tanh.default", "fast_gelu.default"),
                lowerings={"gelu_tanh.default": lower_tanh, "fast_gelu.default": lower_sigmoid},
                calibration=_calibration_site, candidates=(Candidate(_anchor),),
                forms=FORMS["tanh"] + FORMS["sigmoid"])
