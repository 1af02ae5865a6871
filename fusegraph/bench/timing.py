"""Timing helpers shared by every benchmark: warm runs, medians, device synchronisation, machine facts."""
from __future__ import annotations

import os
import platform
import statistics
import time
from typing import Callable

import torch


def synchronize(device: torch.device | str) -> None:
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type == "npu":  # pragma: no cover - Ascend only
        torch.npu.synchronize()


def median_seconds(fn: Callable[[], object], *, device="cpu", warmup: int = 3, reps: int = 20,
                   min_time: float = 0.0) -> float:
    """Median wall time of ``fn()`` over ``reps`` timed runs after ``warmup`` untimed ones (each timed run
    synchronises the device, so it is end-to-end time including host dispatch). With ``min_time`` > 0,
    keeps running until that many seconds have been spent timing (at least ``reps`` runs)."""
    for _ in range(warmup):
        fn()
    synchronize(device)
    times = []
    spent = 0.0
    while len(times) < reps or spent < min_time:
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        dt = time.perf_counter() - t0
        times.append(dt)
        spent += dt
    return statistics.median(times)


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def machine_summary(device: torch.device | str = "cpu") -> str:
    """The variables that decide a result (SPEC §5): device model, threads, torch version."""
    device = torch.device(device)
    parts = [f"torch {torch.__version__}"]
    if device.type == "cuda":
        parts.append(f"GPU {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})")
    else:
        from fusegraph import _C

        parts.append(f"CPU {cpu_model()}, {torch.get_num_threads()} threads, kernels {_C.cpu_capability()}")
    parts.append(f"python {platform.python_version()}, pid {os.getpid()}")
    return "; ".join(parts)


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:8.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:8.3f} ms"
    return f"{seconds:8.3f} s "
