import pytest
import torch
import torch.nn.functional as F

import fusegraph
from tests.helpers import DTYPES, assert_close_to_reference, randn, strided_copy, threads

OPS = {
    "gelu_tanh": (fusegraph.ops.gelu_tanh, lambda x: F.gelu(x, approximate="tanh")),
    "fast_gelu": (fusegraph.ops.fast_gelu, lambda x: x * torch.sigmoid(1.702 * x)),
}
SHAPES = [(1,), (7, 1), (3, 17), (1, 4096 + 5), (7, 33, 12288 // 64), (2, 3, 12288)]


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_matches_float64_reference(name, dtype, shape):
    op, ref = OPS[name]
    x = randn(*shape, dtype=dtype, scale=3.0)
    assert_close_to_reference(op(x), ref(x.double()))


@pytest.mark.parametrize("name", OPS)
def test_extreme_values(name):
    op, ref = OPS[name]
    x = torch.tensor([-100.0, -20.0, -5.0, -1e-3, 0.0, 1e-3, 5.0, 20.0, 100.0])
    assert_close_to_reference(op(x), ref(x.double()))


@pytest.mark.parametrize("name", OPS)
@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_input(name, dtype):
    op, ref = OPS[name]
    x = strided_copy(randn(5, 37, dtype=dtype))
    out = op(x)
    assert out.shape == x.shape and out.is_contiguous()
    assert_close_to_reference(out, ref(x.double()))


@pytest.mark.parametrize("name", OPS)
def test_empty(name):
    op, _ = OPS[name]
    out = op(torch.empty(0, 64, dtype=torch.bfloat16))
    assert out.shape == (0, 64) and out.dtype == torch.bfloat16


@pytest.mark.parametrize("name", OPS)
def test_bitwise_deterministic(name):
    op, _ = OPS[name]
    x = randn(3, 4096, 257, dtype=torch.bfloat16)
    with threads(4):
        first = op(x)
        assert torch.equal(first, op(x))
    with threads(1):  # the block split between threads never changes a result
        assert torch.equal(first, op(x))


@pytest.mark.parametrize("name", OPS)
def test_integer_dtype_rejected(name):
    op, _ = OPS[name]
    with pytest.raises(RuntimeError, match=r"argument 'x' has dtype Long"):
        op(torch.arange(10))


@pytest.mark.parametrize("name", OPS)
def test_opcheck(name):
    op = getattr(torch.ops.fusegraph, name).default
    for x in (randn(3, 65), randn(2, 5, 8, dtype=torch.bfloat16), strided_copy(randn(4, 9, dtype=torch.float16))):
        torch.library.opcheck(op, (x,))


@pytest.mark.parametrize("name", OPS)
def test_traces_under_compile_fullgraph(name):
    op, ref = OPS[name]
    fn = torch.compile(lambda x: op(x) * 2, fullgraph=True, backend="aot_eager")
    x = randn(4, 33)
    assert_close_to_reference(fn(x), ref(x.double()) * 2)
