"""AdaLN fusion (SPEC §3): LayerNorm(elementwise_affine=False)(x) * (1 + scale[:, None]) + shift[:, None]
(AdaLayerNormZero, ZeroSingle, SD35AdaLayerNormZeroX, inline norm2), AdaLayerNormContinuous, Wan's fp32 form with
[B, 1, D] and per-token [B, S, D] modulation -> one fusegraph.adaln each, in the source's output dtype;
lookalikes stay unfused."""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.models.normalization import (AdaLayerNormContinuous, AdaLayerNormZero, AdaLayerNormZeroSingle,
                                            CogVideoXLayerNormZero, FP32LayerNorm, SD35AdaLayerNormZeroX)

from tests.fusion.pattern_checks import assert_matches, assert_ops_gone, compile_and_run, double, fused

DTYPES = [torch.float32, torch.bfloat16]
LN_CHAIN = ("aten.var_mean.correction", "aten.rsqrt.default")
D = 32


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cls", [AdaLayerNormZero, AdaLayerNormZeroSingle])
def test_adalayernorm_zero_fuses(dtype, cls):
    m = cls(D).to(dtype)
    x, emb = torch.randn(2, 7, D, dtype=dtype), torch.randn(2, D, dtype=dtype)

    def f(x, emb):
        return m(x, emb=emb)[0]

    b, out, eager = compile_and_run(f, x, emb, inductor=False)
    assert b.stats.patterns["adaln"] == 1 and fused(b, "adaln") == 1
    assert_ops_gone(b, *LN_CHAIN)
    assert_matches(out, eager, scale=4.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_inline_norm2_fuses(dtype):
    """Flux/SD3 blocks: self.norm2(h) * (1 + scale_mlp[:, None]) + shift_mlp[:, None] (and .unsqueeze(1))."""
    norm2 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)

    def f(h, emb):
        _, _, _, shift_mlp, scale_mlp, _ = emb.chunk(6, dim=1)
        a = norm2(h) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        c = norm2(h * 2) * (1 + scale_mlp.unsqueeze(1)) + shift_mlp.unsqueeze(1)
        return a, c

    h, emb = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, 6 * D, dtype=dtype) * 0.5
    b, out, eager = compile_and_run(f, h, emb, inductor=False)
    assert fused(b, "adaln") == 2
    assert_ops_gone(b, *LN_CHAIN)
    assert_matches(out, eager, scale=4.0, ref64=double(f, h, emb))


@pytest.mark.parametrize("dtype", DTYPES)
def test_adalayernorm_continuous_fuses(dtype):
    m = AdaLayerNormContinuous(D, D, elementwise_affine=False, eps=1e-6).to(dtype)
    x, cond = torch.randn(2, 6, D, dtype=dtype), torch.randn(2, D, dtype=dtype)
    b, out, eager = compile_and_run(m, x, cond, inductor=False)
    assert b.stats.patterns["adaln"] == 1 and fused(b, "adaln") == 1
    assert_ops_gone(b, *LN_CHAIN)
    assert_matches(out, eager, scale=4.0, ref64=double(m, x, cond))


@pytest.mark.parametrize("dtype", DTYPES)
def test_sd35_dual_modulation_of_one_norm_fuses_twice(dtype):
    """SD35AdaLayerNormZeroX modulates one norm twice (msa and msa2): both fuse."""
    m = SD35AdaLayerNormZeroX(D).to(dtype)

    def f(x, emb):
        out = m(x, emb)
        return out[0], out[5]

    x, emb = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, D, dtype=dtype)
    b, out, eager = compile_and_run(f, x, emb, inductor=False)
    assert b.stats.patterns["adaln"] == 2 and fused(b, "adaln") == 2
    assert_ops_gone(b, *LN_CHAIN)
    assert_matches(out, eager, scale=4.0)


def test_norm_also_returned_keeps_the_graph_outputs():
    """The norm's output is returned as well as modulated: the modulation fuses, the returned norm stays."""
    ln = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)

    def f(x, scale, shift):
        n = ln(x)
        return n, n * (1 + scale) + shift

    x, scale, shift = torch.randn(2, 3, D), torch.randn(2, 1, D), torch.randn(2, 1, D)
    b, out, eager = compile_and_run(f, x, scale, shift, inductor=False)
    assert fused(b, "adaln") <= 1
    assert_matches(out, eager)


class WanModulation(nn.Module):
    """Wan's block: (FP32LayerNorm(x.float()) * (1 + scale) + shift).type_as(x), modulation from an fp32 table
    plus temb, chunked: [B, 1, D] (Wan 2.1) or per-token [B, S, D] (Wan 2.2 ti2v)."""

    def __init__(self, per_token):
        super().__init__()
        self.per_token = per_token
        self.norm1 = FP32LayerNorm(D, 1e-6, elementwise_affine=False)
        self.scale_shift_table = nn.Parameter(torch.randn(1, 2, D) / D ** 0.5)

    def forward(self, x, temb):
        if self.per_token:
            shift, scale = (self.scale_shift_table.unsqueeze(0) + temb.float()).chunk(2, dim=2)
            shift, scale = shift.squeeze(2), scale.squeeze(2)
        else:
            shift, scale = (self.scale_shift_table + temb.float()).chunk(2, dim=1)
        return (self.norm1(x.float()) * (1 + scale) + shift).type_as(x)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("per_token", [False, True])
def test_wan_fp32_modulation_fuses(dtype, per_token):
    m = WanModulation(per_token)
    B, S = 2, 6
    x = torch.randn(B, S, D, dtype=dtype)
    temb = torch.randn(B, S, 2, D, dtype=dtype) if per_token else torch.randn(B, 2, D, dtype=dtype)
    b, out, eager = compile_and_run(m, x, temb, inductor=False)
    assert b.stats.patterns["adaln"] == 1 and fused(b, "adaln") == 1
    assert_ops_gone(b, *LN_CHAIN)
    assert out.dtype == dtype
    assert_matches(out, eager, scale=4.0)


def test_layernorm_with_affine_fuses():
    ln = nn.LayerNorm(D, eps=1e-5)
    with torch.no_grad():
        ln.weight.normal_(1.0, 0.2), ln.bias.normal_(0.0, 0.2)

    def f(x, scale, shift):
        return ln(x) * (1 + scale) + shift

    x, scale, shift = torch.randn(2, 5, D), torch.randn(2, 1, D), torch.randn(2, 1, D)
    b, out, eager = compile_and_run(f, x, scale, shift, inductor=False, enable_freezing=False)
    assert fused(b, "adaln") == 1
    assert_matches(out, eager)


@pytest.mark.parametrize("inductor", [False, True])
@pytest.mark.parametrize("noshift", [False, True])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_float32_affine_on_low_precision_x_keeps_x_dtype(dtype, noshift, inductor):
    """An fp32-kept LayerNorm (``_keep_in_fp32_modules``, CogVideoX-style affine norm) on bf16/fp16 activations:
    eager's mixed-dtype layer_norm returns x's dtype, so the modulated result stays bf16/fp16 (the fused op once
    promoted it with the weight's dtype, and a following bf16 linear then raised)."""
    w, b = torch.randn(D) * 0.2 + 1, torch.randn(D) * 0.2
    W = torch.randn(8, D, dtype=dtype) / 4

    def f(x, scale, shift):
        y = F.layer_norm(x, [D], w, b, 1e-6) * (1 + scale)
        return F.linear(y if noshift else y + shift, W)

    x, scale, shift = (torch.randn(2, 5, D, dtype=dtype), torch.randn(2, 1, D, dtype=dtype),
                       torch.randn(2, 1, D, dtype=dtype))
    bk, out, eager = compile_and_run(f, x, scale, shift, inductor=inductor, fusion_choice="always")
    assert bk.stats.patterns["adaln_noshift" if noshift else "adaln"] == 1
    assert out.dtype == eager.dtype == dtype
    assert_matches(out, eager, scale=4.0)


@pytest.mark.parametrize("inductor", [False, True])
@pytest.mark.parametrize("case", ["per_sample_scale", "zero_dim_shift", "rank1_x", "continuous_b1"])
def test_modulation_the_op_refuses_stays_unfused(case, inductor):
    """Shapes eager broadcasts but fusegraph.adaln refuses (a per-sample [B, 1, 1] scale, a 0-dim shift, x of rank
    1, a continuous [B, 1] chunk): the site stays unfused and compiles (it once failed the compile)."""
    x = torch.randn(16) if case == "rank1_x" else torch.randn(2, 5, 16)
    scale, shift = torch.randn(2, 1, 16), torch.randn(2, 1, 16)
    if case == "per_sample_scale":
        scale = torch.randn(2, 1, 1)
    elif case == "zero_dim_shift":
        shift = torch.randn(())
    elif case == "rank1_x":
        scale, shift = torch.randn(16), torch.randn(16)

    def f(x, scale, shift):
        return F.layer_norm(x, [16]) * (1 + scale) + shift

    def continuous(x, scale, shift):
        return F.layer_norm(x, [16]) * (1 + scale)[:, None, :] + shift[:, None, :]

    if case == "continuous_b1":
        f, scale, shift = continuous, torch.randn(2, 1), torch.randn(2, 16)
    bk, out, eager = compile_and_run(f, x, scale, shift, inductor=inductor, fusion_choice="always")
    assert bk.stats.patterns["adaln"] == 0
    assert_matches(out, eager)


def randomize(module):
    """Random weights everywhere, norm weights around 1 and biases around 0: ones/zeros would hide a dropped
    weight or bias."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("norm.weight") else 0.0))
    return module


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cogvideox_affine_continuous_fuses(dtype):
    """CogVideoXLayerNormZero: an affine nn.LayerNorm, then (1 + scale)[:, None, :] and shift[:, None, :] of [B, D]
    chunks, for the video and the text stream (one norm module, two sites)."""
    m = randomize(CogVideoXLayerNormZero(D, D, elementwise_affine=True, eps=1e-5))

    def streams(module):
        def f(x, ctx, temb):
            h, c, _, _ = module(x, ctx, temb)
            return h, c
        return f

    x, ctx, temb = (torch.randn(2, 6, D, dtype=dtype), torch.randn(2, 3, D, dtype=dtype),
                    torch.randn(2, D, dtype=dtype))
    ref64 = double(streams(copy.deepcopy(m).double()), x, ctx, temb)
    b, out, eager = compile_and_run(streams(m.to(dtype)), x, ctx, temb, inductor=False)
    assert b.stats.patterns["adaln"] == 2 and fused(b, "adaln") == 2
    assert_ops_gone(b, *LN_CHAIN)
    assert_matches(out, eager, scale=8.0, ref64=ref64 if dtype == torch.float32 else None)


def flux2_modulation(x, temb):
    """Flux2's blocks: (1 + scale) * norm(x) + shift, scale first, from Flux2Modulation.split's [B, 1, D] chunks."""
    shift, scale, _ = temb.unsqueeze(1).chunk(3, dim=-1)
    return (1 + scale) * F.layer_norm(x, [D], eps=1e-6) + shift


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_flux2_scale_first_modulation_fuses(dtype):
    x, temb = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, 3 * D, dtype=dtype)
    b, out, eager = compile_and_run(flux2_modulation, x, temb, inductor=False)
    assert b.stats.patterns["adaln"] == 1 and fused(b, "adaln") == 1
    assert_ops_gone(b, *LN_CHAIN)
    assert_matches(out, eager, scale=4.0, ref64=double(flux2_modulation, x, temb))


def test_adaln_fuses_under_inductor():
    z = AdaLayerNormZero(D).to(torch.bfloat16)
    c = AdaLayerNormContinuous(D, D, elementwise_affine=False, eps=1e-6).to(torch.bfloat16)

    def f(x, emb):
        return z(x, emb=emb)[0], c(x, emb)

    x, emb = torch.randn(2, 5, D, dtype=torch.bfloat16), torch.randn(2, D, dtype=torch.bfloat16)
    b, out, eager = compile_and_run(f, x, emb, inductor=True)
    assert b.stats.patterns["adaln"] == 2 and fused(b, "adaln") == 2
    assert_matches(out, eager, scale=4.0)


def _sana_wm_block(table):
    """SanaWM's per-frame block modulation (transformer_sana_wm.py, SanaWMBlock.forward): scale/shift [B, F, 1, C]
    chunks, the norm's output reshaped to [B, F, N / F, C] before the modulation."""
    norm1 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)

    def f(x, t):
        B, N, C = x.shape
        num_frames = t.shape[2]
        t = t.reshape(B, num_frames, 6, -1)
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = (table[None, None, :, :] + t).chunk(6, dim=-2)
        x_norm1 = norm1(x).reshape(B, num_frames, -1, C)
        a = (x_norm1 * (1 + scale_msa) + shift_msa).reshape(B, N, C)
        x_norm2 = norm1(x * 2).reshape(B, num_frames, -1, C)
        return a, (x_norm2 * (1 + scale_mlp) + shift_mlp).reshape(B, N, C)

    return f


@pytest.mark.parametrize("inductor", [False, True])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sana_wm_per_frame_modulation_fuses(dtype, inductor):
    """``norm(x).reshape(B, F, -1, C) * (1 + scale) + shift``: the reshape keeps the last dim, so it moves in front
    of the norm (hoist_norm_views) and the plain form fuses with a rank-4 x."""
    f = _sana_wm_block((torch.randn(6, D) / D ** 0.5).to(dtype))
    x, t = torch.randn(2, 12, D, dtype=dtype), (torch.randn(2, 1, 3, 6 * D) * 0.5).to(dtype)
    b, out, eager = compile_and_run(f, x, t, inductor=inductor)
    assert b.stats.patterns["adaln"] == 2 and fused(b, "adaln") == 2, b.stats.patterns
    assert fused(b, "mul_add") == 0
    assert_ops_gone(b, *LN_CHAIN)
    assert_matches(out, eager, scale=4.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sana_wm_final_layer_fuses(dtype):
    """T2IFinalLayer: ``(norm_final(x).reshape(B, F, -1, C) * (1 + scale) + shift).reshape(B, N, C)``."""
    from diffusers.models.transformers.transformer_sana_wm import T2IFinalLayer

    m = T2IFinalLayer(D, (1, 1), 4).to(dtype)
    x, t = torch.randn(2, 12, D, dtype=dtype), (torch.randn(2, 1, 3, D) * 0.5).to(dtype)
    b, out, eager = compile_and_run(m, x, t, inductor=False)
    assert b.stats.patterns["adaln"] == 1 and fused(b, "adaln") == 1, b.stats.patterns
    assert_ops_gone(b, *LN_CHAIN)
    assert_matches(out, eager, scale=8.0, ref64=double(m, x, t))


@pytest.mark.parametrize("inductor", [False, True])
def test_one_plus_scale_shared_by_two_modulations_fuses_twice(inductor):
    """Two norms modulated by one ``1 + scale`` (what CSE makes of two blocks reading the same scale): each
    product gets its own copy of the factor (split_shared_factors) and both fuse."""

    def f(x, scale, shift):
        t = 1 + scale
        a = F.layer_norm(x, [D], eps=1e-6) * t + shift
        return a, F.layer_norm(a * 2, [D], eps=1e-6) * t + shift

    x, scale, shift = torch.randn(2, 5, D), torch.randn(2, 1, D) * 0.5, torch.randn(2, 1, D)
    b, out, eager = compile_and_run(f, x, scale, shift, inductor=inductor)
    assert b.stats.patterns["adaln"] == 2 and fused(b, "adaln") == 2, b.stats.patterns
    assert_ops_gone(b, *LN_CHAIN)
    assert_matches(out, eager)


def lookalike_reshape_changes_last_dim(x, scale, shift):
    """The norm's rows of D are split in two: the norm does not commute with this reshape."""
    B, N, C = x.shape
    return F.layer_norm(x, [C], eps=1e-6).reshape(B, 3, -1, C // 2) * (1 + scale) + shift


def lookalike_reshape_merges_rows(x, scale, shift):
    """Two rows of D become one of 2 D: not the norm's rows either."""
    B, N, C = x.shape
    return F.layer_norm(x, [C], eps=1e-6).reshape(B, 3, -1, 2 * C) * (1 + scale) + shift


@pytest.mark.parametrize("inductor", [False, True])
@pytest.mark.parametrize("fn,width", [(lookalike_reshape_changes_last_dim, D // 2),
                                      (lookalike_reshape_merges_rows, 2 * D)])
def test_reshape_that_changes_the_last_dim_stays_unfused(fn, width, inductor):
    x, scale, shift = torch.randn(2, 12, D), torch.randn(2, 3, 1, width), torch.randn(2, 3, 1, width)
    b, out, eager = compile_and_run(fn, x, scale, shift, inductor=inductor)
    assert b.stats.patterns["adaln"] == 0 and b.stats.patterns["adaln_noshift"] == 0 and fused(b, "adaln") == 0
    assert_matches(out, eager)


# --- lookalikes ------------------------------------------------------------------------------------------


def lookalike_two_plus_scale(x, scale, shift):
    return F.layer_norm(x, [D], eps=1e-6) * (2 + scale) + shift


def lookalike_norm_over_two_dims(x, scale, shift):
    return F.layer_norm(x, list(x.shape[-2:]), eps=1e-6) * (1 + scale) + shift


def lookalike_shift_minus(x, scale, shift):
    return F.layer_norm(x, [D], eps=1e-6) * (1 + scale) - shift


def lookalike_scale_without_one(x, scale, shift):
    return F.layer_norm(x, [D], eps=1e-6) * scale + shift


def lookalike_scale_first_two_plus(x, scale, shift):
    return (2 + scale) * F.layer_norm(x, [D], eps=1e-6) + shift


def lookalike_scale_first_norm_over_two_dims(x, scale, shift):
    return (1 + scale) * F.layer_norm(x, list(x.shape[-2:]), eps=1e-6) + shift


@pytest.mark.parametrize("fn", [lookalike_two_plus_scale, lookalike_norm_over_two_dims, lookalike_shift_minus,
                                lookalike_scale_without_one, lookalike_scale_first_two_plus,
                                lookalike_scale_first_norm_over_two_dims])
def test_lookalikes_stay_unfused(fn):
    x, scale, shift = torch.randn(2, 5, D), torch.randn(2, 1, D), torch.randn(2, 1, D)
    b, out, eager = compile_and_run(fn, x, scale, shift, inductor=False)
    assert b.stats.patterns["adaln"] == 0
    # `norm(x) * (1 + scale) - shift`: the product alone is a no-shift modulation (adaln_noshift), the - stays
    noshift = 1 if fn is lookalike_shift_minus else 0
    assert b.stats.patterns["adaln_noshift"] == noshift and fused(b, "adaln") == noshift
    assert_matches(out, eager)


_W, _B = torch.randn(D) * 0.3 + 1.0, torch.randn(D) * 0.3


def lookalike_affine_continuous_two_plus(x, scale, shift):
    return F.layer_norm(x, [D], _W, _B, 1e-5) * (2 + scale)[:, None, :] + shift[:, None, :]


def lookalike_affine_continuous_norm_over_two_dims(x, scale, shift):
    w, bias = _W.repeat(5, 1), _B.repeat(5, 1)
    return F.layer_norm(x, list(x.shape[-2:]), w, bias, 1e-5) * (1 + scale)[:, None, :] + shift[:, None, :]


@pytest.mark.parametrize("fn", [lookalike_affine_continuous_two_plus, lookalike_affine_continuous_norm_over_two_dims])
def test_affine_continuous_lookalikes_stay_unfused(fn):
    x, scale, shift = torch.randn(2, 5, D), torch.randn(2, D), torch.randn(2, D)
    b, out, eager = compile_and_run(fn, x, scale, shift, inductor=False)
    assert b.stats.patterns["adaln"] == 0 and fused(b, "adaln") == 0
    assert_matches(out, eager)
