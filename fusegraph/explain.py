"""``fusegraph.explain(model_or_fn, *args, **kwargs)``: what was fused, what was missed, and why.

The model is compiled once with a fusegraph ``Backend`` (the ``inductor=False`` route unless a config says
otherwise: the same passes, no codegen) while an observer watches ``passes.fuse_graph``:

* **fused sites**: before each family's pass the graph is snapshotted; after it, every new
  ``torch.ops.fusegraph.*`` node is a site of that family. A replacement keeps only the stack trace of the
  node it replaced last (the match's output), so the replaced nodes' own source lines are recovered from the
  snapshot: each removed node belongs to the site its chain of removed users ends in.
* **unfused candidates**: after each family's pass, the ops that family exists to fuse and that are still in
  the graph (an RMSNorm's ``mean(x²)`` / ``rsqrt``, a LayerNorm's ``var_mean``, a fused RMSNorm or a LayerNorm
  followed by ``* (1 + scale)`` with or without a shift, ``tanh``, complex multiplies, ``mul`` feeding ``add``). The reason is found by running that family's registered patterns at the ops after
  the candidate, in its own function: a pattern that matches but whose check refuses it, the matcher's own
  failure message, or no registered form at all. A family switched off says so.
* **graph breaks**: the reason Dynamo gives for ending each graph, with its source line.

Source lines are the innermost stack frame outside torch (a ``nn.LayerNorm`` is reported at the line that
calls it). The report is rows of plain dataclasses: a new column is a new field (and an entry in ``_COLUMNS``
to show it in the table); a new candidate kind is an entry in ``CANDIDATES``.
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import inspect
import json
import operator
import os
import re
import threading
from typing import Optional
from unittest import mock

import torch
import torch.fx

from ._core.torch_dispatcher import OpOverload
from .fusion import FAMILY_NAMES, choice, passes
from .fusion.patterns import BY_NAME
from .fusion.patterns._prepare import depends_on

_aten = torch.ops.aten
_CONVERT = torch.ops.prims.convert_element_type.default
_TORCH_DIR = os.path.dirname(os.path.abspath(torch.__file__)) + os.sep
_FRAME = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+), in (?P<func>\S+)')
_lock = threading.Lock()  # explain resets Dynamo and swaps passes.fuse_graph: one at a time per process


# ---------------------------------------------------------------------------------------------------------
# Report


@dataclasses.dataclass
class Site:
    """One row: a fused site or an unfused candidate. ``file``/``line``: the innermost frame outside torch;
    ``lines``: every source line the site's ops came from (``file:line``); ``stack``: the frames outside
    torch, outermost first (``file:line in function``)."""

    family: str
    status: str  # "fused" | "unfused" | "no site" (a candidate op that is no site of the family: a plain LayerNorm)
    op: str  # the fused op (fusegraph.rms_norm) or the candidate's anchor (rsqrt, var_mean, tanh, ...)
    file: Optional[str] = None
    line: Optional[int] = None
    lines: list = dataclasses.field(default_factory=list)
    stack: list = dataclasses.field(default_factory=list)
    reason: Optional[str] = None  # unfused only: why no pattern applied
    inductor: Optional[str] = None  # fused only: the Inductor route's per-site choice (fusegraph.fusion.choice)
    graph: int = 0  # which compiled graph (graph breaks make several)

    @property
    def source(self) -> str:
        return f"{_short(self.file)}:{self.line}" if self.file else "?"


@dataclasses.dataclass
class GraphBreak:
    reason: str
    file: Optional[str] = None
    line: Optional[int] = None
    stack: list = dataclasses.field(default_factory=list)

    @property
    def source(self) -> str:
        return f"{_short(self.file)}:{self.line}" if self.file else "?"


# (header, Site -> str): the table's columns; a new column is one entry here. Rows equal in every column are
# shown once with their count (a block repeated N times is one row ×N).
_COLUMNS = (
    ("family", lambda s: s.family),
    ("status", lambda s: s.status),
    ("op", lambda s: s.op),
    ("source", lambda s: s.source),
    ("called from", lambda s: _short_frame(s.stack[-2]) if len(s.stack) > 1 else ""),
    ("reason", lambda s: s.reason or ""),
    ("inductor route", lambda s: s.inductor or ""),
)


@dataclasses.dataclass
class ExplainReport:
    """What ``fusegraph.explain`` found. ``sites`` holds fused sites and unfused candidates alike."""

    model: str
    families: list  # every family, in pass order
    enabled: list  # the families the config switched on
    graphs: int = 0
    sites: list = dataclasses.field(default_factory=list)
    graph_breaks: list = dataclasses.field(default_factory=list)

    def fused(self, family: Optional[str] = None) -> list:
        return [s for s in self.sites if s.status == "fused" and family in (None, s.family)]

    def unfused(self, family: Optional[str] = None) -> list:
        return [s for s in self.sites if s.status == "unfused" and family in (None, s.family)]

    def counts(self) -> dict:
        """``{family: {"fused": n, "unfused": m}}`` for every family: fused sites and unfused sites (candidates
        shown to be no site of the family, a LayerNorm with no modulation, are not counted)."""
        return {f: {"fused": len(self.fused(f)), "unfused": len(self.unfused(f))} for f in self.families}

    def as_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["counts"] = self.counts()
        return d

    def to_json(self, path=None, **kwargs) -> str:
        text = json.dumps(self.as_dict(), indent=kwargs.pop("indent", 1), **kwargs)
        if path is not None:
            with open(path, "w") as f:
                f.write(text + "\n")
        return text

    @classmethod
    def from_dict(cls, d: dict) -> "ExplainReport":
        fields = {f.name for f in dataclasses.fields(cls)}
        d = {k: v for k, v in d.items() if k in fields}
        d["sites"] = [Site(**s) for s in d.get("sites", [])]
        d["graph_breaks"] = [GraphBreak(**b) for b in d.get("graph_breaks", [])]
        return cls(**d)

    @classmethod
    def from_json(cls, text: str) -> "ExplainReport":
        return cls.from_dict(json.loads(text))

    def table(self) -> str:
        """Counts per family, then one row per site (fused first, in pass order), then the graph breaks."""
        out = [f"fusegraph explain: {self.model}: {self.graphs} graph{'' if self.graphs == 1 else 's'}, "
               f"{len(self.graph_breaks)} graph break{'' if len(self.graph_breaks) == 1 else 's'}"]
        counts = self.counts()
        out.append(_grid(["family", "fused", "unfused", "enabled"],
                         [[f, str(c["fused"]), str(c["unfused"]), "yes" if f in self.enabled else "no"]
                          for f, c in counts.items()]))
        order = {f: i for i, f in enumerate(self.families)}
        rows = sorted(self.sites, key=lambda s: (s.status != "fused", order.get(s.family, 99), s.graph,
                                                 s.file or "", s.line or 0))
        if rows:
            grouped = collections.Counter(tuple(get(s) for _, get in _COLUMNS) for s in rows)  # keeps first-seen order
            out.append("")
            out.append(_grid(["n"] + [h for h, _ in _COLUMNS], [[str(n), *cells] for cells, n in grouped.items()]))
        if self.graph_breaks:
            out.append("")
            out.append(_grid(["graph break", "source"],
                             [[b.reason.splitlines()[0] if b.reason else "", b.source] for b in self.graph_breaks]))
        return "\n".join(out)


def _grid(headers, rows) -> str:
    rows = [[str(c).replace("\n", " ") for c in r] for r in rows]
    widths = [max([len(h)] + [len(r[i]) for r in rows]) for i, h in enumerate(headers)]
    fmt = lambda cells: "  ".join(c.ljust(w) for c, w in zip(cells, widths)).rstrip()  # noqa: E731
    return "\n".join([fmt(headers), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


def _short(path: Optional[str]) -> str:
    """A path as a reader finds it: relative to the working directory, or from the package on."""
    if not path:
        return "?"
    marker = "site-packages" + os.sep
    if marker in path:
        return path.split(marker, 1)[1]
    try:
        rel = os.path.relpath(path)
    except ValueError:
        return path
    return rel if not rel.startswith("..") else path


def _short_frame(frame: str) -> str:
    path, _, rest = frame.partition(":")
    return f"{_short(path)}:{rest}"


# ---------------------------------------------------------------------------------------------------------
# Source lines


def _frames(stack_trace: Optional[str]) -> list:
    """(file, line, function) of each frame outside torch, outermost first."""
    if not stack_trace:
        return []
    return [(m["file"], int(m["line"]), m["func"]) for m in _FRAME.finditer(stack_trace)
            if not os.path.abspath(m["file"]).startswith(_TORCH_DIR)]


def _node_frames(node: torch.fx.Node) -> list:
    return _frames(node.meta.get("stack_trace"))


_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<func>\w+?)_at_\d+")


def _fmt_frames(frames) -> list:
    """``file:line in function``; Dynamo's resume functions (code after a graph break) by their own name."""
    return [f"{f}:{n} in {_RESUME.sub(lambda m: m['func'], fn)}" for f, n, fn in frames]


def _place(site: Site, frames) -> Site:
    if frames:
        site.file, site.line = frames[-1][0], frames[-1][1]
        site.stack = _fmt_frames(frames)
    return site


def _same_or_enclosing_call(frames, anchor_frames) -> bool:
    """Whether code with ``frames`` ran in the call ``anchor_frames`` ran in, or in one that encloses it (the
    module's caller, where a modulation after a norm module is written); unknown frames count as yes."""
    if not frames or not anchor_frames or len(frames) > len(anchor_frames):
        return bool(not frames or not anchor_frames)
    k = len(frames) - 1
    return frames[:k] == anchor_frames[:k] and (frames[k][0], frames[k][2]) == (anchor_frames[k][0],
                                                                              anchor_frames[k][2])


# ---------------------------------------------------------------------------------------------------------
# Candidates: the ops each family exists to fuse


def _is(node, *targets) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_function" and node.target in targets


def _is_complex(node) -> bool:
    val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
    return isinstance(val, torch.Tensor) and val.is_complex()


def _upstream(node, depth: int):
    """Every node up to ``depth`` steps before ``node``."""
    seen = []
    frontier = [node]
    for _ in range(depth):
        frontier = [a for n in frontier for a in n.all_input_nodes]
        seen.extend(frontier)
    return seen


def _is_mean_of_square(node) -> bool:
    if not _is(node, _aten.mean.dim):
        return False
    src = node.args[0]
    return (_is(src, _aten.pow.Tensor_Scalar) and src.args[1] == 2) or \
        (_is(src, _aten.mul.Tensor) and src.args[0] is src.args[1])


def _rms_anchor(node) -> Optional[str]:
    if _is_mean_of_square(node):
        return "mean(x²)"
    if _is(node, _aten.rsqrt.default):
        # the rsqrt of a LayerNorm (var_mean) or of an RMSNorm already anchored at its mean(x²) is not a new site
        if any(_is(u, _aten.var_mean.correction) or _is_mean_of_square(u) or
               (_is(u, operator.getitem) and _is(u.args[0], _aten.var_mean.correction))
               for u in _upstream(node, 3)):
            return None
        return "rsqrt"
    return None


def _layer_norm_label(node) -> Optional[str]:
    if _is(node, _aten.var_mean.correction):
        return "var_mean"
    if _is(node, _aten.native_layer_norm.default, _aten.layer_norm.default):
        return "layer_norm"
    return None


_FUSED_RMS_NORM = torch.ops.fusegraph.rms_norm.default


def _modulation(anchor) -> Optional[str]:
    """The modulation after a norm: ``"shift"`` for ``norm * (1 + s) + t`` (a tensor added to the product),
    ``"noshift"`` for ``norm * (1 + s)`` alone, None when no ``* (1 + s)`` follows. The ``(1 + s)`` (through
    views) must come from elsewhere than the norm itself: the ``1 + erf(...)`` of a GELU after the norm's
    linear is no modulation."""
    for n in _nearby(anchor):
        if not _is(n, _aten.mul.Tensor):
            continue
        for a in n.args:
            while _is(a, *_VIEWS):
                a = a.args[0]
            if _is(a, _aten.add.Tensor) and any(c == 1 for c in a.args if not isinstance(c, torch.fx.Node)) \
                    and not depends_on(a, anchor):
                users = list(n.users)
                shifted = len(users) == 1 and _is(users[0], _aten.add.Tensor) and \
                    all(isinstance(c, torch.fx.Node) for c in users[0].args[:2])
                return "shift" if shifted else "noshift"
    return None


def _adaln_anchor(node) -> Optional[str]:
    """A LayerNorm, unless a modulation without shift follows it (then it is an adaln_noshift candidate). One
    with no modulation at all is listed as no site (``_adaln_hint``)."""
    label = _layer_norm_label(node)
    return label if label is not None and _modulation(node) != "noshift" else None


def _adaln_rms_anchor(node) -> Optional[str]:
    """A fused RMSNorm followed by ``* (1 + scale) + shift``. (An RMSNorm still unfused is the rms_norm
    family's candidate: this family starts at the fused op.)"""
    return "fusegraph.rms_norm" if _is(node, _FUSED_RMS_NORM) and _modulation(node) == "shift" else None


def _adaln_noshift_anchor(node) -> Optional[str]:
    """A LayerNorm or a fused RMSNorm followed by ``* (1 + scale)`` with no shift."""
    label = "fusegraph.rms_norm" if _is(node, _FUSED_RMS_NORM) else _layer_norm_label(node)
    return label if label is not None and _modulation(node) == "noshift" else None


def _gelu_anchor(node) -> Optional[str]:
    # tanh-GELU's tanh feeds ``1 + tanh(...)``; a tanh gate (Mochi, Lumina2) is no GELU
    if _is(node, _aten.tanh.default) and any(_is(u, _aten.add.Tensor) and 1 in u.args for u in node.users):
        return "tanh"
    if _is(node, _aten.gelu.default) and node.kwargs.get("approximate") == "tanh":
        return "gelu(tanh)"
    return None


def _rope_anchor(node) -> Optional[str]:
    if _is(node, _aten.mul.Tensor) and _is_complex(node):
        return "complex mul"
    if _is(node, _aten.view_as_complex.default) and not any(_is(u, _aten.mul.Tensor) for u in node.users):
        return "view_as_complex"
    return None


def _mul_add_anchor(node) -> Optional[str]:
    val = node.meta.get("val")
    if not _is(node, _aten.add.Tensor) or not (isinstance(val, torch.Tensor) and val.is_floating_point()):
        return None  # integer index arithmetic (position ids) is no fusion target
    operands = node.args[:2]  # a tensor added: ``x * s + 1.0`` is no mul_add site
    if not all(isinstance(a, torch.fx.Node) for a in operands):
        return None
    # a product by 1 (``y + 1.0 * x``, a one-row addmm's decomposition) is an add, not a mul_add site
    products = [a for a in operands if _is(a, _aten.mul.Tensor) and not any(
        isinstance(b, (int, float)) and not isinstance(b, bool) and b == 1 for b in a.args)]
    return "mul→add" if products else None


def _kv_attention_anchor(node) -> Optional[str]:
    """A decode step's SDPA on CPU (at most MAX_QUERIES query rows) whose keys and values are concatenations."""
    from .fusion.patterns import kv_attention

    sdpa = getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if sdpa is None or not _is(node, sdpa.default) or not all(_is(a, _aten.cat.default) for a in node.args[1:3]):
        return None
    q = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or not isinstance(q.shape[2], int):
        return None
    return "scaled_dot_product_attention over cat" if q.shape[2] <= kv_attention.MAX_QUERIES else None


def _gemv_anchor(node) -> Optional[str]:
    """A linear layer of a few rows with a large weight (mm/addmm), as the gemv family defines its sites."""
    from .fusion.patterns import gemv

    if _is(node, _aten.mm.default) and gemv.site_ok(node.args[0], node.args[1]):
        return "mm of a few rows"
    if _is(node, _aten.addmm.default) and gemv.site_ok(node.args[1], node.args[2], node.args[0]):
        return "addmm of a few rows"
    return None


def _linear_anchor(node) -> Optional[str]:
    """A float32 linear layer of many rows (mm/addmm), as the linear family defines its sites."""
    from .fusion.patterns import linear

    if _is(node, _aten.mm.default) and linear.site_ok(node.args[0], node.args[1]):
        return "float32 mm"
    if _is(node, _aten.addmm.default) and linear.site_ok(node.args[1], node.args[2], node.args[0]):
        return "float32 addmm"
    return None


# family -> (node -> label or None). Order matters only for reading.
CANDIDATES: dict = {
    "adaln": _adaln_anchor,
    "rope": _rope_anchor,
    "rms_norm": _rms_anchor,
    "adaln_rms": _adaln_rms_anchor,
    "adaln_noshift": _adaln_noshift_anchor,
    "gelu": _gelu_anchor,
    "mul_add": _mul_add_anchor,
    "kv_attention": _kv_attention_anchor,
    "gemv": _gemv_anchor,
    "linear": _linear_anchor,
}

def _candidates(graph: torch.fx.Graph, families) -> list:
    """(family, node, label) of every candidate of ``families`` in the graph. A mul→add whose ops come from the
    same line as another family's candidate is that op's inside (a LayerNorm's affine step, GELU's polynomial),
    not a site."""
    found = [(f, n, label) for n in graph.nodes for f in CANDIDATES if (label := CANDIDATES[f](n))]
    other_lines = {n.meta.get("stack_trace") for f, n, _ in found if f != "mul_add"} - {None}
    out = []
    for family, node, label in found:
        if family not in families:
            continue
        if family == "mul_add":
            mul = next(a for a in node.args[:2] if _is(a, _aten.mul.Tensor))
            if node.meta.get("stack_trace") in other_lines or mul.meta.get("stack_trace") in other_lines:
                continue
        out.append((family, node, label))
    return out


def _is_fused_op(node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, OpOverload)
            and node.target.namespace == "fusegraph")


# ---------------------------------------------------------------------------------------------------------
# Why a candidate was not fused


_NEARBY_DEPTH = 10
_NEARBY_MAX = 64


def _nearby(anchor: torch.fx.Node) -> list:
    """The anchor and the ops after it (breadth first, nearest first) made in its own function call or an
    enclosing one: where a pattern containing the anchor would end."""
    anchor_frames = _node_frames(anchor)
    out, seen, frontier = [anchor], {anchor}, [anchor]
    for _ in range(_NEARBY_DEPTH):
        nxt = []
        for n in frontier:
            for u in n.users:
                if u in seen or u.op != "call_function":
                    continue
                seen.add(u)
                if not _same_or_enclosing_call(_node_frames(u), anchor_frames):
                    continue
                out.append(u)
                nxt.append(u)
        frontier = nxt
        if len(out) >= _NEARBY_MAX:
            break
    return out[:_NEARBY_MAX]


def _op_name(node) -> str:
    if node.op == "placeholder":
        return "a graph input"
    if node.op == "get_attr":
        return "a constant"
    t = node.target
    if isinstance(t, OpOverload):
        return t.overloadpacket.__name__
    return getattr(t, "__name__", str(t))


def _entry_parts(entry):
    """(search function, the family's own check) behind a registered entry, or (None, None). The entry's
    extra_check is register_replacement's re-check (a closure over both), wrapped by the pass manager's guard
    and possibly by the family (partials, lambdas): unwrapped here, a few levels deep."""
    frontier, seen = [entry.extra_check], set()
    for _ in range(4):
        nxt = []
        for fn in frontier:
            if id(fn) in seen:
                continue
            seen.add(id(fn))
            if isinstance(fn, functools.partial):
                nxt.extend([fn.func, *fn.args, *fn.keywords.values()])
                continue
            try:
                names = inspect.getclosurevars(fn).nonlocals
            except (TypeError, ValueError):
                continue
            if callable(names.get("search_fn")):
                return names["search_fn"], names.get("extra_check")
            nxt.extend(v for v in [*names.values(), *(getattr(fn, "__defaults__", None) or ())] if callable(v))
        frontier = nxt
    return None, None


def _describe(match) -> str:
    """The matched operands: ``x: bfloat16[2, 8, 16], eps=1e-06``."""
    parts = []
    for name, v in match.kwargs.items():
        val = v.meta.get("val") if isinstance(v, torch.fx.Node) else v
        if isinstance(val, torch.Tensor):
            parts.append(f"{name}: {str(val.dtype).replace('torch.', '')}{list(val.shape)}")
        elif isinstance(val, (int, float, bool)):
            parts.append(f"{name}={val!r}")
    return ", ".join(parts)


def _refusal(family: str, entry, match) -> str:
    """Why a match of a registered form was not applied: the alpha guard, the family's check on the operands,
    or the matcher's exact re-check of the form on this site's own shapes and constants."""
    search_fn, family_check = _entry_parts(entry)
    what = f"{family} form '{getattr(search_fn, '__name__', '?').lstrip('_')}' matched but"
    try:
        if not passes._has_no_scaled_add(match):
            return f"{what} an add in it has alpha != 1"
        if family_check is not None and not family_check(match):
            return f"{what} the {family} check refused its operands ({_describe(match)})"
        if not entry.extra_check(match):
            if family_check is None:
                return f"{what} its checks refused it ({_describe(match)})"
            return (f"{what} the exact re-check on this site's shapes refused it: a constant, dim or cast differs "
                    f"from the registered form ({_describe(match)})")
    except Exception as e:  # a diagnosis, never worth failing the report over
        return f"{what} checking it raised {type(e).__name__}: {e}"
    return f"{what} was not applied (another match took one of its ops first)"


def _match(pattern, node):
    """(result, the graph nodes of the pattern's ops matched before it failed): the matcher's own context."""
    from ._core.torch_pattern_matcher import FailedMatch, MatchContext

    try:
        ctx = MatchContext([pattern], graph=node.graph)
        try:
            result = ctx.match(pattern, node)
        except FailedMatch as e:
            result = e
    except Exception:  # another torch's matcher internals: the public entry, without the progress
        return pattern.match(node), set()
    matched = {n for p, n in ctx.pattern_to_node.items()
               if hasattr(p, "fns") and isinstance(n, torch.fx.Node) and n.op == "call_function"}
    return result, matched


def _fns(pattern) -> str:
    return "/".join(dict.fromkeys(getattr(f, "__name__", str(f)).split(".")[0] for f in getattr(pattern, "fns", ())))


def _failure_text(failed) -> str:
    """The matcher's FailedMatch in words (its own text holds whole pattern reprs)."""
    fmt, args = getattr(failed, "format_string", ""), getattr(failed, "args", ())
    if fmt.startswith("function_mismatch") and len(args) == 2 and isinstance(args[0], torch.fx.Node):
        node, pattern = args
        return f"{node.name} ({_op_name(node)}) where the form has {_fns(pattern)}"
    if fmt.startswith("multiple_users") and args:
        return f"its {_fns(args[0])} op has users outside the site"
    if fmt.startswith("constant_args") and len(args) == 2:
        return f"{args[0].name} has {args[1]!r} where the form has {getattr(failed, 'kwargs', {}).get('pattern')!r}"
    return str(failed)


def _blocker(failed, site: list):
    """For a multiple-users failure: the op of the site it was about (that op's target, more than one user)."""
    args = getattr(failed, "args", ())
    if not getattr(failed, "format_string", "").startswith("multiple_users") or not args:
        return None
    fns = set(getattr(args[0], "fns", ()))
    return next((n for n in site if n.op == "call_function" and n.target in fns and len(n.users) > 1), None)


_VIEWS = (_aten.unsqueeze.default, _aten.view.default, _aten.reshape.default, _aten.slice.Tensor,
          _aten.expand.default)


_NO_MODULATION = "no modulation (norm(x) * (1 + scale) + shift) follows this norm: nothing for adaln to fuse"


def _adaln_hint(anchor, nearby) -> Optional[str]:
    """A LayerNorm with no ``* (1 + scale)`` after it (a plain or affine norm, a qk-norm) is no AdaLN site. The
    ``(1 + scale)`` must come from elsewhere than the norm itself: the ``1 + erf(...)`` of a GELU after the norm's
    linear is no modulation."""
    for n in nearby:
        for a in n.args if _is(n, _aten.mul.Tensor) else ():
            while _is(a, *_VIEWS):
                a = a.args[0]
            if _is(a, _aten.add.Tensor) and any(c == 1 for c in a.args if not isinstance(c, torch.fx.Node)) \
                    and not depends_on(a, anchor):
                return None
    return _NO_MODULATION


# family -> (anchor, nearby ops) -> a plain-words reason or None: consulted when no form matched
_HINTS: dict = {"adaln": _adaln_hint}


def _reason(family: str, anchor: torch.fx.Node, pm) -> str:
    """Runs the family's registered patterns at the anchor and the ops after it (nearest first). A match that
    was refused says by what. Otherwise the form that matched the most ops and got as far as the anchor (or
    was stopped by an op of the site shared with other code) says where it failed. Otherwise no registered
    form ends there."""
    nearby = _nearby(anchor)
    site = nearby + [a for a in anchor.all_input_nodes if a.op == "call_function"]
    best = None  # (score, node, entry, failed, blocker)
    for node in nearby:
        for entry in pm.patterns.get((node.op, node.target), ()):
            try:
                m, matched = _match(entry.pattern, node)
            except Exception:  # the matcher on a graph it was not run on: no diagnosis, never a failure
                continue
            if m:
                return _refusal(family, entry, m)
            blocker = _blocker(m, site)
            reached = node is anchor or anchor in matched
            if blocker is None and not reached:
                continue  # failed before it got to the candidate: says nothing about it
            score = len(matched) + (2 if blocker is not None else 0)
            if best is None or score > best[0]:
                best = (score, node, entry, m, blocker)
    hint = _HINTS[family](anchor, nearby) if family in _HINTS else None
    if hint is not None:
        return hint
    if best is None:
        chain = " → ".join(dict.fromkeys(_op_name(n) for n in nearby[:8]))
        return f"no registered {family} form fits the ops here ({chain})"
    _, node, entry, failed, blocker = best
    form = getattr(_entry_parts(entry)[0], "__name__", "?").lstrip("_")
    why = (f"{blocker.name} ({_op_name(blocker)}) has users outside the site" if blocker is not None
           else _failure_text(failed))
    return f"closest {family} form '{form}' (ending at {node.name}) fails: {why}"


@contextlib.contextmanager
def _explicit_rms_calls(graph: torch.fx.Graph):
    """The graph's fused rms_norm calls with every argument explicit, as the adaln_rms / adaln_noshift patterns
    see them during their pass (``patterns.adaln_rms.canonical_rms_calls``), then back in the traced form."""
    from .fusion.patterns.adaln_rms import canonical_rms_calls

    canonical_rms_calls(graph)
    try:
        yield
    finally:
        canonical_rms_calls(graph, explicit=False)


# ---------------------------------------------------------------------------------------------------------
# The observer


class _Observer:
    """Told by ``passes.fuse_graph`` before and after each pass; collects one graph's sites."""

    def __init__(self, opts, graph_index: int):
        self.opts = opts
        self.enabled = set(opts.enabled_families())
        self.graph_index = graph_index
        self.snapshot: Optional[dict] = None
        self.fused: dict = {}  # fused node -> Site
        self.reasons: dict = {}  # candidate node -> reason (from the first time its family's pass saw it)
        self.sites: list = []
        self.ran: set = set()  # families whose pass ran on this graph (verify_inputs may leave some off)

    def __call__(self, pass_name: str, when: str, graph: torch.fx.Graph) -> None:
        if pass_name not in FAMILY_NAMES and when != "done":
            return
        if when == "before":
            self.snapshot = {n: (list(n.all_input_nodes), n.meta.get("stack_trace")) for n in graph.nodes}
        elif when == "after":
            self.ran.add(pass_name)
            self._record_fused(pass_name, graph)
            self._record_reasons(pass_name, graph)
        elif when == "done":
            self._finish(graph)

    def _record_fused(self, family: str, graph: torch.fx.Graph) -> None:
        before = self.snapshot or {}
        nodes = set(graph.nodes)
        new = [n for n in graph.nodes if n not in before and _is_fused_op(n)]
        if not new:
            return
        removed = [n for n in before if n not in nodes]
        lines = _replaced_lines(before, removed, nodes, new)
        for node in new:
            frames = _node_frames(node)
            site = _place(Site(family, "fused", f"fusegraph.{_op_name(node)}", graph=self.graph_index), frames)
            site.lines = sorted(lines.get(node, set()) | ({f"{site.file}:{site.line}"} if site.file else set()),
                                key=_line_key)
            self.fused[node] = site

    def _record_reasons(self, family: str, graph: torch.fx.Graph) -> None:
        pm = passes.pattern_pass(family, self.opts)
        with _explicit_rms_calls(graph):
            for fam, node, _ in _candidates(graph, (family,)):
                if node not in self.reasons:
                    self.reasons[node] = _reason(fam, node, pm)

    def _finish(self, graph: torch.fx.Graph) -> None:
        nodes = set(graph.nodes)
        self.sites = [site for node, site in self.fused.items() if node in nodes]
        for node, site in self.fused.items():
            if node in nodes:
                site.inductor = choice.describe(node)
        with _explicit_rms_calls(graph):
            # A family the config switches on but this machine does not use ('auto' off here: linear on a CPU
            # where MKL's sgemm is the faster kernel) has no candidates: nothing to fuse is missed.
            candidates = _candidates(graph, [f for f in FAMILY_NAMES
                                             if f in self.enabled or not getattr(self.opts, BY_NAME[f].switch)])
            reasons = {node: self.reasons.get(node) or _reason(family, node, passes.pattern_pass(family, self.opts))
                       for family, node, _ in candidates
                       if family in self.enabled and family in self.ran}
        for family, node, label in candidates:
            if family not in self.enabled:
                reason = f"the {family} family is disabled by the config"
            elif family not in self.ran:
                reason = f"the {family} family did not run on this graph (left off by verification)"
            else:
                reason = reasons[node]
            status = "no site" if reason == _NO_MODULATION else "unfused"
            site = _place(Site(family, status, label, reason=reason, graph=self.graph_index), _node_frames(node))
            site.lines = [f"{site.file}:{site.line}"] if site.file else []
            self.sites.append(site)


def _line_key(text: str):
    path, _, line = text.rpartition(":")
    return path, int(line) if line.isdigit() else 0


def _replaced_lines(before: dict, removed: list, alive: set, new: list) -> dict:
    """fused node -> source lines of the nodes it replaced. Each removed node belongs to the site its chain of
    removed users ends in (the match's output); that output's surviving users now read the fused node."""
    removed_set = set(removed)
    users = collections.defaultdict(list)
    for node, (inputs, _) in before.items():
        for a in inputs:
            users[a].append(node)
    new_set = set(new)

    def fused_reached_from(user) -> set:
        """The new fused nodes ``user`` (a surviving node) reads, through other new nodes (views, casts)."""
        found, stack, seen = set(), list(user.all_input_nodes), set()
        while stack:
            n = stack.pop()
            if n in seen or n in before:
                continue
            seen.add(n)
            if n in new_set:
                found.add(n)
            else:
                stack.extend(n.all_input_nodes)
        return found

    owner: dict = {}  # removed output node -> fused nodes
    for node in removed:
        outside = [u for u in users[node] if u not in removed_set and u in alive]
        if outside:
            owner[node] = set().union(*(fused_reached_from(u) for u in outside))
    lines = collections.defaultdict(set)
    for node in removed:
        frames = _frames(before[node][1])
        if not frames:
            continue
        seen, stack, targets = set(), [node], set()
        while stack:  # forward through removed nodes to the outputs of the match
            n = stack.pop()
            if n in seen:
                continue
            seen.add(n)
            targets |= owner.get(n, set())
            stack.extend(u for u in users[n] if u in removed_set)
        for fused in targets:
            lines[fused].add(f"{frames[-1][0]}:{frames[-1][1]}")
    return lines


# ---------------------------------------------------------------------------------------------------------
# Entry point


def _model_name(model_or_fn) -> str:
    if isinstance(model_or_fn, torch.nn.Module):
        return type(model_or_fn).__name__
    return getattr(model_or_fn, "__qualname__", None) or getattr(model_or_fn, "__name__", None) or repr(model_or_fn)


def _config(config):
    """A CompilationConfig for explain: the caller's (or a dict of overrides), ``inductor=False`` by default."""
    from .config import CompilationConfig

    if config is None:
        return CompilationConfig(inductor=False)
    if isinstance(config, dict):
        return CompilationConfig(**{"inductor": False, **config})
    if isinstance(config, CompilationConfig):
        return copy.deepcopy(config)
    raise TypeError(f"config must be a CompilationConfig, a dict of overrides or None, got {type(config).__name__}")


def _break(reason) -> GraphBreak:
    frames = [(f.filename, f.lineno, f.name) for f in (getattr(reason, "user_stack", None) or [])
              if not os.path.abspath(f.filename).startswith(_TORCH_DIR)]
    b = GraphBreak(str(getattr(reason, "reason", reason)).strip())
    if frames:
        b.file, b.line = frames[-1][0], frames[-1][1]
        b.stack = _fmt_frames(frames)
    return b


def explain(model_or_fn, *args, config=None, **kwargs) -> ExplainReport:
    """Compiles and runs ``model_or_fn(*args, **kwargs)`` once under no_grad with the fusegraph backend and
    reports, per pattern family, the fused sites, the candidates left unfused with a reason, and the graph
    breaks. ``config``: a CompilationConfig, a dict of overrides or None (``inductor=False``: the same fusion
    passes without Inductor's codegen).

    Dynamo is reset before and after, so no compiled state is left behind; the model is not modified
    (it is wrapped, not compiled in place). Not thread-safe: one explain runs at a time per process."""
    from .backend import Backend

    cfg = _config(config)
    opts = cfg.fusion_patterns
    backend = Backend(cfg)
    observers: list = []
    breaks: list = []
    real_fuse_graph = passes.fuse_graph

    def observed_fuse_graph(gm_or_graph, *a, **kw):
        if kw.get("stats") is not backend.stats or kw.get("observer") is not None:
            return real_fuse_graph(gm_or_graph, *a, **kw)  # another backend's compile
        observer = _Observer(opts, len(observers))
        observers.append(observer)
        return real_fuse_graph(gm_or_graph, *a, observer=observer, **kw)

    def compiler(gm, example_inputs):
        reason = getattr(gm, "compile_subgraph_reason", None)
        if reason is not None and getattr(reason, "graph_break", False):
            breaks.append(reason)
        return backend(gm, example_inputs)

    from ._core.torch_inductor import config as inductor_config
    from ._core.torch_dynamo import graph_break_reasons

    with _lock:
        torch.compiler.reset()
        try:
            with contextlib.ExitStack() as stack:
                stack.enter_context(torch.no_grad())
                stack.enter_context(mock.patch.object(passes, "fuse_graph", observed_fuse_graph))
                # Inductor's FX graph cache skips the fusion pass on a hit (inductor=True configs)
                stack.enter_context(inductor_config.patch(fx_graph_cache=False))
                torch.compile(model_or_fn, backend=compiler)(*args, **kwargs)
            # Dynamo lists every break in order, also those whose graph held no op (never handed to a backend)
            breaks = list(graph_break_reasons) + [b for b in breaks if not any(b is r for r in graph_break_reasons)]
        finally:
            torch.compiler.reset()
    report = ExplainReport(model=_model_name(model_or_fn), families=list(FAMILY_NAMES),
                           enabled=list(opts.enabled_families()), graphs=backend.stats.graphs_compiled)
    for observer in observers:
        report.sites.extend(observer.sites)
    seen = set()
    for reason in breaks:
        b = _break(reason)
        key = (b.reason, b.file, b.line)
        if key not in seen:
            seen.add(key)
            report.graph_breaks.append(b)
    return report


# ---------------------------------------------------------------------------------------------------------
# Command line


def main(argv=None) -> int:
    """``python -m fusegraph explain --model <diffusers class> [--json FILE] [--dtype fp32|bf16]``: a tiny zoo
    instance of the class (random weights), explained; the table on stdout, the report as JSON in FILE."""
    import argparse
    import sys

    from . import zoo

    parser = argparse.ArgumentParser(prog="python -m fusegraph explain",
                                     description="What fusegraph fused in a model, what it missed and why.")
    parser.add_argument("--model", required=True, help="a diffusers transformer class name from fusegraph.zoo")
    parser.add_argument("--json", metavar="FILE", help="also write the report as JSON to FILE")
    parser.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    args = parser.parse_args(argv)
    known = zoo.names()
    if args.model not in known:
        print(f"python -m fusegraph explain: unknown model {args.model!r}; known models: {', '.join(known)}",
              file=sys.stderr)
        return 2
    why = _unwritable(args.json) if args.json else None
    if why:
        print(f"python -m fusegraph explain: argument --json: cannot write {args.json!r}: {why}", file=sys.stderr)
        return 2
    model, kwargs = zoo.build(args.model, dtype={"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype])
    report = explain(model, **kwargs)
    print(report.table())
    if args.json:
        try:
            report.to_json(args.json)
        except OSError as e:
            print(f"python -m fusegraph explain: argument --json: cannot write {args.json!r}: {_os_reason(e)}",
                  file=sys.stderr)
            return 1
        print(f"\nwrote {args.json}")
    return 0


def _unwritable(path: str) -> Optional[str]:
    """Why ``path`` cannot be written, or None. Checked before the report runs, so a bad ``--json`` fails at once
    instead of after the compile. Opened for append (an existing file keeps its contents); a file the check
    created is removed again."""
    existed = os.path.lexists(path)
    try:
        with open(path, "a"):
            pass
    except OSError as e:
        return _os_reason(e)
    if not existed:
        os.remove(path)
    return None


def _os_reason(e: OSError) -> str:
    """The OS's words for ``e`` (``No such file or directory``), without the path the message repeats."""
    return e.strerror or str(e)
