"""``kv_attention``: attention of a few new queries over a key/value cache plus the new keys and values."""
import math

import torch
import torch.nn.functional as F

from ._autograd import register as register_autograd
from ._checks import check_float_tensor, check_same_device

_ARGS = ("q", "k_cache", "k_new", "v_cache", "v_new")


def kv_attention(q, k_cache, k_new, v_cache, v_new, *, scale=None) -> torch.Tensor:
    r"""One decode step's attention over a cache, without building the concatenated keys and values:

    .. math:: \mathrm{out} = \mathrm{softmax}\!\left(q\,K^\top \cdot s\right) V,\quad
              K = [k_\mathrm{cache}; k_\mathrm{new}],\ V = [v_\mathrm{cache}; v_\mathrm{new}]

    exactly ``F.scaled_dot_product_attention(q, torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2),
    scale=scale)``: no mask, no dropout, not causal; ``s = scale`` or ``1/sqrt(head_dim)``. Shapes: ``q``
    ``[B, H, Lq, D]``, keys ``[B, H, L*, D]``, values ``[B, H, L*, Dv]`` (either piece may have length 0, not
    both); one dtype for all; any strides. Scores, softmax and the weighted sum in float32, one rounding to the
    output (contiguous ``[B, H, Lq, Dv]``, q's dtype). On CPU one task per query row, reading the two pieces in
    place; other devices run the at:: ops (the fusion pass fuses CPU sites only). float64: the at:: ops in
    float64. Differentiable: the gradient of the same math (``scaled_dot_product_attention``'s), in each
    argument's dtype.
    """
    return torch.ops.fusegraph.kv_attention(q, k_cache, k_new, v_cache, v_new, scale=scale)


def check_args(q, k_cache, k_new, v_cache, v_new, scale) -> None:
    """The C++ checks (csrc/ops/kv_attention.cpp), for the fake kernel."""
    tensors = dict(zip(_ARGS, (q, k_cache, k_new, v_cache, v_new)))
    for name, t in tensors.items():
        check_float_tensor(t, "kv_attention", name)
        if t.dim() != 4:
            raise RuntimeError(f"fusegraph.kv_attention: argument '{name}' has shape {list(t.shape)}; expected 4 dims "
                             "[batch, heads, length, head_dim]")
    for name, t in tensors.items():
        check_same_device(q, "q", t, "kv_attention", name)
        if t.dtype != q.dtype:
            raise RuntimeError(f"fusegraph.kv_attention: argument '{name}' has dtype {t.dtype}; expected q's dtype "
                             f"{q.dtype}")
        for d, what in ((0, "q's batch size"), (1, "q's number of heads")):
            if t.shape[d] != q.shape[d]:
                raise RuntimeError(f"fusegraph.kv_attention: argument '{name}' has shape {list(t.shape)}; expected "
                                 f"{what} {q.shape[d]} at dim {d}")
    expect = (("k_cache", 3, q.shape[3], "q's head_dim"), ("k_new", 3, q.shape[3], "q's head_dim"),
              ("v_cache", 2, k_cache.shape[2], "k_cache's length"), ("v_new", 2, k_new.shape[2], "k_new's length"),
              ("v_new", 3, v_cache.shape[3], "v_cache's head_dim"))
    for name, d, size, what in expect:
        if tensors[name].shape[d] != size:
            raise RuntimeError(f"fusegraph.kv_attention: argument '{name}' has shape {list(tensors[name].shape)}; "
                             f"expected {what} {size} at dim {d}")
    if k_cache.shape[2] + k_new.shape[2] == 0:
        raise RuntimeError("fusegraph.kv_attention: k_cache and k_new are both empty (length 0); expected at least "
                         "one key")
    if scale is not None and not math.isfinite(scale):
        raise ValueError(f"fusegraph.kv_attention: argument 'scale' is {scale}; expected a finite number or None")


@torch.library.register_fake("fusegraph::kv_attention")
def _kv_attention_fake(q, k_cache, k_new, v_cache, v_new, *, scale=None):
    check_args(q, k_cache, k_new, v_cache, v_new, scale)
    return q.new_empty((q.shape[0], q.shape[1], q.shape[2], v_cache.shape[3]))


# --- gradient: scaled_dot_product_attention's, through the concatenation (plain torch ops) ----------------------

def _setup_context(ctx, inputs, keyword_only, output):
    ctx.save_for_backward(*inputs)
    ctx.scale = keyword_only.get("scale")


def _backward(ctx, grad):
    inputs = [t.detach().requires_grad_() for t in ctx.saved_tensors]
    q, kc, kn, vc, vn = inputs
    with torch.enable_grad():
        out = F.scaled_dot_product_attention(q, torch.cat([kc, kn], -2), torch.cat([vc, vn], -2), scale=ctx.scale)
        return torch.autograd.grad(out, inputs, grad, allow_unused=True)


register_autograd("fusegraph::kv_attention", _backward, setup_context=_setup_context)
