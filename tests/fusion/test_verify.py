"""CompilationConfig.verify (SPEC §9): fused copies of each graph run against the unfused graph on the real example
inputs; a family whose replacement changes the result is undone for that graph, logged with the source line of
its sites and counted in stats.fallbacks.

A wrong replacement is planted by swapping the gelu family's replacement function (1.25 * gelu_tanh) and
re-registering that family alone on a copy of the pattern cache; Inductor's caches are off and pointed at a
fresh directory, so no artifact fused with the planted pattern outlives the test."""
import dataclasses
import logging
import os
import subprocess
import sys

import pytest
import torch
import torch._functorch.config as functorch_config
import torch._inductor.config as inductor_config
import torch.nn as nn
import torch.nn.functional as F

import fusegraph.stats as stats_mod
from fusegraph.fusion.inductor_pass import FusionPass
from fusegraph import Backend, CompilationConfig
from fusegraph.fusion import passes
from fusegraph.fusion.patterns import gelu as gelu_patterns
from fusegraph.stats import Stats

UNDONE_GELU = "verify: gelu changed the result beyond the dtype's tolerance; undone"
# On the Inductor route every fused site is kept (fusion_choice="always"): the planted wrong replacements are tiny
# sites the cost model would lower, and a graph with every site lowered reaches Inductor as it came, plant and all
# undone before verify could catch it.
ROUTES = {"aten": dict(inductor=False), "inductor": dict(inductor=True, fusion_choice="always")}


def _line_of(marker: str) -> int:
    with open(__file__) as f:
        return next(i for i, line in enumerate(f, 1) if marker in line and "_line_of" not in line)


class GatedGeluMLP(nn.Module):
    """A gelu site (the planted family) and a gated residual (mul_add, left correct)."""

    def __init__(self, d=32):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x, gate):
        h = F.gelu(self.fc1(x), approximate="tanh")  # the gelu site
        return x + gate * self.fc2(h)


GELU_SITE = f"{__file__}:{_line_of('# the gelu site')}"


def _wrong_gelu(x):
    return torch.ops.fusegraph.gelu_tanh(x) * 1.25


@pytest.fixture
def planted_gelu(monkeypatch, tmp_path):
    """The gelu family registers ``_wrong_gelu`` as its replacement for the duration of the test."""
    forms = tuple(dataclasses.replace(form, replace=_wrong_gelu) for form in gelu_patterns.FORMS["tanh"])
    monkeypatch.setitem(gelu_patterns.FORMS, "tanh", forms)
    monkeypatch.setattr(passes, "_passes", {k: v for k, v in passes._passes.items() if k[0] != "gelu"})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(stats_mod, "_logged", set())


def compile_run(fn, *inputs, **cfg):
    b = Backend(CompilationConfig(**cfg))
    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(fx_graph_cache=False), \
            functorch_config.patch(enable_autograd_cache=False):
        out = torch.compile(fn, backend=b, fullgraph=True)(*inputs)
    return b, out


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_planted_wrong_replacement_is_caught_and_undone(route, planted_gelu, caplog):
    model, x, gate = GatedGeluMLP(), torch.randn(4, 8, 32), torch.randn(4, 1, 32)
    with torch.no_grad():
        eager = model(x, gate)
    # the plant is effective: without verify the graph is wrong
    b, out = compile_run(model, x, gate, **ROUTES[route])
    assert b.stats.patterns["gelu"] == 1
    assert (out - eager).abs().max() > 0.1

    with caplog.at_level(logging.WARNING, logger="fusegraph"):
        b, out = compile_run(model, x, gate, verify=True, **ROUTES[route])
    torch.testing.assert_close(out, eager)
    assert b.stats.fallbacks == {UNDONE_GELU: 1}
    assert b.stats.patterns["gelu"] == 0 and b.stats.patterns["mul_add"] >= 1  # only the culprit is undone
    assert "fusegraph.gelu_tanh.default" not in b.last_graph_ops
    (record,) = [r for r in caplog.records if "verify: gelu" in r.getMessage()]
    assert GELU_SITE in record.getMessage()


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_verify_runs_on_copies_of_inputs_the_graph_mutates(route, planted_gelu):
    """Inductor's graph writes x itself (copy_ into the input: without copies the verification runs would mutate
    it three more times); aot_autograd's aten graph returns the new value and its wrapper writes it."""
    def fn(x, w):
        y = F.gelu(x @ w, approximate="tanh")
        x.mul_(2)
        return y * 3 + x

    x, w = torch.randn(6, 8), torch.randn(8, 8)
    x_eager = x.clone()
    with torch.no_grad():
        eager = fn(x_eager, w)
    b, out = compile_run(fn, x, w, verify=True, **ROUTES[route])
    torch.testing.assert_close(x, x_eager, rtol=0, atol=0)  # mutated once, by the real call only
    torch.testing.assert_close(out, eager)
    assert b.stats.fallbacks == {UNDONE_GELU: 1}


def test_dynamic_shapes_are_verified(planted_gelu):
    model, x, gate = GatedGeluMLP(), torch.randn(3, 5, 32), torch.randn(3, 1, 32)
    b = Backend(CompilationConfig(verify=True, inductor=False))
    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(model, backend=b, dynamic=True)(x, gate)
        eager = model(x, gate)
    torch.testing.assert_close(out, eager)
    assert b.stats.fallbacks == {UNDONE_GELU: 1}


# --- fuse_graph on its own ---------------------------------------------------------------------------------------


def _aten_graph(fn, *inputs):
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(fn, decomposition_table=select_decomp_table(), tracing_mode="fake")(*inputs)


def test_fuse_graph_verify_inputs_undoes_only_the_culprit(planted_gelu):
    def fn(x, y, z):
        return F.gelu(x, approximate="tanh") + y * z

    inputs = [torch.randn(16, 8) for _ in range(3)]
    gm = _aten_graph(fn, *inputs)
    stats = Stats()
    counts = passes.fuse_graph(gm, verify_inputs=inputs, stats=stats)
    assert counts["gelu"] == 0 and counts["mul_add"] >= 1  # (with gelu unfused, mul_add also fuses inside its chain)
    assert stats.patterns == counts and stats.fallbacks == {UNDONE_GELU: 1}
    targets = {str(n.target) for n in gm.graph.nodes}
    assert "fusegraph.mul_add.default" in targets and "aten.tanh.default" in targets
    torch.testing.assert_close(gm(*inputs), fn(*inputs))


def test_fuse_graph_verify_keeps_correct_families():
    def fn(x, y, z):
        return F.gelu(x, approximate="tanh") + y * z

    inputs = [torch.randn(16, 8) for _ in range(3)]
    gm = _aten_graph(fn, *inputs)
    stats = Stats()
    counts = passes.fuse_graph(gm, verify_inputs=inputs, stats=stats)
    assert counts["gelu"] == 1 and counts["mul_add"] == 1 and stats.fallbacks == {}
    torch.testing.assert_close(gm(*inputs), fn(*inputs))


def test_verify_inputs_for_refuses_what_it_cannot_match():
    from torch._subclasses.fake_tensor import FakeTensorMode

    def fn(x, w):
        return x @ w

    x, w = torch.randn(4, 8), torch.randn(8, 2)
    gm = _aten_graph(fn, x, w)
    assert passes.verify_inputs_for(gm, [x, w], params=[])[0] == [x, w]
    assert passes.verify_inputs_for(gm, [w], params=[x])[0] == [x, w]  # parameters aot_autograd lifted in front
    cases = {"2 inputs": [x], "float64": [x.double(), w], "has (4, 2)": [torch.randn(4, 2), w],
             "not a plain tensor": [FakeTensorMode().from_tensor(x), w]}
    for why, inputs in cases.items():
        got, reason = passes.verify_inputs_for(gm, inputs, params=[])
        assert got is None and reason.startswith("verify skipped") and why in reason, (why, reason)
    assert passes.verify_inputs_for(gm, None)[1].startswith("verify skipped")


def test_unmatched_inputs_skip_verification_without_failing_the_compile(monkeypatch):
    """The backend's side: a graph whose inputs cannot be matched compiles (and fuses) with the reason counted."""
    monkeypatch.setattr(stats_mod, "_logged", set())
    monkeypatch.setattr(passes, "verify_inputs_for", lambda graph, inputs: (None, "verify skipped: stand-in reason"))
    model, x, gate = GatedGeluMLP(), torch.randn(2, 4, 32), torch.randn(2, 1, 32)
    b, out = compile_run(model, x, gate, verify=True, inductor=False)
    with torch.no_grad():
        torch.testing.assert_close(out, model(x, gate))
    assert b.stats.fallbacks == {"verify skipped: stand-in reason": 1} and b.stats.patterns["gelu"] == 1


# --- tiny Flux: nothing undone with the real patterns ------------------------------------------------------------


@pytest.mark.parametrize("route,dtype", [("aten", torch.bfloat16), ("inductor", torch.float32)])
def test_tiny_flux_correct_patterns_are_kept(route, dtype):
    from diffusers import FluxTransformer2DModel

    from tests.fusion.test_models import flux_inputs

    model = FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                   attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                   pooled_projection_dim=32, axes_dims_rope=(4, 4, 8)).to(dtype).eval()
    inputs = flux_inputs(dtype)

    def fn(**kw):
        return model(**kw, return_dict=False)[0]

    counts = {}
    for verify in (False, True):
        b = Backend(CompilationConfig(verify=verify, **ROUTES[route]))
        torch._dynamo.reset()
        with torch.no_grad(), inductor_config.patch(fx_graph_cache=False):
            out = torch.compile(fn, backend=b)(**inputs)
        assert b.stats.fallbacks == {}, b.stats.fallbacks
        counts[verify] = dict(b.stats.patterns)
    assert counts[True] == counts[False]
    assert all(counts[True][f] > 0 for f in ("rms_norm", "rope", "adaln", "gelu", "mul_add")), counts[True]
    with torch.no_grad():
        eager = fn(**inputs)
    tol = dict(rtol=1e-4, atol=1e-4) if dtype == torch.float32 else dict(rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(out, eager, **tol)


# --- config ------------------------------------------------------------------------------------------------------


def test_verify_field_default_validation_and_no_alias():
    assert CompilationConfig.verify is False and CompilationConfig().verify is False
    assert CompilationConfig(verify=True).verify is True
    for bad in (1, "1", None):
        with pytest.raises(TypeError, match="verify"):
            CompilationConfig(verify=bad)
        with pytest.raises(TypeError, match="verify"):
            CompilationConfig.verify = bad
    assert "verify" not in CompilationConfig._aliases.values() and "verify" not in CompilationConfig._aliases
    assert CompilationConfig._fields["verify"].__doc__
    # Inductor's caches tell a verified compile from an unverified one
    uuid = {v: FusionPass(CompilationConfig(verify=v), None).uuid() for v in (False, True)}
    assert uuid[False] != uuid[True]


@pytest.mark.parametrize("value,expected", [("1", "True"), ("0", "False"), ("maybe", "False")])
def test_env_var_sets_the_process_default(value, expected):
    script = ("import warnings; warnings.simplefilter('always')\n"
              "from fusegraph import Backend, CompilationConfig\n"
              "print(CompilationConfig.verify, CompilationConfig().verify, Backend().config.verify)")
    env = dict(os.environ, FUSEGRAPH_VERIFY=value)
    done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [expected] * 3
    assert ("FUSEGRAPH_VERIFY='maybe'" in done.stderr) == (value == "maybe")


def _wrong_ln_noshift(x, scale, eps):
    return torch.ops.fusegraph.adaln(x, scale, None, eps) * 1.25


@pytest.mark.parametrize("route", sorted(ROUTES))
def test_one_of_the_families_sharing_a_switch_is_undone_alone(route, monkeypatch, tmp_path):
    """adaln, adaln_rms and adaln_noshift share enable_adalayernorm: a wrong adaln_noshift is undone, the adaln site
    of the same graph stays fused."""
    from fusegraph.fusion.patterns import adaln_noshift

    monkeypatch.setattr(adaln_noshift, "LN_FORMS", tuple(
        dataclasses.replace(form, replace=_wrong_ln_noshift) if form.replace is adaln_noshift._fused_ln_zero else form
        for form in adaln_noshift.LN_FORMS))
    monkeypatch.setattr(passes, "_passes", {k: v for k, v in passes._passes.items() if k[0] != "adaln_noshift"})
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    monkeypatch.setattr(stats_mod, "_logged", set())

    def fn(x, emb):
        shift, scale, scale2 = emb.chunk(3, dim=-1)
        h = F.layer_norm(x, [32], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]  # adaln
        return F.layer_norm(h, [32], eps=1e-6) * (1 + scale2[:, None])  # adaln_noshift (planted wrong)

    x, emb = torch.randn(2, 8, 32), torch.randn(2, 96)
    eager = fn(x, emb)
    b, out = compile_run(fn, x, emb, **ROUTES[route])
    assert b.stats.patterns["adaln_noshift"] == 1 and (out - eager).abs().max() > 0.1  # the plant is effective
    b, out = compile_run(fn, x, emb, verify=True, **ROUTES[route])
    torch.testing.assert_close(out, eager)
    assert b.stats.fallbacks == {"verify: adaln_noshift changed the result beyond the dtype's tolerance; undone": 1}
    assert b.stats.patterns["adaln_noshift"] == 0 and b.stats.patterns["adaln"] == 1
