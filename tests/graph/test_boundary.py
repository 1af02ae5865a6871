"""The C++/Python boundary of the graph runtime: GraphCache.call's typed result, and one counter source (the
C++ counters a Stats shares with the caches of the runners reporting into it)."""
import copy
import pickle
import threading

import numpy as np
import pytest
import torch

from fusegraph import CompilationConfig, Stats, _C
from fusegraph.graph import GraphRunner

Status = _C.graph.LookupStatus


def host(**kw):
    return CompilationConfig(device_graph="host", **kw)


def test_cache_call_answers_with_a_typed_result():
    stats = Stats()
    cache = _C.graph.GraphCache(counters=stats.counters)
    x = torch.randn(3)
    r = cache.call([x])
    assert r.status is Status.Miss and r.outputs is None and r.user is None and r.drifted == ()
    exe = _C.graph.PyExecutable(lambda ts: [ts[0] * 2], [], binds_inputs=True, outputs_are_fresh=True)
    cache.insert([x], [], exe, 64, user="info")
    r = cache.call([torch.randn(3)])
    assert r.status is Status.Replayed and r.user == "info" and len(r.outputs) == 1
    assert (r.copied, r.skipped) == (0, 1)
    with pytest.raises(AttributeError):
        r.status = Status.Miss
    assert (stats.graphs_captured, stats.replays, stats.inputs_skipped, stats.graph_memory_bytes) == (1, 1, 1, 64)
    # not keyed: the call never reaches the cache
    assert cache.call([x, "s"], tensors_only=True).status is Status.NotFlat
    r = cache.call([x, np.zeros(2)])
    assert r.status is Status.Unkeyable and "argument 1 is a ndarray" in r.failure
    assert cache.call([torch.randn(3, requires_grad=True)]).status is Status.SpecialTensor
    cache.record_failure([torch.randn(5)], "boom")
    r = cache.call([torch.randn(5)])
    assert (r.status, r.failure, stats.eager_calls) == (Status.Failed, "boom", 1)
    cache.clear()
    assert stats.graph_memory_bytes == 0 and cache.memory_bytes == 0


def test_runners_sharing_a_stats_count_into_one_source():
    stats = Stats()
    w = torch.randn(1024)  # a constant of both graphs: their measured memory
    a = GraphRunner(lambda x: x + w.sum(), host(), stats=stats)
    b = GraphRunner(lambda x: x * w.sum(), host(), stats=stats)
    x = torch.randn(4)
    for _ in range(3):
        a(x)
        b(x)
    assert (stats.graphs_captured, stats.replays, stats.recaptures) == (2, 6, 0)
    assert stats.inputs_skipped == 6 and stats.capture_seconds > 0
    assert stats.graph_memory_bytes == 2 * 4096
    a.clear()
    b.clear()
    assert stats.graph_memory_bytes == 0
    a(torch.randn(2, 2))  # a second signature of a: a recapture
    assert (stats.graphs_captured, stats.recaptures) == (3, 0)  # a's cache was empty after clear


def test_stats_copies_carry_the_values_not_the_sharing():
    stats = Stats()
    r = GraphRunner(lambda x: x - 1, host(), stats=stats)
    r(torch.randn(2))
    r(torch.randn(2))
    stats.add_fallback("why")
    for twin in (copy.copy(stats), copy.deepcopy(stats), pickle.loads(pickle.dumps(stats))):
        assert twin == stats and twin.as_dict() == stats.as_dict() and twin.counters is not stats.counters
        assert (twin.replays, twin.fallbacks) == (2, {"why": 1})
    twin = copy.deepcopy(stats)
    r(torch.randn(2))
    assert (stats.replays, twin.replays) == (3, 2)
    assert Stats(replays=5, fallbacks={"a": 1}).replays == 5
    with pytest.raises(TypeError, match="replayz"):
        Stats(replayz=1)
    with pytest.raises(AttributeError, match="replayz"):
        stats.add(replayz=1)
    assert "replays=3" in repr(stats)


def test_stats_add_is_atomic_across_threads():
    stats = Stats()

    def work():
        for _ in range(2000):
            stats.add(eager_calls=1, capture_seconds=0.5)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert (stats.eager_calls, stats.capture_seconds) == (8000, 4000.0)
