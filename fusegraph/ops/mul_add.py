"""Fused multiply-add with broadcasting (``mul_add``): the gated residual and ``x * scalar + y``."""
from numbers import Number

import torch

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
    """
    if isinstance(b, torch.Tensor):
        return torch.ops.fusegraph.mul_add(a, b, c, out_dtype=out_dtype)
    if isinstance(b, (Number, torch.SymInt, torch.SymFloat, torch.SymBool)):
        return torch.ops.fusegraph.mul_add.Scalar(a, b, c, out_dtype=out_dtype)
    raise TypeError(f"fusegraph.mul_add: argument 'b' has type {type(b).__name__}; expected a tensor or a number")


class _Promoted:
    """The dtype eager `x op y` gives for float tensors: a dimensioned tensor's dtype wins over a zero-dim one's."""

    def __init__(self, dtype: torch.dtype, zero_dim: bool):
        self.dtype, self.zero_dim = dtype, zero_dim

    @staticmethod
    def of(t: torch.Tensor) -> "_Promoted":
        return _Promoted(t.dtype, t.dim() == 0)

    def __mul__(self, other: "_Promoted") -> "_Promoted":
        if self.zero_dim == other.zero_dim:
            return _Promoted(torch.promote_types(self.dtype, other.dtype), self.zero_dim)
        return other if self.zero_dim else self


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
    dtype = out_dtype or (_Promoted.of(a) * _Promoted.of(b) * _Promoted.of(c)).dtype
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
    dtype = out_dtype or (_Promoted.of(a) * _Promoted.of(c)).dtype
    return a.new_empty(shape, dtype=dtype)
