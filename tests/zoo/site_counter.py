"""An independent count of the fusion sites a model's forward holds, per family (rms_norm, rope, adaln, gelu,
mul_add). Independent: nothing here imports or reuses fusegraph (its patterns, passes or stats); the zoo tests
compare the fused ops in the graphs fusegraph hands on, and ``backend.stats.patterns``, with these counts.

Capture: the unfused aten graph exactly as fusegraph receives it — ``torch.compile`` with a recording backend,
``aot_autograd(fw_compiler=record, inference_compiler=record, decompositions=select_decomp_table())`` (Inductor's
decompositions), under ``torch.no_grad()``. Counts are summed over every Dynamo graph of one forward.

Vocabulary. *Layout op*: an op that moves or converts values without arithmetic (view, reshape, unsqueeze,
squeeze, expand, permute, transpose, clone, dtype casts, alias). *Through layout* means following a chain of
layout ops. *Full shape*: the shape of the add's result. *Last-dim reduction*: ``dim == [-1]`` or the last index.

Rules (one count per site):

- **rms_norm** — an ``rsqrt`` (also ``sqrt`` feeding a ``div``, or ``pow(·, -0.5)``) of ``add(mean(s, [last],
  keepdim), eps)`` where ``s = pow(x, 2)`` or ``mul(x, x)``, and ``x`` is not ``sub(y, mean(y))`` (that is a
  hand-written LayerNorm). Also every surviving ``aten.rms_norm`` / ``aten._fused_rms_norm``. LayerNorm's rsqrt
  (of ``var_mean``'s variance) is never an RMS site.
- **adaln** — a LayerNorm over the last dim (``var_mean``/``var`` over the last dim, or a hand-written
  ``mean((x - mean(x))²)``; normalised output ``mul(sub(x, mean), rsqrt(var + eps))``) whose output, through
  layout ops and at most one affine ``mul`` and one affine ``add`` by a 1-D ``[D]`` tensor, is multiplied by
  ``(1 + scale)`` — an ``add(scale, 1)`` with the literal 1, reached through layout/slice ops, not a ``[D]`` value
  of the weights alone (Krea2's zero-centred RMSNorm weight ``w + 1`` is the norm's affine) — and the product
  (through layout ops) is added to a tensor ``shift``. One site per modulation: a LayerNorm modulated twice (SD3.5's
  ``SD35AdaLayerNormZeroX``) is two sites. ``x * (2 + scale) + shift`` is not a site.
- **adaln_rms** — the same modulation with shift of an RMSNorm's normalised output (``mul(x, r)`` where ``r`` is
  an rms_norm site's inverse square root), through the same layout / affine ops: LTX's ``norm1(x) * (1 + scale) +
  shift`` after an RMSNorm. The RMSNorm is also an rms_norm site.
- **adaln_noshift** — a LayerNorm's or RMSNorm's output (as above) multiplied by ``(1 + scale)`` where the product
  is added to no tensor: ``LuminaRMSNormZero``, ``LuminaLayerNormContinuous``, Lumina2's ``ffn_norm1(x) * (1 +
  scale_mlp)``.
- **rope** — one rotary application to one tensor:
  * real forms: a *combine* node ``add``/``sub`` of two ``mul``s, ``x1 * f1 ± x2 * f2``, where ``x1`` and ``x2``
    are different nodes derived from the same source tensor through layout/select/slice/unbind/neg/stack/cat ops
    (``x`` and its rotation; or the even/odd halves), and ``f1``, ``f2`` are different tensors not derived from that
    source (cos/sin, or HiDream's ``[..., 2, 2]`` rotation-matrix entries). Combines of the same source tensor whose
    results meet in the same assembly (stack / cat / slice_scatter / copy / layout ops downstream — Wan's and Mochi's
    even/odd halves written into one output) are one application; the q and k applications never meet before
    attention, and two rotated tensors concatenated later (Cosmos3's ``cat([k_und, k_gen])``) are two.
  * complex form: a complex ``mul`` one of whose operands is (through layout ops) a ``view_as_complex``.
  * matrix-sum form (Kandinsky 5/6 ``apply_rotary``): ``sum(R * x.reshape(..., n, 1, 2), -1)`` — a ``sum`` over a
    last dim of size 2 of a ``mul`` of a view of ``x`` ending in ``(1, 2)`` with a ``[..., 2, 2]`` tensor not
    derived from ``x`` (a 2x2 rotation per pair).
- **gelu** — a surviving ``aten.gelu(approximate="tanh")``, or a ``tanh`` of ``mul(√(2/π), add(x, mul(x³,
  0.044715)))`` (either operand order). ``gelu(approximate="none")`` (erf) and ``x * sigmoid(1.702 x)`` are not.
- **mul_add** — ``a * b + c``: an ``add`` (no alpha) with a floating result, ``c + p`` in either order, where ``p``
  is a ``mul`` whose only user is that add, and ``a``, ``b``, ``c`` are tensors of the result's dtype or (``a`` or
  ``b``) a Python number other than 1 (``x * scalar + y``; ``x * 1 + y`` is Inductor's one-row addmm) —
  broadcasting in any direction (gated residual ``residual + gate * y`` with a ``[B, 1, D]`` gate, a per-token gate, a LayerNorm's affine ``n * w + b`` when no modulation follows). Also
  Wan's ``(h.float() + y.float() * gate).type_as(h)`` (fp32 add of upcasts, cast back to h's dtype). Mixed dtypes
  otherwise are not a site (eager rounds the product before the add; one fused rounding would differ). Excluded:
  nodes of another family's site — a RoPE combine (``x * cos + rot(x) * sin``), the GELU polynomial
  (``x + 0.044715 x³``), a modulation (any of the three adaln families) and its norm's affine, an RMSNorm's affine (``p`` multiplies an
  RMS-normalised output ``x * rsqrt(...)`` by a 1-D ``[D]`` weight, or is that output). ``sub`` is not counted.
"""
from __future__ import annotations

import contextlib
import math
import numbers

import torch
from torch.fx import Node

FAMILIES = ("rms_norm", "rope", "adaln", "adaln_rms", "adaln_noshift", "gelu", "mul_add")

LAYOUT = {"view", "_unsafe_view", "reshape", "unsqueeze", "squeeze", "expand", "permute", "transpose", "t", "clone",
          "convert_element_type", "_to_copy", "alias", "contiguous", "lift_fresh_copy"}
# ops a RoPE operand may pass through between its source tensor and the multiply (rotation and pair selection)
ROTATE = LAYOUT | {"neg", "select", "slice", "unbind", "getitem", "stack", "cat", "split", "split_with_sizes",
                   "unflatten", "flatten", "copy", "slice_scatter", "select_scatter", "repeat_interleave"}
# ops a RoPE result may pass through on its way to attention (assembling halves into one tensor)
ASSEMBLE = LAYOUT | {"stack", "cat", "slice_scatter", "select_scatter", "copy", "flatten", "view_as_real"}
_NO_DATA = {"empty", "empty_like", "zeros", "zeros_like", "full", "full_like", "empty_strided", "new_empty",
            "new_zeros", "scalar_tensor"}


def op(n) -> str:
    """The op's short name: ``aten.mul.Tensor`` -> ``mul``, ``prims.convert_element_type`` -> its name too."""
    if not isinstance(n, Node) or n.op != "call_function":
        return ""
    t = n.target
    if hasattr(t, "_opname"):
        return t._opname
    return getattr(t, "__name__", str(t))


def val(n):
    return n.meta.get("val") if isinstance(n, Node) else None


def shape(n):
    v = val(n)
    return tuple(v.shape) if isinstance(v, torch.Tensor) else None


def numel(n) -> int:
    v = val(n)
    return v.numel() if isinstance(v, torch.Tensor) else 0


def is_float(n) -> bool:
    v = val(n)
    return isinstance(v, torch.Tensor) and v.is_floating_point()


def through(n, ops=LAYOUT):
    """Back from ``n`` through ops in ``ops`` (first tensor operand) to the first other node."""
    while isinstance(n, Node) and op(n) in ops and n.args and isinstance(n.args[0], Node):
        n = n.args[0]
    return n


def scalar(x, target=None, rel=1e-6):
    """``x`` is a Python number (equal to ``target`` within ``rel`` when given)."""
    if not isinstance(x, numbers.Real) or isinstance(x, bool):
        return False
    return target is None or math.isclose(float(x), target, rel_tol=rel)


def last_dim(dims, n) -> bool:
    s = shape(n)
    if s is None or dims is None:
        return False
    dims = list(dims) if isinstance(dims, (list, tuple)) else [dims]
    return len(dims) == 1 and dims[0] in (-1, len(s) - 1)


def _reduce_dims(n):
    """dim argument of mean / var / var_mean nodes."""
    if len(n.args) > 1:
        return n.args[1]
    return n.kwargs.get("dim")


def square_of(n):
    """``x`` when ``n`` is ``pow(x, 2)`` or ``mul(x, x)``."""
    if op(n) == "pow" and len(n.args) > 1 and scalar(n.args[1], 2.0):
        return n.args[0]
    if op(n) == "mul" and len(n.args) > 1 and n.args[0] is n.args[1]:
        return n.args[0]
    return None


def mean_last(n):
    """The operand of ``mean(x, [last], keepdim)``, else None."""
    if op(n) == "mean" and last_dim(_reduce_dims(n), n.args[0]):
        return n.args[0]
    return None


_RUNTIME_EPS = [False]  # counting_runtime_eps(): an eps read at run time is a norm's eps too


@contextlib.contextmanager
def counting_runtime_eps():
    """Within: an eps that is a 0-d float graph input (through casts) makes a norm as a Python-number eps does. Under
    ``torch.compile(dynamic=True)`` Dynamo passes a module's Python float (diffusers RMSNorm's ``self.eps``) as such
    an input; counted so, the sites are those the graph would hold with the float a number."""
    _RUNTIME_EPS[0] = True
    try:
        yield
    finally:
        _RUNTIME_EPS[0] = False


def runtime_scalar(x) -> bool:
    """``x`` is, through casts, a 0-d floating-point graph input (a value read at run time)."""
    x = through(x)
    v = val(x)
    return isinstance(x, Node) and x.op == "placeholder" and isinstance(v, torch.Tensor) and v.dim() == 0 and \
        v.dtype.is_floating_point


def _eps(x) -> bool:
    return scalar(x) or (_RUNTIME_EPS[0] and isinstance(x, Node) and runtime_scalar(x))


def add_eps(n):
    """``v`` when ``n`` is ``add(v, eps)`` / ``add(eps, v)`` with a Python-number eps (or a run-time one within
    :func:`counting_runtime_eps`)."""
    if op(n) != "add" or len(n.args) < 2:
        return None
    a, b = n.args[:2]
    if isinstance(a, Node) and _eps(b):
        return a
    if isinstance(b, Node) and _eps(a):
        return b
    return None


def centred(x) -> bool:
    """``x`` is ``sub(y, mean(y, [last]))``: the centring of a hand-written LayerNorm."""
    x = through(x)
    return op(x) == "sub" and isinstance(x.args[1], Node) and mean_last(through(x.args[1])) is not None


def inv_sqrt_input(n):
    """The radicand when ``n`` is ``rsqrt(r)``, ``pow(r, -0.5)`` or ``sqrt(r)`` (the last one divides)."""
    if op(n) in ("rsqrt", "sqrt"):
        return n.args[0]
    if op(n) == "pow" and len(n.args) > 1 and scalar(n.args[1], -0.5):
        return n.args[0]
    return None


def rms_site(n) -> bool:
    r = inv_sqrt_input(n)
    v = add_eps(through(r)) if r is not None else None
    x = mean_last(through(v)) if v is not None else None
    sq = square_of(through(x)) if x is not None else None
    return sq is not None and not centred(sq)


def ln_rsqrt(n) -> bool:
    """``n`` is LayerNorm's ``rsqrt(var + eps)`` over the last dim."""
    r = inv_sqrt_input(n)
    v = add_eps(through(r)) if r is not None and op(n) != "sqrt" else None
    if v is None:
        return False
    v = through(v)
    if op(v) == "getitem" and op(v.args[0]) == "var_mean" and v.args[1] == 0:
        vm = v.args[0]
        return last_dim(_reduce_dims(vm), vm.args[0])
    if op(v) == "var":
        return last_dim(_reduce_dims(v), v.args[0])
    x = mean_last(v)
    sq = square_of(through(x)) if x is not None else None
    return sq is not None and centred(sq)


def ln_outputs(graph):
    """LayerNorm normalised outputs: ``mul(sub(x, mean), rsqrt_ln)``."""
    outs = []
    for n in graph.nodes:
        if op(n) == "mul" and len(n.args) == 2 and all(isinstance(a, Node) for a in n.args):
            a, b = n.args
            for cen, r in ((a, b), (b, a)):
                if op(through(cen)) == "sub" and ln_rsqrt(through(r)):
                    outs.append(n)
                    break
    return outs


def one_plus(n) -> bool:
    """``n`` is ``1 + scale`` (the literal 1), reached through layout / slice ops."""
    n = through(n, LAYOUT | {"slice", "select", "getitem", "split", "split_with_sizes"})
    if op(n) != "add" or len(n.args) < 2 or n.kwargs.get("alpha", 1) != 1:
        return False
    a, b = n.args[:2]
    return (isinstance(a, Node) and scalar(b, 1.0, 0)) or (isinstance(b, Node) and scalar(a, 1.0, 0))


def forward_layout(n, ops=LAYOUT):
    """``n`` and every node reachable from it through users that are ops in ``ops``."""
    seen, todo = [], [n]
    while todo:
        m = todo.pop()
        if m in seen:
            continue
        seen.append(m)
        todo.extend(u for u in m.users if op(u) in ops)
    return seen


def _affine_operand(n, width) -> bool:
    s = shape(n)
    return s is not None and len([d for d in s if d != 1]) <= 1 and s[-1:] == (width,)


def _is_weight(n, weights, width) -> bool:
    """``n`` is a norm's own affine factor: a ``[D]`` value of the weights alone (Krea2's zero-centred
    ``weight + 1``), not a modulation (which depends on the input: the timestep)."""
    return through(n, LAYOUT) in weights and _affine_operand(n, width)


def rms_outputs(graph):
    """RMSNorm normalised outputs: ``mul(x, r)`` where ``r`` is an RMS site's inverse square root."""
    return [n for n in graph.nodes
            if op(n) == "mul" and len(n.args) == 2 and any(isinstance(a, Node) and rms_site(through(a)) for a in n.args)]


def modulation_sites(graph, claimed, weights=frozenset(), by_norm=None) -> dict:
    """Modulations of normalised outputs, by family: ``adaln`` (LayerNorm, ``* (1 + scale) + shift``), ``adaln_rms``
    (RMSNorm, ``* (1 + scale) + shift``), ``adaln_noshift`` (LayerNorm or RMSNorm, ``* (1 + scale)`` whose product is
    added to nothing). The norm output may pass through layout ops and at most one affine ``mul`` and one affine
    ``add`` by a 1-D ``[D]`` tensor first (the norm's own weight and bias). ``by_norm`` (a dict), when given, also
    counts the modulated norms (one per norm output, however many modulations it has), by kind: ``"layer"`` and
    ``"rms"``."""
    counts = dict(adaln=0, adaln_rms=0, adaln_noshift=0)
    norms = [(n, "adaln") for n in ln_outputs(graph)] + [(n, "adaln_rms") for n in rms_outputs(graph)]
    for norm, with_shift in norms:
        width = shape(norm)[-1]
        frontier, affine, found = [norm], [], False
        for _ in range(3):  # the norm output, then after an affine mul, then after an affine add
            nxt = []
            for m in frontier:
                for y in forward_layout(m):
                    for u in list(y.users):
                        if op(u) != "mul" or len(u.args) != 2:
                            continue
                        other = u.args[1] if u.args[0] is y else u.args[0]
                        if isinstance(other, Node) and one_plus(other) and not _is_weight(other, weights, width):
                            if u in claimed:
                                continue
                            shifted = None
                            for z in forward_layout(u):
                                for a in z.users:
                                    if op(a) == "add" and len(a.args) == 2 and a.kwargs.get("alpha", 1) == 1:
                                        shift = a.args[1] if a.args[0] is z else a.args[0]
                                        if isinstance(shift, Node) and a not in claimed:
                                            shifted = a
                                            break
                                if shifted is not None:
                                    break
                            if shifted is not None:
                                claimed.update((u, shifted))
                                counts[with_shift] += 1
                            else:
                                claimed.add(u)
                                counts["adaln_noshift"] += 1
                            found = True
                        elif isinstance(other, Node) and _affine_operand(other, width):
                            nxt.append(u)
                    for u in y.users:  # affine bias
                        if op(u) == "add" and len(u.args) == 2 and u.kwargs.get("alpha", 1) == 1:
                            other = u.args[1] if u.args[0] is y else u.args[0]
                            if isinstance(other, Node) and _affine_operand(other, width):
                                nxt.append(u)
            frontier = nxt
            affine.extend(nxt)
            if not frontier:
                break
        if found:  # a modulated norm's affine weight and bias belong to its modulation site
            claimed.update(affine)
            if by_norm is not None:
                kind = "rms" if with_shift == "adaln_rms" else "layer"
                by_norm[kind] = by_norm.get(kind, 0) + 1
    return counts


def roots(n, memo):
    """The source tensors ``n`` is derived from through rotation/selection ops (frozenset of nodes)."""
    if not isinstance(n, Node) or isinstance(val(n), (torch.SymInt, torch.SymFloat, torch.SymBool, numbers.Number)):
        # sizes are no sources: under dynamic=True a slice's bound is a SymInt input every rotation shares
        return frozenset()
    if n in memo:
        return memo[n]
    name = op(n)
    if name in _NO_DATA:
        r = frozenset()
    elif name == "copy":
        r = roots(n.args[1], memo)
    elif name in ROTATE:
        parts = [a for a in n.args if isinstance(a, Node)]
        parts += [a for a in (n.args[0] if n.args and isinstance(n.args[0], (list, tuple)) else ()) if
                  isinstance(a, Node)]
        r = frozenset().union(*(roots(a, memo) for a in parts)) if parts else frozenset()
    else:
        r = frozenset([n])
    memo[n] = r
    return r


def rope_combine(n, memo):
    """The nodes of a real-form RoPE combine ``x1 * f1 ± x2 * f2`` at ``n`` (else None)."""
    if op(n) not in ("add", "sub") or len(n.args) != 2 or n.kwargs.get("alpha", 1) != 1 or not is_float(n):
        return None
    m1, m2 = n.args
    if op(m1) != "mul" or op(m2) != "mul" or len(m1.args) != 2 or len(m2.args) != 2:
        return None
    for x1, f1 in (m1.args, m1.args[::-1]):
        for x2, f2 in (m2.args, m2.args[::-1]):
            if not all(isinstance(v, Node) for v in (x1, f1, x2, f2)) or x1 is x2 or f1 is f2:
                continue
            rx = roots(x1, memo) & roots(x2, memo)
            rf = roots(f1, memo) | roots(f2, memo)
            if rx and not (rf & (roots(x1, memo) | roots(x2, memo))):
                return (n, m1, m2)
    return None


def _combine_sources(c, memo) -> frozenset:
    """The source tensors both rotated operands of a combine ``(n, m1, m2)`` derive from."""
    _, m1, m2 = c
    r1 = frozenset().union(*(roots(a, memo) for a in m1.args if isinstance(a, Node)))
    r2 = frozenset().union(*(roots(a, memo) for a in m2.args if isinstance(a, Node)))
    return r1 & r2


def _matrix_sum(n, memo) -> bool:
    """``sum(R * x.reshape(..., n, 1, 2), [-1])``: a 2x2 rotation matrix per pair, applied by a broadcast product."""
    if op(n) != "sum" or len(n.args) < 2 or not last_dim(n.args[1], n.args[0]):
        return False
    m = n.args[0]
    if op(m) != "mul" or len(m.args) != 2 or not all(isinstance(a, Node) for a in m.args):
        return False
    for xv, rv in (m.args, m.args[::-1]):
        xs, rs = shape(xv), shape(rv)
        if xs is None or rs is None or len(xs) < 3 or len(rs) < 2:
            continue
        if xs[-2:] == (1, 2) and rs[-2:] == (2, 2) and not (roots(rv, memo) & roots(xv, memo)):
            return True
    return False


def rope_sites(graph, claimed):
    memo, combines = {}, []
    for n in graph.nodes:
        c = rope_combine(n, memo)
        if c is not None:
            combines.append(c)
            claimed.update(c)
    # one application per group of combines of one source whose results meet downstream
    groups = []  # [nodes reached, source roots]
    for c in combines:
        reach = set(forward_layout(c[0], ASSEMBLE))
        src = _combine_sources(c, memo)
        merged = [g for g in groups if g[0] & reach and g[1] & src]
        for g in merged:
            groups.remove(g)
            reach |= g[0]
            src |= g[1]
        groups.append([reach, src])
    matrix = 0
    for n in graph.nodes:
        if _matrix_sum(n, memo):
            matrix += 1
            claimed.add(n)
    complex_muls = 0
    for n in graph.nodes:
        if op(n) == "mul" and isinstance(val(n), torch.Tensor) and val(n).is_complex():
            if any(op(through(a)) == "view_as_complex" for a in n.args if isinstance(a, Node)):
                complex_muls += 1
                claimed.add(n)
    return len(groups) + complex_muls + matrix


def gelu_sites(graph, claimed):
    count = 0
    for n in graph.nodes:
        if op(n) == "gelu" and n.kwargs.get("approximate", n.args[1] if len(n.args) > 1 else "none") == "tanh":
            count += 1
        elif op(n) == "tanh":
            m = through(n.args[0])
            if op(m) != "mul" or len(m.args) != 2:
                continue
            k = [a for a in m.args if scalar(a, math.sqrt(2 / math.pi), 1e-5)]
            inner = [through(a) for a in m.args if isinstance(a, Node)]
            if not k or len(inner) != 1 or op(inner[0]) != "add":
                continue
            cubic = [a for a in inner[0].args if op(a) == "mul" and any(scalar(s, 0.044715, 1e-5) for s in a.args)]
            if cubic:
                count += 1
                claimed.update((inner[0], cubic[0]))
    return count


def normalised(graph) -> set:
    """Normalised outputs of RMS and LayerNorms: ``mul(x, rsqrt(...))`` (their affine ``* w + b`` is the norm's)."""
    out = set()
    for n in graph.nodes:
        if op(n) == "mul" and any(isinstance(a, Node) and (rms_site(through(a)) or ln_rsqrt(through(a)))
                                  for a in n.args):
            out.add(n)
    return out


def _upcast_source(n):
    """``x`` when ``n`` casts a bf16/fp16 ``x`` to float32 (Wan's ``h.float()``), else None."""
    if op(n) in ("convert_element_type", "_to_copy") and isinstance(n.args[0], Node):
        src = val(n.args[0])
        if isinstance(src, torch.Tensor) and src.dtype in (torch.bfloat16, torch.float16) and \
                val(n).dtype == torch.float32:
            return n.args[0]
    return None


def _wan_form(n, p, c) -> bool:
    """``(h.float() + y.float() * gate).type_as(h)``: the fp32 add of an upcast ``h`` and a product of an upcast
    ``y``, cast back to h's dtype as its only use."""
    h = _upcast_source(c)
    if h is None or len(n.users) != 1:
        return False
    back = next(iter(n.users))
    if op(back) not in ("convert_element_type", "_to_copy") or val(back).dtype != val(h).dtype:
        return False
    return any(_upcast_source(x) is not None for x in p.args if isinstance(x, Node))


def mul_add_sites(graph, claimed):
    count = 0
    norms = {n for n in normalised(graph) if any(isinstance(a, Node) and rms_site(through(a)) for a in n.args)}
    for n in graph.nodes:
        if op(n) != "add" or len(n.args) != 2 or n.kwargs.get("alpha", 1) != 1 or not is_float(n) or n in claimed:
            continue
        dtype = val(n).dtype
        for p, c in (n.args, n.args[::-1]):
            if not isinstance(c, Node) or not isinstance(p, Node) or op(p) != "mul":
                continue
            if p in claimed or len(p.users) != 1 or len(p.args) != 2:
                continue
            a, b = p.args
            if p in norms or any(through(x) in norms and isinstance(w, Node) and len(shape(w) or ()) == 1
                                 for x, w in ((a, b), (b, a))):  # an RMSNorm's own rsqrt or 1-D affine weight
                continue
            tensors = [x for x in (a, b, c) if isinstance(x, Node)]
            same = all(is_float(x) and val(x).dtype == dtype for x in tensors)
            # x * 1 + y is x + y, no product (Inductor's decomposition of a one-row addmm: sum(...) * 1 + bias)
            by_one = any(not isinstance(x, Node) and x == 1 for x in (a, b))
            if (same and not by_one and all(isinstance(x, Node) or scalar(x) for x in (a, b))) or _wan_form(n, p, c):
                count += 1
                claimed.update((n, p))
                break
    return count


def rms_sites(graph, weights=frozenset()) -> int:
    """RMS sites; a normalised output that several weights multiply is that many norms (CSE merges the shared core
    ``x * rsqrt(mean(x²) + eps)`` of norms of one input — LuminaNext's per-block ``norm1_context`` — but each norm
    still has its own weight)."""
    count = 0
    for n in graph.nodes:
        if op(n) in ("rms_norm", "_fused_rms_norm"):
            count += 1
        elif rms_site(n):
            outs = [u for r in forward_layout(n) for u in r.users if op(u) == "mul"]
            width = [shape(o)[-1] for o in outs if shape(o)]
            affine = {u for o in outs for y in forward_layout(o) for u in y.users
                      if op(u) == "mul" and width and any(
                          isinstance(a, Node) and a is not y and through(a) in weights and _affine_operand(a, width[0])
                          for a in u.args)}
            count += max(1, len(affine))
    return count


def count_graph(graph, weights=frozenset(), by_norm=None) -> dict:
    """Sites per family in one aten FX graph; ``weights``: its nodes computed from weights alone (see
    :func:`weight_values`); ``by_norm``: see :func:`modulation_sites`."""
    claimed: set = set()
    counts = dict(rms_norm=rms_sites(graph, weights), rope=rope_sites(graph, claimed))
    counts.update(modulation_sites(graph, claimed, weights, by_norm))
    counts["gelu"] = gelu_sites(graph, claimed)
    counts["mul_add"] = mul_add_sites(graph, claimed)
    return counts


def capture(fn, *args, dynamic=None, **kwargs):
    """(aten graph modules of one forward of ``fn`` as fusegraph receives them, the output) — no grad, fresh
    Dynamo. The number of graphs is Dynamo's graph count (graph breaks + 1 when there is no other split).
    ``dynamic``: ``torch.compile``'s."""
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    graphs, weights = [], []

    def record(gm, example_inputs):
        gm.weight_inputs = weights.pop()
        graphs.append(gm)
        return gm.forward

    aot = aot_autograd(fw_compiler=record, inference_compiler=record, decompositions=select_decomp_table())

    def backend(gm, example_inputs):
        # which graph inputs are the module's parameters / buffers (Dynamo inlines modules: they arrive as inputs)
        sources = [getattr(n.meta.get("grapharg"), "source", None) for n in gm.graph.find_nodes(op="placeholder")]
        weights.append([s is not None and ("._parameters[" in s.name or "._buffers[" in s.name) for s in sources])
        return aot(gm, example_inputs)

    torch._dynamo.reset()
    with torch.no_grad():
        out = torch.compile(fn, backend=backend, dynamic=dynamic)(*args, **kwargs)
    torch._dynamo.reset()
    return graphs, out


def weight_values(gm) -> set:
    """Nodes of ``gm`` computed from the module's parameters and buffers (``gm.weight_inputs``, from
    :func:`capture`) and constants alone."""
    placeholders = gm.graph.find_nodes(op="placeholder")
    mask = getattr(gm, "weight_inputs", [])
    const = {p for p, w in zip(placeholders, mask) if w} if len(mask) == len(placeholders) else set()
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            const.add(n)
        elif n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and \
                not n.target._schema.is_mutable and all(a in const for a in n.all_input_nodes):
            const.add(n)
    return const


def count_sites(graphs, by_norm=None) -> dict:
    """Sites per family over ``graphs`` (from :func:`capture`); ``by_norm`` (a dict), when given, also counts the
    modulated norms by kind, ``"layer"`` and ``"rms"`` (a modulated RMSNorm is an rms_norm site that the fused
    modulation computes: no rms_norm op of its own)."""
    total = dict.fromkeys(FAMILIES, 0)
    for gm in graphs:
        graph, weights = gm.graph, weight_values(gm)
        for k, v in count_graph(graph, weights, by_norm).items():
            total[k] += v
    return total


def count_model(model, kwargs) -> tuple[dict, int]:
    """(sites per family, number of Dynamo graphs) of one forward of ``model(**kwargs)``."""
    graphs, _ = capture(model, **kwargs)
    return count_sites(graphs), len(graphs)
