"""adaln_noshift fusion: ``norm(x) * (1 + scale)`` with no shift -> one fusegraph.adaln(shift=None) each, the norm
an RMSNorm (LuminaRMSNormZero, Lumina's inline ffn_norm1, MochiRMSNormZero and MochiModulatedRMSNorm with their
fp32 upcast, Z-Image's ``1.0 + scale`` chunks) or a LayerNorm (LuminaLayerNormContinuous, Z-Image's final layer,
scale-first, affine, fp32-upcast), in the source's output dtype; lookalikes stay unfused (and correct)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.models.normalization import LuminaLayerNormContinuous, LuminaRMSNormZero, RMSNorm
from diffusers.models.transformers.transformer_mochi import MochiModulatedRMSNorm, MochiRMSNormZero

from tests.fusion.pattern_checks import assert_matches, compile_and_run, double, fused

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
LN_CHAIN = ("aten.var_mean.correction", "aten.rsqrt.default")
D = 32


def randomize(module: nn.Module) -> nn.Module:
    """Random weights; norm weights around 1 (ones would hide a dropped weight)."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name.endswith("norm.weight") or name == "weight" else 0.0))
    return module


def assert_one_adaln(b):
    assert b.stats.patterns["adaln_noshift"] == 1 and fused(b, "adaln") == 1, b.stats.patterns
    assert fused(b, "rms_norm") == 0 and b.all_ops["aten.var_mean.correction"] == 0


def rms64(x, eps, weight=None):
    x64 = x.double()
    n = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)
    return n * weight.double() if weight is not None else n


# --- RMSNorm forms ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_lumina_rms_norm_zero_fuses(dtype):
    """LuminaRMSNormZero: RMSNorm(x) (with weight) * (1 + scale_msa[:, None])."""
    m = randomize(LuminaRMSNormZero(D, 1e-5, True)).to(dtype)

    def f(x, emb):
        return m(x, emb)[0]

    x, emb = torch.randn(2, 7, D, dtype=dtype), torch.randn(2, D, dtype=dtype)
    b, out, eager = compile_and_run(f, x, emb, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager, scale=8.0, ref64=double(m, x, emb)[0] if dtype == torch.float32 else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_lumina_inline_ffn_norm_fuses(dtype):
    """Lumina2 / Lumina-Next blocks: ffn_norm1(h) * (1 + scale_mlp.unsqueeze(1)), RMSNorm with a weight."""
    norm = randomize(RMSNorm(D, eps=1e-5)).to(dtype)

    def f(h, scale_mlp):
        return norm(h) * (1 + scale_mlp.unsqueeze(1))

    h, scale = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, D, dtype=dtype) * 0.5
    b, out, eager = compile_and_run(f, h, scale, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager, scale=8.0)
    if dtype == torch.float32:
        torch.testing.assert_close(out, (rms64(h, 1e-5, norm.weight) * (1 + scale.double()[:, None])).float())


@pytest.mark.parametrize("dtype", DTYPES)
def test_mochi_rms_norm_zero_fuses(dtype):
    """MochiRMSNormZero: norm(h.to(float32)) * (1 + scale_msa[:, None].to(float32)), then .to(h's dtype)."""
    m = randomize(MochiRMSNormZero(D, 4 * D)).to(dtype)

    def f(h, emb):
        return m(h, emb)[0]

    h, emb = torch.randn(2, 6, D, dtype=dtype), torch.randn(2, D, dtype=dtype)
    b, out, eager = compile_and_run(f, h, emb, inductor=False)
    assert_one_adaln(b)
    assert out.dtype == dtype
    with torch.no_grad():
        scale = m.linear(m.silu(emb)).chunk(4, dim=1)[0]
    ref64 = rms64(h, m.norm.eps) * (1 + scale.double()[:, None])
    torch.testing.assert_close(out, ref64.to(dtype))  # one rounding of the exact math
    assert_matches(out, eager, scale=4.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mochi_modulated_rms_norm_fuses(dtype):
    """MochiLayerNormContinuous's MochiModulatedRMSNorm: norm(x.float()) * scale, scale = 1 + s.unsqueeze(1).float()."""
    norm = MochiModulatedRMSNorm(eps=1e-6)

    def f(x, s):
        return norm(x, (1 + s.unsqueeze(1).to(torch.float32)))

    x, s = torch.randn(2, 6, D, dtype=dtype), torch.randn(2, D, dtype=dtype) * 0.5
    b, out, eager = compile_and_run(f, x, s, inductor=False)
    assert_one_adaln(b)
    assert out.dtype == dtype
    torch.testing.assert_close(out, (rms64(x, 1e-6) * (1 + s.double()[:, None])).to(dtype))
    assert_matches(out, eager, scale=4.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_z_image_float_one_plus_chunk_fuses(dtype):
    """Z-Image blocks: scale_msa, ... = mod.unsqueeze(1).chunk(4, dim=2); scale_msa = 1.0 + scale_msa;
    attention_norm1(x) * scale_msa (RMSNorm with a weight): ``1.0`` is the same modulation as ``1``."""
    norm = randomize(RMSNorm(D, eps=1e-5)).to(dtype)

    def f(x, mod):
        scale_msa, gate_msa, scale_mlp, gate_mlp = mod.unsqueeze(1).chunk(4, dim=2)
        scale_msa = 1.0 + scale_msa
        return norm(x) * scale_msa, gate_msa.tanh()

    x, mod = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, 4 * D, dtype=dtype) * 0.5
    b, out, eager = compile_and_run(f, x, mod, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager, scale=8.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_scale_first_and_continuous_fuse(dtype):
    norm = RMSNorm(D, eps=1e-6, elementwise_affine=False)

    def f(h, scale):
        return (1 + scale[:, None]) * norm(h), norm(h * 2) * (1 + scale)[:, None, :]

    h, scale = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, D, dtype=dtype) * 0.5
    b, out, eager = compile_and_run(f, h, scale, inductor=False)
    assert b.stats.patterns["adaln_noshift"] == 2 and fused(b, "adaln") == 2 and fused(b, "rms_norm") == 0
    assert_matches(out, eager, scale=4.0, ref64=double(f, h, scale))


def test_torch_rms_norm_per_token_scale_fuses():
    """torch.nn.RMSNorm (style="torch"), per-token [B, S, D] scale."""
    norm = randomize(nn.RMSNorm(D, eps=1e-6))

    def f(h, scale):
        return norm(h) * (1 + scale)

    h, scale = torch.randn(2, 5, D), torch.randn(2, 5, D) * 0.5
    b, out, eager = compile_and_run(f, h, scale, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager)


# --- LayerNorm forms -------------------------------------------------------------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
def test_lumina_layer_norm_continuous_fuses(dtype):
    """LuminaLayerNormContinuous: LayerNorm(x) * (1 + scale)[:, None, :] (no linear_2 here)."""
    m = randomize(LuminaLayerNormContinuous(D, D, elementwise_affine=False, eps=1e-6)).to(dtype)
    x, cond = torch.randn(2, 6, D, dtype=dtype), torch.randn(2, D, dtype=dtype)
    b, out, eager = compile_and_run(m, x, cond, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager, scale=4.0, ref64=double(m, x, cond) if dtype == torch.float32 else None)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_z_image_final_layer_fuses(dtype):
    """Z-Image FinalLayer: scale = (1.0 + adaLN_modulation(c)).unsqueeze(1); norm_final(x) * scale."""
    norm_final = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)

    def f(x, c):
        scale = 1.0 + c
        scale = scale.unsqueeze(1)
        return norm_final(x) * scale

    x, c = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, D, dtype=dtype) * 0.5
    b, out, eager = compile_and_run(f, x, c, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager, scale=4.0, ref64=double(f, x, c))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_layer_norm_scale_first_and_affine_fuse(dtype):
    ln = randomize(nn.LayerNorm(D, eps=1e-5)).to(dtype)

    def f(x, scale):
        return (1 + scale) * F.layer_norm(x, [D], eps=1e-6), ln(x * 2) * (1 + scale)

    x, scale = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, 1, D, dtype=dtype) * 0.5
    b, out, eager = compile_and_run(f, x, scale, inductor=False, enable_freezing=False)
    assert b.stats.patterns["adaln_noshift"] == 2 and fused(b, "adaln") == 2
    assert b.all_ops["aten.var_mean.correction"] == 0
    assert_matches(out, eager, scale=8.0)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_layer_norm_fp32_upcast_fuses(dtype):
    """(LayerNorm(x.float()) * (1 + scale)).type_as(x) with an fp32 scale: adaln(..., out_dtype=x.dtype)."""

    def f(x, scale):
        return (F.layer_norm(x.float(), [D], eps=1e-6) * (1 + scale)).type_as(x)

    x, scale = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, 1, D) * 0.5
    b, out, eager = compile_and_run(f, x, scale, inductor=False)
    assert_one_adaln(b)
    assert out.dtype == dtype
    assert_matches(out, eager, scale=4.0, ref64=double(f, x, scale))


def test_fuses_under_inductor():
    m = randomize(LuminaRMSNormZero(D, 1e-5, True)).to(torch.bfloat16)
    c = LuminaLayerNormContinuous(D, D, elementwise_affine=False, eps=1e-6).to(torch.bfloat16)

    def f(x, emb):
        return m(x, emb)[0], c(x, emb)

    x, emb = torch.randn(2, 5, D, dtype=torch.bfloat16), torch.randn(2, D, dtype=torch.bfloat16)
    b, out, eager = compile_and_run(f, x, emb, inductor=True)
    assert b.stats.patterns["adaln_noshift"] == 2 and fused(b, "adaln") == 2
    assert_matches(out, eager, scale=8.0)


def test_a_shift_after_stays_with_the_adaln_family():
    """With a shift, the adaln family (run first) takes the whole modulation: never split into two ops."""

    def f(x, scale, shift):
        return F.layer_norm(x, [D], eps=1e-6) * (1 + scale) + shift

    x, scale, shift = torch.randn(2, 5, D), torch.randn(2, 1, D), torch.randn(2, 1, D)
    b, out, eager = compile_and_run(f, x, scale, shift, inductor=False)
    assert b.stats.patterns["adaln"] == 1 and b.stats.patterns["adaln_noshift"] == 0 and fused(b, "adaln") == 1
    assert fused(b, "mul_add") == 0
    assert_matches(out, eager)


# --- shared values, views -------------------------------------------------------------------------------


def scale_used_elsewhere(x, scale):
    t = 1 + scale
    return _rms(x) * t, t * 3


def ln_scale_used_elsewhere(x, scale):
    t = 1 + scale[:, 0]  # [B, D]: the continuous form (1 + scale)[:, None, :]
    return F.layer_norm(x, [D], eps=1e-6) * t[:, None, :], t * 3


def norm_used_elsewhere(x, scale):
    """NucleusMoE's MoE block: the router reads the norm the MLP's modulation reads
    (``img_mlp(img_normed2 * (1 + scale2), img_normed2)``)."""
    n = F.layer_norm(x, [D], eps=1e-6)
    return n * (1 + scale), n * 2


@pytest.mark.parametrize("inductor", [False, True])
@pytest.mark.parametrize("fn", [scale_used_elsewhere, ln_scale_used_elsewhere, norm_used_elsewhere])
def test_shared_factor_or_norm_is_split_and_fuses(fn, inductor):
    """A ``1 + scale`` or a norm that something else also reads: the modulation gets its own copy
    (split_shared_factors, unshare_norms(shift=False)), fuses, and the other reader keeps the original."""
    x, scale = torch.randn(2, 5, D), torch.randn(2, 1, D) * 0.5
    b, out, eager = compile_and_run(fn, x, scale, inductor=inductor)
    assert b.stats.patterns["adaln_noshift"] == 1 and fused(b, "adaln") == 1, b.stats.patterns
    assert_matches(out, eager)


@pytest.mark.parametrize("inductor", [False, True])
def test_qwenimage21_shared_selected_rows_fuse(inductor):
    """QwenImage21: both blocks' ``norm(h) * (1 + scale)`` read one per-token scale chosen by
    ``torch.where(target_token_mask, real_rows, zero_row)`` (``_select_modulation_rows``); CSE (or the source)
    shares the ``1 + scale`` between the two modulations."""
    norm1 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
    mask = torch.tensor([False] * 3 + [True] * 5)

    def f(h, params):
        real, zero = params[:-1].unsqueeze(1), params[-1:].unsqueeze(0)
        factor = 1 + torch.where(mask.view(1, -1, 1), real, zero)
        a = norm1(h) * factor
        return a, norm1(a * 2) * factor

    h, params = torch.randn(2, 8, D), torch.randn(3, D) * 0.5
    b, out, eager = compile_and_run(f, h, params, inductor=inductor)
    assert b.stats.patterns["adaln_noshift"] == 2 and fused(b, "adaln") == 2, b.stats.patterns
    assert b.all_ops["aten.var_mean.correction"] == 0
    assert_matches(out, eager)


@pytest.mark.parametrize("inductor", [False, True])
def test_per_frame_reshape_fuses(inductor):
    """``norm(x).reshape(B, F, -1, C) * (1 + scale)`` with a per-frame ``[B, F, 1, C]`` scale (SanaWM's layout,
    without the shift): the reshape keeps the last dim and moves in front of the norm."""

    def f(x, scale):
        B, N, C = x.shape
        return (F.layer_norm(x, [C], eps=1e-6).reshape(B, 3, -1, C) * (1 + scale)).reshape(B, N, C)

    x, scale = torch.randn(2, 12, D), torch.randn(2, 3, 1, D) * 0.5
    b, out, eager = compile_and_run(f, x, scale, inductor=inductor)
    assert b.stats.patterns["adaln_noshift"] == 1 and fused(b, "adaln") == 1, b.stats.patterns
    assert b.all_ops["aten.var_mean.correction"] == 0
    assert_matches(out, eager)


# --- lookalikes ------------------------------------------------------------------------------------------

_rms = RMSNorm(D, eps=1e-6, elementwise_affine=False)


def lookalike_rms_two_plus_scale(x, scale):
    return _rms(x) * (2 + scale)


def lookalike_rms_one_minus_scale(x, scale):
    return _rms(x) * (1 - scale)


def lookalike_rms_over_another_dim(x, scale):
    return x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + 1e-6) * (1 + scale)


def lookalike_ln_two_plus_scale(x, scale):
    return F.layer_norm(x, [D], eps=1e-6) * (2 + scale)


def lookalike_ln_over_two_dims(x, scale):
    return F.layer_norm(x, list(x.shape[-2:]), eps=1e-6) * (1 + scale)


def lookalike_ln_scale_without_one(x, scale):
    return F.layer_norm(x, [D], eps=1e-6) * scale


def lookalike_scale_grows_output(x, scale):
    return _rms(x) * (1 + scale[:, None])  # [B, 1, 1, D] * [B, S, D] -> [B, B, S, D]


def lookalike_ln_scale_grows_output(x, scale):
    return F.layer_norm(x, [D], eps=1e-6) * (1 + scale[:, None])


def lookalike_ln_reshape_changes_last_dim(x, scale):
    B, N, C = x.shape
    return F.layer_norm(x, [C], eps=1e-6).reshape(B, N, 2, C // 2) * (1 + scale[:, :, None, : C // 2])


@pytest.mark.parametrize("fn", [lookalike_rms_two_plus_scale, lookalike_rms_one_minus_scale,
                                lookalike_rms_over_another_dim, lookalike_ln_two_plus_scale,
                                lookalike_ln_over_two_dims, lookalike_ln_scale_without_one,
                                lookalike_scale_grows_output, lookalike_ln_scale_grows_output,
                                lookalike_ln_reshape_changes_last_dim])
def test_lookalikes_stay_unfused(fn):
    x, scale = torch.randn(2, 5, D), torch.randn(2, 1, D) * 0.5
    b, out, eager = compile_and_run(fn, x, scale, inductor=False)
    assert b.stats.patterns["adaln_noshift"] == 0 and fused(b, "adaln") == 0, b.stats.patterns
    assert_matches(out, eager)
