"""Batch buckets (CompilationConfig.graph_batch_buckets): pad the batch up to a bucket, replay that bucket's
graph, slice the outputs back; beyond the largest bucket, run uncaptured (fusegraph/graph/buckets.py).

Exactness: the runners here capture unfused (the ``unfused_runner`` fixture: fusion before capture rounds
differently and has its own tests), so the host graph runs the eager call's own aten ops and a replay at the
bucket size is bitwise the eager call at the bucket size. Row for row against eager at the *unpadded* size it is bitwise too for ops
whose per-row arithmetic does not depend on the row count (norms, elementwise, fused ops); a GEMM (Linear) may
block its reduction differently for another M (oneDNN/MKL), so there rows are compared with assert_close's
default tolerances, and bitwise against eager on the padded input."""
import logging

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusegraph
from fusegraph import CompilationConfig
from fusegraph.graph import GraphRunner
from fusegraph.graph.buckets import graph_batch_spec

BUCKETS = (1, 2, 4, 8)

pytestmark = pytest.mark.usefixtures("unfused_runner")


def buckets(**kw):
    return {"graph_batch_buckets": BUCKETS, **kw}


def bucket_of(b):
    return next(k for k in BUCKETS if k >= b)


def pad_rows(x, n):
    """Eager's view of a padded call: the last row repeated up to n rows."""
    return torch.cat((x, x[-1:].expand(n - x.shape[0], *x.shape[1:])))


class NormLinearGelu(nn.Module):
    def __init__(self, d=32, h=48):
        super().__init__()
        self.norm, self.lin = nn.RMSNorm(d), nn.Linear(d, h)

    def forward(self, x):
        return F.gelu(self.lin(self.norm(x)), approximate="tanh")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_batch_sizes_1_to_8_capture_four_graphs_and_match_eager_row_for_row(dtype):
    torch.manual_seed(0)
    m = NormLinearGelu().eval().to(dtype)
    r = GraphRunner(m, buckets())
    with torch.no_grad():
        for _ in range(2):
            for b in range(1, 9):
                x = torch.randn(b, 5, 32, dtype=dtype)
                out = r(x)
                assert out.shape == (b, 5, 48) and out.dtype == dtype
                # bitwise: eager on the padded batch, rows [:b]
                assert torch.equal(out, m(pad_rows(x, bucket_of(b)))[:b])
                ref = m(x)
                if b in BUCKETS:
                    assert torch.equal(out, ref)
                else:  # the Linear's GEMM at another row count (see the module docstring)
                    torch.testing.assert_close(out, ref)
        s = r.stats
        assert (s.graphs_captured, s.replays, s.bucket_padded_calls, s.bucket_overflows, s.eager_calls) == \
            (4, 16, 8, 0, 0)
        assert r.num_entries == 4
        x = torch.randn(9, 5, 32, dtype=dtype)  # beyond the largest bucket: uncaptured, counted
        assert torch.equal(r(x), m(x))
        assert (s.graphs_captured, s.replays, s.bucket_overflows, s.eager_calls) == (4, 16, 1, 1)


def test_row_wise_ops_are_bitwise_equal_to_eager_at_every_batch_size():
    w = torch.randn(32)

    def fn(x):
        return fusegraph.ops.rms_norm(x, w, eps=1e-6) * torch.sigmoid(x) + F.gelu(x, approximate="tanh")

    r = GraphRunner(fn, buckets())
    for b in range(1, 9):
        x = torch.randn(b, 3, 32)
        assert torch.equal(r(x), fn(x))
    assert (r.stats.graphs_captured, r.stats.replays, r.stats.bucket_padded_calls) == (4, 8, 4)


def two_inputs_fn(x, gate, w, *, scale):
    """x [B,S,D], gate [B,D] batched; w [D] not; a tuple and a dict out, one non-batched output."""
    y = F.layer_norm(x, (x.shape[-1],)) * w
    h = y + gate[:, None, :] * scale
    return (h, h.sum(-1)), {"gate2": gate * 2, "w": w + 1, "shape": h.shape}


def test_two_batched_inputs_a_non_batched_one_and_tuple_dict_outputs():
    r = GraphRunner(two_inputs_fn, buckets())
    w = torch.randn(16)
    for b in (1, 2, 3, 5, 6, 7, 8, 4):
        x, gate = torch.randn(b, 4, 16), torch.randn(b, 16)
        (h, s), d = r(x, gate, w, scale=0.5)
        (rh, rs), rd = two_inputs_fn(x, gate, w, scale=0.5)
        assert torch.equal(h, rh) and torch.equal(s, rs) and torch.equal(d["gate2"], rd["gate2"])
        assert torch.equal(d["w"], rd["w"]) and d["w"].shape == (16,)  # not batched: untouched
        assert type(d["shape"]) is torch.Size and d["shape"] == rd["shape"] == (b, 4, 16)
    assert (r.stats.graphs_captured, r.stats.replays, r.stats.bucket_padded_calls) == (4, 8, 4)


def test_padded_rows_do_not_leak_into_outputs():
    """Outputs are exactly B rows; the padded rows (repeats of the last real row) stay in the graph's bucket-size
    buffer behind the view; fused ops in poison mode (every output NaN-filled before its kernel writes it) leave
    no NaN in any real row; a later call of the same bucket does not change an earlier (safe-mode) result."""
    w = torch.randn(16)

    def fn(x):
        return fusegraph.ops.rms_norm(x, w) + 1

    fusegraph._C._set_poison_outputs(True)
    try:
        safe = GraphRunner(fn, buckets())
        x = torch.randn(3, 16)
        x[-1] = 1e4  # the repeated row is unlike the others
        out = safe(x)
        assert out.shape == (3, 16) and torch.equal(out, fn(x)) and torch.isfinite(out).all()
        keep = out.clone()
        safe(torch.randn(3, 16)), safe(torch.randn(4, 16))
        assert torch.equal(out, keep)

        unsafe = GraphRunner(fn, buckets(safe_output_mode=False))
        out = unsafe(x)
        assert out.shape == (3, 16) and torch.equal(out, fn(x))
        base = out._base if out._base is not None else out
        assert base.shape == (4, 16)  # a view of the bucket's output
        assert torch.equal(base[3], base[2])  # the padded row is the last real row's result, finite
    finally:
        fusegraph._C._set_poison_outputs(False)


def test_bucket_sized_batch_is_not_copied():
    seen = []

    def fn(x):
        seen.append(x)  # (the row analysis traces fn on a fake first: fn reads no data here)
        return x * 2

    r = GraphRunner(fn, buckets(device_graph="none"))  # uncaptured: fn sees the tensors the runner passes
    x = torch.randn(4, 3)
    r(x)
    assert seen[-1] is x and r.stats.bucket_padded_calls == 0
    y = torch.randn(3, 3)
    torch.testing.assert_close(r(y), y * 2, rtol=0, atol=0)
    assert seen[-1] is not y and seen[-1].shape == (4, 3) and r.stats.bucket_padded_calls == 1


def test_ambiguous_non_batched_tensor_and_batch_args():
    table = torch.randn(3, 16)  # dim 0 == 3: looks batched to the automatic rule at B = 3

    def fn(x, table):
        return x @ table.T  # [B, 3]

    x = torch.randn(3, 16)
    auto = GraphRunner(fn, buckets())
    # the documented ambiguity: the automatic rule pads the table too, and x @ table.T then multiplies by a batched
    # right-hand side; the row analysis sees it and turns buckets off: the call runs unpadded
    out = auto(x, table)
    assert out.shape == (3, 3) and _buckets_off(auto.stats.fallbacks) == 1
    torch.testing.assert_close(out, fn(x, table))
    for batch_args in ((0,), 0, ("x",)):
        r = GraphRunner(fn, buckets(), batch_args=batch_args)
        out = r(x, table) if batch_args != ("x",) else r(x=x, table=table)
        assert out.shape == (3, 3)
        torch.testing.assert_close(out, fn(x, table))
        assert r.stats.bucket_padded_calls == 1
    r = GraphRunner(lambda x, y: x + y, buckets(), batch_args=(0, 1))
    with pytest.raises(ValueError, match="batch_args names argument 1, but a tensor in it has dim 0 of 2"):
        r(torch.randn(3, 4), torch.randn(2, 4))


def test_beyond_the_largest_bucket_runs_uncaptured_logged_once(caplog):
    r = GraphRunner(lambda x: x.sin(), buckets())
    with caplog.at_level(logging.WARNING, logger="fusegraph.graph"):
        for b in (9, 12, 9):
            x = torch.randn(b, 2)
            assert torch.equal(r(x), x.sin())
    assert (r.stats.bucket_overflows, r.stats.eager_calls, r.stats.graphs_captured) == (3, 3, 0)
    assert sum("beyond the largest bucket 8" in m for m in caplog.messages) == 1
    x = torch.randn(0, 2)  # no row to repeat
    assert r(x).shape == (0, 2)
    assert r.stats.fallbacks == {"batch buckets: batch size 0 (no row to pad with)": 1}


def test_capture_pads_to_the_bucket():
    r = GraphRunner(lambda x: x.cos(), buckets())
    assert r.capture(torch.randn(3, 2)) is True
    assert r.stats.graphs_captured == 1
    for b in (3, 4):
        x = torch.randn(b, 2)
        assert torch.equal(r(x), x.cos())
    assert (r.stats.graphs_captured, r.stats.replays) == (1, 2)
    assert r.capture(torch.randn(9, 2)) is False and r.stats.graphs_captured == 1


def test_bad_values_raise_naming_the_field():
    for bad, err in [((2, 1), ValueError), ((1, 1), ValueError), ((0, 2), ValueError), ((-1,), ValueError),
                     ((1.0, 2), TypeError), ((True,), TypeError), ("1,2", TypeError), (4, TypeError),
                     (None, TypeError)]:
        with pytest.raises(err, match="graph_batch_buckets must be a tuple of strictly increasing positive ints"):
            CompilationConfig(graph_batch_buckets=bad)
        with pytest.raises(err, match="graph_batch_buckets"):
            GraphRunner(lambda x: x, {"graph_batch_buckets": bad})
    assert CompilationConfig(graph_batch_buckets=[1, 2, 4]).graph_batch_buckets == (1, 2, 4)
    assert CompilationConfig().graph_batch_buckets == ()
    with pytest.raises(ValueError, match="graph_batch_buckets is off"):
        GraphRunner(lambda x: x, batch_args=(0,))
    with pytest.raises(TypeError, match="batch_args must be a sequence"):
        GraphRunner(lambda x: x, buckets(), batch_args=(1.5,))


def test_graph_batch_spec_reads_the_batch_symbol():
    from torch.fx.experimental.proxy_tensor import make_fx

    def fn(w, n, x, y):  # a weight first (its dim 0 is a symbol too, but also the output's dim 1), an int input
        return x @ w.T + y.sum(-1, keepdim=True), n + 0, x.shape[0]

    gm = make_fx(fn, tracing_mode="symbolic")(torch.randn(8, 16), 3, torch.randn(3, 16), torch.randn(3, 5))
    spec, why = graph_batch_spec(gm)
    assert why is None and spec.tensors == (2, 3) and spec.ints == (1,)
    assert spec.out_slice == (0,) and spec.out_ints == (1, 2)

    flat = make_fx(lambda x: x.reshape(-1), tracing_mode="symbolic")(torch.randn(3, 16))
    spec, why = graph_batch_spec(flat)
    assert spec is None and "output 0 has the batch size" in why
    static = make_fx(lambda x: x + 1)(torch.randn(3, 16))
    assert graph_batch_spec(static) == (None, None)


@pytest.mark.parametrize("dynamic", [None, True])
def test_backend_graph_route_buckets(dynamic):
    """Dynamo specialises B = 1 (a static graph, captured as it is) and compiles the next batch size with a
    symbolic dim 0 and a SymInt input; that graph pads to the buckets 2, 4, 8: 4 captures for batch sizes 1..8."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    m = NormLinearGelu().eval()
    backend = fusegraph.Backend({"graph_with_compile": True, "graph_batch_buckets": BUCKETS})
    compiled = torch.compile(m, backend=backend, dynamic=dynamic)
    with torch.no_grad():
        for b in list(range(1, 9)) + [3, 9]:
            x = torch.randn(b, 5, 32)
            out = compiled(x)
            assert out.shape == (b, 5, 48)
            torch.testing.assert_close(out, m(x))  # fused rms_norm: one rounding instead of eager's several
    s = backend.stats
    assert s.graphs_compiled == 2 and s.patterns["rms_norm"] == 2
    assert (s.graphs_captured, s.replays, s.bucket_padded_calls, s.bucket_overflows) == (4, 9, 5, 1)
    assert not s.fallbacks


def test_bench_buckets_smoke(capsys):
    from fusegraph.__main__ import main as cli

    assert cli(["bench", "buckets", "--rounds", "1", "--dim", "16", "--seq", "1"]) == 0
    out = capsys.readouterr().out
    assert "buckets           4" in out and "per-size          8" in out
    assert "buckets: replays 16, padded calls 8, overflows 0" in out  # the first sweep and one round


def test_backend_route_batch_size_branch_stays_correct():
    """A branch on the batch size makes Dynamo compile a graph per side (B = 1; 2..3 under the guard B < 4; 4..).
    The guard is checked on the real B; the side's graph then replays at the bucket (B = 3 at 4), which computes
    the rows exactly as the side Dynamo chose. Bucket 4 is captured once per side: 5 captures."""
    class Branch(nn.Module):
        def forward(self, x):
            return x * 2 if x.shape[0] < 4 else x * 3

    torch._dynamo.reset()
    m = Branch()
    backend = fusegraph.Backend({"graph_only": True, "graph_batch_buckets": BUCKETS})
    compiled = torch.compile(m, backend=backend)
    with torch.no_grad():
        for b in range(1, 9):
            x = torch.randn(b, 3)
            assert torch.equal(compiled(x), m(x))
    s = backend.stats
    assert (s.graphs_compiled, s.graphs_captured, s.replays, s.bucket_padded_calls) == (3, 5, 8, 4)


# ---- functions whose rows are not independent: decided from the trace, not bucketed ----
# Each mixing function below gives another result on a padded batch (or fails there); the trace shows why: a
# reduction, softmax, matmul or concatenation over dim 0, the batch moved out of dim 0, or the batch size used as a
# number. Such a function is captured per batch size exactly, the reason counted in stats.fallbacks.

MIXING = {
    "center": lambda x: x - x.mean(0),
    "softmax_dim0": lambda x: torch.softmax(x, 0),
    "sum_dim0": lambda x: x.sum(0),
    "gram": lambda x: x @ x.T,
    "transpose": lambda x: (x * 2).t(),
    "cat_dim0": lambda x: torch.cat([x, x + 1], 0) * 2,
    "cumsum_dim0": lambda x: x.cumsum(0),
    "by_batch_size": lambda x: x / x.shape[0],
    "batch_norm_train": lambda x: F.batch_norm(x, None, None, training=True),
    "write_into_a_table": lambda x: _write_into_a_table(x),
}


def _write_into_a_table(x):
    table = x.new_zeros(8, 16)  # allocated without the batch: a padded call writes table[B] too
    table[:x.shape[0]] = x
    return x + table.sum(0)


def _write_into_new_rows(x):
    out = x.new_zeros(x.shape[0], 32)  # allocated with the batch rows: writing its rows keeps them apart
    out[:, :16] = x
    out[:, 16:] = x.cos()
    return out

W16 = torch.randn(16, 16)
ROW_WISE = {
    "elementwise": lambda x: torch.sigmoid(x) * x + 1,
    "linear": lambda x: F.linear(x, W16, W16[0]),
    "layer_norm": lambda x: F.layer_norm(x, (16,)),
    "rms_norm": lambda x: F.rms_norm(x, (16,), W16[0]) * 2,
    "softmax_last": lambda x: torch.softmax(x, -1),
    "attention": lambda x: F.scaled_dot_product_attention(*(x.view(x.shape[0], 2, 2, 4),) * 3).flatten(1),
    "view_keeps_dim0": lambda x: x.view(x.shape[0], 4, 4).sum(-1),
    "flatten_linear": lambda x: (x.view(x.shape[0], 2, 8) @ W16[:8]).amax(1),
    "cat_last": lambda x: torch.cat([x, x.cos()], -1),
    "in_place_on_a_copy": lambda x: x.clone().mul_(2).add_(1),
    "write_into_new_rows": _write_into_new_rows,
}


def _eager_equal(out, ref):
    assert type(out) is type(ref) and out.shape == ref.shape
    torch.testing.assert_close(out, ref)


def _buckets_off(fallbacks) -> int:
    return sum(n for reason, n in fallbacks.items() if "batch buckets off" in reason)


@pytest.mark.parametrize("name", sorted(MIXING))
def test_runner_mixing_function_is_captured_per_batch_size(name):
    fn = MIXING[name]
    r = GraphRunner(fn, buckets())
    with torch.no_grad():
        for b in (3, 5, 2, 3, 4, 6, 7):
            x = torch.randn(b, 16)
            _eager_equal(r(x), fn(x))
    s = r.stats
    assert _buckets_off(s.fallbacks) == 1, s.fallbacks  # refused once, with the reason
    assert s.bucket_padded_calls == 0
    assert s.graphs_captured == 6 and s.replays == 7  # one graph per batch size seen: 3, 5, 2, 4, 6, 7


def test_runner_batch_passed_as_int_is_captured_per_batch_size():
    def fn(x, n):
        return x.reshape(n, -1) + 1

    r = GraphRunner(fn, buckets())
    for b in (3, 5, 3):
        x = torch.randn(b, 16)
        _eager_equal(r(x, b), fn(x, b))
    assert _buckets_off(r.stats.fallbacks) == 1 and r.stats.bucket_padded_calls == 0
    assert r.stats.graphs_captured == 2


def test_runner_refusal_names_the_reason(caplog):
    r = GraphRunner(MIXING["center"], buckets())
    with caplog.at_level(logging.WARNING, logger="fusegraph.graph"):
        r(torch.randn(3, 16))
    (reason,) = [k for k in r.stats.fallbacks if "batch buckets off" in k]
    assert "mean" in reason and "dim 0" in reason
    assert any("batch buckets off" in m for m in caplog.messages)


def test_runner_mixing_after_an_exact_bucket_capture():
    """A bucket-size call captures first (no padding); the analysis at that capture already turns buckets off, so
    the padded call never replays the bucket's graph."""
    fn = MIXING["center"]
    r = GraphRunner(fn, buckets())
    for b in (4, 3):
        x = torch.randn(b, 16)
        _eager_equal(r(x), fn(x))
    assert r.stats.bucket_padded_calls == 0 and _buckets_off(r.stats.fallbacks) == 1


@pytest.mark.parametrize("name", sorted(ROW_WISE))
def test_runner_row_wise_function_keeps_its_buckets(name):
    fn = ROW_WISE[name]
    r = GraphRunner(fn, buckets())
    with torch.no_grad():
        for b in range(1, 9):
            x = torch.randn(b, 16)
            _eager_equal(r(x), fn(x))
    s = r.stats
    assert (s.graphs_captured, s.bucket_padded_calls, s.replays) == (4, 4, 8)
    assert not s.fallbacks


GRAPH_ROUTES = ["graph_only", "graph_with_compile"]


def _compiled(fn, route):
    torch._dynamo.reset()
    backend = fusegraph.Backend(CompilationConfig(**{route: True}, graph_batch_buckets=BUCKETS))
    return torch.compile(fn, backend=backend), backend


@pytest.mark.parametrize("route", GRAPH_ROUTES)
@pytest.mark.parametrize("name", sorted(MIXING))
def test_backend_route_mixing_function_is_not_bucketed(route, name):
    fn = MIXING[name]
    compiled, backend = _compiled(fn, route)
    with torch.no_grad():
        for b in (2, 3, 5, 6, 3):  # Dynamo: a static graph at 2, then one with a symbolic batch size
            x = torch.randn(b, 16)
            _eager_equal(compiled(x), fn(x))
    s = backend.stats
    assert s.bucket_padded_calls == 0
    assert _buckets_off(s.fallbacks) >= 1, s.fallbacks


@pytest.mark.parametrize("route", GRAPH_ROUTES)
def test_backend_route_batch_passed_as_int_is_not_bucketed(route):
    def fn(x, n):
        return x.reshape(n, -1)

    compiled, backend = _compiled(fn, route)
    for b in (1, 2, 3, 5, 3):
        x = torch.randn(b, 16)
        _eager_equal(compiled(x, b), fn(x, b))
    assert backend.stats.bucket_padded_calls == 0 and _buckets_off(backend.stats.fallbacks) >= 1


@pytest.mark.parametrize("route", GRAPH_ROUTES)
@pytest.mark.parametrize("name", sorted(ROW_WISE))
def test_backend_route_row_wise_function_keeps_its_buckets(route, name):
    fn = ROW_WISE[name]
    compiled, backend = _compiled(fn, route)
    with torch.no_grad():
        for b in (1, 2, 3, 5, 6, 3):
            x = torch.randn(b, 16)
            _eager_equal(compiled(x), fn(x))
    s = backend.stats
    assert s.bucket_padded_calls == 4  # 3, 5, 6, 3
    assert not _buckets_off(s.fallbacks), s.fallbacks


# ---- a padded call that fails says so ----

TABLE = torch.randn(10, 16)


def embed(ids):
    return F.embedding(ids, TABLE) * 2


def _bad_ids(b):
    ids = torch.randint(0, 10, (b, 5))
    ids[-1, -1] = 10  # out of range: eager raises too
    return ids


def _assert_padded_error(excinfo, b=3, bucket=4):
    msg = str(excinfo.value)
    assert f"padded from batch {b} to bucket {bucket} (graph_batch_buckets)" in msg, msg
    assert excinfo.value.__cause__ is not None and str(excinfo.value.__cause__) in msg


def test_runner_padded_call_error_says_it_was_padded():
    r = GraphRunner(embed, buckets())
    for b in (3, 4):
        ids = torch.randint(0, 10, (b, 5))
        _eager_equal(r(ids), embed(ids))
    assert r.stats.bucket_padded_calls == 1 and not r.stats.fallbacks  # row-wise: bucketed
    with pytest.raises(IndexError) as excinfo:  # the original type
        r(_bad_ids(3))
    _assert_padded_error(excinfo)
    assert "input 0 was padded" in str(excinfo.value)
    with pytest.raises(IndexError) as excinfo:  # not padded: the error as eager raises it
        r(_bad_ids(4))
    assert "padded" not in str(excinfo.value)


@pytest.mark.parametrize("route", GRAPH_ROUTES)
def test_backend_route_padded_call_error_says_it_was_padded(route):
    compiled, backend = _compiled(embed, route)
    for b in (1, 2, 3):
        ids = torch.randint(0, 10, (b, 5))
        _eager_equal(compiled(ids), embed(ids))
    assert backend.stats.bucket_padded_calls == 1
    with pytest.raises(IndexError) as excinfo:
        compiled(_bad_ids(3))
    _assert_padded_error(excinfo)


# ---- writes into a tensor that is not batched (a decode step's KV-cache write) ----
# The cache has 8 rows, more than any bucket: a call of batch 3 writes cache[:3] and leaves cache[3] as it was; a
# call padded to bucket 4 would write cache[3] as well. Such a function is captured per batch size exactly.

CACHE_BUCKETS = (1, 2, 4)
CACHE_WRITES = {
    "slice_assign": lambda cache, rows: cache.__setitem__(slice(None, rows.shape[0]), rows),
    "narrow_copy": lambda cache, rows: cache.narrow(0, 0, rows.shape[0]).copy_(rows),
    "as_strided_copy": lambda cache, rows: cache.as_strided((rows.shape[0], 16), (16, 1)).copy_(rows),
    "zero_region": lambda cache, rows: cache[:rows.shape[0]].zero_(),
    "index_assign": lambda cache, rows: cache.__setitem__(torch.arange(rows.shape[0]), rows),
    "index_copy": lambda cache, rows: cache.index_copy_(0, torch.arange(rows.shape[0]), rows),
}


def _cache_step(write):
    def step(cache, rows):
        write(cache, rows + 1)
        return rows * 2
    return step


class CacheStep(nn.Module):
    def __init__(self, step):
        super().__init__()
        self.step = step
        self.register_buffer("cache", torch.full((8, 16), -1.0))

    def forward(self, rows):
        return self.step(self.cache, rows)


@pytest.mark.parametrize("where", ["buffer", "argument"])
@pytest.mark.parametrize("form", sorted(CACHE_WRITES))
def test_runner_write_into_a_non_batched_cache_is_not_padded(form, where):
    """A function writing a batch-sized region of a cache that is not batched (a module buffer, or an argument
    whose dim 0 is the maximum batch) is refused for buckets, the reason in stats.fallbacks: after every call the
    cache equals eager's, so a call of batch 3 leaves cache[3] untouched, and no call is padded."""
    step = _cache_step(CACHE_WRITES[form])
    if where == "buffer":
        m = CacheStep(step)
        r, cache = GraphRunner(m, {"graph_batch_buckets": CACHE_BUCKETS}), m.cache

        def call(rows):
            return r(rows)
    else:
        r, cache = GraphRunner(lambda rows, c: step(c, rows), {"graph_batch_buckets": CACHE_BUCKETS}), \
            torch.full((8, 16), -1.0)

        def call(rows):
            return r(rows, cache)
    ref = torch.full((8, 16), -1.0)
    torch.manual_seed(0)
    with torch.no_grad():
        for i, b in enumerate((3, 4, 2, 3)):
            rows = torch.randn(b, 16)
            assert torch.equal(call(rows), step(ref, rows))
            assert torch.equal(cache, ref), f"call {i} (batch {b}): rows {(cache != ref).any(1).nonzero().tolist()}"
            if i == 0:
                assert (cache[3] == -1).all()
    s = r.stats
    assert s.bucket_padded_calls == 0
    assert _buckets_off(s.fallbacks) == 1, s.fallbacks
    (reason,) = [k for k in s.fallbacks if "batch buckets off" in k]
    if form in ("slice_assign", "narrow_copy"):  # a write through a view of the cache sized by the batch
        assert "not batched" in reason, reason


@pytest.mark.parametrize("route", GRAPH_ROUTES)
@pytest.mark.parametrize("form", ["slice_assign", "narrow_copy"])
def test_backend_route_write_into_a_non_batched_cache_is_not_bucketed(route, form):
    """The graph routes refuse the same cache writes (their functional graph: a slice_scatter sized by the batch
    copied into the cache); the cache equals eager's after every call."""
    step = _cache_step(CACHE_WRITES[form])
    torch._dynamo.reset()
    backend = fusegraph.Backend(CompilationConfig(**{route: True}, graph_batch_buckets=CACHE_BUCKETS))
    compiled = torch.compile(step, backend=backend)
    cache, ref = torch.full((8, 16), -1.0), torch.full((8, 16), -1.0)
    torch.manual_seed(0)
    with torch.no_grad():
        for b in (2, 3, 4, 3):
            rows = torch.randn(b, 16)
            assert torch.equal(compiled(cache, rows), step(ref, rows))
            assert torch.equal(cache, ref), f"batch {b}: rows {(cache != ref).any(1).nonzero().tolist()}"
    assert backend.stats.bucket_padded_calls == 0
    assert _buckets_off(backend.stats.fallbacks) >= 1, backend.stats.fallbacks
