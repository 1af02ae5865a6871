"""A package's integrity and its edges (fusegraph/aot.py, csrc/aot/package_check, examples/aot_runner): weights
replaced with load_weights checked as load_state_dict checks them, dynamic dims without a bound, the CPU flags a
``cpp.march`` package requires, a damaged package refused before anything of it is loaded (Python and the C++
runner), and the runner's None and empty outputs and its command line.

Each package here is a tiny model (an AOTInductor compile of ~10 s)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import zipfile

import pytest
import torch

import fusegraph
from fusegraph import aot

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
RUNNER = os.environ.get("FUSEGRAPH_AOT_RUNNER") or os.path.join(REPO_ROOT, "build", "fusegraph_aot_runner")


class _Weights(torch.nn.Module):
    """A Linear, a persistent and a non-persistent buffer, a submodule the forward never calls (compiled out of the
    package), and outputs None and an empty tensor among them."""

    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)
        self.unused = torch.nn.Linear(8, 4)
        self.register_buffer("scale", torch.full((8,), 2.0))
        self.register_buffer("tmp", torch.ones(8), persistent=False)

    def forward(self, x):
        return self.lin(x) * self.scale + self.tmp, None, x[:, :0]


def _model(seed: int = 0) -> _Weights:
    torch.manual_seed(seed)
    return _Weights().eval()


@pytest.fixture(scope="module")
def weights_pkg(tmp_path_factory):
    path = aot.package(_model(), (torch.randn(3, 8),), None, str(tmp_path_factory.mktemp("aot") / "weights.pt2"))
    return path


def _eager(state: dict, x: torch.Tensor) -> torch.Tensor:
    model = _model(1)
    model.load_state_dict(state, strict=False)
    if "tmp" in state:  # a non-persistent buffer, which load_state_dict leaves alone and load_weights loads
        model.tmp.copy_(state["tmp"])
    with torch.no_grad():
        return model(x)[0]


# ---- load_weights ----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(2, 8), (1, 1), (16, 8), (8,)])
def test_load_weights_refuses_another_shape(weights_pkg, shape):
    """Before: handed to the loader as raw bytes of the exported shape: heap corruption (2x8), garbage (1x1)."""
    loaded = aot.load(weights_pkg)
    x = torch.randn(3, 8)
    before = loaded(x)[0].clone()
    state = dict(_model().state_dict(), **{"lin.weight": torch.randn(*shape)})
    expected = rf"weight 'lin.weight' of shape \[{', '.join(map(str, shape))}\]; the package's is a float32 tensor " \
               r"of shape \[8, 8\]"
    with pytest.raises(ValueError, match=expected):
        loaded.load_weights(state)
    torch.testing.assert_close(loaded(x)[0], before)  # refused whole: no weight was replaced
    with pytest.raises(TypeError, match=r"got a list for weight 'lin.bias'; expected a float32 tensor of shape \[8\]"):
        loaded.load_weights(dict(state, **{"lin.weight": torch.randn(8, 8), "lin.bias": [0.0] * 8}))


@pytest.mark.parametrize("form", ["float64", "bfloat16", "transposed", "sliced"])
def test_load_weights_converts_as_load_state_dict(weights_pkg, form):
    """Another dtype is converted into the weight's and a non-contiguous tensor laid out contiguous, as eager's
    load_state_dict copies (before: the bytes read as contiguous fp32: wrong results)."""
    loaded = aot.load(weights_pkg)
    g = torch.Generator().manual_seed(3)
    w = torch.randn(8, 8, generator=g)
    weight = {"float64": w.double(), "bfloat16": w.bfloat16(), "transposed": w.t().contiguous().t(),
              "sliced": torch.randn(8, 16, generator=g)[:, ::2]}[form]
    assert form in ("float64", "bfloat16") or not weight.is_contiguous()
    state = dict(_model().state_dict(), **{"lin.weight": weight, "scale": torch.randn(8, generator=g).double()})
    loaded.load_weights(state)
    x = torch.randn(3, 8, generator=g)
    torch.testing.assert_close(loaded(x)[0], _eager(state, x))


def test_load_weights_takes_the_models_own_state_dict(weights_pkg):
    """model.state_dict() holds the unused submodule's weights (not in the package) and not the non-persistent buffer
    (in it): both are load_state_dict's business as usual (before: KeyError even with strict=False, and strict=True
    could never be satisfied)."""
    loaded = aot.load(weights_pkg)
    assert "tmp" in loaded.weight_names() and "unused.weight" not in loaded.weight_names()
    state = {k: v * 1.5 for k, v in _model().state_dict().items()}
    assert "unused.weight" in state and "tmp" not in state
    assert loaded.load_weights(state) == ([], [])
    x = torch.randn(3, 8)
    torch.testing.assert_close(loaded(x)[0], _eager(state, x))
    # strict: every persistent weight, and only the model's names
    with pytest.raises(KeyError, match=r"missing \['lin.bias'\]"):
        loaded.load_weights({k: v for k, v in state.items() if k != "lin.bias"})
    with pytest.raises(KeyError, match=r"the model had no weights named \['extra.weight'\]"):
        loaded.load_weights(dict(state, **{"extra.weight": torch.zeros(2)}))
    # non-strict: what the package holds is loaded, the rest ignored and reported
    keys = loaded.load_weights({"lin.bias": torch.zeros(8), "extra.weight": torch.zeros(2)}, strict=False)
    assert keys.unexpected_keys == ["extra.weight"] and keys.missing_keys == ["lin.weight", "scale"]
    torch.testing.assert_close(loaded(x)[0], _eager(dict(state, **{"lin.bias": torch.zeros(8)}), x))
    # a non-persistent buffer given is loaded too
    loaded.load_weights(dict(state, tmp=torch.full((8,), 3.0)))
    torch.testing.assert_close(loaded(x)[0], _eager(dict(state, tmp=torch.full((8,), 3.0)), x))


def test_a_missing_argument_is_named(weights_pkg):
    loaded = aot.load(weights_pkg)
    with pytest.raises(TypeError, match=r"exported with 1 positional argument\(s\); got 0 \(its tensor inputs, "
                                        r"positional then keyword: x\)"):
        loaded()
    with pytest.raises(TypeError, match=r"exported with 1 positional argument\(s\); got 2"):
        loaded(torch.randn(3, 8), torch.randn(3, 8))


# ---- dynamic dims without a bound --------------------------------------------------------------------------------

class _ThreeDims(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(8, 8)

    def forward(self, x, y, z):
        return self.lin(x).sum(0) + y.sum(0) + z.sum(0)


def test_dims_without_a_max_package_and_are_checked(tmp_path):
    """Dim("S"), Dim("T", min=4), Dim.DYNAMIC: torch's bound is int_oo, which is not is_infinite (before: int(int_oo)
    raised AttributeError inside aot.package)."""
    torch.manual_seed(0)
    model = _ThreeDims().eval()
    args = (torch.randn(5, 8), torch.randn(6, 8), torch.randn(7, 8))
    dynamic = ({0: torch.export.Dim("S")}, {0: torch.export.Dim("T", min=4)}, {0: torch.export.Dim.DYNAMIC})
    loaded = aot.load(aot.package(model, args, None, str(tmp_path / "unbounded.pt2"), dynamic_shapes=dynamic))
    dims = [entry.split("|")[3] for entry in loaded.metadata["fusegraph.inputs"].split(";")]
    assert all(d.split(",")[0].endswith(":inf") for d in dims), dims
    assert dims[1].split(",")[0].endswith("=4:inf"), dims
    for sizes in ((2, 4, 3), (1000, 4096, 513)):
        inputs = [torch.randn(n, 8) for n in sizes]
        with torch.no_grad():
            torch.testing.assert_close(loaded(*inputs), model(*inputs), rtol=1e-5, atol=1e-3)
    with pytest.raises(RuntimeError, match=r"input 1 'y' has shape \[3, 8\]; the package expects \[4:inf, 8\]"):
        loaded(torch.randn(5, 8), torch.randn(3, 8), torch.randn(5, 8))


# ---- cpp.march: the CPU flags the package requires -------------------------------------------------------------

# What cpuinfo reports on an AVX2-only CPU (a Haswell server: no AVX-512, no AMX), by at::cpu::get_cpu_capabilities'
# names.
HASWELL = ["aes", "avx", "avx2", "bmi", "bmi2", "clflush", "f16c", "fma3", "lzcnt", "popcnt", "sse", "sse2", "sse3",
           "sse4_1", "sse4_2", "ssse3"]


V3 = ["sse", "sse2", "popcnt", "sse3", "sse4_1", "sse4_2", "ssse3", "avx", "avx2", "bmi", "bmi2", "f16c", "fma3",
      "lzcnt"]
X86 = pytest.mark.skipif(fusegraph._core.torch_dispatcher.cpu_capabilities().get("architecture") != "x86_64",
                         reason="x86-64 levels")


@X86
def test_march_x86_64_v3_requires_the_levels_flags_and_the_kernels_vector_isa(tmp_path):
    """A package compiled for x86-64-v3 records that level's instruction sets plus those of the vector ISA Inductor
    wrote its kernels for (this CPU's best unless ATEN_CPU_CAPABILITY lowers it: cpp.march does not), never fewer:
    recording only the level's let an AVX-512 package pass an AVX2 machine's check (and die there of an illegal
    instruction). Not the packaging CPU's other flags."""
    from fusegraph._core import torch_inductor

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.RMSNorm(16), torch.nn.Linear(16, 16)).eval()
    path = aot.package(model, (torch.randn(2, 16),), None, str(tmp_path / "v3.pt2"),
                       config={"inductor_options": {"cpp.march": "x86-64-v3"}})
    loaded = aot.load(path)
    flags = loaded.metadata["fusegraph.cpu_flags"].split(",")
    isa = aot._VEC_ISA_FLAGS[str(torch_inductor.pick_vec_isa() or "")]
    assert flags == sorted(set(V3) | set(isa)), flags
    assert loaded.record["metadata"]["fusegraph.cpu_flags"] == loaded.metadata["fusegraph.cpu_flags"]
    x = torch.randn(5, 16)[:2]
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model(x))
    # a level this code does not map (or none): this CPU's flags, as before
    assert aot._cpu_flags(fusegraph.CompilationConfig(inductor_options={"cpp.march": "haswell"})) == \
        aot._cpu_flags(None)


@X86
def test_the_avx2_fleet_recipe_records_only_avx2_flags():
    """GUIDE §2.8's recipe, cpp.march x86-64-v3 with ATEN_CPU_CAPABILITY=avx2 (read at Inductor's first pick of a
    vector ISA: a process of its own): that level's flags, all a Haswell has; x86-64-v2 with AVX2 kernels needs
    AVX2 too."""
    code = textwrap.dedent("""
        import json, fusegraph
        from fusegraph import aot
        cfg = lambda m: fusegraph.CompilationConfig(inductor_options={"cpp.march": m})
        print(json.dumps([aot._cpu_flags(cfg("x86-64-v3")), aot._cpu_flags(cfg("x86-64-v2"))]))
    """)
    env = {**os.environ, "ATEN_CPU_CAPABILITY": "avx2"}
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert run.returncode == 0, run.stderr[-2000:]
    v3, v2 = json.loads(run.stdout.strip().splitlines()[-1])
    assert v3 == sorted(V3) and set(v3) <= set(HASWELL)
    assert "avx2" in v2 and "fma3" in v2 and "bmi2" not in v2


# ---- a damaged package -----------------------------------------------------------------------------------------

def _member(path: str, suffix: str) -> zipfile.ZipInfo:
    with zipfile.ZipFile(path) as z:
        return next(i for i in z.infolist() if i.filename.endswith(suffix))


def _flipped(path: str, suffix: str, offset: int) -> bytes:
    """The package's bytes with 64 bytes of the member flipped in place (the archive's CRC no longer matches)."""
    data = bytearray(open(path, "rb").read())
    info = _member(path, suffix)
    start = info.header_offset + 30 + len(info.filename.encode()) + len(info.extra) + offset
    for k in range(64):
        data[start + k] ^= 0xFF
    return bytes(data)


def _rebuilt(path: str, out: str, drop: str = None, replace: tuple = None) -> bytes:
    """The package rewritten whole (every CRC consistent) without the member ending in ``drop``, or with
    ``replace[0]``'s bytes replaced by ``replace[1](bytes)``."""
    with zipfile.ZipFile(path) as zin, zipfile.ZipFile(out, "w") as zout:
        for item in zin.infolist():
            data = zin.read(item.filename)
            if drop and item.filename.endswith(drop):
                continue
            if replace and item.filename.endswith(replace[0]):
                data = replace[1](data)
            zout.writestr(item, data)
    return open(out, "rb").read()


# case -> (the bytes, what the error names: a member ending, or None for the archive)
def _damaged(path: str, folder: str) -> dict:
    tmp = os.path.join(folder, "tmp.zip")
    data = open(path, "rb").read()
    return {
        "so_flipped": (_flipped(path, ".so", 4096), ".so"),
        "blob_flipped": (_flipped(path, ".blob", 16), ".blob"),
        "no_blob": (_rebuilt(path, tmp, drop=".blob"), ".blob"),
        "no_so": (_rebuilt(path, tmp, drop=".so"), ".so"),
        "so_truncated": (_rebuilt(path, tmp, replace=(".so", lambda b: b[:5000])), ".so"),
        "record_garbage": (_rebuilt(path, tmp, replace=("extra/" + aot.RECORD, lambda b: b"{not json")),
                           "extra/" + aot.RECORD),
        "file_truncated": (data[:-10], None),
        "manifest_bad_crc": (_rebuilt(path, tmp, replace=("extra/" + aot.FILES, lambda b: b"zzzzzzzz 12 foo\n")),
                             "extra/" + aot.FILES),
    }


@pytest.fixture(scope="module")
def damaged(weights_pkg, tmp_path_factory):
    folder = tmp_path_factory.mktemp("damaged")
    paths = {}
    for case, (data, member) in _damaged(weights_pkg, str(folder)).items():
        paths[case] = (str(folder / f"{case}.pt2"), member)
        with open(paths[case][0], "wb") as f:
            f.write(data)
    return paths


def test_a_damaged_package_is_refused_before_loading(damaged):
    """aot.load checks every file the package was written with (present, size, CRC-32) before loading its shared
    object: before, a flipped or truncated .so or a missing blob crashed the process (segfault, SIGBUS), a flipped
    blob computed garbage. One process tries each (a crash would end it: the test fails, not the session)."""
    script = textwrap.dedent(f"""
        import json, torch
        from fusegraph import aot
        for case, (path, _) in {damaged!r}.items():
            try:
                loaded = aot.load(path)
                out = loaded(torch.randn(3, 8))[0]
                result = "loaded and ran"
            except Exception as e:
                result = type(e).__name__ + ": " + str(e)
            print(json.dumps([case, result]), flush=True)
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ, OMP_NUM_THREADS="1"))
    results = dict(json.loads(line) for line in run.stdout.splitlines() if line.startswith("["))
    for case, (path, member) in damaged.items():
        assert case in results, f"{case}: the process ended (rc {run.returncode}) before it answered: " \
                                f"{run.stderr[-2000:]}"
        message = results[case]
        assert message.startswith("RuntimeError: ") and path in message, (case, message)
        assert "damaged" in message or "cut short" in message, (case, message)
        if member is not None:
            assert member in message, (case, message)


@pytest.mark.skipif(not os.path.exists(RUNNER), reason="build/fusegraph_aot_runner not built")
def test_the_runner_refuses_a_damaged_package(damaged, tmp_path):
    torch.save([torch.randn(3, 8)], tmp_path / "inputs.pt")
    for case, (path, member) in damaged.items():
        if case == "record_garbage":
            continue  # the runner reads the metadata compiled into the .so, not the record
        run = subprocess.run([RUNNER, path, str(tmp_path / "inputs.pt"), "--runs", "1"], capture_output=True,
                             text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"))
        assert run.returncode == 1, (case, run.returncode, run.stdout, run.stderr[-2000:])
        assert path in run.stderr and (member is None or member in run.stderr), (case, run.stderr)


def test_the_weights_crc_can_be_skipped(damaged, tmp_path):
    """check_weights=False (--no-weights-crc) leaves the blob's bytes unread: a flipped blob loads (and computes
    garbage), a missing one is still refused."""
    aot.load(damaged["blob_flipped"][0], check_weights=False)
    with pytest.raises(RuntimeError, match=r"its file \S+\.blob is missing"):
        aot.load(damaged["no_blob"][0], check_weights=False)
    if os.path.exists(RUNNER):
        torch.save([torch.randn(3, 8)], tmp_path / "in.pt")
        assert _runner(damaged["blob_flipped"][0], tmp_path / "in.pt", "--no-weights-crc").returncode == 0
        run = _runner(damaged["no_blob"][0], tmp_path / "in.pt", "--no-weights-crc")
        assert run.returncode == 1 and ".blob is missing" in run.stderr, run.stderr


def test_the_files_list_is_written_and_a_whole_package_passes(weights_pkg):
    with zipfile.ZipFile(weights_pkg) as z:
        listed = z.read(_member(weights_pkg, "extra/" + aot.FILES).filename).decode().split("\n")
        infos = {i.filename.rsplit("/", 1)[-1]: i for i in z.infolist()}
    entries = [line.split(" ", 2) for line in listed if line]
    names = {name for _, _, name in entries}
    assert any(n.endswith(".so") for n in names) and any(n.endswith(".blob") for n in names), names
    for crc, size, name in entries:
        assert (int(crc, 16), int(size)) == (infos[name].CRC, infos[name].file_size), name
    aot._check_files(weights_pkg)


# ---- the C++ runner --------------------------------------------------------------------------------------------

def _runner(*args, tmp_path=None):
    return subprocess.run([RUNNER, *map(str, args)], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))


@pytest.mark.skipif(not os.path.exists(RUNNER), reason="build/fusegraph_aot_runner not built")
def test_the_runner_compares_none_and_empty_outputs(weights_pkg, tmp_path):
    """The model returns (y, None, an empty tensor): the package gives an undefined tensor for the None, which an
    expected None matches (before: an expected list could not hold None, and an empty output crashed max())."""
    x = torch.randn(3, 8)
    with torch.no_grad():
        want = list(_model()(x))
    assert want[1] is None and want[2].numel() == 0
    torch.save([x], tmp_path / "in.pt")
    torch.save(want, tmp_path / "want.pt")
    run = _runner(weights_pkg, tmp_path / "in.pt", tmp_path / "want.pt", "--runs", "1")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "output 1: None, expected None" in run.stdout and "output 2 [3, 0]" in run.stdout, run.stdout
    torch.save([want[0], torch.zeros(3, 8), want[2]], tmp_path / "tensor.pt")
    run = _runner(weights_pkg, tmp_path / "in.pt", tmp_path / "tensor.pt", "--runs", "1")
    assert run.returncode == 1 and "output 1: None, expected a tensor  MISMATCH" in run.stdout, run.stdout + run.stderr
    torch.save([want[0] + 1, None, want[2]], tmp_path / "off.pt")
    run = _runner(weights_pkg, tmp_path / "in.pt", tmp_path / "off.pt", "--runs", "1")
    assert run.returncode == 1 and "MISMATCH" in run.stdout


@pytest.mark.skipif(not os.path.exists(RUNNER), reason="build/fusegraph_aot_runner not built")
@pytest.mark.parametrize("args,rc,message", [
    (["--rtol", "abc"], 2, "--rtol takes a number >= 0; got 'abc'"),
    (["--atol", "1e-5x"], 2, "--atol takes a number >= 0; got '1e-5x'"),
    (["--runs", "1.5"], 2, "--runs takes a whole number of runs >= 1; got '1.5'"),
    (["--runs", "abc"], 2, "--runs takes a whole number of runs >= 1; got 'abc'"),
    (["--runs", "0"], 2, "--runs takes a whole number of runs >= 1; got '0'"),
    (["--runs"], 2, "--runs needs a value"),
    (["--rots", "1"], 2, "unknown option '--rots'"),
])
def test_the_runner_names_a_bad_argument(weights_pkg, tmp_path, args, rc, message):
    torch.save([torch.randn(3, 8)], tmp_path / "in.pt")
    run = _runner(weights_pkg, tmp_path / "in.pt", *args)
    assert run.returncode == rc and message in run.stderr, (run.returncode, run.stderr)


@pytest.mark.skipif(not os.path.exists(RUNNER), reason="build/fusegraph_aot_runner not built")
def test_the_runner_names_a_bad_file(weights_pkg, tmp_path):
    torch.save([torch.randn(3, 8)], tmp_path / "in.pt")
    missing = str(tmp_path / "missing.pt2")
    run = _runner(missing, tmp_path / "in.pt")
    assert run.returncode == 1 and f"no package at {missing}" in run.stderr, run.stderr
    cut = tmp_path / "cut.pt2"
    cut.write_bytes(open(weights_pkg, "rb").read()[:100000])
    run = _runner(cut, tmp_path / "in.pt")
    assert run.returncode == 1 and f"{cut} is not a whole .pt2 package" in run.stderr, run.stderr
    run = _runner(weights_pkg, weights_pkg)  # the package given as INPUTS
    assert run.returncode == 1 and f"INPUTS {weights_pkg} is not a tensor or a list of tensors" in run.stderr, \
        run.stderr
    run = _runner(weights_pkg, tmp_path / "nothing.pt")
    assert run.returncode == 1 and f"INPUTS {tmp_path / 'nothing.pt'}: cannot open it" in run.stderr, run.stderr
    torch.save([torch.randn(3, 8), 3], tmp_path / "int.pt")
    run = _runner(weights_pkg, tmp_path / "in.pt", tmp_path / "int.pt")
    assert run.returncode == 1 and f"EXPECTED {tmp_path / 'int.pt'}: item 1 is a Int" in run.stderr, run.stderr


class _Tied(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.emb = torch.nn.Embedding(16, 8)
        self.head = torch.nn.Linear(8, 16, bias=False)
        self.head.weight = self.emb.weight  # one tensor under two names; the package holds one

    def forward(self, ids):
        return self.head(self.emb(ids) * 2)


def test_a_tied_weight_given_under_its_other_name_is_loaded(tmp_path):
    """A checkpoint that stores a tied weight once, under the name the package does not hold: loaded into the held
    one, as torch's load_state_dict copies into the shared tensor (same missing/unexpected keys as torch's)."""
    torch.manual_seed(0)
    model = _Tied().eval()
    ids = torch.tensor([0, 5, 11])
    loaded = aot.load(aot.package(model, (ids,), None, str(tmp_path / "tied.pt2")))
    held = loaded.weight_names()
    assert len(held) == 1
    other = "emb.weight" if held[0] == "head.weight" else "head.weight"
    new = {other: torch.randn(16, 8)}
    want = model.load_state_dict(new, strict=False)
    got = loaded.load_weights(new, strict=False)
    assert (sorted(got.missing_keys), sorted(got.unexpected_keys)) == \
        (sorted(want.missing_keys), sorted(want.unexpected_keys))
    with torch.no_grad():
        torch.testing.assert_close(loaded(ids), model(ids), rtol=0, atol=0)
