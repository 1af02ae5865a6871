"""LoRA workflows on a compiled tiny diffusers FluxTransformer2DModel give eager's results after every step.

Parameters are graph inputs on every route, read where they live (the graph route captures them in place), so a
LoRA merged into the base weights in place — by hand (``w.data += B @ A * scale``) or by peft's hotswap
(``.data.copy_`` of the LoRA factors) — is read by the next call with no compile and no capture of any kind.
Workflows that change the module structure (adding, activating, fusing, deleting adapters) make Dynamo re-compile;
their results are asserted and what each step costs is printed (``pytest -s``); docs/GUIDE.md §2.3 tabulates them.
The hotswap is also run as diffusers' own hotswap tests compile it: ``mode="reduce-overhead"`` (the graph route),
``error_on_recompile``, ranks that differ, ``dynamic=True`` over three latent grids. The fast tier (``make test``)
runs the in-place steps on the graph route, one static hotswap under ``reduce-overhead`` and the safe fuse;
``make test-pipelines`` the adapter workflow and every route.

Every check calls the compiled model and the same model eagerly, at that moment, on fresh random inputs, twice (a
first call after the step and a later one). The LoRA factors are
randomized (peft initialises B to zero, which would make every check pass trivially), and each step asserts that
the model's output really changed.

``test_safe_fuse_after_a_reweighting``: a Dynamo graph with an unspecialized float input (peft's ``scaling`` once
``set_adapters`` changed it, read with ``.item()``) whose weights ``fuse_lora(safe_fusing=True)`` replaced: the
replaced weights are the next call's inputs.
"""
import itertools

import pytest
import torch

import fusegraph
from fusegraph import zoo

peft = pytest.importorskip("peft")
diffusers = pytest.importorskip("diffusers")

ROUTES = {
    "default": {},
    "aten": dict(inductor=False),
    "graph_with_compile": dict(graph_with_compile=True),  # fusion, then a captured graph (the host driver on CPU)
}
NAME = "FluxTransformer2DModel"
TARGETS = ["to_q", "to_k", "to_v", "to_out.0"]
RANK = 4


@pytest.fixture(autouse=True)
def _dynamo_never_falls_back_to_eager():
    """A silent fall back to eager (Dynamo's recompile limit) would make every comparison pass: it raises instead."""
    with torch._dynamo.config.patch(recompile_limit=32, fail_on_recompile_limit_hit=True):
        yield


def _flux():
    """The zoo's FluxTransformer2DModel with one block of each kind (the zoo's has two: twice the compile time)."""
    diffusers.utils.logging.set_verbosity_error()
    init = dict(zoo._SPECS[NAME][1], num_layers=1, num_single_layers=1)
    torch.manual_seed(0)
    model = diffusers.FluxTransformer2DModel(**init)
    zoo.randomize_weights(model)
    return model.eval().float()


def _projections(model):
    """{name: nn.Linear} of the attention projections LoRA targets (also inside peft's wrappers)."""
    out = {}
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear) and any(name.endswith("." + t) for t in TARGETS):
            out[name] = m
        elif isinstance(m, torch.nn.Linear) and any(name.endswith("." + t + ".base_layer") for t in TARGETS):
            out[name.removesuffix(".base_layer")] = m
    assert len(out) == 7, sorted(out)  # q/k/v/out of the double block, q/k/v of the single block
    return out


def _lora_state_dict(model, seed, rank=RANK):
    """A peft-format LoRA state dict for every targeted projection (diffusers' ``load_lora_adapter(prefix=None)``
    keys: ``transformer_blocks.0.attn.to_q.lora_A.weight``), random A and B."""
    g = torch.Generator().manual_seed(seed)
    sd = {}
    for name, lin in _projections(model).items():
        sd[f"{name}.lora_A.weight"] = 0.1 * torch.randn(rank, lin.in_features, generator=g)
        sd[f"{name}.lora_B.weight"] = 0.1 * torch.randn(lin.out_features, rank, generator=g)
    return sd


@torch.no_grad()
def _randomize_lora(model, adapter, seed):
    """peft initialises lora_B to zero (a no-op adapter): fill adapter's A and B with small random values."""
    g = torch.Generator().manual_seed(seed)
    n = 0
    for name, p in model.named_parameters():
        if ("lora_A" in name or "lora_B" in name) and f".{adapter}." in name:
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
            n += 1
    assert n == 2 * 7, n


class Compiled:
    """One model, its compiled function and backend; ``check`` compares the two on fresh inputs."""

    def __init__(self, model, route):
        self.model = model
        self.backend = fusegraph.Backend(fusegraph.CompilationConfig(**ROUTES[route]))
        self.fn = torch.compile(model, backend=self.backend)
        self.seeds = itertools.count(1)
        self.fixed = zoo.inputs(NAME, seed=0)  # the inputs ``output`` is taken on
        self.costs = []

    def counters(self):
        """(graphs_compiled, frozen_recompiles, graphs_captured)."""
        st = self.backend.stats
        return st.graphs_compiled, st.frozen_recompiles, st.graphs_captured

    @torch.no_grad()
    def check(self, what):
        for call in ("", ", a second call"):
            kwargs = zoo.inputs(NAME, seed=next(self.seeds))
            got = self.fn(**kwargs)[0]
            want = self.model(**kwargs)[0]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda s: f"after {what}{call}: {s}")

    @torch.no_grad()
    def output(self):
        """The compiled model's output on the fixed inputs (checked against eager's)."""
        got = self.fn(**self.fixed)[0]
        torch.testing.assert_close(got, self.model(**self.fixed)[0], rtol=1e-4, atol=1e-4)
        return got

    def step(self, what, edit):
        """Runs ``edit``, checks, and returns the deltas of ``counters()`` (recorded in costs)."""
        before = self.counters()
        with torch.no_grad():
            edit()
        self.check(what)
        delta = tuple(a - b for a, b in zip(self.counters(), before))
        self.costs.append((what, delta))
        return delta

    def report(self, title):
        st = self.backend.stats
        print(f"\n{title}: route {self.backend.last_route}, {st.graphs_captured} graphs captured, {st.replays} "
              f"replays; per step:")
        for what, delta in self.costs:
            print(f"  {what:55s} +{delta[0]} graphs compiled, +{delta[1]} frozen re-compiles, "
                  f"+{delta[2]} graphs captured")


def _differs(a, b, what):
    assert (a - b).abs().max() > 1e-2, f"{what} did not change the model's output: the check would be trivial"


def _hand_merge(model, factors, sign):
    """peft's merge arithmetic by hand, in place on the base weights: ``W += sign * (B @ A) * scale``."""
    for name, lin in _projections(model).items():
        a, b, scale = factors[name]
        lin.weight.data += sign * (b @ a) * scale


def _random_factors(model, seed, rank=RANK, alpha=RANK):
    g = torch.Generator().manual_seed(seed)
    return {name: (0.1 * torch.randn(rank, lin.in_features, generator=g),
                   0.1 * torch.randn(lin.out_features, rank, generator=g), alpha / rank)
            for name, lin in _projections(model).items()}


def _tiered(routes, fast):
    """``routes`` as parameters, all but ``fast`` in the full tier (``make test-pipelines``)."""
    return [pytest.param(r, marks=() if r == fast else pytest.mark.pipelines_full) for r in routes]


@pytest.mark.parametrize("route", _tiered(ROUTES, fast="graph_with_compile"))
def test_hand_merged_lora_is_read_without_a_recompile(route):
    """Step 5: a LoRA merged by hand into the base weights (``lin.weight.data += B @ A * scale``), another one on
    top, and the undo of both (``-=``): each read by the next call, with no compile of any kind (no Dynamo
    re-compile, no re-freeze); the undo gives the base model's output back."""
    model = _flux()
    c = Compiled(model, route)
    c.check("compile")
    base = c.output()
    compiled_before = c.counters()
    first, second = _random_factors(model, 1), _random_factors(model, 2, rank=8, alpha=4)

    c.step("hand merge of LoRA 1 (W += B @ A * scale)", lambda: _hand_merge(model, first, +1))
    merged = c.output()
    _differs(merged, base, "the hand-merged LoRA")
    c.step("hand merge of LoRA 2 on top", lambda: _hand_merge(model, second, +1))
    _differs(c.output(), merged, "the second hand-merged LoRA")
    c.step("undo of LoRA 1 (W -= B @ A * scale)", lambda: _hand_merge(model, first, -1))
    c.step("undo of LoRA 2", lambda: _hand_merge(model, second, -1))
    torch.testing.assert_close(c.output(), base, rtol=1e-4, atol=1e-4, msg=lambda s: f"undo: not the base: {s}")
    c.report(f"hand-merged LoRA [{route}]")
    assert c.counters() == compiled_before, \
        f"an in-place LoRA merge was re-compiled: (graphs, frozen, captured) {compiled_before} -> {c.counters()}"


@pytest.mark.parametrize("route", _tiered(ROUTES, fast="graph_with_compile"))
def test_lora_hotswap_is_read_without_a_recompile(route):
    """Step 6: ``enable_lora_hotswap(target_rank=8)`` before the first adapter, adapter "a" loaded from a state dict,
    compiled; then another state dict hot-swapped into "a" (peft copies it into the padded LoRA factors in place),
    and one of the full target rank with another alpha (its scaling tensor filled in place): each equals eager,
    with no Dynamo re-compile and no re-freeze."""
    model = _flux()
    model.enable_lora_hotswap(target_rank=8)
    model.load_lora_adapter(_lora_state_dict(model, 1), adapter_name="a", prefix=None)
    c = Compiled(model, route)
    c.check("compile with adapter a (padded to rank 8)")
    loaded = c.output()
    compiled_before = c.counters()

    c.step("hotswap of another rank-4 state dict into a",
           lambda: model.load_lora_adapter(_lora_state_dict(model, 2), adapter_name="a", prefix=None, hotswap=True))
    swapped = c.output()
    _differs(swapped, loaded, "the hotswap")
    # rank 8 (the padded rank: the shapes match) with lora_alpha 4: scaling 0.5, written into its tensor in place
    metadata = dict(r=8, lora_alpha=4, target_modules=sorted(_projections(model)))
    c.step("hotswap of a rank-8 state dict, alpha 4, into a",
           lambda: model.load_lora_adapter(_lora_state_dict(model, 3, rank=8), adapter_name="a", prefix=None,
                                           hotswap=True, metadata=metadata))
    _differs(c.output(), swapped, "the rank-8 hotswap")
    c.report(f"LoRA hotswap [{route}]")
    assert c.counters() == compiled_before, \
        f"a LoRA hotswap was re-compiled: (graphs, frozen, captured) {compiled_before} -> {c.counters()}"


@pytest.mark.parametrize("route", _tiered(["default", "aten"], fast=None))
def test_lora_adapter_workflow(route):
    """Steps 1-4 on one compiled model: an adapter added after the first compiled call (``add_adapter``), a second
    one loaded from a state dict (``load_lora_adapter``), both weighted (``set_adapters``), one alone,
    ``fuse_lora`` (peft's merge, in place) and ``unfuse_lora`` at scale 1 and 0.5, ``delete_adapters`` and
    ``unload_lora``: each equals eager, and unloading gives the base model's output back. The module structure
    changes: Dynamo re-compiles (asserted where it must); the costs are printed."""
    model = _flux()
    c = Compiled(model, route)
    c.check("compile")
    base = c.output()

    def add_a():
        model.add_adapter(peft.LoraConfig(r=RANK, lora_alpha=RANK, target_modules=TARGETS), adapter_name="a")
        _randomize_lora(model, "a", seed=1)

    graphs = c.step("1. add_adapter a (LoraConfig), after the first call", add_a)[0]
    assert graphs > 0, "a structural change was not compiled: the checks may have run eagerly"
    with_a = c.output()
    _differs(with_a, base, "adapter a")

    graphs = c.step("2. load_lora_adapter b (a state dict)",
                    lambda: model.load_lora_adapter(_lora_state_dict(model, 2), adapter_name="b", prefix=None))[0]
    assert graphs > 0
    c.step('2. set_adapters(["a", "b"], weights=[0.7, 0.3])', lambda: model.set_adapters(["a", "b"], [0.7, 0.3]))
    _differs(c.output(), with_a, "set_adapters([a, b], [0.7, 0.3])")
    c.step('2. set_adapters("a")', lambda: model.set_adapters("a"))
    torch.testing.assert_close(c.output(), with_a, rtol=1e-4, atol=1e-4)

    # peft's merge and unmerge write the base weights in place (``weight.data += delta``): read as they are
    in_place = [c.step("3. fuse_lora(lora_scale=1.0)", lambda: model.fuse_lora(lora_scale=1.0))]
    torch.testing.assert_close(c.output(), with_a, rtol=1e-4, atol=1e-4)
    in_place.append(c.step("3. unfuse_lora()", model.unfuse_lora))
    in_place.append(c.step("3. fuse_lora(lora_scale=0.5)", lambda: model.fuse_lora(lora_scale=0.5)))
    half = c.output()
    _differs(half, with_a, "fuse_lora(lora_scale=0.5)")
    in_place.append(c.step("3. unfuse_lora() (the scale stays 0.5)", model.unfuse_lora))
    torch.testing.assert_close(c.output(), half, rtol=1e-4, atol=1e-4)
    assert all(delta[1] == 0 for delta in in_place), f"an in-place merge was re-frozen: {c.costs}"

    c.step('4. delete_adapters("b")', lambda: model.delete_adapters("b"))
    c.step("4. unload_lora()", model.unload_lora)
    assert not any("lora" in n for n, _ in model.named_parameters())
    torch.testing.assert_close(c.output(), base, rtol=1e-4, atol=1e-4, msg=lambda s: f"unload: not the base: {s}")
    c.report(f"LoRA adapter workflow [{route}]")


def test_safe_fuse_after_a_reweighting():
    """``fuse_lora(safe_fusing=True)`` replaces each merged weight's ``.data``; after ``set_adapters`` changed an
    adapter's scale (Dynamo then passes the scale as an unspecialized float), ``unfuse_lora`` returns to a cached
    Dynamo graph whose weights were replaced: it reads them and gives eager's result."""
    model = _flux()
    model.add_adapter(peft.LoraConfig(r=RANK, lora_alpha=RANK, target_modules=TARGETS), adapter_name="a")
    _randomize_lora(model, "a", seed=1)
    c = Compiled(model, "aten")
    c.check("compile")
    c.step('set_adapters("a", 0.7)', lambda: model.set_adapters("a", 0.7))
    c.step("fuse_lora(safe_fusing=True)", lambda: model.fuse_lora(safe_fusing=True))
    c.step("unfuse_lora()", model.unfuse_lora)


# --- hotswap as diffusers' own hotswap tests compile: torch.compile(mode="reduce-overhead"[, dynamic=True]) ---------


def _flux_inputs(seed, h=4, w=4):
    """Forward kwargs of the tiny Flux at an ``h`` x ``w`` latent grid (``h * w`` image tokens)."""
    g = torch.Generator().manual_seed(30_000 + seed)
    grid = torch.meshgrid(torch.zeros(1), torch.arange(float(h)), torch.arange(float(w)), indexing="ij")
    ids = torch.stack(grid, -1)
    return dict(hidden_states=torch.randn(1, h * w, 4, generator=g),
                encoder_hidden_states=torch.randn(1, 8, 32, generator=g),
                pooled_projections=torch.randn(1, 32, generator=g), timestep=torch.rand(1, generator=g),
                img_ids=ids.reshape(h * w, 3).float(), txt_ids=torch.zeros(8, 3))


SHAPES = ((4, 4), (4, 8), (8, 8))  # diffusers' Flux hotswap tests' latent grids


@pytest.mark.parametrize("ranks, dynamic", [
    pytest.param((4, 4), False), pytest.param((3, 6), False, marks=pytest.mark.pipelines_full),
    pytest.param((6, 3), True, marks=pytest.mark.pipelines_full),
    pytest.param((4, 4), True, marks=pytest.mark.pipelines_full)])
def test_lora_hotswap_under_reduce_overhead(ranks, dynamic):
    """diffusers' hotswap workflow as its own tests run it, compiled by fusegraph: ``enable_lora_hotswap`` to the
    larger rank, adapter 0 loaded, ``torch.compile(model, backend=..., mode="reduce-overhead", dynamic=...)`` (the
    graph route), called (over three latent grids when dynamic), adapter 1 of another rank hot-swapped in, called
    again: eager's result every time, under ``error_on_recompile`` (a hotswap must not re-compile) — and after the
    swap no new capture either (the LoRA factors are parameters, captured where they live)."""
    rank0, rank1 = ranks
    model = _flux()
    model.enable_lora_hotswap(target_rank=max(ranks))
    model.load_lora_adapter(_lora_state_dict(model, 1, rank=rank0), adapter_name="adapter0", prefix=None)
    backend = fusegraph.Backend()
    compiled = torch.compile(model, backend=backend, mode="reduce-overhead", dynamic=dynamic)
    shapes = SHAPES if dynamic else SHAPES[:1]
    seeds = itertools.count()

    def check(what):
        outs = []
        for h, w in shapes:
            kwargs = _flux_inputs(next(seeds), h, w)
            got, want = compiled(**kwargs)[0], model(**kwargs)[0]
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4, msg=lambda s: f"{what} at {h}x{w}: {s}")
            outs.append((kwargs, want))
        return outs

    with torch._dynamo.config.patch(error_on_recompile=True), torch.inference_mode():
        before = check("adapter 0")
        assert backend.last_route == "graph_with_compile" and backend.stats.eager_calls == 0
        compiled_before = (backend.stats.graphs_compiled, backend.stats.graphs_captured)
        model.load_lora_adapter(_lora_state_dict(model, 2, rank=rank1), adapter_name="adapter0", prefix=None,
                                hotswap=True)
        check("adapter 1 hot-swapped in")
        for kwargs, old in before:
            _differs(model(**kwargs)[0], old, "the hotswap")
    assert (backend.stats.graphs_compiled, backend.stats.graphs_captured) == compiled_before, \
        "a hotswap compiled or captured again"


def test_hotswap_of_an_adapter_targeting_more_layers_is_peft_s_error():
    """PEFT refuses a hotswap whose adapter targets layers the loaded one does not (its RuntimeError, logged by
    diffusers) — on a model compiled with ``mode="reduce-overhead"`` too: the compile must not be what raises."""
    model = _flux()
    model.enable_lora_hotswap(target_rank=4)
    q_only = {k: v for k, v in _lora_state_dict(model, 1).items() if ".to_q." in k}
    model.load_lora_adapter(q_only, adapter_name="adapter0", prefix=None)
    compiled = torch.compile(model, backend="fusegraph", mode="reduce-overhead")
    with torch.inference_mode():
        kwargs = _flux_inputs(0)
        torch.testing.assert_close(compiled(**kwargs)[0], model(**kwargs)[0], rtol=1e-4, atol=1e-4)
    q_and_k = {k: v for k, v in _lora_state_dict(model, 2).items() if ".to_q." in k or ".to_k." in k}
    with pytest.raises(RuntimeError) as info:
        model.load_lora_adapter(q_and_k, adapter_name="adapter0", prefix=None, hotswap=True)
    assert not isinstance(info.value, torch._dynamo.exc.BackendCompilerFailed), info.value
