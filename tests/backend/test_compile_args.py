"""torch.compile's ``mode`` and ``options`` (GUIDE §1.12, ``config.with_compile_args``): ``torch.compile`` hands them
to a custom backend as keyword arguments; ``"fusegraph"`` and ``Backend`` instances take them.

The rule under test: the backend's config is the base; ``mode`` picks the route (``reduce-overhead``: a graph route;
``max-autotune*``: the Inductor route with that mode's Inductor settings; ``lite``: the aten route); ``options`` set
``CompilationConfig`` / ``FusionPatterns`` fields and Inductor options by name; the backend's own config is never
changed."""
import pytest
import torch
import torch.nn.functional as F

import fusegraph
from fusegraph import Backend, CompilationConfig
from fusegraph.config import with_compile_args
from fusegraph.fusion.inductor_pass import FusionPass


class _Block(torch.nn.Module):
    """RMSNorm -> linear -> tanh-GELU -> linear, plus a gated residual: three fused families."""

    def __init__(self, d=48):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d, eps=1e-6)
        self.up = torch.nn.Linear(d, 2 * d)
        self.down = torch.nn.Linear(2 * d, d)

    def forward(self, x, gate):
        return x + gate * self.down(F.gelu(self.up(self.norm(x)), approximate="tanh"))


def _inputs():
    return torch.randn(3, 5, 48), torch.randn(3, 1, 48)


@pytest.fixture
def block():
    torch.manual_seed(0)
    return _Block().eval()


def _run(block, backend, calls=3, **compile_kwargs):
    """Compiles ``block`` with ``backend`` and ``compile_kwargs``; each call on fresh inputs equals eager's."""
    torch._dynamo.reset()
    compiled = torch.compile(block, backend=backend, **compile_kwargs)
    with torch.no_grad():
        for _ in range(calls):
            x, gate = _inputs()
            torch.testing.assert_close(compiled(x, gate), block(x, gate), rtol=1e-5, atol=1e-5)


@pytest.fixture
def inductor_settings(monkeypatch):
    """The Inductor settings in force while fusegraph's pass runs inside Inductor's compile, one dict per pass (the
    FX graph cache off: a graph served from it runs no pass)."""
    from torch._inductor import config

    seen = []
    original = FusionPass.__call__

    def spy(self, graph, *args, **kwargs):
        seen.append({"max_autotune": config.max_autotune, "coordinate_descent_tuning":
                     config.coordinate_descent_tuning, "triton.cudagraphs": config.triton.cudagraphs,
                     "epilogue_fusion": config.epilogue_fusion})
        return original(self, graph, *args, **kwargs)

    monkeypatch.setattr(FusionPass, "__call__", spy)
    with config.patch(fx_graph_cache=False):
        yield seen


# --- mode ---------------------------------------------------------------------------------------------------


def test_reduce_overhead_runs_the_graph_route(block):
    backend = Backend()
    _run(block, backend, mode="reduce-overhead")
    assert backend.last_route == "graph_with_compile"
    assert backend.stats.graphs_captured == 1 and backend.stats.replays >= 2 and backend.stats.eager_calls == 0
    assert backend.stats.patterns["rms_norm"] == 1 and backend.stats.patterns["gelu"] == 1
    assert backend.config == CompilationConfig()  # the backend's own config unchanged


def test_reduce_overhead_by_name_captures(block):
    before = fusegraph.fusegraph_backend.stats.graphs_captured
    _run(block, "fusegraph", mode="reduce-overhead")
    assert fusegraph.fusegraph_backend.stats.graphs_captured == before + 1


def test_reduce_overhead_keeps_a_graph_route_the_config_chose(block):
    backend = Backend({"graph_only": True})
    _run(block, backend, mode="reduce-overhead")
    assert backend.last_route == "graph_only"  # the config's unfused graph route stands
    assert backend.stats.patterns["rms_norm"] == 0 and backend.stats.graphs_captured == 1


@pytest.mark.parametrize("mode", ["max-autotune", "max-autotune-no-cudagraphs"])
def test_max_autotune_runs_the_inductor_route_with_that_modes_settings(block, mode, inductor_settings):
    backend = Backend({"graph_with_compile": True, "inductor": False})  # mode picks the route over the config's
    _run(block, backend, calls=2, mode=mode)
    assert backend.last_route == "default" and backend.stats.graphs_captured == 0
    assert inductor_settings, "fusegraph's pass did not run inside an Inductor compile"
    assert inductor_settings[-1]["max_autotune"] and inductor_settings[-1]["coordinate_descent_tuning"]
    # Inductor's cudagraphs ("max-autotune") are for CUDA: on CPU Inductor turns them off itself
    assert with_compile_args(CompilationConfig(), mode=mode).inductor_options.get("triton.cudagraphs", False) == \
        (mode == "max-autotune")
    assert backend.stats.patterns["rms_norm"] == 1


def test_default_mode_is_the_config_as_it_is(block, inductor_settings):
    backend = Backend()
    # torch.compile drops mode="default" before the backend sees it; a direct call passes it on
    _run(block, lambda gm, inputs: backend(gm, inputs, mode="default"), calls=2)
    assert backend.last_route == "default" and not inductor_settings[-1]["max_autotune"]


def test_lite_runs_the_aten_route(block, inductor_settings):
    backend = Backend()
    _run(block, backend, mode="lite")
    assert backend.last_route == "default" and inductor_settings == []  # no Inductor compile ran
    assert backend.stats.patterns["rms_norm"] == 1 and sum(backend.stats.graph_choices.values()) == 0


def test_an_unknown_mode_is_a_clear_error(block):
    with pytest.raises(Exception, match=r"mode='fastest' is not a torch.compile mode fusegraph knows; expected one "
                                        r"of 'default', 'reduce-overhead'"):
        _run(block, Backend(), mode="fastest")


# --- options ------------------------------------------------------------------------------------------------


def test_options_set_config_fields_aliases_and_fusion_patterns(block):
    backend = Backend()
    _run(block, backend, options={"aclgraph_with_compile": True, "enable_fast_gelu": False})
    assert backend.last_route == "graph_with_compile" and backend.stats.graphs_captured == 1
    assert backend.stats.patterns["gelu"] == 0 and backend.stats.patterns["rms_norm"] == 1
    assert backend.config == CompilationConfig()


def test_options_set_inductor_options_on_the_inductor_route(block, inductor_settings):
    backend = Backend()
    _run(block, backend, calls=2, options={"epilogue-fusion": False})  # '-' read as '_', as Inductor reads it
    assert inductor_settings and inductor_settings[-1]["epilogue_fusion"] is False
    assert backend.stats.fallbacks == {}


def test_inductor_options_on_a_graph_route_are_said_unused(block, inductor_settings):
    backend = Backend({"graph_with_compile": True})
    _run(block, backend, options={"max_autotune": True})
    assert inductor_settings == []
    assert backend.stats.fallbacks == {
        "Inductor options max_autotune unused: the graph_with_compile route compiles no Inductor code": 1}


def test_options_freezing_and_cpp_wrapper_set_fusegraphs_fields():
    config = with_compile_args(CompilationConfig(), options={"freezing": True, "cpp_wrapper": False})
    assert config.enable_freezing is True and config.cpp_wrapper is False and config.inductor_options == {}


def test_mode_then_options_and_the_backend_config_unchanged():
    base = CompilationConfig(graph_only=True, inductor_options={"epilogue_fusion": False})
    config = with_compile_args(base, mode="max-autotune-no-cudagraphs",
                               options={"max_autotune": False, "enable_rope": False})
    assert (config.graph_only, config.graph_with_compile, config.inductor) == (False, False, True)
    assert config.inductor_options == {"epilogue_fusion": False, "max_autotune": False,
                                       "coordinate_descent_tuning": True}
    assert config.fusion_patterns.enable_rope is False
    assert base == CompilationConfig(graph_only=True, inductor_options={"epilogue_fusion": False})


@pytest.mark.parametrize("options, error, message", [
    ({"bogus": 1}, ValueError, "options: unknown option 'bogus': not a CompilationConfig field, a FusionPatterns "
                               "field nor an Inductor option (torch._inductor.list_options())"),
    ({"max_autotune": "yes"}, TypeError, "options: Inductor option 'max_autotune' must be a bool, got 'yes' (str)"),
    ({"graph_max_entries": -1}, ValueError, "options['graph_max_entries']: graph_max_entries must be >= 0, got -1"),
    ({"enable_rope": 1}, TypeError, "options['enable_rope']: enable_rope must be a bool, got 1 (int)"),
    ({"post_grad_custom_pre_pass": None}, ValueError, "options: 'post_grad_custom_pre_pass' is set by fusegraph per "
                                                      "graph; fusegraph's fusion pass runs there"),
    ({1: True}, TypeError, "options: names are strings, got 1 (int)"),
])
def test_bad_options_name_the_option(options, error, message):
    with pytest.raises(error) as info:
        with_compile_args(CompilationConfig(), options=options)
    assert str(info.value) == message


def test_bad_options_fail_the_first_call_with_the_message(block):
    with pytest.raises(Exception, match=r"options: unknown option 'bogus'"):
        _run(block, Backend(), options={"bogus": 1})


def test_inductor_options_field_is_validated():
    with pytest.raises(ValueError, match="inductor_options: 'no_such_option' is not an Inductor option"):
        CompilationConfig(inductor_options={"no_such_option": 1})
    with pytest.raises(TypeError, match="inductor_options must be a dict"):
        CompilationConfig(inductor_options=[("max_autotune", True)])
    with pytest.raises(ValueError, match="inductor_options: 'freezing' is set by fusegraph per graph; use "
                                         "enable_freezing"):
        CompilationConfig(inductor_options={"freezing": True})
