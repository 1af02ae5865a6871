"""scikit-build-core dynamic-metadata provider (pyproject.toml, [[tool.dynamic-metadata]]): the wheel's torch
requirement is the torch it is built against, to the minor version.

fusegraph._C links libtorch and uses its C++ API, which keeps no ABI across minor releases: an extension built
against torch X.Y loads only into X.Y. The build runs without isolation (pip --no-build-isolation), so the torch
that CMake compiles against is the one installed next to this build backend; its version is read from the
distribution metadata (no import of torch here). Builds that would pull torch into an isolated environment are
refused with a clear message instead.
"""
from __future__ import annotations

from importlib.metadata import PackageNotFoundError, version
from typing import Any, Mapping


def torch_requirement(torch_version: str) -> str:
    """'2.13.0+cpu' -> 'torch==2.13.*' (the local label is ignored by == prefix matching, PEP 440)."""
    major, minor = torch_version.split("+")[0].split(".")[:2]
    return f"torch=={major}.{minor}.*"


def dynamic_metadata(settings: Mapping[str, Any], project: Mapping[str, Any]) -> dict[str, list[str]]:
    if settings:
        raise RuntimeError(f"torch_pin takes no settings, got {sorted(settings)}")
    try:
        torch_version = version("torch")
    except PackageNotFoundError:
        raise RuntimeError("fusegraph builds against the installed torch: install torch first, then build with "
                           "`pip install --no-build-isolation .` or `pip wheel --no-build-isolation .`") from None
    return {"dependencies": [torch_requirement(torch_version)]}


def dynamic_wheel(settings: Mapping[str, Any]) -> dict[str, bool]:
    """The requirement follows the torch of the machine that builds the wheel, not the sdist's."""
    return {"dependencies": True}
