"""Fused AOTInductor packages (fusegraph/aot.py): made once, loaded in a fresh process, run without compiling.

One tiny Flux package (a sequence dim exported dynamic, weights beside the code) and one tiny Wan package (bf16)
serve most tests; each package build is an AOTInductor compile (~20-40 s here)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
import zipfile

import pytest
import torch

import fusegraph
from fusegraph import aot, zoo

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FUSED_FAMILIES = ("rms_norm", "rope", "adaln", "adaln_rms", "adaln_noshift", "gelu", "mul_add")
# fusion_choice="always": at these widths the per-site choice leaves every site to Inductor's own code (faster
# there), on the JIT route as in a package; "always" makes both keep every fused site, which the tests compare.
ALWAYS = {"fusion_choice": "always"}


def flux_inputs(side: int, seed: int = 0) -> dict:
    """Tiny Flux inputs with an image of side x side tokens (zoo's config: 4 channels, 8 text tokens)."""
    g = torch.Generator().manual_seed(100 + seed)
    ids = torch.zeros(side, side, 3)
    ids[..., 1] = torch.arange(side)[:, None]
    ids[..., 2] = torch.arange(side)[None, :]
    return dict(hidden_states=torch.randn(2, side * side, 4, generator=g),
                encoder_hidden_states=torch.randn(2, 8, 32, generator=g),
                pooled_projections=torch.randn(2, 32, generator=g), timestep=torch.rand(2, generator=g),
                img_ids=ids.reshape(side * side, 3), txt_ids=torch.zeros(8, 3), return_dict=False)


def jit_counts(model, kwargs, config: dict) -> dict:
    torch._dynamo.reset()
    backend = fusegraph.Backend(fusegraph.CompilationConfig(**config))
    with torch.no_grad():
        torch.compile(model, backend=backend)(**kwargs)
    torch._dynamo.reset()
    return {k: backend.stats.patterns[k] for k in FUSED_FAMILIES}


def package_ops(path: str) -> set:
    """The operators the package's code calls through AOTInductor's proxy executor, read from its own files (the
    extern-node JSON AOTInductor writes beside the generated C++)."""
    targets = set()
    with zipfile.ZipFile(path) as z:
        for name in z.namelist():
            if name.endswith(".json") and "/data/aotinductor/" in name:
                data = json.loads(z.read(name))
                targets |= {n["node"]["target"] for n in data.get("nodes", []) if "node" in n}
    return targets


def close(got: torch.Tensor, want: torch.Tensor, rtol: float = 1e-5):
    """fp32: |got - want| <= rtol * max|want| (relative to the output's scale)."""
    assert got.shape == want.shape and got.dtype == want.dtype
    err = (got.double() - want.double()).abs().max().item()
    scale = want.double().abs().max().item()
    assert err <= rtol * scale, f"max |got - want| {err:.3g} > {rtol} x scale {scale:.3g}"


@pytest.fixture(scope="module")
def flux(tmp_path_factory):
    model, _ = zoo.build("FluxTransformer2DModel")
    kwargs = flux_inputs(4)
    seq = torch.export.Dim("seq", min=4, max=256)
    dynamic = {"hidden_states": {1: seq}, "encoder_hidden_states": None, "pooled_projections": None,
               "timestep": None, "img_ids": {0: seq}, "txt_ids": None, "return_dict": None}
    path = str(tmp_path_factory.mktemp("aot") / "tiny_flux.pt2")
    stats = fusegraph.Stats()
    t0 = time.perf_counter()
    aot.package(model, (), kwargs, path, config=ALWAYS, dynamic_shapes=dynamic, stats=stats)
    print(f"\ntiny Flux packaged in {time.perf_counter() - t0:.1f} s")
    return model, kwargs, path, stats


@pytest.fixture(scope="module")
def wan(tmp_path_factory):
    model, kwargs = zoo.build("WanTransformer3DModel", dtype=torch.bfloat16)
    kwargs = dict(kwargs, return_dict=False)
    path = str(tmp_path_factory.mktemp("aot") / "tiny_wan.pt2")
    stats = fusegraph.Stats()
    aot.package(model, (), kwargs, path, config=ALWAYS, stats=stats, weights="embedded")
    return model, kwargs, path, stats


def test_flux_fuses_what_the_jit_route_fuses(flux):
    model, kwargs, path, stats = flux
    packaged = {k: stats.patterns[k] for k in FUSED_FAMILIES}
    assert packaged == jit_counts(model, kwargs, ALWAYS)
    assert packaged["rope"] > 0 and packaged["rms_norm"] > 0 and packaged["adaln"] > 0
    assert aot.load(path).counts == {k: stats.patterns[k] for k in fusegraph.stats.PATTERN_NAMES}
    # the package's own code calls the fused ops: one extern call per fused kind, named in its files
    ops = package_ops(path)
    assert {"fusegraph::rms_norm", "fusegraph::rope", "fusegraph::adaln", "fusegraph::mul_add"} <= ops, ops
    assert aot.load(path).metadata["fusegraph.ops"].count("fusegraph::") == len({o for o in ops if "fusegraph" in o})


def test_wan_bf16_fuses_what_the_jit_route_fuses_and_matches_eager(wan):
    model, kwargs, path, stats = wan
    assert {k: stats.patterns[k] for k in FUSED_FAMILIES} == jit_counts(model, kwargs, ALWAYS)
    assert any(o.startswith("fusegraph::") for o in package_ops(path))
    with torch.no_grad():
        want = model(**kwargs)[0]
        reference = zoo.build("WanTransformer3DModel")[0](**{k: v.float() if isinstance(v, torch.Tensor) else v
                                                                for k, v in kwargs.items()})[0]
    got = aot.load(path)(**kwargs)[0]
    # bf16: any other order of roundings (plain Inductor's too) is ~1e-2 off eager at elements near zero, where
    # assert_close's absolute 1e-5 cannot hold; so bf16's rtol against the output's scale, and no further from the
    # fp32 model (same weights) than eager bf16 is
    scale = want.float().abs().max().item()
    torch.testing.assert_close(got, want, rtol=1.6e-2, atol=1.6e-2 * scale)
    eager_error = (want.float() - reference).abs().max().item()
    assert (got.float() - reference).abs().max().item() <= 1.5 * eager_error


def test_fresh_process_serves_three_sizes(flux, tmp_path):
    """A process that never compiled loads the package and runs three sequence lengths from it."""
    model, _, path, _ = flux
    sides = (4, 6, 9)
    script = textwrap.dedent(f"""
        import sys, time, torch
        t0 = time.perf_counter()
        import fusegraph
        from fusegraph import aot
        sys.path.insert(0, {str(REPO_ROOT)!r})
        from tests.aot.test_aot import flux_inputs
        loaded = aot.load({path!r})
        outs = [loaded(**flux_inputs(side, seed=side))[0] for side in {sides!r}]
        torch.save(outs, {str(tmp_path / 'outs.pt')!r})
        print("first call after", time.perf_counter() - t0, "s")
    """)
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(tmp_path / "empty_cache"))  # nothing compiled to reuse
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert not os.path.exists(tmp_path / "empty_cache" / "fxgraph"), "the fresh process compiled something"
    outs = torch.load(tmp_path / "outs.pt")
    for side, got in zip(sides, outs):
        with torch.no_grad():
            want = model(**flux_inputs(side, seed=side))[0]
        close(got, want)


def test_load_weights_takes_a_lora_merged_state_dict(flux):
    """New weights without a compile: a rank-2 LoRA merged into every attention projection."""
    model, kwargs, path, _ = flux
    loaded = aot.load(path)
    state = {k: v.clone() for k, v in model.state_dict().items()}
    g = torch.Generator().manual_seed(7)
    merged = 0
    for name, w in state.items():
        if name.endswith(("to_q.weight", "to_k.weight", "to_v.weight")):
            a, b = torch.randn(2, w.shape[1], generator=g), torch.randn(w.shape[0], 2, generator=g)
            state[name] = w + 0.5 * b @ a
            merged += 1
    assert merged >= 6
    t0 = time.perf_counter()
    loaded.load_weights(state)
    print(f"\nload_weights: {len(state)} tensors in {(time.perf_counter() - t0) * 1e3:.1f} ms")
    edited, _ = zoo.build("FluxTransformer2DModel")
    edited.load_state_dict(state)
    with torch.no_grad():
        want = edited(**kwargs)[0]
        before = model(**kwargs)[0]
    got = loaded(**kwargs)[0]
    close(got, want)
    assert (want - before).abs().max() > 1e-2  # the merge changed the output: the check above is not vacuous
    # the package's other weights stay: a partial update keeps the merged ones
    with pytest.raises(KeyError, match="needs every weight"):
        loaded.load_weights({"proj_out.weight": state["proj_out.weight"]})
    # a name the model never had: refused under strict, ignored (and reported) otherwise, as load_state_dict does
    with pytest.raises(KeyError, match=r"the model had no weights named \['no.such.weight'\]"):
        loaded.load_weights(dict(state, **{"no.such.weight": torch.zeros(1)}))
    assert loaded.load_weights({"no.such.weight": torch.zeros(1)}, strict=False).unexpected_keys == ["no.such.weight"]


def test_bad_inputs_name_the_input(flux):
    _, kwargs, path, _ = flux
    loaded = aot.load(path)
    with pytest.raises(RuntimeError, match=r"input 0 'hidden_states' has dtype float64; the package expects float32"):
        loaded(**dict(kwargs, hidden_states=kwargs["hidden_states"].double()))
    with pytest.raises(RuntimeError, match=r"input 0 'hidden_states' has shape \[2, 16, 5\]; the package expects "
                                           r"\[2, 4:256, 4\]"):
        loaded(**dict(kwargs, hidden_states=torch.randn(2, 16, 5)))
    big = flux_inputs(17)  # 289 tokens: over the exported range
    with pytest.raises(RuntimeError, match=r"'hidden_states' has shape \[2, 289, 4\]"):
        loaded(**big)
    with pytest.raises(TypeError, match="missing 'img_ids'"):
        loaded(**{k: v for k, v in kwargs.items() if k != "img_ids"})
    with pytest.raises(TypeError, match="missing 'hidden_states'"):
        loaded(kwargs["hidden_states"], **{k: v for k, v in kwargs.items() if k != "hidden_states"})
    with pytest.raises(TypeError, match=r"exported without the keyword arguments \['guidance'\]"):
        loaded(**kwargs, guidance=torch.ones(2))
    with pytest.raises(TypeError, match="structured as"):
        loaded(**dict(kwargs, txt_ids=[kwargs["txt_ids"]]))


def _with_metadata(src: str, dst: str, **changes) -> None:
    """A copy of package ``src`` whose fusegraph record claims other metadata (another machine's package)."""
    with zipfile.ZipFile(src) as zin, zipfile.ZipFile(dst, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if item.filename.endswith("extra/" + aot.RECORD):
                record = json.loads(data)
                record["metadata"].update(changes)
                data = json.dumps(record).encode()
            zout.writestr(item, data)


@pytest.mark.parametrize("changes,message", [
    ({"fusegraph.torch": "2.99"}, "compiled with torch 2.99; this process runs torch"),
    ({"fusegraph.cpu_flags": "avx2,amx_tile,avx10_2"}, "compiled for a CPU with .*avx10_2.*which this CPU lacks"),
    ({"fusegraph.ops": "fusegraph::rms_norm.default,fusegraph::no_such_op.default"},
     "calls the operator fusegraph::no_such_op.default, which is not registered"),
])
def test_a_package_this_process_cannot_run_is_refused(flux, tmp_path, changes, message):
    _, _, path, _ = flux
    other = str(tmp_path / "other.pt2")
    _with_metadata(path, other, **changes)
    if "amx_tile" in changes.get("fusegraph.cpu_flags", "") and \
            fusegraph._core.torch_dispatcher.cpu_capabilities().get("avx10_2"):
        pytest.skip("this CPU has AVX10.2")
    with pytest.raises(RuntimeError, match=message):
        aot.load(other)


def test_not_a_package(tmp_path):
    with pytest.raises(FileNotFoundError, match="no package at"):
        aot.load(str(tmp_path / "missing.pt2"))
    (tmp_path / "junk.pt2").write_bytes(b"not a zip")
    with pytest.raises(RuntimeError, match="not a .pt2 package"):
        aot.load(str(tmp_path / "junk.pt2"))
    with pytest.raises(ValueError, match="ending in .pt2"):
        aot.package(torch.nn.Linear(2, 2), (torch.randn(1, 2),), path=str(tmp_path / "x.so"))
    with pytest.raises(ValueError, match="weights must be one of"):
        aot.package(torch.nn.Linear(2, 2), (torch.randn(1, 2),), path=str(tmp_path / "x.pt2"), weights="inline")


def test_exported_program_and_the_default_choice(tmp_path):
    """An ExportedProgram packages as a module does; with the default per-site choice the record says what the
    choice lowered, and the package still equals eager."""
    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.RMSNorm(64, eps=1e-6)
            self.lin = torch.nn.Linear(64, 64)

        def forward(self, x):
            return self.lin(self.norm(x)) * torch.nn.functional.gelu(x, approximate="tanh")

    model = Block().eval()
    x = torch.randn(3, 7, 64)
    ep = torch.export.export(model, (x,))
    path = aot.package(ep, path=str(tmp_path / "block.pt2"))
    loaded = aot.load(path)
    fused = loaded.counts
    assert fused["rms_norm"] == 1 and fused["gelu"] == 1
    lowered = loaded.record["lowered"]
    kept = {k for k in ("rms_norm", "gelu") if fused[k] - lowered.get(k, 0) > 0}
    assert {o.split("::")[1].split(".")[0] for o in loaded.metadata["fusegraph.ops"].split(",") if o} == \
        {"rms_norm" if k == "rms_norm" else "gelu_tanh" for k in kept}
    x2 = torch.randn(3, 7, 64)
    with torch.no_grad():
        close(loaded(x2), model(x2))


class _Tied(torch.nn.Module):
    """x and y share their first dim (B); z's is 2*B; scale is a Python float compiled in as a constant."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, y, z, scale=2.0):
        return self.lin(x) * scale + y, z.sum(0)


@pytest.fixture(scope="module")
def tied(tmp_path_factory):
    model = _Tied().eval()
    B = torch.export.Dim("B", min=2, max=64)
    args = (torch.randn(4, 8), torch.randn(4, 8), torch.randn(8, 8))
    path = aot.package(model, args, {"scale": 2.0}, str(tmp_path_factory.mktemp("aot") / "tied.pt2"),
                       dynamic_shapes=({0: B}, {0: B}, {0: 2 * B}, None))
    return model, aot.load(path)


def test_an_input_in_another_layout_is_laid_out_as_exported(tied):
    """The package's code indexes each input with the exported strides: a slice, an expanded or a transposed view is
    copied into that layout (before: silently wrong, or read past the storage), as eager reads it."""
    model, loaded = tied
    assert loaded.metadata["fusegraph.inputs"].split(";")[0].endswith("|c")
    base = torch.randn(6, 16)
    views = {"sliced": base[:, ::2], "expanded": torch.randn(1, 8).expand(6, 8), "transposed": torch.randn(8, 6).t()}
    for name, view in views.items():
        assert not view.is_contiguous(), name
        z = torch.randn(12, 8)
        for x, y in ((view, torch.randn(6, 8)), (torch.randn(6, 8), view)):
            got, want = loaded(x, y, z, scale=2.0), model(x, y, z)
            close(got[0], want[0].detach())
            close(got[1], want[1])


def test_dims_exported_tied_are_checked_together(tied):
    _, loaded = tied
    with pytest.raises(RuntimeError, match=r"input 1 'y' dim 0 \(3\) gives the exported symbol \w+ = 3, but input 0 "
                                           r"'x' dim 0 \(6\) gave \w+ = 6"):
        loaded(torch.randn(6, 8), torch.randn(3, 8), torch.randn(12, 8), scale=2.0)
    with pytest.raises(RuntimeError, match=r"input 2 'z' dim 0 \(10\) gives the exported symbol \w+ = 5"):
        loaded(torch.randn(6, 8), torch.randn(6, 8), torch.randn(10, 8), scale=2.0)
    with pytest.raises(RuntimeError, match=r"input 2 'z' has size 13 in dim 0; the package expects 2\*\w+\+0"):
        loaded(torch.randn(6, 8), torch.randn(6, 8), torch.randn(13, 8), scale=2.0)


def test_a_non_tensor_argument_must_be_the_exported_value(tied):
    model, loaded = tied
    x, y, z = torch.randn(5, 8), torch.randn(5, 8), torch.randn(10, 8)
    close(loaded(x, y, z, scale=2.0)[0], model(x, y, z, scale=2.0)[0].detach())
    with pytest.raises(ValueError, match=r"argument leaf 3 was 2.0 when the package was exported and is 3.0 now"):
        loaded(x, y, z, scale=3.0)


def test_a_model_without_weights_packages_with_separate_weights(tmp_path):
    class NoWeights(torch.nn.Module):
        def forward(self, x):
            return torch.nn.functional.gelu(x * 2 + 1, approximate="tanh")

    path = aot.package(NoWeights(), (torch.randn(3, 5),), path=str(tmp_path / "none.pt2"))
    loaded = aot.load(path)
    assert loaded.weight_names() == []
    x = torch.randn(3, 5)
    close(loaded(x), NoWeights()(x))
    loaded.load_weights({})  # nothing to replace: not an error
