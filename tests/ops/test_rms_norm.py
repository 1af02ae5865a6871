import warnings

import pytest
import torch
from diffusers.models.normalization import RMSNorm as DiffusersRMSNorm

import fusegraph
from fusegraph.ops.rms_norm import rms_norm_out_dtype
from tests.helpers import DTYPES, assert_close_to_reference, randn, strided_copy, threads
from tests.references import rms_norm_ref, rms_norm_tol

EPS_FP32 = 9.999999974752427e-07  # 1e-6 as it arrives from a model: rounded to float32
# Row lengths: 1, odd, not a multiple of any vector width (4101 also: two row-sum chunks, the second partial),
# a model width, and the largest we promise.
SHAPES = [(7, 1), (3, 17), (1, 4096 + 5), (7, 3, 131), (2, 12288), (5,)]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias"])
def test_torch_style_matches_float64_reference(dtype, shape, affine):
    D = shape[-1]
    x = randn(*shape, dtype=dtype, scale=2.0, offset=0.5)
    w = randn(D, dtype=dtype) if affine != "none" else None
    b = randn(D, dtype=dtype) if affine == "weight+bias" else None
    out = fusegraph.ops.rms_norm(x, w, EPS_FP32, bias=b)
    assert out.shape == x.shape and out.dtype == dtype and out.is_contiguous()
    assert_close_to_reference(out, rms_norm_ref(x, w, EPS_FP32, b))


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("w_dtype", [None, *DTYPES])
@pytest.mark.parametrize("with_bias", [False, True])
def test_diffusers_style_matches_float64_reference(x_dtype, w_dtype, with_bias):
    shape = (7, 2, 3072 + 3)
    D = shape[-1]
    x = randn(*shape, dtype=x_dtype, scale=3.0)
    w = randn(D, dtype=w_dtype, offset=1.0) if w_dtype is not None else None
    b = randn(D, dtype=w_dtype or x_dtype) if with_bias else None
    out = fusegraph.ops.rms_norm(x, w, 1e-5, bias=b, style="diffusers")
    expected_dtype = (w_dtype if w_dtype in (torch.bfloat16, torch.float16) else torch.float32) if w is not None else x_dtype
    assert out.dtype == expected_dtype == rms_norm_out_dtype(x, w, b, "diffusers")
    assert_close_to_reference(out, rms_norm_ref(x, w, 1e-5, b, style="diffusers"), **rms_norm_tol(w, "diffusers", out.dtype))


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("w_dtype", [None, *DTYPES])
def test_torch_style_equals_torch_rms_norm(x_dtype, w_dtype):
    """Against the real thing, mixed dtypes included: torch.rms_norm returns x.dtype."""
    x = randn(3, 5, 1000, dtype=x_dtype)
    w = randn(1000, dtype=w_dtype) if w_dtype is not None else None
    out = fusegraph.ops.rms_norm(x, w, EPS_FP32)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "Mismatch dtype between input and weight" (eager's own fallback)
        ref = torch.rms_norm(x, [1000], w, EPS_FP32)
    assert out.dtype == ref.dtype == x_dtype
    torch.testing.assert_close(out, ref, **({"rtol": 1e-5, "atol": 1e-5} if x_dtype == torch.float32 else {}))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("elementwise_affine", [True, False])
def test_equals_nn_rmsnorm_module(dtype, elementwise_affine):
    D = 3072
    m = torch.nn.RMSNorm(D, eps=1e-6, elementwise_affine=elementwise_affine, dtype=dtype)
    if elementwise_affine:
        with torch.no_grad():
            m.weight.copy_(randn(D, offset=1.0))
    x = randn(2, 77, D, dtype=dtype)
    with torch.no_grad():
        ref = m(x)
    out = fusegraph.ops.rms_norm(x, m.weight, m.eps)
    assert out.dtype == ref.dtype
    torch.testing.assert_close(out, ref, **({"rtol": 1e-5, "atol": 1e-5} if dtype == torch.float32 else {}))


@pytest.mark.parametrize("x_dtype", DTYPES)
@pytest.mark.parametrize("module_dtype", DTYPES)
@pytest.mark.parametrize("variant", ["weight", "weight+bias", "no_weight"])
def test_equals_diffusers_rmsnorm_module(x_dtype, module_dtype, variant):
    """diffusers RMSNorm eager (its cast-before-weight rounding reproduced: mostly bitwise equal)."""
    D = 128 + 3
    m = DiffusersRMSNorm(D, eps=1e-6, elementwise_affine=variant != "no_weight", bias=variant == "weight+bias")
    with torch.no_grad():
        for p in m.parameters():
            p.copy_(randn(D, scale=0.5, offset=1.0))
    m = m.to(module_dtype)
    x = randn(4, 33, D, dtype=x_dtype, scale=2.0)
    with torch.no_grad():
        ref = m(x)
    out = fusegraph.ops.rms_norm(x, m.weight, m.eps, bias=m.bias, style="diffusers")
    assert out.dtype == ref.dtype
    tol = {"rtol": 1e-5, "atol": 1e-5} if ref.dtype == torch.float32 else {}
    torch.testing.assert_close(out, ref, **tol)
    if ref.dtype != torch.float32:
        # Same rounding points as eager: only a float32 1-ulp difference in rsqrt can flip a rounding.
        assert (out == ref).float().mean() > 0.999


def test_eps_is_used_as_given():
    """A large eps changes the result, so it is really applied (and matches the reference)."""
    x = randn(4, 64, scale=0.01)
    out_small, out_big = fusegraph.ops.rms_norm(x, eps=1e-12), fusegraph.ops.rms_norm(x, eps=1e-2)
    assert_close_to_reference(out_small, rms_norm_ref(x, eps=1e-12))
    assert_close_to_reference(out_big, rms_norm_ref(x, eps=1e-2))
    assert not torch.allclose(out_small, out_big)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["torch", "diffusers"])
def test_non_contiguous_x(dtype, style):
    w = randn(67, dtype=dtype)
    for x in (
        strided_copy(randn(5, 6, 67, dtype=dtype)),             # last dim strided: copied to contiguous
        randn(6, 5, 67, dtype=dtype).transpose(0, 1),           # rows strided, not uniformly
        randn(4, 9, 200, dtype=dtype)[1:3, ::2, 3:70],          # sliced rows, offset start
    ):
        assert not x.is_contiguous()
        out = fusegraph.ops.rms_norm(x, w, style=style)
        assert out.is_contiguous() and out.shape == x.shape
        assert_close_to_reference(out, rms_norm_ref(x, w, style=style), **rms_norm_tol(w, style, dtype))


def test_empty():
    for shape in [(0, 64), (2, 0, 16), (3, 0)]:
        x = torch.empty(*shape, dtype=torch.bfloat16)
        w = torch.ones(shape[-1], dtype=torch.bfloat16)
        out = fusegraph.ops.rms_norm(x, w)
        assert out.shape == x.shape and out.dtype == torch.bfloat16


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_bitwise_deterministic_across_runs_and_threads(dtype):
    x = randn(7, 300, 3072 + 5, dtype=dtype)
    w = randn(3072 + 5, dtype=dtype)
    with threads(4):
        first = fusegraph.ops.rms_norm(x, w)
        assert torch.equal(first, fusegraph.ops.rms_norm(x, w))
    with threads(1):
        assert torch.equal(first, fusegraph.ops.rms_norm(x, w))


def test_opcheck():
    op = torch.ops.fusegraph.rms_norm.default
    cases = [
        ((randn(3, 65), randn(65), 1e-6), {}),
        ((randn(2, 5, 8, dtype=torch.bfloat16), None, 1e-5), {}),
        ((strided_copy(randn(4, 9, dtype=torch.float16)), randn(9, dtype=torch.bfloat16), 1e-6),
         {"bias": randn(9, dtype=torch.bfloat16), "style": "diffusers"}),
        ((randn(4, 9, dtype=torch.bfloat16), randn(9), 1e-6), {"style": "diffusers"}),
    ]
    for args, kwargs in cases:
        torch.library.opcheck(op, args, kwargs)


def test_traces_under_compile_fullgraph():
    fn = torch.compile(lambda x, w: fusegraph.ops.rms_norm(x, w, style="diffusers") * 2, fullgraph=True,
                       backend="aot_eager")
    x, w = randn(4, 33), randn(33, dtype=torch.bfloat16)
    out = fn(x, w)
    assert out.dtype == torch.bfloat16
    assert_close_to_reference(out, rms_norm_ref(x, w, style="diffusers") * 2)


BAD_INPUTS = [
    (lambda: (torch.arange(8).reshape(2, 4), None, 1e-6, None, "torch"), RuntimeError, r"argument 'x' has dtype (Long|torch.int64)"),
    (lambda: (randn(2, 4), torch.arange(4), 1e-6, None, "torch"), RuntimeError, r"argument 'weight' has dtype (Long|torch.int64)"),
    (lambda: (torch.tensor(1.0), None, 1e-6, None, "torch"), RuntimeError, r"argument 'x' has shape \[\] \(0 dims\)"),
    (lambda: (randn(2, 4), randn(5), 1e-6, None, "torch"), RuntimeError,
     r"argument 'weight' has shape \[5\]; expected \[4\]"),
    (lambda: (randn(2, 4), randn(2, 4), 1e-6, None, "torch"), RuntimeError,
     r"argument 'weight' has shape \[2, 4\]; expected \[4\]"),
    (lambda: (randn(2, 4), randn(4), 1e-6, randn(3), "torch"), RuntimeError,
     r"argument 'bias' has shape \[3\]; expected \[4\]"),
    (lambda: (randn(2, 4), None, 1e-6, torch.ones(4, dtype=torch.int32), "torch"), RuntimeError,
     r"argument 'bias' has dtype (Int|torch.int32)"),
    (lambda: (randn(2, 4), None, -1e-6, None, "torch"), ValueError, r"argument 'eps' is -1e-06; expected a finite"),
    (lambda: (randn(2, 4), None, float("nan"), None, "torch"), ValueError, r"argument 'eps' is nan"),
    (lambda: (randn(2, 4), None, 1e-6, None, "llama"), ValueError,
     r"argument 'style' is \"llama\"; expected \"torch\" or \"diffusers\""),
    (lambda: (randn(2, 4), torch.ones(4, device="meta"), 1e-6, None, "torch"), RuntimeError,
     r"argument 'weight' is on meta but 'x' is on cpu"),
]


@pytest.mark.parametrize("case", range(len(BAD_INPUTS)))
def test_bad_input_raises_naming_the_argument(case):
    make, exc, pattern = BAD_INPUTS[case]
    x, w, eps, b, style = make()
    with pytest.raises(exc, match=pattern):
        fusegraph.ops.rms_norm(x, w, eps, bias=b, style=style)


@pytest.mark.parametrize("case", range(len(BAD_INPUTS)))
def test_fake_kernel_raises_the_same(case):
    make, exc, pattern = BAD_INPUTS[case]
    x, w, eps, b, style = make()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode(allow_non_fake_inputs=True) as mode:
        args = [mode.from_tensor(t) if isinstance(t, torch.Tensor) else t for t in (x, w, b)]
        with pytest.raises(exc, match=pattern):
            torch.ops.fusegraph.rms_norm(args[0], args[1], eps, bias=args[2], style=style)


@pytest.mark.parametrize("offset", [0.0, 3.0])
def test_fp32_accuracy_at_large_D_is_eager_level(offset):
    """D = 2^22, fp32: the sum of squares is accumulated per chunk and the chunk sums in double. One long run of
    fp32 vector adds per lane gave 4.0e-6 relative error here (eager: 1.2e-7)."""
    D = 2 ** 22
    x64 = torch.randn(2, D, dtype=torch.float64) + offset
    w64 = torch.randn(D, dtype=torch.float64)
    ref = rms_norm_ref(x64, w64, EPS_FP32)
    x, w = x64.float(), w64.float()

    def rel_err(out):
        return ((out.double() - ref).abs().max() / ref.abs().max()).item()

    fused, eager = rel_err(fusegraph.ops.rms_norm(x, w, EPS_FP32)), rel_err(torch.rms_norm(x, [D], w, EPS_FP32))
    assert fused <= 2 * eager, f"relative error {fused:.3g}, eager's {eager:.3g}"


# ---- eps as a 0-d tensor (the eps_tensor overload: what the fusion emits for a run-time eps under dynamic=True) ----


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("style", ["torch", "diffusers"])
@pytest.mark.parametrize("eps_dtype", [torch.float64, torch.float32])
def test_eps_tensor_equals_the_number(dtype, style, eps_dtype):
    """The value read from the tensor is the eps: bitwise the float overload's result (itself checked against float64
    above), on a strided x, with weight and bias; a large eps changes the result."""
    x = randn(6, 5, 131, dtype=dtype).transpose(0, 1)
    w, b = randn(131, dtype=dtype), randn(131, dtype=dtype)
    for value in (EPS_FP32, 1e-2):
        eps = torch.tensor(value, dtype=eps_dtype)
        got = fusegraph.ops.rms_norm(x, w, eps, bias=b, style=style)
        assert torch.equal(got, fusegraph.ops.rms_norm(x, w, float(eps), bias=b, style=style))
    assert not torch.allclose(got, fusegraph.ops.rms_norm(x, w, EPS_FP32, bias=b, style=style))


def test_eps_tensor_opcheck_and_compile():
    eps = torch.tensor(1e-5, dtype=torch.float64)
    torch.library.opcheck(torch.ops.fusegraph.rms_norm.eps_tensor, (randn(3, 65), randn(65), eps), {})
    torch.library.opcheck(torch.ops.fusegraph.rms_norm.eps_tensor, (randn(2, 5, 8, dtype=torch.bfloat16), None, eps),
                          {"style": "diffusers"})
    fn = torch.compile(lambda x, w, e: fusegraph.ops.rms_norm(x, w, e) * 2, fullgraph=True, backend="aot_eager")
    x, w = randn(4, 33), randn(33)
    torch.testing.assert_close(fn(x, w, eps), fusegraph.ops.rms_norm(x, w, 1e-5) * 2, rtol=0, atol=0)


@pytest.mark.parametrize("eps, exc, pattern", [
    (torch.tensor([1e-6]), RuntimeError, r"argument 'eps' is a tensor of shape \[1\], dtype (Float|torch.float32) "
                                         r"on cpu; expected a 0-d floating-point tensor on the CPU"),
    (torch.tensor(1), RuntimeError, r"argument 'eps' is a tensor of shape \[\], dtype (Long|torch.int64)"),
    (torch.tensor(1e-6, device="meta"), RuntimeError, r"argument 'eps' is a tensor .* on meta"),
    (torch.tensor(-1e-6, dtype=torch.float64), ValueError, r"argument 'eps' is -1e-06; expected a finite number"),
    (torch.tensor(float("inf")), ValueError, r"argument 'eps' is inf"),
])
def test_eps_tensor_bad_input(eps, exc, pattern):
    """Checked at each call (its value only there: the fake kernel sees the form, not the value)."""
    x = randn(2, 4)
    with pytest.raises(exc, match=pattern):
        fusegraph.ops.rms_norm(x, None, eps)
    if exc is RuntimeError:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode(allow_non_fake_inputs=True) as mode, pytest.raises(exc, match=pattern):
            torch.ops.fusegraph.rms_norm.eps_tensor(mode.from_tensor(x), None, mode.from_tensor(eps))


def test_eps_tensor_gradients_equal_the_number():
    eps = torch.tensor(1e-3, dtype=torch.float64)
    x, w = randn(3, 5, 17), randn(17)
    grads = []
    for e in (eps, 1e-3):
        xg, wg = x.clone().requires_grad_(), w.clone().requires_grad_()
        fusegraph.ops.rms_norm(xg, wg, e, style="diffusers").square().sum().backward()
        grads.append((xg.grad, wg.grad))
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
