"""The independent site counter against hand counts: small functions with each source form and its lookalikes,
and zoo models whose sites were counted by hand from the diffusers 0.42.1 source (per-block lists below)."""
import pytest
import torch
import torch.nn.functional as F
from diffusers.models.embeddings import apply_rotary_emb

from fusegraph import zoo
from tests.zoo.site_counter import FAMILIES, capture, count_sites


def sites(fn, *args):
    graphs, _ = capture(fn, *args)
    return count_sites(graphs)


def only(**counts):
    return {k: counts.get(k, 0) for k in FAMILIES}


B, S, D = 2, 6, 16


def test_forms_and_lookalikes():
    x, y, res = torch.randn(B, S, D), torch.randn(B, S, D), torch.randn(B, S, D)
    scale, shift, gate, w = torch.randn(B, D), torch.randn(B, D), torch.randn(B, D), torch.randn(D)
    ln = lambda t: F.layer_norm(t, (D,), eps=1e-6)  # noqa: E731
    # AdaLN: (1 + scale) then + shift; not (2 + scale), not without the shift
    assert sites(lambda: ln(x) * (1 + scale[:, None]) + shift[:, None]) == only(adaln=1)
    assert sites(lambda: ln(x) * (2 + scale[:, None]) + shift[:, None]) == only(mul_add=1)  # no AdaLN: a*b+c
    assert sites(lambda: ln(x) * (1 + scale[:, None])) == only(adaln_noshift=1)  # scale only: its own family
    assert sites(lambda: ln(x) * (2 + scale[:, None])) == only()
    # RMSNorm modulations: with shift (adaln_rms, also an rms_norm site), without (adaln_noshift), through the
    # norm's affine weight and a cast; not (2 + scale), not a norm over dim 1
    rms = lambda t: t * torch.rsqrt(t.float().pow(2).mean(-1, keepdim=True) + 1e-6)  # noqa: E731
    assert sites(lambda: rms(x) * (1 + scale[:, None]) + shift[:, None]) == only(rms_norm=1, adaln_rms=1)
    assert sites(lambda: F.rms_norm(x, (D,), w, 1e-6) * (1 + scale)[:, None, :] + shift[:, None, :]) \
        == only(rms_norm=1, adaln_rms=1)
    assert sites(lambda: (1 + scale[:, None]) * (rms(x) * w).to(x.dtype)) == only(rms_norm=1, adaln_noshift=1)
    assert sites(lambda: rms(x) * (2 + scale[:, None]) + shift[:, None]) == only(rms_norm=1, mul_add=1)
    assert sites(lambda: x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6) * (1 + scale[:, None])) == only()
    # RMSNorm over the last dim (torch and hand-written), not over dim 1
    assert sites(lambda: F.rms_norm(x, (D,), w, 1e-6)) == only(rms_norm=1)
    assert sites(lambda: x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w) == only(rms_norm=1)
    assert sites(lambda: x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6)) == only()
    # GELU: tanh only
    assert sites(lambda: F.gelu(x, approximate="tanh")) == only(gelu=1)
    assert sites(lambda: F.gelu(x)) == only()
    assert sites(lambda: x * torch.sigmoid(1.702 * x)) == only()
    # mul_add: a * b + c of one dtype (gate, scalar, per-token, a plain LayerNorm's affine); not mixed dtypes,
    # not a product with another user, not a - , not an RMSNorm's weight
    assert sites(lambda: res + gate[:, None] * y) == only(mul_add=1)
    assert sites(lambda: x * 0.5 + y) == only(mul_add=1)
    assert sites(lambda: x * y + res) == only(mul_add=1)
    assert sites(lambda: F.layer_norm(x, (D,), w, w.flip(0))) == only(mul_add=1)
    assert sites(lambda: x * y.double() + res) == only()
    assert sites(lambda: x * y - res) == only()
    def shared_product():
        p = x * y
        return p + res, p
    assert sites(shared_product) == only()
    assert sites(lambda: res + F.rms_norm(y, (D,), w, 1e-6)) == only(rms_norm=1)


def test_rope_forms():
    H, Dh = 2, 8
    q, k = torch.randn(B, H, S, Dh), torch.randn(B, H, S, Dh)
    cos, sin = torch.randn(S, Dh), torch.randn(S, Dh)
    for dim in (-1, -2):
        assert sites(lambda: (apply_rotary_emb(q, (cos, sin), use_real_unbind_dim=dim),
                              apply_rotary_emb(k, (cos, sin), use_real_unbind_dim=dim))) == only(rope=2)
    freqs = torch.polar(torch.ones(S, Dh // 2), torch.randn(S, Dh // 2))
    assert sites(lambda: torch.view_as_real(torch.view_as_complex(q.reshape(B, H, S, -1, 2)) * freqs).flatten(3)) \
        == only(rope=1)
    # Wan: even/odd halves written into one output: one application
    def wan(x):
        x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
        out = torch.empty_like(x)
        out[..., 0::2] = x1 * cos[..., 0::2] - x2 * sin[..., 1::2]
        out[..., 1::2] = x1 * sin[..., 1::2] + x2 * cos[..., 0::2]
        return out
    assert sites(lambda: (wan(q), wan(k))) == only(rope=2)
    # rotate-half written with chunk / slices + cat, and partial rotary (MiniMax-H3, Ernie: only x[..., :r] rotated,
    # the rest concatenated back): one application per tensor
    def chunk_cat(x, c, s):
        x1, x2 = x.chunk(2, dim=-1)
        return x * c + torch.cat((-x2, x1), -1) * s

    def sliced(x, c, s):
        h = x.shape[-1] // 2
        return x * c + torch.cat((-x[..., h:], x[..., :h]), -1) * s

    def partial(x, c, s):
        r = c.shape[-1]
        return torch.cat((chunk_cat(x[..., :r], c, s), x[..., r:]), dim=-1)
    for form, width in ((chunk_cat, Dh), (sliced, Dh), (partial, Dh // 2)):
        c, s = torch.randn(S, width), torch.randn(S, width)
        assert sites(lambda: (form(q, c, s), form(k, c, s))) == only(rope=2), form.__name__
    # Kandinsky's matrix-sum form: sum(R * x.reshape(..., n, 1, 2), -1) with a 2x2 rotation R per pair
    R = torch.randn(S, Dh // 2, 2, 2)

    def matrix_sum(x):
        return (R * x.reshape(*x.shape[:-1], -1, 1, 2).float()).sum(dim=-1).reshape(*x.shape)
    assert sites(lambda: (matrix_sum(q), matrix_sum(k))) == only(rope=2)
    assert sites(lambda: (R * q.reshape(B, H, S, -1, 2, 1)).sum(dim=-1)) == only()  # (2, 1): not a pair product
    # two rotated tensors concatenated afterwards (Cosmos3's k_und / k_gen) are two applications
    def cat_of_two(x, y, c, s):
        return torch.cat([chunk_cat(x, c, s), chunk_cat(y, c * 2, s * 2)], dim=2)
    c, s = torch.randn(S, Dh), torch.randn(S, Dh)
    assert sites(lambda: cat_of_two(q, k, c, s)) == only(rope=2)
    # lookalike: no rotation (the same x on both sides) is no RoPE; it is a plain mul_add (broadcast factor cos,
    # full-shape addend q * sin)
    assert sites(lambda: q * cos + q * sin) == only(mul_add=1)


# Hand counts from the diffusers source, for the zoo's configs:
HAND = {
    # SPEC §3: per double block 4 RMSNorm, 2 RoPE, 4 AdaLN, 2 GELU, 4 gated residuals; per single block 2, 2, 1, 1,
    # 1; plus the AdaLN of norm_out. 2 double + 2 single blocks.
    "FluxTransformer2DModel": dict(rms_norm=12, rope=8, adaln=11, gelu=6, mul_add=10),
    # 2 blocks; block 0 dual-attention: RMS q/k/added q/k + attn2 q/k = 6, AdaLN norm1 (SD35AdaLayerNormZeroX: two
    # modulations) + norm1_context + norm2 + norm2_context = 5, GELU ff + ff_context = 2, gated attn/attn2/ff/ctx
    # attn/ctx ff = 5; block 1 (context_pre_only): RMS 4, AdaLN norm1 + norm1_context (Continuous) + norm2 = 3,
    # GELU 1, gated 2; norm_out 1 AdaLN.
    "SD3Transformer2DModel": dict(rms_norm=10, rope=0, adaln=9, gelu=3, mul_add=7),
    # 2 blocks: RMS across heads q/k of attn1 and attn2 = 4, RoPE q/k = 2, AdaLN norm1 + norm3 = 2 (norm2 is a
    # plain cross-attention LayerNorm), GELU ff 1, gated attn1 + ffn = 2 (cross-attn residual has no gate); plus
    # norm_out AdaLN 1 and the text embedder's gelu_tanh 1. mul_add: the 2 gated residuals of each of the 2 blocks
    # = 4, plus each block's affine cross-attention norm2 (n * w + b) = 6.
    "WanTransformer3DModel": dict(rms_norm=8, rope=4, adaln=5, gelu=3, mul_add=6),
    # 2 blocks (LayerNorm qk-norm: no RMS): RoPE q/k = 2, CogVideoXLayerNormZero norm1/norm2 modulate both streams
    # = 4 AdaLN, GELU ff 1, gated 4; norm_out AdaLN 1; the last block's text-stream ff residual is dead code
    # (the output is the video stream), so aot_autograd drops it: 8 - 1 gated residuals; plus the affine
    # (n * w + b) of the LayerNorm q/k norms (2 per block = 4) and of norm_final (1): 12.
    "CogVideoXTransformer3DModel": dict(rms_norm=0, rope=4, adaln=9, gelu=2, mul_add=12),
    # 2 layers + noise refiner + context refiner = 4 blocks, each RMS q/k + norm1/ffn_norm1/norm2/ffn_norm2 = 6,
    # plus the caption embedder's RMSNorm = 25; RoPE q/k in all 4 = 8; no AdaLN with shift: the 3 modulated blocks
    # scale their RMSNorms norm1 (LuminaRMSNormZero) and ffn_norm1 by (1 + scale) without a shift = 6, and norm_out
    # (LuminaLayerNormContinuous) scales a LayerNorm = 7 adaln_noshift; gated residuals (tanh gate) in the 3
    # modulated blocks = 6; SiLU-gated FF, no GELU.
    "Lumina2Transformer2DModel": dict(rms_norm=25, rope=8, adaln_noshift=7, gelu=0, mul_add=6),
    # 1 block: RMS across heads q/k of attn1 and attn2 + the RMSNorms norm1 and norm2 = 6; RoPE q/k = 2; norm1 and
    # norm2 modulated by (1 + scale) + shift = 2 adaln_rms; norm_out (a LayerNorm) modulated = 1 adaln; GELU ff +
    # the caption projection = 2; gated attn1 + ff residuals = 2.
    "LTXVideoTransformer3DModel": dict(rms_norm=6, rope=2, adaln=1, adaln_rms=2, gelu=2, mul_add=2),
    # 1 double block: RMS q/k/q_t/k_t = 4, RoPE 2, AdaLN norm1_i/norm1_t/norm3_i/norm3_t = 4, gated 4; 1 single
    # block: RMS 2, RoPE 2, AdaLN 2, gated 2; the final layer's AdaLN 1; SwiGLU MoE, no GELU.
    "HiDreamImageTransformer2DModel": dict(rms_norm=6, rope=4, adaln=7, gelu=0, mul_add=6),
}


@pytest.mark.parametrize("name", sorted(HAND))
def test_hand_counts(name):
    model, kw = zoo.build(name)
    graphs, _ = capture(model, **kw)
    assert count_sites(graphs) == only(**HAND[name])


def test_a_zero_centred_norm_weight_is_no_modulation():
    """Krea2's RMSNorm multiplies by ``weight + 1`` (a parameter): the norm's affine, not a ``(1 + scale)``
    modulation; the modulation by the input-dependent scale after it is the site."""
    class M(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.randn(D))

        def forward(self, x, scale, shift):
            n = F.rms_norm(x.float(), (D,), weight=self.weight + 1.0, eps=1e-5)
            return (1.0 + scale[:, None]) * n + shift[:, None], F.rms_norm(x, (D,), weight=self.weight + 1.0)

    graphs, _ = capture(M(), torch.randn(B, S, D), torch.randn(B, D), torch.randn(B, D))
    assert count_sites(graphs) == only(rms_norm=2, adaln_rms=1)
