"""rms_norm and adaln kernels under each CPU capability (DEFAULT, AVX2; the test machine runs AVX512 by
default). ATen reads ATEN_CPU_CAPABILITY once, at first use, so each capability needs its own process."""
import os
import subprocess
import sys
import textwrap

import pytest

SCRIPT = textwrap.dedent(
    """
    import sys
    import torch, torch.nn.functional as F
    import fusegraph
    from tests.helpers import assert_close_to_reference, randn

    assert fusegraph._C.cpu_capability() == sys.argv[1], fusegraph._C.cpu_capability()
    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for D in (1, 13, 3072 + 7):
            x = randn(3, 4, D, dtype=dtype, scale=2.0)
            x64 = x.double()
            n64 = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6)
            w = randn(D, dtype=dtype)
            assert_close_to_reference(fusegraph.ops.rms_norm(x, w), n64 * w.double())
            wb, bb = randn(D, dtype=torch.bfloat16), randn(D, dtype=torch.bfloat16)
            ref = (n64.to(torch.bfloat16).double() * wb.double()).to(torch.bfloat16).double() + bb.double()
            out = fusegraph.ops.rms_norm(x, wb, bias=bb, style="diffusers")
            assert_close_to_reference(out, ref, rtol=2 * 2.0**-8, atol=1e-5)
            ln64 = F.layer_norm(x64, [D], eps=1e-6)
            for mod_dtype in (dtype, torch.float32):
                scale, shift = [c[:, None] for c in randn(3, 2 * D, dtype=mod_dtype).chunk(2, dim=1)]
                ref = ln64 * (1 + scale.double()) + shift.double()
                assert_close_to_reference(fusegraph.ops.adaln(x, scale, shift), ref)
    print("ok")
    """
)


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_norm_kernels_under_cpu_capability(capability):
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    r = subprocess.run([sys.executable, "-c", SCRIPT, capability.upper()], env=env, cwd=root,
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr
