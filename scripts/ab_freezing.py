"""FLUX.1 widths (1+1 blocks): the weight policies of fusegraph's fused compile side by side, in one process,
interleaved rounds, medians: aliasing freezing (no weight copy), pack_weights=True (oneDNN-packed
bf16 linears, a copy), pack_weights + concat_linear (the former default), freezing off (the Inductor route's default since
issue 23), and plain Inductor.
fusion_choice="always" for every fusegraph variant, so that only the weight policy differs.
Usage: OMP_NUM_THREADS=1 ROUNDS=7 TOKENS=256,64 .venv/bin/python scripts/ab_freezing.py fp32|bf16 [names...]"""
import os
import statistics
import sys
import time

import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
from fusegraph import Backend, CompilationConfig  # noqa: E402
from fusegraph.bench.real import build_flux_real  # noqa: E402

dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1]]
img, txt = (int(v) for v in os.environ.get("TOKENS", "256,64").split(","))
model, inp = build_flux_real(dtype, img, txt)
cfgs = {"alias": dict(fusion_choice="always", enable_freezing=True),
        "pack_weights": dict(fusion_choice="always", enable_freezing=True, pack_weights=True),
        "pack+concat (former)": dict(fusion_choice="always", enable_freezing=True, pack_weights=True,
                                     concat_linear=True),
        "freezing off (default)": dict(fusion_choice="always", enable_freezing=False),
        "inductor": None}
wanted = sys.argv[2:] or list(cfgs)
print(f"FLUX.1 widths, 1+1 blocks, {img}+{txt} tokens, {sys.argv[1]}, {torch.get_num_threads()} thread(s), "
      f"torch {torch.__version__}", flush=True)
variants = {}
with torch.no_grad():
    ref = model(**inp)[0].float()
    for name, cfg in cfgs.items():
        if name not in wanted:
            continue
        fn = torch.compile(model) if cfg is None else torch.compile(model, backend=Backend(CompilationConfig(**cfg)))
        t = time.perf_counter()
        out = fn(**inp)[0]
        print(f"{name:22s} first call {time.perf_counter() - t:6.1f} s, max|diff| vs eager "
              f"{(out.float() - ref).abs().max().item():.2e}", flush=True)
        variants[name] = fn
    times = {k: [] for k in variants}
    for _ in range(2):  # warm-up
        for fn in variants.values():
            fn(**inp)
    for _ in range(int(os.environ.get("ROUNDS", 7))):
        for k, fn in variants.items():
            t = time.perf_counter()
            fn(**inp)
            times[k].append(time.perf_counter() - t)
    base = statistics.median(times["inductor"]) if "inductor" in times else None
    for k, v in times.items():
        med = statistics.median(v)
        rel = f"  {base / med:.3f}x inductor" if base else ""
        print(f"{k:22s} median {med * 1e3:8.1f} ms{rel}   {[round(x * 1e3) for x in v]}")
