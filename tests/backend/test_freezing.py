"""Weights on every route: parameters stay parameters (no default route folds them), and the opt-in freezing of the
Inductor route (``enable_freezing``, ``pack_weights``, ``concat_linear``) never serves values it no longer holds.

Dynamo compiles a module class's forward once and reuses the graph for every instance of the class, with the
parameters as graph inputs; weights are updated in place, replaced, or re-pointed (``.data =``) after compile. Every
route must give eager's result.
"""
import copy
import gc
import os
import subprocess
import sys
import threading
import weakref

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusegraph import Backend, CompilationConfig, freezing

ROUTES = {
    "default": dict(),
    "frozen": dict(enable_freezing=True),  # the Inductor route, frozen on request
    "aten": dict(inductor=False),
    "graph_with_compile": dict(graph_with_compile=True),
    "graph_only": dict(graph_only=True),
}
UNFROZEN = [r for r in ROUTES if r != "frozen"]


class Block(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.lin = nn.Linear(d, d)
        self.norm = nn.RMSNorm(d, eps=1e-6)

    def forward(self, x):
        return F.gelu(self.lin(self.norm(x)), approximate="tanh")


class Net(nn.Module):
    """One Block graph, reused by Dynamo for every instance (a graph break between)."""

    def __init__(self, n=3, d=8):
        super().__init__()
        self.blocks = nn.ModuleList([Block(d) for _ in range(n)])
        for p in self.parameters():
            nn.init.normal_(p)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
            torch._dynamo.graph_break()
        return x


def compiled(net, route, **extra):
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(**ROUTES[route], **extra))
    return torch.compile(net, backend=backend), backend


def checked(net, route, x):
    """``compiled``, and its first call checked against eager."""
    fn, backend = compiled(net, route)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
    return fn, backend


@pytest.mark.parametrize("route", UNFROZEN)
def test_no_default_route_folds_parameters(route, monkeypatch):
    """With the default config no route freezes: the compile never enters the frozen stage, and what Dynamo gets is
    no FrozenGraph."""
    entered = []
    monkeypatch.setattr(freezing, "compile_frozen", lambda *a, **k: entered.append(1))
    torch.manual_seed(10)
    net, x = Block().eval(), torch.randn(3, 8)
    fn, backend = checked(net, route, x)
    assert entered == [] and backend.stats.frozen_recompiles == 0 and backend.stats.fallbacks == {}


@pytest.mark.parametrize("how", ["config", "options"])
def test_auto_freezing_reads_as_off(how, monkeypatch):
    """enable_freezing='auto' is documented as False: nothing folds, and an edit through .data is read (it froze, and
    the edit was lost)."""
    entered = []
    monkeypatch.setattr(freezing, "compile_frozen", lambda *a, **k: entered.append(1))
    assert not freezing.wanted(CompilationConfig(enable_freezing="auto"))
    torch.manual_seed(11)
    net, x = Block().eval(), torch.randn(3, 8)
    torch._dynamo.reset()
    if how == "config":
        fn = torch.compile(net, backend=Backend(CompilationConfig(enable_freezing="auto")))
    else:
        fn = torch.compile(net, backend="fusegraph", options={"freezing": "auto"})
    with torch.no_grad():
        torch.testing.assert_close(fn(x), net(x))
        net.norm.weight.data += 1
        torch.testing.assert_close(fn(x), net(x))
    assert entered == []


@pytest.mark.parametrize("route", ROUTES)
def test_graph_reused_across_instances_uses_each_instance_weights(route):
    torch.manual_seed(0)
    net = Net().eval()
    fn, backend = compiled(net, route)
    with torch.no_grad():
        for _ in range(2):  # the second call replays
            x = torch.randn(2, 8)
            torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.graphs_compiled == 1  # one Dynamo graph for the Block class
    # frozen: instance 1 runs the frozen compile, instances 2 and 3 the one unfrozen compile of the same graph
    assert backend.stats.frozen_recompiles == (1 if route == "frozen" else 0)
    if route != "graph_only":
        # the sites of one Dynamo graph count once
        assert backend.stats.patterns["rms_norm"] == 1 and backend.stats.patterns["gelu"] == 1


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("how", ["copy_", "load_state_dict", "replace_parameter", "set_data", "mul_"])
def test_weights_changed_after_compile_are_not_stale(route, how):
    torch.manual_seed(1)
    net, x = Block().eval(), torch.randn(3, 8)
    fn, backend = checked(net, route, x)
    with torch.no_grad():
        new_w = torch.randn(8, 8)
        if how == "copy_":
            net.lin.weight.copy_(new_w)
        elif how == "load_state_dict":
            state = copy.deepcopy(net.state_dict())
            state["lin.weight"] = new_w
            net.load_state_dict(state)
        elif how == "replace_parameter":
            net.lin.weight = nn.Parameter(new_w)
        elif how == "set_data":
            net.lin.weight.data = new_w
        else:
            net.norm.weight.mul_(3)
        torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)  # and replayed again
    # unfrozen routes read every weight where it lives; the frozen compile serves only what it folded, unchanged
    assert backend.stats.frozen_recompiles == (1 if route == "frozen" else 0)
    assert backend.stats.graphs_compiled == 1


@pytest.mark.parametrize("route", ROUTES)
def test_inference_tensors_as_parameters(route):
    """A model built (or loaded with ``assign=True``) under ``torch.inference_mode()`` has inference tensors as
    parameters; they have no version counter. Every route runs it; the frozen route compiles it unfrozen."""
    torch.manual_seed(11)
    with torch.inference_mode():
        m = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
        loaded = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64)).eval()
        loaded.load_state_dict({k: v.clone() * 2 for k, v in m.state_dict().items()}, assign=True)
        for model in (m, loaded):
            assert all(p.is_inference() for p in model.parameters())
            fn, backend = compiled(model, route)
            x = torch.randn(4, 64)
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
            model[0].weight.mul_(2)  # an in-place edit of an inference tensor, read by the next call
            torch.testing.assert_close(fn(x), model(x), rtol=1e-5, atol=1e-5)
            if route == "frozen":
                assert any("inference tensors" in reason for reason in backend.stats.fallbacks)


class _Scales(nn.Module):
    """Reads one element of a 12-element parameter: a 0-d view Inductor would write into its code as a number."""

    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(16, 16)
        self.scales = nn.Parameter(torch.rand(12) + 0.5)

    def forward(self, x):
        return self.lin(x) * self.scales[3]


@pytest.mark.parametrize("route", ROUTES)
def test_an_edit_of_a_small_parameter_view_is_read(route):
    """``self.scales[3]`` of a 12-element parameter: an in-place edit is read (unfrozen routes: the parameter is an
    input; frozen: the version counter moves, the unfrozen compile serves)."""
    torch.manual_seed(12)
    m = _Scales().eval()
    fn, backend = compiled(m, route)
    x = torch.randn(4, 16)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)
        m.scales.mul_(2)
        torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)


_OTHER_PROCESS = r"""
import sys, torch, torch.nn as nn, fusegraph

class Scaled(nn.Module):  # one element of a 12-element parameter: Inductor writes the folded view as a number
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(32, 32)
        self.scales = nn.Parameter(torch.rand(12) + 0.5)

    def forward(self, x):
        return self.lin(x) * self.scales[3]

torch.manual_seed(int(sys.argv[1]))
m = Scaled().eval()
x = torch.ones(2, 32)
fn = torch.compile(m, backend=fusegraph.Backend(dict(enable_freezing=True)))
with torch.no_grad():
    print(float((fn(x) - m(x)).abs().max()))
"""


@pytest.mark.full  # ~35 s: two processes
def test_a_frozen_graph_is_never_served_from_another_process_cache(tmp_path):
    """Two processes on one Inductor cache folder, the same model class with other weights, frozen: the second is
    compiled for its own weights, not served the first one's constants from the cache."""
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path), OMP_NUM_THREADS="1")
    for seed in (1, 2):
        out = subprocess.run([sys.executable, "-c", _OTHER_PROCESS, str(seed)], env=env, capture_output=True,
                             text=True, timeout=600)
        assert out.returncode == 0, out.stderr[-2000:]
        assert float(out.stdout.strip().splitlines()[-1]) < 1e-4, (seed, out.stdout)


@pytest.mark.parametrize("route", ROUTES)
def test_a_dtype_change_frees_the_old_weights(route):
    """``model.to(torch.bfloat16)`` after the first call frees the old float32 weights at once, as in eager, on
    every default route (nothing compiled holds them); the next call gives eager's bf16 result. The weights' storages are
    numpy arrays' memory (a storage keeps its array alive): an array's death means its weight's bytes were freed."""
    import numpy as np

    torch.manual_seed(13)
    m = nn.Sequential(nn.Linear(32, 64), nn.GELU(approximate="tanh"), nn.Linear(64, 32)).eval()
    arrays = []
    for lin in (m[0], m[2]):
        for name in ("weight", "bias"):
            arr = (0.1 * np.random.randn(*getattr(lin, name).shape)).astype(np.float32)
            setattr(lin, name, nn.Parameter(torch.from_numpy(arr), requires_grad=False))
            arrays.append(weakref.ref(arr))
            del arr
    del lin
    fn, backend = compiled(m, route)
    x = torch.randn(4, 32)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)
    m.to(torch.bfloat16)
    gc.collect()
    held = sum(r() is not None for r in arrays)
    # opt-in freezing: Dynamo compiles a new graph for the new dtypes and never calls the frozen one again, which
    # holds the float32 constants until the model dies (GUIDE §1.3)
    assert held == (4 if route == "frozen" else 0), f"{held} old float32 weights still held"
    with torch.no_grad():
        xb = x.to(torch.bfloat16)
        torch.testing.assert_close(fn(xb), m(xb))


@pytest.mark.parametrize("route", ["frozen", "aten", "graph_with_compile"])
def test_instances_sharing_a_graph_on_threads_get_their_own_results(route):
    """Two instances of one class, compiled by one backend (one Dynamo graph), each called from its own thread with
    a tiny switch interval: every result is the instance's own."""
    torch.manual_seed(14)
    a, b = Block().eval(), Block().eval()
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(**ROUTES[route]))
    fa, fb = torch.compile(a, backend=backend), torch.compile(b, backend=backend)
    x = torch.randn(3, 8)
    with torch.no_grad():
        want = {id(fa): a(x), id(fb): b(x)}
        fa(x), fb(x)  # compiled (and the frozen graph's unfrozen compile made) before the threads start
    wrong, errors = [], []

    def run(fn):
        try:
            with torch.no_grad():
                for _ in range(1500):
                    if not torch.allclose(fn(x), want[id(fn)], rtol=1e-5, atol=1e-5):
                        wrong.append(1)
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        threads = [threading.Thread(target=run, args=(f,)) for f in (fa, fb)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        sys.setswitchinterval(interval)
    assert errors == [] and wrong == []


@pytest.mark.parametrize("route", ["default", "aten"])
def test_dynamic_shapes_are_not_frozen(route):
    """A frozen graph's unfrozen compile runs outside Dynamo and would specialise symbolic shapes: graphs with
    symbolic shapes are compiled unfrozen."""
    torch.manual_seed(3)
    net = Net(n=2).eval()
    fn, backend = compiled(net, route, enable_freezing=True)
    with torch.no_grad():
        for rows in (2, 5, 7, 5, 2):  # 5 makes Dynamo recompile the graph with a symbolic row count
            x = torch.randn(rows, 8)
            torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.graphs_compiled == 2
    assert backend.stats.frozen_recompiles == (1 if route == "default" else 0)  # static graph: instance 2
    reason = "symbolic shapes" if route == "default" else "Inductor route only"
    assert any(reason in r for r in backend.stats.fallbacks), backend.stats.fallbacks


def test_unchanged_weights_never_recompile():
    torch.manual_seed(4)
    net = Block().eval()
    fn, backend = compiled(net, "frozen")
    with torch.no_grad():
        for _ in range(5):
            x = torch.randn(3, 8)
            torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.frozen_recompiles == 0 and backend.stats.graphs_compiled == 1


def test_an_edit_lets_the_frozen_compile_go(monkeypatch):
    """After an in-place edit the frozen compile is stale for good: it is dropped, and the unfrozen one serves."""
    made = []
    compile_frozen = freezing.compile_frozen
    monkeypatch.setattr(freezing, "compile_frozen", lambda *a, **k: made.append(compile_frozen(*a, **k)) or made[-1])
    torch.manual_seed(15)
    net = Block().eval()
    fn, backend = compiled(net, "frozen")
    x = torch.randn(3, 8)
    with torch.no_grad():
        fn(x)
        (graph,) = made
        assert graph.frozen
        net.lin.weight.add_(1)
        torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
    assert not graph.frozen and backend.stats.frozen_recompiles == 1


def test_frozen_guard_check():
    from fusegraph import _C

    a, b = nn.Parameter(torch.randn(3)), nn.Parameter(torch.randn(3))
    g = _C.graph.FrozenGuard([1], [a])
    M = _C.graph.FrozenMatch
    assert g.check((torch.randn(2), a)) == M.SAME
    assert g.check((torch.randn(2), b)) == M.OTHER
    assert g.check((a,)) == M.OTHER  # too few arguments
    assert g.check((torch.randn(2), 1.0)) == M.OTHER  # not a tensor
    with torch.no_grad():
        a.mul_(2)
    assert g.check((None, a)) == M.CHANGED
    g = _C.graph.FrozenGuard([0], [b])
    b.data = torch.randn(3)
    assert g.check((b,)) == M.CHANGED


def _first_tensor(out):
    if isinstance(out, (tuple, list)):
        return out[0]
    return getattr(out, "sample", out)


@pytest.mark.parametrize("route", [pytest.param("frozen", marks=pytest.mark.full), "aten", "graph_with_compile"])
@pytest.mark.parametrize("name", ["HiDreamImageTransformer2DModel", "HunyuanVideo15Transformer3DModel"])
def test_models_that_reuse_block_graphs(name, route):
    """Two zoo models in which Dynamo reuses one block graph (graph breaks inside the blocks) for every block
    instance: each instance runs with its own weights."""
    from fusegraph import zoo

    model, kwargs = zoo.build(name)
    fn, backend = compiled(model, route)
    with torch.no_grad():
        ref = _first_tensor(model(**kwargs))
        torch.testing.assert_close(_first_tensor(fn(**kwargs)), ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(_first_tensor(fn(**kwargs)), ref, rtol=1e-4, atol=1e-4)
    if name.startswith("HiDream") and route == "frozen":  # its MoE breaks the graph inside every block
        assert backend.stats.frozen_recompiles >= 1


class _ConvThenGelu(nn.Module):
    """A conv whose output freezing's CPU weight packing lays out channels-last, then a tanh-GELU on a transposed
    view (eager's gelu keeps that layout; the fused op writes row-major)."""

    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)

    def forward(self, x):
        h = self.conv(x)
        return h, F.gelu(h.flatten(2).transpose(1, 2), approximate="tanh")


@pytest.mark.parametrize("route", ROUTES)
def test_outputs_keep_eager_strides(route):
    torch.manual_seed(5)
    net = _ConvThenGelu().eval()
    fn, backend = compiled(net, route)
    x = torch.randn(2, 4, 6, 5)
    with torch.no_grad():
        for _ in range(2):
            outs, refs = fn(x), net(x)
            for out, ref in zip(outs, refs):
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
                assert out.stride() == ref.stride()


@pytest.mark.parametrize("route", ["aten", "graph_with_compile"])
def test_outputs_keep_eager_strides_under_symbolic_shapes(route):
    """Under dynamic=True the traced strides are symbols: a dense output is restrided to its traced memory order at
    each call's sizes (two sizes, one compile)."""
    torch.manual_seed(5)
    net = _ConvThenGelu().eval()
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(**ROUTES[route]))
    fn = torch.compile(net, backend=backend, dynamic=True)
    with torch.no_grad():
        for x in (torch.randn(2, 4, 6, 5), torch.randn(2, 4, 7, 3)):
            outs, refs = fn(x), net(x)
            for out, ref in zip(outs, refs):
                torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
                assert out.stride() == ref.stride()
    assert backend.stats.patterns.get("gelu", 0) == 1 and backend.stats.graphs_compiled == 1


@pytest.mark.parametrize("dynamic", [None, True])
def test_output_strides_cause_no_recompile(dynamic):
    """Block outputs feed the next Dynamo frame: other strides than traced would fail its stride guards (under
    dynamic=True too: HunyuanVideo 1.5's second block was compiled again within the first call)."""
    torch.manual_seed(6)

    class Chain(nn.Module):
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList([_ConvThenGelu() for _ in range(3)])
            self.proj = nn.ModuleList([nn.Conv2d(8, 4, 1) for _ in range(3)])

        def forward(self, x):
            for block, proj in zip(self.blocks, self.proj):
                h, _ = block(x)
                torch._dynamo.graph_break()
                x = proj(h)
            return x

    net = Chain().eval()
    graphs = []

    def record(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(2, 4, 6, 5)
    with torch.no_grad():
        ref = net(x)
        torch.compile(net, backend=record, dynamic=dynamic)(x)
        torch._dynamo.reset()
        backend = Backend(CompilationConfig(**ROUTES["aten"]))
        fn = torch.compile(net, backend=backend, dynamic=dynamic)
        torch.testing.assert_close(fn(x), ref, rtol=1e-5, atol=1e-5)
    assert backend.stats.graphs_compiled == len(graphs)  # no recompile of the block frames


@pytest.mark.parametrize("route", ["frozen"])
@pytest.mark.parametrize("pack_weights", [False, True])
def test_freezing_packs_no_float32_linear_weights(route, pack_weights):
    """Freezing alone packs no weight (a packed weight is a copy). With ``pack_weights``, float32 linears are
    not packed where the class's GEMM table does not say packing pays (here: forced to "none"; a packed MKL float32
    linear of a few rows is ~3x slower than addmm), also once Inductor's packing patterns are registered in the
    process (an earlier torch.compile(options={"freezing": True})); bf16 ones are (oneDNN), where this CPU has
    oneDNN's bf16 kernels and the class does not widen bf16 linears to float32."""
    from torch._dynamo.utils import counters
    from torch._inductor.fx_passes.mkldnn_fusion import _mkldnn_weight_pack_init

    from fusegraph.fusion import gemm_table
    from fusegraph.fusion.patterns import linear

    if not torch._C._has_mkldnn:
        pytest.skip("no mkldnn: nothing would pack")
    _mkldnn_weight_pack_init()
    bf16_packs = (pack_weights and torch.ops.mkldnn._is_mkldnn_bf16_supported()
                  and torch.bfloat16 not in linear.routed_dtypes("auto"))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(gemm_table, "pack_lookup", lambda dtype=None, key=None: ("none", "forced by the test"))
        for dtype, packed in ((torch.float32, False), (torch.bfloat16, bf16_packs)):
            for rows, width in ((4, 16), (64, 128)):  # a few-row linear, and a site of the table's kind
                net = torch.nn.Sequential(torch.nn.Linear(width, width), torch.nn.GELU(),
                                          torch.nn.Linear(width, width)).eval().to(dtype)
                counters.clear()
                torch._dynamo.reset()
                fn, backend = compiled(net, route, pack_weights=pack_weights)
                x = torch.randn(rows, width, dtype=dtype)
                with torch.no_grad():  # bf16: two linears and a GELU, each rounding where eager's does not
                    torch.testing.assert_close(fn(x).float(), net(x).float(), **(
                        {} if dtype == torch.float32 else dict(rtol=2e-2, atol=1e-2)))
                assert bool(counters["inductor"].get("mkldnn_linear_weight_pack_matcher_count")) == packed, dtype


@pytest.mark.parametrize("pack", ["onednn", "none"])
def test_float32_linears_pack_for_onednn_where_the_class_table_says(pack, monkeypatch):
    """``pack_weights=True`` packs a float32 linear of many rows for oneDNN (``mkldnn._linear_pointwise`` on a weight
    reordered once, never Inductor's MKL packing) exactly where the class's GEMM table says ``pack: "onednn"``; a
    few-row one (the gemv family's) stays unpacked either way. Results stay eager's (fp32 tolerance, fresh
    inputs), and an in-place weight edit is read (the frozen compile lets go)."""
    from torch._dynamo.utils import counters
    from torch._inductor.fx_passes.mkldnn_fusion import _mkldnn_weight_pack_init
    from torch._inductor.utils import run_and_get_code

    from fusegraph.fusion import gemm_table

    if not torch._C._has_mkldnn:
        pytest.skip("no mkldnn: nothing would pack")
    _mkldnn_weight_pack_init()
    monkeypatch.setattr(gemm_table, "pack_lookup", lambda dtype=None, key=None: (pack, "forced by the test"))
    torch.manual_seed(0)
    for rows, width, packed in ((64, 128, pack == "onednn"), (3, 128, False)):
        net = torch.nn.Sequential(torch.nn.Linear(width, 2 * width), torch.nn.GELU(),
                                  torch.nn.Linear(2 * width, width)).eval()
        counters.clear()
        torch._dynamo.reset()
        fn, backend = compiled(net, "frozen", pack_weights=True)
        x = torch.randn(rows, width) * 3
        with torch.no_grad():
            out, code = run_and_get_code(fn, x)
            torch.testing.assert_close(out, net(x), rtol=1e-5, atol=1e-5)
            x = torch.randn(rows, width) * 3
            torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
        assert bool(counters["inductor"].get("mkldnn_linear_weight_pack_matcher_count")) == packed, (rows, pack)
        code = "\n".join(code)
        assert code.count("_linear_pointwise") >= (2 if packed else 0) and ("_linear_pointwise" in code) == packed
        assert "_mkl_linear" not in code
        with torch.no_grad():
            net[0].weight.mul_(-0.5)
            torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)


class _Convs(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(4, 8, 3, padding=1)
        self.dw = nn.Conv2d(8, 8, 3, padding=1, groups=8)

    def forward(self, x):
        return self.dw(F.silu(self.conv(x)))


@pytest.mark.parametrize("route", ["default", "frozen"])
@pytest.mark.parametrize("verdict", [True, False])
def test_conv_packing_follows_the_measured_verdict(route, verdict, monkeypatch, tmp_path):
    """A convolution is packed for oneDNN only where packing was measured faster for its signature; the verdict
    is cached on disk and a later compile reads it instead of measuring again. Eager's result either way."""
    from torch._dynamo.utils import counters

    from fusegraph import packing

    if not torch._C._has_mkldnn:
        pytest.skip("no mkldnn: nothing would pack")
    monkeypatch.setattr(packing, "_verdicts", packing.VerdictFile(lambda: str(tmp_path / "conv.json")))
    from fusegraph._core import measure

    timed = []
    forms = packing._forms
    monkeypatch.setattr(packing, "_forms", lambda sig: timed.append(sig) or forms(sig))
    monkeypatch.setattr(measure, "paired_medians", lambda fns, **kw: [2e-5, 1e-5] if verdict else [1e-5, 2e-5])
    torch.manual_seed(7)
    net = _Convs().eval()
    x = torch.randn(2, 4, 6, 5)
    for attempt in range(2):
        counters.clear()
        torch._dynamo.reset()
        with torch._inductor.config.patch(fx_graph_cache=False), torch.no_grad():
            fn, backend = compiled(net, route, pack_weights=True)
            torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
        packed = counters["inductor"].get("mkldnn_conv_weight_pack_matcher_count", 0)
        assert packed == (2 if verdict else 0), (attempt, packed)
        if attempt == 0:
            assert sorted(s[2] for s in timed) == [(8, 1, 3, 3), (8, 4, 3, 3)]  # both signatures measured once
            timed.clear()
            packing._verdicts.forget()  # a new process: the verdicts come from the file
    assert timed == []
    assert all(d[1] == verdict for d in packing.decisions()[-2:])


def test_conv_packing_measures_both_forms():
    """The measurement itself: both forms run on the signature's shapes and give positive times."""
    from fusegraph import packing
    from fusegraph._core.measure import paired_medians

    if not torch._C._has_mkldnn:
        pytest.skip("no mkldnn: nothing would pack")
    for sig in (("float32", (2, 4, 6, 5), (8, 4, 3, 3), True, (1, 1), (1, 1), (1, 1), False, (0, 0), 1),
                ("float32", (1, 4, 2, 6, 5), (8, 4, 1, 2, 2), False, (1, 2, 2), (0, 0, 0), (1, 1, 1), False,
                 (0, 0, 0), 1),
                ("float32", (2, 4, 3, 3), (4, 2, 2, 2), True, (2, 2), (0, 0), (1, 1), True, (0, 0), 2)):
        t_plain, t_packed = paired_medians(list(packing._forms(sig)), min_time=0.025, rounds=7)
        assert 0 < t_plain < 1 and 0 < t_packed < 1, sig


class _QKV(nn.Module):
    def __init__(self, d=16):
        super().__init__()
        self.q, self.k, self.v = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, d)

    def forward(self, x):
        q, k, v = self.q(x), self.k(x), self.v(x)
        return torch.softmax(q @ k.transpose(-1, -2), -1) @ v


@pytest.mark.parametrize("route", ROUTES)
@pytest.mark.parametrize("concat", [True, False])
def test_concat_linear(route, concat):
    """concat_linear: the three projections of one input become one GEMM on concatenated weights (fewer, larger
    GEMMs) on the Inductor route, which freezes for it; off, or on the routes that never fold, they stay three.
    Eager's result either way."""
    torch.manual_seed(8)
    net = _QKV().eval()
    x = torch.randn(2, 5, 16)
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(concat_linear=concat, **ROUTES[route]))
    fn = torch.compile(net, backend=backend)
    with torch._inductor.config.patch(fx_graph_cache=False), torch.no_grad():
        torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(fn(x), net(x), rtol=1e-5, atol=1e-5)
    ops = backend.last_graph_ops
    linears = ops["aten.addmm.default"] + ops["aten.mm.default"] + ops["aten.linear.default"]
    assert linears == (1 if concat and route in ("default", "frozen") else 3), ops


class _QKAndMLP(nn.Module):
    """Two projections of one shape and a 4x wider MLP projection, all of one input (as in Flux's single block)."""

    def __init__(self, d=16):
        super().__init__()
        self.q, self.k, self.mlp = nn.Linear(d, d), nn.Linear(d, d), nn.Linear(d, 4 * d)

    def forward(self, x):
        q, k = self.q(x), self.k(x)
        return torch.softmax(q @ k.transpose(-1, -2), -1), F.gelu(self.mlp(x), approximate="tanh")


@pytest.mark.parametrize("route", ["default"])
def test_concat_linear_merges_only_projections_of_one_shape(route):
    """Inductor's check would group the wide MLP projection with q and k (same input width); its consumers then
    read strided column slices (copies before the fused GELU). Only projections of one shape are merged: here
    none (Inductor's two-way pattern is for bias-free linears)."""
    torch.manual_seed(9)
    net = _QKAndMLP().eval()
    x = torch.randn(2, 5, 16)
    torch._dynamo.reset()
    fn, backend = compiled(net, route, concat_linear=True)
    with torch._inductor.config.patch(fx_graph_cache=False), torch.no_grad():
        for out, ref in zip(fn(x), net(x)):
            torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    ops = backend.last_graph_ops
    assert ops["aten.addmm.default"] + ops["aten.mm.default"] == 3, ops
