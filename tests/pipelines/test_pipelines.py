"""Whole diffusers pipelines, as users run them: ``pipe.transformer = torch.compile(pipe.transformer,
backend=...)`` (or ``pipe.transformer.compile_repeated_blocks(backend=...)``), then full denoising loops of 4 steps
with a seeded generator. The decoded image equals the eager pipeline's (fp32, 1e-4), a second pipeline call gives
bitwise the same image, and the compiles and captures are counted: as many graphs as Dynamo hands a backend
(counted beforehand with a counting backend that compiles nothing), each captured once on the graph routes, and
nothing compiled or captured again on the second call.

The fast tier (``make test``) runs FluxPipeline on the default and graph_with_compile routes, SD3 on the aten route
and WanPipeline with regional compilation;
``make test-pipelines`` runs the three pipelines on every route."""
import pytest
import torch
from torch._dynamo.testing import CompileCounter

import fusegraph
from tests.pipelines.tiny import PIPELINES

ROUTES = {
    "default": ({}, "whole"),                                        # fusion + Inductor
    "graph_with_compile": (dict(graph_with_compile=True), "whole"),  # + a captured host graph
    "aten": (dict(inductor=False), "whole"),                         # fused aten ops, run as they are
    "regional": ({}, "regional"),                                    # compile_repeated_blocks(backend=...)
    # regional on the graph route: the instances of a block class share one graph and one capture
    "regional_graph": (dict(graph_with_compile=True), "regional"),
}
FAST = {("flux", "default"), ("flux", "graph_with_compile"), ("sd3", "aten"), ("wan", "regional")}
CASES = [pytest.param(name, route, marks=() if (name, route) in FAST else pytest.mark.pipelines_full)
         for name in PIPELINES for route in ROUTES]


def _compile(tiny, form: str, backend) -> None:
    if form == "whole":
        tiny.pipe.transformer = torch.compile(tiny.pipe.transformer, backend=backend)
    else:
        transformer = tiny.pipe.transformer
        if not getattr(transformer, "_repeated_blocks", None):  # SD3Transformer2DModel names none (diffusers 0.42)
            transformer._repeated_blocks = ("JointTransformerBlock",)
        transformer.compile_repeated_blocks(backend=backend)


def _dynamo_graphs(name: str, form: str) -> int:
    """How many graphs Dynamo hands a backend during one pipeline call (a counting backend: no compile)."""
    tiny = PIPELINES[name]()
    counter = CompileCounter()
    _compile(tiny, form, counter)
    tiny()
    torch._dynamo.reset()
    assert counter.frame_count > 0, "the counting compile saw no graph"
    return counter.frame_count


def _counts(backend) -> dict:
    st = backend.stats
    return dict(graphs_compiled=st.graphs_compiled, frozen_recompiles=st.frozen_recompiles,
                graphs_captured=st.graphs_captured, fallbacks=sum(st.fallbacks.values()))


@pytest.mark.parametrize("name, route", CASES)
def test_pipeline_equals_eager(name, route):
    config, form = ROUTES[route]
    graphs = _dynamo_graphs(name, form)
    tiny = PIPELINES[name]()
    want = tiny()
    assert torch.equal(tiny(), want), "the eager pipeline is not deterministic: the comparison would be meaningless"
    other = tiny(prompt_embeds=tiny.kwargs["prompt_embeds"] + 0.5)
    assert (other - want).abs().max() > 1e-3, "the prompt does not reach the image: the comparison would be trivial"

    backend = fusegraph.Backend(fusegraph.CompilationConfig(**config))
    _compile(tiny, form, backend)
    got = tiny()
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda s: f"{name} [{route}], call 1: {s}")
    first = _counts(backend)
    graph_route = config.get("graph_with_compile", False)
    assert first["graphs_compiled"] == graphs, f"Dynamo handed over {graphs} graphs: {first}"
    # off the graph routes no capture; on them one per graph and input signature: exactly one per graph for the
    # whole transformer (one signature per pipeline call), at least one for blocks (a block class's graph may
    # meet the instances' inputs in more than one layout)
    if not graph_route:
        assert first["graphs_captured"] == 0, first
    elif form == "whole":
        assert first["graphs_captured"] == graphs, first
    else:
        assert first["graphs_captured"] >= graphs, first
    assert first["fallbacks"] == 0, backend.stats.fallbacks
    replays = backend.stats.replays

    again = tiny()
    assert torch.equal(again, got), f"{name} [{route}]: the second pipeline call differs from the first"
    assert _counts(backend) == first, f"the second pipeline call compiled or captured again: {first} -> " \
                                      f"{_counts(backend)}"
    if graph_route:
        assert backend.stats.replays - replays >= tiny.steps, "the second call did not replay the captured graphs"
