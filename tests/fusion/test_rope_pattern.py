"""RoPE fusion (SPEC §3): diffusers apply_rotary_emb(use_real=True) with use_real_unbind_dim -1 / -2 and
sequence_dim 1 / 2, and Wan's own RoPE (strided even/odd slices written into empty_like) -> one fusegraph.rope
each; lookalikes stay unfused."""
import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb, get_1d_rotary_pos_embed

from tests.fusion.pattern_checks import assert_matches, assert_ops_gone, compile_and_run, double, fused
from tests.references import wan_rope

DTYPES = [torch.float32, torch.bfloat16]
ROPE_CHAIN = ("aten.neg.default", "aten.unbind.int", "aten.cat.default")


def tables(S, D, repeat_interleave=True):
    """Real (cos, sin) tables as diffusers builds them: [S, D] float32."""
    return get_1d_rotary_pos_embed(D, torch.arange(S).float(), use_real=True, repeat_interleave_real=repeat_interleave)


def diffusers_rope(x, cos, sin, unbind_dim, sequence_dim):
    return apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=unbind_dim, sequence_dim=sequence_dim)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("sequence_dim", [1, 2])
@pytest.mark.parametrize("unbind_dim", [-1, -2])
def test_apply_rotary_emb_fuses(dtype, sequence_dim, unbind_dim):
    B, S, H, D = 2, 7, 3, 16
    shape = (B, S, H, D) if sequence_dim == 1 else (B, H, S, D)
    x = torch.randn(*shape, dtype=dtype)
    cos, sin = tables(S, D, repeat_interleave=unbind_dim == -1)

    def f(x, cos, sin):
        return diffusers_rope(x, cos, sin, unbind_dim, sequence_dim)

    b, out, eager = compile_and_run(f, x, cos, sin, inductor=False)
    assert b.stats.patterns["rope"] == 1 and fused(b, "rope") == 1
    assert_ops_gone(b, *ROPE_CHAIN)
    assert_matches(out, eager, scale=2.0, ref64=double(f, x, cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
def test_flux_attention_rope_on_q_and_k_fuses(dtype):
    """Flux: q and k of [B, S, H, D] after the QK-norm, the same (cos, sin) for both, random tables."""
    B, S, H, D = 1, 9, 2, 8
    q, k = torch.randn(B, S, H, D, dtype=dtype), torch.randn(B, S, H, D, dtype=dtype)
    cos, sin = torch.randn(S, D), torch.randn(S, D)

    def f(q, k, cos, sin):
        return diffusers_rope(q, cos, sin, -1, 1), diffusers_rope(k, cos, sin, -1, 1)

    b, out, eager = compile_and_run(f, q, k, cos, sin, inductor=False)
    assert fused(b, "rope") == 2
    assert_ops_gone(b, *ROPE_CHAIN)
    assert_matches(out, eager, scale=4.0)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tables_kind", ["wan", "random"])
def test_wan_rope_fuses(dtype, tables_kind):
    """Wan's RoPE is interleaved RoPE with per-pair angles: exact for Wan's repeat-interleaved tables and for
    arbitrary ones (the even-position cos and odd-position sin are what it reads)."""
    B, S, H, D = 2, 6, 2, 12
    x = torch.randn(B, S, H, D, dtype=dtype)
    if tables_kind == "wan":
        cos, sin = tables(S, D)
    else:
        cos, sin = torch.randn(S, D), torch.randn(S, D)
    cos, sin = cos.view(1, S, 1, D), sin.view(1, S, 1, D)
    b, out, eager = compile_and_run(wan_rope, x, cos, sin, inductor=False)
    assert b.stats.patterns["rope"] == 1 and fused(b, "rope") == 1
    assert_ops_gone(b, "aten.slice_scatter.default", "aten.unbind.int")
    assert_matches(out, eager, scale=4.0, ref64=double(wan_rope, x, cos, sin))


def test_rope_fuses_under_inductor():
    B, S, H, D = 1, 5, 2, 16
    x = torch.randn(B, S, H, D, dtype=torch.bfloat16)
    cos, sin = tables(S, D)

    def f(x, cos, sin):
        return diffusers_rope(x, cos, sin, -1, 1), wan_rope(x, cos.view(1, S, 1, D), sin.view(1, S, 1, D))

    b, out, eager = compile_and_run(f, x, cos, sin, inductor=True)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2
    assert_matches(out, eager, scale=2.0)


# --- lookalikes ------------------------------------------------------------------------------------------


def lookalike_wrong_sign(x, cos, sin):
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([x_imag, -x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def lookalike_swapped_tables(x, cos, sin):
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * sin + x_rotated.float() * cos * 2).to(x.dtype)


def lookalike_wan_wrong_slices(x, cos, sin):
    x1, x2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    c = cos[..., 1::2]
    s = sin[..., 0::2]
    out = torch.empty_like(x)
    out[..., 0::2] = x1 * c - x2 * s
    out[..., 1::2] = x1 * s + x2 * c
    return out


@pytest.mark.parametrize("fn", [lookalike_wrong_sign, lookalike_swapped_tables])
def test_lookalikes_stay_unfused(fn):
    x = torch.randn(2, 5, 2, 8)
    cos, sin = torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    b, out, eager = compile_and_run(fn, x, cos, sin, inductor=False)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert_matches(out, eager)


def test_wan_lookalike_wrong_slices_stays_unfused():
    x = torch.randn(2, 5, 2, 8)
    cos, sin = torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    b, out, eager = compile_and_run(lookalike_wan_wrong_slices, x, cos, sin, inductor=False)
    assert fused(b, "rope") == 0
    assert_matches(out, eager)


def test_float64_tables_stay_unfused():
    """The fused op takes fp32 or x.dtype tables; a float64 table is left to eager semantics."""
    x = torch.randn(1, 4, 2, 8)
    cos, sin = torch.randn(4, 8, dtype=torch.float64), torch.randn(4, 8, dtype=torch.float64)

    def f(x, cos, sin):
        return diffusers_rope(x, cos, sin, -1, 1)

    b, out, eager = compile_and_run(f, x, cos, sin, inductor=False)
    assert fused(b, "rope") == 0
    torch.testing.assert_close(out, eager)
