"""Gradients of the fused ops (torch.library.register_autograd): gradcheck in float64 for every op and every
differentiable argument, eager's gradients in float32 (eager autograd of the reference formula, default
tolerances) and in bf16/fp16 (the reference formula's float64 gradient rounded to the argument's dtype, default
tolerances: eager's own bf16 backward rounds intermediates and is no reference), dtypes and shapes of the
gradients (broadcast arguments summed back), and a training step through torch.compile's aot_autograd."""
import pytest
import torch
import torch.nn.functional as F

import fusegraph
from tests.helpers import randn, strided_copy
from tests.references import rms_norm_ref, rope_ref, rope_rot

HALF = (torch.bfloat16, torch.float16)


def f64(*shape, **kw):
    return randn(*shape, dtype=torch.float64, **kw).requires_grad_(True)


def gradcheck(fn, inputs):
    """gradcheck over every subset of the tensor inputs requiring grad: all together, then each one alone
    (so a formula that mixes up which input it differentiates shows, and unused grads may be None)."""
    tensors = [i for i, t in enumerate(inputs) if isinstance(t, torch.Tensor)]
    assert torch.autograd.gradcheck(fn, inputs)
    if len(tensors) > 1:
        for k in tensors:
            alone = [t.detach().requires_grad_(i == k) if i in tensors else t for i, t in enumerate(inputs)]
            assert torch.autograd.gradcheck(fn, alone)


# ---- gradcheck in float64 ---------------------------------------------------------------------------------

@pytest.mark.parametrize("style", ["torch", "diffusers"])
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "weight+bias"])
def test_rms_norm_gradcheck(style, affine):
    D = 9
    x = f64(2, 3, D, scale=1.5, offset=0.3)
    w = f64(D, offset=1.0) if "weight" in affine else None
    b = f64(D) if "bias" in affine else None
    gradcheck(lambda x, w, b: fusegraph.ops.rms_norm(x, w, 1e-5, bias=b, style=style), [x, w, b])


def test_rms_norm_gradcheck_strided_x():
    x = strided_copy(randn(4, 7, dtype=torch.float64)).requires_grad_(True)
    gradcheck(lambda x, w: fusegraph.ops.rms_norm(x, w), [x, f64(7)])


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("table", ["S_D", "1_S_1_D", "B_S_1_D", "1_1_S_D"])
def test_rope_gradcheck(interleaved, table):
    B, S, H, D = 2, 3, 2, 6
    if table == "1_1_S_D":  # x [B, H, S, D]
        x, shape = f64(B, H, S, D), (1, 1, S, D)
    else:
        x = f64(B, S, H, D) if table != "S_D" else f64(B, H, S, D)
        shape = {"S_D": (S, D), "1_S_1_D": (1, S, 1, D), "B_S_1_D": (B, S, 1, D)}[table]
    cos, sin = f64(*shape), f64(*shape)
    gradcheck(lambda x, c, s: fusegraph.ops.rope(x, c, s, interleaved=interleaved), [x, cos, sin])


@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("table", ["S_R", "1_S_1_R", "B_S_1_R"])
@pytest.mark.parametrize("d", [10, 9])
def test_rope_rotary_dim_gradcheck(interleaved, table, d):
    """Partial rotary: x [.., D] (D odd too), tables R = 4 wide; the pass-through channels' grad is g."""
    B, S, H, R = 2, 3, 2, 4
    x = f64(B, H, S, d) if table == "S_R" else f64(B, S, H, d)
    shape = {"S_R": (S, R), "1_S_1_R": (1, S, 1, R), "B_S_1_R": (B, S, 1, R)}[table]
    cos, sin = f64(*shape), f64(*shape)
    gradcheck(lambda x, c, s: fusegraph.ops.rope(x, c, s, interleaved=interleaved, rotary_dim=R), [x, cos, sin])


@pytest.mark.parametrize("form", ["B_1_D", "B_S_D", "D", "1_1_D"])
@pytest.mark.parametrize("affine", ["none", "weight", "bias", "weight+bias"])
def test_adaln_gradcheck(form, affine):
    B, S, D = 2, 3, 5
    x = f64(B, S, D, scale=2.0, offset=0.5)
    shape = {"B_1_D": (B, 1, D), "B_S_D": (B, S, D), "D": (D,), "1_1_D": (1, 1, D)}[form]
    scale, shift = f64(*shape, scale=0.5), f64(*shape)
    w = f64(D, offset=1.0) if "weight" in affine else None
    b = f64(D) if "bias" in affine else None
    gradcheck(lambda x, sc, sh, w, b: fusegraph.ops.adaln(x, sc, sh, 1e-5, weight=w, bias=b),
              [x, scale, shift, w, b])


def test_adaln_gradcheck_through_chunk_views():
    """The usual model form: scale/shift are [B, 1, D] views of one embedding; its grad gathers both."""
    B, S, D = 2, 3, 4
    x, emb = f64(B, S, D), f64(B, 6 * D, scale=0.5)

    def fn(x, emb):
        shift, scale = emb.chunk(6, dim=1)[:2]
        return fusegraph.ops.adaln(x, scale[:, None], shift[:, None])

    gradcheck(fn, [x, emb])


@pytest.mark.parametrize("form", ["B_1_D", "B_S_D", "D"])
@pytest.mark.parametrize("affine", ["none", "weight+bias"])
@pytest.mark.parametrize("norm,has_shift", [("rms", True), ("rms", False), ("layer", False)])
def test_adaln_rms_and_no_shift_gradcheck(form, affine, norm, has_shift):
    B, S, D = 2, 3, 5
    x = f64(B, S, D, scale=2.0, offset=0.5)
    shape = {"B_1_D": (B, 1, D), "B_S_D": (B, S, D), "D": (D,)}[form]
    scale = f64(*shape, scale=0.5)
    shift = f64(*shape) if has_shift else None
    w = f64(D, offset=1.0) if "weight" in affine else None
    b = f64(D) if "bias" in affine else None
    gradcheck(lambda x, sc, sh, w, b: fusegraph.ops.adaln(x, sc, sh, 1e-5, weight=w, bias=b, norm=norm),
              [x, scale, shift, w, b])


def test_adaln_no_shift_gradcheck_through_chunk_views():
    """LuminaRMSNormZero: scale is a [B, 1, D] view of a [B, 4D] embedding, no shift."""
    B, S, D = 2, 3, 4
    x, emb = f64(B, S, D), f64(B, 4 * D, scale=0.5)

    def fn(x, emb):
        return fusegraph.ops.adaln(x, emb.chunk(4, dim=1)[0][:, None], None, norm="rms")

    gradcheck(fn, [x, emb])


@pytest.mark.parametrize("name", ["gelu_tanh", "fast_gelu"])
def test_gelu_gradcheck(name):
    gradcheck(getattr(fusegraph.ops, name), [f64(3, 11, scale=2.0)])


@pytest.mark.parametrize("shapes", [
    ((2, 3, 4), (2, 1, 4), (2, 3, 4)),   # gated residual, [B, 1, D] gate
    ((2, 3, 4), (2, 3, 1), (2, 3, 4)),   # per-token gate
    ((3, 4), (4,), (2, 1, 4)),           # every argument broadcast
    ((2, 3), (), (2, 3)),                # zero-dim b
    ((1, 3), (2, 1), ()),                # zero-dim c, output bigger than every argument
])
def test_mul_add_gradcheck(shapes):
    a, b, c = (randn(torch.Size(s).numel(), dtype=torch.float64).reshape(s).requires_grad_(True) for s in shapes)
    gradcheck(fusegraph.ops.mul_add, [a, b, c])


@pytest.mark.parametrize("b", [0.7, -3, 0.0])
def test_mul_add_scalar_gradcheck(b):
    gradcheck(lambda a, c: fusegraph.ops.mul_add(a, b, c), [f64(2, 5), f64(1, 5)])


# ---- against eager (fp32) and the float64 gradient of the reference formula (bf16 / fp16) -----------------

def _grads(fn, inputs, g):
    """d(fn(*inputs) . g) / d(each tensor input), the inputs copied as leaves; also the output."""
    leaves = [t.detach().clone().requires_grad_(True) if isinstance(t, torch.Tensor) else t for t in inputs]
    out = fn(*leaves)
    tensors = [t for t in leaves if isinstance(t, torch.Tensor)]
    return out, torch.autograd.grad(out, tensors, g.to(out.dtype))


def assert_eager_gradients(fused_fn, ref_fn, inputs):
    """Fused gradients: each in its input's dtype and shape; fp32 inputs against eager autograd of ``ref_fn``
    in fp32 and in float64; half inputs against ``ref_fn``'s float64 gradient rounded to their dtype."""
    with torch.no_grad():
        out = fused_fn(*inputs)
    g = randn(*out.shape).to(out.dtype)
    _, fused = _grads(fused_fn, inputs, g)
    _, exact = _grads(ref_fn, [t.double() if isinstance(t, torch.Tensor) else t for t in inputs], g.double())
    tensors = [t for t in inputs if isinstance(t, torch.Tensor)]
    for t, gf, g64 in zip(tensors, fused, exact):
        assert gf.dtype == t.dtype and gf.shape == t.shape
        assert not torch.isnan(gf).any()
        if t.dtype == torch.float32:
            torch.testing.assert_close(gf, g64.float(), rtol=1e-5, atol=1e-5)
        else:
            torch.testing.assert_close(gf, g64.to(t.dtype))
    if all(t.dtype == torch.float32 for t in tensors):
        _, eager = _grads(ref_fn, inputs, g)
        for gf, ge in zip(fused, eager):
            torch.testing.assert_close(gf, ge)


def diffusers_rms_norm_ref(x, w, eps, b, half):
    """diffusers RMSNorm with a weight of dtype ``half``: the normalised value is computed in float32 (as
    diffusers and the kernel do) and rounded to ``half``, and so is the product; the roundings pass gradients
    straight through (as eager's casts do); the rest runs in the inputs' dtype (float64: the exact gradient)."""
    n = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    x32 = x.detach().float()
    n32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)
    n = n + (n32.to(half).to(n.dtype) - n).detach()
    y = n * w
    y = y + (y.to(half).to(y.dtype) - y).detach()
    return y + b


DT = [torch.float32, torch.bfloat16, torch.float16]


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("style", ["torch", "diffusers"])
@pytest.mark.parametrize("affine", ["none", "weight", "weight+bias"])
def test_rms_norm_gradients_match_eager(dtype, style, affine):
    D = 131
    x = randn(3, 17, D, dtype=dtype, scale=2.0)
    w = randn(D, dtype=dtype, offset=1.0) if affine != "none" else None
    b = randn(D, dtype=dtype) if affine == "weight+bias" else None
    if style == "diffusers" and w is not None and dtype in HALF:
        ref = lambda x, w, b: diffusers_rms_norm_ref(x, w, 1e-6, b if b is not None else torch.zeros((), dtype=x.dtype),
                                                     dtype)
    elif dtype == torch.float32 and style == "torch":
        ref = lambda x, w, b: torch.rms_norm(x, [D], w, 1e-6) + (b if b is not None else 0)
    else:
        ref = lambda x, w, b: rms_norm_ref(x, w, 1e-6, b, style=style).to(
            x.dtype if x.dtype == torch.float64 else torch.float32)
    fused = lambda x, w, b: fusegraph.ops.rms_norm(x, w, 1e-6, bias=b, style=style)
    assert_eager_gradients(fused, ref, [x, w, b])


@pytest.mark.parametrize("dtype", DT)
def test_rms_norm_gradients_mixed_dtypes(dtype):
    """bf16/fp16 x with an fp32 weight (diffusers: fp32 result): each grad in its own input's dtype."""
    D = 64
    x, w, b = randn(4, D, dtype=dtype), randn(D, offset=1.0), randn(D)
    fused = lambda x, w, b: fusegraph.ops.rms_norm(x, w, 1e-6, bias=b, style="diffusers")
    assert_eager_gradients(fused, lambda x, w, b: rms_norm_ref(x, w, 1e-6, b, style="diffusers"), [x, w, b])


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("interleaved", [True, False])
@pytest.mark.parametrize("table_dtype", ["float32", "x"])
def test_rope_gradients_match_eager(dtype, interleaved, table_dtype):
    B, S, H, D = 2, 9, 3, 32
    x = randn(B, S, H, D, dtype=dtype)
    tdt = torch.float32 if table_dtype == "float32" else dtype
    cos, sin = randn(1, S, 1, D, dtype=tdt), randn(1, S, 1, D, dtype=tdt)
    fused = lambda x, c, s: fusegraph.ops.rope(x, c, s, interleaved=interleaved)
    # the reference formula as the docstring states it (x.float() * cos + rot(x).float() * sin).to(x.dtype)
    ref = lambda x, c, s: rope_ref(x, c, s, interleaved) if x.dtype == torch.float64 else \
        (x.float() * c + rope_rot(x, interleaved).float() * s).to(x.dtype)
    assert_eager_gradients(fused, ref, [x, cos, sin])


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("interleaved", [True, False])
def test_rope_rotary_dim_gradients_match_eager(dtype, interleaved):
    B, S, H, D, R = 2, 9, 3, 40, 24
    x = randn(B, S, H, D, dtype=dtype)
    cos, sin = randn(1, S, 1, R), randn(1, S, 1, R)
    fused = lambda x, c, s: fusegraph.ops.rope(x, c, s, interleaved=interleaved, rotary_dim=R)

    def ref(x, c, s):
        if x.dtype == torch.float64:
            return rope_ref(x, c, s, interleaved, rotary_dim=R)
        xr = x[..., :R]
        return torch.cat([(xr.float() * c + rope_rot(xr, interleaved).float() * s).to(x.dtype), x[..., R:]], -1)

    assert_eager_gradients(fused, ref, [x, cos, sin])


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("form", ["chunk_view", "per_token", "vector"])
@pytest.mark.parametrize("affine", [False, True])
def test_adaln_gradients_match_eager(dtype, form, affine):
    B, S, D = 3, 7, 96
    x = randn(B, S, D, dtype=dtype, scale=2.0, offset=0.3)
    if form == "chunk_view":
        emb = randn(B, 6 * D, dtype=dtype, scale=0.5)
        shift, scale = (c[:, None] for c in emb.chunk(6, dim=1)[:2])
    else:
        shape = (B, S, D) if form == "per_token" else (D,)
        scale, shift = randn(*shape, dtype=dtype, scale=0.5), randn(*shape, dtype=dtype)
    w = randn(D, dtype=dtype, offset=1.0) if affine else None
    b = randn(D, dtype=dtype) if affine else None
    fused = lambda x, sc, sh, w, b: fusegraph.ops.adaln(x, sc, sh, 1e-6, weight=w, bias=b)
    ref = lambda x, sc, sh, w, b: F.layer_norm(x, [D], w, b, 1e-6) * (1 + sc) + sh
    assert_eager_gradients(fused, ref, [x, scale, shift, w, b])


@pytest.mark.parametrize("dtype", DT)
def test_adaln_gradients_out_dtype(dtype):
    """Wan: (LayerNorm(x.float()) * (1 + scale) + shift).type_as(x) = adaln(..., out_dtype=x.dtype), fp32
    modulation: the modulation grads come back in float32, x's in x's dtype."""
    B, S, D = 2, 5, 64
    x, scale, shift = randn(B, S, D, dtype=dtype), randn(B, 1, D, scale=0.5), randn(B, 1, D)
    fused = lambda x, sc, sh: fusegraph.ops.adaln(x, sc, sh, 1e-6, out_dtype=x.dtype)
    ref = lambda x, sc, sh: (F.layer_norm(x.to(sc.dtype), [D], eps=1e-6) * (1 + sc) + sh).to(x.dtype)
    assert_eager_gradients(fused, ref, [x, scale, shift])


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("affine", [False, True])
@pytest.mark.parametrize("norm,has_shift", [("rms", True), ("rms", False), ("layer", False)])
def test_adaln_rms_and_no_shift_gradients_match_eager(dtype, affine, norm, has_shift):
    B, S, D = 3, 7, 96
    x = randn(B, S, D, dtype=dtype, scale=2.0, offset=0.3)
    emb = randn(B, 6 * D, dtype=dtype, scale=0.5)
    shift, scale = (c[:, None] for c in emb.chunk(6, dim=1)[:2])
    w = randn(D, dtype=dtype, offset=1.0) if affine else None
    b = randn(D, dtype=dtype) if affine else None

    def ref(x, sc, sh, w, b):
        if norm == "rms":
            n = torch.rms_norm(x, [D], None, 1e-6)
            n = n * w if w is not None else n
            n = n + b if b is not None else n
        else:
            n = F.layer_norm(x, [D], w, b, 1e-6)
        y = n * (1 + sc)
        return y + sh if sh is not None else y

    fused = lambda x, sc, w, b, sh=None: fusegraph.ops.adaln(x, sc, sh, 1e-6, weight=w, bias=b, norm=norm)
    if has_shift:
        assert_eager_gradients(lambda x, sc, sh, w, b: fused(x, sc, w, b, sh), ref, [x, scale, shift, w, b])
    else:
        assert_eager_gradients(lambda x, sc, w, b: fused(x, sc, w, b), lambda x, sc, w, b: ref(x, sc, None, w, b),
                               [x, scale, w, b])


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("name", ["gelu_tanh", "fast_gelu"])
def test_gelu_gradients_match_eager(dtype, name):
    x = randn(5, 300, dtype=dtype, scale=3.0)
    ref = (lambda x: F.gelu(x, approximate="tanh")) if name == "gelu_tanh" else (lambda x: x * torch.sigmoid(1.702 * x))
    assert_eager_gradients(getattr(fusegraph.ops, name), ref, [x])


@pytest.mark.parametrize("dtype", DT)
@pytest.mark.parametrize("form", ["gated_residual", "per_token", "scalar", "wan"])
def test_mul_add_gradients_match_eager(dtype, form):
    B, S, D = 3, 7, 40
    y, res = randn(B, S, D, dtype=dtype), randn(B, S, D, dtype=dtype)
    if form == "scalar":
        assert_eager_gradients(lambda a, c: fusegraph.ops.mul_add(a, 0.3, c), lambda a, c: a * 0.3 + c, [y, res])
        return
    if form == "wan":  # (h.float() + y.float() * gate).type_as(h), fp32 gate
        gate = randn(B, 1, D)
        fused = lambda y, g, h: fusegraph.ops.mul_add(y, g, h, out_dtype=h.dtype)
        ref = lambda y, g, h: (h.to(g.dtype) + y.to(g.dtype) * g).to(h.dtype)
    else:
        gate = randn(B, 1, D, dtype=dtype) if form == "gated_residual" else randn(B, S, 1, dtype=dtype)
        fused, ref = fusegraph.ops.mul_add, (lambda a, b, c: a * b + c)
    assert_eager_gradients(fused, ref, [y, gate, res])


def test_only_the_arguments_that_require_grad_get_one():
    x, w, b = randn(3, 8), randn(8), randn(8)
    w.requires_grad_(True)
    y = fusegraph.ops.rms_norm(x, w, bias=b)
    assert y.requires_grad and x.grad is None
    y.sum().backward()
    assert w.grad is not None and w.grad.shape == (8,) and x.grad is None and b.grad is None


def test_no_grad_and_inference_mode_record_nothing():
    x = randn(3, 8).requires_grad_(True)
    with torch.no_grad():
        assert not fusegraph.ops.gelu_tanh(x).requires_grad
    with torch.inference_mode():
        assert not fusegraph.ops.gelu_tanh(x).requires_grad


def test_opcheck_with_inputs_that_require_grad():
    """torch.library.opcheck's autograd registration and aot_dispatch checks, with grads flowing."""
    ops = torch.ops.fusegraph
    D = 16
    cases = [
        (ops.rms_norm.default, (randn(3, D), randn(D), 1e-6, randn(D)), {"style": "torch"}),
        (ops.rms_norm.default, (randn(3, D, dtype=torch.bfloat16), randn(D, dtype=torch.bfloat16), 1e-6),
         {"style": "diffusers"}),
        (ops.rope.default, (randn(2, 3, 2, D), randn(3, 1, D), randn(3, 1, D)), {"interleaved": False}),
        (ops.adaln.default, (randn(2, 3, D), randn(2, 1, D), randn(2, 1, D), 1e-6, randn(D), randn(D)), {}),
        (ops.adaln.default, (randn(2, 3, D), randn(2, 1, D), randn(2, 1, D), 1e-6, randn(D)), {"norm": "rms"}),
        (ops.adaln.default, (randn(2, 3, D), randn(2, 3, D), None, 1e-6), {"norm": "rms"}),
        (ops.adaln.default, (randn(2, 3, D, dtype=torch.bfloat16), randn(2, 1, D), None, 1e-6), {}),
        (ops.gelu_tanh.default, (randn(4, D),), {}),
        (ops.fast_gelu.default, (randn(4, D, dtype=torch.float16),), {}),
        (ops.mul_add.default, (randn(2, 3, D), randn(2, 1, D), randn(2, 3, D)), {}),
        (ops.mul_add.Scalar, (randn(2, 3, D), 0.5, randn(3, D)), {}),
    ]
    for op, args, kwargs in cases:
        args = tuple(a.requires_grad_(True) if isinstance(a, torch.Tensor) else a for a in args)
        torch.library.opcheck(op, args, kwargs)


# ---- training through torch.compile (aot_autograd) ------------------------------------------------------

def _block(x, w, cos, sin, emb, res):
    """A DiT-ish block built from every op: rms_norm -> rope -> adaln (layer; rms; rms without shift) -> gelu ->
    gated residual (+ scalar)."""
    shift, scale, gate = emb.chunk(3, dim=1)
    h = fusegraph.ops.rms_norm(x, w, 1e-6)
    h = fusegraph.ops.rope(h.unflatten(-1, (2, -1)), cos, sin, interleaved=True).flatten(-2)
    h = fusegraph.ops.adaln(h, scale[:, None], shift[:, None], 1e-6)
    h = fusegraph.ops.adaln(h, scale[:, None], shift[:, None], 1e-6, norm="rms")
    h = fusegraph.ops.adaln(h, scale[:, None], None, 1e-6, weight=w, norm="rms")
    h = fusegraph.ops.gelu_tanh(h) + fusegraph.ops.fast_gelu(h)
    h = fusegraph.ops.mul_add(h, gate[:, None], res)
    return fusegraph.ops.mul_add(h, 0.5, res)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_compiled_training_step_matches_eager(dtype):
    B, S, D = 2, 5, 16
    inputs = [randn(B, S, D, dtype=dtype), randn(D, dtype=dtype, offset=1.0), randn(S, 1, D // 2),
              randn(S, 1, D // 2), randn(B, 3 * D, dtype=dtype, scale=0.5), randn(B, S, D, dtype=dtype)]
    g = randn(B, S, D, dtype=dtype)
    out, eager = _grads(_block, inputs, g)
    torch._dynamo.reset()
    compiled = torch.compile(_block, backend="aot_eager", fullgraph=True)
    out_c, grads_c = _grads(compiled, inputs, g)
    torch.testing.assert_close(out_c, out, rtol=0, atol=0)
    for t, gc, ge in zip(inputs, grads_c, eager):
        assert gc.dtype == t.dtype and gc.shape == t.shape
        torch.testing.assert_close(gc, ge)


def test_compiled_training_step_matches_eager_formula():
    """The same block written with plain torch ops (no fusegraph), eager autograd, fp32: same gradients."""
    B, S, D = 2, 5, 16

    def plain(x, w, cos, sin, emb, res):
        shift, scale, gate = emb.chunk(3, dim=1)
        h = torch.rms_norm(x, [D], w, 1e-6).unflatten(-1, (2, -1))
        h = (h * cos + rope_rot(h, True) * sin).flatten(-2)
        h = F.layer_norm(h, [D], eps=1e-6) * (1 + scale[:, None]) + shift[:, None]
        h = torch.rms_norm(h, [D], None, 1e-6) * (1 + scale[:, None]) + shift[:, None]
        h = torch.rms_norm(h, [D], w, 1e-6) * (1 + scale[:, None])
        h = F.gelu(h, approximate="tanh") + h * torch.sigmoid(1.702 * h)
        h = res + gate[:, None] * h
        return h * 0.5 + res

    inputs = [randn(B, S, D), randn(D, offset=1.0), randn(S, 1, D // 2), randn(S, 1, D // 2),
              randn(B, 3 * D, scale=0.5), randn(B, S, D)]
    g = randn(B, S, D)
    torch._dynamo.reset()
    out_c, grads_c = _grads(torch.compile(_block, backend="aot_eager", fullgraph=True), inputs, g)
    out_e, grads_e = _grads(plain, inputs, g)
    torch.testing.assert_close(out_c, out_e)
    for gc, ge in zip(grads_c, grads_e):
        torch.testing.assert_close(gc, ge)


def test_calls_that_need_no_gradient_never_reach_python(monkeypatch):
    """The Autograd kernel is C++ (csrc/ops/autograd.cpp): without grad mode, or with no argument requiring
    grad, a call redispatches below autograd without running the Python formula path."""
    import fusegraph.ops._autograd as ag

    calls = []
    real = ag.apply
    monkeypatch.setattr(ag, "apply", lambda *a: (calls.append(a[0]), real(*a))[1])
    x, w = torch.randn(3, 8), torch.randn(8)
    fusegraph.ops.rms_norm(x, w)  # grad mode on, nothing requires grad
    with torch.no_grad():
        fusegraph.ops.rms_norm(x.requires_grad_(), w)
    assert calls == []
    y = fusegraph.ops.rms_norm(x, w)
    assert calls == ["fusegraph::rms_norm"] and y.grad_fn is not None
