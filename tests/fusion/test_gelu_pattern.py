"""tanh-GELU fusion (SPEC §3): every source form becomes one fusegraph.gelu_tanh (or fast_gelu when asked for);
erf-GELU and disabled fusion leave the graph alone. Graph assertions come from Backend.last_graph_ops."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusegraph import Backend, CompilationConfig

GELU_TANH, FAST_GELU = "fusegraph.gelu_tanh.default", "fusegraph.fast_gelu.default"
DTYPES = [torch.float32, torch.bfloat16]


class FunctionalGelu(nn.Module):
    def forward(self, x):
        return F.gelu(x, approximate="tanh")


class ModuleGelu(nn.Module):  # diffusers FeedForward "gelu-approximate" / Flux single block act_mlp
    def __init__(self):
        super().__init__()
        self.act = nn.GELU(approximate="tanh")

    def forward(self, x):
        return self.act(x)


class UpcastGelu(nn.Module):  # gelu in float32, cast back
    def forward(self, x):
        return F.gelu(x.float(), approximate="tanh").to(x.dtype)


class TwoGelusAroundLinear(nn.Module):
    def __init__(self, d=24):
        super().__init__()
        self.proj = nn.Linear(d, d)

    def forward(self, x):
        return F.gelu(self.proj(F.gelu(x, approximate="tanh")), approximate="tanh") * 0.5


def compile_and_run(model, x, **cfg):
    b = Backend(CompilationConfig(**cfg))
    model = model.to(x.dtype)
    with torch.no_grad():
        out = torch.compile(model, backend=b)(x)
        ref = model(x)
    return b, out, ref


def assert_matches_eager(out, ref):
    assert out.dtype == ref.dtype and out.shape == ref.shape
    torch.testing.assert_close(out, ref)  # the dtype's default tolerances


def assert_unfused_chain_gone(ops):
    assert "aten.tanh.default" not in ops and "aten.erf.default" not in ops


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("form", [FunctionalGelu, ModuleGelu, UpcastGelu])
def test_tanh_gelu_forms_fuse(form, dtype):
    x = torch.randn(3, 7, 40, dtype=dtype) * 3
    b, out, ref = compile_and_run(form(), x, inductor=False)
    assert b.stats.patterns["gelu"] == 1
    assert b.last_graph_ops[GELU_TANH] == 1
    assert_unfused_chain_gone(b.last_graph_ops)
    assert "prims.convert_element_type.default" not in b.last_graph_ops  # the casts went with the chain
    assert_matches_eager(out, ref)


def test_non_contiguous_input():
    x = torch.randn(40, 24).t()  # a transposed view reaches the fused op
    b, out, ref = compile_and_run(FunctionalGelu(), x, inductor=False)
    assert b.last_graph_ops[GELU_TANH] == 1
    assert_matches_eager(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_every_site_fuses(dtype):
    x = torch.randn(5, 24, dtype=dtype)
    b, out, ref = compile_and_run(TwoGelusAroundLinear(), x, inductor=False)
    assert b.stats.patterns["gelu"] == 2 and b.last_graph_ops[GELU_TANH] == 2
    assert_unfused_chain_gone(b.last_graph_ops)
    assert_matches_eager(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_inductor_route(dtype):
    x = torch.randn(5, 24, dtype=dtype)
    b, out, ref = compile_and_run(TwoGelusAroundLinear(), x, inductor=True)
    assert b.stats.patterns["gelu"] == 2
    assert_matches_eager(out, ref)


@pytest.mark.parametrize("dtype", DTYPES)
def test_sigmoid_approximation_uses_fast_gelu(dtype):
    x = torch.randn(6, 32, dtype=dtype) * 3
    b, out, _ = compile_and_run(FunctionalGelu(), x, inductor=False,
                                fusion_patterns={"gelu_approximation": "sigmoid"})
    assert b.last_graph_ops[FAST_GELU] == 1 and GELU_TANH not in b.last_graph_ops
    x64 = x.double()
    expected = (x64 * torch.sigmoid(1.702 * x64)).to(dtype)
    torch.testing.assert_close(out, expected)


def test_tanh_and_sigmoid_backends_coexist_in_one_process():
    """Pattern passes are cached per option set: one backend's choice never leaks into another's."""
    x = torch.randn(6, 32) * 3
    b_sig, out_sig, _ = compile_and_run(FunctionalGelu(), x, inductor=False,
                                        fusion_patterns={"gelu_approximation": "sigmoid"})
    torch._dynamo.reset()
    b_tanh, out_tanh, ref = compile_and_run(FunctionalGelu(), x, inductor=False)
    assert b_sig.last_graph_ops[FAST_GELU] == 1 and b_tanh.last_graph_ops[GELU_TANH] == 1
    assert_matches_eager(out_tanh, ref)
    assert (out_sig - out_tanh).abs().max() > 1e-4  # really the other formula


class ErfGelu(nn.Module):
    def forward(self, x):
        return F.gelu(x) + nn.GELU(approximate="none")(x * 2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_erf_gelu_stays(dtype):
    x = torch.randn(4, 16, dtype=dtype)
    b, out, ref = compile_and_run(ErfGelu(), x, inductor=False)
    assert b.stats.patterns["gelu"] == 0
    assert b.last_graph_ops["aten.erf.default"] == 2
    assert GELU_TANH not in b.last_graph_ops and FAST_GELU not in b.last_graph_ops
    assert_matches_eager(out, ref)


class ManualTanhLookalike(nn.Module):
    """Like tanh-GELU but with another constant: must not be mistaken for it."""

    def forward(self, x):
        return 0.5 * x * (1 + torch.tanh(0.79 * (x + 0.044715 * x * x * x)))


def test_lookalike_with_other_constant_stays():
    x = torch.randn(4, 16)
    b, out, ref = compile_and_run(ManualTanhLookalike(), x, inductor=False, fusion_patterns={"enable_mul_add": False})
    assert b.stats.patterns["gelu"] == 0 and b.last_graph_ops["aten.tanh.default"] == 1
    assert_matches_eager(out, ref)


def test_disabled_family_stays():
    x = torch.randn(4, 16)
    b, out, ref = compile_and_run(FunctionalGelu(), x, inductor=False, fusion_patterns={"enable_fast_gelu": False})
    assert b.stats.patterns["gelu"] == 0 and b.last_graph_ops["aten.tanh.default"] == 1
    assert_matches_eager(out, ref)


def test_intermediate_used_elsewhere_stays():
    """If part of the chain is also an output, replacing the chain would change what the graph returns."""

    class Leaky(nn.Module):
        def forward(self, x):
            inner = torch.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))
            return 0.5 * x * (1 + inner), inner

    x = torch.randn(4, 16)
    b, (out, inner), (ref, ref_inner) = compile_and_run(Leaky(), x, inductor=False,
                                                        fusion_patterns={"enable_mul_add": False})
    assert b.stats.patterns["gelu"] == 0
    assert_matches_eager(out, ref)
    assert_matches_eager(inner, ref_inner)
