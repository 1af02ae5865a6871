"""The C++ host graph: an aten FX graph replayed by callBoxed in C++, bitwise equal to the FX graph's own
Python execution (same kernels, same order)."""
import operator

import pytest
import torch
import torch.nn.functional as F

import fusegraph
from fusegraph.bench.decode import DecodeBlock, make_inputs
from fusegraph.graph import build_host_graph, trace_aten
from fusegraph.graph.host import Unsupported


def assert_bitwise(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and x.shape == y.shape
        assert torch.equal(x, y) or (x.isnan() == y.isnan()).all() and torch.equal(x.nan_to_num(), y.nan_to_num())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_decode_block_is_bitwise_equal_to_the_fx_graph(dtype):
    block = DecodeBlock(hidden=128, heads=4, cache_len=17, batch=2, dtype=dtype).eval()
    x, cos, sin = make_inputs(block, 2, position=17, dtype=dtype)
    gm = trace_aten(lambda *t: [block(*t)], [x, cos, sin])
    hg = build_host_graph(gm)
    assert hg.num_instructions >= 15
    x2 = torch.randn_like(x)  # fresh data, not the traced values
    assert_bitwise(hg.run([x2, cos, sin]), gm(x2, cos, sin))


def test_getitem_on_multi_output_ops_and_list_results():
    def fn(x, w, b):
        out, mean, rstd = torch.ops.aten.native_layer_norm(x, [x.shape[-1]], w, b, 1e-5)
        parts = torch.ops.aten.split.Tensor(out, 3, -1)
        return [parts[0] * rstd, parts[1] + mean, operator.getitem(parts, 2)]

    x, w, b = torch.randn(4, 9), torch.randn(9), torch.randn(9)
    gm = trace_aten(fn, [x, w, b])
    targets = [n.target for n in gm.graph.nodes if n.op == "call_function"]
    assert operator.getitem in targets
    hg = build_host_graph(gm)
    assert_bitwise(hg.run([x, w, b]), gm(x, w, b))


def test_list_arguments_mixing_values_and_constants():
    def fn(x, i):
        return [torch.cat([x, x * 2], dim=0), x[i], torch.stack([x, x], 1)]

    x, i = torch.randn(5, 3), torch.tensor([4, 0, 2])
    gm = trace_aten(fn, [x, i])
    assert_bitwise(build_host_graph(gm).run([x, i]), gm(x, i))


def test_fusegraph_ops_run_in_the_host_graph():
    def fn(x):
        return [fusegraph.ops.gelu_tanh(x) + 1]

    x = torch.randn(3, 33)
    gm = trace_aten(fn, [x])
    assert any(str(n.target).startswith("fusegraph.") for n in gm.graph.nodes)
    out = build_host_graph(gm).run([x])
    assert_bitwise(out, gm(x))
    torch.testing.assert_close(out[0], F.gelu(x, approximate="tanh") + 1)


def test_python_callables_are_unsupported_with_a_reason():
    def py_helper(t):
        return t * 2

    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output([g.call_function(py_helper, (x,))])  # a Python callable
    with pytest.raises(Unsupported, match="py_helper"):
        build_host_graph(torch.fx.GraphModule({}, g))

    g = torch.fx.Graph()
    x = g.placeholder("x")
    g.output([g.call_function(torch.sin, (x,))])  # a torch function, not an aten OpOverload
    with pytest.raises(Unsupported, match="sin"):
        build_host_graph(torch.fx.GraphModule({}, g))


def test_intermediates_are_released_after_their_last_use():
    # a chain whose intermediates are 4 MiB each: the host graph must not keep them all alive
    def fn(x):
        for _ in range(20):
            x = x + 1
        return [x]

    x = torch.randn(1024, 1024)
    hg = build_host_graph(trace_aten(fn, [x]))
    import gc
    import resource

    hg.run([x])
    gc.collect()
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for _ in range(3):
        hg.run([x])
    grown_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    assert grown_kib < 20 * 4096  # far below 20 live intermediates (80 MiB)


def test_tiny_flux_transformer_is_bitwise_equal_to_the_fx_graph():
    diffusers = pytest.importorskip("diffusers")
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=[4, 4, 8]).eval()

    def fn(hidden, context, pooled, timestep, img_ids, txt_ids):
        return [model(hidden_states=hidden, encoder_hidden_states=context, pooled_projections=pooled,
                      timestep=timestep, img_ids=img_ids, txt_ids=txt_ids, return_dict=False)[0]]

    example = [torch.randn(1, 16, 4), torch.randn(1, 8, 32), torch.randn(1, 32), torch.tensor([0.5]),
               torch.randn(16, 3), torch.randn(8, 3)]
    gm = trace_aten(fn, example)
    hg = build_host_graph(gm)
    assert hg.num_instructions > 200
    fresh = [torch.randn_like(t) for t in example[:3]] + example[3:]
    with torch.no_grad():
        assert_bitwise(hg.run(fresh), gm(*fresh))
        assert_bitwise(hg.run(fresh), fn(*fresh))  # and equal to the eager model itself


def assert_same_view(a, b):
    """Equal values and the same geometry: sizes, strides and storage offset."""
    assert a.shape == b.shape and a.stride() == b.stride() and a.storage_offset() == b.storage_offset()
    assert torch.equal(a, b)


def view_chains(x, w):
    """View chains of every kind the host graph folds, read by non-view ops and returned."""
    parts = torch.ops.aten.split.Tensor(x, 4, -1)                    # a list, read only by views below
    q = parts[0].view(2, 3, 2, 2).permute(0, 2, 1, 3)                # split + getitem + view + permute
    k = parts[1].transpose(0, 1).unsqueeze(0).expand(2, 4, 6)         # transpose, unsqueeze, expand
    s = x[1:, 2:9:2].select(0, 2).narrow(0, 1, 2)                    # slice, slice, select, narrow
    u = torch.ops.aten.unbind.int(x.view(2, 3, 12), 1)[2].t()         # view + unbind + getitem + t
    c = torch.ops.aten.chunk.default(w.t(), 2, 0)                     # a constant root; the list read whole
    return [q * 2, k + 1, s.sum(), torch.cat(list(c), 1), u.squeeze(), q, x.diagonal()]


def test_view_chains_are_folded_into_one_as_strided_of_their_root():
    x, w = torch.randn(6, 12), torch.randn(5, 4)
    gm = trace_aten(lambda x: view_chains(x, w), [x])
    hg = build_host_graph(gm)
    n_views = sum(1 for n in gm.graph.nodes if n.op == "call_function" and n.target is not operator.getitem
                  and n.target._schema.returns and n.target._schema.returns[0].alias_info is not None)
    assert hg.num_views_folded >= n_views - 1  # every view but the chunk whose list cat reads whole
    assert hg.num_view_chains < hg.num_views_folded  # chains of several views became one instruction each
    for fresh in (x, torch.randn(6, 12), torch.randn(6, 12)):  # the first run learns each chain's geometry
        out = hg.run([fresh])
        for a, b in zip(out, gm(fresh)):
            assert_same_view(a, b)
    # views returned by the graph still alias its input (q, x.diagonal())
    out = hg.run([x])
    assert all(out[i].untyped_storage().data_ptr() == x.untyped_storage().data_ptr() for i in (5, 6))


@pytest.mark.parametrize("layout", ["offset", "transposed", "expanded"])
def test_folded_views_follow_a_root_of_another_geometry(layout):
    """A root at another storage offset replays the learned geometry shifted by it; a root with other strides (a
    host graph run directly, without the cache's copy to the captured strides) runs the views themselves."""
    x = torch.randn(6, 12)
    gm = trace_aten(lambda x: view_chains(x, torch.ones(5, 4)), [x])
    hg = build_host_graph(gm)
    hg.run([x])  # learns the chains on a contiguous root
    other = {"offset": torch.randn(80)[5:77].view(6, 12), "transposed": torch.randn(12, 6).t(),
             "expanded": torch.randn(1, 12).expand(6, 12)}[layout]
    for a, b in zip(hg.run([other]), gm(other)):
        assert_same_view(a, b)


def test_in_place_writes_through_a_folded_view_reach_the_base():
    def fn(x):
        y = x.clone()
        y.view(-1)[3:9].mul_(2)
        y.view(4, 6)[:, 1].zero_()
        return [y]

    x = torch.randn(4, 6)
    gm = trace_aten(fn, [x])
    hg = build_host_graph(gm)
    assert hg.num_views_folded >= 4 and hg.num_view_chains == 2
    for _ in range(2):
        assert_bitwise(hg.run([x]), gm(x))


def test_a_failing_view_raises_as_the_op_does():
    """view() of a root whose strides do not allow it raises the op's own error (the chain runs its ops)."""
    x = torch.randn(4, 6)
    gm = trace_aten(lambda x: [x.view(24) * 1], [x])
    hg = build_host_graph(gm)
    hg.run([x])
    with pytest.raises(RuntimeError, match="view size is not compatible"):
        hg.run([torch.randn(6, 4).t()])
