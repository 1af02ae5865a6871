"""Which kernel a CPU linear layer of many rows runs, per dtype, as measured for the CPU class (``_core.cpu_class``).

Two choices, each between the kernel eager PyTorch calls (``aten``: ``addmm``, which is MKL's sgemm in float32 and
oneDNN's 16-bit matmul in bf16/fp16) and ``fusegraph.linear`` (``fused``: oneDNN's float32 matmul on the plain
weight; for bf16/fp16 the operands widened to float32 a block of weight rows at a time, the same float32
accumulation as ATen's 16-bit matmul):

- float32: MKL picks its code paths by vendor and ISA; on AMD with AVX-512 its sgemm is 1.1-2.4x slower than
  oneDNN's, on AVX2 level with it or 1.1x slower (the microarchitecture decides).
- bf16 / fp16: without native 16-bit dot products (AVX2, AVX-512 without AVX512-BF16) ATen's 16-bit matmul is
  2.2-17x slower than widening and running the float32 GEMM (BENCHMARKS §1.3); with them (AVX512-BF16, AMX) it
  is the faster one.

A third float32 kernel needs a copy of every weight and is therefore never a default: oneDNN on a weight reordered
once into its blocked layout (``mkldnn._reorder_linear_weight`` + ``mkldnn._linear_pointwise``), what OpenVINO does
to every weight. ``pack_weights=True`` (opt-in, it freezes) packs float32 linears that way only where the class's
table says it beats both plain kernels (``pack`` ``"onednn"``: faster at every shape and by ``MARGIN``
overall); elsewhere float32 weights stay unpacked (Inductor's own float32 packing, MKL's packed sgemm, measured
level with MKL on the plain weight).

The choice comes from a table measured per CPU class (``vendor/class`` key: ``AuthenticAMD/avx2``...):
``measure()`` times both kernels at the published models' GEMM shapes and picks ``fused`` only where it is faster at
every shape and by ``MARGIN`` overall. The tables of the development machines' classes (an AMD Zen 5, re-checked on
a Zen 4, and an Intel Xeon with AMX, each measured on itself and its narrower classes emulated there) ship as
``gemm_cpu.json``; one key covers every microarchitecture of its vendor and ISA class (the Zen 4 and the Zen 5 agree
on every many-row kernel);
``python -m fusegraph bench gemm --calibrate`` measures the user's own machine into the cache directory, which then
takes precedence. An entry may carry ``decided_by``: its kernel was decided by another measurement than the
isolated GEMMs beside it, and a later calibration written into the same table keeps that kernel:
- on whole models where the isolated GEMMs of one machine and another disagree (AMD AVX2 float32: oneDNN measured
  1.07-1.17x MKL emulated on the Zen 5 and 1.01-1.24x on a Zen 4, but 0.91-1.06x on the real AVX2-only EPYC VM of
  issue 38; whole models under the AVX2 caps on the Zen 4 ran 6-8 % faster with oneDNN's);
- on whole models where the isolated GEMMs and the models disagree (Intel float32, every class: the table's GEMMs
  read the two kernels level, 0.96-1.07x, while FLUX.1, Wan 2.1 and SD3.5 each run 1-17 % faster with oneDNN's; a
  GEMM timed alone, over and over on one weight, is not what it is inside a model; and Intel bf16 with AVX512-BF16
  but no AMX, where one 64-row shape kept oneDNN's bf16 matmul for the class while whole models ran 1.37-1.45x
  faster widened).
A second choice per class and dtype is for linears of a few rows (a decode step's projections, at most
``gemv.MAX_ROWS``): ``fusegraph.gemv`` (``fused``: one pass over the weight, bandwidth-bound) or the kernel eager
calls, decided per row count measured (``GEMV_ROWS``: a site of M rows takes the verdict of the smallest measured
count >= M) at the published widths (``GEMV_SHAPES``), by the same rule (faster at every shape and by ``MARGIN``
overall). With AMX, ATen's bf16 matmul on 8 rows is 1.6x faster than the few-row kernel while on one row it is
1.7x slower (BENCHMARKS §1.3); on the AMD Zen 4 with AVX512-BF16, 2-8 bf16 rows are ATen's too (BENCHMARKS §1.7).
A class with no few-row entry gets ``fused`` only at the dtype and row count where every class measured says so.
A class no table covers gets ``aten`` for every
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
PACKS = ("none", "onednn")  # float32 with pack_weights=True: leave unpacked, or pack for oneDNN
MARGIN = 0.05  # fused must be this much faster in geometric mean (and faster at every shape) to be chosen
# (rows, in, out): the GEMMs of FLUX.1 (3072 wide, 12288 MLP), Wan 2.1 1.3B (1536, 8960), SD3.5 Large (2432,
# 9728) at 320 tokens; the pass's sites have at least 2^20 multiply-adds and more than gemv.MAX_ROWS rows
SHAPES = ((320, 3072, 3072), (320, 3072, 12288), (320, 12288, 3072), (320, 1536, 8960), (320, 2432, 2432),
          (64, 1536, 1536))
# few-row linears (the gemv family's sites): the row counts measured and the (in, out) widths of FLUX.1's
# projections and MLP, Wan 2.1 1.3B's FFN and SD3.5 Large's projections
GEMV_ROWS = (1, 2, 4, 8)
GEMV_SHAPES = ((3072, 3072), (3072, 12288), (12288, 3072), (1536, 8960), (2432, 2432))
_SHIPPED = os.path.join(os.path.dirname(__file__), "gemm_cpu.json")


def _checked(data) -> dict:
    if not isinstance(data, dict) or data.get("version") != VERSION or not isinstance(data.get("classes"), dict):
        raise ValueError(f"expected a version {VERSION} GEMM table")
    for key, per_dtype in data["classes"].items():
        if not isinstance(per_dtype, dict):
            raise ValueError(f"{key}: expected a dict per dtype")
        for dtype, entry in per_dtype.items():
            if dtype not in DTYPES or not isinstance(entry, dict) or entry.get("kernel", "aten") not in KERNELS:
                raise ValueError(f"{key}/{dtype}: expected one of {DTYPES} with a kernel in {KERNELS}")
            if entry.get("pack", "none") not in PACKS:
                raise ValueError(f"{key}/{dtype}: pack {entry.get('pack')!r}, expected one of {PACKS}")
            gemv = entry.get("gemv", {})
            if not isinstance(gemv, dict) or any(not str(m).isdigit() or int(m) < 1 or k not in KERNELS
                                                 for m, k in gemv.items()):
                raise ValueError(f"{key}/{dtype}: gemv {gemv!r}, expected row counts mapped to one of {KERNELS}")
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
        if entry is not None and "kernel" in entry:
            ratio = entry.get("geomean")
            how = f", aten/fused time {ratio:.2f}x" if isinstance(ratio, (int, float)) else ""
            return entry["kernel"], f"{key} {name}: {source}{how}"
    return "aten", f"{key} {name}: class not measured (eager's kernel)"


def _gemv_verdict(gemv: dict, rows: int) -> Optional[str]:
    """The kernel a few-row entry gives a site of ``rows`` rows: the verdict of the smallest measured count >= it."""
    counts = sorted(int(m) for m in gemv)
    at = next((m for m in counts if m >= rows), None)
    return None if at is None else gemv[str(at)]


def _architecture(key: str) -> str:
    """The architecture a class key belongs to: ``x86`` for the x86 classes (``GenuineIntel/avx2``...), else the
    class itself (``ARM/aarch64`` -> ``aarch64``)."""
    cls = key.rsplit("/", 1)[-1]
    return "x86" if cls in cpu_class.NAMES else cls


def gemv_lookup(dtype: torch.dtype, rows: int, key: Optional[str] = None) -> tuple:
    """(kernel, why) for a linear of ``rows`` (<= gemv.MAX_ROWS) rows of ``dtype`` on this machine's class (or
    ``key``): ``"fused"`` (``fusegraph.gemv``) or ``"aten"`` (the kernel eager calls). A class without few-row
    entries: ``fused`` only where every class measured on its architecture says so. The few-row kernel races the
    platform's BLAS, so no verdict crosses architectures: an ARM CPU, whose kernels are another build (NEON) racing
    another BLAS, keeps eager's kernel until a class of its own is measured."""
    name = str(dtype).replace("torch.", "")
    key = key or cpu_class.key()
    for source, table in zip(("calibrated here", "measured for this class"), _tables()):
        kernel = _gemv_verdict(table.get(key, {}).get(name, {}).get("gemv", {}), rows)
        if kernel is not None:
            return kernel, f"{key} {name}, {rows} rows: {source}"
    arch = _architecture(key)
    verdicts = [_gemv_verdict(per_dtype.get(name, {}).get("gemv", {}), rows)
                for table in _tables() for other, per_dtype in table.items() if _architecture(other) == arch]
    verdicts = [v for v in verdicts if v is not None]
    if not verdicts:
        return "aten", f"{key} {name}, {rows} rows: class not measured, nor any {arch} class (eager's kernel)"
    kernel = "fused" if all(v == "fused" for v in verdicts) else "aten"
    return kernel, (f"{key} {name}, {rows} rows: class not measured ({'every' if kernel == 'fused' else 'not every'}"
                    f" {arch} class measured runs it fused)")


def pack_lookup(dtype: torch.dtype = torch.float32, key: Optional[str] = None) -> tuple:
    """(pack, why) for float32 linears of many rows under ``pack_weights=True`` on this machine's class (or ``key``):
    ``"onednn"`` (pack the weight once for oneDNN) or ``"none"`` (keep it unpacked: no table says packing pays)."""
    name = str(dtype).replace("torch.", "")
    if name != "float32":
        return "none", f"{name}: only float32 packing is decided by the table"
    key = key or cpu_class.key()
    for source, table in zip(("calibrated here", "measured for this class"), _tables()):
        entry = table.get(key, {}).get(name)
        if entry is not None and "pack" in entry:
            ratio = entry.get("pack_geomean")
            how = f", plain/packed time {ratio:.2f}x" if isinstance(ratio, (int, float)) else ""
            return entry["pack"], f"{key} {name}: {source}{how}"
    return "none", f"{key} {name}: packing not measured for this class (weights stay unpacked)"


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


PARTS = ("many-rows", "few-rows")


def measure(dtypes=DTYPES, shapes=SHAPES, reps: int = 5, progress=None, parts=PARTS) -> dict:
    """{dtype: entry} for this process's class: each shape's aten and fused times and the verdicts, for linears of
    many rows (``"many-rows"`` in ``parts``: the entry's ``kernel`` and ``pack``) and of a few (``"few-rows"``: its
    ``gemv``, per row count)."""
    out = {}
    gen = torch.Generator().manual_seed(0)
    for name in dtypes:
        if "few-rows" in parts:
            out[name] = measure_gemv(getattr(torch, name), reps=max(reps, 7), progress=progress)
        if "many-rows" not in parts:
            continue
        dtype = getattr(torch, name)
        rows = []
        for m, k, n in shapes:
            x = torch.randn(m, k, generator=gen).to(dtype)
            w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(dtype)
            b = torch.randn(n, generator=gen).to(dtype)
            fns = {"aten": lambda: torch.addmm(b, x, w.t()), "fused": lambda: torch.ops.fusegraph.linear(x, w, b)}
            if dtype == torch.float32 and torch.backends.mkldnn.is_available():
                packed = torch.ops.mkldnn._reorder_linear_weight(w, m)
                fns["packed"] = lambda: torch.ops.mkldnn._linear_pointwise(x, packed, b, "none", [], "")
            med = _median_seconds(fns, reps)
            rows.append({"shape": [m, k, n], "aten_s": med["aten"], "fused_s": med["fused"],
                         "ratio": med["aten"] / med["fused"]})
            line = f"{name} {m}x{k}x{n}: aten {med['aten'] * 1e3:.2f} ms, fused {med['fused'] * 1e3:.2f} ms"
            if "packed" in med:
                rows[-1]["packed_s"] = med["packed"]
                line += f", packed {med['packed'] * 1e3:.2f} ms"
            if progress:
                progress(f"{line}, {rows[-1]['ratio']:.2f}x")
        out[name] = {**out.get(name, {}), **_verdict(rows)}
    return out


def measure_gemv(dtype: torch.dtype, rows=GEMV_ROWS, shapes=GEMV_SHAPES, reps: int = 7, progress=None) -> dict:
    """``{"gemv": {rows: kernel}, "gemv_shapes": [...]}`` for ``dtype`` on this process's class: ``addmm`` (what
    eager calls) against ``fusegraph.gemv`` at each row count and width, interleaved medians; ``fused`` for a row
    count where the few-row kernel is faster at every width and by ``MARGIN`` in geometric mean."""
    gen = torch.Generator().manual_seed(1)
    verdicts, measured = {}, []
    for m in rows:
        ratios = []
        for k, n in shapes:
            x = torch.randn(m, k, generator=gen).to(dtype)
            w = (torch.randn(n, k, generator=gen) * k ** -0.5).to(dtype)
            b = torch.randn(n, generator=gen).to(dtype)
            med = _median_seconds({"aten": lambda: torch.addmm(b, x, w.t()),
                                   "fused": lambda: torch.ops.fusegraph.gemv(x, w, b)}, reps)
            ratios.append(med["aten"] / med["fused"])
            measured.append({"shape": [m, k, n], "aten_s": med["aten"], "fused_s": med["fused"],
                             "ratio": ratios[-1]})
            if progress:
                progress(f"{str(dtype).replace('torch.', '')} {m}x{k}x{n} (few rows): aten {med['aten'] * 1e3:.3f} ms, "
                         f"gemv {med['fused'] * 1e3:.3f} ms, {ratios[-1]:.2f}x")
        verdicts[str(m)] = "fused" if _geomean(ratios) >= 1 + MARGIN and all(r > 1 for r in ratios) else "aten"
    return {"gemv": verdicts, "gemv_shapes": measured}


def _geomean(ratios) -> float:
    ratios = list(ratios)
    return math.exp(sum(math.log(r) for r in ratios) / len(ratios))


def _verdict(rows: list, kernel: Optional[str] = None) -> dict:
    """The entry for one dtype's measured ``rows``: the plain kernel (``fused`` only if faster at every shape and by
    ``MARGIN`` overall; or ``kernel`` where another measurement decided it) and, where packed times were measured,
    whether packing for oneDNN beats, by the same rule, the faster of the two plain kernels at each shape: the copy
    is judged on what its layout buys, never on a kernel difference that ``kernel`` (decided on real hardware)
    overrode."""
    geomean = _geomean(r["ratio"] for r in rows)
    if kernel is None:
        kernel = "fused" if geomean >= 1 + MARGIN and all(r["ratio"] > 1 for r in rows) else "aten"
    entry = {"kernel": kernel, "geomean": geomean, "shapes": rows}
    if rows and all("packed_s" in r for r in rows):
        gains = [min(r["aten_s"], r["fused_s"]) / r["packed_s"] for r in rows]
        entry["pack_geomean"] = _geomean(gains)
        entry["pack"] = "onednn" if entry["pack_geomean"] >= 1 + MARGIN and all(g > 1 for g in gains) else "none"
    return entry


def save(entries: dict, path: Optional[str] = None, key: Optional[str] = None) -> str:
    """Merges ``entries`` ({dtype: entry}) under this class's key into the table at ``path`` (default: the
    calibration file in the cache directory) and returns the path."""
    path = path or calibration_path()
    key = key or cpu_class.key()
    data = read_json(path, _checked) if os.path.exists(path) else None
    data = data or {"version": VERSION, "classes": {}, "meta": {}}
    per_dtype = data["classes"].setdefault(key, {})
    for name, entry in entries.items():
        old = per_dtype.get(name, {})
        if "kernel" in entry and "decided_by" in old and "decided_by" not in entry:
            # the kernel was decided by a measurement on the class's real hardware, which emulation cannot replace
            # (another machine's caches): keep it; packing is judged on the layout alone (``_verdict``)
            entry = {**entry, **_verdict(entry["shapes"], old["kernel"]), "decided_by": old["decided_by"]}
        merged = {**old, **entry}  # a part not measured now (many rows, few rows) keeps its entries
        if "gemv" in entry:
            merged.pop("gemv_decided_by", None)  # measured here: what decided it before no longer does
        per_dtype[name] = merged
    data["meta"][key] = {"torch": torch.__version__, "date": time.strftime("%Y-%m-%d"),
                         "threads": torch.get_num_threads(), "describe": cpu_class.describe()}
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)
    reload()
    return path
