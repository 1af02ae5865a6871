"""add/sub with an ``alpha`` and a symbolic float operand (fusion/scalar_alpha.py): torch 2.13's aot_autograd drops
the ``alpha`` (``tensorify_python_scalars``), so under ``dynamic=True`` a module's float attribute read by
``torch.add(self.eps, x, alpha=k)`` (diffusers' Cosmos learnable positional embedding) gave ``eps + x``. Every route
must give eager's values."""
from __future__ import annotations

import pytest
import torch

from fusegraph import Backend, CompilationConfig
from fusegraph.fusion import scalar_alpha

ROUTES = {"default": {}, "aten": dict(inductor=False), "graph": dict(graph_with_compile=True)}


class Scalars(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.eps = 1e-3
        self.scale = 7.0

    def forward(self, x):
        return (torch.add(self.eps, x, alpha=0.5),             # the Cosmos form: scalar first
                torch.sub(self.scale, x, alpha=2),
                x.add(self.scale, alpha=3),                     # method, scalar second
                x.clone().sub_(self.eps, alpha=-1.5),           # in place
                torch.add(x, x, alpha=2),                       # no symbolic float: left alone
                torch.div(self.scale, x, rounding_mode="floor"))


@pytest.mark.parametrize("route", list(ROUTES))
def test_alpha_kept_under_dynamic(route):
    model = Scalars()
    x = torch.rand(5, 3) * 3 + 0.5
    want = model(x)
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(**ROUTES[route]))
    compiled = torch.compile(model, backend=backend, dynamic=True)
    for shape in ((5, 3), (7, 3)):
        x = torch.rand(*shape) * 3 + 0.5
        for got, ref in zip(compiled(x), model(x)):
            torch.testing.assert_close(got, ref, rtol=1e-6, atol=1e-6)
    assert len(want) == 6


def test_rewrite_touches_only_symbolic_float_alphas():
    seen = []

    def backend(gm, example_inputs):
        seen.append(scalar_alpha.keep_alpha(gm))
        return gm.forward

    torch._dynamo.reset()
    torch.compile(Scalars(), backend=backend, dynamic=True)(torch.rand(4, 3) + 0.5)
    assert seen == [4]  # the four add/sub with a SymFloat operand; add(x, x, alpha=2) keeps its alpha
    torch._dynamo.reset()
    seen.clear()
    torch.compile(Scalars(), backend=backend)(torch.rand(4, 3) + 0.5)  # static: floats are constants, no SymFloat
    assert seen == [0]
