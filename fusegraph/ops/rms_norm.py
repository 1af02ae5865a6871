"""RMSNorm over the last dim, in the two flavours models use: ``torch.rms_norm`` and diffusers ``RMSNorm``."""
from __future__ import annotations

import torch

from ._autograd import compute_dtype, needs_input_grad, rows_sum, register as register_autograd
from ._checks import check_eps, check_eps_tensor, check_float_tensor, check_row_param

STYLES = ("torch", "diffusers")
_HALF = (torch.bfloat16, torch.float16)


def rms_norm(x: torch.Tensor, weight: torch.Tensor | None = None, eps: float | torch.Tensor = 1e-6, *,
             bias: torch.Tensor | None = None, style: str = "torch") -> torch.Tensor:
    r"""RMSNorm over the last dim :math:`D` of ``x`` (any rank >= 1, any strides):

    .. math:: n = x \,/\, \sqrt{\tfrac1D \textstyle\sum_j x_j^2 + \epsilon}

    with the sum, the mean and :math:`n` in float32 (``eps`` added in float32, as eager does).

    ``style="torch"`` — ``torch.rms_norm(x, [D], weight, eps)`` (+ ``bias``): :math:`y = n\,w + b`
    in float32, rounded once to ``x.dtype`` (promoted with ``bias.dtype`` when a bias is given).

    ``style="diffusers"`` — ``diffusers.models.normalization.RMSNorm.forward``:

    * fp16/bf16 ``weight``: :math:`y = \mathrm{r}(\mathrm{r}(n)\,w) + b` where :math:`\mathrm{r}` rounds
      to ``weight.dtype`` (the eager cast before the weight multiply, and the half-precision product
      before the bias add); result ``weight.dtype`` (promoted with ``bias.dtype``). Bitwise equal to
      eager whenever the float32 :math:`n` agrees.
    * float32 ``weight``: :math:`y = n\,w + b` in float32; result float32 (even for bf16 ``x``).
    * no ``weight``: :math:`y = n (+ b)`, result ``x.dtype`` (promoted with ``bias.dtype``).

    ``weight`` and ``bias`` are ``[D]``. Output is contiguous with ``x``'s shape.

    float64: when any tensor argument is float64 the same math runs in float64 (``eps`` added in float64;
    diffusers' rounding points kept) with plain torch ops, not the fused kernel; a float32 ``weight`` in
    diffusers style then gives a float64 result, as eager does.

    ``eps`` may be a 0-d floating-point CPU tensor (the ``rms_norm.eps_tensor`` overload): its value is read at
    each call, with no device sync. The fusion passes emit it for a norm whose eps Dynamo passes as an input
    (``torch.compile(dynamic=True)`` and diffusers ``RMSNorm``'s ``self.eps``).

    Differentiable in ``x``, ``weight`` and ``bias``: eager's gradients, computed with plain torch ops in
    float32 (float64 for float64 arguments), each returned in its argument's dtype.
    """
    if isinstance(eps, torch.Tensor):
        return torch.ops.fusegraph.rms_norm.eps_tensor(x, weight, eps, bias=bias, style=style)
    return torch.ops.fusegraph.rms_norm(x, weight, eps, bias=bias, style=style)


def rms_norm_out_dtype(x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None,
                       style: str) -> torch.dtype:
    """The output dtype of :func:`rms_norm` (same rule as ``check_rms_norm_args`` in C++)."""
    out = x.dtype
    if style == "diffusers" and weight is not None:
        out = weight.dtype if weight.dtype in _HALF else \
            torch.promote_types(torch.float32, torch.promote_types(x.dtype, weight.dtype))
    if bias is not None:
        out = torch.promote_types(out, bias.dtype)
    return out


def check_rms_norm_args(x, weight, eps, bias, style) -> torch.dtype:
    if style not in STYLES:
        raise ValueError(f"fusegraph.rms_norm: argument 'style' is \"{style}\"; expected \"torch\" or \"diffusers\"")
    check_float_tensor(x, "rms_norm", "x")
    if x.dim() < 1:
        raise RuntimeError(
            f"fusegraph.rms_norm: argument 'x' has shape {list(x.shape)} (0 dims); "
            "expected at least 1 dim (the normalised last dim)"
        )
    if weight is not None:
        check_row_param(x, weight, "rms_norm", "weight")
    if bias is not None:
        check_row_param(x, bias, "rms_norm", "bias")
    if isinstance(eps, torch.Tensor):
        check_eps_tensor(eps, "rms_norm")
    else:
        check_eps(eps, "rms_norm")
    return rms_norm_out_dtype(x, weight, bias, style)


@torch.library.register_fake("fusegraph::rms_norm")
def _rms_norm_fake(x, weight=None, eps=1e-6, bias=None, *, style="torch"):
    dtype = check_rms_norm_args(x, weight, eps, bias, style)
    return torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusegraph::rms_norm.eps_tensor")
def _rms_norm_eps_tensor_fake(x, weight, eps, bias=None, *, style="torch"):
    return _rms_norm_fake(x, weight, eps, bias, style=style)


# --- gradients: y = n * w + b, n = x * r, r = (mean(x^2) + eps)^-1/2 --------------------------------------
# dx = r * (gn - n * mean(gn * n)) with gn = g * w; dw = sum_rows(g * n); db = sum_rows(g). In diffusers style
# with a half weight, dw uses n rounded to weight.dtype, the value the forward multiplied (its roundings
# themselves pass gradients straight through, as eager's casts do).

def _rms_norm_setup_context(ctx, inputs, keyword_only_inputs, output):
    x, weight, eps, bias = inputs
    ctx.save_for_backward(x, weight)
    ctx.eps = eps
    ctx.bias_dtype = bias.dtype if bias is not None else None
    ctx.style = keyword_only_inputs["style"]


def _rms_norm_backward(ctx, grad):
    x, weight = ctx.saved_tensors
    ct = compute_dtype(x, weight, grad, ctx.bias_dtype)
    g = grad.to(ct)
    xc = x.to(ct)
    rstd = torch.rsqrt(xc.square().mean(-1, keepdim=True) + ctx.eps)
    n = xc * rstd
    need_x, need_w, _, need_b = needs_input_grad(ctx, 4)
    dx = dw = db = None
    gn = g
    if weight is not None:
        gn = g * weight.to(ct)
        if need_w:
            n_w = n.to(weight.dtype).to(ct) if ctx.style == "diffusers" and weight.dtype in _HALF else n
            dw = rows_sum(g * n_w).to(weight.dtype)
    if need_x:
        dx = (rstd * (gn - n * (gn * n).mean(-1, keepdim=True))).to(x.dtype)
    if need_b:
        db = rows_sum(g).to(ctx.bias_dtype)
    return dx, dw, None, db


register_autograd("fusegraph::rms_norm", _rms_norm_backward, setup_context=_rms_norm_setup_context)
# eps a 0-d tensor: ``+ ctx.eps`` adds it as the forward does (a 0-d tensor does not promote the mean)
register_autograd("fusegraph::rms_norm.eps_tensor", _rms_norm_backward, setup_context=_rms_norm_setup_context)
