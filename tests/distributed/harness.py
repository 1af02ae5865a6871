"""Launches N ranks of ``tests/distributed/worker.py`` (torchrun's environment: RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT; gloo on CPU) as subprocesses, each under a faulthandler watchdog inside the worker and
a subprocess timeout here: a hang fails the test (with every rank's stack dumped), it never blocks CI.

Each worker prints one ``RESULT <json>`` line per scenario; ``run_ranks`` returns them per rank."""
from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(ROOT, "tests", "distributed", "worker.py")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class RanksFailed(AssertionError):
    pass


def _busy_beside(pid: int):
    """A process spinning on the core ``pid`` is pinned to (both pinned to one core where there are several): that
    rank runs at about half speed, the others at full speed."""
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    if len(cpus) > 1:
        for p in (busy.pid, pid):
            try:
                os.sched_setaffinity(p, {cpus[-1]})
            except OSError:
                pass
    return busy


def run_ranks(scenarios, nproc: int = 2, timeout: float = 240.0, env: dict | None = None,
              busy_rank: int | None = None) -> list:
    """Runs ``scenarios`` (names in worker.SCENARIOS, run in order in one process per rank) on ``nproc`` ranks.
    Returns, per rank, ``{scenario: result dict}``. Raises RanksFailed with every rank's output when a rank
    fails, or hangs past ``timeout`` seconds (the watchdog dumps each rank's stacks a little before; an exchange
    the other ranks do not join raises after FUSEGRAPH_RANK_TIMEOUT_S, before that). ``busy_rank``: a busy process
    shares that rank's core for the run."""
    port = free_port()
    procs, busy = [], None
    for rank in range(nproc):
        e = dict(os.environ)
        e.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(nproc), LOCAL_WORLD_SIZE=str(nproc),
                 MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1",
                 FUSEGRAPH_WATCHDOG_S=str(max(10.0, timeout - 15.0)),
                 FUSEGRAPH_RANK_TIMEOUT_S=str(max(5.0, (timeout - 15.0) / 2)),
                 PYTHONPATH=ROOT + os.pathsep + e.get("PYTHONPATH", ""))
        e.update(env or {})
        procs.append(subprocess.Popen([sys.executable, WORKER, *scenarios], env=e, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True, cwd=ROOT))
        if rank == busy_rank:
            busy = _busy_beside(procs[-1].pid)
    deadline = time.monotonic() + timeout
    outputs, hung = [], False
    try:
        for p in procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                hung = True
                p.kill()
                out, _ = p.communicate()
            outputs.append(out)
    finally:
        if busy is not None:
            busy.kill()
            busy.wait()
    failed = hung or any(p.returncode != 0 for p in procs)
    if failed:
        text = "\n".join(f"===== rank {r} (exit {p.returncode}) =====\n{o[-20000:]}"
                         for r, (p, o) in enumerate(zip(procs, outputs)))
        raise RanksFailed(f"{'HANG (timeout ' + str(timeout) + ' s)' if hung else 'rank failure'} in "
                          f"{scenarios}:\n{text}")
    results = []
    for out in outputs:
        per = {}
        for line in out.splitlines():
            if line.startswith("RESULT "):
                item = json.loads(line[len("RESULT "):])
                per[item["scenario"]] = item
        results.append(per)
    return results
