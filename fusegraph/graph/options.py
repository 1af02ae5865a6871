"""The graph_* settings the runtime reads (SPEC §1.1), as one frozen snapshot.

Defaults, the ``aclgraph_*`` aliases and validation are ``fusegraph.CompilationConfig``'s: a
``CompilationConfig`` is read as it is; ``None`` means the process defaults (seed style
``CompilationConfig.graph_max_entries = 4`` applies to a ``GraphRunner(fn)`` too); a dict is a set of overrides
(``CompilationConfig(**d)``: an unknown name raises); any other object (a plain
namespace) contributes the config names it has and goes through ``CompilationConfig``'s checks, so a bad value
fails, naming the field, before anything is captured.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..config import CompilationConfig


@dataclass(frozen=True)
class GraphOptions:
    graph_lazy_capture: bool
    graph_max_entries: int
    graph_eviction: str
    graph_memory_budget: int
    graph_recapture: bool
    graph_warmup_runs: int
    graph_fallback: str
    device_graph: str
    safe_output_mode: bool
    fusion_patterns: object  # FusionPatterns: the families GraphRunner fuses before it captures
    graph_only: bool         # True: capture the function as traced, unfused
    verify: bool             # check each fused family against the unfused graph on the capture's inputs
    graph_batch_buckets: tuple = ()  # () = off
    graph_rank_check: str = "call"

    @classmethod
    def from_config(cls, config=None) -> "GraphOptions":
        if isinstance(config, GraphOptions):
            return config
        if isinstance(config, dict):  # overrides, as Backend takes them: unknown names and bad values raise
            config = CompilationConfig(**config)
        if not isinstance(config, CompilationConfig):
            names = set(CompilationConfig._fields) | set(CompilationConfig._aliases)
            config = CompilationConfig(**{n: getattr(config, n) for n in names if hasattr(config, n)})
        return cls(**{f.name: getattr(config, f.name) for f in dataclasses.fields(cls)})

    @property
    def fuses(self) -> bool:
        """GraphRunner runs the fusion passes on its trace before capturing (off with graph_only or when every
        family is switched off)."""
        return not self.graph_only and bool(self.fusion_patterns.enabled_families())
