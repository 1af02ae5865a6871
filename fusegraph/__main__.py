"""Command line: ``python -m fusegraph demo``, ``python -m fusegraph bench <subject> [options]`` and
``python -m fusegraph explain --model <diffusers class> [--json FILE] [--dtype fp32|bf16]`` (fusegraph.explain).
Any of them may be prefixed with ``--cpu-class NAME`` (``avx2``, ``avx512``, ``default``...): the command re-runs
itself as that CPU class would (fusegraph._core.cpu_class: the libraries' ISA caps set before torch loads).

Each bench subject is a module ``fusegraph.bench.<subject>`` with ``main(argv) -> int``; the demo is
``fusegraph.bench.demo``. Adding a subject needs no change here.
"""
import importlib
import os
import pkgutil
import sys

import fusegraph.bench


def _subjects():
    return sorted(m.name for m in pkgutil.iter_modules(fusegraph.bench.__path__) if not m.name.startswith("_")
                  and m.name not in ("demo", "timing"))


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    usage = (f"usage: python -m fusegraph [--cpu-class CLASS] demo | bench {{{','.join(_subjects())}}} [options] | "
             f"explain --model <diffusers class> [--json FILE] [--dtype fp32|bf16]")
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if argv[0] == "--cpu-class":
        from fusegraph._core import cpu_class

        if len(argv) < 3:
            print(f"--cpu-class: expected a class ({', '.join(cpu_class.NAMES)}) and a command", file=sys.stderr)
            return 2
        try:
            cpu_class.check_emulable(argv[1])
        except ValueError as e:
            print(e, file=sys.stderr)
            return 2
        env = {**os.environ, **cpu_class.environment(argv[1])}
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, "-m", "fusegraph", *argv[2:]], env)
    if argv[0] == "demo":
        return _run("demo", "fusegraph.bench.demo", argv[1:])
    if argv[0] == "explain":
        return _run("explain", "fusegraph.explain", argv[1:])
    if argv[0] == "bench" and len(argv) >= 2 and argv[1] in _subjects():
        return _run(f"bench {argv[1]}", f"fusegraph.bench.{argv[1]}", argv[2:])
    if argv[0] == "bench" and len(argv) >= 2:
        print(f"python -m fusegraph bench: unknown subject {argv[1]!r}; expected one of {', '.join(_subjects())}",
              file=sys.stderr)
    print(usage, file=sys.stderr)
    return 2


def _run(name: str, module: str, argv: list) -> int:
    """A command's main; a ValueError it raises (an argument found bad past argparse: a device, a size that does not
    divide, a dtype) is one line naming the command, exit status 2, not a traceback."""
    try:
        return importlib.import_module(module).main(argv)
    except ValueError as e:
        print(f"python -m fusegraph {name}: error: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
