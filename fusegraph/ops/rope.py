"""Rotary position embedding (``rope``): diffusers' ``apply_rotary_emb(use_real=True)`` in one kernel."""
import torch

from ._autograd import compute_dtype, grad_like, needs_input_grad, register as register_autograd
from ._checks import check_float_tensor, check_same_device


def rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, interleaved: bool = True,
         rotary_dim: int | None = None) -> torch.Tensor:
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
    Equals ``(x.float() * cos + rot(x).float() * sin).to(x.dtype)``. ``interleaved`` must be a bool (or the int 1
    or 0, the form Inductor's C++ wrapper passes a bool in): None or another number raises TypeError (a plain
    ``bool`` schema argument would have read None as False, rotate-half).

    ``rotary_dim`` (partial rotary, MiniMax-H3, Ernie-Image, Stable Audio 3): only ``x[..., :rotary_dim]`` is
    rotated as above (for rotate-half, :math:`h = \text{rotary\_dim}/2`, the halves of that part) and
    ``x[..., rotary_dim:]`` is copied unchanged: ``cat([rope(x[..., :R], cos, sin), x[..., R:]], -1)``. cos /
    sin are then ``R`` wide (``[S, R]``, ``[1, S, 1, R]``, ...) and broadcast to ``x[..., :R]``. None (the
    default) means all of D; otherwise an even int with ``0 < rotary_dim <= D`` (D itself may then be odd).

    float64: when any tensor argument is float64 the same math runs in float64 with plain torch ops (not the
    fused kernel).

    Differentiable in ``x``, ``cos`` and ``sin``: :math:`dx = g \odot \cos - \operatorname{rot}(g \odot \sin)`
    (rot is antisymmetric), :math:`d\cos = g \odot x`, :math:`d\sin = g \odot \operatorname{rot}(x)`, the table
    grads summed over their broadcast dims; plain torch ops in float32 (float64 for float64 arguments), each
    returned in its argument's dtype. With ``rotary_dim`` these hold on the rotated part; the pass-through
    channels get the output grad as it is.
    """
    return torch.ops.fusegraph.rope(x, cos, sin, interleaved=interleaved, rotary_dim=rotary_dim)


def check_rope_args(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, rotary_dim: int | None = None) -> int:
    """The checks of csrc/ops/rope.cpp check_rope_args, same messages. Returns the rotated width R."""
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
    if rotary_dim is not None:
        if not (0 < rotary_dim <= D and rotary_dim % 2 == 0):
            raise RuntimeError(
                f"fusegraph.rope: argument 'rotary_dim' is {rotary_dim}; expected an even width with "
                f"0 < rotary_dim <= D = {D} (x's last dim), or None for all of D"
            )
    elif D % 2 != 0:
        raise RuntimeError(
            f"fusegraph.rope: argument 'x' has shape {xs} with odd last dim D = {D}; expected D even (rotation pairs)"
        )
    R = D if rotary_dim is None else rotary_dim
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
    if rotary_dim is not None and cos.shape[-1] != R:
        raise RuntimeError(
            f"fusegraph.rope: argument 'cos' has shape {cs} with last dim {cos.shape[-1]}; expected rotary_dim = {R}"
        )
    if cos.shape[-1] != D and rotary_dim is None:
        raise RuntimeError(
            f"fusegraph.rope: argument 'cos' has shape {cs} with last dim {cos.shape[-1]}; expected x's last dim D = {D}"
        )
    offset = 4 - cos.dim()
    for d, size in enumerate(cos.shape[:-1]):
        if size != 1 and size != x.shape[d + offset]:
            raise RuntimeError(
                f"fusegraph.rope: argument 'cos' has shape {cs} which does not broadcast to x's shape {xs} "
                f"(dim {d} is {size}, x has {x.shape[d + offset]}); expected each dim 1 or x's size, "
                "e.g. [S, D], [1, S, 1, D], [1, 1, S, D] or [B, S, 1, D]"
            )
    return R


def check_rope_interleaved(interleaved) -> bool:
    """As csrc/ops/rope.cpp check_rope_interleaved: a bool, or the int 1 or 0 (Inductor's C++ wrapper passes a bool
    to a Scalar argument as an int), else TypeError with the same message."""
    if isinstance(interleaved, bool):
        return interleaved
    if isinstance(interleaved, int) and interleaved in (0, 1):
        return interleaved == 1
    if interleaved is None:
        seen = "None"
    elif isinstance(interleaved, int):
        seen = f"the int {interleaved}"
    elif isinstance(interleaved, float):
        seen = f"the float {interleaved:g}"
    else:
        seen = f"the {type(interleaved).__name__} {interleaved!r}"
    raise TypeError(f"fusegraph.rope: argument 'interleaved' is {seen}; "
                    "expected a bool: True (interleaved pairs) or False (rotate-half), or the int 1 or 0")


@torch.library.register_fake("fusegraph::rope")
def _rope_fake(x, cos, sin, *, interleaved=True, rotary_dim=None):
    check_rope_args(x, cos, sin, rotary_dim)
    check_rope_interleaved(interleaved)
    return x.new_empty(x.shape)


def _rot(x: torch.Tensor, interleaved: bool) -> torch.Tensor:
    """interleaved: pairs (x0, x1) -> (-x1, x0); otherwise rotate-half cat(-x2, x1)."""
    if interleaved:
        x0, x1 = x.unflatten(-1, (-1, 2)).unbind(-1)
        return torch.stack([-x1, x0], dim=-1).flatten(-2)
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat([-x2, x1], dim=-1)


def _rope_setup_context(ctx, inputs, keyword_only_inputs, output):
    x, cos, sin = inputs
    ctx.save_for_backward(x, cos, sin)
    ctx.interleaved = keyword_only_inputs["interleaved"]
    ctx.rotary_dim = keyword_only_inputs.get("rotary_dim")


def _rope_backward(ctx, grad):
    """On the rotated part x[..., :R] the formulas of :func:`rope`; the pass-through channels' grad is g there."""
    x, cos, sin = ctx.saved_tensors
    need_x, need_cos, need_sin = needs_input_grad(ctx, 3)
    ct = compute_dtype(x, cos, sin, grad)
    R = x.shape[-1] if ctx.rotary_dim is None else ctx.rotary_dim
    g_all = grad.to(ct)
    g, xr = g_all[..., :R], x[..., :R]
    dx = dcos = dsin = None
    if need_x:
        dx = g * cos.to(ct) - _rot(g * sin.to(ct), ctx.interleaved)
        if R < x.shape[-1]:
            dx = torch.cat([dx, g_all[..., R:]], dim=-1)
        dx = dx.to(x.dtype)
    if need_cos:
        dcos = grad_like(g * xr.to(ct), cos)
    if need_sin:
        dsin = grad_like(g * _rot(xr.to(ct), ctx.interleaved), sin)
    return dx, dcos, dsin


register_autograd("fusegraph::rope", _rope_backward, setup_context=_rope_setup_context)
