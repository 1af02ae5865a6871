import zlib

import pytest
import torch

import fusegraph


@pytest.fixture(autouse=True)
def _poisoned_outputs_and_seed(request):
    """Every test: op outputs are NaN-filled before kernels write them, and the RNG is seeded from the
    test's name (fresh, non-zero random data that is still reproducible)."""
    torch.manual_seed(zlib.crc32(request.node.nodeid.encode()))
    fusegraph._C._set_poison_outputs(True)
    yield
    fusegraph._C._set_poison_outputs(False)


@pytest.fixture(autouse=True, scope="session")
def _own_graph_choice_cache(tmp_path_factory):
    """The measured graph choices (fusion_choice="auto") of this test run start empty and stay in it: a verdict
    cached by an earlier run or by a benchmark on this machine does not decide which compile a test runs."""
    from fusegraph.fusion import measured

    path = str(tmp_path_factory.mktemp("fusegraph_choice") / "graphs.json")
    saved = measured.cache_path
    measured.cache_path = lambda: path
    measured.forget()
    yield
    measured.cache_path = saved
    measured.forget()
