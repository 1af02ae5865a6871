"""Pass manager (fusegraph.fusion.passes): order, caching per option set, fixpoint, redundant-node pass."""
import torch
import torch.nn.functional as F
from torch._inductor.decomposition import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx

from fusegraph import CompilationConfig, FusionPatterns, Stats
from fusegraph.fusion import FAMILY_NAMES as FAMILIES, fuse_graph
from fusegraph.fusion import passes


def aten_graph(fn, *inputs):
    """The graph as the backend sees it: Inductor's decompositions, fake-tensor metadata on every node."""
    return make_fx(fn, select_decomp_table(), tracing_mode="fake")(*inputs)


def ops_of(gm):
    return [str(n.target) for n in gm.graph.nodes if n.op == "call_function"]


def test_family_order_puts_supersets_first():
    assert FAMILIES == ("adaln", "rope", "rms_norm", "adaln_rms", "adaln_noshift", "gelu", "mul_add", "kv_attention",
                        "gemv", "linear")


def test_pattern_pass_cached_per_relevant_options():
    tanh, sigmoid = FusionPatterns(), FusionPatterns(gelu_approximation="sigmoid")
    assert passes.pattern_pass("gelu", tanh) is passes.pattern_pass("gelu", FusionPatterns(enable_rope=False))
    assert passes.pattern_pass("gelu", tanh) is not passes.pattern_pass("gelu", sigmoid)
    assert passes.pattern_pass("mul_add", tanh) is passes.pattern_pass("mul_add", sigmoid)  # option irrelevant


def test_fuse_graph_counts_and_stats():
    def fn(x, y, gate):
        h = F.gelu(x, approximate="tanh")
        return y + gate * h

    gm = aten_graph(fn, torch.randn(4, 8), torch.randn(4, 8), torch.randn(1, 8))
    stats = Stats()
    counts = fuse_graph(gm, CompilationConfig(), stats=stats)
    assert counts == {"adaln": 0, "rope": 0, "rms_norm": 0, "adaln_rms": 0, "adaln_noshift": 0, "gelu": 1,
                      "mul_add": 1, "kv_attention": 0, "gemv": 0, "linear": 0}
    assert stats.patterns["gelu"] == 1 and stats.patterns["mul_add"] == 1
    assert ops_of(gm) == ["fusegraph.gelu_tanh.default", "fusegraph.mul_add.default"]
    x, y, g = torch.randn(4, 8), torch.randn(4, 8), torch.randn(1, 8)
    torch.testing.assert_close(gm(x, y, g), fn(x, y, g))


def test_fuse_graph_respects_disabled_families():
    gm = aten_graph(lambda x: F.gelu(x, approximate="tanh"), torch.randn(4, 8))
    counts = fuse_graph(gm, FusionPatterns(enable_fast_gelu=False))
    assert counts["gelu"] == 0 and "aten.tanh.default" in ops_of(gm)


def test_redundant_pass_drops_noop_clone_view_and_single_piece_split():
    def fn(x):
        a = x * 2
        b = a.clone()
        c = b.view(b.shape)
        (d,) = torch.split(c, c.shape[-1], dim=-1)
        return d + 1

    gm = aten_graph(fn, torch.randn(4, 8))
    before = ops_of(gm)
    assert "aten.clone.default" in before and "aten.split.Tensor" in before
    removed = passes.remove_redundant_nodes(gm.graph)
    gm.recompile()
    after = ops_of(gm)
    assert removed >= 3
    assert after == ["aten.mul.Tensor", "aten.add.Tensor"]
    x = torch.randn(4, 8)
    torch.testing.assert_close(gm(x), fn(x))


def test_redundant_pass_keeps_layout_changing_clone_and_output_aliasing():
    def fn(x):
        t = x.t()
        c = t.contiguous()  # a real copy: changes strides
        return c.view(-1), x.clone()  # returning a clone of an input must stay a new tensor

    gm = aten_graph(fn, torch.randn(4, 8))
    passes.remove_redundant_nodes(gm.graph)
    gm.recompile()
    x = torch.randn(4, 8)
    flat, copy = gm(x)
    torch.testing.assert_close(flat, x.t().reshape(-1))
    assert copy.data_ptr() != x.data_ptr()
