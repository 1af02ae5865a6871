"""Which kernel a CPU linear layer of many rows runs, per dtype, as measured for the CPU class (``_core.cpu_class``).

Two choices, each between the kernel eager PyTorch calls (``aten``: ``addmm``, which is MKL's sgemm in float32 and
oneDNN's 16-bit matmul in bf16/fp16) and ``fusegraph.linear`` (``fused``: oneDNN's float32 matmul on the plain
weight; for bf16/fp16 the operands widened to float32 a block of weight rows at a time, the same float32
accumulation as ATen's 16-bit matmul):

- float32: MKL picks its code paths by vendor and ISA; on AMD with AVX-512 its sgemm is 2.1-2.4x slower than
  oneDNN's, on AVX2 level with it.
- bf16 / fp16: without native 16-bit dot products (AVX2, AVX-512 without AVX512-BF16) ATen's 16-bit matmul is
  2.2-17x slower than widening and running the float32 GEMM (BENCHMARKS §1.3); with them (AVX512-BF16, AMX) it
  is the faster one.

The choice comes from a table measured per CPU class (``vendor/class`` key: ``AuthenticAMD/avx2``...):
``measure()`` times both kernels at the published models' GEMM shapes and picks ``fused`` only where it is faster at
every shape and by ``MARGIN`` overall. The table of the development machine's classes (measured there, narrower
classes emulated) ships as ``gemm_cpu.json``; ``python -m fusegraph bench gemm --calibrate`` measures the user's
own machine into the cache directory, which then takes precedence. A class no table covers gets ``aten`` for every
dtype: eager's kernel, so never slower than eager or Inductor (which call the same kernels). The choice is read at
compile time and never measured during a compile: the same inputs give the same outputs from the first call.
"""
from __future__ import annotations

import functools
import json
import math
import os
import statistics
import time
from typing import Optional

import torch

from .._core import cache, cpu_class
from .._core.cache import read_json

VERSION = 1
DTYPES = ("float32", "bfloat16", "float16")
KERNELS = ("aten", "fused")
MARGIN = 0.05  # fused must be this much faster in geometric mean (and faster at every shape) to be chosen
# (rows, in, out): the GEMMs of FLUX.1 (3072 wide, 12288 MLP), Wan 2.1 1.3B (1536, 8960), SD3.5 Large (2432,
# 9728) at 320 tokens; the pass's sites have at least 2^20 multiply-adds and more than gemv.MAX_ROWS rows
SHAPES = ((320, 3072, 3072), (320, 3072, 12288), (320, 12288, 3072), (320, 1536, 8960), (320, 2432, 2432),
          (64, 1536, 1536))
_SHIPPED = os.path.join(os.path.dirname(__file__), "gemm_cpu.json")


def _checked(data) -> dict:
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("classes"), dict):
        raise ValueError(f"expected a version {VERSION} GEMM table")
    for key, per_dtype in data["classes"].items():
        if not isinstance(per_dtype, dict):
            raise ValueError(f"{key}: expected a dict per dtype")
        for dtype, entry in per_dtype.items():
            if dtype not in DTYPES or not isinstance(entry, dict) or entry.get("kernel") not in KERNELS:
                raise ValueError(f"{key}/{dtype}: expected one of {DTYPES} with a kernel in {KERNELS}")
    return data


def calibration_path() -> str:
    return cache.path(f"gemm_v{VERSION}.json")


@functools.lru_cache(maxsize=None)
def _tables() -> tuple:
    """(the user's calibration, the shipped table), each {key: {dtype: entry}}."""
    user = read_json(calibration_path(), _checked)
    shipped = read_json(_SHIPPED, _checked)
    return (user or {}).get("classes", {}), (shipped or {}).get("classes", {})


def reload() -> None:
    _tables.cache_clear()


def lookup(dtype: torch.dtype, key: Optional[str] = None) -> tuple:
    """(kernel, why) for linears of ``dtype`` on this machine's class (or ``key``): ``"aten"`` or ``"fused"``."""
    name = str(dtype).replace("torch.", "")
    key = key or cpu_class.key()
    for source, table in zip(("calibrated here", "measured for this class"), _tables()):
        entry = table.get(key, {}).get(name)
        if entry is not None:
            ratio = entry.get("geomean")
            how = f", aten/fused time {ratio:.2f}x" if isinstance(ratio, (int, float)) else ""
            return entry["kernel"], f"{key} {name}: {source}{how}"
    return "aten", f"{key} {name}: class not measured (eager's kernel)"


def measured_classes() -> list:
    """The keys the shipped table and the user's calibration hold."""
    user, shipped = _tables()
    return sorted(set(user) | set(shipped))


def _median_seconds(fns: dict, reps: int) -> dict:
    """Interleaved warm medians of each callable."""
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn()
    for _ in range(reps):
        for name, fn in fns.items():
            t = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(t) for name, t in times.items()}


def measure(dtypes=DTYPES, shapes=SHAPES, reps: int = 5, progress=None) -> dict:
    """{dtype: entry} for this process's class: each shape's aten and fused times and the verdict."""
    out = {}
    gen = torch.Generator().manual_seed(0)
    for name in dtypes:
        dtype = getattr(torch, name)
        rows = []
        for m, k, n in shapes:
            x = torch.randn(m, k, generator=gen).to(dtype)
            w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(dtype)
            b = torch.randn(n, generator=gen).to(dtype)
            med = _median_seconds({"aten": lambda: torch.addmm(b, x, w.t()),
                                   "fused": lambda: torch.ops.fusegraph.linear(x, w, b)}, reps)
            rows.append({"shape": [m, k, n], "aten_s": med["aten"], "fused_s": med["fused"],
                         "ratio": med["aten"] / med["fused"]})
            if progress:
                progress(f"{name} {m}x{k}x{n}: aten {med['aten'] * 1e3:.2f} ms, fused {med['fused'] * 1e3:.2f} ms, "
                         f"{rows[-1]['ratio']:.2f}x")
        geomean = math.exp(sum(math.log(r["ratio"]) for r in rows) / len(rows))
        kernel = "fused" if geomean >= 1 + MARGIN and all(r["ratio"] > 1 for r in rows) else "aten"
        out[name] = {"kernel": kernel, "geomean": geomean, "shapes": rows}
    return out


def save(entries: dict, path: Optional[str] = None, key: Optional[str] = None) -> str:
    """Merges ``entries`` ({dtype: entry}) under this class's key into the table at ``path`` (default: the
    calibration file in the cache directory) and returns the path."""
    path = path or calibration_path()
    key = key or cpu_class.key()
    data = read_json(path, _checked) if os.path.exists(path) else None
    data = data or {"version": VERSION, "classes": {}, "meta": {}}
    data["classes"].setdefault(key, {}).update(entries)
    data["meta"][key] = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                         "threads": torch.get_num_threads(), "describe": cpu_class.describe()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    reload()
    return path
