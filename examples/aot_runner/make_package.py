"""Makes the package examples/aot_runner runs: a tiny diffusers Flux transformer (fusegraph.zoo's config, seeded
random weights), packaged by fusegraph.aot.package; its flat inputs and the eager model's outputs saved beside it.

    python examples/aot_runner/make_package.py OUT_DIR   ->  OUT_DIR/tiny_flux.pt2, tiny_flux_inputs.pt,
                                                               tiny_flux_expected.pt
then, with no Python:
    build/fusegraph_aot_runner OUT_DIR/tiny_flux.pt2 OUT_DIR/tiny_flux_inputs.pt OUT_DIR/tiny_flux_expected.pt
"""
import os
import sys
import time

import torch

import fusegraph
from fusegraph import aot, zoo


def main(out_dir: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    model, kwargs = zoo.build("FluxTransformer2DModel")
    kwargs["return_dict"] = False
    with torch.no_grad():
        expected = list(model(**kwargs))
    path = os.path.join(out_dir, "tiny_flux.pt2")
    stats = fusegraph.Stats()
    t0 = time.perf_counter()
    # fusion_choice="always": at these tiny widths the per-site choice would leave every site to Inductor's own
    # code (faster there), and the example is about running fused ops from C++
    aot.package(model, (), kwargs, path, config={"fusion_choice": "always"}, stats=stats)
    print(f"{path}: packaged in {time.perf_counter() - t0:.1f} s; fused "
          f"{ {k: v for k, v in stats.patterns.items() if v} }")
    loaded = aot.load(path)
    torch.save(loaded.flat_inputs((), kwargs), os.path.join(out_dir, "tiny_flux_inputs.pt"))
    torch.save(expected, os.path.join(out_dir, "tiny_flux_expected.pt"))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "build/aot")
