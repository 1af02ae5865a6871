"""Measures fusegraph.ops.rope and fusegraph.ops.mul_add against the eager compositions and a plain copy.

Run from the repository root:  .venv/bin/python docs/notes/elem_bench.py [--threads N]
"copy" copies a buffer of (bytes read + bytes written) / 2 into a preallocated one, so it moves exactly the
op's traffic and pays no output allocation; the op (like eager) allocates its output, whose first touch costs
page faults when the allocation is fresh mmap'd memory (glibc: > 32 MiB). "first touch" prints that cost alone.
"""
import argparse
import os
import statistics
import time

import torch
from diffusers.models.embeddings import apply_rotary_emb

import fusegraph
from fusegraph.bench.timing import fmt_time, machine_summary, median_seconds

REPS = dict(warmup=5, reps=30, min_time=1.0)
MEASURE = lambda fn: median_seconds(fn, **REPS)  # noqa: E731


def median_cpu_seconds(fn, warmup=5, reps=30):
    """Median on-CPU time of the calling thread (time.thread_time): with one thread the kernels run inline, so
    this is their cost without the time other processes hold the core (the shared build machine)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        t0 = time.thread_time()
        fn()
        times.append(time.thread_time() - t0)
    return statistics.median(times)


def same_bytes_copy(nbytes):
    src = torch.empty(nbytes // 4, dtype=torch.float32).normal_()
    dst = torch.empty_like(src)
    return lambda: dst.copy_(src)


def row(name, op, eager, copy):
    t_op, t_eager, t_copy = (MEASURE(f) for f in (op, eager, copy))
    print(f"{name:34s} op {fmt_time(t_op)}  eager {fmt_time(t_eager)}  copy {fmt_time(t_copy)}  "
          f"eager/op {t_eager / t_op:5.2f}x  op/copy {t_op / t_copy:5.2f}x")


def first_touch(shape, dtype):
    out = torch.empty(shape, dtype=dtype)
    t_fresh = MEASURE(lambda: torch.empty(shape, dtype=dtype).fill_(1))
    t_reused = MEASURE(lambda: out.fill_(1))
    print(f"  fill of a fresh {list(shape)} {str(dtype)[6:]} {fmt_time(t_fresh)}, of a reused one {fmt_time(t_reused)}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--clock", choices=["wall", "cpu"], default="wall",
                        help="wall: median_seconds (end to end); cpu: the calling thread's CPU time (use --threads 1)")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    global MEASURE
    if args.clock == "cpu":
        assert args.threads == 1, "--clock cpu measures the calling thread only: use --threads 1"
        MEASURE = median_cpu_seconds
    print(machine_summary())
    with open("/proc/loadavg") as f:
        print("load average", f.read().split()[:3], "| THP_MEM_ALLOC_ENABLE =", os.environ.get("THP_MEM_ALLOC_ENABLE"),
              "| clock", args.clock)
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.randn(1, 4096, 24, 128).to(dtype)
        cos, sin = torch.randn(4096, 128), torch.randn(4096, 128)
        c4, s4 = cos[None, :, None, :], sin[None, :, None, :]
        moved = 2 * x.numel() * x.element_size() + 2 * cos.numel() * 4
        for interleaved, unbind in ((True, -1), (False, -2)):
            row(f"rope {str(dtype)[6:]} interleaved={interleaved}",
                lambda: fusegraph.ops.rope(x, c4, s4, interleaved=interleaved),
                lambda: apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=unbind, sequence_dim=1),
                same_bytes_copy(moved // 2))
        first_touch(x.shape, dtype)
    for dtype in (torch.float32, torch.bfloat16):
        y, res = torch.randn(1, 4096, 3072).to(dtype), torch.randn(1, 4096, 3072).to(dtype)
        gate = torch.randn(1, 6 * 3072).to(dtype).chunk(6, dim=1)[2].unsqueeze(1)  # [1,1,D] view
        moved = 3 * y.numel() * y.element_size()
        row(f"mul_add {str(dtype)[6:]} gate view", lambda: fusegraph.ops.mul_add(y, gate, res),
            lambda: res + gate * y, same_bytes_copy(moved // 2))
        row(f"mul_add {str(dtype)[6:]} same shape", lambda: fusegraph.ops.mul_add(y, res, res),
            lambda: res + res * y, same_bytes_copy(moved // 2))
        row(f"mul_add {str(dtype)[6:]} scalar", lambda: fusegraph.ops.mul_add(y, 0.5, res),
            lambda: y * 0.5 + res, same_bytes_copy(moved // 2))
        if dtype == torch.bfloat16:
            g32 = gate.float()
            row("mul_add bf16 fp32 gate (Wan)", lambda: fusegraph.ops.mul_add(y, g32, res, out_dtype=dtype),
                lambda: (res.float() + y.float() * g32).type_as(res), same_bytes_copy(moved // 2))
        first_touch(y.shape, dtype)


if __name__ == "__main__":
    main()
