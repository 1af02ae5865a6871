import pytest
import torch

import npu_standin  # tests/graph is on sys.path (pytest rootdir conftest mode)


@pytest.fixture
def npu(monkeypatch):
    """``torch.npu`` replaced by the CPU stand-in of torch_npu's graph surface (tests/graph/npu_standin.py)."""
    mod = npu_standin.make_module()
    monkeypatch.setattr(torch, "npu", mod, raising=False)
    return mod


@pytest.fixture
def unfused_runner(monkeypatch):
    """GraphRunner without fusion before capture (``graph_only``, the process default for the test): the capture
    mechanics are checked bitwise against eager, which fused ops (another rounding) would not match.
    Fusion before capture has its own tests (test_runner_fusion.py)."""
    from fusegraph.config import CompilationConfig

    monkeypatch.setitem(CompilationConfig._defaults, "graph_only", True)
