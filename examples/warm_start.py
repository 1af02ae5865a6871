"""First-call time of a fresh process under each warm-start recipe (docs/GUIDE.md §2.5), tiny Flux fp32.

    # cold, then a second process on the same cache folder; --save writes the cache artifacts
    TORCHINDUCTOR_CACHE_DIR=/tmp/wa python examples/warm_start.py --save /tmp/artifacts.bin
    TORCHINDUCTOR_CACHE_DIR=/tmp/wa python examples/warm_start.py
    # an empty cache folder and the artifacts
    TORCHINDUCTOR_CACHE_DIR=/tmp/wb python examples/warm_start.py --load /tmp/artifacts.bin
    # the same for plain torch.compile: --backend inductor
"""
import argparse
import time

import torch

import fusegraph
from fusegraph import zoo


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", default="fusegraph", choices=["fusegraph", "inductor"])
    p.add_argument("--save", metavar="FILE", help="write torch.compiler.save_cache_artifacts() here after the call")
    p.add_argument("--load", metavar="FILE", help="torch.compiler.load_cache_artifacts() from here first")
    args = p.parse_args()

    model, inputs = zoo.build("FluxTransformer2DModel")
    if args.load:
        with open(args.load, "rb") as f:
            torch.compiler.load_cache_artifacts(f.read())
    backend = fusegraph.Backend(fusegraph.CompilationConfig()) if args.backend == "fusegraph" else "inductor"
    compiled = torch.compile(model, backend=backend)
    start = time.perf_counter()
    with torch.no_grad():
        out = compiled(**inputs)[0]
    seconds = time.perf_counter() - start
    with torch.no_grad():
        torch.testing.assert_close(out, model(**inputs)[0], rtol=1e-4, atol=1e-4)
    print(f"{args.backend}: first call {seconds:.1f} s (torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads)")
    if args.save:
        artifacts = torch.compiler.save_cache_artifacts()
        with open(args.save, "wb") as f:
            f.write(artifacts[0])
        print(f"cache artifacts: {len(artifacts[0]) / 2**20:.1f} MiB -> {args.save}")


if __name__ == "__main__":
    main()
