"""``python -m fusegraph bench real [--model flux|sd35|wan|hunyuan_video|ltx|qwenimage] [--dtype fp32|bf16]
[--tokens IMG,TXT] [--layers N] [--variants A;B;...] [--reps N] [--threads N] [--device cpu|cuda]
[--interleave ROUNDS [--interleave-only]] [--json PATH]``

Diffusion transformers at the widths users run: the published configs of FLUX.1-dev, Stable Diffusion 3.5 Large,
Wan 2.1 1.3B, HunyuanVideo, LTX-Video and Qwen-Image (hidden size, heads x head dim, FFN, text dim, as their
transformer configs on the hub give them), with few blocks (``--layers``, default 1 of each block kind) and few
tokens (``--tokens``, default 256 image/video + 64 text) so that a variant runs in minutes on 2 cores; random
weights (norm weights and zero-initialised projections re-randomised, as in the zoo).

Each variant runs in a process of its own (resident memory is a process's) on an empty Inductor cache of its own
(``TORCHINDUCTOR_CACHE_DIR``, removed after; ``--warm`` adds a second process's first call on the cache the first
filled): the model and inputs are built, the
resident set read, the first call made (compile time, cold caches), two warm-up calls made, the
timed calls made, the resident set read again (the difference is what the compiled function holds), and the max
|diff| against eager taken in the same process. The processes run one after another, so a change of the machine's
load between them shows as a difference between rows; ``--interleave ROUNDS`` adds one more process holding every
variant that ran, compiled and warmed, and times them in ROUNDS rounds of one call each, the order rotated every
round (speeds only: a second table, and ``"interleaved"`` in the JSON; ``--interleave-only``: that table alone).
Variants:

- ``eager``; ``inductor`` (plain ``torch.compile``); ``inductor_tuned`` (``freezing`` + ``cpp_wrapper``, what a
  tuned CPU user sets); ``inductor_dynamic`` (``torch.compile(dynamic=True)``, as cache-dit compiles);
- ``fusegraph`` (the default config) and ``fusegraph:<overrides>`` (``fusegraph:pack_weights=True,concat_linear=True``,
  ``fusegraph:enable_freezing=True``, ``fusegraph:fusion_choice=always``, ``fusegraph:dynamic=True``);
- ``openvino``: ``openvino.convert_model`` + ``compile_model`` on CPU (an optional benchmark dependency,
  ``pip install openvino``; the row says so when it is missing). Its bf16 row converts the same weights in fp32
  and runs with ``INFERENCE_PRECISION_HINT=bf16``, OpenVINO's own way to run bf16 on CPU.

``--device cuda`` builds the model on the CPU (the same seeded weights) and moves it and its inputs to the GPU; each
timed call ends with a device synchronisation, and "resident +" is then the GPU memory the compiled function holds
(``torch.cuda.memory_reserved`` after its calls less before: its workspaces, CUDA-graph pools and weight copies).
On CUDA ``inductor_cudagraphs`` adds Inductor's own CUDA graphs (``mode="reduce-overhead"``), and
``fusegraph:mode=reduce-overhead`` fusegraph's (the compiled graph captured and replayed); ``openvino`` is CPU only.

``bench real --model flux`` is the weights benchmark of docs/BENCHMARKS.md §6 (FLUX.1 widths, 1 + 1 blocks).
"""
from __future__ import annotations

import argparse
import ast
import json
import os
import resource
import statistics
import subprocess
import sys
import time

DEFAULT_VARIANTS = ("eager", "inductor", "inductor_tuned", "fusegraph", "openvino")


def _rss_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _overrides(text: str) -> dict:
    """``NAME=VALUE,...`` as Python values: True/False/None, numbers and tuples as written, anything else a string
    (``graph_max_entries=4``, ``gelu_approximation=sigmoid``, ``graph_batch_buckets=(1,2,4)`` in one item)."""
    out = {}
    for item in _split_items(text):
        key, _, value = item.partition("=")
        value = value.strip()
        try:
            out[key.strip()] = ast.literal_eval(value)
        except (ValueError, SyntaxError):
            out[key.strip()] = value
    return out


def _split_items(text: str) -> list:
    """``text`` split at the commas outside brackets."""
    items, depth, current = [], 0, ""
    for ch in text:
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            items.append(current)
            current = ""
        else:
            current += ch
    return [i for i in items + [current] if i.strip()]


def fusegraph_compile_args(text: str) -> dict:
    """``torch.compile`` keyword arguments for the variant ``fusegraph:text``: ``mode=M`` as torch.compile's mode,
    ``dynamic=True`` as its ``dynamic`` (cache-dit compiles so), the rest as its ``options=`` (CompilationConfig and
    FusionPatterns fields by name, or Inductor options)."""
    from fusegraph import Backend, CompilationConfig
    from fusegraph.config import with_compile_args

    overrides = _overrides(text)
    mode = overrides.pop("mode", None)
    dynamic = overrides.pop("dynamic", None)
    if dynamic not in (None, True, False):
        raise SystemExit(f"bench: variant option 'dynamic' is {dynamic!r}; expected True or False")
    return {"backend": Backend(with_compile_args(CompilationConfig(), options=overrides)), "mode": mode,
            "dynamic": dynamic}


# --- the models: published transformer configs, fewer blocks -------------------------------------------------
# Each builder: (layers, img tokens, txt tokens, generator) -> (diffusers class name, init kwargs, forward kwargs,
# the width summary). Image/video token counts are rounded to the latent grids the configs' patch sizes allow.

def _side(tokens: int, patch: int = 1) -> int:
    """Latent side whose patched square grid holds about ``tokens`` tokens."""
    return max(1, round(tokens ** 0.5)) * patch


def _flux(layers, img, txt, g):
    import torch

    init = dict(patch_size=1, in_channels=64, num_layers=layers, num_single_layers=layers, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
                axes_dims_rope=(16, 56, 56))
    kw = dict(hidden_states=torch.randn(1, img, 64, generator=g), encoder_hidden_states=torch.randn(1, txt, 4096,
              generator=g), pooled_projections=torch.randn(1, 768, generator=g), timestep=torch.tensor([0.5]),
              img_ids=torch.randn(img, 3, generator=g), txt_ids=torch.zeros(txt, 3), guidance=torch.tensor([3.5]))
    return "FluxTransformer2DModel", init, kw, "FLUX.1-dev: hidden 3072 = 24 x 128, text 4096, pooled 768"


def _sd35(layers, img, txt, g):
    import torch

    side = _side(img, 2)
    init = dict(sample_size=128, patch_size=2, in_channels=16, num_layers=2 * layers, attention_head_dim=64,
                num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, qk_norm="rms_norm")
    kw = dict(hidden_states=torch.randn(1, 16, side, side, generator=g), encoder_hidden_states=torch.randn(
              1, txt, 4096, generator=g), pooled_projections=torch.randn(1, 2048, generator=g),
              timestep=torch.tensor([500.0]))
    return "SD3Transformer2DModel", init, kw, "SD3.5 Large: hidden 2432 = 38 x 64, text 4096, pooled 2048"


def _wan(layers, img, txt, g):
    import torch

    side = _side(img, 2)
    init = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=2 * layers,
                cross_attn_norm=True, qk_norm="rms_norm_across_heads", eps=1e-6, rope_max_seq_len=1024)
    kw = dict(hidden_states=torch.randn(1, 16, 1, side, side, generator=g),
              encoder_hidden_states=torch.randn(1, txt, 4096, generator=g), timestep=torch.tensor([500]))
    return "WanTransformer3DModel", init, kw, "Wan 2.1 1.3B: hidden 1536 = 12 x 128, FFN 8960, text 4096"


def _hunyuan_video(layers, img, txt, g):
    import torch

    side = _side(img, 2)
    init = dict(in_channels=16, out_channels=16, num_attention_heads=24, attention_head_dim=128, num_layers=layers,
                num_single_layers=layers, num_refiner_layers=2, mlp_ratio=4.0, patch_size=2, patch_size_t=1,
                qk_norm="rms_norm", guidance_embeds=True, text_embed_dim=4096, pooled_projection_dim=768,
                rope_theta=256.0, rope_axes_dim=(16, 56, 56))
    kw = dict(hidden_states=torch.randn(1, 16, 1, side, side, generator=g), timestep=torch.tensor([500]),
              encoder_hidden_states=torch.randn(1, txt, 4096, generator=g),
              encoder_attention_mask=torch.ones(1, txt), pooled_projections=torch.randn(1, 768, generator=g),
              guidance=torch.tensor([3500.0]))
    return ("HunyuanVideoTransformer3DModel", init, kw,
            "HunyuanVideo: hidden 3072 = 24 x 128, text 4096, pooled 768, 2 refiner layers")


def _ltx(layers, img, txt, g):
    import torch

    side = _side(img)
    init = dict(in_channels=128, out_channels=128, patch_size=1, patch_size_t=1, num_attention_heads=32,
                attention_head_dim=64, cross_attention_dim=2048, num_layers=2 * layers, caption_channels=4096,
                qk_norm="rms_norm_across_heads", norm_elementwise_affine=False, norm_eps=1e-6)
    kw = dict(hidden_states=torch.randn(1, side * side, 128, generator=g),
              encoder_hidden_states=torch.randn(1, txt, 4096, generator=g), timestep=torch.tensor([500]),
              encoder_attention_mask=torch.ones(1, txt, dtype=torch.bool), num_frames=1, height=side, width=side)
    return "LTXVideoTransformer3DModel", init, kw, "LTX-Video: hidden 2048 = 32 x 64, caption 4096"


def _qwenimage(layers, img, txt, g):
    import torch

    side = _side(img)
    init = dict(patch_size=2, in_channels=64, out_channels=16, num_layers=2 * layers, attention_head_dim=128,
                num_attention_heads=24, joint_attention_dim=3584, guidance_embeds=False, axes_dims_rope=(16, 56, 56))
    kw = dict(hidden_states=torch.randn(1, side * side, 64, generator=g),
              encoder_hidden_states=torch.randn(1, txt, 3584, generator=g),
              encoder_hidden_states_mask=torch.ones(1, txt, dtype=torch.long), timestep=torch.tensor([0.5]),
              img_shapes=[(1, side, side)])
    return "QwenImageTransformer2DModel", init, kw, "Qwen-Image: hidden 3072 = 24 x 128, text 3584"


MODELS = {"flux": _flux, "sd35": _sd35, "wan": _wan, "hunyuan_video": _hunyuan_video, "ltx": _ltx,
          "qwenimage": _qwenimage}


def build(name: str, dtype, img_tokens: int = 256, txt_tokens: int = 64, layers: int = 1, seed: int = 0,
          device: str = "cpu"):
    """(model, forward kwargs, width summary) of ``name`` at its published widths, eval mode, ``dtype``, on
    ``device`` (built and seeded on the CPU, then moved: the same weights on every device)."""
    import diffusers
    import torch

    from ..zoo import _cast, randomize_weights

    diffusers.utils.logging.set_verbosity_error()
    g = torch.Generator().manual_seed(seed)
    cls_name, init, kw, summary = MODELS[name](layers, img_tokens, txt_tokens, g)
    torch.manual_seed(seed)
    model = getattr(diffusers, cls_name)(**init)
    randomize_weights(model, seed, ())
    kw = _cast(kw, dtype)
    for k in ("img_ids", "txt_ids"):  # positions stay fp32, as the pipelines pass them
        if k in kw:
            kw[k] = kw[k].float()
    if device != "cpu":
        kw = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in kw.items()}
    return model.eval().to(device=device, dtype=dtype), dict(kw, return_dict=False), summary


def build_flux_real(dtype, img_tokens: int, txt_tokens: int):
    """FLUX.1 widths, 1 + 1 blocks (docs/BENCHMARKS.md §6, scripts/ab_freezing.py): (model, forward kwargs)."""
    model, kw, _ = build("flux", dtype, img_tokens, txt_tokens)
    return model, kw


# --- OpenVINO ---------------------------------------------------------------------------------------------------

def _openvino(model, inputs: dict, dtype, threads: int, restore: bool = False):
    """A callable running ``model`` through OpenVINO's CPU runtime (converted on the first call, which is what its
    first-call time includes), taking the same kwargs and returning (torch tensor,). A bf16 model is cast to fp32
    in place for the conversion, and back to bf16 after it with ``restore`` (where other variants share the
    model: bf16 -> fp32 -> bf16 is exact). Not on a copy: a copy's caches are empty, and Qwen-Image's RoPE cache,
    filled on a first call with complex ops, is what OpenVINO cannot convert."""
    import openvino as ov
    import torch

    names = [k for k, v in inputs.items() if isinstance(v, torch.Tensor)]
    static = {k: v for k, v in inputs.items() if not isinstance(v, torch.Tensor)}
    fp32 = model.float() if dtype != torch.float32 else model

    class Positional(torch.nn.Module):  # convert_model traces positional tensors; the rest are constants
        def __init__(self):
            super().__init__()
            self.model = fp32

        def forward(self, *tensors):
            out = self.model(**dict(zip(names, tensors)), **static)
            return out[0] if isinstance(out, (tuple, list)) else out

    state = {}

    def run(**kw):
        args = [kw[k].float() if kw[k].is_floating_point() else kw[k] for k in names]
        if "compiled" not in state:
            try:
                try:
                    ov_model = ov.convert_model(Positional().eval(), example_input=tuple(args))
                except Exception as e:  # TorchScript tracing fails on some models (HunyuanVideo:
                    # aten::masked_fill with a bool value, torch 2.13): OpenVINO's other front end, from torch.export
                    print(f"openvino: TorchScript conversion failed ({type(e).__name__}); converting via "
                          "torch.export", file=sys.stderr)
                    ov_model = ov.convert_model(torch.export.export(Positional().eval(), tuple(args)))
                config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
                          "INFERENCE_PRECISION_HINT": "bf16" if dtype == torch.bfloat16 else "f32"}
                state["compiled"] = ov.compile_model(ov_model, "CPU", config)
            finally:  # converted or not (bf16 under the AVX2 caps fails to compile), the others get bf16 back
                if restore and dtype != torch.float32:
                    model.to(dtype)
        result = state["compiled"]([a.numpy() for a in args])
        return (torch.from_numpy(result[0]).to(dtype),)

    return run


def _make_fn(model, inputs: dict, dtype, variant: str, threads: int, shared: bool = False):
    """The callable ``variant`` runs ``model`` with (compiled on its first call); ``shared``: other variants use
    ``model`` too (OpenVINO's bf16 row then casts it back to bf16 once converted)."""
    import torch

    if variant == "eager":
        return model
    if variant == "inductor":
        return torch.compile(model)
    if variant == "inductor_tuned":
        return torch.compile(model, options={"freezing": True, "cpp_wrapper": True})
    if variant == "inductor_cudagraphs":
        return torch.compile(model, mode="reduce-overhead")
    if variant == "inductor_dynamic":
        return torch.compile(model, dynamic=True)
    if variant == "openvino":
        return _openvino(model, inputs, dtype, threads, restore=shared)
    if variant.split(":")[0] == "fusegraph":
        # fusegraph:mode=reduce-overhead, fusegraph:pack_weights=True, fusegraph:enable_linear=True, ...
        return torch.compile(model, **fusegraph_compile_args(variant.partition(":")[2]))
    raise SystemExit(f"bench real: argument --variants: unknown variant {variant!r}")


def _memory_mib(device: str) -> float:
    """What the process holds: its resident set on the CPU, the caching allocator's reserve on a GPU."""
    if device == "cpu":
        return _rss_mib()
    import torch

    torch.cuda.synchronize()
    return torch.cuda.memory_reserved() / 2**20


def _timed(fn, inputs: dict, device: str) -> float:
    """Seconds of one call of ``fn``, to the end of its device work."""
    return _timed_faults(fn, inputs, device)[0]


def _minor_faults() -> int:
    """The process's minor page faults so far (pages the kernel had to map and zero on first touch)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _timed_faults(fn, inputs: dict, device: str) -> tuple:
    """(seconds, minor page faults) of one call of ``fn``, to the end of its device work. The faults are memory
    the call touched that the process did not hold: on CPU, buffers glibc's malloc had returned to the system
    since the last call (it trims the top of its heap on free and serves large requests with fresh mappings),
    each page mapped and zeroed again, ~1-7 us apiece in a virtual machine."""
    import torch

    sync = torch.cuda.synchronize if device != "cpu" else (lambda: None)
    sync()
    f0 = _minor_faults()
    t0 = time.perf_counter()
    fn(**inputs)
    sync()
    return time.perf_counter() - t0, _minor_faults() - f0


def run_variant(model_name: str, variant: str, dtype_name: str, img_tokens: int, txt_tokens: int, layers: int,
                reps: int, threads: int, device: str = "cpu") -> dict:
    """One variant, in this process: the row's figures."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model, inputs, _ = build(model_name, dtype, img_tokens, txt_tokens, layers, device=device)
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    warmup = 2
    with torch.no_grad():
        ref = model(**inputs)[0]  # eager's output first: the OpenVINO variant converts the model to fp32
        ref = ref.clone()  # (a CUDA-graph variant's output is overwritten by its next replay)
        rss0 = _memory_mib(device)
        fn = _make_fn(model, inputs, dtype, variant, threads)
        t0 = time.perf_counter()
        out = fn(**inputs)[0].clone()
        if device != "cpu":
            torch.cuda.synchronize()
        first = time.perf_counter() - t0
        for _ in range(warmup):
            fn(**inputs)
        timed = [_timed_faults(fn, inputs, device) for _ in range(reps)]
        times = [t for t, _ in timed]
        rss1 = _memory_mib(device)
    return {"model": model_name, "variant": variant, "dtype": dtype_name, "device": device,
            "weights_mib": weight_bytes / 2**20,
            "resident_mib": rss1 - rss0, "first_s": first, "median_s": statistics.median(times),
            "faults_per_call": statistics.median(f for _, f in timed),
            "max_diff": float((out.float() - ref.float()).abs().max()), "ref_max": float(ref.float().abs().max())}


def run_interleaved(model_name: str, variants: list, dtype_name: str, img_tokens: int, txt_tokens: int,
                    layers: int, rounds: int, threads: int, device: str = "cpu") -> dict:
    """Every variant in this one process, on one model: each compiled and warmed (first call + 2; OpenVINO's
    conversion first), then ``rounds`` rounds calling each once, the order rotated by one every round, so that a
    change of the machine's load hits every variant alike. ``{"order": [[variant, ...] per round], "times_s": {variant: [s per round]},
    "median_s": {variant: s}, "first_s": {variant: s}, "memory_mib": {variant: MiB}}``: ``first_s`` is each
    variant's first call (its compile; the variants compile one after another in this process, so a later one may
    find kernels an earlier one compiled), ``memory_mib`` what the process's memory grew by over the variant's
    compile and first three calls (resident set; on CUDA the allocator's reserve), ``faults_per_call`` the median
    minor page faults of its timed calls (``_timed_faults``; the variants share this process's heap, so a call's
    count also depends on what the call before it left there), ``failed`` {variant: "Error: its last line"} for a
    variant that could not compile or make its first calls here (the others are timed without it). OpenVINO's
    converted copy of the weights stays resident beside the model."""
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model, inputs, _ = build(model_name, dtype, img_tokens, txt_tokens, layers, device=device)
    fns = {}
    with torch.no_grad():
        model(**inputs)  # an eager call first, as in run_variant: it fills the model's caches (Qwen-Image's RoPE)
        # OpenVINO converts first, before any compile sees the model it casts to fp32 and back
        first, memory, failed = {}, {}, {}
        for variant in sorted(variants, key=lambda v: v != "openvino"):
            mem0 = _memory_mib(device)
            try:
                fn = _make_fn(model, inputs, dtype, variant, threads, shared=True)
                first[variant] = _timed(fn, inputs, device)
                for _ in range(2):
                    fn(**inputs)
            except Exception as e:  # one variant that cannot run here (OpenVINO's bf16 under the AVX2 caps)
                lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]  # OpenVINO's reason is its last
                failed[variant] = f"{type(e).__name__}: {lines[-1] if lines else ''}"
                first.pop(variant, None)
                continue
            memory[variant] = _memory_mib(device) - mem0
            fns[variant] = fn
        variants = [v for v in variants if v not in failed]
        times = {v: [] for v in variants}
        faults = {v: [] for v in variants}
        orders = []
        for r in range(rounds):
            k = r % len(variants)
            order = variants[k:] + variants[:k]
            orders.append(order)
            for variant in order:
                t, f = _timed_faults(fns[variant], inputs, device)
                times[variant].append(t)
                faults[variant].append(f)
    return {"order": orders, "times_s": times, "median_s": {v: statistics.median(t) for v, t in times.items()},
            "first_s": first, "memory_mib": memory,
            "faults_per_call": {v: statistics.median(f) for v, f in faults.items()}, "failed": failed}


def main(argv=None) -> int:
    from .timing import positive_int

    p = argparse.ArgumentParser(prog="python -m fusegraph bench real", description=__doc__.split("\n\n")[1])
    p.add_argument("--model", choices=sorted(MODELS), default="flux")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--tokens", default="256,64", help="image/video and text tokens (default 256,64)")
    p.add_argument("--layers", type=int, default=1, help="blocks of each kind (default 1: FLUX.1 and HunyuanVideo 1 double + 1 single block; the single-kind models 2 blocks)")
    p.add_argument("--variants", default=";".join(DEFAULT_VARIANTS),
                   help="';'-separated (default: %(default)s); 'fusegraph:NAME=VALUE,...' sets CompilationConfig or "
                   "FusionPatterns fields or Inductor options, as torch.compile(options=...) does (mode=M: "
                   "torch.compile's mode, dynamic=True: its dynamic); inductor_dynamic: torch.compile(dynamic=True)")
    p.add_argument("--reps", type=positive_int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                   help="where the model runs (default cpu); cuda: timed to the end of the GPU's work, memory is "
                        "the GPU's")
    p.add_argument("--json", default=None)
    p.add_argument("--warm", action="store_true",
                   help="also time the first call of a second process on the same cache (warm-cache compile)")
    p.add_argument("--interleave", type=int, default=0, metavar="ROUNDS",
                   help="also time every variant in one process, ROUNDS rotating rounds (speed only; the "
                        "per-process rows keep first call and memory)")
    p.add_argument("--interleave-only", action="store_true",
                   help="with --interleave: only the one-process table (no per-process rows)")
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a single variant, in this process
    p.add_argument("--together", action="store_true", help=argparse.SUPPRESS)  # --interleave's process
    args = p.parse_args(argv)
    try:
        img, txt = (int(v) for v in args.tokens.split(","))
    except ValueError:
        p.error(f"argument --tokens: expected IMG,TXT (two integers), got {args.tokens!r}")
    if min(img, txt) < 1 or args.layers < 1 or args.reps < 1 or args.threads < 1:
        p.error("argument --tokens/--layers/--reps/--threads: expected positive integers")
    if args.interleave < 0 or args.interleave == 1:
        p.error(f"argument --interleave: expected 0 (off) or at least 2 rounds, got {args.interleave}")
    if args.interleave_only and not args.interleave:
        p.error("argument --interleave-only: needs --interleave ROUNDS")
    variants = [v for v in args.variants.split(";") if v]
    if args.device != "cpu" and "openvino" in variants:
        if args.variants != ";".join(DEFAULT_VARIANTS):
            p.error(f"argument --variants: openvino runs on the CPU only, not with --device {args.device}")
        variants.remove("openvino")
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        p.error("argument --device: cuda, but torch sees no CUDA device")
    torch.set_num_threads(args.threads)
    if args.one is not None:
        print(json.dumps(run_variant(args.model, args.one, args.dtype, img, txt, args.layers, args.reps,
                                     args.threads, args.device)))
        return 0
    if args.together:
        print(json.dumps(run_interleaved(args.model, variants, args.dtype, img, txt, args.layers,
                                         args.interleave, args.threads, args.device)))
        return 0
    from .timing import machine_summary

    summary = MODELS[args.model](args.layers, img, txt, torch.Generator())[3]
    print(f"{summary}; blocks x{args.layers}, {img}+{txt} tokens, {args.dtype}; {machine_summary(args.device)}")
    if not args.interleave_only:
        print(f"{'variant':40s} {'weights':>9s} {'resident +':>11s} {'% of w':>7s} {'first call':>11s} "
              f"{'median':>10s} {'vs inductor':>12s} {'faults/call':>11s} {'max|diff|':>10s} {'/ max|out|':>10s}")
    rows = []
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    import shutil
    import tempfile
    ran = []
    for variant in variants:
        if variant == "openvino":
            try:
                import openvino  # noqa: F401
            except ImportError:
                print(f"{variant:40s} not installed (optional: pip install openvino)")
                continue
        if args.interleave_only:
            ran.append(variant)
            continue
        cmd = [sys.executable, "-m", "fusegraph", "bench", "real", "--one", variant, "--model", args.model,
               "--dtype", args.dtype, "--tokens", args.tokens, "--layers", str(args.layers), "--reps",
               str(args.reps), "--threads", str(args.threads), "--device", args.device]
        cache = tempfile.mkdtemp(prefix="fusegraph_bench_real_")  # cold: every variant compiles from nothing
        try:
            venv = dict(env, TORCHINDUCTOR_CACHE_DIR=cache)
            proc = subprocess.run(cmd, capture_output=True, text=True, env=venv)
            lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
            if proc.returncode != 0 or not lines:
                tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                print(f"{variant:40s} failed: {tail[:200]}")
                continue
            row = json.loads(lines[-1])
            if args.warm and variant not in ("eager", "openvino"):
                again = subprocess.run(cmd[:cmd.index("--reps") + 1] + ["1"] + cmd[cmd.index("--reps") + 2:],
                                       capture_output=True, text=True, env=venv)
                lines = [ln for ln in again.stdout.splitlines() if ln.startswith("{")]
                row["first_warm_s"] = json.loads(lines[-1])["first_s"] if again.returncode == 0 and lines else None
        finally:
            shutil.rmtree(cache, ignore_errors=True)
        rows.append(row)
        ran.append(variant)
        base = next((r["median_s"] for r in rows if r["variant"] == "inductor"), None)
        rel = f"{base / row['median_s']:11.3f}x" if base else f"{'':12s}"
        print(f"{variant:40s} {row['weights_mib']:7.0f} M {row['resident_mib']:9.0f} M "
              f"{100 * row['resident_mib'] / row['weights_mib']:6.1f}% {row['first_s']:9.1f} s "
              f"{'' if row.get('first_warm_s') is None else format(row['first_warm_s'], '5.1f') + ' s warm  '}"
              f"{row['median_s'] * 1e3:8.0f} ms {rel} {row['faults_per_call']:11.0f} {row['max_diff']:10.2e} "
              f"{row['max_diff'] / max(row['ref_max'], 1e-30):10.2e}", flush=True)
    interleaved = None
    if args.interleave:  # what failed or is not installed above is left out here too
        interleaved = _interleave_process(args, ran, env)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_summary(args.device), "device": args.device, "model": args.model,
                       "tokens": [img, txt], "layers": args.layers, "rows": rows, "interleaved": interleaved}, f,
                      indent=1)
    complete = len(ran) == len(variants) if args.interleave_only else len(rows) == len(variants)
    if interleaved and interleaved.get("failed"):
        complete = False
    return 0 if complete and (not args.interleave or interleaved) else 1


def _interleave_process(args, variants: list, env: dict):
    """``--interleave``: every variant timed in one process (``run_interleaved``), printed as a second table."""
    import shutil
    import tempfile

    from .timing import machine_summary

    if not variants:
        return None
    print(f"interleaved: {', '.join(variants)} in one process, {args.interleave} rounds, order rotated each "
          f"round; {machine_summary(args.device)}")
    cmd = [sys.executable, "-m", "fusegraph", "bench", "real", "--together", "--variants", ";".join(variants),
           "--model", args.model, "--dtype", args.dtype, "--tokens", args.tokens, "--layers", str(args.layers),
           "--interleave", str(args.interleave), "--threads", str(args.threads), "--device", args.device]
    cache = tempfile.mkdtemp(prefix="fusegraph_bench_real_")
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=dict(env, TORCHINDUCTOR_CACHE_DIR=cache))
    finally:
        shutil.rmtree(cache, ignore_errors=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
        print(f"interleaved: failed: {tail[:200]}")
        return None
    result = json.loads(lines[-1])
    med = result["median_s"]
    base = med.get("inductor")
    print(f"{'variant':40s} {'median':>11s} {'vs inductor':>12s} {'first call':>11s} {'memory +':>10s} "
          f"{'faults/call':>11s}   per round")
    for v, why in result.get("failed", {}).items():
        print(f"{v:40s} failed: {why[:200]}")
    for v in variants:
        if v not in med:
            continue
        rel = f"{base / med[v]:11.3f}x" if base else f"{'':12s}"
        spread = " ".join(f"{t * 1e3:.1f}" for t in result["times_s"][v])
        print(f"{v:40s} {med[v] * 1e3:8.2f} ms {rel} {result['first_s'][v]:9.1f} s {result['memory_mib'][v]:8.0f} M"
              f" {result['faults_per_call'][v]:11.0f}   (ms): {spread}", flush=True)
    return result
