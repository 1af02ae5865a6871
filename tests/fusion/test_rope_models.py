"""RoPE in real models beyond Flux / Wan (SPEC §3): tiny diffusers Lumina2, Z-Image, QwenImage, NucleusMoE (complex
form), LTX and LTX2 (rank-3 x; LTX2 also its split form), HiDream (2x2 matrices) and HunyuanVideo 1.5 (use_real,
sequence_dim=1), Mochi (strided even / odd halves, per-pair tables), Ernie-Image and Stable Audio 3 (partial
rotary), LongCat-Audio and Ideogram4 (rotate-half by chunk / slices + cat), Helios (Wan-like), Kandinsky 5 (matrix
sums), JoyImage (interleaved), random weights, fp32, through the fusegraph Backend (inductor=False; Lumina2,
HiDream, LTX2 split, Mochi and the issue #11 models but Kandinsky 5 and Ideogram4 also on the default route,
``Backend(CompilationConfig())``: Inductor, freezing on): every RoPE site fuses and the output matches eager.

Expected counts are read off each model's source: the attention processors that apply RoPE, times the q / k
(and, in QwenImage, text q / k) they apply it to; each is counted from the model's own modules."""
import pytest
import torch
from diffusers import (HiDreamImageTransformer2DModel, HunyuanVideo15Transformer3DModel, Lumina2Transformer2DModel,
                       LTX2VideoTransformer3DModel, LTXVideoTransformer3DModel, MochiTransformer3DModel,
                       QwenImageTransformer2DModel, ZImageTransformer2DModel)
from diffusers.models.transformers.transformer_hidream_image import HiDreamAttention
from diffusers.models.transformers.transformer_hunyuan_video15 import HunyuanVideo15TransformerBlock
from diffusers.models.transformers.transformer_lumina2 import Lumina2TransformerBlock
from diffusers.models.transformers.transformer_mochi import MochiTransformerBlock
from diffusers.models.transformers.transformer_ltx import LTXVideoTransformerBlock
from diffusers.models.transformers.transformer_ltx2 import LTX2VideoTransformerBlock
from diffusers.models.transformers.transformer_qwenimage import QwenImageTransformerBlock
from diffusers.models.transformers.transformer_z_image import ZImageTransformerBlock

from tests.fusion.pattern_checks import compile_and_run

TOL = dict(rtol=1e-4, atol=1e-4)
ATEN = dict(inductor=False)
DEFAULT = {}  # Backend(CompilationConfig()): inductor=True, no freezing
FROZEN = dict(enable_freezing=True)  # inductor=True, freezing (its CSE runs before the fusion)
# the opt-in frozen route repeats the default route's check with Inductor's freezing CSE first: full tier
ROUTES = [pytest.param(ATEN, id="aten"), pytest.param(DEFAULT, id="default"),
          pytest.param(FROZEN, id="frozen", marks=pytest.mark.full)]


def count(model, cls):
    return sum(isinstance(m, cls) for m in model.modules())


def randomize(model):
    """Tiny configs init norms to ones / zeros and some projections to zero (that would hide a wrong fusion):
    every parameter gets random values."""
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3)
    return model.eval()


def check(model, inputs, expected_rope, route=ATEN):
    """Every output the model returns (LTX2's audio too: a site whose result no output reads is dead code).
    ``route``: the whole CompilationConfig (``DEFAULT``: none given)."""
    def run():
        return tuple(o for o in model(**inputs, return_dict=False) if isinstance(o, torch.Tensor))

    b, out, eager = compile_and_run(run, fullgraph=False, **route)
    if route is FROZEN:
        assert b.config.inductor and b.config.enable_freezing  # the route whose CSE the fix is about
    assert b.stats.patterns["rope"] == expected_rope, b.stats.patterns
    torch.testing.assert_close(out, eager, **TOL)


@pytest.mark.parametrize("route", ROUTES)
def test_lumina2(route):
    """Lumina2AttnProcessor2_0: apply_rotary_emb(use_real=False) on q and k in every block (noise and context
    refiners, main layers). Lumina2RotaryPosEmbed's stock tables are complex128 (everywhere but on MPS), so the
    product runs in float64 and type_as(x) rounds it to fp32: the op's fp32 math from fp32-rounded tables is a
    couple of fp32 ulps from that, and every site fuses, on both routes."""
    model = randomize(Lumina2Transformer2DModel(
        sample_size=8, patch_size=2, in_channels=4, hidden_size=24, num_layers=1, num_refiner_layers=1,
        num_attention_heads=3, num_kv_heads=1, multiple_of=2, norm_eps=1e-5, axes_dim_rope=(4, 2, 2),
        axes_lens=(64, 64, 64), cap_feat_dim=16))
    assert all(f.dtype == torch.complex128 for f in model.rope_embedder.freqs_cis)  # the stock tables
    B, T = 1, 6
    inputs = dict(hidden_states=torch.randn(B, 4, 8, 8), encoder_hidden_states=torch.randn(B, T, 16),
                  timestep=torch.rand(B), encoder_attention_mask=torch.ones(B, T, dtype=torch.bool))
    check(model, inputs, 2 * count(model, Lumina2TransformerBlock), route)


def test_z_image():
    """ZSingleStreamAttnProcessor: its own complex apply_rotary_emb on q and k in every block (noise and
    context refiners, main layers)."""
    model = randomize(ZImageTransformer2DModel(
        all_patch_size=(2,), all_f_patch_size=(1,), in_channels=4, dim=32, n_layers=1, n_refiner_layers=1,
        n_heads=2, n_kv_heads=2, cap_feat_dim=16, axes_dims=[8, 4, 4], axes_lens=[64, 32, 32]))
    inputs = dict(x=[torch.randn(4, 1, 8, 8)], t=torch.tensor([0.5]), cap_feats=[torch.randn(7, 16)])
    check(model, inputs, 2 * count(model, ZImageTransformerBlock))


def test_qwen_image():
    """QwenDoubleStreamAttnProcessor2_0: apply_rotary_emb_qwen(use_real=False) on image q / k and text q / k."""
    model = randomize(QwenImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, axes_dims_rope=(8, 4, 4)))
    B, T, H, W = 1, 7, 4, 4
    inputs = dict(hidden_states=torch.randn(B, H * W, 16), encoder_hidden_states=torch.randn(B, T, 16),
                  encoder_hidden_states_mask=torch.ones(B, T), timestep=torch.tensor([0.5]),
                  img_shapes=[(1, H, W)])
    check(model, inputs, 4 * count(model, QwenImageTransformerBlock))


def test_ltx():
    """LTXVideoAttnProcessor: apply_rotary_emb on q and k of attn1 (attn2, the text cross-attention, has none)."""
    model = randomize(LTXVideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        num_layers=2, caption_channels=16))
    B, F, H, W, T = 1, 2, 4, 4, 6
    inputs = dict(hidden_states=torch.randn(B, F * H * W, 4), encoder_hidden_states=torch.randn(B, T, 16),
                  timestep=torch.tensor([500]), encoder_attention_mask=torch.ones(B, T),
                  num_frames=F, height=H, width=W)
    check(model, inputs, 2 * count(model, LTXVideoTransformerBlock))


@pytest.mark.parametrize("rope_type,route", [pytest.param("interleaved", ATEN, id="interleaved-aten"),
                                             pytest.param("split", ATEN, id="split-aten"),
                                             pytest.param("split", DEFAULT, id="split-default"),
                                             pytest.param("split", FROZEN, id="split-frozen", marks=pytest.mark.full)])
def test_ltx2(rope_type, route):
    """LTX2AudioVideoAttnProcessor, per block: q and k of the video and audio self-attentions (attn1,
    audio_attn1) and of the audio-to-video and video-to-audio cross-attentions (8); attn2 / audio_attn2 (text)
    have none. "split" is what the released LTX-2 checkpoints use. On the default route freezing's CSE shares
    q's and k's ``cos.unsqueeze(-2)``, ``sin.unsqueeze(-2)`` and ``-sin_u`` (split_shared_table_ops undoes
    it), and the form's last reshape merges with the attention's unflatten (the _ltx2_split_heads form)."""
    model = randomize(LTX2VideoTransformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, cross_attention_dim=16,
        audio_in_channels=4, audio_out_channels=4, audio_num_attention_heads=2, audio_attention_head_dim=4,
        audio_cross_attention_dim=8, num_layers=1, caption_channels=16, rope_double_precision=False,
        rope_type=rope_type))
    B, F, H, W, T, A = 1, 2, 4, 4, 6, 5
    inputs = dict(hidden_states=torch.randn(B, F * H * W, 4), audio_hidden_states=torch.randn(B, A, 4),
                  encoder_hidden_states=torch.randn(B, T, 16), audio_encoder_hidden_states=torch.randn(B, T, 16),
                  timestep=torch.tensor([500.0]), encoder_attention_mask=torch.ones(B, T).bool(),
                  num_frames=F, height=H, width=W, audio_num_frames=A, fps=25.0)
    check(model, inputs, 8 * count(model, LTX2VideoTransformerBlock), route)


@pytest.mark.parametrize("route", ROUTES)
def test_hidream(route):
    """HiDreamAttnProcessor: apply_rope(q, k) once per attention (two sites), double and single blocks.
    Dynamo reuses one graph for several block instances (MoE graph breaks); freezing is guarded per call
    (tests/fusion/test_freezing.py). The default route: freezing's CSE shares q's and k's
    ``freqs_cis[..., 0]`` / ``[..., 1]`` (split_shared_table_ops undoes it)."""
    model = randomize(HiDreamImageTransformer2DModel(
        patch_size=2, in_channels=4, out_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=8,
        num_attention_heads=4, caption_channels=[8, 4], text_emb_dim=8, num_routed_experts=2,
        num_activated_experts=2, axes_dims_rope=(4, 2, 2), max_resolution=(16, 16), llama_layers=(0, 1),
        force_inference_output=True))
    B, T = 1, 4
    inputs = dict(hidden_states=torch.randn(B, 4, 8, 8), encoder_hidden_states_t5=torch.randn(B, T, 8),
                  encoder_hidden_states_llama3=torch.randn(2, B, T, 4), pooled_embeds=torch.randn(B, 8),
                  timesteps=torch.tensor([500]))
    check(model, inputs, 2 * count(model, HiDreamAttention), route)


def test_hunyuan_video15():
    """HunyuanVideo15AttnProcessor2_0: apply_rotary_emb(use_real=True, sequence_dim=1) on q and k of every
    transformer block (the token refiner has none). A graph break inside the blocks makes Dynamo compile the
    block forward once and reuse it for both blocks: 2 sites in the compiled graphs (stats count per graph)."""
    model = randomize(HunyuanVideo15Transformer3DModel(
        in_channels=4, out_channels=4, num_attention_heads=2, attention_head_dim=8, num_layers=2,
        num_refiner_layers=1, mlp_ratio=2.0, text_embed_dim=16, text_embed_2_dim=8, image_embed_dim=12,
        rope_axes_dim=(2, 2, 4), target_size=16, task_type="t2v"))
    B = 1
    inputs = dict(hidden_states=torch.randn(B, 4, 1, 8, 8), timestep=torch.tensor([1.0]),
                  encoder_hidden_states=torch.randn(B, 6, 16), encoder_hidden_states_2=torch.randn(B, 4, 8),
                  encoder_attention_mask=torch.ones(B, 6), encoder_attention_mask_2=torch.ones(B, 4),
                  image_embeds=torch.randn(B, 3, 12))
    assert count(model, HunyuanVideo15TransformerBlock) == 2
    check(model, inputs, 2, ATEN)


@pytest.mark.parametrize("route", ROUTES)
def test_mochi(route):
    """MochiAttnProcessor2_0: its nested apply_rotary_emb on q and k of every block (x [B, S, H, D] after
    unflatten(2, (heads, -1)), tables [S, H, D/2]). The processor has graph breaks, so apply_rotary_emb runs
    as a frame of its own: Dynamo compiles it once and reuses it for
    q and k in every block — one site in the compiled graphs (stats count per graph), as the zoo's counter
    finds (tests.zoo.site_counter.count_model: rope 1)."""
    model = randomize(MochiTransformer3DModel(
        patch_size=2, num_attention_heads=2, attention_head_dim=8, num_layers=2, pooled_projection_dim=16,
        in_channels=4, out_channels=None, qk_norm="rms_norm", text_embed_dim=16, time_embed_dim=4,
        activation_fn="swiglu", max_sequence_length=8))
    assert count(model, MochiTransformerBlock) == 2  # 4 applications, one compiled frame
    B = 1
    inputs = dict(hidden_states=torch.randn(B, 4, 2, 8, 8), encoder_hidden_states=torch.randn(B, 8, 16),
                  timestep=torch.tensor([500]), encoder_attention_mask=torch.ones(B, 8, dtype=torch.bool))
    check(model, inputs, 1, route)


# --- partial rotary, rotate-half by chunk + cat, NucleusMoE's complex form (issue #11) -------------------------


@pytest.mark.parametrize("route", ROUTES)
def test_ernie_image(route):
    """ErnieImageSingleStreamAttnProcessor: its nested apply_rotary_emb (rotate-half by chunk on
    ``x[..., :R]``, the rest concatenated back; here R = head_dim, as the stock axes give: an empty
    pass-through), cos / sin of the angles inside, on q and k of every block."""
    from diffusers import ErnieImageTransformer2DModel
    from diffusers.models.transformers.transformer_ernie_image import ErnieImageAttention

    model = randomize(ErnieImageTransformer2DModel(
        hidden_size=32, num_attention_heads=2, num_layers=2, ffn_hidden_size=64, in_channels=4, out_channels=4,
        patch_size=1, text_in_dim=16, rope_theta=256, rope_axes_dim=(4, 6, 6)))
    inputs = dict(hidden_states=torch.randn(1, 4, 4, 4), timestep=torch.rand(1), text_bth=torch.randn(1, 5, 16),
                  text_lens=torch.tensor([5]))
    check(model, inputs, 2 * count(model, ErnieImageAttention), route)


@pytest.mark.parametrize("route", ROUTES)
def test_stable_audio3(route):
    """StableAudio3SelfAttnProcessor with differential attention: _apply_rotary_partial (partial rotary,
    fp32 math) on q1, q2, k1, k2 of every self-attention."""
    from diffusers import StableAudio3DiTModel
    from diffusers.models.transformers.transformer_stable_audio3 import StableAudio3SelfAttention

    model = randomize(StableAudio3DiTModel(
        io_channels=4, embed_dim=32, depth=2, num_heads=2, cond_token_dim=8, global_cond_dim=8, local_add_cond_dim=4,
        timestep_features_dim=16, num_memory_tokens=2, use_differential_attention=True))
    rot_dim = model.rotary_pos_emb(4, "cpu").shape[-1]
    assert rot_dim < model.config.embed_dim // model.config.num_heads  # partial: a pass-through is left
    inputs = dict(hidden_states=torch.randn(1, 4, 12), timestep=torch.rand(1),
                  encoder_hidden_states=torch.randn(1, 5, 8), global_hidden_states=torch.randn(1, 8))
    check(model, inputs, 4 * count(model, StableAudio3SelfAttention), route)


@pytest.mark.parametrize("route", ROUTES)
def test_longcat_audio(route):
    """LongCat-Audio: _apply_rotary_emb (rotate-half by chunk, fp32) on q and k of each self-attention and on
    q (audio positions) and k (prompt positions) of each cross-attention."""
    from diffusers import LongCatAudioDiTTransformer
    from diffusers.models.transformers.transformer_longcat_audio_dit import AudioDiTAttention

    model = randomize(LongCatAudioDiTTransformer(dit_dim=32, dit_depth=2, dit_heads=2, dit_text_dim=8, latent_dim=4))
    inputs = dict(hidden_states=torch.randn(1, 10, 4), encoder_hidden_states=torch.randn(1, 5, 8),
                  encoder_attention_mask=torch.ones(1, 5, dtype=torch.bool), timestep=torch.rand(1),
                  latent_cond=torch.randn(1, 10, 4))
    check(model, inputs, 2 * count(model, AudioDiTAttention), route)


@pytest.mark.parametrize("route", ROUTES)
def test_nucleus_moe(route):
    """NucleusMoEAttnProcessor2_0: _apply_rotary_emb_nucleus(use_real=False) on the image q and k and the text
    k of every block (dense blocks here: the MoE routing is no RoPE matter)."""
    from diffusers import NucleusMoEImageTransformer2DModel
    from diffusers.models.transformers.transformer_nucleusmoe_image import NucleusMoEImageTransformerBlock

    model = randomize(NucleusMoEImageTransformer2DModel(
        patch_size=2, in_channels=16, out_channels=4, num_layers=2, attention_head_dim=16, num_attention_heads=2,
        joint_attention_dim=16, axes_dims_rope=(4, 6, 6), moe_enabled=False))
    inputs = dict(hidden_states=torch.randn(1, 16, 16), img_shapes=[(1, 4, 4)],
                  encoder_hidden_states=torch.randn(1, 5, 16), encoder_hidden_states_mask=torch.ones(1, 5),
                  timestep=torch.rand(1))
    check(model, inputs, 3 * count(model, NucleusMoEImageTransformerBlock), route)


@pytest.mark.parametrize("route", ROUTES)
def test_helios(route):
    """apply_rotary_emb_transposed (Wan's form, table slices taken at each use) on q and k of each block's
    self-attention (the cross-attention has none)."""
    from diffusers import HeliosTransformer3DModel
    from diffusers.models.transformers.transformer_helios import HeliosTransformerBlock

    model = randomize(HeliosTransformer3DModel(
        patch_size=(1, 2, 2), num_attention_heads=2, attention_head_dim=12, in_channels=4, out_channels=4, text_dim=8,
        freq_dim=16, ffn_dim=32, num_layers=2, rope_dim=(4, 4, 4)))
    inputs = dict(hidden_states=torch.randn(1, 4, 2, 4, 4), timestep=torch.tensor([500]),
                  encoder_hidden_states=torch.randn(1, 5, 8))
    check(model, inputs, 2 * count(model, HeliosTransformerBlock), route)


def test_kandinsky5():
    """Kandinsky5AttnProcessor's nested apply_rotary ((rope * x_).sum(-1), 2x2 matrices) on q and k of every
    self-attention, text encoder and visual decoder blocks. aten route only: on Inductor's routes its
    fp32 -> bf16 -> fp32 round trip after the product is dropped by Inductor's codegen (plain torch.compile
    too), which is no RoPE matter."""
    from diffusers import Kandinsky5Transformer3DModel
    from diffusers.models.transformers.transformer_kandinsky import (Kandinsky5TransformerDecoderBlock,
                                                                     Kandinsky5TransformerEncoderBlock)

    model = randomize(Kandinsky5Transformer3DModel(
        in_visual_dim=4, in_text_dim=8, in_text_dim2=8, time_dim=16, out_visual_dim=4, patch_size=(1, 2, 2),
        model_dim=32, ff_dim=64, num_text_blocks=1, num_visual_blocks=1, axes_dims=(4, 6, 6)))
    inputs = dict(hidden_states=torch.randn(1, 1, 4, 4, 4), encoder_hidden_states=torch.randn(1, 5, 8),
                  timestep=torch.rand(1), pooled_projections=torch.randn(1, 8),
                  visual_rope_pos=(torch.arange(1), torch.arange(2), torch.arange(2)), text_rope_pos=torch.arange(5))
    blocks = count(model, Kandinsky5TransformerEncoderBlock) + count(model, Kandinsky5TransformerDecoderBlock)
    check(model, inputs, 2 * blocks)


@pytest.mark.parametrize("route", ROUTES)
def test_joyimage(route):
    """JoyImage's _apply_rotary_emb (interleaved, rotation of x.float()) on the image q and k of every block
    (no text tables without a text rope size: ``get_rotary_pos_embed`` returns ``(vis_freqs, None)``)."""
    from diffusers import JoyImageEditTransformer3DModel
    from diffusers.models.transformers.transformer_joyimage import JoyImageTransformerBlock

    model = randomize(JoyImageEditTransformer3DModel(
        patch_size=[1, 2, 2], in_channels=4, out_channels=4, hidden_size=32, num_attention_heads=2, text_dim=8,
        num_layers=2, rope_dim_list=[4, 6, 6]))
    inputs = dict(hidden_states=torch.randn(1, 4, 1, 4, 4), timestep=torch.rand(1),
                  encoder_hidden_states=torch.randn(1, 5, 8))
    check(model, inputs, 2 * count(model, JoyImageTransformerBlock), route)


def test_ideogram4():
    """Ideogram4AttnProcessor: ``(query * cos) + (_rotate_half(query) * sin)`` (rotate-half by slices, in x's
    dtype, MRoPE tables ``[B, L, 1, D]``) on q and k of every block. aten route only: on Inductor's routes
    plain torch.compile itself is ~5e-3 off eager on this model (outputs ~35), no RoPE matter."""
    from diffusers import Ideogram4Transformer2DModel
    from diffusers.models.transformers import transformer_ideogram4

    model = randomize(Ideogram4Transformer2DModel(
        in_channels=4, num_layers=2, attention_head_dim=32, num_attention_heads=2, intermediate_size=32, adaln_dim=16,
        llm_features_dim=8, rope_theta=10000, mrope_section=(6, 5, 5)))
    L = 10
    indicator = torch.tensor([[transformer_ideogram4.LLM_TOKEN_INDICATOR] * 4
                              + [transformer_ideogram4.OUTPUT_IMAGE_INDICATOR] * 6])
    position_ids = torch.stack([torch.zeros(L), torch.arange(L) % 3, torch.arange(L) // 3], -1).long()[None]
    inputs = dict(hidden_states=torch.randn(1, L, 4), timestep=torch.rand(1),
                  encoder_hidden_states=torch.randn(1, L, 8), position_ids=position_ids,
                  segment_ids=torch.zeros(1, L, dtype=torch.long), indicator=indicator)
    check(model, inputs, 2 * model.config.num_layers)
