
import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb

import fusegraph
from tests.helpers import DTYPES, assert_close_to_reference, randn, run_under_cpu_capabilities, strided_copy, threads
from tests.references import rope_ref, wan_rope

B, S, H = 2, 9, 3


def tables(shape, dtype=torch.float32):
    """Random cos/sin of `shape` (not unit-norm pairs: every lane must be read from its own position)."""
    return randn(*shape, dtype=dtype), randn(*shape, dtype=dtype)


# (x shape, cos/sin shape): every layout SPEC §2 lists, for [B,S,H,D] (sequence_dim=1) and [B,H,S,D] (=2).
def layouts(b, d):
    return {
        "S_D": ((b, H, S, d), (S, d)),
        "1_S_1_D": ((b, S, H, d), (1, S, 1, d)),
        "1_1_S_D": ((b, H, S, d), (1, 1, S, d)),
        "B_S_1_D": ((b, S, H, d), (b, S, 1, d)),
    }


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("layout", list(layouts(B, 8)))
@pytest.mark.parametrize("table_dtype", ["float32", "x"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_float64_reference(dtype, table_dtype, layout, interleaved):
    x_shape, cs_shape = layouts(B, 70)[layout]  # D = 70: blocks of every vector width plus a tail
    x = randn(*x_shape, dtype=dtype, scale=2.0)
    cos, sin = tables(cs_shape, torch.float32 if table_dtype == "float32" else dtype)
    out = fusegraph.ops.rope(x, cos, sin, interleaved=interleaved)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert_close_to_reference(out, rope_ref(x, cos, sin, interleaved))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("d", [2, 4, 6, 30, 128, 258])
@pytest.mark.parametrize("b", [1, 7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_sizes(dtype, b, d, interleaved):
    x = randn(b, 5, 3, d, dtype=dtype)
    cos, sin = tables((1, 5, 1, d))
    assert_close_to_reference(fusegraph.ops.rope(x, cos, sin, interleaved=interleaved), rope_ref(x, cos, sin, interleaved))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_x(dtype, interleaved):
    cos, sin = tables((S, 34))
    transposed = randn(B, S, H, 34, dtype=dtype).transpose(1, 2)  # [B,H,S,D] view of [B,S,H,D]
    strided = strided_copy(randn(B, H, S, 34, dtype=dtype))  # D not unit-stride
    for x in (transposed, strided):
        assert not x.is_contiguous()
        out = fusegraph.ops.rope(x, cos, sin, interleaved=interleaved)
        assert out.is_contiguous() and out.shape == x.shape
        assert_close_to_reference(out, rope_ref(x, cos, sin, interleaved))


@pytest.mark.parametrize("interleaved", [True, False])
def test_sliced_tables(interleaved):
    x = randn(B, H, S, 18, dtype=torch.bfloat16)
    big_cos, big_sin = tables((S + 11, 40))
    views = {
        "row slice of [S_max, D]": (big_cos[:S, :18], big_sin[:S, :18]),
        "offset rows": (big_cos[5 : 5 + S, 3:21], big_sin[5 : 5 + S, 3:21]),
        "D strided": (big_cos[:S, ::2][:, :18], big_sin[:S, ::2][:, :18]),
        "expanded": (big_cos[:1, :18].expand(S, 18), big_sin[:1, :18].expand(S, 18)),
    }
    for name, (cos, sin) in views.items():
        out = fusegraph.ops.rope(x, cos, sin, interleaved=interleaved)
        assert_close_to_reference(out, rope_ref(x, cos, sin, interleaved), msg=name)


@pytest.mark.parametrize("sequence_dim", [1, 2])
@pytest.mark.parametrize("unbind_dim", [-1, -2])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_diffusers_apply_rotary_emb(dtype, unbind_dim, sequence_dim):
    shape = (B, S, H, 64) if sequence_dim == 1 else (B, H, S, 64)
    x = randn(*shape, dtype=dtype)
    cos, sin = tables((S, 64))
    expected = apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=unbind_dim, sequence_dim=sequence_dim)
    view = (lambda t: t[None, :, None, :]) if sequence_dim == 1 else (lambda t: t)
    out = fusegraph.ops.rope(x, view(cos), view(sin), interleaved=unbind_dim == -1)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else {}
    torch.testing.assert_close(out, expected, **tol)


# --- partial rotary (rotary_dim): x[..., :R] rotated, x[..., R:] copied -----------------------------------


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("layout", list(layouts(B, 8)))
@pytest.mark.parametrize("table_dtype", ["float32", "x"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_dim_matches_float64_reference(dtype, table_dtype, layout, interleaved):
    """D = 70, R = 36 (MiniMax-H3-like: a rotated head, a pass-through tail): every layout, both forms."""
    x_shape, cs_shape = layouts(B, 70)[layout]
    R = 36
    x = randn(*x_shape, dtype=dtype, scale=2.0)
    cos, sin = tables((*cs_shape[:-1], R), torch.float32 if table_dtype == "float32" else dtype)
    out = fusegraph.ops.rope(x, cos, sin, interleaved=interleaved, rotary_dim=R)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    ref = rope_ref(x, cos, sin, interleaved, rotary_dim=R)
    assert_close_to_reference(out, ref)
    assert torch.equal(out[..., R:], x[..., R:])  # copied exactly, x's dtype throughout
    # the rotated part is the whole-width op on x[..., :R]
    assert torch.equal(out[..., :R], fusegraph.ops.rope(x[..., :R], cos, sin, interleaved=interleaved))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("d,r", [(3, 2), (9, 4), (10, 2), (33, 16), (70, 68), (130, 64), (258, 70), (64, 64)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_dim_sizes(dtype, d, r, interleaved):
    """Odd D (the pass-through makes it possible), R not a multiple of any vector width, R == D."""
    x = randn(3, 5, 2, d, dtype=dtype)
    cos, sin = tables((1, 5, 1, r))
    out = fusegraph.ops.rope(x, cos, sin, interleaved=interleaved, rotary_dim=r)
    assert_close_to_reference(out, rope_ref(x, cos, sin, interleaved, rotary_dim=r))
    assert torch.equal(out[..., r:], x[..., r:])


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_dim_equal_to_d_is_the_full_op(dtype, interleaved):
    x = randn(B, S, H, 38, dtype=dtype)
    cos, sin = tables((S, 1, 38))
    full = fusegraph.ops.rope(x, cos, sin, interleaved=interleaved)
    assert torch.equal(fusegraph.ops.rope(x, cos, sin, interleaved=interleaved, rotary_dim=38), full)
    assert torch.equal(fusegraph.ops.rope(x, cos, sin, interleaved=interleaved, rotary_dim=None), full)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_dim_non_contiguous_x_and_tables(dtype, interleaved):
    R, D = 20, 34
    big_cos, big_sin = tables((S + 4, 2 * R))
    cos, sin = big_cos[2 : 2 + S, ::2], big_sin[1 : 1 + S, ::2]  # row offsets and a D-strided view
    assert not cos.is_contiguous()
    transposed = randn(B, S, H, D, dtype=dtype).transpose(1, 2)  # [B,H,S,D] view of [B,S,H,D]
    strided = strided_copy(randn(B, H, S, D, dtype=dtype))  # D not unit-stride
    narrowed = randn(B, H, S, D + 6, dtype=dtype)[..., 3 : 3 + D]  # rows of D inside longer rows
    for x in (transposed, strided, narrowed):
        assert not x.is_contiguous()
        out = fusegraph.ops.rope(x, cos, sin, interleaved=interleaved, rotary_dim=R)
        assert out.is_contiguous() and out.shape == x.shape
        assert_close_to_reference(out, rope_ref(x, cos, sin, interleaved, rotary_dim=R))


def test_rotary_dim_matches_minimax_h3_source():
    """transformer_minimax_h3._apply_rotary_emb (tables cast to x's dtype, rotate-half on the first R)."""
    from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

    x = randn(B, S, H, 40)
    cos, sin = tables((S, 24))
    expected = _apply_rotary_emb(x, cos, sin)
    out = fusegraph.ops.rope(x, cos[None, :, None], sin[None, :, None], interleaved=False, rotary_dim=24)
    torch.testing.assert_close(out, expected, rtol=1e-5, atol=1e-5)


def test_rotary_dim_empty():
    x = torch.empty(B, 0, H, 10)
    cos = torch.empty(1, 0, 1, 4)
    assert fusegraph.ops.rope(x, cos, cos, rotary_dim=4).shape == x.shape


def test_matches_wan_rope():
    # Wan's tables repeat each frequency twice (repeat_interleave(2)), so the interleaved rotation is exact.
    freqs = torch.rand(S, 32, dtype=torch.float64) * 10
    cos = freqs.cos().repeat_interleave(2, dim=-1).float()[None, :, None, :]
    sin = freqs.sin().repeat_interleave(2, dim=-1).float()[None, :, None, :]
    x = randn(B, S, H, 64, dtype=torch.bfloat16)
    expected = wan_rope(x.float(), cos, sin).to(x.dtype)  # Wan runs it on float32 q/k
    torch.testing.assert_close(fusegraph.ops.rope(x, cos, sin, interleaved=True), expected)


@pytest.mark.parametrize("shape", [(0, S, H, 8), (B, 0, H, 8), (B, S, H, 0)])
def test_empty(shape):
    x = torch.empty(shape, dtype=torch.bfloat16)
    cos = torch.empty(1, shape[1], 1, shape[3])
    out = fusegraph.ops.rope(x, cos, cos)
    assert out.shape == shape and out.dtype == torch.bfloat16


def test_bitwise_deterministic():
    x = randn(2, 512, 8, 128, dtype=torch.bfloat16)
    cos, sin = tables((1, 512, 1, 128))
    for interleaved in (True, False):
        with threads(4):
            first = fusegraph.ops.rope(x, cos, sin, interleaved=interleaved)
            assert torch.equal(first, fusegraph.ops.rope(x, cos, sin, interleaved=interleaved))
        with threads(1):  # the row split between threads never changes a result
            assert torch.equal(first, fusegraph.ops.rope(x, cos, sin, interleaved=interleaved))


def test_opcheck():
    op = torch.ops.fusegraph.rope.default
    cos, sin = tables((S, 6))
    samples = [
        ((randn(B, H, S, 6), cos, sin), {}),
        ((randn(B, S, H, 6, dtype=torch.bfloat16).transpose(1, 2), cos, sin), {"interleaved": False}),
        ((randn(1, S, H, 6, dtype=torch.float16), cos[None, :, None].half(), sin[None, :, None].half()), {}),
        ((randn(B, S, H, 10), cos[None, :, None], sin[None, :, None]), {"interleaved": False, "rotary_dim": 6}),
        ((randn(B, H, S, 9, dtype=torch.bfloat16), cos, sin), {"rotary_dim": 6}),
    ]
    for args, kwargs in samples:
        torch.library.opcheck(op, args, kwargs)


def test_traces_under_compile_fullgraph():
    x = randn(B, S, H, 16)
    cos, sin = tables((1, S, 1, 16))
    fn = torch.compile(lambda x, c, s: fusegraph.ops.rope(x, c, s, interleaved=False) * 2, fullgraph=True,
                       backend="aot_eager")
    assert_close_to_reference(fn(x, cos, sin), rope_ref(x, cos, sin, False) * 2)


x4 = (B, S, H, 8)
# C++ prints ScalarType names, the fake kernels torch.dtype names.
DTYPE_NAMES = {n: f"({n}|torch.{t})" for n, t in
               [("Float", "float32"), ("Half", "float16"), ("BFloat16", "bfloat16"), ("Int", "int32"), ("Long", "int64")]}
BAD = {
    "x rank": (dict(x=(S, H, 8)), r"argument 'x' has shape \[9, 3, 8\] \(rank 3\); expected rank 4"),
    "odd D": (dict(x=(B, S, H, 7), cs=(S, 7)), r"argument 'x' has shape \[2, 9, 3, 7\] with odd last dim D = 7"),
    "cos last dim": (dict(cs=(1, S, 1, 6)), r"argument 'cos' has shape \[1, 9, 1, 6\] with last dim 6; expected x's last dim D = 8"),
    "cos does not broadcast": (dict(cs=(S, 8)), r"argument 'cos' has shape \[9, 8\] which does not broadcast to x's shape \[2, 9, 3, 8\]"),
    "cos rank": (dict(cs=(1, 1, S, 1, 8)), r"argument 'cos' has shape \[1, 1, 9, 1, 8\] \(rank 5\); expected rank 1 to 4"),
    "sin shape": (dict(ss=(1, 1, 1, 8)), r"argument 'sin' has shape \[1, 1, 1, 8\]; expected the shape of 'cos', \[1, 9, 1, 8\]"),
    "cos dtype": (dict(x_dtype=torch.bfloat16, cs_dtype=torch.float16), r"argument 'cos' has dtype {Half}; expected float32 or x's dtype {BFloat16}"),
    "sin dtype": (dict(s_dtype=torch.bfloat16, x_dtype=torch.bfloat16), r"argument 'sin' has dtype {BFloat16}; expected the dtype of 'cos', {Float}"),
    "integer x": (dict(x_dtype=torch.int32), r"argument 'x' has dtype {Int}; expected float32, bfloat16, float16 or float64"),
    "integer cos": (dict(cs_dtype=torch.int64, s_dtype=torch.int64), r"argument 'cos' has dtype {Long}"),
}


@pytest.mark.parametrize("device", ["cpu", "meta"])  # meta: the fake kernel's checks, same messages
@pytest.mark.parametrize("case", list(BAD))
def test_bad_input_rejected(case, device):
    spec, message = BAD[case]
    x_shape, cs = spec.get("x", x4), spec.get("cs", (1, S, 1, 8))
    ss = spec.get("ss", cs)
    x = torch.ones(x_shape, dtype=spec.get("x_dtype", torch.float32), device=device)
    cos = torch.ones(cs, dtype=spec.get("cs_dtype", torch.float32), device=device)
    sin = torch.ones(ss, dtype=spec.get("s_dtype", cos.dtype), device=device)
    with pytest.raises(RuntimeError, match="fusegraph.rope: " + message.format(**DTYPE_NAMES)):
        fusegraph.ops.rope(x, cos, sin)


BAD_ROTARY = {  # (rotary_dim, cos/sin shape, message) for x [2, 9, 3, 8]
    "odd": (5, (1, S, 1, 5), r"argument 'rotary_dim' is 5; expected an even width with 0 < rotary_dim <= D = 8 "
                             r"\(x's last dim\), or None for all of D"),
    "zero": (0, (1, S, 1, 8), r"argument 'rotary_dim' is 0; expected an even width with 0 < rotary_dim <= D = 8"),
    "negative": (-2, (1, S, 1, 8), r"argument 'rotary_dim' is -2; expected an even width"),
    "above D": (10, (1, S, 1, 10), r"argument 'rotary_dim' is 10; expected an even width with 0 < rotary_dim <= D = 8"),
    "tables D wide": (4, (1, S, 1, 8), r"argument 'cos' has shape \[1, 9, 1, 8\] with last dim 8; expected rotary_dim = 4"),
    "tables narrower": (6, (1, S, 1, 4), r"argument 'cos' has shape \[1, 9, 1, 4\] with last dim 4; expected rotary_dim = 6"),
    "tables do not broadcast": (4, (S, 4), r"argument 'cos' has shape \[9, 4\] which does not broadcast to x's shape"),
}


@pytest.mark.parametrize("device", ["cpu", "meta"])  # meta: the fake kernel's checks, same messages
@pytest.mark.parametrize("case", list(BAD_ROTARY))
def test_bad_rotary_dim_rejected(case, device):
    rotary_dim, cs, message = BAD_ROTARY[case]
    x, cos = torch.ones(x4, device=device), torch.ones(cs, device=device)
    with pytest.raises(RuntimeError, match="fusegraph.rope: " + message):
        fusegraph.ops.rope(x, cos, cos, rotary_dim=rotary_dim)


def test_odd_d_needs_rotary_dim():
    """An odd D is refused without rotary_dim (pairs), taken with an even rotary_dim below it."""
    x, cos = randn(1, S, H, 7), randn(1, S, 1, 7)
    with pytest.raises(RuntimeError, match="with odd last dim D = 7"):
        fusegraph.ops.rope(x, cos, cos)
    out = fusegraph.ops.rope(x, cos[..., :6], cos[..., :6], rotary_dim=6)
    assert_close_to_reference(out, rope_ref(x, cos[..., :6], cos[..., :6], True, rotary_dim=6))


def test_rotary_dim_must_be_an_int():
    """The schema's ``int?``: the dispatcher refuses a float or a string, naming the argument."""
    x, cos = torch.ones(x4), torch.ones(1, S, 1, 4)
    for value in (4.0, "4"):
        with pytest.raises(RuntimeError, match="for argument 'rotary_dim'"):
            fusegraph.ops.rope(x, cos, cos, rotary_dim=value)


@pytest.mark.parametrize("device", ["cpu", "meta"])  # meta: the fake kernel, same message
@pytest.mark.parametrize("value,seen", [(None, "None"), (2, "the int 2"), (-1, "the int -1"), (0.5, "the float 0.5")])
def test_interleaved_must_be_a_bool(value, seen, device):
    """A bool schema argument would coerce None to False (rotate-half) and 2/0.5 to their truth value: refused."""
    x, cs = torch.ones(x4, device=device), torch.ones(1, S, 1, 8, device=device)
    message = f"fusegraph.rope: argument 'interleaved' is {seen}; expected a bool: True (interleaved pairs) or False"
    with pytest.raises(TypeError, match=message.replace("(", r"\(").replace(")", r"\)")):
        fusegraph.ops.rope(x, cs, cs, interleaved=value)
    with pytest.raises(TypeError, match="argument 'interleaved' is"):
        torch.ops.fusegraph.rope(x, cs, cs, interleaved=value)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_interleaved_int_one_and_zero_are_true_and_false(device):
    """Inductor's C++ wrapper passes a bool to the Scalar argument as the int 1 or 0: both are taken as the bool."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(x4, generator=g).to(device)
    cs = torch.randn(1, S, 1, 8, generator=g).to(device)
    for as_int, as_bool in ((1, True), (0, False)):
        got = torch.ops.fusegraph.rope(x, cs, cs, interleaved=as_int)
        want = torch.ops.fusegraph.rope(x, cs, cs, interleaved=as_bool)
        if device == "cpu":
            torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert got.shape == want.shape


def test_interleaved_non_number_is_rejected_by_the_dispatcher():
    x, cs = torch.ones(x4), torch.ones(1, S, 1, 8)
    for value in ("yes", torch.tensor(True), [True]):
        with pytest.raises(RuntimeError, match="for argument 'interleaved'"):
            fusegraph.ops.rope(x, cs, cs, interleaved=value)


def test_mixed_devices_rejected():
    x = torch.ones(x4)
    with pytest.raises(RuntimeError, match=r"fusegraph.rope: argument 'cos' is on meta but 'x' is on cpu"):
        fusegraph.ops.rope(x, torch.ones(S, 8, device="meta")[None, :, None], torch.ones(1, S, 1, 8))


CAPABILITY_SCRIPT = r"""
import torch, fusegraph
from tests.helpers import assert_close_to_reference, randn

from tests.references import rope_ref
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for d in (2, 6, 70, 128):
        x = randn(3, 5, 2, d, dtype=dtype)
        cos, sin = randn(1, 5, 1, d), randn(1, 5, 1, d)
        for interleaved in (True, False):
            assert_close_to_reference(fusegraph.ops.rope(x, cos, sin, interleaved=interleaved),
                                      rope_ref(x, cos, sin, interleaved))
            r = max(2, (d // 2) & ~1)  # partial rotary: the first half of the row, even
            out = fusegraph.ops.rope(x, cos[..., :r], sin[..., :r], interleaved=interleaved, rotary_dim=r)
            assert_close_to_reference(out, rope_ref(x, cos[..., :r], sin[..., :r], interleaved, rotary_dim=r))
            assert torch.equal(out[..., r:], x[..., r:])
print(fusegraph._C.cpu_capability())
"""


def test_every_cpu_capability():
    """The kernels compiled for DEFAULT and AVX2 (this CPU runs AVX512 by default), one process each, in parallel."""
    run_under_cpu_capabilities(CAPABILITY_SCRIPT)
