"""RMSNorm fusion (SPEC §3): torch.nn.RMSNorm / F.rms_norm (eps fp32-rounded), diffusers RMSNorm (weight in x's
dtype or fp32, with and without bias, without weight), Wan's across-heads norm -> one fusegraph.rms_norm each,
with the source's output dtype, also where freezing's CSE merged norms of one input (default route, LuminaNext);
lookalikes stay unfused."""
import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from diffusers.models.normalization import MochiRMSNorm, RMSNorm

from tests.fusion.pattern_checks import assert_matches, assert_ops_gone, compile_and_run, double, fused

DTYPES = [torch.float32, torch.bfloat16]
RMS_CHAIN = ("aten.rsqrt.default", "aten.pow.Tensor_Scalar", "aten.mean.dim")


def randomize(module, scale=1.0, offset=0.0):
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn_like(p) * scale + offset)
    return module


@pytest.mark.parametrize("dtype", DTYPES)
def test_torch_rmsnorm_with_weight_fuses(dtype):
    m = randomize(nn.RMSNorm(64, eps=1e-6), 0.5, 1.0).to(dtype)
    x = torch.randn(2, 7, 3, 64, dtype=dtype)  # Flux QK-norm: [B, S, H, Dh]
    b, out, eager = compile_and_run(m, x, inductor=False)
    assert b.stats.patterns["rms_norm"] == 1 and fused(b, "rms_norm") == 1
    assert_ops_gone(b, *RMS_CHAIN)
    assert_matches(out, eager, scale=2.0, ref64=double(m, x))


@pytest.mark.parametrize("eps", [1e-6, 1e-5, None])
def test_torch_rmsnorm_eps_is_captured_not_baked(eps):
    """nn.RMSNorm's eps arrives fp32-rounded (1e-6 -> 9.999999974752427e-07), None -> finfo eps: all fuse,
    and the fused op gets the graph's value."""
    m = nn.RMSNorm(32, eps=eps, elementwise_affine=False)
    x = torch.randn(3, 5, 32) * 1e-3  # small values: eps matters to the result
    b, out, eager = compile_and_run(m, x, inductor=False)
    assert fused(b, "rms_norm") == 1
    assert_ops_gone(b, *RMS_CHAIN)
    assert_matches(out, eager)


def test_functional_rms_norm_fuses():
    def f(x, w):
        return F.rms_norm(x, [x.shape[-1]], w, eps=1e-5) + 1.0

    x, w = torch.randn(4, 48), torch.randn(48)
    b, out, eager = compile_and_run(f, x, w, inductor=False)
    assert fused(b, "rms_norm") == 1
    assert_matches(out, eager)


@pytest.mark.parametrize("w_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("bias", [False, True])
def test_diffusers_rmsnorm_fuses_with_its_output_dtype(w_dtype, bias):
    """diffusers RMSNorm casts to a bf16 weight's dtype before the multiply; with an fp32 weight the result
    stays fp32 even for bf16 x. The fused op must give the same dtype and values."""
    m = randomize(RMSNorm(64, eps=1e-6, bias=bias), 0.5, 1.0).to(w_dtype)
    if bias:
        with torch.no_grad():
            m.bias.mul_(0.1)
    x = torch.randn(2, 9, 64, dtype=torch.bfloat16)
    b, out, eager = compile_and_run(m, x, inductor=False)
    assert fused(b, "rms_norm") == 1
    assert_ops_gone(b, *RMS_CHAIN, "aten.add.Tensor")
    assert out.dtype == (torch.float32 if w_dtype == torch.float32 else torch.bfloat16)
    assert_matches(out, eager, scale=2.0)


@pytest.mark.parametrize("dtype", DTYPES)
def test_diffusers_rmsnorm_without_weight_fuses(dtype):
    m = RMSNorm(40, eps=1e-6, elementwise_affine=False)
    x = torch.randn(2, 3, 5, 40, dtype=dtype)
    b, out, eager = compile_and_run(m, x, inductor=False)
    assert fused(b, "rms_norm") == 1
    assert_ops_gone(b, *RMS_CHAIN)
    assert_matches(out, eager, ref64=double(m, x))


@pytest.mark.parametrize("dtype", DTYPES)
def test_wan_across_heads_rmsnorm_fuses(dtype):
    """Wan: norm_q = RMSNorm(heads * head_dim) over the full inner dim, then unflatten into heads."""
    heads, head_dim = 4, 16
    norm = randomize(nn.RMSNorm(heads * head_dim, eps=1e-6), 0.5, 1.0).to(dtype)
    proj = nn.Linear(32, heads * head_dim).to(dtype)

    def f(h):
        return norm(proj(h)).unflatten(2, (heads, -1))

    x = torch.randn(2, 11, 32, dtype=dtype)
    b, out, eager = compile_and_run(f, x, inductor=False)
    assert fused(b, "rms_norm") == 1
    assert_ops_gone(b, *RMS_CHAIN)
    assert_matches(out, eager, scale=4.0)


@pytest.mark.parametrize("w_dtype", [None, torch.float32])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_mochi_rmsnorm_fuses(dtype, w_dtype):
    """Mochi's QK-norm (MochiRMSNorm): the weight multiplied in fp32 without a cast before it, then one cast to
    x's dtype -> style="torch"; the weight in x's dtype or kept in fp32."""
    m = randomize(MochiRMSNorm(16, eps=1e-5), 0.5, 1.0).to(w_dtype or dtype)
    x = torch.randn(2, 7, 3, 16, dtype=dtype)  # [B, S, H, Dh] after unflatten
    b, out, eager = compile_and_run(m, x, inductor=False)
    assert b.stats.patterns["rms_norm"] == 1 and fused(b, "rms_norm") == 1
    assert_ops_gone(b, *RMS_CHAIN)
    assert out.dtype == dtype
    assert_matches(out, eager, scale=2.0, ref64=double(m, x))


def lookalike_mochi_cast_to_other_dtype(x, w):
    """MochiRMSNorm's chain but cast to fp16 at the end: not x's dtype, so not the torch-style op."""
    h = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
    return (h * w).to(torch.float16)


def lookalike_mochi_over_other_dim(x, w):
    h = x * torch.rsqrt(x.float().pow(2).mean(1, keepdim=True) + 1e-6)
    return (h * w).to(x.dtype)


@pytest.mark.parametrize("fn", [lookalike_mochi_cast_to_other_dtype, lookalike_mochi_over_other_dim])
def test_mochi_lookalikes_stay_unfused(fn):
    x, w = torch.randn(2, 16, 16, dtype=torch.bfloat16), torch.randn(16, dtype=torch.bfloat16)
    b, out, eager = compile_and_run(fn, x, w, inductor=False)
    assert b.stats.patterns["rms_norm"] == 0 and fused(b, "rms_norm") == 0
    torch.testing.assert_close(out, eager)


def test_rmsnorm_fuses_under_inductor():
    m = randomize(nn.RMSNorm(64, eps=1e-6), 0.5, 1.0).to(torch.bfloat16)
    d = randomize(RMSNorm(64, eps=1e-6), 0.5, 1.0).to(torch.bfloat16)

    def f(q, k):
        # q and k share nothing but their casts after freezing's CSE (both are read as q.float(), k.float())
        return m(q), d(k), q.float() + k.float()

    q, k = torch.randn(2, 5, 2, 64, dtype=torch.bfloat16), torch.randn(2, 5, 2, 64, dtype=torch.bfloat16)
    b, out, eager = compile_and_run(f, q, k, inductor=True)
    assert b.stats.patterns["rms_norm"] == 2 and fused(b, "rms_norm") == 2
    assert_matches(out, eager, scale=2.0)


def test_non_contiguous_input_fuses():
    m = randomize(nn.RMSNorm(32, eps=1e-6), 0.5, 1.0)

    def f(x):
        return m(x.transpose(1, 2))  # [B, H, S, D] view of [B, S, H, D]

    x = torch.randn(2, 6, 3, 32)
    b, out, eager = compile_and_run(f, x, inductor=False)
    assert fused(b, "rms_norm") == 1
    assert_matches(out, eager)


# --- lookalikes: same ops, different math: must stay unfused ------------------------------------------------


def lookalike_mean_over_other_dim(x, w):
    return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-6) * w


def lookalike_fourth_power(x, w):
    return x * torch.rsqrt(x.pow(4).mean(-1, keepdim=True) + 1e-6) * w


def lookalike_rsqrt_of_sum(x, w):
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + 1e-6) * w


def lookalike_two_dim_norm(x, w):
    return F.rms_norm(x, list(x.shape[-2:]), None, 1e-6) * w


@pytest.mark.parametrize("fn", [lookalike_mean_over_other_dim, lookalike_fourth_power, lookalike_rsqrt_of_sum,
                                lookalike_two_dim_norm])
def test_lookalikes_stay_unfused(fn):
    x, w = torch.randn(2, 16, 16), torch.randn(16)
    b, out, eager = compile_and_run(fn, x, w, inductor=False)
    assert b.stats.patterns["rms_norm"] == 0 and fused(b, "rms_norm") == 0
    assert_matches(out, eager)


def test_returned_intermediate_keeps_the_graph_outputs():
    """The normalised value before the weight is also returned: the weight form cannot fuse (it would drop
    an output); what fuses must leave both outputs equal to eager."""

    def f(x, w):
        n = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6)
        return n, n * w

    x, w = torch.randn(3, 24), torch.randn(24)
    b, out, eager = compile_and_run(f, x, w, inductor=False)
    assert fused(b, "rms_norm") <= 1
    assert_matches(out, eager)


# --- norms of one input sharing their core (freezing's CSE on the default route: LuminaNext) -----------------


class NormsOfOneInput(nn.Module):
    """Several RMSNorms, one eps, different (random) weights, all of the same input: LuminaNext's
    ``norm1_context`` in every block normalizes the same ``encoder_hidden_states``. Freezing's CSE merges
    their ``x * rsqrt(mean(x^2) + eps)`` (the weights are not part of it) into one core that every
    ``* weight`` reads; ``plain``: a weightless norm of the input too (it is the core itself)."""

    def __init__(self, form, dim, n=2, plain=False, dtype=torch.float32, w_dtype=None):
        super().__init__()
        make = {"diffusers": lambda: RMSNorm(dim, eps=1e-5), "torch": lambda: nn.RMSNorm(dim, eps=1e-5),
                "mochi": lambda: MochiRMSNorm(dim, eps=1e-5)}[form]
        self.norms = nn.ModuleList(randomize(make(), 0.5, 1.0).to(w_dtype or dtype) for _ in range(n))
        self.plain = RMSNorm(dim, eps=1e-5, elementwise_affine=False) if plain else None

    def forward(self, x):
        outs = tuple(norm(x) for norm in self.norms)
        return outs + (self.plain(x),) if self.plain is not None else outs


SHARED_CORE_CASES = {  # id: (form, x dtype, weight dtype, norms, plain)
    "diffusers-fp32": ("diffusers", torch.float32, None, 2, False),  # LuminaNext
    "diffusers-bf16": ("diffusers", torch.bfloat16, None, 2, False),  # one shared .to(weight.dtype) too
    "diffusers-bf16-fp32w": ("diffusers", torch.bfloat16, torch.float32, 2, False),
    "torch-bf16": ("torch", torch.bfloat16, None, 2, False),
    "mochi-fp16": ("mochi", torch.float16, None, 2, False),
    "diffusers-fp32-three-and-plain": ("diffusers", torch.float32, None, 3, True),
}


@pytest.mark.parametrize("freezing", ["auto", True], ids=["default", "frozen"])
@pytest.mark.parametrize("case", list(SHARED_CORE_CASES), ids=list(SHARED_CORE_CASES))
def test_norms_sharing_their_core_fuse_on_default_route(case, freezing):
    """The Inductor route (as default, and with freezing, whose CSE runs before the fusion pass):
    every norm fuses with its own weight, as on the aten route (split_shared_rms_cores gives each weight
    product its own copy of the core). Before, the shared core fused as one weightless norm and the weight
    products stayed: one site lost per extra norm."""
    form, dtype, w_dtype, n, plain = SHARED_CORE_CASES[case]
    torch.manual_seed(0)
    m = NormsOfOneInput(form, 32, n, plain, dtype, w_dtype).eval()
    x = torch.randn(2, 7, 32, dtype=dtype)
    b, out, eager = compile_and_run(m, x, enable_freezing=freezing)
    assert b.config.inductor and b.config.enable_freezing is freezing
    sites = n + plain
    assert b.stats.patterns["rms_norm"] == sites and fused(b, "rms_norm") == sites, b.stats.patterns
    assert_matches(out, eager, scale=4.0, ref64=double(m, x))


def test_split_shared_rms_cores_copies_per_weight_product():
    """The preparation step on a graph with one shared core (as after CSE), traced as aot_autograd traces:
    each weight product gets its own chain, the core's other user (returned as it is) keeps the original,
    and the graph computes exactly the same; likewise two cores reading one rsqrt. One norm whose core is
    also read raw, and a lookalike core (mean over another dim), are left as they are."""
    from fusegraph.fusion.patterns._prepare import split_shared_rms_cores
    from fusegraph.fusion.patterns._trace import fwd_functional

    def shared(x, w1, w2):
        n = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
        return n * w1, w2 * n, n

    def shared_other_dim(x, w1, w2):
        n = x * torch.rsqrt(x.float().pow(2).mean(1, keepdim=True) + 1e-5)
        return n * w1, n * w2

    def shared_rsqrt(x, w1, w2):
        """One rsqrt read by two cores (CSE stopped there): a core with a weight, one without."""
        r = torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
        return (x * r) * w1, x * r

    def returned_core(x, w1, w2):
        """One norm whose normalised value is also returned: left as it is."""
        n = x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-5)
        return n, n * w1

    def rsqrts(gm):
        return [n for n in gm.graph.nodes if n.op == "call_function" and n.target == torch.ops.aten.rsqrt.default]

    args = [torch.randn(3, 5, 16), torch.randn(16), torch.randn(16)]
    for fn, copies in ((shared, 2), (shared_rsqrt, 1), (returned_core, 0), (shared_other_dim, 0)):
        gm = fwd_functional(fn, args)
        assert len(rsqrts(gm)) == 1
        assert split_shared_rms_cores(gm.graph) == copies
        assert len(rsqrts(gm)) == 1 + copies
        gm.graph.lint()
        gm.recompile()
        for a, e in zip(gm(*args), fn(*args)):
            torch.testing.assert_close(a, e, rtol=0, atol=0)


def lookalike_shared_core_other_dim(x, w1, w2):
    n = x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + 1e-5)
    return n * w1, n * w2


def test_shared_lookalike_core_stays_unfused_on_default_route():
    x, w1, w2 = torch.randn(2, 16, 16), torch.randn(16), torch.randn(16)
    b, out, eager = compile_and_run(lookalike_shared_core_other_dim, x, w1, w2)
    assert b.stats.patterns["rms_norm"] == 0 and fused(b, "rms_norm") == 0
    assert_matches(out, eager)


@pytest.mark.parametrize("inductor", [False, True])
def test_rmsnorm_of_a_selected_qkv_slice_fuses(inductor):
    """PRX: ``img_q = norm_q(qkv[0])`` after a permute of a fused QKV projection. The rope family's table split
    step used to take x's ``select`` for a RoPE table (read by ``x * rsqrt(...)``) and copy it, which left the
    norm's pow and its product on different nodes: no RMSNorm of such an x fused (PRX: 0 of 6)."""
    m = randomize(RMSNorm(16, eps=1e-6), 0.5, 1.0)

    def f(x):
        q = x.reshape(2, 16, 3, 2, 16).permute(2, 0, 3, 1, 4)[0]
        return m(q) * 2, m(x.reshape(2, 16, 6, 16)[:, :, 1])

    x = torch.randn(2, 16, 96)
    b, out, eager = compile_and_run(f, x, inductor=inductor)
    assert fused(b, "rms_norm") == 2
    assert_matches(out, eager)
