"""Backend: by name and instance, routes (SPEC §1.2), stats, the INFO line, graph_log_url, weights."""
import copy
import logging
import re
from importlib.metadata import entry_points

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusegraph
import fusegraph.backend as backend_mod
import fusegraph.pipeline as pipeline_mod
import fusegraph.stats as stats_mod
from fusegraph import Backend, CompilationConfig

GELU_TANH = "fusegraph.gelu_tanh.default"


class GeluMLP(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x), approximate="tanh"))


def run(model, backend, *inputs):
    with torch.no_grad():
        out = torch.compile(model, backend=backend)(*inputs)
        ref = model(*inputs)
    return out, ref


# --- graph runtime stand-in: the routes' contract with fusegraph.graph ------------------------------------------


class _RecordingRunner:
    """Minimal GraphRunner: records what it was given and runs it (the runtime itself is tested elsewhere)."""
    created = []

    def __init__(self, fn, config=None, stats=None):
        self.fn, self.config, self.stats = fn, config, stats
        stats.add(graphs_captured=1)
        _RecordingRunner.created.append(self)

    def __call__(self, *args):
        return self.fn(*args)


@pytest.fixture
def runtime_available(monkeypatch):
    """The backend's graph routes hand their graph to this stand-in (the name backend.py imported)."""
    _RecordingRunner.created = []
    monkeypatch.setattr(pipeline_mod, "compile_graph_route",
                        lambda fn, example_inputs, config, stats, **kw: _RecordingRunner(fn, config, stats))


@pytest.fixture
def runtime_missing(monkeypatch):
    """No device graph for the inputs (as CUDA graphs on a machine without CUDA)."""
    monkeypatch.setattr(pipeline_mod, "device_graph_available", lambda device, config: (False, "no device graph here"))
    monkeypatch.setattr(stats_mod, "_logged", set())


# --- by name / instance -----------------------------------------------------------------------------------------


def test_backend_by_name_uses_process_defaults(monkeypatch):
    monkeypatch.setitem(CompilationConfig._defaults, "inductor", False)
    before = backend_mod.fusegraph_backend.stats.patterns["gelu"]
    model, x = GeluMLP(), torch.randn(4, 32)
    out, ref = run(model, "fusegraph", x)
    torch.testing.assert_close(out, ref)
    assert backend_mod.fusegraph_backend.stats.patterns["gelu"] == before + 1


def test_entry_point_names_the_backend_function():
    (ep,) = [e for e in entry_points(group="torch_dynamo_backends") if e.name == "fusegraph"]
    assert ep.value == "fusegraph.backend:fusegraph_backend"
    assert ep.load() is fusegraph.backend.fusegraph_backend
    assert torch._dynamo.lookup_backend("fusegraph") is fusegraph.backend.fusegraph_backend


def test_backend_instance_counts_into_its_own_stats():
    b1, b2 = Backend(CompilationConfig(inductor=False)), Backend(CompilationConfig(inductor=False))
    model, x = GeluMLP(), torch.randn(4, 32)
    out, ref = run(model, b1, x)
    torch.testing.assert_close(out, ref)
    assert b1.stats.patterns["gelu"] == 1 and b1.stats.graphs_compiled == 1
    assert b2.stats.patterns["gelu"] == 0 and b2.stats.graphs_compiled == 0
    assert b1.last_graph_ops[GELU_TANH] == 1 and "aten.tanh.default" not in b1.last_graph_ops


# --- routes ---------------------------------------------------------------------------------------------------

ROUTES = [  # (graph_only, graph_with_compile) -> route taken when a device graph is available
    (False, False, "default"),
    (True, False, "graph_only"),
    (False, True, "graph_with_compile"),
    (True, True, "graph_with_compile"),  # with_compile wins
]


@pytest.mark.parametrize("only,with_compile,route", ROUTES)
def test_routes_with_graph_runtime(runtime_available, only, with_compile, route):
    b = Backend(CompilationConfig(graph_only=only, graph_with_compile=with_compile, inductor=False))
    model, x = GeluMLP(), torch.randn(4, 32)
    out, ref = run(model, b, x)
    torch.testing.assert_close(out, ref)
    assert b.last_route == route
    assert b.stats.fallbacks == {}
    fused = b.stats.patterns["gelu"]
    if route == "default":
        assert fused == 1 and b.stats.graphs_captured == 0 and _RecordingRunner.created == []
    elif route == "graph_only":  # captured as traced: the tanh chain is still there
        assert fused == 0 and b.stats.graphs_captured == 1
        runner = _RecordingRunner.created[0]
        assert GELU_TANH not in runner.fn.code and "tanh" in runner.fn.code
    else:  # fusion first, then capture of the fused graph
        assert fused == 1 and b.stats.graphs_captured == 1
        assert "fusegraph.gelu_tanh" in _RecordingRunner.created[0].fn.code
        assert _RecordingRunner.created[0].config == b.config


@pytest.mark.parametrize("only,with_compile,route", ROUTES[1:])
def test_graph_route_without_device_graph_takes_default_and_counts_why(runtime_missing, caplog, only,
                                                                         with_compile, route):
    caplog.set_level(logging.WARNING, logger="fusegraph")
    b = Backend(CompilationConfig(graph_only=only, graph_with_compile=with_compile, inductor=False))
    model = GeluMLP()
    for n in (4, 5):  # two graphs (a new shape recompiles): counted twice, logged once
        out, ref = run(model, b, torch.randn(n, 32))
        torch.testing.assert_close(out, ref)
    assert b.last_route == "default"
    assert b.stats.patterns["gelu"] >= 2  # the default route fuses
    assert b.stats.graphs_captured == 0
    ((reason, count),) = b.stats.fallbacks.items()
    assert route in reason and "no device graph here" in reason and count == 2
    assert sum("no device graph here" in r.getMessage() for r in caplog.records) == 1


def test_device_graph_none_takes_default_route(runtime_available):
    b = Backend(CompilationConfig(graph_with_compile=True, device_graph="none", inductor=False))
    run(GeluMLP(), b, torch.randn(4, 32))
    assert b.last_route == "default" and b.stats.graphs_captured == 0
    assert any("device_graph='none'" in r for r in b.stats.fallbacks)


class _OnCuda(torch.Tensor):
    """A CPU tensor that reports a CUDA device: what unfusable_why reads of a graph's inputs."""

    @property
    def device(self):
        return torch.device("cuda", 0)


def test_a_device_without_fused_kernels_is_named_and_other_devices_are_not():
    on_cuda = torch.Tensor._make_subclass(_OnCuda, torch.empty(2))
    assert pipeline_mod.unfusable_why([torch.empty(2), 3, torch.empty(1, device="meta")]) is None
    why = pipeline_mod.unfusable_why([torch.empty(2), on_cuda])  # this CPU build registers no CUDA kernels
    assert "no cuda kernels" in why and "no nvcc" in why and "unfused" in why
    config = CompilationConfig()
    unfused = pipeline_mod._unfused(config)
    assert unfused.fusion_patterns.enabled_families() == () and config.fusion_patterns.enabled_families()


@pytest.mark.parametrize("inductor", [False, True])
def test_a_graph_on_a_device_without_fused_kernels_compiles_unfused_and_says_why(monkeypatch, inductor):
    # As a fusegraph built without nvcc sees a CUDA graph (CMakeLists.txt then builds the CPU part alone): no fused op
    # may enter the graph, which would fail at its first call for want of a kernel.
    reason = "fusegraph's ops have no cuda kernels (stand-in): this graph is compiled unfused"
    monkeypatch.setattr(pipeline_mod, "unfusable_why", lambda inputs: reason)
    b = Backend(CompilationConfig(inductor=inductor))
    out, ref = run(GeluMLP(), b, torch.randn(4, 32))
    torch.testing.assert_close(out, ref)
    assert b.stats.patterns["gelu"] == 0 and GELU_TANH not in (b.last_graph_ops or {})
    assert b.stats.fallbacks == {reason: 1}
    assert b.config.fusion_patterns.enabled_families()  # the backend's own config is unchanged


def test_inductor_route_fuses_and_matches_eager():
    b = Backend(CompilationConfig(inductor=True))
    model, x = GeluMLP(), torch.randn(4, 32)
    out, ref = run(model, b, x)
    torch.testing.assert_close(out, ref)
    assert b.stats.patterns["gelu"] == 1
    # a second backend on the same graph may be served from Inductor's cache: the count is still reported
    torch._dynamo.reset()
    b2 = Backend(CompilationConfig(inductor=True))
    run(model, b2, x)
    assert b2.stats.patterns["gelu"] == 1


# (config, route taken): every route compiles a graph that needs gradients, unfused (fused ops have no backward)
TRAINING_ROUTES = [
    (dict(inductor=True), "default"),
    (dict(inductor=False), "default"),
    (dict(graph_only=True), "graph_only"),
    (dict(graph_with_compile=True), "graph_with_compile"),
]


@pytest.mark.parametrize("options,route", TRAINING_ROUTES, ids=["inductor", "aten", "graph_only", "graph_with_compile"])
def test_grad_enabled_graph_is_not_fused_and_differentiates_as_eager(options, route):
    """Output, every parameter's gradient and the input's gradient equal eager's on a copy of the module with the
    same inputs and the same upstream gradient (fp32, tight tolerance)."""
    b = Backend(CompilationConfig(**options))
    model, x = GeluMLP(), torch.randn(4, 32, requires_grad=True)
    eager, x_eager = copy.deepcopy(model), x.detach().clone().requires_grad_()
    grad_out = torch.randn(4, 32)
    out = torch.compile(model, backend=b)(x)
    out.backward(grad_out)
    ref = eager(x_eager)
    ref.backward(grad_out)
    tight = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out, ref, **tight)
    for (name, p), p_eager in zip(model.named_parameters(), eager.parameters()):
        assert p.grad is not None, name
        torch.testing.assert_close(p.grad, p_eager.grad, **tight, msg=lambda m: f"{name}.grad: {m}")
    torch.testing.assert_close(x.grad, x_eager.grad, **tight)
    assert b.last_route == route
    assert b.stats.patterns["gelu"] == 0
    if route != "graph_only":  # the route that fuses says why it did not
        assert any("autograd" in r for r in b.stats.fallbacks)


# --- weights ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("freezing", [True, False])
def test_the_aten_route_never_folds_parameters(freezing):
    """Freezing is the Inductor route's opt-in: on the aten route the weights and biases stay inputs either way,
    and asking for freezing there says why it does not apply."""
    b = Backend(CompilationConfig(inductor=False, enable_freezing=freezing))
    model, x = GeluMLP(), torch.randn(4, 32)
    out, ref = run(model, b, x)
    torch.testing.assert_close(out, ref)
    ops = b.last_graph_ops
    assert ops[GELU_TANH] == 1
    assert ops["get_attr"] == 0 and ops["placeholder"] == 5
    assert any("Inductor route only" in r for r in b.stats.fallbacks) == freezing


# --- INFO line, graph log -------------------------------------------------------------------------------------

# the SPEC's five families, then the families added since (keys are added at the end, never renamed)
INFO_LINE = re.compile(r"^fusegraph: fused rms_norm×(\d+) rope×(\d+) adaln×(\d+) gelu×(\d+) mul_add×(\d+) "
                       r"adaln_rms×\d+ adaln_noshift×\d+ kv_attention×\d+ gemv×\d+ linear×\d+; "
                       r"captured (\d+) graphs? \((\d+\.\d\d) s, (\d+\.\d) MiB\)$")


def test_info_line_per_compiled_graph(caplog):
    caplog.set_level(logging.INFO, logger="fusegraph")
    b = Backend(CompilationConfig(inductor=False))
    model = GeluMLP()
    run(model, b, torch.randn(4, 32))
    run(model, b, torch.randn(5, 32))
    lines = [r.getMessage() for r in caplog.records if r.name == "fusegraph" and r.levelno == logging.INFO]
    matches = [INFO_LINE.match(line) for line in lines]
    assert len(matches) == 2 and all(matches), lines
    assert matches[0].group(4) == "1" and matches[0].group(6) == "0"


def test_info_line_counts_captures(runtime_available, caplog):
    caplog.set_level(logging.INFO, logger="fusegraph")
    run(GeluMLP(), Backend(CompilationConfig(graph_with_compile=True, inductor=False)), torch.randn(4, 32))
    (line,) = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    m = INFO_LINE.match(line)
    assert m and m.group(4) == "1" and m.group(6) == "1" and "captured 1 graph (" in line


def test_graph_log_url_writes_before_and_after_each_pass(tmp_path):
    folder = tmp_path / "logs" / "nested"  # created if missing
    b = Backend(CompilationConfig(inductor=False, graph_log_url=str(folder)))
    run(GeluMLP(), b, torch.randn(4, 32))
    names = sorted(p.name for p in folder.iterdir())
    for pass_name in ("redundant", "adaln", "rope", "rms_norm", "adaln_rms", "adaln_noshift", "gelu", "mul_add"):
        assert any(f"_{pass_name}_before.txt" in n for n in names), (pass_name, names)
        assert any(f"_{pass_name}_after.txt" in n for n in names), (pass_name, names)
    (gelu_before,) = [n for n in names if n.startswith("graph000_") and "_gelu_before" in n][:1]
    gelu_after = gelu_before.replace("_before", "_after")
    assert "aten.tanh" in (folder / gelu_before).read_text()
    after = (folder / gelu_after).read_text()
    assert "fusegraph.gelu_tanh" in after and "aten.tanh" not in after


def test_graph_log_url_disabled_passes_skip(tmp_path):
    b = Backend(CompilationConfig(inductor=False, graph_log_url=tmp_path,
                                  fusion_patterns={"enable_rope": False}))
    run(GeluMLP(), b, torch.randn(4, 32))
    names = [p.name for p in tmp_path.iterdir()]
    assert names and not any("_rope_" in n for n in names)


def test_graph_log_url_that_is_a_file_is_a_clear_error(tmp_path):
    path = tmp_path / "not_a_dir"
    path.write_text("x")
    with pytest.raises(ValueError, match="graph_log_url"):
        Backend(CompilationConfig(graph_log_url=str(path)))
