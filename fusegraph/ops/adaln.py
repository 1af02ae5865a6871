"""Adaptive LayerNorm modulation (the DiT ``norm(x) * (1 + scale) + shift``)."""
from __future__ import annotations

import torch

from ._autograd import compute_dtype, grad_like, needs_input_grad, rows_sum, sum_to, register as register_autograd
from ._checks import check_eps, check_float_tensor, check_out_dtype, check_same_device


def adaln(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor, eps: float = 1e-6, *,
          weight: torch.Tensor | None = None, bias: torch.Tensor | None = None,
          out_dtype: torch.dtype | None = None) -> torch.Tensor:
    r"""LayerNorm over the last dim :math:`D`, then modulation:

    .. math::
        \mu = \tfrac1D \textstyle\sum_j x_j,\quad
        \sigma^2 = \tfrac1D \textstyle\sum_j (x_j - \mu)^2,\quad
        y = \left(\frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}}\,w + b\right)(1 + \mathrm{scale}) + \mathrm{shift}

    i.e. ``layer_norm(x, [D], weight, bias, eps) * (1 + scale) + shift``, all in float32, rounded once.
    ``x`` has rank >= 2 (usually ``[B, S, D]``); ``scale`` and ``shift`` broadcast to it with last dim
    ``D`` (``[B, 1, D]`` views from ``emb.chunk(6, dim=1)[i][:, None]`` are read in place, as are
    per-token ``[B, S, D]``, ``[D]`` and ``[1, 1, D]``). ``weight``/``bias`` are ``[D]`` or None.

    Output dtype: ``out_dtype`` if given, else what eager gives for the unfused expression
    (``torch.result_type`` over ``x, scale, shift, weight, bias``). Wan's
    ``(LayerNorm(x.float()) * (1 + scale) + shift).type_as(x)`` is ``adaln(x, scale, shift, out_dtype=x.dtype)``.
    Output is contiguous with ``x``'s shape.

    float64: when any tensor argument or ``out_dtype`` is float64 the same math runs in float64 with plain
    torch ops (not the fused kernel).

    Differentiable in ``x``, ``scale``, ``shift``, ``weight`` and ``bias``: eager's gradients, computed with plain
    torch ops in float32 (float64 for float64 arguments), each returned in its argument's dtype and shape
    (summed over the dims a ``[B, 1, D]`` or ``[D]`` modulation was broadcast along).
    """
    return torch.ops.fusegraph.adaln(x, scale, shift, eps, weight=weight, bias=bias, out_dtype=out_dtype)


def _check_param(x: torch.Tensor, p: torch.Tensor, arg: str) -> None:
    check_float_tensor(p, "adaln", arg)
    check_same_device(x, "x", p, "adaln", arg)
    D = x.shape[-1]
    if p.dim() != 1 or p.shape[0] != D:
        raise RuntimeError(
            f"fusegraph.adaln: argument '{arg}' has shape {list(p.shape)}; expected [{D}] "
            f"(x's last dim; x has shape {list(x.shape)})"
        )


def _check_modulation(x: torch.Tensor, m: torch.Tensor, arg: str) -> None:
    check_float_tensor(m, "adaln", arg)
    check_same_device(x, "x", m, "adaln", arg)
    D = x.shape[-1]
    if m.dim() < 1 or m.shape[-1] != D:
        raise RuntimeError(
            f"fusegraph.adaln: argument '{arg}' has shape {list(m.shape)}; expected its last dim to be {D} "
            f"(x's last dim; x has shape {list(x.shape)})"
        )
    ok = m.dim() <= x.dim() and all(m.shape[-i] == 1 or m.shape[-i] == x.shape[-i] for i in range(1, m.dim() + 1))
    if not ok:
        raise RuntimeError(
            f"fusegraph.adaln: argument '{arg}' has shape {list(m.shape)}, which does not broadcast to x's shape "
            f"{list(x.shape)}; expected at most {x.dim()} dims, each 1 or equal to x's (e.g. [B, 1, D] or [B, S, D])"
        )


def check_adaln_args(x, scale, shift, eps, weight, bias, out_dtype) -> torch.dtype:
    """Same checks and output-dtype rule as ``check_adaln_args`` in C++."""
    check_float_tensor(x, "adaln", "x")
    if x.dim() < 2:
        raise RuntimeError(
            f"fusegraph.adaln: argument 'x' has shape {list(x.shape)} ({x.dim()} dims); "
            "expected at least 2 dims, e.g. [B, S, D]"
        )
    _check_modulation(x, scale, "scale")
    _check_modulation(x, shift, "shift")
    if weight is not None:
        _check_param(x, weight, "weight")
    if bias is not None:
        _check_param(x, bias, "bias")
    check_eps(eps, "adaln")
    check_out_dtype(out_dtype, "adaln")
    if out_dtype is not None:
        return out_dtype
    dtype = torch.promote_types(x.dtype, torch.promote_types(scale.dtype, shift.dtype))
    for p in (weight, bias):
        if p is not None:
            dtype = torch.promote_types(dtype, p.dtype)
    return dtype


@torch.library.register_fake("fusegraph::adaln")
def _adaln_fake(x, scale, shift, eps=1e-6, weight=None, bias=None, *, out_dtype=None):
    dtype = check_adaln_args(x, scale, shift, eps, weight, bias, out_dtype)
    return torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)


# --- gradients: y = a * (1 + scale) + shift, a = ln * w + b, ln = (x - mean) * r, r = (var + eps)^-1/2 ------
# dshift = g, dscale = g * a, gz = g * (1 + scale), dw = sum_rows(gz * ln), db = sum_rows(gz),
# dx = r * (gl - mean(gl) - ln * mean(gl * ln)) with gl = gz * w; modulation grads summed to their shapes.

def _adaln_setup_context(ctx, inputs, keyword_only_inputs, output):
    x, scale, shift, eps, weight, bias = inputs
    ctx.save_for_backward(x, scale, weight, bias)
    ctx.eps = eps
    ctx.shift_meta = (shift.shape, shift.dtype)


def _adaln_backward(ctx, grad):
    x, scale, weight, bias = ctx.saved_tensors
    need_x, need_scale, need_shift, _, need_w, need_b = needs_input_grad(ctx, 6)
    shift_shape, shift_dtype = ctx.shift_meta
    ct = compute_dtype(x, scale, weight, bias, grad, shift_dtype)
    g = grad.to(ct)
    xc = x.to(ct)
    xm = xc - xc.mean(-1, keepdim=True)
    rstd = torch.rsqrt(xm.square().mean(-1, keepdim=True) + ctx.eps)
    ln = xm * rstd
    dx = dscale = dshift = dw = db = None
    if need_shift:
        dshift = sum_to(g, shift_shape, shift_dtype)
    if need_scale:
        a = ln * weight.to(ct) if weight is not None else ln
        a = a + bias.to(ct) if bias is not None else a
        dscale = grad_like(g * a, scale)
    gz = g * (1 + scale.to(ct))
    if need_w and weight is not None:
        dw = rows_sum(gz * ln).to(weight.dtype)
    if need_b and bias is not None:
        db = rows_sum(gz).to(bias.dtype)
    if need_x:
        gl = gz * weight.to(ct) if weight is not None else gz
        dx = (rstd * (gl - gl.mean(-1, keepdim=True) - ln * (gl * ln).mean(-1, keepdim=True))).to(x.dtype)
    return dx, dscale, dshift, None, dw, db


register_autograd("fusegraph::adaln", _adaln_backward, setup_context=_adaln_setup_context)
