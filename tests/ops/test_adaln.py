import pytest
import torch
from diffusers.models.normalization import AdaLayerNormZero, LuminaLayerNormContinuous, LuminaRMSNormZero, RMSNorm

import fusegraph
from tests.helpers import DTYPES, assert_close_to_reference, randn, strided_copy, threads
from tests.references import adaln_ref

# Row lengths: 1, odd, not a multiple of any vector width, a model width, and the largest we promise.
DIMS = [1, 17, 3072 + 5, 2 * 4096 + 3, 12288]  # 8195: chunked row sums (kSumChunk = 4096) with a tail


def chunked_modulation(B, D, dtype, i=1):
    """(scale, shift) as AdaLayerNormZero makes them: [B,1,D] views of a [B,6D] embedding."""
    emb = randn(B, 6 * D, dtype=dtype, scale=0.5)
    chunks = emb.chunk(6, dim=1)
    scale, shift = chunks[i][:, None], chunks[i - 1][:, None]
    assert scale.stride() == (6 * D, D, 1) or D == 1 or scale.stride()[0] == 6 * D
    return scale, shift


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("B", [1, 7])
def test_chunked_modulation_matches_float64_reference(dtype, D, B):
    S = 5 if D >= 3072 else 33
    x = randn(B, S, D, dtype=dtype, scale=2.0, offset=0.3)
    scale, shift = chunked_modulation(B, D, dtype)
    assert not scale.is_contiguous() or B == 1
    out = fusegraph.ops.adaln(x, scale, shift)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert_close_to_reference(out, adaln_ref(x, scale, shift))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["per_token", "vector", "1_1_D", "B_1_D_contiguous"])
def test_modulation_forms_match_float64_reference(dtype, form):
    B, S, D = 3, 19, 131
    x = randn(B, S, D, dtype=dtype)
    shape = {"per_token": (B, S, D), "vector": (D,), "1_1_D": (1, 1, D), "B_1_D_contiguous": (B, 1, D)}[form]
    scale, shift = randn(*shape, dtype=dtype, scale=0.5), randn(*shape, dtype=dtype)
    assert_close_to_reference(fusegraph.ops.adaln(x, scale, shift, 1e-5), adaln_ref(x, scale, shift, 1e-5))


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("mod_dtype", DTYPES)
@pytest.mark.parametrize("affine", [False, True])
def test_mixed_dtypes_follow_eager_promotion(x_dtype, mod_dtype, affine):
    B, S, D = 2, 9, 200
    x = randn(B, S, D, dtype=x_dtype)
    scale, shift = chunked_modulation(B, D, mod_dtype)
    w = randn(D, dtype=torch.bfloat16, offset=1.0) if affine else None
    b = randn(D, dtype=torch.float16) if affine else None
    out = fusegraph.ops.adaln(x, scale, shift, weight=w, bias=b)
    # eager dtype of the unfused expression: layer_norm(x, [D], w, b) has x's dtype whatever w and b are
    assert out.dtype == torch.promote_types(torch.result_type(x, scale), shift.dtype)
    assert_close_to_reference(out, adaln_ref(x, scale, shift, weight=w, bias=b))


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_float32_affine_on_low_precision_x_gives_eagers_dtype(x_dtype, norm):
    """An fp32 affine on bf16/fp16 x: eager's mixed-dtype layer_norm keeps x's dtype; the RMS form's affine is a
    product (rms_norm(x) * w + b), which promotes."""
    D = 40
    x, scale, shift = randn(2, 3, D, dtype=x_dtype), randn(2, 1, D, dtype=x_dtype), randn(2, 1, D, dtype=x_dtype)
    w, b = randn(D, offset=1.0), randn(D)
    if norm == "layer":
        eager = torch.nn.functional.layer_norm(x, [D], w, b, 1e-6) * (1 + scale) + shift
    else:
        eager = (torch.rms_norm(x, [D], None, 1e-6) * w + b) * (1 + scale) + shift
    out = fusegraph.ops.adaln(x, scale, shift, 1e-6, w, b, norm=norm)
    assert out.dtype == eager.dtype == (x_dtype if norm == "layer" else torch.float32)
    torch.testing.assert_close(out, eager, rtol=1.6e-2, atol=4e-2)


def test_spec_signature():
    """SPEC §2: adaln(x, scale, shift=None, eps=1e-6, weight=None, bias=None, *, out_dtype=None, norm="layer")."""
    D = 24
    x, scale, shift = randn(2, 3, D), randn(2, 1, D), randn(2, 1, D)
    w, b = randn(D, offset=1.0), randn(D)
    assert_close_to_reference(fusegraph.ops.adaln(x, scale), adaln_ref(x, scale, None))
    assert_close_to_reference(fusegraph.ops.adaln(x, scale, shift, 1e-5, w, b), adaln_ref(x, scale, shift, 1e-5, w, b))
    assert_close_to_reference(torch.ops.fusegraph.adaln(x, scale), adaln_ref(x, scale, None))


def test_scale_and_shift_of_different_dtypes():
    x = randn(2, 7, 64, dtype=torch.bfloat16)
    scale = randn(2, 1, 64, dtype=torch.float16)
    shift = randn(2, 1, 64)
    out = fusegraph.ops.adaln(x, scale, shift)
    assert out.dtype == torch.float32
    assert_close_to_reference(out, adaln_ref(x, scale, shift))


@pytest.mark.parametrize("out_dtype", DTYPES)
def test_out_dtype_overrides_promotion(out_dtype):
    """Wan: (LayerNorm(x.float()) * (1 + scale) + shift).type_as(x), fp32 modulation, bf16 x."""
    x = randn(2, 11, 96, dtype=torch.bfloat16)
    scale, shift = randn(2, 11, 96, scale=0.3), randn(2, 11, 96)
    out = fusegraph.ops.adaln(x, scale, shift, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    assert_close_to_reference(out, adaln_ref(x, scale, shift))


def test_wan_expression_with_out_dtype():
    D = 256
    norm = torch.nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
    x = randn(2, 40, D, dtype=torch.bfloat16)
    scale, shift = chunked_modulation(2, D, torch.float32)
    eager = (norm(x.float()) * (1 + scale) + shift).type_as(x)
    out = fusegraph.ops.adaln(x, scale, shift, out_dtype=x.dtype)
    assert out.dtype == eager.dtype
    torch.testing.assert_close(out, eager)  # one float32 chain, one rounding: bf16 tolerance
    assert (out == eager).float().mean() > 0.98


@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_diffusers_ada_layer_norm_zero(dtype):
    """AdaLayerNormZero's norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None], from its own chunks."""
    D = 192
    m = AdaLayerNormZero(D).to(dtype)
    x, temb = randn(3, 50, D, dtype=dtype), randn(3, D, dtype=dtype)
    with torch.no_grad():
        eager, *_ = m(x, emb=temb)
        emb = m.linear(m.silu(temb))
    shift_msa, scale_msa = emb.chunk(6, dim=1)[:2]
    out = fusegraph.ops.adaln(x, scale_msa[:, None], shift_msa[:, None], m.norm.eps)
    assert out.dtype == eager.dtype
    ref64 = adaln_ref(x, scale_msa[:, None], shift_msa[:, None], m.norm.eps)
    if dtype == torch.float32:
        torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    else:
        # eager rounds four times in half precision, we round once: never worse than eager.
        assert (out.double() - ref64).abs().max() <= (eager.double() - ref64).abs().max()
        torch.testing.assert_close(out, eager, rtol=2e-2, atol=2e-2)
    assert_close_to_reference(out, ref64)


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_weight_and_bias(dtype):
    D = 77
    x = randn(4, 6, D, dtype=dtype)
    scale, shift = chunked_modulation(4, D, dtype)
    w, b = randn(D, dtype=dtype, offset=1.0), randn(D, dtype=dtype)
    out = fusegraph.ops.adaln(x, scale, shift, 1e-5, weight=w, bias=b)
    assert_close_to_reference(out, adaln_ref(x, scale, shift, 1e-5, w, b))
    only_w = fusegraph.ops.adaln(x, scale, shift, 1e-5, weight=w)
    assert_close_to_reference(only_w, adaln_ref(x, scale, shift, 1e-5, w))


def test_large_mean_rows_keep_precision():
    """Corrected two-pass variance: rows with mean 1000 and std 1 normalise to float32 accuracy."""
    x = randn(4, 8, 3072, offset=1000.0)
    scale, shift = randn(4, 1, 3072, scale=0.1), randn(4, 1, 3072)
    assert_close_to_reference(fusegraph.ops.adaln(x, scale, shift), adaln_ref(x, scale, shift))


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_x_and_ranks(dtype):
    D = 67
    scale, shift = chunked_modulation(4, D, dtype)
    cases = [
        (strided_copy(randn(4, 6, D, dtype=dtype)), scale, shift),             # last dim strided
        (randn(6, 4, D, dtype=dtype).transpose(0, 1), scale, shift),           # rows strided
        (randn(4, 9, D + 20, dtype=dtype)[:, 1:8, 5:5 + D], scale, shift),     # sliced rows
        (randn(5, D, dtype=dtype), scale[0, 0], shift[0]),                     # rank 2
        (randn(4, 2, 3, D, dtype=dtype), scale[:, None], shift[:, None]),      # rank 4, [B,1,1,D]
        (randn(4, 2, 3, D, dtype=dtype), randn(2, 1, D, dtype=dtype), randn(1, 3, D, dtype=dtype)),
        (randn(3, 5, D, dtype=dtype), randn(3, 5, 2 * D, dtype=dtype)[..., ::2], randn(5, D, dtype=dtype)),
    ]
    for x, sc, sh in cases:
        out = fusegraph.ops.adaln(x, sc, sh)
        assert out.is_contiguous() and out.shape == x.shape
        assert_close_to_reference(out, adaln_ref(x, sc, sh))


def test_empty():
    for B, S, D in [(0, 4, 64), (2, 0, 64), (2, 3, 0)]:
        x = torch.empty(B, S, D, dtype=torch.bfloat16)
        out = fusegraph.ops.adaln(x, torch.empty(B, 1, D, dtype=torch.bfloat16), torch.empty(D, dtype=torch.bfloat16))
        assert out.shape == x.shape and out.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitwise_deterministic_across_runs_and_threads(dtype):
    x = randn(7, 300, 3072 + 5, dtype=dtype)
    scale, shift = chunked_modulation(7, 3072 + 5, dtype)
    with threads(4):
        first = fusegraph.ops.adaln(x, scale, shift)
        assert torch.equal(first, fusegraph.ops.adaln(x, scale, shift))
    with threads(1):
        assert torch.equal(first, fusegraph.ops.adaln(x, scale, shift))


def test_opcheck():
    op = torch.ops.fusegraph.adaln.default
    sc, sh = chunked_modulation(2, 40, torch.bfloat16)
    cases = [
        ((randn(2, 3, 40), randn(2, 1, 40), randn(40), 1e-6), {}),
        ((randn(2, 3, 40, dtype=torch.bfloat16), sc, sh, 1e-5), {"weight": randn(40), "bias": randn(40)}),
        ((strided_copy(randn(2, 3, 40, dtype=torch.float16)), randn(2, 3, 40), randn(2, 3, 40), 1e-6),
         {"out_dtype": torch.float16}),
    ]
    for args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs)


def test_traces_under_compile_fullgraph():
    fn = torch.compile(lambda x, s, t: fusegraph.ops.adaln(x, s, t, out_dtype=torch.bfloat16) * 2, fullgraph=True,
                       backend="aot_eager")
    x = randn(2, 9, 48, dtype=torch.bfloat16)
    s, t = chunked_modulation(2, 48, torch.float32)
    out = fn(x, s, t)
    assert out.dtype == torch.bfloat16
    assert_close_to_reference(out, adaln_ref(x, s, t) * 2)


_DEFAULT = object()


def _args(x=None, scale=None, shift=_DEFAULT, eps=1e-6, weight=None, bias=None, out_dtype=None, norm="layer"):
    x = randn(2, 3, 8) if x is None else x
    scale = randn(2, 1, 8) if scale is None else scale
    shift = randn(2, 1, 8) if shift is _DEFAULT else shift
    return x, scale, shift, eps, weight, bias, out_dtype, norm


BAD_INPUTS = [
    (lambda: _args(x=torch.ones(2, 3, 8, dtype=torch.int64)), RuntimeError, r"argument 'x' has dtype (Long|torch.int64)"),
    (lambda: _args(scale=torch.ones(2, 1, 8, dtype=torch.int32)), RuntimeError, r"argument 'scale' has dtype (Int|torch.int32)"),
    (lambda: _args(x=randn(8), scale=randn(8), shift=randn(8)), RuntimeError,
     r"argument 'x' has shape \[8\] \(1 dims\); expected at least 2 dims"),
    (lambda: _args(scale=randn(2, 1, 9)), RuntimeError,
     r"argument 'scale' has shape \[2, 1, 9\]; expected its last dim to be 8"),
    (lambda: _args(shift=randn(2, 1, 1)), RuntimeError,
     r"argument 'shift' has shape \[2, 1, 1\]; expected its last dim to be 8"),
    (lambda: _args(scale=randn(3, 1, 8)), RuntimeError,
     r"argument 'scale' has shape \[3, 1, 8\], which does not broadcast to x's shape \[2, 3, 8\]"),
    (lambda: _args(shift=randn(1, 2, 1, 8)), RuntimeError,
     r"argument 'shift' has shape \[1, 2, 1, 8\], which does not broadcast to x's shape \[2, 3, 8\]"),
    (lambda: _args(weight=randn(7)), RuntimeError, r"argument 'weight' has shape \[7\]; expected \[8\]"),
    (lambda: _args(bias=randn(1, 8)), RuntimeError, r"argument 'bias' has shape \[1, 8\]; expected \[8\]"),
    (lambda: _args(eps=-1.0), ValueError, r"argument 'eps' is -1(\.0)?; expected a finite number >= 0"),
    (lambda: _args(out_dtype=torch.int32), ValueError, r"argument 'out_dtype' is (Int|torch.int32)"),
    (lambda: _args(shift=torch.ones(2, 1, 8, device="meta")), RuntimeError,
     r"argument 'shift' is on meta but 'x' is on cpu"),
    # the norm kind; and the optional shift is still checked when given, with either norm
    (lambda: _args(norm="group"), ValueError, r"argument 'norm' is \"group\"; expected \"layer\" or \"rms\""),
    (lambda: _args(norm="RMS", shift=None), ValueError, r"argument 'norm' is \"RMS\"; expected \"layer\" or \"rms\""),
    (lambda: _args(norm="rms", shift=randn(2, 1, 7)), RuntimeError,
     r"argument 'shift' has shape \[2, 1, 7\]; expected its last dim to be 8"),
    (lambda: _args(norm="rms", shift=torch.ones(2, 1, 8, dtype=torch.int64)), RuntimeError,
     r"argument 'shift' has dtype (Long|torch.int64)"),
    (lambda: _args(norm="rms", shift=None, scale=randn(2, 4, 8)), RuntimeError,
     r"argument 'scale' has shape \[2, 4, 8\], which does not broadcast to x's shape \[2, 3, 8\]"),
]


@pytest.mark.parametrize("case", range(len(BAD_INPUTS)))
def test_bad_input_raises_naming_the_argument(case):
    make, exc, pattern = BAD_INPUTS[case]
    x, scale, shift, eps, w, b, out_dtype, norm = make()
    with pytest.raises(exc, match=pattern):
        fusegraph.ops.adaln(x, scale, shift, eps, weight=w, bias=b, out_dtype=out_dtype, norm=norm)


@pytest.mark.parametrize("case", range(len(BAD_INPUTS)))
def test_fake_kernel_raises_the_same(case):
    from torch._subclasses.fake_tensor import FakeTensorMode

    make, exc, pattern = BAD_INPUTS[case]
    x, scale, shift, eps, w, b, out_dtype, norm = make()
    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        x, scale, shift, w, b = [mode.from_tensor(t) if t is not None else None for t in (x, scale, shift, w, b)]
        with pytest.raises(exc, match=pattern):
            torch.ops.fusegraph.adaln(x, scale, shift, eps, weight=w, bias=b, out_dtype=out_dtype, norm=norm)


@pytest.mark.parametrize("offset", [0.0, 3.0])
def test_fp32_accuracy_at_large_D_is_eager_level(offset):
    """D = 2^22, fp32: the row sums (mean, deviations, squares) are accumulated per chunk and the chunk sums in
    double. One long run of fp32 vector adds per lane gave 9.6e-6 relative error here (eager: 1.6e-7)."""
    D = 2 ** 22
    x64 = torch.randn(2, 1, D, dtype=torch.float64) + offset
    scale64, shift64 = torch.randn(2, 1, D, dtype=torch.float64), torch.randn(2, 1, D, dtype=torch.float64)
    ref = adaln_ref(x64, scale64, shift64)
    x, scale, shift = x64.float(), scale64.float(), shift64.float()

    def rel_err(out):
        return ((out.double() - ref).abs().max() / ref.abs().max()).item()

    fused = rel_err(fusegraph.ops.adaln(x, scale, shift))
    eager = rel_err(torch.nn.functional.layer_norm(x, [D], eps=1e-6) * (1 + scale) + shift)
    assert fused <= 2 * eager, f"relative error {fused:.3g}, eager's {eager:.3g}"


# ---- RMSNorm and no-shift variants (norm="rms", shift=None) ----------------------------------------------

VARIANTS = [("rms", True), ("rms", False), ("layer", False)]  # (norm, has shift); ("layer", True) is above


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("D", DIMS)
@pytest.mark.parametrize("B", [1, 7])
@pytest.mark.parametrize("norm,has_shift", VARIANTS)
def test_variants_chunked_modulation_match_float64_reference(dtype, D, B, norm, has_shift):
    S = 5 if D >= 3072 else 33
    x = randn(B, S, D, dtype=dtype, scale=2.0, offset=0.3)
    scale, shift = chunked_modulation(B, D, dtype)
    shift = shift if has_shift else None
    out = fusegraph.ops.adaln(x, scale, shift, norm=norm)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert_close_to_reference(out, adaln_ref(x, scale, shift, norm=norm))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", ["per_token", "vector", "1_1_D", "B_1_D_contiguous"])
@pytest.mark.parametrize("norm,has_shift", VARIANTS)
def test_variants_modulation_forms(dtype, form, norm, has_shift):
    B, S, D = 3, 19, 131
    x = randn(B, S, D, dtype=dtype)
    shape = {"per_token": (B, S, D), "vector": (D,), "1_1_D": (1, 1, D), "B_1_D_contiguous": (B, 1, D)}[form]
    scale = randn(*shape, dtype=dtype, scale=0.5)
    shift = randn(*shape, dtype=dtype) if has_shift else None
    out = fusegraph.ops.adaln(x, scale, shift, 1e-5, norm=norm)
    assert_close_to_reference(out, adaln_ref(x, scale, shift, 1e-5, norm=norm))


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("mod_dtype", DTYPES)
@pytest.mark.parametrize("norm,has_shift", VARIANTS)
def test_variants_mixed_dtypes_follow_eager_promotion(x_dtype, mod_dtype, norm, has_shift):
    B, S, D = 2, 9, 200
    x = randn(B, S, D, dtype=x_dtype)
    scale, shift = chunked_modulation(B, D, mod_dtype)
    shift = shift if has_shift else None
    out = fusegraph.ops.adaln(x, scale, shift, norm=norm)
    eager_dtype = torch.result_type(x, scale)
    if shift is not None:
        eager_dtype = torch.promote_types(eager_dtype, shift.dtype)
    assert out.dtype == eager_dtype
    assert_close_to_reference(out, adaln_ref(x, scale, shift, norm=norm))


def test_rms_scale_and_shift_of_different_dtypes():
    x = randn(2, 7, 64, dtype=torch.bfloat16)
    scale, shift = randn(2, 1, 64, dtype=torch.float16), randn(2, 1, 64)
    out = fusegraph.ops.adaln(x, scale, shift, norm="rms")
    assert out.dtype == torch.float32
    assert_close_to_reference(out, adaln_ref(x, scale, shift, norm="rms"))
    # no shift, half scale of another half dtype than x: upcast, promoted output
    out = fusegraph.ops.adaln(x, scale, None, norm="rms")
    assert out.dtype == torch.float32
    assert_close_to_reference(out, adaln_ref(x, scale, None, norm="rms"))


@pytest.mark.parametrize("out_dtype", DTYPES)
@pytest.mark.parametrize("norm,has_shift", VARIANTS)
def test_variants_out_dtype(out_dtype, norm, has_shift):
    x = randn(2, 11, 96, dtype=torch.bfloat16)
    scale = randn(2, 11, 96, scale=0.3)
    shift = randn(2, 11, 96) if has_shift else None
    out = fusegraph.ops.adaln(x, scale, shift, out_dtype=out_dtype, norm=norm)
    assert out.dtype == out_dtype
    assert_close_to_reference(out, adaln_ref(x, scale, shift, norm=norm))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm,has_shift", VARIANTS)
def test_variants_weight_and_bias(dtype, norm, has_shift):
    D = 77
    x = randn(4, 6, D, dtype=dtype)
    scale, shift = chunked_modulation(4, D, dtype)
    shift = shift if has_shift else None
    w, b = randn(D, dtype=dtype, offset=1.0), randn(D, dtype=dtype)
    out = fusegraph.ops.adaln(x, scale, shift, 1e-5, weight=w, bias=b, norm=norm)
    assert_close_to_reference(out, adaln_ref(x, scale, shift, 1e-5, w, b, norm=norm))
    only_w = fusegraph.ops.adaln(x, scale, shift, 1e-5, weight=w, norm=norm)
    assert_close_to_reference(only_w, adaln_ref(x, scale, shift, 1e-5, w, norm=norm))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm,has_shift", VARIANTS)
def test_variants_non_contiguous_x_and_ranks(dtype, norm, has_shift):
    D = 67
    scale, shift = chunked_modulation(4, D, dtype)
    cases = [
        (strided_copy(randn(4, 6, D, dtype=dtype)), scale, shift),
        (randn(6, 4, D, dtype=dtype).transpose(0, 1), scale, shift),
        (randn(4, 9, D + 20, dtype=dtype)[:, 1:8, 5:5 + D], scale, shift),
        (randn(5, D, dtype=dtype), scale[0, 0], shift[0]),
        (randn(4, 2, 3, D, dtype=dtype), scale[:, None], shift[:, None]),
        (randn(4, 2, 3, D, dtype=dtype), randn(2, 1, D, dtype=dtype), randn(1, 3, D, dtype=dtype)),
        (randn(3, 5, D, dtype=dtype), randn(3, 5, 2 * D, dtype=dtype)[..., ::2], randn(5, D, dtype=dtype)),
    ]
    for x, sc, sh in cases:
        sh = sh if has_shift else None
        out = fusegraph.ops.adaln(x, sc, sh, norm=norm)
        assert out.is_contiguous() and out.shape == x.shape
        assert_close_to_reference(out, adaln_ref(x, sc, sh, norm=norm))


def test_rms_is_not_layer_norm():
    """The two norms differ on rows with a mean: each matches its own reference and not the other's."""
    x = randn(2, 5, 64, offset=1.5)
    scale = randn(2, 1, 64, scale=0.5)
    rms, layer = (fusegraph.ops.adaln(x, scale, None, norm=n) for n in ("rms", "layer"))
    assert_close_to_reference(rms, adaln_ref(x, scale, None, norm="rms"))
    assert_close_to_reference(layer, adaln_ref(x, scale, None, norm="layer"))
    assert (rms - layer).abs().max() > 0.1


@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_diffusers_lumina_rms_norm_zero(dtype):
    """LuminaRMSNormZero: RMSNorm(x) * (1 + scale_msa[:, None]), no shift."""
    D = 96
    m = LuminaRMSNormZero(embedding_dim=D, norm_eps=1e-5, norm_elementwise_affine=True).to(dtype)
    with torch.no_grad():
        m.norm.weight.copy_(randn(D, offset=1.0))
    x, temb = randn(3, 21, D, dtype=dtype), randn(3, min(D, 1024), dtype=dtype)
    with torch.no_grad():
        eager, *_ = m(x, emb=temb)
        scale_msa = m.linear(m.silu(temb)).chunk(4, dim=1)[0]
    out = fusegraph.ops.adaln(x, scale_msa[:, None], None, 1e-5, weight=m.norm.weight, norm="rms")
    assert out.dtype == eager.dtype
    ref64 = adaln_ref(x, scale_msa[:, None], None, 1e-5, m.norm.weight, norm="rms")
    assert_close_to_reference(out, ref64)
    if dtype == torch.float32:
        torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    else:  # eager rounds after the norm, the weight and the product; we round once
        assert (out.double() - ref64).abs().max() <= (eager.double() - ref64).abs().max()


@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_diffusers_lumina_layer_norm_continuous(dtype):
    """LuminaLayerNormContinuous: LayerNorm(x) * (1 + scale)[:, None, :], no shift."""
    D = 80
    m = LuminaLayerNormContinuous(D, D, elementwise_affine=False, eps=1e-6).to(dtype)
    x, cond = randn(2, 13, D, dtype=dtype), randn(2, D, dtype=dtype)
    with torch.no_grad():
        eager = m(x, cond)
        scale = m.linear_1(m.silu(cond).to(x.dtype))
    out = fusegraph.ops.adaln(x, scale[:, None, :], None, 1e-6)
    ref64 = adaln_ref(x, scale[:, None, :], None, 1e-6)
    assert out.dtype == eager.dtype
    assert_close_to_reference(out, ref64)
    if dtype == torch.float32:
        torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
def test_equals_diffusers_rms_norm_then_modulation(dtype):
    """LTX: RMSNorm(D, elementwise_affine=False)(x) * (1 + scale) + shift with [B, 1, D] scale/shift."""
    D = 128
    norm = RMSNorm(D, eps=1e-6, elementwise_affine=False)
    x = randn(2, 17, D, dtype=dtype)
    scale, shift = chunked_modulation(2, D, dtype)
    eager = norm(x) * (1 + scale) + shift
    out = fusegraph.ops.adaln(x, scale, shift, 1e-6, norm="rms")
    ref64 = adaln_ref(x, scale, shift, 1e-6, norm="rms")
    assert out.dtype == eager.dtype
    assert_close_to_reference(out, ref64)
    if dtype == torch.float32:
        torch.testing.assert_close(out, eager, rtol=1e-5, atol=1e-5)
    else:
        assert (out.double() - ref64).abs().max() <= (eager.double() - ref64).abs().max()


@pytest.mark.parametrize("norm,has_shift", VARIANTS)
def test_variants_empty(norm, has_shift):
    for B, S, D in [(0, 4, 64), (2, 0, 64), (2, 3, 0)]:
        x = torch.empty(B, S, D, dtype=torch.bfloat16)
        shift = torch.empty(D, dtype=torch.bfloat16) if has_shift else None
        out = fusegraph.ops.adaln(x, torch.empty(B, 1, D, dtype=torch.bfloat16), shift, norm=norm)
        assert out.shape == x.shape and out.dtype == torch.bfloat16


@pytest.mark.parametrize("norm,has_shift", VARIANTS)
def test_variants_bitwise_deterministic_across_threads(norm, has_shift):
    x = randn(7, 300, 3072 + 5, dtype=torch.bfloat16)
    scale, shift = chunked_modulation(7, 3072 + 5, torch.bfloat16)
    shift = shift if has_shift else None
    with threads(4):
        first = fusegraph.ops.adaln(x, scale, shift, norm=norm)
    with threads(1):
        assert torch.equal(first, fusegraph.ops.adaln(x, scale, shift, norm=norm))


def test_variants_opcheck():
    op = torch.ops.fusegraph.adaln.default
    sc, _ = chunked_modulation(2, 40, torch.bfloat16)
    cases = [
        ((randn(2, 3, 40), randn(2, 1, 40), randn(40), 1e-6), {"norm": "rms"}),
        ((randn(2, 3, 40), randn(2, 1, 40), None, 1e-6), {}),
        ((randn(2, 3, 40, dtype=torch.bfloat16), sc, None, 1e-5), {"weight": randn(40), "norm": "rms"}),
        ((strided_copy(randn(2, 3, 40, dtype=torch.float16)), randn(2, 3, 40), None, 1e-6),
         {"out_dtype": torch.float16, "norm": "rms"}),
    ]
    for args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs)


def test_old_positional_call_still_works():
    """The pre-existing call forms (shift positional, norm defaulted) keep LayerNorm semantics."""
    x, scale, shift = randn(2, 3, 40), randn(2, 1, 40), randn(40)
    out = torch.ops.fusegraph.adaln(x, scale, shift, 1e-5)
    assert_close_to_reference(out, adaln_ref(x, scale, shift, 1e-5))
    out = fusegraph.ops.adaln(x, scale, shift, 1e-5)
    assert_close_to_reference(out, adaln_ref(x, scale, shift, 1e-5))


def test_variants_trace_under_compile_fullgraph():
    fn = torch.compile(lambda x, s: fusegraph.ops.adaln(x, s, None, norm="rms", out_dtype=torch.bfloat16) * 2,
                       fullgraph=True, backend="aot_eager")
    x = randn(2, 9, 48, dtype=torch.bfloat16)
    s, _ = chunked_modulation(2, 48, torch.float32)
    out = fn(x, s)
    assert out.dtype == torch.bfloat16
    assert_close_to_reference(out, adaln_ref(x, s, None, norm="rms") * 2)


@pytest.mark.parametrize("has_shift", [True, False])
def test_rms_fp32_accuracy_at_large_D_is_eager_level(has_shift):
    """D = 2^22, fp32, norm="rms": the sum of squares is accumulated per chunk and the chunk sums in double."""
    D = 2 ** 22
    x64 = torch.randn(2, 1, D, dtype=torch.float64) + 3.0
    scale64 = torch.randn(2, 1, D, dtype=torch.float64)
    shift64 = torch.randn(2, 1, D, dtype=torch.float64) if has_shift else None
    ref = adaln_ref(x64, scale64, shift64, norm="rms")
    x, scale = x64.float(), scale64.float()
    shift = shift64.float() if has_shift else None

    def rel_err(out):
        return ((out.double() - ref).abs().max() / ref.abs().max()).item()

    fused = rel_err(fusegraph.ops.adaln(x, scale, shift, norm="rms"))
    eager_y = torch.rms_norm(x, [D], eps=1e-6) * (1 + scale)
    eager = rel_err(eager_y + shift if has_shift else eager_y)
    assert fused <= 2 * eager, f"relative error {fused:.3g}, eager's {eager:.3g}"


# ---- eps as a 0-d tensor (adaln.eps_tensor: a run-time eps under dynamic=True) ---------------------------------


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("norm", ["rms", "layer"])
def test_eps_tensor_equals_the_number(dtype, norm):
    """Bitwise the float overload's result (itself checked against float64 above), with a [B, 1, D] chunk view, no
    shift or a shift, weight and bias; a wrong eps form names the argument, also in the fake kernel."""
    x = randn(2, 7, 131, dtype=dtype)
    emb = randn(2, 3 * 131, dtype=dtype)
    scale, shift, _ = (c[:, None] for c in emb.chunk(3, dim=1))
    w, b = randn(131), randn(131)
    for sh in (shift, None):
        for value in (1e-6, 1e-2):
            eps = torch.tensor(value, dtype=torch.float64)
            got = fusegraph.ops.adaln(x, scale, sh, eps, w, b, norm=norm)
            assert torch.equal(got, fusegraph.ops.adaln(x, scale, sh, value, w, b, norm=norm))
    torch.library.opcheck(torch.ops.fusegraph.adaln.eps_tensor, (x, scale, shift, eps), {"norm": norm})
    with pytest.raises(RuntimeError, match=r"argument 'eps' is a tensor of shape \[2\]"):
        fusegraph.ops.adaln(x, scale, shift, torch.tensor([1e-6, 1e-6]), norm=norm)
    with pytest.raises(ValueError, match=r"argument 'eps' is -1"):
        fusegraph.ops.adaln(x, scale, shift, torch.tensor(-1.0), norm=norm)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [3, 4096 + 904])
def test_layer_norm_row_whose_squares_overflow_float32(dtype, D):
    """|x - mean| above ~1.8e19: the float32 sum of squared deviations overflows; the row's statistics are taken
    again in double, so the result is float64's (it was `shift`: rstd = 1 / sqrt(inf) = 0). A row holding inf stays
    NaN, as eager's; the other rows are untouched."""
    x = randn(3, D, dtype=torch.float32)
    x[0, 0] = 1e20
    x[2, 1] = float("inf")
    x = x.to(dtype)
    scale, shift = randn(D, dtype=dtype, scale=0.1), randn(D, dtype=dtype)
    got = fusegraph.ops.adaln(x, scale, shift)
    want = torch.nn.functional.layer_norm(x.double(), [D], eps=1e-6) * (1 + scale.double()) + shift.double()
    torch.testing.assert_close(got[:2], want[:2].to(dtype))
    assert got[2].isnan().all()
