"""Resolutions that change between requests: a compiled tiny Flux and Wan transformer called at three latent sizes
and back to the first. Every result equals eager's (fp32, 1e-4); the number of compiles is plain Inductor's for
the same calls (counted on a ``torch.compile(backend="inductor")`` of the same model), under Dynamo's automatic
dynamic shapes (the default: the first size specialised, the second compiles one dynamic graph that serves the
rest), ``dynamic=True`` and ``mark_dynamic``; the graph routes capture once per size and hold at most
``graph_max_entries`` graphs per compiled graph. Last, the seeds' padding recipe for variable lengths (pad to
``max_len``, slice the output) on the graph route: one capture serves every length.

The fast tier (``make test``) runs the padding recipe; ``make test-pipelines`` runs the rest (each size case
compiles plain Inductor as well, for its compile count: about a minute each)."""
import functools

import pytest
import torch
from torch._dynamo.testing import CompileCounterWithBackend

import fusegraph
from fusegraph import zoo

# (name, latent sizes in the model's own terms, first size again last)
SIZES = {
    "FluxTransformer2DModel": [(4, 4), (6, 6), (8, 6), (4, 4)],      # (h, w) of the packed latent: h*w tokens
    "WanTransformer3DModel": [(8, 8), (12, 8), (16, 16), (8, 8)],   # (H, W) of the latent video, 2x2 patches
}
MODES = ["automatic", "dynamic", "mark_dynamic"]
FAST = set()  # every case compiles plain Inductor too (the reference count): all in the full tier


def _inputs(name: str, size, seed: int) -> dict:
    """Forward kwargs of the zoo model at latent ``size``, batch 1, fresh random values per seed."""
    g = torch.Generator().manual_seed(seed)
    if name == "FluxTransformer2DModel":
        h, w = size
        return dict(hidden_states=torch.randn(1, h * w, 4, generator=g),
                    encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
                    pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.rand(1, generator=g),
                    img_ids=zoo._grid_ids(h, w), txt_ids=torch.zeros(8, 3))
    h, w = size
    return dict(hidden_states=torch.randn(1, 4, 2, h, w, generator=g),
                encoder_hidden_states=torch.randn(1, 12, 16, generator=g),
                timestep=torch.rand(1, generator=g) * 1000)


def _mark(name: str, kwargs: dict) -> dict:
    """``mark_dynamic`` on the dims the resolution changes."""
    if name == "FluxTransformer2DModel":
        torch._dynamo.mark_dynamic(kwargs["hidden_states"], 1)
        torch._dynamo.mark_dynamic(kwargs["img_ids"], 0)
    else:
        torch._dynamo.mark_dynamic(kwargs["hidden_states"], 3)
        torch._dynamo.mark_dynamic(kwargs["hidden_states"], 4)
    return kwargs


@functools.lru_cache(maxsize=None)
def _model(name: str):
    return zoo.build(name)[0]


def _run(name: str, mode: str, backend, rounds: int = 1, after_round=None) -> list:
    """Calls a fresh torch.compile of the model at every size, ``rounds`` times over, ``after_round()`` after each
    round; returns [(compiled output, eager output)] of every call."""
    torch._dynamo.reset()
    model = _model(name)
    fn = torch.compile(model, backend=backend, dynamic=True if mode == "dynamic" else None)
    results = []
    with torch.no_grad():
        for r in range(rounds):
            for i, size in enumerate(SIZES[name]):
                kwargs = _inputs(name, size, seed=10 * r + i)
                if mode == "mark_dynamic":
                    kwargs = _mark(name, kwargs)
                results.append((fn(**kwargs)[0], model(**kwargs)[0]))
            if after_round is not None:
                after_round()
    return results


@functools.lru_cache(maxsize=None)
def _inductor_compiles(name: str, mode: str) -> int:
    counter = CompileCounterWithBackend("inductor")
    for got, want in _run(name, mode, counter):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    return counter.frame_count


def _cases(routes):
    return [pytest.param(name, mode, route, marks=() if (name, mode, route) in FAST else pytest.mark.pipelines_full)
            for name in SIZES for mode in MODES for route in routes]


@pytest.mark.parametrize("name, mode, route", _cases(["default", "graph_with_compile"]))
def test_resolutions(name, mode, route):
    """The sizes, then the same sizes twice again: every result exact; at most plain Inductor's compiles; on the
    graph route a capture for each size a compiled graph meets — at least one per size, at most one per size and
    graph, none evicted — and once every graph has met its sizes, calls only replay. (Dynamo tries the most
    recent graph first, so the second round may still bring a graph compiled late in the first a size it has
    not met; the third round captures nothing.)"""
    config = dict(graph_with_compile=True) if route == "graph_with_compile" else {}
    backend = fusegraph.Backend(fusegraph.CompilationConfig(**config))
    st = backend.stats
    counts = []
    sizes = SIZES[name]
    rounds = _run(name, mode, backend, rounds=3,
                  after_round=lambda: counts.append((st.graphs_compiled, st.graphs_captured, st.replays)))
    for i, (got, want) in enumerate(rounds):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4,
                                   msg=lambda s: f"{name} [{mode}, {route}] at {sizes[i % len(sizes)]}: {s}")
    assert counts[0][0] == counts[2][0], f"the later rounds compiled again: {counts}"
    assert counts[2][1] == counts[1][1], f"the third round captured again: {counts}"
    inductor = _inductor_compiles(name, mode)
    assert 1 <= st.graphs_compiled <= inductor, f"{st.graphs_compiled} compiles where plain Inductor has {inductor}"
    if route == "graph_with_compile":
        assert len(set(sizes)) <= st.graphs_captured <= st.graphs_compiled * len(set(sizes)), counts
        assert st.evictions == 0
        assert counts[2][2] - counts[1][2] == len(sizes), f"the third round did not replay every call: {counts}"
    else:
        assert st.graphs_captured == 0
    assert not st.fallbacks, st.fallbacks


@pytest.mark.pipelines_full
def test_graph_max_entries_bounds_the_captures_per_graph():
    """Flux under ``dynamic=True``: one compiled graph serves every size; with ``graph_max_entries=2`` it holds at
    most two captured graphs, the oldest evicted (and captured again when its size returns), every result exact.
    (Wan under ``dynamic=True`` compiles twice, as plain Inductor does, which would blur the count.)"""
    name = "FluxTransformer2DModel"
    backend = fusegraph.Backend(fusegraph.CompilationConfig(graph_with_compile=True, graph_max_entries=2))
    for got, want in _run(name, "dynamic", backend):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    st = backend.stats
    assert st.graphs_compiled == 1
    # sizes A B C A: A, B captured; C evicts A; A evicts B and is captured again
    assert (st.graphs_captured, st.evictions) == (4, 2), (st.graphs_captured, st.evictions)
    assert not st.fallbacks, st.fallbacks


class TokenMLP(torch.nn.Module):
    """A per-token block (RMSNorm, tanh-GELU MLP, gated residual): rows are independent, so padded rows change
    nothing in the real ones — the condition of the padding recipe."""

    def __init__(self, dim=32):
        super().__init__()
        self.norm = torch.nn.RMSNorm(dim, eps=1e-6)
        self.up, self.down = torch.nn.Linear(dim, 4 * dim), torch.nn.Linear(4 * dim, dim)
        self.gate = torch.nn.Parameter(torch.rand(dim))

    def forward(self, x):
        h = self.down(torch.nn.functional.gelu(self.up(self.norm(x)), approximate="tanh"))
        return x + self.gate * h


def test_padding_recipe_for_variable_lengths():
    """The seeds' recipe: capture once at ``max_len``, then pad every chunk to ``max_len`` and slice the output —
    one capture, every later call a replay, each result equal to eager's on the unpadded chunk."""
    torch._dynamo.reset()
    model, max_len = TokenMLP().eval(), 16
    with torch.no_grad():
        torch.nn.init.uniform_(model.norm.weight, 0.5, 1.5)
    backend = fusegraph.Backend(fusegraph.CompilationConfig(graph_with_compile=True))
    compiled = torch.compile(model, backend=backend)
    with torch.no_grad():
        compiled(torch.randn(max_len, 32))  # triggers the capture
        replays = backend.stats.replays
        for length in (3, 16, 9, 1, 11):
            chunk = torch.randn(length, 32)
            padded = torch.nn.functional.pad(chunk, (0, 0, 0, max_len - length))
            torch.testing.assert_close(compiled(padded)[:length], model(chunk), rtol=1e-5, atol=1e-5)
    st = backend.stats
    assert (st.graphs_compiled, st.graphs_captured) == (1, 1)
    assert st.replays - replays == 5
    assert st.patterns["rms_norm"] == 1 and st.patterns["gelu"] == 1
