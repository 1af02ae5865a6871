"""The backend's graph routes (branch fusion's Backend) running on this runtime: on CPU the host graph."""
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
