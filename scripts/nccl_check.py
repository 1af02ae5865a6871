"""NCCL part of scripts/device_check.sh: run with ``torchrun --nproc-per-node N scripts/nccl_check.py`` (N = the GPUs,
at most 2; with one GPU N=1: the NCCL path runs with world size 1, so the CUDA-graph capture of collectives is
exercised but nothing crosses GPUs, and the context-parallel model check needs 2 and is skipped, said in the log).

1. The communicator is warmed (one all_reduce, synchronised) before any capture: NCCL creates its communicator
   lazily at the first collective, which must not happen inside a CUDA graph capture.
2. A GraphRunner over a function with ``_c10d_functional.all_reduce`` + ``wait_tensor`` captures a CUDA graph
   with the collective inside on every rank, replays it 20 times on fresh inputs (checked against the expected sum),
   and every rank reports the same counters (1 graph captured, 20 replays, no fallback).
3. With 2 GPUs: Flux (tiny) under diffusers' Ulysses context parallelism compiled with fusegraph's graph route:
   output within 1e-5 of the single-process model, one CUDA graph per Dynamo graph on every rank, no fallback.
Exit status 0 when every check passed on this rank."""
from __future__ import annotations

import faulthandler
import os
import sys

faulthandler.dump_traceback_later(float(os.environ.get("FUSEGRAPH_WATCHDOG_S", "150")), exit=True)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import fusegraph  # noqa: E402,F401
from fusegraph import Backend, CompilationConfig  # noqa: E402
from fusegraph.graph import GraphRunner  # noqa: E402


def log(*a):
    print(f"[rank {dist.get_rank()}]", *a, flush=True)


def main() -> int:
    local = int(os.environ.get("LOCAL_RANK", "0"))
    torch.cuda.set_device(local)
    device = torch.device("cuda", local)
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    if world == 1:
        log("one GPU: the NCCL path runs with world size 1 (CUDA-graph capture of collectives; nothing crosses GPUs)")
    # 1. warm the communicator outside any capture
    warm = torch.ones(1, device=device)
    dist.all_reduce(warm)
    torch.cuda.synchronize(device)
    assert warm.item() == world, f"warm-up all_reduce gave {warm.item()}, expected {world}"

    # 2. a CUDA graph with a collective inside, captured and replayed on every rank
    group_name = dist.group.WORLD.group_name

    def fn(x, w):
        y = torch.ops._c10d_functional.all_reduce(x @ w, "sum", group_name)
        y = torch.ops._c10d_functional.wait_tensor(y)
        return torch.nn.functional.gelu(y, approximate="tanh") + x

    g = torch.Generator(device="cpu").manual_seed(0)
    w = torch.randn(64, 64, generator=g).to(device)
    runner = GraphRunner(fn)
    with torch.no_grad():
        for i in range(20):
            x = torch.randn(32, 64, generator=g).to(device)
            out = runner(x * (rank + 1), w)
            y = sum(x @ w * (r + 1) for r in range(world))
            want = torch.nn.functional.gelu(y, approximate="tanh") + x * (rank + 1)
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)
    s = runner.stats
    counters = (s.graphs_captured, s.replays, dict(s.fallbacks))
    everyone = [None] * world
    dist.all_gather_object(everyone, counters)
    assert all(c == everyone[0] for c in everyone), f"ranks differ: {everyone}"
    assert counters[0] == 1 and counters[1] == 20 and not counters[2], f"counters {counters}"
    log(f"CUDA graph with all_reduce inside: captured {counters[0]}, replayed {counters[1]}, same on all {world} ranks")

    # 3. Flux under Ulysses context parallelism, fusegraph's graph route (CUDA graphs)
    if world < 2:
        log("context-parallel Flux skipped: needs 2 GPUs")
    else:
        from diffusers import ContextParallelConfig, FluxTransformer2DModel

        def make():
            torch.manual_seed(0)
            return FluxTransformer2DModel(patch_size=1, in_channels=4, num_layers=1, num_single_layers=1,
                                          attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                                          pooled_projection_dim=32, axes_dims_rope=(4, 4, 8)).to(device).eval()

        def inputs(seed):
            gi = torch.Generator().manual_seed(seed)
            ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(4.0), torch.arange(4.0), indexing="ij"),
                              -1).reshape(16, 3)
            d = dict(hidden_states=torch.randn(1, 16, 4, generator=gi), encoder_hidden_states=torch.randn(1, 8, 32, generator=gi),
                     pooled_projections=torch.randn(1, 32, generator=gi), timestep=torch.rand(1, generator=gi),
                     img_ids=ids, txt_ids=torch.randn(8, 3, generator=gi))
            return {k: v.to(device) for k, v in d.items()}

        reference = make()
        model = make()
        model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
        backend = Backend(CompilationConfig(graph_with_compile=True))
        compiled = torch.compile(model, backend=backend)
        with torch.no_grad():
            for seed in range(3):
                i = inputs(seed)
                got = compiled(**i, return_dict=False)[0]
                ref = reference(**i, return_dict=False)[0]
                diff = (got.double() - ref.double()).abs().max().item()
                assert diff <= 1e-5 * max(1.0, ref.abs().max().item()), f"CP Flux differs by {diff}"
        s = backend.stats
        counters = (s.graphs_captured, s.replays, dict(s.fallbacks))
        everyone = [None] * world
        dist.all_gather_object(everyone, counters)
        assert all(c == everyone[0] for c in everyone), f"ranks differ: {everyone}"
        assert s.graphs_captured >= 1 and not s.fallbacks, f"stats {s}"
        log(f"Flux Ulysses CP, graph route: max diff {diff:.3g}, captured {s.graphs_captured}, replays {s.replays}, "
            f"fused {dict((k, v) for k, v in s.patterns.items() if v)}")
    dist.barrier()
    dist.destroy_process_group()
    faulthandler.cancel_dump_traceback_later()
    return 0


if __name__ == "__main__":
    sys.exit(main())
