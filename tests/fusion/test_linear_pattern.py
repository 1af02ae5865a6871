"""linear family: linear layers of many rows become fusegraph.linear (oneDNN's float32 matmul on the module's own
weight; bf16/fp16 widened to it) on every route; few rows, small products and the switch leave them alone. The
family is forced on (enable_linear=True) so that these tests hold on any CPU; 'auto' is the rule read from the CPU
class's GEMM table (tests/backend/test_config.py), per dtype."""
import pytest
import torch
import torch.nn.functional as F

from fusegraph import Backend, CompilationConfig
from fusegraph.graph import GraphRunner
from fusegraph.graph.host import trace_fused

ON = {"enable_linear": True}
ROUTES = {"default": {}, "default_frozen": dict(enable_freezing=True), "aten": dict(inductor=False),
          "graph_with_compile": dict(graph_with_compile=True)}


class MLP(torch.nn.Module):
    def __init__(self, k=256, n=512, bias=True, dtype=torch.float32):
        super().__init__()
        self.up = torch.nn.Linear(k, n, bias=bias, dtype=dtype)
        self.down = torch.nn.Linear(n, k, bias=bias, dtype=dtype)

    def forward(self, x):
        return self.down(F.gelu(self.up(x), approximate="tanh")) + x


def _counts(module, inputs, **patterns):
    _, counts, _ = trace_fused(lambda *t: [module(*t)], list(inputs), CompilationConfig(
        fusion_patterns={**ON, **patterns}).fusion_patterns)
    return counts


def _ref64(module, x):
    with torch.no_grad():
        return module.double()(x.double()).float() if module.float() is not None else None


def _close_to_float64(out, module, x):
    """fp32 output within float32 tolerance of the float64 model (oneDNN and MKL sum in different orders)."""
    with torch.no_grad():
        ref = _ref64(module, x)
    module.float()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("shape, k, n, bias, dtype, fused", [
    ((64,), 256, 512, True, torch.float32, 2),      # 64 x 256 x 512 = 2^23 multiply-adds each
    ((3, 37), 256, 512, False, torch.float32, 2),   # [B, S, K]: 111 rows
    ((9,), 512, 256, True, torch.float32, 2),       # 9 rows: the first row count past gemv's
    ((8,), 512, 256, True, torch.float32, 0),       # 8 rows: gemv's (its own family)
    ((64,), 64, 128, True, torch.float32, 0),       # 2^19 multiply-adds: addmm's call is cheaper
    ((64,), 256, 512, True, torch.bfloat16, 2),     # bf16 / fp16: widened to float32 (where 'auto' says so)
    ((3, 37), 256, 512, False, torch.float16, 2),
    ((64,), 64, 128, True, torch.bfloat16, 0),
])
def test_what_is_a_site(shape, k, n, bias, dtype, fused):
    torch.manual_seed(4)
    module = MLP(k, n, bias, dtype).eval()
    x = torch.randn(*shape, k, dtype=dtype)
    assert _counts(module, [x])["linear"] == fused
    with torch.no_grad():
        out = GraphRunner(module, config=CompilationConfig(fusion_patterns=ON))(x)
        if dtype == torch.float32:
            _close_to_float64(out, module, x)
        else:  # float32 accumulation, one rounding per linear: no further from the float64 model than eager
            eager = module(x)
            ref = module.double()(x.double())
            module.to(dtype)
            err, eager_err = ((t.double() - ref).abs().max().item() for t in (out, eager))
            assert err <= 1.25 * eager_err, (err, eager_err)
            torch.testing.assert_close(out, eager, rtol=2 * torch.finfo(dtype).eps, atol=1e-3)


def test_auto_routes_each_dtype_by_its_own_rule(monkeypatch):
    """'auto' asks the rule per dtype: a class whose table says bf16 is faster widened (AVX2, AVX-512 without BF16)
    routes bf16 linears and leaves float32 ones with addmm, and the other way round."""
    from fusegraph.fusion.patterns import linear

    torch.manual_seed(5)
    for routed in (torch.bfloat16, torch.float32):
        monkeypatch.setattr(linear, "machine_rule", lambda dtype=torch.float32, r=routed: (dtype == r, "test"))
        for dtype in (torch.float32, torch.bfloat16):
            module, x = MLP(dtype=dtype).eval(), torch.randn(64, 256, dtype=dtype)
            assert _counts(module, [x], enable_linear="auto")["linear"] == (2 if dtype == routed else 0)


@pytest.mark.parametrize("route", ROUTES)
def test_backend_routes_and_weight_edits(route):
    """Each route runs the fused op on the weight as it is: frozen or not, an in-place edit is read next call."""
    torch.manual_seed(6)
    module = MLP().eval()
    x = torch.randn(2, 40, 256)
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(fusion_patterns=ON, **ROUTES[route]))
    fn = torch.compile(module, backend=backend)
    with torch.no_grad():
        _close_to_float64(fn(x), module, x)
        assert backend.stats.patterns["linear"] == 2, backend.stats.patterns
        assert backend.last_graph_ops["fusegraph.linear.default"] == 2
        module.up.weight.data += 0.25 * torch.randn_like(module.up.weight)
        module.down.bias.data.copy_(torch.randn_like(module.down.bias))
        _close_to_float64(fn(x), module, x)


def test_switch_off_auto_and_explain(monkeypatch):
    from fusegraph import explain
    from fusegraph.fusion.patterns import linear

    module, x = MLP().eval(), torch.randn(64, 256)
    assert _counts(module, [x], enable_linear=False)["linear"] == 0
    torch._dynamo.reset()
    report = explain(module, x, config=CompilationConfig(fusion_patterns={"enable_linear": False}))
    assert report.counts()["linear"]["unfused"] == 2
    # 'auto' where the machine rule says MKL is the faster kernel: the family is off, its sites are no candidates
    monkeypatch.setattr(linear, "machine_rule", lambda *dtype: (False, "test"))
    assert _counts(module, [x], enable_linear="auto")["linear"] == 0
    torch._dynamo.reset()
    report = explain(module, x)
    assert "linear" not in report.counts() or report.counts()["linear"]["unfused"] == 0


def test_pass_key_follows_the_machine_rule(monkeypatch):
    """Inductor's cache key holds the rule's answer: a cache directory shared with a machine that decides the
    other way does not serve this machine a graph built for that one."""
    from fusegraph.fusion import inductor_pass
    from fusegraph.fusion.patterns import linear

    keys = []
    for rule in (True, False):
        monkeypatch.setattr(linear, "machine_rule", lambda *dtype, r=rule: (r, "test"))
        keys.append(inductor_pass.FusionPass(CompilationConfig(), None).uuid())
    assert keys[0] != keys[1]


@pytest.mark.parametrize("route", ["default", "aten", "graph_with_compile"])
def test_dynamic_row_count_is_judged_at_its_hint(route):
    """Under dynamic=True the row count is symbolic: the site is judged at the size this compile was made for (it
    was never fused before, which cost fusegraph 10 % at SD3.5 widths against its static compile); one graph then
    serves every row count, few rows included, exactly."""
    torch.manual_seed(7)
    module = MLP().eval()
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(fusion_patterns=ON, **ROUTES[route]))
    fn = torch.compile(module, backend=backend, dynamic=True)
    with torch.no_grad():
        for rows in (40, 23, 3):
            x = torch.randn(2, rows, 256)
            _close_to_float64(fn(x), module, x)
    assert backend.stats.patterns["linear"] == 2, backend.stats.patterns
    torch._dynamo.reset()
