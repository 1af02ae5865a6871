"""``python -m fusegraph bench model --model flux|sd3|wan [--dtype fp32|bf16] [--json PATH]``

A small diffusers transformer with random weights (configs in the spirit of diffusers' own model tests, made big
enough that timing means something and small enough to compile in seconds on 2 cores), run side by side:
eager, ``torch.compile`` default (Inductor), fusegraph default (fusion + Inductor), fusegraph ``inductor=False``
(fusion, fused aten ops) and the fusegraph graph route when a device graph is available. For each: compile
time (first call), steady-state median, speed-up over eager, max |diff| vs eager, fusion counts.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import torch

from .timing import fmt_time, machine_summary, median_seconds

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


BUILDERS = {"flux": build_flux, "sd3": build_sd3, "wan": build_wan}


def _to(inputs, dtype, device):
    out = {}
    for k, v in inputs.items():
        if isinstance(v, torch.Tensor) and v.is_floating_point() and k not in ("timestep", "img_ids", "txt_ids"):
            v = v.to(dtype)
        out[k] = v.to(device) if isinstance(v, torch.Tensor) else v
    return out


def _first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def run_variant(name, make_fn, inputs, reference, device, reps):
    torch._dynamo.reset()
    fn, backend = make_fn()
    t0 = time.perf_counter()
    with torch.no_grad():
        out = _first(fn(**inputs))
    compile_s = time.perf_counter() - t0

    def step():
        with torch.no_grad():
            fn(**inputs)

    median = median_seconds(step, device=device, warmup=2, reps=reps)
    diff = (out.float() - reference.float()).abs().max().item() if reference is not None else 0.0
    row = dict(variant=name, compile_s=compile_s, median_s=median, max_abs_diff=diff)
    if backend is not None:
        row["patterns"] = dict(backend.stats.patterns)
        row["fallbacks"] = dict(backend.stats.fallbacks)
        row["graphs_captured"] = backend.stats.graphs_captured
    return row, out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusegraph bench model", description=__doc__.split("\n\n")[0])
    p.add_argument("--model", choices=sorted(BUILDERS), required=True)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=int, default=10, help="timed runs per variant (median reported)")
    p.add_argument("--json", help="also write the results as JSON to this path")
    p.add_argument("--variants", default="eager,inductor,fusegraph,fusegraph_aten,fusegraph_graph",
                   help="comma-separated subset of: eager, inductor, fusegraph, fusegraph_aten, fusegraph_graph")
    args = p.parse_args(argv)

    from fusegraph import Backend, CompilationConfig
    from fusegraph.backend import _graph_runtime

    torch.manual_seed(0)
    dtype, device = DTYPES[args.dtype], torch.device(args.device)
    model, inputs, shape = BUILDERS[args.model](dtype, device)
    model = model.to(device=device, dtype=dtype).eval()
    inputs = _to(inputs, dtype, device)

    print(f"fusegraph bench model: {args.model} ({type(model).__name__}), {shape}, dtype {args.dtype}")
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
    runtime, why_not = _graph_runtime()
    if runtime is not None:
        variants["fusegraph_graph"] = compiled(CompilationConfig(graph_with_compile=True, inductor=False))
    wanted = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in wanted if v not in variants and v != "fusegraph_graph"]
    if unknown:
        print(f"unknown variant(s) {unknown}; choose from {sorted(variants)}", file=sys.stderr)
        return 2
    if "fusegraph_graph" in wanted and runtime is None:
        print(f"(fusegraph_graph skipped: {why_not})")

    rows, reference = [], None
    for name in wanted:
        if name not in variants:
            continue
        row, out = run_variant(name, variants[name], inputs, reference, device, args.reps)
        if name == "eager":
            reference = out
        rows.append(row)
        print(f"  {name:<16} first call {row['compile_s']:7.2f} s   median {fmt_time(row['median_s'])}",
              flush=True)

    eager = next((r["median_s"] for r in rows if r["variant"] == "eager"), None)
    print()
    print(f"{'variant':<16} {'compile':>9} {'median':>12} {'vs eager':>9} {'max|diff|':>10}  fused")
    for r in rows:
        ratio = f"{eager / r['median_s']:8.2f}x" if eager else "      -"
        fused = " ".join(f"{k}×{v}" for k, v in r.get("patterns", {}).items()) if "patterns" in r else "-"
        print(f"{r['variant']:<16} {r['compile_s']:8.2f}s {fmt_time(r['median_s']):>12} {ratio:>9} "
              f"{r['max_abs_diff']:10.2e}  {fused}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(model=args.model, dtype=args.dtype, device=str(device), shape=shape,
                           machine=machine_summary(device), rows=rows), f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
