"""What the families' explain candidates (``Family.candidates``) share: node tests, source frames (the
innermost stack frame outside torch) and the ops after an anchor made in its own call (``nearby``), where a
pattern containing the anchor would end. ``fusegraph.explain`` reads the same helpers."""
from __future__ import annotations

import os
import re
from typing import Optional

import torch
import torch.fx

from ._prepare import depends_on

aten = torch.ops.aten
TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
VIEWS = (aten.unsqueeze.default, aten.view.default, aten.reshape.default, aten.slice.Tensor, aten.expand.default)
NEARBY_DEPTH = 10
NEARBY_MAX = 64


def is_op(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def is_complex(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def upstream(node, depth: int):
    """Every node up to ``depth`` steps before ``node``."""
    seen = []
    frontier = [node]
    for _ in range(depth):
        frontier = [a for n in frontier for a in n.all_input_nodes]
        seen.extend(frontier)
    return seen


def matmul_anchor(node, site_ok, mm_label: str, addmm_label: str) -> Optional[str]:
    """``mm_label`` / ``addmm_label`` when ``node`` is an ``mm(x, w)`` / ``addmm(b, x, w)`` whose operands
    ``site_ok(x, w[, b])`` accepts (the linear layers the gemv and linear families fuse), else None."""
    if is_op(node, aten.mm.default) and site_ok(node.args[0], node.args[1]):
        return mm_label
    if is_op(node, aten.addmm.default) and site_ok(node.args[1], node.args[2], node.args[0]):
        return addmm_label
    return None


def frames(stack_trace: Optional[str]) -> list:
    """(file, line, function) of each frame outside torch, outermost first."""
    if not stack_trace:
        return []
    return [(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(stack_trace)
            if not os.path.abspath(m["file"]).startswith(TORCH_DIR)]


def node_frames(node: torch.fx.Node) -> list:
    return frames(node.meta.get("stack_trace"))


def same_or_enclosing_call(frames_, anchor_frames) -> bool:
    """Whether code with ``frames_`` ran in the call ``anchor_frames`` ran in, or in one that encloses it (the
    module's caller, where a modulation after a norm module is written); unknown frames count as yes."""
    if not frames_ or not anchor_frames or len(frames_) > len(anchor_frames):
        return bool(not frames_ or not anchor_frames)
    k = len(frames_) - 1
    return frames_[:k] == anchor_frames[:k] and (frames_[k][0], frames_[k][2]) == (anchor_frames[k][0],
                                                                                 anchor_frames[k][2])


def nearby(anchor: torch.fx.Node) -> list:
    """The anchor and the ops after it (breadth first, nearest first) made in its own function call or an
    enclosing one: where a pattern containing the anchor would end."""
    anchor_frames = node_frames(anchor)
    out, seen, frontier = [anchor], {anchor}, [anchor]
    for _ in range(NEARBY_DEPTH):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u in seen or u.op != "call_function":
                    continue
                seen.add(u)
                if not same_or_enclosing_call(node_frames(u), anchor_frames):
                    continue
                out.append(u)
                nxt.append(u)
        frontier = nxt
        if len(out) >= NEARBY_MAX:
            break
    return out[:NEARBY_MAX]


def is_mean_of_square(node) -> bool:
    if not is_op(node, aten.mean.dim):
        return False
    src = node.args[0]
    return (is_op(src, aten.pow.Tensor_Scalar) and src.args[1] == 2) or \
        (is_op(src, aten.mul.Tensor) and src.args[0] is src.args[1])


def layer_norm_label(node) -> Optional[str]:
    if is_op(node, aten.var_mean.correction):
        return "var_mean"
    if is_op(node, aten.native_layer_norm.default, aten.layer_norm.default):
        return "layer_norm"
    return None


def is_fused_rms_norm(node) -> bool:
    from ._family import overload

    return is_op(node, overload("rms_norm.default"), overload("rms_norm.eps_tensor"))


def is_one_plus(a, anchor) -> bool:
    """``1 + s`` (through views) computed from elsewhere than ``anchor``: the ``(1 + scale)`` of a modulation (the
    ``1 + erf(...)`` of a GELU after the norm's linear is none)."""
    while is_op(a, *VIEWS):
        a = a.args[0]
    return is_op(a, aten.add.Tensor) and any(c == 1 for c in a.args if not isinstance(c, torch.fx.Node)) \
        and not depends_on(a, anchor)


def modulation(anchor) -> Optional[str]:
    """The modulation after a norm: ``"shift"`` for ``norm * (1 + s) + t`` (a tensor added to the product),
    ``"noshift"`` for ``norm * (1 + s)`` alone, None when no ``* (1 + s)`` follows. The ``(1 + s)`` (through
    views) must come from elsewhere than the norm itself: the ``1 + erf(...)`` of a GELU after the norm's
    linear is no modulation."""
    for n in nearby(anchor):
        if not is_op(n, aten.mul.Tensor):
            continue
        for a in n.args:
            if is_one_plus(a, anchor):
                users = list(n.users)
                shifted = len(users) == 1 and is_op(users[0], aten.add.Tensor) and \
                    all(isinstance(c, torch.fx.Node) for c in users[0].args[:2])
                return "shift" if shifted else "noshift"
    return None
