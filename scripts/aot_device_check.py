"""The fused-AOT-package path on a device (scripts/device_check.sh step aot_cuda; runs on CPU too):

    python scripts/aot_device_check.py [--device cuda] [OUT_JSON]

tiny Flux (fp32 and bf16) packaged by fusegraph.aot.package on the device (every site fused), loaded, run and
compared with eager (fp32: 1e-5 of the output's scale; bf16: bf16's rtol of the scale); package build time, load
time, and steady medians of the package against the JIT route and eager."""
import argparse
import json
import os
import sys
import tempfile
import time

import torch

import fusegraph
from fusegraph import aot, zoo
from fusegraph.bench import timing


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("out", nargs="?", default=None)
    args = p.parse_args()
    folder = tempfile.mkdtemp(prefix="fusegraph-aot-device-")
    results, ok = {}, True
    for dtype, rtol in ((torch.float32, 1e-5), (torch.bfloat16, 1.6e-2)):
        model, kwargs = zoo.build("FluxTransformer2DModel", dtype=dtype)
        model = model.to(args.device)
        kwargs = {k: v.to(args.device) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}
        kwargs["return_dict"] = False
        path = os.path.join(folder, f"flux_{str(dtype)[6:]}.pt2")
        t0 = time.perf_counter()
        aot.package(model, (), kwargs, path, config={"fusion_choice": "always"})
        built = time.perf_counter() - t0
        t0 = time.perf_counter()
        loaded = aot.load(path)
        load_s = time.perf_counter() - t0
        with torch.no_grad():
            want = model(**kwargs)[0]
            got = loaded(**kwargs)[0]
            err = (got.float() - want.float()).abs().max().item()
            scale = want.float().abs().max().item()
            jit = torch.compile(model, backend="fusegraph")
            jit(**kwargs)
            times = timing.interleaved_seconds({"package": lambda: loaded(**kwargs), "jit": lambda: jit(**kwargs),
                                                "eager": lambda: model(**kwargs)}, device=args.device, reps=20)
        torch._dynamo.reset()
        fits = err <= rtol * scale
        ok = ok and fits
        results[str(dtype)] = dict(package_s=built, load_s=load_s, ops=loaded.metadata.get("fusegraph.ops"),
                                   max_abs_err=err, scale=scale, ok=fits,
                                   median_ms={k: sorted(v)[len(v) // 2] * 1e3 for k, v in times.items()})
        print(str(dtype), json.dumps(results[str(dtype)]), flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(dict(device=args.device, torch=torch.__version__, results=results), f, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
