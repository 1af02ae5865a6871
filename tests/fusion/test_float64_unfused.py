"""float64 sites stay unfused. The fused ops accept float64 now (their float64 path runs plain torch ops, for
gradcheck), but fusion exists for the float32/bf16/fp16 kernels: each family's extra check accepts only those
dtypes, so a float64 model compiles to the graph it traced. The same block in float32 fuses every family (the
control that the forms are the fusable ones)."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.models.embeddings import apply_rotary_emb

from tests.fusion.pattern_checks import compile_and_run, fused

FAMILIES = ("rms_norm", "rope", "adaln", "adaln_rms", "adaln_noshift", "gelu", "mul_add")


class Block(nn.Module):
    """One site of every family, in the source forms the patterns fuse."""

    def __init__(self, D=32):
        super().__init__()
        self.norm_q = nn.RMSNorm(D // 2, eps=1e-6)
        self.norm1 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        self.norm2 = nn.RMSNorm(D, eps=1e-6, elementwise_affine=False)
        self.norm3 = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)
        with torch.no_grad():
            self.norm_q.weight.copy_(torch.randn(D // 2) * 0.5 + 1.0)

    def forward(self, x, emb, cos, sin):
        shift, scale, gate, scale2 = emb.chunk(4, dim=1)
        h = self.norm1(x) * (1 + scale[:, None]) + shift[:, None]                        # adaln
        h = self.norm2(h) * (1 + scale2[:, None]) + shift[:, None]                       # rms_norm, then adaln_rms
        h = self.norm3(h) * (1 + scale2[:, None])                                        # adaln_noshift
        q = self.norm_q(h.unflatten(-1, (2, -1)))                                        # rms_norm, [B, S, H, Dh]
        q = apply_rotary_emb(q, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=1)  # rope
        h = F.gelu(q.flatten(-2), approximate="tanh")                                   # gelu
        return x + gate[:, None] * h                                                    # mul_add


def inputs(dtype, B=2, S=5, D=32):
    cos, sin = (torch.randn(S, D // 4, dtype=dtype).repeat_interleave(2, -1) for _ in range(2))
    return [torch.randn(B, S, D, dtype=dtype), torch.randn(B, 4 * D, dtype=dtype) * 0.5, cos, sin]


def test_float32_control_fuses_every_family():
    b, out, eager = compile_and_run(Block(), *inputs(torch.float32), inductor=False)
    # the RMSNorm before the rms modulation is fused by rms_norm first, then taken into the adaln_rms op
    assert {f: b.stats.patterns[f] for f in FAMILIES} == {f: 2 if f == "rms_norm" else 1 for f in FAMILIES}
    assert fused(b, "adaln") == 3 and fused(b, "rms_norm") == 1
    torch.testing.assert_close(out, eager)


@pytest.mark.parametrize("inductor", [False, True])
def test_float64_model_is_left_unfused(inductor):
    m = Block().double()
    b, out, eager = compile_and_run(m, *inputs(torch.float64), inductor=inductor)
    assert {f: b.stats.patterns[f] for f in FAMILIES} == {f: 0 for f in FAMILIES}
    assert b.all_ops["aten.rsqrt.default"] >= 2  # the passes saw the graph (norms still decomposed)
    assert not [op for op in b.all_ops if op.startswith("fusegraph.")]
    assert out.dtype == torch.float64
    torch.testing.assert_close(out, eager, rtol=1e-12, atol=1e-12)
