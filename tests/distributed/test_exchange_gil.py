"""The guard against gloo's GIL deadlock (docs/DESIGN.md "Ranks in step"): every exchange runs with the Python
dispatcher off, so the ``ProcessGroup`` call releases the GIL before it takes gloo's queue lock, and keeps its work
referenced from Python, so gloo's worker thread never destroys it (a destruction there needs the GIL under that
lock). The deadlock itself needs two ranks and a race (about one run in ten of the busy-core verify case in
test_multiprocess.py); this checks the two conditions that rule it out, in one process with a 1-rank gloo group."""
import torch
import torch.distributed as dist
from torch._dispatch.python import enable_python_dispatcher

from fusegraph._core import ranks


def _python_dispatcher_on() -> bool:
    return torch._C._dispatch_tls_local_include_set().has(torch._C.DispatchKey.PythonDispatcher)


def test_exchanges_run_without_the_python_dispatcher_and_keep_their_work(tmp_path, monkeypatch):
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        group = dist.group.WORLD
        seen = []
        issue = dist.all_reduce

        def spy(*args, **kwargs):
            seen.append(_python_dispatcher_on())
            return issue(*args, **kwargs)

        monkeypatch.setattr(dist, "all_reduce", spy)
        with enable_python_dispatcher():  # as inside Inductor's compile, where verify exchanges
            assert _python_dispatcher_on()
            assert ranks.agree_any(group, [True, False], "test") == [True, False]
            work = ranks._held[0]
            ranks.check_call(group, "signature", "test")
            assert _python_dispatcher_on()  # restored after each exchange
        assert seen == [False, False]  # both exchanges were issued without it
        assert isinstance(work, dist.Work) and ranks._held[0] is not work  # each exchange keeps its own work
        assert isinstance(ranks._held[0], dist.Work)
        rows = ranks._all_gather_ints([3, 4], group, "test")
        assert rows == [[3, 4]] and isinstance(ranks._held[0], dist.Work)
    finally:
        ranks._held.clear()
        dist.destroy_process_group()
