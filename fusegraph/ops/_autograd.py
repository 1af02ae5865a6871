"""The ops' gradients: each op module registers its formula here (``register``: ``setup_context`` and
``backward`` with ``torch.library.register_autograd``'s signatures), and shared pieces of the formulas.

The check whether a call needs gradients runs on every call, so it is C++: one Autograd kernel for every
fusegraph op (csrc/ops/autograd.cpp) redispatches below autograd when grad mode is off or no tensor argument
requires grad, and otherwise calls ``apply`` here, which runs a ``torch.autograd.Function`` around the op.
(``torch.library.register_autograd`` makes that same check in Python: ~3 µs on every call, under no_grad too.)

The backward formulas are plain torch ops, not fused kernels: they compute in float32 (float64 when any
tensor argument is float64) and return each gradient in its argument's dtype and shape (broadcast dims summed).
"""
from __future__ import annotations

import torch

from .._core.torch_dispatcher import AutoDispatchBelowAutograd


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
    flags = tuple(ctx.needs_input_grad)[:n]  # apply() adds one input of its own (the keyword-only arguments)
    return flags + (False,) * (n - len(flags))


# --- the autograd path (called by csrc/ops/autograd.cpp) -------------------------------------------------------

_FUNCTIONS: dict = {}  # (schema name, overload name) -> (autograd.Function class, positional count, kw-only names)


class _KeywordOnly:
    """The keyword-only arguments, as one non-tensor input of the autograd.Function."""

    __slots__ = ("values",)

    def __init__(self, values: dict):
        self.values = values


def register(qualname: str, backward, *, setup_context) -> None:
    """``torch.library.register_autograd``'s contract for a fusegraph op (``"fusegraph::rms_norm"``,
    ``"fusegraph::mul_add.Scalar"``): ``setup_context(ctx, inputs, [keyword_only_inputs,] output)`` and
    ``backward(ctx, *grads)`` returning one gradient per positional argument."""
    name, _, overload = qualname.partition(".")
    packet = getattr(torch.ops.fusegraph, name.split("::")[1])
    op = getattr(packet, overload or "default")
    arguments = op._schema.arguments
    positional = sum(1 for a in arguments if not a.kwarg_only)
    kw_names = tuple(a.name for a in arguments if a.kwarg_only)

    def forward(*inputs):
        *args, kw = inputs
        with AutoDispatchBelowAutograd():
            return op(*args, **kw.values)

    def setup(ctx, inputs, output):
        *args, kw = inputs
        if kw_names:
            setup_context(ctx, tuple(args), dict(kw.values), output)
        else:
            setup_context(ctx, tuple(args), output)

    def grads(ctx, *grad_outputs):
        out = backward(ctx, *grad_outputs)
        return (tuple(out) if isinstance(out, tuple) else (out,)) + (None,)

    # named per op, so the grad_fn reads e.g. "rms_norm_Backward"
    Function = type(f"{name.split('::')[1]}{'_' + overload if overload else ''}_", (torch.autograd.Function,),
                    {"forward": staticmethod(forward), "setup_context": staticmethod(setup),
                     "backward": staticmethod(grads)})
    _FUNCTIONS[(name, overload)] = (Function, positional, kw_names)


def apply(name: str, overload: str, args: list):
    """Runs the op ``name.overload`` on every argument of its schema (in order) with autograd."""
    # The op modules register on import; importing this module imports the package fusegraph.ops, and so all of them.
    try:
        function, positional, kw_names = _FUNCTIONS[(name, overload)]
    except KeyError:
        raise RuntimeError(f"fusegraph: no gradient formula is registered for fusegraph::{name}.{overload}") from None
    kw = _KeywordOnly(dict(zip(kw_names, args[positional:])))
    return function.apply(*args[:positional], kw)
