"""RMSNorm family: ``torch.nn.RMSNorm`` / ``F.rms_norm`` and diffusers ``RMSNorm`` → ``fusegraph.rms_norm``.

Source forms (each traced with Inductor's decompositions, exactly as the model's graph is):

* ``torch.rms_norm(x, [D], weight, eps)`` with and without weight (Flux / Wan QK-norm, Wan's across-heads
  norm over the full inner dim before ``unflatten``): ``style="torch"``.
* diffusers ``RMSNorm.forward`` (non-NPU branch): fp32 variance, ``x * rsqrt(var + eps)``, cast to the
  weight's dtype when the weight is fp16/bf16, times weight, plus optional bias; without weight cast back to
  ``x.dtype``: ``style="diffusers"``, which reproduces those output dtypes.
* diffusers ``MochiRMSNorm`` (Mochi's QK-norms): the same fp32 variance, but the weight is multiplied in without
  the cast before it (fp32 times a bf16/fp16 weight promotes to fp32), then one cast to ``x.dtype``: exactly
  ``torch.rms_norm``'s math, so ``style="torch"``. For fp32 x it traces to the diffusers fp32-weight form.

Norms of one input (default inductor=True route): freezing's CSE merges RMSNorms that read the same input
with the same eps (LuminaNext: every block's ``norm1_context`` normalizes the same ``encoder_hidden_states``)
into one ``x * rsqrt(mean(x^2) + eps)`` that each norm's ``* weight`` reads (or one ``rsqrt`` that several
``x * rsqrt`` read). The matcher refuses a match whose inner nodes have outside users, so only the weightless
form matched, on the shared core: one fused norm, the weight products left, where the aten route (no CSE)
fuses every norm. ``_prepare.split_shared_rms_cores`` gives each norm its own chain again before matching.

eps is captured from the graph (``scalar_workaround``), never baked in: it arrives fp32-rounded from
``nn.RMSNorm`` (e.g. 9.999999974752427e-07). Ints, dtypes and shapes are ignored by the first, coarse match
and checked exactly by ``register_replacement``'s re-trace on the match's own shapes, so a mean over another
dim, ``pow(x, 3)`` or a cast to another dtype do not fuse.
"""
from __future__ import annotations

import functools
import operator

import torch
from ..._core.torch_pattern_matcher import Match, PatternMatcherPass

from ._prepare import prepare_before, split_shared_casts, split_shared_rms_cores
from . import _anchors
from ._family import Candidate, Family, Form, overload, register_forms
from ._lowering import ROW, compute_dtype, rms
from ._trace import fwd_functional, kwarg

# A value no real graph holds, exactly representable in fp32 (torch.rms_norm rounds eps to fp32): every
# literal equal to it in a traced pattern becomes the captured eps.
_EPS_MAGIC = 0.07314279675483704
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_LOW = (torch.bfloat16, torch.float16)


# ---- search forms ------------------------------------------------------------------------------------


def _torch_weight(x, weight, eps):
    return torch.rms_norm(x, [x.shape[-1]], weight, eps)


def _torch_plain(x, eps):
    return torch.rms_norm(x, [x.shape[-1]], None, eps)


def _diffusers_core(x, eps):
    # diffusers RMSNorm: x (any dtype) times an fp32 rsqrt promotes to fp32.
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    return x * torch.rsqrt(variance + eps)


def _diffusers_weight(x, weight, eps):
    h = _diffusers_core(x, eps)
    if weight.dtype in _LOW:
        h = h.to(weight.dtype)
    return h * weight


def _diffusers_weight_bias(x, weight, bias, eps):
    return _diffusers_weight(x, weight, eps) + bias


def _mochi_weight(x, weight, eps):
    # MochiRMSNorm: no cast before the weight; the product is fp32 and is cast to x's dtype once
    return (_diffusers_core(x, eps) * weight).to(x.dtype)


def _diffusers_plain(x, eps):
    return _diffusers_core(x, eps).to(x.dtype)


# ---- replacements ------------------------------------------------------------------------------------


def fused_rms_norm(x, weight=None, eps=1e-6, bias=None, *, style="torch"):
    """``fusegraph.rms_norm``, or its ``eps_tensor`` overload for an eps read at run time (a 0-d tensor)."""
    if isinstance(eps, torch.Tensor):
        return torch.ops.fusegraph.rms_norm.eps_tensor(x, weight, eps, bias=bias, style=style)
    return torch.ops.fusegraph.rms_norm(x, weight, eps, bias=bias, style=style)


def _fused_torch_weight(x, weight, eps):
    return fused_rms_norm(x, weight, eps, style="torch")


def _fused_torch_plain(x, eps):
    return fused_rms_norm(x, None, eps, style="torch")


def _fused_diffusers_weight(x, weight, eps):
    return fused_rms_norm(x, weight, eps, style="diffusers")


def _fused_diffusers_weight_bias(x, weight, bias, eps):
    return fused_rms_norm(x, weight, eps, bias, style="diffusers")


def _fused_diffusers_plain(x, eps):
    return fused_rms_norm(x, None, eps, style="diffusers")


# ---- checks ------------------------------------------------------------------------------------------


def _val(match: Match, name: str):
    node = match.kwargs.get(name)
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def runtime_eps(eps) -> bool:
    """``eps`` (a match's eps value) is read at run time: a 0-d floating-point CPU tensor, as Dynamo passes a
    module's Python float attribute under ``dynamic=True``; the ``eps_tensor`` overloads take it (the kernel
    checks its value at each call)."""
    return isinstance(eps, torch.Tensor) and eps.dim() == 0 and eps.dtype.is_floating_point and \
        eps.device.type == "cpu"


def usable_eps(match: Match) -> bool:
    """The match's eps is a number >= 0 fixed at compile time, or a run-time one (:func:`runtime_eps`)."""
    eps = kwarg(match, "eps")
    if isinstance(eps, torch.fx.Node):
        return runtime_eps(eps.meta.get("val"))
    return isinstance(eps, (int, float)) and eps >= 0.0


def _supported(match: Match) -> bool:
    """What the fused kernel takes: float x with a last dim, a 1-D weight/bias of size D, a usable eps."""
    x = _val(match, "x")
    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES or x.dim() < 1:
        return False
    if not usable_eps(match):
        return False
    dim = x.shape[-1]
    weight = _val(match, "weight")
    for name in ("weight", "bias"):
        t = _val(match, name)
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES or t.dim() != 1 or t.shape[0] != dim:
            return False
        if t.device != x.device:
            return False
    bias = _val(match, "bias")
    if bias is not None and bias.dtype != weight.dtype:
        return False  # diffusers keeps weight and bias in one dtype; a mixed pair would promote differently
    return True


# ---- registration ------------------------------------------------------------------------------------


def _examples(x_dtype, w_dtype, n_tensors):
    x = torch.empty(2, 3, 16, dtype=x_dtype)
    w = torch.empty(16, dtype=w_dtype)
    return [x, w, torch.empty(16, dtype=w_dtype)][:n_tensors]


def _inputs(n_tensors: int, *, transposed: bool = False):
    """The example-input builder of a form with ``n_tensors`` tensor arguments: per x dtype, the weight in x's
    dtype (module.to(dtype)) or in another one (fp32 weights, autocast-style graphs); the casts in the traced
    graph differ per combination, identical patterns are skipped. ``transposed``: also a non-contiguous x (a
    transposed [B, H, S, D] view), for which torch.rms_norm ends in a clone."""

    def examples():
        out = []
        for x_dtype in _DTYPES:
            for w_dtype in _DTYPES if n_tensors > 1 else (x_dtype,):
                out.append(_examples(x_dtype, w_dtype, n_tensors) + [_EPS_MAGIC])
                if transposed:
                    args = _examples(x_dtype, w_dtype, n_tensors)
                    args[0] = torch.empty(2, 5, 3, 16, dtype=x_dtype).transpose(1, 2)
                    out.append(args + [_EPS_MAGIC])
        return out

    return examples


def eps_example() -> torch.Tensor:
    """The stand-in of a run-time eps: what Dynamo passes for a Python float under ``dynamic=True`` (a 0-d float64
    CPU tensor)."""
    return torch.tensor(_EPS_MAGIC, dtype=torch.float64)


def runtime_eps_form(form: Form, *, cast: bool = True) -> Form:
    """``form`` with its eps (the last argument) read at run time: a 0-d float64 tensor input, which the graph
    converts to float32 before adding it (``cast``: Dynamo's graph of ``variance + self.eps`` under
    ``dynamic=True`` is ``add(mean, convert_element_type(eps, float32))``). The replacement gets the tensor itself
    (the ``eps_tensor`` overloads). The search function keeps the form's argument names (``functools.wraps``:
    ``register_replacement`` reads them with ``inspect.signature``)."""

    @functools.wraps(form.search)
    def search(*args):
        *rest, eps = args
        return form.search(*rest, eps.to(torch.float32) if cast else eps)

    def examples(*combination):
        return [[*inputs[:-1], eps_example()] for inputs in form.examples(*combination)]

    return Form(search, form.replace, examples, check=form.check, check_of=form.check_of, scalars={})


# The larger form first (bias contains the weight form).
_STATIC_FORMS = (
    Form(_diffusers_weight_bias, _fused_diffusers_weight_bias, _inputs(3)),
    Form(_diffusers_weight, _fused_diffusers_weight, _inputs(2)),
    Form(_diffusers_plain, _fused_diffusers_plain, _inputs(1)),
    Form(_mochi_weight, _fused_torch_weight, _inputs(2)),
    Form(_torch_weight, _fused_torch_weight, _inputs(2, transposed=True)),
    Form(_torch_plain, _fused_torch_plain, _inputs(1, transposed=True)),
)
# The forms whose eps is Python arithmetic (``variance + self.eps``): under dynamic=True Dynamo passes that float as
# a 0-d tensor input. torch.rms_norm's eps is a float argument, which Dynamo specializes to a number.
FORMS = _STATIC_FORMS + tuple(runtime_eps_form(f) for f in _STATIC_FORMS[:4])


def register(pm: PatternMatcherPass, opts) -> None:
    """Registers every RMSNorm source form, per dtype combination, into ``pm``."""
    del opts  # the pass manager decides whether this family runs; nothing here depends on its options
    # norm cores and casts merged by freezing's CSE would block matches (cores first: their copies read the
    # input's upcast, which split_shared_casts then gives each norm)
    prepare_before(pm, split_shared_rms_cores, split_shared_casts)
    register_forms(pm, FORMS, trace_fn=fwd_functional, check=_supported, scalars={"eps": _EPS_MAGIC})


# ---- lowering, calibration, explain ------------------------------------------------------------------


def lower(out_dtype, x, weight=None, eps=1e-6, bias=None, *, style="torch"):
    """``fusegraph.rms_norm`` in torch ops (``Family.lowerings``)."""
    cd = compute_dtype(x, weight, bias)
    n = rms(x, eps, cd)
    if style == "diffusers" and weight is not None and weight.dtype in (torch.float16, torch.bfloat16):
        y = n.to(weight.dtype) * weight  # diffusers: cast to the weight's dtype, then a half-precision product
        return (y + bias if bias is not None else y).to(out_dtype)
    if weight is not None:
        n = n * weight.to(cd)
    if bias is not None:
        n = n + bias.to(cd)
    return n.to(out_dtype)


def _calibration_site(numel, rnd, row=ROW):
    rows = max(numel // row, 1)
    return overload("rms_norm.default"), (rnd(rows, row), rnd(row), 1e-6), {}


def _anchor(node):
    """An RMSNorm still unfused: its ``mean(x²)``, or an ``rsqrt`` of no LayerNorm and no such mean."""
    aten = _anchors.aten
    if _anchors.is_mean_of_square(node):
        return "mean(x²)"
    if _anchors.is_op(node, aten.rsqrt.default):
        # the rsqrt of a LayerNorm (var_mean) or of an RMSNorm already anchored at its mean(x²) is not a new site
        if any(_anchors.is_op(u, aten.var_mean.correction) or _anchors.is_mean_of_square(u) or
               (_anchors.is_op(u, operator.getitem) and _anchors.is_op(u.args[0], aten.var_mean.correction))
               for u in _anchors.upstream(node, 3)):
            return None
        return "rsqrt"
    return None


FAMILY = Family("rms_norm", "enable_rms_norm", register, ops=("rms_norm.default", "rms_norm.eps_tensor"),
                lowerings={"rms_norm.default": lower, "rms_norm.eps_tensor": lower}, calibration=_calibration_site,
                row_wise=True,
                candidates=(Candidate(_anchor),), forms=FORMS)
