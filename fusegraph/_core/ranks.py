"""Ranks in step (multi-process inference under ``torchrun``).

A graph that contains collectives (``_c10d_functional.all_to_all_single`` / ``all_gather_into_tensor`` /
``all_reduce`` + ``wait_tensor``: diffusers' context parallelism, DTensor tensor parallelism) must run the same
collectives in the same order on every rank of their group, or the job hangs. Replaying a captured graph runs
them exactly as the eager program would; what can differ are the runtime's own *decisions*: capture (its warm-up
runs execute the function, collectives included), recapture, eviction, fallback to eager after a failed capture,
and verify's undo of a pattern family. Every such decision is taken identically on all ranks:

- capture is decided by the input signature; the ranks compare the tensor part of it (shapes, dtypes, device
  types: ``tensor_signature``) on every call (``graph_rank_check="call"``: one all_reduce of two int64) or only
  before each capture (``"capture"``: one ``all_gather`` of an int64) and, when they differ, every rank raises a
  ``RuntimeError`` naming each rank's signature (never a hang, never a capture on some ranks only). Non-tensor
  values are not compared: they may differ by rank within one program (a rank's sequence offset under context
  parallelism);
- a capture's outcome is agreed: one ``all_gather`` of (failed, measured memory); a failure on any rank makes
  every rank drop its capture and fall back (or raise) for that signature, naming the rank that failed; the
  memory each rank records is the maximum over the ranks, so memory-budget eviction evicts the same entries;
- FIFO/LRU eviction and recapture depend only on the sequence of signatures, which is the same on all ranks;
- verify (``CompilationConfig.verify``) runs the graph, collectives included, several times inside the compile: it
  first checks that every rank is verifying a graph with the same collectives as its n-th verify on the group
  (``enter_step``), then agrees on each "differs", on the families that fused and on each undone family
  (``agree_any``, vectors of a fixed length). ``passes._verified`` says why its sequence of collectives cannot
  differ between ranks; Inductor's caches are bypassed while it verifies with several ranks
  (``inductor_pass.FusionPass.uuid``), so no rank is served a compile the others run the pass for.

Every exchange made during a compile waits at most ``FUSEGRAPH_RANK_TIMEOUT_S`` seconds (default 600) for the other
ranks; past that it raises ``RanksOutOfStep`` naming this rank and the step, instead of hanging.

When: only when ``torch.distributed`` is initialised with more than one rank *and* the graph contains collectives
(for aten graphs: a ``_c10d_functional``/``c10d`` op in it; the group is the one those ops name, or the default
group when they name several). A graph without collectives stays rank-local (a rank may compile and capture
things the others do not), and a single process pays nothing: no check runs at all. A ``GraphRunner`` around an
arbitrary Python function cannot be inspected before it runs: it agrees over the default group when distributed
is initialised (``process_group="auto"``), unless given ``process_group=None`` (rank-local) or a group.

The capture agreements run only when a signature is new (a capture). On a replay the only exchange is the signature
comparison of ``graph_rank_check="call"`` (the default): one all_reduce of two int64 and a host read of it; with
``"capture"`` a replay exchanges nothing and makes no host synchronisation. Rank-local events a runtime cannot see coming (a rank replacing its weights alone) are the
program's to keep in step, exactly as in eager mode.
"""
from __future__ import annotations

import datetime
import functools
import hashlib
import os
import re

import torch

from .torch_dispatcher import DisablePythonDispatcher, single_overload
from .torch_distributed import resolve_process_group
from .torch_fake import disable_current_modes

COLLECTIVE_NAMESPACES = ("_c10d_functional", "c10d_functional", "c10d", "_dtensor")


class RanksOutOfStep(RuntimeError):
    """The ranks of a group are no longer issuing the same collectives: one waited past ``exchange_timeout()`` in an
    exchange the others did not join, or the ranks entered one step with different graphs or counts. Never
    swallowed by a fallback: continuing would pair different collectives and hang."""


def exchange_timeout() -> float:
    """Seconds an exchange made during a compile waits for the other ranks (``FUSEGRAPH_RANK_TIMEOUT_S``, default
    600): long enough for a rank still compiling a large graph, short of a job's own timeout."""
    try:
        return max(1.0, float(os.environ.get("FUSEGRAPH_RANK_TIMEOUT_S", "600")))
    except ValueError:
        return 600.0


def _wait(work, step: str) -> None:
    """``work.wait()`` with ``exchange_timeout()``; past it, RanksOutOfStep naming this rank and ``step``."""
    timeout = exchange_timeout()
    try:
        work.wait(timeout=datetime.timedelta(seconds=timeout))
    except RuntimeError as e:
        if "timed out" not in str(e).lower() and "timeout" not in str(e).lower():
            raise
        raise RanksOutOfStep(
            f"fusegraph: rank {torch.distributed.get_rank()}: {step}: the other ranks of the group did not join this "
            f"exchange within {timeout:g} s (FUSEGRAPH_RANK_TIMEOUT_S): the ranks are out of step (a rank compiling "
            f"other graphs, or one that skipped a step the others made)") from None


def distributed_world() -> bool:
    """torch.distributed is initialised with more than one rank."""
    dist = torch.distributed
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def collective_groups(gm) -> list | None:
    """The group names the collectives of an FX graph use (``[]``: none; ``None``: collectives whose group cannot
    be read, e.g. the in-place ``c10d`` ops that take a ProcessGroup object)."""
    graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
    names, unknown = set(), False
    for n in graph.nodes:
        op = single_overload(n.target) if n.op == "call_function" else None
        if op is None or op._schema.name.split("::", 1)[0] not in COLLECTIVE_NAMESPACES:
            continue
        if op._schema.name.endswith("::wait_tensor"):
            continue
        bound = dict(zip((a.name for a in op._schema.arguments), n.args))
        bound.update(n.kwargs)
        if isinstance(bound.get("group_name"), str):
            names.add(bound["group_name"])
        else:
            unknown = True
    return None if unknown else sorted(names)


def group_for_graph(gm):
    """The process group whose ranks must agree on this graph's decisions, or None (no collectives, or not
    distributed)."""
    if not distributed_world():
        return None
    names = collective_groups(gm)
    if names == []:
        return None
    if names and len(names) == 1:
        try:
            return resolve_process_group(names[0])
        except Exception:  # an unregistered name: the default group is a safe superset
            pass
    return torch.distributed.group.WORLD


def group_for_runner(process_group, fn):
    """The group a GraphRunner agrees over: ``process_group`` "auto" → the graph's (aten graphs) or the default
    group (any other function) when distributed; None → rank-local; a group → that group."""
    if process_group is None:
        return None
    if process_group != "auto":
        return process_group
    if not distributed_world():
        return None
    if isinstance(fn, torch.fx.GraphModule):
        return group_for_graph(fn)
    return torch.distributed.group.WORLD


def _outside_modes(fn):
    """Runs an exchange with every Python dispatch mode popped and the Python dispatcher off (both restored after).

    - Modes: the aten route fuses, and so verifies, inside aot_autograd's fake mode: an agreement tensor made there
      is fake, and the fake mode either skips the collective (no communication: this rank falls a collective
      behind) or, for a one-element constant, runs it for real; the ranks then pair different collectives and hang.
    - The Python dispatcher (on inside Inductor's compile, where verify runs): with it, the dispatcher holds the GIL
      while the collective is enqueued. gloo's worker thread destroys a finished work under the lock enqueueing
      takes, and when that work held the last reference to a tensor Python had let go of (the graph's own
      collective a verify run just made), the destructor waits for the GIL: the two threads wait on each other
      and the rank hangs (seen once in ~10 runs of tests/distributed's busy-core verify case). Without the Python
      dispatcher ``ProcessGroup`` calls release the GIL first, and the worker can finish.
    """
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with disable_current_modes(), DisablePythonDispatcher():
            return fn(*args, **kwargs)

    return wrapper


_held: list = []  # the last exchange's work and tensors, kept alive until the next exchange (see _keep)


def _keep(work, *tensors) -> None:
    """Keeps an exchange's work (and its tensors) referenced from Python until the next exchange. gloo's worker
    thread drops its own reference to a finished work under the lock that enqueueing the next collective takes; if
    that was the last reference, the work's destructor releases its tensors there, and releasing a tensor that has
    (or had) a Python object takes the GIL. The next collective on this thread — the verified graph's own, issued
    with the GIL held by its Python autograd kernel — then waits for that lock while holding the GIL: the deadlock
    ``_outside_modes`` describes, the other way round. Held here, the work is destroyed on this thread instead."""
    _held[:] = [work, *tensors]


def _comm_device(group) -> torch.device:
    """Where the agreement tensors live: CPU for gloo, the current CUDA device for NCCL (a communicator that
    cannot take CPU tensors)."""
    dist = torch.distributed
    try:
        backend = dist.get_backend(group)
    except Exception:
        backend = "gloo"
    if "nccl" in str(backend) and torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if "hccl" in str(backend) and hasattr(torch, "npu"):
        return torch.device("npu", torch.npu.current_device())
    return torch.device("cpu")


@_outside_modes
def _all_gather_ints(values: list, group, step: str = "an exchange") -> list:
    """Each rank's ``values`` (the same length on every rank), as a list per rank (waits at most
    ``exchange_timeout()``)."""
    dist = torch.distributed
    device = _comm_device(group)
    mine = torch.tensor(values, dtype=torch.int64, device=device)
    world = dist.get_world_size(group)
    out = torch.empty(world * len(values), dtype=torch.int64, device=device)
    work = dist.all_gather_into_tensor(out, mine, group=group, async_op=True)
    _wait(work, step)
    _keep(work, out, mine)
    return out.view(world, len(values)).tolist()


def _normalise(description: str) -> str:
    """A signature as it compares across ranks: device indices (each rank its own GPU) and object addresses
    (modules keyed by identity) are rank-local."""
    description = re.sub(r"\b(cuda|npu|xpu|hpu):\d+", r"\1", description)
    return re.sub(r"0x[0-9a-fA-F]+", "0x?", description)


def tensor_signature(leaves) -> str:
    """What must be the same on every rank: the tensor arguments' shapes, dtypes and device types. Non-tensor
    values may differ by rank and still be one program: under context parallelism Dynamo passes each rank's
    sequence offset as an int (rank 0's specialised away, rank 1's 384), so they are not compared."""
    from .. import _C

    return _C.graph.GraphCache.describe_signature([x for x in leaves if isinstance(x, torch.Tensor)])


def signature_hash(description: str) -> int:
    digest = hashlib.sha256(_normalise(description).encode()).digest()
    return int.from_bytes(digest[:8], "little", signed=True)


@_outside_modes
def check_signatures(group, description: str, what: str) -> None:
    """Raises on every rank when the ranks of ``group`` are about to capture different input signatures."""
    dist = torch.distributed
    hashes = [row[0] for row in _all_gather_ints([signature_hash(description)], group,
                                                  f"{what}: comparing the input signatures")]
    if len(set(hashes)) == 1:
        return
    descriptions = [None] * dist.get_world_size(group)
    dist.all_gather_object(descriptions, description, group=group)
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(len(hashes)))
    counts = {h: hashes.count(h) for h in hashes}
    common = max(counts, key=lambda h: (counts[h], -hashes.index(h)))
    odd = [ranks[i] for i, h in enumerate(hashes) if h != common]
    listing = "; ".join(f"rank {ranks[i]}: {d}" for i, d in enumerate(descriptions))
    raise RuntimeError(
        f"fusegraph: {what}: the ranks called with different input signatures, so they would capture and run "
        f"different graphs (and their collectives would not match). Rank(s) {odd} differ from the others. "
        f"Signatures: {listing}. Every rank must call the compiled function with the same shapes, dtypes and "
        f"non-tensor values (this rank: {dist.get_rank()})")


@_outside_modes
def check_call(group, description: str, what: str) -> None:
    """The per-call form of ``check_signatures`` (``graph_rank_check="call"``): one all_reduce(MAX) of
    (hash, -hash); only when the ranks differ are the signatures gathered, and every rank raises."""
    dist = torch.distributed
    h = signature_hash(description)
    t = torch.tensor([h, -h], dtype=torch.int64, device=_comm_device(group))
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
    work.wait()
    _keep(work, t)
    if t[0].item() == -t[1].item():  # max == min: every rank has this hash
        return
    check_signatures(group, description, what)
    raise AssertionError("fusegraph: the ranks' signature hashes differ, their signatures do not")  # not reached


@_outside_modes
def agree_capture(group, failed: bool, memory_bytes: int) -> tuple[list, int]:
    """(global ranks whose capture failed, the largest memory any rank measured)."""
    dist = torch.distributed
    rows = _all_gather_ints([int(failed), int(memory_bytes)], group, "agreeing on a capture's outcome")
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(len(rows)))
    failed_ranks = [ranks[i] for i, (f, _) in enumerate(rows) if f]
    return failed_ranks, max(m for _, m in rows)


@_outside_modes
def agree_any(group, flags: list, step: str = "an agreement") -> list:
    """Element-wise OR of ``flags`` (bools, the same length on every rank) over ``group``; ``flags`` itself when
    ``group`` is None. Waits at most ``exchange_timeout()`` (then RanksOutOfStep naming ``step``)."""
    if group is None:
        return list(flags)
    dist = torch.distributed
    t = torch.tensor([int(bool(f)) for f in flags], dtype=torch.int64, device=_comm_device(group))
    work = dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group, async_op=True)
    _wait(work, step)
    _keep(work, t)
    return [bool(v) for v in t.tolist()]


def collective_sequence(gm) -> str:
    """The collectives of an FX graph in graph order (op and group name): what must be the same on every rank."""
    graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
    seq = []
    for n in graph.nodes:
        op = single_overload(n.target) if n.op == "call_function" else None
        if op is not None and op._schema.name.split("::", 1)[0] in COLLECTIVE_NAMESPACES:
            group = n.kwargs.get("group_name", next((a for a in n.args if isinstance(a, str)), ""))
            seq.append(f"{op._schema.name}[{group}]")
    return " ".join(seq)


_entries: dict = {}  # (step kind, group) -> steps of that kind this process entered on that group


@_outside_modes
def enter_step(group, kind: str, key: str) -> None:
    """Before a step whose collectives every rank of ``group`` must make alike (verify of a graph with collectives):
    one all_gather of (hash of ``key``, how many ``kind`` steps this process entered on the group). Equal on every
    rank: returns. Otherwise every rank raises RanksOutOfStep listing each rank's (key hash, count): the ranks are
    about to run different collectives (another graph), or one made a step the others did not (a compile served
    from a cache on one rank). A rank the others never join raises after ``exchange_timeout()``."""
    if group is None:
        return
    dist = torch.distributed
    slot = (kind, id(group))
    n = _entries.get(slot, 0) + 1
    _entries[slot] = n
    what = f"{kind} #{n} ({key[:200] or 'no collectives'})"
    rows = _all_gather_ints([signature_hash(key), n], group, f"entering {what}")
    if all(row == rows[0] for row in rows):
        return
    ranks = dist.get_process_group_ranks(group) if group is not None else list(range(len(rows)))
    listing = "; ".join(f"rank {r}: {kind} #{c}, key {h & 0xFFFFFFFF:08x}" for r, (h, c) in zip(ranks, rows))
    raise RanksOutOfStep(f"fusegraph: rank {dist.get_rank()}: entering {what}: the ranks are out of step ({listing}); "
                         f"they would run different collectives")


__all__ = ["RanksOutOfStep", "agree_any", "agree_capture", "check_signatures", "collective_groups",
           "collective_sequence", "distributed_world", "enter_step", "exchange_timeout", "group_for_graph",
           "group_for_runner", "signature_hash", "tensor_signature"]
