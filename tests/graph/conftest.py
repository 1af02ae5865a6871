import pytest
import torch

import npu_standin  # tests/graph is on sys.path (pytest rootdir conftest mode)


@pytest.fixture
def npu(monkeypatch):
    """``torch.npu`` replaced by the CPU stand-in of torch_npu's graph surface (tests/graph/npu_standin.py)."""
    mod = npu_standin.make_module()
    monkeypatch.setattr(torch, "npu", mod, raising=False)
    return mod
