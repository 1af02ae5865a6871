"""The shared test helpers themselves: a tolerance passed to one comparison stays in that comparison, and a
capability subprocess catches an output element its kernel never wrote."""
import pytest
import torch

import fusegraph
from tests import helpers
from tests.helpers import assert_close_to_reference, run_under_cpu_capabilities


def test_tolerance_arguments_leave_fp32_tol_unchanged():
    ref = torch.ones(8, dtype=torch.float64)
    assert_close_to_reference(ref.float() * (1 + 1e-3), ref, rtol=1e-2, atol=1e-2)
    assert helpers.FP32_TOL == dict(rtol=1e-5, atol=1e-5)
    with pytest.raises(AssertionError):  # the next fp32 comparison is as tight as before
        assert_close_to_reference(ref.float() * (1 + 1e-3), ref)


# A kernel stand-in that forgets one element: its output comes from the ops' own allocation (fusegraph::new_output),
# and every element but the first is written.
UNWRITTEN_ELEMENT_SCRIPT = r"""
import torch, fusegraph
from tests.helpers import assert_close_to_reference

ref = torch.randn(3, 17, dtype=torch.float64)
out = fusegraph._C._new_output_like(ref.float())
out.view(-1)[1:].copy_(ref.view(-1)[1:])
assert_close_to_reference(out, ref)
print(fusegraph._C.cpu_capability())
"""


def test_capability_subprocesses_catch_an_unwritten_element():
    """The subprocesses poison op outputs as tests/conftest.py does in-process: the unwritten element is NaN."""
    with pytest.raises(AssertionError, match="some element was never written"):
        run_under_cpu_capabilities(UNWRITTEN_ELEMENT_SCRIPT)


def test_the_stand_in_buffer_is_an_op_output_poisoned_in_process():
    """The stand-in's buffer is what the ops allocate: all NaN under tests/conftest.py's poison mode."""
    out = fusegraph._C._new_output_like(torch.ones(2, 3, dtype=torch.bfloat16))
    assert out.shape == (2, 3) and out.dtype == torch.bfloat16 and torch.isnan(out).all()
