"""One rank of the multi-process tests (launched by harness.run_ranks with torchrun's environment; gloo on CPU).

    python tests/distributed/worker.py SCENARIO [SCENARIO ...]

Each scenario checks on this rank and prints ``RESULT {"scenario": ..., ...}``; a failed check raises (the rank
exits non-zero). A faulthandler watchdog (FUSEGRAPH_WATCHDOG_S) dumps every thread's stack and exits on a hang.

References are the single-process model, run eagerly in this process on the same weights and the same fresh random
inputs (never zeros); the parallel model must match it within 1e-5 (fp32)."""
from __future__ import annotations

import faulthandler
import json
import os
import sys

faulthandler.dump_traceback_later(float(os.environ.get("FUSEGRAPH_WATCHDOG_S", "200")), exit=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import fusegraph  # noqa: E402
from fusegraph import Backend, CompilationConfig  # noqa: E402

TOL = 1e-5
ROUTES = {
    "default": {},                                   # fusion + Inductor
    "aten": {"inductor": False},                     # fusion, fused aten graph
    "graph_with_compile": {"graph_with_compile": True},  # fusion, then the host graph captured and replayed
    "graph_only": {"graph_only": True},              # the traced graph captured as is
}
# Fusion sites of a Flux model with one double and one single block (SPEC §3): double 4/2/4/2/4, single 2/2/1/1/1,
# plus norm_out's AdaLN
FLUX_SITES = {"rms_norm": 6, "rope": 4, "adaln": 6, "gelu": 3, "mul_add": 5}

RANK = int(os.environ.get("RANK", "0"))
SCENARIOS = {}


def scenario(fn):
    SCENARIOS[fn.__name__] = fn
    return fn


def check(cond, what):
    if not cond:
        raise AssertionError(f"rank {RANK}: {what}")


def max_diff(a, b) -> float:
    """max |a - b|, relative to the reference's magnitude where that exceeds 1 (a residual stream of random
    weights reaches tens: fp32 carries ~7 digits of it)."""
    if isinstance(a, (tuple, list)):
        return max(max_diff(x, y) for x, y in zip(a, b))
    return (a.double() - b.double()).abs().max().item() / max(1.0, b.double().abs().max().item())


def new_backend(route, **extra):
    return Backend(CompilationConfig(**ROUTES[route], **extra))


def check_route(backend, route, graphs: int, what: str, sites=None):
    """Every site fused (fusing routes), no fallback, and on the graph routes every compiled graph captured once
    (``graphs``: the count after the first call; later calls on fresh inputs of the same shapes only replay)."""
    s = backend.stats
    check(not s.fallbacks, f"{what} [{route}]: fallbacks {s.fallbacks}")
    if sites is not None and route != "graph_only":
        got = {k: s.patterns.get(k, 0) for k in sites}
        check(got == sites, f"{what} [{route}]: fused {got}, expected every site {sites}")
    if route.startswith("graph"):
        check(s.graphs_captured == graphs == s.graphs_compiled,
              f"{what} [{route}]: {s.graphs_captured} graphs captured, {graphs} after the first call, "
              f"{s.graphs_compiled} compiled")
        check(s.replays >= 2 * graphs, f"{what} [{route}]: {s.replays} replays")
    return {"patterns": {k: v for k, v in s.patterns.items() if v}, "captured": s.graphs_captured,
            "replays": s.replays, "fallbacks": dict(s.fallbacks)}


def allow_cpu_parallelism():
    """diffusers' ``enable_parallelism`` computes ``rank % torch.accelerator.device_count()``, which is 0 on a
    CPU-only machine (ZeroDivisionError). That is diffusers', not fusegraph's: the tests patch it here, in the test
    helper only, to 1 (every rank uses the CPU)."""
    if torch.accelerator.device_count() == 0:
        torch.accelerator.device_count = lambda: 1
    # diffusers 0.42.1's context-parallel hook calls ``logger.warning_once`` (not a method of logging.Logger) when an
    # input has other dims than its plan expects: Wan's plan expects a per-token [B, S] timestep, a Wan 2.1 [B]
    # timestep hits that line and raises AttributeError in eager mode too. Also diffusers', patched here only.
    import logging

    if not hasattr(logging.Logger, "warning_once"):
        logging.Logger.warning_once = logging.Logger.warning


# ----------------------------------------------------------------------------------------------------------------
# models


def tiny_flux(seed=0):
    import diffusers

    from fusegraph import zoo

    diffusers.utils.logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = diffusers.FluxTransformer2DModel(
        patch_size=1, in_channels=4, num_layers=1, num_single_layers=1, attention_head_dim=16,
        num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, axes_dims_rope=(4, 4, 8))
    zoo.randomize_weights(model, seed)
    return model.eval()


def flux_inputs(seed):
    from fusegraph import zoo

    g = torch.Generator().manual_seed(1000 + seed)
    b = 1
    return dict(hidden_states=torch.randn(b, 16, 4, generator=g), encoder_hidden_states=torch.randn(b, 8, 32, generator=g),
                pooled_projections=torch.randn(b, 32, generator=g), timestep=torch.rand(b, generator=g),
                img_ids=zoo._grid_ids(4, 4), txt_ids=torch.randn(8, 3, generator=g))


def tiny_wan(seed=0):
    import diffusers

    from fusegraph import zoo

    diffusers.utils.logging.set_verbosity_error()
    torch.manual_seed(seed)
    model = diffusers.WanTransformer3DModel(**dict(zoo._WAN, num_layers=1))
    zoo.randomize_weights(model, seed)
    return model.eval()


def wan_inputs(seed):
    g = torch.Generator().manual_seed(2000 + seed)
    return dict(hidden_states=torch.randn(1, 4, 2, 8, 8, generator=g),
                encoder_hidden_states=torch.randn(1, 12, 16, generator=g), timestep=torch.rand(1, generator=g) * 1000)


def run_context_parallel(make_model, make_inputs, what, routes, sites=None, ring=False):
    from diffusers import ContextParallelConfig

    allow_cpu_parallelism()
    reference_model = make_model()
    out = {}
    for route in routes:
        model = make_model()
        cfg = ContextParallelConfig(ring_degree=2) if ring else ContextParallelConfig(ulysses_degree=2)
        model.enable_parallelism(config=cfg)
        backend = new_backend(route)
        compiled = torch.compile(model, backend=backend)
        torch._dynamo.reset()
        diffs = []
        with torch.no_grad():
            for seed in range(3):  # capture (graph routes), then replays on fresh inputs
                inputs = make_inputs(seed)
                ref = reference_model(**inputs, return_dict=False)[0]
                got = compiled(**inputs, return_dict=False)[0]
                diffs.append(max_diff(got, ref))
                if seed == 0:
                    first = backend.stats.graphs_captured
        check(max(diffs) <= TOL, f"{what} [{route}]: max |parallel - single process| = {max(diffs):.3g} > {TOL}")
        out[route] = dict(check_route(backend, route, first, what, sites), max_diff=max(diffs))
    return out


@scenario
def cp_flux_ulysses():
    return run_context_parallel(tiny_flux, flux_inputs, "Flux Ulysses CP", list(ROUTES), FLUX_SITES)


@scenario
def cp_wan_ulysses():
    return run_context_parallel(tiny_wan, wan_inputs, "Wan Ulysses CP", ["default", "graph_with_compile"])


# ----------------------------------------------------------------------------------------------------------------
# DTensor tensor parallelism (parallelize_module, ColwiseParallel / RowwiseParallel); the DTensor parameters are inputs


def tp_mesh():
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (dist.get_world_size(),))


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)
        self.down = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.down(torch.nn.functional.gelu(self.up(x), approximate="tanh"))


def run_tensor_parallel(make_model, plan, make_inputs, what, sites, routes=tuple(ROUTES)):
    from torch.distributed.tensor.parallel import parallelize_module

    mesh = tp_mesh()
    reference = make_model()
    out = {}
    for route in routes:
        model = parallelize_module(make_model(), mesh, plan)
        backend = new_backend(route)
        compiled = torch.compile(model, backend=backend)
        diffs, eager = [], []
        with torch.no_grad():
            for seed in range(3):
                args = make_inputs(seed)
                diffs.append(max_diff(compiled(*args), reference(*args)))
                eager.append(max_diff(model(*args), reference(*args)))  # TP's own reordering, uncompiled
                if seed == 0:
                    first = backend.stats.graphs_captured
        check(max(diffs) <= TOL, f"{what} [{route}]: max |TP - single process| = {max(diffs):.3g} > {TOL} "
                                 f"(eager TP: {max(eager):.3g})")
        ops = backend.last_graph_ops
        if route != "default":  # the graph handed on: no weight folded (parameters stay inputs), collectives inside
            check(ops.get("get_attr", 0) == 0, f"{what} [{route}]: constants in the graph: {dict(ops)}")
        check(any("c10d_functional" in k for k in ops), f"{what} [{route}]: no collective in the graph {dict(ops)}")
        out[route] = dict(check_route(backend, route, first, what, sites), max_diff=max(diffs))
    return out


@scenario
def tp_mlp():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    def make():
        torch.manual_seed(0)
        return MLP().eval()

    def inputs(seed):
        return (torch.randn(4, 32, generator=torch.Generator().manual_seed(seed)),)

    return run_tensor_parallel(make, {"up": ColwiseParallel(), "down": RowwiseParallel()}, inputs, "TP MLP",
                               {"gelu": 1})


FLUX_BLOCK_TP_PLAN = ["attn.to_q", "attn.to_k", "attn.to_v", "attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj",
                      "ff.net.0.proj", "ff_context.net.0.proj"], ["attn.to_out.0", "attn.to_add_out", "ff.net.2",
                                                                   "ff_context.net.2"]


class _Block(torch.nn.Module):
    """A Flux double block (dim 32, 2 heads of 16) with its inputs' RoPE table as an argument."""

    def __init__(self):
        super().__init__()
        from diffusers.models.transformers.transformer_flux import FluxTransformerBlock

        from fusegraph import zoo

        torch.manual_seed(0)
        self.block = FluxTransformerBlock(dim=32, num_attention_heads=2, attention_head_dim=16)
        zoo.randomize_weights(self.block, 0)

    def forward(self, hidden, context, temb, cos, sin):
        context, hidden = self.block(hidden, context, temb, image_rotary_emb=(cos, sin))
        return hidden, context


def _block_inputs(seed):
    g = torch.Generator().manual_seed(300 + seed)
    angles = torch.randn(24, 8, generator=g)
    cos = torch.cos(angles).repeat_interleave(2, dim=1)
    sin = torch.sin(angles).repeat_interleave(2, dim=1)
    return (torch.randn(1, 16, 32, generator=g), torch.randn(1, 8, 32, generator=g), torch.randn(1, 32, generator=g),
            cos, sin)


@scenario
def tp_flux_block():
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel

    col, row = FLUX_BLOCK_TP_PLAN
    plan = {**{f"block.{k}": ColwiseParallel() for k in col}, **{f"block.{k}": RowwiseParallel() for k in row}}
    sites = {"rms_norm": 4, "rope": 2, "adaln": 4, "gelu": 2, "mul_add": 4}

    def make():
        return _Block().eval()

    return run_tensor_parallel(make, plan, _block_inputs, "TP Flux block", sites)


# ----------------------------------------------------------------------------------------------------------------
# the runtime's decisions in step; the GIL released around collectives


def _all_reduce_fn(x, w):
    """An aten-level function with a collective: (all_reduce(x @ w) over the default group, gelu of it)."""
    y = torch.ops._c10d_functional.all_reduce(x @ w, "sum", dist.group.WORLD.group_name)
    y = torch.ops._c10d_functional.wait_tensor(y)
    return y, torch.nn.functional.gelu(y, approximate="tanh") * 2 + x


def _expected(x, w):
    parts = [x @ w * (r + 1) for r in range(dist.get_world_size())]  # rank r passes (r + 1) * x
    y = sum(parts)
    return y, torch.nn.functional.gelu(y, approximate="tanh") * 2 + x * (RANK + 1)


@scenario
def replay_stress():
    """Replays with collectives inside, many times: through the GraphRunner (C++ cache call path), through
    HostGraph.run directly (the path that deadlocked with the GIL held), and a compiled model's graph route."""
    from fusegraph.graph.host import build_host_graph, trace_aten

    from fusegraph.graph import GraphRunner

    iterations = int(os.environ.get("FUSEGRAPH_STRESS_ITERATIONS", "40"))
    g = torch.Generator().manual_seed(7)
    w = torch.randn(16, 16, generator=g)
    runner = GraphRunner(_all_reduce_fn)
    gm = trace_aten(_all_reduce_fn, [torch.randn(8, 16), w])
    host = build_host_graph(gm)
    check(any("c10d" in str(n.target) for n in gm.graph.nodes), "the traced graph holds the collective")
    for i in range(iterations):
        x = torch.randn(8, 16, generator=g)
        mine = x * (RANK + 1)
        want = _expected(x, w)
        with torch.no_grad():
            for got in (runner(mine, w), host.run([mine, w])):
                for a, b in zip(got, want):
                    check(max_diff(a, b) <= 1e-4, f"replay {i}: max diff {max_diff(a, b)}")
    s = runner.stats
    check(s.graphs_captured == 1 and s.replays == iterations and not s.fallbacks,
          f"runner: captured {s.graphs_captured}, replays {s.replays}, fallbacks {s.fallbacks}")
    return {"iterations": iterations, "replays": s.replays}


@scenario
def signature_mismatch():
    """A rank whose input signature differs gets a clear error naming the ranks and signatures; no hang."""
    from fusegraph.graph import GraphRunner

    w = torch.randn(16, 16)
    runner = GraphRunner(_all_reduce_fn)
    with torch.no_grad():
        runner(torch.randn(8, 16), w)  # the same signature everywhere: captured
        rows = 8 if RANK == 0 else 4
        try:
            runner(torch.randn(rows, 16), w)
        except RuntimeError as e:
            msg = str(e)
        else:
            raise AssertionError(f"rank {RANK}: no error for different signatures")
    check("different input signatures" in msg and "Rank(s) [1]" in msg and "rank 0: " in msg and "rank 1: " in msg
          and "[4, 16]" in msg and "[8, 16]" in msg, f"unclear error: {msg}")
    # and through torch.compile's graph route (the compile-time capture)
    backend = new_backend("graph_with_compile")
    compiled = torch.compile(lambda x, w: _all_reduce_fn(x, w)[1], backend=backend, dynamic=False)
    with torch.no_grad():
        try:
            compiled(torch.randn(6 if RANK == 0 else 2, 16), w)
        except Exception as e:  # Dynamo wraps backend errors (BackendCompilerFailed)
            compiled_msg = str(e)
        else:
            raise AssertionError(f"rank {RANK}: no error from the compiled graph route")
    check("different input signatures" in compiled_msg and "Rank(s) [1]" in compiled_msg,
          f"unclear error: {compiled_msg[:2000]}")
    return {"message": msg.splitlines()[0][:300]}


@scenario
def capture_failure_in_step():
    """A capture that fails on one rank only (rank 1 here): every rank drops the capture and runs the signature
    eagerly, the reason names the rank; with graph_fallback='raise' every rank raises."""
    from fusegraph.graph import GraphRunner, drivers

    original = drivers.HostDriver.capture

    def failing(self, flat_fn, tensors, options, graph=None, **kwargs):
        # after the warm-up run (which ran the collectives on every rank), as an out-of-memory while instantiating
        # the graph would; a failure *while* collectives run is as fatal as in eager mode (docs/DESIGN.md)
        cap = original(self, flat_fn, tensors, options, graph, **kwargs)
        if RANK == 1:
            raise RuntimeError("injected capture failure on rank 1")
        return cap

    drivers.HostDriver.capture = failing
    try:
        g = torch.Generator().manual_seed(11)  # the same values on every rank (default generators differ)
        w = torch.randn(16, 16, generator=g)
        runner = GraphRunner(_all_reduce_fn)
        with torch.no_grad():
            for i in range(4):
                x = torch.randn(8, 16, generator=g)
                got = runner(x * (RANK + 1), w)
                for a, b in zip(got, _expected(x, w)):
                    check(max_diff(a, b) <= 1e-4, f"eager fallback {i}: wrong result {max_diff(a, b)} {a.shape} {b.shape}")
        s = runner.stats
        check(s.graphs_captured == 0 and s.replays == 0 and s.eager_calls == 4, f"rank {RANK}: {s}")
        reasons = list(s.fallbacks)
        check(any(("rank(s) [1]" in r) if RANK == 0 else ("injected" in r) for r in reasons), f"reasons {reasons}")
        strict = GraphRunner(_all_reduce_fn, CompilationConfig(graph_fallback="raise"))
        with torch.no_grad():
            try:
                strict(torch.randn(8, 16), w)
            except RuntimeError as e:
                raised = str(e)
            else:
                raise AssertionError(f"rank {RANK}: graph_fallback='raise' did not raise")
        check("injected" in raised if RANK == 1 else "rank(s) [1]" in raised, f"raised {raised}")
    finally:
        drivers.HostDriver.capture = original
    return {"fallbacks": reasons}


@scenario
def eviction_in_step():
    """graph_max_entries=1 with alternating signatures: every call recaptures, on all ranks together."""
    from fusegraph.graph import GraphRunner

    g = torch.Generator().manual_seed(12)
    w = torch.randn(16, 16, generator=g)
    runner = GraphRunner(_all_reduce_fn, CompilationConfig(graph_max_entries=1, graph_memory_budget=1 << 30))
    with torch.no_grad():
        for i in range(6):
            x = torch.randn(8 if i % 2 else 4, 16, generator=g)
            for a, b in zip(runner(x * (RANK + 1), w), _expected(x, w)):
                check(max_diff(a, b) <= 1e-4, f"call {i}: wrong result")
    s = runner.stats
    check(s.graphs_captured == 6 and s.evictions == 5 and not s.fallbacks, f"{s}")
    return {"captured": s.graphs_captured, "evictions": s.evictions}


@scenario
def verify_in_step():
    """CompilationConfig(verify=True) on a TP graph: the verifier runs the graph (its collectives) equally often on
    every rank and agrees on every undo."""
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    torch.manual_seed(0)
    reference = MLP().eval()
    torch.manual_seed(0)
    model = parallelize_module(MLP().eval(), tp_mesh(), {"up": ColwiseParallel(), "down": RowwiseParallel()})
    backend = Backend(CompilationConfig(verify=True, inductor=False))
    compiled = torch.compile(model, backend=backend)
    x = torch.randn(4, 32, generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        d = max_diff(compiled(x), reference(x))
    check(d <= TOL and backend.stats.patterns.get("gelu") == 1 and not backend.stats.fallbacks,
          f"verify: diff {d}, {backend.stats}")
    return {"max_diff": d}


@scenario
def verify_warm_cache_on_one_rank():
    """verify=True on Inductor's route for a graph with collectives, compiled twice: first with each rank's Inductor
    cache folder empty, then again (Dynamo reset, a new Backend) with rank 0 on a fresh empty folder and rank 1 on
    its folder from the first compile, which holds that compile. Both times every rank runs the fusion pass and its
    verify exchanges, in step, and gets the right result."""
    root = os.environ["FUSEGRAPH_TEST_CACHE_ROOT"]
    g = torch.Generator().manual_seed(13)  # the same values on every rank
    w, x = torch.randn(16, 16, generator=g), torch.randn(8, 16, generator=g)

    def fn(x, w):
        return _all_reduce_fn(x, w)[1]

    out = {}
    for phase in ("cold", "rank 1 warm"):
        folder = f"rank{RANK}" if RANK == 1 or phase == "cold" else f"rank{RANK}-fresh"
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(root, folder)
        torch._dynamo.reset()
        backend = Backend(CompilationConfig(verify=True, cpp_wrapper=False, fusion_choice="always"))
        compiled = torch.compile(fn, backend=backend, dynamic=False)
        with torch.no_grad():
            d = max_diff(compiled(x * (RANK + 1), w), _expected(x, w)[1])
        s = backend.stats
        check(d <= 1e-4 and not s.fallbacks and s.patterns.get("gelu") == 1, f"{phase}: diff {d}, {s}")
        out[phase] = {"max_diff": d, "patterns": {k: v for k, v in s.patterns.items() if v}}
    return out


@scenario
def exchange_under_fake_mode():
    """The ranks' agreements run inside aot_autograd's fake mode on the aten route (verify fuses there): each
    must still communicate. Rank-dependent flags; one- and several-element exchanges; a fake mode that skipped
    the collective would leave this rank's own flags (or pair different collectives and hang)."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from fusegraph._core import ranks

    group = torch.distributed.group.WORLD
    with FakeTensorMode(allow_non_fake_inputs=True):
        one = ranks.agree_any(group, [RANK == 1])
        several = ranks.agree_any(group, [RANK == 0, False, RANK == 1])
        failed, memory = ranks.agree_capture(group, RANK == 1, 100 * (RANK + 1))
        ranks.check_call(group, "same signature", "exchange_under_fake_mode")
    check(one == [True], f"one flag: {one}")
    check(several == [True, False, True], f"several flags: {several}")
    check(failed == [1] and memory == 200, f"agree_capture: {failed}, {memory}")
    return {"one": one, "several": several}


@scenario
def deliberate_hang():
    """For the harness's own test: rank 0 waits in a collective rank 1 never joins (the watchdog must fire)."""
    if RANK == 0:
        dist.all_reduce(torch.ones(1))
    else:
        import time

        time.sleep(120)


# ----------------------------------------------------------------------------------------------------------------


def main():
    from torch.utils._python_dispatch import _get_current_dispatch_mode_stack

    dist.init_process_group("gloo")
    try:
        for name in sys.argv[1:]:
            result = SCENARIOS[name]()
            modes = _get_current_dispatch_mode_stack()
            check(not modes, f"{name} left dispatch modes pushed: {modes}")  # they would reach later scenarios
            print("RESULT " + json.dumps({"scenario": name, "rank": RANK, **(result or {})}), flush=True)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main()
