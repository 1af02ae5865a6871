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
from ..._core.torch_pattern_matcher import PatternMatcherPass, register_replacement

from ._prepare import prepare_before, split_shared_casts, split_shared_factors
from .adaln import hoist_norm_views, unshare_norms
from .adaln_rms import (_DTYPES, _EPS_MAGIC, _STYLES, _rms, adaln_out_dtype, explicit_rms_calls_during, param_examples,
                        rms_expression_dtype, supported, trace_canonical)

_HALF = (torch.bfloat16, torch.float16)
_scale_only = functools.partial(supported, mods=("scale",))
_scale_only_chunks = functools.partial(supported, mods=("scale",), chunks=True)


# ---- RMSNorm forms --------------------------------------------------------------------------------------


def _fused_rms(x, scale, eps, weight, bias, style):
    out_dtype = adaln_out_dtype(rms_expression_dtype(x, weight, bias, style, scale), x, scale, weight, bias)
    return torch.ops.fusegraph.adaln(x, scale, None, eps, weight=weight, bias=bias, out_dtype=out_dtype, norm="rms")


def _rms_forms(style: str) -> list:
    """(search, replace, number of norm parameters, chunks) for one rms_norm style."""

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

    forms = [
        (affine_zero, fused_affine, 2, False), (affine_zero_scale_first, fused_affine, 2, False),
        (affine_continuous, fused_affine_continuous, 2, True),
        (weight_zero, fused_weight, 1, False), (weight_zero_scale_first, fused_weight, 1, False),
        (weight_continuous, fused_weight_continuous, 1, True),
        (zero, fused, 0, False), (zero_scale_first, fused, 0, False), (continuous, fused_continuous, 0, True),
    ]
    for search, *_ in forms:
        search.__name__ = f"_rms_{search.__name__}_{style}"
    return forms


def _mochi_forms(style: str) -> list:
    """Mochi's upcast: ``(rms_norm(x.float()) * (1 + scale.float())).to(x.dtype)`` for a half x and scale."""

    def mochi_fp32(x, scale, eps):
        return (_rms(x.float(), None, eps, style=style) * (1 + scale.float())).to(x.dtype)

    def fused_mochi_fp32(x, scale, eps):
        return torch.ops.fusegraph.adaln(x, scale, None, eps, out_dtype=x.dtype, norm="rms")

    mochi_fp32.__name__ = f"_rms_mochi_fp32_{style}"
    return [(mochi_fp32, fused_mochi_fp32)]


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
    return torch.ops.fusegraph.adaln(x, scale, None, eps, out_dtype=adaln_out_dtype(_ln_dtype(x, scale), x, scale))


def _fused_ln_continuous(x, scale, eps):
    return _fused_ln_zero(x, scale.unsqueeze(1), eps)


def _fused_ln_fp32(x, scale, eps):
    out_dtype = None if x.dtype == torch.float32 else x.dtype
    return torch.ops.fusegraph.adaln(x, scale, None, eps, out_dtype=out_dtype)


def _fused_ln_affine(x, weight, bias, scale, eps):
    expected = _ln_dtype(x, weight, bias, scale)
    return torch.ops.fusegraph.adaln(x, scale, None, eps, weight=weight, bias=bias,
                                     out_dtype=adaln_out_dtype(expected, x, weight, bias, scale))


def _fused_ln_affine_continuous(x, weight, bias, scale, eps):
    return _fused_ln_affine(x, weight, bias, scale.unsqueeze(1), eps)


# ---- registration ------------------------------------------------------------------------------------


def register(pm: PatternMatcherPass, opts) -> None:
    """Registers the no-shift modulation forms into ``pm``: the RMSNorm ones on the fused rms_norm op (no casts
    in them but Mochi's: float32 and one mixed example suffice), the LayerNorm ones per dtype combination (their
    decomposition holds casts)."""
    del opts  # the pass manager decides whether this family runs
    explicit_rms_calls_during(pm)
    prepare_before(pm, split_shared_factors, functools.partial(unshare_norms, shift=False), split_shared_casts,
                   hoist_norm_views)
    reg = functools.partial(
        register_replacement,
        trace_fn=trace_canonical,
        pass_dicts=pm,
        scalar_workaround={"eps": _EPS_MAGIC},
        skip_duplicates=True,
    )
    B, S, D = 2, 5, 16
    for style in _STYLES:
        for search, replace, n_params, chunks in _rms_forms(style):
            if n_params == 2 and style == "torch":
                continue  # the rms_norm family makes style="torch" calls without a bias
            for x_dtype, m_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32)):
                x = torch.empty(B, S, D, dtype=x_dtype)
                scale = torch.empty(*((B, D) if chunks else (B, 1, D)), dtype=m_dtype)
                reg(search, replace, [x, *param_examples(n_params, D), scale, _EPS_MAGIC],
                    extra_check=_scale_only_chunks if chunks else _scale_only)
        for search, replace in _mochi_forms(style):
            for x_dtype in _HALF:
                for m_dtype in _HALF:
                    reg(search, replace, [torch.empty(B, S, D, dtype=x_dtype), torch.empty(B, 1, D, dtype=m_dtype),
                                          _EPS_MAGIC], extra_check=_scale_only)
    for x_dtype in _DTYPES:
        x = torch.empty(B, S, D, dtype=x_dtype)
        for m_dtype in _DTYPES:
            scale = torch.empty(B, 1, D, dtype=m_dtype)
            if x_dtype != torch.float32:
                reg(_ln_fp32, _fused_ln_fp32, [x, scale, _EPS_MAGIC], extra_check=_scale_only)  # contains _ln_zero
            reg(_ln_zero, _fused_ln_zero, [x, scale, _EPS_MAGIC], extra_check=_scale_only)
            reg(_ln_zero_scale_first, _fused_ln_zero, [x, scale, _EPS_MAGIC], extra_check=_scale_only)
            wb = [torch.empty(D, dtype=x_dtype) for _ in range(2)]
            reg(_ln_affine, _fused_ln_affine, [x, *wb, scale, _EPS_MAGIC], extra_check=_scale_only)
            chunk = torch.empty(B, D, dtype=m_dtype)
            reg(_ln_continuous, _fused_ln_continuous, [x, chunk, _EPS_MAGIC], extra_check=_scale_only_chunks)
            reg(_ln_affine_continuous, _fused_ln_affine_continuous, [x, *wb, chunk, _EPS_MAGIC],
                extra_check=_scale_only_chunks)
