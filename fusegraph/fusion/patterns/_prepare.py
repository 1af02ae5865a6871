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
* **CSE of whole RMSNorm cores.** Two RMSNorms of the same input with the same eps and different weights
  (LuminaNext: every block's ``norm1_context`` normalizes the same ``encoder_hidden_states``) become one
  ``x * rsqrt(mean(x^2) + eps)`` whose result two ``* weight`` products read. The weightless form then fused
  that shared core and left both products unfused: one fused site for two norms. :func:`split_shared_rms_cores`
  gives each weight product its own copy of the core again (the aten route never had the sharing, so both
  routes fuse the same norms).
* **CSE of modulation factors.** Two modulations with the same scale (QwenImage21: every block's
  ``norm(h) * (1 + scale)`` selects the same per-token scale rows) share one ``1 + scale`` — an inner node of
  each modulation pattern. :func:`split_shared_factors` gives each product its own copy.
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
        copies += give_copies(graph, node, groups if rest else groups[1:])  # else the first norm keeps the original
    return copies


def give_copies(graph: torch.fx.Graph, node: torch.fx.Node, groups) -> int:
    """Each group of ``node``'s users reads its own copy of ``node`` (inserted right after it); users in no
    group keep the original. Returns the number of copies made."""
    copies = 0
    for users in groups:
        with graph.inserting_after(node):
            copy = graph.node_copy(node)
        for user in users:
            user.replace_input_with(node, copy)
        copies += 1
    return copies


_FACTOR_VIEWS = (_aten.unsqueeze.default, _aten.view.default, _aten.reshape.default)


def _one_plus(node) -> bool:
    """``1 + s`` as traced (``add(s, 1)``, either order), or a view of it: a modulation's factor."""
    while _is(node, _FACTOR_VIEWS[0]) or _is(node, _FACTOR_VIEWS[1]) or _is(node, _FACTOR_VIEWS[2]):
        node = node.args[0]
    return (_is(node, _aten.add.Tensor) and len(node.args) == 2 and not node.kwargs
            and sum(not isinstance(a, torch.fx.Node) and a == 1 for a in node.args) == 1)


def split_shared_factors(graph: torch.fx.Graph) -> int:
    """Gives each product (``mul``) or view that reads a shared ``1 + s`` factor (or a shared view of one) its
    own copy of it; other users keep the original together. Views are split before the factor they read,
    so a whole ``(1 + s)[:, None]`` path ends up per product. Returns the number of copies made. The graph's
    outputs and every value are unchanged; Inductor merges or inlines what then stays unfused."""
    copies = 0
    for node in reversed(list(graph.nodes)):
        if len(node.users) < 2 or not _one_plus(node):
            continue
        groups, rest = [], False
        for user in node.users:
            if _is(user, _aten.mul.Tensor) or any(_is(user, t) for t in _FACTOR_VIEWS):
                groups.append([user])
            else:
                rest = True
        copies += give_copies(graph, node, groups if rest else groups[1:])
    return copies


def _over_last_dim(mean: torch.fx.Node) -> bool:
    """``mean(t, [-1] | [t.dim() - 1], keepdim=True)``."""
    val = mean.args[0].meta.get("val") if isinstance(mean.args[0], torch.fx.Node) else None
    dims = mean.args[1] if len(mean.args) > 1 else None
    keepdim = mean.args[2] if len(mean.args) > 2 else mean.kwargs.get("keepdim", False)
    if not isinstance(val, torch.Tensor) or not isinstance(dims, (list, tuple)) or len(dims) != 1 or not keepdim:
        return False
    return dims[0] in (-1, val.dim() - 1)


def _rms_chain(rsqrt: torch.fx.Node):
    """``[pow, mean, add, rsqrt]`` when ``rsqrt`` is an RMSNorm's ``rsqrt(mean(pow(x', 2), [-1]) + eps)``
    whose inner nodes have no user but the next node of the chain; else None."""
    if not _is(rsqrt, _aten.rsqrt.default):
        return None
    chain = [rsqrt]
    node = rsqrt.args[0]
    for targets in ((_aten.add.Tensor, _aten.add.Scalar), (_aten.mean.dim,), (_aten.pow.Tensor_Scalar,)):
        if not any(_is(node, t) for t in targets) or len(node.users) != 1:
            return None
        chain.append(node)
        node = node.args[0]
    pow_, mean = chain[-1], chain[-2]
    if pow_.args[1] != 2 or not _over_last_dim(mean):
        return None  # not an RMSNorm: copies would only duplicate work
    return chain[::-1]


def _is_core(user: torch.fx.Node, rsqrt: torch.fx.Node, pow_in) -> bool:
    """``user`` is ``mul(x, rsqrt)`` with ``pow_in`` x or x's upcast: the normalised value."""
    if not _is(user, _aten.mul.Tensor) or len(user.args) != 2 or user.kwargs or user.args[1] is not rsqrt:
        return False
    x = user.args[0]
    return pow_in is x or (_is(pow_in, _CONVERT) and pow_in.args[0] is x)


def _weight_product(tail: torch.fx.Node, user: torch.fx.Node) -> bool:
    """``user`` multiplies the norm's output by a 1-D tensor (a norm weight), in either order."""
    if not _is(user, _aten.mul.Tensor) or len(user.args) != 2 or user.kwargs:
        return False
    a, b = user.args
    other = b if a is tail else a
    if other is tail or not isinstance(other, torch.fx.Node):
        return False
    val = other.meta.get("val")
    return isinstance(val, torch.Tensor) and val.dim() == 1


def _rms_instances(rsqrt: torch.fx.Node, pow_in):
    """The norms that read ``rsqrt``, each as ``(nodes after rsqrt to copy, consumers, node they read)``, and
    whether ``rsqrt`` has other users. A core ``mul(x, rsqrt)`` is one norm, unless two or more weight
    products read it (through its single downcast, if any): then each product is one, and the core's
    other users together one more. (One product and a raw read of one core is one norm whose intermediate
    is also used, as a source may write it: left as it is.)"""
    instances, others = [], False
    for core in list(rsqrt.users):
        if not _is_core(core, rsqrt, pow_in):
            others = True
            continue
        path = [core]
        while len(path[-1].users) == 1 and _is(next(iter(path[-1].users)), _CONVERT):
            path.append(next(iter(path[-1].users)))
        tail = path[-1]
        products = [u for u in tail.users if _weight_product(tail, u)]
        if len(products) < 2:
            instances.append(([], [core], rsqrt))
            continue
        instances.extend((path, [p], tail) for p in products)
        rest = [u for u in tail.users if u not in products]
        if rest:
            instances.append((path, rest, tail))
    return instances, others


def split_shared_rms_cores(graph: torch.fx.Graph) -> int:
    """Freezing's CSE merges RMSNorms of one input with one eps: one ``pow`` ... ``rsqrt`` read by several
    cores ``x * rsqrt``, or one core read by each norm's ``* weight`` (also through one shared downcast,
    diffusers' ``.to(weight.dtype)``). Each norm (see :func:`_rms_instances`) but the first gets its own
    copy of the chain, inserted just before its first consumer; if the ``rsqrt`` has users that are no
    norm, those keep the original and every norm gets a copy. The input's upcast is not copied
    (:func:`split_shared_casts`, run after this, splits it per norm). Returns the number of copies made.
    The graph's outputs and every value are unchanged."""
    copies = 0
    for rsqrt in list(graph.nodes):
        chain = _rms_chain(rsqrt)
        if chain is None:
            continue
        instances, others = _rms_instances(rsqrt, chain[0].args[0])
        if len(instances) + others < 2:
            continue
        for path, consumers, read in instances[0 if others else 1:]:
            env: dict = {}
            first = next(n for n in graph.nodes if n in consumers)
            with graph.inserting_before(first):
                for n in chain + path:
                    env[n] = graph.node_copy(n, lambda a: env.get(a, a))
            for consumer in consumers:
                consumer.replace_input_with(read, env[read])
            copies += 1
    return copies


def depends_on(node: torch.fx.Node, ancestor: torch.fx.Node, limit: int = 64) -> bool:
    """``node`` is computed from ``ancestor`` (an upstream search over at most ``limit`` nodes)."""
    seen, todo = set(), [node]
    while todo and len(seen) < limit:
        n = todo.pop()
        if n is ancestor:
            return True
        if n in seen:
            continue
        seen.add(n)
        todo.extend(n.all_input_nodes)
    return False


def prepare_before(pm, *steps) -> None:
    """Makes ``pm.apply(graph)`` run ``steps`` (each ``step(fx.Graph)``) first."""
    apply = pm.apply

    def apply_prepared(graph):
        g = graph.graph if isinstance(graph, torch.fx.GraphModule) else graph
        for step in steps:
            step(g)
        return apply(graph)

    pm.apply = apply_prepared
