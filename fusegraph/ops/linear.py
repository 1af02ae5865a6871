"""``linear``: a linear layer through oneDNN's matmul on the module's own (unpacked) weight."""
import torch

from ._autograd import register as register_autograd
from .gemv import backward, check_args, setup_context


def linear(x, weight, bias=None) -> torch.Tensor:
    r"""``F.linear(x, weight, bias)``:

    .. math:: \mathrm{out}[..., n] = \sum_k x[..., k]\, w[n, k] + b[n]

    ``x`` ``[..., K]``, ``weight`` ``[N, K]``, ``bias`` ``[N]`` or None, one dtype for all; output contiguous
    ``[..., N]``. float32 on CPU: oneDNN's matmul (``mkldnn._linear_pointwise``) on the weight as it is, no packed
    copy, so an in-place edit of the weight is read by the next call. bf16/fp16 on CPU: the operands widened to
    float32 (the weight a block of rows at a time, never a whole copy), the same float32 GEMM, the bias added in
    float32, rounded once to the dtype. The fusion pass routes large linears here for the dtypes where the table
    measured for the CPU class says this is the faster kernel (``fusegraph.fusion.patterns.linear``). Other
    devices, and a torch without oneDNN: ``at::linear``. Differentiable (``F.linear``'s gradient).
    """
    return torch.ops.fusegraph.linear(x, weight, bias)


@torch.library.register_fake("fusegraph::linear")
def _linear_fake(x, weight, bias=None):
    check_args(x, weight, bias, "linear")
    return x.new_empty((*x.shape[:-1], weight.shape[0]))


register_autograd("fusegraph::linear", backward, setup_context=setup_context)
