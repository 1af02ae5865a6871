"""``gemv``: a linear layer on a few rows, where reading the weight is the whole cost."""
import torch
import torch.nn.functional as F

from ._autograd import register as register_autograd
from ._checks import check_float_tensor, check_same_device


def gemv(x, weight, bias=None) -> torch.Tensor:
    r"""``F.linear(x, weight, bias)`` for an ``x`` of a few rows (a decode step's projection):

    .. math:: \mathrm{out}[m, n] = \sum_k x[m, k]\, w[n, k] + b[n]

    ``x`` ``[..., K]`` (its rows: the leading dims), ``weight`` ``[N, K]``, ``bias`` ``[N]`` or None, one dtype for
    all; sums in float32, bias added before one rounding to the output (contiguous ``[..., N]``). On CPU one
    pass over the weight rows (four at a time) for all of x's rows: bandwidth-bound, for the M <= 8 rows the
    fusion pass gives it; other devices run ``at::linear``. float64: ``at::linear`` in float64. Differentiable
    (``F.linear``'s gradient).
    """
    return torch.ops.fusegraph.gemv(x, weight, bias)


def check_args(x, weight, bias, op: str = "gemv") -> None:
    """The C++ checks (csrc/ops/gemv.cpp, gemv's and linear's), for the fake kernels."""
    check_float_tensor(x, op, "x")
    check_float_tensor(weight, op, "weight")
    if x.dim() < 1:
        raise RuntimeError(f"fusegraph.{op}: argument 'x' is a 0-dim tensor; expected [..., in_features]")
    if weight.dim() != 2 or weight.shape[1] != x.shape[-1]:
        raise RuntimeError(f"fusegraph.{op}: argument 'weight' has shape {list(weight.shape)}; expected "
                         f"[out_features, {x.shape[-1]}] (x's in_features)")
    check_same_device(x, "x", weight, op, "weight")
    if weight.dtype != x.dtype:
        raise RuntimeError(f"fusegraph.{op}: argument 'weight' has dtype {weight.dtype}; expected x's dtype {x.dtype}")
    if bias is not None:
        check_float_tensor(bias, op, "bias")
        check_same_device(x, "x", bias, op, "bias")
        if bias.dtype != x.dtype:
            raise RuntimeError(f"fusegraph.{op}: argument 'bias' has dtype {bias.dtype}; expected x's dtype {x.dtype}")
        if bias.dim() != 1 or bias.shape[0] != weight.shape[0]:
            raise RuntimeError(f"fusegraph.{op}: argument 'bias' has shape {list(bias.shape)}; expected "
                             f"[{weight.shape[0]}] (weight's out_features)")


@torch.library.register_fake("fusegraph::gemv")
def _gemv_fake(x, weight, bias=None):
    check_args(x, weight, bias)
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


def setup_context(ctx, inputs, output):
    ctx.save_for_backward(*[t for t in inputs if t is not None])
    ctx.has_bias = len(inputs) > 2 and inputs[2] is not None


def backward(ctx, grad):
    """F.linear's gradient (gemv's and linear's)."""
    inputs = [t.detach().requires_grad_() for t in ctx.saved_tensors]
    with torch.enable_grad():
        out = F.linear(*inputs)
        grads = torch.autograd.grad(out, inputs, grad, allow_unused=True)
    return tuple(grads) + (() if ctx.has_bias else (None,))


register_autograd("fusegraph::gemv", backward, setup_context=setup_context)
