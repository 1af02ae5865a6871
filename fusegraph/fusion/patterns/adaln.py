"""AdaLN family: adaptive LayerNorm modulation ``layer_norm(x) * (1 + scale) + shift`` → ``fusegraph.adaln``.

Source forms (diffusers):

* ``LayerNorm(D, elementwise_affine=False)(x) * (1 + scale[:, None]) + shift[:, None]``: AdaLayerNormZero,
  AdaLayerNormZeroSingle, SD35AdaLayerNormZeroX, the inline ``norm2`` / ``norm2_context`` of Flux and SD3
  blocks (``scale_mlp[:, None]`` or ``.unsqueeze(1)``). The pattern starts at the broadcast scale/shift
  (whatever view made them ``[B, 1, D]``, or per-token ``[B, S, D]``), which the fused op takes as they are.
* ``AdaLayerNormContinuous``: ``norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]`` with scale/shift
  ``[B, D]`` chunks: the ``1 +`` comes before the broadcast, so the replacement unsqueezes scale itself.
* Wan: ``(FP32LayerNorm(x.float()) * (1 + scale) + shift).type_as(x)`` with fp32 ``[B, 1, D]`` or per-token
  ``[B, S, D]`` modulation → ``adaln(x, scale, shift, eps, out_dtype=x.dtype)``: the fused op upcasts x itself.
* a LayerNorm with weight and bias before the modulation → ``adaln(..., weight=, bias=)``, in the ``[B, 1, D]``
  layout and in the continuous one (CogVideoXLayerNormZero: ``norm(x) * (1 + scale)[:, None, :] + shift[:, None, :]``
  with an affine ``nn.LayerNorm``).
* Flux2: ``(1 + scale) * norm(x) + shift``. The matcher compares arguments in order (it knows nothing of
  commutativity), so the scale-first product is a form of its own.
* SanaWM (blocks and ``T2IFinalLayer``): ``norm(x).reshape(B, F, -1, C) * (1 + scale) + shift`` with per-frame
  ``[B, F, 1, C]`` scale/shift. No search form of its own: a pre-step (:func:`hoist_norm_views`) moves a view or
  reshape that keeps the last dim in front of the (weightless) norm, ``norm(x.reshape(B, F, -1, C))`` — the
  same rows of C, so the same values — and the plain form then matches with a rank-4 x. A view that changes
  the last dim stays where it is (and nothing fuses).

Output dtype: the source's (type promotion of x, scale and shift, or ``x.dtype`` after ``type_as``), passed
as ``out_dtype`` when it is not x's. eps is captured from the graph. The ``1`` in ``1 + scale``, the
normalised dim (the last) and every cast are re-checked exactly per match, so ``x * (2 + scale) + shift`` or
a norm over another dim do not fuse.

A LayerNorm whose output feeds two modulations (SD35AdaLayerNormZeroX's ``norm_hidden_states`` → msa and
msa2) is fused as two ``adaln`` calls: the pattern matcher refuses a match whose inner nodes have users
outside it, so ``register`` adds a pre-step (:func:`unshare_norms`) that gives each modulation its own copy
of the shared norm, after the casts CSE merged are split again (``_prepare.split_shared_casts``). For the same
reason a ``1 + scale`` that CSE made two modulations share (QwenImage21's blocks) is first given one copy per
product (``_prepare.split_shared_factors``).
"""
from __future__ import annotations

import contextlib
import functools

import torch
import torch.nn.functional as F
from ..._core.torch_pattern_matcher import Match, PatternMatcherPass

from ._prepare import prepare_before, split_shared_casts, split_shared_factors
from ._trace import fwd_functional
from . import _anchors
from ._family import Candidate, Family, Form, NoSite, register_forms
from ._lowering import adaln as lower, adaln_shift, adaln_site
from .adaln_rms import supported

_EPS_MAGIC = 0.07314279675483704  # exactly representable in fp32; every literal equal to it becomes eps
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# ---- search forms ------------------------------------------------------------------------------------


def _ln(x, eps):
    return F.layer_norm(x, [x.shape[-1]], None, None, eps)


def _zero(x, scale, shift, eps):
    return _ln(x, eps) * (1 + scale) + shift


def _zero_scale_first(x, scale, shift, eps):
    return (1 + scale) * _ln(x, eps) + shift


def _continuous(x, scale, shift, eps):
    return _ln(x, eps) * (1 + scale)[:, None, :] + shift[:, None, :]


def _fp32(x, scale, shift, eps):
    return (_ln(x.float(), eps) * (1 + scale) + shift).type_as(x)


def _affine(x, weight, bias, scale, shift, eps):
    return F.layer_norm(x, [x.shape[-1]], weight, bias, eps) * (1 + scale) + shift


def _affine_continuous(x, weight, bias, scale, shift, eps):
    return F.layer_norm(x, [x.shape[-1]], weight, bias, eps) * (1 + scale)[:, None, :] + shift[:, None, :]


# ---- replacements ------------------------------------------------------------------------------------


def _out_dtype(x, *others):
    """The source's result dtype: type promotion of x with the modulation tensors, None when it is x's."""
    dtype = x.dtype
    for t in others:
        dtype = torch.promote_types(dtype, t.dtype)
    return None if dtype == x.dtype else dtype


def _fused_zero(x, scale, shift, eps):
    return torch.ops.fusegraph.adaln(x, scale, shift, eps, out_dtype=_out_dtype(x, scale, shift))


def _fused_continuous(x, scale, shift, eps):
    scale, shift = scale.unsqueeze(1), shift.unsqueeze(1)
    return torch.ops.fusegraph.adaln(x, scale, shift, eps, out_dtype=_out_dtype(x, scale, shift))


def _fused_fp32(x, scale, shift, eps):
    out_dtype = None if x.dtype == torch.float32 else x.dtype
    return torch.ops.fusegraph.adaln(x, scale, shift, eps, out_dtype=out_dtype)


def _fused_affine(x, weight, bias, scale, shift, eps):
    # layer_norm(x, [D], weight, bias) has x's dtype whatever the affine's (eager's mixed-dtype LayerNorm)
    return torch.ops.fusegraph.adaln(
        x, scale, shift, eps, weight=weight, bias=bias, out_dtype=_out_dtype(x, scale, shift)
    )


def _fused_affine_continuous(x, weight, bias, scale, shift, eps):
    scale, shift = scale.unsqueeze(1), shift.unsqueeze(1)
    return _fused_affine(x, weight, bias, scale, shift, eps)


# ---- checks ------------------------------------------------------------------------------------------


def _supported(match: Match, *, chunks: bool = False) -> bool:
    """What the fused kernel takes (the op's own checks, so a site it would refuse stays unfused): float x of rank
    >= 2; float scale/shift with x's last dim D that broadcast to x without growing it (``chunks``: the continuous
    form's ``[B, D]``, unsqueezed by the replacement; a per-sample ``[B, 1, 1]`` scale or a 0-dim shift does not
    fit); 1-D weight/bias of size D; a usable eps; everything on x's device."""
    return supported(match, chunks=chunks)


# ---- shared norms ------------------------------------------------------------------------------------

_aten = torch.ops.aten
_CONVERT = torch.ops.prims.convert_element_type.default


def _single_user(node, target):
    users = list(node.users)
    return users[0] if len(users) == 1 and users[0].op == "call_function" and users[0].target == target else None


def _norm_chain(var_mean: torch.fx.Node):
    """The nodes of one decomposed layer norm, ``var_mean`` to its output (optionally cast), or None."""
    getitems = {u.args[1]: u for u in var_mean.users if u.op == "call_function" and len(u.args) == 2}
    if set(getitems) != {0, 1}:
        return None
    var, mean = getitems[0], getitems[1]
    add = _single_user(var, _aten.add.Tensor)
    rsqrt = _single_user(add, _aten.rsqrt.default) if add is not None else None
    sub = _single_user(mean, _aten.sub.Tensor)
    if rsqrt is None or sub is None:
        return None
    mul = _single_user(rsqrt, _aten.mul.Tensor)
    if mul is None or _single_user(sub, _aten.mul.Tensor) is not mul:
        return None
    chain = [var_mean, var, mean, add, rsqrt, sub, mul]
    src = var_mean.args[0]
    if isinstance(src, torch.fx.Node) and src.target == _CONVERT and sub.args[0] is src and len(src.users) == 2:
        chain.insert(0, src)  # the upcast of a low-precision x belongs to this norm alone
    cast = _single_user(mul, _CONVERT)
    return chain + [cast] if cast is not None else chain


_VIEWS = (_aten.view.default, _aten.reshape.default, _aten._unsafe_view.default)


def _is_modulation(user: torch.fx.Node, norm_out: torch.fx.Node, shift: bool = True) -> bool:
    """``norm_out * t + u`` (or ``t * norm_out + u``) where t is ``1 + s`` or a view of it: what the adaln
    patterns fuse; with ``shift=False`` also ``norm_out * t`` alone (the adaln_noshift family)."""
    if user.op != "call_function" or user.target != _aten.mul.Tensor or len(user.args) != 2:
        return False
    if list(user.args).count(norm_out) != 1 or (shift and len(user.users) != 1):
        return False
    factor = user.args[1] if user.args[0] is norm_out else user.args[0]  # norm * (1 + s) or (1 + s) * norm
    while isinstance(factor, torch.fx.Node) and factor.target in (_aten.unsqueeze.default, *_VIEWS):
        factor = factor.args[0]
    if not (isinstance(factor, torch.fx.Node) and factor.target == _aten.add.Tensor and factor.args[1] == 1):
        return False
    return not shift or next(iter(user.users)).target == _aten.add.Tensor


def _over_last_dim(var_mean: torch.fx.Node) -> bool:
    """``var_mean(x, [-1] | [x.dim() - 1], correction=0, keepdim=True)``: a LayerNorm's statistics."""
    val = var_mean.args[0].meta.get("val") if isinstance(var_mean.args[0], torch.fx.Node) else None
    dims = var_mean.args[1] if len(var_mean.args) > 1 else var_mean.kwargs.get("dim")
    return (isinstance(val, torch.Tensor) and isinstance(dims, (list, tuple)) and len(dims) == 1
            and dims[0] in (-1, val.dim() - 1) and var_mean.kwargs.get("correction") == 0
            and var_mean.kwargs.get("keepdim") is True)


def _refresh_vals(nodes) -> None:
    """Recomputes ``meta["val"]`` of ``nodes`` (in graph order) from their inputs' fake values."""
    from ..._core.torch_fake import detect_fake_mode

    def fake(a):
        return a.meta["val"] if isinstance(a, torch.fx.Node) else a

    inputs = {a for n in nodes for a in n.all_input_nodes} - set(nodes)
    mode = detect_fake_mode([a.meta.get("val") for a in inputs])
    with mode if mode is not None else contextlib.nullcontext():
        for n in nodes:
            args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), fake)
            n.meta["val"] = n.target(*args, **kwargs)
            n.meta.pop("tensor_meta", None)


def hoist_norm_views(graph: torch.fx.Graph) -> int:
    """SanaWM's per-frame modulation ``norm(x).reshape(B, F, -1, C) * (1 + scale) + shift`` (scale/shift
    ``[B, F, 1, C]``): a LayerNorm over the last dim commutes with a view or reshape that keeps the last dim
    (each row of C elements stays one row), so the view is moved in front of the norm —
    ``norm(x.reshape(B, F, -1, C))`` — and the modulation then matches the plain forms with a rank-4 x.

    Only a weightless LayerNorm chain (:func:`_norm_chain`, over the last dim) whose only user is the view
    moves, and only when the view's result is modulated (a ``* (1 + s)``, with or without a shift); the
    view's last dim is re-checked against x's exactly. Returns the number of views moved. The graph's
    outputs and every value are unchanged."""
    moved = 0
    for var_mean in list(graph.find_nodes(op="call_function", target=_aten.var_mean.correction)):
        chain = _norm_chain(var_mean)
        if chain is None or not _over_last_dim(var_mean):
            continue
        out = chain[-1]
        if len(out.users) != 1:
            continue
        view = next(iter(out.users))
        if view.op != "call_function" or view.target not in _VIEWS or len(view.args) != 2 or view.kwargs:
            continue
        shape, before, after = view.args[1], out.meta.get("val"), view.meta.get("val")
        if not (isinstance(shape, (list, tuple)) and all(type(d) is int for d in shape)
                and isinstance(before, torch.Tensor) and isinstance(after, torch.Tensor) and after.dim() >= 2
                and type(before.shape[-1]) is int and type(after.shape[-1]) is int
                and after.shape[-1] == before.shape[-1]):
            continue
        if not any(_is_modulation(u, view, shift=False) for u in view.users):
            continue
        first = chain[0]  # var_mean, or the upcast that belongs to this norm alone
        src = first.args[0]
        readers = [first] if first.target == _CONVERT else [n for n in chain if src in n.args]
        with graph.inserting_before(first):
            reshaped = graph.call_function(_aten.reshape.default, (src, list(shape)))
        for n in readers:
            n.replace_input_with(src, reshaped)
        var_mean.args = (var_mean.args[0], [after.dim() - 1], *var_mean.args[2:])
        view.replace_all_uses_with(out)
        graph.erase_node(view)
        _refresh_vals([reshaped, *chain])
        moved += 1
    return moved


def unshare_norms(graph: torch.fx.Graph, shift: bool = True) -> int:
    """Gives each modulation of a layer norm shared by several (SD35AdaLayerNormZeroX: msa and msa2) its
    own copy of the norm, so each can fuse into one ``adaln``. Returns the number of copies made. With
    ``shift=False`` (the adaln_noshift family) a ``norm * (1 + s)`` without a shift counts as a modulation
    too (NucleusMoE: the MoE router reads the norm the MLP's modulation reads).

    Only modulation users get copies; any other user keeps the original. A copy that then does not fuse
    is left to Inductor's CSE (inductor=True) or costs one extra norm (inductor=False)."""
    copies = 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != _aten.var_mean.correction:
            continue
        chain = _norm_chain(node)
        if chain is None:
            continue
        out = chain[-1]
        mods = [u for u in out.users if _is_modulation(u, out, shift)]
        if len(out.users) < 2 or not mods:
            continue
        if len(mods) == len(out.users):
            mods = mods[1:]  # the original keeps one of them
        for user in mods:
            env = {}
            with graph.inserting_before(user):
                for n in chain:
                    env[n] = graph.node_copy(n, lambda a: env.get(a, a))
            user.replace_input_with(out, env[out])
            copies += 1
    return copies



# ---- registration ------------------------------------------------------------------------------------


_B, _S, _D = 2, 5, 16


def _mod(m_dtype, chunks=False):
    """scale and shift: ``[B, 1, D]`` (per-token ``[B, S, D]`` traces to the same pattern: shapes are checked per
    match) or the continuous form's ``[B, D]`` chunks."""
    return [torch.empty(*((_B, _D) if chunks else (_B, 1, _D)), dtype=m_dtype) for _ in range(2)]


def _x(x_dtype):
    return torch.empty(_B, _S, _D, dtype=x_dtype)


def _wb(x_dtype):
    return [torch.empty(_D, dtype=x_dtype) for _ in range(2)]


# Per (x dtype, modulation dtype): the modulation in x's dtype, or another one (fp32 temb).
FORMS = (
    # contains _zero on x.float(): first; only for a low-precision x (for float32 it is _zero)
    Form(_fp32, _fused_fp32, lambda xd, md: [[_x(xd), *_mod(md), _EPS_MAGIC]] if xd != torch.float32 else []),
    Form(_zero, _fused_zero, lambda xd, md: [[_x(xd), *_mod(md), _EPS_MAGIC]]),
    Form(_zero_scale_first, _fused_zero, lambda xd, md: [[_x(xd), *_mod(md), _EPS_MAGIC]]),
    Form(_affine, _fused_affine, lambda xd, md: [[_x(xd), *_wb(xd), *_mod(md), _EPS_MAGIC]]),
    Form(_continuous, _fused_continuous, lambda xd, md: [[_x(xd), *_mod(md, chunks=True), _EPS_MAGIC]],
         check=functools.partial(_supported, chunks=True)),
    Form(_affine_continuous, _fused_affine_continuous,
         lambda xd, md: [[_x(xd), *_wb(xd), *_mod(md, chunks=True), _EPS_MAGIC]],
         check=functools.partial(_supported, chunks=True)),
)


def register(pm: PatternMatcherPass, opts) -> None:
    """Registers the AdaLN source forms, per dtype combination, into ``pm``."""
    del opts  # the pass manager decides whether this family runs
    prepare_before(pm, split_shared_factors, unshare_norms, split_shared_casts, hoist_norm_views)
    for x_dtype in _DTYPES:
        for m_dtype in _DTYPES:
            register_forms(pm, FORMS, x_dtype, m_dtype, trace_fn=fwd_functional, check=_supported,
                           scalars={"eps": _EPS_MAGIC})


# ---- lowering, calibration, explain ------------------------------------------------------------------


def _claims(node) -> bool:
    """A ``fusegraph.adaln`` call of this family: a LayerNorm modulation with a shift."""
    return adaln_shift(node) is not None and node.kwargs.get("norm", "layer") != "rms"


def _anchor(node):
    """A LayerNorm, unless a modulation without shift follows it (then it is an adaln_noshift candidate). One
    with no modulation at all is listed as no site (``_no_modulation``)."""
    label = _anchors.layer_norm_label(node)
    return label if label is not None and _anchors.modulation(node) != "noshift" else None


NO_MODULATION = NoSite("no modulation (norm(x) * (1 + scale) + shift) follows this norm: nothing for adaln to fuse")


def _no_modulation(anchor, nearby):
    """A LayerNorm with no ``* (1 + scale)`` after it (a plain or affine norm, a qk-norm) is no AdaLN site. The
    ``(1 + scale)`` must come from elsewhere than the norm itself: the ``1 + erf(...)`` of a GELU after the norm's
    linear is no modulation."""
    for n in nearby:
        for a in n.args if _anchors.is_op(n, _anchors.aten.mul.Tensor) else ():
            if _anchors.is_one_plus(a, anchor):
                return None
    return NO_MODULATION


FAMILY = Family("adaln", "enable_adalayernorm", register, ops=("adaln.default",), claims=_claims,
                lowerings={"adaln.default": lower}, calibration=adaln_site(norm="layer", shift=True),
                row_wise=True, candidates=(Candidate(_anchor, no_site=_no_modulation),), forms=FORMS)
