"""The one timing policy every measured choice and benchmark uses: interleaved rounds, a median per side (the same
machine load hits each side of a ratio alike, so a burst of load on a shared machine does not decide), and the
device synchronisation around each timed stretch (CUDA/NPU kernels run asynchronously)."""
from __future__ import annotations

import statistics
import time
from typing import Callable, Optional, Sequence

import torch


def synchronize(device) -> None:
    """Waits for ``device``'s queued work (nothing to wait for on CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":  # pragma: no cover - Ascend only
        torch.npu.synchronize()


def sync_for(device) -> Callable[[], None]:
    """A no-argument ``synchronize`` for ``device``."""
    device = torch.device(device)
    return (lambda: None) if device.type == "cpu" else (lambda: synchronize(device))


def interleaved(fns: Sequence[Callable[[], object]], *, rounds: int, warmup: int = 1, min_time: float = 0.0,
                sync: Optional[Callable[[], None]] = None) -> list:
    """Seconds per call of each of ``fns`` in each of ``rounds`` rounds: ``[[t, ...] per function]``. First
    ``warmup`` untimed calls of each; then each function gets n calls per round, n doubled until a round of it takes
    about ``min_time / rounds`` (n = 1 with ``min_time=0``); a round runs every function in turn, the order rotated
    by one each round (A B C, B C A, ...), each timed stretch between two ``sync()``."""
    sync = sync or (lambda: None)
    fns = list(fns)
    for fn in fns:
        for _ in range(warmup):
            fn()
    counts = []
    for fn in fns:
        n = 1
        while min_time > 0:
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            if (time.perf_counter() - t0) * rounds >= min_time or n >= 1 << 16:
                break
            n *= 2
        counts.append(n)
    times = [[] for _ in fns]
    order = list(range(len(fns)))
    for r in range(rounds):
        k = r % len(fns) if fns else 0
        for i in order[k:] + order[:k]:
            fn, n = fns[i], counts[i]
            sync()
            t0 = time.perf_counter()
            for _ in range(n):
                fn()
            sync()
            times[i].append((time.perf_counter() - t0) / n)
    return times


def paired_medians(fns: Sequence[Callable[[], object]], *, min_time: float = 0.06, rounds: int = 9,
                   sync: Optional[Callable[[], None]] = None) -> list:
    """Median seconds per call of each of ``fns`` (``interleaved`` after one warm-up call each): what every
    measured choice compares."""
    return [statistics.median(t) for t in interleaved(fns, rounds=rounds, warmup=1, min_time=min_time, sync=sync)]


def decide(default: Callable[[], object], other: Callable[[], object], *, by: float, store=None,
           key: Optional[str] = None, min_time: float = 0.06, rounds: int = 9,
           sync: Optional[Callable[[], None]] = None) -> list:
    """The one way fusegraph takes a choice by measurement: ``[other wins, t_default, t_other]``, ``other`` winning
    only when ``t_default >= by * t_other`` in ``paired_medians`` (``by`` > 1: the margin the default keeps).
    With a ``store`` (a ``cache.VerdictFile``) the verdict is kept under ``key`` and read back instead of measured
    again, in this process and in the next."""
    if store is not None:
        verdict = store.get(key)
        if verdict is not None:
            return verdict
    t_default, t_other = paired_medians([default, other], min_time=min_time, rounds=rounds, sync=sync)
    verdict = [t_default >= by * t_other, t_default, t_other]
    if store is not None:
        store.put(key, verdict)
    return verdict
