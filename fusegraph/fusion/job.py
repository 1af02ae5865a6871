"""One compile's fusion: what the fusion stages did to one graph, kept as a record the compile returns.

The Inductor route's pass (``inductor_pass.FusionPass``) and the aten route call ``fuse`` (and ``choose``) on the
job; the job keeps the counts, the sites lowered back, the final op counts, the graph log and a ``Tally`` of what
the compile adds to a ``Stats`` — it reports to nothing. The caller reads the record once the compile returns
(``Stats.absorb``)."""
from __future__ import annotations

import collections
from typing import Optional

import torch

from ..stats import Tally, log_fallback
from . import choice, passes


class FusionJob:
    """One compile of one graph (``graph_id``) as far as fusion is concerned.

    ``count=False`` (a re-compile of a graph already counted: a frozen graph's unfrozen compile, the Python-wrapper
    retry) keeps the fused and lowered counts and verify's notes out of the tally; fallbacks the compile notes
    itself are always in it."""

    def __init__(self, config, graph_id: int, *, log_dir: Optional[str], label: str, count: bool = True,
                 freeze: bool = False):
        self.config = config
        self.graph_id = graph_id
        self.count = count
        self.freeze = freeze  # fold parameters into constants
        self.fusing = True  # False on the graph_only route
        self.counts: Optional[dict] = None  # {family: sites fused}; None: unknown (an Inductor cache hit, no record)
        self.lowered: Optional[dict] = None  # {family: sites lowered back to aten for Inductor} (Inductor route)
        self.ops: collections.Counter = collections.Counter()  # op name -> count in the graph handed on
        self.tally = Tally()
        self.glog = passes.GraphLog(log_dir, f"{label}, Dynamo graph {graph_id}")
        self.pass_ran = False  # Inductor ran the fusion pass (False on a cache hit)
        self.pass_fallbacks: list = []  # fallbacks noted by the pass (replayed on a cache hit)
        self.real_inputs: Optional[list] = None  # the graph's real example inputs, for verify

    def _counted(self):
        return self.tally if self.count else None

    def fuse(self, graph_or_gm, reshape_views: bool = False) -> None:
        """The pattern families on the graph, in place (``passes.fuse_graph``)."""
        verify_inputs = None
        if self.config.verify:
            verify_inputs, why = passes.verify_inputs_for(graph_or_gm, self.real_inputs)
            if why:
                self.note_fallback(why)
        counts = passes.fuse_graph(graph_or_gm, self.config, stats=self._counted(), graph_log=self.glog,
                                   verify_inputs=verify_inputs, reshape_views=reshape_views)
        if self.counts is None:
            self.counts = counts
        else:
            for k, v in counts.items():
                self.counts[k] += v
        self.record_ops(graph_or_gm)

    def choose(self, graph) -> None:
        """Inductor route: fused sites Inductor's own code is predicted to beat are lowered back (choice.py)."""
        self.lowered = choice.choose(graph, stats=self._counted())
        self.record_ops(graph)

    def record_ops(self, graph_or_gm) -> None:
        """What the compile hands on: op name -> count in the final graph."""
        graph = graph_or_gm.graph if isinstance(graph_or_gm, torch.fx.GraphModule) else graph_or_gm
        self.ops = collections.Counter(str(n.target) if n.op == "call_function" else n.op for n in graph.nodes
                                       if n.op in ("call_function", "get_attr", "placeholder"))

    def adopt(self, record: dict) -> None:
        """Takes the counts, ops and notes of an earlier compile of the same graph (``inductor_pass``'s record), when
        Inductor served this one from its cache without running the pass."""
        if record["counts"] is not None:
            self.counts = dict(record["counts"])
            if self.count:
                self.tally.add_patterns(self.counts)
        if record["lowered"] is not None:
            self.lowered = dict(record["lowered"])
            if self.count:
                self.tally.add_lowered(self.lowered)
        self.ops = collections.Counter(record["ops"])
        for reason in record["fallbacks"]:
            self.note_fallback(reason)

    def note_fallback(self, reason: str) -> None:
        """Something this compile left undone, and why: logged (once per process and reason) and tallied."""
        self.tally.add_fallback(reason)
        log_fallback(reason)
