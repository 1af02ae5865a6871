"""Runs diffusers' own test suite (a checkout of diffusers' ``tests/`` matching the installed diffusers) with
``torch.compile`` defaulting to fusegraph's backend, on this machine's device — how a new user would try fusegraph
against a suite nobody here wrote (GUIDE §1.12, BENCHMARKS; issue 36).

    python scripts/diffusers_suite.py DIFFUSERS_CHECKOUT [--backend fusegraph|inductor] [pytest args...]
    e.g. python scripts/diffusers_suite.py ~/diffusers -k HotSwap \\
             tests/models/transformers/test_models_transformer_flux.py

As a pytest plugin (``-p diffusers_suite`` with this folder on ``PYTHONPATH``) it
  - makes ``torch.compile``'s default backend ``$FUSEGRAPH_SUITE_BACKEND`` (``fusegraph`` unless set; ``inductor``
    runs the same suite with plain Inductor, to compare): a call that names no backend gets it, so do
    ``nn.Module.compile`` and diffusers' ``compile_repeated_blocks``; ``mode=`` and ``options=`` pass through;
  - lifts diffusers' ``require_torch_accelerator`` skip (the compile and LoRA-hotswap mixins carry it; they run on
    CPU as they are), so they run where no GPU is.
Nothing of diffusers' is copied here: the suite is read from the checkout given.
"""
from __future__ import annotations

import functools
import os
import subprocess
import sys

ACCELERATOR_SKIP = "test requires accelerator"


def _default_backend_is(name: str) -> None:
    import torch

    if getattr(torch.compile, "_fusegraph_suite", False):
        return
    original = torch.compile

    @functools.wraps(original)
    def compile(model=None, *args, backend="inductor", **kwargs):
        if backend == "inductor":
            backend = name
        return original(model, *args, backend=backend, **kwargs)

    compile._fusegraph_suite = True
    torch.compile = compile


def pytest_configure(config):
    name = os.environ.get("FUSEGRAPH_SUITE_BACKEND", "fusegraph")
    if name == "fusegraph":
        import fusegraph  # noqa: F401  (registers backend="fusegraph" from a plain checkout)
    _default_backend_is(name)


def pytest_collection_modifyitems(config, items):
    for item in items:
        for node in item.listchain():
            node.own_markers[:] = [m for m in node.own_markers
                                   if not (m.name == "skipif" and str(m.kwargs.get("reason", "")).startswith(
                                       ACCELERATOR_SKIP))]


def main(argv: list) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("diffusers", help="a diffusers checkout (its tests/ folder is run)")
    parser.add_argument("--backend", default="fusegraph", help="torch.compile's default backend (default fusegraph)")
    args, pytest_args = parser.parse_known_args(argv)
    env = dict(os.environ, FUSEGRAPH_SUITE_BACKEND=args.backend,
               PYTHONPATH=os.pathsep.join([os.path.dirname(os.path.abspath(__file__)),
                                           os.environ.get("PYTHONPATH", "")]))
    cmd = [sys.executable, "-m", "pytest", "-p", "diffusers_suite", *pytest_args]
    return subprocess.call(cmd, cwd=os.path.abspath(args.diffusers), env=env)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
