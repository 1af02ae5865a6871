"""The per-graph measured choice (fusion_choice="auto"): fusegraph's compile or plain Inductor's, timed on the first
calls, the faster kept, the verdict cached on disk (fusegraph.fusion.measured)."""
import json
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fusegraph
from fusegraph import Backend, CompilationConfig
from fusegraph.fusion import measured


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    """Each test starts with no verdicts, in a cache file of its own."""
    path = tmp_path / "graphs.json"
    monkeypatch.setattr(measured, "cache_path", lambda: str(path))
    measured.forget()
    torch._dynamo.reset()
    yield path
    measured.forget()
    torch._dynamo.reset()


def _sleeper(seconds, tag, calls):
    def fn(*args):
        calls.append(tag)
        time.sleep(seconds)
        return tag
    return fn


@pytest.mark.parametrize("slow", [measured.FUSED, measured.INDUCTOR])
def test_the_faster_compile_wins_after_the_measured_calls(slow):
    calls, verdicts = [], []
    fns = {name: _sleeper(0.004 if name == slow else 0.0, name, calls) for name in (measured.FUSED, measured.INDUCTOR)}
    g = measured.MeasuredGraph(fns[measured.FUSED], fns[measured.INDUCTOR], torch.device("cpu"),
                               lambda *v: verdicts.append(v), graph_id=0)
    outs = [g(1) for _ in range(measured.CALLS)]
    assert outs == calls  # every measured call returns the output of the compile it ran
    assert calls.count(measured.FUSED) == calls.count(measured.INDUCTOR) == measured.WARMUP + measured.ROUNDS
    fast = measured.INDUCTOR if slow == measured.FUSED else measured.FUSED
    assert g.choice == fast and len(verdicts) == 1
    choice, t_fused, t_inductor, why = verdicts[0]
    assert choice == fast and why == ""
    assert (t_fused > t_inductor) == (slow == measured.FUSED) and max(t_fused, t_inductor) >= 0.004
    calls.clear()
    assert [g(1) for _ in range(5)] == [fast] * 5 and calls == [fast] * 5


def test_calls_that_compiled_are_not_timed():
    """A call that compiled (a frozen graph's guard miss on another module instance) is run again later."""
    recompiles = [0]
    calls = []

    def fused(*args):
        calls.append(measured.FUSED)
        if calls.count(measured.FUSED) <= 4:  # the first four fused calls compile: seconds, not a steady time
            recompiles[0] += 1
            time.sleep(0.01)
        return measured.FUSED

    inductor = _sleeper(0.002, measured.INDUCTOR, calls)
    g = measured.MeasuredGraph(fused, inductor, torch.device("cpu"), lambda *v: None, graph_id=0,
                               recompiles=lambda: recompiles[0])
    while g.choice is None:
        g()
    assert g.choice == measured.FUSED  # the slow compiling calls were not counted against it
    assert len(g._times[measured.FUSED]) == len(g._times[measured.INDUCTOR]) == measured.ROUNDS


def test_concurrent_callers_get_a_result_each_and_one_verdict():
    """Calls from other threads while one measures run untimed (fusegraph's compile, or the winner once decided)."""
    import threading

    verdicts, outs = [], []
    calls = []
    g = measured.MeasuredGraph(_sleeper(0.0005, measured.FUSED, calls), _sleeper(0.0, measured.INDUCTOR, calls),
                               torch.device("cpu"), lambda *v: verdicts.append(v), graph_id=0)

    def worker():
        for _ in range(measured.CALLS):
            outs.append(g())

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    while g.choice is None:  # the measuring thread may not have finished the schedule
        outs.append(g())
    assert len(verdicts) == 1 and g.choice == measured.INDUCTOR
    assert set(outs) <= {measured.FUSED, measured.INDUCTOR} and len(outs) >= 4 * measured.CALLS
    assert len(g._times[measured.FUSED]) == len(g._times[measured.INDUCTOR]) == measured.ROUNDS


def test_plain_inductor_failing_at_run_time_keeps_fusegraphs_compile():
    verdicts = []

    def inductor(*args):
        raise RuntimeError("boom")

    g = measured.MeasuredGraph(lambda *a: "fused", inductor, torch.device("cpu"), lambda *v: verdicts.append(v), 0)
    assert [g() for _ in range(4)] == ["fused"] * 4
    assert g.choice == measured.FUSED and "boom" in verdicts[0][3]


class Block(nn.Module):
    def __init__(self, d=64):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return x + 0.5 * F.gelu(self.lin(self.norm(x)), approximate="tanh")


def _model(n=2, d=64):
    model = nn.Sequential(*[Block(d) for _ in range(n)]).eval()
    for p in model.parameters():
        nn.init.normal_(p, std=0.2)
    return model


class _CountPlain:
    """Counts the calls into plain Inductor's compiles (Backend._compile_plain's results)."""

    def __init__(self, monkeypatch):
        self.compiles = 0
        self.calls = 0
        original = Backend._compile_plain

        def compile_plain(backend, gm, example_inputs):
            self.compiles += 1
            fn = original(backend, gm, example_inputs)

            def counted(*args):
                self.calls += 1
                return fn(*args)
            return counted

        monkeypatch.setattr(Backend, "_compile_plain", compile_plain)


def _compiled_calls_match_eager(model, shape, calls: int) -> Backend:
    """``calls`` calls of the model compiled by a default Backend, each on fresh inputs and equal to eager's."""
    backend = Backend()
    fn = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(calls):
            x = torch.randn(*shape)
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
    return backend


def test_backend_measures_once_then_serves_the_verdict_from_disk(_own_cache, monkeypatch):
    plain = _CountPlain(monkeypatch)
    model, x = _model(), torch.randn(7, 64)
    backend = _compiled_calls_match_eager(model, (7, 64), measured.CALLS + 3)
    assert plain.compiles == 1 and plain.calls >= measured.WARMUP + measured.ROUNDS
    assert sum(backend.stats.graph_choices.values()) == 1
    assert sum(backend.stats.patterns.values()) > 0  # the fused compile's sites are counted either way
    (choice, t_fused, t_inductor), = json.loads(_own_cache.read_text()).values()
    assert backend.stats.graph_choices[choice] == 1 and t_fused > 0 and t_inductor > 0

    # A new process (here: a new backend after Dynamo's reset) measures nothing; plain is compiled only if it won.
    measured.forget()
    torch._dynamo.reset()
    plain.compiles = plain.calls = 0
    backend = Backend()
    fn = torch.compile(model, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
        assert backend.stats.graph_choices[choice] == 1  # decided at compile time
        for _ in range(3):
            fn(x)
    assert plain.compiles == (choice == measured.INDUCTOR)
    assert plain.calls == (4 if choice == measured.INDUCTOR else 0)


@pytest.mark.parametrize("choice", [measured.FUSED, measured.INDUCTOR])
def test_a_cached_verdict_picks_the_compile_that_runs(monkeypatch, choice):
    plain = _CountPlain(monkeypatch)
    monkeypatch.setattr(measured, "cached_verdict", lambda key: choice)
    model, x = _model(), torch.randn(5, 64)
    backend = Backend()
    fn = torch.compile(model, backend=backend)
    with torch.no_grad():
        for _ in range(3):
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.graph_choices == {measured.FUSED: int(choice == measured.FUSED),
                                           measured.INDUCTOR: int(choice == measured.INDUCTOR)}
    assert plain.calls == (3 if choice == measured.INDUCTOR else 0)


@pytest.mark.parametrize("config, dynamic, grad", [
    (dict(fusion_choice="model"), False, False),
    (dict(fusion_choice="always"), False, False),
    (dict(inductor=False), False, False),
    (dict(), True, False),  # symbolic shapes: one size would decide for all
    (dict(), False, True),  # autograd graph: nothing fused
])
def test_graphs_not_measured(monkeypatch, config, dynamic, grad):
    plain = _CountPlain(monkeypatch)
    model, x = _model(), torch.randn(6, 64)
    backend = Backend(CompilationConfig(**config))
    fn = torch.compile(model, backend=backend, dynamic=dynamic or None)
    with torch.set_grad_enabled(grad):
        for _ in range(measured.CALLS + 1):
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
    assert plain.compiles == 0
    assert backend.stats.graph_choices == {measured.FUSED: 0, measured.INDUCTOR: 0}


def test_shared_graph_across_module_instances_stays_correct_while_measured():
    """Dynamo reuses one Block graph for every instance (a graph break between): during the measured calls the
    frozen compile re-compiles per instance and the plain one takes each instance's weights as inputs."""

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([Block(32) for _ in range(3)])
            for p in self.parameters():
                nn.init.normal_(p, std=0.3)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
                torch._dynamo.graph_break()
            return x

    backend = _compiled_calls_match_eager(Net().eval(), (3, 32), measured.CALLS + 2)
    assert backend.stats.graphs_compiled == 1
    assert sum(backend.stats.graph_choices.values()) == 1


def test_stats_carry_graph_choices():
    s = fusegraph.Stats()
    s.add_graph_choice(measured.INDUCTOR)
    assert s.as_dict()["graph_choices"] == {measured.FUSED: 0, measured.INDUCTOR: 1}
    assert fusegraph.Stats(**s.as_dict()) == s
