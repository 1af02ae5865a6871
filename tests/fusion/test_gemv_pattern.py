"""gemv family: linear layers of a few rows with a large weight become fusegraph.gemv (decode projections) on
every route; more rows, small weights and the switch leave them alone; with enable_gemv="auto" (the default) only
at the dtypes and row counts the CPU class's table says the few-row kernel wins."""
import pytest
import torch
import torch.nn.functional as F

from fusegraph import Backend, CompilationConfig
from fusegraph.bench.decode import DecodeBlock, make_inputs
from fusegraph.graph import GraphRunner
from fusegraph.fusion import gemm_table
from fusegraph.graph.host import trace_fused

@pytest.fixture(autouse=True)
def _few_row_kernel_wins(request, monkeypatch):
    """The site rules below are the machine's business only through the table: pinned to "the few-row kernel wins"
    for them (on some CPU classes it loses at some row counts, tested with their own tables at the end)."""
    if request.function not in (test_auto_follows_the_class_table_per_dtype_and_row_count,
                                test_an_unmeasured_class_fuses_few_rows_where_its_architecture_does):
        monkeypatch.setattr(gemm_table, "gemv_lookup", lambda dtype, rows, key=None: ("fused", "pinned by the test"))


ROUTES = {"default": {}, "aten": dict(inductor=False), "graph_with_compile": dict(graph_with_compile=True)}


class Proj(torch.nn.Module):
    def __init__(self, k=512, n=384, bias=True, dtype=torch.float32):
        super().__init__()
        self.lin = torch.nn.Linear(k, n, bias=bias, dtype=dtype)

    def forward(self, x):
        return F.silu(self.lin(x))


def _counts(module, inputs, **opts):
    _, counts, _ = trace_fused(lambda *t: [module(*t)], list(inputs), CompilationConfig(**opts).fusion_patterns)
    return counts


@pytest.mark.parametrize("rows, k, n, bias, fused", [(1, 512, 384, True, 1), (1, 512, 384, False, 1),
                                                     (8, 512, 256, True, 1), (9, 512, 384, True, 0),
                                                     (1, 256, 256, True, 0), (2, 1024, 128, False, 1)])
def test_what_is_a_site(rows, k, n, bias, fused):
    torch.manual_seed(4)
    module = Proj(k, n, bias).eval()
    x = torch.randn(rows, k)
    assert _counts(module, [x])["gemv"] == fused
    with torch.no_grad():
        torch.testing.assert_close(GraphRunner(module)(x), module(x), rtol=1e-5, atol=1e-5)


def test_three_dim_input_and_bf16():
    torch.manual_seed(5)
    module = Proj(dtype=torch.bfloat16).eval()
    x = torch.randn(2, 1, 512, dtype=torch.bfloat16)
    assert _counts(module, [x])["gemv"] == 1
    with torch.no_grad():
        ref64 = F.silu(F.linear(x.double(), module.lin.weight.double(), module.lin.bias.double()))
        out, eager = GraphRunner(module)(x), module(x)
    err, err_eager = (out.double() - ref64).abs().max(), (eager.double() - ref64).abs().max()
    assert err <= 1.5 * err_eager + 1e-3, (err, err_eager)


@pytest.mark.parametrize("route", ROUTES)
def test_backend_routes(route):
    torch.manual_seed(6)
    module = Proj().eval()
    x = torch.randn(1, 512)
    torch._dynamo.reset()
    backend = Backend(CompilationConfig(**ROUTES[route]))
    fn = torch.compile(module, backend=backend)
    with torch.no_grad():
        torch.testing.assert_close(fn(x), module(x), rtol=1e-5, atol=1e-5)
    assert backend.stats.patterns["gemv"] == 1, backend.stats.patterns  # frozen or not, the weight is found
    assert backend.last_graph_ops["fusegraph.gemv.default"] == 1


def test_decode_block():
    block = DecodeBlock(hidden=512, heads=8, cache_len=16, batch=1, dtype=torch.float32).eval()
    inputs = make_inputs(block, 1, position=16, dtype=torch.float32)
    assert _counts(block, inputs)["gemv"] == 2  # the QKV projection and the output projection
    with torch.no_grad():
        torch.testing.assert_close(GraphRunner(block)(*inputs), block(*inputs), rtol=1e-5, atol=1e-5)


def test_switch_off_and_explain():
    from fusegraph import explain

    module, x = Proj().eval(), torch.randn(1, 512)
    assert _counts(module, [x], fusion_patterns={"enable_gemv": False})["gemv"] == 0
    torch._dynamo.reset()
    report = explain(module, x, config=CompilationConfig(fusion_patterns={"enable_gemv": False}))
    assert report.counts()["gemv"]["unfused"] == 1


def test_leading_dims_stay_whole():
    """F.linear on [B, 1, K] flattens to [B, K] and back around the mm: the gemv site takes and gives the 3-D
    tensors, without the two views."""
    torch.manual_seed(7)
    module = Proj().eval()
    x = torch.randn(2, 1, 512)
    fused, counts, _ = trace_fused(lambda t: [module(t)], [x], CompilationConfig().fusion_patterns)
    assert counts["gemv"] == 1
    targets = [n.target for n in fused.graph.nodes if n.op == "call_function"]
    assert not [t for t in targets if "view" in str(t) or "reshape" in str(t)], targets
    with torch.no_grad():
        torch.testing.assert_close(GraphRunner(module)(x), module(x), rtol=1e-5, atol=1e-5)


def _table(tmp_path, monkeypatch, classes):
    """``classes`` ({key: {dtype: entry}}) as the shipped GEMM table, no user calibration."""
    import json

    path = tmp_path / "gemm.json"
    path.write_text(json.dumps({"version": gemm_table.VERSION, "classes": classes, "meta": {}}))
    monkeypatch.setattr(gemm_table, "_SHIPPED", str(path))
    monkeypatch.setattr(gemm_table, "calibration_path", lambda: str(tmp_path / "none.json"))
    gemm_table.reload()


def test_auto_follows_the_class_table_per_dtype_and_row_count(tmp_path, monkeypatch):
    """"auto": a site of M rows takes the verdict of the smallest measured row count >= M for its dtype (AMX's
    bf16: the few-row kernel on 1-2 rows, ATen's matmul on 4-8); True fuses every site whatever the table."""
    from fusegraph._core import cpu_class

    key = cpu_class.key()
    _table(tmp_path, monkeypatch, {key: {"bfloat16": {"gemv": {"1": "fused", "2": "fused", "4": "aten", "8": "aten"}},
                                         "float32": {"gemv": {"1": "aten", "2": "aten", "4": "fused", "8": "fused"}}}})
    try:
        module = Proj(dtype=torch.bfloat16).eval()
        for rows, fused in ((1, 1), (2, 1), (3, 0), (8, 0)):
            x = torch.randn(rows, 512, dtype=torch.bfloat16)
            assert _counts(module, [x])["gemv"] == fused, rows
            assert _counts(module, [x], fusion_patterns={"enable_gemv": True})["gemv"] == 1, rows
        module = Proj().eval()
        for rows, fused in ((1, 0), (3, 1), (8, 1)):
            assert _counts(module, [torch.randn(rows, 512)])["gemv"] == fused, rows
        assert gemm_table.gemv_lookup(torch.bfloat16, 3) == ("aten", f"{key} bfloat16, 3 rows: measured for this class")
        module, x = Proj(dtype=torch.bfloat16).eval(), torch.randn(8, 512, dtype=torch.bfloat16)
        with torch.no_grad():
            torch.testing.assert_close(torch.compile(module, backend="fusegraph")(x), module(x))
    finally:
        gemm_table.reload()


def test_an_unmeasured_class_fuses_few_rows_where_its_architecture_does(tmp_path, monkeypatch):
    _table(tmp_path, monkeypatch, {
        "Vendor/avx2": {"float16": {"gemv": {"1": "fused", "8": "fused"}},
                        "bfloat16": {"gemv": {"1": "fused", "8": "aten"}}},
        "Vendor/avx512": {"float16": {"gemv": {"1": "fused", "8": "fused"}},
                          "bfloat16": {"gemv": {"1": "fused", "8": "fused"}}, "float32": {"kernel": "fused"}}})
    try:
        lookup = gemm_table.gemv_lookup
        assert lookup(torch.float16, 8, key="Other/amx")[0] == "fused"
        assert lookup(torch.bfloat16, 1, key="Other/amx")[0] == "fused"
        assert lookup(torch.bfloat16, 2, key="Other/amx")[0] == "aten"  # avx2 measured at 8 rows: aten
        assert lookup(torch.float32, 1, key="Other/amx") == (
            "aten", "Other/amx float32, 1 rows: class not measured, nor any x86 class (eager's kernel)")
        assert lookup(torch.bfloat16, 2, key="Vendor/avx512")[0] == "fused"  # its own entry
        # No verdict crosses architectures: ARM keeps eager's kernel where every x86 class fuses...
        assert lookup(torch.float16, 1, key="ARM/aarch64") == (
            "aten", "ARM/aarch64 float16, 1 rows: class not measured, nor any aarch64 class (eager's kernel)")
    finally:
        gemm_table.reload()
    # ... and follows the aarch64 classes measured, once there are some
    _table(tmp_path, monkeypatch, {"Vendor/avx2": {"float16": {"gemv": {"8": "aten"}}},
                                   "Ampere/aarch64": {"float16": {"gemv": {"8": "fused"}}}})
    try:
        assert gemm_table.gemv_lookup(torch.float16, 4, key="ARM/aarch64") == (
            "fused", "ARM/aarch64 float16, 4 rows: class not measured (every aarch64 class measured runs it fused)")
        assert gemm_table.gemv_lookup(torch.float16, 4, key="Other/amx")[0] == "aten"
    finally:
        gemm_table.reload()
