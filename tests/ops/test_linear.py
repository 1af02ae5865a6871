"""fusegraph.linear: F.linear through oneDNN's float32 matmul on the plain weight (float32 CPU; bf16/fp16 widened to
float32 a block of weight rows at a time), at::linear otherwise; against a float64 reference."""
import pytest
import torch
import torch.nn.functional as F

import fusegraph
from tests.helpers import DTYPES, assert_close_to_reference, assert_error_names, randn, threads

op = fusegraph.ops.linear

# (M, N, K, bias): odd sizes, the pass's smallest site (9 rows, 2^20 multiply-adds), a FLUX.1-width slice, and a
# weight of more than one widened block (4 MiB of float32 rows: 384 rows at K = 3072) with a partial last block
SHAPES = [(9, 1024, 128, True), (37, 129, 257, False), (300, 513, 300, True), (64, 3072, 160, True),
          (1, 7, 5, True), (320, 48, 3072, False), (12, 1500, 3072, True)]


def reference(x, w, b=None):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


def check(out, x, w, b=None):
    """Against float64 at the dtype's tolerance (bf16/fp16: float32 accumulation, the bias added before the one
    rounding)."""
    assert_close_to_reference(out, reference(x, w, b))


@pytest.mark.parametrize("nthreads", [1, 2])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference(dtype, shape, nthreads):
    M, N, K, has_bias = shape
    x, w = randn(M, K, dtype=dtype), randn(N, K, dtype=dtype, scale=K ** -0.5)
    b = randn(N, dtype=dtype) if has_bias else None
    with threads(nthreads):
        out = op(x, w, b)
    assert out.shape == (M, N) and out.is_contiguous() and out.dtype == dtype
    assert_close_to_reference(out, reference(x, w, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_arguments_and_leading_dims(dtype):
    """x a column slice of a wider buffer and a permuted [..., K]; a weight with padded rows and a transposed
    one; a strided bias: all copied to what oneDNN takes, the result [..., N] contiguous."""
    w = randn(45, 96, dtype=dtype, scale=0.1)[:, :70]
    b = randn(90, dtype=dtype)[::2]
    for x in (randn(33, 80, dtype=dtype)[:, :70], randn(3, 11, 70, dtype=dtype).transpose(0, 1),
              randn(70, dtype=dtype)):
        out = op(x, w, b)
        assert out.shape == (*x.shape[:-1], 45) and out.is_contiguous()
        check(out, x, w, b)
    wt = randn(70, 45, dtype=dtype, scale=0.1).t()
    x = randn(20, 70, dtype=dtype)
    check(op(x, wt), x, wt)


def test_reads_the_weight_as_it_is_now():
    """No copy of the weight is kept between calls: an in-place edit (w.data += d) is read by the next call."""
    x, w, b = randn(64, 256), randn(512, 256, scale=1 / 16), randn(512)
    first = op(x, w, b)
    w.data += 0.5
    second = op(x, w, b)
    assert not torch.equal(first, second)
    assert_close_to_reference(second, reference(x, w, b))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_widened_row_tiles_and_the_reused_workspace(dtype):
    """bf16/fp16 widen into a per-thread workspace reused by every call: an activation over 32 MiB of float32 goes
    in row tiles (2100 x 4096: a 2048-row tile and a 52-row one, the weight widened again per tile); calls of other
    shapes after it (smaller, then larger again, then a strided x) read nothing stale from the workspace; an
    in-place weight edit is read by the next call."""
    w, b = randn(40, 4096, dtype=dtype, scale=1 / 64), randn(40, dtype=dtype)
    x = randn(2100, 4096, dtype=dtype)
    check(op(x, w, b), x, w, b)
    for m, k, n in ((7, 96, 130), (300, 3072, 500), (2, 4096, 40)):
        xs, ws = randn(m, k, dtype=dtype), randn(n, k, dtype=dtype, scale=k ** -0.5)
        check(op(xs, ws), xs, ws)
    xt = randn(4096, 33, dtype=dtype).t()
    check(op(xt, w, b), xt, w, b)
    first = op(x[:64], w, b)
    w.data.mul_(-0.5)
    second = op(x[:64], w, b)
    assert not torch.equal(first, second)
    check(second, x[:64], w, b)


def test_widened_calls_from_concurrent_threads():
    """Each thread widens into its own workspace: two threads calling at once, each with its own shapes, get
    their own products."""
    from concurrent.futures import ThreadPoolExecutor

    def work(seed):
        g = torch.Generator().manual_seed(seed)
        for i in range(6):
            m, k, n = 50 + 31 * i + seed, 512 + 128 * seed, 300 - 17 * i
            x = torch.randn(m, k, generator=g, dtype=torch.float64).to(torch.bfloat16)
            w = (torch.randn(n, k, generator=g, dtype=torch.float64) * k ** -0.5).to(torch.bfloat16)
            check(op(x, w), x, w)
        return seed

    with threads(1), ThreadPoolExecutor(2) as pool:
        assert sorted(pool.map(work, (0, 1, 2, 3))) == [0, 1, 2, 3]


def test_empty_and_zero_width():
    x, w, b = torch.randn(12, 0), torch.randn(3, 0), torch.randn(3)
    torch.testing.assert_close(op(x, w, b), b.expand(12, 3))
    torch.testing.assert_close(op(x, w), torch.zeros(12, 3))
    assert op(torch.randn(0, 4), torch.randn(3, 4)).shape == (0, 3)
    assert op(torch.randn(2, 4), torch.randn(0, 4)).shape == (2, 0)


def test_float64_and_gradient():
    x, w, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((12, 5), (3, 5), (3,)))
    torch.testing.assert_close(op(x, w, b), F.linear(x, w, b))
    assert torch.autograd.gradcheck(lambda *a: op(*a), (x, w, b))
    assert torch.autograd.gradcheck(lambda *a: op(*a), (x, w))
    # float32 through oneDNN: the same gradient as F.linear's
    x, w, b = (torch.randn(*s, requires_grad=True) for s in ((16, 64), (32, 64), (32,)))
    g = torch.randn(16, 32)
    ours = torch.autograd.grad(op(x, w, b), (x, w, b), g)
    theirs = torch.autograd.grad(F.linear(x, w, b), (x, w, b), g)
    for a, e in zip(ours, theirs):
        torch.testing.assert_close(a, e)


BAD = [
    (lambda x, w, b: (x[0, 0], w, b), "linear: argument 'x' is a 0-dim tensor; expected \\[..., in_features\\]"),
    (lambda x, w, b: (x, w[:, :4], b), "linear: argument 'weight' has shape \\[3, 4\\]; expected \\[out_features, 5\\]"),
    (lambda x, w, b: (x, w.half(), b), "linear: argument 'weight' has dtype .*; expected x's dtype"),
    (lambda x, w, b: (x, w, b[:2]), "linear: argument 'bias' has shape \\[2\\]; expected \\[3\\]"),
    (lambda x, w, b: (x, w, b.double()), "linear: argument 'bias' has dtype .*; expected x's dtype"),
    (lambda x, w, b: (x.int(), w, b), "linear: argument 'x' has dtype .*; expected float32"),
]


@pytest.mark.parametrize("fake", [False, True], ids=["cpu", "fake"])
@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_arguments_name_the_argument(case, fake):
    make_args, message = BAD[case]
    assert_error_names(op, make_args(torch.randn(2, 5), torch.randn(3, 5), torch.randn(3)), message, fake=fake)
