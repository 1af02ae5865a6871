"""The math the families' lowerings share (``Family.lowerings``): each fused op as plain torch ops with the op's
exact semantics (math in float32, float64 when an argument is float64; rounded once to the op's output dtype,
which the node's "val" carries), and the calibration sites' row length."""
from __future__ import annotations

import torch

# The row length of a calibration site (``Family.calibration``): the hidden size / head dim scale of the zoo and
# the small benchmark models.
ROW = 128


def compute_dtype(*items) -> torch.dtype:
    for t in items:
        dtype = t.dtype if isinstance(t, torch.Tensor) else t
        if isinstance(dtype, torch.dtype) and dtype == torch.float64:
            return torch.float64
    return torch.float32


def _eps(eps, cd):
    """eps as the source adds it: a number, or a run-time 0-d tensor converted to the math dtype first (the graph
    Dynamo hands over converts its float64 input so; the op reads it as a double and adds it in float32)."""
    return eps.to(cd) if isinstance(eps, torch.Tensor) else eps


def rms(x, eps, cd):
    xf = x.to(cd)
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + _eps(eps, cd))


def adaln(out_dtype, x, scale, shift=None, eps=1e-6, weight=None, bias=None, *, out_dtype_arg=None, norm="layer"):
    """``fusegraph.adaln`` (the op of the adaln, adaln_rms and adaln_noshift families)."""
    cd = compute_dtype(x, scale, shift, weight, bias, out_dtype)
    if norm == "rms":
        n = rms(x, eps, cd)
    else:
        xf = x.to(cd)
        mean = xf.mean(-1, keepdim=True)
        centred = xf - mean
        n = centred * torch.rsqrt(centred.pow(2).mean(-1, keepdim=True) + _eps(eps, cd))
    if weight is not None:
        n = n * weight.to(cd)
    if bias is not None:
        n = n + bias.to(cd)
    y = n * (scale.to(cd) + 1)
    if shift is not None:
        y = y + shift.to(cd)
    return y.to(out_dtype)


def fused_adaln(x, scale, shift, eps, **kwargs):
    """``fusegraph.adaln`` in a replacement, or its ``eps_tensor`` overload for an eps read at run time (a 0-d
    tensor: ``rms_norm.runtime_eps_form``)."""
    op = torch.ops.fusegraph.adaln.eps_tensor if isinstance(eps, torch.Tensor) else torch.ops.fusegraph.adaln
    return op(x, scale, shift, eps, **kwargs)


def adaln_shift(node):
    """The shift argument of a ``fusegraph.adaln`` node (None: the no-shift modulation)."""
    return node.args[2] if len(node.args) > 2 else node.kwargs.get("shift")


def adaln_site(*, norm: str, shift: bool):
    """The calibration site of an adaln family (``Family.calibration``): a LayerNorm (``norm="layer"``) or an
    RMSNorm (``"rms"``) modulation, with or without a shift."""

    def site(numel, rnd, row=ROW):
        from ._family import overload

        rows = max(numel // row, 1)
        x = rnd(1, rows, row)
        scale, shift_ = rnd(1, 1, row), rnd(1, 1, row)
        return overload("adaln.default"), (x, scale, shift_ if shift else None, 1e-6), {"norm": norm}

    return site
