"""Shared test helpers: dtypes, reference comparison, non-contiguous views."""
import contextlib

import torch

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Tolerances for comparing against a float64 reference rounded to the output dtype: float32 tight,
# bfloat16 / float16 at torch.testing.assert_close's defaults for that dtype.
FP32_TOL = dict(rtol=1e-5, atol=1e-5)


def assert_close_to_reference(out: torch.Tensor, ref64: torch.Tensor, **kw) -> None:
    """``out`` (any float dtype) against a float64 reference: no NaN anywhere (outputs are poisoned),
    same shape and dtype as the reference cast, values within the dtype's tolerance."""
    assert not torch.isnan(out).any(), "output has NaN: some element was never written"
    expected = ref64.to(out.dtype)
    tol = {**(FP32_TOL if out.dtype == torch.float32 else {}), **kw}  # a copy: FP32_TOL is shared by every test
    torch.testing.assert_close(out, expected, **tol)


@contextlib.contextmanager
def threads(n: int):
    """``torch.set_num_threads(n)`` inside the block: the kernels' split between threads is exercised whatever the
    process was started with (``make test`` runs its workers with OMP_NUM_THREADS=1)."""
    saved = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(saved)


def randn(*shape, dtype=torch.float32, scale=1.0, offset=0.0):
    """Random normal data in float64 first, then cast, so the reference sees exactly the same values."""
    return (torch.randn(*shape, dtype=torch.float64) * scale + offset).to(dtype)


def strided_copy(t: torch.Tensor) -> torch.Tensor:
    """Same values as ``t`` in a non-contiguous layout (every other element of a 2x-wide buffer)."""
    buf = torch.empty(*t.shape[:-1], t.shape[-1] * 2, dtype=t.dtype)
    view = buf[..., ::2]
    view.copy_(t)
    assert not view.is_contiguous() or t.numel() <= 1
    return view


# What tests/conftest.py's autouse fixture does, for a script run in its own process: every op output NaN-filled
# before its kernel writes it (an element the kernel forgets fails the comparison), and a seeded RNG.
SUBPROCESS_PROLOGUE = "import torch, fusegraph\nfusegraph._C._set_poison_outputs(True)\ntorch.manual_seed({seed})\n"


def run_under_cpu_capabilities(script: str, capabilities=("default", "avx2"), timeout: float = 300) -> None:
    """Runs ``script`` (Python source) once per ATen CPU capability, each in a fresh process (ATen reads
    ATEN_CPU_CAPABILITY once, at first use), in parallel, after ``SUBPROCESS_PROLOGUE``: op outputs poisoned and
    the RNG seeded, as tests/conftest.py does in-process. Each run must exit 0 and print the capability its
    kernels ran at (``fusegraph._C.cpu_capability()``) as its last line."""
    import os
    import subprocess
    import sys
    import zlib

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    source = SUBPROCESS_PROLOGUE.format(seed=zlib.crc32(script.encode())) + script
    runs = {
        cap: subprocess.Popen([sys.executable, "-c", source], env=dict(os.environ, ATEN_CPU_CAPABILITY=cap),
                              cwd=root, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for cap in capabilities
    }
    for cap, proc in runs.items():
        stdout, stderr = proc.communicate(timeout=timeout)
        assert proc.returncode == 0, f"{cap}: {stderr}"
        assert stdout.split()[-1] == cap.upper(), f"{cap}: ran at {stdout.split()[-1:]}"


def assert_error_names(op, args, message: str, *, fake: bool, exc=RuntimeError) -> None:
    """``op(*args)`` raises ``exc`` (SPEC §2: a RuntimeError for a bad shape or dtype) matching ``message``: the real
    kernel's checks, or with ``fake`` the fake kernel's (the same arguments as FakeTensors: the checks a compile
    runs)."""
    import pytest

    if fake:
        from torch._subclasses.fake_tensor import FakeTensorMode

        with FakeTensorMode() as mode:
            args = tuple(mode.from_tensor(t) for t in args)
            with pytest.raises(exc, match=message):
                op(*args)
    else:
        with pytest.raises(exc, match=message):
            op(*args)
