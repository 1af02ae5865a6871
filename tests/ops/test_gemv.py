"""fusegraph.gemv: F.linear on a few rows, one pass over the weight, against a float64 reference."""
import pytest
import torch
import torch.nn.functional as F

import fusegraph
from tests.helpers import (
    DTYPES, assert_close_to_reference, assert_error_names, randn, run_under_cpu_capabilities, threads)

op = fusegraph.ops.gemv

# (M, N, K, bias)
SHAPES = [(1, 1536, 512, False), (1, 512, 512, True), (3, 37, 65, True), (8, 5, 1, True), (2, 9, 33, False),
          (1, 1, 1, True), (5, 130, 200, True), (7, 4, 32, False)]


def reference(x, w, b=None):
    return F.linear(x.double(), w.double(), None if b is None else b.double())


@pytest.mark.parametrize("nthreads", [1, 4])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference(dtype, shape, nthreads):
    M, N, K, has_bias = shape
    x, w = randn(M, K, dtype=dtype), randn(N, K, dtype=dtype, scale=K ** -0.5)
    b = randn(N, dtype=dtype) if has_bias else None
    with threads(nthreads):  # (1536, 512): blocks of rows split between the threads
        out = op(x, w, b)
    assert out.shape == (M, N) and out.is_contiguous() and out.dtype == dtype
    assert_close_to_reference(out, reference(x, w, b))


@pytest.mark.parametrize("dtype", DTYPES)
def test_strided_arguments(dtype):
    """x a row slice of a wider buffer, a weight with padded rows (row stride > K), a strided bias; a weight whose
    last dim is not contiguous is copied by the op."""
    x = randn(3, 80, dtype=dtype)[:, :70]
    w = randn(45, 96, dtype=dtype)[:, :70]
    b = randn(90, dtype=dtype)[::2]
    assert_close_to_reference(op(x, w, b), reference(x, w, b))
    wt = randn(70, 45, dtype=dtype).t()
    assert_close_to_reference(op(x, wt), reference(x, wt))


@pytest.mark.parametrize("dtype", DTYPES)
def test_leading_dims_are_rows(dtype):
    """x [..., K] -> [..., N], as F.linear: a decode step's [B, 1, K] and a 1-D vector; a permuted x whose rows
    are not one stride is copied."""
    w, b = randn(40, 24, dtype=dtype, scale=0.2), randn(40, dtype=dtype)
    for x in (randn(2, 1, 24, dtype=dtype), randn(24, dtype=dtype), randn(3, 2, 24, dtype=dtype).transpose(0, 1)):
        out = op(x, w, b)
        assert out.shape == (*x.shape[:-1], 40) and out.is_contiguous()
        assert_close_to_reference(out, reference(x, w, b))


def test_empty_and_zero_width():
    x, w, b = torch.randn(2, 0), torch.randn(3, 0), torch.randn(3)
    torch.testing.assert_close(op(x, w, b), b.expand(2, 3))
    torch.testing.assert_close(op(x, w), torch.zeros(2, 3))
    assert op(torch.randn(0, 4), torch.randn(3, 4)).shape == (0, 3)


def test_float64_and_gradient():
    x, w, b = (torch.randn(*s, dtype=torch.float64, requires_grad=True) for s in ((2, 5), (3, 5), (3,)))
    torch.testing.assert_close(op(x, w, b), F.linear(x, w, b))
    assert torch.autograd.gradcheck(lambda *a: op(*a), (x, w, b))
    assert torch.autograd.gradcheck(lambda *a: op(*a), (x, w))


BAD = [
    (lambda x, w, b: (x[0, 0], w, b), "argument 'x' is a 0-dim tensor; expected \\[..., in_features\\]"),
    (lambda x, w, b: (x, w[:, :4], b), "argument 'weight' has shape \\[3, 4\\]; expected \\[out_features, 5\\]"),
    (lambda x, w, b: (x, w.half(), b), "argument 'weight' has dtype .*; expected x's dtype"),
    (lambda x, w, b: (x, w, b[:2]), "argument 'bias' has shape \\[2\\]; expected \\[3\\]"),
    (lambda x, w, b: (x, w, b.double()), "argument 'bias' has dtype .*; expected x's dtype"),
    (lambda x, w, b: (x.int(), w, b), "argument 'x' has dtype .*; expected float32"),
]


@pytest.mark.parametrize("fake", [False, True], ids=["cpu", "fake"])
@pytest.mark.parametrize("case", range(len(BAD)))
def test_bad_arguments_name_the_argument(case, fake):
    make_args, message = BAD[case]
    assert_error_names(op, make_args(torch.randn(2, 5), torch.randn(3, 5), torch.randn(3)), message, fake=fake)


def test_every_cpu_capability():
    run_under_cpu_capabilities("""
import torch, torch.nn.functional as F, fusegraph
torch.manual_seed(0)
for dt in (torch.float32, torch.bfloat16, torch.float16):
    for m, n, k in ((1, 67, 70), (3, 8, 64), (2, 5, 3)):
        x, w, b = torch.randn(m, k, dtype=dt), torch.randn(n, k, dtype=dt) * k ** -0.5, torch.randn(n, dtype=dt)
        ref = F.linear(x.double(), w.double(), b.double())
        torch.testing.assert_close(fusegraph.ops.gemv(x, w, b), ref.to(dt),
                                   **({"rtol": 1e-5, "atol": 1e-5} if dt == torch.float32 else {}))
print(fusegraph._C.cpu_capability())
""")


def test_every_prefetch_hint_gives_the_same_bits():
    """FUSEGRAPH_GEMV_PREFETCH picks the prefetch instruction the few-row kernel issues (read once per process): a
    hint, never a change of result, so every choice gives the default's bits; a value it does not know warns,
    naming the variable, and keeps the default."""
    import os
    import subprocess
    import sys

    script = """
import hashlib, warnings, torch, fusegraph
warnings.simplefilter("always")
g = torch.Generator().manual_seed(0)
digest = hashlib.sha256()
for dt in (torch.float32, torch.bfloat16):
    for m, n, k in ((1, 67, 700), (3, 40, 2048), (8, 9, 33)):
        x, w = torch.randn(m, k, generator=g).to(dt), (torch.randn(n, k, generator=g) * k ** -0.5).to(dt)
        digest.update(fusegraph.ops.gemv(x, w, torch.randn(n, generator=g).to(dt)).view(torch.uint8).numpy().tobytes())
print(digest.hexdigest())
"""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    hints = ("", "nta", "t0", "t1", "t2", "none", "bogus")
    runs = {h: subprocess.Popen([sys.executable, "-c", script], cwd=root, text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env=dict(os.environ, FUSEGRAPH_GEMV_PREFETCH=h))
            for h in hints}
    out = {}
    for h, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, f"{h!r}: {stderr}"
        out[h] = stdout.split()[-1]
        if h == "bogus":
            assert "FUSEGRAPH_GEMV_PREFETCH" in stderr and "'bogus'" in stderr, stderr
    assert len(set(out.values())) == 1, out
