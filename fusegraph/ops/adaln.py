"""Adaptive norm modulation: the DiT ``norm(x) * (1 + scale) + shift``, LayerNorm or RMSNorm, shift optional."""
from __future__ import annotations

import torch

from ._autograd import compute_dtype, grad_like, needs_input_grad, rows_sum, sum_to, register as register_autograd
from ._checks import (check_eps, check_eps_tensor, check_float_tensor, check_out_dtype, check_row_param,
                      check_same_device)

NORMS = ("layer", "rms")


def adaln(x: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor | None = None, eps: float | torch.Tensor = 1e-6,
          weight: torch.Tensor | None = None, bias: torch.Tensor | None = None, *,
          out_dtype: torch.dtype | None = None, norm: str = "layer") -> torch.Tensor:
    r"""A norm over the last dim :math:`D`, then modulation:

    .. math::
        y = (n\,w + b)\,(1 + \mathrm{scale}) + \mathrm{shift}

    with, for ``norm="layer"`` (LayerNorm, biased variance)

    .. math::
        \mu = \tfrac1D \textstyle\sum_j x_j,\quad
        \sigma^2 = \tfrac1D \textstyle\sum_j (x_j - \mu)^2,\quad
        n = \frac{x - \mu}{\sqrt{\sigma^2 + \epsilon}}

    and for ``norm="rms"`` (RMSNorm, as :func:`fusegraph.ops.rms_norm` computes it: mean of squares and ``+ eps``
    in float32) :math:`n = x / \sqrt{\tfrac1D \sum_j x_j^2 + \epsilon}`.

    i.e. ``layer_norm(x, [D], weight, bias, eps) * (1 + scale) + shift``, or ``(torch.rms_norm(x, [D], None, eps)
    * weight + bias) * (1 + scale) + shift``, all in float32, rounded once. ``shift=None``: no shift term
    (``norm(x) * (1 + scale)``: Lumina's ``LuminaRMSNormZero``, Mochi, Z-Image). ``x`` has rank >= 2 (usually
    ``[B, S, D]``); ``scale`` and ``shift`` broadcast to it with last dim ``D`` (``[B, 1, D]`` views from
    ``emb.chunk(6, dim=1)[i][:, None]`` are read in place, as are per-token ``[B, S, D]``, ``[D]`` and
    ``[1, 1, D]``). ``weight``/``bias`` are ``[D]`` or None.

    Output dtype: ``out_dtype`` if given, else what eager gives for the unfused expression: ``torch.result_type``
    over ``x, scale, shift`` and, for ``norm="rms"`` (whose affine is a product), ``weight, bias``, those given.
    For ``norm="layer"`` the affine is inside ``layer_norm``, whose result has ``x``'s dtype (a float32 weight on
    bf16 ``x`` is eager's mixed-dtype LayerNorm). Wan's
    ``(LayerNorm(x.float()) * (1 + scale) + shift).type_as(x)`` is ``adaln(x, scale, shift, out_dtype=x.dtype)``.
    Output is contiguous with ``x``'s shape.

    float64: when any tensor argument or ``out_dtype`` is float64 the same math runs in float64 with plain
    torch ops (not the fused kernel).

    Differentiable in ``x``, ``scale``, ``shift``, ``weight`` and ``bias``: eager's gradients, computed with plain
    torch ops in float32 (float64 for float64 arguments), each returned in its argument's dtype and shape
    (summed over the dims a ``[B, 1, D]`` or ``[D]`` modulation was broadcast along).

    ``eps`` may be a 0-d floating-point CPU tensor, read at each call (the ``adaln.eps_tensor`` overload; see
    :func:`fusegraph.ops.rms_norm`).
    """
    if isinstance(eps, torch.Tensor):
        return torch.ops.fusegraph.adaln.eps_tensor(x, scale, shift, eps, weight=weight, bias=bias,
                                                    out_dtype=out_dtype, norm=norm)
    return torch.ops.fusegraph.adaln(x, scale, shift, eps, weight=weight, bias=bias, out_dtype=out_dtype, norm=norm)


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


def check_adaln_norm(norm) -> None:
    if norm not in NORMS:
        raise ValueError(f"fusegraph.adaln: argument 'norm' is \"{norm}\"; expected \"layer\" or \"rms\"")


def check_adaln_args(x, scale, shift, eps, weight, bias, out_dtype, norm="layer") -> torch.dtype:
    """Same checks and output-dtype rule as ``check_adaln_args`` in C++."""
    check_float_tensor(x, "adaln", "x")
    if x.dim() < 2:
        raise RuntimeError(
            f"fusegraph.adaln: argument 'x' has shape {list(x.shape)} ({x.dim()} dims); "
            "expected at least 2 dims, e.g. [B, S, D]"
        )
    _check_modulation(x, scale, "scale")
    if shift is not None:
        _check_modulation(x, shift, "shift")
    if weight is not None:
        check_row_param(x, weight, "adaln", "weight")
    if bias is not None:
        check_row_param(x, bias, "adaln", "bias")
    if isinstance(eps, torch.Tensor):
        check_eps_tensor(eps, "adaln")
    else:
        check_eps(eps, "adaln")
    check_out_dtype(out_dtype, "adaln")
    if out_dtype is not None:
        return out_dtype
    dtype = x.dtype
    # layer_norm(x, [D], weight, bias) has x's dtype; rms_norm(x) * weight + bias promotes
    for t in (scale, shift) if norm == "layer" else (scale, shift, weight, bias):
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


@torch.library.register_fake("fusegraph::adaln")
def _adaln_fake(x, scale, shift=None, eps=1e-6, weight=None, bias=None, *, out_dtype=None, norm="layer"):
    check_adaln_norm(norm)
    dtype = check_adaln_args(x, scale, shift, eps, weight, bias, out_dtype, norm)
    return torch.empty_like(x, dtype=dtype, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusegraph::adaln.eps_tensor")
def _adaln_eps_tensor_fake(x, scale, shift, eps, weight=None, bias=None, *, out_dtype=None, norm="layer"):
    return _adaln_fake(x, scale, shift, eps, weight, bias, out_dtype=out_dtype, norm=norm)


# --- gradients: y = a * (1 + scale) + shift, a = n * w + b -------------------------------------------------
# layer: n = (x - mean) * r, r = (var + eps)^-1/2; rms: n = x * r, r = (mean(x^2) + eps)^-1/2.
# dshift = g, dscale = g * a, gz = g * (1 + scale), dw = sum_rows(gz * n), db = sum_rows(gz), gl = gz * w,
# dx = r * (gl - mean(gl) - n * mean(gl * n)) (layer), r * (gl - n * mean(gl * n)) (rms);
# modulation grads summed to their shapes. No shift: no dshift.

def _adaln_setup_context(ctx, inputs, keyword_only_inputs, output):
    x, scale, shift, eps, weight, bias = inputs
    ctx.save_for_backward(x, scale, weight, bias)
    ctx.eps = eps
    ctx.norm = keyword_only_inputs.get("norm", "layer")
    ctx.shift_meta = (shift.shape, shift.dtype) if shift is not None else None


def _adaln_backward(ctx, grad):
    x, scale, weight, bias = ctx.saved_tensors
    need_x, need_scale, need_shift, _, need_w, need_b = needs_input_grad(ctx, 6)
    shift_meta = ctx.shift_meta
    ct = compute_dtype(x, scale, weight, bias, grad, shift_meta[1] if shift_meta is not None else None)
    g = grad.to(ct)
    xc = x.to(ct)
    rms = ctx.norm == "rms"
    if rms:
        # as the forward: mean of squares + eps in the math dtype
        rstd = torch.rsqrt(xc.square().mean(-1, keepdim=True) + ctx.eps)
        n = xc * rstd
    else:
        xm = xc - xc.mean(-1, keepdim=True)
        rstd = torch.rsqrt(xm.square().mean(-1, keepdim=True) + ctx.eps)
        n = xm * rstd
    dx = dscale = dshift = dw = db = None
    if need_shift and shift_meta is not None:
        dshift = sum_to(g, *shift_meta)
    if need_scale:
        a = n * weight.to(ct) if weight is not None else n
        a = a + bias.to(ct) if bias is not None else a
        dscale = grad_like(g * a, scale)
    gz = g * (1 + scale.to(ct))
    if need_w and weight is not None:
        dw = rows_sum(gz * n).to(weight.dtype)
    if need_b and bias is not None:
        db = rows_sum(gz).to(bias.dtype)
    if need_x:
        gl = gz * weight.to(ct) if weight is not None else gz
        proj = n * (gl * n).mean(-1, keepdim=True)
        dx = (rstd * (gl - proj if rms else gl - gl.mean(-1, keepdim=True) - proj)).to(x.dtype)
    return dx, dscale, dshift, None, dw, db


register_autograd("fusegraph::adaln", _adaln_backward, setup_context=_adaln_setup_context)
register_autograd("fusegraph::adaln.eps_tensor", _adaln_backward, setup_context=_adaln_setup_context)
