"""adaln_noshift family: modulation without a shift, ``norm(x) * (1 + scale)`` → ``fusegraph.adaln(shift=None)``,
the norm a LayerNorm (``norm="layer"``) or an RMSNorm (``norm="rms"``).

Source forms (diffusers):

* RMSNorm: ``LuminaRMSNormZero`` (Lumina2 / Lumina-Next: ``self.norm(x) * (1 + scale_msa[:, None])``), the
  inline ``ffn_norm1(h) * (1 + scale_mlp.unsqueeze(1))`` of their blocks, ``MochiRMSNormZero``
  (``norm(h.to(float32)) * (1 + scale_msa[:, None].to(float32))``, then ``.to(h_dtype)``) and
  ``MochiModulatedRMSNorm`` (``norm(h.float()) * (1 + scale.unsqueeze(1).to(float32))``, then ``.to(dtype)``),
  Z-Image (``scale = 1.0 + chunk``, then ``attention_norm1(x) * scale``), Ideogram4, NucleusMoE. As in the
  adaln_rms family, the patterns start at the RMSNorm the rms_norm family has already fused
  (``torch.ops.fusegraph.rms_norm``), so every RMSNorm source form composes: ``n * (1 + scale)``, scale first
  ``(1 + scale) * n``, ``n * (1 + scale)[:, None, :]``, without weight, with a weight, with weight and bias, in
  both rms_norm styles; and Mochi's upcast form ``(n(x.float()) * (1 + scale.float())).to(x.dtype)`` (a bf16 or
  fp16 x; in float32 the casts are no-ops and the plain form matches) → ``adaln(..., out_dtype=x.dtype)``.
* LayerNorm: ``LuminaLayerNormContinuous`` (``norm(x) * (1 + scale)[:, None, :]``), Z-Image's final layer
  (``norm_final(x) * scale`` with ``scale = (1.0 + emb).unsqueeze(1)``): the adaln family's search forms
  without the shift: ``ln(x) * (1 + scale)``, scale first, ``(1 + scale)[:, None, :]``, an affine LayerNorm
  in both layouts, and the fp32-upcast ``(ln(x.float()) * (1 + scale)).type_as(x)``.

Shared values (the same pre-steps as the adaln family's): a LayerNorm that something else also reads gets a copy
for its modulation (NucleusMoE's MoE block: the router reads ``img_normed2``, the MLP ``img_normed2 * (1 +
scale2)``) — ``adaln.unshare_norms(shift=False)``; a ``1 + scale`` two modulations share (QwenImage21: every
block's ``norm(h) * (1 + scale)`` with the same per-token ``torch.where``-selected rows, merged by CSE on the
default route) gets one copy per product — ``_prepare.split_shared_factors``; a view of the norm's output that
keeps the last dim moves in front of the norm — ``adaln.hoist_norm_views``.

The adaln family runs first (and adaln_rms before this one), so a modulation with a shift is never split into
a no-shift adaln and an add. Output dtype, eps capture and the checks (the ``1`` of ``1 + scale``, rank >= 2,
a scale that does not grow x, no outside users of inner nodes after the pre-steps) are those of the adaln and
adaln_rms families.
"""
from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from ..._core.torch_pattern_matcher import PatternMatcherPass

from ._prepare import prepare_before, split_shared_casts, split_shared_factors
from . import _anchors
from ._family import Candidate, Family, Form, register_forms
from ._lowering import adaln as lower, adaln_shift, adaln_site, fused_adaln
from .rms_norm import runtime_eps_form
from .adaln import hoist_norm_views, unshare_norms
from .adaln_rms import rms_modulation_forms
from .adaln_rms import (_DTYPES, _EPS_MAGIC, _STYLES, _rms, adaln_out_dtype, explicit_rms_calls_during, param_examples,
                        rms_expression_dtype, supported, trace_canonical)

_HALF = (torch.bfloat16, torch.float16)
_scale_only = functools.partial(supported, mods=("scale",))
_scale_only_chunks = functools.partial(supported, mods=("scale",), chunks=True)


# ---- RMSNorm forms --------------------------------------------------------------------------------------


def _fused_rms(x, scale, eps, weight, bias, style):
    out_dtype = adaln_out_dtype(rms_expression_dtype(x, weight, bias, style, scale), x, scale, weight, bias)
    return fused_adaln(x, scale, None, eps, weight=weight, bias=bias, out_dtype=out_dtype, norm="rms")


_B, _S, _D = 2, 5, 16


def _rms_examples(n_params: int, chunks: bool):
    """An RMSNorm form's example inputs: the fused rms_norm op holds no casts, so float32 and one mixed example
    suffice."""

    def examples():
        out = []
        for x_dtype, m_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32)):
            x = torch.empty(_B, _S, _D, dtype=x_dtype)
            scale = torch.empty(*((_B, _D) if chunks else (_B, 1, _D)), dtype=m_dtype)
            out.append([x, *param_examples(n_params, _D), scale, _EPS_MAGIC])
        return out

    return examples


def _mochi_examples():
    return [[torch.empty(_B, _S, _D, dtype=x_dtype), torch.empty(_B, 1, _D, dtype=m_dtype), _EPS_MAGIC]
            for x_dtype in _HALF for m_dtype in _HALF]


def _rms_forms(style: str) -> list:
    """The RMSNorm Form records of one rms_norm style."""

    def zero(x, scale, eps):
        return _rms(x, None, eps, style=style) * (1 + scale)

    def zero_scale_first(x, scale, eps):
        return (1 + scale) * _rms(x, None, eps, style=style)

    def continuous(x, scale, eps):
        return _rms(x, None, eps, style=style) * (1 + scale)[:, None, :]

    def weight_zero(x, weight, scale, eps):
        return _rms(x, weight, eps, style=style) * (1 + scale)

    def weight_zero_scale_first(x, weight, scale, eps):
        return (1 + scale) * _rms(x, weight, eps, style=style)

    def weight_continuous(x, weight, scale, eps):
        return _rms(x, weight, eps, style=style) * (1 + scale)[:, None, :]

    def affine_zero(x, weight, bias, scale, eps):
        return _rms(x, weight, eps, bias, style=style) * (1 + scale)

    def affine_zero_scale_first(x, weight, bias, scale, eps):
        return (1 + scale) * _rms(x, weight, eps, bias, style=style)

    def affine_continuous(x, weight, bias, scale, eps):
        return _rms(x, weight, eps, bias, style=style) * (1 + scale)[:, None, :]

    def fused(x, scale, eps):
        return _fused_rms(x, scale, eps, None, None, style)

    def fused_continuous(x, scale, eps):
        return _fused_rms(x, scale.unsqueeze(1), eps, None, None, style)

    def fused_weight(x, weight, scale, eps):
        return _fused_rms(x, scale, eps, weight, None, style)

    def fused_weight_continuous(x, weight, scale, eps):
        return _fused_rms(x, scale.unsqueeze(1), eps, weight, None, style)

    def fused_affine(x, weight, bias, scale, eps):
        return _fused_rms(x, scale, eps, weight, bias, style)

    def fused_affine_continuous(x, weight, bias, scale, eps):
        return _fused_rms(x, scale.unsqueeze(1), eps, weight, bias, style)

    def form(search, replace, n_params, chunks):
        search.__name__ = f"_rms_{search.__name__}_{style}"
        return Form(search, replace, _rms_examples(n_params, chunks),
                    check=_scale_only_chunks if chunks else _scale_only)

    return rms_modulation_forms(style, form, locals())


def _mochi_forms(style: str) -> list:
    """Mochi's upcast: ``(rms_norm(x.float()) * (1 + scale.float())).to(x.dtype)`` for a half x and scale."""

    def mochi_fp32(x, scale, eps):
        return (_rms(x.float(), None, eps, style=style) * (1 + scale.float())).to(x.dtype)

    def fused_mochi_fp32(x, scale, eps):
        return fused_adaln(x, scale, None, eps, out_dtype=x.dtype, norm="rms")

    mochi_fp32.__name__ = f"_rms_mochi_fp32_{style}"
    return [Form(mochi_fp32, fused_mochi_fp32, _mochi_examples, check=_scale_only)]


# ---- LayerNorm forms ------------------------------------------------------------------------------------


def _ln(x, eps):
    return F.layer_norm(x, [x.shape[-1]], None, None, eps)


def _ln_zero(x, scale, eps):
    return _ln(x, eps) * (1 + scale)


def _ln_zero_scale_first(x, scale, eps):
    return (1 + scale) * _ln(x, eps)


def _ln_continuous(x, scale, eps):
    return _ln(x, eps) * (1 + scale)[:, None, :]


def _ln_fp32(x, scale, eps):
    return (_ln(x.float(), eps) * (1 + scale)).type_as(x)


def _ln_affine(x, weight, bias, scale, eps):
    return F.layer_norm(x, [x.shape[-1]], weight, bias, eps) * (1 + scale)


def _ln_affine_continuous(x, weight, bias, scale, eps):
    return F.layer_norm(x, [x.shape[-1]], weight, bias, eps) * (1 + scale)[:, None, :]


def _ln_dtype(x, *others):
    dtype = x.dtype
    for t in others:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def _fused_ln_zero(x, scale, eps):
    return fused_adaln(x, scale, None, eps, out_dtype=adaln_out_dtype(_ln_dtype(x, scale), x, scale))


def _fused_ln_continuous(x, scale, eps):
    return _fused_ln_zero(x, scale.unsqueeze(1), eps)


def _fused_ln_fp32(x, scale, eps):
    out_dtype = None if x.dtype == torch.float32 else x.dtype
    return fused_adaln(x, scale, None, eps, out_dtype=out_dtype)


def _fused_ln_affine(x, weight, bias, scale, eps):
    # layer_norm(x, [D], weight, bias) has x's dtype whatever the affine's (eager's mixed-dtype LayerNorm), and so
    # has adaln(norm="layer")'s own promotion
    expected = _ln_dtype(x, scale)
    return fused_adaln(x, scale, None, eps, weight=weight, bias=bias, out_dtype=adaln_out_dtype(expected, x, scale))


def _fused_ln_affine_continuous(x, weight, bias, scale, eps):
    return _fused_ln_affine(x, weight, bias, scale.unsqueeze(1), eps)


# ---- registration ------------------------------------------------------------------------------------


def _ln_x(x_dtype):
    return torch.empty(_B, _S, _D, dtype=x_dtype)


def _ln_scale(m_dtype):
    return torch.empty(_B, 1, _D, dtype=m_dtype)


def _ln_chunk(m_dtype):
    return torch.empty(_B, _D, dtype=m_dtype)


def _ln_wb(x_dtype):
    return [torch.empty(_D, dtype=x_dtype) for _ in range(2)]


# The RMSNorm forms on the fused rms_norm op (no casts in them but Mochi's: float32 and one mixed example
# suffice), per style; then the LayerNorm forms, per (x dtype, scale dtype) (their decomposition holds casts).
# Each RMSNorm form also with a run-time eps (dynamic=True: an ``rms_norm.eps_tensor`` call, adaln_rms's).
_STATIC_RMS_FORMS = tuple(f for style in _STYLES for f in (*_rms_forms(style), *_mochi_forms(style)))
RMS_FORMS = _STATIC_RMS_FORMS + tuple(runtime_eps_form(f, cast=False) for f in _STATIC_RMS_FORMS)
LN_FORMS = (
    # contains _ln_zero: first; only for a low-precision x
    Form(_ln_fp32, _fused_ln_fp32, lambda xd, md: [[_ln_x(xd), _ln_scale(md), _EPS_MAGIC]] if xd != torch.float32
         else []),
    Form(_ln_zero, _fused_ln_zero, lambda xd, md: [[_ln_x(xd), _ln_scale(md), _EPS_MAGIC]]),
    Form(_ln_zero_scale_first, _fused_ln_zero, lambda xd, md: [[_ln_x(xd), _ln_scale(md), _EPS_MAGIC]]),
    Form(_ln_affine, _fused_ln_affine, lambda xd, md: [[_ln_x(xd), *_ln_wb(xd), _ln_scale(md), _EPS_MAGIC]]),
    Form(_ln_continuous, _fused_ln_continuous, lambda xd, md: [[_ln_x(xd), _ln_chunk(md), _EPS_MAGIC]],
         check=_scale_only_chunks),
    Form(_ln_affine_continuous, _fused_ln_affine_continuous,
         lambda xd, md: [[_ln_x(xd), *_ln_wb(xd), _ln_chunk(md), _EPS_MAGIC]], check=_scale_only_chunks),
)


def register(pm: PatternMatcherPass, opts) -> None:
    """Registers the no-shift modulation forms into ``pm``: the RMSNorm ones, then the LayerNorm ones per dtype
    combination."""
    del opts  # the pass manager decides whether this family runs
    explicit_rms_calls_during(pm)
    prepare_before(pm, split_shared_factors, functools.partial(unshare_norms, shift=False), split_shared_casts,
                   hoist_norm_views)
    reg = functools.partial(register_forms, pm, trace_fn=trace_canonical, check=_scale_only,
                            scalars={"eps": _EPS_MAGIC})
    reg(RMS_FORMS)
    for x_dtype in _DTYPES:
        for m_dtype in _DTYPES:
            reg(LN_FORMS, x_dtype, m_dtype)


# ---- lowering, calibration, explain ------------------------------------------------------------------


def _claims(node) -> bool:
    """A ``fusegraph.adaln`` call of this family: no shift (either norm)."""
    return adaln_shift(node) is None


def _anchor(node):
    """A LayerNorm or a fused RMSNorm followed by ``* (1 + scale)`` with no shift."""
    if _anchors.is_fused_rms_norm(node):
        label = "fusegraph.rms_norm"
    else:
        label = _anchors.layer_norm_label(node)
    return label if label is not None and _anchors.modulation(node) == "noshift" else None


FAMILY = Family("adaln_noshift", "enable_adalayernorm", register, ops=("adaln.default", "adaln.eps_tensor"),
                claims=_claims, lowerings={"adaln.default": lower, "adaln.eps_tensor": lower},
                calibration=adaln_site(norm="layer", shift=False),
                row_wise=True, candidates=(Candidate(_anchor),), forms=RMS_FORMS + LN_FORMS)
