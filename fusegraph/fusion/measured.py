"""Per-graph measured choice on the Inductor route: fusegraph's compile of a graph or plain Inductor's, whichever
runs faster on this machine.

The per-site choice (``choice.py``) predicts each fused site from a cost model of the fused op alone. What it
cannot see is the whole graph: freezing's effect on the GEMMs around a site, the loops Inductor would have
generated across a site's neighbours, a few microseconds here and there that add up. So with
``fusion_choice="auto"`` (the default) a graph of the Inductor route is also compiled as plain ``torch.compile``
compiles it (``compile_fx`` on the same Dynamo graph, no fusion, no freezing), and the first calls time both,
interleaved on the caller's own inputs: ``WARMUP`` untimed calls of each, then ``ROUNDS`` timed calls of each in
the order A B B A A B ... The graph whose median is lower serves every later call (fusegraph's on a tie); the
other is dropped. The verdict is cached in memory and on disk next to Inductor's cache, keyed by the graph, its
input layouts, the config, the thread count and the machine, so a later process compiles only the winner, the
way Inductor's autotuning times its choices once.

Measuring on real calls rather than at compile time keeps the calls' side effects as the user wrote them (an input
updated in place, the RNG) and costs no input copies; during those first calls the results come from either
compile (equal within the dtype's tolerance, not bit for bit), and on a GPU each measured call synchronises.
Not measured (fusegraph's compile runs): graphs with symbolic shapes (one size would decide for all), graphs with
collectives on a multi-rank job (the ranks could choose differently), graphs where fusegraph changed nothing.
"""
from __future__ import annotations

import hashlib
import logging
import os
import statistics
import threading
import time

import torch

from .._verdicts import VerdictFile, is_timed_verdict

log = logging.getLogger("fusegraph")

CACHE_VERSION = 1
# Untimed calls of each compile before timing. A process settles over its first calls (allocator, caches, Python's
# specialising interpreter): tiny decode_mlp's calls went 135, 80, 64, 59, 55 us... to a steady 47 us, so one
# warm-up call each measured fusegraph's compile 5 % slower there when it is 7 % faster in the steady state.
WARMUP = 8
ROUNDS = 7  # timed calls of each compile
FUSED, INDUCTOR = "fused", "inductor"


def cache_path() -> str:
    from torch._inductor.runtime.cache_dir_utils import cache_dir

    return os.path.join(cache_dir(), "fusegraph_choice", f"graphs_v{CACHE_VERSION}.json")


_verdicts = VerdictFile(lambda: cache_path(),  # key -> [choice, t_fused, t_inductor]
                        valid=lambda v: is_timed_verdict(v, (FUSED, INDUCTOR)))


def cached_verdict(key: str):
    """The stored choice for ``key`` (FUSED or INDUCTOR), or None when it was never measured here."""
    verdict = _verdicts.get(key)
    if isinstance(verdict, list) and verdict and verdict[0] in (FUSED, INDUCTOR):
        return verdict[0]
    return None


def store_verdict(key: str, choice: str, t_fused: float, t_inductor: float) -> None:
    _verdicts.put(key, [choice, t_fused, t_inductor])


def forget() -> None:
    """Drops this process's verdicts (the file is read again on the next lookup). For tests and benchmarks."""
    _verdicts.forget()


def _machine(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    from ..bench.timing import cpu_model

    return cpu_model()


def graph_key(gm: torch.fx.GraphModule, example_inputs, pass_uuid: str, freeze: bool, device: torch.device) -> str:
    """Identifies a Dynamo graph's measurement: its code, its inputs' layouts, fusegraph's pass and config
    (``pass_uuid``), freezing, torch's version, the thread count and the machine."""
    inputs = [(tuple(x.shape), tuple(x.stride()), str(x.dtype), str(x.device), isinstance(x, torch.nn.Parameter))
              if isinstance(x, torch.Tensor) else type(x).__name__ for x in example_inputs]
    text = repr((gm.code, inputs, pass_uuid, freeze, torch.__version__, torch.get_num_threads(), _machine(device)))
    return hashlib.sha256(text.encode()).hexdigest()


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":  # pragma: no cover - Ascend only
        torch.npu.synchronize()


def _schedule() -> list:
    """(compile, timed?) per measured call: the warm-up calls, then A B, B A, A B, ... so that a drift in the
    machine's load hits both alike."""
    steps = [(FUSED, False), (INDUCTOR, False)] * WARMUP
    for r in range(ROUNDS):
        pair = (FUSED, INDUCTOR) if r % 2 == 0 else (INDUCTOR, FUSED)
        steps += [(pair[0], True), (pair[1], True)]
    return steps


CALLS = len(_schedule())  # calls a measured graph takes to decide (benchmarks warm up at least this long)


class MeasuredGraph:
    """The compiled callable Dynamo gets when a graph is measured: the first calls alternate between fusegraph's
    compile (``fused``) and plain Inductor's (``inductor``) and time each; then the faster serves every call.

    ``on_verdict(choice, t_fused, t_inductor, why)`` is called once, when the choice is made (``why``: empty, or
    why fusegraph's compile was kept unmeasured)."""

    def __init__(self, fused, inductor, device: torch.device, on_verdict, graph_id: int, recompiles=lambda: 0):
        self._fns = {FUSED: fused, INDUCTOR: inductor}
        self._recompiles = recompiles  # a count that grows when a call compiled (a frozen graph's guard miss)
        self._device = device
        self._on_verdict = on_verdict
        self._graph_id = graph_id
        self._steps = _schedule()
        self._step = 0
        self._times = {FUSED: [], INDUCTOR: []}
        self._measuring = threading.Lock()
        self.chosen = None  # the winning compile once decided
        self.choice = None  # FUSED or INDUCTOR once decided
        self.last_served = None  # FUSED or INDUCTOR: the compile that served the last call (read-only; for tests)

    def __call__(self, *args):
        chosen = self.chosen
        if chosen is not None:
            self.last_served = self.choice
            return chosen(*args)
        if not self._measuring.acquire(blocking=False):  # another thread is measuring: no timing of this call
            fns = self._fns
            fn = self.chosen or fns.get(FUSED) or fns[INDUCTOR]
            self.last_served = FUSED if fn is fns.get(FUSED) else INDUCTOR
            return fn(*args)
        try:
            if self.chosen is not None:
                self.last_served = self.choice
                return self.chosen(*args)
            return self._measured_call(args)
        finally:
            self._measuring.release()

    def _measured_call(self, args):
        name, timed = self._steps[self._step]
        fn = self._fns[name]
        self.last_served = name
        if timed:
            _synchronize(self._device)
            recompiles = self._recompiles()
            t0 = time.perf_counter()
        try:
            out = fn(*args)
        except Exception as e:
            if name == FUSED:
                raise
            # Plain Inductor failing where fusegraph's compile runs: keep fusegraph's (and say so).
            self._decide(FUSED, why=f"Inductor's own compile failed at run time ({type(e).__name__}: {e})")
            self.last_served = FUSED
            return self.chosen(*args)
        if timed:
            _synchronize(self._device)
            dt = time.perf_counter() - t0
            if self._recompiles() != recompiles:
                return out  # this call compiled (another module instance of a shared graph): time it again
            self._times[name].append(dt)
        self._step += 1
        if self._step == len(self._steps):
            t_fused, t_inductor = (statistics.median(self._times[k]) for k in (FUSED, INDUCTOR))
            self._decide(FUSED if t_fused <= t_inductor else INDUCTOR, t_fused, t_inductor)
        return out

    def _decide(self, choice: str, t_fused: float = float("nan"), t_inductor: float = float("nan"), why: str = ""):
        self.choice = choice
        self.chosen = self._fns[choice]
        self._fns = {choice: self.chosen}  # the other compile is dropped
        self._on_verdict(choice, t_fused, t_inductor, why)
        if why:
            log.warning("fusegraph: graph %d: %s; running fusegraph's compile", self._graph_id, why)
        else:
            log.info("fusegraph: graph %d measured: fusegraph's compile %.1f us, Inductor's own %.1f us per call: "
                     "running %s", self._graph_id, t_fused * 1e6, t_inductor * 1e6,
                     "fusegraph's" if choice == FUSED else "Inductor's own")


__all__ = ["CALLS", "FUSED", "INDUCTOR", "MeasuredGraph", "cache_path", "cached_verdict", "forget", "graph_key",
           "store_verdict"]
