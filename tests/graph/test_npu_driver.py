"""The NPU driver against the CPU stand-in of torch.npu's graph surface (npu_standin.py). Real Ascend
hardware is untested."""
import gc
import logging
import types

import pytest
import torch

from fusegraph.graph import GraphRunner, npu_graph_available


def cfg(**kw):
    return types.SimpleNamespace(device_graph="npu", **kw)


def fn(x, w):
    return torch.tanh(x @ w) + x


def test_detection_needs_npugraph_and_graph(npu, monkeypatch):
    assert npu_graph_available()
    monkeypatch.delattr(npu, "graph")
    assert not npu_graph_available()


def test_replay_reuses_the_graph_and_matches_eager(npu):
    r = GraphRunner(fn, cfg())
    w = torch.randn(8, 8)
    for _ in range(3):
        x = torch.randn(4, 8)
        torch.testing.assert_close(r(x, w), fn(x, w), rtol=0, atol=0)
    assert r.stats.graphs_captured == 1 and r.stats.replays == 3


def test_eager_capture_owns_its_buffers_lazy_shares_the_callers(npu):
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    eager = GraphRunner(fn, cfg(graph_lazy_capture=False))
    eager(x, w)
    eager(x, w)
    # eager capture: static buffers are clones, so the same caller tensors are copied in every time
    assert eager.stats.inputs_skipped == 0 and eager.stats.inputs_copied == 4
    lazy = GraphRunner(fn, cfg(graph_lazy_capture=True))
    lazy(x, w)
    lazy(x, w)
    # lazy capture: static buffers are detach() of the first call's inputs: the same tensors are zero-copy
    assert lazy.stats.inputs_skipped == 4 and lazy.stats.inputs_copied == 0
    x2 = torch.randn(4, 8)
    torch.testing.assert_close(lazy(x2, w), fn(x2, w), rtol=0, atol=0)
    assert lazy.stats.inputs_copied == 1 and lazy.stats.inputs_skipped == 5
    # the copy went into the static buffer, which is the first caller's storage (the seed's lazy rule)
    torch.testing.assert_close(x, x2, rtol=0, atol=0)


def test_zero_copy_skip_needs_same_pointer_and_strides(npu):
    r = GraphRunner(lambda x: x * 2, cfg(graph_lazy_capture=True))
    buf = torch.randn(4, 4)
    r(buf)
    r(buf.view(4, 4))  # same storage, same strides: skipped
    assert r.stats.inputs_skipped == 2 and r.stats.inputs_copied == 0
    torch.testing.assert_close(r(buf.t().contiguous().t()), buf * 2, rtol=0, atol=0)  # other strides: copied
    assert r.stats.inputs_copied == 1


def test_copies_run_on_a_copy_stream_ordered_by_events(npu):
    r = GraphRunner(fn, cfg())
    w = torch.randn(8, 8)
    r(torch.randn(4, 8), w)
    compute = npu.current_stream()
    before = len(compute.waited)
    r(torch.randn(4, 8), w)
    assert len(compute.waited) == before + 1  # the compute stream waits on the copy stream's event
    copy_stream = compute.waited[-1].recorded_on
    assert copy_stream is not compute and copy_stream.waited  # which waited on the compute stream first


def test_safe_output_mode_clones_and_off_returns_the_graph_buffer(npu):
    x = torch.randn(4, 8)
    w = torch.randn(8, 8)
    safe = GraphRunner(fn, cfg())
    out = safe(x, w)
    kept = out.clone()
    later = safe(x * 2, w)  # a later replay does not overwrite an output handed out before
    assert later.data_ptr() != out.data_ptr()
    torch.testing.assert_close(out, kept, rtol=0, atol=0)
    out.add_(100)  # nor does the caller writing it change the next replay
    torch.testing.assert_close(safe(x, w), fn(x, w), rtol=0, atol=0)
    raw = GraphRunner(fn, cfg(safe_output_mode=False))
    a = raw(x, w)
    b = raw(x * 2, w)
    assert a.data_ptr() == b.data_ptr()  # overwritten by the next replay, as documented
    torch.testing.assert_close(a, fn(x * 2, w), rtol=0, atol=0)


def test_gc_and_empty_cache_are_noops_during_capture(npu, monkeypatch):
    calls = {"gc": 0, "empty_cache": 0}

    def count(name):
        def f(*a, **k):
            calls[name] += 1
        return f

    monkeypatch.setattr(gc, "collect", count("gc"))
    monkeypatch.setattr(npu, "empty_cache", count("empty_cache"))
    r = GraphRunner(lambda x: x + 1, cfg())
    r(torch.randn(3))
    assert r.stats.graphs_captured == 1
    assert calls == {"gc": 0, "empty_cache": 0}  # torch.npu.graph's own calls were no-ops
    gc.collect(), npu.empty_cache()  # restored afterwards
    assert calls == {"gc": 1, "empty_cache": 1}


def test_one_pool_per_device_shared_by_entries(npu):
    pools = []
    real = npu.NPUGraph.capture_begin

    def spy(self, pool=None, capture_error_mode="global"):
        pools.append(pool)
        return real(self, pool=pool, capture_error_mode=capture_error_mode)

    npu.NPUGraph.capture_begin = spy
    try:
        a, b = GraphRunner(lambda x: x + 1, cfg()), GraphRunner(lambda x: x * 3, cfg())
        a(torch.randn(2)), a(torch.randn(3)), b(torch.randn(2))
    finally:
        npu.NPUGraph.capture_begin = real
    assert len(pools) == 3 and pools[0] is not None and all(p == pools[0] for p in pools)


def test_memory_measure_and_budget(npu):
    r = GraphRunner(lambda x: x * 2, cfg(graph_memory_budget=3 * 4096))
    for n in (1024, 1025, 1026):
        r(torch.randn(n))
    # each entry owns its static input clone and its output (~8 KiB): the budget keeps one
    assert r.stats.evictions == 2 and r.num_entries == 1


def test_two_threads_share_one_npu_runner(npu):
    import threading

    r = GraphRunner(fn, cfg(graph_max_entries=2))
    w = torch.randn(8, 8)
    errors = []

    def worker(rows):
        try:
            for i in range(30):
                x = torch.randn(rows + i % 3, 8)
                torch.testing.assert_close(r(x, w), fn(x, w), rtol=0, atol=0)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in (2, 6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert r.stats.replays == 60


def test_streams_are_shared_not_created_per_entry(npu, monkeypatch):
    created = []
    real = npu.Stream

    class CountingStream(real):
        def __init__(self, *a, **k):
            super().__init__(*a, **k)
            created.append(self)

    monkeypatch.setattr(npu, "Stream", CountingStream)
    r = GraphRunner(lambda x: x + 1, cfg())
    for n in range(1, 6):
        r(torch.randn(n))
    assert r.stats.graphs_captured == 5
    assert len(created) == 2  # one capture stream and one copy stream for the device


def test_fallback_eager_runs_uncaptured_and_raise_reraises(npu, unfused_runner):
    def fn(x):
        return x * x.sum().item()  # a host sync: not capturable into a device graph

    r = GraphRunner(fn, cfg())
    x = torch.randn(4)
    torch.testing.assert_close(r(x), fn(x), rtol=0, atol=0)
    torch.testing.assert_close(r(x), fn(x), rtol=0, atol=0)
    assert r.num_entries == 0 and r.stats.graphs_captured == 0
    (reason,) = r.stats.fallbacks
    assert "npu capture failed" in reason and ".item()" in reason
    assert r.stats.eager_calls == 2
    strict = GraphRunner(fn, cfg(graph_fallback="raise"))
    with pytest.raises(RuntimeError, match="host synchronisation"):
        strict(x)
    assert strict.num_entries == 0


def test_debug_warns_on_address_drift(caplog, npu, unfused_runner):
    r = GraphRunner(lambda x: x + 1, cfg(graph_lazy_capture=True))
    x = torch.randn(4)
    r(x)
    with caplog.at_level(logging.DEBUG, logger="fusegraph.graph"):
        r(x)
        assert not [m for m in caplog.messages if "captured address" in m]
        r(torch.randn(4))
    assert any("not at the captured address" in m and "static buffer" in m for m in caplog.messages)
    host = GraphRunner(lambda x: x + 1)  # the host graph binds any address: no warning
    host(x)
    caplog.clear()
    with caplog.at_level(logging.DEBUG, logger="fusegraph.graph"):
        host(torch.randn(4))
    assert not [m for m in caplog.messages if "captured address" in m]


def test_a_stride0_first_input_on_the_stream_driver(npu):
    r = GraphRunner(lambda x: x * 2, cfg(graph_lazy_capture=True))
    e = torch.randn(1, 4).expand(3, 4)
    torch.testing.assert_close(r(e), e * 2, rtol=0, atol=0)
    y = torch.randn(3, 4)
    torch.testing.assert_close(r(y), y * 2, rtol=0, atol=0)
    assert r.stats.graphs_captured == 1 and r.stats.replays == 2 and not r.stats.fallbacks


def test_static_inputs_are_replayed_in_place_and_keyed_by_address(npu):
    """Static inputs (a graph's parameters): even under eager capture the static buffer is the caller's own tensor,
    never a copy, so an in-place edit is read by the next replay; another tensor at that position is a capture of
    its own (its address is in the signature), and the first tensor is never written."""
    r = GraphRunner(fn, cfg(graph_lazy_capture=False), static_inputs=(1,), static_by_address=True)
    x, w = torch.randn(4, 8), torch.randn(8, 8)
    torch.testing.assert_close(r(x, w), fn(x, w), rtol=0, atol=0)
    r(torch.randn(4, 8), w)
    assert r.stats.graphs_captured == 1 and r.stats.inputs_skipped == 2  # w, on both replays
    w.mul_(0.5)  # read by the next replay
    x = torch.randn(4, 8)
    torch.testing.assert_close(r(x, w), fn(x, w), rtol=0, atol=0)
    w_before = w.clone()
    w2 = torch.randn(8, 8)
    torch.testing.assert_close(r(x, w2), fn(x, w2), rtol=0, atol=0)
    assert r.stats.graphs_captured == 2
    torch.testing.assert_close(w, w_before, rtol=0, atol=0)  # never a copy target
    torch.testing.assert_close(r(x, w), fn(x, w), rtol=0, atol=0)  # both captures serve
    assert r.stats.graphs_captured == 2


def test_graph_route_holds_parameters_where_they_live(npu):
    """The backend's graph route on a static-buffer driver: the parameters are static inputs (never copied, even
    with eager capture), an in-place edit is read by the next replay, a replaced parameter is captured anew and the
    old one is left as it was; every call equals eager."""
    from fusegraph import Backend, CompilationConfig

    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 8)).eval()
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(graph_with_compile=True, device_graph="npu", graph_lazy_capture=False))
    f = torch.compile(m, backend=backend)
    with torch.no_grad():
        for _ in range(2):
            x = torch.randn(3, 8)
            torch.testing.assert_close(f(x), m(x), rtol=1e-5, atol=1e-5)
        assert backend.stats.inputs_copied <= 2 and backend.stats.inputs_skipped >= 4  # x copied, 4 weights not
        m[0].weight.mul_(2)
        torch.testing.assert_close(f(x), m(x), rtol=1e-5, atol=1e-5)
        captured = backend.stats.graphs_captured
        old = m[2].weight
        old_values = old.detach().clone()
        m[2].weight = torch.nn.Parameter(torch.randn(8, 16))
        torch.testing.assert_close(f(x), m(x), rtol=1e-5, atol=1e-5)
        assert backend.stats.graphs_captured == captured + 1
        torch.testing.assert_close(old.detach(), old_values, rtol=0, atol=0)


def test_one_tensor_passed_twice_gets_two_buffers_under_lazy_capture(npu, unfused_runner):
    def f(a, b):
        return a * 10 + b

    r = GraphRunner(f, cfg(graph_lazy_capture=True))
    x = torch.randn(3)
    torch.testing.assert_close(r(x, x), f(x, x), rtol=0, atol=0)
    a, b = torch.full((3,), 2.0), torch.full((3,), 3.0)
    torch.testing.assert_close(r(a, b), f(a, b), rtol=0, atol=0)  # was 33: both copies went into one storage


def test_a_function_writing_its_input_runs_uncaptured(npu, unfused_runner):
    def f(x):
        x.mul_(2)
        return x + 1

    r = GraphRunner(f, cfg())
    a = torch.ones(3)
    torch.testing.assert_close(r(a), torch.full((3,), 3.0), rtol=0, atol=0)
    torch.testing.assert_close(a, torch.full((3,), 2.0), rtol=0, atol=0)  # the caller's tensor, written once
    b = torch.ones(3)
    r(b)
    torch.testing.assert_close(b, torch.full((3,), 2.0), rtol=0, atol=0)
    assert r.num_entries == 0
    assert any("writes its input(s) [0] in place" in k for k in r.stats.fallbacks), r.stats.fallbacks


def test_captured_under_inference_mode_replays_outside_it(npu, unfused_runner):
    r = GraphRunner(fn, cfg())
    w = torch.randn(8, 8)
    with torch.inference_mode():
        x = torch.randn(4, 8)
        torch.testing.assert_close(r(x, w), fn(x, w), rtol=0, atol=0)
    with torch.no_grad():
        x = torch.randn(4, 8)
        torch.testing.assert_close(r(x, w), fn(x, w), rtol=0, atol=0)
    assert r.stats.graphs_captured == 1 and not r.stats.fallbacks


def test_an_input_on_another_device_is_refused_at_capture(npu):
    """A CPU scalar tensor among device inputs: the graph would keep the value read at capture (cudagraph trees
    skip such graphs too). The driver refuses; the runner then runs that signature uncaptured."""
    from fusegraph.graph.drivers import NpuDriver
    from fusegraph.graph.options import GraphOptions

    with pytest.raises(RuntimeError, match=r"inputs on \['meta'\] besides cpu"):
        NpuDriver().capture(lambda a, b: [a], [torch.randn(4), torch.empty((), device="meta")],
                            GraphOptions.from_config(None))


class _Counter(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(3))

    def forward(self, x):
        self.acc.add_(x)
        return self.acc * 2


@pytest.mark.parametrize("lazy", [False, True])
def test_module_state_written_once_per_call_on_a_stream_driver(npu, unfused_runner, lazy):
    """The fusion trace and the warm-up runs write the module's buffer for real: those writes are undone, so the
    state follows eager call by call (the capture itself records without running on a real device)."""
    m, e = _Counter(), _Counter()
    r = GraphRunner(m, cfg(graph_lazy_capture=lazy, graph_warmup_runs=2))
    for _ in range(3):
        x = torch.randn(3)
        torch.testing.assert_close(r(x), e(x), rtol=0, atol=0)
        torch.testing.assert_close(m.acc, e.acc, rtol=0, atol=0)
    assert r.stats.graphs_captured == 1


def test_lazy_capture_of_a_function_writing_its_input_writes_it_once(npu, unfused_runner):
    def f(x):
        x.mul_(2)
        return x + 1

    r = GraphRunner(f, cfg(graph_lazy_capture=True, graph_warmup_runs=2))
    a = torch.ones(3)
    torch.testing.assert_close(r(a), torch.full((3,), 3.0), rtol=0, atol=0)
    torch.testing.assert_close(a, torch.full((3,), 2.0), rtol=0, atol=0)  # once (the warm-ups' writes undone)
    assert r.num_entries == 0


def test_input_copies_wait_on_the_graphs_device_stream(npu):
    from fusegraph.graph.drivers import _CopyStream

    asked = []
    real = npu.current_stream
    npu_current = lambda device=None: (asked.append(device), real(device))[1]  # noqa: E731
    try:
        npu.current_stream = npu_current
        _CopyStream(npu, "npu:1")([[torch.zeros(2)]], [[torch.ones(2)]])
    finally:
        npu.current_stream = real
    assert asked == ["npu:1"]
