"""The wheel's torch pin (scripts/packaging/torch_pin.py) and the device check's choice of a carried wheel
(scripts/packaging/pick_wheel.py). The wheel itself is built and used by scripts/check_wheel.sh (make test)."""
import importlib.util
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest
import torch
from packaging.specifiers import SpecifierSet

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "packaging"


def _load(name):
    spec = importlib.util.spec_from_file_location(f"_fg_{name}", SCRIPTS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


torch_pin = _load("torch_pin")
pick_wheel = _load("pick_wheel")
THIS_MINOR = ".".join(torch.__version__.split("+")[0].split(".")[:2])


@pytest.mark.parametrize("built, ok, not_ok", [
    ("2.13.0+cpu", ["2.13.0", "2.13.1+cu130"], ["2.12.1", "2.14.0", "2.1.3"]),
    ("2.11.0+cu130", ["2.11.0+cpu", "2.11.2"], ["2.10.0", "2.12.0"]),
])
def test_torch_pin_admits_the_built_minor_version_only(built, ok, not_ok):
    requirement = torch_pin.torch_requirement(built)
    assert requirement.startswith("torch==")
    spec = SpecifierSet(requirement[len("torch"):])
    assert all(spec.contains(v) for v in ok) and not any(spec.contains(v) for v in not_ok)


def test_torch_pin_provider_reads_the_installed_torch():
    assert torch_pin.dynamic_metadata({}, {}) == {"dependencies": [f"torch=={THIS_MINOR}.*"]}
    with pytest.raises(RuntimeError):
        torch_pin.dynamic_metadata({"unknown": 1}, {})


def _wheel(folder, python_tag, torch_minor, platform=None):
    platform = platform or sysconfig.get_platform().replace("-", "_").replace(".", "_")
    path = folder / f"fusegraph-0.1.0-{python_tag}-{python_tag}-{platform}.whl"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("fusegraph-0.1.0.dist-info/METADATA",
                   f"Metadata-Version: 2.2\nName: fusegraph\nRequires-Dist: torch=={torch_minor}.*\n")
    return path


def test_pick_wheel_takes_only_a_wheel_for_this_python_platform_and_torch(tmp_path, capsys):
    here = f"cp{sys.version_info.major}{sys.version_info.minor}"
    other_minor = THIS_MINOR.split(".")[0] + "." + str(int(THIS_MINOR.split(".")[1]) + 1)
    _wheel(tmp_path, "cp39", THIS_MINOR)
    _wheel(tmp_path, here, other_minor)
    _wheel(tmp_path, here, THIS_MINOR, platform="macosx_11_0_arm64")
    assert pick_wheel.main([str(tmp_path), str(tmp_path / "absent")]) == 1
    err = capsys.readouterr().err
    assert "built for cp39" in err and f"requires torch=={other_minor}.*" in err and "macosx" in err
    assert "absent: not found" in err
    good = _wheel(tmp_path, here, THIS_MINOR)
    assert pick_wheel.main([str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(good)
