"""RoPE family: diffusers ``apply_rotary_emb`` (``use_real=True``) and Wan's RoPE → ``fusegraph.rope``.

Source forms:

* ``apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=1|2)`` (Flux):
  pairs ``(x0, x1) → (-x1, x0)`` built with ``reshape(..., -1, 2).unbind(-1)`` and ``stack(...).flatten(3)``;
  ``(x.float() * cos + x_rot.float() * sin).to(x.dtype)`` → ``rope(x, cos, sin, interleaved=True)``.
  The pattern starts at the broadcast cos/sin (``cos[None, :, None, :]`` or ``cos[None, None]``), which the
  fused op takes as they are.
* the same with ``use_real_unbind_dim=-2`` (rotate-half: ``reshape(..., 2, -1)``, ``cat([-x2, x1], -1)``)
  → ``interleaved=False``.
* Wan's own RoPE: ``x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)``, ``cos = freqs_cos[..., 0::2]``,
  ``sin = freqs_sin[..., 1::2]``, results written into ``empty_like(x)`` at ``[..., 0::2]`` / ``[..., 1::2]``:
  ``out[2i] = x[2i] cos[2i] - x[2i+1] sin[2i+1]``, ``out[2i+1] = x[2i] sin[2i+1] + x[2i+1] cos[2i]``. That is
  interleaved RoPE with per-pair angles, so it becomes ``rope(x, C, S, interleaved=True)`` where ``C`` repeats
  each even-position cos twice and ``S`` each odd-position sin twice (exact for any freqs, not only for the
  repeat-interleaved tables Wan builds). ``C``/``S`` are tiny (``[1, S, 1, D]``).

Dims, slice steps and dtypes are re-checked exactly on every match (``register_replacement`` re-traces the
search function on the matched shapes), so ``stack([x_real, -x_imag])`` or a slice from 1 where 0 is due
do not fuse.
"""
from __future__ import annotations

import functools
import operator

import torch
from torch._inductor.pattern_matcher import Match, PatternMatcherPass, register_replacement

from ._prepare import prepare_before, split_shared_casts
from ._trace import fwd_functional, fwd_functional_reshape

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---- search forms (copied from diffusers' code paths, minus the no-op .to(device)) ---------------------


def _diffusers_interleaved(x, cos, sin):
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def _diffusers_half(x, cos, sin):
    x_real, x_imag = x.reshape(*x.shape[:-1], 2, -1).unbind(-2)
    x_rotated = torch.cat([-x_imag, x_real], dim=-1)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def _wan(x, freqs_cos, freqs_sin):
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


# ---- replacements ------------------------------------------------------------------------------------


def _fused_interleaved(x, cos, sin):
    return torch.ops.fusegraph.rope(x, cos, sin, interleaved=True)


def _fused_half(x, cos, sin):
    return torch.ops.fusegraph.rope(x, cos, sin, interleaved=False)


def _pairwise(t):
    """``t[..., 2i]`` repeated into positions 2i and 2i+1 (``repeat_interleave(t, 2, dim=-1)``)."""
    return t.unsqueeze(-1).expand(*t.shape, 2).flatten(-2)


def _fused_wan(x, freqs_cos, freqs_sin):
    cos = _pairwise(freqs_cos[..., 0::2])
    sin = _pairwise(freqs_sin[..., 1::2])
    return torch.ops.fusegraph.rope(x, cos, sin, interleaved=True)


# ---- checks ------------------------------------------------------------------------------------------


def _val(match: Match, name: str):
    node = match.kwargs.get(name)
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def _supported(match: Match) -> bool:
    """What the fused kernel takes: float x, cos/sin of one shape, fp32 or x's dtype, last dim D,
    broadcastable to x without changing x's shape."""
    x, cos, sin = (_val(match, n) for n in ("x", "cos", "sin"))
    if cos is None:  # the Wan form names them freqs_*
        cos, sin = _val(match, "freqs_cos"), _val(match, "freqs_sin")
    if not all(isinstance(t, torch.Tensor) for t in (x, cos, sin)):
        return False
    if x.dtype not in _DTYPES or x.dim() != 4 or x.shape[-1] % 2:  # the op takes [B, S, H, D] / [B, H, S, D]
        return False
    if cos.shape != sin.shape or cos.dtype != sin.dtype or cos.dtype not in (torch.float32, x.dtype):
        return False
    if cos.device != x.device or sin.device != x.device or not 1 <= cos.dim() <= x.dim():
        return False
    try:
        return tuple(torch.broadcast_shapes(x.shape, cos.shape)) == tuple(x.shape)
    except RuntimeError:
        return False


# ---- shared inputs ------------------------------------------------------------------------------------

_aten = torch.ops.aten


def _is(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == target


def _only_user(node, target):
    users = list(node.users)
    return users[0] if len(users) == 1 and _is(users[0], target) else None


def _wan_group(node: torch.fx.Node, user: torch.fx.Node):
    """Which Wan RoPE instance ``user`` (a user of a shared ``freqs[..., k::2]`` slice or ``empty``) is in."""
    if _is(node, _aten.empty.memory_format):
        if _is(user, _aten.slice_scatter.default):
            return user
        copy = _only_user(user, _aten.copy.default) if _is(user, _aten.slice.Tensor) else None
        scatter = _only_user(copy, _aten.slice_scatter.default) if copy is not None else None
        return scatter if scatter is not None and scatter.args[0] is node else user
    if _is(user, _aten.mul.Tensor):  # x1 * cos: x1 = unbind(x)[0]; the instance is its unbind
        other = user.args[0] if user.args[1] is node else user.args[1]
        if _is(other, operator.getitem) and _is(other.args[0], _aten.unbind.int):
            return other.args[0]
    return user


def split_shared_rope_inputs(graph: torch.fx.Graph) -> int:
    """Freezing's CSE makes q's and k's Wan RoPE share ``freqs_cos[..., 0::2]``, ``freqs_sin[..., 1::2]``
    and even the ``empty_like`` buffer, which blocks both matches: each RoPE gets its own copy again (views
    and an allocation: free). Returns the number of copies made."""
    copies = 0
    for node in list(graph.nodes):
        strided_slice = _is(node, _aten.slice.Tensor) and len(node.args) == 5 and node.args[4] == 2
        if not (strided_slice or _is(node, _aten.empty.memory_format)) or len(node.users) < 2:
            continue
        groups: dict = {}
        for user in node.users:
            groups.setdefault(_wan_group(node, user), []).append(user)
        for users in list(groups.values())[1:]:
            with graph.inserting_after(node):
                copy = graph.node_copy(node)
            for user in users:
                user.replace_input_with(node, copy)
            copies += 1
    return copies


# ---- registration ------------------------------------------------------------------------------------


def register(pm: PatternMatcherPass, opts) -> None:
    """Registers the RoPE source forms, per x dtype (cos/sin fp32 or x's dtype), into ``pm``."""
    del opts  # the pass manager decides whether this family runs
    # casts, table slices and buffers merged by freezing's CSE would block matches
    prepare_before(pm, split_shared_casts, split_shared_rope_inputs)
    # Traced as aot_autograd leaves the graph (views), and with views as reshapes: Inductor's freezing rewrites
    # every view so before its post-grad passes (where the fusion runs on the inductor=True route).
    for trace_fn in (fwd_functional, fwd_functional_reshape):
        reg = functools.partial(
            register_replacement, trace_fn=trace_fn, pass_dicts=pm, extra_check=_supported, skip_duplicates=True
        )
        for x_dtype in _DTYPES:
            for c_dtype in dict.fromkeys((torch.float32, x_dtype)):
                x = torch.empty(2, 5, 3, 16, dtype=x_dtype)  # [B, S, H, D]
                cs = [torch.empty(1, 5, 1, 16, dtype=c_dtype) for _ in range(2)]
                reg(_wan, _fused_wan, [x, *cs])
                reg(_diffusers_interleaved, _fused_interleaved, [x, *cs])
                reg(_diffusers_half, _fused_half, [x, *cs])
