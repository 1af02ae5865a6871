"""``python -m fusegraph bench ops``: every fused op against what it replaces, side by side in one run.

For each op x dtype, at Flux-scale shapes, four timings: medians over warm runs, taken interleaved
(``timing.interleaved_seconds``: eager, compiled, fused, copy, then again in rotated order) so a change of
load on a shared machine hits every column alike:

- **eager**: the unfused PyTorch composition, written as diffusers writes it (sources cited per case);
- **compiled**: ``torch.compile`` (``--backend``, default Inductor in its default mode) of that same
  composition; its compile time (first call) is reported apart and never mixed into the warm median;
- **fused**: ``fusegraph.ops.<op>``, one kernel;
- **copy**: the bandwidth limit, a copy that moves the same bytes as the fused op (its inputs + output,
  each view at its own size; half read, half written) into a fresh buffer of the op's output size, as the
  functional op allocates one per call; and "copy pre", the same copy between preallocated buffers (the
  memory system alone). See :func:`copy_limits`.

Each fused result is compared with eager (max abs diff) and judged against a float64 run of the same
composition (``torch.testing.assert_close`` at the output dtype's default tolerances, as the op tests do):
judging against bf16 eager would blame the fused op for eager's own intermediate roundings. A fast wrong
kernel shows up in the table ("WRONG") and fails the command (exit 1). A result bit-equal to eager's is not
flagged: off the CPU kv_attention and gemv are eager's own at:: composition, and their error is eager's.
"""
from __future__ import annotations

import argparse
import math
import statistics
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

import fusegraph.ops as fops
from fusegraph.bench import timing

EPS = 1e-6


# --- the eager compositions (what a DiT model executes without fusegraph) ---------------------------

def rms_norm_torch_eager(x, weight):
    # Flux / Wan QK-norm: torch.nn.RMSNorm(dim, eps=1e-6) -> F.rms_norm.
    return F.rms_norm(x, (x.shape[-1],), weight, EPS)


def rms_norm_diffusers_eager(x, weight):
    # diffusers.models.normalization.RMSNorm.forward (non-NPU branch), with a weight.
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    x = x * torch.rsqrt(variance + EPS)
    if weight.dtype in (torch.float16, torch.bfloat16):
        x = x.to(weight.dtype)
    return x * weight


def rope_eager(x, cos, sin):
    # diffusers.models.embeddings.apply_rotary_emb(use_real=True, use_real_unbind_dim=-1, sequence_dim=1), Flux.
    # diffusers computes in x.float(); promote_types is the same for fp32/bf16/fp16 and keeps a float64
    # reference (the demo's) in float64.
    compute = torch.promote_types(x.dtype, torch.float32)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.to(compute) * cos + x_rotated.to(compute) * sin).to(x.dtype)


def rope_partial_eager(x, cos, sin):
    # diffusers transformer_minimax_h3._apply_rotary_emb: the first R = cos.shape[-1] channels rotated
    # (rotate-half, tables cast to x's dtype, math in x's dtype), the rest concatenated back.
    rotary_dim = cos.shape[-1]
    x_rot, x_pass = x[..., :rotary_dim], x[..., rotary_dim:]
    cos = cos.to(x.dtype)[None, :, None, :]
    sin = sin.to(x.dtype)[None, :, None, :]
    x1, x2 = x_rot.chunk(2, dim=-1)
    x_rot = x_rot * cos + torch.cat((-x2, x1), dim=-1) * sin
    return torch.cat((x_rot, x_pass), dim=-1).contiguous()


def adaln_eager(x, emb):
    # diffusers AdaLayerNormZeroSingle.forward after its linear: chunk, LayerNorm(no affine), modulate.
    shift, scale, _gate = emb.chunk(3, dim=1)
    return F.layer_norm(x, (x.shape[-1],), eps=EPS) * (1 + scale[:, None]) + shift[:, None]


def adaln_rms_eager(x, emb):
    # LTX block (transformer_ltx.py): norm1 = RMSNorm(dim, elementwise_affine=False) (diffusers RMSNorm, no weight:
    # fp32 variance, cast back to x's dtype), then norm_hidden_states * (1 + scale_msa) + shift_msa.
    shift, scale, _gate = emb.chunk(3, dim=1)
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    n = (x * torch.rsqrt(variance + EPS)).to(x.dtype)
    return n * (1 + scale[:, None]) + shift[:, None]


def adaln_noshift_eager(x, weight, emb):
    # LuminaRMSNormZero.forward after its linear: RMSNorm (diffusers, with weight) then * (1 + scale_msa[:, None]).
    scale = emb.chunk(3, dim=1)[0]
    return rms_norm_diffusers_eager(x, weight) * (1 + scale[:, None])


def gelu_tanh_eager(x):
    # FluxSingleTransformerBlock.act_mlp = nn.GELU(approximate="tanh"); FeedForward "gelu-approximate".
    return F.gelu(x, approximate="tanh")


def mul_add_eager(residual, y, emb):
    # FluxSingleTransformerBlock.forward: gate = gate.unsqueeze(1); residual + gate * proj_out(...).
    gate = emb.chunk(3, dim=1)[2].unsqueeze(1)
    return residual + gate * y


def kv_attention_eager(q, k_cache, k_new, v_cache, v_new):
    # a decode step over a KV cache (transformers' DynamicCache concatenates the step's keys and values)
    return F.scaled_dot_product_attention(q, torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2))


def gemv_eager(x, weight, bias):
    # a decode step's projection: nn.Linear on one token
    return F.linear(x, weight, bias)


# --- the fused calls (same inputs, same views) -------------------------------------------------------

def rms_norm_torch_fused(x, weight):
    return fops.rms_norm(x, weight, EPS)


def rms_norm_diffusers_fused(x, weight):
    return fops.rms_norm(x, weight, EPS, style="diffusers")


def rope_fused(x, cos, sin):
    return fops.rope(x, cos[None, :, None, :], sin[None, :, None, :], interleaved=True)


def rope_partial_fused(x, cos, sin):
    # the fp32 tables as they are (the op reads fp32 tables with a bf16 / fp16 x): the float64 reference
    # is the composition with unrounded tables, which bf16 tables would miss by their own rounding.
    return fops.rope(x, cos[None, :, None, :], sin[None, :, None, :], interleaved=False, rotary_dim=cos.shape[-1])


def adaln_fused(x, emb):
    shift, scale, _gate = emb.chunk(3, dim=1)
    return fops.adaln(x, scale[:, None], shift[:, None], EPS)


def adaln_rms_fused(x, emb):
    shift, scale, _gate = emb.chunk(3, dim=1)
    return fops.adaln(x, scale[:, None], shift[:, None], EPS, norm="rms")


def adaln_noshift_fused(x, weight, emb):
    scale = emb.chunk(3, dim=1)[0]
    return fops.adaln(x, scale[:, None], None, EPS, weight=weight, norm="rms")


def gelu_tanh_fused(x):
    return fops.gelu_tanh(x)


def mul_add_fused(residual, y, emb):
    gate = emb.chunk(3, dim=1)[2].unsqueeze(1)
    return fops.mul_add(gate, y, residual)


# --- inputs --------------------------------------------------------------------------------------------

def _randn(shape, dtype, device, scale=1.0, offset=0.0):
    return (torch.randn(shape, dtype=torch.float32) * scale + offset).to(device=device, dtype=dtype)


def rope_tables(seq: int, head_dim: int, theta: float = 10000.0, device="cpu"):
    """Interleaved float32 cos/sin tables ``[S, D]`` as Flux builds them (each frequency repeated twice)."""
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float64), freqs).repeat_interleave(2, dim=1)
    return angles.cos().float().to(device), angles.sin().float().to(device)


def norm_inputs(shape, dtype, device):
    return _randn(shape, dtype, device), _randn(shape[-1:], dtype, device, 0.1, 1.0)


def rope_inputs(shape, dtype, device):
    cos, sin = rope_tables(shape[1], shape[3], device=device)
    return _randn(shape, dtype, device), cos, sin


def rope_partial_inputs(shape, dtype, device):
    """x ``[B, S, H, D]`` and rotate-half tables ``[S, D/2]`` (half the head rotated, MiniMax-H3-like)."""
    cos, sin = rope_tables(shape[1], shape[3] // 2, device=device)
    return _randn(shape, dtype, device), cos, sin


def adaln_inputs(shape, dtype, device):
    return _randn(shape, dtype, device), _randn((shape[0], 3 * shape[-1]), dtype, device, 0.5)


def adaln_weight_inputs(shape, dtype, device):
    return (_randn(shape, dtype, device), _randn(shape[-1:], dtype, device, 0.1, 1.0),
            _randn((shape[0], 3 * shape[-1]), dtype, device, 0.5))


def gelu_inputs(shape, dtype, device):
    return (_randn(shape, dtype, device, 2.0),)


def kv_attention_inputs(shape, dtype, device):
    B, H, L, D = shape  # one new token over a cache of L
    return (_randn((B, H, 1, D), dtype, device), _randn((B, H, L, D), dtype, device),
            _randn((B, H, 1, D), dtype, device), _randn((B, H, L, D), dtype, device),
            _randn((B, H, 1, D), dtype, device))


def gemv_inputs(shape, dtype, device):
    M, N, K = shape
    return (_randn((M, K), dtype, device), _randn((N, K), dtype, device, K ** -0.5), _randn((N,), dtype, device))


def mul_add_inputs(shape, dtype, device):
    return (_randn(shape, dtype, device), _randn(shape, dtype, device),
            _randn((shape[0], 3 * shape[-1]), dtype, device, 0.5))


@dataclass(frozen=True)
class Case:
    """One row family of the table: an op in one source form, at a Flux-scale and a --quick shape."""
    op: str                        # the fused op's name (what --ops selects)
    label: str                     # row label
    shape: tuple                   # Flux-scale main input shape
    quick_shape: tuple
    inputs: Callable               # (shape, dtype, device) -> tuple of tensors
    eager: Callable
    fused: Callable


CASES = [
    Case("rms_norm", "rms_norm", (1, 4096, 3072), (2, 64, 256), norm_inputs,
         rms_norm_torch_eager, rms_norm_torch_fused),
    Case("rms_norm", "rms_norm[diffusers]", (1, 4096, 3072), (2, 64, 256), norm_inputs,
         rms_norm_diffusers_eager, rms_norm_diffusers_fused),
    Case("rope", "rope", (1, 4096, 24, 128), (1, 64, 4, 32), rope_inputs, rope_eager, rope_fused),
    Case("rope", "rope[rotary_dim=D/2]", (1, 4096, 24, 128), (1, 64, 4, 32), rope_partial_inputs,
         rope_partial_eager, rope_partial_fused),
    Case("adaln", "adaln", (1, 4096, 3072), (2, 64, 256), adaln_inputs, adaln_eager, adaln_fused),
    Case("adaln", "adaln[rms]", (1, 4096, 3072), (2, 64, 256), adaln_inputs, adaln_rms_eager, adaln_rms_fused),
    Case("adaln", "adaln[rms, no shift]", (1, 4096, 3072), (2, 64, 256), adaln_weight_inputs,
         adaln_noshift_eager, adaln_noshift_fused),
    Case("gelu_tanh", "gelu_tanh", (1, 4096, 12288), (2, 64, 1024), gelu_inputs,
         gelu_tanh_eager, gelu_tanh_fused),
    Case("mul_add", "mul_add", (1, 4096, 3072), (2, 64, 256), mul_add_inputs, mul_add_eager, mul_add_fused),
    # decode-step ops at an LLM decode step's scale: 32 heads of 128 over a 2048-token cache; a 4096 x 4096 linear
    Case("kv_attention", "kv_attention", (1, 32, 2048, 128), (1, 4, 64, 32), kv_attention_inputs,
         kv_attention_eager, fops.kv_attention),
    Case("gemv", "gemv", (1, 4096, 4096), (1, 256, 512), gemv_inputs, gemv_eager, fops.gemv),
]
OPS = sorted({c.op for c in CASES}, key=[c.op for c in CASES].index)
# --zoo: the size of the zoo's tiny models (fusegraph.zoo: batch 2, a few dozen tokens, hidden 32, heads of 16),
# where per-call costs, not bandwidth, decide
ZOO_SHAPES = {"rms_norm": (2, 32, 32), "rope": (2, 32, 2, 16), "adaln": (2, 32, 32), "gelu_tanh": (2, 32, 128),
              "mul_add": (2, 32, 32), "kv_attention": (2, 2, 32, 16), "gemv": (2, 128, 32)}
assert set(ZOO_SHAPES) == set(OPS)


# --- measuring -----------------------------------------------------------------------------------------

def _error_text(e: BaseException) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}".strip()


def measure_case(case: Case, dtype: torch.dtype, device: torch.device, *, quick: bool, backend: str | None,
                 warmup: int, reps: int, zoo: bool = False, route: bool = False) -> dict:
    """All numbers of one row (seconds; None where a variant could not run, with the reason). ``route``: also
    the composition compiled by fusegraph's default route (fusion, then Inductor), in the same interleaved runs."""
    shape = ZOO_SHAPES[case.op] if zoo else case.quick_shape if quick else case.shape
    args = case.inputs(shape, dtype, device)
    row = {"op": case.op, "label": case.label, "dtype": timing.DTYPE_NAMES[dtype], "shape": list(shape),
           "eager_s": None, "compiled_s": None, "compile_s": None, "fused_s": None, "copy_s": None,
           "copy_prealloc_s": None, "bytes": None, "max_abs_diff": None, "close": None,
           "fused_err64": None, "eager_err64": None,
           "compiled_max_abs_diff": None, "fused_error": None, "compiled_error": None,
           "route_s": None, "route_fused": None, "route_error": None}

    expected = case.eager(*args)
    ref64 = case.eager(*(a.double() for a in args))
    row["eager_err64"] = max_abs_diff(expected, ref64)
    fns = {"eager": lambda: case.eager(*args)}

    if backend is not None:
        torch.compiler.reset()  # a fresh compile per row: honest compile time, no recompile limit
        compiled = torch.compile(case.eager, backend=backend)
        try:
            row["compile_s"] = timing.first_call_seconds(lambda: compiled(*args), device=device)
            row["compiled_max_abs_diff"] = max_abs_diff(compiled(*args), expected)
            fns["compiled"] = lambda: compiled(*args)
        except Exception as e:  # noqa: BLE001 - report and go on (e.g. no C++ compiler for Inductor)
            row["compiled_error"] = _error_text(e)

    if route:
        from fusegraph import Backend

        torch.compiler.reset()
        fg = Backend()
        routed = torch.compile(case.eager, backend=fg)
        try:
            routed(*args)
            row["route_fused"] = sum(fg.stats.patterns.values())
            fns["route"] = lambda: routed(*args)
        except Exception as e:  # noqa: BLE001
            row["route_error"] = _error_text(e)

    try:
        out = case.fused(*args)
        row["max_abs_diff"] = max_abs_diff(out, expected)
        row["fused_err64"] = max_abs_diff(out, ref64)
        # bit-equal to eager: the op is eager's own composition there (kv_attention and gemv off the CPU), its
        # error against float64 eager's (the H200's bf16 SDPA is outside bf16's default tolerance by itself)
        row["close"] = out.dtype == expected.dtype and (_close(out, ref64.to(expected.dtype)) or
                                                        row["max_abs_diff"] == 0)
        fns["fused"] = lambda: case.fused(*args)
        del out
    except Exception as e:  # noqa: BLE001 - an op not yet built for this device/dtype is a row note
        row["fused_error"] = _error_text(e)

    row["bytes"] = timing.tensor_bytes(*args, expected)
    fns["copy"], fns["copy_prealloc"] = copy_limits(row["bytes"], timing.tensor_bytes(expected), device)
    del expected, ref64

    times = timing.interleaved_seconds(fns, device=device, warmup=warmup, reps=reps)
    for name, ts in times.items():
        row[f"{name}_s"] = statistics.median(ts)
        row[f"{name}_min_s"] = min(ts)
    return row


def copy_limits(traffic: int, out_bytes: int, device) -> tuple[Callable, Callable]:
    """Two copies that move ``traffic`` bytes (half read, half written), the fused op's inputs + output:

    - ``copy``: like the functional op, each call allocates a fresh ``out_bytes`` buffer and writes into it
      (plus into a preallocated spill buffer when half the traffic exceeds the output, e.g. mul_add's two
      full-size inputs); on CPU, fresh large buffers are new mmap'd pages whose first-touch faults every
      functional op pays, so this is the limit the op can reach;
    - ``copy_prealloc``: one ``copy_`` between preallocated buffers, the memory system alone.
    """
    n = math.ceil(traffic / 2 / 4)  # float32 elements read = written
    n_out = min(n, math.ceil(out_bytes / 4))
    src = torch.ones(n, dtype=torch.float32, device=device)
    spill = torch.empty(n - n_out, dtype=torch.float32, device=device)
    dst = torch.empty_like(src)

    def copy():
        out = torch.empty(n_out, dtype=torch.float32, device=device)
        out.copy_(src[:n_out])
        spill.copy_(src[n_out:])
        return out

    return copy, lambda: dst.copy_(src)


def max_abs_diff(out: torch.Tensor, expected: torch.Tensor) -> float:
    """max |out - expected| in float64 (inf when the shapes differ)."""
    if out.shape != expected.shape:
        return float("inf")
    return (out.double() - expected.double()).abs().max().item()


def _close(out: torch.Tensor, expected: torch.Tensor) -> bool:
    """Same shape and dtype, values within torch.testing's default tolerance for the dtype."""
    try:
        torch.testing.assert_close(out, expected)
        return True
    except AssertionError:
        return False


# --- report -------------------------------------------------------------------------------------------

HEADERS = ["op", "dtype", "shape", "eager", "compiled", "fused", "copy", "copy pre", "x eager",
           "fused/comp", "fused/copy", "max|diff|", "fp64 err fused/eager", "compile"]


def _t(s):
    return "-" if s is None else timing.fmt_time(s).strip()


def _ratio(a, b, fmt="{:.2f}"):
    return "-" if a is None or b is None else fmt.format(a / b)


ROUTE_HEADERS = ["fg route", "route/comp"]


def table_rows(rows: list[dict], route: bool = False) -> list[list[str]]:
    out = []
    for r in rows:
        fused = _t(r["fused_s"]) if r["fused_error"] is None else "n/a"
        diff = "-" if r["max_abs_diff"] is None else f"{r['max_abs_diff']:.1e}"
        err = "-" if r["fused_err64"] is None else \
            f"{r['fused_err64']:.1e}/{r['eager_err64']:.1e}" + ("" if r["close"] else " WRONG")
        out.append([r["label"], r["dtype"], "x".join(map(str, r["shape"])), _t(r["eager_s"]),
                    _t(r["compiled_s"]) if r["compiled_error"] is None else "error", fused, _t(r["copy_s"]),
                    _t(r["copy_prealloc_s"]), _ratio(r["eager_s"], r["fused_s"], "{:.2f}x"),
                    _ratio(r["fused_s"], r["compiled_s"]), _ratio(r["fused_s"], r["copy_s"]), diff, err,
                    _t(r["compile_s"])])
        if route:
            routed = "error" if r["route_error"] else _t(r["route_s"]) + ("" if r["route_fused"] else " (unfused)")
            out[-1] += [routed, _ratio(r["route_s"], r["compiled_s"])]
    return out


LEGEND = """\
medians of warm runs, the columns measured in turn; compiled = torch.compile(eager, backend={backend}).
x eager = eager/fused (speed-up); fused/comp, fused/copy = time ratios (< 1: fused faster).
copy = a copy moving the fused op's bytes (inputs + output) into a fresh output-sized buffer per call,
  like the functional op; copy pre = the same copy between preallocated buffers (no allocation).
max|diff| = fused vs eager; fp64 err = max abs error of fused and of eager vs the composition in float64
  (WRONG: fused outside torch.testing's default tolerance for the dtype, and not eager's own result).
compile = first call of the compiled code (compile + one run; on-disk caches may shorten it), apart."""
ROUTE_LEGEND = """fg route = the same composition through torch.compile(backend=fusegraph.Backend()): fusion, then Inductor
  (the fused op called from Inductor's generated code); route/comp = its time / the compiled column's."""


def parse_args(argv):
    p = argparse.ArgumentParser(prog="python -m fusegraph bench ops", description=__doc__.split("\n\n")[0])
    timing.add_run_args(p, quick_help="tiny shapes and few reps (smoke test)",
                        reps_help="timed runs per median (default 10, quick 3)")
    p.add_argument("--ops", default=",".join(OPS), help=f"comma list of ops (default all: {','.join(OPS)})")
    p.add_argument("--warmup", type=int, default=None, help="untimed runs first (default 2, quick 1)")
    p.add_argument("--zoo", action="store_true",
                   help="the zoo's tiny-model sizes (batch 2, 32 tokens, hidden 32), where per-call costs decide")
    p.add_argument("--route", action="store_true",
                   help="add a column: the composition compiled by fusegraph's default route (fusion + Inductor)")
    p.add_argument("--backend", default="inductor",
                   help="torch.compile backend of the 'compiled' column (default inductor; 'none' skips it)")
    return p.parse_args(argv)


def main(argv) -> int:
    args = parse_args(argv)
    try:
        device = timing.setup_device(args.device, args.threads)
        dtypes = timing.parse_dtypes(args.dtype)
        ops = [s.strip() for s in args.ops.split(",") if s.strip()]
        unknown = [o for o in ops if o not in OPS]
        if unknown or not ops:
            raise ValueError(f"--ops: unknown op(s) {unknown or args.ops!r}; expected a comma list of {', '.join(OPS)}")
    except ValueError as e:
        print(f"error: {e}")
        return 2
    backend = None if args.backend == "none" else args.backend
    warmup = args.warmup if args.warmup is not None else (1 if args.quick else 2)
    reps = args.reps if args.reps is not None else (3 if args.quick else 10)

    print(f"fusegraph bench ops: {timing.machine_summary(device)}")
    rows = []
    for case in (c for c in CASES if c.op in ops):
        for dtype in dtypes:
            row = measure_case(case, dtype, device, quick=args.quick, backend=backend, warmup=warmup, reps=reps,
                               zoo=args.zoo, route=args.route)
            rows.append(row)
            print(f"  measured {row['label']} {row['dtype']}", flush=True)

    print()
    print(timing.format_table(HEADERS + (ROUTE_HEADERS if args.route else []), table_rows(rows, args.route)))
    print(LEGEND.format(backend=backend or "none: skipped"))
    if args.route:
        print(ROUTE_LEGEND)
    for r in rows:
        for key in ("fused_error", "compiled_error", "route_error"):
            if r[key]:
                print(f"note: {r['label']} {r['dtype']}: {key.split('_')[0]} did not run: {r[key]}")

    if args.json:
        timing.write_json(args.json, {"subject": "ops", "facts": timing.run_facts(device),
                                      "settings": {"quick": args.quick, "zoo": args.zoo, "route": args.route,
                                                   "warmup": warmup, "reps": reps,
                                                   "compile_backend": backend},
                                      "rows": rows})
        print(f"wrote {args.json}")
    wrong = [r for r in rows if r["close"] is False]
    broken = [r for r in rows if r["fused_error"] and not r["fused_error"].startswith("NotImplementedError")]
    return 1 if wrong or broken else 0
