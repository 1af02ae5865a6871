"""What happened: one stats object per Backend and per GraphRunner (SPEC §1.3)."""
from __future__ import annotations

import logging
import threading

from . import _C
from .fusion.patterns import PATTERN_NAMES  # the family table lists them

_DICTS = ("patterns", "lowered", "fallbacks", "graph_choices")
# The scalar counters, in C++ (csrc/graph/counters.h: the list and what each counts).
COUNTER_NAMES = _C.graph.Counters.names


log = logging.getLogger("fusegraph")
_logged: set = set()
_logged_lock = threading.Lock()


def log_fallback(reason: str) -> None:
    """A fallback's reason, logged as a warning once per process."""
    with _logged_lock:
        if reason in _logged:
            return
        _logged.add(reason)
    log.warning("fusegraph: %s", reason)


class Tally:
    """What one compile adds to a ``Stats``: fused and lowered sites per family, and fallback reasons (in order).
    Takes the same ``add_*`` calls as a Stats (``passes.fuse_graph`` and ``choice.choose`` count into either).
    Once absorbed (``Stats.absorb``), later additions go straight to that Stats: aot_autograd compiles a training
    graph's backward at the first backward call, after the compile returned."""

    def __init__(self):
        self.patterns: dict = {}
        self.lowered: dict = {}
        self.fallbacks: list = []
        self.target = None  # the Stats that absorbed it

    def add_patterns(self, counts: dict) -> None:
        if self.target is not None:
            return self.target.add_patterns(counts)
        for name, n in counts.items():
            self.patterns[name] = self.patterns.get(name, 0) + n

    def add_lowered(self, counts: dict) -> None:
        if self.target is not None:
            return self.target.add_lowered(counts)
        for name, n in counts.items():
            self.lowered[name] = self.lowered.get(name, 0) + n

    def add_fallback(self, reason: str) -> None:
        if self.target is not None:
            return self.target.add_fallback(reason)
        self.fallbacks.append(reason)


class Stats:
    """Counters for one backend or runner. Names are part of the API; add counters, never rename.

    - ``patterns``: fused sites per family; ``lowered``: of those, the sites the Inductor route lowered back to
      aten ops because Inductor's own code is predicted faster there (fusegraph.fusion.choice; fused ops in
      the compiled code = patterns - lowered); ``fallbacks``: reason -> count; ``graph_choices``: Inductor-route
      graphs by what the compile-time choice left in them: ``"fused"`` (at least one fused op kept) or
      ``"inductor"`` (every site Inductor's own code, or nothing to fuse). Python
      dicts: change them through ``add_patterns``, ``add_lowered``, ``add_fallback`` and ``add_graph_choice``.
    - the scalars (``graphs_compiled``, ``graphs_captured``, ``replays``, ``inputs_copied``, ``inputs_skipped``,
      ``evictions``, ``recaptures``, ``eager_calls``, ``frozen_recompiles``, ``weight_invalidations``,
      ``bucket_padded_calls``, ``bucket_overflows``, ``graph_memory_bytes``, ``capture_seconds``,
      ``compile_seconds``): attributes read from ``counters``, the C++ object (atomics) that the graph caches
      of the runners reporting into this Stats count into as they capture, replay and evict. Add to them with
      ``add(name=amount, ...)``.

    Copies, deep copies and pickles carry the values, not the sharing: a copy has counters of its own.
    """

    def __init__(self, **values):
        self.patterns = {name: 0 for name in PATTERN_NAMES}
        self.lowered = {name: 0 for name in PATTERN_NAMES}
        self.fallbacks = {}
        self.graph_choices = {"fused": 0, "inductor": 0}
        self.counters = _C.graph.Counters()  # shared with the GraphCaches of the runners reporting here
        self._lock = threading.Lock()  # the dicts
        for name, value in values.items():
            if name in _DICTS:
                setattr(self, name, dict(value))
            elif name in COUNTER_NAMES:
                setattr(self.counters, name, value)
            else:
                raise TypeError(f"Stats() got an unexpected keyword argument {name!r}")

    def add(self, **amounts) -> None:
        """Adds to scalar counters atomically: ``stats.add(eager_calls=1, bucket_overflows=1)``."""
        self.counters.add(**amounts)

    def add_fallback(self, reason: str) -> None:
        with self._lock:
            self.fallbacks[reason] = self.fallbacks.get(reason, 0) + 1

    def add_patterns(self, counts: dict) -> None:
        with self._lock:
            for name, n in counts.items():
                self.patterns[name] = self.patterns.get(name, 0) + n

    def add_graph_choice(self, choice: str) -> None:
        with self._lock:
            self.graph_choices[choice] = self.graph_choices.get(choice, 0) + 1

    def add_lowered(self, counts: dict) -> None:
        with self._lock:
            for name, n in counts.items():
                self.lowered[name] = self.lowered.get(name, 0) + n

    def absorb(self, tally: Tally) -> None:
        """Adds what one compile tallied, and whatever it tallies from now on."""
        self.add_patterns(tally.patterns)
        self.add_lowered(tally.lowered)
        for reason in tally.fallbacks:
            self.add_fallback(reason)
        tally.target = self

    def note_fallback(self, reason: str) -> None:
        """Counts a fallback and logs its reason (once per process and reason)."""
        self.add_fallback(reason)
        log_fallback(reason)

    def as_dict(self) -> dict:
        with self._lock:
            out = {name: dict(getattr(self, name)) for name in _DICTS}
        out.update((name, getattr(self.counters, name)) for name in COUNTER_NAMES)
        return out

    def __getstate__(self):  # copy/deepcopy/pickle: the values, not the lock or the shared counters
        return self.as_dict()

    def __setstate__(self, state):
        self.__init__(**state)

    def __eq__(self, other):
        return type(other) is Stats and self.as_dict() == other.as_dict()

    __hash__ = None

    def __repr__(self):
        return "Stats(" + ", ".join(f"{k}={v!r}" for k, v in self.as_dict().items()) + ")"


def _counter(name):
    return property(lambda self: getattr(self.counters, name),
                    lambda self, value: setattr(self.counters, name, value),
                    doc=f"The ``{name}`` counter (``counters.{name}``).")


for _name in COUNTER_NAMES:
    setattr(Stats, _name, _counter(_name))
del _name
