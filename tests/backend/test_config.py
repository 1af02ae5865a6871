"""CompilationConfig (SPEC §1.1): seed-style class defaults, instance overrides, aliases, validation, snapshot."""
import copy

import pytest
import torch

from fusegraph import Backend, CompilationConfig, FusionPatterns


@pytest.fixture(autouse=True)
def _restore_defaults():
    """Tests change process-wide defaults; put them back."""
    saved = copy.deepcopy(CompilationConfig._defaults), copy.deepcopy(FusionPatterns._defaults)
    saved[0]["fusion_patterns"] = FusionPatterns
    yield
    CompilationConfig._defaults.clear()
    CompilationConfig._defaults.update(saved[0])
    FusionPatterns._defaults.clear()
    FusionPatterns._defaults.update(saved[1])


SPEC_DEFAULTS = dict(graph_only=False, graph_with_compile=False, graph_lazy_capture=False, graph_max_entries=0,
                     graph_eviction="fifo", graph_memory_budget=0, graph_recapture=True, graph_warmup_runs=1,
                     graph_fallback="eager", device_graph="auto", safe_output_mode=True,
                     enable_freezing=False,  # no route folds parameters (config.py says why)
                     inductor=True, graph_log_url=None)
SPEC_PATTERN_DEFAULTS = dict(enable_rms_norm=True, enable_rope=True, enable_adalayernorm=True, enable_fast_gelu=True,
                             enable_mul_add=True, gelu_approximation="tanh")
ALIASES = dict(aclgraph_only="graph_only", aclgraph_with_compile="graph_with_compile",
               aclgraph_lazy_capture="graph_lazy_capture", aclgraph_max_entries="graph_max_entries")


def test_defaults_match_spec_on_class_and_instance():
    cfg = CompilationConfig()
    for name, value in SPEC_DEFAULTS.items():
        assert getattr(CompilationConfig, name) == value, name
        assert getattr(cfg, name) == value, name
    for name, value in SPEC_PATTERN_DEFAULTS.items():
        assert getattr(CompilationConfig.fusion_patterns, name) == value, name
        assert getattr(cfg.fusion_patterns, name) == value, name


def test_seed_style_class_default_applies_to_later_instances_only():
    before = CompilationConfig()
    CompilationConfig.graph_with_compile = True
    assert CompilationConfig().graph_with_compile is True
    assert before.graph_with_compile is False


def test_instance_override_leaves_process_defaults_alone():
    cfg = CompilationConfig(graph_with_compile=True, graph_max_entries=4)
    assert (cfg.graph_with_compile, cfg.graph_max_entries) == (True, 4)
    assert CompilationConfig.graph_with_compile is False and CompilationConfig.graph_max_entries == 0
    cfg.graph_eviction = "lru"
    assert CompilationConfig().graph_eviction == "fifo"


@pytest.mark.parametrize("alias,name", sorted(ALIASES.items()))
def test_alias_reads_and_writes_the_same_value(alias, name):
    value = 7 if name == "graph_max_entries" else True
    setattr(CompilationConfig, alias, value)
    assert getattr(CompilationConfig, name) == value and getattr(CompilationConfig, alias) == value
    cfg = CompilationConfig(**{alias: value})
    assert getattr(cfg, name) == value
    setattr(cfg, name, 0 if name == "graph_max_entries" else False)
    assert getattr(cfg, alias) == getattr(cfg, name)


def test_fusion_patterns_class_default_and_overrides():
    CompilationConfig.fusion_patterns.enable_rope = False
    assert FusionPatterns.enable_rope is False
    assert CompilationConfig().fusion_patterns.enable_rope is False
    CompilationConfig.fusion_patterns.enable_rope = True
    cfg = CompilationConfig(fusion_patterns={"enable_rope": False, "gelu_approximation": "sigmoid"})
    assert cfg.fusion_patterns.enable_rope is False and cfg.fusion_patterns.gelu_approximation == "sigmoid"
    assert cfg.fusion_patterns.enable_mul_add is True  # the rest from the defaults
    fp = FusionPatterns(enable_mul_add=False)
    cfg2 = CompilationConfig(fusion_patterns=fp)
    fp.enable_mul_add = True  # the config holds its own copy
    assert cfg2.fusion_patterns.enable_mul_add is False
    CompilationConfig.fusion_patterns = {"enable_rms_norm": False}
    assert CompilationConfig().fusion_patterns.enable_rms_norm is False
    # the class-level field is still FusionPatterns after a whole assignment: the attribute form keeps working
    assert CompilationConfig.fusion_patterns is FusionPatterns
    CompilationConfig.fusion_patterns.enable_rms_norm = True
    assert CompilationConfig().fusion_patterns.enable_rms_norm is True


def test_enabled_families_in_pass_order():
    fp = FusionPatterns(enable_rope=False, enable_linear=True)
    assert fp.enabled_families() == ("adaln", "rms_norm", "adaln_rms", "adaln_noshift", "gelu", "mul_add",
                                     "kv_attention", "gemv", "linear")
    # enable_adalayernorm switches the three modulation families together
    assert FusionPatterns(enable_adalayernorm=False, enable_linear=False).enabled_families() == (
        "rope", "rms_norm", "gelu", "mul_add", "kv_attention", "gemv")


@pytest.mark.parametrize("rule", [True, False])
def test_linear_auto_follows_the_machine_rule(monkeypatch, rule):
    """enable_linear='auto' turns the family on exactly where the machine rule says oneDNN's float32 linear is
    the faster kernel; True / False override it."""
    from fusegraph.fusion.patterns import linear

    monkeypatch.setattr(linear, "machine_rule", lambda *dtype: (rule, "test"))
    assert ("linear" in FusionPatterns().enabled_families()) is rule
    assert "linear" in FusionPatterns(enable_linear=True).enabled_families()
    assert "linear" not in FusionPatterns(enable_linear=False).enabled_families()


def test_linear_machine_rule(monkeypatch, tmp_path):
    """The rule reads the table measured for the CPU class (vendor/class key), per dtype, never a timing taken
    during the compile: the user's calibration first, then the shipped table, and a class no table covers keeps
    eager's kernel for every dtype."""
    import json

    from fusegraph.fusion import gemm_table
    from fusegraph.fusion.patterns import linear

    shipped = {"version": 1, "classes": {
        "AuthenticAMD/avx2": {"float32": {"kernel": "aten"}, "bfloat16": {"kernel": "fused", "geomean": 3.5}},
        "AuthenticAMD/avx512_bf16": {"float32": {"kernel": "fused"}, "bfloat16": {"kernel": "aten"}}}}
    user = {"version": 1, "classes": {"AuthenticAMD/avx2": {"float32": {"kernel": "fused"}}}}
    (tmp_path / "shipped.json").write_text(json.dumps(shipped))
    monkeypatch.setattr(gemm_table, "_SHIPPED", str(tmp_path / "shipped.json"))
    monkeypatch.setattr(gemm_table, "calibration_path", lambda: str(tmp_path / "user.json"))
    monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: True)
    monkeypatch.setattr(torch.backends.mkl, "is_available", lambda: True)

    def rule(key, dtype):
        monkeypatch.setattr(gemm_table.cpu_class, "key", lambda: key)
        gemm_table.reload()
        linear.machine_rule.cache_clear()
        return linear.machine_rule(dtype)

    try:
        assert rule("AuthenticAMD/avx2", torch.float32)[0] is False
        ok, why = rule("AuthenticAMD/avx2", torch.bfloat16)
        assert ok is True and "3.50x" in why, why
        assert rule("AuthenticAMD/avx2", torch.float16)[0] is False  # no entry for the dtype: eager's kernel
        assert rule("AuthenticAMD/avx512_bf16", torch.float32)[0] is True
        assert rule("AuthenticAMD/avx512_bf16", torch.bfloat16)[0] is False
        ok, why = rule("GenuineIntel/avx512", torch.float32)
        assert ok is False and "not measured" in why, why
        (tmp_path / "user.json").write_text(json.dumps(user))
        ok, why = rule("AuthenticAMD/avx2", torch.float32)
        assert ok is True and "calibrated here" in why, why
        assert rule("AuthenticAMD/avx2", torch.bfloat16)[0] is True  # the shipped entry still answers for bf16
        (tmp_path / "user.json").write_text('{"version": 1, "classes": {"x": {"float32": {"kernel": "mkl"}}}}')
        assert rule("AuthenticAMD/avx2", torch.float32)[0] is False  # a bad file is ignored, never trusted
        monkeypatch.setattr(torch.backends.mkldnn, "is_available", lambda: False)
        assert rule("AuthenticAMD/avx512_bf16", torch.float32) == (False, "torch has no oneDNN")
    finally:
        monkeypatch.undo()
        gemm_table.reload()
        linear.machine_rule.cache_clear()


def test_float32_packing_verdict_and_lookup(monkeypatch, tmp_path):
    """The opt-in float32 weight copy (``pack_weights=True``) follows the class's measured table: packed for oneDNN
    only where it beats both plain kernels at every shape and by the margin overall — judged on the layout alone,
    so a plain-kernel difference that a real-hardware measurement overrode (``decided_by``, whose kernel a later
    emulated calibration keeps) never packs; a class or a dtype without a packing verdict is never packed; a bad
    ``pack`` value makes the table untrusted."""
    import json

    from fusegraph.fusion import gemm_table

    def rows(aten, fused, packed):
        return [{"shape": [320, 8, 8], "aten_s": a, "fused_s": f, "packed_s": p, "ratio": a / f}
                for a, f, p in zip(aten, fused, packed)]

    e = gemm_table._verdict(rows([1.0, 1.0], [0.8, 0.8], [0.7, 0.7]))
    assert e["kernel"] == "fused" and e["pack"] == "onednn" and abs(e["pack_geomean"] - 8 / 7) < 1e-9
    e = gemm_table._verdict(rows([1.0, 1.0], [0.8, 0.8], [0.78, 0.78]))
    assert e["kernel"] == "fused" and e["pack"] == "none"  # 1.03x over the plain oneDNN kernel: below the margin
    e = gemm_table._verdict(rows([1.0, 1.0], [0.8, 0.8], [0.5, 1.1]))
    assert e["pack"] == "none"  # slower at one shape
    e = gemm_table._verdict(rows([1.0, 1.0], [0.8, 0.8], [0.78, 0.78]), kernel="aten")
    assert e["kernel"] == "aten" and e["pack"] == "none"  # 1.28x over aten, but only 1.03x over the plain oneDNN
    e = gemm_table._verdict(rows([1.0, 0.7], [0.8, 0.9], [0.7, 0.6]))
    assert e["kernel"] == "aten" and e["pack"] == "onednn"  # against the faster plain kernel at each shape: 8/7, 7/6
    e = gemm_table._verdict(rows([1.0, 0.7], [0.8, 0.9], [0.78, 0.69]))
    assert e["pack"] == "none"  # 1.03x and 1.01x over the faster plain kernel: below the margin
    e = gemm_table._verdict(rows([1.0, 0.7], [0.8, 0.9], [0.6, 0.72]))
    assert e["pack"] == "none"  # 1.33x at one shape, slower than aten at the other
    assert "pack" not in gemm_table._verdict([{"shape": [1, 1, 1], "aten_s": 1.0, "fused_s": 1.0, "ratio": 1.0}])

    path = tmp_path / "table.json"
    path.write_text(json.dumps({"version": 1, "meta": {}, "classes": {"AuthenticAMD/avx2": {"float32": {
        "kernel": "aten", "decided_by": "a real AVX2 machine"}}}}))
    monkeypatch.setattr(gemm_table.cpu_class, "key", lambda: "AuthenticAMD/avx2")
    monkeypatch.setattr(gemm_table, "_SHIPPED", str(path))
    monkeypatch.setattr(gemm_table, "calibration_path", lambda: str(tmp_path / "none.json"))
    try:
        gemm_table.save({"float32": gemm_table._verdict(rows([1.0, 1.0], [0.8, 0.8], [0.78, 0.78]))}, str(path))
        entry = json.loads(path.read_text())["classes"]["AuthenticAMD/avx2"]["float32"]
        assert entry["kernel"] == "aten" and entry["decided_by"] == "a real AVX2 machine" and entry["pack"] == "none"
        gemm_table.save({"float32": gemm_table._verdict(rows([1.0, 1.0], [0.8, 0.8], [0.7, 0.7]))}, str(path))
        entry = json.loads(path.read_text())["classes"]["AuthenticAMD/avx2"]["float32"]
        assert entry["kernel"] == "aten" and entry["decided_by"] == "a real AVX2 machine" and entry["pack"] == "onednn"
        gemm_table.reload()
        pack, why = gemm_table.pack_lookup(torch.float32)
        assert pack == "onednn" and "1.14x" in why, why
        assert gemm_table.pack_lookup(torch.bfloat16)[0] == "none"
        assert gemm_table.pack_lookup(torch.float32, "GenuineIntel/avx2")[0] == "none"
        path.write_text(json.dumps({"version": 1, "classes": {"AuthenticAMD/avx2": {"float32": {
            "kernel": "aten", "pack": "mkl"}}}}))
        gemm_table.reload()
        assert gemm_table.pack_lookup(torch.float32)[0] == "none"  # a bad table is ignored, never trusted
    finally:
        monkeypatch.undo()
        gemm_table.reload()


def test_gemm_table_few_row_part_is_measured_and_kept_apart(tmp_path, monkeypatch):
    """The few-row verdicts (``gemv``: row count -> kernel) and the many-row ones are measured and saved apart: a
    calibration of one part keeps the other; a measured few-row part replaces what ``gemv_decided_by`` kept; a
    malformed few-row entry makes the table unreadable (ignored), never half-trusted."""
    import json

    from fusegraph.fusion import gemm_table

    path = tmp_path / "table.json"
    path.write_text(json.dumps({"version": 1, "meta": {}, "classes": {"AuthenticAMD/avx2": {"bfloat16": {
        "kernel": "fused", "gemv": {"1": "fused", "8": "fused"}, "gemv_decided_by": "as built"}}}}))
    monkeypatch.setattr(gemm_table.cpu_class, "key", lambda: "AuthenticAMD/avx2")
    monkeypatch.setattr(gemm_table, "_SHIPPED", str(path))
    monkeypatch.setattr(gemm_table, "calibration_path", lambda: str(tmp_path / "none.json"))
    try:
        gemm_table.reload()
        assert gemm_table.gemv_lookup(torch.bfloat16, 3)[0] == "fused"
        gemm_table.save({"bfloat16": {"gemv": {"1": "fused", "2": "fused", "4": "aten", "8": "aten"},
                                      "gemv_shapes": []}}, str(path))
        entry = json.loads(path.read_text())["classes"]["AuthenticAMD/avx2"]["bfloat16"]
        assert entry["kernel"] == "fused" and "gemv_decided_by" not in entry  # the many-row part kept
        assert [gemm_table.gemv_lookup(torch.bfloat16, m)[0] for m in (1, 2, 3, 4, 8)] == \
            ["fused", "fused", "aten", "aten", "aten"]
        assert gemm_table.gemv_lookup(torch.bfloat16, 16)[0] == "aten"  # beyond every measured count
        rows = [{"shape": [320, 8, 8], "aten_s": 1.0, "fused_s": 1.1, "ratio": 1 / 1.1}]
        gemm_table.save({"bfloat16": gemm_table._verdict(rows)}, str(path))
        entry = json.loads(path.read_text())["classes"]["AuthenticAMD/avx2"]["bfloat16"]
        assert entry["kernel"] == "aten" and entry["gemv"]["4"] == "aten"  # the few-row part kept
        path.write_text(json.dumps({"version": 1, "classes": {"AuthenticAMD/avx2": {"bfloat16": {
            "kernel": "aten", "gemv": {"1": "gemv"}}}}}))
        gemm_table.reload()
        assert gemm_table.lookup(torch.bfloat16)[1].endswith("class not measured (eager's kernel)")
        # measured: the few-row kernel against addmm at each row count and width (tiny widths here: fast)
        e = gemm_table.measure_gemv(torch.float32, rows=(1, 2), shapes=((64, 32),), reps=1)
        assert set(e["gemv"]) == {"1", "2"} and set(e["gemv"].values()) <= {"fused", "aten"}
        assert [r["shape"] for r in e["gemv_shapes"]] == [[1, 64, 32], [2, 64, 32]]
    finally:
        monkeypatch.undo()
        gemm_table.reload()


@pytest.mark.parametrize("overrides,exc,words", [
    (dict(graph_only=1), TypeError, ["graph_only", "1"]),
    (dict(graph_max_entries=-1), ValueError, ["graph_max_entries", "-1"]),
    (dict(graph_max_entries=2.0), TypeError, ["graph_max_entries"]),
    (dict(graph_memory_budget=True), TypeError, ["graph_memory_budget"]),
    (dict(graph_eviction="random"), ValueError, ["graph_eviction", "random"]),
    (dict(graph_fallback=None), TypeError, ["graph_fallback"]),
    (dict(device_graph="tpu"), ValueError, ["device_graph", "tpu"]),
    (dict(graph_log_url=3), TypeError, ["graph_log_url"]),
    (dict(no_such_field=True), ValueError, ["no_such_field"]),
    (dict(fusion_patterns={"gelu_approximation": "erf"}), ValueError, ["gelu_approximation", "erf"]),
    (dict(fusion_patterns={"enable_rope": "yes"}), TypeError, ["enable_rope"]),
    (dict(fusion_patterns={"enable_everything": True}), ValueError, ["enable_everything"]),
    (dict(fusion_patterns=["enable_rope"]), TypeError, ["fusion_patterns"]),
])
def test_bad_values_raise_naming_the_field(overrides, exc, words):
    with pytest.raises(exc) as info:
        CompilationConfig(**overrides)
    for w in words:
        assert w in str(info.value)


def test_bad_values_rejected_on_the_class_too():
    with pytest.raises(TypeError, match="graph_warmup_runs"):
        CompilationConfig.graph_warmup_runs = "1"
    with pytest.raises(ValueError, match="aclgraph_typo"):
        CompilationConfig.aclgraph_typo = True
    with pytest.raises(ValueError, match="gelu_approximation"):
        CompilationConfig.fusion_patterns.gelu_approximation = "exact"
    assert CompilationConfig.graph_warmup_runs == 1


def test_backend_snapshots_its_config():
    cfg = CompilationConfig(graph_max_entries=3)
    backend = Backend(cfg)
    cfg.graph_max_entries = 9
    cfg.fusion_patterns.enable_mul_add = False
    CompilationConfig.inductor = False
    assert backend.config.graph_max_entries == 3
    assert backend.config.fusion_patterns.enable_mul_add is True
    assert backend.config.inductor is True
    assert Backend().config.inductor is False  # a new backend sees the new default


def test_backend_accepts_override_dict_and_rejects_other_types():
    assert Backend({"inductor": False}).config.inductor is False
    with pytest.raises(TypeError, match="config"):
        Backend("inductor=False")


def test_fields_carry_docstrings():
    for name, f in CompilationConfig._fields.items():
        assert f.__doc__ and len(f.__doc__) > 10, name
    for name, f in FusionPatterns._fields.items():
        assert f.__doc__ and len(f.__doc__) > 10, name
