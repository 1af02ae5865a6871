"""Real models whose RMSNorm / AdaLN / tanh-GELU / gated-residual sites used to be missed: tiny diffusers Mochi,
CogVideoX, Flux2, QwenImage, CogView4, HunyuanVideo 1.5 and HiDream transformers, fp32, random weights (norm
weights and biases included: tiny configs init them to ones/zeros, which hides a dropped weight), through the
fusegraph Backend with ``inductor=False``. Per family, the fused count must equal the sites counted from the
model's own modules, and the output must match eager.

What the counts account for:
* dead code: the last dual-stream block of QwenImage / CogView4 / HunyuanVideo 1.5 / HiDream computes a text
  stream nobody reads; Dynamo drops it (its norm, modulation, GELU and residuals are not in any graph);
* graph breaks: Mochi's attention processor (``nonzero`` in a loop) runs eagerly, so its QK-norms are compiled as
  separate one-module frames; Dynamo compiles such a frame once per input shape and reuses it for every instance.
  ``stats`` counts fused sites per compiled graph, so those are counted per distinct shape.

mul_add is not counted here: the zoo suite (tests/zoo) checks every family's exact count against an independent
site counter for these models.
"""
import pytest
import torch
import torch.nn as nn

from tests.fusion.pattern_checks import compile_and_run



def randomize(model, seed=0):
    """Every 1-D parameter (norm weights and biases, biases of linears) and every parameter a tiny config leaves
    constant is redrawn: norm weights around 1, the rest around 0."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            constant = bool((p == p.reshape(-1)[0]).all())
            if p.dim() > 1 and not constant:
                continue
            noise = torch.randn(p.shape, generator=g)
            is_scale = p.dim() == 1 and name.endswith("weight")
            p.copy_(1.0 + 0.25 * noise if is_scale else noise * (0.1 if p.dim() == 1 else p.shape[-1] ** -0.5))
    return model


def count(model, cls):
    return sum(isinstance(m, cls) for m in model.modules())


# --- Mochi -------------------------------------------------------------------------------------------------


def mochi():
    from diffusers import MochiTransformer3DModel

    m = MochiTransformer3DModel(patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2,
                                pooled_projection_dim=16, in_channels=4, text_embed_dim=16, time_embed_dim=4,
                                max_sequence_length=8)
    inputs = dict(hidden_states=torch.randn(1, 4, 2, 8, 8), encoder_hidden_states=torch.randn(1, 8, 16),
                  timestep=torch.tensor([300.0]), encoder_attention_mask=torch.ones(1, 8, dtype=torch.bool))
    return m, inputs


def mochi_expected(model):
    """RMSNorm: MochiRMSNormZero (norm1, norm1_context) and MochiModulatedRMSNorm (norm2/3/4 and their _context
    twins, norm1_context of the last, context_pre_only block) each normalise once inside the block graphs: 6 + 3
    per full block, 2 + 3 in the last one. The QK-norms (MochiRMSNorm) run in the eagerly executed attention
    processor: one compiled frame per distinct input shape — the video tokens and the text tokens — whatever the
    number of blocks. Gated residuals: norm2/norm4 (and the _context twins in full blocks) are
    ``h + rms(y) * tanh(gate)`` once the norm is fused. AdaLN: norm_out (AdaLayerNormContinuous)."""
    from diffusers.models.transformers.transformer_mochi import MochiTransformerBlock

    blocks = [m for m in model.modules() if isinstance(m, MochiTransformerBlock)]
    full = sum(not b.context_pre_only for b in blocks)
    last = len(blocks) - full
    return dict(rms_norm=8 * full + 5 * last + 2, adaln=1, gelu=0, mul_add=4 * full + 2 * last)


# --- CogVideoX ---------------------------------------------------------------------------------------------


def cogvideox():
    from diffusers import CogVideoXTransformer3DModel

    m = CogVideoXTransformer3DModel(num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
                                    time_embed_dim=2, text_embed_dim=8, num_layers=2, sample_width=8,
                                    sample_height=8, sample_frames=8, patch_size=2, temporal_compression_ratio=4,
                                    max_text_seq_length=8)
    inputs = dict(hidden_states=torch.randn(1, 1, 4, 8, 8), encoder_hidden_states=torch.randn(1, 8, 8),
                  timestep=torch.tensor([300.0]))
    return m, inputs


def cogvideox_expected(model):
    """AdaLN: each CogVideoXLayerNormZero (affine LayerNorm, continuous layout) modulates the video and the text
    stream; norm_out is an AdaLayerNorm (affine, [B, 1, D]). GELU: one FeedForward per block. Gated residuals:
    4 per block (attention and FF, both streams)."""
    from diffusers.models.normalization import CogVideoXLayerNormZero

    blocks = len(model.transformer_blocks)
    return dict(rms_norm=0, adaln=2 * count(model, CogVideoXLayerNormZero) + 1, gelu=blocks, mul_add=4 * blocks)


# --- Flux2 -------------------------------------------------------------------------------------------------


def flux2():
    from diffusers import Flux2Transformer2DModel

    m = Flux2Transformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                timestep_guidance_channels=256, axes_dims_rope=(4, 4, 4, 4))
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(4), torch.arange(4), torch.arange(1))[None]
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(8))[None]
    inputs = dict(hidden_states=torch.randn(1, 16, 4), encoder_hidden_states=torch.randn(1, 8, 32),
                  img_ids=img_ids, txt_ids=txt_ids, timestep=torch.tensor([0.5]), guidance=torch.tensor([3.5]))
    return m, inputs


def flux2_expected(model):
    """AdaLN (``(1 + scale) * norm(x) + shift``): norm1 / norm1_context / norm2 / norm2_context per double block,
    norm per single block, norm_out. RMSNorm: q/k norms (+ added q/k in double blocks). Gated residuals: 4 per
    double block, 1 per single block."""
    nd, ns = len(model.transformer_blocks), len(model.single_transformer_blocks)
    return dict(rms_norm=count(model, nn.RMSNorm) + _diffusers_rms(model), adaln=4 * nd + ns + 1, gelu=0,
                mul_add=4 * nd + ns)


def _diffusers_rms(model):
    from diffusers.models.normalization import RMSNorm

    return count(model, RMSNorm)


MODELS = dict(mochi=(mochi, mochi_expected), cogvideox=(cogvideox, cogvideox_expected),
              flux2=(flux2, flux2_expected))


@pytest.mark.parametrize("name", list(MODELS))
def test_model_sites_fuse_and_match_eager(name):
    make, expected_of = MODELS[name]
    torch.manual_seed(0)
    model, inputs = make()
    model = randomize(model.eval())
    expected = expected_of(model)
    tensors = {k: v for k, v in inputs.items() if isinstance(v, torch.Tensor)}
    others = {k: v for k, v in inputs.items() if not isinstance(v, torch.Tensor)}

    def call(*args):
        return model(**dict(zip(tensors, args)), **others, return_dict=False)[0]

    b, out, eager = compile_and_run(call, *tensors.values(), fullgraph=False, inductor=False)
    got = {k: b.stats.patterns[k] for k in ("rms_norm", "adaln", "gelu")}
    assert got == {k: expected[k] for k in got}, f"fused {got}, the model has {expected} sites"
    torch.testing.assert_close(out, eager, rtol=1e-4, atol=1e-4)
