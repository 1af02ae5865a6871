"""The installed fusegraph works, away from the checkout (scripts/check_wheel.sh runs this from a temporary
folder in a fresh venv; scripts/device_check.sh with --cuda). Usage: python smoke.py REPO_ROOT [--cuda]

1. torch.compile(model, backend="fusegraph") by name before anything imported fusegraph: Dynamo finds the
   backend through the wheel's torch_dynamo_backends entry point; output as eager's.
2. fusegraph is the installed copy (not the checkout), its extension and package data are there.
3. the fused ops, through torch.ops.fusegraph and fusegraph.ops, against float64 references (--cuda: the
   extension has its CUDA kernels, and the ops run on the GPU too).
"""
import math
import sys
from importlib.metadata import requires
from pathlib import Path

import torch
import torch.nn.functional as F

repo = Path(sys.argv[1]).resolve()
devices = ["cpu", "cuda"] if sys.argv[2:] == ["--cuda"] else ["cpu"]
assert "fusegraph" not in sys.modules


class Block(torch.nn.Module):
    def __init__(self, dim=64):
        super().__init__()
        self.norm = torch.nn.RMSNorm(dim, eps=1e-6)
        self.fc = torch.nn.Linear(dim, 4 * dim)
        self.out = torch.nn.Linear(4 * dim, dim)

    def forward(self, x):
        return x + self.out(F.gelu(self.fc(self.norm(x)), approximate="tanh"))


torch.manual_seed(0)
model = Block().eval()
x = torch.randn(2, 16, 64)
with torch.no_grad():
    expected = model(x)
    got = torch.compile(model, backend="fusegraph")(x)
torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-4)

import fusegraph  # noqa: E402  (loaded above by Dynamo through the entry point)
from fusegraph.backend import fusegraph_backend  # noqa: E402

matched = {k: v for k, v in fusegraph_backend.stats.patterns.items() if v}
assert matched, f"backend by name fused nothing: {fusegraph_backend.stats.patterns}"
print(f"torch.compile(backend='fusegraph') by name: matches eager; sites {matched}")

package = Path(fusegraph.__file__).resolve().parent
assert repo not in package.parents, f"fusegraph imported from the checkout: {package}"
assert Path(fusegraph._C.__file__).parent == package, fusegraph._C.__file__
assert (package / "_C.pyi").is_file() and (package / "fusion" / "cost_cpu.json").is_file()
# the ops library _C binds (C++ programs link it to run fused AOT packages), installed beside _C
assert (package / "libfusegraph_ops.so").is_file(), sorted(p.name for p in package.iterdir())
assert not (package.parent / "tests").exists(), "tests installed into site-packages"
torch_req = [r for r in requires("fusegraph") if r.startswith("torch")]
major_minor = ".".join(torch.__version__.split("+")[0].split(".")[:2])
assert torch_req == [f"torch=={major_minor}.*"], torch_req
print(f"installed: {package} (requires {torch_req[0]})")


def check(name, got, ref64, tol=2e-6):
    err = (got.double().cpu() - ref64).abs().max().item()
    assert err <= tol * max(1.0, ref64.abs().max().item()), f"{name}: max error {err}"
    print(f"  {name:28s} max|err| vs float64 {err:.2e}")


def rms64(t):
    return t * torch.rsqrt(t.pow(2).mean(-1, keepdim=True) + 1e-6)


if "cuda" in devices:
    assert fusegraph._C.has_cuda_kernels(), "fusegraph._C was built without CUDA kernels"
for dev in devices:
    x = torch.randn(4, 33, 96)
    w = torch.randn(96)
    scale, shift, gate = torch.randn(3, 4, 1, 96).unbind(0)
    q = torch.randn(2, 3, 8, 16)
    ang = torch.randn(8, 16)
    cos, sin = ang.cos(), ang.sin()
    x64, w64, q64 = x.double(), w.double(), q.double()
    x, w, scale, shift, gate, q, cos, sin = (t.to(dev) for t in (x, w, scale, shift, gate, q, cos, sin))
    check(f"{dev} torch.ops.fusegraph.rms_norm", torch.ops.fusegraph.rms_norm(x, w, 1e-6), rms64(x64) * w64)
    check(f"{dev} ops.rms_norm", fusegraph.ops.rms_norm(x, w, eps=1e-6), rms64(x64) * w64)
    ln64 = F.layer_norm(x64, (96,), eps=1e-6)
    check(f"{dev} ops.adaln", fusegraph.ops.adaln(x, scale, shift),
          ln64 * (1 + scale.double().cpu()) + shift.double().cpu())
    check(f"{dev} ops.gelu_tanh", fusegraph.ops.gelu_tanh(x),
          0.5 * x64 * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x64 + 0.044715 * x64.pow(3)))))
    check(f"{dev} ops.mul_add", fusegraph.ops.mul_add(gate, x, w), w64 + gate.double().cpu() * x64)
    rot64 = torch.stack([-q64[..., 1::2], q64[..., 0::2]], dim=-1).flatten(-2)  # interleaved pairs
    check(f"{dev} ops.rope", fusegraph.ops.rope(q, cos, sin), q64 * cos.double().cpu() + rot64 * sin.double().cpu())
print("smoke: ok")
