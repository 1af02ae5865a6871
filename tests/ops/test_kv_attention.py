"""fusegraph.kv_attention: SDPA of a few queries over cat([k_cache, k_new]) / cat([v_cache, v_new]) without the
concatenation, against a float64 reference."""
import pytest
import torch
import torch.nn.functional as F

import fusegraph
from tests.helpers import (
    DTYPES, assert_close_to_reference, assert_error_names, randn, run_under_cpu_capabilities, threads)

op = fusegraph.ops.kv_attention

# (B, H, Lq, cached, added, D, Dv); head dims up to 4 blocks of 2 float32 vectors run with q and the output in
# registers (128 with AVX512), longer ones through a scratch row: (1, 2, 1, 9, 3, 160, 200) and (.., 129, 40)
SHAPES = [(1, 8, 1, 128, 1, 64, 64), (2, 3, 3, 17, 2, 37, 19), (1, 1, 1, 0, 5, 8, 8), (1, 2, 2, 7, 0, 33, 65),
          (3, 2, 8, 100, 4, 128, 96), (1, 1, 1, 1, 1, 1, 1), (1, 2, 1, 9, 3, 160, 200), (2, 1, 2, 6, 1, 129, 40)]


def make(B, H, Lq, Lc, Ln, D, Dv, dtype, scale=1.0):
    return (randn(B, H, Lq, D, dtype=dtype, scale=scale), randn(B, H, Lc, D, dtype=dtype, scale=scale),
            randn(B, H, Ln, D, dtype=dtype, scale=scale), randn(B, H, Lc, Dv, dtype=dtype),
            randn(B, H, Ln, Dv, dtype=dtype))


def reference(q, kc, kn, vc, vn, scale=None):
    d = torch.float64
    return F.scaled_dot_product_attention(q.to(d), torch.cat([kc, kn], -2).to(d), torch.cat([vc, vn], -2).to(d),
                                          scale=scale)


@pytest.mark.parametrize("nthreads", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference(dtype, shape, nthreads):
    args = make(*shape, dtype=dtype, scale=2.0)
    with threads(nthreads):  # rows split between the threads where a row reads few keys
        out = op(*args)
    assert out.shape == shape[:3] + (shape[6],) and out.is_contiguous() and out.dtype == dtype
    assert_close_to_reference(out, reference(*args))


@pytest.mark.parametrize("dtype", DTYPES)
def test_explicit_scale_and_peaked_scores(dtype):
    """A large scale concentrates the softmax on one key: the max subtraction keeps exp finite."""
    args = make(2, 4, 1, 33, 1, 16, 16, dtype=dtype, scale=4.0)
    for scale in (0.01, 1.0, 30.0):
        assert_close_to_reference(op(*args, scale=scale), reference(*args, scale=scale))


@pytest.mark.parametrize("D", [64, 160], ids=["registers", "scratch"])
@pytest.mark.parametrize("where", ["cache_key", "new_key", "cache_value"])
def test_nan_propagates_like_the_reference(where, D):
    """A NaN score (in the vectorised part of the row's max or its scalar tail) or a NaN value row makes that
    row's output NaN, as in the reference; the other rows stay finite and exact."""
    q, kc, kn, vc, vn = make(1, 3, 1, 128, 1, D, D, dtype=torch.float32)
    {"cache_key": kc, "new_key": kn, "cache_value": vc}[where][0, 1, 0, 5] = float("nan")
    out, ref = op(q, kc, kn, vc, vn), reference(q, kc, kn, vc, vn)
    assert ref[0, 1].isnan().all() if where != "cache_value" else ref[0, 1, :, 5].isnan().all()
    torch.testing.assert_close(out, ref.float(), rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_views(dtype):
    """The decode step's layouts: q/k/v as transposes of [B, L, H, D] projections, a cache slice of a longer
    buffer, and a last dim that is not contiguous (copied by the op)."""
    B, H, D = 2, 4, 24
    q = randn(B, 1, H, D, dtype=dtype).transpose(1, 2)
    kn = randn(B, 1, H, D, dtype=dtype).transpose(1, 2)
    vn = randn(B, 1, H, 2 * D, dtype=dtype).transpose(1, 2)[..., ::2]
    kc = randn(B, H, 50, D, dtype=dtype)[:, :, :37]
    vc = randn(B, H, 37, D, 2, dtype=dtype)[..., 0]
    assert not vc.is_contiguous() and vc.stride(-1) == 2 and vn.stride(-1) == 2
    assert_close_to_reference(op(q, kc, kn, vc, vn), reference(q, kc, kn, vc, vn))


def test_float64_uses_the_reference_math():
    args = make(1, 2, 1, 5, 1, 8, 8, dtype=torch.float64)
    torch.testing.assert_close(op(*args), reference(*args))


def test_gradient():
    args = [t.requires_grad_() for t in make(1, 2, 2, 3, 1, 4, 3, dtype=torch.float64)]
    assert torch.autograd.gradcheck(lambda *a: op(*a), args)


BAD = [
    (lambda a: (a[0][0],) + a[1:], "argument 'q' has shape \\[2, 1, 8\\]; expected 4 dims"),
    (lambda a: (a[0].half(),) + a[1:], "argument 'k_cache' has dtype .*; expected q's dtype"),
    (lambda a: a[:1] + (a[1][:1],) + a[2:], "argument 'k_cache' has shape \\[1, 2, 5, 8\\]; expected q's batch"),
    (lambda a: a[:2] + (a[2][..., :4],) + a[3:], "argument 'k_new' has shape .*; expected q's head_dim 8 at dim 3"),
    (lambda a: a[:3] + (a[3][:, :, :4],) + a[4:], "argument 'v_cache' has shape .*; expected k_cache's length 5"),
    (lambda a: (a[0], a[1][:, :, :0], a[2][:, :, :0], a[3][:, :, :0], a[4][:, :, :0]),
     "k_cache and k_new are both empty"),
    (lambda a: a[:4] + (a[4].int(),), "argument 'v_new' has dtype .*; expected float32"),
]


@pytest.mark.parametrize("fake", [False, True], ids=["cpu", "fake"])
@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_arguments_name_the_argument(case, fake):
    make_args, message = BAD[case]
    assert_error_names(op, make_args(make(2, 2, 1, 5, 1, 8, 8, dtype=torch.float32)), message, fake=fake)


def test_bad_scale():
    with pytest.raises(ValueError, match="argument 'scale' is inf"):
        op(*make(1, 1, 1, 2, 1, 4, 4, dtype=torch.float32), scale=float("inf"))


def test_fake_kernel_shape():
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        args = tuple(mode.from_tensor(t) for t in make(2, 3, 4, 5, 1, 8, 6, dtype=torch.bfloat16))
        out = op(*args)
    assert out.shape == (2, 3, 4, 6) and out.dtype == torch.bfloat16


def test_every_cpu_capability():
    run_under_cpu_capabilities("""
import torch, torch.nn.functional as F, fusegraph
torch.manual_seed(0)
for dt in (torch.float32, torch.bfloat16, torch.float16):
    q, kc = torch.randn(2, 3, 1, 37, dtype=dt), torch.randn(2, 3, 20, 37, dtype=dt)
    kn = torch.randn(2, 3, 1, 37, dtype=dt)
    vc, vn = torch.randn(2, 3, 20, 70, dtype=dt), torch.randn(2, 3, 1, 70, dtype=dt)
    ref = F.scaled_dot_product_attention(q.double(), torch.cat([kc, kn], 2).double(), torch.cat([vc, vn], 2).double())
    torch.testing.assert_close(fusegraph.ops.kv_attention(q, kc, kn, vc, vn), ref.to(dt),
                               **({"rtol": 1e-5, "atol": 1e-5} if dt == torch.float32 else {}))
print(fusegraph._C.cpu_capability())
""")
