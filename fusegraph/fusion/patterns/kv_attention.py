"""Decode attention over a key/value cache: ``scaled_dot_product_attention(q, cat([k_cache, k_new], -2),
cat([v_cache, v_new], -2))`` with a few queries -> ``fusegraph.kv_attention`` (reads the two pieces in place).

The SDPA of one decode step (1..8 new queries per head) over the cache plus this step's keys and values, the form
a static cache or a concatenating cache (transformers' ``DynamicCache``) gives: after the decompositions it is
``_scaled_dot_product_flash_attention_for_cpu`` (output ``[0]``) on two ``aten.cat`` nodes. The flash kernel is
built for long query blocks: for one query row it spends more time on its blocking (and, in bf16, on converting
the keys) than on the math, and the concatenation copies the whole cache every step. Only CPU sites are fused
(CUDA has flash/efficient kernels of its own), without mask, dropout or causal flag (a causal mask over one new
query of a longer key sequence is not what a decode step means), with the cache and the new piece in one dtype.
"""
import operator

import torch
from ..._core.torch_pattern_matcher import CallFunction, KeywordArg, register_graph_pattern

from . import _anchors
from ._family import Candidate, Family

aten = torch.ops.aten

MAX_QUERIES = 8  # query rows per head; above this the flash kernel's blocking pays


def _val(node):
    return node.meta.get("val") if isinstance(node, torch.fx.Node) else None


def _pieces(cat_node):
    """(cache, new) of a two-piece concatenation along the length dim (-2) of 4-D tensors, else None."""
    if not (isinstance(cat_node, torch.fx.Node) and cat_node.target is aten.cat.default):
        return None
    tensors = cat_node.args[0]
    dim = cat_node.args[1] if len(cat_node.args) > 1 else cat_node.kwargs.get("dim", 0)
    if len(tensors) != 2 or not all(isinstance(t, torch.fx.Node) for t in tensors):
        return None
    vals = [_val(t) for t in tensors]
    if any(not isinstance(v, torch.Tensor) or v.dim() != 4 for v in vals) or dim not in (2, -2):
        return None
    return tuple(tensors)


def _sdpa_args(sdpa):
    """(q, keys, values, scale) of a plain SDPA node (no mask, no dropout, not causal), else None."""
    args = list(sdpa.args)
    q, k, v = args[:3]
    dropout = args[3] if len(args) > 3 else sdpa.kwargs.get("dropout_p", 0.0)
    causal = args[4] if len(args) > 4 else sdpa.kwargs.get("is_causal", False)
    if dropout != 0.0 or causal or sdpa.kwargs.get("attn_mask") is not None:
        return None
    return q, k, v, sdpa.kwargs.get("scale")


def _site(match):
    """(sdpa node, q, (k_cache, k_new), (v_cache, v_new), scale) when the match is a decode step, else None."""
    sdpa = match.output_node().args[0]
    parsed = _sdpa_args(sdpa)
    if parsed is None:
        return None
    q, k, v, scale = parsed
    if any(u.target is not operator.getitem or u.args[1] != 0 for u in sdpa.users):
        return None  # the logsumexp output is used (a backward, a merge of attention states)
    keys, values = _pieces(k), _pieces(v)
    qv = _val(q)
    if keys is None or values is None or not isinstance(qv, torch.Tensor) or qv.dim() != 4:
        return None
    vals = [qv] + [_val(t) for t in keys + values]
    if qv.device.type != "cpu" or any(t.dtype != qv.dtype for t in vals):
        return None
    if qv.dtype not in (torch.float32, torch.bfloat16, torch.float16):
        return None
    lq = qv.shape[2]
    if not isinstance(lq, int) or lq > MAX_QUERIES:  # a symbolic query length: not judged (no guard added)
        return None
    shapes_ok = all(t.shape[:2] == qv.shape[:2] for t in vals)
    return (sdpa, q, keys, values, scale) if shapes_ok else None


def register(pm, opts) -> None:
    sdpa_op = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if sdpa_op is None:
        return
    # the node forms the decompositions leave: 3..5 positional arguments, with or without scale=
    for n_args in (3, 4, 5):
        for with_scale in (False, True):
            args = [KeywordArg("q"), KeywordArg("k"), KeywordArg("v"), KeywordArg("dropout_p"),
                    KeywordArg("is_causal")][:n_args]
            kwargs = {"scale": KeywordArg("scale")} if with_scale else {}
            pattern = CallFunction(operator.getitem, CallFunction(sdpa_op.default, *args, **kwargs), 0)

            register_graph_pattern(pattern, extra_check=lambda m: _site(m) is not None, pass_dict=pm)(_replace)


def _replace(match, *args, **kwargs):
    sdpa, q, (kc, kn), (vc, vn), scale = _site(match)
    getitem = match.output_node()
    graph = getitem.graph
    with graph.inserting_before(getitem):
        node = graph.call_function(torch.ops.fusegraph.kv_attention.default, (q, kc, kn, vc, vn),
                                   {"scale": scale} if scale is not None else {})
    node.meta.update({k: v for k, v in sdpa.meta.items() if k in ("stack_trace", "nn_module_stack", "source_fn_stack")})
    val = _val(getitem)
    if isinstance(val, torch.Tensor):
        from ..._core.torch_fake import FakeTensor

        fake = [_val(n) for n in (q, kc, kn, vc, vn)]
        if all(isinstance(f, FakeTensor) for f in fake):
            with fake[0].fake_mode:
                node.meta["val"] = torch.ops.fusegraph.kv_attention.default(*fake, scale=scale)
        else:
            node.meta["val"] = val.new_empty(val.shape)  # contiguous, as the op's output
    getitem.replace_all_uses_with(node)
    graph.erase_node(getitem)
    if not sdpa.users:
        graph.erase_node(sdpa)


# ---- explain -----------------------------------------------------------------------------------------


def _anchor(node):
    """A decode step's SDPA on CPU (at most MAX_QUERIES query rows) whose keys and values are concatenations."""
    sdpa = getattr(aten, "_scaled_dot_product_flash_attention_for_cpu", None)
    if sdpa is None or not _anchors.is_op(node, sdpa.default) or \
            not all(_anchors.is_op(a, aten.cat.default) for a in node.args[1:3]):
        return None
    q = node.args[0].meta.get("val") if isinstance(node.args[0], torch.fx.Node) else None
    if not isinstance(q, torch.Tensor) or q.dim() != 4 or not isinstance(q.shape[2], int):
        return None
    return "scaled_dot_product_attention over cat" if q.shape[2] <= MAX_QUERIES else None


# Not lowered, not calibrated: it replaces an extern call (SDPA) for which Inductor generates no code of its own.
FAMILY = Family("kv_attention", "enable_kv_attention", register, ops=("kv_attention.default",),
                candidates=(Candidate(_anchor),))
