"""adaln_rms fusion: RMSNorm followed by ``* (1 + scale) + shift`` (LTX / LTX2 blocks, ACE-Step, Ernie, Krea2,
MiniMax-H3, StableAudio3) -> one fusegraph.adaln(norm="rms") each, in the source's output dtype, whatever
RMSNorm source form the rms_norm family fused first (diffusers RMSNorm with and without weight / bias,
torch.nn.RMSNorm), casts around the modulation included (ACE-Step's type_as, Ernie's float32 modulation); one
norm modulated twice (LTX2); lookalikes stay unfused (and correct)."""
import pytest
import torch
import torch.nn as nn
from diffusers.models.normalization import RMSNorm

from tests.fusion.pattern_checks import assert_matches, compile_and_run, double, fused

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
D = 32


def randomize(norm: nn.Module) -> nn.Module:
    """Norm weights around 1 and biases around 0, not exactly: ones/zeros would hide a dropped parameter."""
    with torch.no_grad():
        for name, p in norm.named_parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (1.0 if name == "weight" else 0.0))
    return norm


def modulation(B, S, dtype, per_token=False):
    """(scale, shift) as LTX makes them: [B, 1, D] (or per-token [B, S, D]) chunks of a [B, S?, k, D] table."""
    if per_token:
        table = torch.randn(B, S, 6, D, dtype=dtype) * 0.5
        shift, scale = table[:, :, 0], table[:, :, 1]
    else:
        table = torch.randn(B, 1, 6, D, dtype=dtype) * 0.5
        shift, scale = table.unbind(dim=2)[:2]
    return scale, shift


def rms_modulation64(x, weight, bias, eps, scale, shift):
    """float64 (x / sqrt(mean(x^2) + eps) * weight + bias) * (1 + scale) + shift."""
    x64 = x.double()
    n = x64 * torch.rsqrt(x64.square().mean(-1, keepdim=True) + eps)
    n = n * weight.double() if weight is not None else n
    n = n + bias.double() if bias is not None else n
    return n * (1 + scale.double()) + shift.double()


def assert_one_adaln(b, family="adaln_rms"):
    assert b.stats.patterns[family] == 1 and fused(b, "adaln") == 1, b.stats.patterns
    assert fused(b, "rms_norm") == 0 and fused(b, "mul_add") == 0


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("per_token", [False, True])
def test_ltx_rms_norm_modulation_fuses(dtype, per_token):
    """LTX: norm1 = RMSNorm(dim, elementwise_affine=False); norm1(h) * (1 + scale_msa) + shift_msa."""
    norm = RMSNorm(D, eps=1e-6, elementwise_affine=False)

    def f(h, scale, shift):
        return norm(h) * (1 + scale) + shift

    h = torch.randn(2, 7, D, dtype=dtype)
    scale, shift = modulation(2, 7, dtype, per_token)
    b, out, eager = compile_and_run(f, h, scale, shift, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager, scale=4.0, ref64=double(f, h, scale, shift))


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.float32, torch.float32), (torch.bfloat16, torch.bfloat16),
                                             (torch.float16, torch.float16), (torch.bfloat16, torch.float32)])
def test_affine_diffusers_rms_norm_modulation_fuses(x_dtype, w_dtype):
    """diffusers RMSNorm with a weight (and its half-precision casts), fp32 modulation: the source's dtype."""
    norm = randomize(RMSNorm(D, eps=1e-5, elementwise_affine=True)).to(w_dtype)

    def f(h, scale, shift):
        return norm(h) * (1 + scale) + shift

    h = torch.randn(2, 5, D, dtype=x_dtype)
    scale, shift = modulation(2, 5, torch.float32)
    b, out, eager = compile_and_run(f, h, scale, shift, inductor=False)
    assert_one_adaln(b)
    assert out.dtype == eager.dtype == torch.float32
    # the fused op is the exact math on the given values, rounded once
    ref64 = rms_modulation64(h, norm.weight, None, 1e-5, scale, shift)
    torch.testing.assert_close(out, ref64.float())
    if x_dtype == torch.float32:
        torch.testing.assert_close(out, eager)
    else:  # eager rounds the norm (and the weighted norm) to the half weight dtype before the fp32 modulation
        torch.testing.assert_close(out, eager, rtol=1.6e-2 if x_dtype == torch.bfloat16 else 1e-3, atol=8 * 2.0 ** -8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_with_bias_modulation_fuses(dtype):
    """diffusers RMSNorm(bias=True): weight and bias, then the modulation."""
    norm = randomize(RMSNorm(D, eps=1e-6, elementwise_affine=True, bias=True)).to(dtype)

    def f(h, scale, shift):
        return norm(h) * (1 + scale) + shift

    h = torch.randn(2, 5, D, dtype=dtype)
    scale, shift = modulation(2, 5, dtype)
    b, out, eager = compile_and_run(f, h, scale, shift, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager, scale=8.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_rms_norm_modulation_fuses(dtype):
    """torch.nn.RMSNorm (style="torch") with a weight, eps at its default (None: the dtype's eps)."""
    norm = randomize(nn.RMSNorm(D)).to(dtype)

    def f(h, scale, shift):
        return norm(h) * (1 + scale) + shift

    h = torch.randn(2, 5, D, dtype=dtype)
    scale, shift = modulation(2, 5, dtype)
    b, out, eager = compile_and_run(f, h, scale, shift, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager, scale=8.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_scale_first_and_continuous_forms_fuse(dtype):
    """(1 + scale) * norm(x) + shift, and norm(x) * (1 + scale)[:, None, :] + shift[:, None, :] of [B, D] chunks."""
    norm = RMSNorm(D, eps=1e-6, elementwise_affine=False)

    def f(h, emb):
        shift, scale = emb.chunk(2, dim=1)
        a = (1 + scale[:, None]) * norm(h) + shift[:, None]
        c = norm(h * 2) * (1 + scale)[:, None, :] + shift[:, None, :]
        return a, c

    h, emb = torch.randn(2, 5, D, dtype=dtype), torch.randn(2, 2 * D, dtype=dtype) * 0.5
    b, out, eager = compile_and_run(f, h, emb, inductor=False)
    assert b.stats.patterns["adaln_rms"] == 2 and fused(b, "adaln") == 2 and fused(b, "rms_norm") == 0
    assert_matches(out, eager, scale=4.0, ref64=double(f, h, emb))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ace_step_type_as_form_fuses(dtype):
    """ACE-Step: (self_attn_norm(h) * (1 + scale_msa) + shift_msa).type_as(h), scale/shift chunks of a float32
    scale_shift_table + temb: one adaln(out_dtype=h.dtype), one rounding (eager rounds the norm, then casts)."""
    norm = randomize(RMSNorm(D, eps=1e-6)).to(dtype)
    table = torch.randn(1, 6, D) / D ** 0.5

    def f(h, temb):
        shift_msa, scale_msa, _gate, _, _, _ = (table + temb).chunk(6, dim=1)
        return (norm(h) * (1 + scale_msa) + shift_msa).type_as(h)

    h, temb = torch.randn(2, 7, D, dtype=dtype), torch.randn(2, 6, D) * 0.5
    b, out, eager = compile_and_run(f, h, temb, inductor=False)
    assert_one_adaln(b)
    assert out.dtype == dtype and b.all_ops["prims.convert_element_type.default"] == 0  # the cast taken in too
    shift, scale = (table + temb).chunk(6, dim=1)[:2]
    ref64 = rms_modulation64(h, norm.weight, None, 1e-6, scale, shift)
    torch.testing.assert_close(out, ref64.to(dtype), **({} if dtype != torch.float32 else dict(rtol=1e-5, atol=1e-5)))
    assert_matches(out, eager, scale=8.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("mod_dtype", [None, torch.float32])
def test_ernie_fp32_modulation_form_fuses(dtype, mod_dtype):
    """Ernie: x = adaLN_sa_ln(x); (x.float() * (1 + scale.float()) + shift.float()).to(x.dtype), RMSNorm with a
    weight, the modulation in x's dtype or float32."""
    norm = randomize(RMSNorm(D, eps=1e-6)).to(dtype)

    def f(x, scale, shift):
        x = norm(x)
        return (x.float() * (1 + scale.float()) + shift.float()).to(x.dtype)

    x = torch.randn(2, 7, D, dtype=dtype)
    scale, shift = modulation(2, 7, mod_dtype or dtype)
    b, out, eager = compile_and_run(f, x, scale, shift, inductor=False)
    assert_one_adaln(b)
    assert out.dtype == dtype and b.all_ops["prims.convert_element_type.default"] == 0  # the casts taken in too
    ref64 = rms_modulation64(x, norm.weight, None, 1e-6, scale, shift)
    torch.testing.assert_close(out, ref64.to(dtype), **({} if dtype != torch.float32 else dict(rtol=1e-5, atol=1e-5)))
    assert_matches(out, eager, scale=8.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_minimax_h3_packed_rows_fuse(dtype):
    """MiniMax-H3: a packed [T, D] sequence (rank 2), per-row modulation gathered with index_select:
    norm(h) * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx), torch.nn.RMSNorm."""
    norm = randomize(nn.RMSNorm(D, eps=1e-6)).to(dtype)

    def f(h, emb, idx):
        shift, scale = emb.chunk(2, dim=-1)
        return norm(h) * (1.0 + scale.index_select(0, idx)) + shift.index_select(0, idx)

    h, emb, idx = torch.randn(9, D, dtype=dtype), torch.randn(3, 2 * D, dtype=dtype) * 0.5, torch.randint(0, 3, (9,))
    b, out, eager = compile_and_run(f, h, emb, idx, inductor=False)
    assert_one_adaln(b)
    assert_matches(out, eager, scale=8.0)


def test_stable_audio3_modulate_helper_fuses():
    """StableAudio3: _modulate(pre_norm(h), shift, scale) = x * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1), its
    own fp32 RMSNorm with a gamma (the rms_norm family fuses it first)."""
    from diffusers.models.transformers.transformer_stable_audio3 import StableAudio3RMSNorm, _modulate

    norm = StableAudio3RMSNorm(D)
    with torch.no_grad():
        norm.gamma.copy_(torch.randn(D) * 0.3 + 1.0)

    def f(h, shift, scale):
        return _modulate(norm(h), shift, scale)

    h, shift, scale = torch.randn(2, 5, D), torch.randn(2, D), torch.randn(2, D) * 0.5
    b, out, eager = compile_and_run(f, h, shift, scale, inductor=False)
    assert_one_adaln(b)
    ref64 = rms_modulation64(h, norm.gamma, None, 1e-6, scale[:, None], shift[:, None])
    torch.testing.assert_close(out, ref64.float())
    assert_matches(out, eager)


def test_krea2_scale_first_zero_centred_norm_fuses():
    """Krea2: (1.0 + prescale) * norm1(h) + preshift, Krea2RMSNorm = F.rms_norm(h.float(), weight=w + 1.0)."""
    from diffusers.models.transformers.transformer_krea2 import Krea2RMSNorm

    norm = randomize(Krea2RMSNorm(D, eps=1e-5))

    def f(h, prescale, preshift):
        return (1.0 + prescale) * norm(h) + preshift

    h = torch.randn(2, 5, D)
    scale, shift = modulation(2, 5, torch.float32)
    b, out, eager = compile_and_run(f, h, scale, shift, inductor=False)
    assert_one_adaln(b)
    ref64 = rms_modulation64(h, norm.weight.detach() + 1.0, None, 1e-5, scale, shift)
    torch.testing.assert_close(out, ref64.float())
    assert_matches(out, eager)


@pytest.mark.parametrize("inductor", [False, True])
def test_one_norm_modulated_twice_fuses_twice(inductor):
    """LTX2's audio-to-video and video-to-audio cross-attention modulate one norm_hidden_states twice
    (``n * (1 + scale.squeeze(2)) + shift.squeeze(2)``): each modulation gets its own norm and fuses; another
    user of the norm keeps the fused rms_norm."""
    norm = randomize(nn.RMSNorm(D, eps=1e-6))

    def f(x, table):
        a, b, c, d = table.unbind(dim=2)  # [B, 1, 1, D] each after the unbind of [B, 1, 4, 1, D]
        n = norm(x)
        return n * (1 + a.squeeze(2)) + b.squeeze(2), n * (1 + c.squeeze(2)) + d.squeeze(2), n * 2

    x, table = torch.randn(2, 5, D), torch.randn(2, 1, 4, 1, D) * 0.5
    b, out, eager = compile_and_run(f, x, table, inductor=inductor)
    assert b.stats.patterns["adaln_rms"] == 2 and fused(b, "adaln") == 2 and fused(b, "rms_norm") == 1
    assert fused(b, "mul_add") == 0
    assert_matches(out, eager)


def test_fuses_under_inductor():
    norm = randomize(RMSNorm(D, eps=1e-6, elementwise_affine=True)).to(torch.bfloat16)

    def f(h, scale, shift):
        return norm(h) * (1 + scale) + shift

    h = torch.randn(2, 5, D, dtype=torch.bfloat16)
    scale, shift = modulation(2, 5, torch.bfloat16)
    b, out, eager = compile_and_run(f, h, scale, shift, inductor=True)
    assert b.stats.patterns["adaln_rms"] == 1 and fused(b, "adaln") == 1
    assert_matches(out, eager, scale=8.0)


def test_disabled_with_enable_adalayernorm():
    norm = RMSNorm(D, eps=1e-6, elementwise_affine=False)

    def f(h, scale, shift):
        return norm(h) * (1 + scale) + shift

    h = torch.randn(2, 5, D)
    scale, shift = modulation(2, 5, torch.float32)
    b, out, eager = compile_and_run(f, h, scale, shift, inductor=False,
                                    fusion_patterns={"enable_adalayernorm": False})
    assert b.stats.patterns["adaln_rms"] == 0 and fused(b, "adaln") == 0 and fused(b, "rms_norm") == 1
    assert_matches(out, eager)


# --- lookalikes ------------------------------------------------------------------------------------------

_norm = RMSNorm(D, eps=1e-6, elementwise_affine=False)


def lookalike_two_plus_scale(x, scale, shift):
    return _norm(x) * (2 + scale) + shift


def lookalike_scale_without_one(x, scale, shift):
    return _norm(x) * scale + shift


def lookalike_shift_minus(x, scale, shift):
    return _norm(x) * (1 + scale) - shift


def lookalike_rms_over_another_dim(x, scale, shift):
    n = x * torch.rsqrt(x.pow(2).mean(-2, keepdim=True) + 1e-6)
    return n * (1 + scale) + shift


def lookalike_shift_grows_output(x, scale, shift):
    return _norm(x) * (1 + scale) + shift[:, None]  # [B, 1, 1, D] + [B, S, D] -> [B, B, S, D]


def scale_used_elsewhere(x, scale, shift):
    t = 1 + scale
    return _norm(x) * t + shift, t * 3


@pytest.mark.parametrize("inductor", [False, True])
def test_shared_one_plus_scale_is_split_and_the_whole_modulation_fuses(inductor):
    """A ``1 + scale`` also read elsewhere: the modulation gets its own copy (split_shared_factors) and fuses with
    its shift here, not as a no-shift adaln plus an add."""
    x = torch.randn(2, 5, D)
    scale, shift = modulation(2, 5, torch.float32)
    b, out, eager = compile_and_run(scale_used_elsewhere, x, scale, shift, inductor=inductor)
    assert b.stats.patterns["adaln_rms"] == 1 and b.stats.patterns["adaln_noshift"] == 0, b.stats.patterns
    assert fused(b, "adaln") == 1
    assert_matches(out, eager)


@pytest.mark.parametrize("fn", [lookalike_two_plus_scale, lookalike_scale_without_one, lookalike_shift_minus,
                                lookalike_rms_over_another_dim, lookalike_shift_grows_output])
def test_lookalikes_stay_unfused(fn):
    x = torch.randn(2, 5, D)
    scale, shift = modulation(2, 5, torch.float32)
    b, out, eager = compile_and_run(fn, x, scale, shift, inductor=False)
    assert b.stats.patterns["adaln_rms"] == 0
    if fn in (lookalike_shift_minus, lookalike_shift_grows_output):
        # the product alone is a no-shift modulation (the adaln_noshift family): the shift stays outside
        assert b.stats.patterns["adaln_noshift"] == 1 and fused(b, "adaln") == 1
    else:
        assert fused(b, "adaln") == 0
    assert_matches(out, eager)


@pytest.mark.parametrize("inductor", [False, True])
def test_modulation_shared_by_layers_fuses_in_each(inductor):
    """Ernie-Image computes its adaLN modulation once and every layer applies the same ``1 + scale``: freezing's CSE
    (the default, inductor=True route) merges the layers' ``add(scale, 1)`` into one node that all products read,
    which blocked every match (0 of 4 in the zoo model). Each product now gets its own copy first."""
    norms = [randomize(RMSNorm(D, eps=1e-6)) for _ in range(3)]

    def f(x, scale, shift):
        for norm in norms:
            x = x + (norm(x) * (1 + scale) + shift).tanh()
        return x

    x, (scale, shift) = torch.randn(2, 7, D), modulation(2, 7, torch.float32)
    b, out, eager = compile_and_run(f, x, scale, shift, inductor=inductor)
    assert fused(b, "adaln") == 3 and b.stats.patterns["adaln_rms"] == 3
    assert_matches(out, eager)
