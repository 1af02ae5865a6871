"""GraphRunner on CPU through the C++ host graph: entries per signature, eviction, fallbacks, outputs,
threads, debug warnings (SPEC §4)."""
import threading
import types

import pytest
import torch
import torch.nn.functional as F

from fusegraph.graph import GraphRunner, compile_graph_route

pytestmark = pytest.mark.usefixtures("unfused_runner")


def cfg(**kw):
    return types.SimpleNamespace(**kw)


def block_fn(x, w):
    y = F.layer_norm(x, (x.shape[-1],))
    a, b = y.chunk(2, dim=-1)
    return torch.relu(a) * b + w


def test_same_signature_reuses_its_entry():
    r = GraphRunner(block_fn)
    w = torch.randn(4)
    for _ in range(3):
        x = torch.randn(3, 8)
        torch.testing.assert_close(r(x, w), block_fn(x, w), rtol=0, atol=0)
    assert r.stats.graphs_captured == 1
    assert r.stats.replays == 3
    assert r.num_entries == 1


def test_new_shape_captures_a_new_entry():
    r = GraphRunner(block_fn)
    w = torch.randn(4)
    r(torch.randn(3, 8), w)
    x = torch.randn(5, 8)
    torch.testing.assert_close(r(x, w), block_fn(x, w), rtol=0, atol=0)
    assert r.stats.graphs_captured == 2
    assert r.stats.recaptures == 1
    assert r.num_entries == 2


def test_dtype_change_captures():
    r = GraphRunner(block_fn)
    r(torch.randn(3, 8), torch.randn(4))
    x, w = torch.randn(3, 8, dtype=torch.float64), torch.randn(4, dtype=torch.float64)
    out = r(x, w)
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, block_fn(x, w), rtol=0, atol=0)
    assert r.stats.graphs_captured == 2


def test_dtype_change_raises_without_recapture():
    r = GraphRunner(block_fn, cfg(graph_recapture=False))
    r(torch.randn(3, 8), torch.randn(4))
    with pytest.raises(RuntimeError) as e:
        r(torch.randn(3, 8), torch.randn(4, dtype=torch.float64))
    msg = str(e.value)
    assert "fusegraph: graph input mismatch at position 1: captured tensor(shape=[4], dtype=Float" in msg
    assert "got tensor(shape=[4], dtype=Double" in msg
    assert r.stats.graphs_captured == 1


def test_non_tensor_arguments_are_keyed_by_value():
    r = GraphRunner(lambda x, scale: x * scale)
    x = torch.randn(4)
    torch.testing.assert_close(r(x, 2.0), x * 2.0, rtol=0, atol=0)
    torch.testing.assert_close(r(x, 3.0), x * 3.0, rtol=0, atol=0)
    torch.testing.assert_close(r(x, scale=3.0), x * 3.0, rtol=0, atol=0)  # another argument structure
    assert r.stats.graphs_captured == 3


def _shapes_resident(r):
    return r.entry_ids()


@pytest.mark.parametrize("policy", ["fifo", "lru"])
def test_eviction_order(policy):
    r = GraphRunner(lambda x: x.sin(), cfg(graph_max_entries=2, graph_eviction=policy))
    a, b, c = torch.randn(1), torch.randn(2), torch.randn(3)
    r(a), r(b)
    ids = r.entry_ids()
    r(a)  # a hit: LRU makes a the most recent, FIFO ignores it
    r(c)
    assert r.stats.evictions == 1
    assert r.num_entries == 2
    kept = r.entry_ids()
    assert kept[:1] == ([ids[1]] if policy == "fifo" else [ids[0]])
    captured = r.stats.graphs_captured
    r(a if policy == "lru" else b)  # still resident: no capture
    assert r.stats.graphs_captured == captured


def test_memory_budget_evicts_by_measured_memory():
    # constants held by the graph are its measured memory: 4 KiB per entry here
    weights = {n: torch.randn(1024) for n in (1, 2, 3)}
    r = GraphRunner(lambda x: x + weights[x.shape[0]].sum(), cfg(graph_memory_budget=9000))
    for n in (1, 2):
        r(torch.randn(n))
    assert r.stats.graph_memory_bytes == 2 * 4096
    r(torch.randn(3))
    assert r.stats.evictions == 1
    assert r.num_entries == 2
    assert r.stats.graph_memory_bytes == 2 * 4096


def test_caller_mutating_an_output_does_not_change_the_next_replay():
    const = torch.randn(4)
    kept = const.clone()
    r = GraphRunner(lambda x: (x * 2, const))  # the second output is the graph's own constant
    x = torch.randn(4)
    out, c = r(x)
    assert c is not const and c.data_ptr() != const.data_ptr()  # the caller gets a clone (safe_output_mode)
    out.add_(100), c.add_(100)
    out2, c2 = r(x)
    torch.testing.assert_close(out2, x * 2, rtol=0, atol=0)
    torch.testing.assert_close(c2, kept, rtol=0, atol=0)
    torch.testing.assert_close(const, kept, rtol=0, atol=0)


def test_host_graph_binds_inputs_and_copies_only_other_layouts():
    r = GraphRunner(lambda x: x.exp())
    x = torch.randn(4, 6)
    r(x)
    r(torch.randn(4, 6))
    assert r.stats.inputs_skipped == 2 and r.stats.inputs_copied == 0
    t = torch.randn(6, 4).t()  # same signature, other strides: re-laid out for the graph
    torch.testing.assert_close(r(t), t.exp(), rtol=0, atol=0)
    assert r.stats.inputs_copied == 1


def test_unsupported_node_falls_back_to_fx_python_with_reason():
    def fn(x):
        return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    r = GraphRunner(fn)
    x = torch.randn(5)
    torch.testing.assert_close(r(x), fn(x), rtol=0, atol=0)
    torch.testing.assert_close(r(-x.abs()), fn(-x.abs()), rtol=0, atol=0)
    (reason,) = r.stats.fallbacks
    assert reason.startswith("host graph:") and "get_attr" in reason


def test_capture_failure_falls_back_eager_without_an_entry():
    def fn(x):
        if x.shape[0] == 3:
            raise RuntimeError("cannot capture this one")
        return x + 1

    r = GraphRunner(fn)
    r(torch.randn(2))
    with pytest.raises(RuntimeError, match="cannot capture"):
        r(torch.randn(3))  # eager fallback runs fn, which raises the same error uncaptured
    assert r.num_entries == 1
    assert any("cannot capture this one" in k for k in r.stats.fallbacks)


def test_two_threads_share_one_runner():
    r = GraphRunner(block_fn, cfg(graph_max_entries=3))
    w = torch.randn(4)
    errors = []

    def worker(rows):
        try:
            for i in range(40):
                x = torch.randn(rows + i % 3, 8)
                torch.testing.assert_close(r(x, w), block_fn(x, w), rtol=0, atol=0)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=worker, args=(n,)) for n in (2, 7)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert r.stats.replays == 80


def test_warmup_runs_happen_before_capture():
    calls = []

    def fn(x):
        calls.append(1)
        return x + 1

    r = GraphRunner(fn, cfg(graph_warmup_runs=3))
    r(torch.randn(2))
    assert len(calls) == 3 + 1  # 3 warm-up runs + the trace; the replay runs no Python
    r(torch.randn(2))
    assert len(calls) == 4


def test_compile_graph_route_eager_captures_at_compile_time():
    gm = torch.fx.symbolic_trace(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.GELU()))
    x = torch.randn(2, 8)
    with torch.no_grad():  # under grad mode the parameters' gradients would need autograd: not captured
        route = compile_graph_route(gm, [x], cfg(graph_lazy_capture=False), None)
        assert route.stats.graphs_captured == 1
        torch.testing.assert_close(route(x), gm(x), rtol=0, atol=0)
        lazy = compile_graph_route(gm, [x], cfg(graph_lazy_capture=True), None)
        assert lazy.stats.graphs_captured == 0
        lazy(x)
        assert lazy.stats.graphs_captured == 1


def test_bad_config_values_name_the_field():
    with pytest.raises(ValueError, match="graph_eviction"):
        GraphRunner(lambda x: x, cfg(graph_eviction="random"))
    with pytest.raises(ValueError, match="graph_max_entries"):
        GraphRunner(lambda x: x, cfg(graph_max_entries=-1))
    with pytest.raises(TypeError, match="safe_output_mode"):
        GraphRunner(lambda x: x, cfg(safe_output_mode="yes"))


def test_a_function_mutating_its_input_mutates_it_once_per_call():
    def fn(x):
        x.add_(1)
        return x * 2

    r = GraphRunner(fn, cfg(graph_warmup_runs=2))
    x = torch.zeros(3)
    out = r(x)
    torch.testing.assert_close(x, torch.ones(3), rtol=0, atol=0)
    torch.testing.assert_close(out, torch.full((3,), 2.0), rtol=0, atol=0)
    r(x)
    torch.testing.assert_close(x, torch.full((3,), 2.0), rtol=0, atol=0)


def test_device_graph_available_for_the_backend(npu):
    from fusegraph.graph import device_graph_available

    assert device_graph_available("cpu", cfg()) == (True, None)
    assert device_graph_available("cpu", cfg(device_graph="npu")) == (True, None)  # the stand-in
    ok, why = device_graph_available("cpu", cfg(device_graph="none"))
    assert not ok and "none" in why
    if not torch.cuda.is_available():
        ok, why = device_graph_available("cuda", cfg())
        assert not ok and "CUDA" in why


def test_cuda_graphs_need_the_switch_until_a_gpu_run_passes(monkeypatch):
    """Where CUDA exists, the CUDA driver is chosen only with FUSEGRAPH_CUDA_GRAPHS=1 (its first real GPU run
    crashed, docs/BENCHMARKS.md §12); without it the reason says so and names the switch."""
    from fusegraph.graph import drivers

    monkeypatch.setattr(drivers, "cuda_graph_available", lambda: True)
    monkeypatch.delenv("FUSEGRAPH_CUDA_GRAPHS", raising=False)
    driver, why = drivers.select_driver("auto", torch.device("cuda"))
    assert driver is None and "FUSEGRAPH_CUDA_GRAPHS=1" in why and "crashed" in why
    assert drivers.device_graph_available("cuda", cfg()) == (False, why)
    monkeypatch.setenv("FUSEGRAPH_CUDA_GRAPHS", "1")
    driver, why = drivers.select_driver("cuda", torch.device("cuda"))
    assert isinstance(driver, drivers.CudaDriver) and why is None


def test_graph_runner_is_reachable_from_the_package():
    import fusegraph

    assert fusegraph.graph.GraphRunner is GraphRunner


def test_inference_mode_callers_get_inference_tensors_others_mutable_ones():
    r = GraphRunner(block_fn)
    x, w = torch.randn(3, 8), torch.randn(4)
    with torch.inference_mode():
        out = r(x, w)
        torch.testing.assert_close(out, block_fn(x, w), rtol=0, atol=0)
        assert out.is_inference()
    out = r(x, w)
    assert not out.is_inference()
    out.add_(1)  # an ordinary tensor: in-place works outside inference mode


def test_process_defaults_apply_without_a_config():
    """Seed style: CompilationConfig class attributes are the defaults of a GraphRunner made without a config;
    a runner snapshots them when made."""
    from fusegraph import CompilationConfig

    before = CompilationConfig.aclgraph_max_entries
    CompilationConfig.aclgraph_max_entries = 1
    try:
        r = GraphRunner(torch.neg)
    finally:
        CompilationConfig.aclgraph_max_entries = before
    for n in (2, 3, 4):
        r(torch.randn(n))
    assert r.stats.graphs_captured == 3 and r.stats.evictions == 2


def _count_positive(x):
    return x + x.nonzero().shape[0]


def _mask_then_table(x):
    return torch.zeros(x[x > 0].shape[0]) + 1


_IDS = torch.tensor([0, 2])


def _gather(x):
    return x[_IDS] * 2


@pytest.mark.parametrize("fuse", [False, True])
@pytest.mark.parametrize("fn", [_count_positive, _mask_then_table])
def test_a_shape_from_the_inputs_data_runs_uncaptured(fn, fuse):
    """nonzero / a boolean mask: a real-mode trace fixes the data-dependent shape to the captured call's, so a graph
    would return the first call's count for every later input (it did). The signature runs uncaptured, saying why."""
    r = GraphRunner(fn, cfg(graph_only=not fuse))
    with torch.no_grad():
        r(torch.ones(4))
        x = torch.tensor([0.0, 0.0, 1.0, 1.0])
        out = r(x)
    torch.testing.assert_close(out, fn(x), rtol=0, atol=0)
    assert r.num_entries == 0
    assert any("makes a shape or value from the input's data" in k for k in r.stats.fallbacks), r.stats.fallbacks


def test_integer_indexing_is_still_captured():
    r = GraphRunner(_gather)
    with torch.no_grad():
        r(torch.ones(4))
        x = torch.randn(4)
        torch.testing.assert_close(r(x), _gather(x), rtol=0, atol=0)
    assert r.num_entries == 1 and not r.stats.fallbacks


class _Accumulator(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer("acc", torch.zeros(4))
        self.calls = torch.zeros(())  # a tensor attribute, not a buffer

    def forward(self, x):
        self.acc.add_(x)
        self.calls.add_(1)
        return self.acc * 2


@pytest.mark.parametrize("fuse", [False, True])
def test_a_forward_writing_its_module_state_writes_it_once_per_call(fuse):
    """The capture runs fn several times (trace, warm-ups, timed replays): those writes to the module's buffer and
    tensor attribute are undone, so the state and the outputs follow eager call by call (they ran 3 ahead)."""
    m, e = _Accumulator(), _Accumulator()
    r = GraphRunner(m, cfg(graph_only=not fuse, graph_warmup_runs=2))
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(4)
            torch.testing.assert_close(r(x), e(x), rtol=0, atol=0)
            torch.testing.assert_close(m.acc, e.acc, rtol=0, atol=0)
            assert m.calls.item() == e.calls.item()
    assert r.num_entries == 1


def test_train_and_eval_drop_the_captured_graphs():
    class Branchy(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = torch.nn.Identity()

        def forward(self, x):
            return x * 2 if self.inner.training else x * 3

    m = Branchy().eval()
    r = GraphRunner(m)
    x = torch.randn(4)
    with torch.no_grad():
        torch.testing.assert_close(r(x), x * 3)
        m.train()
        torch.testing.assert_close(r(x), x * 2)
        m.eval()
        torch.testing.assert_close(r(x), x * 3)
    assert r.stats.weight_invalidations == 2
