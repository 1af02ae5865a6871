"""kv_attention family: a decode step's SDPA over cat([cache, new]) becomes fusegraph.kv_attention on every route;
prefill-sized queries, masks, causal attention and the switch leave it alone."""
import pytest
import torch
import torch.nn.functional as F

from fusegraph import Backend, CompilationConfig
from fusegraph.bench.decode import DecodeBlock, make_inputs, reference
from fusegraph.graph import GraphRunner
from fusegraph.graph.host import trace_fused

ROUTES = {"default": {}, "aten": dict(inductor=False), "graph_with_compile": dict(graph_with_compile=True)}


def _block(dtype=torch.float32):
    block = DecodeBlock(hidden=64, heads=4, cache_len=9, batch=2, dtype=dtype).eval()
    return block, make_inputs(block, 2, position=9, dtype=dtype)


class CacheAttention(torch.nn.Module):
    """SDPA of ``q`` over a cache and new keys/values, with the variants the family must refuse."""

    def __init__(self, cache_len=6, heads=2, dim=8, mask=False, causal=False):
        super().__init__()
        self.register_buffer("k_cache", torch.randn(1, heads, cache_len, dim))
        self.register_buffer("v_cache", torch.randn(1, heads, cache_len, dim))
        self.mask, self.causal = mask, causal

    def forward(self, q, k, v):
        keys, values = torch.cat([self.k_cache, k], dim=2), torch.cat([self.v_cache, v], dim=2)
        mask = torch.ones(q.shape[2], keys.shape[2], dtype=torch.bool).tril(keys.shape[2] - q.shape[2]) if self.mask \
            else None
        return F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, is_causal=self.causal) * 2.0


def _counts(module, inputs, **opts):
    _, counts, _ = trace_fused(lambda *t: [module(*t)], list(inputs), CompilationConfig(**opts).fusion_patterns)
    return counts


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_decode_block_fuses_and_matches(dtype):
    block, inputs = _block(dtype)
    assert _counts(block, inputs)["kv_attention"] == 1
    with torch.no_grad():
        ref = block(*inputs)
        runner = GraphRunner(block)
        out = runner(*inputs)
        if dtype == torch.float32:
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        else:  # eager rounds to bf16 between its ops too: both against the float64 math, as bench decode checks
            ref64 = reference(block, *inputs)
            err, err_eager = (out.double() - ref64).abs().max(), (ref.double() - ref64).abs().max()
            assert err <= 1.5 * err_eager + 1e-3, (err, err_eager)
    assert runner.stats.patterns["kv_attention"] == 1


@pytest.mark.parametrize("route", ROUTES)
def test_backend_routes(route):
    block, inputs = _block()
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(**ROUTES[route]))
    fn = torch.compile(block, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(fn(*inputs), block(*inputs), rtol=1e-5, atol=1e-5)
    assert backend.stats.patterns["kv_attention"] == 1
    if route == "default":
        assert backend.last_graph_ops["fusegraph.kv_attention.default"] == 1
        assert backend.stats.lowered["kv_attention"] == 0  # no cost table: Inductor has no code of its own for it


@pytest.mark.parametrize("queries, mask, causal, fused", [(1, False, False, 1), (8, False, False, 1),
                                                          (9, False, False, 0), (1, True, False, 0),
                                                          (1, False, True, 0)])
def test_what_is_a_decode_step(queries, mask, causal, fused):
    torch.manual_seed(3)
    module = CacheAttention(mask=mask, causal=causal)
    inputs = [torch.randn(1, 2, queries, 8), torch.randn(1, 2, 1, 8), torch.randn(1, 2, 1, 8)]
    assert _counts(module, inputs)["kv_attention"] == fused
    with torch.no_grad():
        torch.testing.assert_close(GraphRunner(module)(*inputs), module(*inputs), rtol=1e-5, atol=1e-5)


def test_switch_off():
    block, inputs = _block()
    assert _counts(block, inputs, fusion_patterns={"enable_kv_attention": False})["kv_attention"] == 0


def test_explain_reports_an_unfused_decode_step():
    from fusegraph import explain

    block, inputs = _block()
    torch._dynamo.reset()
    report = explain(block, *inputs)
    assert report.counts()["kv_attention"] == {"fused": 1, "unfused": 0}
    torch._dynamo.reset()
    report = explain(block, *inputs, config=CompilationConfig(fusion_patterns={"enable_kv_attention": False}))
    assert report.counts()["kv_attention"]["unfused"] == 1
