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
to show it in the table); a new candidate kind is a ``Candidate`` in its family's ``FAMILY.candidates``
(``fusegraph/fusion/patterns/<family>.py``).
"""
from __future__ import annotations

import collections
import contextlib
import copy
import dataclasses
import functools
import inspect
import json
import os
import re
import threading
from typing import Optional
from unittest import mock

import torch
import torch.fx

from ._core.torch_dispatcher import OpOverload
from .fusion import FAMILY_NAMES, choice, passes
from .fusion.patterns import BY_NAME, FAMILIES, NoSite
from .fusion.patterns import _anchors
from .fusion.patterns._anchors import TORCH_DIR as _TORCH_DIR
from .fusion.patterns._anchors import frames as _frames
from .fusion.patterns._anchors import nearby as _nearby
from .fusion.patterns._anchors import node_frames as _node_frames

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


_RESUME = re.compile(r"torch_dynamo_resume_in_(?P<func>\w+?)_at_\d+")


def _fmt_frames(frames) -> list:
    """``file:line in function``; Dynamo's resume functions (code after a graph break) by their own name."""
    return [f"{f}:{n} in {_RESUME.sub(lambda m: m['func'], fn)}" for f, n, fn in frames]


def _place(site: Site, frames) -> Site:
    if frames:
        site.file, site.line = frames[-1][0], frames[-1][1]
        site.stack = _fmt_frames(frames)
    return site


# ---------------------------------------------------------------------------------------------------------
# Candidates: the ops each family exists to fuse


# family -> its Candidate records (``Family.candidates``: an anchor, node -> label or None; its no-site reason; the
# nodes whose line makes it another candidate's inside), in pass order: derived from the family table.
CANDIDATES: dict = {f.name: f.candidates for f in FAMILIES}


def _candidates(graph: torch.fx.Graph, families) -> list:
    """(family, node, label) of every candidate of ``families`` in the graph. A candidate with ``inner`` (a
    mul→add) whose ops come from the same line as another family's candidate is that op's inside (a LayerNorm's
    affine step, GELU's polynomial), not a site."""
    found = [(f, c, n, label) for n in graph.nodes for f, cands in CANDIDATES.items() for c in cands
             if (label := c.anchor(n))]
    lines = {(f, n.meta.get("stack_trace")) for f, _, n, _ in found}  # (family, a candidate's line)
    other_lines = {f: {line for (g, line) in lines if g != f} - {None} for f in families}
    out = []
    for family, cand, node, label in found:
        if family not in families:
            continue
        if cand.inner is not None and any(n.meta.get("stack_trace") in other_lines[family] for n in cand.inner(node)):
            continue
        out.append((family, node, label))
    return out


def _is_fused_op(node) -> bool:
    return (node.op == "call_function" and isinstance(node.target, OpOverload)
            and node.target.namespace == "fusegraph")


# ---------------------------------------------------------------------------------------------------------
# Why a candidate was not fused


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
    for cand in BY_NAME[family].candidates:
        hint = cand.no_site(anchor, nearby) if cand.no_site is not None else None
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
        self.reasons: dict = {}  # (family, candidate node) -> reason (from the first time its family's pass saw it)
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
                if (fam, node) not in self.reasons:  # one node can be two families' candidate (a run-time eps norm)
                    self.reasons[fam, node] = _reason(fam, node, pm)

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
            reasons = {(family, node): self.reasons.get((family, node)) or
                       _reason(family, node, passes.pattern_pass(family, self.opts))
                       for family, node, _ in candidates
                       if family in self.enabled and family in self.ran}
        for family, node, label in candidates:
            if family not in self.enabled:
                reason = f"the {family} family is disabled by the config"
            elif family not in self.ran:
                reason = f"the {family} family did not run on this graph (left off by verification)"
            else:
                reason = reasons[family, node]
            status = "no site" if isinstance(reason, NoSite) else "unfused"
            site = _place(Site(family, status, label, reason=str(reason), graph=self.graph_index), _node_frames(node))
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


def explain(model_or_fn, *args, config=None, dynamic=None, **kwargs) -> ExplainReport:
    """Compiles and runs ``model_or_fn(*args, **kwargs)`` once under no_grad with the fusegraph backend and
    reports, per pattern family, the fused sites, the candidates left unfused with a reason, and the graph
    breaks. ``config``: a CompilationConfig, a dict of overrides or None (``inductor=False``: the same fusion
    passes without Inductor's codegen). ``dynamic``: ``torch.compile``'s (True: symbolic sizes from the first
    call, and Python floats of modules as inputs: a norm's eps read at run time fuses as a number does).

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
        # This explain's compiles (its backend's config; the pipeline passes it on), counted (a re-compile of a
        # graph already counted passes no stats), not already observed.
        config = a[0] if a else kw.get("config")
        if config is not backend.config or kw.get("stats") is None or kw.get("observer") is not None:
            return real_fuse_graph(gm_or_graph, *a, **kw)  # another compile
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
                torch.compile(model_or_fn, backend=compiler, dynamic=dynamic)(*args, **kwargs)
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
    parser.add_argument("--dynamic", action="store_true",
                        help="compile with torch.compile(dynamic=True): symbolic sizes, Python floats as inputs")
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
    report = explain(model, dynamic=True if args.dynamic else None, **kwargs)
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
