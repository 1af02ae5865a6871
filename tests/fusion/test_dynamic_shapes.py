"""Fusion and capture with symbolic sizes (torch.compile(dynamic=True)): a site whose sizes the program spells two
ways fuses as in the static compile, and the graph route captures each new size by specializing the fused graph (no second fusion: the counts do not grow per capture).
Every output is compared with eager on fresh inputs of each size."""
from __future__ import annotations

import pytest
import torch
from diffusers.models.embeddings import apply_rotary_emb

from fusegraph import Backend, CompilationConfig
from fusegraph.fusion.patterns._trace import canonical_symbols

HEADS, DIM = 3, 16


class Rope(torch.nn.Module):
    """Flux 2's attention shape: q of the text and image tokens concatenated (the sequence length is the sum of two
    symbols), heads from a projection (static head dim), diffusers' interleaved RoPE."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(8, HEADS * DIM)

    def forward(self, txt, img, cos, sin):
        q = torch.cat([self.proj(txt), self.proj(img)], 1).unflatten(-1, (HEADS, DIM))
        return apply_rotary_emb(q, (cos, sin), sequence_dim=1)


def _inputs(n_txt, n_img, seed):
    g = torch.Generator().manual_seed(seed)
    s = n_txt + n_img
    return (torch.randn(2, n_txt, 8, generator=g, dtype=torch.float64).float(),
            torch.randn(2, n_img, 8, generator=g, dtype=torch.float64).float(),
            torch.randn(s, DIM, generator=g, dtype=torch.float64).float(),
            torch.randn(s, DIM, generator=g, dtype=torch.float64).float())


SIZES = ((4, 6), (4, 10), (5, 12))


def _run(model, route: dict):
    backend = Backend(CompilationConfig(**route))
    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for i, (t, s) in enumerate(SIZES):
            args = _inputs(t, s, seed=i)
            torch.testing.assert_close(compiled(*args), model(*args), rtol=1e-5, atol=1e-5)
    torch._dynamo.reset()
    return backend.stats


@pytest.mark.parametrize("route", [dict(inductor=False), dict(graph_with_compile=True)], ids=["aten", "graph"])
def test_rope_with_a_summed_sequence_length_fuses_under_dynamic_shapes(route):
    stats = _run(Rope(), route)
    assert stats.patterns["rope"] == 1, dict(stats.patterns)  # one compile, one site (not one per capture)
    assert stats.graphs_compiled == 1
    if route.get("graph_with_compile"):
        assert stats.graphs_captured == len(SIZES) and stats.eager_calls == 0, dict(stats.fallbacks)


def test_canonical_symbols_keeps_one_node_per_value():
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(a, b):
        x = torch.cat([a, b], 0)
        return x.view(x.shape[0], -1) + x.reshape(a.shape[0] + b.shape[0], -1)

    gm = make_fx(f, tracing_mode="symbolic")(torch.randn(3, 4), torch.randn(5, 4))
    before = len(gm.graph.nodes)
    replaced = canonical_symbols(gm.graph)
    gm.recompile()
    assert replaced >= 1 and len(gm.graph.nodes) < before
    a, b = torch.randn(2, 4), torch.randn(7, 4)
    torch.testing.assert_close(gm(a, b), f(a, b))


class ModulatedRMSNorms(torch.nn.Module):
    """diffusers RMSNorms (eps a Python float attribute): a plain one, one modulated without a shift (Mochi's
    MochiRMSNormZero), one with a shift (LTX's)."""

    def __init__(self):
        super().__init__()
        from diffusers.models.normalization import RMSNorm

        self.plain, self.noshift, self.shift = (RMSNorm(DIM, 1e-6, elementwise_affine=False) for _ in range(3))

    def forward(self, x, scale, shift):
        return self.plain(x), self.noshift(x) * (1 + scale), self.shift(x) * (1 + scale) + shift


def test_norms_with_a_run_time_eps_fuse_as_static_ones():
    """Under dynamic=True each RMSNorm's eps is a 0-d tensor input: the norms and their modulations fuse as they do
    static (the plain norm as rms_norm, the modulated ones as the two modulation families, which compute their
    norm), on the ``eps_tensor`` overloads, and equal eager; a changed eps is read at the next call, with no
    recompile. With the rms_norm family off, explain reports what it reports static."""
    from fusegraph import CompilationConfig, explain
    from fusegraph.config import FusionPatterns

    model = ModulatedRMSNorms()
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(2, 5, DIM, generator=g), torch.randn(2, 1, DIM, generator=g),
            torch.randn(2, 1, DIM, generator=g)]
    counts = explain(model, *args).counts()
    assert (counts["rms_norm"]["fused"], counts["adaln_noshift"]["fused"], counts["adaln_rms"]["fused"]) == (1, 1, 1)
    report = explain(model, *args, dynamic=True)
    counts = {f: (c["fused"], c["unfused"]) for f, c in report.counts().items() if c["fused"] or c["unfused"]}
    assert counts == {"rms_norm": (1, 0), "adaln_noshift": (1, 0), "adaln_rms": (1, 0)}, report.table()

    torch._dynamo.reset()
    backend = Backend(CompilationConfig(inductor=False))
    compiled = torch.compile(model, backend=backend, dynamic=True)
    with torch.no_grad():
        for n in (5, 9):
            call = [torch.randn(2, n, DIM, generator=g), *args[1:]]
            for got, want in zip(compiled(*call), model(*call)):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        fused = dict(backend.stats.patterns)  # one graph (the norms fused, then two of them into modulations)
        assert (fused["rms_norm"], fused["adaln_noshift"], fused["adaln_rms"]) == (3, 1, 1)
        for norm in (model.plain, model.noshift, model.shift):
            norm.eps = 0.5  # a Python float Dynamo passes as an input: read at this call, no recompile
        for got, want in zip(compiled(*call), model(*call)):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
        assert dict(backend.stats.patterns) == fused
    torch._dynamo.reset()

    off = CompilationConfig(fusion_patterns=FusionPatterns(enable_rms_norm=False))
    static, dynamic = explain(model, *args, config=off), explain(model, *args, config=off, dynamic=True)
    assert dynamic.counts() == static.counts(), dynamic.table()
