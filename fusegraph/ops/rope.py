"""Rotary position embedding (``rope``): diffusers' ``apply_rotary_emb(use_real=True)`` in one kernel."""
import torch

from ._checks import check_float_tensor, check_same_device


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = True) -> torch.Tensor:
    r"""Rotary embedding of ``x`` with precomputed ``cos`` / ``sin`` tables:

    .. math:: y = x \odot \cos + \operatorname{rot}(x) \odot \sin

    with, over the last dim,

    - ``interleaved=True`` (diffusers ``use_real_unbind_dim=-1``; Flux, CogVideoX, HunyuanDiT):
      :math:`\operatorname{rot}(x)_{2k} = -x_{2k+1},\ \operatorname{rot}(x)_{2k+1} = x_{2k}`;
    - ``interleaved=False`` (rotate-half, ``use_real_unbind_dim=-2``): with :math:`h = D/2`,
      :math:`\operatorname{rot}(x) = \operatorname{cat}(-x_{h:}, x_{:h})`.

    ``x`` is rank 4 (``[B, S, H, D]`` or ``[B, H, S, D]``, D even, any strides); ``cos`` and ``sin`` have one
    shape and one dtype (float32 or ``x.dtype``), broadcast to ``x`` like eager (right-aligned): ``[S, D]``
    (for ``[B, H, S, D]``), ``[1, S, 1, D]``, ``[1, 1, S, D]``, ``[B, S, 1, D]``; slices of bigger tables are
    read in place. Math in float32, rounded once to ``x.dtype``; the output is contiguous with ``x``'s shape.
    Equals ``(x.float() * cos + rot(x).float() * sin).to(x.dtype)``.
    """
    return torch.ops.fusegraph.rope(x, cos, sin, interleaved=interleaved)


def check_rope_args(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """The checks of csrc/ops/rope.cpp check_rope_args, same messages."""
    for name, t in (("x", x), ("cos", cos), ("sin", sin)):
        check_float_tensor(t, "rope", name)
    check_same_device(x, "x", cos, "rope", "cos")
    check_same_device(x, "x", sin, "rope", "sin")
    xs, cs = list(x.shape), list(cos.shape)
    if x.dim() != 4:
        raise RuntimeError(
            f"fusegraph.rope: argument 'x' has shape {xs} (rank {x.dim()}); expected rank 4, [B, S, H, D] or [B, H, S, D]"
        )
    D = x.shape[3]
    if D % 2 != 0:
        raise RuntimeError(
            f"fusegraph.rope: argument 'x' has shape {xs} with odd last dim D = {D}; expected D even (rotation pairs)"
        )
    if cos.dtype not in (torch.float32, x.dtype):
        raise RuntimeError(
            f"fusegraph.rope: argument 'cos' has dtype {cos.dtype}; expected float32 or x's dtype {x.dtype}"
        )
    if sin.dtype != cos.dtype:
        raise RuntimeError(
            f"fusegraph.rope: argument 'sin' has dtype {sin.dtype}; expected the dtype of 'cos', {cos.dtype}"
        )
    if sin.shape != cos.shape:
        raise RuntimeError(
            f"fusegraph.rope: argument 'sin' has shape {list(sin.shape)}; expected the shape of 'cos', {cs}"
        )
    if not 1 <= cos.dim() <= 4:
        raise RuntimeError(
            f"fusegraph.rope: argument 'cos' has shape {cs} (rank {cos.dim()}); expected rank 1 to 4, "
            f"broadcastable to x {xs}"
        )
    if cos.shape[-1] != D:
        raise RuntimeError(
            f"fusegraph.rope: argument 'cos' has shape {cs} with last dim {cos.shape[-1]}; expected x's last dim D = {D}"
        )
    offset = 4 - cos.dim()
    for d, size in enumerate(cos.shape):
        if size != 1 and size != x.shape[d + offset]:
            raise RuntimeError(
                f"fusegraph.rope: argument 'cos' has shape {cs} which does not broadcast to x's shape {xs} "
                f"(dim {d} is {size}, x has {x.shape[d + offset]}); expected each dim 1 or x's size, "
                "e.g. [S, D], [1, S, 1, D], [1, 1, S, D] or [B, S, 1, D]"
            )


@torch.library.register_fake("fusegraph::rope")
def _rope_fake(x, cos, sin, *, interleaved=True):
    check_rope_args(x, cos, sin)
    return x.new_empty(x.shape)
