"""`python -m fusegraph bench model`: runs end to end on a tiny model and reports what the table promises."""
import json

from fusegraph.__main__ import main


def test_bench_model_sd3_json(tmp_path, capsys):
    path = tmp_path / "sd3.json"
    rc = main(["bench", "model", "--model", "sd3", "--variants", "eager,fusegraph_aten", "--reps", "1",
               "--threads", "1", "--json", str(path)])
    assert rc == 0
    out = capsys.readouterr().out
    assert "fusegraph_aten" in out and "vs eager" in out
    data = json.loads(path.read_text())
    rows = {r["variant"]: r for r in data["rows"]}
    assert set(rows) == {"eager", "fusegraph_aten"}
    fused = rows["fusegraph_aten"]
    assert fused["patterns"]["gelu"] > 0 and fused["patterns"]["mul_add"] > 0
    assert fused["max_abs_diff"] < 1e-4 and fused["median_s"] > 0 and fused["compile_s"] > 0
