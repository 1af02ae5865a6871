"""fusegraph.explain and ``python -m fusegraph explain``: fused sites at their source lines, lookalikes and
uncovered forms reported as unfused with a reason, graph breaks, JSON, the command line.

Expected source lines are found by the ``# site:`` markers in this file, never written as numbers."""
import json
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

import fusegraph
from fusegraph.fusion import FAMILY_NAMES, passes


def line_of(marker: str) -> int:
    """The line of this file that carries ``# site: <marker>``."""
    with open(__file__) as f:
        hits = [i for i, text in enumerate(f, 1) if text.rstrip().endswith(f"# site: {marker}")]
    assert len(hits) == 1, (marker, hits)
    return hits[0]


def here(site) -> bool:
    return site.file is not None and os.path.abspath(site.file) == os.path.abspath(__file__)


# --- a DiT-like block: every family once, plus lookalikes and an RMSNorm form no pattern covers --------------


class DiffusersStyleRMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.randn(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)  # site: rms variance
        x = x * torch.rsqrt(variance + self.eps)  # site: rms rsqrt
        return x * self.weight  # site: rms out


class OwnLayerNorm(nn.Module):
    """A LayerNorm in a module of its own (as diffusers' FP32LayerNorm): its ops come from this file, the
    modulation after it from the caller's line."""

    def forward(self, x):
        return F.layer_norm(x, x.shape[-1:], None, None, 1e-6)  # site: own layer norm


def rope(x, cos, sin):
    x_real, x_imag = x.reshape(*x.shape[:-1], -1, 2).unbind(-1)  # site: rope pairs
    x_rotated = torch.stack([-x_imag, x_real], dim=-1).flatten(3)
    return (x.float() * cos + x_rotated.float() * sin).to(x.dtype)  # site: rope out


class Block(nn.Module):
    def __init__(self, dim=32, heads=2):
        super().__init__()
        self.heads = heads
        self.mod = nn.Linear(dim, 5 * dim)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False, eps=1e-6)
        self.qk = nn.Linear(dim, 2 * dim)
        self.q_norm = DiffusersStyleRMSNorm(dim // heads)
        self.k_norm = nn.RMSNorm(dim // heads, eps=1e-6)
        self.ff = nn.Linear(dim, dim)
        self.ff2 = nn.Linear(dim, dim)
        self.own_norm = OwnLayerNorm()

    def forward(self, x, temb, cos, sin):
        shift, scale, gate, shift2, scale2 = self.mod(temb).chunk(5, dim=-1)
        h = self.norm(x) * (1 + scale[:, None]) + shift[:, None]  # site: adaln
        B, S, D = h.shape
        q, k = self.qk(h).view(B, S, 2, self.heads, D // self.heads).unbind(2)
        q = rope(self.q_norm(q), cos, sin)  # site: q
        k = rope(self.k_norm(k), cos, sin)  # site: k
        a = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), k.transpose(1, 2))
        x = x + gate[:, None] * a.transpose(1, 2).reshape(B, S, D)  # site: gated residual
        y = F.gelu(self.ff(x), approximate="tanh")  # site: gelu
        z = F.gelu(self.ff2(y), approximate="none")  # site: erf gelu
        w = self.own_norm(z) * (2 + scale2[:, None]) + shift2[:, None]  # site: adaln lookalike
        v = w / torch.sqrt(w.pow(2).mean(-1, keepdim=True) + 1e-6)  # site: uncovered rms
        return x + v


def block_inputs(B=2, S=8, D=32, head_dim=16):
    return torch.randn(B, S, D), torch.randn(B, D), torch.randn(1, S, 1, head_dim), torch.randn(1, S, 1, head_dim)


@pytest.fixture(scope="module")
def block_report():
    torch.manual_seed(0)
    return fusegraph.explain(Block(), *block_inputs())


def lines(sites) -> list:
    return sorted(s.line for s in sites)


def test_fused_sites_point_at_their_source_lines(block_report):
    r = block_report
    assert all(here(s) for s in r.fused()), [s.source for s in r.fused()]
    assert lines(r.fused("adaln")) == [line_of("adaln")]
    assert lines(r.fused("gelu")) == [line_of("gelu")]
    # gated residual; the lookalike's x * (2 + scale) + shift is a plain mul+add and fuses as one
    assert lines(r.fused("mul_add")) == sorted([line_of("gated residual"), line_of("adaln lookalike")])
    # the RoPE function's last line, called from the q and k lines
    assert lines(r.fused("rope")) == [line_of("rope out")] * 2
    assert sorted(s.stack[-2].rsplit(" in ", 1)[0].rsplit(":", 1)[1] for s in r.fused("rope")) == \
        sorted(str(line_of(m)) for m in ("q", "k"))
    assert all(set(s.lines) >= {f"{__file__}:{line_of('rope pairs')}", f"{__file__}:{line_of('rope out')}"}
               for s in r.fused("rope"))
    # nn.RMSNorm: torch's own frames are skipped, the calling line is the source
    rms = sorted(r.fused("rms_norm"), key=lambda s: s.line)
    assert [s.line for s in rms] == [line_of("rms out"), line_of("k")]
    # a norm written over three lines reports all three
    assert rms[0].lines == [f"{__file__}:{line_of(m)}" for m in ("rms variance", "rms rsqrt", "rms out")]
    assert all(s.op.startswith("fusegraph.") and s.reason is None for s in r.fused())


def test_lookalikes_are_not_reported_fused(block_report):
    r = block_report
    assert line_of("adaln lookalike") not in lines(r.fused("adaln"))
    # erf-GELU is no candidate of the tanh-GELU family, fused or not
    assert not [s for s in r.sites if s.family == "gelu" and s.line == line_of("erf gelu")]
    [lookalike] = r.unfused("adaln")  # the norm's own line, called from the modulation's
    assert (lookalike.line, lookalike.op) == (line_of("own layer norm"), "var_mean")
    assert lookalike.stack[-2].startswith(f"{__file__}:{line_of('adaln lookalike')} in forward")
    assert "adaln form 'zero' matched but the exact re-check" in lookalike.reason


def test_uncovered_rms_norm_form_is_an_unfused_candidate_with_a_reason(block_report):
    [site] = block_report.unfused("rms_norm")
    assert here(site) and site.line == line_of("uncovered rms")
    assert site.reason.startswith("no registered rms_norm form fits the ops here") and "sqrt" in site.reason


def test_counts_table_and_json_round_trip(block_report, tmp_path):
    r = block_report
    counts = r.counts()
    assert counts == {f: {"fused": len(r.fused(f)), "unfused": len(r.unfused(f))} for f in FAMILY_NAMES}
    assert counts["rms_norm"] == {"fused": 2, "unfused": 1} and r.graphs == 1 and r.graph_breaks == []
    table = r.table()
    for s in r.sites:
        assert s.source in table
    assert "no registered rms_norm form fits the ops here" in table
    path = tmp_path / "report.json"
    text = r.to_json(path)
    assert json.loads(path.read_text()) == json.loads(text) == r.as_dict()
    back = fusegraph.ExplainReport.from_json(text)
    assert back == r and back.table() == table


def test_graph_breaks_are_listed_with_their_source_lines():
    def fn(x):
        x = torch.rms_norm(x, [x.shape[-1]], None, 1e-6)
        torch._dynamo.graph_break()  # site: explicit break
        y = F.gelu(x, approximate="tanh")
        if y.sum().item() > -1e30:  # site: item break
            y = y * 2
        return y

    r = fusegraph.explain(fn, torch.randn(2, 4, 8))
    assert [b.line for b in r.graph_breaks] == [line_of("explicit break"), line_of("item break")]
    assert all(b.reason and here(b) for b in r.graph_breaks)
    assert "graph_break" in r.graph_breaks[0].reason and "item" in r.graph_breaks[1].reason
    assert r.graphs == 3
    assert [s.family for s in r.fused()] == ["rms_norm", "gelu"] and [s.graph for s in r.fused()] == [0, 1]
    assert r.graph_breaks[0].reason.splitlines()[0] in r.table()


def test_shared_and_refused_candidates_and_disabled_families_have_reasons():
    def fn(x, w):
        v = x.pow(2).mean(-1, keepdim=True)
        n = x * torch.rsqrt(v + 1e-6) * w
        p = x * w
        y = p + x  # site: shared mul
        g = F.gelu(x.double(), approximate="tanh")  # site: float64 gelu
        ln = F.layer_norm(x, (8,), w, w)  # site: plain layer norm
        return n + v, y, p, g, F.gelu(x, approximate="tanh"), ln  # site: disabled gelu

    x, w = torch.randn(2, 4, 8), torch.randn(8)
    r = fusegraph.explain(fn, x, w, config={"fusion_patterns": {"enable_fast_gelu": False, "enable_linear": True}})
    assert r.enabled == ["adaln", "rope", "rms_norm", "adaln_rms", "adaln_noshift", "mul_add", "kv_attention", "gemv",
                         "linear"]
    [rms] = r.unfused("rms_norm")  # the variance is read outside the norm
    assert "users outside the site" in rms.reason
    assert {s.line: s.reason for s in r.unfused("gelu")} == {
        line_of("float64 gelu"): "the gelu family is disabled by the config",
        line_of("disabled gelu"): "the gelu family is disabled by the config"}
    [shared] = [s for s in r.unfused("mul_add") if s.line == line_of("shared mul")]
    assert "users outside the site" in shared.reason
    assert not r.fused("gelu")
    assert not r.unfused("adaln")  # a LayerNorm without modulation is no adaln site: listed, not counted
    [ln] = [s for s in r.sites if s.family == "adaln" and s.status == "no site"]
    assert ln.line == line_of("plain layer norm") and ln.reason.startswith("no modulation")
    assert r.counts()["adaln"] == {"fused": 0, "unfused": 0}


class Modulations(nn.Module):
    """The two modulation families beyond AdaLN: an RMSNorm with a shift, LayerNorm and RMSNorm without one,
    and an RMSNorm modulation whose (1 + scale) is also read elsewhere (fused: the modulation gets its own copy
    of the factor)."""

    def __init__(self, D=32):
        super().__init__()
        self.rms1, self.rms2, self.rms3 = (nn.RMSNorm(D, eps=1e-6) for _ in range(3))
        self.ln = nn.LayerNorm(D, elementwise_affine=False, eps=1e-6)

    def forward(self, x, emb):
        shift, scale, s2, s3 = emb.chunk(4, dim=-1)
        a = self.rms1(x) * (1 + scale[:, None]) + shift[:, None]  # site: rms modulation
        b = self.ln(a) * (1 + s2[:, None])  # site: layer norm no shift
        c = self.rms2(b) * (1 + s3)[:, None, :]  # site: rms no shift
        t = 1 + s2[:, None]
        d = self.rms3(c) * t + shift[:, None]  # site: shared scale
        return d, t * 2


def test_modulation_families_fused_and_unfused_with_reasons():
    # mul_add off: it would take the shared-scale site's `n * t + shift` as a plain a*b+c
    r = fusegraph.explain(Modulations(), torch.randn(2, 5, 32), torch.randn(2, 128),
                          config={"fusion_patterns": {"enable_mul_add": False}})
    assert lines(r.fused("adaln_rms")) == sorted([line_of("rms modulation"), line_of("shared scale")])
    assert lines(r.fused("adaln_noshift")) == sorted([line_of("layer norm no shift"), line_of("rms no shift")])
    assert all(s.op == "fusegraph.adaln" for s in r.fused("adaln_rms") + r.fused("adaln_noshift"))
    assert not r.fused("adaln") and not r.unfused("adaln") and not r.unfused("adaln_noshift")
    assert not r.unfused("adaln_rms")
    # the norms taken into a modulation are no rms_norm sites of their own
    assert not r.fused("rms_norm")
    counts = r.counts()
    assert counts["adaln_rms"] == {"fused": 2, "unfused": 0} and counts["adaln_noshift"] == {"fused": 2, "unfused": 0}
    assert "adaln_rms" in r.table() and "adaln_noshift" in r.table()


def test_refused_operands_are_described():
    def fn(x):
        gated = torch.tanh(x) * x  # a tanh gate (Mochi, Lumina2) is no GELU candidate
        return F.gelu(x, approximate="tanh"), gated  # site: fp64 gelu

    [site] = fusegraph.explain(fn, torch.randn(4, 8, dtype=torch.float64)).unfused("gelu")
    assert site.line == line_of("fp64 gelu") and site.op == "tanh"
    assert "the gelu check refused its operands (x: float64[4, 8])" in site.reason


def test_explain_leaves_the_model_and_dynamo_as_they_were():
    torch.manual_seed(1)
    model = Block()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    real = passes.fuse_graph
    fusegraph.explain(model, *block_inputs())
    assert passes.fuse_graph is real
    assert type(model) is Block and "forward" not in model.__dict__
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    from torch._dynamo.eval_frame import _debug_get_cache_entry_list

    assert _debug_get_cache_entry_list(Block.forward.__code__) == []


# --- command line ---------------------------------------------------------------------------------------


def test_cli_explains_a_zoo_flux_model(tmp_path, capsys):
    from diffusers.models.normalization import AdaLayerNormContinuous, AdaLayerNormZero, AdaLayerNormZeroSingle
    from diffusers.models.transformers.transformer_flux import FluxAttention

    from fusegraph import __main__ as cli
    from fusegraph import zoo

    path = tmp_path / "flux.json"
    assert cli.main(["explain", "--model", "FluxTransformer2DModel", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    report = json.loads(path.read_text())
    assert report["model"] == "FluxTransformer2DModel"
    # the sites the model's modules say are there (as in tests/fusion/test_models.py)
    model, _ = zoo.build("FluxTransformer2DModel")
    n = lambda cls: sum(isinstance(m, cls) for m in model.modules())  # noqa: E731
    inline = sum(isinstance(getattr(b, a, None), nn.LayerNorm) for b in model.transformer_blocks
                 for a in ("norm2", "norm2_context"))
    assert report["counts"]["rms_norm"]["fused"] == n(nn.RMSNorm)
    assert report["counts"]["rope"]["fused"] == 2 * n(FluxAttention)
    assert report["counts"]["adaln"]["fused"] == (n(AdaLayerNormZero) + n(AdaLayerNormZeroSingle)
                                                  + n(AdaLayerNormContinuous) + inline)
    fused = [s for s in report["sites"] if s["status"] == "fused"]
    assert all("diffusers" in s["file"] and s["line"] > 0 for s in fused)
    assert out.startswith("fusegraph explain: FluxTransformer2DModel: 1 graph, 0 graph breaks")
    assert "diffusers/models/embeddings.py" in out and f"wrote {path}" in out


def test_cli_unknown_model_is_a_clear_error(capsys):
    from fusegraph import __main__ as cli

    assert cli.main(["explain", "--model", "NoSuchTransformer"]) == 2
    err = capsys.readouterr().err
    assert "unknown model 'NoSuchTransformer'" in err and "FluxTransformer2DModel" in err


@pytest.mark.parametrize("where, why", [("missing/report.json", "No such file or directory"),
                                        (".", "Is a directory")])
def test_cli_unwritable_json_is_a_clear_error_before_the_report_runs(tmp_path, capsys, monkeypatch, where, why):
    """An unwritable ``--json`` path is refused in one line (the argument, the path, the OS's reason) with
    argparse's exit code, before the model is built or explained."""
    import sys

    from fusegraph import __main__ as cli
    from fusegraph import zoo

    explain_mod = sys.modules["fusegraph.explain"]
    ran = lambda *a, **k: pytest.fail("the report ran before --json was checked")  # noqa: E731
    monkeypatch.setattr(zoo, "build", ran)
    monkeypatch.setattr(explain_mod, "explain", ran)
    path = str(tmp_path / where)
    assert cli.main(["explain", "--model", "FluxTransformer2DModel", "--json", path]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err == f"python -m fusegraph explain: argument --json: cannot write {path!r}: {why}\n"


def test_cli_json_write_failure_after_the_report_is_one_line(tmp_path, capsys, monkeypatch):
    """A path writable when checked but gone when the report is written (its folder removed meanwhile): the table
    is printed, the failure is one line on stderr, exit code 1, no traceback. The check itself leaves no file."""
    import sys

    from fusegraph import __main__ as cli
    from fusegraph import zoo

    explain_mod = sys.modules["fusegraph.explain"]
    folder = tmp_path / "out"
    folder.mkdir()
    path = folder / "report.json"

    def explain_then_remove_the_folder(model, **kwargs):
        assert not path.exists()
        folder.rmdir()
        return explain_mod.ExplainReport(model="Stand-in", families=[], enabled=[])

    monkeypatch.setattr(zoo, "build", lambda name, dtype: (None, {}))
    monkeypatch.setattr(explain_mod, "explain", explain_then_remove_the_folder)
    assert cli.main(["explain", "--model", "FluxTransformer2DModel", "--json", str(path)]) == 1
    captured = capsys.readouterr()
    assert captured.out.startswith("fusegraph explain: Stand-in: 0 graphs")
    assert captured.err == (f"python -m fusegraph explain: argument --json: cannot write {str(path)!r}: "
                            "No such file or directory\n")


def test_cli_help_lists_explain(capsys):
    from fusegraph import __main__ as cli

    assert cli.main(["--help"]) == 0
    assert "explain --model" in capsys.readouterr().out


def test_layer_norm_before_an_erf_gelu_is_no_adaln_site():
    """ConsisID's feed-forward: LayerNorm -> Linear -> erf-GELU. The GELU's ``x * (1 + erf(...))`` reads the norm
    itself; it is no ``(1 + scale)`` modulation, so the norm is no missed adaln site."""
    lin = nn.Linear(8, 8)

    def fn(x):
        return F.gelu(lin(F.layer_norm(x, (8,))))

    r = fusegraph.explain(fn, torch.randn(2, 4, 8))
    assert not r.unfused("adaln")
    assert [s.status for s in r.sites if s.family == "adaln"] == ["no site"]
