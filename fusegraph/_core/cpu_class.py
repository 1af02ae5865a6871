"""CPU classes: the instruction-set class this process runs as, and how to run as another one on the same machine.

A class is what decides which kernels the libraries under fusegraph pick: the widest vector ISA ATen dispatches to
(``ATEN_CPU_CAPABILITY``), what oneDNN may use (``ONEDNN_MAX_CPU_ISA``: AVX-512 with or without the BF16 dot
products, AMX), what MKL may use (``MKL_ENABLE_INSTRUCTIONS``), plus the vendor, since MKL picks its code paths by
vendor as well as by ISA. fusegraph's own kernels follow ATen's capability (csrc/ops/cpu/isa_dispatch.h) and
Inductor's generated code follows ``ATEN_CPU_CAPABILITY`` too.

Emulation: a process started with the environment of ``EMULATE[name]`` runs the libraries' code paths of that class
on a wider machine (``python -m fusegraph --cpu-class avx2 bench ...`` re-executes itself with it). What it cannot
show: the other machine's cache sizes, memory bandwidth, clock and core count; AMX on a machine without it; and
Inductor still compiles its C++ with ``-march=native``, so the compiler may auto-vectorise scalar loops with the
wider ISA (its explicit vector code is the class's).

The environment is read by each library once, at its first use: the class must be set before torch is imported.
"""
from __future__ import annotations

import functools
import os

import torch

from .torch_dispatcher import cpu_capabilities

# class -> (ATen capability, oneDNN ISA cap, MKL instruction cap). Widest first.
EMULATE = {
    "amx": ("avx512", "AVX512_CORE_AMX", "AVX512_E4"),
    "avx512_bf16": ("avx512", "AVX512_CORE_BF16", "AVX512"),
    "avx512": ("avx512", "AVX512_CORE", "AVX512"),
    "avx2": ("avx2", "AVX2", "AVX2"),
    "default": ("default", "SSE41", "SSE4_2"),
}
NAMES = tuple(EMULATE)
# The hardware features each class needs (cpuinfo names): a class can only be emulated on a machine that has them.
_NEEDS = {
    "amx": ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_bf16", "amx_bf16", "amx_tile"),
    "avx512_bf16": ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq", "avx512_bf16"),
    "avx512": ("avx512_f", "avx512_bw", "avx512_vl", "avx512_dq"),
    "avx2": ("avx2", "fma3"),
    "default": (),
}
_ONEDNN_ORDER = ("SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE", "AVX512_CORE_VNNI",
                 "AVX512_CORE_BF16", "AVX512_CORE_FP16", "AVX512_CORE_AMX", "AVX512_CORE_AMX_FP16", "ALL")


def environment(name: str) -> dict:
    """The environment variables that make a process run as class ``name``."""
    if name not in EMULATE:
        raise ValueError(f"cpu class: unknown {name!r}; expected one of {list(NAMES)}")
    aten, onednn, mkl = EMULATE[name]
    return {"ATEN_CPU_CAPABILITY": aten, "ONEDNN_MAX_CPU_ISA": onednn, "DNNL_MAX_CPU_ISA": onednn,
            "MKL_ENABLE_INSTRUCTIONS": mkl, "FUSEGRAPH_CPU_CLASS": name}


def hardware_classes() -> tuple:
    """The classes this machine can run as (its own and every narrower one), widest first."""
    caps = cpu_capabilities()
    return tuple(n for n in NAMES if all(caps.get(f, False) for f in _NEEDS[n]))


def check_emulable(name: str) -> None:
    """Raise a clear error when this machine cannot run as class ``name``."""
    environment(name)
    if name not in hardware_classes():
        caps = cpu_capabilities()
        missing = [f for f in _NEEDS[name] if not caps.get(f, False)]
        raise ValueError(f"cpu class: {name!r} needs {missing}, which this CPU ({caps.get('name', '?')}) lacks; "
                         f"it can run as {list(hardware_classes())}")


def _onednn_cap() -> str:
    cap = (os.environ.get("ONEDNN_MAX_CPU_ISA") or os.environ.get("DNNL_MAX_CPU_ISA") or "ALL").upper()
    return cap if cap in _ONEDNN_ORDER else "ALL"


def _onednn_allows(isa: str) -> bool:
    return _ONEDNN_ORDER.index(_onednn_cap()) >= _ONEDNN_ORDER.index(isa)


@functools.lru_cache(maxsize=None)
def current() -> str:
    """The class this process runs as: the machine's own, narrowed by the emulation variables it was started with.
    Non-x86 machines: the architecture's name (``aarch64``...), a class of its own."""
    import platform

    arch = platform.machine().lower()
    if arch not in ("x86_64", "amd64"):
        return arch
    aten = torch.backends.cpu.get_cpu_capability()  # honours ATEN_CPU_CAPABILITY
    own = hardware_classes()
    if aten == "DEFAULT":
        return "default"
    if aten == "AVX2" or not _onednn_allows("AVX512_CORE"):
        return "avx2"
    if "amx" in own and _onednn_allows("AVX512_CORE_AMX"):
        return "amx"
    if "avx512_bf16" in own and _onednn_allows("AVX512_CORE_BF16"):
        return "avx512_bf16"
    return "avx512"


# ARM CPUs name their designer by "CPU implementer" (MIDR_EL1 bits 31:24; Linux's arch/arm64/include/asm/cputype.h).
_ARM_IMPLEMENTERS = {0x41: "ARM", 0x42: "Broadcom", 0x43: "Cavium", 0x46: "Fujitsu", 0x48: "HiSilicon",
                     0x4E: "NVIDIA", 0x50: "APM", 0x51: "Qualcomm", 0x61: "Apple", 0x6D: "Microsoft", 0xC0: "Ampere"}


def vendor(cpuinfo: str = "/proc/cpuinfo") -> str:
    """The CPU vendor: x86's vendor string (``GenuineIntel``, ``AuthenticAMD``...), an ARM CPU's implementer
    (``ARM`` for Neoverse cores such as AWS Graviton's, ``HiSilicon`` for Kunpeng, ``Ampere``...), or "" where
    /proc/cpuinfo says neither."""
    try:
        with open(cpuinfo) as f:
            for line in f:
                name, _, value = line.partition(":")
                name, value = name.strip(), value.strip()
                if name == "vendor_id":
                    return value
                if name == "CPU implementer":
                    try:
                        code = int(value, 16)
                    except ValueError:
                        return ""
                    return _ARM_IMPLEMENTERS.get(code, f"arm-{code:#04x}")
    except OSError:
        pass
    return ""


def key() -> str:
    """The key measured tables are kept under: ``vendor/class`` (MKL's code path depends on both)."""
    return f"{vendor() or 'unknown'}/{current()}"


def emulated() -> bool:
    """Whether this process runs as a narrower class than its machine's (started with ``environment``)."""
    own = hardware_classes()
    return bool(own) and current() != own[0]


def describe() -> str:
    """One line for benchmark headers: the class, and whether it is emulated."""
    own = hardware_classes()
    text = f"CPU class {key()}"
    if emulated():
        text += f" (emulated on an {own[0]} machine)"
    return text
