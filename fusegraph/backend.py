"""The torch.compile backend: ``Backend`` takes each graph Dynamo hands it through the compile pipeline
(``fusegraph.pipeline``) and keeps what the compiles report: ``stats``, ``last_route``, ``last_graph_ops``, the
SPEC §1.3 log line.

Per graph: ``pipeline.compile_graph`` -> a ``CompiledGraph`` record, its tally absorbed into ``stats``, its callable
handed to Dynamo as the compile made it (an opt-in frozen compile is a ``freezing.FrozenGraph``, made inside the
pipeline).
"""
from __future__ import annotations

import collections
import copy
import itertools
import logging
import time
from typing import Optional

import torch

from . import pipeline
from .config import CompilationConfig, with_compile_args
from .fusion import PATTERN_NAMES, passes
from .stats import Stats

log = logging.getLogger("fusegraph")


class Backend:
    """A ``torch.compile`` backend: ``torch.compile(model, backend=fusegraph.Backend(config))``.

    The config (a CompilationConfig, a dict of overrides, or None for the process defaults) is snapshotted
    here; ``stats`` accumulates over every graph this backend compiles.
    """

    def __init__(self, config: Optional[CompilationConfig] = None):
        if config is None:
            config = CompilationConfig()
        elif isinstance(config, dict):
            config = CompilationConfig(**config)
        elif not isinstance(config, CompilationConfig):
            raise TypeError(f"config must be a CompilationConfig, a dict of overrides or None, "
                            f"got {type(config).__name__}")
        self.config = copy.deepcopy(config)
        self.stats = Stats()
        self._log_dir = passes.prepare_log_dir(self.config.graph_log_url)
        self._ids = itertools.count()
        self.last_route: Optional[str] = None
        # The last compiled graph as handed on (after fusion): op name -> count.
        # Op names are str(target), e.g. "fusegraph.gelu_tanh.default", "aten.tanh.default"; plus "get_attr".
        self.last_graph_ops: collections.Counter = collections.Counter()

    # copy.deepcopy / pickle of a compiled model carry the backend: its config and counters (a copied Stats carries
    # the values, in counters of its own); the graph-id counter continues where it was (itertools.count does not pickle on Python >= 3.14)
    def __getstate__(self):
        state = dict(self.__dict__)
        state["_ids"] = next(copy.copy(self._ids))
        return state

    def __setstate__(self, state):
        state = dict(state)
        state["_ids"] = itertools.count(state["_ids"])
        self.__dict__.update(state)

    def select_route(self, example_inputs) -> tuple[str, Optional[str]]:
        """('graph_with_compile' | 'graph_only' | 'default', why the wanted graph route is unavailable)."""
        return pipeline.select_route(self.config, example_inputs)

    def __call__(self, gm: torch.fx.GraphModule, example_inputs, *, mode: Optional[str] = None,
                 options: Optional[dict] = None):
        """One Dynamo graph. ``mode`` and ``options`` are what ``torch.compile(..., mode=, options=)`` hands a
        backend: applied over this backend's config for this compile (``config.with_compile_args``), the backend's
        own config unchanged."""
        t0 = time.perf_counter()
        config, log_dir = self.config, self._log_dir
        if mode is not None or options is not None:
            config = with_compile_args(config, mode, options)
            if config.graph_log_url != self.config.graph_log_url:
                log_dir = passes.prepare_log_dir(config.graph_log_url)
        captured_before, seconds_before = self.stats.graphs_captured, self.stats.capture_seconds
        graph_id = next(self._ids)
        record = pipeline.compile_graph(config, self.stats, gm, example_inputs, graph_id=graph_id,
                                        log_dir=log_dir, label=f"fusegraph Backend {id(self):#x}")
        self.stats.absorb(record.job.tally)
        self.last_route, self.last_graph_ops = record.route, record.job.ops
        job = record.job
        if record.route == "default" and config.inductor and job.counts is not None:
            kept = sum(job.counts.values()) - sum((job.lowered or {}).values())
            self.stats.add_graph_choice("fused" if kept > 0 else "inductor")
        seconds = time.perf_counter() - t0
        self.stats.add(graphs_compiled=1, compile_seconds=seconds)
        log.info(self._summary(job, self.stats.graphs_captured - captured_before,
                               self.stats.capture_seconds - seconds_before))
        log.debug("fusegraph: graph %d compiled in %.2f s on the %s route (%s)", graph_id, seconds, record.route,
                  "Inductor" if record.route == "default" and config.inductor else "aten graph")
        return record.fn

    def _summary(self, job, captured: int, capture_seconds: float) -> str:
        """The SPEC §1.3 line; '?' for a count Inductor served from its cache before fusegraph saw the graph."""
        counts = job.counts or {}
        unknown = job.counts is None and job.fusing
        fused = " ".join(f"{name}×{'?' if unknown else counts.get(name, 0)}" for name in PATTERN_NAMES)
        lowered = sum((job.lowered or {}).values())
        to_inductor = f"; {lowered} of them left to Inductor's code (faster there)" if lowered else ""
        return (f"fusegraph: fused {fused}; captured {captured} graph{'' if captured == 1 else 's'} "
                f"({capture_seconds:.2f} s, {self.stats.graph_memory_bytes / 2**20:.1f} MiB){to_inductor}")


def fusegraph_backend(gm, example_inputs, *, mode: Optional[str] = None, options: Optional[dict] = None):
    """Backend by name (``torch.compile(backend="fusegraph", mode=..., options=...)``): a Backend with the process
    defaults as they are at this compile, ``mode``/``options`` applied over them. Its counters add up in
    ``fusegraph_backend.stats``."""
    backend = Backend()
    backend.stats = fusegraph_backend.stats
    return backend(gm, example_inputs, mode=mode, options=options)


fusegraph_backend.stats = Stats()
