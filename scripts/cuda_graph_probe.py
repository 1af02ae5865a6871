"""Where a CUDA-graph crash happens, stage by stage (scripts/device_check.sh, step ``cuda_graph_probe``).

The first GPU run (H200, torch 2.11) lost every process that took fusegraph's CUDA-graph route to a host
segfault, while the CUDA ops and the Inductor and aten routes passed. Each stage below adds one layer of that
route to the one before, prints its name (flushed) before it starts and ``ok`` after, and runs in a process of its
own (``--stage N``), so the first stage that dies names the layer; with ``python -X faulthandler`` its stack is
printed too. Usage: python scripts/cuda_graph_probe.py            (every stage, each in a child process)
                    python -X faulthandler scripts/cuda_graph_probe.py --stage N
"""
from __future__ import annotations

import os
import subprocess
import sys
import types


def _fn(x, w):
    import torch

    return torch.tanh(x @ w) + x


def _inputs():
    import torch

    return torch.randn(16, 64, device="cuda"), torch.randn(64, 64, device="cuda")


def stage_plain_graph():
    """torch.cuda.graph alone: capture on a side stream, replay, new inputs copied in."""
    import torch

    x, w = _inputs()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        _fn(x, w)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = _fn(x, w)
    x2 = torch.randn_like(x)
    x.copy_(x2)
    g.replay()
    torch.testing.assert_close(out, _fn(x2, w))


def stage_shared_pool_side_stream():
    """As the driver does: a process-wide pool handle, an explicit capture stream, gc.collect/empty_cache muted."""
    import torch

    from fusegraph.graph import drivers

    x, w = _inputs()
    pool = torch.cuda.graph_pool_handle()
    side = torch.cuda.Stream()
    side.wait_event(torch.cuda.current_stream().record_event())
    with torch.cuda.stream(side):
        _fn(x, w)
    torch.cuda.current_stream().wait_event(side.record_event())
    g = torch.cuda.CUDAGraph()
    with drivers._quiet_memory_hooks(torch.cuda):
        with torch.cuda.graph(g, pool=pool, stream=side):
            out = _fn(x, w)
    g.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out, _fn(x, w))


def stage_driver_capture():
    """fusegraph's CudaDriver.capture, then the captured graph replayed from Python (no C++ cache)."""
    import torch

    from fusegraph.graph import drivers

    x, w = _inputs()
    opts = types.SimpleNamespace(graph_lazy_capture=False, graph_warmup_runs=1)
    cap = drivers.CudaDriver().capture(lambda a, b: [_fn(a, b)], [x, w], opts)
    print("  captured; memory", cap.memory_bytes, "static inputs", len(cap.static_inputs), flush=True)
    cap.static_inputs[0].copy_(x)
    cap.info["graph"].replay()
    torch.cuda.synchronize()
    print("  replayed", flush=True)


def stage_cache_replay():
    """The capture inserted into the C++ GraphCache and replayed through it (the GIL released around the call;
    the PyExecutable re-takes it for graph.replay and for the copy stream's input copies)."""
    import torch

    from fusegraph import _C
    from fusegraph.graph import drivers

    x, w = _inputs()
    opts = types.SimpleNamespace(graph_lazy_capture=False, graph_warmup_runs=1)
    cap = drivers.CudaDriver().capture(lambda a, b: [_fn(a, b)], [x, w], opts)
    cache = _C.graph.GraphCache(0, _C.graph.Eviction.fifo, 0, True, True)
    cache.insert([x, w], cap.static_inputs, cap.executable, int(cap.memory_bytes), None)
    print("  inserted", flush=True)
    for i in range(3):
        x2 = torch.randn_like(x)
        res = cache.call([x2, w], False)
        print(f"  call {i}: {res.status}", flush=True)
        torch.cuda.synchronize()
    print("  replayed through the cache", flush=True)


def stage_graph_runner():
    """The whole route: GraphRunner (trace, capture, the C++ cache, input copies on the copy stream, replay)."""
    import torch

    from fusegraph.graph import GraphRunner

    x, w = _inputs()
    r = GraphRunner(_fn)
    for i in range(3):
        x = torch.randn(16, 64, device="cuda")
        print(f"  call {i}", flush=True)
        torch.testing.assert_close(r(x, w), _fn(x, w))
    print("  stats:", r.stats.graphs_captured, "captured,", r.stats.replays, "replays", flush=True)


def stage_reduce_overhead():
    """torch.compile(backend=fusegraph, mode="reduce-overhead") on a small module: fusion, Inductor, capture."""
    import torch

    from fusegraph import Backend

    m = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.GELU(approximate="tanh"),
                            torch.nn.RMSNorm(64)).cuda()
    c = torch.compile(m, backend=Backend(), mode="reduce-overhead")
    with torch.no_grad():
        for i in range(3):
            x = torch.randn(16, 64, device="cuda")
            torch.testing.assert_close(c(x), m(x))


STAGES = [stage_plain_graph, stage_shared_pool_side_stream, stage_driver_capture, stage_cache_replay,
          stage_graph_runner, stage_reduce_overhead]


def main(argv) -> int:
    if argv[:1] == ["--stage"]:
        stage = STAGES[int(argv[1])]
        print(f"stage {argv[1]}: {stage.__name__}: {stage.__doc__.splitlines()[0]}", flush=True)
        stage()
        print(f"stage {argv[1]}: ok", flush=True)
        return 0
    failed = 0
    for i, stage in enumerate(STAGES):
        proc = subprocess.run([sys.executable, "-X", "faulthandler", __file__, "--stage", str(i)], text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300,
                              env=dict(os.environ, FUSEGRAPH_CUDA_GRAPHS="1"))  # the route is off by default
        print(proc.stdout, end="", flush=True)
        if proc.returncode != 0:
            failed += 1
            print(f"stage {i} ({stage.__name__}): exit code {proc.returncode}"
                  f"{' (killed by signal ' + str(-proc.returncode) + ')' if proc.returncode < 0 else ''}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
