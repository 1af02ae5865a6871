"""``python -m fusegraph bench aot``: fused AOTInductor packages against compiling at start (docs/BENCHMARKS.md §11).

    python -m fusegraph bench aot --width tiny|flux1 --dtype fp32|bf16 [--tokens 256,64] [--reps 10] [--out DIR]

One FluxTransformer2DModel (``tiny``: the zoo's 2+2 blocks; ``flux1``: FLUX.1-dev widths, 1 double + 1 single
block, bench/real.py), measured:
- a weight swap: ``AOTModel.load_weights`` of the whole state dict (a copy per weight), seconds;
- package build: ``fusegraph.aot.package`` (default config: the per-site choice) and plain AOTInductor
  (``aoti_compile_and_package`` of the same export), seconds;
- start-up, each in a fresh process (model construction and input loading untimed): the package's load + first
  call; the JIT route's first call (``torch.compile(backend="fusegraph")``) with an empty Inductor cache (cold) and
  with the cache the cold process left (warm);
- steady state, interleaved medians in this process: the fused package, plain AOTInductor's package and the JIT
  route (same fused ops: expect level).
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import torch

from .. import aot
from .._core import torch_inductor
from . import timing

_STARTUP = r"""
import json, sys, time, torch
torch.set_num_threads({threads})
import fusegraph
from fusegraph import aot
from fusegraph.bench.aot import build
model, kwargs = build({width!r}, {dtype!r}, {tokens!r}, weights={weights!r})
t0 = time.perf_counter()
if {mode!r} == "package":
    fn = aot.load({path!r})
    t_load = time.perf_counter() - t0
    out = fn(**kwargs)
else:
    t_load = 0.0
    fn = torch.compile(model, backend="fusegraph")
    with torch.no_grad():
        out = fn(**kwargs)
first = time.perf_counter() - t0
with torch.no_grad():
    t1 = time.perf_counter(); fn(**kwargs); second = time.perf_counter() - t1
print(json.dumps(dict(load=t_load, first=first, second=second)))
"""


def build(width: str, dtype: str, tokens: tuple, weights: bool = True):
    """(model, forward kwargs) for ``width`` ('tiny' | 'flux1') and ``dtype`` ('fp32' | 'bf16'); ``weights=False``:
    the model is built anyway (a package process needs only its inputs, but building them is the same code)."""
    from .. import zoo
    from .real import build_flux_real

    dt = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    if width == "tiny":
        model, kwargs = zoo.build("FluxTransformer2DModel", dtype=dt)
        return model, dict(kwargs, return_dict=False)
    return build_flux_real(dt, tokens[0], tokens[1])


def _fresh(mode: str, args, path: str, cache: str) -> dict:
    code = _STARTUP.format(threads=args.threads, width=args.width, dtype=args.dtype, tokens=args.tokens_pair,
                           weights=True, mode=mode, path=path)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=cache, OMP_NUM_THREADS=str(args.threads))
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    if run.returncode != 0:
        raise RuntimeError(f"fresh {mode} process failed:\n{run.stderr[-3000:]}")
    return json.loads(run.stdout.strip().splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusegraph bench aot", description=__doc__.split("\n\n")[0])
    p.add_argument("--width", choices=("tiny", "flux1"), default="tiny")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--tokens", default="256,64", help="flux1: image and text tokens (default 256,64)")
    p.add_argument("--reps", type=timing.positive_int, default=10)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None, help="folder for the packages (default: a temporary one)")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    args.tokens_pair = tuple(int(t) for t in args.tokens.split(","))
    torch.set_num_threads(args.threads)
    out = args.out or tempfile.mkdtemp(prefix="fusegraph-bench-aot-")
    os.makedirs(out, exist_ok=True)
    model, kwargs = build(args.width, args.dtype, args.tokens_pair)
    result = dict(width=args.width, dtype=args.dtype, tokens=args.tokens_pair if args.width == "flux1" else None,
                  threads=args.threads, cpu=timing.cpu_model(), capability=torch.backends.cpu.get_cpu_capability(),
                  torch=torch.__version__)

    fused_path = os.path.join(out, f"flux_{args.width}_{args.dtype}.pt2")
    t0 = time.perf_counter()
    aot.package(model, (), kwargs, fused_path)
    result["package_s"] = time.perf_counter() - t0
    fused = aot.load(fused_path)
    result["fused_sites"] = {k: v for k, v in fused.counts.items() if v}
    result["lowered_sites"] = {k: v for k, v in (fused.record.get("lowered") or {}).items() if v}
    result["package_ops"] = fused.metadata.get("fusegraph.ops", "")
    result["package_mib"] = os.path.getsize(fused_path) / 2**20

    # the model's whole state dict, as a caller passes it (names the package compiled out are ignored)
    state = {k: v.detach().clone() for k, v in model.state_dict().items()}
    t0 = time.perf_counter()
    fused.load_weights(state)
    result["load_weights_s"] = time.perf_counter() - t0
    result["weights_mib"] = sum(v.nbytes for v in state.values()) / 2**20

    plain_path = os.path.join(out, f"flux_{args.width}_{args.dtype}_plain.pt2")
    t0 = time.perf_counter()
    with torch.no_grad():
        ep = torch.export.export(model, (), kwargs, strict=False)
    torch_inductor.aoti_compile_and_package(ep, package_path=plain_path)
    result["plain_package_s"] = time.perf_counter() - t0
    plain = torch_inductor.load_package(plain_path)

    cache = tempfile.mkdtemp(prefix="fusegraph-bench-aot-cache-")
    result["fresh_package"] = _fresh("package", args, fused_path, cache)
    result["fresh_jit_cold"] = _fresh("jit", args, fused_path, cache)
    result["fresh_jit_warm"] = _fresh("jit", args, fused_path, cache)

    jit = torch.compile(model, backend="fusegraph")
    with torch.no_grad():
        want = model(**kwargs)[0]
        jit(**kwargs)
        fns = {"package": lambda: fused(**kwargs), "plain AOTInductor": lambda: plain(**kwargs),
               "JIT fusegraph": lambda: jit(**kwargs), "eager": lambda: model(**kwargs)}
        result["output_scale"] = want.float().abs().max().item()
        result["max_abs_error_vs_eager"] = {name: (fns[name]()[0].float() - want.float()).abs().max().item()
                                            for name in ("package", "plain AOTInductor", "JIT fusegraph")}
        times = timing.interleaved_seconds(fns, warmup=2, reps=args.reps)
    result["steady_ms"] = {k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
