"""Linear layers on a few rows (a decode step's projections): ``mm(x, W)`` / ``addmm(b, x, W)`` with ``W`` the
transpose of a row-major ``[N, K]`` weight and ``x`` of at most 8 rows -> ``fusegraph.gemv``.

With one to a few rows a linear layer reads its whole weight to do 2 flops per element read: it is bound by memory
bandwidth. ``fusegraph.gemv`` streams four weight rows at a time against every row of ``x`` (measured on this
project's CPU: a 1 x 512 by 512 x 1536 fp32 projection 40 -> 33 us, bf16 54 -> 16 us; BENCHMARKS.md). Only CPU
sites with a weight of at least ``MIN_WEIGHT`` elements are fused: below that the call itself is the cost, which
MKL's own gemv pays the same. ``W`` is what a ``Linear``'s ``t(weight)`` decomposes to: ``permute(weight, [1, 0])``
or, after freezing, the folded constant with the same strides.

Where: ``enable_gemv`` ``"auto"`` (default) fuses a site of M rows and a dtype where the table measured for the CPU
class says the few-row kernel is the faster one at that row count (``gemm_table.gemv_lookup``: with AMX, ATen's
bf16 matmul wins on 8 rows, the few-row kernel on one); ``True`` every site; ``False`` none.
"""
import torch
from ..._core.torch_pattern_matcher import CallFunction, KeywordArg, register_graph_pattern

from .. import gemm_table
from . import _anchors
from ._family import Candidate, Family

aten = torch.ops.aten

MAX_ROWS = 8
MIN_WEIGHT = 1 << 17  # elements (512 KiB of float32)
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _plain(n) -> bool:
    return isinstance(n, int) and not isinstance(n, bool)


def site_ok(x, w, bias=None, mode=True) -> bool:
    """x [M <= MAX_ROWS, K], w [K, N] with strides (1, K) (a row-major [N, K] weight, transposed), N * K >=
    MIN_WEIGHT, optional bias [N]; CPU, one float dtype; static sizes; and, with ``mode`` ``"auto"``, a dtype and
    row count for which the CPU class's table says the few-row kernel is faster (``gemm_table.gemv_lookup``)."""
    xv, wv = _val(x), _val(w)
    if not isinstance(xv, torch.Tensor) or not isinstance(wv, torch.Tensor) or xv.dim() != 2 or wv.dim() != 2:
        return False
    if xv.device.type != "cpu" or xv.dtype not in _DTYPES or wv.dtype != xv.dtype:
        return False
    sizes = (*xv.shape, *wv.shape, *wv.stride())
    if not all(_plain(s) for s in sizes):  # symbolic: not judged (no guard added)
        return False
    (m, k), (k2, n) = xv.shape, wv.shape
    if m > MAX_ROWS or k != k2 or n * k < MIN_WEIGHT or tuple(wv.stride()) != (1, k):
        return False
    if bias is not None:
        bv = _val(bias)
        if not isinstance(bv, torch.Tensor) or bv.dtype != xv.dtype or tuple(bv.shape) != (n,):
            return False
    return mode != "auto" or gemm_table.gemv_lookup(xv.dtype, m)[0] == "fused"


def _check_mm(match, mode=True) -> bool:
    node = match.output_node()
    return site_ok(node.args[0], node.args[1], mode=mode)


def _check_addmm(match, mode=True) -> bool:
    node = match.output_node()
    if node.kwargs.get("beta", 1) != 1 or node.kwargs.get("alpha", 1) != 1:
        return False
    return site_ok(node.args[1], node.args[2], node.args[0], mode=mode)


def _is_transpose(node) -> bool:
    return (isinstance(node, torch.fx.Node) and node.target is aten.permute.default
            and list(node.args[1]) in ([1, 0], [-1, -2], [1, -2], [-1, 0]))


_VIEWS = (aten.view.default, aten.reshape.default, aten._unsafe_view.default)


def _unflattened(node, x):
    """(x's unflattened source, the view of the result that restores it) when ``x`` only flattens the leading dims
    of a tensor and the result's one user restores them (``F.linear`` on ``[..., K]``): gemv takes and gives the
    N-D tensors, two ops fewer. Else (x, None)."""
    if not (isinstance(x, torch.fx.Node) and x.target in _VIEWS and len(node.users) == 1):
        return x, None
    src, out = x.args[0], next(iter(node.users))
    sv, ov, nv = _val(src), _val(out), _val(node)
    if not (isinstance(sv, torch.Tensor) and isinstance(ov, torch.Tensor) and out.target in _VIEWS
            and out.args[0] is node and sv.dim() >= 1 and sv.shape[-1] == _val(x).shape[-1]
            and tuple(ov.shape) == (*sv.shape[:-1], nv.shape[-1])):
        return x, None
    return src, out


def replace(node, x, w, bias, op=None):
    """Replaces the mm/addmm ``node`` by ``op`` (default ``fusegraph.gemv``) on x's unflattened source where the
    result's one user restores it, the weight as [N, K] and the bias."""
    op = torch.ops.fusegraph.gemv.default if op is None else op
    graph = node.graph
    x, restore = _unflattened(node, x)
    with graph.inserting_before(node):
        if _is_transpose(w) and isinstance(_val(w.args[0]), torch.Tensor):
            weight = w.args[0]  # Linear's t(weight): the weight itself (the permute goes with the mm)
        else:  # freezing's folded constant: a view back to [N, K]
            weight = graph.call_function(aten.permute.default, (w, [1, 0]))
            weight.meta["val"] = _val(w).permute(1, 0)
            weight.meta.update({k: node.meta[k] for k in ("stack_trace",) if k in node.meta})
        new = graph.call_function(op, (x, weight) + ((bias,) if bias is not None else ()))
    from ..._core.torch_fake import FakeTensor

    wv = _val(weight)
    if isinstance(wv, FakeTensor):
        with wv.fake_mode:
            args = [_val(x), wv] + ([_val(bias)] if bias is not None else [])
            new.meta["val"] = op(*args)
    else:
        new.meta["val"] = _val(node).new_empty(_val(node).shape)
    for key in ("stack_trace", "nn_module_stack", "source_fn_stack"):
        if key in node.meta:
            new.meta[key] = node.meta[key]
    if restore is not None:  # gemv gives [..., N] itself: its users read it in place of the restoring view
        restore.replace_all_uses_with(new)
        graph.erase_node(restore)
    node.replace_all_uses_with(new)
    graph.erase_node(node)
    if _is_transpose(w) and not w.users:
        graph.erase_node(w)


def register(pm, opts) -> None:
    mode = opts.enable_gemv  # "auto": the table is asked at each match (the registration is cached)

    @register_graph_pattern(CallFunction(aten.mm.default, KeywordArg("x"), KeywordArg("w")),
                            extra_check=lambda match: _check_mm(match, mode), pass_dict=pm)
    def _mm(match, x, w):
        replace(match.output_node(), x, w, None)

    @register_graph_pattern(CallFunction(aten.addmm.default, KeywordArg("b"), KeywordArg("x"), KeywordArg("w")),
                            extra_check=lambda match: _check_addmm(match, mode), pass_dict=pm)
    def _addmm(match, b, x, w):
        replace(match.output_node(), x, w, b)


# ---- explain -----------------------------------------------------------------------------------------


def _anchor(node):
    """A linear layer of a few rows with a large weight (mm/addmm) of a dtype and row count the "auto" rule fuses, as
    this family defines its sites."""
    return _anchors.matmul_anchor(node, lambda *a: site_ok(*a, mode="auto"), "mm of a few rows",
                                  "addmm of a few rows")


# Not lowered, not calibrated: it replaces an extern call (mm) for which Inductor generates no code of its own.
FAMILY = Family("gemv", "enable_gemv", register, options=("enable_gemv",), ops=("gemv.default",),
                candidates=(Candidate(_anchor),))
