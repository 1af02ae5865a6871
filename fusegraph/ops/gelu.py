"""GELU variants: ``gelu_tanh`` (exact tanh approximation) and ``fast_gelu`` (sigmoid form)."""
import torch

from ._checks import check_float_tensor


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    r"""tanh-approximated GELU, exactly ``F.gelu(x, approximate="tanh")``:

    .. math:: y = \tfrac12 x \left(1 + \tanh\!\left(\sqrt{2/\pi}\,(x + 0.044715\,x^3)\right)\right)

    computed in float32, rounded once to ``x.dtype``. Output is contiguous with ``x``'s shape.
    """
    return torch.ops.fusegraph.gelu_tanh(x)


def fast_gelu(x: torch.Tensor) -> torch.Tensor:
    r"""Sigmoid GELU (the NPU "fast gelu"): :math:`y = x\,\sigma(1.702\,x)`, float32 math, one rounding.

    Differs from exact GELU by up to about 0.02; the fusion pass uses it only when
    ``fusion_patterns.gelu_approximation == "sigmoid"``.
    """
    return torch.ops.fusegraph.fast_gelu(x)


@torch.library.register_fake("fusegraph::gelu_tanh")
def _gelu_tanh_fake(x):
    check_float_tensor(x, "gelu_tanh", "x")
    return torch.empty_like(x, memory_format=torch.contiguous_format)


@torch.library.register_fake("fusegraph::fast_gelu")
def _fast_gelu_fake(x):
    check_float_tensor(x, "fast_gelu", "x")
    return torch.empty_like(x, memory_format=torch.contiguous_format)
