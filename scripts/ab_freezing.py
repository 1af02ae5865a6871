"""FLUX.1 widths (1+1 blocks, 64+16 tokens): fusegraph with aliasing freezing vs concat_linear=True vs Inductor, in one
process, interleaved rounds. Usage: OMP_NUM_THREADS=1 ROUNDS=5 .venv/bin/python scripts/ab_freezing.py fp32|bf16"""
import torch, time, statistics, sys, os
torch.set_num_threads(1)
from fusegraph import Backend, CompilationConfig
from fusegraph.bench.weights import build_flux_real
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[1]]
model, inp = build_flux_real(dtype, 64, 16)
variants = {}
cfgs = {"alias (new default)": dict(fusion_choice="model"), "concat_linear": dict(fusion_choice="model", concat_linear=True),
        "inductor": None}
with torch.no_grad():
    for name, cfg in cfgs.items():
        fn = torch.compile(model) if cfg is None else torch.compile(model, backend=Backend(CompilationConfig(**cfg)))
        t = time.perf_counter(); fn(**inp); print(name, "first", round(time.perf_counter() - t, 1), "s", flush=True)
        variants[name] = fn
    times = {k: [] for k in variants}
    for r in range(int(os.environ.get("ROUNDS", 5))):
        for k, fn in variants.items():
            t = time.perf_counter(); fn(**inp); times[k].append(time.perf_counter() - t)
    for k, v in times.items(): print(f"{k:22s} median {statistics.median(v)*1e3:.0f} ms  {[round(x*1e3) for x in v]}")
