"""Smoke tests of ``python -m fusegraph bench ops`` and ``python -m fusegraph demo`` at tiny shapes, plus
checks that their eager baselines are what diffusers really computes."""
import json
import mmap
import statistics
import sys
import types

import pytest
import torch

from fusegraph.__main__ import main as cli
from fusegraph.bench import demo, ops


def _run(argv, capsys):
    rc = cli(argv)
    return rc, capsys.readouterr().out


def test_bench_ops_quick_prints_table_and_json_for_every_op(tmp_path, capsys):
    path = tmp_path / "ops.json"
    rc, out = _run(["bench", "ops", "--quick", "--backend", "none", "--dtype", "fp32,bf16", "--json", str(path)], capsys)
    assert rc == 0, out
    for header in ops.HEADERS:
        assert header in out
    assert "torch " in out and "threads" in out  # machine summary
    result = json.loads(path.read_text())
    assert result["facts"]["torch"] == torch.__version__ and result["facts"]["date_utc"]
    rows = result["rows"]
    assert [(r["label"], r["dtype"]) for r in rows] == [(c.label, d) for c in ops.CASES for d in ("fp32", "bf16")]
    for r in rows:
        assert f"{r['label']} " in out
        assert r["eager_s"] > 0 and r["copy_s"] > 0 and r["copy_prealloc_s"] > 0 and r["bytes"] > 0, r
        assert r["fused_error"] is None, r
        assert r["fused_s"] > 0, r
        assert r["close"] is True and 0 <= r["max_abs_diff"] < 0.1, r
        assert r["fused_err64"] <= 2 * r["eager_err64"] + 1e-6, r  # not less accurate than eager


def test_bench_ops_quick_times_compiled_apart_from_its_compile(tmp_path, capsys):
    # backend "eager" (dynamo, no codegen) keeps this fast; the real bench uses Inductor, its default.
    path = tmp_path / "ops.json"
    rc, out = _run(["bench", "ops", "--quick", "--ops", "gelu_tanh", "--dtype", "fp32", "--backend", "eager",
                    "--json", str(path)], capsys)
    assert rc == 0, out
    (row,) = json.loads(path.read_text())["rows"]
    assert row["compiled_error"] is None, row
    assert row["compiled_s"] > 0 and row["compile_s"] > row["compiled_s"]
    assert row["compiled_max_abs_diff"] < 1e-5


def test_bench_ops_zoo_shapes_with_the_route_column(tmp_path, capsys):
    # --zoo: the zoo's tiny sizes; --route: the composition through fusegraph's default route, which must fuse it
    path = tmp_path / "ops.json"
    rc, out = _run(["bench", "ops", "--zoo", "--route", "--reps", "3", "--warmup", "1", "--ops", "mul_add",
                    "--dtype", "fp32", "--backend", "eager", "--json", str(path)], capsys)
    assert rc == 0, out
    (row,) = json.loads(path.read_text())["rows"]
    assert row["shape"] == list(ops.ZOO_SHAPES["mul_add"])
    assert row["route_error"] is None and row["route_fused"] == 1 and row["route_s"] > 0, row
    assert "fg route" in out and "route/comp" in out


def test_bench_ops_flags_a_wrong_fused_result(monkeypatch, tmp_path, capsys):
    case = next(c for c in ops.CASES if c.op == "gelu_tanh")
    wrong = ops.Case(case.op, case.label, case.shape, case.quick_shape, case.inputs, case.eager,
                     lambda x: torch.ops.fusegraph.fast_gelu(x))  # sigmoid form: off by up to ~0.02
    monkeypatch.setattr(ops, "CASES", [wrong])
    rc, out = _run(["bench", "ops", "--quick", "--backend", "none", "--dtype", "fp32", "--ops", "gelu_tanh"], capsys)
    assert rc == 1 and "WRONG" in out


@pytest.mark.parametrize("argv, word", [(["--ops", "softmax"], "--ops"), (["--dtype", "fp8"], "--dtype"),
                                        (["--threads", "0"], "--threads")])
def test_bench_ops_rejects_bad_arguments_by_name(argv, word, capsys):
    rc, out = _run(["bench", "ops", "--quick", "--backend", "none"] + argv, capsys)
    assert rc == 2 and word in out


def test_eager_baselines_match_diffusers():
    """The bench's 'eager' forms are diffusers' own code paths (exactly, same dtype)."""
    from diffusers.models.embeddings import apply_rotary_emb
    from diffusers.models.normalization import AdaLayerNormZeroSingle, RMSNorm

    x = torch.randn(2, 16, 64, dtype=torch.bfloat16)
    norm = RMSNorm(64, eps=ops.EPS).to(torch.bfloat16)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(64) * 0.1 + 1)
    torch.testing.assert_close(ops.rms_norm_diffusers_eager(x, norm.weight), norm(x), rtol=0, atol=0)

    q = torch.randn(1, 16, 2, 32, dtype=torch.bfloat16)
    cos, sin = ops.rope_tables(16, 32)
    torch.testing.assert_close(ops.rope_eager(q, cos, sin), apply_rotary_emb(q, (cos, sin), sequence_dim=1),
                               rtol=0, atol=0)
    from diffusers.models.transformers.transformer_minimax_h3 import _apply_rotary_emb

    q, cos, sin = ops.rope_partial_inputs((1, 16, 2, 32), torch.bfloat16, "cpu")
    torch.testing.assert_close(ops.rope_partial_eager(q, cos, sin), _apply_rotary_emb(q, cos, sin), rtol=0, atol=0)

    ada = AdaLayerNormZeroSingle(64)
    temb = torch.randn(2, 64)
    emb = ada.linear(ada.silu(temb))
    h, gate = ada(x.float(), emb=temb)
    torch.testing.assert_close(ops.adaln_eager(x.float(), emb), h, rtol=0, atol=0)
    y, res = torch.randn(2, 16, 64), torch.randn(2, 16, 64)
    torch.testing.assert_close(ops.mul_add_eager(res, y, emb), res + gate.unsqueeze(1) * y, rtol=0, atol=0)


def test_demo_eager_block_is_diffusers_flux_single_block():
    from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock

    cfg = demo.QUICK
    params, inputs = demo.make_params(cfg), demo.make_inputs(cfg)
    blk = FluxSingleTransformerBlock(cfg.hidden, cfg.heads, cfg.head_dim, mlp_ratio=cfg.mlp_ratio).double()
    with torch.no_grad():
        for mod, name in [(blk.norm.linear, "mod"), (blk.attn.to_q, "q"), (blk.attn.to_k, "k"),
                          (blk.attn.to_v, "v"), (blk.proj_mlp, "mlp"), (blk.proj_out, "out")]:
            mod.weight.copy_(params[f"{name}_w"])
            mod.bias.copy_(params[f"{name}_b"])
        blk.attn.norm_q.weight.copy_(params["norm_q"])
        blk.attn.norm_k.weight.copy_(params["norm_k"])
        x, temb, cos, sin = inputs["x"], inputs["temb"], inputs["cos"], inputs["sin"]
        _, expected = blk(x, x[:, :0], temb, image_rotary_emb=(cos, sin))
    torch.testing.assert_close(demo.block_eager(params, x, temb, cos, sin), expected)


def test_demo_quick_prints_errors_and_timings(tmp_path, capsys):
    path = tmp_path / "demo.json"
    rc, out = _run(["demo", "--quick", "--json", str(path)], capsys)
    assert rc == 0, out
    assert "fused vs fp64" in out and "fused block" in out
    result = json.loads(path.read_text())
    for dtype in ("fp32", "bf16"):
        err, t = result["results"]["accuracy"][dtype], result["results"]["timing"][dtype]
        assert err["fused_vs_fp64"] <= 2 * err["eager_vs_fp64"] + 1e-6, err
        assert 0 <= err["fused_vs_eager"] < (1e-4 if dtype == "fp32" else 0.25), err
        assert t["eager_s"] > 0 and t["fused_s"] > 0
    # the Flux section: the backend fused every site of the tiny model and matched eager
    flux = {row["variant"]: row for row in result["results"]["flux_compile"]["rows"]}
    assert set(flux) >= {"eager", "fusegraph_aten"}, flux.keys()
    expected = {"rms_norm": 12, "rope": 8, "adaln": 11, "gelu": 6}  # 2 double + 2 single blocks + norm_out
    for variant in ("fusegraph_aten", "fusegraph_graph"):
        if variant in flux:
            assert {k: flux[variant]["patterns"][k] for k in expected} == expected, flux[variant]
            assert flux[variant]["max_abs_diff"] < 1e-4 and flux[variant]["median_s"] > 0


def test_bench_zoo_prints_counts_and_times(tmp_path, capsys):
    import json

    from fusegraph.bench import zoo as bench_zoo

    path = tmp_path / "zoo.json"
    assert bench_zoo.main(["--models", "FluxTransformer2DModel", "--reps", "1", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "FluxT.2DModel" in out and "fg vs ind" in out
    row = json.loads(path.read_text())["rows"][0]
    # tiny Flux (2 double + 2 single blocks): every site fused, present = fused (nothing left unfused); it has
    # sites of every family but the two modulation families beyond AdaLN (RMSNorm / no-shift modulation) and the
    # decode-step families (no KV cache, no large few-row linear), nor float32 linears of 2^20 multiply-adds
    counts = row["counts"]
    none = ("adaln_rms", "adaln_noshift", "kv_attention", "gemv", "linear")
    assert all(c["unfused"] == 0 for c in counts.values()), counts
    assert all(c["fused"] > 0 for f, c in counts.items() if f not in none), counts
    assert all(counts[f]["fused"] == 0 for f in none), counts
    assert row["fusegraph_max_abs_diff"] < 1e-4 and row["eager_s"] > 0 and row["fusegraph_s"] > 0


def test_bench_zoo_rejects_unknown_models(capsys):
    from fusegraph.bench import zoo as bench_zoo

    assert bench_zoo.main(["--models", "NoSuchModel"]) == 2
    assert "NoSuchModel" in capsys.readouterr().err


def test_bench_calibrate_writes_a_table_the_cost_model_reads(tmp_path, capsys):
    import json

    from fusegraph.fusion.choice import CostModel

    path = tmp_path / "cost.json"
    assert cli(["bench", "calibrate", "--families", "gelu", "--dtypes", "fp32", "--sizes", "10,14",
                 "--out", str(path)]) == 0
    out = capsys.readouterr().out
    assert "gelu" in out and "ratio" in out
    data = json.loads(path.read_text())
    from fusegraph._core import cpu_class

    assert list(data["tables"]) == [f"cpu@{cpu_class.key()}"]  # kept under this CPU class
    points = data["tables"][f"cpu@{cpu_class.key()}"]["1"]["gelu"]["float32"]
    assert [p[0] for p in points] == [10.0, 14.0] and all(r > 0 and us > 0 for _, r, us in points)
    model = CostModel(data["tables"], str(path))
    ratio, fused_us = model.predict("gelu", torch.device("cpu"), torch.float32, 2 ** 12, threads=1)
    assert ratio is not None and points[0][2] <= fused_us <= points[1][2]


def test_bench_calibrate_rejects_bad_arguments(capsys):
    for argv in (["--dtypes", "fp8"], ["--families", "conv"], ["--sizes", "a,b"], ["--sizes", "40"]):
        with pytest.raises(SystemExit):
            cli(["bench", "calibrate", *argv])
    err = capsys.readouterr().err
    assert "--dtypes" in err and "--families" in err and "--sizes" in err


def test_bench_model_decode_mlp_graph_runner(capsys):
    assert cli(["bench", "model", "--model", "decode_mlp", "--variants", "eager,graph_runner", "--reps", "3",
                 "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "graph_runner" in out and "rms_norm×8 gelu×8 mul_add×8" in out


def test_bench_overhead_runs(capsys):
    assert cli(["bench", "overhead", "--layers", "3", "--rounds", "2", "--calls", "2"]) == 0
    out = capsys.readouterr().out
    assert "GraphRunner (no Dynamo)" in out and "per call through torch.compile" in out


@pytest.mark.parametrize("argv, needle", [(["--tokens", "x"], "--tokens"), (["--tokens", "0,4"], "positive"),
                                          (["--model", "nope"], "--model")])
def test_bench_real_argument_errors_name_the_argument(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["bench", "real", *argv])
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_bench_real_builds_published_widths_and_runs_a_variant():
    """LTX-Video, the smallest of them: its published widths (hidden 2048 = 32 x 64, caption 4096), one variant's
    row from this process (the command runs each in a process of its own)."""
    from fusegraph.bench import real

    model, kw, summary = real.build("ltx", torch.bfloat16, img_tokens=4, txt_tokens=4)
    block = model.transformer_blocks[0]
    assert block.attn1.to_q.weight.shape == (2048, 2048) and model.caption_projection.linear_1.in_features == 4096
    assert "2048 = 32 x 64" in summary
    row = real.run_variant("ltx", "eager", "bf16", 4, 4, 1, 1, 1)
    assert row["max_diff"] == 0 and row["median_s"] > 0 and row["weights_mib"] > 300  # 2 blocks: 177 M parameters
    assert row["faults_per_call"] >= 0


def test_bench_real_device_arguments(capsys):
    """--device cuda: OpenVINO named as CPU only; without a CUDA device, said so (not a crash deep in a variant)."""
    with pytest.raises(SystemExit) as e:
        cli(["bench", "real", "--device", "cuda", "--variants", "eager;openvino"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and "openvino runs on the CPU only" in err and "--variants" in err
    if not torch.cuda.is_available():
        with pytest.raises(SystemExit) as e:
            cli(["bench", "real", "--device", "cuda", "--variants", "eager"])
        err = capsys.readouterr().err
        assert e.value.code == 2 and "--device" in err and "no CUDA device" in err


@pytest.mark.parametrize("argv, needle", [(["--interleave", "1"], "got 1"), (["--interleave", "-2"], "got -2"),
                                          (["--interleave-only"], "needs --interleave")])
def test_bench_real_interleave_arguments(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["bench", "real", *argv])
    err = capsys.readouterr().err
    assert e.value.code == 2 and argv[0] in err and needle in err


def test_bench_real_interleaved_rotates_the_order_and_times_every_variant(monkeypatch):
    """run_interleaved: each variant compiled and warmed once (3 calls; OpenVINO first), then one call per round,
    the order rotated every round; medians are of each variant's own calls. A tiny model stands in for the
    published widths."""
    from fusegraph.bench import real

    model = torch.nn.Linear(8, 8)
    calls = []
    clock = [0.0]  # a fake perf_counter each call advances by its variant's cost: no timing on a busy machine

    def make_fn(m, inputs, dtype, variant, threads, shared=False):
        assert m is model and shared  # every variant runs the one model

        def fn(**kw):
            calls.append(variant)
            clock[0] += {"a": 0.001, "b": 0.004, "openvino": 0.002}[variant] * (1 + 0.1 * len(calls) % 3)
            if variant == "b":  # a call that touches 64 MiB the process did not hold: faults, every call
                with mmap.mmap(-1, 64 << 20) as fresh:
                    fresh[::mmap.PAGESIZE] = b"\1" * ((64 << 20) // mmap.PAGESIZE)
            return (m(kw["input"]),)
        return fn

    monkeypatch.setattr(real, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(real, "build", lambda *a, **k: (model, {"input": torch.randn(2, 8)}, "tiny"))
    monkeypatch.setattr(real, "_make_fn", make_fn)
    res = real.run_interleaved("flux", ["a", "b", "openvino"], "fp32", 4, 4, 1, 4, 1)
    assert calls[:9] == ["openvino"] * 3 + ["a"] * 3 + ["b"] * 3  # OpenVINO converts before any compile
    assert res["order"] == [["a", "b", "openvino"], ["b", "openvino", "a"], ["openvino", "a", "b"],
                            ["a", "b", "openvino"]]
    assert calls[9:] == [v for order in res["order"] for v in order]
    assert {v: len(t) for v, t in res["times_s"].items()} == {"a": 4, "b": 4, "openvino": 4}
    assert res["median_s"] == pytest.approx({v: statistics.median(t) for v, t in res["times_s"].items()})
    assert res["median_s"]["a"] < res["median_s"]["openvino"] < res["median_s"]["b"]
    # each variant's first call (its compile) timed on its own, and what the process grew by over its warm-up
    assert res["first_s"]["a"] < res["first_s"]["openvino"] < res["first_s"]["b"]
    assert set(res["memory_mib"]) == {"a", "b", "openvino"}
    # minor page faults per call: the fresh 64 MiB mapping's pages (32 even if all were 2 MiB huge pages)
    faults = res["faults_per_call"]
    assert faults["b"] >= 32 and faults["b"] > faults["a"], faults


def test_bench_real_interleaved_times_the_others_when_one_variant_fails(monkeypatch):
    """A variant that cannot run on this machine (OpenVINO's bf16 under the AVX2 caps: 'Supported primitive
    descriptors list is empty') is named with its error and left out; the others are still timed."""
    from fusegraph.bench import real

    model = torch.nn.Linear(8, 8)
    calls = []

    def make_fn(m, inputs, dtype, variant, threads, shared=False):
        def fn(**kw):
            calls.append(variant)
            if variant == "openvino":
                raise RuntimeError("Exception from src/inference/src/cpp/core.cpp:117:\nException from src/plugins/"
                                   "intel_cpu/src/node.cpp:1:\nSupported primitive descriptors list is empty for "
                                   "node: Softmax_1\n")
            return (m(kw["input"]),)
        return fn

    monkeypatch.setattr(real, "build", lambda *a, **k: (model, {"input": torch.randn(2, 8)}, "tiny"))
    monkeypatch.setattr(real, "_make_fn", make_fn)
    res = real.run_interleaved("flux", ["a", "openvino", "b"], "bf16", 4, 4, 1, 3, 1)
    assert res["failed"] == {"openvino": "RuntimeError: Supported primitive descriptors list is empty for node: "
                                         "Softmax_1"}
    assert calls.count("openvino") == 1 and "openvino" not in res["median_s"] and "openvino" not in res["first_s"]
    assert res["order"] == [["a", "b"], ["b", "a"], ["a", "b"]]
    assert {v: len(t) for v, t in res["times_s"].items()} == {"a": 3, "b": 3}


def test_bench_real_openvino_gives_the_shared_model_its_dtype_back_when_it_fails(monkeypatch):
    """OpenVINO's bf16 row casts the shared model to fp32 to convert it; when its compile fails (bf16 under the
    AVX2 caps) the model is bf16 again for the variants after it, as after a conversion that succeeds."""
    from fusegraph.bench import real

    def compile_model(ov_model, device, config):
        assert config["INFERENCE_PRECISION_HINT"] == "bf16"
        raise RuntimeError("Supported primitive descriptors list is empty for node: Softmax_1")

    fake = types.SimpleNamespace(convert_model=lambda module, example_input=None: module, compile_model=compile_model)
    monkeypatch.setitem(sys.modules, "openvino", fake)
    model = torch.nn.Linear(8, 8).to(torch.bfloat16)
    inputs = {"input": torch.randn(2, 8, dtype=torch.bfloat16)}
    fn = real._make_fn(model, inputs, torch.bfloat16, "openvino", 1, shared=True)
    assert model.weight.dtype == torch.float32  # cast for the conversion
    with pytest.raises(RuntimeError, match="primitive descriptors"):
        fn(**inputs)
    assert model.weight.dtype == torch.bfloat16
    assert model(**inputs).dtype == torch.bfloat16


def test_bench_real_fusegraph_variants_take_compile_options_by_name(monkeypatch):
    """'fusegraph:NAME=VALUE,...' sets CompilationConfig and FusionPatterns fields (and Inductor options) as
    torch.compile(options=...) does; mode= is torch.compile's mode; an unknown name raises naming it."""
    import fusegraph
    from fusegraph.bench import real

    seen = []
    monkeypatch.setattr(fusegraph, "Backend", lambda config: seen.append(config) or "backend")
    monkeypatch.setattr(torch, "compile", lambda model, backend=None, mode=None, dynamic=None: (backend, mode, dynamic))
    model = torch.nn.Linear(2, 2)
    assert real._make_fn(model, {}, torch.float32, "fusegraph:enable_linear=True,cpp_wrapper=False,"
                         "mode=reduce-overhead,max_autotune_gemm=False", 1) == ("backend", "reduce-overhead", None)
    (config,) = seen
    assert config.fusion_patterns.enable_linear is True and config.cpp_wrapper is False
    assert config.inductor_options == {"max_autotune_gemm": False}
    assert real._make_fn(model, {}, torch.float32, "fusegraph:dynamic=True", 1) == ("backend", None, True)
    with pytest.raises(ValueError, match="unknown option 'no_such_field'"):
        real._make_fn(model, {}, torch.float32, "fusegraph:no_such_field=1", 1)


def test_bench_real_interleave_prints_a_second_table(tmp_path, capsys):
    """End to end at LTX-Video widths, 4 + 4 tokens, eager only: the per-process row, then the interleaved
    process's table, both in the JSON."""
    out_json = tmp_path / "r.json"
    assert cli(["bench", "real", "--model", "ltx", "--dtype", "bf16", "--tokens", "4,4", "--variants", "eager",
                "--reps", "1", "--interleave", "2", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "interleaved: eager in one process, 2 rounds" in out and "per round" in out and "first call" in out
    data = json.loads(out_json.read_text())
    assert [r["variant"] for r in data["rows"]] == ["eager"]
    assert data["interleaved"]["order"] == [["eager"], ["eager"]] and data["interleaved"]["median_s"]["eager"] > 0
    assert data["interleaved"]["first_s"]["eager"] > 0 and data["device"] == "cpu"
    assert cli(["bench", "real", "--model", "ltx", "--dtype", "bf16", "--tokens", "4,4", "--variants", "eager",
                "--interleave", "2", "--interleave-only", "--json", str(out_json)]) == 0
    out = capsys.readouterr().out
    assert "interleaved: eager" in out and "resident +" not in out and json.loads(out_json.read_text())["rows"] == []


@pytest.mark.parametrize("argv, needle", [(["--models", "nope"], "--models"), (["--modes", "partial"], "--modes"),
                                          (["--threads", "0"], "--threads")])
def test_bench_compile_argument_errors_name_the_argument(argv, needle, capsys):
    with pytest.raises(SystemExit) as e:
        cli(["bench", "compile", *argv])
    assert e.value.code == 2 and needle in capsys.readouterr().err


def test_bench_compile_times_a_regional_first_call():
    """One variant's first call in this process, regional (diffusers' compile_repeated_blocks with fusegraph)."""
    from fusegraph.bench import compile as bench_compile

    torch._dynamo.reset()
    assert bench_compile.first_call("tiny_flux", "regional", "fusegraph", "fp32") > 0
    torch._dynamo.reset()


def test_bench_gemm_compares_both_kernels_and_says_what_the_pass_does(tmp_path, capsys):
    import json

    from fusegraph.fusion.patterns import linear

    path = tmp_path / "gemm.json"
    assert cli(["bench", "gemm", "--quick", "--dtype", "fp32,bf16", "--json", str(path)]) == 0
    out = capsys.readouterr().out
    assert "fusegraph.linear" in out and "linear family rule" in out
    data = json.loads(path.read_text())
    assert data["rule"][0] is linear.machine_rule()[0]
    rows = data["results"]
    assert {r["dtype"] for r in rows} == {"torch.float32", "torch.bfloat16"}
    for r in rows:
        assert min(r["median_s"].values()) > 0 and max(r["max_err_vs_float64"].values()) < 0.05
        expected = "linear" if linear.machine_rule(getattr(torch, r["dtype"].split(".")[1]))[0] else "addmm"
        assert r["route"] == expected, r
    assert cli(["bench", "gemm", "--dtype", "fp8"]) == 2  # one line naming the argument, no traceback
    assert "bench gemm: error: --dtype: unknown dtype 'fp8'" in capsys.readouterr().err


def test_variant_overrides_take_python_values_and_every_field():
    """fusegraph:NAME=VALUE,...: ints, floats, None and tuples as written (an int field given '4' raised), strings
    otherwise; CompilationConfig and FusionPatterns fields and mode= alike for bench real and bench compile."""
    from fusegraph.bench.real import _overrides, fusegraph_compile_args

    assert _overrides("graph_max_entries=4,inductor=False,gelu_approximation=sigmoid,graph_batch_buckets=(1, 2, 4)") \
        == {"graph_max_entries": 4, "inductor": False, "gelu_approximation": "sigmoid", "graph_batch_buckets": (1, 2, 4)}
    args = fusegraph_compile_args("mode=reduce-overhead,graph_max_entries=4,enable_linear=False")
    assert args["mode"] == "reduce-overhead"
    config = args["backend"].config
    assert config.graph_max_entries == 4 and config.fusion_patterns.enable_linear is False
    assert args["dynamic"] is None and fusegraph_compile_args("dynamic=True")["dynamic"] is True
    with pytest.raises(SystemExit, match="variant option 'dynamic' is 'yes'; expected True or False"):
        fusegraph_compile_args("dynamic=yes")


@pytest.mark.parametrize("argv, needle", [
    (["bench", "ops", "--quick", "--device", "foo"], "--device: 'foo' is not a device"),
    (["bench", "ops", "--quick", "--reps", "0"], "--reps: expected a positive integer, got 0"),
    (["bench", "decode", "--reps", "0"], "--reps: expected a positive integer, got 0"),
    (["bench", "gemm", "--threads", "0"], "--threads: 0; expected a positive integer"),
    (["bench", "decode", "--hidden", "100", "--heads", "8", "--device", "cpu"], "not a multiple of heads"),
    (["bench", "calibrate", "--threads", "0"], "--threads: 0; expected a positive integer"),
    (["bench", "nosuch"], "unknown subject 'nosuch'"),
])
def test_bad_command_lines_are_one_line_not_a_traceback(argv, needle, capsys):
    try:
        rc = cli(argv)
    except SystemExit as e:  # argparse's own errors
        rc = e.code
    captured = capsys.readouterr()
    assert rc == 2 and needle in captured.out + captured.err and "Traceback" not in captured.err, captured
