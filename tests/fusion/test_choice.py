"""The Inductor route's per-site choice (fusegraph.fusion.choice): lowerings equal to the ops, the cost model's
reading of its table, and the backend keeping / lowering sites as the model says."""
import functools
import json
import unittest.mock

import pytest
import torch
import torch.nn.functional as F

import fusegraph
from fusegraph.fusion import choice
from fusegraph.fusion.choice import CostModel, lowered_call

fg = torch.ops.fusegraph
DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)


def _rand(*shape, dtype):
    return torch.randn(*shape, dtype=torch.float64).to(dtype)


def _check(target, *args, **kwargs):
    """The lowering gives the op's dtype and, in float32 math as the op, values within the dtype's default
    tolerance (float32 and float64 tighter)."""
    want = target(*args, **kwargs)
    got = lowered_call(target, *args, **kwargs)
    assert got.dtype == want.dtype and got.shape == want.shape
    tol = {torch.float32: dict(rtol=2e-6, atol=2e-6), torch.float64: dict(rtol=1e-12, atol=1e-12)}.get(want.dtype, {})
    torch.testing.assert_close(got, want, **tol)


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_lowering_equals_the_op(dtype):
    x = _rand(3, 5, 48, dtype=dtype)[:, ::2]  # a non-contiguous view
    w, b = _rand(48, dtype=dtype), _rand(48, dtype=dtype)
    _check(fg.rms_norm.default, x, w, 1e-6)
    _check(fg.rms_norm.default, x, w, 1e-5, b)
    _check(fg.rms_norm.default, x, None, 1e-6)
    _check(fg.rms_norm.default, x, w.float(), 1e-6, style="diffusers")
    _check(fg.rms_norm.default, x, w, 1e-6, b, style="diffusers")
    _check(fg.rms_norm.default, x, None, 1e-6, style="diffusers")


@pytest.mark.parametrize("dtype", DTYPES)
def test_adaln_lowering_equals_the_op(dtype):
    x = _rand(2, 7, 40, dtype=dtype)
    scale, shift = _rand(2, 1, 40, dtype=dtype), _rand(2, 1, 40, dtype=dtype)
    w, b = _rand(40, dtype=dtype), _rand(40, dtype=dtype)
    for norm in ("layer", "rms"):
        _check(fg.adaln.default, x, scale, shift, 1e-6, norm=norm)
        _check(fg.adaln.default, x, scale, None, 1e-6, norm=norm)
        _check(fg.adaln.default, x, scale, norm=norm)  # a trace drops trailing defaults: shift None, eps 1e-6
        _check(fg.adaln.default, x, scale, shift, 1e-6, w, b, norm=norm)
        _check(fg.adaln.default, x, _rand(2, 7, 40, dtype=dtype), shift, 1e-5, w, None, norm=norm)
        _check(fg.adaln.default, x, scale.float(), shift.float(), 1e-6, out_dtype=dtype, norm=norm)


@pytest.mark.parametrize("dtype", DTYPES)
def test_eps_tensor_lowerings_equal_the_ops(dtype):
    """The run-time eps overloads (dynamic=True) lower as the float ones, the 0-d float64 eps converted first."""
    eps = torch.tensor(1e-2, dtype=torch.float64)
    x = _rand(3, 5, 48, dtype=dtype)[:, ::2]
    w = _rand(48, dtype=dtype)
    _check(fg.rms_norm.eps_tensor, x, w, eps)
    _check(fg.rms_norm.eps_tensor, x, None, eps, style="diffusers")
    scale, shift = _rand(3, 1, 48, dtype=dtype), _rand(3, 1, 48, dtype=dtype)
    _check(fg.adaln.eps_tensor, x, scale, shift, eps, w, norm="rms")
    _check(fg.adaln.eps_tensor, x, scale, None, eps, norm="rms")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_lowering_equals_the_op(dtype, interleaved):
    x = _rand(2, 6, 3, 16, dtype=dtype).transpose(1, 2)  # [B, H, S, D] view of [B, S, H, D]
    cos, sin = torch.randn(6, 16), torch.randn(6, 16)
    _check(fg.rope.default, x, cos, sin, interleaved=interleaved)
    _check(fg.rope.default, x, cos.to(dtype), sin.to(dtype), interleaved=interleaved)
    x_odd = _rand(2, 3, 6, 13, dtype=dtype)
    _check(fg.rope.default, x_odd, cos[:, :8], sin[:, :8], interleaved=interleaved, rotary_dim=8)


@pytest.mark.parametrize("dtype", DTYPES)
def test_gelu_and_mul_add_lowerings_equal_the_ops(dtype):
    x = _rand(4, 33, dtype=dtype) * 3
    _check(fg.gelu_tanh.default, x)
    _check(fg.fast_gelu.default, x)
    g, c = _rand(4, 1, dtype=dtype), _rand(4, 33, dtype=dtype)
    _check(fg.mul_add.default, x, g, c)
    _check(fg.mul_add.default, x, g.float(), c, out_dtype=dtype)
    _check(fg.mul_add.Scalar, x, 0.5, c)
    _check(fg.mul_add.Scalar, x, -1.25, c.float())


def test_cost_model_interpolates_in_log_size_and_clamps():
    model = CostModel({"cpu": {"1": {"gelu": {"float32": [[10, 0.5], [16, 2.0]]}},
                               "4": {"gelu": {"float32": [[10, 9.0], [16, 9.0]]}}}}, "test")
    cpu = torch.device("cpu")
    assert model.ratio("gelu", cpu, torch.float32, 2 ** 10, threads=1) == 0.5
    assert model.ratio("gelu", cpu, torch.float32, 2 ** 13, threads=1) == pytest.approx(1.25)
    # below the table: the first point scaled with the size (the fused op's fixed call cost dominates there)
    assert model.ratio("gelu", cpu, torch.float32, 2 ** 8, threads=1) == pytest.approx(0.125)
    assert model.ratio("gelu", cpu, torch.float32, 2 ** 30, threads=1) == 2.0  # above: its last
    assert model.ratio("gelu", cpu, torch.float32, 2 ** 13, threads=2) == pytest.approx(1.25)  # nearest: 1
    assert model.ratio("gelu", cpu, torch.float32, 2 ** 13, threads=3) == 9.0  # nearest: 4
    assert model.ratio("gelu", cpu, torch.bfloat16, 2 ** 13, threads=1) is None  # not measured
    assert model.ratio("rope", cpu, torch.float32, 2 ** 13, threads=1) is None
    assert model.ratio("gelu", torch.device("cuda"), torch.float32, 2 ** 13) is None  # no table: keep fused


def test_cost_model_reads_the_table_of_the_cpu_class(monkeypatch):
    """CPU tables are kept per class: this class's own answers; a class with none gets the least favourable
    prediction of the classes measured (fused only where it won on each); a table under the bare "cpu" key (a
    calibration from before classes) answers for this machine."""
    from fusegraph._core import cpu_class

    tables = {"cpu@V/fast": {"1": {"gelu": {"float32": [[10, 3.0, 1.0], [16, 3.0, 64.0]]}}},
              "cpu@V/slow": {"1": {"gelu": {"float32": [[10, 0.8, 2.0], [16, 0.8, 128.0]]},
                                   "rope": {"float32": [[10, 2.0, 1.0], [16, 2.0, 64.0]]}}}}
    cpu = torch.device("cpu")
    for key, gelu in (("V/fast", (3.0, 64.0)), ("V/slow", (0.8, 128.0)), ("W/unmeasured", (0.8, 128.0))):
        monkeypatch.setattr(cpu_class, "key", lambda k=key: k)
        assert CostModel(tables, "test").predict("gelu", cpu, torch.float32, 2 ** 16, threads=1) == gelu, key
    # rope measured on one class only: an unmeasured class takes that one's answer (the others say nothing)
    assert CostModel(tables, "test").ratio("rope", cpu, torch.float32, 2 ** 16, threads=1) == 2.0
    legacy = dict(tables, cpu={"1": {"gelu": {"float32": [[10, 5.0]]}}})
    assert CostModel(legacy, "test").ratio("gelu", cpu, torch.float32, 2 ** 10, threads=1) == 5.0
    monkeypatch.setattr(cpu_class, "key", lambda: "V/fast")
    assert CostModel(legacy, "test").ratio("gelu", cpu, torch.float32, 2 ** 10, threads=1) == 3.0
    assert choice._device_key(cpu) == "cpu@V/fast" and choice._device_key(torch.device("cuda")) == "cuda"


def test_cost_model_judges_a_row_wise_site_by_the_nearest_measured_width():
    """A norm's table may hold several row widths ("float32" at the default 128, "float32@3072"): a site takes the
    width nearest its own in log scale; without a width, or with one width measured, the default's; a family
    measured at one width answers for every width."""
    model = CostModel({"cpu": {"1": {"adaln": {"float32": [[10, 0.5], [22, 0.5]],
                                               "float32@3072": [[13, 1.5], [22, 1.5]]},
                                     "gelu": {"float32@512": [[10, 2.0], [22, 2.0]]}}}}, "test")
    cpu = torch.device("cpu")
    ratio = functools.partial(model.ratio, "adaln", cpu, torch.float32, 2 ** 19, 1)
    assert model.predict("adaln", cpu, torch.float32, 2 ** 19, threads=1, row=3072)[0] == 1.5
    assert model.predict("adaln", cpu, torch.float32, 2 ** 19, threads=1, row=1536)[0] == 1.5  # nearer 3072
    assert model.predict("adaln", cpu, torch.float32, 2 ** 19, threads=1, row=128)[0] == 0.5
    assert model.predict("adaln", cpu, torch.float32, 2 ** 19, threads=1, row=600)[0] == 0.5  # nearer 128
    assert ratio() == 0.5  # no width: the default's
    assert model.predict("adaln", cpu, torch.bfloat16, 2 ** 19, threads=1, row=3072) == (None, None)
    assert model.predict("gelu", cpu, torch.float32, 2 ** 19, threads=1, row=64)[0] == 2.0  # the one width

    def site(shape):
        g = torch.fx.Graph()
        x, s = g.placeholder("x"), g.placeholder("s")
        node = g.call_function(fg.adaln.default, (x, s, s, 1e-6))
        node.meta["val"] = torch.empty(shape)
        return node

    with unittest.mock.patch.object(choice, "_model", model):
        assert choice.decide(site((1, 320, 3072)))[0] and not choice.decide(site((1, 7680, 128)))[0]


def test_cost_model_interpolates_the_fused_time_in_log_log():
    model = CostModel({"cpu": {"1": {"gelu": {"float32": [[10, 0.5, 2.0], [16, 2.0, 128.0]]}}}}, "test")
    cpu = torch.device("cpu")
    assert model.predict("gelu", cpu, torch.float32, 2 ** 10, threads=1) == (0.5, 2.0)
    ratio, us = model.predict("gelu", cpu, torch.float32, 2 ** 13, threads=1)
    assert ratio == pytest.approx(1.25) and us == pytest.approx(16.0)  # halfway in log size: 2 * 64 ** 0.5
    assert model.predict("gelu", cpu, torch.float32, 2 ** 4, threads=1)[1] == 2.0  # below: the fixed call cost
    assert model.predict("gelu", cpu, torch.float32, 2 ** 18, threads=1)[1] == pytest.approx(512.0)  # above: ~numel
    old = CostModel({"cpu": {"1": {"gelu": {"float32": [[10, 0.5], [16, 2.0]]}}}}, "ratios only")
    assert old.predict("gelu", cpu, torch.float32, 2 ** 13, threads=1) == (pytest.approx(1.25), None)


def test_a_site_must_save_context_us_to_stay_fused(monkeypatch):
    """Faster by the ratio is not enough: a fused op that saves less than CONTEXT_US per call loses in a model
    (an extern call cuts Inductor's fusion with its neighbours), so it is lowered; a big site that saves more stays.
    """
    # gelu 3x faster everywhere; the fused op takes 1 us at 2^10 elements and 1024 us at 2^20
    model = CostModel({"cpu": {"1": {"gelu": {"float32": [[10, 3.0, 1.0], [20, 3.0, 1024.0]]}}}}, "test")
    monkeypatch.setattr(choice, "_model", model)
    monkeypatch.setattr(choice, "CONTEXT_US", {"cpu": 5.0})

    def site(numel):
        g = torch.fx.Graph()
        x = g.placeholder("x")
        node = g.call_function(fg.gelu_tanh.default, (x,))
        node.meta["val"] = torch.empty(numel)
        return node

    small, big = site(2 ** 10), site(2 ** 14)  # saves 2 us; saves (3 - 1) * 16 = 32 us
    assert choice.decide(small) == (False, pytest.approx(3.0))
    assert choice.decide(big) == (True, pytest.approx(3.0))
    assert "saves 2.0 us" in choice.describe(small) and choice.describe(small).startswith("Inductor code")
    assert choice.describe(big).startswith("fused op") and "saves 32.0 us" in choice.describe(big)
    monkeypatch.setattr(choice, "CONTEXT_US", {})  # a device without the bar: the ratio alone decides
    assert choice.decide(small)[0]


def test_shipped_table_covers_every_family_and_dtype():
    """Every CPU class shipped has a table for every family the choice weighs, in every dtype; the others
    (kv_attention, gemv, linear: extern calls replaced by ours) are not in CALIBRATED."""
    with open(choice._SHIPPED) as f:
        data = json.load(f)
    assert data["version"] == choice.TABLE_VERSION
    assert set(choice.CALIBRATED) <= set(fusegraph.stats.PATTERN_NAMES)
    assert set(fusegraph.stats.PATTERN_NAMES) - set(choice.CALIBRATED) == {"kv_attention", "gemv", "linear"}
    assert "cpu@AuthenticAMD/avx512_bf16" in data["tables"] and all(k.startswith("cpu@") for k in data["tables"])
    for key, per_threads in data["tables"].items():
        assert "1" in per_threads and key in data["meta"], key
        for family in choice.CALIBRATED:
            for dtype in ("float32", "bfloat16", "float16"):
                points = per_threads["1"][family][dtype]
                assert len(points) >= 3 and all(len(p) == 3 and p[1] > 0 and p[2] > 0 for p in points), (key, family)
                assert [p[0] for p in points] == sorted(p[0] for p in points)


class _Block(torch.nn.Module):
    """RMSNorm -> Linear -> tanh-GELU -> x + 0.5 * h, a decode-like layer."""

    def __init__(self, d):
        super().__init__()
        self.norm = torch.nn.RMSNorm(d, eps=1e-6)
        self.lin = torch.nn.Linear(d, d)

    def forward(self, x):
        return x + 0.5 * F.gelu(self.lin(self.norm(x)), approximate="tanh")


def _compile(model, x, **cfg):
    torch._dynamo.reset()
    backend = fusegraph.Backend(cfg)
    with torch.no_grad():
        out = torch.compile(model, backend=backend)(x)
    return backend, out


@pytest.fixture
def table(monkeypatch):
    """A cost model that keeps gelu fused and lowers everything else, at any size."""
    families = {f: {"float32": [[0, 0.5], [30, 0.5]]} for f in fusegraph.stats.PATTERN_NAMES}
    families["gelu"] = {"float32": [[0, 3.0], [30, 3.0]]}
    model = CostModel({"cpu": {"1": families}}, "test table")
    monkeypatch.setattr(choice, "_model", model)
    return model


def test_backend_lowers_the_sites_the_model_gives_to_inductor(table):
    model = _Block(64).eval()
    x = torch.randn(3, 64)
    with torch.no_grad():
        want = model(x)
    backend, out = _compile(model, x)
    assert backend.stats.patterns["rms_norm"] == 1 and backend.stats.patterns["gelu"] == 1
    assert backend.stats.patterns["mul_add"] == 1
    assert backend.stats.lowered == {**{f: 0 for f in fusegraph.stats.PATTERN_NAMES}, "rms_norm": 1, "mul_add": 1}
    ops = backend.last_graph_ops
    assert ops["fusegraph.gelu_tanh.default"] == 1
    assert not any(k.startswith("fusegraph.rms_norm") or k.startswith("fusegraph.mul_add") for k in ops)
    torch.testing.assert_close(out, want)


def test_fusion_choice_always_keeps_every_fused_op(table):
    model = _Block(64).eval()
    x = torch.randn(3, 64)
    backend, out = _compile(model, x, fusion_choice="always")
    assert sum(backend.stats.lowered.values()) == 0
    assert backend.last_graph_ops["fusegraph.rms_norm.default"] == 1
    assert backend.last_graph_ops["fusegraph.mul_add.Scalar"] == 1
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))


def test_aten_route_never_lowers(table):
    model = _Block(64).eval()
    backend, _ = _compile(model, torch.randn(3, 64), inductor=False)
    assert sum(backend.stats.lowered.values()) == 0
    assert backend.last_graph_ops["fusegraph.rms_norm.default"] == 1


def test_summary_line_names_the_sites_left_to_inductor(table, caplog):
    import logging

    with caplog.at_level(logging.INFO, logger="fusegraph"):
        _compile(_Block(64).eval(), torch.randn(3, 64))
    assert any("2 of them left to Inductor's code" in r.getMessage() for r in caplog.records)


def test_unknown_fusion_choice_is_rejected():
    with pytest.raises(ValueError, match="fusion_choice"):
        fusegraph.CompilationConfig(fusion_choice="sometimes")


def test_save_calibration_merges_devices_and_thread_counts(tmp_path):
    path = tmp_path / "cost.json"
    choice.save_calibration({"cpu": {"1": {"gelu": {"float32": [[10, 1.0]]}}}, "_overhead_us": {"1": 3.0}}, path)
    choice.save_calibration({"cpu": {"2": {"gelu": {"float32": [[10, 2.0]]}}}}, path)
    choice.save_calibration({"cpu": {"1": {"rope": {"float32": [[10, 3.0]]}}}}, path)  # a partial one
    data = json.loads(path.read_text())
    assert set(data["tables"]["cpu"]) == {"1", "2"}
    assert set(data["tables"]["cpu"]["1"]) == {"gelu", "rope"}
    choice.cost_model(reload=True)  # back to the real table for other tests


def test_sites_with_float64_arguments_are_left_to_inductor(monkeypatch):
    """The ops run float64 calls as plain torch ops (no fused kernel): such a node is lowered even where the table
    says the fused op is faster (the patterns fuse no float64 site today; a rope with float64 tables would be one)."""
    keep_all = {f: {"float32": [[0, 3.0], [30, 3.0]]} for f in fusegraph.stats.PATTERN_NAMES}
    monkeypatch.setattr(choice, "_model", CostModel({"cpu": {"1": keep_all}}, "keeps every fused op"))
    graph = torch.fx.Graph()
    x, cos, sin = graph.placeholder("x"), graph.placeholder("cos"), graph.placeholder("sin")
    rope = graph.call_function(fg.rope.default, (x, cos, sin))
    graph.output(rope)
    for dtype, keep in ((torch.float32, True), (torch.float64, False)):
        with torch._subclasses.FakeTensorMode():
            x.meta["val"] = torch.empty(1, 64, 2, 32)
            cos.meta["val"] = sin.meta["val"] = torch.empty(64, 32, dtype=dtype)
            rope.meta["val"] = torch.empty(1, 64, 2, 32)
        assert choice.decide(rope)[0] is keep, dtype
    assert choice.describe(rope) == "Inductor code (float64 arguments: no fused kernel)"


def test_lower_takes_tensor_keywords():
    """A fused node whose weight/bias come as keywords is lowered with them (FX graph, fake values)."""
    graph = torch.fx.Graph()
    x, scale, shift, w, b = (graph.placeholder(n) for n in ("x", "scale", "shift", "w", "b"))
    node = graph.call_function(fg.adaln.default, (x, scale, shift, 1e-6), {"weight": w, "bias": b, "norm": "rms"})
    graph.output(node)
    real = [torch.randn(2, 5, 16), torch.randn(2, 1, 16), torch.randn(2, 1, 16), torch.randn(16), torch.randn(16)]
    mode = torch._subclasses.FakeTensorMode()
    for p, t in zip((x, scale, shift, w, b), real):
        p.meta["val"] = mode.from_tensor(t)
    with mode:
        node.meta["val"] = fg.adaln.default(*[p.meta["val"] for p in (x, scale, shift)], 1e-6, weight=w.meta["val"],
                                            bias=b.meta["val"], norm="rms")
    choice.lower(graph, node)
    assert not any(n.target is fg.adaln.default for n in graph.nodes)
    out = torch.fx.GraphModule(torch.nn.Module(), graph)(*real)
    want = fg.adaln.default(*real[:3], 1e-6, weight=real[3], bias=real[4], norm="rms")
    torch.testing.assert_close(out, want, rtol=2e-6, atol=2e-6)


def test_graph_ops_survive_an_inductor_cache_hit(table):
    """Inductor's FX graph cache skips the fusion pass on a hit: the final graph's ops then come from the record
    the compile that ran it stored (CI machines keep Inductor's cache between runs)."""
    from torch._dynamo.utils import counters

    first, _ = _compile(_Block(64).eval(), torch.randn(3, 64))
    hits = counters["inductor"]["fxgraph_cache_hit"]
    second, out = _compile(_Block(64).eval(), torch.randn(3, 64))
    assert counters["inductor"]["fxgraph_cache_hit"] == hits + 1  # the second compile did not run the pass
    assert first.last_graph_ops["fusegraph.gelu_tanh.default"] == 1
    assert second.last_graph_ops == first.last_graph_ops
    assert second.stats.lowered == first.stats.lowered


def test_a_graph_with_every_site_lowered_reaches_inductor_as_it_came(monkeypatch):
    """No fused op left after the choice: Inductor compiles the graph the pass was given, node for node, not the
    fusion's lowered and prepared form; where one fused op stays, the fused graph goes on."""
    from fusegraph.fusion import inductor_pass

    seen = []
    call = inductor_pass.FusionPass.__call__

    def spy(self, graph, is_inference=True):
        before = str(graph)
        call(self, graph, is_inference)
        seen.append((before, str(graph)))

    monkeypatch.setattr(inductor_pass.FusionPass, "__call__", spy)
    lower_all = {f: {"float32": [[0, 0.5], [30, 0.5]]} for f in fusegraph.stats.PATTERN_NAMES}
    monkeypatch.setattr(choice, "_model", CostModel({"cpu": {"1": lower_all}}, "lowers every site"))
    model, x = _Block(64).eval(), torch.randn(3, 64)
    with torch._inductor.config.patch(fx_graph_cache=False):  # the pass must run, not a cached graph
        backend, out = _compile(model, x)
    assert backend.stats.patterns["rms_norm"] == 1 and sum(backend.stats.lowered.values()) == 3
    assert not any(k.startswith("fusegraph.") for k in backend.last_graph_ops)
    assert len(seen) == 1 and seen[0][0] == seen[0][1]
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))

    keep_gelu = dict(lower_all, gelu={"float32": [[0, 3.0], [30, 3.0]]})
    monkeypatch.setattr(choice, "_model", CostModel({"cpu": {"1": keep_gelu}}, "keeps gelu"))
    seen.clear()
    with torch._inductor.config.patch(fx_graph_cache=False):
        backend, out = _compile(model, x)
    assert backend.last_graph_ops["fusegraph.gelu_tanh.default"] == 1
    assert seen[0][0] != seen[0][1]
    with torch.no_grad():
        torch.testing.assert_close(out, model(x))
