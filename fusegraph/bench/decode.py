"""``python -m fusegraph bench decode``: the seed's decode-block example (SPEC §5).

RMSNorm -> QKV projection -> RoPE -> attention over a static KV cache -> out-projection -> residual, one new
token per sequence. Checks ``assert_close(out, reference, rtol=1e-2, atol=1e-2)`` against a float64
reference and that graph and no-graph results are equal, then prints the three figures of SPEC §5 —
kernel time eager, kernel time in graph replay, end-to-end time including host dispatch — for eager,
torch.compile (default), and the fusegraph graph route (GraphRunner: the C++ host graph on CPU, a CUDA
graph on CUDA), plus the variables that decide the result.

Kernel time on CPU: the ops' own time, measured around each op's ``callBoxed`` in the host graph's C++ loop
(``HostGraph.run_timed``); eager runs the very same aten kernels on the same inputs, so the figure serves both
(torch.profiler's per-op self time on CPU is dominated by its own overhead). On CUDA: profiler device time.
End-to-end: wall time per call, medians over interleaved rounds in rotating order (same machine load for all).
Host-graph overhead per op = (end-to-end replay - kernel time in replay) / number of ops.
"""
from __future__ import annotations

import argparse
import math
import statistics
import sys
import time as _time

import torch
import torch.nn.functional as F

from fusegraph.bench.timing import fmt_time, machine_summary, positive_int, synchronize
from fusegraph.config import CompilationConfig
from fusegraph.graph.host import trace_fused


class DecodeBlock(torch.nn.Module):
    """One decode step of an attention block over a static (prefilled) KV cache."""

    def __init__(self, hidden=512, heads=8, cache_len=128, batch=1, eps=1e-6, dtype=torch.bfloat16, device="cpu"):
        super().__init__()
        if hidden % heads:
            raise ValueError(f"hidden={hidden} is not a multiple of heads={heads}")
        self.hidden, self.heads, self.head_dim, self.eps = hidden, heads, hidden // heads, eps
        g = torch.Generator().manual_seed(0)

        def param(*shape, scale):
            return (torch.randn(*shape, generator=g, dtype=torch.float64) * scale).to(dtype).to(device)

        self.norm_weight = torch.nn.Parameter(1 + param(hidden, scale=0.1), requires_grad=False)
        self.w_qkv = torch.nn.Parameter(param(3 * hidden, hidden, scale=hidden ** -0.5), requires_grad=False)
        self.w_out = torch.nn.Parameter(param(hidden, hidden, scale=hidden ** -0.5), requires_grad=False)
        self.register_buffer("cache_k", param(batch, heads, cache_len, self.head_dim, scale=1.0))
        self.register_buffer("cache_v", param(batch, heads, cache_len, self.head_dim, scale=1.0))

    def forward(self, x, cos, sin):
        """x: [B, 1, hidden]; cos, sin: [1, 1, 1, head_dim] for the new token's position."""
        b = x.shape[0]
        h = F.rms_norm(x, (self.hidden,), self.norm_weight, self.eps)
        q, k, v = F.linear(h, self.w_qkv).split(self.hidden, dim=-1)
        q, k, v = (t.view(b, 1, self.heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = rope_rotate_half(q, cos, sin), rope_rotate_half(k, cos, sin)
        keys = torch.cat([self.cache_k, k], dim=2)
        values = torch.cat([self.cache_v, v], dim=2)
        attn = F.scaled_dot_product_attention(q, keys, values)
        attn = attn.transpose(1, 2).reshape(b, 1, self.hidden)
        return x + F.linear(attn, self.w_out)


def rope_rotate_half(x, cos, sin):
    x1, x2 = x.chunk(2, dim=-1)
    return x * cos + torch.cat([-x2, x1], dim=-1) * sin


def rope_tables(position: int, head_dim: int, dtype, device="cpu"):
    inv = 1.0 / (10000 ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    ang = position * inv
    ang = torch.cat([ang, ang])
    cos, sin = (t.to(dtype).view(1, 1, 1, head_dim).to(device) for t in (ang.cos(), ang.sin()))
    return cos, sin


def reference(block: DecodeBlock, x, cos, sin):
    """The same math in float64 on the same (rounded) parameters and inputs."""
    d = torch.float64
    b = x.shape[0]
    x64 = x.to(d)
    h = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + block.eps) * block.norm_weight.to(d)
    q, k, v = (h @ block.w_qkv.to(d).T).split(block.hidden, dim=-1)
    q, k, v = (t.view(b, 1, block.heads, block.head_dim).transpose(1, 2) for t in (q, k, v))
    q, k = rope_rotate_half(q, cos.to(d), sin.to(d)), rope_rotate_half(k, cos.to(d), sin.to(d))
    keys = torch.cat([block.cache_k.to(d), k], dim=2)
    values = torch.cat([block.cache_v.to(d), v], dim=2)
    scores = (q @ keys.transpose(-1, -2)) / math.sqrt(block.head_dim)
    attn = (scores.softmax(-1) @ values).transpose(1, 2).reshape(b, 1, block.hidden)
    return x64 + attn @ block.w_out.to(d).T


def make_inputs(block: DecodeBlock, batch: int, position: int, dtype, device="cpu"):
    g = torch.Generator().manual_seed(1)
    x = torch.randn(batch, 1, block.hidden, generator=g, dtype=torch.float64).to(dtype).to(device)
    cos, sin = rope_tables(position, block.head_dim, dtype, device)
    return x, cos, sin


def _profiled_kernel_seconds(fn, reps, device):
    """Per call, the device kernels' time torch.profiler records (CUDA); on CPU the ops' self time (only used
    where the host graph's own per-op timer is not available)."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    for _ in range(3):
        fn()
    with profile(activities=acts) as prof:
        for _ in range(reps):
            fn()
        synchronize(device)
    total = 0.0
    for e in prof.key_averages():
        if device.type == "cuda":
            total += e.self_device_time_total
        elif e.key.startswith(("aten::", "fusegraph::")):
            total += e.self_cpu_time_total
    return total / reps * 1e-6


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m fusegraph bench decode", description=__doc__.splitlines()[0])
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--cache-len", type=int, default=128)
    p.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32", "bfloat16", "float16", "float32"],
                   help="bf16 (default), fp16 or fp32 (the long names work too)")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--reps", type=positive_int, default=200)
    p.add_argument("--threads", type=int, default=0, help="torch.set_num_threads (0: leave as is)")
    p.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow to compile on small machines)")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}.get(args.dtype) or getattr(torch, args.dtype)
    device = torch.device(args.device)

    import fusegraph  # noqa: F401
    from fusegraph.graph import GraphRunner, trace_aten

    block = DecodeBlock(args.hidden, args.heads, args.cache_len, args.batch, dtype=dtype, device=device).eval()
    x, cos, sin = make_inputs(block, args.batch, position=args.cache_len, dtype=dtype, device=device)
    print(f"# decode block: batch {args.batch}, heads {args.heads}, hidden {args.hidden}, head_dim "
          f"{block.head_dim}, KV cache {args.cache_len}, dtype {args.dtype}, device {device}")
    print(f"# {machine_summary(device)}")

    with torch.no_grad():
        eager_out = block(x, cos, sin)
        torch.testing.assert_close(eager_out.double(), reference(block, x, cos, sin), rtol=1e-2, atol=1e-2)
        runner = GraphRunner(block)
        t0 = _time.perf_counter()
        graph_out = runner(x, cos, sin)
        synchronize(device)
        capture_s = _time.perf_counter() - t0
        torch.testing.assert_close(graph_out.double(), reference(block, x, cos, sin), rtol=1e-2, atol=1e-2)
        # GraphRunner fuses before it captures: "no graph" is the same ops run without capture — the fused trace,
        # or the plain one where the host driver timed that faster and captured it instead
        fused, _, plain = trace_fused(lambda *t: [block(*t)], [x, cos, sin], CompilationConfig().fusion_patterns)
        captured = plain if plain is not None and any(runner.stats.lowered.values()) else fused
        no_graph = captured(x, cos, sin)[0] if captured is not None else eager_out
        assert torch.equal(runner(x, cos, sin), no_graph), "graph and no-graph results differ"
        ref = reference(block, x, cos, sin)
        err_eager, err_graph = ((o.double() - ref).abs().max().item() for o in (eager_out, graph_out))
        kind = "plain" if captured is plain else "fused"
        print("# correctness: assert_close(out, reference, rtol=1e-2, atol=1e-2) passed for eager and graph; "
              f"graph == no-graph (the same {kind} ops uncaptured): True; max |out - float64 reference|: "
              f"eager {err_eager:.2e}, graph {err_graph:.2e}")

        compiled, compile_s = None, None
        if not args.no_compile:
            compiled = torch.compile(block)
            t0 = _time.perf_counter()
            compiled(x, cos, sin)
            compile_s = _time.perf_counter() - t0
        fg_default, fg_compile_s = None, None
        if not args.no_compile:  # fusegraph's default route (fusion -> Inductor), SPEC §5's fourth column
            try:
                torch.compiler.reset()
                from fusegraph import Backend

                fg_default = torch.compile(block, backend=Backend())
                t0 = _time.perf_counter()
                fg_default(x, cos, sin)
                fg_compile_s = _time.perf_counter() - t0
            except Exception as e:  # report, don't fail the benchmark
                print(f"# fusegraph default route unavailable: {type(e).__name__}: {e}")
                fg_default = None
        variants = {"eager": lambda: block(x, cos, sin), "graph": lambda: runner(x, cos, sin)}
        if compiled is not None:
            variants["compile"] = lambda: compiled(x, cos, sin)
        if fg_default is not None:
            variants["fg_default"] = lambda: fg_default(x, cos, sin)
        hg = hg_eager = n_ops = None
        if device.type == "cpu":  # the kernels of each: eager's ops (the plain trace) and the replay's (fused)
            from fusegraph.graph import build_host_graph

            hg_eager = build_host_graph(trace_aten(lambda *t: [block(*t)], [x, cos, sin]))
            hg = build_host_graph(fused) if fused is not None else hg_eager
            n_ops, n_eager_ops = hg.num_instructions, hg_eager.num_instructions
        # interleaved rounds: every variant sees the same machine load (medians over rounds); the host
        # graph's per-op timer runs in the same rounds
        times = {k: [] for k in variants}
        kernel_sums, eager_kernel_sums, release_sums = [], [], []
        names = list(variants)
        warm = 10  # untimed rounds
        for i in range(args.reps + warm):
            # rotate the order each round, so no variant always runs right after another one
            for name in names[i % len(names):] + names[:i % len(names)]:
                fn = variants[name]
                synchronize(device)
                t0 = _time.perf_counter()
                fn()
                synchronize(device)
                if i >= warm:
                    times[name].append(_time.perf_counter() - t0)
            if hg is not None:
                _, secs, released = hg.run_timed([x, cos, sin])
                _, eager_secs, _ = hg_eager.run_timed([x, cos, sin])
                if i >= warm:
                    kernel_sums.append(sum(secs))
                    eager_kernel_sums.append(sum(eager_secs))
                    release_sums.append(released)
        med = {k: statistics.median(v) for k, v in times.items()}
        eager_s, graph_s, compiled_s = med["eager"], med["graph"], med.get("compile")
        if kernel_sums:  # CPU: a C++ timer around each op of the host graphs of eager's ops and of the replay's
            kernel_eager, kernel_graph = statistics.median(eager_kernel_sums), statistics.median(kernel_sums)
        else:  # device: profiler device time of each
            kernel_eager = _profiled_kernel_seconds(variants["eager"], min(args.reps, 50), device)
            kernel_graph = _profiled_kernel_seconds(variants["graph"], min(args.reps, 50), device)
        rows = [("eager", kernel_eager, None, eager_s)]
        if compiled_s is not None:
            rows.append((f"torch.compile default (compile {compile_s:.1f} s)", None, None, compiled_s))
        if "fg_default" in med:
            rows.append((f"fusegraph default (fusion+Inductor, compile {fg_compile_s:.1f} s)", None, None,
                         med["fg_default"]))
        rows.append((f"fusegraph graph route ({'host graph' if device.type == 'cpu' else device.type + ' graph'}, "
                     f"capture {capture_s:.2f} s)", None, kernel_graph, graph_s))

    print(f"{'variant':58s} {'kernel eager':>13s} {'kernel replay':>13s} {'end-to-end':>12s} {'vs eager':>9s}")
    for name, ke, kg, e2e in rows:
        print(f"{name:58s} {fmt_time(ke) if ke else '-':>13s} {fmt_time(kg) if kg else '-':>13s} "
              f"{fmt_time(e2e):>12s} {eager_s / e2e:8.2f}x")
    print("# kernel time: " + ("the ops' own time, a C++ timer around each op's callBoxed in a host graph: for "
                               "eager, of eager's own ops (the plain trace, the same aten kernels on the same "
                               "inputs); for the replay, of the captured fused graph (the CPU has no separate "
                               "device timeline)" if n_ops else "profiler device time"))
    if n_ops:
        freed = statistics.median(release_sums)
        print(f"# host graph: {n_ops} ops; overhead per replayed op = (end-to-end - kernel replay) / ops = "
              f"{(graph_s - kernel_graph) / n_ops * 1e6:.2f} us, of which freeing dead tensors "
              f"{freed / n_ops * 1e6:.2f} us; eager: {n_eager_ops} ops, host work per op = "
              f"{(eager_s - kernel_eager) / n_eager_ops * 1e6:.2f} us")
        if compiled_s is not None:
            print(f"# graph route vs torch.compile default: {compiled_s / graph_s:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
