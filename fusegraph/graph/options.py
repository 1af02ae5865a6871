"""The graph_* settings the runtime reads, from any config object (SPEC §1.1).

The runtime accepts any object with the SPEC's attribute names (``fusegraph.CompilationConfig`` or a
plain namespace); a missing attribute takes the SPEC default, a seed alias (``aclgraph_*``) is read when the
portable name is absent. Values are checked here so a bad one fails before anything is captured.
"""
from __future__ import annotations

from dataclasses import dataclass

_DEFAULTS = dict(
    graph_lazy_capture=False,
    graph_max_entries=0,
    graph_eviction="fifo",
    graph_memory_budget=0,
    graph_recapture=True,
    graph_warmup_runs=1,
    graph_fallback="eager",
    device_graph="auto",
    safe_output_mode=True,
)
_ALIASES = dict(graph_lazy_capture="aclgraph_lazy_capture", graph_max_entries="aclgraph_max_entries")


@dataclass(frozen=True)
class GraphOptions:
    graph_lazy_capture: bool = False
    graph_max_entries: int = 0
    graph_eviction: str = "fifo"
    graph_memory_budget: int = 0
    graph_recapture: bool = True
    graph_warmup_runs: int = 1
    graph_fallback: str = "eager"
    device_graph: str = "auto"
    safe_output_mode: bool = True

    @classmethod
    def from_config(cls, config=None) -> "GraphOptions":
        if isinstance(config, GraphOptions):
            return config
        values = {}
        for name, default in _DEFAULTS.items():
            if config is not None and hasattr(config, name):
                values[name] = getattr(config, name)
            elif config is not None and name in _ALIASES and hasattr(config, _ALIASES[name]):
                values[name] = getattr(config, _ALIASES[name])
            else:
                values[name] = default
        opts = cls(**values)
        opts.validate()
        return opts

    def validate(self) -> None:
        for name in ("graph_lazy_capture", "graph_recapture", "safe_output_mode"):
            if not isinstance(getattr(self, name), bool):
                raise TypeError(f"fusegraph: {name} is {getattr(self, name)!r}; expected True or False")
        for name in ("graph_max_entries", "graph_memory_budget", "graph_warmup_runs"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise TypeError(f"fusegraph: {name} is {v!r}; expected an int")
            if v < 0:
                raise ValueError(f"fusegraph: {name} is {v}; expected >= 0")
        choices = dict(graph_eviction=("fifo", "lru"), graph_fallback=("eager", "raise"),
                       device_graph=("auto", "cuda", "npu", "host", "none"))
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"fusegraph: {name} is {getattr(self, name)!r}; expected one of {allowed}")
