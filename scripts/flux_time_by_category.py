"""Where one FLUX.1-width call (or another ``bench real`` model's: ``--model``) spends its time, by category, in
eager, fusegraph (default route), Inductor and OpenVINO (issue 38, item 2). Run it under a CPU class's caps
(``fusegraph._core.cpu_class.environment``), e.g. AVX2:

    OMP_NUM_THREADS=1 ONEDNN_MAX_CPU_ISA=AVX2 ATEN_CPU_CAPABILITY=avx2 MKL_ENABLE_INSTRUCTIONS=AVX2 \\
        .venv/bin/python scripts/flux_time_by_category.py --dtype fp32

The model is ``bench real``'s FLUX.1 (1 double + 1 single block, 256 + 64 tokens). eager and fusegraph are profiled
with torch.profiler (self CPU time of each op, 3 calls after warm-up; Inductor's generated kernels run inside its
C++ wrapper and are not ops the profiler sees: they are what the call's wall time leaves after the ops it saw);
OpenVINO with its own per-node performance counters (``PERF_COUNT``, 3 inferences), grouped by node type.
Categories: GEMM (linears, matmuls), attention (SDPA and its parts), fusegraph's fused ops, layout (copies,
transposes, reorders, casts, concatenations), and the rest (elementwise, norms, ...).
"""
from __future__ import annotations

import argparse
import collections
import statistics
import time

import torch

GEMM = ("addmm", "mm", "bmm", "matmul", "linear", "_linear_pointwise", "gemv", "fullyconnected")
ATTENTION = ("scaled_dot_product", "_flash_attention", "softmax", "sdpa", "scaleddotproductattention")
LAYOUT = ("reorder", "transpose", "permute", "copy", "contiguous", "clone", "convert", "_to_copy", "cat", "concat")


def category(name: str) -> str:
    n = name.lower()
    if n.startswith("fusegraph::") and not any(g in n for g in ("linear", "gemv")):
        return "fused ops"
    if any(g == n.split("::")[-1] or n.endswith(g) for g in GEMM) or "gemm" in n or "fullyconnected" in n:
        return "GEMM"
    if any(a in n for a in ATTENTION):
        return "attention"
    if any(c in n for c in LAYOUT):
        return "layout"
    return "rest"


def torch_profile(fn, kw, reps: int = 3) -> tuple:
    """(wall seconds per call, {category: self CPU seconds per call}) of ``fn(**kw)``."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(2):
        fn(**kw)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn(**kw)
        wall = (time.perf_counter() - t0) / reps
    cats = collections.Counter()
    for e in prof.key_averages():
        if e.key.startswith("ProfilerStep") or e.key.startswith("Torch-Compiled") or e.key.startswith("##"):
            continue
        cats[category(e.key)] += e.self_cpu_time_total / 1e6 / reps
    return wall, dict(cats)


def openvino_profile(model, kw, dtype, threads: int, reps: int = 3) -> tuple:
    """(median wall seconds per inference, {category: seconds per inference}) from OpenVINO's own counters; the
    model converted as ``bench real``'s OpenVINO row converts it (fp32 weights; bf16 as a precision hint)."""
    import openvino as ov

    names = [k for k, v in kw.items() if isinstance(v, torch.Tensor)]
    static = {k: v for k, v in kw.items() if not isinstance(v, torch.Tensor)}
    args = [kw[k].float() if kw[k].is_floating_point() else kw[k] for k in names]
    fp32 = model.float()

    class Positional(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.model = fp32

        def forward(self, *tensors):
            out = self.model(**dict(zip(names, tensors)), **static)
            return out[0] if isinstance(out, (tuple, list)) else out

    converted = ov.convert_model(Positional().eval(), example_input=tuple(args))
    config = {"INFERENCE_NUM_THREADS": threads, "PERFORMANCE_HINT": "LATENCY", "NUM_STREAMS": 1,
              "INFERENCE_PRECISION_HINT": "bf16" if dtype == torch.bfloat16 else "f32", "PERF_COUNT": "YES"}
    request = ov.Core().compile_model(converted, "CPU", config).create_infer_request()
    feed = [a.numpy() for a in args]
    for _ in range(2):
        request.infer(feed)
    walls, cats = [], collections.Counter()
    for _ in range(reps):
        t0 = time.perf_counter()
        request.infer(feed)
        walls.append(time.perf_counter() - t0)
        for info in request.profiling_info:
            cats[category(info.node_type)] += info.real_time.total_seconds() / reps
    return statistics.median(walls), dict(cats)


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--model", default="flux", help="a bench real model (flux, wan, sd35, ...)")
    p.add_argument("--skip-openvino", action="store_true")
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    from fusegraph import Backend, CompilationConfig
    from fusegraph.bench.real import build
    from fusegraph.bench.timing import machine_summary

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[args.dtype]
    model, kw, summary = build(args.model, dtype)
    print(f"{summary}; bench real's blocks, 256 + 64 tokens, {args.dtype}; {machine_summary()}", flush=True)
    rows = {}
    with torch.no_grad():
        rows["eager"] = torch_profile(model, kw)
        compiled = torch.compile(model, backend=Backend())
        rows["fusegraph"] = torch_profile(compiled, kw)
        # Inductor's Python wrapper calls its extern kernels (the GEMMs) as ops the profiler sees
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=Backend(CompilationConfig(cpp_wrapper=False)))
        rows["fg (py wrapper)"] = torch_profile(compiled, kw)
        torch._dynamo.reset()
        rows["inductor"] = torch_profile(torch.compile(model), kw)  # its Python wrapper: the GEMMs are seen
        if not args.skip_openvino:
            try:
                rows["openvino"] = openvino_profile(model, kw, dtype, args.threads)
            except ImportError:
                print("openvino: not installed")
    cats = ("GEMM", "attention", "fused ops", "layout", "rest")
    print(f"{'variant':16s} {'wall':>9s} " + " ".join(f"{c:>11s}" for c in cats) + f" {'unseen':>9s}")
    for name, (wall, got) in rows.items():
        seen = sum(got.values())
        print(f"{name:16s} {wall * 1e3:7.0f}ms " + " ".join(f"{got.get(c, 0.0) * 1e3:9.0f}ms" for c in cats)
              + f" {max(0.0, wall - seen) * 1e3:7.0f}ms", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
