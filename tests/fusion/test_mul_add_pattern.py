"""Mul+Add fusion (SPEC §3): gated residuals (Flux/SD3), Wan's float32 gated residual, x * scalar + y for any
scalar -> one fusegraph.mul_add; lookalikes stay. Graph assertions come from Backend.last_graph_ops.

Numerics: the fused op computes a*b+c in float32 and rounds once, so it is compared with the float64 value of
the same expression at the dtype's default tolerances, and with eager (which also rounds a*b in bf16) at a
tolerance that allows for eager's extra rounding of the product."""
import pytest
import torch
import torch.nn as nn

from fusegraph import Backend, CompilationConfig

MUL_ADD, MUL_ADD_SCALAR = "fusegraph.mul_add.default", "fusegraph.mul_add.Scalar"
DTYPES = [torch.float32, torch.bfloat16]


def compile_and_run(fn, *inputs, **cfg):
    b = Backend(CompilationConfig(**cfg))
    with torch.no_grad():
        out = torch.compile(fn, backend=b)(*inputs)
        ref = fn(*inputs)
    return b, out, ref


def check_numerics(fn, inputs, out, eager, product_scale, ref=None):
    """``out`` vs float64 at default tolerances; vs eager within eager's own rounding of the product.
    ``ref``: the float64 reference rounded where the fused graph rounds (default: ``fn`` in float64)."""
    ref = ref or (lambda *a: fn(*[t.double() if isinstance(t, torch.Tensor) else t for t in a]))
    assert out.dtype == eager.dtype and out.shape == eager.shape
    torch.testing.assert_close(out, ref(*inputs).to(out.dtype))
    if out.dtype != torch.float32:
        ulp = 2.0 ** -8 if out.dtype == torch.bfloat16 else 2.0 ** -11
        torch.testing.assert_close(out, eager, rtol=1.6e-2, atol=2 * ulp * product_scale)
    else:
        torch.testing.assert_close(out, eager)


def fused_ops(b):
    return b.last_graph_ops[MUL_ADD] + b.last_graph_ops[MUL_ADD_SCALAR]


def assert_mul_add_chain_gone(b):
    assert "aten.mul.Tensor" not in b.last_graph_ops and "aten.add.Tensor" not in b.last_graph_ops


# --- Flux / SD3 gated residual: residual + gate.unsqueeze(1) * y, gate a chunk of the modulation ------------------


def gated_residual(hidden, emb, attn_out):
    shift, scale, gate = emb.chunk(3, dim=1)
    return hidden + gate.unsqueeze(1) * attn_out


def gated_residual_pair(hidden, emb, attn_out, ff_out):
    """Flux double block: two gated residuals from one chunked modulation."""
    _, gate_msa, _, gate_mlp = emb.chunk(4, dim=1)
    hidden = hidden + gate_msa.unsqueeze(1) * attn_out
    return hidden + gate_mlp.unsqueeze(1) * ff_out


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_residual_fuses(dtype):
    B, S, D = 2, 9, 48
    inputs = (torch.randn(B, S, D, dtype=dtype), torch.randn(B, 3 * D, dtype=dtype) * 0.3,
              torch.randn(B, S, D, dtype=dtype))
    b, out, eager = compile_and_run(gated_residual, *inputs, inductor=False)
    assert b.stats.patterns["mul_add"] == 1 and b.last_graph_ops[MUL_ADD] == 1
    assert_mul_add_chain_gone(b)
    check_numerics(gated_residual, inputs, out, eager, product_scale=2.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_two_gated_residuals_fuse(dtype):
    B, S, D = 2, 5, 32
    inputs = (torch.randn(B, S, D, dtype=dtype), torch.randn(B, 4 * D, dtype=dtype) * 0.3,
              torch.randn(B, S, D, dtype=dtype), torch.randn(B, S, D, dtype=dtype))
    b, out, eager = compile_and_run(gated_residual_pair, *inputs, inductor=False)
    assert b.stats.patterns["mul_add"] == 2 and b.last_graph_ops[MUL_ADD] == 2
    assert_mul_add_chain_gone(b)
    def ref(hidden, emb, attn_out, ff_out):  # each fused op rounds its result to the model dtype
        _, g1, _, g2 = emb.double().chunk(4, dim=1)
        h1 = (hidden.double() + g1.unsqueeze(1) * attn_out.double()).to(dtype)
        return h1.double() + g2.unsqueeze(1) * ff_out.double()

    check_numerics(gated_residual_pair, inputs, out, eager, product_scale=2.0, ref=ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gated_residual_inductor_route(dtype):
    B, S, D = 2, 9, 48
    inputs = (torch.randn(B, S, D, dtype=dtype), torch.randn(B, 3 * D, dtype=dtype) * 0.3,
              torch.randn(B, S, D, dtype=dtype))
    b, out, eager = compile_and_run(gated_residual, *inputs, inductor=True)
    assert b.stats.patterns["mul_add"] == 1
    check_numerics(gated_residual, inputs, out, eager, product_scale=2.0)


# --- Wan: (h.float() + y.float() * gate).type_as(h), gate float32 --------------------------------------------------


def wan_residual(h, y, modulation):
    gate = modulation.chunk(2, dim=1)[1]  # [B, 1, D] float32 view
    return (h.float() + y.float() * gate).type_as(h)


def wan_per_token(h, y, gate):  # per-token modulation [B, S, D]
    return (h.float() + y.float() * gate).type_as(h)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fn,gate_shape", [(wan_residual, (2, 2, 40)), (wan_per_token, (2, 7, 40))])
def test_wan_float32_gated_residual_fuses(fn, gate_shape, dtype):
    inputs = (torch.randn(2, 7, 40, dtype=dtype), torch.randn(2, 7, 40, dtype=dtype),
              torch.randn(*gate_shape, dtype=torch.float32) * 0.3)
    b, out, eager = compile_and_run(fn, *inputs, inductor=False)
    assert b.stats.patterns["mul_add"] == 1 and b.last_graph_ops[MUL_ADD] == 1
    assert "prims.convert_element_type.default" not in b.last_graph_ops  # casts folded into the kernel
    assert_mul_add_chain_gone(b)
    # eager does exactly the fused math here (float32, one rounding)
    torch.testing.assert_close(out, eager)
    check_numerics(fn, inputs, out, eager, product_scale=1.0)


# --- x * scalar + y for any scalar --------------------------------------------------------------------------------


@pytest.mark.parametrize("scalar", [0.5, -3.0, 1e-6, 7])
@pytest.mark.parametrize("dtype", DTYPES)
def test_scalar_mul_add_any_scalar(scalar, dtype):
    x, y = torch.randn(3, 5, 16, dtype=dtype), torch.randn(3, 5, 16, dtype=dtype)

    def fn(x, y):
        return x * scalar + y

    b, out, eager = compile_and_run(fn, x, y, inductor=False)
    assert b.stats.patterns["mul_add"] == 1 and b.last_graph_ops[MUL_ADD_SCALAR] == 1
    assert_mul_add_chain_gone(b)
    check_numerics(fn, (x, y), out, eager, product_scale=abs(scalar) * 4)


def test_scalar_is_captured_not_baked():
    """One pattern serves every scalar: two graphs with different scalars both come out right."""
    x, y = torch.randn(4, 8), torch.randn(4, 8)
    for scalar in (0.25, 1.75):
        torch._dynamo.reset()
        b, out, eager = compile_and_run(lambda x, y: y + x * scalar, x, y, inductor=False)
        assert b.last_graph_ops[MUL_ADD_SCALAR] == 1
        torch.testing.assert_close(out, x * scalar + y)


def test_scalar_from_an_argument():
    x, y = torch.randn(4, 8), torch.randn(4, 8)

    def fn(x, y, s):
        return x * s + y

    b, out, eager = compile_and_run(fn, x, y, 0.37, inductor=False)
    assert b.stats.patterns["mul_add"] == 1
    torch.testing.assert_close(out, eager)


# --- lookalikes stay ----------------------------------------------------------------------------------------------


def _abc():
    return torch.randn(2, 6, 16), torch.randn(2, 1, 16), torch.randn(2, 6, 16)


def _product_reused(a, b, c):
    p = a * b
    return p + c, p  # the product is needed on its own


@pytest.mark.parametrize("fn", [
    lambda a, b, c: torch.add(c, a * b, alpha=2.5),  # stays add(c, p, alpha=2.5) in aten: not c + p
    lambda a, b, c: torch.add(a * b, c, alpha=-1.0),
    lambda a, b, c: c - a * b,  # subtraction
    _product_reused,
    lambda a, b, c: (c + a / b),  # division
], ids=["alpha", "alpha_on_c", "sub", "product_reused", "div"])
def test_lookalikes_stay(fn):
    inputs = _abc()
    b, out, eager = compile_and_run(fn, *inputs, inductor=False)
    assert b.stats.patterns["mul_add"] == 0 and fused_ops(b) == 0
    torch.testing.assert_close(out, eager)


def test_mixed_dtype_promotion_stays():
    """bf16 * bf16 + fp32: eager rounds the product to bf16 first; one fused rounding would not match it."""
    a, b_, c = torch.randn(2, 6, 16, dtype=torch.bfloat16), torch.randn(2, 1, 16, dtype=torch.bfloat16), \
        torch.randn(2, 6, 16)
    b, out, eager = compile_and_run(lambda a, b, c: a * b + c, a, b_, c, inductor=False)
    assert b.stats.patterns["mul_add"] == 0
    torch.testing.assert_close(out, eager)


def test_disabled_family_stays():
    inputs = _abc()
    b, out, eager = compile_and_run(lambda a, b, c: c + a * b, *inputs, inductor=False,
                                    fusion_patterns={"enable_mul_add": False})
    assert b.stats.patterns["mul_add"] == 0 and fused_ops(b) == 0
    torch.testing.assert_close(out, eager)


def test_graph_outputs_and_aliasing_unchanged():
    """Fusion never changes which tensors a graph returns: an input returned as is stays an input."""
    a, g, c = _abc()

    def fn(a, g, c):
        return c + g * a, c

    b, (out, same), (eager, _) = compile_and_run(fn, a, g, c, inductor=False)
    assert b.stats.patterns["mul_add"] == 1
    torch.testing.assert_close(out, eager)
    torch.testing.assert_close(same, c)
