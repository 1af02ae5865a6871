"""Inductor's C++ wrapper on the CPU Inductor route (CompilationConfig.cpp_wrapper): used where it fits, results
equal to eager, fused ops called from C++, and a wrapper that fails to compile falls back to the Python one."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.models.embeddings import apply_rotary_emb

import fusegraph
import fusegraph.pipeline as pipeline_mod


class RopeGeluBlock(nn.Module):
    """diffusers' RoPE in both forms (interleaved and rotate-half: a bool the C++ wrapper passes to rope's Scalar
    argument as an int), RMSNorm and a tanh-GELU MLP: fused sites whose ops are called from the C++ wrapper."""

    def __init__(self, d=64, heads=4):
        super().__init__()
        self.heads = heads
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.qk = nn.Linear(d, 2 * d)
        self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)

    def forward(self, x, cos, sin):
        b, s, d = x.shape
        q, k = self.qk(self.norm(x)).view(b, s, 2, self.heads, d // self.heads).permute(2, 0, 3, 1, 4).unbind(0)
        q = apply_rotary_emb(q, (cos, sin), use_real=True, use_real_unbind_dim=-1)
        k = apply_rotary_emb(k, (cos, sin), use_real=True, use_real_unbind_dim=-2)
        h = (q + k).transpose(1, 2).reshape(b, s, d)
        return self.fc2(F.gelu(self.fc1(h), approximate="tanh")) + x


def _inputs(seed=0, s=37):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2, s, 64, generator=g)
    cos, sin = torch.randn(s, 16, generator=g), torch.randn(s, 16, generator=g)
    return x, cos, sin


def _wrapper_seen(monkeypatch):
    """The cpp_wrapper each of fusegraph's Inductor compiles asked for (its config_patches), one entry per compile."""
    import torch._inductor.compile_fx as compile_fx_mod

    seen = []
    original = compile_fx_mod.compile_fx

    def record(gm, example_inputs, *args, config_patches=None, **kwargs):
        if config_patches and "post_grad_custom_pre_pass" in config_patches:
            seen.append(config_patches.get("cpp_wrapper"))
        return original(gm, example_inputs, *args, config_patches=config_patches, **kwargs)

    monkeypatch.setattr(compile_fx_mod, "compile_fx", record)
    return seen


@pytest.mark.parametrize("cpp_wrapper", [True, False])
def test_results_equal_eager_with_either_wrapper(cpp_wrapper, monkeypatch):
    torch._dynamo.reset()
    seen = _wrapper_seen(monkeypatch)
    model = RopeGeluBlock().eval()
    backend = fusegraph.Backend({"cpp_wrapper": cpp_wrapper, "fusion_choice": "always"})
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend)
        for seed in (0, 1):
            x, cos, sin = _inputs(seed)
            torch.testing.assert_close(compiled(x, cos, sin), model(x, cos, sin), rtol=1e-5, atol=1e-5)
    assert seen == [cpp_wrapper]
    assert backend.last_graph_ops["fusegraph.rope.default"] == 2
    assert backend.stats.fallbacks == {}


def test_cpp_wrapper_is_the_default_on_cpu(monkeypatch):
    torch._dynamo.reset()
    seen = _wrapper_seen(monkeypatch)
    model = RopeGeluBlock().eval()
    with torch.no_grad():
        torch.compile(model, backend=fusegraph.Backend({"fusion_choice": "model"}))(*_inputs())
    assert fusegraph.CompilationConfig().cpp_wrapper is True
    assert seen == [True]


def test_a_wrapper_that_fails_to_compile_falls_back_to_python(monkeypatch, caplog):
    torch._dynamo.reset()
    seen = _wrapper_seen(monkeypatch)
    original = pipeline_mod._compile_inductor_with

    def failing(config, gm, example_inputs, job, cpp_wrapper):
        if cpp_wrapper:
            original(config, gm, example_inputs, job, cpp_wrapper)  # the pass runs and counts, then the build fails
            raise RuntimeError("C++ compile failed: injected\nsecond line")
        return original(config, gm, example_inputs, job, cpp_wrapper)

    monkeypatch.setattr(pipeline_mod, "_compile_inductor_with", failing)
    model = RopeGeluBlock().eval()
    backend = fusegraph.Backend({"fusion_choice": "always"})
    x, cos, sin = _inputs()
    # Inductor's caches off: both attempts run the pass (the first counts the sites, the second must not again)
    with torch.no_grad(), caplog.at_level("WARNING", logger="fusegraph"), \
            torch._inductor.config.patch(force_disable_caches=True):
        out = torch.compile(model, backend=backend)(x, cos, sin)
        torch.testing.assert_close(out, model(x, cos, sin), rtol=1e-5, atol=1e-5)
    assert seen == [True, False]
    (reason,) = backend.stats.fallbacks
    assert "C++ wrapper failed to compile graph 0 (RuntimeError: C++ compile failed: injected)" in reason
    assert "Python wrapper" in reason and "second line" not in reason
    assert backend.stats.patterns["rope"] == 2  # counted once, not once per attempt
    assert backend.stats.patterns["gelu"] == 1


class Chain(nn.Module):
    """``n`` elementwise ops, a graph of ``n`` ops as Dynamo hands it."""

    def __init__(self, n):
        super().__init__()
        self.n = n

    def forward(self, x):
        for i in range(self.n):
            x = torch.sin(x) if i % 2 else x * 1.5
        return x


def test_a_graph_over_the_op_limit_gets_the_python_wrapper(monkeypatch, caplog):
    """g++ compiles a large graph's C++ wrapper in superlinear time (948 s against 122 s at Wan 2.1's 30 blocks):
    a graph of more than CPP_WRAPPER_MAX_OPS ops takes the Python wrapper, said in the log, with the same results;
    one at the limit keeps the C++ wrapper."""
    monkeypatch.setattr(pipeline_mod, "CPP_WRAPPER_MAX_OPS", 40)
    seen = _wrapper_seen(monkeypatch)
    x = torch.randn(3, 5, generator=torch.Generator().manual_seed(0))
    for n, expected in ((40, True), (41, False)):
        torch._dynamo.reset()
        model = Chain(n)
        with torch.no_grad(), caplog.at_level("INFO", logger="fusegraph"):
            out = torch.compile(model, backend=fusegraph.Backend())(x)
        torch.testing.assert_close(out, model(x), rtol=1e-6, atol=1e-6)
        assert seen[-1] is expected, (n, seen)
    assert "graph 0 has 41 ops, more than the C++ wrapper's 40" in caplog.text
    assert pipeline_mod._graph_ops(torch.fx.symbolic_trace(Chain(7))) == 7


def test_symbolic_shapes_and_non_tensor_inputs_keep_the_python_wrapper(monkeypatch):
    torch._dynamo.reset()
    seen = _wrapper_seen(monkeypatch)
    model = RopeGeluBlock().eval()
    backend = fusegraph.Backend({"fusion_choice": "always"})
    with torch.no_grad():
        compiled = torch.compile(model, backend=backend, dynamic=True)
        for s in (37, 41):
            x, cos, sin = _inputs(s=s)
            torch.testing.assert_close(compiled(x, cos, sin), model(x, cos, sin), rtol=1e-5, atol=1e-5)
    assert seen and not any(seen)
    assert not pipeline_mod._cpp_wrapper_fits(torch.fx.GraphModule({}, torch.fx.Graph()), [torch.ones(2), object()])


def test_graphs_the_cpp_wrapper_cannot_run_keep_the_python_wrapper():
    """Static CPU graphs of tensor inputs only; no collectives; no op with an ``Any`` argument (the C++ wrapper
    cannot hand one to an op it calls back in Python: context parallelism's)."""
    lib = torch.library.Library("fusegraph_test_cpp_wrapper", "DEF")
    lib.define("takes_any(Tensor x, Any y) -> Tensor")

    def graph_of(target, *args):
        g = torch.fx.Graph()
        x = g.placeholder("x")
        g.output(g.call_function(target, (x, *args)))
        return torch.fx.GraphModule({}, g)

    x = torch.ones(2)
    assert pipeline_mod._cpp_wrapper_fits(graph_of(torch.ops.aten.relu.default), [x])
    assert not pipeline_mod._cpp_wrapper_fits(graph_of(torch.ops.aten.relu.default), [x.to("meta")])
    takes_any = torch.ops.fusegraph_test_cpp_wrapper.takes_any
    for target in (takes_any, takes_any.default):  # a packet (as Dynamo records it) and its overload
        assert not pipeline_mod._cpp_wrapper_fits(graph_of(target, None), [x])
    collective = graph_of(torch.ops._c10d_functional.all_reduce.default, "sum", "0")
    assert not pipeline_mod._cpp_wrapper_fits(collective, [x])


class ComplexRope(nn.Module):
    """Z-Image's complex RoPE ends in aten ops the C++ wrapper has no C shim for (select_scatter on a complex
    tensor among them): it would call them through its proxy executor, the path that crashed the process."""

    def forward(self, x, freqs):
        xc = torch.view_as_complex(x.float().reshape(*x.shape[:-1], -1, 2)) * freqs.unsqueeze(0)
        xc = xc.select_scatter(xc[:, 0] * 2, 1, 0)  # complex: an aten fallback inside Inductor's code
        return torch.view_as_real(xc).flatten(-2) + 1


class Nanmedian(nn.Module):
    """A real-valued graph with an aten op Inductor leaves to aten and the C++ wrapper has no C shim for."""

    def forward(self, x):
        return torch.nanmedian(x * 2, 1).values + 1


def _no_c_shim(op: str) -> None:
    from torchgen.aoti.fallback_ops import inductor_fallback_ops

    if op in inductor_fallback_ops:
        pytest.skip(f"this torch has a C shim for {op}")


def test_graphs_with_complex_tensors_keep_the_python_wrapper_from_the_start(monkeypatch):
    """Inductor generates no code for complex ops: the graph is not tried with the C++ wrapper at all (one compile,
    with the Python wrapper), and its result equals eager."""
    torch._dynamo.reset()
    seen = _wrapper_seen(monkeypatch)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 5, 8, generator=g)
    freqs = torch.polar(torch.ones(5, 4), torch.randn(5, 4, generator=g))
    model = ComplexRope()
    backend = fusegraph.Backend({"fusion_choice": "always"})
    with torch.no_grad(), torch._inductor.config.patch(force_disable_caches=True):
        out = torch.compile(model, backend=backend)(x, freqs)
    torch.testing.assert_close(out, model(x, freqs), rtol=1e-5, atol=1e-5)
    assert seen == [False]
    assert backend.stats.fallbacks == {}


def test_graphs_with_ops_without_a_c_shim_keep_the_python_wrapper(monkeypatch, caplog):
    """An aten op the C++ wrapper would call through its proxy executor is seen during the C++-wrapper compile, which
    is then redone with the Python wrapper: a choice, logged, not a failure."""
    _no_c_shim("aten.nanmedian.dim")
    torch._dynamo.reset()
    seen = _wrapper_seen(monkeypatch)
    x = torch.randn(3, 17, generator=torch.Generator().manual_seed(0))
    model = Nanmedian()
    backend = fusegraph.Backend({"fusion_choice": "always"})
    with torch.no_grad(), caplog.at_level("INFO", logger="fusegraph"), \
            torch._inductor.config.patch(force_disable_caches=True):
        out = torch.compile(model, backend=backend)(x)
    torch.testing.assert_close(out, model(x), rtol=1e-5, atol=1e-5)
    assert seen == [True, False]
    assert "without a C shim for Inductor's C++ wrapper (aten.nanmedian.dim)" in caplog.text
    assert backend.stats.fallbacks == {}  # a choice, not a failure
