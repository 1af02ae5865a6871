"""GELU variants: ``gelu_tanh`` (exact tanh approximation) and ``fast_gelu`` (sigmoid form)."""
import torch

from ._autograd import compute_dtype, register as register_autograd
from ._checks import check_float_tensor


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    r"""tanh-approximated GELU, exactly ``F.gelu(x, approximate="tanh")``:

    .. math:: y = \tfrac12 x \left(1 + \tanh\!\left(\sqrt{2/\pi}\,(x + 0.044715\,x^3)\right)\right)

    computed in float32, rounded once to ``x.dtype``. Output is contiguous with ``x``'s shape. float64 ``x``:
    the same math in float64 (plain torch ops). Differentiable: eager's gradient (``gelu_backward``) in float32,
    returned in ``x.dtype``.
    """
    return torch.ops.fusegraph.gelu_tanh(x)


def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    r"""Sigmoid GELU (the NPU "fast gelu"): :math:`y = x\,\sigma(1.702\,x)`, float32 math, one rounding.

    Differs from exact GELU by up to about 0.02; the fusion pass uses it only when
    ``fusion_patterns.gelu_approximation == "sigmoid"``. float64 ``x``: the same math in float64 (plain torch
    ops). Differentiable: :math:`dx = g\,(\sigma + 1.702\,x\,\sigma(1 - \sigma))` in float32, in ``x.dtype``.
    """
    return torch.ops.fusegraph.fast_gelu(x)


@torch.library.register_fake("fusegraph::gelu_tanh")
def _gelu_tanh_fake(x):
    check_float_tensor(x, "gelu_tanh", "x")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusegraph::fast_gelu")
def _fast_gelu_fake(x):
    check_float_tensor(x, "fast_gelu", "x")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


# --- gradients (plain torch ops in float32, float64 for float64 x; returned in x.dtype) ---------------------

def _gelu_setup_context(ctx, inputs, output):
    (x,) = inputs
    ctx.save_for_backward(x)


def _gelu_tanh_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    ct = compute_dtype(x, grad)
    return torch.ops.aten.gelu_backward(grad.to(ct), x.to(ct), approximate="tanh").to(x.dtype)


def _fast_gelu_backward(ctx, grad):
    (x,) = ctx.saved_tensors
    ct = compute_dtype(x, grad)
    xc = x.to(ct)
    s = torch.sigmoid(1.702 * xc)
    return (grad.to(ct) * (s + 1.702 * xc * s * (1 - s))).to(x.dtype)


register_autograd("fusegraph::gelu_tanh", _gelu_tanh_backward, setup_context=_gelu_setup_context)
register_autograd("fusegraph::fast_gelu", _fast_gelu_backward, setup_context=_gelu_setup_context)
