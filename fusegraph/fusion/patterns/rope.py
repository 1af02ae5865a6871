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
* Mochi's ``apply_rotary_emb`` (nested in ``MochiAttnProcessor2_0``): ``x_even = x[..., 0::2].float()``,
  ``x_odd = x[..., 1::2].float()``, ``cos = (x_even * freqs_cos - x_odd * freqs_sin).to(x.dtype)``,
  ``sin = (x_even * freqs_sin + x_odd * freqs_cos).to(x.dtype)``, ``stack([cos, sin], -1).flatten(-2)``. That is
  interleaved RoPE with per-pair tables (``[S, H, D/2]`` for x ``[B, S, H, D]`` after ``unflatten(2, (heads,
  -1))``): ``rope(x, pairwise(freqs_cos), pairwise(freqs_sin), interleaved=True)``, the tables repeated into
  both positions of each pair as broadcast views. In fp32 the casts are no-ops and leave the graph; with
  bf16 / fp16 x both results are rounded to x's dtype once, as the op rounds. Without this form the mul_add family
  would fuse one of its two ``x * c ± y * s`` halves.
* the complex form, ``apply_rotary_emb(x, freqs_cis, use_real=False)`` (Lumina2) and the copies in Z-Image and
  QwenImage (``apply_rotary_emb_qwen(use_real=False)``): ``view_as_complex(x.float().reshape(..., -1, 2)) *
  freqs`` → ``view_as_real`` → flatten → ``type_as(x)``. The complex product is interleaved RoPE with
  cos = Re freqs, sin = Im freqs, each in both positions of its pair (tables of freqs' size, fp32).
  complex128 freqs (Lumina2's stock tables everywhere but on MPS) make the product float64; it fuses too
  (lead's decision), the op computing in fp32 from fp32-rounded cos/sin: a couple of fp32 ulps from the
  float64 product, within the project's op-level fp32 tolerance. Only where ``type_as(x)`` rounds the
  result to x's dtype anyway (the match's output must be in x's dtype); a float64 result that flows on, or
  one cast to another dtype, stays unfused. A real fp32 / bf16 / fp16 table in place of the complex one
  (LuminaNext as diffusers' own model test runs it, a random ``image_rotary_emb [384, 384, 4]``) makes each
  pair's product one by a real number: cos = f, sin = 0, exact (the same graph as complex64 freqs, so the same
  entry: :func:`_complex_tables`, :func:`_fused_complex`); a float64 one (a complex128 product) stays unfused.
* HiDream's ``apply_rope``: ``freqs_cis[..., 0] * x_[..., 0] + freqs_cis[..., 1] * x_[..., 1]`` with a 2x2
  matrix per pair; any such matrix is the op's ``x * cos + rot(x) * sin`` with cos = (f00, f11) and
  sin = (-f01, f10) per pair.
* LTX2's ``apply_split_rotary_emb`` (rotate-half with per-head half tables ``[B, H, T, D/2]``) →
  ``rope(x.view(B, T, H, D), cat([cos, cos]), ..., interleaved=False)``: the op takes full-width tables, so
  this form writes them (x's size, fp32) once per site. Also without its last ``reshape(b, t, -1)`` (fp32 x,
  output ``[B, T, H, D]``): on the inductor=True route that reshape and the attention's
  ``unflatten(2, (heads, -1))`` become one reshape back to the swapaxes' shape, which Inductor drops.

* rotate-half written with slices or ``chunk`` + ``cat``: ``cat((-x[..., h:], x[..., :h]), -1)`` (Cosmos3's
  and Ideogram4's ``_rotate_half``), ``first, second = x.chunk(2, -1)``, ``cat((-second, first), -1)``
  (LongCat-Audio), as ``x * cos + rot(x) * sin`` in x's dtype (Cosmos3 on a rank-3 ``[N, H, D]`` x with
  ``[N, 1, D]`` tables, Ideogram4 ``[B, L, H, D]`` / ``[B, L, 1, D]``) or ``(x.float() * cos +
  rot(x).float() * sin).to(x.dtype)`` (LongCat-Audio, ``[1, S, 1, D]``) → ``rope(x, cos, sin,
  interleaved=False)``. In x's dtype with bf16 / fp16 x, eager rounds each product and the sum; the op
  rounds once (as for every form here). A form without casts whose result is not in x's dtype (fp32 tables,
  bf16 x: promoted to fp32) stays unfused: the op's output is x's dtype.
* partial rotary: ``x_rot, x_pass = x[..., :R], x[..., R:]`` with R the tables' last dim, ``cat((x_rot * cos +
  rot(x_rot) * sin, x_pass), -1)``, rotate-half by ``chunk`` in x's dtype (MiniMax-H3's ``_apply_rotary_emb``,
  MiniMax-Music3's ``_apply_partial_rotary_emb``, Ernie-Image's nested ``apply_rotary_emb``, whose
  ``cos(freqs).to(x.dtype)`` stays outside the match) or by ``unflatten(-1, (2, -1)).unbind(-2)`` in fp32
  (Stable Audio 3's ``_apply_rotary_partial``: ``x_rot.float()``, the result ``.to(x.dtype)`` before the
  ``cat``) → ``rope(x, cos, sin, interleaved=False, rotary_dim=R)``: the pass-through channels are copied by
  the op, no ``cat``. R = D too (Ernie's tables are as wide as the head: the ``x[..., :D]`` slice is a no-op
  that tracing drops and the pass-through is empty; a form of its own). The search forms take R from the
  tables, and the matcher re-traces them on the matched shapes, so a pass-through that is not exactly
  ``x[..., R:]``, a rotated part taken elsewhere than ``x[..., :R]`` or of another width does not fuse.
* JoyImage's ``_apply_rotary_emb`` (and JoyImage-Edit-Plus' batched copy): the interleaved form with the
  rotation of ``x.float()`` and ``type_as(x)``.
* AnyFlow's ``apply_rotary_emb``: the complex form in float64 (``x.to(float64).unflatten(3, (-1, 2))``,
  ``flatten(3, 4)``, ``type_as(x)``), fused on the terms of Lumina2's complex128 tables. NucleusMoE's,
  QwenImage-2.1's and Bria-Fibo2's copies of the complex form are the ``_complex`` form.
* Kandinsky 5's and 6's ``apply_rotary``: ``(rope * x.reshape(..., -1, 1, 2).float()).sum(-1)`` with a 2x2
  matrix per pair — HiDream's product as a sum, the same replacement. Kandinsky 5 rounds the result to bf16
  and back whatever x is (``.to(torch.bfloat16)``, ``.type_as(query)``): with fp32 x the form without a cast
  matches and the round trip stays, so the source's rounding is kept; Kandinsky 6's ``.to(x.dtype)`` is in the
  form. PRX's ``apply_rope`` is HiDream's.
* SanaWM's ``_apply_rotary_emb`` on ``(B, H, D, N)`` features: the complex form on ``x.permute(0, 1, 3, 2)``,
  the result permuted back → ``rope(x.permute(0, 1, 3, 2), ...).permute(0, 1, 3, 2)`` (views). Its camera path
  (``_apply_ucpe_transform``: q, the K‖V concatenation, V rotated too, and the output's inverse rotation with
  ``rotary_emb.conj()``) rotates the second half of the head dim with the complex form written with
  ``to(float32).unflatten(-1, (-1, 2))`` and ``flatten(-2, -1)`` (:func:`_complex_unflatten`) → ``rope(half,
  ...)`` on that half (the first half's 4x4 transform and the ``cat`` stay). The half is ``.contiguous()``-copied
  first where its last dim is strided; :func:`_complex`'s ``reshape`` traces to a view that keeps the -1 on
  such a contiguous x and ``unflatten`` spells the pair count out, so the exact re-check refused that form
  there (5 of SanaWM's 10 sites; the one on an unstrided half matched, the -1 being resolved on a strided x).
  The conjugate is resolved (``_conj``, ``clone``) before the product: an ordinary complex table.
* Helios' ``apply_rotary_emb_transposed``: Wan's form with each table slice taken at each use (the tables are
  the outputs of ``freqs_cis.unsqueeze(-2).chunk(2, -1)``). Sana-Video's is Wan's verbatim.

Sharing left by freezing's CSE (the default inductor=True route runs it before the fusion pass): the matcher
refuses a match whose inner nodes have users outside it, and q's and k's RoPE compute the same table ops.
Before matching, each RoPE instance gets its own copy again: Wan's strided table slices and ``empty_like``
buffer (:func:`split_shared_rope_inputs`; a strided slice read by products that are no Wan table use —
Mochi's fp32 ``x[..., 0::2]``, read by ``* freqs_cos`` and ``* freqs_sin`` — is left whole: a copy per
product would block Mochi's match in fp32); HiDream's ``freqs_cis[..., 0]`` / ``[..., 1]`` selects and LTX2
split's ``cos.unsqueeze(-2)``, ``sin.unsqueeze(-2)`` and ``-sin_u`` (:func:`split_shared_table_ops`, users
grouped by the x they combine the table with). Views, selects and table-sized negations: cheap (Inductor
re-merges copies that stay unfused; the aten route keeps them, a table-sized negation at most).

Why these forms are separate: the complex and HiDream forms are other op chains; LTX's ``unflatten`` traces to a
view with the pair count spelled out (``reshape(..., -1, 2)`` keeps the -1), and x may be rank 3 (the op is rank
4). The checks run before the matcher's re-trace, at the rank each form was traced with, so a form traced at rank 4
is refused silently on a rank-3 x (the matcher's re-trace would fail with error-level "Attempting to broadcast a
dimension" tracebacks from fake tensors).

Dims, slice steps and dtypes are re-checked exactly on every match (``register_replacement`` re-traces the
search function on the matched shapes), so ``stack([x_real, -x_imag])`` or a slice from 1 where 0 is due
do not fuse.
"""
from __future__ import annotations

import functools
import operator

import torch
from ..._core.torch_pattern_matcher import Match, PatternMatcherPass, register_replacement

from ._prepare import depends_on, give_copies, prepare_before, split_shared_casts
from ._trace import fwd_functional, fwd_functional_reshape, on_symbolic, symbolic_recheck
from . import _anchors
from ._family import Candidate, Family, Form, overload
from ._lowering import ROW, compute_dtype

_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---- replacements ------------------------------------------------------------------------------------


def _rope(x, cos, sin, interleaved, rotary_dim=None):
    """The op on rank-4 x; a rank-3 x (LTX's ``[B, S, C]``, Cosmos3's ``[N, H, D]``) gets a leading 1 (a view;
    right-aligned cos/sin broadcast as before)."""
    if x.dim() == 3:
        return torch.ops.fusegraph.rope(x.unsqueeze(0), cos, sin, interleaved=interleaved,
                                        rotary_dim=rotary_dim).squeeze(0)
    return torch.ops.fusegraph.rope(x, cos, sin, interleaved=interleaved, rotary_dim=rotary_dim)


def _fused_interleaved(x, cos, sin):
    return _rope(x, cos, sin, True)


def _fused_half(x, cos, sin):
    return _rope(x, cos, sin, False)


def _fused_partial_half(x, cos, sin):
    """Rotate-half on ``x[..., :R]`` (R = the tables' width), the rest copied: the op's ``rotary_dim``."""
    return _rope(x, cos, sin, False, rotary_dim=cos.shape[-1])


def _pairwise(t):
    """``t[..., i]`` repeated into positions 2i and 2i+1 (``repeat_interleave(t, 2, dim=-1)``)."""
    return t.unsqueeze(-1).expand(*t.shape, 2).flatten(-2)


def _fused_wan(x, freqs_cos, freqs_sin):
    cos = _pairwise(freqs_cos[..., 0::2])
    sin = _pairwise(freqs_sin[..., 1::2])
    return _rope(x, cos, sin, True)


def _fused_mochi(x, freqs_cos, freqs_sin):
    """Interleaved RoPE with each per-pair cos / sin in both positions of its pair (tables ``[..., D]``, views
    of the ``[..., D/2]`` ones broadcast in the op: nothing is written)."""
    return _rope(x, _pairwise(freqs_cos), _pairwise(freqs_sin), True)


def _fused_complex(x, freqs):
    """``(a + ib)(c + id) = (ac - bd) + i(bc + ad)``: interleaved RoPE with cos = Re f and sin = Im f in both
    positions of each pair. The tables are ``freqs``' size (``[B, S, 1, D]`` fp32 for Lumina2); complex128
    freqs are rounded to fp32 first (the op computes in fp32; see :func:`_complex_tables`).

    A real ``freqs`` (LuminaNext as diffusers' own model test runs it: a random real ``image_rotary_emb``) is the
    complex number ``f + 0i``: cos = f, sin = 0 (a zero table of cos' size). Exact, as eager's complex64 product
    (the factor promoted to ``f + 0i``): ``a f + (-b) 0`` is its ``a f - b 0`` and ``b f + a 0`` its imaginary
    part, each one fp32 rounding of ``a f``, NaN from ``inf * 0`` included."""
    if not freqs.is_complex():
        cos = _pairwise(freqs.to(torch.float32))
        return _rope(x, cos, torch.zeros_like(cos), True)
    f = torch.view_as_real(freqs).to(torch.float32)
    return _rope(x, _pairwise(f[..., 0]), _pairwise(f[..., 1]), True)


def _fused_sana_wm(x, freqs):
    """:func:`_fused_complex` on ``x.permute(0, 1, 3, 2)`` (a view), the result permuted back (the view the
    source returns, of a contiguous ``[B, H, N, D]``)."""
    return _fused_complex(x.permute(0, 1, 3, 2), freqs).permute(0, 1, 3, 2)


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
    b, _, t, _ = cos.shape
    return _fused_ltx2_split_heads(x, cos, sin).reshape(b, t, -1)


def _fused_ltx2_split_heads(x, cos, sin):
    """:func:`_fused_ltx2_split` without the last reshape: ``[B, T, H, D]``, the shape the matched swapaxes
    has."""
    b, h, t, _ = cos.shape
    cos = torch.cat([cos, cos], dim=-1).transpose(1, 2)
    sin = torch.cat([sin, sin], dim=-1).transpose(1, 2)
    return torch.ops.fusegraph.rope(x.reshape(b, t, h, -1), cos, sin, interleaved=False)


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


def _pair_tables(match: Match):
    """Mochi: per-pair tables ``[..., D/2]`` (one shape, dtype and device) -> ``[..., D]``."""
    cos, sin = _val(match, "freqs_cos"), _val(match, "freqs_sin")
    if not _tensors(cos, sin) or cos.dim() < 1 or cos.shape != sin.shape or cos.dtype != sin.dtype \
            or cos.device != sin.device:
        return None
    return (*cos.shape[:-1], 2 * cos.shape[-1]), cos.dtype, cos.device


def _complex_tables(match: Match):
    """complex64 / complex128 ``freqs [..., D/2]`` -> fp32 ``[..., D]``; also a real fp32 / bf16 / fp16 ``freqs``
    (the product is then complex64 whatever x is, and exact in the op: :func:`_fused_complex`).

    complex128 (Lumina2's tables everywhere but on MPS) makes the product float64; the op computes it in fp32
    from fp32-rounded cos / sin, a couple of fp32 ulps from the float64 value. That is taken only where the
    result is rounded to x's dtype anyway (``type_as(x)``: the match's output is in x's dtype); a float64
    result that flows on stays unfused."""
    f, x = _val(match, "freqs"), _val(match, "x")
    if not _tensors(f, x):
        return None
    if f.dtype in (torch.complex64, torch.complex128):
        if f.is_conj():  # view_as_real needs the conj resolved
            return None
    elif f.dtype not in _DTYPES:
        # a real table (see :func:`_fused_complex`): fp32 / bf16 / fp16 only, whose product with x's pairs is
        # exact in the op; a float64 one makes the product complex128, not an fp32 product: refused
        return None
    out = match.output_node().meta.get("val")
    if not _tensors(out) or out.dtype != x.dtype:
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


def _split_heads_tables(match: Match):
    """:func:`_split_tables`, and the matched output in x's dtype (the form has no cast: fp32 x only)."""
    x, out = _val(match, "x"), match.output_node().meta.get("val")
    if not _tensors(x, out) or out.dtype != x.dtype:
        return None
    return _split_tables(match)


def _supported(match: Match, rank: int, tables=_real_tables, partial: bool = False,
               transposed: bool = False) -> bool:
    """What the fused kernel takes: float x of the rank the pattern was traced at, D even; cos/sin of one
    shape and dtype (fp32 or x's dtype), last dim D, broadcastable to x without changing x's shape; the
    matched result in x's dtype (the op's output dtype: a form without casts, ``x * cos + rot(x) * sin`` with
    fp32 tables and a bf16 x, gives fp32). ``partial`` (rotary_dim forms): the tables' last dim R is the
    rotated width, even and at most D (D itself may be odd), and they broadcast to ``x[..., :R]``.
    ``transposed`` (SanaWM): the form rotates ``x.transpose(-1, -2)``, whose shape the checks use.

    Runs before the matcher re-traces the search form on the matched shapes: a form traced at rank 4 would
    fail that trace on a rank-3 x, and the failed trace logs error-level tracebacks; a refusal here is silent."""
    x, tables = _val(match, "x"), tables(match)
    if not _tensors(x) or tables is None:
        return False
    shape, dtype, device = tables
    if x.dtype not in _DTYPES or x.dim() != rank:
        return False
    if transposed:
        x = x.transpose(-1, -2)
    if dtype not in (torch.float32, x.dtype) or device != x.device or not 1 <= len(shape) <= rank:
        return False
    out = match.output_node().meta.get("val")
    if _tensors(out) and out.dtype != x.dtype:
        return False
    width = x.shape[-1]
    if partial:
        if not 0 < shape[-1] <= width:
            return False
        width = shape[-1]
    if width % 2 or shape[-1] != width:
        return False
    target = (*x.shape[:-1], width)
    try:
        return tuple(torch.broadcast_shapes(target, shape)) == target
    except RuntimeError:
        return False


# ---- example inputs and the check of a form -----------------------------------------------------------
# Per x dtype, fp32 tables only: a form traced with x.dtype tables gives the same graph (``x.float() * t`` and
# ``x1 * t`` promote in the op, no cast node), which register_replacement drops as a duplicate after tracing it;
# the matcher re-traces with the matched dtypes and _supported takes both.


def _x(x_dtype):
    return torch.empty(2, 5, 3, 16, dtype=x_dtype)  # [B, S, H, D]


def _tables(*shape) -> list:
    """cos and sin (two tensors: tracing one tensor twice would tie the wildcards together)."""
    return [torch.empty(*shape) for _ in range(2)]


def _with_tables(*shape):
    """The example inputs of a form on ``[B, S, H, D]`` x with fp32 cos / sin of ``shape``."""
    return lambda x_dtype: [[_x(x_dtype), *_tables(*shape)]]


def _with_freqs(*shape, dtype=None):
    """The example inputs of a form on ``[B, S, H, D]`` x with one table (complex freqs of the combination's
    dtype, or a real fp32 table)."""
    if dtype is None:
        return lambda x_dtype, freqs_dtype: [[_x(x_dtype), torch.empty(*shape, dtype=freqs_dtype)]]
    return lambda x_dtype: [[_x(x_dtype), torch.empty(*shape, dtype=dtype)]]


def _half_only(examples):
    """Only for a bf16 / fp16 x: the form's casts are no-ops in fp32 (the same graph as another form there),
    which saves its tracing at registration."""
    return lambda x_dtype, *rest: examples(x_dtype, *rest) if x_dtype != torch.float32 else []


def _fp32_only(examples):
    """Only for an fp32 x: a form without casts traces to one graph for every x dtype (bf16 / fp16 x with
    x-dtype tables matches the fp32 trace; with fp32 tables the result is fp32, refused by the output dtype
    check)."""
    return lambda x_dtype, *rest: examples(x_dtype, *rest) if x_dtype == torch.float32 else []


def _check(tables=_real_tables, partial: bool = False, transposed: bool = False):
    """``Form.check_of``: :func:`_supported` at the example x's rank (checked before the matcher's re-trace:
    :func:`_register`)."""
    return lambda inputs: functools.partial(_supported, rank=inputs[0].dim(), tables=tables, partial=partial,
                                            transposed=transposed)


# ---- forms: each search function (copied from diffusers' code paths, minus the no-op .to(device)) and its
# record (replacement, example inputs, check) ------------------------------------------------------------


def _diffusers_interleaved(x, cos, sin):
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


_DIFFUSERS_INTERLEAVED = Form(_diffusers_interleaved, _fused_interleaved, _with_tables(1, 5, 1, 16), check_of=_check())


def _ltx_interleaved(x, cos, sin):
    """LTX's ``apply_rotary_emb`` and LTX2's ``apply_interleaved_rotary_emb``: the interleaved form on
    ``[B, S, C]`` (all heads at once, cos/sin ``[B, S, C]``). ``unflatten`` traces to a view with the pair count
    spelled out where ``reshape(..., -1, 2)`` keeps the -1, hence a form of its own."""
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


# LTX / LTX2: [B, S, C], cos/sin [B, S, C]
_LTX_INTERLEAVED = Form(_ltx_interleaved, _fused_interleaved,
                        lambda x_dtype: [[torch.empty(2, 5, 16, dtype=x_dtype), *_tables(2, 5, 16)]],
                        check_of=_check())


def _diffusers_half(x, cos, sin):
    x_real, x_imag = x.reshape(*x.shape[:-1], 2, -1).unbind(-2)
    x_rotated = torch.cat([-x_imag, x_real], dim=-1)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


_DIFFUSERS_HALF = Form(_diffusers_half, _fused_half, _with_tables(1, 5, 1, 16), check_of=_check())


def _wan(x, freqs_cos, freqs_sin):
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(x)


_WAN = Form(_wan, _fused_wan, _with_tables(1, 5, 1, 16), check_of=_check())


def _mochi(x, freqs_cos, freqs_sin):
    """Mochi's ``apply_rotary_emb`` (nested in ``MochiAttnProcessor2_0``): strided even / odd halves, per-pair
    tables ``[..., D/2]``, results stacked back pairwise: ``out[2i] = x[2i] c[i] - x[2i+1] s[i]``,
    ``out[2i+1] = x[2i] s[i] + x[2i+1] c[i]``. In fp32 the ``.float()`` / ``.to(x.dtype)`` casts are no-ops
    and leave the graph (one form per x dtype, as every form here)."""
    x_even = x[..., 0::2].float()
    x_odd = x[..., 1::2].float()
    cos = (x_even * freqs_cos - x_odd * freqs_sin).to(x.dtype)
    sin = (x_even * freqs_sin + x_odd * freqs_cos).to(x.dtype)
    return torch.stack([cos, sin], dim=-1).flatten(-2)


# x [B, S, H, D] (after unflatten(2, (heads, -1))), per-pair tables [S, H, D/2]
_MOCHI = Form(_mochi, _fused_mochi, _with_tables(5, 3, 8), check_of=_check(_pair_tables))


def _complex(x, freqs):
    """``apply_rotary_emb(use_real=False)`` (Lumina2), Z-Image's and QwenImage's copies of it: x's pairs as
    complex numbers times ``freqs`` (complex64 or complex128, as already unsqueezed to broadcast: the pattern
    starts there, so ``unsqueeze(1)`` and ``unsqueeze(2)`` alike). With complex128 freqs the product and
    ``view_as_real`` are float64 and ``type_as(x)`` is a real cast even for fp32 x (a form of its own)."""
    x_rotated = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_rotated * freqs).flatten(3).type_as(x)


# per (x dtype, freqs dtype): complex128 puts a cast at the end, even for fp32 x
_COMPLEX = Form(_complex, _fused_complex, _with_freqs(1, 5, 1, 8), check_of=_check(_complex_tables))


def _complex_unflatten(x, freqs):
    """SanaWM's ``_apply_ucpe_transform`` (camera path: q, the K‖V concatenation and the output, forward and
    inverse): the complex form on the second half of the head dim, ``rotated.to(float32)``, ``.contiguous()``
    where its last dim is strided, ``view_as_complex(unflatten(-1, (-1, 2)))``, ``view_as_real(... * freqs)
    .flatten(-2, -1).type_as(rotated)``. :func:`_complex`'s ``reshape(..., -1, 2)`` traces to a view that
    keeps the -1 on a contiguous x (it spells the pair count out on a strided one): after the ``.contiguous()``
    the exact re-check refused that form, as ``unflatten`` spells the pair count out (a form of its own). The
    ``.contiguous()`` stays outside the match (the op reads the copy); ``freqs.conj()`` (``inverse_rope``) is
    resolved before the product (``_conj`` → a physical conjugate), so it is an input like any table."""
    x_rotated = torch.view_as_complex(x.to(torch.float32).unflatten(3, (-1, 2)))
    return torch.view_as_real(x_rotated * freqs).flatten(3, 4).type_as(x)


_COMPLEX_UNFLATTEN = Form(_complex_unflatten, _fused_complex, _with_freqs(1, 5, 1, 8), check_of=_check(_complex_tables))


def _hidream(x, freqs_cis):
    """HiDream's ``apply_rope`` (one of q / k): each pair times its own 2x2 matrix ``freqs_cis[..., i, :, :]``."""
    x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs_cis[..., 0] * x_[..., 0] + freqs_cis[..., 1] * x_[..., 1]
    return out.reshape(*x.shape).type_as(x)


_HIDREAM = Form(_hidream, _fused_hidream, _with_freqs(1, 5, 1, 8, 2, 2, dtype=torch.float32),
                check_of=_check(_hidream_tables))


def _ltx2_split(x, cos, sin):
    """LTX2's ``apply_split_rotary_emb`` (``rope_type="split"``, the released LTX-2 checkpoints), the branch
    real models take: q / k ``[B, T, C]`` reshaped to heads, per-head half tables ``[B, H, T, D/2]`` applied to
    both halves: ``out[k] = x[k] c[k] - x[k+h] s[k]``, ``out[k+h] = x[k+h] c[k] + x[k] s[k]`` (the body is
    :func:`_ltx2_split_heads`; traced, the two are one chain)."""
    b, _, t, _ = cos.shape
    return _ltx2_split_heads(x, cos, sin).reshape(b, t, -1).to(dtype=x.dtype)


# x [B, T, H * D], half tables [B, H, T, D/2]
_LTX2_SPLIT = Form(_ltx2_split, _fused_ltx2_split,
                   lambda x_dtype: [[torch.empty(2, 5, 24, dtype=x_dtype), *_tables(2, 3, 5, 4)]],
                   check_of=_check(_split_tables))


def _ltx2_split_heads(x, cos, sin):
    """:func:`_ltx2_split` up to ``out.swapaxes(1, 2)`` (``[B, T, H, D]``): a form of its own for fp32 x. On
    the inductor=True route the form's last ``reshape(b, t, -1)`` is gone: the attention's
    ``unflatten(2, (heads, -1))`` right after it makes the two reshapes one, back to the shape the swapaxes
    has, which Inductor drops as a no-op. (With bf16 / fp16 x the ``.to(x_dtype)`` sits between the two and
    the whole form stays.)"""
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
    return out.swapaxes(1, 2)


# registered once (fp32 x), after the per-dtype forms
_LTX2_SPLIT_HEADS = Form(_ltx2_split_heads, _fused_ltx2_split_heads,
                         lambda: [[torch.empty(2, 5, 24), *_tables(2, 3, 5, 4)]], check_of=_check(_split_heads_tables))


def _rotate_half_slices(x):
    """Cosmos3's and Ideogram4's ``_rotate_half``: ``cat((-x[..., h:], x[..., :h]), -1)``, ``h = D // 2``."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rotate_half_chunk(x):
    """LongCat-Audio's ``_rotate_half`` and the inline rotations of MiniMax-H3, MiniMax-Music3 and Ernie:
    ``first, second = x.chunk(2, -1)``, ``cat((-second, first), -1)``."""
    first, second = x.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def _rotate_half_unflatten(x):
    """Stable Audio 3's ``_rotate_half``: ``x.unflatten(-1, (2, -1)).unbind(-2)``, ``cat((-x2, x1), -1)``."""
    x1, x2 = x.unflatten(-1, (2, -1)).unbind(-2)
    return torch.cat((-x2, x1), dim=-1)


def _half_slices(x, cos, sin):
    """Cosmos3 (x ``[N, H, D]``, cos ``[N, 1, D]``) and Ideogram4 (x ``[B, L, H, D]``, cos ``[B, L, 1, D]``):
    ``x * cos + _rotate_half(x) * sin`` in x's dtype, no casts (the tables in x's dtype; fp32 tables with a
    bf16 / fp16 x would make the result fp32, which the op does not give: refused by the output dtype check)."""
    return x * cos + _rotate_half_slices(x) * sin


# rotate-half by slices / chunk + cat, per (x dtype, layout): Ideogram4 / LongCat-Audio's [B, S, H, D] with
# [1, S, 1, D] tables (layout 4), Cosmos3's [N, H, D] with [N, 1, D] tables (layout 3, no casts)


def _half_layout(x_dtype, layout):
    if layout == 4:
        return [[_x(x_dtype), *_tables(1, 5, 1, 16)]]
    return [[torch.empty(5, 3, 16, dtype=x_dtype), *_tables(5, 1, 16)]]


_HALF_SLICES = Form(_half_slices, _fused_half, _fp32_only(_half_layout), check_of=_check())


def _half_chunk(x, cos, sin):
    """The chunk rotation of :func:`_half_slices` (in x's dtype, no casts)."""
    return x * cos + _rotate_half_chunk(x) * sin


_HALF_CHUNK = Form(_half_chunk, _fused_half, _fp32_only(_half_layout), check_of=_check())


def _half_chunk_cast(x, cos, sin):
    """LongCat-Audio's ``_apply_rotary_emb``: ``(x.float() * cos + _rotate_half(x).float() * sin).to(x.dtype)``
    with the chunk rotation (cos ``[1, S, 1, D]``)."""
    return (x.float() * cos + _rotate_half_chunk(x).float() * sin).to(x.dtype)


# the cast forms only differ from the plain ones for bf16 / fp16 x, and only in layout 4
_HALF_CHUNK_CAST = Form(_half_chunk_cast, _fused_half,
                        _half_only(lambda x_dtype, layout: _half_layout(x_dtype, layout) if layout == 4 else []),
                        check_of=_check())


def _half_slices_cast(x, cos, sin):
    """:func:`_half_chunk_cast` with the slice rotation."""
    return (x.float() * cos + _rotate_half_slices(x).float() * sin).to(x.dtype)


_HALF_SLICES_CAST = Form(_half_slices_cast, _fused_half,
                         _half_only(lambda x_dtype, layout: _half_layout(x_dtype, layout) if layout == 4 else []),
                         check_of=_check())


def _partial_chunk(x, cos, sin):
    """Partial rotary, rotate-half by ``chunk`` on the first ``R = cos.shape[-1]`` channels, the rest passed
    through, math in x's dtype: MiniMax-H3's ``_apply_rotary_emb`` (tables ``.to(x.dtype)[None, :, None, :]``,
    a final ``.contiguous()`` that is no node), MiniMax-Music3's ``_apply_partial_rotary_emb`` (``[S, 1, R]``)
    and Ernie-Image's nested ``apply_rotary_emb`` (``cos(freqs).to(x.dtype)``: the pattern starts at the
    tables, so the ``cos`` / ``sin`` of the angles stay outside it)."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    return torch.cat((x_rot * cos + _rotate_half_chunk(x_rot) * sin, x_pass), dim=-1)


# partial rotary, per (x dtype, R): R = 8 of D = 16, and R = D (Ernie's tables are as wide as the head: the
# ``x[..., :D]`` slice is a no-op that tracing drops, the pass-through is empty)


def _partial_examples(x_dtype, r):
    return [[_x(x_dtype), *_tables(1, 5, 1, r)]]


_PARTIAL_CHUNK = Form(_partial_chunk, _fused_partial_half, _fp32_only(_partial_examples), check_of=_check(partial=True))


def _partial_unflatten_cast(x, cos, sin):
    """Stable Audio 3's ``_apply_rotary_partial``: ``t_rot = t[..., :R].float()``, ``t_rot * cos +
    _rotate_half(t_rot) * sin`` (``cos = freqs.cos()`` ``[S, 1, R]``, fp32), ``cat((t_rot.to(t.dtype),
    t[..., R:]), -1)``."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    x_rot = x_rot.float()
    x_rot = x_rot * cos + _rotate_half_unflatten(x_rot) * sin
    return torch.cat((x_rot.to(x.dtype), x_pass), dim=-1)


_PARTIAL_UNFLATTEN_CAST = Form(_partial_unflatten_cast, _fused_partial_half, _partial_examples,
                               check_of=_check(partial=True))


def _joy(x, cos, sin):
    """JoyImage's ``_apply_rotary_emb`` (and JoyImage-Edit-Plus' batched copy): the interleaved form with the
    rotation built from ``x.float()`` (``_rotate_half(x)``: ``x.float().reshape(..., -1, 2).unbind(-1)``,
    ``stack([-x_imag, x_real], -1).flatten(3)``) and ``type_as(x)``; the same graph as
    :func:`_diffusers_interleaved` for fp32 x, its own for bf16 / fp16."""
    x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated * sin).type_as(x)


_JOY = Form(_joy, _fused_interleaved, _half_only(_with_tables(1, 5, 1, 16)), check_of=_check())


def _complex_f64(x, freqs):
    """AnyFlow's ``apply_rotary_emb`` (and AnyFlow-FAR's copy): the complex form in float64 on CPU / CUDA
    (``view_as_complex(x.to(float64).unflatten(3, (-1, 2)))``, ``view_as_real(... * freqs).flatten(3, 4)``,
    ``type_as(x)``). As with Lumina2's complex128 tables, the op computes in fp32 from fp32-rounded tables:
    a couple of fp32 ulps from the float64 product, taken only because ``type_as(x)`` rounds the result to
    x's dtype anyway (see :func:`_complex_tables`)."""
    x_rotated = torch.view_as_complex(x.to(torch.float64).unflatten(3, (-1, 2)))
    return torch.view_as_real(x_rotated * freqs).flatten(3, 4).type_as(x)


_COMPLEX_F64 = Form(_complex_f64, _fused_complex, _with_freqs(1, 5, 1, 8), check_of=_check(_complex_tables))


def _matrix_sum(x, freqs_cis):
    """Kandinsky 5's ``apply_rotary`` up to its casts: ``x_ = x.reshape(..., -1, 1, 2).float()``,
    ``(rope * x_).sum(-1).reshape(x.shape)`` with a 2x2 matrix per pair (``rope [..., D/2, 2, 2]``,
    ``stack([cos, -sin, sin, cos]).view(2, 2)``): HiDream's product written as a sum. Kandinsky 5 then
    rounds to bf16 and back (``.to(torch.bfloat16)``, ``.type_as(query)``): those casts stay outside the
    match, so for fp32 x the source's bf16 rounding is kept as it is."""
    x_ = x.reshape(*x.shape[:-1], -1, 1, 2).float()
    return (freqs_cis * x_).sum(dim=-1).reshape(*x.shape)


_MATRIX_SUM = Form(_matrix_sum, _fused_hidream, _with_freqs(1, 5, 1, 8, 2, 2, dtype=torch.float32),
                   check_of=_check(_hidream_tables))


def _matrix_sum_cast(x, freqs_cis):
    """Kandinsky 6's (and 6-SR's) ``apply_rotary``: ``(rope.float() * x_).sum(-1).reshape(x.shape)
    .to(x.dtype)`` (fp32 tables: the ``rope.float()`` is no node); Kandinsky 5's with a bf16 x."""
    x_ = x.reshape(*x.shape[:-1], -1, 1, 2).float()
    return (freqs_cis * x_).sum(dim=-1).reshape(*x.shape).to(x.dtype)


_MATRIX_SUM_CAST = Form(_matrix_sum_cast, _fused_hidream,
                        _half_only(_with_freqs(1, 5, 1, 8, 2, 2, dtype=torch.float32)),
                        check_of=_check(_hidream_tables))


def _sana_wm(x, freqs):
    """SanaWM's ``_apply_rotary_emb`` on ``(B, H, D, N)`` features (q / k permuted for its linear attention):
    the complex form on ``x.permute(0, 1, 3, 2)`` (``to(float32)``, ``unflatten(3, (-1, 2))``), the result
    ``flatten(3, 4).permute(0, 1, 3, 2).type_as(x)``; freqs ``[1, 1, N, D/2]`` complex64."""
    x_rotated = torch.view_as_complex(x.permute(0, 1, 3, 2).to(torch.float32).unflatten(3, (-1, 2)))
    x_out = torch.view_as_real(x_rotated * freqs).flatten(3, 4).permute(0, 1, 3, 2)
    return x_out.type_as(x)


# x [B, H, D, N] (a permuted view whose D is unit-stride), freqs [1, 1, N, D/2], per (x dtype, freqs dtype)
_SANA_WM = Form(_sana_wm, _fused_sana_wm,
                lambda x_dtype, freqs_dtype: [[torch.empty(2, 3, 5, 16, dtype=x_dtype).transpose(-1, -2),
                                               torch.empty(1, 1, 5, 8, dtype=freqs_dtype)]],
                check_of=_check(_complex_tables, transposed=True))


def _helios(x, freqs_cos, freqs_sin):
    """Helios' ``apply_rotary_emb_transposed``: Wan's form with the table slices taken at each use
    (``cos[..., 0::2]`` twice, ``sin[..., 1::2]`` twice) from ``freqs_cis.unsqueeze(-2).chunk(2, -1)``
    (the chunk's outputs are the pattern's tables). Freezing's CSE (default route) merges the repeated
    slices, and the graph is Wan's."""
    x_1, x_2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(x)
    out[..., 0::2] = x_1 * freqs_cos[..., 0::2] - x_2 * freqs_sin[..., 1::2]
    out[..., 1::2] = x_1 * freqs_sin[..., 1::2] + x_2 * freqs_cos[..., 0::2]
    return out.type_as(x)


_HELIOS = Form(_helios, _fused_wan, _with_tables(1, 5, 1, 16), check_of=_check())


# ---- pre-steps: inputs freezing's CSE made shared ---------------------------------------------------

_aten = torch.ops.aten


def _is(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == target


def _only_user(node, target):
    users = list(node.users)
    return users[0] if len(users) == 1 and _is(users[0], target) else None


def _wan_group(node: torch.fx.Node, user: torch.fx.Node):
    """Which Wan RoPE instance ``user`` (a user of a shared ``freqs[..., k::2]`` slice or ``empty``) is in.

    A ``mul`` by anything but one of x's pairs (``unbind``) is no Wan table use: all such users stay on one
    node (None). Mochi's RoPE reads its own ``x[..., 0::2]`` (fp32 x: no cast in between) in two products,
    ``x_even * freqs_cos`` and ``x_even * freqs_sin``; a copy per product would block that match."""
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
        return None
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
        copies += give_copies(graph, node, list(groups.values())[1:])
    return copies


_TABLE_OPS = (_aten.select.int, _aten.unsqueeze.default, _aten.neg.default)


def _read_base(node):
    """The tensor a chain of ``select`` / ``slice`` reads (x's pairs / halves: one x per RoPE instance)."""
    while _is(node, _aten.select.int) or _is(node, _aten.slice.Tensor):
        node = node.args[0]
    return node


def _x_of(table, other):
    """The x a table use combines ``table`` with (the tensor ``other`` reads), or None."""
    if not isinstance(other, torch.fx.Node) or other is table or depends_on(other, table):
        return None
    return _read_base(other)


def _table_instance(node: torch.fx.Node, user: torch.fx.Node):
    """The RoPE instance ``user`` (a user of a table node: ``freqs_cis[..., k]``, ``cos.unsqueeze(-2)``,
    ``-sin_u``) is in, named by the x it combines the table with; None when ``user`` is not such a use.

    HiDream: ``freqs_cis[..., k] * x_[..., k]`` (x: ``x_``). LTX2 split: ``split_x * cos_u``,
    ``addcmul(out[half], ±sin_u, split_x[other half])`` (x: ``split_x``). A table op (``-sin_u``) is in the
    instance all its users are in.

    The x a table multiplies is never computed from the table: a product whose other operand is (PRX's RMSNorm
    of ``qkv[0]``: ``x * rsqrt(mean(x**2))`` with x a ``select``) is no table use."""
    if _is(user, _aten.mul.Tensor) and len(user.args) == 2 and not user.kwargs:
        a, b = user.args
        other = b if a is node else a
        return _x_of(node, other)
    if _is(user, _aten.addcmul.default) and len(user.args) == 3 and user.args[1] is node:
        return _x_of(node, user.args[2])
    if any(_is(user, target) for target in _TABLE_OPS) and user.users:
        keys = {_table_instance(user, u) for u in user.users}
        return keys.pop() if len(keys) == 1 else None
    return None


def split_shared_table_ops(graph: torch.fx.Graph) -> int:
    """Freezing's CSE (inductor=True route) merges the table ops q's and k's RoPE compute alike — HiDream's
    ``freqs_cis[..., 0]`` / ``[..., 1]``, LTX2 split's ``cos.unsqueeze(-2)``, ``sin.unsqueeze(-2)`` and
    ``-sin_u`` — and a node shared by two matches blocks both. Each RoPE instance (see
    :func:`_table_instance`) gets its own copy (a view or a table-sized negation), shared within the
    instance as the form reads it; users that are no such use keep the original together. Nodes are visited
    last first, so ``-sin_u`` is split before the ``sin_u`` it reads. Returns the number of copies made."""
    copies = 0
    for node in reversed(list(graph.nodes)):
        if not any(_is(node, target) for target in _TABLE_OPS) or len(node.users) < 2:
            continue
        groups: dict = {}
        rest = []
        for user in node.users:
            key = _table_instance(node, user)
            (groups.setdefault(key, []) if key is not None else rest).append(user)
        if len(groups) + bool(rest) < 2:
            continue
        copies += give_copies(graph, node, list(groups.values())[0 if rest else 1:])
    return copies


# ---- registration ------------------------------------------------------------------------------------


def _entries(pm: PatternMatcherPass) -> set:
    return {id(e) for entries in pm.patterns.values() for e in entries}


def _register(pm: PatternMatcherPass, trace_fn, form: Form, example_inputs) -> None:
    """``register_replacement`` of one form with its check (:func:`_supported` at the example x's rank) checked
    *before* the matcher's re-trace of the search function on the matched shapes, not after it: forms of one
    structure at several ranks (and lookalikes of them) are refused silently instead of by a failed, logged
    trace."""
    check = form.check_of(example_inputs)
    before = _entries(pm)
    register_replacement(form.search, form.replace, example_inputs, trace_fn=trace_fn, pass_dicts=pm,
                         extra_check=check, skip_duplicates=True)
    symbolic = symbolic_recheck(form.search, form.replace, example_inputs, trace_fn)
    for entries in pm.patterns.values():
        for entry in entries:
            if id(entry) not in before:
                entry.extra_check = functools.partial(_checked_first, check, on_symbolic(entry.extra_check, symbolic))


def _checked_first(check, retrace_and_check, match: Match) -> bool:
    return check(match) and retrace_and_check(match)


def _register_forms(pm: PatternMatcherPass, trace_fn, forms, *combination) -> None:
    for form in forms:
        for example_inputs in form.examples(*combination):
            _register(pm, trace_fn, form, example_inputs)


_FREQS_DTYPES = (torch.complex64, torch.complex128)
# The registration order (per x dtype; a group per further combination): a form containing another first.
_PLAIN = (_WAN, _DIFFUSERS_INTERLEAVED, _DIFFUSERS_HALF, _MOCHI, _LTX_INTERLEAVED)
_COMPLEX_FORMS = (_COMPLEX, _COMPLEX_UNFLATTEN)  # per freqs dtype
_MATRIX = (_HIDREAM, _MATRIX_SUM, _HELIOS, _MATRIX_SUM_CAST, _JOY)
_COMPLEX_LATE = (_COMPLEX_F64, _SANA_WM)  # per freqs dtype
_HALF = (_HALF_SLICES, _HALF_CHUNK, _HALF_SLICES_CAST, _HALF_CHUNK_CAST)  # per layout (4, 3)
_PARTIAL = (_PARTIAL_UNFLATTEN_CAST, _PARTIAL_CHUNK)  # per rotated width R (8, 16)
FORMS = (*_PLAIN, *_COMPLEX_FORMS, *_MATRIX, *_COMPLEX_LATE, _LTX2_SPLIT, *_HALF, *_PARTIAL, _LTX2_SPLIT_HEADS)


def register(pm: PatternMatcherPass, opts) -> None:
    """Registers the RoPE source forms, per x dtype (cos/sin fp32 or x's dtype), into ``pm``."""
    del opts  # the pass manager decides whether this family runs
    # casts, table slices / views / negations and buffers merged by freezing's CSE would block matches
    prepare_before(pm, split_shared_casts, split_shared_rope_inputs, split_shared_table_ops)
    # Traced as aot_autograd leaves the graph (views), and with views as reshapes: Inductor's freezing rewrites
    # every view so before its post-grad passes (where the fusion runs on the inductor=True route).
    for trace_fn in (fwd_functional, fwd_functional_reshape):
        reg = functools.partial(_register_forms, pm, trace_fn)
        for x_dtype in _DTYPES:
            reg(_PLAIN, x_dtype)
            for freqs_dtype in _FREQS_DTYPES:
                reg(_COMPLEX_FORMS, x_dtype, freqs_dtype)
            reg(_MATRIX, x_dtype)
            for freqs_dtype in _FREQS_DTYPES:
                reg(_COMPLEX_LATE, x_dtype, freqs_dtype)
            reg((_LTX2_SPLIT,), x_dtype)
            for layout in (4, 3):
                reg(_HALF, x_dtype, layout)
            for r in (8, 16):
                reg(_PARTIAL, x_dtype, r)
        reg((_LTX2_SPLIT_HEADS,))


# ---- lowering, calibration, explain ------------------------------------------------------------------


def _rot(x, interleaved: bool):
    if interleaved:
        pairs = x.unflatten(-1, (-1, 2))
        return torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def lower(out_dtype, x, cos, sin, *, interleaved=True, rotary_dim=None):
    """``fusegraph.rope`` in torch ops."""
    cd = compute_dtype(x, cos, sin)
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    part = x[..., :r].to(cd)
    y = part * cos.to(cd) + _rot(part, bool(interleaved)) * sin.to(cd)
    if r != x.shape[-1]:
        y = torch.cat([y, x[..., r:].to(cd)], dim=-1)
    return y.to(out_dtype)


def _calibration_site(numel, rnd):
    rows = max(numel // ROW, 1)
    heads = max(rows // 64, 1)
    seq = max(numel // (heads * 32), 1)
    x = rnd(1, seq, heads, 32)
    return overload("rope.default"), (x, rnd(1, seq, 1, 32, dt=torch.float32), rnd(1, seq, 1, 32, dt=torch.float32)), \
        {"interleaved": True}


def _anchor(node):
    aten = _anchors.aten
    if _anchors.is_op(node, aten.mul.Tensor) and _anchors.is_complex(node):
        return "complex mul"
    if _anchors.is_op(node, aten.view_as_complex.default) and \
            not any(_anchors.is_op(u, aten.mul.Tensor) for u in node.users):
        return "view_as_complex"
    return None


FAMILY = Family("rope", "enable_rope", register, ops=("rope.default",), lowerings={"rope.default": lower},
                calibration=_calibration_site, candidates=(Candidate(_anchor),), forms=FORMS)
