"""``python -m fusegraph bench model --model flux|wan --nproc N``: the same model under diffusers' context
parallelism (Ulysses, degree N) on N ranks (spawned with torch.multiprocessing, torchrun's environment; gloo on CPU,
NCCL on CUDA, one GPU per rank), each variant timed on every rank, against the same variants in one process.

Reports each rank's median per variant, the slowest rank (the step time of the job), the one-process median and
the speed-up. Each rank's output is checked against the one-process eager model (max |diff|). On CPU the ranks
share the machine's cores: on a 2-core machine the numbers say that it runs, not how it scales."""
from __future__ import annotations

import json
import os
import socket
import statistics
import tempfile
import time

import torch

PARALLEL_MODELS = ("flux", "wan")  # models of bench model with a diffusers _cp_plan
PARALLEL_VARIANTS = ("eager", "fusegraph", "fusegraph_aten", "fusegraph_graph")


def _variant_backend(name):
    from fusegraph import Backend, CompilationConfig

    return {"fusegraph": lambda: Backend(CompilationConfig(inductor=True)),
            "fusegraph_aten": lambda: Backend(CompilationConfig(inductor=False)),
            "fusegraph_graph": lambda: Backend(CompilationConfig(graph_with_compile=True, inductor=False))}[name]()


def _timed(fn, inputs, device, reps, warmup=None) -> list:
    warmup = 3 if warmup is None else warmup
    times = []
    with torch.no_grad():
        for i in range(warmup + reps):
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0 = time.perf_counter()
            fn(**inputs)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            if i >= warmup:
                times.append(time.perf_counter() - t0)
    return times


def _rank_main(rank, world, port, model_name, dtype_name, device_type, reps, variants, threads, out_path):
    import faulthandler

    faulthandler.enable()  # a rank that aborts prints every thread's Python stack, not only "terminate called"
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(port))
    import torch.distributed as dist

    from diffusers import ContextParallelConfig

    from .model import BUILDERS, DTYPES, _first, _to

    torch.set_num_threads(threads)
    if device_type == "cuda":
        torch.cuda.set_device(rank)
        device = torch.device("cuda", rank)
        dist.init_process_group("nccl", device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo")
        if torch.accelerator.device_count() == 0:
            # diffusers' enable_parallelism computes rank % torch.accelerator.device_count(): 0 on a CPU-only
            # machine (diffusers', not fusegraph's); every rank uses the CPU
            torch.accelerator.device_count = lambda: 1
    import logging

    if not hasattr(logging.Logger, "warning_once"):  # diffusers 0.42.1's CP hook calls it on a [B] timestep (Wan)
        logging.Logger.warning_once = logging.Logger.warning
    dtype = DTYPES[dtype_name]
    rows = {}
    fn = model = backend = None
    try:
        torch.manual_seed(0)
        reference_model, inputs, shape = BUILDERS[model_name](dtype, device)
        reference_model = reference_model.to(device=device, dtype=dtype).eval()
        inputs = _to(inputs, dtype, device)
        with torch.no_grad():
            reference = _first(reference_model(**inputs))
        for name in variants:
            torch.manual_seed(0)
            model, _, _ = BUILDERS[model_name](dtype, device)
            model = model.to(device=device, dtype=dtype).eval()
            model.enable_parallelism(config=ContextParallelConfig(ulysses_degree=world))
            backend = None
            fn = model
            if name != "eager":
                backend = _variant_backend(name)
                fn = torch.compile(model, backend=backend)
            t0 = time.perf_counter()
            with torch.no_grad():
                out = _first(fn(**inputs))
            compile_s = time.perf_counter() - t0
            diff = (out.float() - reference.float()).abs().max().item()
            times = _timed(fn, inputs, device, reps)
            rows[name] = dict(median_s=statistics.median(times), compile_s=compile_s, max_abs_diff=diff,
                              fallbacks=dict(backend.stats.fallbacks) if backend else {},
                              graphs_captured=backend.stats.graphs_captured if backend else 0)
            torch._dynamo.reset()
        gathered = [None] * world
        dist.all_gather_object(gathered, rows)
        if rank == 0:
            with open(out_path, "w") as f:
                json.dump(dict(shape=shape, ranks=gathered), f)
        # Tear down in step: every compiled graph, its collectives' work objects and the process group go while
        # the interpreter is whole. A gloo worker thread that drops the last reference to a Python-owned tensor
        # takes the GIL; during interpreter finalization that aborts the process ("terminate called without an
        # active exception", SIGABRT; pytorch/pytorch#190489, #179291). A rank aborted with that message once in CI,
        # not reproduced in 13 local runs; faulthandler above shows where, should it recur.
        del fn, model, reference_model, backend
        torch._dynamo.reset()
        import gc

        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def benchmark_parallel(model_name, dtype_name, device, reps, variants, nproc, threads=0) -> dict:
    import torch.multiprocessing as mp

    from .model import benchmark_model
    from .timing import fmt_time, machine_summary

    if model_name not in PARALLEL_MODELS:
        raise SystemExit(f"--nproc: --model must be one of {PARALLEL_MODELS} (a diffusers model with a _cp_plan); "
                         f"got {model_name!r}")
    variants = [v for v in variants if v in PARALLEL_VARIANTS]
    device = torch.device(device)
    if device.type == "cuda" and torch.cuda.device_count() < nproc:
        raise SystemExit(f"--nproc {nproc} on CUDA needs {nproc} GPUs; {torch.cuda.device_count()} visible")
    cores = os.cpu_count() or 1
    per_rank_threads = threads or max(1, cores // nproc)
    print(f"fusegraph bench model --nproc {nproc}: {model_name}, Ulysses context parallelism (degree {nproc}), "
          f"{'NCCL' if device.type == 'cuda' else 'gloo'}, {per_rank_threads} thread(s) per rank")
    print("one process:")
    single = benchmark_model(model_name, dtype_name, str(device), reps, variants)
    single_rows = {r["variant"]: r for r in single["rows"]}
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with tempfile.TemporaryDirectory() as tmp:
        out_path = os.path.join(tmp, "ranks.json")
        mp.spawn(_rank_main, args=(nproc, port, model_name, dtype_name, device.type, reps, variants,
                                   per_rank_threads, out_path), nprocs=nproc, join=True)
        with open(out_path) as f:
            data = json.load(f)
    print()
    print(f"{nproc} ranks ({machine_summary(device)}):")
    header = " ".join(f"{'rank ' + str(r):>11}" for r in range(nproc))
    print(f"{'variant':<16} {header} {'slowest':>11} {'1 process':>11} {'speed-up':>9} {'max|diff|':>10}")
    rows = []
    for name in variants:
        per_rank = [data["ranks"][r][name] for r in range(nproc)]
        slowest = max(r["median_s"] for r in per_rank)
        one = single_rows[name]["median_s"]
        diff = max(r["max_abs_diff"] for r in per_rank)
        rows.append(dict(variant=name, rank_median_s=[r["median_s"] for r in per_rank], slowest_s=slowest,
                         single_process_s=one, speedup=one / slowest, max_abs_diff=diff,
                         fallbacks=[r["fallbacks"] for r in per_rank],
                         graphs_captured=[r["graphs_captured"] for r in per_rank]))
        cells = " ".join(f"{fmt_time(r['median_s']):>11}" for r in per_rank)
        print(f"{name:<16} {cells} {fmt_time(slowest):>11} {fmt_time(one):>11} {one / slowest:8.2f}x {diff:10.2e}")
    note = None
    if device.type == "cpu":
        note = (f"note: {nproc} ranks on {cores} CPU core(s) share the machine's cores (gloo, {per_rank_threads} "
                f"thread(s) per rank); these numbers show that it runs, they are not meaningful for scaling "
                f"(that needs one GPU per rank)")
        print(note)
    return dict(model=model_name, dtype=dtype_name, device=str(device), nproc=nproc, shape=data["shape"],
                machine=machine_summary(device), rows=rows, single_process=single, note=note)
