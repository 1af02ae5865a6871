"""Soak: many replays with changing input storages, many captures cycling through shapes with a small
cache: results stay correct and resident memory stops growing."""
import gc
import types

import pytest
import torch


from fusegraph.graph import GraphRunner


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096


def fn(x, w):
    return torch.tanh(x * w) + x.sum(-1, keepdim=True)


def test_ten_thousand_replays_with_changing_storages():
    r = GraphRunner(fn)
    w = torch.randn(64)
    xs = [torch.randn(8, 64) for _ in range(16)]
    for i in range(1000):
        r(xs[i % 16].clone(), w)
    gc.collect()
    base = rss_bytes()
    for i in range(10_000):
        x = xs[i % 16].clone()  # a new storage every call
        out = r(x, w)
        if i % 997 == 0:
            torch.testing.assert_close(out, fn(x, w), rtol=0, atol=0)
    gc.collect()
    assert r.stats.graphs_captured == 1 and r.stats.replays == 11_000
    assert rss_bytes() - base < 8 * 2**20, "resident memory grew during replays"


@pytest.mark.full  # ~60 s
def test_cycling_fifty_shapes_through_four_entries():
    r = GraphRunner(fn, types.SimpleNamespace(graph_max_entries=4, graph_warmup_runs=0))
    w = torch.randn(32)
    samples = []
    for i in range(1000):
        x = torch.randn(1 + i % 50, 32)
        out = r(x, w)
        if i % 37 == 0:
            torch.testing.assert_close(out, fn(x, w), rtol=0, atol=0)
        if i in (300, 999):
            gc.collect()
            samples.append(rss_bytes())
    assert r.num_entries == 4
    assert r.stats.graphs_captured == 1000 and r.stats.evictions == 996
    assert samples[1] - samples[0] < 16 * 2**20, f"resident memory grew by {(samples[1] - samples[0]) / 2**20:.1f} MiB"
