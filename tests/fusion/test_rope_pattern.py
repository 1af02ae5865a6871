"""RoPE fusion (SPEC §3): diffusers apply_rotary_emb(use_real=True) with use_real_unbind_dim -1 / -2 and
sequence_dim 1 / 2, Wan's own RoPE (strided even/odd slices written into empty_like), the complex form
(use_real=False: Lumina2, Z-Image, QwenImage; complex64 and complex128 tables), LTX / LTX2 on rank-3 x, LTX2's
split form and HiDream's 2x2 matrices -> one fusegraph.rope each, also where q's and k's RoPE share table ops (as
freezing's CSE leaves them on the default route); lookalikes stay unfused, silently."""
import logging

import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb, get_1d_rotary_pos_embed

from tests.fusion.pattern_checks import assert_matches, assert_ops_gone, compile_and_run, double, fused
from tests.references import rope_ref, wan_rope

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


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
def test_x_dtype_tables_fuse(x_dtype):
    """Tables in x's dtype (the op takes fp32 or x.dtype): the forms are registered with fp32 tables only, the
    graph being the same (the promotion is inside the mul)."""
    B, S, H, D = 2, 5, 2, 8
    x = torch.randn(B, S, H, D, dtype=x_dtype)
    cos, sin = (t.to(x_dtype) for t in tables(S, D))

    def f(x, cos, sin):
        return diffusers_rope(x, cos, sin, -1, 1), wan_rope(x, cos.view(1, S, 1, D), sin.view(1, S, 1, D))

    b, out, eager = compile_and_run(f, x, cos, sin, inductor=False)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2
    assert_matches(out, eager, scale=2.0)


# --- complex form: apply_rotary_emb(use_real=False) (Lumina2), Z-Image, QwenImage --------------------------

COMPLEX_CHAIN = ("aten.view_as_complex.default",)  # the replacement reads freqs through view_as_real


def complex_freqs(*shape):
    """complex64 e^{i theta} with random angles (what the models precompute with torch.polar)."""
    return torch.polar(torch.ones(*shape), torch.randn(*shape) * 3)


def lumina_rope(x, freqs_cis):
    return apply_rotary_emb(x, freqs_cis, use_real=False)


def qwen_rope(x, freqs_cis):
    from diffusers.models.transformers.transformer_qwenimage import apply_rotary_emb_qwen

    return apply_rotary_emb_qwen(x, freqs_cis, use_real=False)


def z_image_rope(x_in, freqs_cis):
    """Verbatim the nested apply_rotary_emb of diffusers' ZSingleStreamAttnProcessor (transformer_z_image.py)."""
    with torch.amp.autocast("cuda", enabled=False):
        x = torch.view_as_complex(x_in.float().reshape(*x_in.shape[:-1], -1, 2))
        freqs_cis = freqs_cis.unsqueeze(2)
        x_out = torch.view_as_real(x * freqs_cis).flatten(3)
        return x_out.type_as(x_in)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["lumina2", "z_image", "qwen"])
def test_complex_rope_fuses(dtype, form):
    """x [B, S, H, D]; freqs [B, S, D/2] unsqueezed at 2 (Lumina2, Z-Image) or [S, D/2] at 1 (QwenImage)."""
    B, S, H, D = 2, 7, 3, 16
    x = torch.randn(B, S, H, D, dtype=dtype)
    fn, freqs = {"lumina2": (lumina_rope, complex_freqs(B, S, D // 2)),
                 "z_image": (z_image_rope, complex_freqs(B, S, D // 2)),
                 "qwen": (qwen_rope, complex_freqs(S, D // 2))}[form]
    b, out, eager = compile_and_run(fn, x, freqs, inductor=False)
    assert b.stats.patterns["rope"] == 1 and fused(b, "rope") == 1
    assert_ops_gone(b, *COMPLEX_CHAIN)
    ref64 = torch.view_as_real(torch.view_as_complex(x.double().reshape(B, S, H, -1, 2))
                               * freqs.to(torch.complex128).unsqueeze(2 if form != "qwen" else 1)).flatten(3)
    assert_matches(out, eager, scale=2.0, ref64=ref64)


def lookalike_complex_conjugate(x, freqs):
    """x's pairs conjugated before the product: (x0, -x1) rotated, not a RoPE of x. (Conjugated *freqs* are
    a RoPE with other tables; they fuse, see test_complex_rope_conjugated_freqs_fuses.)"""
    x_c = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)).conj()
    return torch.view_as_real(x_c * freqs.unsqueeze(2)).flatten(3).type_as(x)


def lookalike_complex_halves(x, freqs):
    """Real parts first, then imaginary parts: the product laid out rotate-half style, not pairwise."""
    x_c = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_c * freqs.unsqueeze(2)).transpose(-1, -2).flatten(3).type_as(x)


def test_complex_rope_conjugated_freqs_fuses():
    """The inverse rotation by conjugated freqs (``freqs.conj()``, resolved in the graph) is RoPE with tables
    Re f, -Im f: it fuses, and the result is the inverse rotation."""
    x = torch.randn(2, 5, 2, 8)
    freqs = complex_freqs(2, 5, 4)

    def f(x, freqs):
        return lumina_rope(x, freqs.conj())

    b, out, eager = compile_and_run(f, x, freqs, inductor=False)
    assert fused(b, "rope") == 1
    assert_matches(out, eager)
    torch.testing.assert_close(lumina_rope(out, freqs), x)  # rotated back


def rope64(x, freqs, dim):
    """The complex product in float64: x's pairs times complex128 freqs unsqueezed at ``dim`` (heads)."""
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.to(torch.complex128).unsqueeze(dim)).flatten(3)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("form", ["lumina2", "z_image"])
def test_complex128_freqs_fuse(dtype, form):
    """complex128 freqs (Lumina2's stock tables) make the product float64, which ``type_as(x)`` rounds to x's
    dtype: a form of its own for fp32 x (the cast is a node there), the same graph as complex64 for bf16 /
    fp16. The op computes in fp32 from fp32-rounded tables (a couple of fp32 ulps from the float64 product)."""
    B, S, H, D = 2, 7, 3, 16
    x = torch.randn(B, S, H, D, dtype=dtype)
    freqs = complex_freqs(B, S, D // 2).to(torch.complex128)
    fn = lumina_rope if form == "lumina2" else z_image_rope
    b, out, eager = compile_and_run(fn, x, freqs, inductor=False)
    assert b.stats.patterns["rope"] == 1 and fused(b, "rope") == 1
    assert_ops_gone(b, *COMPLEX_CHAIN)
    assert_matches(out, eager, scale=2.0, ref64=rope64(x, freqs, 2))


def test_complex128_fused_op_accuracy():
    """The accuracy the lead's decision rests on: fused (fp32 math, fp32-rounded cos / sin) against the float64
    product, on random x and random angles (positions up to 4096: the angles' own fp32 rounding is in the
    tables), fp32 x: within the project's op-level fp32 tolerance, and as close to eager's float64-then-round
    result."""
    torch.manual_seed(0)
    B, S, H, D = 2, 256, 4, 64
    x = torch.randn(B, S, H, D) * 3
    angles = torch.rand(B, S, D // 2, dtype=torch.float64) * 4096 * torch.rand(D // 2, dtype=torch.float64)
    freqs = torch.polar(torch.ones_like(angles), angles)
    assert freqs.dtype == torch.complex128
    b, out, eager = compile_and_run(lumina_rope, x, freqs, inductor=False)
    assert fused(b, "rope") == 1
    ref = rope64(x, freqs, 2)
    torch.testing.assert_close(out.double(), ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    err = ((out.double() - ref).abs() / (ref.abs() + 1)).max().item()
    assert err < 4 * 2.0 ** -23, err  # a few fp32 ulps


def lookalike_complex128_float64_out(x, freqs):
    """complex128 product whose float64 result flows on (no cast back to x's dtype): not the op's result."""
    x_c = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_c * freqs.unsqueeze(2)).flatten(3) * 2


def lookalike_complex128_other_cast(x, freqs):
    """complex128 product cast to a dtype that is not x's (bf16 from fp32 x)."""
    x_c = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(x_c * freqs.unsqueeze(2)).flatten(3).to(torch.bfloat16)


@pytest.mark.parametrize("fn", [lookalike_complex128_float64_out, lookalike_complex128_other_cast])
def test_complex128_lookalikes_stay_unfused(fn):
    x = torch.randn(2, 5, 2, 8)
    freqs = complex_freqs(2, 5, 4).to(torch.complex128)
    b, out, eager = compile_and_run(fn, x, freqs, inductor=False)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert out.dtype == eager.dtype
    torch.testing.assert_close(out, eager, rtol=0, atol=0)


@pytest.mark.parametrize("fn", [lookalike_complex_conjugate, lookalike_complex_halves])
def test_complex_lookalikes_stay_unfused(fn):
    x = torch.randn(2, 5, 2, 8, dtype=torch.bfloat16)
    freqs = complex_freqs(2, 5, 4)
    b, out, eager = compile_and_run(fn, x, freqs, inductor=False)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert_matches(out, eager)


# --- the complex form with a real table: LuminaNext as diffusers' own model test runs it -----------------------
# (tests/models/transformers/test_models_transformer_lumina.py passes image_rotary_emb = randn(384, 384, 4): the
# complex product of each pair (a, b) by a real f is (a f, b f), RoPE with cos = f, sin = 0)


def lumina_next_qk(q, k, freqs):
    """LuminaAttnProcessor2_0 (query_rotary_emb = key_rotary_emb = the patch embedder's ``freqs_cis[:h, :w]
    .flatten(0, 1).unsqueeze(0)``): ``apply_rotary_emb(use_real=False)`` on q [B, S, H, D] and k [B, S, 1, D]."""
    return lumina_rope(q, freqs), lumina_rope(k, freqs)


def real_factor_ref64(x, freqs):
    """x's pairs as complex128 numbers times the real table (float64), unsqueezed at the heads."""
    xc = torch.view_as_complex(x.double().reshape(*x.shape[:-1], -1, 2))
    return torch.view_as_real(xc * freqs.double().unsqueeze(2)).flatten(3)


@pytest.mark.parametrize("route", [pytest.param(dict(inductor=False), id="aten"), pytest.param({}, id="default")])
@pytest.mark.parametrize("tables_dtype", ["fp32", "x"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_complex_rope_real_tables_fuse(dtype, tables_dtype, route):
    """A real fp32 / bf16 / fp16 table (diffusers' LuminaNext test: random, not a rotation; its bf16 copy in the
    zoo's bf16 build) makes the product complex64: each pair times a real number, which the op computes exactly
    as eager does (``a f + (-b) 0`` is the complex product's ``a f - b 0``, NaN / inf included), so fp32 is
    compared bit for bit. Fresh random inputs per seed (x and the table)."""
    B, S, H, D = 2, 9, 3, 8
    for seed in (0, 1):
        g = torch.Generator().manual_seed(seed)
        q, k = torch.randn(B, S, H, D, generator=g).to(dtype), torch.randn(B, S, 1, D, generator=g).to(dtype)
        freqs = torch.randn(1, S, D // 2, generator=g).to(dtype if tables_dtype == "x" else torch.float32)
        b, out, eager = compile_and_run(lumina_next_qk, q, k, freqs, **route)
        assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2, b.stats.patterns
        assert_ops_gone(b, *COMPLEX_CHAIN)
        for o, e, t in zip(out, eager, (q, k)):
            assert o.dtype == e.dtype == dtype and o.shape == e.shape
            if dtype == torch.float32:
                torch.testing.assert_close(o, e, rtol=0, atol=0)
            else:
                torch.testing.assert_close(o, e)
            torch.testing.assert_close(o, real_factor_ref64(t, freqs).to(dtype))


def test_complex_rope_real_tables_nan_inf_as_eager():
    """The product's special values: a pair with an infinite part times a real f gives NaN in the other part
    (a complex product, ``inf * 0``), in eager and in the op alike."""
    x = torch.randn(1, 3, 2, 8)
    x[0, 0, 0, 1] = float("inf")
    x[0, 1, 1, 2] = float("-inf")
    freqs = torch.randn(1, 3, 4)
    b, out, eager = compile_and_run(lumina_rope, x, freqs, inductor=False)
    assert fused(b, "rope") == 1
    assert torch.isnan(eager).any()
    torch.testing.assert_close(out, eager, rtol=0, atol=0, equal_nan=True)


def test_complex_rope_float64_real_tables_stay_unfused():
    """A float64 real table makes the product complex128 (fp32 x times a float64 factor is not exact in fp32):
    the op's fp32 product would differ from eager's float64-then-round; refused, the graph as eager's."""
    x = torch.randn(2, 5, 2, 8)
    freqs = torch.randn(1, 5, 4, dtype=torch.float64)
    b, out, eager = compile_and_run(lumina_rope, x, freqs, inductor=False)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert out.dtype == eager.dtype
    torch.testing.assert_close(out, eager, rtol=0, atol=0)


# --- rank-3 x: LTX apply_rotary_emb, LTX2 apply_interleaved_rotary_emb ------------------------------------


def ltx_rope(x, cos, sin):
    from diffusers.models.transformers.transformer_ltx import apply_rotary_emb as ltx_apply_rotary_emb

    return ltx_apply_rotary_emb(x, (cos, sin))


def ltx2_rope(x, cos, sin):
    from diffusers.models.transformers.transformer_ltx2 import apply_interleaved_rotary_emb

    return apply_interleaved_rotary_emb(x, (cos, sin))


class _ErrorLogs(logging.Handler):
    """Collects error-level records of the torch loggers (fake tensors log failed traces at ERROR)."""

    def __init__(self):
        super().__init__(logging.ERROR)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def error_logs():
    """Error records of "torch" and of every torch logger that does not propagate to it (torch's logging
    setup gives e.g. torch._subclasses.fake_tensor its own stderr handler)."""
    handler = _ErrorLogs()
    loggers = [logging.getLogger("torch")] + [
        logger for name, logger in logging.root.manager.loggerDict.items()
        if name.startswith("torch.") and isinstance(logger, logging.Logger) and not logger.propagate]
    for logger in loggers:
        logger.addHandler(handler)
    yield handler.records
    for logger in loggers:
        logger.removeHandler(handler)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("fn", [ltx_rope, ltx2_rope])
def test_rank3_rope_fuses_silently(dtype, fn, error_logs):
    """[B, S, C] with per-token tables [B, S, C] (LTX's rope output): fuses, and the rank-4 forms that look
    the same do not log a failed trace while they are refused."""
    B, S, C = 2, 6, 24
    x = torch.randn(B, S, C, dtype=dtype)
    cos, sin = tables(S, C)
    cos, sin = cos.expand(B, S, C).contiguous(), sin.expand(B, S, C).contiguous()
    b, out, eager = compile_and_run(fn, x, cos, sin, inductor=False)
    assert b.stats.patterns["rope"] == 1 and fused(b, "rope") == 1
    assert_ops_gone(b, *ROPE_CHAIN)
    assert_matches(out, eager, scale=2.0, ref64=double(fn, x, cos, sin))
    assert not error_logs, [r.getMessage() for r in error_logs]


def lookalike_rank3_wrong_sign(x, cos, sin):
    x_real, x_imag = x.unflatten(2, (-1, 2)).unbind(-1)
    x_rotated = torch.stack([x_imag, -x_real], dim=-1).flatten(2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


def lookalike_rank3_mismatched_pairs(x, cos, sin):
    """Pairs (k, k + C/2) read, written back interleaved: neither RoPE layout."""
    x_real, x_imag = x.unflatten(2, (2, -1)).unbind(-2)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(2)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)


@pytest.mark.parametrize("fn", [lookalike_rank3_wrong_sign, lookalike_rank3_mismatched_pairs])
def test_rank3_lookalikes_stay_unfused(fn, error_logs):
    x = torch.randn(2, 5, 16, dtype=torch.bfloat16)
    cos, sin = torch.randn(2, 5, 16), torch.randn(2, 5, 16)
    b, out, eager = compile_and_run(fn, x, cos, sin, inductor=False)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert_matches(out, eager)
    assert not error_logs, [r.getMessage() for r in error_logs]


# --- HiDream apply_rope: a 2x2 matrix per pair ------------------------------------------------------------


def hidream_freqs(B, S, D):
    """HiDream's table: [B, S, 1, D/2, 2, 2] rotation matrices (HiDreamImageEmbedND, random positions)."""
    from diffusers.models.transformers.transformer_hidream_image import HiDreamImageEmbedND

    return HiDreamImageEmbedND(theta=10000, axes_dim=[D // 2, D // 2])(torch.randn(B, S, 2) * 4)


def hidream_rope(q, k, freqs_cis):
    from diffusers.models.transformers.transformer_hidream_image import apply_rope

    return apply_rope(q, k, freqs_cis)


def hidream_rope_half(q, k, freqs_cis):
    """HiDream's attention when the head dim is twice the rope dim (its default config): rope on the first
    chunk of the head dim, the rest passed through (transformer_hidream_image.py)."""
    q1, q2 = q.chunk(2, dim=-1)
    k1, k2 = k.chunk(2, dim=-1)
    q1, k1 = hidream_rope(q1, k1, freqs_cis)
    return torch.cat([q1, q2], dim=-1), torch.cat([k1, k2], dim=-1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("tables_kind", ["hidream", "random"])
@pytest.mark.parametrize("fn", [hidream_rope, hidream_rope_half])
def test_hidream_rope_fuses(dtype, tables_kind, fn):
    """q and k: two sites. Exact for HiDream's rotation matrices and for arbitrary 2x2 matrices."""
    B, S, H, D = 2, 6, 2, 16
    Dr = D if fn is hidream_rope else D // 2
    q, k = torch.randn(B, S, H, D, dtype=dtype), torch.randn(B, S, H, D, dtype=dtype)
    freqs = hidream_freqs(B, S, Dr) if tables_kind == "hidream" else torch.randn(B, S, 1, Dr // 2, 2, 2)
    b, out, eager = compile_and_run(fn, q, k, freqs, inductor=False)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2
    assert_ops_gone(b, "aten.mul.Tensor", "aten.add.Tensor")
    assert_matches(out, eager, scale=4.0, ref64=double(fn, q, k, freqs))


def lookalike_hidream_swapped_columns(x, freqs_cis):
    x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs_cis[..., 1] * x_[..., 0] + freqs_cis[..., 0] * x_[..., 1]
    return out.reshape(*x.shape).type_as(x)


def lookalike_hidream_difference(x, freqs_cis):
    x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
    out = freqs_cis[..., 0] * x_[..., 0] - freqs_cis[..., 1] * x_[..., 1]
    return out.reshape(*x.shape).type_as(x)


@pytest.mark.parametrize("fn", [lookalike_hidream_swapped_columns, lookalike_hidream_difference])
def test_hidream_lookalikes_stay_unfused(fn):
    x = torch.randn(2, 5, 2, 8, dtype=torch.bfloat16)
    freqs = torch.randn(2, 5, 1, 4, 2, 2)
    b, out, eager = compile_and_run(fn, x, freqs, inductor=False)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert_matches(out, eager)


# --- LTX2 apply_split_rotary_emb: rotate-half with per-head half tables -----------------------------------


def ltx2_split_rope(x, cos, sin):
    from diffusers.models.transformers.transformer_ltx2 import apply_split_rotary_emb

    return apply_split_rotary_emb(x, (cos, sin))


@pytest.mark.parametrize("dtype", DTYPES)
def test_ltx2_split_rope_fuses(dtype):
    """q [B, T, H * D] with tables [B, H, T, D/2] as LTX2's rope builds them (a transposed view)."""
    B, T, H, D = 2, 5, 3, 8
    x = torch.randn(B, T, H * D, dtype=dtype)
    cos, sin = (torch.randn(B, T, H, D // 2).transpose(1, 2) for _ in range(2))
    b, out, eager = compile_and_run(ltx2_split_rope, x, cos, sin, inductor=False)
    assert b.stats.patterns["rope"] == 1 and fused(b, "rope") == 1
    assert_ops_gone(b, "aten.addcmul.default")
    assert_matches(out, eager, scale=4.0, ref64=double(ltx2_split_rope, x, cos, sin))


def _ltx2_split_like(x, cos, sin, first, second, sign):
    """apply_split_rotary_emb with the halves each addcmul reads, and the sign of the first, as given."""
    x_dtype = x.dtype
    b, h, t, _ = cos.shape
    x = x.reshape(b, t, h, -1).swapaxes(1, 2)
    split_x = x.reshape(*x.shape[:-1], 2, -1).float()
    halves = {0: split_x[..., :1, :], 1: split_x[..., 1:, :]}
    out = split_x * cos.unsqueeze(-2)
    out[..., :1, :].addcmul_(sign * sin.unsqueeze(-2), halves[first])
    out[..., 1:, :].addcmul_(-sign * sin.unsqueeze(-2), halves[second])
    return out.reshape(*out.shape[:-2], -1).swapaxes(1, 2).reshape(b, t, -1).to(x_dtype)


def lookalike_ltx2_split_sign_flipped(x, cos, sin):
    """The conjugate rotation written in the code: +sin on the first half, -sin on the second."""
    return _ltx2_split_like(x, cos, sin, first=1, second=0, sign=1)


def lookalike_ltx2_split_same_half(x, cos, sin):
    """Each half times (cos -/+ sin) of itself: a scale, not a rotation."""
    return _ltx2_split_like(x, cos, sin, first=0, second=1, sign=-1)


@pytest.mark.parametrize("fn", [lookalike_ltx2_split_sign_flipped, lookalike_ltx2_split_same_half])
def test_ltx2_split_lookalikes_stay_unfused(fn):
    B, T, H, D = 2, 5, 2, 8
    x = torch.randn(B, T, H * D, dtype=torch.bfloat16)
    cos, sin = torch.randn(B, H, T, D // 2), torch.randn(B, H, T, D // 2)
    b, out, eager = compile_and_run(fn, x, cos, sin, inductor=False)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert_matches(out, eager)


# --- q and k sharing table ops (freezing's CSE on the default route) --------------------------------------


def hidream_rope_shared(q, k, freqs_cis):
    """apply_rope(q, k) as freezing's CSE leaves it: one ``freqs_cis[..., 0]`` and one ``[..., 1]`` for both."""
    f0, f1 = freqs_cis[..., 0], freqs_cis[..., 1]

    def one(x):
        x_ = x.float().reshape(*x.shape[:-1], -1, 1, 2)
        return (f0 * x_[..., 0] + f1 * x_[..., 1]).reshape(*x.shape).type_as(x)

    return one(q), one(k)


def hidream_rope_shared_lookalike_k(q, k, freqs_cis):
    """q: HiDream's RoPE; k: the swapped-columns lookalike. Both read the shared selects."""
    f0, f1 = freqs_cis[..., 0], freqs_cis[..., 1]
    q_ = q.float().reshape(*q.shape[:-1], -1, 1, 2)
    k_ = k.float().reshape(*k.shape[:-1], -1, 1, 2)
    q_out = (f0 * q_[..., 0] + f1 * q_[..., 1]).reshape(*q.shape).type_as(q)
    k_out = (f1 * k_[..., 0] + f0 * k_[..., 1]).reshape(*k.shape).type_as(k)
    return q_out, k_out


def ltx2_split_shared(q, k, cos, sin, extra_out=False):
    """apply_split_rotary_emb on q and k as freezing's CSE leaves it: one ``cos.unsqueeze(-2)``,
    ``sin.unsqueeze(-2)`` and ``-sin_u`` for both (``extra_out``: ``-sin_u`` also returned, a user outside
    either RoPE)."""
    cos_u, sin_u = cos.unsqueeze(-2), sin.unsqueeze(-2)
    neg_sin_u = -sin_u
    b, h, t, _ = cos.shape

    def one(x):
        x_dtype = x.dtype
        x = x.reshape(b, t, h, -1).swapaxes(1, 2)
        last = x.shape[-1]
        split_x = x.reshape(*x.shape[:-1], 2, last // 2).float()
        out = split_x * cos_u
        out[..., :1, :].addcmul_(neg_sin_u, split_x[..., 1:, :])
        out[..., 1:, :].addcmul_(sin_u, split_x[..., :1, :])
        return out.reshape(*out.shape[:-2], last).swapaxes(1, 2).reshape(b, t, -1).to(x_dtype)

    return (one(q), one(k), neg_sin_u) if extra_out else (one(q), one(k))


def ltx2_split_attention(q, k, cos, sin):
    """LTX2's attention: split RoPE on q and k, then ``unflatten(2, (heads, -1))`` (on the default route the
    form's last reshape and this one become one reshape that Inductor drops)."""
    h = cos.shape[1]
    return tuple(ltx2_split_rope(x, cos, sin).unflatten(2, (h, -1)) for x in (q, k))


def test_split_shared_table_ops_groups_per_instance():
    """The preparation step itself, on the shared-table graphs traced as aot_autograd does: each RoPE gets its
    own copies, a user outside both (``-sin_u`` returned) keeps the original, and the graph computes the
    same."""
    from fusegraph.fusion.patterns._trace import fwd_functional
    from fusegraph.fusion.patterns.rope import split_shared_table_ops

    def ops(gm, target):
        return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == target]

    B, T, H, D = 1, 5, 2, 8
    q, k = torch.randn(B, T, H * D), torch.randn(B, T, H * D)
    cos, sin = torch.randn(B, H, T, D // 2), torch.randn(B, H, T, D // 2)
    gm = fwd_functional(lambda *a: ltx2_split_shared(*a, extra_out=True), [q, k, cos, sin])  # as aot_autograd
    assert [len(n.users) for n in ops(gm, torch.ops.aten.neg.default)] == [3]  # q, k and the output
    # -sin_u and sin_u: a copy for q and one for k (the original keeps the output); cos_u: k's copy
    assert split_shared_table_ops(gm.graph) == 5
    assert [len(n.users) for n in ops(gm, torch.ops.aten.neg.default)] == [1, 1, 1]
    # sin_u: the original (read by the returned -sin_u), q's and k's (each read by its -sin_u and addcmul)
    assert sorted(len(n.users) for n in ops(gm, torch.ops.aten.unsqueeze.default)) == [1, 1, 1, 2, 2]
    gm.recompile()
    for a, e in zip(gm(q, k, cos, sin), ltx2_split_shared(q, k, cos, sin, extra_out=True)):
        torch.testing.assert_close(a, e, rtol=0, atol=0)

    freqs = torch.randn(B, T, 1, D // 2, 2, 2)
    x4 = [torch.randn(B, T, H, D) for _ in range(2)]
    gm = fwd_functional(hidream_rope_shared, [*x4, freqs])
    assert split_shared_table_ops(gm.graph) == 2  # [..., 0] and [..., 1]: k's copies
    assert all(len(n.users) == 1 for n in ops(gm, torch.ops.aten.select.int) if n.args[0].op == "placeholder")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["hidream", "ltx2_split"])
def test_rope_sharing_table_ops_fuses(dtype, form):
    """q and k sharing the table ops (as after CSE, here written so): both RoPEs fuse (inductor=False: the
    sharing is the source's own)."""
    B, T, H, D = 2, 5, 3, 8
    if form == "hidream":
        fn, q, k = hidream_rope_shared, torch.randn(B, T, H, D, dtype=dtype), torch.randn(B, T, H, D, dtype=dtype)
        tables = (torch.randn(B, T, 1, D // 2, 2, 2),)
    else:
        fn, q, k = ltx2_split_shared, torch.randn(B, T, H * D, dtype=dtype), torch.randn(B, T, H * D, dtype=dtype)
        tables = tuple(torch.randn(B, T, H, D // 2).transpose(1, 2) for _ in range(2))
    b, out, eager = compile_and_run(fn, q, k, *tables, inductor=False)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2
    assert_matches(out, eager, scale=4.0, ref64=double(fn, q, k, *tables))


def test_rope_sharing_table_ops_with_lookalike():
    """q's RoPE and a lookalike on k share the selects: q fuses, k stays as written."""
    q, k = torch.randn(2, 5, 2, 8), torch.randn(2, 5, 2, 8)
    freqs = torch.randn(2, 5, 1, 4, 2, 2)
    b, out, eager = compile_and_run(hidream_rope_shared_lookalike_k, q, k, freqs, inductor=False)
    assert b.stats.patterns["rope"] == 1 and fused(b, "rope") == 1
    assert_matches(out, eager, ref64=double(hidream_rope_shared_lookalike_k, q, k, freqs))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["hidream", "ltx2_split"])
def test_rope_sharing_after_cse_fuses_on_default_route(dtype, form):
    """The stock diffusers functions on q and k with the same tables through the default route
    (``Backend(CompilationConfig())``: Inductor, freezing on): freezing's CSE merges q's and k's table ops
    before the fusion pass, and both RoPEs still fuse."""
    B, T, H, D = 1, 5, 2, 8
    if form == "hidream":
        fn, q, k = hidream_rope, torch.randn(B, T, H, D, dtype=dtype), torch.randn(B, T, H, D, dtype=dtype)
        tables = (hidream_freqs(B, T, D),)
    else:
        fn, q, k = ltx2_split_attention, torch.randn(B, T, H * D, dtype=dtype), torch.randn(B, T, H * D, dtype=dtype)
        tables = tuple(torch.randn(B, T, H, D // 2).transpose(1, 2) for _ in range(2))
    b, out, eager = compile_and_run(fn, q, k, *tables)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2
    assert_matches(out, eager, scale=4.0, ref64=double(fn, q, k, *tables))


# --- Mochi: strided even / odd halves, per-pair tables [S, H, D/2], stacked back ---------------------------


def mochi_rope(x, freqs_cos, freqs_sin):
    """Verbatim the nested apply_rotary_emb of diffusers' MochiAttnProcessor2_0 (attention_processor.py)."""
    x_even = x[..., 0::2].float()
    x_odd = x[..., 1::2].float()

    cos = (x_even * freqs_cos - x_odd * freqs_sin).to(x.dtype)
    sin = (x_even * freqs_sin + x_odd * freqs_cos).to(x.dtype)

    return torch.stack([cos, sin], dim=-1).flatten(-2)


def mochi_rope_qk(q, k, freqs_cos, freqs_sin):
    """The processor's two calls, q and k with the same tables (one graph here; in the model a graph break
    makes the function a frame of its own, compiled once)."""
    return mochi_rope(q, freqs_cos, freqs_sin), mochi_rope(k, freqs_cos, freqs_sin)


def mochi_ref64(x, freqs_cos, freqs_sin):
    """The rotation of each pair (x[2i], x[2i+1]) by (c_i, s_i), float64."""
    x = x.double().unflatten(-1, (-1, 2))
    c, s = freqs_cos.double(), freqs_sin.double()
    return torch.stack([x[..., 0] * c - x[..., 1] * s, x[..., 0] * s + x[..., 1] * c], dim=-1).flatten(-2)


MOCHI_CHAIN = ("aten.slice.Tensor", "aten.cat.default", "aten.sub.Tensor")


@pytest.mark.parametrize("route", [dict(inductor=False), {}], ids=["aten", "default"])
@pytest.mark.parametrize("tables_dtype", ["fp32", "x"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mochi_rope_fuses(dtype, tables_dtype, route, error_logs):
    """x [B, S, H, D] (after the processor's unflatten(2, (heads, -1))), random per-pair tables [S, H, D/2]
    (fp32, as MochiRoPE builds them, or in x's dtype); q and k: two sites. The default route
    (``CompilationConfig()``: Inductor, freezing on) too."""
    torch.manual_seed(0)
    B, S, H, D = 2, 6, 3, 16
    q, k = torch.randn(B, S, H, D, dtype=dtype), torch.randn(B, S, H, D, dtype=dtype)
    cos, sin = (torch.randn(S, H, D // 2) for _ in range(2))
    if tables_dtype == "x":
        cos, sin = cos.to(dtype), sin.to(dtype)
    b, out, eager = compile_and_run(mochi_rope_qk, q, k, cos, sin, **route)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2, b.stats.patterns
    assert b.stats.patterns["mul_add"] == 0  # nothing of the RoPE left for mul_add
    assert_ops_gone(b, *MOCHI_CHAIN)
    assert_matches(out, eager, scale=4.0, ref64=(mochi_ref64(q, cos, sin), mochi_ref64(k, cos, sin)))
    assert not error_logs, [r.getMessage() for r in error_logs]


def test_mochi_ref64_is_the_source():
    """The float64 reference above is Mochi's function (run in float64), so the test compares with the
    source's math, not with the op's idea of it."""
    x, cos, sin = torch.randn(2, 5, 2, 8), torch.randn(5, 2, 4), torch.randn(5, 2, 4)
    torch.testing.assert_close(mochi_ref64(x, cos, sin), double(mochi_rope, x, cos, sin), rtol=1e-12, atol=1e-12)


def lookalike_mochi_wrong_sign(x, freqs_cos, freqs_sin):
    """The conjugate rotation: + where the source has -, - where it has +."""
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
    cos = (x_even * freqs_cos + x_odd * freqs_sin).to(x.dtype)
    sin = (x_even * freqs_sin - x_odd * freqs_cos).to(x.dtype)
    return torch.stack([cos, sin], dim=-1).flatten(-2)


def lookalike_mochi_even_odd_swapped(x, freqs_cos, freqs_sin):
    x_even, x_odd = x[..., 1::2].float(), x[..., 0::2].float()
    cos = (x_even * freqs_cos - x_odd * freqs_sin).to(x.dtype)
    sin = (x_even * freqs_sin + x_odd * freqs_cos).to(x.dtype)
    return torch.stack([cos, sin], dim=-1).flatten(-2)


def lookalike_mochi_outputs_swapped(x, freqs_cos, freqs_sin):
    """The two results written back in the other order (the sin part at even positions)."""
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
    cos = (x_even * freqs_cos - x_odd * freqs_sin).to(x.dtype)
    sin = (x_even * freqs_sin + x_odd * freqs_cos).to(x.dtype)
    return torch.stack([sin, cos], dim=-1).flatten(-2)


def lookalike_mochi_halves(x, freqs_cos, freqs_sin):
    """Stacked along a new first-of-pair dim the other way round: halves, not pairs (rotate-half layout of
    interleaved reads)."""
    x_even, x_odd = x[..., 0::2].float(), x[..., 1::2].float()
    cos = (x_even * freqs_cos - x_odd * freqs_sin).to(x.dtype)
    sin = (x_even * freqs_sin + x_odd * freqs_cos).to(x.dtype)
    return torch.stack([cos, sin], dim=-2).flatten(-2)


@pytest.mark.parametrize("route", [dict(inductor=False), {}], ids=["aten", "default"])
@pytest.mark.parametrize("fn", [lookalike_mochi_wrong_sign, lookalike_mochi_even_odd_swapped,
                                lookalike_mochi_outputs_swapped, lookalike_mochi_halves])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mochi_lookalikes_stay_unfused(fn, dtype, route, error_logs):
    x = torch.randn(2, 5, 2, 8, dtype=dtype)
    cos, sin = torch.randn(5, 2, 4), torch.randn(5, 2, 4)
    b, out, eager = compile_and_run(fn, x, cos, sin, **route)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert_matches(out, eager)
    assert not error_logs, [r.getMessage() for r in error_logs]


def test_mochi_rope_other_table_shapes():
    """Tables that broadcast over the heads ([S, 1, D/2]) fuse too."""
    x = torch.randn(2, 5, 3, 8)
    cos, sin = torch.randn(5, 1, 4), torch.randn(5, 1, 4)
    b, out, eager = compile_and_run(mochi_rope, x, cos, sin, inductor=False)
    assert fused(b, "rope") == 1
    assert_matches(out, eager, ref64=mochi_ref64(x, cos, sin))


# --- rotate-half by slices / chunk + cat (Cosmos3, Ideogram4, LongCat-Audio) ------------------------------


def cosmos3_rotate_half(x):
    """Verbatim transformer_cosmos3._rotate_half (Ideogram4's is the same)."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def cosmos3_rope(q, k, cos, sin):
    """Cosmos3PackedMoTAttnProcessor: q / k ``[N, H, D]`` (one packed sequence), tables ``[N, D]``
    unsqueezed to ``[N, 1, D]``, math in x's dtype."""
    cos = cos.unsqueeze(1)
    sin = sin.unsqueeze(1)
    q = q * cos + cosmos3_rotate_half(q) * sin
    k = k * cos + cosmos3_rotate_half(k) * sin
    return q, k


def ideogram4_rope(query, key, cos, sin):
    """Ideogram4AttnProcessor: ``[B, L, H, D]``, tables ``[B, L, D]`` unsqueezed at 2."""
    cos = cos.unsqueeze(2)
    sin = sin.unsqueeze(2)
    query = (query * cos) + (cosmos3_rotate_half(query) * sin)
    key = (key * cos) + (cosmos3_rotate_half(key) * sin)
    return query, key


def longcat_rotate_half(hidden_states):
    """Verbatim transformer_longcat_audio_dit._rotate_half."""
    first, second = hidden_states.chunk(2, dim=-1)
    return torch.cat((-second, first), dim=-1)


def longcat_rope(hidden_states, cos, sin):
    """transformer_longcat_audio_dit._apply_rotary_emb (its ``.to(device)`` no-ops dropped): tables ``[S, D]``."""
    cos = cos[None, :, None]
    sin = sin[None, :, None]
    return (hidden_states.float() * cos + longcat_rotate_half(hidden_states).float() * sin).to(hidden_states.dtype)


def half_ref64(x, cos, sin, rotary_dim=None):
    """float64 rotate-half RoPE on x[..., :R] (R = the tables' width), the rest as it is."""
    return rope_ref(x, cos, sin, False, rotary_dim=rotary_dim)


ROUTES = [pytest.param(dict(inductor=False), id="aten"), pytest.param({}, id="default")]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_cosmos3_rope_fuses(dtype, route, error_logs):
    """Rank-3 x (no batch dim), tables in x's dtype (Cosmos3's rotary embedding returns them so; fp32 tables
    with a bf16 x would give an fp32 result, see the lookalike test)."""
    N, H, D = 7, 3, 16
    q, k = torch.randn(N, H, D, dtype=dtype), torch.randn(N, H, D, dtype=dtype)
    cos, sin = torch.randn(N, D, dtype=dtype), torch.randn(N, D, dtype=dtype)
    b, out, eager = compile_and_run(cosmos3_rope, q, k, cos, sin, **route)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2, b.stats.patterns
    assert b.stats.patterns["mul_add"] == 0
    assert_ops_gone(b, "aten.cat.default", "aten.neg.default")
    refs = tuple(half_ref64(t, cos[:, None], sin[:, None]) for t in (q, k))
    assert_matches(out, eager, scale=8.0, ref64=refs)
    assert not error_logs, [r.getMessage() for r in error_logs]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_ideogram4_rope_fuses(dtype, route, error_logs):
    B, L, H, D = 2, 6, 2, 24
    q, k = torch.randn(B, L, H, D, dtype=dtype), torch.randn(B, L, H, D, dtype=dtype)
    cos, sin = torch.randn(B, L, D, dtype=dtype), torch.randn(B, L, D, dtype=dtype)
    b, out, eager = compile_and_run(ideogram4_rope, q, k, cos, sin, **route)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2, b.stats.patterns
    assert_ops_gone(b, "aten.cat.default", "aten.neg.default")
    refs = tuple(half_ref64(t, cos[:, :, None], sin[:, :, None]) for t in (q, k))
    assert_matches(out, eager, scale=8.0, ref64=refs)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("tables_dtype", ["fp32", "x"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_longcat_audio_rope_fuses(dtype, tables_dtype, route, error_logs):
    """Tables ``[S, D]`` (LongCat-Audio's rotary embedding casts them to x's dtype; fp32 works too)."""
    B, S, H, D = 2, 9, 2, 16
    x = torch.randn(B, S, H, D, dtype=dtype)
    cos, sin = torch.randn(S, D), torch.randn(S, D)
    if tables_dtype == "x":
        cos, sin = cos.to(dtype), sin.to(dtype)
    b, out, eager = compile_and_run(longcat_rope, x, cos, sin, **route)
    assert b.stats.patterns["rope"] == 1 and fused(b, "rope") == 1, b.stats.patterns
    assert_ops_gone(b, "aten.cat.default", "aten.neg.default")
    assert_matches(out, eager, scale=4.0, ref64=half_ref64(x, cos[None, :, None], sin[None, :, None]))
    assert not error_logs, [r.getMessage() for r in error_logs]


def rotate_half_chunk_inline(x, cos, sin):
    """The inline chunk rotation (``x1, x2 = x.chunk(2, dim=-1)``; ``rot = torch.cat((-x2, x1), dim=-1)``)."""
    x1, x2 = x.chunk(2, dim=-1)
    rot = torch.cat((-x2, x1), dim=-1)
    return x * cos + rot * sin


def rotate_half_slices_fp32(x, cos, sin):
    """Slices ``x[..., : d // 2]``, ``x[..., d // 2 :]`` in fp32 (``.float()`` on x), cast back."""
    d = x.shape[-1]
    rot = torch.cat((-x[..., d // 2 :], x[..., : d // 2]), dim=-1)
    return (x.float() * cos + rot.float() * sin).to(x.dtype)


HALF_LAYOUTS = {  # x layout, tables shape (S = 7, D = 12, B = 2)
    "BSHD_S1D": ("BSHD", (7, 1, 12)),
    "BSHD_1S1D": ("BSHD", (1, 7, 1, 12)),
    "BSHD_BS1D": ("BSHD", (2, 7, 1, 12)),
    "BHSD_SD": ("BHSD", (7, 12)),
    "BHSD_B1SD": ("BHSD", (2, 1, 7, 12)),
    "BHSD_view_11SD": ("BHSD_view", (1, 1, 7, 12)),
}


@pytest.mark.parametrize("layout", list(HALF_LAYOUTS))
@pytest.mark.parametrize("fn", [rotate_half_chunk_inline, rotate_half_slices_fp32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_rotate_half_layouts_fuse(dtype, fn, layout):
    """Both rotate-half spellings over the table layouts models use, x [B, S, H, D] or [B, H, S, D] (also a
    transposed view of [B, S, H, D]); tables in x's dtype (the form without casts needs them so)."""
    kind, cs_shape = HALF_LAYOUTS[layout]
    B, S, H, D = 2, 7, 3, 12
    if kind == "BSHD":
        x = torch.randn(B, S, H, D, dtype=dtype)
    elif kind == "BHSD":
        x = torch.randn(B, H, S, D, dtype=dtype)
    else:
        x = torch.randn(B, S, H, D, dtype=dtype).transpose(1, 2)
    cos, sin = torch.randn(cs_shape).to(dtype), torch.randn(cs_shape).to(dtype)
    b, out, eager = compile_and_run(fn, x, cos, sin, inductor=False)
    assert b.stats.patterns["rope"] == 1 and fused(b, "rope") == 1, b.stats.patterns
    assert_ops_gone(b, "aten.cat.default", "aten.neg.default")
    assert_matches(out, eager, scale=8.0, ref64=half_ref64(x, cos, sin))


def test_rotate_half_sources_are_the_op():
    """The copies above are diffusers' functions (the module's own, where importable) and the op's math."""
    from diffusers.models.transformers import transformer_cosmos3, transformer_ideogram4, transformer_longcat_audio_dit

    x = torch.randn(2, 5, 3, 12)
    for fn in (transformer_cosmos3._rotate_half, transformer_ideogram4._rotate_half,
               transformer_longcat_audio_dit._rotate_half):
        torch.testing.assert_close(fn(x), cosmos3_rotate_half(x), rtol=0, atol=0)
    cos, sin = torch.randn(5, 12), torch.randn(5, 12)
    torch.testing.assert_close(transformer_longcat_audio_dit._apply_rotary_emb(x, (cos, sin)),
                               longcat_rope(x, cos, sin), rtol=0, atol=0)


def lookalike_half_wrong_order(x, cos, sin):
    """``cat((x2, -x1))``: the inverse rotation's sign placement."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((second, -first), dim=-1) * sin


def lookalike_half_slice_from_1(x, cos, sin):
    """The second half read from one element later (``x[..., h + 1:]`` padded back): not rotate-half."""
    half = x.shape[-1] // 2
    second = torch.cat((x[..., half + 1 :], x[..., :1]), dim=-1)
    return x * cos + torch.cat((-second, x[..., :half]), dim=-1) * sin


def lookalike_half_no_neg(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat((x[..., half:], x[..., :half]), dim=-1) * sin


def lookalike_half_tables_swapped(x, cos, sin):
    return x * sin + cosmos3_rotate_half(x) * cos * 2


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("fn", [lookalike_half_wrong_order, lookalike_half_slice_from_1, lookalike_half_no_neg,
                                lookalike_half_tables_swapped])
def test_rotate_half_lookalikes_stay_unfused(fn, route, error_logs):
    x = torch.randn(2, 5, 2, 8)
    cos, sin = torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    b, out, eager = compile_and_run(fn, x, cos, sin, **route)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert_matches(out, eager)
    assert not error_logs, [r.getMessage() for r in error_logs]


def test_rotate_half_without_casts_and_fp32_tables_stays_unfused():
    """bf16 x times fp32 tables with no cast back: the result is fp32, which the op (x's dtype) does not give."""
    x = torch.randn(2, 5, 2, 8, dtype=torch.bfloat16)
    cos, sin = torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    b, out, eager = compile_and_run(lambda x, c, s: x * c + cosmos3_rotate_half(x) * s, x, cos, sin, inductor=False)
    assert fused(b, "rope") == 0 and out.dtype == torch.float32
    torch.testing.assert_close(out, eager)


# --- partial rotary (MiniMax-H3, MiniMax-Music3, Ernie-Image, Stable Audio 3) -----------------------------


def minimax_h3_rope(hidden_states, cos, sin):
    """Verbatim transformer_minimax_h3._apply_rotary_emb: tables ``[S, R]``, the first R channels rotated."""
    rotary_dim = cos.shape[-1]
    hidden_states_rotary = hidden_states[..., :rotary_dim]
    hidden_states_pass = hidden_states[..., rotary_dim:]

    cos = cos.to(hidden_states.dtype)[None, :, None, :]
    sin = sin.to(hidden_states.dtype)[None, :, None, :]
    x1, x2 = hidden_states_rotary.chunk(2, dim=-1)
    hidden_states_rotated = torch.cat((-x2, x1), dim=-1)
    hidden_states_rotary = hidden_states_rotary * cos + hidden_states_rotated * sin
    return torch.cat((hidden_states_rotary, hidden_states_pass), dim=-1).contiguous()


def minimax_music3_rope(hidden_states, rotary_emb):
    """Verbatim transformer_minimax_music3._apply_partial_rotary_emb: tables ``[S, R]`` -> ``[S, 1, R]``."""
    cos, sin = rotary_emb
    rotary_dim = cos.shape[-1]
    cos = cos[:, None, :].to(hidden_states.dtype)
    sin = sin[:, None, :].to(hidden_states.dtype)
    rotated = hidden_states[..., :rotary_dim]
    half_first, half_second = rotated.chunk(2, dim=-1)
    rotate_half = torch.cat((-half_second, half_first), dim=-1)
    rotated = rotated * cos + rotate_half * sin
    return torch.cat((rotated, hidden_states[..., rotary_dim:]), dim=-1)


def ernie_rope(x_in, freqs_cis):
    """Verbatim the nested apply_rotary_emb of ErnieImageAttnProcessor: angles ``[B, S, 1, R]``, cos / sin of
    them in x's dtype inside."""
    rot_dim = freqs_cis.shape[-1]
    x, x_pass = x_in[..., :rot_dim], x_in[..., rot_dim:]
    cos_ = torch.cos(freqs_cis).to(x.dtype)
    sin_ = torch.sin(freqs_cis).to(x.dtype)
    # Non-interleaved rotate_half: [-x2, x1]
    x1, x2 = x.chunk(2, dim=-1)
    x_rotated = torch.cat((-x2, x1), dim=-1)
    return torch.cat((x * cos_ + x_rotated * sin_, x_pass), dim=-1)


def stable_audio3_rotate_half(x):
    """Verbatim transformer_stable_audio3._rotate_half."""
    x = x.unflatten(-1, (2, -1))
    x1, x2 = x.unbind(-2)
    return torch.cat((-x2, x1), dim=-1)


def stable_audio3_rope(t, freqs):
    """Verbatim transformer_stable_audio3._apply_rotary_partial: angles ``[S_max, R]``, fp32 math."""
    rot_dim = freqs.shape[-1]
    out_dtype = t.dtype
    t_rot, t_pass = t[..., :rot_dim], t[..., rot_dim:]
    t_rot = t_rot.float()
    freqs = freqs[-t_rot.shape[-3] :].float().unsqueeze(1)  # (seq_len, 1, rot_dim) broadcasts over heads
    t_rot = t_rot * freqs.cos() + stable_audio3_rotate_half(t_rot) * freqs.sin()
    return torch.cat((t_rot.to(out_dtype), t_pass), dim=-1)


def qk(fn):
    def both(q, k, *tables):
        return fn(q, *tables), fn(k, *tables)
    both.__name__ = fn.__name__ + "_qk"
    return both


def partial_case(name, dtype, D, R):
    """(function of q, k, tables; inputs; float64 references) for one source form."""
    B, S, H = 2, 7, 3
    q, k = torch.randn(B, S, H, D, dtype=dtype), torch.randn(B, S, H, D, dtype=dtype)
    if name == "minimax_h3":
        cos, sin = torch.randn(S, R), torch.randn(S, R)
        c, s = cos.to(dtype)[None, :, None], sin.to(dtype)[None, :, None]
        return qk(minimax_h3_rope), (q, k, cos, sin), c, s
    if name == "minimax_music3":
        cos, sin = torch.randn(S, R), torch.randn(S, R)
        c, s = cos.to(dtype)[:, None], sin.to(dtype)[:, None]
        return qk(lambda x, c_, s_: minimax_music3_rope(x, (c_, s_))), (q, k, cos, sin), c, s
    if name == "ernie":
        freqs = torch.rand(B, S, 1, R) * 6
        return qk(ernie_rope), (q, k, freqs), freqs.cos().to(dtype), freqs.sin().to(dtype)
    freqs = torch.rand(S + 3, R) * 6  # stable_audio3
    f = freqs[-S:].unsqueeze(1)
    return qk(stable_audio3_rope), (q, k, freqs), f.cos(), f.sin()


PARTIAL_SOURCES = ["minimax_h3", "minimax_music3", "ernie", "stable_audio3"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("D,R", [(16, 8), (20, 12), (16, 16)], ids=["R=D/2", "R=12_of_20", "R=D"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", PARTIAL_SOURCES)
def test_partial_rotary_fuses(name, dtype, D, R, route, error_logs):
    """Each source's function on q and k: one fusegraph.rope(..., rotary_dim=R) each, also with R = D (Ernie's
    tables are as wide as the head: an empty pass-through)."""
    fn, inputs, cos, sin = partial_case(name, dtype, D, R)
    b, out, eager = compile_and_run(fn, *inputs, **route)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2, b.stats.patterns
    assert b.stats.patterns["mul_add"] == 0
    assert_ops_gone(b, "aten.neg.default")
    refs = tuple(half_ref64(t, cos, sin, rotary_dim=R) for t in inputs[:2])
    assert_matches(out, eager, scale=8.0, ref64=refs)
    assert not error_logs, [r.getMessage() for r in error_logs]


def test_partial_sources_are_diffusers():
    """The copies above are diffusers' functions."""
    from diffusers.models.transformers import (transformer_minimax_h3, transformer_minimax_music3,
                                               transformer_stable_audio3)

    x = torch.randn(2, 5, 3, 20)
    cos, sin = torch.randn(5, 12), torch.randn(5, 12)
    torch.testing.assert_close(minimax_h3_rope(x, cos, sin), transformer_minimax_h3._apply_rotary_emb(x, cos, sin),
                               rtol=0, atol=0)
    torch.testing.assert_close(minimax_music3_rope(x, (cos, sin)),
                               transformer_minimax_music3._apply_partial_rotary_emb(x, (cos, sin)), rtol=0, atol=0)
    freqs = torch.rand(8, 12)
    torch.testing.assert_close(stable_audio3_rope(x, freqs), transformer_stable_audio3._apply_rotary_partial(x, freqs),
                               rtol=0, atol=0)


def lookalike_partial_wrong_order(x, cos, sin):
    """``cat((x2, -x1))`` on the rotated part."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r:]
    x1, x2 = x_rot.chunk(2, dim=-1)
    return torch.cat((x_rot * cos + torch.cat((x2, -x1), dim=-1) * sin, x_pass), dim=-1)


def lookalike_partial_pass_not_the_rest(x, cos, sin):
    """The pass-through skips a channel and repeats the last one: not ``x[..., R:]``."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r + 1 :]
    x1, x2 = x_rot.chunk(2, dim=-1)
    return torch.cat((x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin, x_pass, x[..., -1:]), dim=-1)


def lookalike_partial_pass_other_tensor(x, cos, sin, other):
    r = cos.shape[-1]
    x_rot = x[..., :r]
    x1, x2 = x_rot.chunk(2, dim=-1)
    return torch.cat((x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin, other[..., r:]), dim=-1)


def lookalike_partial_from_the_end(x, cos, sin):
    """The rotated part is the last R channels, passed-through first."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., -r:], x[..., :-r]
    x1, x2 = x_rot.chunk(2, dim=-1)
    return torch.cat((x_pass, x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin), dim=-1)


def lookalike_partial_rotated_from_1(x, cos, sin):
    """The rotated part starts one channel in (``x[..., 1:R + 1]``), the pass-through keeps the rest."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., 1 : r + 1], torch.cat((x[..., :1], x[..., r + 1 :]), dim=-1)
    x1, x2 = x_rot.chunk(2, dim=-1)
    return torch.cat((x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin, x_pass), dim=-1)


def lookalike_partial_mismatched_widths(x, cos, sin):
    """Rotated part R wide (the tables' width), pass-through from R + 2: channels R, R + 1 dropped."""
    r = cos.shape[-1]
    x_rot, x_pass = x[..., :r], x[..., r + 2 :]
    x1, x2 = x_rot.chunk(2, dim=-1)
    return torch.cat((x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin, x_pass), dim=-1)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("fn", [lookalike_partial_wrong_order, lookalike_partial_pass_not_the_rest,
                                lookalike_partial_pass_other_tensor, lookalike_partial_from_the_end,
                                lookalike_partial_rotated_from_1, lookalike_partial_mismatched_widths])
def test_partial_lookalikes_stay_unfused(fn, route, error_logs):
    """None of these may become rope(rotary_dim=R). Where the inner ``x_rot * cos + rot(x_rot) * sin`` is a
    correct rotate-half of a slice, the full-width form may fuse that part alone (the output stays right)."""
    x = torch.randn(2, 5, 2, 16)
    cos, sin = torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8)
    args = (x, cos, sin, torch.randn(2, 5, 2, 16)) if fn is lookalike_partial_pass_other_tensor else (x, cos, sin)
    b, out, eager = compile_and_run(fn, *args, **route)
    assert b.stats.patterns["rope"] == fused(b, "rope")
    assert b.all_ops["aten.cat.default"] >= 1  # the pass-through's cat: no rope(rotary_dim=R) took it
    if fn is lookalike_partial_wrong_order:
        assert fused(b, "rope") == 0
    assert_matches(out, eager)
    assert not error_logs, [r.getMessage() for r in error_logs]


# --- other sources over diffusers' transformers: each module's own function where importable ----------------


def cplx_freqs(*shape, dtype=torch.complex64):
    """Unit-modulus complex tables (random angles), as the complex forms' rotary embeddings build them."""
    return torch.polar(torch.ones(*shape, dtype=torch.float64), torch.rand(*shape, dtype=torch.float64) * 6).to(dtype)


def kandinsky5_rope(x, rope):
    """Verbatim the nested apply_rotary of Kandinsky5AttnProcessor (transformer_kandinsky.py)."""
    x_ = x.reshape(*x.shape[:-1], -1, 1, 2).to(torch.float32)
    x_out = (rope * x_).sum(dim=-1)
    return x_out.reshape(*x.shape).to(torch.bfloat16)


def kandinsky5_qk(q, k, rope):
    """The processor's calls: ``apply_rotary(query, rotary_emb).type_as(query)`` (and key)."""
    return kandinsky5_rope(q, rope).type_as(q), kandinsky5_rope(k, rope).type_as(k)


def kandinsky_tables(B, S, D):
    """``stack([cos, -sin, sin, cos]).view(2, 2)`` per pair, ``unsqueeze(-4)`` over the heads: [B, S, 1, D/2, 2, 2]."""
    args = torch.rand(B, S, D // 2) * 6
    rope = torch.stack([args.cos(), -args.sin(), args.sin(), args.cos()], dim=-1)
    return rope.view(*rope.shape[:-1], 2, 2).unsqueeze(-4)


def matrix_ref64(x, m):
    """float64 ``out[2i + r] = sum_c m[i, r, c] x[2i + c]``."""
    return (m.double() * x.double().unflatten(-1, (-1, 1, 2))).sum(-1).flatten(-2)


def other_case(name, dtype):
    """(function, inputs, float64 reference of each output) for one source."""
    from diffusers.models.transformers import (transformer_anyflow, transformer_helios, transformer_joyimage,
                                               transformer_joyimage_edit_plus, transformer_kandinsky6,
                                               transformer_nucleusmoe_image, transformer_prx, transformer_qwenimage21)

    torch.manual_seed(0)
    B, S, H, D = 2, 6, 2, 16
    q, k = torch.randn(B, S, H, D, dtype=dtype), torch.randn(B, S, H, D, dtype=dtype)

    def complex_ref(x, f):  # f broadcast to x's pairs
        f = torch.view_as_real(f.to(torch.complex128))
        c, s = (t.repeat_interleave(2, -1) for t in (f[..., 0], f[..., 1]))
        return rope_ref(x, c, s, True)

    if name in ("nucleus", "qwenimage21"):  # freqs [S, D/2], unsqueezed at 1 inside
        fn = transformer_nucleusmoe_image._apply_rotary_emb_nucleus if name == "nucleus" else \
            transformer_qwenimage21.apply_rotary_emb_qwen
        f = cplx_freqs(S, D // 2)
        return (lambda q, k, f: (fn(q, f, use_real=False), fn(k, f, use_real=False))), (q, k, f), \
            tuple(complex_ref(t, f.unsqueeze(1)) for t in (q, k))
    if name == "bria_fibo2":
        def apply_rotary_emb(x_in, freqs_cis):  # verbatim, nested in BriaFibo2AttnProcessor
            x = torch.view_as_complex(x_in.float().reshape(*x_in.shape[:-1], -1, 2))
            x_out = torch.view_as_real(x * freqs_cis.unsqueeze(2)).flatten(3)
            return x_out.type_as(x_in)
        f = cplx_freqs(B, S, D // 2)
        return qk(apply_rotary_emb), (q, k, f), tuple(complex_ref(t, f.unsqueeze(2)) for t in (q, k))
    if name == "anyflow":  # complex128 tables [S, 1, D/2], float64 math
        f = cplx_freqs(S, 1, D // 2, dtype=torch.complex128)
        return qk(transformer_anyflow.apply_rotary_emb), (q, k, f), tuple(complex_ref(t, f) for t in (q, k))
    if name in ("joyimage", "joyimage_edit_plus"):
        if name == "joyimage":  # tables [S, D] viewed to [1, S, 1, D] inside
            cos, sin = torch.randn(S, D), torch.randn(S, D)
            fn, c, s = transformer_joyimage._apply_rotary_emb, cos[None, :, None], sin[None, :, None]
        else:  # batched tables [B, S, D] unsqueezed at 2 inside
            cos, sin = torch.randn(B, S, D), torch.randn(B, S, D)
            fn, c, s = transformer_joyimage_edit_plus._apply_rotary_emb_batched, cos[:, :, None], sin[:, :, None]
        return (lambda q, k, cos, sin: fn(q, k, (cos, sin))), (q, k, cos, sin), \
            tuple(rope_ref(t, c, s, True) for t in (q, k))
    if name in ("kandinsky5", "kandinsky6"):
        rope = kandinsky_tables(B, S, D)
        fn = kandinsky5_qk if name == "kandinsky5" else qk(transformer_kandinsky6.apply_rotary)
        refs = tuple(matrix_ref64(t, rope) for t in (q, k))
        if name == "kandinsky5":  # the source rounds to bf16 whatever x is: so does the reference
            refs = tuple(r.to(torch.bfloat16).double() for r in refs)
        return fn, (q, k, rope), refs
    if name == "prx":  # x [B, H, S, D], freqs_cis [B, 1, S, D/2, 2, 2]
        qh, kh = q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous()
        rope = kandinsky_tables(B, S, D).transpose(1, 2)
        return qk(transformer_prx.apply_rope), (qh, kh, rope), tuple(matrix_ref64(t, rope) for t in (qh, kh))
    if name == "sana_wm":  # q / k [B, N, H, D] permuted to (B, H, D, N), as SanaWM's linear attention does
        from diffusers.models.transformers import transformer_sana_wm

        f = cplx_freqs(1, 1, S, D // 2)

        def sana_wm(q, k, f):
            q, k = q.permute(0, 2, 3, 1), k.permute(0, 2, 3, 1)
            return transformer_sana_wm._apply_rotary_emb(q, f), transformer_sana_wm._apply_rotary_emb(k, f)

        return sana_wm, (q, k, f), tuple(complex_ref(t.permute(0, 2, 1, 3), f).permute(0, 1, 3, 2) for t in (q, k))
    assert name == "helios"  # freqs_cis [B, S, 2D]: cos | sin, each repeat-interleaved per pair
    angles = (torch.rand(B, S, D // 2) * 6).repeat_interleave(2, -1)
    freqs_cis = torch.cat([angles.cos(), angles.sin()], dim=-1)
    c, s = angles.cos()[:, :, None], angles.sin()[:, :, None]
    return qk(transformer_helios.apply_rotary_emb_transposed), (q, k, freqs_cis), \
        tuple(rope_ref(t, c, s, True) for t in (q, k))


OTHER_SOURCES = ["nucleus", "qwenimage21", "bria_fibo2", "anyflow", "joyimage", "joyimage_edit_plus", "kandinsky5",
                 "kandinsky6", "prx", "helios", "sana_wm"]


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", OTHER_SOURCES)
def test_other_sources_fuse(name, dtype, route, error_logs):
    """q and k through each source's function: two fusegraph.rope, the output equal to eager (and to the
    float64 math). Kandinsky 5 rounds its result to bf16 and back whatever x is: that stays, outside the op."""
    fn, inputs, refs = other_case(name, dtype)
    b, out, eager = compile_and_run(fn, *inputs, **route)
    assert b.stats.patterns["rope"] == 2 and fused(b, "rope") == 2, b.stats.patterns
    assert b.stats.patterns["mul_add"] == 0
    if name == "kandinsky5" and dtype == torch.float32 and b.config.inductor:
        # Inductor's codegen drops an fp32 -> bf16 -> fp32 round trip (emulate_precision_casts is off): plain
        # torch.compile gives the unrounded value too, and so does this route
        torch._dynamo.reset()
        with torch.no_grad():
            eager = torch.compile(fn)(*inputs)
        refs = tuple(matrix_ref64(t, inputs[2]) for t in inputs[:2])
    assert_matches(out, eager, scale=8.0, ref64=refs)
    assert not error_logs, [r.getMessage() for r in error_logs]


def test_kandinsky5_copy_is_the_source():
    """kandinsky5_rope above is the processor's nested function: its source line for line."""
    import inspect

    from diffusers.models.transformers import transformer_kandinsky

    src = inspect.getsource(transformer_kandinsky.Kandinsky5AttnProcessor.__call__)
    body = [line.strip() for line in inspect.getsource(kandinsky5_rope).splitlines()[2:]]
    assert all(line in src for line in body), body


def lookalike_matrix_transposed(x, freqs_cis):
    """The pair's matrix applied transposed (``rope * x_`` summed over the rows, not the columns)."""
    x_ = x.reshape(*x.shape[:-1], -1, 2, 1).float()
    return (freqs_cis * x_).sum(dim=-2).reshape(*x.shape).to(x.dtype)


def lookalike_helios_wrong_slices(x, freqs_cos, freqs_sin):
    x_1, x_2 = x.unflatten(-1, (-1, 2)).unbind(-1)
    out = torch.empty_like(x)
    out[..., 0::2] = x_1 * freqs_cos[..., 1::2] - x_2 * freqs_sin[..., 1::2]
    out[..., 1::2] = x_1 * freqs_sin[..., 1::2] + x_2 * freqs_cos[..., 1::2]
    return out.type_as(x)


def lookalike_joy_wrong_sign(x, cos, sin):
    x_real, x_imag = x.float().reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([x_imag, -x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated * sin).type_as(x)


def lookalike_anyflow_pairs_swapped(x, freqs):
    """Each result pair written back as (imag, real)."""
    x_rotated = torch.view_as_complex(x.to(torch.float64).unflatten(3, (-1, 2)))
    return torch.view_as_real(x_rotated * freqs).flip(-1).flatten(3, 4).type_as(x)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("fn", [lookalike_matrix_transposed, lookalike_helios_wrong_slices, lookalike_joy_wrong_sign,
                                lookalike_anyflow_pairs_swapped])
def test_other_lookalikes_stay_unfused(fn, route, error_logs):
    x = torch.randn(2, 5, 2, 8, dtype=torch.bfloat16)
    if fn is lookalike_matrix_transposed:
        args = (x, kandinsky_tables(2, 5, 8))
    elif fn is lookalike_anyflow_pairs_swapped:
        args = (x, cplx_freqs(5, 1, 4, dtype=torch.complex128))
    else:
        args = (x, torch.randn(1, 5, 1, 8), torch.randn(1, 5, 1, 8))
    b, out, eager = compile_and_run(fn, *args, **route)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert_matches(out, eager)
    assert not error_logs, [r.getMessage() for r in error_logs]


# --- SanaWM's camera path (UCPE): the complex form on the second half of the head dim -------------------------


def sana_wm_ucpe(q, k, v, P, P_inv, f):
    """SanaWM's camera-path calls of ``_apply_ucpe_transform`` (transformer_sana_wm.py, the GDN / linear
    attention's ``ray_transforms`` branch): q and the K‖V concatenation (V rotated too) in ``(B, H, D, N)``,
    transposed to ``(B, H, N, D)`` (a strided last dim: the source's ``.contiguous()`` copies the rotated half),
    and the output's inverse rotation (``rotary_emb.conj()``)."""
    from diffusers.models.transformers.transformer_sana_wm import _apply_ucpe_transform

    q_ucpe = _apply_ucpe_transform(q.transpose(-1, -2), P, f).transpose(-1, -2).contiguous()
    kv = torch.cat([k, v], dim=1)
    kv_ucpe = _apply_ucpe_transform(kv.transpose(-1, -2), P_inv, f).transpose(-1, -2).contiguous()
    out = _apply_ucpe_transform(q_ucpe.transpose(-1, -2), P, f, inverse_rope=True).transpose(-1, -2).contiguous()
    return q_ucpe, kv_ucpe, out


def sana_wm_ucpe_ref64(q, k, v, P, P_inv, f):
    """:func:`sana_wm_ucpe` in float64: the 4x4 transform of the first half, the complex128 rotation of the
    second (rounded to x's dtype where the source rounds: after each transform)."""
    def ucpe(x, m, freqs):  # x (B, H, N, D)
        b, h, n, d = x.shape
        proj, rot = x.double().split(d // 2, dim=-1)
        proj = torch.einsum("bnij,bhnkj->bhnki", m.double(), proj.reshape(b, h, n, -1, 4)).reshape(b, h, n, d // 2)
        rot = torch.view_as_real(torch.view_as_complex(rot.unflatten(-1, (-1, 2)).contiguous())
                                 * freqs.to(torch.complex128)).flatten(-2)
        return torch.cat([proj, rot], dim=-1)

    dt = q.dtype
    q_ucpe = ucpe(q.transpose(-1, -2), P, f).transpose(-1, -2)
    kv_ucpe = ucpe(torch.cat([k, v], dim=1).transpose(-1, -2), P_inv, f).transpose(-1, -2)
    out = ucpe(q_ucpe.to(dt).transpose(-1, -2), P, f.conj()).transpose(-1, -2)
    return q_ucpe, kv_ucpe, out


def sana_wm_ucpe_inputs(dtype):
    torch.manual_seed(0)
    B, H, D, N = 2, 2, 16, 6
    q, k, v = (torch.randn(B, H, D, N, dtype=dtype) for _ in range(3))
    P, P_inv = torch.randn(B, N, 4, 4, dtype=dtype), torch.randn(B, N, 4, 4, dtype=dtype)
    return q, k, v, P, P_inv, cplx_freqs(1, 1, N, D // 4)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sana_wm_ucpe_rope_fuses(dtype, route, error_logs):
    """The three rotations of :func:`sana_wm_ucpe`: each one fusegraph.rope on the half, equal to eager and to
    float64. Before, ``unflatten(-1, (-1, 2))`` after the ``.contiguous()`` copy traced to a view with the pair
    count spelled out where :func:`_complex`'s ``reshape`` keeps the -1: the exact re-check refused the match
    and the complex product stayed (SanaWM's camera path: 5 of its 10 RoPE sites)."""
    inputs = sana_wm_ucpe_inputs(dtype)
    b, out, eager = compile_and_run(sana_wm_ucpe, *inputs, **route)
    assert b.stats.patterns["rope"] == 3 and fused(b, "rope") == 3, b.stats.patterns
    assert b.all_ops["aten.view_as_complex.default"] == 0
    assert_matches(out, eager, scale=8.0, ref64=sana_wm_ucpe_ref64(*inputs))
    assert not error_logs, [r.getMessage() for r in error_logs]


def lookalike_ucpe_pairs_swapped(x, freqs):
    """The camera path's complex form with each result pair written back as (imag, real)."""
    x_rotated = torch.view_as_complex(x.to(torch.float32).unflatten(-1, (-1, 2)))
    return torch.view_as_real(x_rotated * freqs).flip(-1).flatten(-2, -1).type_as(x)


def lookalike_ucpe_x_conj(x, freqs):
    """x's pairs conjugated before the product (a reflection, not a rotation)."""
    x_rotated = torch.view_as_complex(x.to(torch.float32).unflatten(-1, (-1, 2)))
    return torch.view_as_real(x_rotated.conj() * freqs).flatten(-2, -1).type_as(x)


def lookalike_ucpe_halves_paired(x, freqs):
    """Pairs (x[k], x[k + D/2]) instead of (x[2k], x[2k + 1]): ``unflatten(-1, (2, -1))`` then a transpose."""
    x_rotated = torch.view_as_complex(x.to(torch.float32).unflatten(-1, (2, -1)).transpose(-1, -2).contiguous())
    return torch.view_as_real(x_rotated * freqs).flatten(-2, -1).type_as(x)


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("fn", [lookalike_ucpe_pairs_swapped, lookalike_ucpe_x_conj, lookalike_ucpe_halves_paired])
def test_sana_wm_ucpe_lookalikes_stay_unfused(fn, route, error_logs):
    """On the strided half the camera path rotates (copied contiguous first, as the source does)."""
    x = torch.randn(2, 2, 16, 6).transpose(-1, -2)[..., 8:].contiguous()
    b, out, eager = compile_and_run(fn, x, cplx_freqs(1, 1, 6, 4), **route)
    assert b.stats.patterns["rope"] == 0 and fused(b, "rope") == 0
    assert_matches(out, eager)
    assert not error_logs, [r.getMessage() for r in error_logs]
