"""Tracing a search pattern the way aot_autograd traces the model: decomposed AND functionalized.

``fwd_only`` (Inductor's) decomposes with ``make_fx`` but does not functionalize, so a decomposition that
writes in place (``torch.rms_norm``'s ``add_``) or a source that does (Wan's RoPE fills ``empty_like`` through
slices) would never line up with the model's functional graph. ``fwd_functional`` traces twice: once with the
decompositions, then that graph again under ``torch.func.functionalize``, then the same clean-up as
``fwd_only``.
"""
from __future__ import annotations

import torch
from ..._core.torch_fake import enable_python_dispatcher
from ..._core.torch_inductor import select_decomp_table
from torch.fx.experimental.proxy_tensor import make_fx


def fwd_functional(fn, args, *, get_decomp_fn=select_decomp_table, **_):
    """Drop-in ``trace_fn`` for ``register_replacement`` (accepts the newer ``get_decomp_fn`` keyword)."""
    from ..._core.torch_inductor import remove_noop_ops

    with enable_python_dispatcher():
        decomposed = make_fx(fn, get_decomp_fn(), tracing_mode="real")(*args)
        gm = make_fx(torch.func.functionalize(decomposed), tracing_mode="real")(*args)
    remove_noop_ops(gm.graph)
    gm.graph.eliminate_dead_code()
    gm.recompile()
    return gm


def fwd_functional_reshape(fn, args, **kwargs):
    """``fwd_functional`` with every ``view`` written as ``reshape``: the form Inductor's freezing leaves the
    graph in (``view_to_reshape``) when the fusion runs as its post-grad pass."""
    gm = fwd_functional(fn, args, **kwargs)
    for node in gm.graph.nodes:
        if node.op == "call_function" and node.target == torch.ops.aten.view.default:
            node.target = torch.ops.aten.reshape.default
    gm.recompile()
    return gm
