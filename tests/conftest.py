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


# The suite's tiers: a test marked ``full`` runs only with FUSEGRAPH_TESTS=full (``make test-full``); ``make test``
# (CI) deselects it. For cases that repeat what a faster case checks on another model or route, and the slowest
# whole-system runs (the soak, context parallel on four routes, the busy machine) that no change to one module needs
# (the zoo and the pipelines have tiers of their own: FUSEGRAPH_ZOO, FUSEGRAPH_PIPELINES).
def pytest_configure(config):
    config.addinivalue_line("markers", "full: a case of the full tier only (FUSEGRAPH_TESTS=full / make test-full)")


def pytest_collection_modifyitems(config, items):
    import os

    if os.environ.get("FUSEGRAPH_TESTS") == "full":
        return
    keep = [item for item in items if item.get_closest_marker("full") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep
