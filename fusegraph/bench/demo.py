"""``python -m fusegraph demo`` (``make demo``): fusegraph's fused ops in one DiT block, then the backend on a
tiny diffusers Flux transformer (eager vs torch.compile vs fusegraph's routes).

The block is shaped like diffusers' ``FluxSingleTransformerBlock``: AdaLN-Zero modulation -> attention with
QK RMSNorm and interleaved RoPE -> tanh-GELU MLP in parallel -> concat, projection, gated residual. It is
written twice with the same weights: ``block_eager`` (plain PyTorch, as diffusers writes it) and
``block_fused`` (the five fusable chains replaced by ``fusegraph.ops``; matmuls and attention unchanged).

The demo is a list of sections (``SECTIONS``); each takes the shared :class:`Demo` state, prints its part
and returns its numbers for ``--json``. The last section compiles a tiny diffusers ``FluxTransformer2DModel``
with ``torch.compile(backend=fusegraph.Backend(...))`` (``fusegraph.bench.model``).
"""
from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F

import fusegraph.ops as fops
from fusegraph.bench import timing
from fusegraph.bench.ops import max_abs_diff, rope_eager, rope_tables

EPS = 1e-6


@dataclass(frozen=True)
class BlockConfig:
    hidden: int = 768
    heads: int = 6
    seq: int = 1024
    mlp_ratio: int = 4
    batch: int = 1

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads


QUICK = BlockConfig(hidden=128, heads=2, seq=64)


def make_params(cfg: BlockConfig, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random float64 weights (cast per run), scaled like a trained block so activations stay O(1)."""
    g = torch.Generator().manual_seed(seed)
    D, M, Dh = cfg.hidden, cfg.hidden * cfg.mlp_ratio, cfg.head_dim

    def lin(out_f, in_f):
        return (torch.randn(out_f, in_f, generator=g, dtype=torch.float64) / math.sqrt(in_f),
                torch.randn(out_f, generator=g, dtype=torch.float64) * 0.02)

    p = {}
    p["mod_w"], p["mod_b"] = lin(3 * D, D)            # AdaLayerNormZeroSingle.linear
    for name in ("q", "k", "v"):
        p[f"{name}_w"], p[f"{name}_b"] = lin(D, D)    # FluxAttention.to_q / to_k / to_v
    p["norm_q"] = 1.0 + 0.1 * torch.randn(Dh, generator=g, dtype=torch.float64)
    p["norm_k"] = 1.0 + 0.1 * torch.randn(Dh, generator=g, dtype=torch.float64)
    p["mlp_w"], p["mlp_b"] = lin(M, D)                 # proj_mlp
    p["out_w"], p["out_b"] = lin(D, D + M)            # proj_out
    return p


def make_inputs(cfg: BlockConfig, seed: int = 1) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    cos, sin = rope_tables(cfg.seq, cfg.head_dim)
    return {"x": torch.randn(cfg.batch, cfg.seq, cfg.hidden, generator=g, dtype=torch.float64),
            "temb": torch.randn(cfg.batch, cfg.hidden, generator=g, dtype=torch.float64),
            "cos": cos.double(), "sin": sin.double()}


def cast(tensors: dict, dtype: torch.dtype, device, keep_fp32=("cos", "sin")) -> dict:
    """Model tensors to ``dtype``; rope tables stay float32 as Flux keeps them (float64 for the reference)."""
    return {k: v.to(device=device, dtype=torch.float32 if k in keep_fp32 and dtype != torch.float64 else dtype)
            for k, v in tensors.items()}


# --- the block, twice ------------------------------------------------------------------------------

def _attention(q, k, v):
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    return out.transpose(1, 2).flatten(2)


def block_eager(p: dict, x, temb, cos, sin):
    """FluxSingleTransformerBlock.forward in plain PyTorch (no text tokens)."""
    B, S, D = x.shape
    Dh = p["norm_q"].shape[0]
    emb = F.linear(F.silu(temb), p["mod_w"], p["mod_b"])
    shift, scale, gate = emb.chunk(3, dim=1)
    h = F.layer_norm(x, (D,), eps=EPS) * (1 + scale[:, None]) + shift[:, None]       # adaln
    mlp = F.gelu(F.linear(h, p["mlp_w"], p["mlp_b"]), approximate="tanh")          # gelu_tanh
    q = F.rms_norm(F.linear(h, p["q_w"], p["q_b"]).view(B, S, -1, Dh), (Dh,), p["norm_q"], EPS)  # rms_norm
    k = F.rms_norm(F.linear(h, p["k_w"], p["k_b"]).view(B, S, -1, Dh), (Dh,), p["norm_k"], EPS)
    v = F.linear(h, p["v_w"], p["v_b"]).view(B, S, -1, Dh)
    q, k = rope_eager(q, cos, sin), rope_eager(k, cos, sin)                            # rope
    attn = _attention(q, k, v)
    out = F.linear(torch.cat([attn, mlp], dim=2), p["out_w"], p["out_b"])
    return x + gate.unsqueeze(1) * out                                                   # mul_add


def block_fused(p: dict, x, temb, cos, sin):
    """The same block with the five fusable chains as fusegraph.ops calls."""
    B, S, D = x.shape
    Dh = p["norm_q"].shape[0]
    emb = F.linear(F.silu(temb), p["mod_w"], p["mod_b"])
    shift, scale, gate = emb.chunk(3, dim=1)
    h = fops.adaln(x, scale[:, None], shift[:, None], EPS)
    mlp = fops.gelu_tanh(F.linear(h, p["mlp_w"], p["mlp_b"]))
    q = fops.rms_norm(F.linear(h, p["q_w"], p["q_b"]).view(B, S, -1, Dh), p["norm_q"], EPS)
    k = fops.rms_norm(F.linear(h, p["k_w"], p["k_b"]).view(B, S, -1, Dh), p["norm_k"], EPS)
    v = F.linear(h, p["v_w"], p["v_b"]).view(B, S, -1, Dh)
    cos4, sin4 = cos[None, :, None, :], sin[None, :, None, :]
    q, k = fops.rope(q, cos4, sin4, interleaved=True), fops.rope(k, cos4, sin4, interleaved=True)
    attn = _attention(q, k, v)
    out = F.linear(torch.cat([attn, mlp], dim=2), p["out_w"], p["out_b"])
    return fops.mul_add(gate.unsqueeze(1), out, x)


# --- sections --------------------------------------------------------------------------------------

@dataclass
class Demo:
    """State shared by the sections: settings, the block's float64 weights and inputs, results so far."""
    cfg: BlockConfig
    device: torch.device
    dtypes: list
    warmup: int
    reps: int
    quick: bool
    params64: dict
    inputs64: dict
    results: dict = field(default_factory=dict)

    def args(self, dtype):
        """(params, x, temb, cos, sin) in ``dtype`` on the demo's device."""
        p, i = cast(self.params64, dtype, self.device), cast(self.inputs64, dtype, self.device)
        return p, i["x"], i["temb"], i["cos"], i["sin"]


def section_accuracy(d: Demo) -> dict:
    """Max abs error of the fused block vs the eager block (same dtype) and of both vs float64 eager."""
    ref = block_eager(*d.args(torch.float64))
    rows, out = [], {}
    for dtype in d.dtypes:
        a = d.args(dtype)
        eager, fused = block_eager(*a), block_fused(*a)
        e = {"fused_vs_eager": max_abs_diff(fused, eager), "fused_vs_fp64": max_abs_diff(fused, ref),
             "eager_vs_fp64": max_abs_diff(eager, ref), "output_max_abs": ref.abs().max().item()}
        out[timing.DTYPE_NAMES[dtype]] = e
        rows.append([timing.DTYPE_NAMES[dtype], f"{e['fused_vs_eager']:.3e}", f"{e['fused_vs_fp64']:.3e}",
                     f"{e['eager_vs_fp64']:.3e}", f"{e['output_max_abs']:.2f}"])
    print(timing.format_table(["dtype", "fused vs eager", "fused vs fp64", "eager vs fp64", "max|out|"], rows))
    return out


def section_timing(d: Demo) -> dict:
    """Medians of warm runs, eager and fused block measured in turn: per dtype."""
    rows, out = [], {}
    for dtype in d.dtypes:
        a = d.args(dtype)
        with torch.inference_mode():
            ts = timing.interleaved_seconds({"eager": lambda: block_eager(*a), "fused": lambda: block_fused(*a)},
                                            device=d.device, warmup=d.warmup, reps=d.reps)
        te, tf = statistics.median(ts["eager"]), statistics.median(ts["fused"])
        out[timing.DTYPE_NAMES[dtype]] = {"eager_s": te, "fused_s": tf, "eager_min_s": min(ts["eager"]),
                                          "fused_min_s": min(ts["fused"])}
        rows.append([timing.DTYPE_NAMES[dtype], timing.fmt_time(te).strip(), timing.fmt_time(tf).strip(),
                     f"{te / tf:.2f}x"])
    print(timing.format_table(["dtype", "eager block", "fused block", "speed-up"], rows))
    return out


def section_flux_compile(d: Demo) -> dict:
    """The main job: a tiny diffusers FluxTransformer2DModel (2 double + 2 single blocks, random weights)
    compiled with the fusegraph backend, side by side with eager and torch.compile's default (Inductor):
    fusion counts, max diff vs eager, compile time and steady-state medians (fp32). --quick leaves out the
    Inductor variants (their C++ compiles take minutes on 2 cores)."""
    from .model import VARIANTS, benchmark_model

    variants = [v for v in VARIANTS if not (d.quick and v in ("inductor", "fusegraph"))]
    return benchmark_model("flux", "fp32", d.device, reps=d.reps, variants_wanted=variants)


SECTIONS = [
    ("accuracy: fused block vs eager and vs float64 eager (max abs error)", section_accuracy),
    ("timing: one block, medians of warm runs", section_timing),
    ("torch.compile(backend=fusegraph) on a tiny diffusers Flux transformer", section_flux_compile),
]


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m fusegraph demo", description=__doc__.split("\n\n")[0])
    timing.add_run_args(p, quick_help="a tiny block and few reps (smoke test)",
                        reps_help="timed runs per median (default 7, quick 3)")
    return p.parse_args(argv)


def main(argv) -> int:
    args = parse_args(argv)
    try:
        device = timing.setup_device(args.device, args.threads)
        dtypes = timing.parse_dtypes(args.dtype)
    except ValueError as e:
        print(f"error: {e}")
        return 2
    cfg = QUICK if args.quick else BlockConfig()
    reps = args.reps if args.reps is not None else (3 if args.quick else 7)
    d = Demo(cfg=cfg, device=device, dtypes=dtypes, warmup=1, reps=reps, quick=args.quick,
             params64=make_params(cfg), inputs64=make_inputs(cfg))
    print(f"fusegraph demo: {timing.machine_summary(device)}")
    print(f"block: Flux single-block shape, batch {cfg.batch}, seq {cfg.seq}, hidden {cfg.hidden}, "
          f"heads {cfg.heads} x {cfg.head_dim}, mlp {cfg.mlp_ratio * cfg.hidden}")
    for title, section in SECTIONS:
        print(f"\n== {title}")
        try:
            d.results[section.__name__.removeprefix("section_")] = section(d)
        except NotImplementedError as e:  # an op still missing in this checkout: say which, fail
            print(f"cannot run: {e}")
            return 1
    if args.json:
        timing.write_json(args.json, {"subject": "demo", "facts": timing.run_facts(device),
                                      "config": vars(cfg) | {"head_dim": cfg.head_dim},
                                      "settings": {"quick": args.quick, "reps": reps}, "results": d.results})
        print(f"\nwrote {args.json}")
    return 0
