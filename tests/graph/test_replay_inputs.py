"""What a replay does to its inputs (SPEC §4, host graph): an input of other strides than the capture's is bound as a
re-laid-out copy and what the graph writes into it comes back; inputs sharing storage are a signature of their own
and see each other's writes as eagerly; the cache's bookkeeping methods never wait for the mutex with the GIL held."""
import subprocess
import sys
import textwrap

import pytest
import torch
import torch.nn.functional as F

from fusegraph.graph import GraphRunner, build_host_graph, trace_aten


def add_one_twice(x):
    x.add_(1)
    return x * 2


@pytest.mark.usefixtures("unfused_runner")
@pytest.mark.parametrize("inference", [False, True])
def test_write_to_an_input_of_other_strides_reaches_the_caller(inference):
    r = GraphRunner(add_one_twice)
    mode = torch.inference_mode() if inference else torch.no_grad()
    with mode:
        first = torch.zeros(4, 4)
        r(first)  # captured on a contiguous tensor
        for make in (lambda: torch.arange(16.).view(4, 4).t(),          # transposed
                     lambda: torch.arange(32.).view(4, 8)[:, ::2]):    # a strided view
            x, expected = make(), make()
            out = r(x)
            want = add_one_twice(expected)
            assert torch.equal(x, expected), "the graph's write to the input was lost"
            assert torch.equal(out, want)
    assert r.num_entries == 1 and r.stats.inputs_copied == 2  # replayed on a re-laid-out copy, not recaptured


@pytest.mark.usefixtures("unfused_runner")
def test_read_only_graph_writes_nothing_back():
    r = GraphRunner(lambda x: x * 2)
    with torch.no_grad():
        r(torch.zeros(4, 4))
        x = torch.arange(16.).view(4, 4).t()
        version = x._version
        assert torch.equal(r(x), x * 2)
    assert x._version == version  # no copy back into the caller's tensor


def scale_then_gelu(a, b):
    a.mul_(2)
    return F.gelu(b, approximate="tanh")  # a fusable site: the runner captures the fused (functionalized) trace


def scale_then_add(a, b):
    a.mul_(2)
    return b + 1


@pytest.mark.parametrize("first", ["distinct", "aliased"])
def test_one_tensor_for_two_arguments_sees_its_own_write(first):
    r = GraphRunner(scale_then_gelu)
    with torch.no_grad():
        if first == "distinct":
            r(torch.ones(8, 64), torch.ones(8, 64))
        for _ in range(2):
            x, xe = torch.ones(8, 64), torch.ones(8, 64)
            out, want = r(x, x), scale_then_gelu(xe, xe)
            torch.testing.assert_close(out, want)
            assert torch.equal(x, xe)
        # other tensors again, distinct: the fused graph
        a, b, ae, be = torch.ones(8, 64), torch.full((8, 64), 3.), torch.ones(8, 64), torch.full((8, 64), 3.)
        torch.testing.assert_close(r(a, b), scale_then_gelu(ae, be))
        assert torch.equal(a, ae)
    assert sum(r.stats.patterns.values()) >= 1  # fusion kept
    assert r.num_entries == 2  # shared and distinct inputs are two signatures


@pytest.mark.usefixtures("unfused_runner")
def test_views_of_one_tensor_with_other_strides_keep_their_sharing():
    r = GraphRunner(scale_then_add)
    with torch.no_grad():
        r(torch.ones(4, 4), torch.ones(4, 4))  # captured on two contiguous tensors
        x = torch.arange(16.).view(4, 4)
        xe = x.clone()
        out, want = r(x, x.t()), scale_then_add(xe, xe.t())
        assert torch.equal(out, want) and torch.equal(x, xe)
        # the same sharing again: replayed, binding both as they are
        x = torch.arange(16.).view(4, 4)
        xe = x.clone()
        out, want = r(x, x.t()), scale_then_add(xe, xe.t())
        assert torch.equal(out, want) and torch.equal(x, xe)
    assert r.num_entries == 2 and r.stats.replays == 3


def test_signature_names_the_shared_storage():
    from fusegraph import _C

    x = torch.zeros(4, 4)
    text = _C.graph.GraphCache.describe_signature([x, x.t()])
    assert "strides=[1, 4], storage of argument 0" in text, text
    assert "storage" not in _C.graph.GraphCache.describe_signature([x, torch.zeros(4, 4)])


def test_host_graph_knows_the_inputs_it_writes():
    def f(a, b, c):
        a[0].add_(1)  # through a view
        return [b * 2 + c]

    gm = trace_aten(f, [torch.zeros(2, 3), torch.zeros(3), torch.zeros(3)])
    assert list(build_host_graph(gm).written_inputs) == [0]


DEADLOCK_SCRIPT = textwrap.dedent("""
    import threading, time, torch
    from fusegraph.graph import GraphRunner

    @torch.library.custom_op("test_replay_inputs::twice", mutates_args=())
    def twice(x: torch.Tensor) -> torch.Tensor:
        return x * 2   # a Python kernel: the replay takes the GIL inside the cache's mutex

    @twice.register_fake
    def _(x):
        return torch.empty_like(x)

    r = GraphRunner(lambda x: twice(x) + 1)
    x = torch.randn(64)
    with torch.no_grad():
        r(x)
    assert r.num_entries == 1 and not r.stats.fallbacks, r.stats.fallbacks
    stop, counts = False, {"calls": 0, "polls": 0}

    def caller():
        with torch.no_grad():
            while not stop:
                r(x)
                counts["calls"] += 1

    def poller():
        while not stop:
            r.num_entries, r.entry_ids(), r._cache.memory_bytes, len(r._cache)
            counts["polls"] += 1

    threads = [threading.Thread(target=caller, daemon=True), threading.Thread(target=poller, daemon=True)]
    for t in threads:
        t.start()
    time.sleep(2)
    stop = True
    for t in threads:
        t.join(10)
    assert not any(t.is_alive() for t in threads), "a thread is stuck"
    print("ok", counts)
""")


def test_polling_a_runner_while_it_replays_does_not_deadlock():
    try:
        proc = subprocess.run([sys.executable, "-c", DEADLOCK_SCRIPT], capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: num_entries/entry_ids/memory_bytes waited for the cache's mutex with the GIL held "
                    "while a replay held the mutex and waited for the GIL")
    assert proc.returncode == 0 and "ok" in proc.stdout, proc.stdout[-2000:] + proc.stderr[-2000:]


class KVBlock(torch.nn.Module):
    """Writes its buffer in place (a KV cache), around a fusable site."""

    def __init__(self):
        super().__init__()
        self.register_buffer("cache", torch.zeros(8, 4))
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x, pos):
        self.cache.index_copy_(0, pos, F.gelu(self.lin(x), approximate="tanh"))
        return self.cache.sum(0)


def test_module_writing_its_buffer_keeps_fusion():
    torch.manual_seed(0)
    block, eager = KVBlock(), KVBlock()
    eager.load_state_dict(block.state_dict())
    r = GraphRunner(block)
    with torch.no_grad():
        for step in range(3):
            x, pos = torch.randn(1, 4), torch.tensor([step])
            torch.testing.assert_close(r(x, pos), eager(x, pos))
            torch.testing.assert_close(block.cache, eager.cache)  # written once per call, as eagerly
    assert not r.stats.fallbacks, r.stats.fallbacks
    assert r.stats.patterns["gelu"] >= 1


class SliceKV(torch.nn.Module):
    """The usual KV-cache step: write a slice of the buffer, then read the buffer (make_fx gives the write and the
    read get_attr nodes of their own)."""

    def __init__(self):
        super().__init__()
        self.register_buffer("k", torch.zeros(1, 16, 8))
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, pos: int):
        self.k[:, pos:pos + 1] = self.lin(x)
        return F.gelu(self.k[:, :pos + 1].sum(1), approximate="tanh")


def test_module_writing_a_slice_of_its_buffer_then_reading_it_keeps_fusion():
    """Every get_attr of the written buffer becomes the one lifted input: the fused graph reads what the write left
    (it read the buffer before the write when only the written node was lifted)."""
    torch.manual_seed(0)
    block, eager = SliceKV(), SliceKV()
    eager.load_state_dict(block.state_dict())
    r = GraphRunner(block)
    with torch.no_grad():
        for step in range(3):
            x = torch.randn(1, 1, 8)
            torch.testing.assert_close(r(x, step), eager(x, step), rtol=1e-6, atol=1e-6)
            torch.testing.assert_close(block.k, eager.k)
    assert not r.stats.fallbacks, r.stats.fallbacks
    assert r.stats.patterns["gelu"] >= 1


def write_then_read(a, b):
    a.add_(1)
    return b * 2


def test_overlapping_column_slices_of_one_buffer_share_their_write():
    """Column slices of one buffer (a layout ATen's quick overlap check cannot classify) are keyed as sharing
    storage and bound as they are: the write through one is read through the other, on the capture and on replays,
    and nothing is re-laid out."""
    r = GraphRunner(write_then_read)
    with torch.no_grad():
        for _ in range(3):
            buf, ref = torch.zeros(2, 8), torch.zeros(2, 8)
            got = r(buf[:, :4], buf[:, 2:6])
            want = write_then_read(ref[:, :4], ref[:, 2:6])
            torch.testing.assert_close(got, want, rtol=0, atol=0)
            torch.testing.assert_close(buf, ref, rtol=0, atol=0)
    assert r.num_entries == 1


def test_an_expanded_view_sharing_memory_with_another_input_runs_uncaptured():
    """An expanded view of an input the graph writes: a capture would take it on a dense copy and cut the sharing,
    so the call runs eagerly, saying why."""
    r = GraphRunner(write_then_read)
    with torch.no_grad():
        for _ in range(2):
            a, ref = torch.zeros(1, 4), torch.zeros(1, 4)
            got = r(a, a.expand(3, 4))
            torch.testing.assert_close(got, write_then_read(ref, ref.expand(3, 4)), rtol=0, atol=0)
            torch.testing.assert_close(a, ref, rtol=0, atol=0)
    assert r.num_entries == 0
    assert any("overlaps itself" in f for f in r.stats.fallbacks), r.stats.fallbacks
