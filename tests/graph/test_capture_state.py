"""What a capturing call leaves behind, as eagerly (GUIDE §1.4): module state written once per call (running
statistics included), the random generators where eager leaves them, module arguments not kept alive, the modules
a function reaches through globals and closure objects guarded, and an entry's memory without the weights it
only reads."""
import copy
import gc
import types
import weakref

import pytest
import torch

from fusegraph.graph import GraphRunner
from fusegraph.graph.drivers import StateWrites


def cfg(**kw):
    return types.SimpleNamespace(**kw)


# ---- 1. state an op writes without a schema annotation ----

def test_batch_norm_running_statistics_are_written_once_per_call():
    torch.manual_seed(0)
    eager = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4)).train()
    model = copy.deepcopy(eager)
    r = GraphRunner(model)
    with torch.no_grad():
        for _ in range(3):  # the capturing call, then replays
            x = torch.randn(6, 4)
            torch.testing.assert_close(r(x), eager(x))
            bn, bn_eager = model[1], eager[1]
            torch.testing.assert_close(bn.running_mean, bn_eager.running_mean, rtol=0, atol=1e-6)
            torch.testing.assert_close(bn.running_var, bn_eager.running_var, rtol=0, atol=1e-6)
            assert bn.num_batches_tracked.item() == bn_eager.num_batches_tracked.item()
    assert r.stats.graphs_captured == 1


@pytest.mark.parametrize("op", ["native_batch_norm", "cudnn_batch_norm"])
def test_state_writes_undoes_unannotated_running_statistics_writes(op):
    # native_batch_norm's running_mean/running_var carry no (a!) annotation, yet training mode writes them
    schema = getattr(torch.ops.aten, op).default._schema
    assert not schema.is_mutable
    mean, var = torch.zeros(3), torch.ones(3)
    with torch.no_grad(), StateWrites([mean, var]):
        torch.ops.aten.native_batch_norm(torch.randn(5, 3) + 4, None, None, mean, var, True, 0.5, 1e-5)
        assert mean.abs().sum() > 0  # written meanwhile
    assert torch.equal(mean, torch.zeros(3)) and torch.equal(var, torch.ones(3))


def test_state_writes_leaves_evaluation_mode_batch_norm_alone():
    mean, var = torch.zeros(3), torch.ones(3)
    writes = StateWrites([mean, var])
    with torch.no_grad(), writes:
        torch.ops.aten.native_batch_norm(torch.randn(5, 3), None, None, mean, var, False, 0.5, 1e-5)
        assert not writes._saved  # nothing written, nothing copied


# ---- 2. random numbers ----

def _noisy(x):
    return x + torch.rand(x.shape)


def test_capturing_call_draws_like_eager_and_leaves_the_generator_as_eager_does():
    x = torch.zeros(4)
    with torch.no_grad():
        torch.manual_seed(0)
        expected, expected_next = _noisy(x), torch.rand(2)
        r = GraphRunner(_noisy)
        torch.manual_seed(0)
        first, first_next = r(x), torch.rand(2)  # the capturing call
        torch.manual_seed(0)
        replay, replay_next = r(x), torch.rand(2)
        assert not torch.equal(r(x), r(x))  # a replay draws anew
    assert r.stats.graphs_captured == 1
    assert torch.equal(first, expected) and torch.equal(first_next, expected_next)
    assert torch.equal(replay, expected) and torch.equal(replay_next, expected_next)


def test_capturing_call_of_a_dropout_module_draws_like_eager():
    m = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).train()
    x = torch.randn(4, 8)
    r = GraphRunner(m)
    with torch.no_grad():
        torch.manual_seed(1)
        expected = m(x)
        torch.manual_seed(1)
        assert torch.equal(r(x), expected)


@pytest.mark.parametrize("lazy", [False, True])
def test_graph_route_first_call_draws_like_eager(lazy):
    from fusegraph import Backend, CompilationConfig

    torch._dynamo.reset()
    compiled = torch.compile(_noisy, backend=Backend(CompilationConfig(graph_with_compile=True,
                                                                       graph_lazy_capture=lazy)))
    x = torch.zeros(4)
    try:
        with torch.no_grad():
            torch.manual_seed(0)
            expected, expected_next = _noisy(x), torch.rand(2)
            torch.manual_seed(0)
            first, first_next = compiled(x), torch.rand(2)
    finally:
        torch._dynamo.reset()
    assert torch.equal(first, expected) and torch.equal(first_next, expected_next)


# ---- 3. module arguments ----

def _apply(x, layer):
    return layer(x) * 2


def test_module_arguments_of_evicted_entries_are_not_kept_alive():
    r = GraphRunner(_apply, cfg(graph_max_entries=2))
    refs = []
    with torch.no_grad():
        for _ in range(8):
            layer = torch.nn.Linear(16, 16)
            r(torch.randn(2, 16), layer)
            refs.append(weakref.ref(layer))
            del layer
    gc.collect()
    assert r.num_entries == 2
    # the two resident entries hold theirs; the guards hold none (nor the cache's first signature: only
    # graph_recapture=False keeps it)
    assert [ref() is not None for ref in refs[:-2]] == [False] * 6
    assert len(r._arg_guards) == 2
    r.clear()
    gc.collect()
    assert r._arg_guards == {}
    assert sum(ref() is not None for ref in refs) == 0


def test_module_argument_guard_still_drops_graphs_after_a_replaced_weight():
    layer = torch.nn.Linear(4, 4)
    r = GraphRunner(_apply)
    x = torch.randn(2, 4)
    with torch.no_grad():
        r(x, layer)
        layer.weight = torch.nn.Parameter(torch.randn(4, 4))
        torch.testing.assert_close(r(x, layer), _apply(x, layer), rtol=0, atol=0)
    assert r.stats.weight_invalidations == 1


# ---- 4. modules reached through globals and closure objects ----

lin = torch.nn.Linear(8, 8)
net = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Dropout(0.5)).eval()
pipe = types.SimpleNamespace(transformer=lin, name="pipe")
app = types.SimpleNamespace(pipe=pipe)


def _step(x):
    return lin(x)


def _helper_step(x):  # through a helper function
    return _step(x) + 1


def _chain_step(x):  # two attributes deep
    return app.pipe.transformer(x)


def _dropout_step(x):
    return net(x)


def _closure_over_object():
    holder = types.SimpleNamespace(model=lin)
    return lambda x: holder.model(x)


class _Holder:  # a non-module object whose method the runner wraps
    def __init__(self):
        self.transformer = lin

    def run(self, x):
        return self.transformer(x)


@pytest.mark.parametrize("fn", [_step, _helper_step, _chain_step, lambda x: pipe.transformer(x),
                                _closure_over_object(), _Holder().run],
                         ids=["global", "helper", "chain", "global-object", "closure-object", "method"])
def test_replaced_parameter_of_a_module_reached_by_name_drops_graphs(fn):
    x = torch.randn(4, 8)
    r = GraphRunner(fn)
    old = lin.weight
    try:
        with torch.no_grad():
            r(x)
            lin.weight = torch.nn.Parameter(torch.randn(8, 8))
            torch.testing.assert_close(r(x), fn(x), rtol=0, atol=0)
    finally:
        lin.weight = old
    assert r.stats.weight_invalidations == 1


def test_train_switch_of_a_global_module_drops_graphs():
    x = torch.randn(64, 8)
    r = GraphRunner(_dropout_step)
    try:
        with torch.no_grad():
            r(x)
            net.train()
            assert (r(x) == 0).float().mean() > 0.2  # dropout is on now
    finally:
        net.eval()
    assert r.stats.weight_invalidations == 1


def test_rebinding_the_global_or_the_attribute_drops_graphs():
    global lin
    x = torch.randn(4, 8)
    old = lin
    r, chain = GraphRunner(_step), GraphRunner(_chain_step)
    try:
        with torch.no_grad():
            r(x)
            lin = torch.nn.Linear(8, 8)
            torch.testing.assert_close(r(x), lin(x), rtol=0, atol=0)
            chain(x)
            pipe.transformer = torch.nn.Linear(8, 8)
            torch.testing.assert_close(chain(x), pipe.transformer(x), rtol=0, atol=0)
    finally:
        lin = pipe.transformer = old


# ---- 5. an entry's memory ----

def test_module_weights_are_not_an_entrys_memory():
    m = torch.nn.Linear(256, 256).eval()  # 257 KiB of weights, read in place by every entry
    r = GraphRunner(m, cfg(graph_memory_budget=300 << 10))
    with torch.no_grad():
        for b in (1, 2, 3, 4):
            r(torch.randn(b, 256))
    assert r.num_entries == 4 and r.stats.evictions == 0
    assert r.stats.graph_memory_bytes == 0


def test_constants_an_entry_owns_are_still_its_memory():
    m = torch.nn.Linear(4, 4)
    table = torch.randn(1024)  # a closure tensor: a constant of the graph, not module state
    r = GraphRunner(lambda x: m(x) + table[: x.shape[-1]].sum())
    with torch.no_grad():
        r(torch.randn(2, 4))
    assert r.stats.graph_memory_bytes == 4096


def test_capture_of_a_function_that_draws_nothing_leaves_other_threads_draws_alone():
    """The generators are put back only when the captured graph draws: a capture of a deterministic function while
    another thread draws from the global generator must not rewind it (that thread would see its numbers again)."""
    import threading
    import time

    draws, stop = [], threading.Event()

    def drawer():
        while not stop.is_set():
            draws.append(torch.rand(1, dtype=torch.float64).item())
            time.sleep(0)

    t = threading.Thread(target=drawer, daemon=True)
    t.start()
    try:
        time.sleep(0.05)
        with torch.no_grad():
            for n in range(5):  # five captures
                GraphRunner(lambda x: torch.nn.functional.gelu(x, approximate="tanh") * 2)(torch.randn(4 + n, 64))
        time.sleep(0.05)
    finally:
        stop.set()
        t.join()
    assert len(draws) > 100 and len(set(draws)) == len(draws)


def test_draws_random_reads_the_graph():
    from fusegraph.graph.runner import _draws_random
    from torch.fx.experimental.proxy_tensor import make_fx

    x = torch.randn(3)
    assert not _draws_random(make_fx(lambda t: t * 2)(x))
    assert _draws_random(make_fx(lambda t: t + torch.rand(3))(x))
    assert _draws_random(make_fx(lambda t: torch.nn.functional.dropout(t, 0.5, training=True))(x))
    assert _draws_random(None)  # no graph to tell: restore


_LAYERS = [torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)]


class _Holder:
    def __init__(self):
        self.blocks = [torch.nn.Linear(8, 8)]


_HOLDER = _Holder()
_ENC = torch.nn.Linear(8, 8)
_ENCODE = _ENC.forward  # a bound method held as a global


def _list_step(x):
    for layer in _LAYERS:
        x = layer(x)
    return x


def _attr_list_step(x):
    return _HOLDER.blocks[0](x)


def _bound_step(x):
    return _ENCODE(x) + 1


@pytest.mark.parametrize("case", ["global list item", "list attribute", "global bound method"])
def test_modules_in_lists_and_behind_bound_methods_are_guarded(case):
    fn = {"global list item": _list_step, "list attribute": _attr_list_step, "global bound method": _bound_step}[case]
    x = torch.randn(4, 8)
    r = GraphRunner(fn)
    with torch.no_grad():
        r(x)
        r(x)
        assert r.stats.weight_invalidations == 0  # steady: no spurious drop
        if case == "global list item":
            _LAYERS[0] = torch.nn.Linear(8, 8)
        elif case == "list attribute":
            _HOLDER.blocks[0].weight = torch.nn.Parameter(torch.randn(8, 8))
        else:
            _ENC.weight = torch.nn.Parameter(torch.randn(8, 8))
        torch.testing.assert_close(r(x), fn(x), rtol=0, atol=0)
    assert r.stats.weight_invalidations == 1
