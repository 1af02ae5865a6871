"""Step caching with a compiled transformer: cache-dit's DBCache (``cache_dit.enable_cache(pipe,
cache_config=DBCacheConfig(...))``, pinned in requirements.txt) and diffusers' own First Block Cache
(``transformer.enable_cache(FirstBlockCacheConfig(...))``) on the tiny pipelines of ``tiny.py``, the transformer
compiled by fusegraph, full denoising loops of 8 steps with a seeded generator.

Both caches decide per transformer call, from a relative difference of the first block's residual against the
last computed step's, whether the remaining blocks run or their cached residual is reused. The decision is a
Python ``float`` compared with a threshold outside the compiled graphs (their ``torch.compiler.disable`` code), so
a compiled transformer must reproduce the eager differences closely enough to take the same decisions. What is
checked, per pipeline, cache and route, against the same cached pipeline run eagerly:

- the cache does something: in the eager run some calls are skipped and some computed, and the cached pipeline's
  latents differ from the uncached pipeline's by more than 1e-2 (100x the tolerance below), so equal images and
  equal skipped steps are not vacuous;
- the threshold is not on a knife's edge: every eager difference is at least ``MARGIN`` (1e-3) from it, while the
  compiled routes reproduce the differences to about 1e-6; a failure there means "pick another threshold", not a
  fusegraph bug;
- the compiled pipeline skips exactly the eager run's calls (the same steps, and on Wan the same CFG calls),
  with differences within 1e-4 of eager's;
- its decoded images and its latents equal eager's (fp32, rtol = atol = 1e-4, as ``test_pipelines.py``: the
  compiled transformer differs from eager by ~1e-6 per call, the decoded images in [0, 1]);
- fusegraph compiles exactly the graphs Dynamo hands it (Dynamo's own count, ``counters["stats"]["unique_graphs"]``:
  the caches' ``torch.compiler.disable`` helpers break the transformer into several graphs), captures each at least once on the graph route, and falls
  back nowhere;
- the second pipeline call (and a third, with ``output_type="latent"``) compiles nothing (no Dynamo frame is
  converted again: ``counters["frames"]``), captures nothing, skips the same calls and gives bitwise the first
  call's image; on the graph route it replays.

The fast tier (``make test``) runs FluxPipeline with DBCache on the graph route and with First Block Cache on the
default route; ``make test-pipelines`` every pipeline (Flux, SD3 with classifier-free guidance in one batch, Wan with
separate CFG calls) with each cache the pipeline takes (SD3Transformer2DModel has no ``enable_cache``) on the
default, graph and aten routes. ``pytest -s`` prints each case's decisions.
"""
from __future__ import annotations

import pytest
import torch
from torch._dynamo.utils import counters

import fusegraph
from tests.pipelines.tiny import PIPELINES

cache_dit = pytest.importorskip("cache_dit")
diffusers = pytest.importorskip("diffusers")
from diffusers.hooks import first_block_cache  # noqa: E402

_DECIDE = first_block_cache.FBCHeadBlockHook._should_compute_remaining_blocks  # the hook's own decision

STEPS = 8
MARGIN = 1e-3
ROUTES = {
    "default": {},                                       # fusion + Inductor
    "graph_with_compile": dict(graph_with_compile=True),  # + a captured host graph
    "aten": dict(inductor=False),                        # fused aten ops, run as they are
}
# The thresholds: each skips some calls and computes others on the tiny pipeline, with every difference at least
# MARGIN from it (asserted). DBCache: Fn_compute_blocks=1 (the first block decides), Bn_compute_blocks=1 where the
# transformer has blocks enough (Flux: 2 + 2, SD3: 2; Wan: 2, Bn 0), max_warmup_steps=2.
THRESHOLDS = {
    ("flux", "dbcache"): 0.4, ("flux", "fbc"): 0.5,
    ("sd3", "dbcache"): 0.5,
    ("wan", "dbcache"): 0.2, ("wan", "fbc"): 0.3,
}
BN = {"flux": 1, "sd3": 0, "wan": 0}
FAST = {("flux", "dbcache", "graph_with_compile"), ("flux", "fbc", "default")}
CASES = [pytest.param(name, cache, route, marks=() if (name, cache, route) in FAST else pytest.mark.pipelines_full,
                      id=f"{name}-{cache}-{route}")
         for (name, cache) in THRESHOLDS for route in ROUTES]


class DBCache:
    """cache-dit's Dual Block Cache on the whole pipeline; the decisions from ``cache_dit.summary``: per cached
    block list and CFG branch, each step's residual difference and whether it was cached."""

    def __init__(self, tiny, name: str, threshold: float):
        self.tiny, self.threshold = tiny, threshold
        config = cache_dit.DBCacheConfig(Fn_compute_blocks=1, Bn_compute_blocks=BN[name], max_warmup_steps=2,
                                         residual_diff_threshold=threshold)
        cache_dit.enable_cache(tiny.pipe, cache_config=config)

    def decisions(self) -> list[tuple]:
        """[(where, step, difference, skipped)] of the last pipeline call."""
        out = []
        for i, st in enumerate(cache_dit.summary(self.tiny.pipe, logging=False)):
            for branch, diffs, cached in (("", st.residual_diffs, st.cached_steps),
                                          ("cfg", st.cfg_residual_diffs, st.cfg_cached_steps)):
                out += [(f"{i}{branch}", int(step), diff, int(step) in cached) for step, diff in diffs.items()]
        return sorted(out)


class FirstBlockCache:
    """diffusers' First Block Cache (``transformer.enable_cache(FirstBlockCacheConfig(threshold))``). Its hook
    keeps no record, so its decision method is wrapped (still ``torch.compiler.disable``d: it runs eagerly under
    compile, as the original) to record each call's difference — the relative absmean change of the first
    block's residual, as the hook computes it — and whether the remaining blocks were skipped; that the recorded
    difference is the one the hook decided on is asserted (skipped == difference <= threshold)."""

    def __init__(self, tiny, name: str, threshold: float, monkeypatch):
        self.tiny, self.threshold, self.calls = tiny, threshold, []
        calls = self.calls

        @torch.compiler.disable
        def recording(hook, residual):
            state = hook.state_manager.get_state()
            prev, diff = state.head_block_residual, None
            if prev is not None:
                diff = ((residual - prev).abs().mean() / prev.abs().mean()).item()
            compute = _DECIDE(hook, residual)
            calls.append((hook.state_manager.context.name, diff, not compute))
            return compute

        monkeypatch.setattr(first_block_cache.FBCHeadBlockHook, "_should_compute_remaining_blocks", recording)
        tiny.transformer.enable_cache(diffusers.FirstBlockCacheConfig(threshold=threshold))

    def decisions(self) -> list[tuple]:
        """[(cache context, call, difference, skipped)] of the calls since the last ``decisions()``; the first call
        of a context has no difference (it always computes)."""
        out = [(ctx, i, diff, skipped) for i, (ctx, diff, skipped) in enumerate(self.calls) if diff is not None]
        assert len(out) == len(self.calls) - len({ctx for ctx, _, _ in self.calls})
        for ctx, i, diff, skipped in out:
            assert skipped == (diff <= self.threshold), (ctx, i, diff, skipped, self.threshold)
        self.calls.clear()
        return out


def _cached(name: str, cache: str, monkeypatch):
    tiny = PIPELINES[name]()
    tiny.steps = STEPS
    threshold = THRESHOLDS[name, cache]
    state = DBCache(tiny, name, threshold) if cache == "dbcache" else FirstBlockCache(tiny, name, threshold,
                                                                                         monkeypatch)
    return tiny, state


def _latents(tiny) -> torch.Tensor:
    return tiny(output_type="latent")


def _counts(backend) -> dict:
    st = backend.stats
    return dict(graphs_compiled=st.graphs_compiled, frozen_recompiles=st.frozen_recompiles,
                graphs_captured=st.graphs_captured, fallbacks=sum(st.fallbacks.values()),
                dynamo_frames=counters["frames"]["total"], dynamo_graphs=counters["stats"]["unique_graphs"])


def _show(decisions) -> str:
    return " ".join(f"{where}:{step}{'S' if skipped else 'C'}({diff:.3f})" for where, step, diff, skipped in decisions)


@pytest.mark.parametrize("name, cache, route", CASES)
def test_step_cache_equals_eager(name, cache, route, monkeypatch):
    plain = PIPELINES[name]()
    plain.steps = STEPS
    uncached = _latents(plain)
    del plain

    tiny, state = _cached(name, cache, monkeypatch)
    want = tiny()
    want_decisions = state.decisions()
    assert torch.equal(tiny(), want), "the eager cached pipeline is not deterministic"
    assert state.decisions() == want_decisions, "the eager cached pipeline skips other calls on a second run"
    want_latents = _latents(tiny)
    assert state.decisions() == want_decisions
    skipped = [d for d in want_decisions if d[3]]
    assert skipped and len(skipped) < len(want_decisions), \
        f"threshold {state.threshold} skips {len(skipped)} of {len(want_decisions)} calls: the check needs both"
    assert (want_latents - uncached).abs().max() > 1e-2, "the cache does not change the result: the check is trivial"
    edge = min(abs(diff - state.threshold) for _, _, diff, _ in want_decisions)
    assert edge >= MARGIN, f"a difference is {edge:.2g} from threshold {state.threshold}: pick another threshold " \
                           f"({_show(want_decisions)})"

    backend = fusegraph.Backend(fusegraph.CompilationConfig(**ROUTES[route]))
    before = _counts(backend)
    tiny.pipe.transformer = torch.compile(tiny.pipe.transformer, backend=backend)
    got = tiny()
    got_decisions = state.decisions()
    print(f"\n{name} {cache} [{route}], threshold {state.threshold}: {len(skipped)} of {len(want_decisions)} "
          f"decided calls skipped; eager {_show(want_decisions)}; compiled {_show(got_decisions)}")
    assert [(w, s, k) for w, s, _, k in got_decisions] == [(w, s, k) for w, s, _, k in want_decisions], \
        f"the compiled pipeline skips other calls: eager {_show(want_decisions)}, compiled {_show(got_decisions)}"
    torch.testing.assert_close(torch.tensor([d[2] for d in got_decisions]),
                               torch.tensor([d[2] for d in want_decisions]), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda s: f"{name} {cache} [{route}]: {s}")
    first = _counts(backend)
    graphs = first["dynamo_graphs"] - before["dynamo_graphs"]
    assert graphs > 0 and first["graphs_compiled"] == graphs, f"Dynamo compiled {graphs} graphs: {first}"
    if route == "graph_with_compile":
        assert first["graphs_captured"] >= graphs, first
    else:
        assert first["graphs_captured"] == 0, first
    assert first["fallbacks"] == 0, backend.stats.fallbacks
    replays = backend.stats.replays

    again = tiny()
    assert state.decisions() == got_decisions, "the second compiled call skips other calls"
    assert torch.equal(again, got), f"{name} {cache} [{route}]: the second pipeline call differs from the first"
    latents = _latents(tiny)
    assert state.decisions() == got_decisions
    torch.testing.assert_close(latents, want_latents, rtol=1e-4, atol=1e-4)
    assert _counts(backend) == first, f"a later pipeline call compiled or captured again: {first} -> " \
                                      f"{_counts(backend)}"
    if route == "graph_with_compile":
        assert backend.stats.replays - replays >= 2 * STEPS, "the later calls did not replay the captured graphs"
