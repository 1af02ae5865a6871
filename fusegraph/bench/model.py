"""``python -m fusegraph bench model --model flux|sd3|wan [--dtype fp32|bf16] [--json PATH] [--nproc N]``

A small diffusers transformer with random weights (configs in the spirit of diffusers' own model tests, made big
enough that timing means something and small enough to compile in seconds on 2 cores), run side by side:
eager, ``torch.compile`` default (Inductor), fusegraph default (fusion + Inductor), fusegraph ``inductor=False``
(fusion, fused aten ops) and the fusegraph graph route when a device graph is available. For each: compile
time (first call), steady-state median (variants timed round-robin, one call each per round), speed-up over
eager, max |diff| vs eager, fusion counts. ``--nproc N``: the model under context parallelism on N ranks
(fusegraph/bench/_parallel.py).
"""
from __future__ import annotations

import argparse
import json
import os
import re
import socket
import statistics
import sys
import tempfile
import time

import torch

from .timing import fmt_time, interleaved_seconds, machine_summary, positive_int, synchronize

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def build_flux(dtype, device):
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2,
                                   attention_head_dim=32, num_attention_heads=4, joint_attention_dim=64,
                                   pooled_projection_dim=64, axes_dims_rope=(8, 12, 12))
    B, S_img, S_txt = 1, 256, 32
    inputs = dict(hidden_states=torch.randn(B, S_img, 16), encoder_hidden_states=torch.randn(B, S_txt, 64),
                  pooled_projections=torch.randn(B, 64), timestep=torch.tensor([0.5]),
                  img_ids=torch.randn(S_img, 3), txt_ids=torch.randn(S_txt, 3), return_dict=False)
    shape = f"B={B} img_tokens={S_img} txt_tokens={S_txt} hidden=128 heads=4 layers=2+2"
    return model, inputs, shape


def build_sd3(dtype, device):
    from diffusers import SD3Transformer2DModel

    model = SD3Transformer2DModel(sample_size=32, patch_size=2, in_channels=4, num_layers=2, attention_head_dim=32,
                                  num_attention_heads=4, caption_projection_dim=128, joint_attention_dim=64,
                                  pooled_projection_dim=64, out_channels=4, pos_embed_max_size=32)
    B = 1
    inputs = dict(hidden_states=torch.randn(B, 4, 32, 32), encoder_hidden_states=torch.randn(B, 32, 64),
                  pooled_projections=torch.randn(B, 64), timestep=torch.tensor([500.0]), return_dict=False)
    shape = f"B={B} img_tokens=256 txt_tokens=32 hidden=128 heads=4 layers=2"
    return model, inputs, shape


def build_wan(dtype, device):
    from diffusers import WanTransformer3DModel

    model = WanTransformer3DModel(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=32, in_channels=16,
                                  out_channels=16, text_dim=64, freq_dim=256, ffn_dim=256, num_layers=2,
                                  cross_attn_norm=True, qk_norm="rms_norm_across_heads", rope_max_seq_len=1024)
    B = 1
    inputs = dict(hidden_states=torch.randn(B, 16, 2, 16, 16), timestep=torch.tensor([500]),
                  encoder_hidden_states=torch.randn(B, 32, 64), return_dict=False)
    shape = f"B={B} video_tokens=128 txt_tokens=32 hidden=128 heads=4 layers=2"
    return model, inputs, shape


class DecodeMLP(torch.nn.Module):
    """A decode-like block: ``layers`` x [RMSNorm -> matmul dim x dim -> tanh-GELU -> x + 0.5 * h], one token."""

    def __init__(self, layers=8, dim=256):
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.w = torch.nn.ParameterList([torch.nn.Parameter(torch.randn(dim, dim, generator=g) * dim ** -0.5,
                                                            requires_grad=False) for _ in range(layers)])
        self.g = torch.nn.ParameterList([torch.nn.Parameter(1 + 0.1 * torch.randn(dim, generator=g),
                                                            requires_grad=False) for _ in range(layers)])

    def forward(self, x):
        for w, g in zip(self.w, self.g):
            h = torch.nn.functional.rms_norm(x, (x.shape[-1],), g, 1e-6)
            x = x + 0.5 * torch.nn.functional.gelu(h @ w, approximate="tanh")
        return x


def build_decode_mlp(dtype, device):
    return DecodeMLP(), dict(x=torch.randn(1, 256)), "batch 1, 8 x [RMSNorm -> matmul 256x256 -> tanh-GELU -> x + 0.5*h]"


BUILDERS = {"flux": build_flux, "sd3": build_sd3, "wan": build_wan, "decode_mlp": build_decode_mlp}


def _to(inputs, dtype, device):
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in ("timestep", "img_ids", "txt_ids"):
            v = v.to(dtype)
        out[k] = v.to(device) if isinstance(v, torch.Tensor) else v
    return out


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def compile_variant(name, make_fn, inputs, reference):
    """Builds the variant and makes its first call (compile time); returns its row, callable and output."""
    fn, backend = make_fn()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = _first(fn(**inputs))
    row = dict(variant=name, compile_s=time.perf_counter() - t0)
    row["max_abs_diff"] = (out.float() - reference.float()).abs().max().item() if reference is not None else 0.0
    if backend is not None:
        row["patterns"] = dict(backend.stats.patterns)
        row["lowered"] = dict(backend.stats.lowered)
        row["fallbacks"] = dict(backend.stats.fallbacks)
        row["graphs_captured"] = backend.stats.graphs_captured
    return row, fn, out


def time_round_robin(fns: dict, inputs, device, reps: int, warmup: int | None = None) -> dict:
    """Median seconds per variant, measured in turn rep by rep (timing.interleaved_seconds) so that a machine
    whose load changes over time biases every variant alike."""
    calls = {name: (lambda fn=fn: fn(**inputs)) for name, fn in fns.items()}
    with torch.no_grad():
        times = interleaved_seconds(calls, device=device, warmup=3 if warmup is None else warmup,
                                    reps=reps)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusegraph bench model", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(BUILDERS), required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=positive_int, default=10, help="timed runs per variant (median reported)")
    p.add_argument("--threads", type=int, default=0,
                   help="torch.set_num_threads (0: torch's default). On a loaded shared machine use 1: a parallel "
                        "region waiting for a descheduled thread makes every op orders of magnitude slower")
    p.add_argument("--json", help="also write the results as JSON to this path")
    p.add_argument("--variants", default="eager,inductor,fusegraph,fusegraph_aten,fusegraph_graph,graph_runner",
                   help="comma-separated subset of: " + ", ".join(VARIANTS))
    p.add_argument("--nproc", type=int, default=1,
                   help="N > 1: run the model under diffusers' Ulysses context parallelism on N ranks (gloo on CPU, "
                        "NCCL on CUDA) and report per-rank medians and the speed-up over one process (flux, wan)")
    args = p.parse_args(argv)
    if args.nproc < 1:
        p.error(f"--nproc must be >= 1, got {args.nproc}")

    threads_before = torch.get_num_threads()
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    try:
        return _run(args, variants_wanted=[v.strip() for v in args.variants.split(",") if v.strip()])
    finally:
        torch.set_num_threads(threads_before)


def _run(args, variants_wanted) -> int:
    unknown = [v for v in variants_wanted if v not in VARIANTS]
    if unknown:
        print(f"unknown variant(s) {unknown}; choose from {list(VARIANTS)}", file=sys.stderr)
        return 2
    if args.nproc > 1:

        result = benchmark_parallel(args.model, args.dtype, args.device, args.reps, variants_wanted, args.nproc,
                                    threads=args.threads)
    else:
        result = benchmark_model(args.model, args.dtype, args.device, args.reps, variants_wanted)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return 0


# fusegraph_graph: the graph route through torch.compile; graph_runner: fusegraph.graph.GraphRunner on the module
# (fusion before capture, no Dynamo)
VARIANTS = ("eager", "inductor", "fusegraph", "fusegraph_aten", "fusegraph_graph", "graph_runner")


def benchmark_model(model_name: str, dtype_name: str = "fp32", device="cpu", reps: int = 10,
                    variants_wanted=VARIANTS) -> dict:
    """Builds the tiny ``model_name`` model, compiles each wanted variant (first call = compile time), times
    them round-robin, prints the table and returns every number (also what ``--json`` writes)."""
    from fusegraph import Backend, CompilationConfig
    from fusegraph.graph import GraphRunner, device_graph_available

    torch.manual_seed(0)
    dtype, device = DTYPES[dtype_name], torch.device(device)
    model, inputs, shape = BUILDERS[model_name](dtype, device)
    model = model.to(device=device).eval()
    if dtype != torch.float32:  # (diffusers logs a keep-in-fp32 notice on every dtype cast)
        model = model.to(dtype=dtype)
    inputs = _to(inputs, dtype, device)

    print(f"fusegraph bench model: {model_name} ({type(model).__name__}), {shape}, dtype {dtype_name}")
    print(machine_summary(device))

    def compiled(cfg=None, default_inductor=False):
        def make():
            if default_inductor:
                return torch.compile(model), None
            b = Backend(cfg)
            return torch.compile(model, backend=b), b
        return make

    variants = {
        "eager": lambda: (model, None),
        "inductor": compiled(default_inductor=True),
        "fusegraph": compiled(CompilationConfig(inductor=True)),
        "fusegraph_aten": compiled(CompilationConfig(inductor=False)),
    }
    available, why_not = device_graph_available(device)
    if available:
        variants["fusegraph_graph"] = compiled(CompilationConfig(graph_with_compile=True, inductor=False))

        def runner():
            r = GraphRunner(model)
            return r, r  # the runner has the stats a backend has

        variants["graph_runner"] = runner
    else:
        for name in ("fusegraph_graph", "graph_runner"):
            if name in variants_wanted:
                print(f"({name} skipped: {why_not})")

    rows, fns, reference = [], {}, None
    torch.compiler.reset()
    for name in variants_wanted:  # variants coexist: Dynamo keeps one cache entry per backend
        if name not in variants:
            continue
        row, fn, out = compile_variant(name, variants[name], inputs, reference)
        if name == "eager":
            reference = out
        rows.append(row)
        fns[name] = fn
        print(f"  {name:<16} first call {row['compile_s']:7.2f} s", flush=True)
    medians = time_round_robin(fns, inputs, device, reps)
    for row in rows:
        row["median_s"] = medians[row["variant"]]

    eager = next((r["median_s"] for r in rows if r["variant"] == "eager"), None)
    inductor = next((r["median_s"] for r in rows if r["variant"] == "inductor"), None)
    print()
    print(f"{'variant':<16} {'compile':>9} {'median':>12} {'vs eager':>9} {'vs ind':>7} {'max|diff|':>10}  "
          f"fused (of them left to Inductor's code)")
    for r in rows:
        ratio = f"{eager / r['median_s']:8.2f}x" if eager else "      -"
        vs_ind = f"{inductor / r['median_s']:6.2f}x" if inductor else "     -"
        lowered = r.get("lowered", {})
        fused = " ".join(f"{k}×{v}" + (f"({lowered[k]})" if lowered.get(k) else "")
                         for k, v in r.get("patterns", {}).items() if v) if "patterns" in r else "-"
        print(f"{r['variant']:<16} {r['compile_s']:8.2f}s {fmt_time(r['median_s']):>12} {ratio:>9} {vs_ind:>7} "
              f"{r['max_abs_diff']:10.2e}  {fused}")
    return dict(model=model_name, dtype=dtype_name, device=str(device), shape=shape,
                machine=machine_summary(device), rows=rows)


if __name__ == "__main__":
    sys.exit(main())


# Multi-process: ``--nproc N``: the same model under diffusers' context
# parallelism (Ulysses, degree N) on N ranks (spawned with torch.multiprocessing, torchrun's environment; gloo on CPU,
# NCCL on CUDA, one GPU per rank), each variant timed on every rank, against the same variants in one process.
#
# Reports each rank's median per variant, the slowest rank (the step time of the job), the one-process median and
# the speed-up. Each rank's output is checked against the one-process eager model (max |diff|). On CPU the ranks
# share the machine's cores: on a 2-core machine the numbers say that it runs, not how it scales.

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
            synchronize(device)
            t0 = time.perf_counter()
            fn(**inputs)
            synchronize(device)
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
            torch.compiler.reset()
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
        torch.compiler.reset()
        import gc

        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def benchmark_parallel(model_name, dtype_name, device, reps, variants, nproc, threads=0) -> dict:
    import torch.multiprocessing as mp


    if model_name not in PARALLEL_MODELS:
        raise SystemExit(f"--nproc: --model must be one of {PARALLEL_MODELS} (a diffusers model with a _cp_plan); "
                         f"got {model_name!r}")
    dropped = [v for v in variants if v not in PARALLEL_VARIANTS]
    if dropped:
        raise SystemExit(f"--nproc: variant(s) {dropped} do not run under context parallelism; expected a subset of "
                         f"{list(PARALLEL_VARIANTS)}")
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
    # the parent's summary, with each rank's own thread count (the parent's team is not the ranks')
    summary = re.sub(r"\b\d+ threads?\b", f"{per_rank_threads} thread(s) per rank", machine_summary(device), count=1)
    print(f"{nproc} ranks ({summary}):")
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
