"""adaln_rms family: RMSNorm modulation ``rms_norm(x) * (1 + scale) + shift`` → ``fusegraph.adaln(norm="rms")``.

Source forms (diffusers): LTX / LTX2 blocks (``norm1 = RMSNorm(dim, elementwise_affine=False)``, then
``norm_hidden_states * (1 + scale_msa) + shift_msa`` with ``[B, 1, D]`` or per-token ``[B, S, D]`` chunks of a
``[B, S, k, D]`` table), their output norms (``LayerNorm`` there: the adaln family), ACE-Step, Ernie, Krea2,
MiniMax-H3, StableAudio3 (RMSNorm then ``* (1 + scale) + shift``).

The patterns start at the RMSNorm the rms_norm family has already fused (it runs first, in the same round):
``torch.ops.fusegraph.rms_norm(x, weight, eps, bias, style=...)``, so every RMSNorm source form that family
knows (``torch.rms_norm``, diffusers ``RMSNorm`` with its dtype casts, ``MochiRMSNorm``) composes for free. On
it: ``n * (1 + scale) + shift``, the scale-first ``(1 + scale) * n + shift``, and the continuous
``n * (1 + scale)[:, None, :] + shift[:, None, :]`` (``[B, D]`` chunks, unsqueezed by the replacement); each
with and without weight (and with a bias), in both rms_norm styles. Half precision, the casts taken in:
ACE-Step's ``(n * (1 + scale) + shift).type_as(h)`` (float32 modulation table) and Ernie's
``(n.float() * (1 + scale.float()) + shift.float()).to(n.dtype)``.

A fused RMSNorm that several modulations read (LTX2's a2v and v2a cross-attention) gets a copy per modulation
first (:func:`unshare_rms_norms`), and so does a ``1 + scale`` that several products read
(``_prepare.split_shared_factors``).

Replacement: ``adaln(x, scale, shift, eps, weight=w, bias=b, norm="rms", out_dtype=...)`` with out_dtype the
matched expression's dtype (rms_norm's output dtype for its style, promoted with scale and shift) whenever
adaln's own promotion over its tensors would give another. Numerics: one float32 chain and one rounding where
eager rounds after the norm (diffusers style with a half weight: twice), the product and the sum.

The ``1`` of ``1 + scale`` is a literal in the pattern, checked per match (``2 + scale`` does not fuse); scale
and shift must broadcast to x without growing it; x has rank >= 2 (adaln's contract). The matcher refuses a
match whose inner nodes have users outside it: after those copies, what else stays shared (an RMSNorm's
intermediate read elsewhere) stays unfused.
"""
from __future__ import annotations

import functools

import torch
from ..._core.torch_pattern_matcher import Match, PatternMatcherPass

from ...ops.rms_norm import rms_norm_out_dtype
from ._prepare import prepare_before, split_shared_factors
from ._trace import fwd_functional, kwarg
from . import _anchors
from ._family import Candidate, Family, Form, register_forms
from ._lowering import adaln as lower, adaln_shift, adaln_site, fused_adaln
from .rms_norm import fused_rms_norm as _rms, runtime_eps_form, usable_eps

_EPS_MAGIC = 0.07314279675483704  # exactly representable in fp32; every literal equal to it becomes eps
_DTYPES = (torch.float32, torch.bfloat16, torch.float16)
_STYLES = ("torch", "diffusers")
_RMS = torch.ops.fusegraph.rms_norm.default  # a run-time eps's overload (eps_tensor) needs no canonical form:
_RMS_EPS_TENSOR = torch.ops.fusegraph.rms_norm.eps_tensor  # its weight and eps are never dropped from a trace


# ---- the pieces shared with adaln_noshift ---------------------------------------------------------------

_RMS_ARGS = ("x", "weight", "eps", "bias")
_RMS_DEFAULTS = {"weight": None, "eps": 1e-6, "bias": None}


def _is_default(name: str, value) -> bool:
    default = _RMS_DEFAULTS[name]
    if default is None:
        return value is None
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == default


def canonical_rms_calls(graph: torch.fx.Graph, *, explicit: bool = True) -> int:
    """Writes every ``fusegraph.rms_norm`` call as ``(x, weight, eps, bias, style=...)``, all explicit
    (``explicit=False``: back in the traced form, trailing defaults dropped, which Inductor's lowering expects).
    A traced call drops trailing arguments equal to their defaults (``weight=None`` when eps is 1e-6,
    ``bias=None``, ``style="torch"``), so the same norm would look different with another eps; the patterns are
    traced with an explicit eps and made explicit too (:func:`trace_canonical`), so both sides agree. Returns the
    number of calls rewritten."""
    changed = 0
    for node in graph.find_nodes(op="call_function", target=_RMS):
        values = dict(zip(_RMS_ARGS, node.args))
        values.update({k: v for k, v in node.kwargs.items() if k in _RMS_ARGS})
        args = [values.get(name, _RMS_DEFAULTS.get(name)) for name in _RMS_ARGS]
        style = node.kwargs.get("style", "torch")
        kwargs = {"style": style}
        if not explicit:  # drop trailing arguments equal to their defaults: bias None, eps 1e-6, weight None
            while len(args) > 1 and _is_default(_RMS_ARGS[len(args) - 1], args[-1]):
                args.pop()
            kwargs = {} if style == "torch" else kwargs
        args = tuple(args)
        if args != tuple(node.args) or kwargs != dict(node.kwargs):
            node.args, node.kwargs = args, kwargs
            changed += 1
    return changed


_aten = torch.ops.aten
_FACTOR_VIEWS = (_aten.unsqueeze.default, _aten.view.default, _aten.reshape.default, _aten.squeeze.dim,
                 _aten.squeeze.default, _aten.slice.Tensor, _aten.expand.default)


def _is_modulation(user: torch.fx.Node, norm: torch.fx.Node) -> bool:
    """``norm * f`` or ``f * norm`` with f ``1 + s`` (or a view of it): what the two families fuse, with or
    without a shift after it."""
    if user.op != "call_function" or user.target != _aten.mul.Tensor or len(user.args) != 2:
        return False
    if list(user.args).count(norm) != 1:
        return False
    factor = user.args[1] if user.args[0] is norm else user.args[0]
    while isinstance(factor, torch.fx.Node) and factor.op == "call_function" and factor.target in _FACTOR_VIEWS:
        factor = factor.args[0]
    return (isinstance(factor, torch.fx.Node) and factor.op == "call_function" and factor.target == _aten.add.Tensor
            and any(not isinstance(a, torch.fx.Node) and a == 1 for a in factor.args[:2]))


def unshare_rms_norms(graph: torch.fx.Graph) -> int:
    """Gives each modulation of a fused RMSNorm that several read (LTX2's audio-to-video and video-to-audio
    cross-attention modulate one ``norm_hidden_states`` twice) its own copy of the ``fusegraph.rms_norm`` call:
    the matcher refuses a match whose inner nodes have users outside it. Only modulation users get copies (the
    original keeps one of them, or its other users). Returns the number of copies made; a copy that then does
    not fuse costs one extra norm."""
    copies = 0
    norms = [*graph.find_nodes(op="call_function", target=_RMS),
             *graph.find_nodes(op="call_function", target=_RMS_EPS_TENSOR)]
    for node in norms:
        users = list(node.users)
        if len(users) < 2:
            continue
        mods = [u for u in users if _is_modulation(u, node)]
        if len(mods) == len(users):
            mods = mods[1:]
        for user in mods:
            with graph.inserting_before(user):
                copy = graph.node_copy(node)
            user.replace_input_with(node, copy)
            copies += 1
    return copies


def explicit_rms_calls_during(pm: PatternMatcherPass) -> None:
    """Makes ``pm.apply`` see explicit rms_norm calls (:func:`canonical_rms_calls`), each modulation with its own
    norm (:func:`unshare_rms_norms`), and leaves the calls in the traced form again."""
    apply = pm.apply

    def apply_explicit(graph):
        g = graph.graph if isinstance(graph, torch.fx.GraphModule) else graph
        canonical_rms_calls(g)
        unshare_rms_norms(g)
        try:
            return apply(graph)
        finally:
            canonical_rms_calls(g, explicit=False)

    pm.apply = apply_explicit


def trace_canonical(fn, args, **kwargs):
    """``fwd_functional``, then :func:`canonical_rms_calls` on the traced pattern."""
    gm = fwd_functional(fn, args, **kwargs)
    if canonical_rms_calls(gm.graph):
        gm.recompile()
    return gm



def val(match: Match, name: str):
    node = match.kwargs.get(name)
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else node


def modulation_fits(x: torch.Tensor, t, *, chunks: bool) -> bool:
    """A float scale/shift on x's device that broadcasts to x without growing it (``chunks``: a ``[B, D]``
    chunk, unsqueezed to ``[B, 1, D]`` by the replacement)."""
    if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES or t.device != x.device:
        return False
    shape = tuple(t.shape)
    if chunks:
        if len(shape) != 2:
            return False
        shape = (shape[0], 1, shape[1])
    if len(shape) < 1 or len(shape) > x.dim() or shape[-1] != x.shape[-1]:
        return False
    try:
        return tuple(torch.broadcast_shapes(x.shape, shape)) == tuple(x.shape)
    except RuntimeError:
        return False


def supported(match: Match, *, chunks: bool = False, mods=("scale", "shift")) -> bool:
    """What the fused kernel takes: float x of rank >= 2; the modulation tensors (``mods``) fit
    (:func:`modulation_fits`); 1-D weight/bias of size D; a usable eps; everything on x's device."""
    x = val(match, "x")
    if not isinstance(x, torch.Tensor) or x.dtype not in _DTYPES or x.dim() < 2:
        return False
    if not usable_eps(match):
        return False
    for name in ("weight", "bias"):
        t = val(match, name)
        if t is None:
            continue
        if not isinstance(t, torch.Tensor) or t.dtype not in _DTYPES or t.device != x.device:
            return False
        if t.dim() != 1 or t.shape[0] != x.shape[-1]:
            return False
    return all(modulation_fits(x, val(match, name), chunks=chunks) for name in mods)


def adaln_out_dtype(expected: torch.dtype, *tensors) -> torch.dtype | None:
    """``out_dtype`` for an adaln call whose result must be ``expected``: None when adaln's own promotion over
    its tensors (those not None) already gives it."""
    own = None
    for t in tensors:
        if t is not None:
            own = t.dtype if own is None else torch.promote_types(own, t.dtype)
    return None if own == expected else expected


def rms_expression_dtype(x, weight, bias, style, *mods) -> torch.dtype:
    """The dtype of ``rms_norm(x, weight, eps, bias, style=style) * (1 + scale) [+ shift]`` in eager."""
    dtype = rms_norm_out_dtype(x, weight, bias, style)
    for t in mods:
        if t is not None:
            dtype = torch.promote_types(dtype, t.dtype)
    return dtype


def fused_rms(x, scale, shift, eps, weight, bias, style):
    """The replacement: one adaln(norm="rms") with the source's output dtype."""
    out_dtype = adaln_out_dtype(rms_expression_dtype(x, weight, bias, style, scale, shift),
                                x, scale, shift, weight, bias)
    return fused_adaln(x, scale, shift, eps, weight=weight, bias=bias, out_dtype=out_dtype,
                                     norm="rms")


def param_examples(n_params: int, D: int) -> list:
    return [torch.empty(D) for _ in range(n_params)]


# ---- search forms and replacements, per rms_norm style --------------------------------------------------


_B, _S, _D = 2, 5, 16


def _plain_examples(n_params: int, chunks: bool):
    """A plain form's example inputs: the traced patterns hold no casts (the modulation's type promotion is
    implicit in aten's mul/add), so the float32 examples and one mixed example (bf16 x, float32 modulation) cover
    every dtype combination; identical patterns are skipped."""

    def examples():
        out = []
        for x_dtype, m_dtype in ((torch.float32, torch.float32), (torch.bfloat16, torch.float32)):
            x = torch.empty(_B, _S, _D, dtype=x_dtype)
            shape = (_B, _D) if chunks else (_B, 1, _D)
            mod = [torch.empty(*shape, dtype=m_dtype) for _ in range(2)]
            out.append([x, *param_examples(n_params, _D), *mod, _EPS_MAGIC])
        return out

    return examples


def _cast_examples(style: str, search, n_params: int):
    """A cast form's example inputs: traced for bf16 x (fp16 traces to the same pattern: the matcher re-traces
    each match on its own dtypes), each weight and modulation dtype. Only where the final cast is a real
    conversion: a no-op cast is not traced, and the form would then be a plain one with the wrong out_dtype
    (skip_duplicates would even drop the right plain entry)."""

    def examples():
        out = []
        for w_dtype in (torch.bfloat16, torch.float32):
            for m_dtype in (torch.bfloat16, torch.float32):
                x = torch.empty(_B, _S, _D, dtype=torch.bfloat16)
                mod = [torch.empty(_B, 1, _D, dtype=m_dtype) for _ in range(2)]
                params = [torch.empty(_D, dtype=w_dtype)][:n_params]
                weight = params[0] if params else None
                norm_dtype = rms_norm_out_dtype(x, weight, None, style)
                if "type_as" in search.__name__:
                    real_cast = rms_expression_dtype(x, weight, None, style, *mod) != x.dtype
                else:
                    real_cast = norm_dtype != torch.float32
                if real_cast:
                    out.append([x, *params, *mod, _EPS_MAGIC])
        return out

    return examples


def rms_modulation_forms(style: str, form, fns: dict) -> list:
    """The forms of an RMSNorm modulation (this family's and adaln_noshift's), in registration order: affine, weight
    and weightless norms, each with the scale after, before, and per token. ``fns`` holds the search functions
    (``affine_zero``, ``weight_continuous``, ...) and replacements (``fused_affine``, ...) by name; ``form(search,
    replace, n_params, per_token)`` makes one record. The rms_norm family makes style="torch" calls without a bias
    (torch.rms_norm has none): no affine forms there."""
    affine = [] if style == "torch" else [
        form(fns["affine_zero"], fns["fused_affine"], 2, False),
        form(fns["affine_zero_scale_first"], fns["fused_affine"], 2, False),
        form(fns["affine_continuous"], fns["fused_affine_continuous"], 2, True),
    ]
    return affine + [
        form(fns["weight_zero"], fns["fused_weight"], 1, False),
        form(fns["weight_zero_scale_first"], fns["fused_weight"], 1, False),
        form(fns["weight_continuous"], fns["fused_weight_continuous"], 1, True),
        form(fns["zero"], fns["fused"], 0, False), form(fns["zero_scale_first"], fns["fused"], 0, False),
        form(fns["continuous"], fns["fused_continuous"], 0, True),
    ]


def _forms(style: str) -> list:
    """The Form records of one rms_norm style. The argument names are the
    match's names (the checks read x, weight, bias, scale, shift, eps)."""

    def zero(x, scale, shift, eps):
        return _rms(x, None, eps, style=style) * (1 + scale) + shift

    def zero_scale_first(x, scale, shift, eps):
        return (1 + scale) * _rms(x, None, eps, style=style) + shift

    def continuous(x, scale, shift, eps):
        return _rms(x, None, eps, style=style) * (1 + scale)[:, None, :] + shift[:, None, :]

    def weight_zero(x, weight, scale, shift, eps):
        return _rms(x, weight, eps, style=style) * (1 + scale) + shift

    def weight_zero_scale_first(x, weight, scale, shift, eps):
        return (1 + scale) * _rms(x, weight, eps, style=style) + shift

    def weight_continuous(x, weight, scale, shift, eps):
        return _rms(x, weight, eps, style=style) * (1 + scale)[:, None, :] + shift[:, None, :]

    def affine_zero(x, weight, bias, scale, shift, eps):
        return _rms(x, weight, eps, bias, style=style) * (1 + scale) + shift

    def affine_zero_scale_first(x, weight, bias, scale, shift, eps):
        return (1 + scale) * _rms(x, weight, eps, bias, style=style) + shift

    def affine_continuous(x, weight, bias, scale, shift, eps):
        return _rms(x, weight, eps, bias, style=style) * (1 + scale)[:, None, :] + shift[:, None, :]

    def fused(x, scale, shift, eps):
        return fused_rms(x, scale, shift, eps, None, None, style)

    def fused_continuous(x, scale, shift, eps):
        return fused_rms(x, scale.unsqueeze(1), shift.unsqueeze(1), eps, None, None, style)

    def fused_weight(x, weight, scale, shift, eps):
        return fused_rms(x, scale, shift, eps, weight, None, style)

    def fused_weight_continuous(x, weight, scale, shift, eps):
        return fused_rms(x, scale.unsqueeze(1), shift.unsqueeze(1), eps, weight, None, style)

    def fused_affine(x, weight, bias, scale, shift, eps):
        return fused_rms(x, scale, shift, eps, weight, bias, style)

    def fused_affine_continuous(x, weight, bias, scale, shift, eps):
        return fused_rms(x, scale.unsqueeze(1), shift.unsqueeze(1), eps, weight, bias, style)

    def form(search, replace, n_params, chunks):
        search.__name__ = f"_rms_{search.__name__}_{style}"  # as the explain report names the closest form
        return Form(search, replace, _plain_examples(n_params, chunks),
                    check=functools.partial(supported, chunks=chunks))

    return rms_modulation_forms(style, form, locals())


def _cast_forms(style: str) -> list:
    """The Form records of the half-precision forms that end in a cast:

    * ACE-Step: ``(norm(h) * (1 + scale) + shift).type_as(h)`` (a float32 modulation table promotes the
      product; the cast brings it back) → ``adaln(..., out_dtype=h.dtype)``;
    * Ernie: ``x = norm(x); (x.float() * (1 + scale.float()) + shift.float()).to(x.dtype)`` →
      ``adaln(..., out_dtype=<the norm's dtype>)``.
    In float32 every cast here is a no-op the redundant-node pass drops, and the plain forms match."""

    def type_as(x, scale, shift, eps):
        return (_rms(x, None, eps, style=style) * (1 + scale) + shift).to(x.dtype)

    def weight_type_as(x, weight, scale, shift, eps):
        return (_rms(x, weight, eps, style=style) * (1 + scale) + shift).to(x.dtype)

    def fp32_modulation(x, scale, shift, eps):
        n = _rms(x, None, eps, style=style)
        return (n.float() * (1 + scale.float()) + shift.float()).to(n.dtype)

    def weight_fp32_modulation(x, weight, scale, shift, eps):
        n = _rms(x, weight, eps, style=style)
        return (n.float() * (1 + scale.float()) + shift.float()).to(n.dtype)

    def fused_type_as(x, scale, shift, eps):
        return fused_adaln(x, scale, shift, eps, out_dtype=x.dtype, norm="rms")

    def fused_weight_type_as(x, weight, scale, shift, eps):
        return fused_adaln(x, scale, shift, eps, weight=weight, out_dtype=x.dtype, norm="rms")

    def fused_fp32_modulation(x, scale, shift, eps):
        out_dtype = rms_norm_out_dtype(x, None, None, style)
        return fused_adaln(x, scale, shift, eps, out_dtype=out_dtype, norm="rms")

    def fused_weight_fp32_modulation(x, weight, scale, shift, eps):
        out_dtype = rms_norm_out_dtype(x, weight, None, style)
        return fused_adaln(x, scale, shift, eps, weight=weight, out_dtype=out_dtype, norm="rms")

    def form(search, replace, n_params):
        search.__name__ = f"_rms_{search.__name__}_{style}"
        return Form(search, replace, _cast_examples(style, search, n_params), check=supported)

    return [
        form(weight_fp32_modulation, fused_weight_fp32_modulation, 1), form(fp32_modulation, fused_fp32_modulation, 0),
        form(weight_type_as, fused_weight_type_as, 1), form(type_as, fused_type_as, 0),
    ]


# ---- registration ------------------------------------------------------------------------------------


# Per style, the cast forms first: each contains a plain form. Then each with a run-time eps (under dynamic=True:
# the rms_norm family's ``rms_norm.eps_tensor`` call, its eps a 0-d tensor input).
_STATIC_FORMS = tuple(f for style in _STYLES for f in (*_cast_forms(style), *_forms(style)))
FORMS = _STATIC_FORMS + tuple(runtime_eps_form(f, cast=False) for f in _STATIC_FORMS)


def register(pm: PatternMatcherPass, opts) -> None:
    """Registers the RMSNorm-modulation forms into ``pm``."""
    del opts  # the pass manager decides whether this family runs
    explicit_rms_calls_during(pm)
    prepare_before(pm, split_shared_factors)
    register_forms(pm, FORMS, trace_fn=trace_canonical, scalars={"eps": _EPS_MAGIC})


# ---- lowering, calibration, explain ------------------------------------------------------------------


def _claims(node) -> bool:
    """A ``fusegraph.adaln`` call of this family: an RMSNorm modulation with a shift."""
    return adaln_shift(node) is not None and node.kwargs.get("norm", "layer") == "rms"


def _anchor(node):
    """A fused RMSNorm followed by ``* (1 + scale) + shift``. (An RMSNorm still unfused is the rms_norm
    family's candidate: this family starts at the fused op.)"""
    if _anchors.modulation(node) != "shift":
        return None
    return "fusegraph.rms_norm" if _anchors.is_fused_rms_norm(node) else None


FAMILY = Family("adaln_rms", "enable_adalayernorm", register, ops=("adaln.default", "adaln.eps_tensor"),
                claims=_claims, lowerings={"adaln.default": lower, "adaln.eps_tensor": lower},
                calibration=adaln_site(norm="rms", shift=True),
                row_wise=True, candidates=(Candidate(_anchor),), forms=FORMS)
