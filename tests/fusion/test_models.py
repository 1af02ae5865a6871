"""Real models (SPEC §3): tiny diffusers Flux, SD3.5-style SD3 (qk_norm="rms_norm", a dual-attention block) and
Wan transformers, random weights, through the fusegraph Backend: every rms_norm / rope / adaln site fuses — the
expected count per pattern is derived here from the model's own modules — and the output matches eager.

Numerics: the fused ops round once where eager rounds several times, so after a few blocks the two differ by
more than one op's tolerance; the output is compared with eager at a tolerance per dtype, and the error of
the fused model against a float64 run of the same model must not exceed eager's own error by much."""
import pytest
import torch
import torch.nn as nn
from diffusers import FluxTransformer2DModel, SD3Transformer2DModel, WanTransformer3DModel
from diffusers.models.attention_processor import Attention
from diffusers.models.normalization import (AdaLayerNormContinuous, AdaLayerNormZero, AdaLayerNormZeroSingle,
                                            RMSNorm, SD35AdaLayerNormZeroX)
from diffusers.models.transformers.transformer_flux import FluxAttention
from diffusers.models.transformers.transformer_wan import WanAttention

from tests.fusion.pattern_checks import compile_and_run

FAMILIES = ("rms_norm", "rope", "adaln")
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.bfloat16: dict(rtol=5e-2, atol=5e-2)}


def count(model, cls):
    return sum(isinstance(m, cls) for m in model.modules())


# --- Flux ------------------------------------------------------------------------------------------------


def flux_model():
    return FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=2, num_single_layers=2,
                                  attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                  pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))


def flux_inputs(dtype, B=1, H=4, W=4, T=8):
    grid = torch.meshgrid(torch.zeros(1), torch.arange(H).float(), torch.arange(W).float(), indexing="ij")
    img_ids = torch.stack(grid, -1)
    return dict(hidden_states=torch.randn(B, H * W, 4, dtype=dtype),
                encoder_hidden_states=torch.randn(B, T, 32, dtype=dtype),
                pooled_projections=torch.randn(B, 32, dtype=dtype), timestep=torch.tensor([0.5] * B, dtype=dtype),
                img_ids=img_ids.reshape(-1, 3).float(), txt_ids=torch.zeros(T, 3))


def flux_expected(model):
    """Sites from the modules: every nn.RMSNorm is applied once; RoPE on q and k of every attention; AdaLN in
    every AdaLayerNormZero / ZeroSingle / Continuous and in the inline norm2 / norm2_context of double blocks."""
    double = model.transformer_blocks
    inline = sum(isinstance(getattr(blk, n, None), nn.LayerNorm) for blk in double for n in ("norm2", "norm2_context"))
    expected = dict(rms_norm=count(model, nn.RMSNorm), rope=2 * count(model, FluxAttention),
                    adaln=count(model, AdaLayerNormZero) + count(model, AdaLayerNormZeroSingle)
                    + count(model, AdaLayerNormContinuous) + inline)
    nd, ns = len(double), len(model.single_transformer_blocks)
    # the same numbers from SPEC §3's per-block site list
    assert expected == dict(rms_norm=4 * nd + 2 * ns, rope=2 * nd + 2 * ns, adaln=4 * nd + ns + 1)
    return expected


# --- SD3.5-style SD3 --------------------------------------------------------------------------------------


def sd3_model():
    return SD3Transformer2DModel(sample_size=8, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8,
                                 num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32,
                                 pooled_projection_dim=64, out_channels=4, qk_norm="rms_norm",
                                 dual_attention_layers=(0,))


def sd3_inputs(dtype, B=2, T=7):
    return dict(hidden_states=torch.randn(B, 4, 8, 8, dtype=dtype),
                encoder_hidden_states=torch.randn(B, T, 32, dtype=dtype),
                pooled_projections=torch.randn(B, 64, dtype=dtype), timestep=torch.tensor([3.0] * B, dtype=dtype))


def sd3_expected(model):
    """Every diffusers RMSNorm (qk-norms, added qk-norms, the dual block's attn2 qk-norms) applied once; AdaLN:
    norm1 (two modulations for SD35AdaLayerNormZeroX), norm1_context (Zero or Continuous), inline norm2 and
    norm2_context where the block has it, and norm_out. No RoPE."""
    adaln = 1  # norm_out
    for blk in model.transformer_blocks:
        adaln += 2 if isinstance(blk.norm1, SD35AdaLayerNormZeroX) else 1
        adaln += 1  # norm1_context: AdaLayerNormZero, or AdaLayerNormContinuous in the last (context_pre_only) block
        adaln += 1  # inline norm2
        adaln += blk.norm2_context is not None
    assert count(model, Attention) > 0
    return dict(rms_norm=count(model, RMSNorm), rope=0, adaln=adaln)


# --- Wan -------------------------------------------------------------------------------------------------


def wan_model():
    return WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
                                 out_channels=4, text_dim=16, freq_dim=32, ffn_dim=32, num_layers=2,
                                 cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def wan_inputs(dtype, B=1, T=5):
    return dict(hidden_states=torch.randn(B, 4, 2, 8, 8, dtype=dtype), timestep=torch.tensor([7] * B),
                encoder_hidden_states=torch.randn(B, T, 16, dtype=dtype))


def wan_expected(model):
    """Across-heads nn.RMSNorm on q and k of both attentions; RoPE on q and k of the self-attention (attn1)
    only; AdaLN on norm1 and norm3 of every block (norm2 is a plain affine norm) and on norm_out."""
    blocks = model.blocks
    self_attn = sum(isinstance(blk.attn1, WanAttention) for blk in blocks)
    return dict(rms_norm=count(model, nn.RMSNorm), rope=2 * self_attn, adaln=2 * len(blocks) + 1)


MODELS = dict(flux=(flux_model, flux_inputs, flux_expected), sd3=(sd3_model, sd3_inputs, sd3_expected),
              wan=(wan_model, wan_inputs, wan_expected))

CASES = [("flux", torch.float32, False), ("flux", torch.bfloat16, False), ("flux", torch.bfloat16, True),
         ("sd3", torch.float32, False), ("sd3", torch.bfloat16, False), ("sd3", torch.float32, True),
         ("wan", torch.float32, False), ("wan", torch.bfloat16, False), ("wan", torch.bfloat16, True)]


@pytest.mark.parametrize("name,dtype,inductor", CASES, ids=[f"{n}-{str(d)[6:]}-{'inductor' if i else 'aten'}"
                                                           for n, d, i in CASES])
def test_model_every_site_fuses_and_matches_eager(name, dtype, inductor):
    make, make_inputs, expected_of = MODELS[name]
    torch.manual_seed(0)
    model = make().eval()
    expected = expected_of(model)
    model = model.to(dtype)
    inputs = make_inputs(dtype)

    def run(**kw):
        return model(**kw, return_dict=False)[0]

    def call(*args):
        return run(**dict(zip(inputs, args)))

    b, out, eager = compile_and_run(call, *inputs.values(), fullgraph=False, inductor=inductor)
    got = {k: b.stats.patterns[k] for k in FAMILIES}
    assert got == expected, f"fused {got}, the model has {expected} sites"
    for k in FAMILIES:
        assert b.all_ops[f"fusegraph.{k}.default"] == expected[k]
    # no unfused norm left: every layer norm is an adaln or Wan's affine norm2; every rsqrt is in a fused op
    affine_norms = sum(isinstance(getattr(blk, "norm2", None), nn.LayerNorm) and blk.norm2.elementwise_affine
                       for blk in getattr(model, "blocks", []))
    assert b.all_ops["aten.var_mean.correction"] == affine_norms
    assert b.all_ops["aten.rsqrt.default"] == affine_norms
    assert out.dtype == eager.dtype and out.shape == eager.shape
    torch.testing.assert_close(out, eager, **TOL[dtype])
    if dtype != torch.float32:
        with torch.no_grad():
            ref = model.double()(**{k: v.double() if v.is_floating_point() else v for k, v in inputs.items()},
                                 return_dict=False)[0]
        err_fused = (out.double() - ref).abs().max().item()
        err_eager = (eager.double() - ref).abs().max().item()
        assert err_fused <= 1.5 * err_eager + 1e-3, (err_fused, err_eager)
