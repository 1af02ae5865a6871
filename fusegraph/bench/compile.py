"""First-call (compile) time against plain ``torch.compile``: cold caches, warm caches, whole model and regional.

For each variant and mode a fresh process compiles the model on an empty Inductor cache of its own
(``TORCHINDUCTOR_CACHE_DIR``, removed after) and times its first call (cold); a second process on the cache the
first filled times its first call again (warm: what every later run of the user's program pays). Modes: ``full``
(``torch.compile(model, ...)``) and ``regional`` (diffusers' ``model.compile_repeated_blocks(...)``, each
transformer block compiled on its own). Models: ``tiny_flux`` (the zoo's FluxTransformer2DModel, 2 + 2 blocks) and
``flux`` (FLUX.1-dev widths, 1 + 1 blocks, 256 + 64 tokens, ``bench real``'s model). Variants: ``inductor``,
``inductor_tuned`` (``freezing`` + ``cpp_wrapper``), ``fusegraph`` and ``fusegraph:<overrides>``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

MODELS = ("tiny_flux", "flux")
MODES = ("full", "regional")
DEFAULT_VARIANTS = ("inductor", "inductor_tuned", "fusegraph")


def _build(model: str, dtype_name: str):
    import torch

    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    if model == "tiny_flux":
        from .. import zoo

        return zoo.build("FluxTransformer2DModel", dtype)
    from .real import build

    m, kw, _ = build("flux", dtype)
    return m, kw


def first_call(model: str, mode: str, variant: str, dtype_name: str) -> float:
    """Seconds of the first call of ``model`` compiled as ``variant`` in ``mode``, in this process."""
    import torch

    from .real import fusegraph_compile_args

    m, kw = _build(model, dtype_name)
    name, _, overrides = variant.partition(":")
    if name == "inductor":
        args = {}
    elif name == "inductor_tuned":
        args = {"options": {"freezing": True, "cpp_wrapper": True}}
    elif name == "fusegraph":
        args = fusegraph_compile_args(overrides)
    else:
        raise SystemExit(f"bench compile: argument --variants: unknown variant {variant!r}")
    fn = m
    if mode == "full":
        fn = torch.compile(m, **args)
    else:
        m.compile_repeated_blocks(**args)
    with torch.no_grad():
        t0 = time.perf_counter()
        fn(**kw)
        return time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusegraph bench compile", description=__doc__.split("\n\n")[0])
    p.add_argument("--models", default="tiny_flux", help=f"comma-separated, of {','.join(MODELS)}")
    p.add_argument("--modes", default="full,regional", help=f"comma-separated, of {','.join(MODES)}")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="fp32")
    p.add_argument("--variants", default=";".join(DEFAULT_VARIANTS), help="';'-separated (default: %(default)s)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", default=None)
    p.add_argument("--one", default=None, help=argparse.SUPPRESS)  # model,mode,variant in this process
    args = p.parse_args(argv)
    models, modes = args.models.split(","), args.modes.split(",")
    for what, given, allowed in (("--models", models, MODELS), ("--modes", modes, MODES)):
        bad = [v for v in given if v not in allowed]
        if bad:
            p.error(f"argument {what}: unknown {bad[0]!r}; expected some of {', '.join(allowed)}")
    if args.threads < 1:
        p.error(f"argument --threads: expected a positive integer, got {args.threads}")
    import torch

    torch.set_num_threads(args.threads)
    if args.one is not None:
        model, mode, variant = args.one.split(",", 2)
        print(json.dumps({"first_s": first_call(model, mode, variant, args.dtype)}))
        return 0
    from .timing import machine_summary

    print(f"first-call time, {args.dtype}, cold (empty Inductor cache) and warm (a second process on that cache); "
          f"{machine_summary()}")
    print(f"{'model':10s} {'mode':9s} {'variant':36s} {'cold':>8s} {'vs ind':>7s} {'warm':>8s} {'vs ind':>7s}")
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads))
    rows, failed = [], 0
    for model in models:
        for mode in modes:
            base = None
            for variant in filter(None, args.variants.split(";")):
                cmd = [sys.executable, "-m", "fusegraph", "bench", "compile", "--one", f"{model},{mode},{variant}",
                       "--dtype", args.dtype, "--threads", str(args.threads)]
                cache = tempfile.mkdtemp(prefix="fusegraph_bench_compile_")
                times = []
                try:
                    for _ in ("cold", "warm"):
                        proc = subprocess.run(cmd, capture_output=True, text=True,
                                              env=dict(env, TORCHINDUCTOR_CACHE_DIR=cache))
                        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
                        if proc.returncode != 0 or not lines:
                            tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
                            print(f"{model:10s} {mode:9s} {variant:36s} failed: {tail[:200]}", flush=True)
                            break
                        times.append(json.loads(lines[-1])["first_s"])
                finally:
                    shutil.rmtree(cache, ignore_errors=True)
                if len(times) < 2:
                    failed += 1
                    continue
                row = dict(model=model, mode=mode, variant=variant, dtype=args.dtype, threads=args.threads,
                           cold_s=times[0], warm_s=times[1])
                if variant == "inductor":
                    base = row
                rows.append(row)
                rel = (lambda k: f"{row[k] / base[k]:6.2f}x" if base else f"{'':7s}")
                print(f"{model:10s} {mode:9s} {variant:36s} {row['cold_s']:7.1f}s {rel('cold_s')} "
                      f"{row['warm_s']:7.1f}s {rel('warm_s')}", flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine_summary(), "rows": rows}, f, indent=1)
    return 1 if failed else 0
