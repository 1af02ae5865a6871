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
import statistics
import sys
import time

import torch

from .timing import fmt_time, interleaved_seconds, machine_summary

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
    p.add_argument("--reps", type=int, default=10, help="timed runs per variant (median reported)")
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
        from ._parallel import benchmark_parallel

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
    torch._dynamo.reset()
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
