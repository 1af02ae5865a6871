"""tanh-GELU family: ``F.gelu(x, approximate="tanh")`` / ``nn.GELU(approximate="tanh")`` -> one fused kernel.

After Inductor's decompositions the op is a chain of ~10 pointwise aten ops
(``0.5*x*(1+tanh(sqrt(2/pi)*(x+0.044715*x^3)))``); for bf16/fp16 inputs the chain is wrapped in
``convert_element_type`` to float32 and back, which is also exactly what ``gelu(x.float()).to(bf16)`` traces to.
The constants are GELU's own (not user scalars), so they stay in the pattern.

``opts.gelu_approximation``: "tanh" -> ``fusegraph.gelu_tanh`` (exact); "sigmoid" -> ``fusegraph.fast_gelu``.
``gelu(approximate="none")`` (erf) traces to a different chain and is never matched.
"""
import torch
import torch.nn.functional as F
from ..._core.torch_pattern_matcher import fwd_only, register_replacement

# Reduced-precision patterns first: their root (the cast back) comes after the float32 chain they contain.
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _search(x):
    return F.gelu(x, approximate="tanh")


def _replace_tanh(x):
    return torch.ops.fusegraph.gelu_tanh(x)


def _replace_sigmoid(x):
    return torch.ops.fusegraph.fast_gelu(x)


def _input_dtype_is(dtype):
    """The cast-wrapped patterns say nothing about x's own dtype: the kernel's output dtype is x's, so it must be
    the dtype the pattern casts back to."""

    def check(match) -> bool:
        val = match.kwargs["x"].meta.get("val") if hasattr(match.kwargs["x"], "meta") else None
        return val is not None and val.dtype == dtype

    return check


def register(pm, opts) -> None:
    replace = _replace_sigmoid if opts.gelu_approximation == "sigmoid" else _replace_tanh
    for dtype in _DTYPES:
        x = torch.empty(8, 16, dtype=dtype)
        register_replacement(_search, replace, [x], fwd_only, pm, extra_check=_input_dtype_is(dtype),
                             skip_duplicates=True)
