"""The backend under adversarial use: copies of compiled models, graph logs that must be neither lost nor
overwritten, and what an Inductor cache hit must still report."""
import copy
import os
import pickle

import pytest
import torch

from fusegraph import Backend, CompilationConfig


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x), approximate="tanh")


class Broken(torch.nn.Module):
    """Two Dynamo graphs: a graph break between the blocks."""

    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x):
        y = self.a(x)
        torch._dynamo.graph_break()
        return self.b(y)


@pytest.mark.parametrize("how", ["deepcopy", "pickle"])
@pytest.mark.parametrize("route", [dict(), dict(inductor=False), dict(graph_with_compile=True)])
def test_a_compiled_model_with_a_backend_instance_copies_and_pickles(how, route):
    m = Block().eval()
    b = Backend(CompilationConfig(**route))
    c = torch.compile(m, backend=b)
    x = torch.randn(2, 8)
    with torch.no_grad():
        c(x)
        c2 = copy.deepcopy(c) if how == "deepcopy" else pickle.loads(pickle.dumps(c))
        torch.testing.assert_close(c2(x), m(x))
    assert b.stats.graphs_compiled == 1


def _logged_graphs(folder):
    return sorted({name.split("_")[0] for name in os.listdir(folder)})


def test_two_backends_sharing_a_log_folder_keep_every_graph(tmp_path):
    x = torch.randn(2, 8)
    for _ in range(2):
        torch._dynamo.reset()
        c = torch.compile(Block().eval(), backend=Backend(CompilationConfig(inductor=False, graph_log_url=tmp_path)))
        with torch.no_grad():
            c(x)
    assert _logged_graphs(tmp_path) == ["graph000", "graph001"]
    infos = [(tmp_path / f"graph00{i}_info.txt").read_text() for i in range(2)]
    assert all(f"pid {os.getpid()}" in t for t in infos)


def test_the_named_backend_with_graph_breaks_keeps_every_graphs_log(tmp_path):
    saved = CompilationConfig.graph_log_url, CompilationConfig.inductor
    CompilationConfig.graph_log_url, CompilationConfig.inductor = str(tmp_path), False
    try:
        c = torch.compile(Broken().eval(), backend="fusegraph")
        with torch.no_grad():
            c(torch.randn(2, 8))
    finally:
        CompilationConfig.graph_log_url, CompilationConfig.inductor = saved
    graphs = _logged_graphs(tmp_path)
    assert len(graphs) == 2
    for g in graphs:
        assert any(n.startswith(g + "_") and n.endswith("_gelu_after.txt") for n in os.listdir(tmp_path))


def test_an_inductor_cache_hit_writes_the_logs_and_counts_the_training_fallback(tmp_path):
    from torch._inductor.utils import fresh_inductor_cache

    first, second = tmp_path / "first", tmp_path / "second"
    x = torch.randn(2, 8)
    from torch._dynamo.utils import counters

    with fresh_inductor_cache():
        counters.clear()
        backends = []
        for folder in (first, second):
            torch._dynamo.reset()
            b = Backend(CompilationConfig(graph_log_url=folder))
            torch.manual_seed(0)
            with torch.no_grad():
                torch.compile(Block().eval(), backend=b)(x)
            backends.append(b)
        assert backends[1].stats.patterns == backends[0].stats.patterns and backends[0].stats.patterns["gelu"] == 1
        assert counters["inductor"]["fxgraph_cache_hit"] == 1
        logged = sorted(os.listdir(second))
        assert any(n.endswith("_gelu_after.txt") for n in logged), logged
        assert "cache" in (second / "graph000_info.txt").read_text()

        training = []
        for _ in range(2):  # grad mode, parameters requiring grad: an autograd graph, fusion skipped
            torch._dynamo.reset()
            b = Backend()
            torch.compile(Block(), backend=b)(x).sum().backward()
            training.append(b.stats.fallbacks)
        assert training[0] and training[1] == training[0]


@pytest.mark.parametrize("route", [dict(graph_with_compile=True), dict(graph_only=True)])
def test_a_graph_of_constants_and_frozen_weights_is_captured(route):
    """Mochi's position tables: a Dynamo graph with no inputs once its parameter is frozen. Captured at compile
    time inside aot_autograd's FakeTensorMode, its factory ops made fakes that met the real frozen weight."""

    class Tables(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.freq = torch.nn.Parameter(torch.randn(1, 3, 8))

        def forward(self, x):
            pos = torch.arange(4, dtype=torch.float32)[None, :, None].expand(1, 4, 3)
            table = torch.bmm(pos, self.freq)
            torch._dynamo.graph_break()
            return x * table.cos()

    m = Tables().eval()
    b = Backend(CompilationConfig(**route))
    c = torch.compile(m, backend=b)
    x = torch.randn(1, 4, 8)
    with torch.no_grad():
        for _ in range(2):
            torch.testing.assert_close(c(x), m(x))
    assert not b.stats.fallbacks and b.stats.eager_calls == 0
    assert b.stats.graphs_captured == 2
