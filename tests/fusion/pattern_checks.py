"""Shared by the rms_norm / rope / adaln pattern tests and the model tests: compile through the real Backend,
collect the ops of every graph it handed on (after fusion), and compare numerics with eager.

Numerics: a fused op computes in float32 and rounds once; eager rounds some intermediates to bf16/fp16
(a norm's output before the modulation, a product before an add). So fp32 results are compared with eager at
the default fp32 tolerances; bf16/fp16 results at the dtype's default rtol, with an atol of two ulps of the
magnitude the intermediates reach (``scale``) — the size of eager's own extra rounding — and also with the
float64 value of the same computation where the test has one.
"""
from __future__ import annotations

import collections
from unittest import mock

import torch
import torch._inductor.config as inductor_config

from fusegraph import Backend, CompilationConfig, pipeline
from fusegraph.fusion import passes

ULP = {torch.bfloat16: 2.0 ** -8, torch.float16: 2.0 ** -11}


def compile_and_run(fn, *inputs, fullgraph=True, **cfg):
    """(backend, compiled output, eager output) of ``fn`` under the fusegraph backend, no grad.

    ``backend.all_ops`` counts the ops of every graph right after fusion (the pass manager's output, on
    both routes), of the compiles that made the result: a C++-wrapper compile that failed and was redone with the
    Python wrapper is not counted twice. Inductor's FX graph cache is off so the fusion pass always runs."""
    b = Backend(CompilationConfig(**cfg))
    b.all_ops = collections.Counter()
    fuse_graph = passes.fuse_graph
    compile_with = pipeline._compile_inductor_with

    def attempt(*args, **kwargs):
        before = collections.Counter(b.all_ops)
        try:
            return compile_with(*args, **kwargs)
        except BaseException:
            b.all_ops = before
            raise

    def recording_fuse_graph(gm_or_graph, *args, **kwargs):
        counts = fuse_graph(gm_or_graph, *args, **kwargs)
        graph = gm_or_graph.graph if isinstance(gm_or_graph, torch.fx.GraphModule) else gm_or_graph
        b.all_ops.update(str(n.target) for n in graph.nodes if n.op == "call_function")
        return counts

    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(fx_graph_cache=False), \
            mock.patch.object(passes, "fuse_graph", recording_fuse_graph), \
            mock.patch.object(pipeline, "_compile_inductor_with", attempt):
        out = torch.compile(fn, backend=b, fullgraph=fullgraph)(*inputs)
    with torch.no_grad():
        eager = fn(*inputs)
    return b, out, eager


def fused(b, op: str) -> int:
    """How many ``fusegraph.<op>`` calls the backend's graphs hold."""
    return b.all_ops[f"fusegraph.{op}.default"]


def assert_ops_gone(b, *ops: str) -> None:
    left = {op: b.all_ops[op] for op in ops if b.all_ops[op]}
    assert not left, f"unfused ops left in the graph: {left}"


def assert_matches(out, eager, *, scale: float = 1.0, ref64=None) -> None:
    """``out`` against eager (and against a float64 reference when given), same dtype and shape."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    eagers = eager if isinstance(eager, (tuple, list)) else (eager,)
    refs = ref64 if isinstance(ref64, (tuple, list)) else (ref64,) * len(outs)
    assert len(outs) == len(eagers)
    for o, e, r in zip(outs, eagers, refs):
        assert o.dtype == e.dtype and o.shape == e.shape, (o.dtype, e.dtype, o.shape, e.shape)
        assert not torch.isnan(o).any()
        tol = {} if o.dtype == torch.float32 else dict(rtol=1.6e-2 if o.dtype == torch.bfloat16 else 1e-3,
                                                      atol=2 * ULP[o.dtype] * scale)
        torch.testing.assert_close(o, e, **tol)
        if r is not None:
            torch.testing.assert_close(o, r.to(o.dtype), **tol)


def double(module_or_fn, *inputs):
    """The same computation in float64 (module copied to double): the reference of the exact math."""
    import copy

    if isinstance(module_or_fn, torch.nn.Module):
        module_or_fn = copy.deepcopy(module_or_fn).double()
    with torch.no_grad():
        return module_or_fn(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t
                              for t in inputs])
