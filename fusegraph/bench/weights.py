"""``python -m fusegraph bench weights [--dtype fp32|bf16] [--tokens IMG,TXT] [--variants A;B;...] [--reps N]``

What freezing costs in memory, at FLUX.1's published widths: a FluxTransformer2DModel with hidden 3072 (24 heads x
128), joint attention dim 4096, pooled dim 768, 64 input channels, one double-stream and one single-stream block
(535 M parameters), random weights. Each variant runs in a process of its own (resident memory is a process's):
the model and inputs are built, then the resident set is read before compile and after the first call and the
timed calls; the difference is what the compiled function holds. Also: first-call (compile) time, the median of
the timed calls, and the max |diff| against eager in the same process.

Variants: eager, inductor (plain ``torch.compile``), inductor_tuned (``freezing`` + ``cpp_wrapper``), fusegraph
(the default config), and ``fusegraph:<overrides>`` (e.g. ``fusegraph:pack_weights=True,concat_linear=True``,
``fusegraph:enable_freezing=False``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

DEFAULT_VARIANTS = ("eager", "inductor", "inductor_tuned", "fusegraph", "fusegraph:concat_linear=True",
                    "fusegraph:enable_freezing=False")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _overrides(text: str) -> dict:
    out = {}
    for item in filter(None, text.split(",")):
        key, _, value = item.partition("=")
        out[key.strip()] = {"True": True, "False": False}.get(value.strip(), value.strip())
    return out


def build_flux_real(dtype, img_tokens: int, txt_tokens: int):
    import torch
    from diffusers import FluxTransformer2DModel

    model = FluxTransformer2DModel(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1,
                                   attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                                   pooled_projection_dim=768, axes_dims_rope=(16, 56, 56)).to(dtype).eval()
    g = torch.Generator().manual_seed(0)
    inputs = dict(hidden_states=torch.randn(1, img_tokens, 64, generator=g).to(dtype),
                  encoder_hidden_states=torch.randn(1, txt_tokens, 4096, generator=g).to(dtype),
                  pooled_projections=torch.randn(1, 768, generator=g).to(dtype),
                  timestep=torch.tensor([0.5]).to(dtype), img_ids=torch.randn(img_tokens, 3, generator=g),
                  txt_ids=torch.randn(txt_tokens, 3, generator=g), return_dict=False)
    return model, inputs


def run_variant(variant: str, dtype_name: str, img_tokens: int, txt_tokens: int, reps: int) -> dict:
    """One variant, in this process: the row's figures."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model, inputs = build_flux_real(dtype, img_tokens, txt_tokens)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    with torch.no_grad():
        rss0 = _rss_mib()
        if variant == "eager":
            fn = model
        elif variant == "inductor":
            fn = torch.compile(model)
        elif variant == "inductor_tuned":
            fn = torch.compile(model, options={"freezing": True, "cpp_wrapper": True})
        elif variant.split(":")[0] == "fusegraph":
            from fusegraph import Backend, CompilationConfig

            fn = torch.compile(model, backend=Backend(CompilationConfig(**_overrides(variant.partition(":")[2]))))
        else:
            raise SystemExit(f"bench weights: argument --variants: unknown variant {variant!r}")
        t0 = time.perf_counter()
        out = fn(**inputs)[0]
        first = time.perf_counter() - t0
        times = []
        for _ in range(reps):
            t0 = time.perf_counter()
            fn(**inputs)
            times.append(time.perf_counter() - t0)
        rss1 = _rss_mib()
        ref = model(**inputs)[0]
    return {"variant": variant, "dtype": dtype_name, "weights_mib": weight_bytes / 2**20,
            "resident_mib": rss1 - rss0, "first_s": first, "median_s": statistics.median(times),
            "max_diff": float((out.float() - ref.float()).abs().max())}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusegraph bench weights", description=__doc__.split("\n\n")[1])
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--tokens", default="256,64", help="image and text tokens (default 256,64)")
    p.add_argument("--variants", default=";".join(DEFAULT_VARIANTS), help="';'-separated (default: %(default)s)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a single variant, in this process
    args = p.parse_args(argv)
    try:
        img, txt = (int(v) for v in args.tokens.split(","))
    except ValueError:
        p.error(f"argument --tokens: expected IMG,TXT (two integers), got {args.tokens!r}")
    import torch

    torch.set_num_threads(args.threads)
    if args.one is not None:
        print(json.dumps(run_variant(args.one, args.dtype, img, txt, args.reps)))
        return 0
    from .timing import machine_summary

    variants = [v for v in args.variants.split(";") if v]
    print(f"FLUX.1 widths, 1+1 blocks, {img}+{txt} tokens, {args.dtype}; {machine_summary()}")
    print(f"{'variant':40s} {'weights':>9s} {'resident +':>11s} {'% of w':>7s} {'first call':>11s} "
          f"{'median':>10s} {'max|diff|':>10s}")
    rows = []
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    for variant in variants:
        cmd = [sys.executable, "-m", "fusegraph", "bench", "weights", "--one", variant, "--dtype", args.dtype,
               "--tokens", args.tokens, "--reps", str(args.reps), "--threads", str(args.threads)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
        if proc.returncode != 0 or not lines:
            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
            print(f"{variant:40s} failed: {tail[:200]}")
            continue
        row = json.loads(lines[-1])
        rows.append(row)
        print(f"{variant:40s} {row['weights_mib']:7.0f} M {row['resident_mib']:9.0f} M "
              f"{100 * row['resident_mib'] / row['weights_mib']:6.1f}% {row['first_s']:9.1f} s "
              f"{row['median_s'] * 1e3:8.0f} ms {row['max_diff']:10.2e}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_summary(), "tokens": [img, txt], "rows": rows}, f, indent=1)
    return 0 if len(rows) == len(variants) else 1
