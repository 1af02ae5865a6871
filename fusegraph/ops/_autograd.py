"""Shared pieces of the ops' autograd formulas (``torch.library.register_autograd`` in each op's module).

The backward formulas are plain torch ops, not fused kernels: they compute in float32 (float64 when any
tensor argument is float64) and return each gradient in its argument's dtype and shape (broadcast dims summed).
"""
from __future__ import annotations

import torch


def compute_dtype(*tensors_or_dtypes) -> torch.dtype:
    """float64 when any given tensor (or dtype) is float64, else float32 (the ops' math dtype). None is skipped."""
    dtypes = (t.dtype if isinstance(t, torch.Tensor) else t for t in tensors_or_dtypes)
    return torch.float64 if torch.float64 in dtypes else torch.float32


def sum_to(g: torch.Tensor, shape, dtype: torch.dtype) -> torch.Tensor:
    """``g`` (the broadcast shape) summed over the dims an argument of ``shape`` was broadcast along, in ``dtype``."""
    shape = tuple(shape)
    if tuple(g.shape) != shape:
        lead = g.dim() - len(shape)
        dims = [d for d in range(g.dim()) if d < lead or (shape[d - lead] == 1 and g.shape[d] != 1)]
        if dims:
            g = g.sum(dims, keepdim=True)
        g = g.reshape(shape)
    return g.to(dtype)


def grad_like(g: torch.Tensor, arg: torch.Tensor) -> torch.Tensor:
    """:func:`sum_to` ``arg``'s shape and dtype."""
    return sum_to(g, arg.shape, arg.dtype)


def rows_sum(t: torch.Tensor) -> torch.Tensor:
    """Sum over every dim but the last (a ``[D]`` parameter's gradient)."""
    return t.sum(tuple(range(t.dim() - 1))) if t.dim() > 1 else t


def needs_input_grad(ctx, n: int) -> tuple:
    """``ctx.needs_input_grad`` padded to the op's ``n`` positional arguments: the dispatcher drops trailing
    arguments equal to their defaults (``bias=None``) before autograd sees them; their grads must be None."""
    flags = tuple(ctx.needs_input_grad)
    return flags + (False,) * (n - len(flags))
