"""float32 linear layers on many rows through oneDNN: ``mm(x, W)`` / ``addmm(b, x, W)`` with ``W`` the transpose
of a row-major ``[N, K]`` weight, ``x`` of more than ``gemv.MAX_ROWS`` rows, at least ``MIN_MACS`` multiply-adds
-> ``fusegraph.linear`` (oneDNN's matmul on the weight as it is).

Why: ATen's float32 addmm is MKL's sgemm. MKL picks its kernels by CPU vendor: on a non-Intel CPU with AVX-512
(this project's AMD Zen 5) it runs a path 2.1-2.4x slower than oneDNN's AVX-512 brgemm on the same weight, from
64 x 128 x 512 up to FLUX.1's 320 x 3072 x 12288 (docs/BENCHMARKS.md, "GEMM kernels"; ``python -m fusegraph bench
gemm`` measures it on any machine); linears are 96 % of FLUX.1's float32 time. oneDNN picks its kernels by the ISA
the CPU reports. Its call costs ~15 us more than MKL's, so small products stay with addmm (below 2^20
multiply-adds the measured ratio falls under 1.15x; 8 x 128 x 128 is 0.36x), and few-row ones go to gemv.

Where: ``enable_linear`` ``"auto"`` (default) routes these sites on CPUs where MKL does not use its AVX-512 code
(vendor other than GenuineIntel, AVX-512 reported, torch built with MKL and oneDNN) - a property of the CPU and
the torch build, fixed for the machine, never measured during the user's compile (the choice does not depend on
the machine's load); ``True`` on any CPU with oneDNN; ``False`` never. bf16/fp16 linears are left alone: ATen
already runs them through oneDNN (measured 0.95-1.04x either way).
"""
from __future__ import annotations

import functools

import torch
from ..._core.torch_pattern_matcher import CallFunction, KeywordArg, register_graph_pattern

from . import _anchors, gemv
from ._family import Candidate, Family

aten = torch.ops.aten

MIN_MACS = 1 << 20


def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


@functools.lru_cache(maxsize=None)
def machine_rule() -> tuple:
    """(oneDNN's float32 linear is the faster kernel on this machine, why): the "auto" rule (module docstring)."""
    if not torch.backends.mkldnn.is_available():
        return False, "torch has no oneDNN"
    if not torch.backends.mkl.is_available():
        return False, "torch's BLAS is not MKL"
    vendor = _cpu_vendor()
    if not vendor:
        return False, "CPU vendor unknown"
    if vendor == "GenuineIntel":
        return False, "Intel CPU: MKL's sgemm runs its own best code"
    capability = torch.backends.cpu.get_cpu_capability()
    if not capability.startswith("AVX512"):
        return False, f"{vendor} CPU without AVX-512 ({capability})"
    return True, f"{vendor} CPU with AVX-512: MKL's sgemm does not use it, oneDNN's matmul does"


def uses_onednn(mode) -> bool:
    """Whether ``enable_linear=mode`` routes float32 CPU linears to oneDNN here."""
    if mode == "auto":
        return machine_rule()[0]
    return bool(mode) and torch.backends.mkldnn.is_available()


def site_ok(x, w, bias=None) -> bool:
    """x [M > gemv.MAX_ROWS, K], w [K, N] with strides (1, K) (a row-major [N, K] weight, transposed),
    M * K * N >= MIN_MACS, optional bias [N]; CPU, float32; static sizes."""
    xv, wv = gemv._val(x), gemv._val(w)
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or xv.dim() != 2 or wv.dim() != 2:
        return False
    if xv.device.type != "cpu" or xv.dtype != torch.float32 or wv.dtype != torch.float32:
        return False
    if not all(gemv._plain(s) for s in (*xv.shape, *wv.shape, *wv.stride())):  # symbolic: not judged
        return False
    (m, k), (k2, n) = xv.shape, wv.shape
    if m <= gemv.MAX_ROWS or k != k2 or m * k * n < MIN_MACS or tuple(wv.stride()) != (1, k):
        return False
    if bias is not None:
        bv = gemv._val(bias)
        if not isinstance(bv, torch.Tensor) or bv.dtype != xv.dtype or tuple(bv.shape) != (n,):
            return False
    return True


def register(pm, opts) -> None:
    op = torch.ops.fusegraph.linear.default

    @register_graph_pattern(CallFunction(aten.mm.default, KeywordArg("x"), KeywordArg("w")),
                            extra_check=lambda match: site_ok(*match.output_node().args[:2]), pass_dict=pm)
    def _mm(match, x, w):
        gemv.replace(match.output_node(), x, w, None, op)

    def check_addmm(match) -> bool:
        node = match.output_node()
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return False
        return site_ok(node.args[1], node.args[2], node.args[0])

    @register_graph_pattern(CallFunction(aten.addmm.default, KeywordArg("b"), KeywordArg("x"), KeywordArg("w")),
                            extra_check=check_addmm, pass_dict=pm)
    def _addmm(match, b, x, w):
        gemv.replace(match.output_node(), x, w, b, op)


# ---- explain -----------------------------------------------------------------------------------------


def _anchor(node):
    """A float32 linear layer of many rows (mm/addmm), as this family defines its sites."""
    return _anchors.matmul_anchor(node, site_ok, "float32 mm", "float32 addmm")


# Not lowered, not calibrated: it replaces an extern call (mm) for which Inductor generates no code of its own.
FAMILY = Family("linear", "enable_linear", register, active=uses_onednn, ops=("linear.default",),
                candidates=(Candidate(_anchor),))
