"""A rewrite of Dynamo's graph that keeps ``add``/``sub``'s ``alpha`` where aot_autograd would drop it.

torch 2.13's ``tensorify_python_scalars`` (``torch/fx/passes/_tensorify_python_scalars.py``, run by aot_autograd
on every route: fusegraph's aten and graph routes, Inductor's, ``aot_eager``'s) turns an op with a symbolic float
argument into a tensor-tensor op and rebuilds the node from its positional arguments only, so the keyword ``alpha``
of ``aten.add.Tensor`` / ``aten.sub.Tensor`` is lost: ``torch.add(eps, norm, alpha=k)`` runs as ``eps + norm``.
Under ``dynamic=True`` Dynamo passes a module's Python float attributes as inputs and reads them with ``.item()``
(a ``SymFloat``); diffusers' ``CosmosLearnablePositionalEmbed`` computes ``torch.add(self.eps, norm, alpha=...)``,
so CosmosTransformer3DModel compiled with ``dynamic=True`` gave wrong outputs on every backend using aot_autograd
(pytorch/pytorch PR 189547 fixes the pass; not in the installed torch).

``keep_alpha`` moves such an ``alpha`` into its own multiplication before aot_autograd sees the graph:
``add(a, b, alpha=k)`` -> ``add(a, mul(b, k))`` (``sub`` likewise; function, method and in-place forms). The result
dtype is unchanged (``b * k`` promotes as ``alpha * b`` does inside ``add``); the rounding may differ from eager's
fused ``a + k * b`` by one unit in the last place. Nodes without a symbolic float argument are left alone: the pass
keeps their ``alpha``.
"""
from __future__ import annotations

import torch

_FUNCTIONS = {torch.add: torch.mul, torch.sub: torch.mul}
_METHODS = ("add", "sub", "add_", "sub_")


def _is_symfloat(a) -> bool:
    return isinstance(a, torch.fx.Node) and isinstance(a.meta.get("example_value"), torch.SymFloat)


def keep_alpha(gm: torch.fx.GraphModule) -> int:
    """Rewrites, in place, every ``add``/``sub`` of ``gm`` (a Dynamo graph) that has an ``alpha`` other than 1 and
    a ``SymFloat`` argument; returns how many."""
    changed = 0
    for node in list(gm.graph.nodes):
        if node.op == "call_function" and node.target in _FUNCTIONS:
            operands = list(node.args[:2])
        elif node.op == "call_method" and node.target in _METHODS:
            operands = list(node.args[:2])
        else:
            continue
        alpha = node.kwargs.get("alpha", 1)
        if len(operands) != 2 or (not isinstance(alpha, torch.fx.Node) and alpha == 1) or \
                not any(_is_symfloat(a) for a in operands):
            continue
        with gm.graph.inserting_before(node):
            scaled = gm.graph.call_function(torch.mul, (operands[1], alpha))
        example = operands[1].meta.get("example_value") if isinstance(operands[1], torch.fx.Node) else operands[1]
        factor = alpha.meta.get("example_value") if isinstance(alpha, torch.fx.Node) else alpha
        if example is not None and factor is not None:
            scaled.meta["example_value"] = example * factor
        node.args = (operands[0], scaled) + tuple(node.args[2:])
        node.kwargs = {k: v for k, v in node.kwargs.items() if k != "alpha"}
        changed += 1
    if changed:
        gm.graph.lint()
        gm.recompile()
    return changed
