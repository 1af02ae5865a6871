"""Warm start across processes (the recipe in docs/GUIDE.md §2.5): fusegraph's default route compiles through
Inductor, so PyTorch's own caches carry it. A second process with the same ``TORCHINDUCTOR_CACHE_DIR`` is served
from Inductor's FX graph cache; ``torch.compiler.save_cache_artifacts()`` in one process and
``load_cache_artifacts()`` in another with an empty cache directory (another machine, a container) gives the same
FX graph cache hit. fusegraph keeps no cache of its own that a warm start needs (its per-graph report of what was
fused lives in the Inductor cache directory, ``fusegraph/counts``; without it the counts are unknown, nothing
else changes). Each process is a fresh interpreter (subprocess)."""
import json
import os
import subprocess
import sys

import torch

SCRIPT = r"""
import json, sys, torch, fusegraph
from torch._dynamo.utils import counters

mode, folder = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
dim = 48
model = torch.nn.Sequential(torch.nn.RMSNorm(dim, eps=1e-6), torch.nn.Linear(dim, 4 * dim),
                            torch.nn.GELU(approximate="tanh"), torch.nn.Linear(4 * dim, dim)).eval()
with torch.no_grad():
    torch.nn.init.uniform_(model[0].weight, 0.5, 1.5)
x = torch.randn(3, 40, dim, generator=torch.Generator().manual_seed(1))
if mode == "load":
    with open(folder + "/artifacts.bin", "rb") as f:
        torch.compiler.load_cache_artifacts(f.read())
backend = fusegraph.Backend(fusegraph.CompilationConfig())
compiled = torch.compile(model, backend=backend)
with torch.no_grad():
    out, want = compiled(x), model(x)
torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
torch.save(out, f"{folder}/out_{mode}.pt")
if mode == "save":
    artifacts = torch.compiler.save_cache_artifacts()
    assert artifacts is not None, "nothing to save"
    with open(folder + "/artifacts.bin", "wb") as f:
        f.write(artifacts[0])
print(json.dumps(dict(hits=counters["inductor"]["fxgraph_cache_hit"], misses=counters["inductor"]["fxgraph_cache_miss"],
                      compiled=backend.stats.graphs_compiled, fused=sum(backend.stats.patterns.values()))))
"""


def _process(mode: str, folder, cache_dir) -> dict:
    env = dict(os.environ, TORCHINDUCTOR_CACHE_DIR=str(cache_dir), OMP_NUM_THREADS="1")
    env.pop("TORCHINDUCTOR_FX_GRAPH_CACHE", None)
    proc = subprocess.run([sys.executable, "-c", SCRIPT, mode, str(folder)], env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, f"{mode}: {proc.stderr[-3000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_warm_start_from_the_cache_directory_and_from_cache_artifacts(tmp_path):
    first = _process("save", tmp_path, tmp_path / "cache_a")
    assert first["misses"] >= 1 and first["hits"] == 0 and first["fused"] >= 2, first

    same_dir = _process("same_dir", tmp_path, tmp_path / "cache_a")   # a second process, the same cache folder
    assert same_dir["hits"] >= 1 and same_dir["misses"] == 0, same_dir
    assert same_dir["fused"] == first["fused"], "the report of what was fused was not kept with the cache entry"

    loaded = _process("load", tmp_path, tmp_path / "cache_b")        # an empty folder + the saved artifacts
    assert loaded["hits"] >= 1 and loaded["misses"] == 0, loaded
    assert loaded["compiled"] == first["compiled"]

    out = torch.load(tmp_path / "out_save.pt")
    for mode in ("same_dir", "load"):
        assert torch.equal(torch.load(tmp_path / f"out_{mode}.pt"), out), f"{mode}: not the first process's result"
