"""CPU classes (fusegraph._core.cpu_class): the class a process runs as, narrowed by the libraries' ISA caps, and
``python -m fusegraph --cpu-class C`` running a command as class C would."""
import os
import platform
import subprocess
import sys

import pytest
import torch

from fusegraph._core import cpu_class

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
x86 = pytest.mark.skipif(platform.machine().lower() not in ("x86_64", "amd64"), reason="x86 classes")


def _run(args, env=None):
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
                          env={**os.environ, "OMP_NUM_THREADS": "1", **(env or {})})


def test_environment_sets_every_library_cap_and_rejects_unknown_names():
    env = cpu_class.environment("avx2")
    assert env["ATEN_CPU_CAPABILITY"] == "avx2" and env["ONEDNN_MAX_CPU_ISA"] == "AVX2"
    assert env["MKL_ENABLE_INSTRUCTIONS"] == "AVX2" and env["FUSEGRAPH_CPU_CLASS"] == "avx2"
    with pytest.raises(ValueError, match=r"unknown 'avx3'.*'avx512_bf16'"):
        cpu_class.environment("avx3")


@x86
def test_each_narrower_class_is_what_a_process_started_with_its_caps_reports():
    """A process started with a class's caps names that class, and ATen (hence fusegraph's kernels and Inductor's
    code) runs at its capability."""
    own = cpu_class.hardware_classes()
    assert own and own[-1] == "default"
    code = ("from fusegraph._core import cpu_class; import torch, fusegraph; "
            "print(cpu_class.current(), cpu_class.emulated(), fusegraph._C.cpu_capability())")
    for name in own:
        out = _run(["-c", code], cpu_class.environment(name))
        assert out.returncode == 0, out.stderr[-2000:]
        current, emulated, kernels = out.stdout.split()
        assert current == name and emulated == str(name != own[0]), (name, out.stdout)
        assert kernels == {"avx2": "AVX2", "default": "DEFAULT"}.get(name, "AVX512"), (name, out.stdout)


@x86
def test_the_command_line_runs_a_command_as_another_class():
    if "avx2" not in cpu_class.hardware_classes():
        pytest.skip("no AVX2 on this CPU")
    out = _run(["-m", "fusegraph", "--cpu-class", "avx2", "bench", "gemm", "--quick", "--dtype", "fp32",
                "--reps", "1"])
    assert out.returncode == 0, out.stderr[-2000:]
    assert "kernels AVX2" in out.stdout and "/avx2" in out.stdout, out.stdout[:600]


@x86
def test_a_class_this_machine_cannot_run_is_a_clear_error(monkeypatch):
    # a CPU without AMX (whatever this one has): the class it lacks is named with the missing flags
    caps = {k: v for k, v in cpu_class.cpu_capabilities().items() if not k.startswith("amx")}
    caps.update({"avx512_f": True, "avx512_bw": True, "avx512_vl": True, "avx512_dq": True, "avx512_bf16": True})
    monkeypatch.setattr(cpu_class, "cpu_capabilities", lambda: caps)
    assert "amx" not in cpu_class.hardware_classes() and "avx512_bf16" in cpu_class.hardware_classes()
    with pytest.raises(ValueError, match=r"'amx' needs \['amx_bf16', 'amx_tile'\], which this CPU .* lacks; it can "
                                         r"run as \['avx512_bf16', 'avx512', 'avx2', 'default'\]"):
        cpu_class.check_emulable("amx")
    # the command line: an unknown class, and the flag without one, exit 2 naming the problem
    out = _run(["-m", "fusegraph", "--cpu-class", "avx3", "bench", "gemm"])
    assert out.returncode == 2 and "avx3" in out.stderr and "expected one of" in out.stderr, out.stderr
    out = _run(["-m", "fusegraph", "--cpu-class", "avx2"])
    assert out.returncode == 2 and "expected a class" in out.stderr, out.stderr


def test_an_arm_machine_is_a_class_of_its_own_named_by_its_implementer(tmp_path, monkeypatch):
    def cpuinfo(text):
        path = tmp_path / "cpuinfo"
        path.write_text(text)
        return str(path)

    neoverse = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n"
    assert cpu_class.vendor(cpuinfo(neoverse)) == "ARM"
    assert cpu_class.vendor(cpuinfo(neoverse.replace("0x41", "0x48"))) == "HiSilicon"  # Kunpeng
    assert cpu_class.vendor(cpuinfo(neoverse.replace("0x41", "0x7f"))) == "arm-0x7f"
    assert cpu_class.vendor(cpuinfo("processor\t: 0\nvendor_id\t: AuthenticAMD\n")) == "AuthenticAMD"
    assert cpu_class.vendor(cpuinfo("processor\t: 0\n")) == ""
    assert cpu_class.vendor(str(tmp_path / "missing")) == ""

    # On aarch64 the class is the architecture, whatever ATen's capability; it has no table, so linears keep eager's
    # kernel, and the header names it as a class not measured.
    from fusegraph.fusion import gemm_table

    monkeypatch.setattr(platform, "machine", lambda: "aarch64")
    monkeypatch.setattr(cpu_class, "vendor", lambda cpuinfo="/proc/cpuinfo": "ARM")
    cpu_class.current.cache_clear()
    try:
        assert cpu_class.current() == "aarch64" and cpu_class.key() == "ARM/aarch64"
        kernel, why = gemm_table.lookup(torch.float32)
        assert kernel == "aten" and "ARM/aarch64" in why and "not measured" in why, why
        assert gemm_table.pack_lookup(torch.float32)[0] == "none"
    finally:
        cpu_class.current.cache_clear()
