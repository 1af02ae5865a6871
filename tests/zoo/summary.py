"""Prints the zoo table: per model and family, the sites the independent counter finds and the count fusegraph
fused (``inductor=False`` route, fp32), the number of Dynamo graphs, and the max difference from eager.

    .venv/bin/python -m tests.zoo.summary [--route default|aten|graph] [ClassName ...]
"""
from __future__ import annotations

import argparse
import time

import torch
import torch._inductor.config as inductor_config

from fusegraph import Backend, CompilationConfig, zoo
from tests.zoo.site_counter import FAMILIES, capture, count_sites
from tests.zoo.test_zoo import ROUTES, tensors


def row(name: str, route: str = "aten") -> dict:
    model, kw = zoo.build(name)
    graphs, _ = capture(model, **kw)
    sites = count_sites(graphs, frozen=route == "default")
    backend = Backend(CompilationConfig(**ROUTES[route]))
    torch._dynamo.reset()
    with torch.no_grad(), inductor_config.patch(fx_graph_cache=False):
        out = torch.compile(model, backend=backend)(**kw)
        eager = model(**kw)
    diff = max((o - e).abs().max().item() for o, e in zip(tensors(out), tensors(eager)))
    fused = {k: backend.stats.patterns.get(k, 0) for k in FAMILIES}
    return dict(name=name, sites=sites, fused=fused, graphs=len(graphs), diff=diff)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--route", default="aten", choices=sorted(ROUTES))
    p.add_argument("models", nargs="*")
    args = p.parse_args(argv)
    print(f"| model | graphs | {' | '.join(FAMILIES)} | max diff vs eager |")
    print(f"|---|---|{'---|' * len(FAMILIES)}---|")
    for name in args.models or zoo.names():
        t0 = time.time()
        try:
            r = row(name, args.route)
        except Exception as e:  # a table row per model, whatever happens
            print(f"| {name} | error: {type(e).__name__}: {str(e)[:120]} |", flush=True)
            continue
        cells = [f"{r['sites'][k]}/{r['fused'][k]}" + ("" if r['sites'][k] == r['fused'][k] else " ✗")
                 for k in FAMILIES]
        print(f"| {name} | {r['graphs']} | {' | '.join(cells)} | {r['diff']:.2g} | <!-- {time.time() - t0:.0f}s -->",
              flush=True)
    print("(cells: sites counted / fused; ✗ where they differ)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
