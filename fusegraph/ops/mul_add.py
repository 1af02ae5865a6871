"""Fused multiply-add with broadcasting (``mul_add``): the gated residual and ``x * scalar + y``."""
from numbers import Number

import torch

from ._autograd import compute_dtype, grad_like, needs_input_grad, register as register_autograd
from ._checks import check_float_tensor, check_out_dtype, check_same_device


def mul_add(a: torch.Tensor, b, c: torch.Tensor, *, out_dtype: torch.dtype | None = None) -> torch.Tensor:
    r"""Fused multiply-add with broadcasting:

    .. math:: y = a \cdot b + c

    ``b`` is a tensor (``torch.ops.fusegraph.mul_add``) or a Python number (``mul_add.Scalar``). Inputs may
    have different float dtypes and any strides (e.g. a gate ``[B, 1, D]`` viewed out of ``chunk``); the
    output is contiguous with the broadcast shape of ``a``, ``b`` and ``c``. Math in float32 (a fused
    multiply-add), rounded once to ``out_dtype`` — by default the dtype eager ``a * b + c`` gives
    (``torch.result_type`` promotion; a number never promotes a floating tensor).

    Covers the gated residual ``residual + gate.unsqueeze(1) * y`` as ``mul_add(y, gate[:, None], residual)``
    and Wan's ``(h.float() + y.float() * gate).type_as(h)`` as
    ``mul_add(y, gate, h, out_dtype=h.dtype)``.

    float64: when any tensor argument or ``out_dtype`` is float64 the same math runs in float64 with plain torch
    ops (not the fused kernel; a number ``b`` is then not rounded to float32).

    Differentiable in ``a``, ``b`` (a tensor) and ``c``: :math:`da = g\,b`, :math:`db = g\,a`, :math:`dc = g`, each
    summed over the dims its argument was broadcast along and returned in its dtype (math in float32, float64
    for float64 arguments).
    """
    if isinstance(b, torch.Tensor):
        return torch.ops.fusegraph.mul_add(a, b, c, out_dtype=out_dtype)
    if isinstance(b, (Number, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return torch.ops.fusegraph.mul_add.Scalar(a, b, c, out_dtype=out_dtype)
    raise TypeError(f"fusegraph.mul_add: argument 'b' has type {type(b).__name__}; expected a tensor or a number")


def _result_dtype(*tensors: torch.Tensor) -> torch.dtype:
    """The dtype eager `x op y op ...` gives for float tensors, left to right: a dimensioned tensor's dtype
    wins over a zero-dim one's (same category); otherwise the two promote. As csrc/ops/mul_add.cpp."""
    dtype, zero_dim = tensors[0].dtype, tensors[0].dim() == 0
    for t in tensors[1:]:
        if zero_dim == (t.dim() == 0):
            dtype = torch.promote_types(dtype, t.dtype)
        elif zero_dim:
            dtype, zero_dim = t.dtype, False
    return dtype


def _check_broadcast(shapes) -> list:
    """The broadcast of the (name, shape) pairs, raising like csrc/ops/mul_add.cpp check_broadcast."""
    rank = max(len(s) for _, s in shapes)
    out = [1] * rank
    for d in range(rank):
        which = None
        for name, s in shapes:
            td = d - (rank - len(s))
            if td < 0 or s[td] == 1:
                continue
            if which is None:
                out[d], which = s[td], (name, s)
            elif s[td] != out[d]:
                raise RuntimeError(
                    f"fusegraph.mul_add: argument '{name}' has shape {list(s)} which does not broadcast with "
                    f"'{which[0]}' of shape {list(which[1])} (size {s[td]} vs {out[d]} at dim {d - rank}); "
                    "expected sizes equal or 1 per dim"
                )
    return out



@torch.library.register_fake("fusegraph::mul_add")
def _mul_add_fake(a, b, c, *, out_dtype=None):
    for name, t in (("a", a), ("b", b), ("c", c)):
        check_float_tensor(t, "mul_add", name)
    check_same_device(a, "a", b, "mul_add", "b")
    check_same_device(a, "a", c, "mul_add", "c")
    shape = _check_broadcast((("a", a.shape), ("b", b.shape), ("c", c.shape)))
    check_out_dtype(out_dtype, "mul_add")
    dtype = out_dtype or _result_dtype(a, b, c)
    return a.new_empty(shape, dtype=dtype)


@torch.library.register_fake("fusegraph::mul_add.Scalar")
def _mul_add_scalar_fake(a, b, c, *, out_dtype=None):
    check_float_tensor(a, "mul_add", "a")
    check_float_tensor(c, "mul_add", "c")
    if isinstance(b, complex):
        raise RuntimeError(
            f"fusegraph.mul_add: argument 'b' is the complex number {b}; expected a real number or a float tensor"
        )
    check_same_device(a, "a", c, "mul_add", "c")
    shape = _check_broadcast((("a", a.shape), ("b", ()), ("c", c.shape)))
    check_out_dtype(out_dtype, "mul_add")
    dtype = out_dtype or _result_dtype(a, c)
    return a.new_empty(shape, dtype=dtype)


# --- gradients: y = a * b + c (plain torch ops in float32, float64 for float64 arguments) ----------------

def _mul_add_setup_context(ctx, inputs, keyword_only_inputs, output):
    a, b, c = inputs
    ctx.save_for_backward(a, b if isinstance(b, torch.Tensor) else None, c)
    ctx.b_number = None if isinstance(b, torch.Tensor) else b


def _mul_add_backward(ctx, grad):
    a, b, c = ctx.saved_tensors
    need_a, need_b, need_c = needs_input_grad(ctx, 3)
    ct = compute_dtype(a, b, c, grad)
    g = grad.to(ct)
    da = db = dc = None
    if need_a:
        da = grad_like(g * (b.to(ct) if b is not None else ctx.b_number), a)
    if need_b and b is not None:
        db = grad_like(g * a.to(ct), b)
    if need_c:
        dc = grad_like(g, c)
    return da, db, dc


register_autograd("fusegraph::mul_add", _mul_add_backward, setup_context=_mul_add_setup_context)
register_autograd("fusegraph::mul_add.Scalar", _mul_add_backward, setup_context=_mul_add_setup_context)
