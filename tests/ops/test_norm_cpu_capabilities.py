"""rms_norm and adaln (both norms, with and without shift) kernels under each CPU capability (DEFAULT, AVX2;
the test machine runs AVX512 by default). ATen reads ATEN_CPU_CAPABILITY once, at first use, so each capability
needs its own process."""
import textwrap

from tests.helpers import run_under_cpu_capabilities

SCRIPT = textwrap.dedent(
    """
    import torch, torch.nn.functional as F
    import fusegraph
    from tests.helpers import assert_close_to_reference, randn

    torch.manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        for D in (1, 13, 3072 + 7, 2 * 4096 + 3):  # the last: chunked row sums (kSumChunk = 4096), a tail
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
                # RMSNorm statistics, and no shift (either norm)
                assert_close_to_reference(fusegraph.ops.adaln(x, scale, shift, norm="rms"),
                                          n64 * (1 + scale.double()) + shift.double())
                assert_close_to_reference(fusegraph.ops.adaln(x, scale, None, norm="rms"), n64 * (1 + scale.double()))
                assert_close_to_reference(fusegraph.ops.adaln(x, scale, None), ln64 * (1 + scale.double()))
    print(fusegraph._C.cpu_capability())
    """
)


def test_norm_kernels_under_each_cpu_capability():
    run_under_cpu_capabilities(SCRIPT)
