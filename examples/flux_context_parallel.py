"""Flux under diffusers' context parallelism (Ulysses), compiled with fusegraph, on N processes.

    torchrun --nproc-per-node 2 examples/flux_context_parallel.py            # CPU: gloo; GPUs: NCCL, one per rank
    torchrun --nproc-per-node 2 examples/flux_context_parallel.py --graph    # + capture/replay (host graph / CUDA graph)
    (from a checkout: PYTHONPATH=. torchrun ...)

fusegraph does not build its own engine: diffusers splits the sequence across ranks and puts PyTorch's functional
collectives (all_to_all_single + wait_tensor) into the graph; fusegraph fuses around them and captures the graph
with them inside, taking every capture decision identically on all ranks. A small random-weight Flux (no download);
rank 0 checks the result against the same model run in one process and prints the stats.
"""
import argparse
import os

import torch
import torch.distributed as dist

import fusegraph
from fusegraph import Backend, CompilationConfig


def tiny_flux(device):
    from diffusers import FluxTransformer2DModel

    torch.manual_seed(0)  # the same weights on every rank
    return FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                  attention_head_dim=32, num_attention_heads=4, joint_attention_dim=64,
                                  pooled_projection_dim=64, axes_dims_rope=(8, 12, 12)).to(device).eval()


def inputs(device, seed=0):
    g = torch.Generator().manual_seed(seed)  # the same inputs on every rank (diffusers splits them)
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(16.0), torch.arange(16.0), indexing="ij"), -1)
    d = dict(hidden_states=torch.randn(1, 256, 16, generator=g), encoder_hidden_states=torch.randn(1, 32, 64, generator=g),
             pooled_projections=torch.randn(1, 64, generator=g), timestep=torch.rand(1, generator=g),
             img_ids=ids.reshape(256, 3), txt_ids=torch.zeros(32, 3))
    return {k: v.to(device) for k, v in d.items()}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--graph", action="store_true", help="graph_with_compile: capture once, then replay")
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()

    if torch.cuda.is_available():
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        # diffusers' enable_parallelism computes `rank % torch.accelerator.device_count()`, which is 0 without an
        # accelerator (a diffusers limitation, not fusegraph's): on CPU every rank uses the CPU
        torch.accelerator.device_count = lambda: 1
    rank, world = dist.get_rank(), dist.get_world_size()

    from diffusers import ContextParallelConfig

    model = tiny_flux(device)
    model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
    backend = Backend(CompilationConfig(graph_with_compile=args.graph))
    compiled = torch.compile(model, backend=backend)

    with torch.no_grad():
        for step in range(args.steps):
            out = compiled(**inputs(device, seed=step), return_dict=False)[0]
        reference = tiny_flux(device)(**inputs(device, seed=args.steps - 1), return_dict=False)[0]
    diff = (out.double() - reference.double()).abs().max().item()
    s = backend.stats
    if rank == 0:
        print(f"{world} ranks ({'NCCL' if device.type == 'cuda' else 'gloo'}), output {tuple(out.shape)}, "
              f"max |diff| vs one process: {diff:.2e}")
        print(f"fused: {dict((k, v) for k, v in s.patterns.items() if v)}; graphs captured {s.graphs_captured}, "
              f"replays {s.replays}, fallbacks {dict(s.fallbacks) or 'none'}")
    assert diff <= 1e-4, f"rank {rank}: the parallel model differs from one process by {diff}"
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
