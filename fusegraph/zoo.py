"""The model zoo: a tiny, randomly initialised instance of every diffusers transformer class that builds and runs
on CPU without downloads, with seeded random forward inputs. The zoo tests (tests/zoo), ``python -m fusegraph
explain --model <ClassName>`` and the zoo benchmark use it.

``ZOO[name]()`` / ``build(name, dtype=torch.float32, seed=0)`` -> ``(model, kwargs)``: the model in eval mode,
seeded random weights, and forward kwargs with seeded random inputs; ``inputs(name, dtype, seed)`` gives fresh
inputs of the same shapes (a second call of a compiled model). Configs are of the kind diffusers' own model tests
use (1-2 layers of each block type, hidden 16-64, a few dozen tokens); each runs eagerly on CPU well under a
second.

Weights: after construction every norm weight/bias (LayerNorm, RMSNorm, GroupNorm, any parameter named *norm*)
and every parameter left constant by the model's init (zero-initialised adaLN / gate / output projections,
ones-initialised scales) is redrawn from a seeded generator, so that no fusion site hides behind identity weights
(``x * (1 + 0)`` or a zero gate would make a wrongly fused AdaLN or gated residual look right); so is every
parameter the init leaves uninitialised (``torch.empty``: NucleusMoE's expert weights), named in ``_EMPTY_PARAMS``.

Classes of ``diffusers.models.transformers`` (diffusers 0.42.1) not in the zoo, and why: ``NOT_INCLUDED`` below.
In short: building blocks or non-DiT models (UNet-internal Transformer2DModel / TransformerTemporalModel /
DualTransformer2DModel / DreamLiteTransformer2DModel, PriorTransformer, T5FilmDecoder, an RVQ depth decoder, a
protein model). Every diffusion-transformer class of diffusers.models.transformers is in the zoo (68), each given a
config and inputs written and checked by hand. A few classes have a second entry, ``<Class>@diffusers-test``: the
init dict and input shapes of diffusers' own model test of the class (tests/models/transformers/test_models_
transformer_*.py in the diffusers repository), kept beside ours as checks of the RoPE forms: LuminaNext's test passes a
real-valued random rotary table (a form of its own), Mochi's and Cosmos3's (head_dim 6, no text QK-norm, one vision
token) fuse with the forms ours need.
"""
from __future__ import annotations

import functools
from typing import Callable

import torch

# name -> (diffusers class name, init kwargs, inputs(generator, batch) -> kwargs, batch size)
_SPECS: dict[str, tuple] = {}
# name -> names of parameters the class's __init__ leaves uninitialised (``torch.empty``, filled only by a
# checkpoint): ``build`` draws them like the constant ones, or they would hold whatever memory held
_EMPTY_PARAMS: dict[str, tuple[str, ...]] = {}

_NOT_DIT = "not a diffusion-transformer backbone of the kind fusegraph targets"
NOT_INCLUDED: dict[str, str] = {
    "Transformer2DModel": "UNet-internal building block (its DiT/PixArt uses are DiTTransformer2DModel / "
                          "PixArtTransformer2DModel, both in the zoo)",
    "TransformerTemporalModel": "UNet-internal temporal block; " + _NOT_DIT,
    "DualTransformer2DModel": "wrapper of two Transformer2DModel (Versatile Diffusion UNet); " + _NOT_DIT,
    "PriorTransformer": "CLIP-embedding prior (unCLIP/Shap-E); " + _NOT_DIT,
    "T5FilmDecoder": "spectrogram T5 decoder; " + _NOT_DIT,
    "MiniMaxMusic3RVQDepthDecoder": "RVQ depth decoder of an audio model; " + _NOT_DIT,
    "RFD4ProteinaTransformer": "protein-structure model; " + _NOT_DIT,
    "DreamLiteTransformer2DModel": "UNet-internal building block (Transformer2DModel's continuous-input branch inside "
                                   "the DreamLite UNet); its GQA + qk-norm attention runs only with the processor the "
                                   "UNet installs (DreamLiteAttnProcessor2_0): standalone, num_kv_heads < heads makes "
                                   "the default AttnProcessor2_0 fail in norm_q ('The size of tensor a (8) must match "
                                   "the size of tensor b (16)'); " + _NOT_DIT,
}


def _spec(name: str, cls: str | None = None, batch: int = 2, **init):
    """Registers a zoo entry: the decorated function makes the forward kwargs from a generator and a batch size."""
    def register(fn):
        _SPECS[name] = (cls or name, init, fn, batch)
        return fn
    return register


def _r(g: torch.Generator, *shape, scale: float = 1.0) -> torch.Tensor:
    return torch.randn(*shape, generator=g) * scale


def _t(g: torch.Generator, b: int, high: float = 1000.0) -> torch.Tensor:
    """Random timesteps in (0, high), not integers: an integral timestep would not exercise the embedding."""
    return torch.rand(b, generator=g) * high


def _grid_ids(h: int, w: int, t: int = 1, offset: float = 0.0) -> torch.Tensor:
    """Flux-style [h*w, 3] position ids (t, row, col)."""
    ids = torch.zeros(h, w, 3)
    ids[..., 0] = offset
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


# --- Flux family ------------------------------------------------------------------------------------------


@_spec("FluxTransformer2DModel", patch_size=1, in_channels=4, num_layers=2, num_single_layers=2,
       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
       axes_dims_rope=(4, 4, 8))
def _flux(g, b):
    return dict(hidden_states=_r(g, b, 16, 4), encoder_hidden_states=_r(g, b, 8, 32), pooled_projections=_r(g, b, 32),
                timestep=torch.rand(b, generator=g), img_ids=_grid_ids(4, 4), txt_ids=torch.zeros(8, 3))


@_spec("Flux2Transformer2DModel", patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, timestep_guidance_channels=256,
       axes_dims_rope=(4, 4, 4, 4))
def _flux2(g, b, h=4, w=4, t=8):
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1))
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(t))
    return dict(hidden_states=_r(g, b, h * w, 4), encoder_hidden_states=_r(g, b, t, 32),
                img_ids=img_ids[None].expand(b, -1, -1), txt_ids=txt_ids[None].expand(b, -1, -1),
                timestep=torch.rand(b, generator=g), guidance=torch.rand(b, generator=g) * 4)


@_spec("ChromaTransformer2DModel", patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8),
       approximator_num_channels=8, approximator_hidden_dim=16, approximator_layers=1)
def _chroma(g, b):
    return dict(hidden_states=_r(g, b, 16, 4), encoder_hidden_states=_r(g, b, 8, 32), img_ids=_grid_ids(4, 4),
                txt_ids=torch.zeros(8, 3), timestep=torch.rand(b, generator=g))


@_spec("SD3Transformer2DModel", sample_size=8, patch_size=1, in_channels=4, num_layers=2, attention_head_dim=8,
       num_attention_heads=4, caption_projection_dim=32, joint_attention_dim=32, pooled_projection_dim=64,
       out_channels=4, qk_norm="rms_norm", dual_attention_layers=(0,))
def _sd3(g, b):
    return dict(hidden_states=_r(g, b, 4, 8, 8), encoder_hidden_states=_r(g, b, 7, 32),
                pooled_projections=_r(g, b, 64), timestep=_t(g, b))


@_spec("AuraFlowTransformer2DModel", sample_size=8, patch_size=2, in_channels=4, num_mmdit_layers=1,
       num_single_dit_layers=1, attention_head_dim=8, num_attention_heads=4, caption_projection_dim=32,
       joint_attention_dim=32, out_channels=4, pos_embed_max_size=64)
def _auraflow(g, b):
    return dict(hidden_states=_r(g, b, 4, 8, 8), encoder_hidden_states=_r(g, b, 16, 32), timestep=_t(g, b))


@_spec("QwenImageTransformer2DModel", patch_size=2, in_channels=16, out_channels=4, num_layers=2,
       attention_head_dim=16, num_attention_heads=4, joint_attention_dim=16, guidance_embeds=False,
       axes_dims_rope=(8, 4, 4))
def _qwenimage(g, b):
    return dict(hidden_states=_r(g, b, 16, 16), encoder_hidden_states=_r(g, b, 8, 16),
                encoder_hidden_states_mask=torch.ones(b, 8, dtype=torch.long), timestep=torch.rand(b, generator=g),
                img_shapes=[(1, 4, 4)] * b)


@_spec("HiDreamImageTransformer2DModel", patch_size=2, in_channels=4, out_channels=4, num_layers=1,
       num_single_layers=1, attention_head_dim=8, num_attention_heads=4, caption_channels=(8, 4), text_emb_dim=8,
       num_routed_experts=2, num_activated_experts=2, axes_dims_rope=(4, 2, 2), max_resolution=(16, 16),
       llama_layers=(0, 1), force_inference_output=True)
def _hidream(g, b):
    return dict(hidden_states=_r(g, b, 4, 16, 16), encoder_hidden_states_t5=_r(g, b, 8, 8),
                encoder_hidden_states_llama3=_r(g, 2, b, 8, 4), pooled_embeds=_r(g, b, 8), timesteps=_t(g, b))


# --- Wan family -------------------------------------------------------------------------------------------

_WAN = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
            text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
            qk_norm="rms_norm_across_heads", rope_max_seq_len=32)


def _wan_inputs(g, b):
    return dict(hidden_states=_r(g, b, 4, 2, 8, 8), encoder_hidden_states=_r(g, b, 12, 16), timestep=_t(g, b))


_spec("WanTransformer3DModel", **_WAN)(_wan_inputs)
_spec("SkyReelsV2Transformer3DModel", **_WAN)(_wan_inputs)
_spec("ChronoEditTransformer3DModel", **_WAN)(_wan_inputs)


@_spec("WanVACETransformer3DModel", **dict(_WAN, vace_layers=[0], vace_in_channels=12))
def _wan_vace(g, b):
    return dict(_wan_inputs(g, b), control_hidden_states=_r(g, b, 12, 2, 8, 8))


# --- Hunyuan family ---------------------------------------------------------------------------------------

_HUNYUAN_VIDEO = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=10, num_layers=1,
                      num_single_layers=1, num_refiner_layers=1, patch_size=1, patch_size_t=1, guidance_embeds=True,
                      text_embed_dim=16, pooled_projection_dim=8, rope_axes_dim=(2, 4, 4), image_condition_type=None)


@_spec("HunyuanVideoTransformer3DModel", **_HUNYUAN_VIDEO)
def _hunyuan_video(g, b):
    return dict(hidden_states=_r(g, b, 4, 1, 8, 8), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 12, 16),
                pooled_projections=_r(g, b, 8), encoder_attention_mask=torch.ones(b, 12), guidance=_t(g, b))


@_spec("HunyuanVideoFramepackTransformer3DModel", **dict(_HUNYUAN_VIDEO, patch_size=2, has_image_proj=True,
                                                          image_proj_dim=16, has_clean_x_embedder=True))
def _framepack(g, b, f=3, h=4, w=4):
    return dict(hidden_states=_r(g, b, 4, f, h, w), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 12, 16),
                pooled_projections=_r(g, b, 8), encoder_attention_mask=torch.ones(b, 12), guidance=_t(g, b),
                image_embeds=_r(g, b, 12, 16), indices_latents=torch.arange(f),
                latents_clean=_r(g, b, 4, f - 1, h, w), indices_latents_clean=torch.arange(f - 1),
                latents_history_2x=_r(g, b, 4, f - 1, h, w), indices_latents_history_2x=torch.arange(f - 1),
                latents_history_4x=_r(g, b, 4, (f - 1) * 4, h, w),
                indices_latents_history_4x=torch.arange((f - 1) * 4))


@_spec("HunyuanVideo15Transformer3DModel", batch=1, in_channels=4, out_channels=4, num_attention_heads=2,
       attention_head_dim=8, num_layers=2, num_refiner_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1,
       text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=12, rope_axes_dim=(2, 2, 4), target_size=16,
       task_type="t2v")
def _hunyuan_video15(g, b):
    return dict(hidden_states=_r(g, b, 4, 1, 8, 8), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 6, 16),
                encoder_hidden_states_2=_r(g, b, 4, 8), encoder_attention_mask=torch.ones(b, 6),
                encoder_attention_mask_2=torch.ones(b, 4), image_embeds=torch.zeros(b, 3, 12))


@_spec("HunyuanImageTransformer2DModel", in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
       num_layers=1, num_single_layers=1, num_refiner_layers=1, patch_size=(1, 1), text_embed_dim=16,
       rope_axes_dim=(4, 4))
def _hunyuan_image(g, b):
    return dict(hidden_states=_r(g, b, 4, 8, 8), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 8, 16),
                encoder_attention_mask=torch.ones(b, 8))


@_spec("HunyuanDiT2DModel", sample_size=8, patch_size=2, in_channels=4, num_layers=1, attention_head_dim=8,
       num_attention_heads=2, cross_attention_dim=8, cross_attention_dim_t5=8, pooled_projection_dim=4,
       hidden_size=16, text_len=4, text_len_t5=4, activation_fn="gelu-approximate")
def _hunyuan_dit(g, b):
    from diffusers.models.embeddings import get_2d_rotary_pos_embed

    cos, sin = get_2d_rotary_pos_embed(8, ((0, 0), (4, 4)), (4, 4))
    return dict(hidden_states=_r(g, b, 4, 8, 8), encoder_hidden_states=_r(g, b, 4, 8),
                text_embedding_mask=torch.ones(b, 4), encoder_hidden_states_t5=_r(g, b, 4, 8),
                text_embedding_mask_t5=torch.ones(b, 4), timestep=_t(g, b),
                image_meta_size=torch.tensor([[1024.0, 1024, 16, 16, 0, 0]] * b), style=torch.zeros(b, dtype=torch.long),
                image_rotary_emb=[cos.float(), sin.float()])


# --- Lumina, Z-Image, OmniGen -----------------------------------------------------------------------------


@_spec("Lumina2Transformer2DModel", sample_size=8, patch_size=2, in_channels=4, hidden_size=24, num_layers=2,
       num_refiner_layers=1, num_attention_heads=3, num_kv_heads=1, multiple_of=2, ffn_dim_multiplier=None,
       norm_eps=1e-5, scaling_factor=1.0, axes_dim_rope=(4, 2, 2), axes_lens=(128, 128, 128), cap_feat_dim=32)
def _lumina2(g, b):
    return dict(hidden_states=_r(g, b, 4, 8, 8), encoder_hidden_states=_r(g, b, 8, 32),
                timestep=torch.rand(b, generator=g), encoder_attention_mask=torch.ones(b, 8, dtype=torch.bool))


@_spec("LuminaNextDiT2DModel", sample_size=8, patch_size=2, in_channels=4, hidden_size=24, num_layers=2,
       num_attention_heads=3, num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None, norm_eps=1e-5,
       learn_sigma=False, qk_norm=True, cross_attention_dim=32, scaling_factor=1.0)
def _lumina_next(g, b):
    from diffusers.models.embeddings import get_2d_rotary_pos_embed_lumina

    return dict(hidden_states=_r(g, b, 4, 8, 8), encoder_hidden_states=_r(g, b, 8, 32),
                timestep=torch.rand(b, generator=g), encoder_mask=torch.ones(b, 8),
                image_rotary_emb=get_2d_rotary_pos_embed_lumina(8, 16, 16), cross_attention_kwargs={})


# diffusers' own model test (tests/models/transformers/test_models_transformer_lumina.py): its init dict and input
# shapes, a real-valued random [384, 384, 4] image_rotary_emb included (the stock tables are complex; a real one
# makes the complex product of each pair a product by a real number)
@_spec("LuminaNextDiT2DModel@diffusers-test", cls="LuminaNextDiT2DModel", sample_size=16, patch_size=2, in_channels=4,
       hidden_size=24, num_layers=2, num_attention_heads=3, num_kv_heads=1, multiple_of=16, ffn_dim_multiplier=None,
       norm_eps=1e-5, learn_sigma=False, qk_norm=True, cross_attention_dim=32, scaling_factor=1.0)
def _lumina_next_diffusers_test(g, b):
    return dict(hidden_states=_r(g, b, 4, 16, 16), encoder_hidden_states=_r(g, b, 16, 32),
                timestep=torch.rand(b, generator=g), encoder_mask=_r(g, b, 16), image_rotary_emb=_r(g, 384, 384, 4),
                cross_attention_kwargs={})


@_spec("ZImageTransformer2DModel", batch=1, all_patch_size=(2,), all_f_patch_size=(1,), in_channels=16, dim=32,
       n_layers=1, n_refiner_layers=1, n_heads=2, n_kv_heads=2, qk_norm=True, cap_feat_dim=16, rope_theta=256.0,
       t_scale=1000.0, axes_dims=[8, 4, 4], axes_lens=[256, 32, 32])
def _z_image(g, b):
    return dict(x=[_r(g, 16, 1, 8, 8) for _ in range(b)], cap_feats=[_r(g, 16, 16) for _ in range(b)],
                t=torch.rand(b, generator=g))


@_spec("OmniGenTransformer2DModel", hidden_size=16, num_attention_heads=4, num_key_value_heads=4,
       intermediate_size=32, num_layers=2, pad_token_id=0, vocab_size=1000, in_channels=4, time_step_dim=4,
       rope_scaling={"long_factor": [1, 2], "short_factor": [1, 2]})
def _omnigen(g, b, h=8, w=8, s=24):
    n = s + 1 + h * w // 4
    return dict(hidden_states=_r(g, b, 4, h, w), timestep=torch.rand(b, generator=g),
                input_ids=torch.randint(0, 10, (b, s), generator=g), input_img_latents=[_r(g, 1, 4, h, w)],
                input_image_sizes={0: [[0, h * w // 4]]}, attention_mask=torch.ones(b, n, n),
                position_ids=torch.arange(n)[None].expand(b, -1).contiguous())


# --- LTX, Mochi, CogVideoX family, CogView ----------------------------------------------------------------


@_spec("LTXVideoTransformer3DModel", in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
       cross_attention_dim=16, num_layers=1, qk_norm="rms_norm_across_heads", caption_channels=16)
def _ltx(g, b, f=2, h=4, w=4):
    return dict(hidden_states=_r(g, b, f * h * w, 4), encoder_hidden_states=_r(g, b, 8, 16), timestep=_t(g, b),
                encoder_attention_mask=torch.ones(b, 8, dtype=torch.bool), num_frames=f, height=h, width=w)


@_spec("LTX2VideoTransformer3DModel", in_channels=4, out_channels=4, patch_size=1, patch_size_t=1,
       num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16, audio_in_channels=4,
       audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4, audio_cross_attention_dim=8,
       num_layers=1, qk_norm="rms_norm_across_heads", caption_channels=16, rope_double_precision=False)
def _ltx2(g, b, f=2, h=4, w=4, af=9):
    return dict(hidden_states=_r(g, b, f * h * w, 4), audio_hidden_states=_r(g, b, af, 4),
                encoder_hidden_states=_r(g, b, 8, 16), audio_encoder_hidden_states=_r(g, b, 8, 16),
                timestep=_t(g, b), encoder_attention_mask=torch.ones(b, 8, dtype=torch.bool), num_frames=f,
                height=h, width=w, audio_num_frames=af, fps=25.0)


@_spec("MochiTransformer3DModel", patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2,
       pooled_projection_dim=16, in_channels=4, out_channels=None, qk_norm="rms_norm", text_embed_dim=16,
       time_embed_dim=4, activation_fn="swiglu", max_sequence_length=8)
def _mochi(g, b):
    return dict(hidden_states=_r(g, b, 4, 2, 8, 8), encoder_hidden_states=_r(g, b, 8, 16), timestep=_t(g, b),
                encoder_attention_mask=torch.ones(b, 8, dtype=torch.bool))


# diffusers' own model test (tests/models/transformers/test_models_transformer_mochi.py): its init dict and inputs
@_spec("MochiTransformer3DModel@diffusers-test", cls="MochiTransformer3DModel", patch_size=2, num_attention_heads=2,
       attention_head_dim=8, num_layers=2, pooled_projection_dim=16, in_channels=4, out_channels=None,
       qk_norm="rms_norm", text_embed_dim=16, time_embed_dim=4, activation_fn="swiglu", max_sequence_length=16)
def _mochi_diffusers_test(g, b):
    return dict(hidden_states=_r(g, b, 4, 2, 16, 16), encoder_hidden_states=_r(g, b, 16, 16),
                timestep=torch.randint(0, 1000, (b,), generator=g),
                encoder_attention_mask=torch.ones(b, 16, dtype=torch.bool))


@_spec("CogVideoXTransformer3DModel", num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
       time_embed_dim=2, text_embed_dim=8, num_layers=2, sample_width=8, sample_height=8, sample_frames=8,
       patch_size=2, patch_size_t=None, temporal_compression_ratio=4, max_text_seq_length=8,
       use_rotary_positional_embeddings=True)
def _cogvideox(g, b):
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    cos, sin = get_3d_rotary_pos_embed(16, ((0, 0), (4, 4)), (4, 4), 1)
    return dict(hidden_states=_r(g, b, 1, 4, 8, 8), encoder_hidden_states=_r(g, b, 8, 8), timestep=_t(g, b),
                image_rotary_emb=(cos, sin))


@_spec("ConsisIDTransformer3DModel", num_attention_heads=2, attention_head_dim=16, in_channels=4, out_channels=4,
       time_embed_dim=2, text_embed_dim=8, num_layers=1, sample_width=8, sample_height=8, sample_frames=8,
       patch_size=2, temporal_compression_ratio=4, max_text_seq_length=8, cross_attn_interval=1, is_kps=False,
       is_train_face=True, cross_attn_dim_head=1, cross_attn_num_heads=1, LFE_id_dim=2, LFE_vit_dim=2, LFE_depth=5,
       LFE_dim_head=8, LFE_num_heads=2, LFE_num_id_token=1, LFE_num_querie=1, LFE_output_dim=21, LFE_ff_mult=1,
       LFE_num_scale=1, use_rotary_positional_embeddings=True)
def _consisid(g, b):
    from diffusers.models.embeddings import get_3d_rotary_pos_embed

    cos, sin = get_3d_rotary_pos_embed(16, ((0, 0), (4, 4)), (4, 4), 1)
    return dict(hidden_states=_r(g, b, 1, 4, 8, 8), encoder_hidden_states=_r(g, b, 8, 8), timestep=_t(g, b),
                image_rotary_emb=(cos, sin), id_vit_hidden=[_r(g, b, 2, 2)], id_cond=_r(g, b, 2))


def _cogview_inputs(g, b):
    size = torch.tensor([[64, 64]] * b)
    return dict(hidden_states=_r(g, b, 4, 8, 8), encoder_hidden_states=_r(g, b, 8, 8), timestep=_t(g, b),
                original_size=size, target_size=size.clone(), crop_coords=torch.zeros(b, 2, dtype=torch.long))


_spec("CogView3PlusTransformer2DModel", patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4,
      num_attention_heads=2, out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=2,
      pos_embed_max_size=8, sample_size=8)(_cogview_inputs)
_spec("CogView4Transformer2DModel", patch_size=2, in_channels=4, num_layers=2, attention_head_dim=4,
      num_attention_heads=4, out_channels=4, text_embed_dim=8, time_embed_dim=8, condition_dim=4)(_cogview_inputs)


# --- PixArt / DiT / Sana / Latte / Allegro / Cosmos / EasyAnimate / StableAudio ----------------------------


@_spec("PixArtTransformer2DModel", sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8,
       num_attention_heads=2, in_channels=4, cross_attention_dim=16, out_channels=8, attention_bias=True,
       activation_fn="gelu-approximate", num_embeds_ada_norm=8, norm_type="ada_norm_single",
       norm_elementwise_affine=False, norm_eps=1e-6, use_additional_conditions=False, caption_channels=None)
def _pixart(g, b):
    return dict(hidden_states=_r(g, b, 4, 8, 8), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 8, 16),
                added_cond_kwargs={"aspect_ratio": None, "resolution": None})


@_spec("DiTTransformer2DModel", in_channels=4, out_channels=8, activation_fn="gelu-approximate",
       num_attention_heads=2, attention_head_dim=8, attention_bias=True, num_layers=1, norm_type="ada_norm_zero",
       num_embeds_ada_norm=8, patch_size=2, sample_size=8)
def _dit(g, b):
    return dict(hidden_states=_r(g, b, 4, 8, 8), timestep=_t(g, b),
                class_labels=torch.randint(0, 4, (b,), generator=g))


@_spec("SanaTransformer2DModel", patch_size=1, in_channels=4, out_channels=4, num_layers=1, attention_head_dim=8,
       num_attention_heads=2, num_cross_attention_heads=2, cross_attention_head_dim=8, cross_attention_dim=16,
       caption_channels=8, sample_size=8)
def _sana(g, b):
    return dict(hidden_states=_r(g, b, 4, 8, 8), encoder_hidden_states=_r(g, b, 8, 8), timestep=_t(g, b))


@_spec("LatteTransformer3DModel", sample_size=8, num_layers=1, patch_size=2, attention_head_dim=8,
       num_attention_heads=2, caption_channels=8, in_channels=4, cross_attention_dim=16, out_channels=8,
       attention_bias=True, activation_fn="gelu-approximate", num_embeds_ada_norm=1000, norm_type="ada_norm_single",
       norm_elementwise_affine=False, norm_eps=1e-6, video_length=2)
def _latte(g, b):
    return dict(hidden_states=_r(g, b, 4, 2, 8, 8), encoder_hidden_states=_r(g, b, 8, 8), timestep=_t(g, b),
                enable_temporal_attentions=True)


@_spec("AllegroTransformer3DModel", num_attention_heads=2, attention_head_dim=8, in_channels=4, out_channels=4,
       num_layers=1, cross_attention_dim=16, sample_width=8, sample_height=8, sample_frames=8, caption_channels=8)
def _allegro(g, b):
    return dict(hidden_states=_r(g, b, 4, 2, 8, 8), encoder_hidden_states=_r(g, b, 8, 8), timestep=_t(g, b))


@_spec("CosmosTransformer3DModel", in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12,
       num_layers=2, mlp_ratio=2, text_embed_dim=16, adaln_lora_dim=4, max_size=(4, 32, 32), patch_size=(1, 2, 2),
       rope_scale=(2.0, 1.0, 1.0), concat_padding_mask=False, extra_pos_embed_type="learnable")
def _cosmos(g, b):
    return dict(hidden_states=_r(g, b, 4, 1, 8, 8), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 8, 16),
                attention_mask=torch.ones(b, 8), fps=30)


@_spec("EasyAnimateTransformer3DModel", attention_head_dim=16, num_attention_heads=2, in_channels=4,
       mmdit_layers=2, num_layers=2, out_channels=4, patch_size=2, sample_height=60, sample_width=90,
       text_embed_dim=16, time_embed_dim=8, time_position_encoding_type="3d_rope", timestep_activation_fn="silu")
def _easyanimate(g, b):
    return dict(hidden_states=_r(g, b, 4, 2, 8, 8), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 8, 16))


@_spec("StableAudioDiTModel", sample_size=16, in_channels=4, num_layers=2, attention_head_dim=8,
       num_attention_heads=2, num_key_value_attention_heads=1, out_channels=4, cross_attention_dim=16,
       time_proj_dim=16, global_states_input_dim=16, cross_attention_input_dim=16)
def _stable_audio(g, b, n=16):
    from diffusers.models.embeddings import get_1d_rotary_pos_embed

    rotary = get_1d_rotary_pos_embed(4, n + 1, use_real=True, repeat_interleave_real=False)
    return dict(hidden_states=_r(g, b, 4, n), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 8, 16),
                global_hidden_states=_r(g, b, 1, 16), rotary_embedding=rotary)


# --- group 1 ---


@_spec("AceStepTransformer1DModel", hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
       num_key_value_heads=2, head_dim=8, in_channels=24, audio_acoustic_hidden_dim=8, patch_size=2,
       rope_theta=10000.0, sliding_window=4)
def _ace_step(g, b, n=16):
    # 16 frames -> 8 tokens after the stride-2 patchify; a window of 4 keeps the sliding layer's mask non-trivial
    return dict(hidden_states=_r(g, b, n, 8), timestep=torch.rand(b, generator=g),
                timestep_r=torch.rand(b, generator=g), encoder_hidden_states=_r(g, b, 10, 32),
                context_latents=_r(g, b, n, 16))


@_spec("ErnieImageTransformer2DModel", hidden_size=32, num_attention_heads=2, num_layers=2, ffn_hidden_size=48,
       in_channels=8, out_channels=8, patch_size=1, text_in_dim=24, rope_theta=256, rope_axes_dim=(8, 4, 4))
def _ernie_image(g, b, t=8):
    return dict(hidden_states=_r(g, b, 8, 4, 4), timestep=_t(g, b), text_bth=_r(g, b, t, 24),
                text_lens=torch.full((b,), t, dtype=torch.long))


@_spec("Krea2Transformer2DModel", in_channels=16, num_layers=2, attention_head_dim=8, num_attention_heads=4,
       num_key_value_heads=2, intermediate_size=32, timestep_embed_dim=8, text_hidden_dim=16, num_text_layers=3,
       text_num_attention_heads=2, text_num_key_value_heads=1, text_intermediate_size=16, num_layerwise_text_blocks=1,
       num_refiner_text_blocks=1, axes_dims_rope=(4, 2, 2), rope_theta=1000.0)
def _krea2(g, b, h=4, w=4, t=6):
    position_ids = torch.cat([torch.zeros(t, 3), _grid_ids(h, w)])
    return dict(hidden_states=_r(g, b, h * w, 16), encoder_hidden_states=_r(g, b, t, 3, 16),
                timestep=torch.rand(b, generator=g), position_ids=position_ids,
                encoder_attention_mask=torch.ones(b, t, dtype=torch.bool))


@_spec("MiniMaxH3Transformer3DModel", num_attention_heads=2, attention_head_dim=16, hidden_size=24, num_layers=2,
       num_refiner_layers=1, ffn_dim=32, in_channels=4, audio_in_channels=6, patch_size=(1, 2, 2), text_dim=8,
       freq_dim=8, time_embed_hidden_dim=24, time_embed_dim=16, rope_freq_dim=2)
def _minimax_h3(g, b, t=4, a=6, h=4, w=4):
    # packed [text | audio | video] rows; heads of 16 with 2 * 3 * rope_freq_dim = 12 rotated channels (partial,
    # as in the released model); two noise levels (video/text rows use timestep 0, audio rows timestep 1)
    v = h * w
    n = t + a + v
    text, audio, video = torch.arange(t), torch.arange(t, t + a), torch.arange(t + a, n)
    tags = torch.cat([torch.ones(t), torch.full((a,), 2), torch.zeros(v)]).long()
    timestep_indices = torch.cat([torch.zeros(t), torch.ones(a), torch.zeros(v)]).long()
    position_ids = torch.zeros(n, 3)
    position_ids[:, 0] = torch.arange(n)
    position_ids[video, 1:] = _grid_ids(h, w)[:, 1:]
    return dict(hidden_states=_r(g, b, v, 16), audio_hidden_states=_r(g, b, a, 6), encoder_hidden_states=_r(g, b, t, 8),
                timestep=torch.rand(2, generator=g), timestep_indices=timestep_indices, token_tags=tags,
                position_ids=position_ids, video_indices=video, audio_indices=audio, text_indices=text)


@_spec("StableAudio3DiTModel", io_channels=8, patch_size=1, embed_dim=32, depth=2, num_heads=4, cond_token_dim=16,
       global_cond_dim=12, local_add_cond_dim=5, timestep_features_dim=16, ff_mult=2, num_memory_tokens=3)
def _stable_audio3(g, b, n=16):
    # differential attention (the model's default) on; heads of 8 with 4 rotated channels (partial, as released)
    return dict(hidden_states=_r(g, b, 8, n), timestep=torch.rand(b, generator=g),
                encoder_hidden_states=_r(g, b, 6, 16), global_hidden_states=_r(g, b, 12),
                encoder_attention_mask=torch.ones(b, 6, dtype=torch.bool))


_ANYFLOW = dict(patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4,
                text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True, rope_max_seq_len=32)


def _anyflow_inputs(g, b, f=2, h=8, w=8):
    t = _t(g, b)[:, None].expand(b, f).contiguous()  # (B, F) timesteps, the target r below t per frame
    return dict(hidden_states=_r(g, b, f, 4, h, w), timestep=t, r_timestep=t * torch.rand(b, f, generator=g),
                encoder_hidden_states=_r(g, b, 12, 16))


_spec("AnyFlowTransformer3DModel", **_ANYFLOW)(_anyflow_inputs)


@_spec("AnyFlowFARTransformer3DModel", **dict(_ANYFLOW, compressed_patch_size=(1, 4, 4), full_chunk_limit=3))
def _anyflow_far(g, b):
    return dict(_anyflow_inputs(g, b, f=4), chunk_partition=[2, 2])


@_spec("BriaTransformer2DModel", patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 6, 6))
def _bria(g, b):
    return dict(hidden_states=_r(g, b, 16, 4), encoder_hidden_states=_r(g, b, 8, 32), timestep=_t(g, b),
                img_ids=_grid_ids(4, 4), txt_ids=torch.zeros(8, 3))


@_spec("BriaFiboTransformer2DModel", patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, text_encoder_dim=16,
       axes_dims_rope=(4, 6, 6))
def _bria_fibo(g, b):
    # one text-encoder layer per block (num_layers + num_single_layers)
    return dict(hidden_states=_r(g, b, 16, 4), encoder_hidden_states=_r(g, b, 8, 32), timestep=_t(g, b),
                img_ids=_grid_ids(4, 4), txt_ids=torch.zeros(8, 3),
                text_encoder_layers=[_r(g, b, 8, 16) for _ in range(2)])


@_spec("BriaFibo2Transformer2DModel", in_channels=4, patch_size=2, dim=32, n_layers=2, n_refiner_layers=1, n_heads=2,
       cap_feat_dim=16, injection_layer_ids=(1,), perceiver_num_layers=1, min_num_gist_tokens=4,
       max_num_gist_tokens=8, gist_step=4, gist_min_text_len=4, gist_max_text_len=16, axes_dims=(4, 6, 6),
       axes_lens=(32, 16, 16))
def _bria_fibo2(g, b, t=10):
    # encoder_hidden_states: the Perceiver's bundle, then one per injection layer
    return dict(hidden_states=_r(g, b, 4, 8, 8), timestep=torch.rand(b, generator=g),
                encoder_hidden_states=_r(g, b, 2, t, 16))


@_spec("Flux3Transformer2DModel", in_channels=4, cond_in_channels=4, num_layers=1, num_single_layers=1,
       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, timestep_channels=32,
       axes_dims_rope=(4, 4, 4, 4))
def _flux3(g, b, h=4, w=4, t=8):
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1)).float()
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(t)).float()
    return dict(hidden_states=_r(g, b, h * w, 4), encoder_hidden_states=_r(g, b, t, 32),
                timestep=torch.rand(b, generator=g), img_ids=img_ids, txt_ids=txt_ids)


@_spec("GlmImageTransformer2DModel", patch_size=2, in_channels=4, out_channels=4, num_layers=2, attention_head_dim=8,
       num_attention_heads=2, text_embed_dim=32, time_embed_dim=16, condition_dim=8,
       prior_vq_quantizer_codebook_size=64)
def _glm_image(g, b, h=8, w=8):
    return dict(hidden_states=_r(g, b, 4, h, w), encoder_hidden_states=_r(g, b, 12, 32),
                prior_token_id=torch.randint(0, 64, (b, h * w // 4), generator=g),
                prior_token_drop=torch.zeros(b, dtype=torch.bool), timestep=_t(g, b),
                target_size=torch.tensor([[h * 8.0, w * 8.0]] * b), crop_coords=torch.zeros(b, 2))


@_spec("HeliosTransformer3DModel", patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4,
       out_channels=4, text_dim=16, freq_dim=256, ffn_dim=32, num_layers=2, cross_attn_norm=True,
       qk_norm="rms_norm_across_heads", rope_dim=(4, 4, 4))
def _helios(g, b, f=2, h=8, w=8):
    # the stage-1 path the pipeline runs: short / mid / long history latents with their frame indices
    idx = lambda lo, n: torch.arange(lo, lo + n).float()[None].expand(b, -1).contiguous()  # noqa: E731
    return dict(hidden_states=_r(g, b, 4, f, h, w), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 12, 16),
                indices_hidden_states=idx(6, f), indices_latents_history_short=idx(5, 1),
                indices_latents_history_mid=idx(4, 1), indices_latents_history_long=idx(0, 4),
                latents_history_short=_r(g, b, 4, 1, h, w), latents_history_mid=_r(g, b, 4, 1, h, w),
                latents_history_long=_r(g, b, 4, 4, h, w))


_JOY = dict(patch_size=[1, 2, 2], in_channels=16, hidden_size=32, num_attention_heads=2, text_dim=16, num_layers=2,
            rope_dim_list=[4, 6, 6], theta=256)


@_spec("JoyImageEditTransformer3DModel", **_JOY)
def _joyimage(g, b):
    return dict(hidden_states=_r(g, b, 16, 1, 8, 8), encoder_hidden_states=_r(g, b, 12, 16),
                timestep=torch.rand(b, generator=g))


@_spec("JoyImageEditPlusTransformer3DModel", **_JOY)
def _joyimage_plus(g, b, h=4, w=4):
    # patchified input [B, tokens, C, 1, 2, 2]: the target and one reference image of h x w tokens each
    return dict(hidden_states=_r(g, b, 2 * h * w, 16, 1, 2, 2), encoder_hidden_states=_r(g, b, 12, 16),
                encoder_hidden_states_mask=torch.ones(b, 12), timestep=torch.rand(b, generator=g),
                shape_list=[[(1, h, w), (1, h, w)]] * b)


@_spec("Kandinsky5Transformer3DModel", in_visual_dim=4, in_text_dim=16, in_text_dim2=8, time_dim=16, out_visual_dim=4,
       patch_size=(1, 2, 2), model_dim=32, ff_dim=48, num_text_blocks=1, num_visual_blocks=2, axes_dims=(4, 6, 6))
def _kandinsky5(g, b, f=2, h=8, w=8, t=8):
    return dict(hidden_states=_r(g, b, f, h, w, 4), encoder_hidden_states=_r(g, b, t, 16), timestep=_t(g, b),
                pooled_projections=_r(g, b, 8),
                visual_rope_pos=[torch.arange(f), torch.arange(h // 2), torch.arange(w // 2)],
                text_rope_pos=torch.arange(t))


# --- group 2 ----------------------------------------------------------------------------------------------


@_spec("Ideogram4Transformer2DModel", in_channels=16, num_layers=2, attention_head_dim=16, num_attention_heads=2,
       intermediate_size=48, adaln_dim=16, llm_features_dim=24, rope_theta=10_000, mrope_section=(4, 2, 2))
def _ideogram4(g, b, t=8, h=4, w=4):
    from diffusers.models.transformers.transformer_ideogram4 import (IMAGE_POSITION_OFFSET, LLM_TOKEN_INDICATOR,
                                                                      OUTPUT_IMAGE_INDICATOR)

    # one packed sequence per sample: t text tokens, then an h x w image grid (positions offset as the pipeline does)
    text = torch.arange(t)[:, None].expand(t, 3)
    grid = torch.stack([torch.zeros(h * w, dtype=torch.long), torch.arange(h).repeat_interleave(w),
                        torch.arange(w).repeat(h)], dim=-1) + IMAGE_POSITION_OFFSET
    indicator = torch.tensor([LLM_TOKEN_INDICATOR] * t + [OUTPUT_IMAGE_INDICATOR] * (h * w))
    return dict(hidden_states=_r(g, b, t + h * w, 16), timestep=torch.rand(b, generator=g),
                encoder_hidden_states=_r(g, b, t + h * w, 24),
                position_ids=torch.cat([text, grid])[None].repeat(b, 1, 1),
                segment_ids=torch.ones(b, t + h * w, dtype=torch.long), indicator=indicator[None].repeat(b, 1))


# layer 0 dense, layer 1 mixture-of-experts (expert-choice routing), as the default strategy mixes them
_EMPTY_PARAMS["NucleusMoEImageTransformer2DModel"] = ("experts.gate_up_proj", "experts.down_proj")
@_spec("NucleusMoEImageTransformer2DModel", patch_size=2, in_channels=16, out_channels=4, num_layers=2,
       attention_head_dim=16, num_attention_heads=4, num_key_value_heads=2, joint_attention_dim=16,
       axes_dims_rope=(8, 4, 4), dense_moe_strategy="leave_first_block_dense", num_experts=4,
       moe_intermediate_dim=16, capacity_factors=[2.0, 2.0])
def _nucleus_moe(g, b):
    return dict(hidden_states=_r(g, b, 16, 16), encoder_hidden_states=_r(g, b, 8, 16),
                encoder_hidden_states_mask=torch.ones(b, 8, dtype=torch.long), timestep=torch.rand(b, generator=g),
                img_shapes=[(1, 4, 4)] * b)


@_spec("LongCatAudioDiTTransformer", dit_dim=32, dit_depth=2, dit_heads=2, dit_text_dim=16, latent_dim=8)
def _longcat_audio(g, b, n=16, s=10):
    return dict(hidden_states=_r(g, b, n, 8), encoder_hidden_states=_r(g, b, s, 16),
                encoder_attention_mask=torch.ones(b, s, dtype=torch.bool), timestep=torch.rand(b, generator=g),
                attention_mask=torch.ones(b, n, dtype=torch.bool), latent_cond=_r(g, b, n, 8))


# one packed sequence (the model has no batch dimension): 8 text tokens, then a 1 x 4 x 4 grid of 2x2 latent patches
@_spec("Cosmos3OmniTransformer", batch=1, head_dim=8, hidden_size=16, intermediate_size=32, latent_channel=4,
       latent_patch_size=2, num_attention_heads=2, num_hidden_layers=2, num_key_value_heads=1, patch_latent_dim=16,
       rope_axes_dim=[2, 1, 1], rope_theta=10_000.0, vocab_size=32)
def _cosmos3(g, b, t=8, h=4, w=4):
    n = h * w
    grid = torch.stack([torch.full((n,), t), torch.arange(h).repeat_interleave(w), torch.arange(w).repeat(h)])
    vision = torch.arange(t, t + n)
    return dict(input_ids=torch.randint(0, 32, (t,), generator=g), text_indexes=torch.arange(t),
                position_ids=torch.cat([torch.arange(t)[None].expand(3, t), grid], dim=1), und_len=t,
                sequence_length=t + n, vision_tokens=[_r(g, 1, 4, 1, 2 * h, 2 * w)], vision_token_shapes=[(1, h, w)],
                vision_sequence_indexes=vision, vision_mse_loss_indexes=vision,
                vision_timesteps=_t(g, n), vision_noisy_frame_indexes=[torch.tensor([0])])


# diffusers' own model test (tests/models/transformers/test_models_transformer_cosmos3.py): its init dict and inputs
# (2 text tokens, one 1 x 1 x 1 vision token, all positions 0); head_dim 6 (half 3), no text QK-norm
@_spec("Cosmos3OmniTransformer@diffusers-test", cls="Cosmos3OmniTransformer", batch=1, head_dim=6, hidden_act="relu2",
       hidden_size=12, intermediate_size=24, latent_channel=2, latent_patch_size=1, num_attention_heads=2,
       num_hidden_layers=2, num_key_value_heads=1, patch_latent_dim=2, qk_norm_for_text=False, rms_norm_eps=1e-5,
       rope_axes_dim=[1, 1, 1], rope_theta=1e8, vocab_size=32)
def _cosmos3_diffusers_test(g, b, h=1, w=1):
    n = h * w
    vision = torch.arange(2, 2 + n)
    return dict(input_ids=torch.tensor([1, 2]), text_indexes=torch.tensor([0, 1]),
                position_ids=torch.zeros((3, 2 + n), dtype=torch.long), und_len=2, sequence_length=2 + n,
                vision_tokens=[_r(g, 1, 2, 1, h, w)], vision_token_shapes=[(1, h, w)], vision_sequence_indexes=vision,
                vision_mse_loss_indexes=vision, vision_timesteps=torch.ones(n),
                vision_noisy_frame_indexes=[torch.tensor([0])])


# the released checkpoints' variant (text_token_padding, ca_rope, cross_gates, fix_modulation on); video with audio
@_spec("Kandinsky6Transformer3DModel", in_visual_dim=4, out_visual_dim=4, in_text_dim=16, in_text_dim2=8,
       time_dim=16, patch_size=(1, 2, 2), model_dim=32, ff_dim=64, num_text_blocks=1, num_visual_blocks=2,
       axes_dims=(4, 6, 6), in_audio_dim=4, out_audio_dim=4, text_token_padding=True, ca_rope=True, cross_gates=True,
       fix_modulation=True)
def _kandinsky6(g, b, s=8):
    return dict(hidden_states=_r(g, b, 2, 8, 8, 9), encoder_hidden_states=_r(g, b, s, 16),
                pooled_projections=_r(g, b, 8), timestep=_t(g, b), audio_hidden_states=_r(g, b, 12, 4),
                encoder_attention_mask=torch.ones(b, s, dtype=torch.bool))


# NABLA attention groups 8x8 token tiles: a 1 x 8 x 8 token grid is the smallest
@_spec("Kandinsky6SRTransformer3DModel", in_visual_dim=4, out_visual_dim=16, time_dim=16, patch_size=(1, 1, 1),
       model_dim=32, ff_dim=64, num_visual_blocks=2, axes_dims=(4, 6, 6))
def _kandinsky6_sr(g, b):
    return dict(hidden_states=_r(g, b, 1, 8, 8, 9), timestep=_t(g, b))


@_spec("LongCatImageTransformer2DModel", patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
       axes_dims_rope=[4, 4, 8])
def _longcat_image(g, b):
    return dict(hidden_states=_r(g, b, 16, 4), encoder_hidden_states=_r(g, b, 8, 32),
                timestep=torch.rand(b, generator=g), img_ids=_grid_ids(4, 4), txt_ids=torch.zeros(8, 3),
                guidance=torch.rand(b, generator=g) * 4)


# partial rotary as the default config (rotary_dim 32 of head 64): 8 of 16 here
@_spec("MiniMaxMusic3Transformer1DModel", in_channels=8, condition_dim=16, num_layers=2, num_attention_heads=2,
       attention_head_dim=16, ff_inner_dim=32, rotary_dim=8, fourier_embedding_dim=8)
def _minimax_music3(g, b, n=24):
    return dict(hidden_states=_r(g, b, 8, n), timestep=torch.rand(b, generator=g),
                encoder_hidden_states=_r(g, b, n, 16))


@_spec("MotifVideoTransformer3DModel", in_channels=9, out_channels=4, num_attention_heads=2, attention_head_dim=12,
       num_layers=1, num_single_layers=1, num_decoder_layers=1, mlp_ratio=2.0, patch_size=1, patch_size_t=1,
       qk_norm="rms_norm", text_embed_dim=16, image_embed_dim=4, rope_theta=256.0, rope_axes_dim=(4, 4, 4))
def _motif_video(g, b):
    return dict(hidden_states=_r(g, b, 9, 2, 4, 4), encoder_hidden_states=_r(g, b, 8, 16), timestep=_t(g, b),
                encoder_attention_mask=torch.ones(b, 8, dtype=torch.bool), image_embeds=_r(g, b, 4, 4))


@_spec("OvisImageTransformer2DModel", patch_size=1, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1,
       attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32, axes_dims_rope=(4, 4, 8))
def _ovis_image(g, b):
    return dict(hidden_states=_r(g, b, 16, 4), encoder_hidden_states=_r(g, b, 8, 32),
                timestep=torch.rand(b, generator=g), img_ids=_grid_ids(4, 4), txt_ids=torch.zeros(8, 3))


@_spec("PRXTransformer2DModel", in_channels=4, patch_size=2, context_in_dim=16, hidden_size=32, mlp_ratio=2.0,
       num_heads=2, depth=2, axes_dim=[8, 8])
def _prx(g, b):
    return dict(hidden_states=_r(g, b, 4, 8, 8), timestep=torch.rand(b, generator=g),
                encoder_hidden_states=_r(g, b, 8, 16), attention_mask=torch.ones(b, 8, dtype=torch.bool))


# a condition image (1 x 2 x 2 latent tokens: one vision-language slot amid the text) and the target (1 x 4 x 4: four
# slots at the end); block-causal prefill of the joint sequence (the default processor), t=0 rows for the prefix
@_spec("QwenImage21Transformer2DModel", patch_size=1, in_channels=16, out_channels=16, num_layers=2,
       attention_head_dim=16, num_attention_heads=2, context_in_dim=16, axes_dims_rope=(4, 6, 6))
def _qwenimage21(g, b):
    img_mask = torch.tensor([False] * 4 + [True] + [False] * 4 + [True] * 4)
    return dict(hidden_states=_r(g, b, 4 + 16, 16), encoder_hidden_states=_r(g, b, 9, 16),
                timestep=torch.rand(b, generator=g), img_shapes=[[(1, 2, 2), (1, 4, 4)]] * b,
                img_mask=img_mask[None].repeat(b, 1), encoder_hidden_states_mask=torch.ones(b, 9, dtype=torch.bool))


@_spec("SanaVideoTransformer3DModel", in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=12,
       num_layers=2, num_cross_attention_heads=2, cross_attention_head_dim=12, cross_attention_dim=24,
       caption_channels=16, sample_size=8, patch_size=(1, 2, 2), rope_max_seq_len=32)
def _sana_video(g, b):
    return dict(hidden_states=_r(g, b, 4, 2, 8, 8), encoder_hidden_states=_r(g, b, 8, 16), timestep=_t(g, b),
                encoder_attention_mask=torch.ones(b, 8))


# block 0 a gated-delta-net linear-attention block, block 1 softmax attention (every softmax_every_n-th); camera
# control as the pipeline passes it (a raymap per latent frame and chunked Plücker maps, from a small random
# trajectory through the pipeline's own prepare_camera); per-frame timesteps (B, 1, F)
@_spec("SanaWMTransformer3DModel", in_channels=4, num_layers=2, hidden_size=32, num_attention_heads=2,
       softmax_every_n=2, linear_head_dim=16, caption_channels=16, chunk_plucker_channels=24,
       chunk_plucker_post_attn_blocks=2, image_size=64)
def _sana_wm(g, b, f=5):
    from diffusers.pipelines.sana_wm.cam_utils import prepare_camera

    c2w = torch.eye(4).repeat(f, 1, 1)
    c2w[:, :3, 3] = _r(g, f, 3, scale=0.1)
    intrinsics = torch.tensor([[64.0, 64.0, 32.0, 32.0]]).repeat(f, 1)
    cam = prepare_camera(c2w.numpy(), intrinsics.numpy(), target_size=(64, 64), vae_stride=(4, 8, 8))
    return dict(hidden_states=_r(g, b, 4, 2, 8, 8), timestep=_t(g, b * 2).reshape(b, 1, 2),
                encoder_hidden_states=_r(g, b, 8, 16), encoder_attention_mask=torch.ones(b, 8),
                camera_conditions=cam["raymap"][None].repeat(b, 1, 1),
                chunk_plucker=cam["chunk_plucker"][None].repeat(b, 1, 1, 1, 1))


_SANA_WM_REFINER = dict(in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8,
                        cross_attention_dim=16, audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2,
                        audio_attention_head_dim=4, audio_cross_attention_dim=8, num_layers=2, caption_channels=16)


# one AR block of the video-only refiner without a KV cache (plain self-attention over the block); the RoPE the
# pipeline passes comes from the model's build_rotary_emb_for_absolute_positions, rebuilt here on a rope module of
# the same config (the method reads only ``self.rope``)
@_spec("SanaWMLTX2RefinerTransformer3DModel", **_SANA_WM_REFINER)
def _sana_wm_refiner(g, b, f=2, h=4, w=4):
    from types import SimpleNamespace

    from diffusers import SanaWMLTX2RefinerTransformer3DModel as Refiner
    from diffusers.models.transformers.transformer_sana_wm_refiner import SanaWMLTX2AudioVideoRotaryPosEmbed

    c = _SANA_WM_REFINER
    rope = SanaWMLTX2AudioVideoRotaryPosEmbed(
        dim=c["num_attention_heads"] * c["attention_head_dim"], patch_size=1, patch_size_t=1, base_num_frames=20,
        base_height=2048, base_width=2048, scale_factors=(8, 32, 32), theta=10000.0, causal_offset=1,
        modality="video", double_precision=True, rope_type="interleaved", num_attention_heads=c["num_attention_heads"])
    cos, sin = Refiner.build_rotary_emb_for_absolute_positions(SimpleNamespace(rope=rope), b, list(range(3, 3 + f)), h,
                                                               w, torch.device("cpu"), fps=24.0)
    return dict(hidden_states=_r(g, b, f * h * w, 4), encoder_hidden_states=_r(g, b, 8, 16),
                timestep=_t(g, b)[:, None].expand(b, f * h * w).contiguous(), video_rotary_emb=(cos, sin),
                encoder_attention_mask=torch.ones(b, 8))


# T = 2 latent frames (+1 reference frame) and a 5-frame 16 x 16 face video: the face encoder's two stride-2 causal
# convolutions give 2 motion frames (+1 zero pad) = T + 1, one per latent frame, as in the pipeline (77 -> 21)
@_spec("WanAnimateTransformer3DModel", **dict(_WAN, in_channels=12, latent_channels=4, image_dim=16,
                                              motion_encoder_channel_sizes={"4": 16, "8": 16, "16": 16},
                                              motion_encoder_size=16, motion_style_dim=8, motion_dim=4,
                                              motion_encoder_dim=16, face_encoder_hidden_dim=16,
                                              face_encoder_num_heads=2, inject_face_latents_blocks=2))
def _wan_animate(g, b, t=2):
    return dict(hidden_states=_r(g, b, 12, t + 1, 8, 8), timestep=_t(g, b), encoder_hidden_states=_r(g, b, 12, 16),
                encoder_hidden_states_image=_r(g, b, 8, 16), pose_hidden_states=_r(g, b, 4, t, 8, 8),
                face_pixel_values=_r(g, b, 3, 5, 16, 16))


# one denoising step (kv_cache_mode="cached", the pass the pipeline repeats) of a 5-frame 32 x 32 segment: 3 latent
# frames of 2 x 2 patches attend, through the flex BlockMask, to each other and to 2 cached reference frames. The
# cache holds the reference pass's pre-RoPE K/V ((B, 8, heads, head_dim)); here they are seeded random tensors in
# a fresh cache per call of ``inputs`` (what the model reads from them is all it needs). CLIP features are 1280-wide
# (MLPProj hard-codes the CLIP width). The first forward in a process builds the BlockMask with
# ``create_block_mask(_compile=True)`` (seconds, once per process); every later call runs in ~20 ms.
@_spec("WanAnimate2Transformer3DModel", patch_size=(1, 2, 2), text_len=16, in_dim=12, dim=32, ffn_dim=64, freq_dim=64,
       text_dim=16, out_dim=4, num_heads=2, num_layers=2)
def _wan_animate2(g, b, ref=2, gen=3, h=4, w=4, heads=2, head_dim=16, layers=2):
    from diffusers.models.transformers.transformer_wan_animate_2 import WanAnimate2KVCache

    cache = WanAnimate2KVCache(layers)
    for layer in cache.layer_caches:
        layer.store(_r(g, b, ref * h * w // 4, heads, head_dim), _r(g, b, ref * h * w // 4, heads, head_dim))
    return dict(hidden_states=[_r(g, 4, gen, h, w) for _ in range(b)], timestep=_t(g, b),
                encoder_hidden_states=[_r(g, 8, 16) for _ in range(b)],
                condition_latents=[_r(g, 8, gen, h, w) for _ in range(b)],
                encoder_hidden_states_image=_r(g, b, 4, 1280),
                kv_cache=cache, kv_cache_mode="cached", seq_len=gen * h * w // 4,
                reference_grid_sizes=torch.tensor([[ref, h // 2, w // 2]] * b), origin_len=5, origin_area=[32, 32])

# ---------------------------------------------------------------------------------------------------------


def names() -> list[str]:
    """The zoo's diffusers class names, sorted."""
    return sorted(_SPECS)


def _cast(x, dtype):
    """Floating tensors (in nested lists/tuples/dicts) to ``dtype``; ints, bools, complex and Python values stay."""
    if isinstance(x, torch.Tensor):
        return x.to(dtype) if x.is_floating_point() else x
    if isinstance(x, (list, tuple)):
        return type(x)(_cast(v, dtype) for v in x)
    if isinstance(x, dict):
        return {k: _cast(v, dtype) for k, v in x.items()}
    return x


def inputs(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> dict:
    """Forward kwargs of zoo model ``name``: seeded random tensors (the same shapes for every seed)."""
    _, _, make, batch = _SPECS[name]
    g = torch.Generator().manual_seed(10_000 + seed)
    return _cast(make(g, batch), dtype)


def _is_norm(module: torch.nn.Module) -> bool:
    return isinstance(module, (torch.nn.LayerNorm, torch.nn.GroupNorm, torch.nn.RMSNorm)) or \
        "norm" in type(module).__name__.lower()


@torch.no_grad()
def randomize_weights(model: torch.nn.Module, seed: int = 0, empty: tuple[str, ...] = ()) -> torch.nn.Module:
    """Redraws, from a generator seeded with ``seed``, every parameter of a norm (or named *norm*), every
    parameter the model's init left constant (zero-initialised adaLN / gate / output projections, ones-filled
    scales) and every parameter whose name ends with one of ``empty`` (left uninitialised by the init): weights
    around 1 (norm weights) or at the scale of a default Linear init, biases small."""
    g = torch.Generator().manual_seed(20_000 + seed)
    norm_params = {id(p) for m in model.modules() if _is_norm(m) for p in m.parameters(recurse=False)}
    for name, p in model.named_parameters():
        if not p.is_floating_point() or p.numel() == 0:
            continue
        if any(name.endswith(e) for e in empty):
            p.zero_()  # uninitialised memory: drawn below as a weight at the Linear scale
        constant = bool((p == p.reshape(-1)[0]).all())
        is_norm = id(p) in norm_params or "norm" in name.lower()
        if not (is_norm or constant):
            continue
        noise = torch.randn(p.shape, generator=g, dtype=torch.float32)
        if is_norm and name.endswith("weight") or (constant and bool((p == 1).all())):
            value = 1.0 + 0.25 * noise
        elif name.endswith("bias") or p.dim() <= 1:
            value = 0.1 * noise
        else:
            fan_in = p.shape[-1] if p.dim() >= 2 else 1
            value = noise / max(fan_in, 1) ** 0.5
        p.copy_(value.to(p.dtype))
    return model


def build(name: str, dtype: torch.dtype = torch.float32, seed: int = 0) -> tuple[torch.nn.Module, dict]:
    """(model, forward kwargs) of zoo entry ``name``: eval mode, ``dtype``, seeded random weights and inputs."""
    import diffusers

    diffusers.utils.logging.set_verbosity_error()  # "modules that should be kept in float32" on every .to()
    cls_name, init, _, _ = _SPECS[name]
    torch.manual_seed(seed)
    model = getattr(diffusers, cls_name)(**init)
    randomize_weights(model, seed, _EMPTY_PARAMS.get(name, ()))
    model = model.eval().to(dtype)
    return model, inputs(name, dtype, seed)


ZOO: dict[str, Callable[[], tuple[torch.nn.Module, dict]]] = {n: functools.partial(build, n) for n in sorted(_SPECS)}
