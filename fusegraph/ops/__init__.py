"""Fused operators: documented wrappers over ``torch.ops.fusegraph.*`` plus their fake kernels.

Every op computes in float32 and rounds once to its output dtype; inputs are float32, bfloat16 or
float16 and may be non-contiguous views. float64 inputs are accepted too (for gradcheck): the same math in
float64 with plain torch ops, not the fused kernel. Every op is differentiable in each tensor argument
(a C++ Autograd kernel, formulas in plain torch ops: fusegraph/ops/_autograd.py). Each wrapper's docstring states the exact math.
"""
from .adaln import adaln
from .kv_attention import kv_attention
from .gelu import fast_gelu, gelu_tanh
from .gemv import gemv
from .linear import linear
from .mul_add import mul_add
from .rms_norm import rms_norm
from .rope import rope

__all__ = ["rms_norm", "rope", "adaln", "gelu_tanh", "fast_gelu", "mul_add", "kv_attention", "gemv", "linear"]
