"""The backend's graph routes (branch fusion's Backend) running on this runtime: on CPU the host graph."""
import pytest
import torch
import torch.nn.functional as F

from fusegraph import Backend, CompilationConfig


class GeluMLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up, self.down = torch.nn.Linear(32, 64), torch.nn.Linear(64, 32)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x), approximate="tanh"))


def test_graph_only_route_captures_once_and_replays():
    torch._dynamo.reset()
    model = GeluMLP().eval()
    backend = Backend(CompilationConfig(graph_only=True, inductor=False))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.graphs_captured == 1
    assert backend.stats.replays == 3
    assert not backend.stats.fallbacks


def test_graph_with_compile_route_replays_fused_ops():
    torch._dynamo.reset()
    model = GeluMLP().eval()
    backend = Backend(CompilationConfig(graph_with_compile=True, inductor=False))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        x = torch.randn(4, 32)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.patterns["gelu"] == 1
    assert backend.stats.graphs_captured == 1 and backend.stats.replays == 2


class NormedAttention(torch.nn.Module):
    """diffusers' attention with qk RMSNorm: the norms read transposed [B, H, S, D] views, so eager's normed q
    keeps the [B, S, H, D] memory order, SDPA's output follows its query's, and the closing
    ``transpose(1, 2).reshape(B, S, H * D)`` is traced as a plain view — which no longer applies once the fused
    RMSNorm writes q densely as [B, H, S, D]."""

    def __init__(self, heads=4, dim=8):
        super().__init__()
        self.heads, self.dim = heads, dim
        self.qkv = torch.nn.Linear(heads * dim, 3 * heads * dim)
        self.weight_q = torch.nn.Parameter(torch.empty(dim).uniform_(0.5, 1.5))
        self.weight_k = torch.nn.Parameter(torch.empty(dim).uniform_(0.5, 1.5))

    @staticmethod
    def norm(x, weight):  # diffusers' RMSNorm: elementwise ops, which keep x's memory order (torch.rms_norm
        # of a transposed view copies it to row-major first)
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * weight

    def forward(self, x):
        b, s, _ = x.shape
        q, k, v = (t.view(b, s, self.heads, self.dim).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1))
        out = F.scaled_dot_product_attention(self.norm(q, self.weight_q), self.norm(k, self.weight_k), v)
        return out.transpose(1, 2).reshape(b, s, self.heads * self.dim)


@pytest.mark.parametrize("config", [dict(inductor=False), dict(graph_with_compile=True), dict(graph_only=True)],
                         ids=["aten", "graph_with_compile", "graph_only"])
@pytest.mark.parametrize("freezing", [False, True])
def test_views_after_a_fused_op_that_changes_the_layout(config, freezing):
    """The fused graph runs as is on these routes: its views become reshapes once a site was fused (a copy where
    the fused op's dense output makes a traced view impossible), with no fallback to eager (freezing asked for or
    not: these routes never fold parameters, and say so)."""
    torch._dynamo.reset()
    model = NormedAttention().eval()
    backend = Backend(CompilationConfig(enable_freezing=freezing, **config))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 5, 32)
            torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.patterns["rms_norm"] == (0 if config.get("graph_only") else 2)
    assert all("Inductor route only" in r for r in backend.stats.fallbacks) and \
        bool(backend.stats.fallbacks) == freezing


def test_graph_runner_views_after_a_fused_op_that_changes_the_layout():
    """GraphRunner fuses before it captures: the same view, the same reshape."""
    from fusegraph.graph import GraphRunner

    model = NormedAttention().eval()
    runner = GraphRunner(model)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(2, 5, 32)
            torch.testing.assert_close(runner(x), model(x), rtol=1e-5, atol=1e-5)
    assert runner.stats.graphs_captured == 1 and not runner.stats.fallbacks


@pytest.mark.parametrize("config", [dict(graph_with_compile=True), dict(graph_only=True)],
                         ids=["graph_with_compile", "graph_only"])
def test_a_capture_copies_no_weight(config, monkeypatch):
    """The host graph's capture warms up and traces on copies of the inputs a graph may mutate; the parameters it
    does not mutate are used where they live, so a capture never holds a second copy of the model."""
    from fusegraph.graph import drivers, runner

    made = []
    original = drivers.static_buffers

    def spy(tensors, lazy, static=()):
        out = original(tensors, lazy, static)
        made.append(out)
        return out

    monkeypatch.setattr(drivers, "static_buffers", spy)
    monkeypatch.setattr(runner, "static_buffers", spy)
    torch._dynamo.reset()
    model = GeluMLP().eval()
    compiled = torch.compile(model, backend=Backend(CompilationConfig(**config)))
    with torch.no_grad():
        x = torch.randn(4, 32)
        torch.testing.assert_close(compiled(x), model(x), rtol=1e-5, atol=1e-5)
    weights = {p.data_ptr() for p in model.parameters()}
    assert made, "no capture made work buffers"
    for buffers in made:
        assert weights <= {b.data_ptr() for b in buffers}, "a weight was copied for the capture"
