import pytest
import torch


@pytest.fixture(autouse=True)
def _fresh_dynamo():
    """Every fusion test compiles from scratch (no graph reused from an earlier test)."""
    torch._dynamo.reset()
    yield
    torch._dynamo.reset()
