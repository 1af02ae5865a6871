"""RoPE family: diffusers' RoPE source forms → ``fusegraph.rope``.

Source forms:

* ``apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=1|2)`` (Flux,
  HunyuanVideo 1.5): pairs ``(x0, x1) → (-x1, x0)`` built with ``reshape(..., -1, 2).unbind(-1)`` and
  ``stack(...).flatten(3)``; ``(x.float() * cos + x_rot.float() * sin).to(x.dtype)`` →
  ``rope(x, cos, sin, interleaved=True)``. The pattern starts at the broadcast cos/sin (``cos[None, :, None, :]``
  or ``cos[None, None]``), which the fused op takes as they are.
* the same with ``use_real_unbind_dim=-2`` (rotate-half: ``reshape(..., 2, -1)``, ``cat([-x2, x1], -1)``)
  → ``interleaved=False``.
* LTX's ``apply_rotary_emb`` / LTX2's ``apply_interleaved_rotary_emb``: the interleaved form on ``[B, S, C]``
  (``unflatten(2, (-1, 2))``, ``flatten(2)``). The op takes rank 4, so x gets a leading 1 (a view).
* Wan's own RoPE: ``x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)``, ``cos = freqs_cos[..., 0::2]``,
  ``sin = freqs_sin[..., 1::2]``, results written into ``empty_like(x)`` at ``[..., 0::2]`` / ``[..., 1::2]``:
  ``out[2i] = x[2i] cos[2i] - x[2i+1] sin[2i+1]``, ``out[2i+1] = x[2i] sin[2i+1] + x[2i+1] cos[2i]``. That is
  interleaved RoPE with per-pair angles, so it becomes ``rope(x, C, S, interleaved=True)`` where ``C`` repeats
  each even-position cos twice and ``S`` each odd-position sin twice (exact for any freqs, not only for the
  repeat-interleaved tables Wan builds). ``C``/``S`` are tiny (``[1, S, 1, D]``).
* the complex form, ``apply_rotary_emb(x, freqs_cis, use_real=False)`` (Lumina2) and the copies in Z-Image and
  QwenImage (``apply_rotary_emb_qwen(use_real=False)``): ``view_as_complex(x.float().reshape(..., -1, 2)) *
  freqs`` → ``view_as_real`` → flatten → ``type_as(x)``. The complex product is interleaved RoPE with
  cos = Re freqs, sin = Im freqs, each in both positions of its pair (tables of freqs' size, fp32).
* HiDream's ``apply_rope``: ``freqs_cis[..., 0] * x_[..., 0] + freqs_cis[..., 1] * x_[..., 1]`` with a 2x2
  matrix per pair; any such matrix is the op's ``x * cos + rot(x) * sin`` with cos = (f00, f11) and
  sin = (-f01, f10) per pair.
* LTX2's ``apply_split_rotary_emb`` (rotate-half with per-head half tables ``[B, H, T, D/2]``) →
  ``rope(x.view(B, T, H, D), cat([cos, cos]), ..., interleaved=False)``: the op takes full-width tables, so
  this form writes them (x's size, fp32) once per site.

Why these forms were missed before: the complex and HiDream forms are other op chains; LTX's ``unflatten``
traces to a view with the pair count spelled out (``reshape(..., -1, 2)`` keeps the -1), and a rank-3 x was
refused (the op is rank 4). A form traced at rank 4 used to be re-traced on LTX's rank-3 x by the matcher,
which failed loudly (error-level "Attempting to broadcast a dimension" tracebacks from fake tensors); the
checks now run before that re-trace, at the rank each form was traced with, so a refusal is silent.

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


def _ltx_interleaved(x, cos, sin):
    """LTX's ``apply_rotary_emb`` and LTX2's ``apply_interleaved_rotary_emb``: the interleaved form on
    ``[B, S, C]`` (all heads at once, cos/sin ``[B, S, C]``). ``unflatten`` traces to a view with the pair count
    spelled out where ``reshape(..., -1, 2)`` keeps the -1, hence a form of its own."""
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
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


def _complex(x, freqs):
    """``apply_rotary_emb(use_real=False)`` (Lumina2), Z-Image's and QwenImage's copies of it: x's pairs as
    complex numbers times ``freqs`` (complex64, as already unsqueezed to broadcast: the pattern starts there,
    so ``unsqueeze(1)`` and ``unsqueeze(2)`` alike)."""
    x_rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_rotated * freqs).flatten(3).type_as(x)


def _hidream(x, freqs_cis):
    """HiDream's ``apply_rope`` (one of q / k): each pair times its own 2x2 matrix ``freqs_cis[..., i, :, :]``."""
    x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs_cis[..., 0] * x_[..., 0] + freqs_cis[..., 1] * x_[..., 1]
    return out.reshape(*x.shape).type_as(x)


def _ltx2_split(x, cos, sin):
    """LTX2's ``apply_split_rotary_emb`` (``rope_type="split"``, the released LTX-2 checkpoints), the branch
    real models take: q / k ``[B, T, C]`` reshaped to heads, per-head half tables ``[B, H, T, D/2]`` applied to
    both halves: ``out[k] = x[k] c[k] - x[k+h] s[k]``, ``out[k+h] = x[k+h] c[k] + x[k] s[k]``."""
    x_dtype = x.dtype
    b, h, t, _ = cos.shape
    x = x.reshape(b, t, h, -1).swapaxes(1, 2)
    last = x.shape[-1]
    r = last // 2
    split_x = x.reshape(*x.shape[:-1], 2, r).float()
    first_x = split_x[..., :1, :]
    second_x = split_x[..., 1:, :]
    cos_u = cos.unsqueeze(-2)
    sin_u = sin.unsqueeze(-2)
    out = split_x * cos_u
    first_out = out[..., :1, :]
    second_out = out[..., 1:, :]
    first_out.addcmul_(-sin_u, second_x)
    second_out.addcmul_(sin_u, first_x)
    out = out.reshape(*out.shape[:-2], last)
    out = out.swapaxes(1, 2).reshape(b, t, -1)
    return out.to(dtype=x_dtype)


# ---- replacements ------------------------------------------------------------------------------------


def _rope(x, cos, sin, interleaved):
    """The op on rank-4 x; a rank-3 ``[B, S, C]`` x (LTX) gets a leading 1 (a view; right-aligned cos/sin
    broadcast as before)."""
    if x.dim() == 3:
        return torch.ops.fusegraph.rope(x.unsqueeze(0), cos, sin, interleaved=interleaved).squeeze(0)
    return torch.ops.fusegraph.rope(x, cos, sin, interleaved=interleaved)


def _fused_interleaved(x, cos, sin):
    return _rope(x, cos, sin, True)


def _fused_half(x, cos, sin):
    return _rope(x, cos, sin, False)


def _pairwise(t):
    """``t[..., i]`` repeated into positions 2i and 2i+1 (``repeat_interleave(t, 2, dim=-1)``)."""
    return t.unsqueeze(-1).expand(*t.shape, 2).flatten(-2)


def _fused_wan(x, freqs_cos, freqs_sin):
    cos = _pairwise(freqs_cos[..., 0::2])
    sin = _pairwise(freqs_sin[..., 1::2])
    return _rope(x, cos, sin, True)


def _fused_complex(x, freqs):
    """``(a + ib)(c + id) = (ac - bd) + i(bc + ad)``: interleaved RoPE with cos = Re f and sin = Im f in both
    positions of each pair. The tables are ``freqs``' size (``[B, S, 1, D]`` fp32 for Lumina2)."""
    f = torch.view_as_real(freqs)
    return _rope(x, _pairwise(f[..., 0]), _pairwise(f[..., 1]), True)


def _fused_hidream(x, freqs_cis):
    """``out[2i] = f00 x[2i] + f01 x[2i+1]``, ``out[2i+1] = f10 x[2i] + f11 x[2i+1]`` is the op's
    ``x * cos + rot(x) * sin`` (``rot(x)[2i] = -x[2i+1]``, ``rot(x)[2i+1] = x[2i]``) with cos = (f00, f11) and
    sin = (-f01, f10) per pair: exact for any matrices, not only the rotations HiDream builds."""
    cos = torch.stack([freqs_cis[..., 0, 0], freqs_cis[..., 1, 1]], dim=-1).flatten(-2)
    sin = torch.stack([-freqs_cis[..., 0, 1], freqs_cis[..., 1, 0]], dim=-1).flatten(-2)
    return _rope(x, cos, sin, True)


def _fused_ltx2_split(x, cos, sin):
    """Rotate-half RoPE on x viewed as ``[B, T, H, D]`` (no transpose: the tables are transposed instead, as
    views). The op takes full-width tables, so each half table is written twice (``cat``): a table as big as
    x in fp32 per site, the one copy this form costs."""
    b, h, t, _ = cos.shape
    cos = torch.cat([cos, cos], dim=-1).transpose(1, 2)
    sin = torch.cat([sin, sin], dim=-1).transpose(1, 2)
    return torch.ops.fusegraph.rope(x.reshape(b, t, h, -1), cos, sin, interleaved=False).reshape(b, t, -1)


# ---- checks ------------------------------------------------------------------------------------------


def _val(match: Match, name: str):
    node = match.kwargs.get(name)
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def _tensors(*ts) -> bool:
    return all(isinstance(t, torch.Tensor) for t in ts)


def _real_tables(match: Match):
    """``(shape, dtype, device)`` of the cos / sin tables the replacement hands the op, or None when the
    matched inputs are not what the form takes. Real forms: the tables as they are."""
    names = match.kwargs
    cos, sin = (_val(match, "cos"), _val(match, "sin")) if "cos" in names else \
        (_val(match, "freqs_cos"), _val(match, "freqs_sin"))  # the Wan form names them freqs_*
    if not _tensors(cos, sin) or cos.shape != sin.shape or cos.dtype != sin.dtype or cos.device != sin.device:
        return None
    return tuple(cos.shape), cos.dtype, cos.device


def _complex_tables(match: Match):
    """complex64 ``freqs [..., D/2]`` -> fp32 ``[..., D]``."""
    f = _val(match, "freqs")
    if not _tensors(f) or f.dtype != torch.complex64 or f.is_conj():  # view_as_real needs the conj resolved
        return None
    return (*f.shape[:-1], 2 * f.shape[-1]), torch.float32, f.device


def _hidream_tables(match: Match):
    """``freqs_cis [..., D/2, 2, 2]`` -> ``[..., D]``."""
    f = _val(match, "freqs_cis")
    if not _tensors(f) or f.dim() < 3 or tuple(f.shape[-2:]) != (2, 2):
        return None
    return (*f.shape[:-3], 2 * f.shape[-3]), f.dtype, f.device


def _split_tables(match: Match):
    """LTX2 split: the form reshapes x ``[B, T, C]`` to ``[B, T, H, D]`` with B, H, T taken from the half tables
    ``[B, H, T, D/2]``; the replacement does the same, so the tables must be exactly that (no broadcast dim,
    D/2 wide). Then they cover x, which is what the shape returned here stands for."""
    x, cos, sin = _val(match, "x"), _val(match, "cos"), _val(match, "sin")
    if not _tensors(x, cos, sin) or cos.dim() != 4 or x.dim() != 3 or cos.shape != sin.shape:
        return None
    b, h, t, r = cos.shape
    if tuple(x.shape) != (b, t, h * 2 * r) or cos.dtype != sin.dtype or cos.device != sin.device:
        return None
    return tuple(x.shape), cos.dtype, cos.device


def _supported(match: Match, rank: int, tables=_real_tables) -> bool:
    """What the fused kernel takes: float x of the rank the pattern was traced at, D even; cos/sin of one
    shape and dtype (fp32 or x's dtype), last dim D, broadcastable to x without changing x's shape.

    Runs before the matcher re-traces the search form on the matched shapes: a form traced at rank 4 would
    fail that trace on a rank-3 x, and the failed trace logs error-level tracebacks; a refusal here is silent."""
    x, tables = _val(match, "x"), tables(match)
    if not _tensors(x) or tables is None:
        return False
    shape, dtype, device = tables
    if x.dtype not in _DTYPES or x.dim() != rank or x.shape[-1] % 2:
        return False
    if dtype not in (torch.float32, x.dtype) or device != x.device or not 1 <= len(shape) <= rank:
        return False
    if shape[-1] != x.shape[-1]:
        return False
    try:
        return tuple(torch.broadcast_shapes(x.shape, shape)) == tuple(x.shape)
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


def _entries(pm: PatternMatcherPass) -> set:
    return {id(e) for entries in pm.patterns.values() for e in entries}


def _register(pm: PatternMatcherPass, trace_fn, search_fn, replace_fn, example_inputs, tables=_real_tables) -> None:
    """``register_replacement`` with :func:`_supported` (at the example x's rank) checked *before* the
    matcher's re-trace of ``search_fn`` on the matched shapes, not after it: forms of one structure at several
    ranks (and lookalikes of them) are refused silently instead of by a failed, logged trace."""
    check = functools.partial(_supported, rank=example_inputs[0].dim(), tables=tables)
    before = _entries(pm)
    register_replacement(search_fn, replace_fn, example_inputs, trace_fn=trace_fn, pass_dicts=pm,
                         extra_check=check, skip_duplicates=True)
    for entries in pm.patterns.values():
        for entry in entries:
            if id(entry) not in before:
                entry.extra_check = functools.partial(_checked_first, check, entry.extra_check)


def _checked_first(check, retrace_and_check, match: Match) -> bool:
    return check(match) and retrace_and_check(match)


def register(pm: PatternMatcherPass, opts) -> None:
    """Registers the RoPE source forms, per x dtype (cos/sin fp32 or x's dtype), into ``pm``."""
    del opts  # the pass manager decides whether this family runs
    # casts, table slices and buffers merged by freezing's CSE would block matches
    prepare_before(pm, split_shared_casts, split_shared_rope_inputs)
    # Traced as aot_autograd leaves the graph (views), and with views as reshapes: Inductor's freezing rewrites
    # every view so before its post-grad passes (where the fusion runs on the inductor=True route).
    for trace_fn in (fwd_functional, fwd_functional_reshape):
        reg = functools.partial(_register, pm, trace_fn)
        for x_dtype in _DTYPES:
            # fp32 tables only: a form traced with x.dtype tables gives the same graph (``x.float() * t`` and
            # ``x1 * t`` promote in the op, no cast node), which register_replacement drops as a duplicate
            # after tracing it; the matcher re-traces with the matched dtypes and _supported takes both.
            x = torch.empty(2, 5, 3, 16, dtype=x_dtype)  # [B, S, H, D]
            cs = [torch.empty(1, 5, 1, 16) for _ in range(2)]
            reg(_wan, _fused_wan, [x, *cs])
            reg(_diffusers_interleaved, _fused_interleaved, [x, *cs])
            reg(_diffusers_half, _fused_half, [x, *cs])
            x3 = torch.empty(2, 5, 16, dtype=x_dtype)  # LTX / LTX2: [B, S, C], cos/sin [B, S, C]
            reg(_ltx_interleaved, _fused_interleaved, [x3, torch.empty(2, 5, 16), torch.empty(2, 5, 16)])
            reg(_complex, _fused_complex, [x, torch.empty(1, 5, 1, 8, dtype=torch.complex64)], _complex_tables)
            reg(_hidream, _fused_hidream, [x, torch.empty(1, 5, 1, 8, 2, 2)], _hidream_tables)
            half = [torch.empty(2, 3, 5, 4) for _ in range(2)]  # [B, H, T, D/2] for x [B, T, H * D]
            reg(_ltx2_split, _fused_ltx2_split, [torch.empty(2, 5, 24, dtype=x_dtype), *half], _split_tables)
