"""Every way a user changes a weight after compile is read or detected, on every route.

The default freezing holds no copy of any weight: its constants are the parameters or views of them, so an edit
in place — also one that bypasses the version counter (``w.data += d``, ``w.data.copy_``, a numpy write) — is read
by the next call, without a re-compile. A parameter that is replaced (another tensor, another storage) is a miss of
the frozen graph's guard: a re-compile, counted. With weight copies opted into (``concat_linear``,
``pack_weights``), in-place edits are detected instead (version counters, ``.data`` accesses and a content hash).
Each step compares with eager on fresh inputs.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusegraph import Backend, CompilationConfig, freezing

ROUTES = {
    "default": {},  # the Inductor route does not freeze by default: weights are the graph's inputs
    "frozen": dict(enable_freezing=True),  # the Inductor route, frozen
    "python_wrapper": dict(enable_freezing=True, cpp_wrapper=False),  # the wrapper does not change what is read
    "aten": dict(inductor=False),
    "graph_with_compile": dict(graph_with_compile=True),
    "graph_only": dict(graph_only=True),
}


class Model(nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm = nn.RMSNorm(d, eps=1e-6)
        self.q, self.k, self.v, self.out = (nn.Linear(d, d) for _ in range(4))
        self.gate = nn.Parameter(torch.tensor(0.5))  # a 0-d parameter: Inductor would inline a frozen one
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.2)

    def forward(self, x):
        h = self.norm(x)
        a = torch.softmax(self.q(h) @ self.k(h).transpose(-1, -2) * 0.125, -1) @ self.v(h)
        return x + self.gate * F.gelu(self.out(a), approximate="tanh")


def _new_state(m, dtype=None):
    return {k: 0.3 * torch.randn_like(v, dtype=dtype) for k, v in m.state_dict().items()}


# name -> (edit, whether it is an in-place edit a frozen graph without copies reads as it is)
EDITS = {
    "data_iadd": (lambda m: m.q.weight.data.__iadd__(torch.randn_like(m.q.weight)), True),
    "data_imul": (lambda m: m.norm.weight.data.__imul__(1.5), True),
    "data_copy": (lambda m: m.k.weight.data.copy_(torch.randn_like(m.k.weight)), True),
    "data_zero": (lambda m: m.v.bias.data.zero_(), True),
    "scalar_data_fill": (lambda m: m.gate.data.fill_(-1.25), True),
    "no_grad_add": (lambda m: [p.add_(0.1 * torch.randn_like(p)) for p in m.parameters()], True),
    "numpy_write": (lambda m: m.out.weight.detach().numpy().__iadd__(0.5), True),
    "load_state_dict": (lambda m: m.load_state_dict(_new_state(m)), True),
    "load_state_dict_cast": (lambda m: m.load_state_dict(_new_state(m, torch.float64)), True),
    "data_assign": (lambda m: setattr(m.q.weight, "data", torch.randn_like(m.q.weight)), False),
    "replace_parameter": (lambda m: setattr(m.k, "weight", nn.Parameter(torch.randn_like(m.k.weight))), False),
    "load_state_dict_assign": (lambda m: m.load_state_dict(_new_state(m), assign=True), False),
    "module_swap": (lambda m: setattr(m, "v", nn.Linear(32, 32)), False),
    "to_dtype_and_back": (lambda m: m.double().float(), False),
}


def _compiled(route, **extra):
    backend = Backend(CompilationConfig(**ROUTES[route], **extra))
    return backend


def _check(fn, m, what):
    """fp32 against eager on fresh inputs, the absolute tolerance taken relative to the output's scale: some edits
    (``numpy_write`` adds 0.5 to every weight of a 32-wide projection) make outputs of ~10 whose residual sums
    cancel to ~0.1, where a rounding-level difference is ~1e-5 absolute (the compiled result is then no farther
    from a float64 model than eager's); a stale weight is off by 0.1-10."""
    x = torch.randn(2, 8, 32)
    ref = m(x)
    atol = 1e-5 * max(1.0, ref.abs().max().item())
    torch.testing.assert_close(fn(x), ref, rtol=1e-5, atol=atol, msg=lambda s: f"after {what}: {s}")


def _apply(m, name):
    with torch.no_grad():
        EDITS[name][0](m)


@pytest.mark.parametrize("route", ROUTES)
def test_every_edit_is_read_or_detected(route):
    """One compiled model, each edit in turn: in-place edits are read with no compile of any kind; replacements
    cost one counted re-compile (a frozen-graph miss, or Dynamo's own guard for a swapped module or dtype)."""
    m = Model().eval()
    backend = _compiled(route)
    fn = torch.compile(m, backend=backend)
    with torch.no_grad():
        _check(fn, m, "compile")
        _check(fn, m, "a second call")
        for name, (_, read) in EDITS.items():
            before = (backend.stats.frozen_recompiles, backend.stats.graphs_compiled)
            _apply(m, name)
            _check(fn, m, name)
            _check(fn, m, f"{name}, replayed")
            after = (backend.stats.frozen_recompiles, backend.stats.graphs_compiled)
            if read:
                assert after == before, f"{name}: an in-place edit was re-compiled {before} -> {after}"
            elif route != "default":  # unfrozen, a replaced weight is just another input
                assert sum(after) > sum(before), f"{name}: a replaced weight was not re-compiled"


@pytest.mark.parametrize("route", ["default", "frozen", "python_wrapper", "aten", "graph_with_compile"])
def test_edits_after_many_calls_and_past_the_refreeze_limit(route, monkeypatch):
    """Edits made after 35 calls, and once the frozen graph ran out of frozen compiles (the unfrozen compile then
    serves other weights): still read."""
    monkeypatch.setattr(freezing, "FROZEN_SPECIALIZATION_LIMIT", 2)
    m = Model().eval()
    backend = _compiled(route)
    fn = torch.compile(m, backend=backend)
    with torch.no_grad():
        for i in range(35):
            _check(fn, m, f"call {i}")
        for name in ("data_iadd", "data_copy", "numpy_write"):
            _apply(m, name)
            _check(fn, m, f"{name} after 35 calls")
        for name in ("data_assign", "data_assign", "replace_parameter"):  # 1 frozen re-compile, then unfrozen
            _apply(m, name)
            _check(fn, m, f"{name} (the re-freeze limit)")
        if route != "default":  # nothing frozen, nothing to re-freeze
            assert any("unfrozen compile" in r for r in backend.stats.fallbacks), backend.stats.fallbacks
        for name in ("data_iadd", "data_zero", "scalar_data_fill", "load_state_dict"):
            _apply(m, name)
            _check(fn, m, f"{name} past the re-freeze limit")


@pytest.mark.parametrize("route", ["frozen", "aten"])
@pytest.mark.parametrize("copies", [dict(concat_linear=True), dict(pack_weights=True, concat_linear=True)])
def test_edits_of_copied_weights_are_detected(route, copies):
    """With weight copies opted into, in-place edits — also through ``.data``, which bypasses the version counter —
    make the graph re-compile on the new values (counted); unchanged weights, and ``.data`` only read, do not."""
    m = Model().eval()
    backend = _compiled(route, **copies)
    fn = torch.compile(m, backend=backend)
    with torch.no_grad():
        _check(fn, m, "compile")
        assert m.q.weight.data.shape == (32, 32)  # a read of .data: hashed, found unchanged
        _check(fn, m, "a read of .data")
        assert backend.stats.frozen_recompiles == 0
        for name in ("data_iadd", "data_imul", "data_copy", "data_zero", "load_state_dict", "data_assign"):
            before = backend.stats.frozen_recompiles
            _apply(m, name)
            _check(fn, m, name)
            assert backend.stats.frozen_recompiles == before + 1, name
        alias = m.k.weight.data  # held across calls: written after the next call
        _check(fn, m, "an alias held")
        alias.mul_(-1.0)
        _check(fn, m, "a write through a held .data alias")


def test_frozen_constants_alias_the_parameters():
    """The default freezing holds no weight copy: each frozen constant of the aten route's graph shares storage with
    a parameter; a dtype cast of a weight stays an op of the graph (a folded cast would be a stale copy)."""

    class Cast(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.w = nn.Parameter(torch.randn(16, 16, dtype=torch.float64))

        def forward(self, x):
            return self.lin(x) @ self.w.float().t()

    m = Cast().eval()
    seen = []
    original = freezing.freeze_aot_graph

    def spy(*args, **kwargs):
        graph, keep = original(*args, **kwargs)
        seen.append(graph)
        return graph, keep

    storages = {p.untyped_storage().data_ptr() for p in m.parameters()}
    x = torch.randn(3, 16)
    with torch.no_grad(), pytest.MonkeyPatch.context() as mp:
        mp.setattr(freezing, "freeze_aot_graph", spy)
        fn = torch.compile(m, backend=_compiled("aten"))
        torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)
        m.w.data.mul_(2)
        torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)
    (graph,) = seen
    constants = [getattr(graph, n.target) for n in graph.graph.nodes if n.op == "get_attr"]
    assert constants and all(c.untyped_storage().data_ptr() in storages for c in constants)
    ops = [str(n.target) for n in graph.graph.nodes if n.op == "call_function"]
    assert "aten._to_copy.default" in ops or "prims.convert_element_type.default" in ops, ops


def test_copy_mode_hash_sees_what_changed():
    a = torch.randn(5, 7)
    h = freezing.content_hash(a)
    assert freezing.content_hash(a.clone()) == h
    b = a.clone()
    b[0, 0], b[1, 1] = a[1, 1], a[0, 0]  # a swap keeps the sum
    assert freezing.content_hash(b) != h
    c = a.clone()
    c[4, 6] += 1e-6
    assert freezing.content_hash(c) != h
    assert freezing.content_hash(a.t()) != h  # another order
    bf = torch.randn(3, 3).bfloat16()  # 9 two-byte elements: padded to whole words
    assert freezing.content_hash(bf) == freezing.content_hash(bf.clone())


def test_fail_on_recompile_stance_refuses_a_refreeze():
    m = Model().eval()
    fn = torch.compile(m, backend=_compiled("aten"))
    with torch.no_grad():
        _check(fn, m, "compile")
        _apply(m, "data_assign")
        with torch.compiler.set_stance("fail_on_recompile"):
            with pytest.raises(RuntimeError, match="fail_on_recompile"):
                fn(torch.randn(2, 8, 32))
        _check(fn, m, "the stance lifted")


def _rss_mib() -> float:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.parametrize("route", ROUTES)
def test_deleted_models_free_their_weights(route):
    """A deleted model and its compiled function free their weights, as plain ``torch.compile``'s do: no weak
    reference to a parameter survives, nor to the numpy arrays whose memory the weights' storages are (a storage
    keeps its array alive: the array's death means the weight's bytes were freed, by whatever alias held them)."""
    import gc
    import weakref

    import numpy as np

    params, arrays = [], []
    for _ in range(3):
        m = nn.Sequential(nn.Linear(256, 256), nn.GELU(), nn.Linear(256, 256)).eval()
        for lin in (m[0], m[2]):
            for name in ("weight", "bias"):
                arr = (0.06 * np.random.randn(*getattr(lin, name).shape)).astype(np.float32)
                setattr(lin, name, nn.Parameter(torch.from_numpy(arr), requires_grad=False))
                arrays.append(weakref.ref(arr))
                params.append(weakref.ref(getattr(lin, name)))
                del arr
        fn = torch.compile(m, backend=_compiled(route))
        with torch.no_grad():
            x = torch.randn(4, 256)
            torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)
            fn(x)
        del m, fn, lin
        gc.collect()
    assert sum(r() is not None for r in params) == 0
    assert sum(r() is not None for r in arrays) == 0


def test_deleted_models_free_their_weights_with_weight_copies():
    """Also with packed/concatenated copies opted into (the copies are the compiled graph's own)."""
    import gc
    import weakref

    refs = []
    for _ in range(2):
        m = Model().eval()
        refs += [weakref.ref(p) for p in m.parameters()]
        fn = torch.compile(m, backend=_compiled("aten", concat_linear=True, pack_weights=True))
        with torch.no_grad():
            _check(fn, m, "compile")
        del m, fn
        gc.collect()
    assert sum(r() is not None for r in refs) == 0


@pytest.mark.parametrize("route", ["default", "aten"])
def test_a_float_attribute_read_from_a_tensor_is_not_frozen(route):
    """After a float attribute changes, Dynamo passes it as a 0-d tensor read with ``.item()``; a frozen graph's
    re-compile (outside Dynamo) cannot trace that, so such a graph is not frozen and a replaced weight is read."""

    class Scaled(nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(16, 16)
            self.scale = 1.0

        def forward(self, x):
            return self.lin(x) * self.scale

    m = Scaled().eval()
    fn = torch.compile(m, backend=_compiled(route))
    x = torch.randn(2, 16)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)
        m.scale = 0.7
        torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)
        m.scale = 0.3
        torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)
        m.lin.weight.data = torch.randn(16, 16)
        torch.testing.assert_close(fn(x), m(x), rtol=1e-5, atol=1e-5)
