"""GraphRunner fuses before it captures: the backend's passes on the call's trace, switchable by the config."""
import logging

import torch
import torch.nn.functional as F

import fusegraph
from fusegraph.bench.model import DecodeMLP
from fusegraph.graph import GraphRunner
from fusegraph.graph.host import trace_fused


def DecodeLike():
    """3 x [RMSNorm -> matmul 64x64 -> tanh-GELU -> x + 0.5 * h] (the issue's decode-like block, smaller)."""
    return DecodeMLP(layers=3, dim=64)


def test_runner_fuses_every_site_before_capture_and_matches_eager():
    model = DecodeLike()
    for dtype in (torch.float32, torch.bfloat16):
        m = model.to(dtype)
        r = GraphRunner(m)
        with torch.no_grad():
            for _ in range(3):
                x = torch.randn(2, 64, dtype=dtype)
                torch.testing.assert_close(r(x), m(x))
        assert r.stats.patterns["rms_norm"] == 3 and r.stats.patterns["gelu"] == 3
        assert r.stats.patterns["mul_add"] == 3
        assert r.stats.graphs_captured == 1 and r.stats.replays == 3 and not r.stats.fallbacks


def test_replay_equals_the_same_fused_graph_run_uncaptured():
    m = DecodeLike()
    x = torch.randn(2, 64)
    with torch.no_grad():
        graph, counts, _ = trace_fused(lambda t: [m(t)], [x], fusegraph.CompilationConfig().fusion_patterns)
        assert counts["rms_norm"] == 3
        ops = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
        assert ops.count("fusegraph.rms_norm.default") == 3 and ops.count("fusegraph.gelu_tanh.default") == 3
        r = GraphRunner(m)
        r(x)
        x2 = torch.randn(2, 64)
        assert torch.equal(r(x2), graph(x2)[0])


def test_graph_only_and_switched_off_families_capture_the_plain_trace():
    m = DecodeLike()
    x = torch.randn(2, 64)
    with torch.no_grad():
        plain = GraphRunner(m, {"graph_only": True})
        assert torch.equal(plain(x), m(x))  # the same aten ops as eager: bitwise
        assert sum(plain.stats.patterns.values()) == 0
        cfg = fusegraph.CompilationConfig()
        cfg.fusion_patterns.enable_fast_gelu = False
        some = GraphRunner(m, cfg)
        torch.testing.assert_close(some(x), m(x))
        assert some.stats.patterns["gelu"] == 0 and some.stats.patterns["rms_norm"] == 3


def test_input_mutation_is_kept_through_fusion():
    def fn(x, cache):
        cache.mul_(0.5).add_(x)  # an in-place update of an input (a KV cache), then a fused site on it
        return F.rms_norm(cache, (cache.shape[-1],), None, 1e-6)

    r = GraphRunner(fn)
    with torch.no_grad():
        for _ in range(3):
            x, cache = torch.randn(4, 32), torch.randn(4, 32)
            want_cache = cache.clone()
            want = fn(x, want_cache)
            out = r(x, cache)
            torch.testing.assert_close(out, want)
            torch.testing.assert_close(cache, want_cache)  # mutated exactly once
    assert r.stats.patterns["rms_norm"] == 1 and r.stats.graphs_captured == 1


def test_a_failing_fusion_trace_captures_the_plain_function(monkeypatch, caplog):
    """Fusion is an optimisation: when its trace or passes raise, the call is captured unfused and says why."""
    import fusegraph.graph.host as host

    def broken(*args, **kwargs):
        raise RuntimeError("injected: the fusion trace failed")

    monkeypatch.setattr(host, "trace_fused", broken)
    m = DecodeLike()
    r = GraphRunner(m)
    x = torch.randn(3, 64)
    with caplog.at_level(logging.WARNING, logger="fusegraph.graph"), torch.no_grad():
        assert torch.equal(r(x), m(x))  # the plain trace: eager's ops, bitwise
        assert torch.equal(r(x), m(x))
    assert r.stats.graphs_captured == 1 and r.stats.replays == 2
    assert r.stats.fallbacks == {"fusion before capture skipped (RuntimeError: injected: the fusion trace failed)": 1}
    assert any("fusion before capture skipped" in rec.getMessage() for rec in caplog.records)
