"""The pipeline tests' tiers: the fast tier is the default selection (part of ``make test``); the full tier
(marker ``pipelines_full``: every pipeline on every route) is opted into with ``FUSEGRAPH_PIPELINES=full``
(``make test-pipelines``) and deselected otherwise."""
import os

import pytest
import torch


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "pipelines_full: pipeline case of the full tier only (FUSEGRAPH_PIPELINES=full / make test-pipelines)")


def pytest_collection_modifyitems(config, items):
    if os.environ.get("FUSEGRAPH_PIPELINES") == "full":
        return
    keep = [item for item in items if item.get_closest_marker("pipelines_full") is None]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item not in keep])
        items[:] = keep


@pytest.fixture(autouse=True)
def _fresh_dynamo_that_never_falls_back_to_eager():
    """Every test compiles from scratch, and a silent fall back to eager (Dynamo's recompile limit) raises instead
    of making the comparison with eager pass."""
    torch._dynamo.reset()
    with torch._dynamo.config.patch(recompile_limit=32, fail_on_recompile_limit_hit=True):
        yield
    torch._dynamo.reset()
