"""What happened: one stats object per Backend and per GraphRunner (SPEC §1.3)."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

from .fusion.patterns import PATTERN_NAMES  # the family table lists them


@dataclass
class Stats:
    """Counters for one backend or runner. Names are part of the API; add fields, never rename."""

    patterns: dict = field(default_factory=lambda: {name: 0 for name in PATTERN_NAMES})
    # Of the sites in ``patterns``, those the Inductor route lowered back to aten ops because Inductor's own code is
    # predicted faster there (fusegraph.fusion.choice; fused ops in the compiled code = patterns - lowered).
    lowered: dict = field(default_factory=lambda: {name: 0 for name in PATTERN_NAMES})
    graphs_compiled: int = 0
    graphs_captured: int = 0
    replays: int = 0
    inputs_copied: int = 0
    inputs_skipped: int = 0
    evictions: int = 0
    recaptures: int = 0
    fallbacks: dict = field(default_factory=dict)  # reason -> count
    eager_calls: int = 0  # calls run uncaptured because their signature fell back
    frozen_recompiles: int = 0  # a frozen graph compiled again: other parameter tensors, or weights changed
    weight_invalidations: int = 0  # a GraphRunner dropped its graphs: a parameter/buffer/submodule was replaced
    bucket_padded_calls: int = 0  # batch buckets: calls whose batch was padded up to a bucket
    bucket_overflows: int = 0  # batch buckets: calls beyond the largest bucket, run uncaptured (also eager_calls)
    capture_seconds: float = 0.0
    compile_seconds: float = 0.0
    graph_memory_bytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def __getstate__(self):  # copy/deepcopy/pickle: the counters, not the lock
        return self.as_dict()

    def __setstate__(self, state):
        self.__init__(**state)

    def add_fallback(self, reason: str) -> None:
        with self._lock:
            self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    def add_patterns(self, counts: dict) -> None:
        with self._lock:
            for name, n in counts.items():
                self.patterns[name] = self.patterns.get(name, 0) + n

    def add_lowered(self, counts: dict) -> None:
        with self._lock:
            for name, n in counts.items():
                self.lowered[name] = self.lowered.get(name, 0) + n

    def as_dict(self) -> dict:
        return {k: (dict(v) if isinstance(v, dict) else v) for k, v in self.__dict__.items() if not k.startswith("_")}
