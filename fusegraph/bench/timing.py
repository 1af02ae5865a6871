"""Timing helpers shared by every benchmark: warm runs, medians, device synchronisation, machine facts."""
from __future__ import annotations

import argparse
import os
import platform
import time
from typing import Callable

import torch

from .._core.measure import interleaved, sync_for, synchronize  # noqa: F401  (synchronize: the benchmarks' name)


def interleaved_seconds(fns: dict[str, Callable[[], object]], *, device="cpu", warmup: int = 3,
                        reps: int = 20) -> dict[str, list[float]]:
    """Wall times of several alternatives measured in turn, rep by rep (A B C, B C A, C A B, ...), so a change of
    machine load during the run (a shared machine) hits all of them alike: ``measure.interleaved``, the policy the
    measured choices use too, one call per rep. Each timed run synchronises the device (end-to-end time including
    host dispatch). Returns every alternative's list of ``reps`` times."""
    names = list(fns)
    times = interleaved([fns[n] for n in names], rounds=reps, warmup=warmup, sync=sync_for(device))
    return dict(zip(names, times))


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def load_summary() -> str:
    """The machine's 1-minute load average against its cores: on a shared machine, a load above the core
    count means other processes take CPU time from the run (and stall multi-threaded ops)."""
    cores = os.cpu_count() or 1
    try:
        load = os.getloadavg()[0]
    except OSError:  # pragma: no cover - not on Linux/macOS
        return f"{cores} cores"
    note = " (busy: other processes compete for the CPUs)" if load > cores else ""
    return f"load {load:.1f} on {cores} cores{note}"


def machine_summary(device: torch.device | str = "cpu") -> str:
    """The variables that decide a result (SPEC §5): device model, threads, torch version."""
    device = torch.device(device)
    parts = [f"torch {torch.__version__}"]
    if device.type == "cuda":
        parts.append(f"GPU {torch.cuda.get_device_name(device)} (CUDA {torch.version.cuda})")
    else:
        from fusegraph import _C

        from fusegraph._core import cpu_class

        parts.append(f"CPU {cpu_model()}, {torch.get_num_threads()} threads, kernels {_C.cpu_capability()}")
        from fusegraph.fusion import gemm_table

        measured = cpu_class.key() in gemm_table.measured_classes()
        parts.append(cpu_class.describe() + (", a measured class" if measured else
                                             ", a class not measured: linears keep eager's kernels (measure it: "
                                             "python -m fusegraph bench gemm --calibrate)"))
        parts.append(load_summary())
    parts.append(f"python {platform.python_version()}, pid {os.getpid()}")
    return "; ".join(parts)


def fmt_time(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:8.1f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:8.3f} ms"
    return f"{seconds:8.3f} s "


def first_call_seconds(fn: Callable[[], object], *, device="cpu") -> float:
    """Wall time of one synchronised call of ``fn()``: for ``torch.compile``d code, the compile time
    (tracing + codegen + the first run), reported apart from the warm medians."""
    synchronize(device)
    t0 = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - t0


def tensor_bytes(*tensors: torch.Tensor) -> int:
    """Bytes a kernel must move for these tensors: each view counted once at its own size (a ``[B,1,D]``
    broadcast view is D elements, not B*S*D), which is what a fused kernel reads or writes."""
    return sum(t.numel() * t.element_size() for t in tensors)


# --- command-line and report helpers shared by the bench subjects and the demo ---------------------

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def parse_dtypes(text: str) -> list[torch.dtype]:
    """``"fp32,bf16"`` -> ``[torch.float32, torch.bfloat16]``; a ValueError names an unknown entry."""
    out = []
    for name in (s.strip() for s in text.split(",") if s.strip()):
        if name not in DTYPES:
            raise ValueError(f"--dtype: unknown dtype {name!r}; expected a comma list of {', '.join(DTYPES)}")
        out.append(DTYPES[name])
    if not out:
        raise ValueError(f"--dtype: empty list {text!r}; expected a comma list of {', '.join(DTYPES)}")
    return out


def setup_device(device: str, threads: int | None) -> torch.device:
    """Validates ``--device`` and applies ``--threads`` (CPU intra-op threads) before anything is timed."""
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ValueError(f"--device: {device!r} is not a device; expected cpu or cuda") from None
    if dev.type not in ("cpu", "cuda"):
        raise ValueError(f"--device: {device!r}; expected cpu or cuda")
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device: {device!r} requested but torch {torch.__version__} sees no CUDA device")
    if threads is not None:
        if threads < 1:
            raise ValueError(f"--threads: {threads}; expected a positive integer")
        torch.set_num_threads(threads)
    return dev


def run_facts(device: torch.device | str = "cpu") -> dict:
    """What a JSON result file records besides the numbers: machine, torch, threads, date (UTC)."""
    import datetime

    device = torch.device(device)
    facts = {
        "machine": machine_summary(device),
        "torch": torch.__version__,
        "device": str(device),
        "threads": torch.get_num_threads(),
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
    }
    if device.type == "cuda":
        facts["gpu"] = torch.cuda.get_device_name(device)
        facts["cuda"] = torch.version.cuda
    else:
        facts["cpu"] = cpu_model()
        facts["cores"] = os.cpu_count()
        facts["load_avg_1min"] = os.getloadavg()[0] if hasattr(os, "getloadavg") else None
    return facts


def format_table(headers: list[str], rows: list[list[str]]) -> str:
    """A plain-text table: first column left-aligned, the others right-aligned, one space-padded line each."""
    cells = [headers] + rows
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]

    def line(r):
        return "  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))

    return "\n".join([line(headers), "  ".join("-" * w for w in widths)] + [line(r) for r in rows])


def write_json(path: str, payload: dict) -> None:
    import json

    with open(path, "w") as f:
        json.dump(payload, f, indent=2, sort_keys=False)
        f.write("\n")


def positive_int(text: str) -> int:
    """argparse ``type=``: an integer >= 1 (a count of runs, threads...)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def add_run_args(p, *, quick_help: str, reps_help: str) -> None:
    """The options ``demo`` and ``bench ops`` share: --device, --dtype, --quick, --reps, --threads, --json."""
    p.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    p.add_argument("--dtype", default="fp32,bf16", help="comma list of fp32, bf16, fp16 (default fp32,bf16)")
    p.add_argument("--quick", action="store_true", help=quick_help)
    p.add_argument("--reps", type=positive_int, default=None, help=reps_help)
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads(N) before timing")
    p.add_argument("--json", default=None, metavar="PATH", help="write every number (+ machine, date) here")
