"""The CUDA driver (torch.cuda.CUDAGraph in a shared pool, copy stream, no host sync on replay).
Skipped without CUDA; run on a GPU machine."""
import types

import pytest
import torch

from fusegraph.graph import GraphRunner

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.fixture(autouse=True)
def _cuda_graphs_on(monkeypatch):
    """These test the CUDA driver itself, off by default until a GPU run passes (drivers.CUDA_GRAPHS_ENV)."""
    monkeypatch.setenv("FUSEGRAPH_CUDA_GRAPHS", "1")


def fn(x, w):
    return torch.tanh(x @ w) + x


def test_cuda_graph_replays_and_matches_eager():
    w = torch.randn(64, 64, device="cuda")
    r = GraphRunner(fn)
    for _ in range(3):
        x = torch.randn(16, 64, device="cuda")
        torch.testing.assert_close(r(x, w), fn(x, w))
    assert r.stats.graphs_captured == 1 and r.stats.replays == 3
    assert r.stats.graph_memory_bytes > 0


def test_cuda_lazy_capture_is_zero_copy_for_the_same_tensors():
    x, w = torch.randn(16, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    r = GraphRunner(fn, types.SimpleNamespace(graph_lazy_capture=True))
    r(x, w)
    r(x, w)
    assert r.stats.inputs_skipped == 4 and r.stats.inputs_copied == 0


def test_cuda_replay_does_not_synchronize_the_host():
    x, w = torch.randn(16, 64, device="cuda"), torch.randn(64, 64, device="cuda")
    r = GraphRunner(fn)
    r(x, w)
    torch.cuda.set_sync_debug_mode("error")
    try:
        r(torch.randn(16, 64, device="cuda"), w)
    finally:
        torch.cuda.set_sync_debug_mode("default")
