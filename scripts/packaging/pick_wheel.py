"""Print the fusegraph wheel among the given files and folders that fits this python and this torch (its
interpreter tag, its platform, its torch==X.Y.* requirement), or nothing; exit 1 when none fits.
Usage: python pick_wheel.py PATH... (scripts/device_check.sh: a carried wheel in wheels/ or FG_WHEEL=FILE)."""
import re
import sys
import sysconfig
import zipfile
from importlib.metadata import version
from pathlib import Path


def fits(wheel: Path, python_tag: str, platform: str, torch_minor: str) -> str:
    """'' when the wheel fits, else why not."""
    m = re.fullmatch(r"fusegraph-[^-]+(?:-\d[^-]*)?-([^-]+)-([^-]+)-([^-]+)\.whl", wheel.name)
    if not m:
        return "not a fusegraph wheel"
    if m.group(1) != python_tag or m.group(3) != platform:
        return f"built for {m.group(1)} {m.group(3)}, this is {python_tag} {platform}"
    with zipfile.ZipFile(wheel) as z:
        meta = next(n for n in z.namelist() if n.endswith(".dist-info/METADATA"))
        pins = re.findall(r"^Requires-Dist: torch\s*==\s*([\d.]+)\.\*", z.read(meta).decode(), re.M)
    if pins != [torch_minor]:
        return f"requires torch=={pins[0] if pins else '?'}.*, this is torch {torch_minor}"
    return ""


def main(paths) -> int:
    python_tag = f"cp{sys.version_info.major}{sys.version_info.minor}"
    platform = sysconfig.get_platform().replace("-", "_").replace(".", "_")
    torch_minor = ".".join(version("torch").split("+")[0].split(".")[:2])
    for p in map(Path, paths):
        if not p.exists():
            print(f"pick_wheel: {p}: not found", file=sys.stderr)
            continue
        for wheel in sorted(p.glob("fusegraph-*.whl")) if p.is_dir() else [p]:
            why = fits(wheel, python_tag, platform, torch_minor)
            if not why:
                print(wheel)
                return 0
            print(f"pick_wheel: {wheel.name}: {why}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
