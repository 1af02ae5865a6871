"""The float64 path of every op (accepted so that gradcheck can run): the documented math in float64 with
plain torch ops, a contiguous output of the documented dtype, the same checks and messages as the other dtypes
(real and fake kernels)."""
import pytest
import torch
import torch.nn.functional as F
from torch._subclasses.fake_tensor import FakeTensorMode

import fusegraph
from fusegraph.ops.rms_norm import rms_norm_out_dtype
from tests.helpers import randn, strided_copy
from tests.references import adaln_ref, mul_add_ref, rms_norm_ref, rope_ref

F64 = torch.float64
TIGHT = dict(rtol=1e-12, atol=1e-12)


def check(out, expected, dtype=F64):
    assert out.dtype == dtype and out.is_contiguous() and out.shape == expected.shape
    assert not torch.isnan(out).any()
    torch.testing.assert_close(out, expected.to(dtype), **(TIGHT if dtype == F64 else {}))


@pytest.mark.parametrize("style", ["torch", "diffusers"])
@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias"])
def test_rms_norm(style, affine):
    D = 37
    x = randn(3, 4, D, dtype=F64, scale=2.0).transpose(0, 1)  # strided rows
    w = randn(D, dtype=F64, offset=1.0) if affine != "none" else None
    b = randn(D, dtype=F64) if affine == "weight+bias" else None
    check(fusegraph.ops.rms_norm(x, w, 1e-5, bias=b, style=style), rms_norm_ref(x, w, 1e-5, b, style=style))


@pytest.mark.parametrize("w_dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_diffusers_mixed(w_dtype):
    """float64 x, diffusers style: an fp32 weight gives float64 (the fp32 normalised value times w promotes, as
    eager does); a half weight keeps its rounding points and its dtype."""
    D = 16
    x, w = randn(5, D, dtype=F64), randn(D, dtype=w_dtype, offset=1.0)
    out = fusegraph.ops.rms_norm(x, w, style="diffusers")
    expected_dtype = F64 if w_dtype == torch.float32 else w_dtype
    assert out.dtype == expected_dtype == rms_norm_out_dtype(x, w, None, "diffusers")
    check(out, rms_norm_ref(x, w, style="diffusers"), expected_dtype)


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("table_dtype", [F64, torch.float32])
def test_rope(interleaved, table_dtype):
    x = randn(2, 4, 3, 10, dtype=F64).transpose(1, 2)  # [B, H, S, D] view
    cos, sin = randn(4, 10, dtype=table_dtype), randn(4, 10, dtype=table_dtype)
    check(fusegraph.ops.rope(x, cos, sin, interleaved=interleaved), rope_ref(x, cos, sin, interleaved))


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("x_dtype,table_dtype", [(F64, F64), (F64, torch.float32)])
def test_rope_rotary_dim(interleaved, x_dtype, table_dtype):
    """Partial rotary on the float64 path: x[..., :6] rotated, x[..., 6:] (D = 11, odd) copied."""
    x = randn(2, 4, 3, 11, dtype=x_dtype).transpose(1, 2)  # [B, H, S, D] view
    cos, sin = randn(4, 6, dtype=table_dtype), randn(4, 6, dtype=table_dtype)
    out = fusegraph.ops.rope(x, cos, sin, interleaved=interleaved, rotary_dim=6)
    check(out, rope_ref(x, cos, sin, interleaved, rotary_dim=6), x_dtype)
    assert torch.equal(out[..., 6:], x[..., 6:])


@pytest.mark.parametrize("affine", [False, True])
def test_adaln(affine):
    B, S, D = 2, 5, 24
    x = randn(B, S, D, dtype=F64, offset=3.0)
    shift, scale = (c[:, None] for c in randn(B, 6 * D, dtype=F64).chunk(6, dim=1)[:2])
    w = randn(D, dtype=F64, offset=1.0) if affine else None
    b = randn(D, dtype=F64) if affine else None
    check(fusegraph.ops.adaln(x, scale, shift, 1e-5, weight=w, bias=b), adaln_ref(x, scale, shift, 1e-5, w, b))


@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("norm,has_shift", [("rms", True), ("rms", False), ("layer", False)])
def test_adaln_rms_and_no_shift(affine, norm, has_shift):
    B, S, D = 2, 5, 23
    x = randn(B, S, D, dtype=F64, offset=3.0)
    shift, scale = (c[:, None] for c in randn(B, 6 * D, dtype=F64).chunk(6, dim=1)[:2])
    shift = shift if has_shift else None
    w = randn(D, dtype=F64, offset=1.0) if affine else None
    b = randn(D, dtype=F64) if affine else None
    check(fusegraph.ops.adaln(x, scale, shift, 1e-5, weight=w, bias=b, norm=norm),
          adaln_ref(x, scale, shift, 1e-5, w, b, norm=norm))
    # a float64 scale alone (no shift) also takes the float64 path
    check(fusegraph.ops.adaln(x.float(), scale, None, norm=norm), adaln_ref(x.float(), scale, None, norm=norm))


def test_adaln_out_dtype_float64_from_float32_inputs():
    x, scale, shift = randn(2, 3, 8), randn(2, 1, 8), randn(2, 1, 8)
    check(fusegraph.ops.adaln(x, scale, shift, out_dtype=F64), adaln_ref(x, scale, shift))


def test_gelu():
    x = strided_copy(randn(7, 33, dtype=F64, scale=3.0))
    check(fusegraph.ops.gelu_tanh(x), F.gelu(x, approximate="tanh"))
    check(fusegraph.ops.fast_gelu(x), x * torch.sigmoid(1.702 * x))


def test_mul_add():
    a, gate, c = randn(2, 3, 8, dtype=F64), randn(2, 1, 8, dtype=F64), randn(3, 8, dtype=F64)
    check(fusegraph.ops.mul_add(a, gate, c), mul_add_ref(a, gate, c))
    check(fusegraph.ops.mul_add(a, 0.1, c), mul_add_ref(a, 0.1, c))  # 0.1 not rounded to float32
    # mixed: a float64 operand promotes (eager's rule), out_dtype rounds once
    check(fusegraph.ops.mul_add(a.float(), gate, c.float()), mul_add_ref(a.float(), gate, c.float()))
    check(fusegraph.ops.mul_add(a, gate, c, out_dtype=torch.bfloat16), mul_add_ref(a, gate, c), torch.bfloat16)


def test_fake_kernels_accept_float64_and_give_the_same_dtype():
    D = 8
    cases = [
        (torch.ops.fusegraph.rms_norm.default, (randn(3, D, dtype=F64), randn(D), 1e-6), {"style": "diffusers"}),
        (torch.ops.fusegraph.rope.default, (randn(1, 2, 1, D, dtype=F64), randn(2, 1, D), randn(2, 1, D)), {}),
        (torch.ops.fusegraph.adaln.default, (randn(2, 3, D), randn(2, 1, D, dtype=F64), randn(2, 1, D)), {}),
        (torch.ops.fusegraph.adaln.default, (randn(2, 3, D), randn(2, 1, D, dtype=F64), None), {"norm": "rms"}),
        (torch.ops.fusegraph.gelu_tanh.default, (randn(4, D, dtype=F64),), {}),
        (torch.ops.fusegraph.mul_add.default, (randn(2, D), randn(D, dtype=F64), randn(2, D)), {}),
        (torch.ops.fusegraph.mul_add.Scalar, (randn(2, D, dtype=F64), 2.0, randn(2, D, dtype=F64)), {}),
    ]
    for op, args, kwargs in cases:
        real = op(*args, **kwargs)
        assert real.dtype == F64
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fake = op(*[mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args], **kwargs)
        assert fake.dtype == real.dtype and fake.shape == real.shape
        torch.library.opcheck(op, args, kwargs)


def test_float64_error_messages_list_float64():
    with pytest.raises(RuntimeError, match=r"argument 'x' has dtype (Int|torch.int32); expected float32, bfloat16, "
                                           r"float16 or float64"):
        fusegraph.ops.gelu_tanh(torch.ones(3, dtype=torch.int32))
    with pytest.raises(ValueError, match=r"argument 'out_dtype' is (Long|torch.int64); expected float32, bfloat16, "
                                         r"float16 or float64"):
        fusegraph.ops.mul_add(randn(3), randn(3), randn(3), out_dtype=torch.int64)
