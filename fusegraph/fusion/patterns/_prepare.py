"""Graph preparation shared by the rms_norm / rope / adaln families: undo sharing that blocks a match.

Inductor's pattern matcher refuses a match whose inner nodes have users outside it. Two kinds of sharing
make real models miss fusions:

* **CSE of upcasts.** Inductor's freezing (the default inductor=True route) runs common-subexpression
  elimination before the fusion pass, so Wan's ``norm1(h.float())`` and its residual ``h.float() + ...`` share
  one ``convert_element_type``. :func:`split_shared_casts` gives each norm reading an fp16/bf16 -> fp32 cast
  its own copy again (both inputs of one norm — ``var_mean``/``sub`` of a LayerNorm, ``pow``/``mul`` of an
  RMSNorm — share it); all other users keep the original together, so patterns that read one upcast in
  several ops (a GELU) are left as they are.
  Casts are pure and cheap; Inductor re-merges whatever ends up unfused.
* **One norm, two modulations** (SD35AdaLayerNormZeroX): handled in ``adaln.unshare_norms``.
"""
from __future__ import annotations

import operator

import torch

_aten = torch.ops.aten
_CONVERT = torch.ops.prims.convert_element_type.default


def _is(node, target) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target == target


def _norm_key(cast: torch.fx.Node, user: torch.fx.Node):
    """The norm ``user`` is an input op of (its ``var_mean`` for a LayerNorm, its ``pow`` for an RMSNorm),
    or None when ``user`` is not the first op of a norm of ``cast``."""
    if _is(user, _aten.var_mean.correction) or _is(user, _aten.pow.Tensor_Scalar):
        return user
    if _is(user, _aten.sub.Tensor) and user.args[0] is cast:  # LayerNorm: x - mean, mean from var_mean(x)
        mean = user.args[1]
        if _is(mean, operator.getitem) and _is(mean.args[0], _aten.var_mean.correction):
            return mean.args[0] if mean.args[0].args[0] is cast else None
    if _is(user, _aten.mul.Tensor) and user.args[0] is cast:  # RMSNorm: x * rsqrt(mean(pow(x)) + eps)
        node = user.args[1]
        for target in (_aten.rsqrt.default, None, _aten.mean.dim):
            if not isinstance(node, torch.fx.Node) or (target is not None and node.target != target):
                return None
            node = node.args[0]
        return node if _is(node, _aten.pow.Tensor_Scalar) and node.args[0] is cast else None
    return None


def _is_upcast(cast: torch.fx.Node) -> bool:
    """fp16/bf16 -> fp32: the ``x.float()`` a pattern starts from. Downcasts end patterns (a norm's output
    cast); splitting one would give the norm's last op two users and block that norm's match."""
    src = cast.args[0]
    val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
    return (isinstance(val, torch.Tensor) and val.dtype in (torch.bfloat16, torch.float16)
            and cast.args[1] == torch.float32)


def split_shared_casts(graph: torch.fx.Graph) -> int:
    """Gives every norm that reads a shared fp16/bf16 -> fp32 cast its own copy of the cast; the cast's other
    users (a residual, a GELU's several ops) keep the original together. Returns the number of copies made.
    The graph's outputs and every value are unchanged."""
    copies = 0
    for node in list(graph.nodes):
        if not _is(node, _CONVERT) or len(node.users) < 2 or not _is_upcast(node):
            continue
        norms: dict = {}
        rest = []
        for user in node.users:
            key = _norm_key(node, user) if user.op == "call_function" else None
            (norms.setdefault(key, []) if key is not None else rest).append(user)
        groups = list(norms.values())
        if not rest:
            groups = groups[1:]  # the first norm keeps the original
        for users in groups:
            with graph.inserting_after(node):
                copy = graph.node_copy(node)
            for user in users:
                user.replace_input_with(node, copy)
            copies += 1
    return copies


def prepare_before(pm, *steps) -> None:
    """Makes ``pm.apply(graph)`` run ``steps`` (each ``step(fx.Graph)``) first."""
    apply = pm.apply

    def apply_prepared(graph):
        g = graph.graph if isinstance(graph, torch.fx.GraphModule) else graph
        for step in steps:
            step(g)
        return apply(graph)

    pm.apply = apply_prepared
