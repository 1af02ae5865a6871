import itertools

import pytest
import torch

import fusegraph
from tests.helpers import DTYPES, assert_close_to_reference, randn, run_under_cpu_capabilities, strided_copy, threads


def rand(shape, dtype=torch.float32):
    """tests.helpers.randn for any shape, zero-dim included."""
    return randn(torch.Size(shape).numel(), dtype=dtype).reshape(shape)


def reference(a, b, c):
    b = b.double() if isinstance(b, torch.Tensor) else b
    return a.double() * b + c.double()


def gate_view(batch, d, dtype=torch.float32, index=2):
    """A [B, 1, D] gate as models make it: one of six chunks of a [B, 6D] embedding, unsqueezed (strides (6D, D, 1))."""
    emb = randn(batch, 6 * d, dtype=dtype)
    gate = emb.chunk(6, dim=1)[index].unsqueeze(1)
    assert gate.stride() == (6 * d, d, 1) and not gate.is_contiguous() or batch == 1
    return gate


@pytest.mark.parametrize("d", [1, 7, 33, 12288])
@pytest.mark.parametrize("batch", [1, 7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_residual(dtype, batch, d):
    """residual + gate.unsqueeze(1) * y, the gate a chunk view: mul_add(y, gate, residual)."""
    seq = 5 if d == 12288 else 37
    y, residual = randn(batch, seq, d, dtype=dtype), randn(batch, seq, d, dtype=dtype)
    gate = gate_view(batch, d, dtype)
    out = fusegraph.ops.mul_add(y, gate, residual)
    assert out.shape == (batch, seq, d) and out.dtype == dtype and out.is_contiguous()
    assert_close_to_reference(out, reference(y, gate, residual))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("gate_first", [False, True])
def test_wan_float32_gate(dtype, gate_first):
    """Wan: (h.float() + y.float() * gate).type_as(h) with a float32 gate, as mul_add(y, gate, h, out_dtype=h.dtype)."""
    h, y = randn(2, 19, 96, dtype=dtype), randn(2, 19, 96, dtype=dtype)
    gate = gate_view(2, 96, torch.float32)
    a, b = (gate, y) if gate_first else (y, gate)
    out = fusegraph.ops.mul_add(a, b, h, out_dtype=dtype)
    assert out.dtype == dtype
    assert_close_to_reference(out, reference(y, gate, h))
    torch.testing.assert_close(out, (h.float() + y.float() * gate).type_as(h))
    # Without out_dtype the result has eager's dtype: float32 here.
    assert fusegraph.ops.mul_add(a, b, h).dtype == torch.float32


@pytest.mark.parametrize("shape", [(1,), (5, 1), (3, 17), (2, 4096 + 5), (7, 3, 12288)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_same_shape_contiguous(dtype, shape):
    a, b, c = (randn(*shape, dtype=dtype) for _ in range(3))
    assert_close_to_reference(fusegraph.ops.mul_add(a, b, c), reference(a, b, c))


BROADCASTS = {
    "column*row+full": ((9, 1), (1, 70), (9, 70)),
    "row*full+column": ((70,), (9, 70), (9, 1)),
    "c smaller than out": ((2, 1, 4), (3, 1), (4,)),
    "all scalars per row": ((6, 1), (6, 1), (6, 1)),
    "zero-dim b": ((4, 33), (), (4, 33)),
    "all zero-dim": ((), (), ()),
    "rank 5 mixed": ((2, 1, 3, 1, 5), (1, 4, 1, 6, 1), (4, 3, 6, 5)),
    "D = 1 rows": ((7, 5, 1), (7, 1, 1), (7, 5, 1)),
}


@pytest.mark.parametrize("case", list(BROADCASTS))
@pytest.mark.parametrize("dtype", DTYPES)
def test_general_broadcasting(dtype, case):
    a, b, c = (rand(s, dtype) for s in BROADCASTS[case])
    out = fusegraph.ops.mul_add(a, b, c)
    expected_shape = torch.broadcast_shapes(a.shape, b.shape, c.shape)
    assert out.shape == expected_shape and out.is_contiguous()
    assert_close_to_reference(out, reference(a, b, c))


@pytest.mark.parametrize("dtype", DTYPES)
def test_non_contiguous_operands(dtype):
    a = randn(40, 9, dtype=dtype).t()  # transposed: inner stride 40
    b = strided_copy(randn(9, 40, dtype=dtype))  # inner stride 2
    c = randn(9, 40, dtype=dtype)
    assert_close_to_reference(fusegraph.ops.mul_add(a, b, c), reference(a, b, c))
    assert_close_to_reference(fusegraph.ops.mul_add(c, a, b), reference(c, a, b))
    # expanded (stride 0) operands are read in place
    e = randn(1, 40, dtype=dtype).expand(9, 40)
    assert_close_to_reference(fusegraph.ops.mul_add(e, c, e), reference(e, c, e))


@pytest.mark.parametrize("dtypes", list(itertools.product(DTYPES, repeat=3)), ids=lambda d: "-".join(str(t)[6:] for t in d))
def test_mixed_dtypes_promote_like_eager(dtypes):
    a, b, c = (rand(s, t) for s, t in zip(((3, 1, 70), (3, 5, 70), (5, 70)), dtypes))
    out = fusegraph.ops.mul_add(a, b, c)
    assert out.dtype == (a * b + c).dtype
    assert_close_to_reference(out, reference(a, b, c))


def test_zero_dim_tensors_do_not_promote():
    a = randn(4, 6, dtype=torch.bfloat16)
    for b, c in [(rand((), torch.float32), randn(4, 6, dtype=torch.bfloat16)),
                 (randn(4, 6, dtype=torch.float16), rand((), torch.float32)),
                 (rand((), torch.float32), rand((), torch.float16))]:
        out = fusegraph.ops.mul_add(a, b, c)
        assert out.dtype == (a * b + c).dtype, (b.shape, c.shape)
        assert_close_to_reference(out, reference(a, b, c))
    out = fusegraph.ops.mul_add(rand((), torch.float16), rand((), torch.bfloat16), rand((), torch.bfloat16))
    assert out.dtype == torch.float32 and out.shape == ()


@pytest.mark.parametrize("out_dtype", DTYPES)
def test_out_dtype(out_dtype):
    a, b, c = randn(3, 50, dtype=torch.bfloat16), randn(3, 50), randn(3, 50, dtype=torch.float16)
    out = fusegraph.ops.mul_add(a, b, c, out_dtype=out_dtype)
    assert out.dtype == out_dtype
    assert_close_to_reference(out, reference(a, b, c))


@pytest.mark.parametrize("b", [0.7071067811865476, -3, True, 1e-3])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_b(dtype, b):
    a, c = randn(3, 70, dtype=dtype), randn(70, dtype=dtype)
    out = fusegraph.ops.mul_add(a, b, c)
    assert out.dtype == (a * b + c).dtype == dtype
    assert_close_to_reference(out, reference(a, b, c))


def test_scalar_b_mixed_and_out_dtype():
    a, c = randn(5, 33, dtype=torch.bfloat16), randn(5, 33)
    out = fusegraph.ops.mul_add(a, 2.5, c)
    assert out.dtype == torch.float32
    assert_close_to_reference(out, reference(a, 2.5, c))
    out = fusegraph.ops.mul_add(strided_copy(a), 2.5, c, out_dtype=torch.float16)
    assert out.dtype == torch.float16
    assert_close_to_reference(out, reference(a, 2.5, c))


@pytest.mark.parametrize("shapes", [((0, 8), (0, 8), (0, 8)), ((3, 0), (1, 1), (3, 0)), ((4, 1), (1, 0), (1,))])
def test_empty(shapes):
    a, b, c = (torch.empty(s, dtype=torch.bfloat16) for s in shapes)
    out = fusegraph.ops.mul_add(a, b, c)
    assert out.shape == torch.broadcast_shapes(*shapes) and out.dtype == torch.bfloat16
    assert fusegraph.ops.mul_add(a, 3.0, c).shape == torch.broadcast_shapes(shapes[0], shapes[2])


def test_bitwise_deterministic():
    y, res = randn(2, 1024, 3072, dtype=torch.bfloat16), randn(2, 1024, 3072, dtype=torch.bfloat16)
    gate = gate_view(2, 3072, torch.bfloat16)
    with threads(4):
        first = fusegraph.ops.mul_add(y, gate, res)
        assert torch.equal(first, fusegraph.ops.mul_add(y, gate, res))
    with threads(1):  # the element split between threads never changes a result
        assert torch.equal(first, fusegraph.ops.mul_add(y, gate, res))
    a = randn(1024, 1, dtype=torch.float16)
    assert torch.equal(fusegraph.ops.mul_add(a, gate[0], res[0]), fusegraph.ops.mul_add(a, gate[0], res[0]))


def test_opcheck():
    gate = gate_view(2, 12)
    samples = [
        (torch.ops.fusegraph.mul_add.default, (randn(2, 5, 12), gate, randn(2, 5, 12)), {}),
        (torch.ops.fusegraph.mul_add.default, (randn(2, 5, 12, dtype=torch.bfloat16), gate, randn(2, 5, 12, dtype=torch.bfloat16)),
         {"out_dtype": torch.bfloat16}),
        (torch.ops.fusegraph.mul_add.default, (randn(5, 1, dtype=torch.float16), randn(1, 12), randn(12)), {}),
        (torch.ops.fusegraph.mul_add.Scalar, (randn(3, 7), 0.5, randn(3, 7)), {}),
        (torch.ops.fusegraph.mul_add.Scalar, (randn(3, 7, dtype=torch.bfloat16), 2, randn(7)), {"out_dtype": torch.float32}),
    ]
    for op, args, kwargs in samples:
        torch.library.opcheck(op, args, kwargs)


def test_traces_under_compile_fullgraph():
    y, res, gate = randn(2, 5, 12), randn(2, 5, 12), gate_view(2, 12)
    fn = torch.compile(lambda y, g, r: fusegraph.ops.mul_add(y, g, r) + fusegraph.ops.mul_add(y, 0.5, r),
                       fullgraph=True, backend="aot_eager")
    assert_close_to_reference(fn(y, gate, res), reference(y, gate, res) + reference(y, 0.5, res))


DTYPE_NAMES = {n: f"({n}|torch.{t})" for n, t in [("Int", "int32"), ("Long", "int64")]}
BAD = {
    "a b": (((3, 4), (5, 4), (3, 4)), r"argument 'b' has shape \[5, 4\] which does not broadcast with 'a' of shape \[3, 4\] \(size 5 vs 3 at dim -2\)"),
    "c": (((3, 1), (1, 4), (3, 5)), r"argument 'c' has shape \[3, 5\] which does not broadcast with 'b' of shape \[1, 4\] \(size 5 vs 4 at dim -1\)"),
}


@pytest.mark.parametrize("device", ["cpu", "meta"])  # meta: the fake kernels' checks, same messages
@pytest.mark.parametrize("case", list(BAD))
def test_non_broadcastable_rejected(case, device):
    shapes, message = BAD[case]
    a, b, c = (torch.ones(s, device=device) for s in shapes)
    with pytest.raises(RuntimeError, match="fusegraph.mul_add: " + message):
        fusegraph.ops.mul_add(a, b, c)
    if case == "c":
        with pytest.raises(RuntimeError, match=r"argument 'c' has shape \[3, 5\] which does not broadcast with 'a'"):
            fusegraph.ops.mul_add(torch.ones(3, 4, device=device), 2.0, c)


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("arg", ["a", "b", "c"])
def test_integer_dtype_rejected(arg, device):
    args = {k: torch.ones(2, 3, device=device) for k in "abc"}
    args[arg] = torch.ones(2, 3, dtype=torch.int64, device=device)
    with pytest.raises(RuntimeError, match=rf"fusegraph.mul_add: argument '{arg}' has dtype {DTYPE_NAMES['Long']}; expected float32"):
        fusegraph.ops.mul_add(args["a"], args["b"], args["c"])
    if arg != "b":
        with pytest.raises(RuntimeError, match=rf"argument '{arg}' has dtype {DTYPE_NAMES['Long']}"):
            fusegraph.ops.mul_add(args["a"], 1.5, args["c"])


@pytest.mark.parametrize("device", ["cpu", "meta"])
@pytest.mark.parametrize("scalar", [False, True])
def test_bad_out_dtype_rejected(scalar, device):
    a = torch.ones(2, 3, device=device)
    b = 2.0 if scalar else a
    with pytest.raises(ValueError, match=rf"fusegraph.mul_add: argument 'out_dtype' is {DTYPE_NAMES['Int']}; expected float32"):
        fusegraph.ops.mul_add(a, b, a, out_dtype=torch.int32)


@pytest.mark.parametrize("device", ["cpu", "meta"])
def test_complex_scalar_rejected(device):
    a = torch.ones(2, 3, device=device)
    with pytest.raises(RuntimeError, match=r"fusegraph.mul_add: argument 'b' is the complex number .*expected a real number"):
        fusegraph.ops.mul_add(a, 1 + 2j, a)


def test_non_number_b_rejected():
    with pytest.raises(TypeError, match=r"fusegraph.mul_add: argument 'b' has type str; expected a tensor or a number"):
        fusegraph.ops.mul_add(torch.ones(2), "2", torch.ones(2))


def test_mixed_devices_rejected():
    a = torch.ones(2, 3)
    with pytest.raises(RuntimeError, match=r"fusegraph.mul_add: argument 'b' is on meta but 'a' is on cpu"):
        fusegraph.ops.mul_add(a, torch.ones(2, 3, device="meta"), a)
    with pytest.raises(RuntimeError, match=r"fusegraph.mul_add: argument 'c' is on meta but 'a' is on cpu"):
        fusegraph.ops.mul_add(a, 2.0, torch.ones(2, 3, device="meta"))


CAPABILITY_SCRIPT = r"""
import torch, fusegraph
from tests.helpers import assert_close_to_reference, randn
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for d in (1, 33, 3072 + 7):
        y, res = randn(3, 5, d, dtype=dtype), randn(3, 5, d, dtype=dtype)
        gate = randn(3, 6 * d, dtype=dtype).chunk(6, dim=1)[1].unsqueeze(1)
        assert_close_to_reference(fusegraph.ops.mul_add(y, gate, res), y.double() * gate.double() + res.double())
        g32 = randn(3, 1, d)
        assert_close_to_reference(fusegraph.ops.mul_add(y, g32, res, out_dtype=dtype), y.double() * g32.double() + res.double())
        assert_close_to_reference(fusegraph.ops.mul_add(y, 0.3, res), y.double() * 0.3 + res.double())
        col = randn(5, 1, dtype=dtype).t()
        assert_close_to_reference(fusegraph.ops.mul_add(y, col.t(), res[0].t().contiguous().t()), y.double() * col.t().double() + res[0].double())
print(fusegraph._C.cpu_capability())
"""


def test_every_cpu_capability():
    """The kernels compiled for DEFAULT and AVX2 (this CPU runs AVX512 by default), one process each, in parallel."""
    run_under_cpu_capabilities(CAPABILITY_SCRIPT)
