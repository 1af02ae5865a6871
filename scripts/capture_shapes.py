"""Graph-route capture under changing shapes: three image sizes through one compiled zoo model (BENCHMARKS §5).

    OMP_NUM_THREADS=1 python scripts/capture_shapes.py [--models Flux Qwen Flux2] [--modes static dynamic]

For each model and mode, a fresh ``torch.compile(model, backend=Backend({"graph_with_compile": True}),
dynamic=...)`` is called once at each of three token grids (4x4, 4x6, 6x6 latent patches; text length fixed), each
call on new inputs of that size. ``static`` is ``dynamic=False``: a compile per shape (Dynamo's automatic dynamic
shapes off); ``dynamic`` is ``dynamic=True``: one compile with symbolic sizes, a capture per shape. Printed per
shape: the first call's wall time (Dynamo, the backend's compile, the capture and the run) and the time the graph
runtime spent capturing (``stats.capture_seconds``); then whether every output equals eager (1e-4).
"""
from __future__ import annotations

import argparse
import time

import torch

from fusegraph import Backend, CompilationConfig, zoo
from fusegraph.bench.zoo import tensors

GRIDS = ((4, 4), (4, 6), (6, 6))


def _grid_ids(h, w):
    ids = torch.zeros(h, w, 3)
    ids[..., 1] = torch.arange(h)[:, None]
    ids[..., 2] = torch.arange(w)[None, :]
    return ids.reshape(h * w, 3)


def _flux(g, b, h, w):
    return dict(hidden_states=torch.randn(b, h * w, 4, generator=g), encoder_hidden_states=torch.randn(b, 8, 32, generator=g),
                pooled_projections=torch.randn(b, 32, generator=g), timestep=torch.rand(b, generator=g),
                img_ids=_grid_ids(h, w), txt_ids=torch.zeros(8, 3))


def _qwen(g, b, h, w):
    return dict(hidden_states=torch.randn(b, h * w, 16, generator=g), encoder_hidden_states=torch.randn(b, 8, 16, generator=g),
                encoder_hidden_states_mask=torch.ones(b, 8, dtype=torch.long), timestep=torch.rand(b, generator=g),
                img_shapes=[(1, h, w)] * b)


def _flux2(g, b, h, w):
    img_ids = torch.cartesian_prod(torch.arange(1), torch.arange(h), torch.arange(w), torch.arange(1))
    txt_ids = torch.cartesian_prod(torch.arange(1), torch.arange(1), torch.arange(1), torch.arange(8))
    return dict(hidden_states=torch.randn(b, h * w, 4, generator=g), encoder_hidden_states=torch.randn(b, 8, 32, generator=g),
                img_ids=img_ids[None].expand(b, -1, -1), txt_ids=txt_ids[None].expand(b, -1, -1),
                timestep=torch.rand(b, generator=g), guidance=torch.rand(b, generator=g) * 4)


MODELS = {"Flux": ("FluxTransformer2DModel", _flux), "Qwen": ("QwenImageTransformer2DModel", _qwen),
          "Flux2": ("Flux2Transformer2DModel", _flux2)}


def run(name: str, mode: str) -> list:
    cls, make = MODELS[name]
    model, _ = zoo.build(cls)
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(graph_with_compile=True))
    compiled = torch.compile(model, backend=backend, dynamic=(mode == "dynamic"))
    rows, ok = [], True
    for i, (h, w) in enumerate(GRIDS):
        kw = make(torch.Generator().manual_seed(i), 2, h, w)
        with torch.no_grad():
            ref = model(**kw)
            before = backend.stats.capture_seconds
            t0 = time.perf_counter()
            out = compiled(**kw)
            wall = time.perf_counter() - t0
        capture = backend.stats.capture_seconds - before
        ok &= all(torch.allclose(a, b, rtol=1e-4, atol=1e-4) for a, b in zip(tensors(out), tensors(ref)))
        rows.append((f"{h}x{w}", wall, capture))
    patterns = {k: v for k, v in backend.stats.patterns.items() if v}
    print(f"{name:6s} {mode:8s} " + "  ".join(f"{g}: first call {wall:6.2f} s, capture {cap:6.2f} s" for g, wall, cap in rows)
          + f"  | total first calls {sum(r[1] for r in rows):6.2f} s, captures {sum(r[2] for r in rows):6.2f} s, "
          f"compiles {backend.stats.graphs_compiled}, captures {backend.stats.graphs_captured}, "
          f"outputs {'equal eager' if ok else 'DIFFER FROM EAGER'}, fused {patterns}", flush=True)
    return rows


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--modes", nargs="+", default=["static", "dynamic"], choices=["static", "dynamic"])
    args = parser.parse_args(argv)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s)")
    for name in args.models:
        for mode in args.modes:
            run(name, mode)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
