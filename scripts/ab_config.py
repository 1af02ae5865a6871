"""Zoo models: fusegraph configurations side by side with plain Inductor, in one process, interleaved rounds,
medians (the A/B that decides a default).
Usage: OMP_NUM_THREADS=1 ROUNDS=41 .venv/bin/python scripts/ab_config.py MODEL[,MODEL...] [fp32|bf16] \
           'name:key=value,key=value' ...
e.g.   scripts/ab_config.py FluxTransformer2DModel,WanTransformer3DModel fp32 'default:' 'nofreeze:enable_freezing=False'
Prints, per model, each variant's median and its ratio to plain torch.compile; then the geometric means."""
import math
import os
import statistics
import sys
import time

import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
from fusegraph import Backend, CompilationConfig, zoo  # noqa: E402
from fusegraph.bench.real import _overrides  # noqa: E402

models = sys.argv[1].split(",") if sys.argv[1] != "all" else zoo.names()
dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[sys.argv[2] if len(sys.argv) > 2 else "fp32"]
configs = {spec.partition(":")[0]: _overrides(spec.partition(":")[2]) for spec in sys.argv[3:]} or {"default": {}}
rounds = int(os.environ.get("ROUNDS", 41))
print(f"{len(models)} zoo models, {dtype}, {torch.get_num_threads()} thread(s), {rounds} rounds, torch "
      f"{torch.__version__}; variants: inductor, " + ", ".join(f"{k} {v}" for k, v in configs.items()), flush=True)
ratios = {k: [] for k in configs}
for name in models:
    model, kw = zoo.build(name, dtype)
    torch._dynamo.reset()
    fns = {"inductor": torch.compile(model)}
    fns.update({k: torch.compile(model, backend=Backend(CompilationConfig(**cfg))) for k, cfg in configs.items()})
    times = {k: [] for k in fns}
    try:
        with torch.no_grad():
            for fn in fns.values():
                for _ in range(3):
                    fn(**kw)
            names = list(fns)
            for i in range(rounds):
                for k in names[i % len(names):] + names[:i % len(names)]:
                    t = time.perf_counter()
                    fns[k](**kw)
                    times[k].append(time.perf_counter() - t)
    except Exception as e:  # a model a variant cannot compile: say so, go on
        print(f"{name:40s} failed: {type(e).__name__}: {str(e)[:150]}", flush=True)
        continue
    base = statistics.median(times["inductor"])
    row = f"{name:40s} inductor {base * 1e3:8.3f} ms"
    for k in configs:
        r = base / statistics.median(times[k])
        ratios[k].append(r)
        row += f"  {k} {r:6.3f}x"
    print(row, flush=True)
for k, rs in ratios.items():
    if rs:
        print(f"{k}: geomean {math.exp(sum(map(math.log, rs)) / len(rs)):.3f}x inductor over {len(rs)} models, "
              f"min {min(rs):.3f}x, below 1.0: {sum(r < 1.0 for r in rs)}")
