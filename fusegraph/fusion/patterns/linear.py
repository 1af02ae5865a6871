"""Linear layers on many rows through ``fusegraph.linear`` where the CPU class's measured table says it is the faster
kernel: ``mm(x, W)`` / ``addmm(b, x, W)`` with ``W`` the transpose of a row-major ``[N, K]`` weight, ``x`` of more
than ``gemv.MAX_ROWS`` rows, at least ``MIN_MACS`` multiply-adds, CPU, float32 / bf16 / fp16.

Why: the kernel eager PyTorch calls is not the fastest on every CPU (``fusegraph.fusion.gemm_table``). float32:
ATen's addmm is MKL's sgemm, which picks its code by vendor; on AMD with AVX-512 it runs 2.1-2.4x slower than
oneDNN's brgemm on the same weight (linears are 96 % of FLUX.1's float32 time). bf16/fp16: on a CPU class without
native 16-bit dot products (AVX2, AVX-512 without AVX512-BF16) ATen's 16-bit matmul is 2.2-17x slower than
widening the operands and running the float32 GEMM, which ``fusegraph.linear`` does a block of weight rows at a time
(no float32 copy of the weight is kept). Small products stay with addmm (oneDNN's call costs ~15 us more than
MKL's: below 2^20 multiply-adds the measured ratio falls under 1.15x), few-row ones go to gemv.

Where: ``enable_linear`` ``"auto"`` (default) routes the dtypes whose table entry for this CPU class says
``fused`` (``gemm_table.lookup``: the user's ``bench gemm --calibrate``, else the table shipped for the class,
else eager's kernel) - fixed for the machine, never measured during the user's compile; ``True`` routes every
dtype on any CPU with oneDNN; ``False`` none.
"""
from __future__ import annotations

import functools

import torch
from ..._core.torch_pattern_matcher import CallFunction, KeywordArg, register_graph_pattern

from .. import gemm_table
from . import _anchors, gemv
from ._family import Candidate, Family

aten = torch.ops.aten

MIN_MACS = 1 << 20


@functools.lru_cache(maxsize=None)
def machine_rule(dtype: torch.dtype = torch.float32) -> tuple:
    """(``fusegraph.linear`` is the faster kernel for ``dtype`` on this machine's CPU class, why): the "auto" rule
    (module docstring)."""
    if not torch.backends.mkldnn.is_available():
        return False, "torch has no oneDNN"
    if dtype == torch.float32 and not torch.backends.mkl.is_available():
        return False, "torch's BLAS is not MKL"
    kernel, why = gemm_table.lookup(dtype)
    return kernel == "fused", why


DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def routed_dtypes(mode) -> tuple:
    """The dtypes whose many-row linears ``enable_linear=mode`` routes to ``fusegraph.linear`` here."""
    if mode == "auto":
        return tuple(d for d in DTYPES if machine_rule(d)[0])
    return DTYPES if bool(mode) and torch.backends.mkldnn.is_available() else ()


def uses_onednn(mode) -> bool:
    """Whether ``enable_linear=mode`` routes any CPU linear to ``fusegraph.linear`` here (the family is active)."""
    return bool(routed_dtypes(mode))


def site_ok(x, w, bias=None, dtypes=(torch.float32,)) -> bool:
    """x [M > gemv.MAX_ROWS, K], w [K, N] with strides (1, K) (a row-major [N, K] weight, transposed),
    M * K * N >= MIN_MACS, optional bias [N]; CPU, one of ``dtypes``; static sizes."""
    xv, wv = gemv._val(x), gemv._val(w)
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or xv.dim() != 2 or wv.dim() != 2:
        return False
    if xv.device.type != "cpu" or xv.dtype not in dtypes or wv.dtype != xv.dtype:
        return False
    if not all(gemv._plain(s) for s in (xv.shape[1], *wv.shape, *wv.stride())):  # a symbolic K or N: not judged
        return False
    (m, k), (k2, n) = xv.shape, wv.shape
    if not gemv._plain(m):
        # a symbolic row count (the tokens under dynamic shapes): judged at its hint, the size this compile was
        # made for, as Inductor picks its kernels; fusegraph.linear is exact at any row count, so another size
        # costs at most the other kernel's speed
        m = _hint(m)
        if m is None:
            return False
    if m <= gemv.MAX_ROWS or k != k2 or m * k * n < MIN_MACS or tuple(wv.stride()) != (1, k):
        return False
    if bias is not None:
        bv = gemv._val(bias)
        if not isinstance(bv, torch.Tensor) or bv.dtype != xv.dtype or tuple(bv.shape) != (n,):
            return False
    return True


def _hint(size):
    """The example value of a symbolic size, or None (an unbacked size has none)."""
    try:
        from torch.fx.experimental.symbolic_shapes import optimization_hint
    except ImportError:  # torch <= 2.11
        from torch.fx.experimental.symbolic_shapes import size_hint as optimization_hint
    try:
        return int(optimization_hint(size))
    except Exception:
        return None


def register(pm, opts) -> None:
    op = torch.ops.fusegraph.linear.default
    mode = opts.enable_linear  # the dtypes it routes are asked at each match: the registration is cached

    @register_graph_pattern(CallFunction(aten.mm.default, KeywordArg("x"), KeywordArg("w")),
                            extra_check=lambda match: site_ok(*match.output_node().args[:2],
                                                              dtypes=routed_dtypes(mode)), pass_dict=pm)
    def _mm(match, x, w):
        gemv.replace(match.output_node(), x, w, None, op)

    def check_addmm(match) -> bool:
        node = match.output_node()
        if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
            return False
        return site_ok(node.args[1], node.args[2], node.args[0], dtypes=routed_dtypes(mode))

    @register_graph_pattern(CallFunction(aten.addmm.default, KeywordArg("b"), KeywordArg("x"), KeywordArg("w")),
                            extra_check=check_addmm, pass_dict=pm)
    def _addmm(match, b, x, w):
        gemv.replace(match.output_node(), x, w, b, op)


# ---- explain -----------------------------------------------------------------------------------------


def _anchor(node):
    """A linear layer of many rows (mm/addmm) of a dtype the "auto" rule routes here, as this family defines its
    sites."""
    dtypes = routed_dtypes("auto") or (torch.float32,)
    label = node.meta.get("val").dtype if isinstance(node.meta.get("val"), torch.Tensor) else torch.float32
    name = str(label).replace("torch.", "")
    return _anchors.matmul_anchor(node, lambda *a: site_ok(*a, dtypes=dtypes), f"{name} mm", f"{name} addmm")


# Not lowered, not calibrated: it replaces an extern call (mm) for which Inductor generates no code of its own.
FAMILY = Family("linear", "enable_linear", register, options=("enable_linear",), active=uses_onednn,
                ops=("linear.default",),
                candidates=(Candidate(_anchor),))
