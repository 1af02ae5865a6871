"""The zoo's tiers: the fast tier is the default selection (part of ``make test``); the full tier (marker
``zoo_full``) is opted into with ``FUSEGRAPH_ZOO=full`` (``make test-zoo``) and deselected otherwise."""
import os

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line("markers", "zoo_full: zoo case of the full tier only (FUSEGRAPH_ZOO=full / make test-zoo)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("FUSEGRAPH_ZOO") == "full":
        return
    keep = [item for item in items if item.get_closest_marker("zoo_full") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every zoo test compiles from scratch (no graph reused from an earlier test)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
