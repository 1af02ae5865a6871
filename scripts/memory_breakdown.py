"""Where a compiled model's resident memory goes (BENCHMARKS §1.5): ``bench real``'s "resident +" split by mapping.

    OMP_NUM_THREADS=1 .venv/bin/python scripts/memory_breakdown.py --model wan --dtype bf16 --runs 3
    OMP_NUM_THREADS=1 .venv/bin/python scripts/memory_breakdown.py --cpu-class avx2 ...   # under a class's caps

Each run is a process of its own per variant (Inductor, then fusegraph), on an empty Inductor cache, built as ``bench
real`` builds it: the model and an eager call first, then the resident set read, the compile and first call, three
more calls, the resident set read again (what ``bench real`` reports), then glibc's ``malloc_trim(0)`` and a last
read. Printed per variant and run: the growth of the resident set over those calls split into malloc's heap
(``[heap]``), anonymous mappings (Python's object arenas, large malloc blocks, workspaces mapped on their own) and
the shared libraries whose pages were touched; malloc's own count of the bytes it has handed out and not had back
(``mallinfo2``: in use, as against its free chunks, which stay resident until trimmed); and the resident growth left
after the trim. The heap's free chunks are what moves from one process to the next: the same variant's "resident +"
differs by several MiB between runs while the bytes in use do not.
"""
import argparse
import ctypes
import os
import subprocess
import sys
import tempfile


class _MallInfo2(ctypes.Structure):
    _fields_ = [(n, ctypes.c_size_t) for n in
                "arena ordblks smblks hblks hblkhd usmblks fsmblks uordblks fordblks keepcost".split()]


def _snapshot(libc) -> dict:
    """{"rss": MiB, "in_use": MiB malloc has handed out, "maps": {mapping name: resident MiB}}."""
    maps, name = {}, None
    with open("/proc/self/smaps") as f:
        for line in f:
            parts = line.split()
            if "-" in parts[0] and not parts[0].endswith(":"):
                name = os.path.basename(parts[5]) if len(parts) > 5 and parts[5].startswith("/") else (
                    parts[5] if len(parts) > 5 else "[anon]")
            elif parts[0] == "Rss:":
                maps[name] = maps.get(name, 0) + int(parts[1]) / 1024
    info = libc.mallinfo2()
    return {"rss": sum(maps.values()), "in_use": (info.uordblks + info.hblkhd) / 2**20, "maps": maps}


def _child(variant: str, model_name: str, dtype_name: str, layers: int) -> None:
    import torch

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    from fusegraph.bench.real import _make_fn, build

    libc = ctypes.CDLL("libc.so.6")
    if not hasattr(libc, "mallinfo2"):
        sys.exit("memory_breakdown: needs glibc 2.33 or later (mallinfo2); this libc has none")
    libc.mallinfo2.restype = _MallInfo2
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name]
    model, inputs, _ = build(model_name, dtype, 256, 64, layers)
    with torch.no_grad():
        model(**inputs)
        before = _snapshot(libc)
        fn = _make_fn(model, inputs, dtype, variant, torch.get_num_threads())
        for _ in range(4):
            fn(**inputs)
        after = _snapshot(libc)
        libc.malloc_trim(0)
        trimmed = _snapshot(libc)
    grown = {k: after["maps"].get(k, 0) - before["maps"].get(k, 0) for k in set(after["maps"]) | set(before["maps"])}
    libs = sorted(((v, k) for k, v in grown.items() if k not in ("[heap]", "[anon]") and abs(v) >= 0.5),
                  reverse=True)
    print(f"{variant:10s} resident +{after['rss'] - before['rss']:6.1f} MiB = heap {grown.get('[heap]', 0):+6.1f}, "
          f"anonymous {grown.get('[anon]', 0):+6.1f}, libraries {sum(v for v, _ in libs):+5.1f} "
          f"({', '.join(f'{k} {v:+.1f}' for v, k in libs[:3]) or 'none'}); malloc in use "
          f"{after['in_use'] - before['in_use']:+6.1f}; after malloc_trim +{trimmed['rss'] - before['rss']:6.1f}",
          flush=True)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="wan")
    p.add_argument("--dtype", choices=("fp32", "bf16"), default="bf16")
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--variants", default="inductor,fusegraph")
    p.add_argument("--cpu-class", default=None, help="run the processes under this class's caps (avx2, avx512, ...)")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        _child(args.child, args.model, args.dtype, args.layers)
        return 0
    if args.runs < 1 or args.layers < 1:
        p.error(f"argument --runs/--layers: expected positive integers, got {args.runs}/{args.layers}")
    if args.cpu_class:  # the caps must be in the environment before torch loads: the children get them
        from fusegraph._core import cpu_class

        try:
            os.environ.update(cpu_class.environment(args.cpu_class))
        except ValueError as e:
            p.error(f"argument --cpu-class: {e}")
    from fusegraph.bench.timing import machine_summary

    print(f"{args.model} {args.dtype}, --layers {args.layers}, {args.runs} runs; {machine_summary('cpu')}; "
          f"caps: {' '.join(f'{k}={v}' for k, v in sorted(os.environ.items()) if k in CAPS) or 'none'}", flush=True)
    for _ in range(args.runs):
        for variant in args.variants.split(","):
            with tempfile.TemporaryDirectory() as cache:
                subprocess.run([sys.executable, os.path.abspath(__file__), "--child", variant, "--model", args.model,
                                "--dtype", args.dtype, "--layers", str(args.layers)],
                               env={**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}, check=True)
    return 0


CAPS = ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA", "MKL_ENABLE_INSTRUCTIONS",
        "FUSEGRAPH_CPU_CLASS", "OMP_NUM_THREADS")

if __name__ == "__main__":
    sys.exit(main())
