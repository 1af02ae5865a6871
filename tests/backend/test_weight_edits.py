"""Every way a user changes a weight after compile is read, on every route.

No default route folds parameters: they are graph inputs, read where they live, so every in-place edit — also one
that bypasses the version counter (``w.data += d``, ``w.data.copy_``, a numpy write) — is read by the next call
without a compile, and a replaced parameter is just another input. The opt-in freezing of the Inductor route
(``enable_freezing``, ``pack_weights``, ``concat_linear``) serves its frozen compile only for the parameters it
folded, unchanged (identity, storage, version counter); any other call runs its one unfrozen compile. Writes through
``.data`` bypass the version counter and are not seen by a frozen graph (GUIDE, "Weights"): those edits are tested
on the unfrozen routes only. Each step compares with eager on fresh inputs.
"""
import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from fusegraph import Backend, CompilationConfig

ROUTES = {
    "default": {},  # the Inductor route: weights are the graph's inputs
    "python_wrapper": dict(cpp_wrapper=False),  # the wrapper does not change what is read
    "aten": dict(inductor=False),
    "graph_with_compile": dict(graph_with_compile=True),
    "graph_only": dict(graph_only=True),
}
FROZEN = {
    "frozen": dict(enable_freezing=True),  # the Inductor route, frozen on request
    "frozen_python_wrapper": dict(enable_freezing=True, cpp_wrapper=False),
    "packed": dict(pack_weights=True, concat_linear=True),  # frozen, with weight copies
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


# name -> (edit, whether it is an in-place edit (read with no compile of any kind))
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


# the edits a frozen graph's guard sees: the version counter, the storage, the tensor's identity
GUARDED = ("no_grad_add", "load_state_dict", "load_state_dict_cast", "data_assign", "replace_parameter",
           "load_state_dict_assign", "module_swap", "to_dtype_and_back")


def _compiled(route, **extra):
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(**{**ROUTES, **FROZEN}[route], **extra))
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
def test_every_edit_is_read(route):
    """One compiled model, each edit in turn: in-place edits are read with no compile of any kind; a replaced
    parameter is another input (no compile either); a swapped module or dtype is Dynamo's own recompile."""
    m = Model().eval()
    backend = _compiled(route)
    fn = torch.compile(m, backend=backend)
    with torch.no_grad():
        _check(fn, m, "compile")
        _check(fn, m, "a second call")
        for name, (_, read) in EDITS.items():
            before = backend.stats.graphs_compiled
            _apply(m, name)
            _check(fn, m, name)
            _check(fn, m, f"{name}, replayed")
            if read or name in ("data_assign", "replace_parameter", "load_state_dict_assign"):
                assert backend.stats.graphs_compiled == before, f"{name}: compiled again"
    assert backend.stats.frozen_recompiles == 0


@pytest.mark.parametrize("route", FROZEN)
def test_every_guarded_edit_of_a_frozen_graph_is_read(route):
    """A frozen graph: each edit its guard sees makes the one unfrozen compile serve (made once, counted once)."""
    m = Model().eval()
    backend = _compiled(route)
    fn = torch.compile(m, backend=backend)
    with torch.no_grad():
        _check(fn, m, "compile")
        _check(fn, m, "a second call")
        assert backend.stats.frozen_recompiles == 0
        for name in GUARDED:
            _apply(m, name)
            _check(fn, m, name)
            _check(fn, m, f"{name}, replayed")
    assert backend.stats.frozen_recompiles == 1
    assert any("unfrozen compile" in r for r in backend.stats.fallbacks), backend.stats.fallbacks


@pytest.mark.parametrize("route", [*ROUTES, *FROZEN])
def test_edits_after_many_calls(route):
    """Edits made after 35 calls: still read (on a frozen graph, those its guard sees)."""
    m = Model().eval()
    backend = _compiled(route)
    fn = torch.compile(m, backend=backend)
    edits = ("no_grad_add", "load_state_dict", "data_assign", "replace_parameter") if route in FROZEN else \
        ("data_iadd", "data_copy", "numpy_write", "data_assign", "replace_parameter", "data_zero",
         "scalar_data_fill", "load_state_dict")
    with torch.no_grad():
        for i in range(35):
            _check(fn, m, f"call {i}")
        for name in edits:
            _apply(m, name)
            _check(fn, m, f"{name} after 35 calls")


def test_fail_on_recompile_stance_refuses_the_unfrozen_compile():
    m = Model().eval()
    fn = torch.compile(m, backend=_compiled("frozen"))
    with torch.no_grad():
        _check(fn, m, "compile")
        _apply(m, "data_assign")
        with torch.compiler.set_stance("fail_on_recompile"):
            with pytest.raises(RuntimeError, match="fail_on_recompile"):
                fn(torch.randn(2, 8, 32))
        _check(fn, m, "the stance lifted")


@pytest.mark.parametrize("route", [*ROUTES, *FROZEN])
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
        fn = torch.compile(m, backend=_compiled("packed"))
        with torch.no_grad():
            _check(fn, m, "compile")
        del m, fn
        gc.collect()
    assert sum(r() is not None for r in refs) == 0


@pytest.mark.parametrize("route", ["frozen", "aten"])
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
