"""float64 references of the fused ops (SPEC §2), shared by the CPU, CUDA, capability and pattern tests.
No diffusers import here, so capability subprocesses can use them cheaply."""
import torch
import torch.nn.functional as F


def rms_norm_ref(x, weight=None, eps=1e-6, bias=None, style="torch"):
    """float64 RMSNorm, including the diffusers rounding points for a half-precision weight (the normalised
    value and the weighted value are rounded to weight.dtype before the multiply and the bias add)."""
    x64 = x.double()
    n = x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps)
    half_w = style == "diffusers" and weight is not None and weight.dtype in (torch.bfloat16, torch.float16)
    if weight is not None:
        if half_w:
            n = n.to(weight.dtype).double()
        n = n * weight.double()
    if bias is not None:
        if half_w:
            n = n.to(weight.dtype).double()
        n = n + bias.double()
    return n


def rms_norm_tol(weight, style, out_dtype):
    """diffusers style with a half weight: the reference rounds the float64 normalised value where the
    kernel rounds the float32 one, so an intermediate rounding may flip by one ulp: two ulps allowed."""
    if style != "diffusers" or weight is None or weight.dtype == torch.float32 or out_dtype == torch.float32:
        return {}
    return dict(rtol=2 * torch.finfo(out_dtype).eps, atol=1e-5)


def adaln_ref(x, scale, shift, eps=1e-6, weight=None, bias=None, norm="layer"):
    """float64 ``norm(x) [* weight + bias] * (1 + scale) [+ shift]``: norm "layer" is ``layer_norm(x, [D])``,
    "rms" is ``x / sqrt(mean(x^2) + eps)``; shift None: no shift term."""
    w = weight.double() if weight is not None else None
    b = bias.double() if bias is not None else None
    x64 = x.double()
    if norm == "layer":
        n = F.layer_norm(x64, [x.shape[-1]], w, b, eps)
    else:
        assert norm == "rms", norm
        n = x64 / torch.sqrt(x64.square().mean(-1, keepdim=True) + eps)
        n = n * w if w is not None else n
        n = n + b if b is not None else n
    y = n * (1 + scale.double())
    return y + shift.double() if shift is not None else y


def rope_rot(x, interleaved: bool):
    """interleaved: (x0, x1) -> (-x1, x0) per pair; otherwise rotate-half cat(-x2, x1)."""
    if interleaved:
        return torch.stack([-x[..., 1::2], x[..., 0::2]], dim=-1).flatten(-2)
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def rope_ref(x, cos, sin, interleaved: bool, rotary_dim=None):
    """float64 x * cos + rot(x) * sin; with ``rotary_dim`` R on x[..., :R] (rot of that part alone), x[..., R:]
    as it is."""
    x = x.double()
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    xr = x[..., :r]
    return torch.cat([xr * cos.double() + rope_rot(xr, interleaved) * sin.double(), x[..., r:]], dim=-1)


def wan_rope(hidden_states, freqs_cos, freqs_sin):
    """Verbatim the nested apply_rotary_emb of diffusers' WanAttnProcessor (transformer_wan.py): strided
    even/odd writes into empty_like."""
    x1, x2 = hidden_states.unflatten(-1, (-1, 2)).unbind(-1)
    cos = freqs_cos[..., 0::2]
    sin = freqs_sin[..., 1::2]
    out = torch.empty_like(hidden_states)
    out[..., 0::2] = x1 * cos - x2 * sin
    out[..., 1::2] = x1 * sin + x2 * cos
    return out.type_as(hidden_states)


def mul_add_ref(a, b, c):
    """float64 a * b + c (b a tensor or a number)."""
    b64 = b.double() if isinstance(b, torch.Tensor) else b
    return a.double() * b64 + c.double()
