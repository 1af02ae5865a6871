"""``python -m fusegraph bench norm``: rms_norm and adaln against their eager compositions and a copy.

The fused ops are memory-bound; their floor is a copy of the same bytes. Reported per dtype: the fused
op, the eager expression it replaces, ``out.copy_(x)`` into a preallocated buffer and ``x.clone()``
(a copy that allocates its output, as the ops do). Medians of warm runs.
"""
from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F

from fusegraph.bench.timing import fmt_time, machine_summary, median_seconds


def _cases(x: torch.Tensor):
    D = x.shape[-1]
    w = torch.randn(D, dtype=x.dtype)
    emb = torch.randn(x.shape[0], 6 * D, dtype=x.dtype)
    shift, scale = (c[:, None] for c in emb.chunk(6, dim=1)[:2])  # [B,1,D] views, as AdaLayerNormZero
    out = torch.empty_like(x)

    def eager_rms_diffusers():
        n = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return n.to(w.dtype) * w if w.dtype != torch.float32 else n * w

    return [
        ("copy_ (preallocated out)", lambda: out.copy_(x)),
        ("clone (allocates out)", lambda: x.clone()),
        ("rms_norm torch  fused", lambda: torch.ops.fusegraph.rms_norm(x, w, 1e-6)),
        ("rms_norm torch  eager torch.rms_norm", lambda: torch.rms_norm(x, [D], w, 1e-6)),
        ("rms_norm diffusers fused", lambda: torch.ops.fusegraph.rms_norm(x, w, 1e-6, style="diffusers")),
        ("rms_norm diffusers eager RMSNorm.forward", eager_rms_diffusers),
        ("adaln fused", lambda: torch.ops.fusegraph.adaln(x, scale, shift, 1e-6)),
        ("adaln eager layer_norm*(1+scale)+shift", lambda: F.layer_norm(x, [D], eps=1e-6) * (1 + scale) + shift),
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusegraph bench norm", description=__doc__)
    p.add_argument("--shape", default="1,4096,3072")
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--repeats", type=int, default=3, help="whole-table repeats (the machine may be shared)")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    shape = tuple(int(s) for s in args.shape.split(","))
    print(machine_summary("cpu"))
    for dtype_name in args.dtypes.split(","):
        dtype = getattr(torch, dtype_name)
        x = torch.randn(*shape, dtype=dtype)
        print(f"\nx {list(shape)} {dtype_name} ({x.numel() * x.element_size() / 2**20:.0f} MiB)")
        results: dict[str, list[float]] = {}
        with torch.inference_mode():
            for _ in range(args.repeats):
                for name, fn in _cases(x):
                    results.setdefault(name, []).append(median_seconds(fn, warmup=3, reps=args.reps))
        copy_t = min(results["copy_ (preallocated out)"])
        clone_t = min(results["clone (allocates out)"])
        for name, ts in results.items():
            t = sorted(ts)[len(ts) // 2]
            print(f"  {name:42s} {fmt_time(t)}   {t / copy_t:5.2f}x copy_   {t / clone_t:5.2f}x clone"
                  f"   (repeats: {', '.join(fmt_time(v).strip() for v in ts)})")
    return 0
