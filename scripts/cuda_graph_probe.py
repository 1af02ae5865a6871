"""Where a CUDA-graph crash happens, stage by stage (scripts/device_check.sh, step ``cuda_graph_probe``).

The first GPU run (H200, torch 2.11; docs/BENCHMARKS.md §12) lost every process that took fusegraph's CUDA-graph
route to a host segfault, while the CUDA ops and the Inductor and aten routes passed. Each stage below adds one
layer of that route, prints its name (flushed) before it starts and ``ok`` after, and runs in a process of its own
with faulthandler; the first stage killed by a signal is run again under gdb (where installed) for a native
backtrace. Reading the result:

- ``plain`` dies: torch or the driver itself (fusegraph not even imported);
- only ``plain_after_import`` dies: loading fusegraph's library;
- ``driver_recipe`` dies: the driver's use of torch (one pool for every graph, a side stream, the copy stream, the
  muted ``gc.collect``/``empty_cache``); after "2 graphs, 1 pool ok": reusing a pool whose graphs died;
- ``trace_fused`` dies: GraphRunner's fusion trace on real CUDA tensors;
- ``cache_*`` dies while ``plain`` passes: the C++ cache (the GIL released around a call, PyExecutable re-taking it),
  ``cache_copy_stream``: the copy stream;
- ``runner_graph_only`` passes and ``runner_default`` dies: the fusion in front of the capture;
- ``runner_cpu`` dies: the build or Python on that machine.

Usage: python scripts/cuda_graph_probe.py                (every stage; exit 1 when any failed)
       python -X faulthandler scripts/cuda_graph_probe.py --stage NAME   (one; CUDA_LAUNCH_BLOCKING=1 helps)
The CUDA-graph route is off by default (FUSEGRAPH_CUDA_GRAPHS): the stages turn it on.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import types

os.environ["FUSEGRAPH_CUDA_GRAPHS"] = "1"


def say(*args):
    print(" ", *args, flush=True)


def fn(x, w):
    import torch

    return torch.tanh(x @ w) + x


def inputs():
    import torch

    return torch.randn(16, 64, device="cuda"), torch.randn(64, 64, device="cuda")


def plain_capture(pool=None, stream=None):
    """torch.cuda.graph of ``fn`` after a warm-up on a side stream: (graph, x, w, out)."""
    import torch

    x, w = inputs()
    side = stream or torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(x, w)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, stream=stream):
        out = fn(x, w)
    return graph, x, w, out


def replay_and_check(graph, x, w, out, copy=None):
    import torch

    x2 = torch.randn_like(x)
    (copy or (lambda dst, src: dst.copy_(src)))(x, x2)
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, fn(x2, w))


def stage_env():
    """The versions, and which CUDA runtime libraries the process maps once fusegraph is loaded."""
    import torch

    say(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0))
    import fusegraph  # noqa: F401

    with open("/proc/self/maps") as f:
        say(sorted({line.split()[-1] for line in f if "cudart" in line}))


def stage_plain():
    """torch.cuda.graph alone; fusegraph not imported."""
    replay_and_check(*plain_capture())


def stage_plain_after_import():
    """The same with fusegraph's library loaded."""
    import fusegraph  # noqa: F401

    replay_and_check(*plain_capture())


def stage_driver_recipe():
    """The driver's torch calls, written out: one pool for two graphs on a side stream, gc.collect and empty_cache
    muted during capture, inputs copied on a copy stream; then the pool reused after its graphs died."""
    import gc

    import torch

    pool, side, copier = torch.cuda.graph_pool_handle(), torch.cuda.Stream(), torch.cuda.Stream()

    def copy(dst, src):
        compute = torch.cuda.current_stream()
        copier.wait_event(compute.record_event())
        with torch.cuda.stream(copier):
            torch._foreach_copy_([dst], [src])
        compute.wait_event(copier.record_event())

    saved = gc.collect, torch.cuda.empty_cache
    gc.collect, torch.cuda.empty_cache = (lambda *a, **k: 0), (lambda *a, **k: None)
    try:
        with torch.cuda.device(0):
            a = plain_capture(pool, side)
            b = plain_capture(pool, side)
    finally:
        gc.collect, torch.cuda.empty_cache = saved
    replay_and_check(*a, copy=copy)
    replay_and_check(*b, copy=copy)
    say("2 graphs, 1 pool ok")
    del a, b
    gc.collect()
    replay_and_check(*plain_capture(pool, side))
    say("the pool reused after its graphs died ok")


def stage_trace_fused():
    """GraphRunner's fusion trace (make_fx, functionalisation, fake propagation) on real CUDA tensors."""
    from fusegraph import CompilationConfig
    from fusegraph.graph.host import trace_fused

    x, w = inputs()
    say(trace_fused(lambda a, b: [fn(a, b)], [x, w], CompilationConfig().fusion_patterns)[1])


def _driver_capture():
    from fusegraph.graph import drivers

    x, w = inputs()
    opts = types.SimpleNamespace(graph_lazy_capture=False, graph_warmup_runs=1)
    return drivers.CudaDriver().capture(lambda a, b: [fn(a, b)], [x, w], opts), x, w


def stage_driver_capture():
    """fusegraph's CudaDriver.capture, the graph replayed from Python."""
    import torch

    cap, _, _ = _driver_capture()
    cap.info["graph"].replay()
    torch.cuda.synchronize()


def _through_cache(executable, static, x, w, check=True):
    import torch

    from fusegraph import _C

    cache = _C.graph.GraphCache(0, _C.graph.Eviction.fifo, 0, True, True)
    cache.insert([x, w], static, executable, 0, None)
    for i in range(3):
        x2 = torch.randn_like(x)
        res = cache.call([x2, w], False)
        torch.cuda.synchronize()
        say(i, res.status)
        if check:
            torch.testing.assert_close(res.outputs[0], fn(x2, w))


def _py_executable(run, out, **kw):
    from fusegraph import _C

    return _C.graph.PyExecutable(run, [out], binds_inputs=False, outputs_are_fresh=False, **kw)


def stage_cache_no_graph():
    """The C++ cache on CUDA tensors (the GIL released around the call), an executable that captures nothing."""
    x, w = inputs()
    _through_cache(_py_executable(lambda: None, fn(x, w)), [x.clone(), w.clone()], x, w, check=False)


def stage_cache_plain_graph():
    """A plain torch graph replayed through the C++ cache (its input copies in C++)."""
    graph, x, w, out = plain_capture()
    _through_cache(_py_executable(graph.replay, out), [x, w], x, w)


def stage_cache_copy_stream():
    """The same with the driver's copy stream doing the input copies."""
    import torch

    from fusegraph.graph.drivers import _CopyStream

    graph, x, w, out = plain_capture()
    _through_cache(_py_executable(graph.replay, out, copy_fn=_CopyStream(torch.cuda)), [x, w], x, w)


def stage_cache_driver():
    """fusegraph's capture replayed through the C++ cache: the route minus GraphRunner."""
    cap, x, w = _driver_capture()
    _through_cache(cap.executable, cap.static_inputs, x, w)


def _runner(config, device="cuda"):
    import torch

    from fusegraph.graph import GraphRunner

    w = torch.randn(64, 64, device=device)
    r = GraphRunner(fn, config)
    for i in range(3):
        x = torch.randn(16, 64, device=device)
        torch.testing.assert_close(r(x, w), fn(x, w))
        say("call", i, "ok")
    say(r.stats.graphs_captured, "captured,", r.stats.replays, "replays, fallbacks", r.stats.fallbacks)


def stage_runner_cpu():
    """GraphRunner on the CPU (the host graph): the build and this Python, without CUDA."""
    _runner(None, "cpu")


def stage_runner_graph_only():
    """GraphRunner on CUDA without the fusion trace."""
    _runner({"graph_only": True})


def stage_runner_default():
    """GraphRunner on CUDA as the failing test runs it."""
    _runner(None)


def stage_reduce_overhead():
    """torch.compile(backend=fusegraph Backend, mode="reduce-overhead") on a small module."""
    import torch

    from fusegraph import Backend

    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(approximate="tanh"), torch.nn.RMSNorm(64)).cuda()
    c = torch.compile(m, backend=Backend(), mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(16, 64, device="cuda")
            torch.testing.assert_close(c(x), m(x))


def stage_inductor_cudagraphs():
    """Inductor's own CUDA graphs (torch.compile(mode="reduce-overhead")), no fusegraph."""
    import torch

    m = torch.nn.Linear(64, 64).cuda()
    c = torch.compile(m, mode="reduce-overhead")
    with torch.no_grad():
        for _ in range(3):
            x = torch.randn(16, 64, device="cuda")
            torch.testing.assert_close(c(x), m(x))


STAGES = {name[len("stage_"):]: f for name, f in list(globals().items()) if name.startswith("stage_")}


def main(argv) -> int:
    if argv[:1] == ["--stage"]:
        stage = STAGES[argv[1]]
        print(f"== {argv[1]}: {stage.__doc__.splitlines()[0]}", flush=True)
        stage()
        print(f"== {argv[1]}: ok", flush=True)
        return 0
    failed, crashed = [], None
    for name in STAGES:
        try:
            rc = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--stage", name],
                                timeout=300).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        print(f"== {name}: {'ok' if rc == 0 else f'exit {rc}'}", flush=True)
        if rc != 0:
            failed.append(name)
            if crashed is None and isinstance(rc, int) and rc < 0:
                crashed = name
    if crashed and shutil.which("gdb"):
        print(f"== {crashed} again under gdb", flush=True)
        subprocess.run(["gdb", "-q", "-batch", "-ex", "run", "-ex", "bt 30", "--args", sys.executable, __file__,
                        "--stage", crashed], timeout=300)
    print(f"== failed: {', '.join(failed) or 'none'}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
