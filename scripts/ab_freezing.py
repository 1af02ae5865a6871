"""Frozen vs unfrozen, per route, in one process: tiny Flux (``bench model``'s), the decode block (``bench
decode``'s), or ``chainN``: a 16-element input multiplied by each of N 16-element parameters in turn (almost no
compute: the per-call cost of the weight path itself; 16 elements, more than Inductor inlines as numbers, so a frozen
compile keeps them as constants and computes the same as an unfrozen one). Every variant is compiled (first call timed, result checked against eager), then timed interleaved:
ROUNDS rounds, each variant in turn with the order rotated, CALLS calls per round; the median per call.

Variants: ``name=overrides`` of CompilationConfig (``;``-separated, ``k=v,k=v``), ``inductor`` (plain
torch.compile) or ``eager``. The default list runs each route with and without ``enable_freezing``: on a tree
where the aten and graph routes froze by default (before freezing became opt-in) both forms differ; since, the aten
and graph routes never fold and the pairs are the same compile.

Usage: OMP_NUM_THREADS=1 ROUNDS=11 .venv/bin/python scripts/ab_freezing.py tiny_flux|decode|chainN fp32|bf16 [VARIANTS]
FLUX.1 and Wan 2.1 widths: ``python -m fusegraph bench real --variants ...`` (per-process rows: resident memory)."""
import os
import statistics
import sys
import time

import torch

torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
import fusegraph  # noqa: E402

VARIANTS = ("eager;inductor;default=;default frozen=enable_freezing=True;"
            "aten frozen=inductor=False,enable_freezing=True;aten=inductor=False,enable_freezing=False;"
            "graph frozen=graph_with_compile=True,enable_freezing=True;"
            "graph=graph_with_compile=True,enable_freezing=False")


def _overrides(text):
    out = {}
    for item in filter(None, (text or "").split(",")):
        k, v = item.split("=")
        out[k] = {"True": True, "False": False}.get(v, v)
    return out


class Chain(torch.nn.Module):
    def __init__(self, n: int, dtype):
        super().__init__()
        self.ps = torch.nn.ParameterList([torch.nn.Parameter(1 + 1e-3 * torch.randn(16, dtype=dtype))
                                          for _ in range(n)])

    def forward(self, x):
        for p in self.ps:
            x = x * p
        return x


def build(name, dtype):
    if name.startswith("chain"):
        n = int(name[5:])
        return Chain(n, dtype).eval(), (torch.randn(16, dtype=dtype),), {}, f"{n} parameters of 16 elements"
    if name == "tiny_flux":
        from fusegraph.bench.model import _to, build_flux

        model, inputs, shape = build_flux(dtype, "cpu")
        return model.to(dtype).eval(), (), _to(inputs, dtype, "cpu"), shape
    from fusegraph.bench.decode import DecodeBlock, make_inputs

    block = DecodeBlock(512, 8, 128, 1, dtype=dtype, device="cpu").eval()
    return block, make_inputs(block, 1, position=128, dtype=dtype, device="cpu"), {}, "batch 1, hidden 512, 8 heads, cache 128"


def first(out):
    return out[0] if isinstance(out, (tuple, list)) else out


def main():
    name, dtype_name = sys.argv[1], sys.argv[2]
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    variants = [v.split("=", 1) if "=" in v else (v, None) for v in (sys.argv[3] if len(sys.argv) > 3 else VARIANTS).split(";")]
    rounds, calls = int(os.environ.get("ROUNDS", 11)), int(os.environ.get("CALLS", 0))
    torch.manual_seed(0)
    model, args, kwargs, shape = build(name, dtype)
    print(f"{name} ({shape}), {dtype_name}, {torch.get_num_threads()} thread(s), torch {torch.__version__}, "
          f"fusegraph {os.path.dirname(fusegraph.__file__)}", flush=True)
    fns = {}
    with torch.no_grad():
        ref = first(model(*args, **kwargs)).float()
        for vname, cfg in variants:
            torch._dynamo.reset()
            if vname == "eager":
                fn = model
            elif vname == "inductor":
                fn = torch.compile(model)
            else:
                fn = torch.compile(model, backend=fusegraph.Backend(fusegraph.CompilationConfig(**_overrides(cfg))))
            t = time.perf_counter()
            out = first(fn(*args, **kwargs)).float()
            print(f"{vname:16s} first call {time.perf_counter() - t:7.2f} s, max|diff| vs eager "
                  f"{(out - ref).abs().max().item():.2e}", flush=True)
            fns[vname] = fn
        t = time.perf_counter()
        model(*args, **kwargs)
        n = calls or max(1, int(0.05 / max(time.perf_counter() - t, 1e-6)))
        times = {k: [] for k in fns}
        order = list(fns)
        for r in range(rounds + 1):
            for k in order[r % len(order):] + order[:r % len(order)]:
                fn = fns[k]
                t = time.perf_counter()
                for _ in range(n):
                    fn(*args, **kwargs)
                if r:  # round 0 warms up
                    times[k].append((time.perf_counter() - t) / n)
    base = statistics.median(times["eager"]) if "eager" in times else None
    for k, v in times.items():
        med = statistics.median(v)
        spread = (max(v) - min(v)) / med
        rel = f"  {base / med:5.2f}x eager" if base else ""
        print(f"{k:16s} median {med * 1e6:10.1f} us  (spread {100 * spread:4.0f} %){rel}")


if __name__ == "__main__":
    main()
