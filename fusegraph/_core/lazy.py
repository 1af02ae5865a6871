"""Names an adaptor module resolves on first use: an adaptor imports a torch module only when a name of it is first
read, so a process pays only for the subsystems it uses. (``import fusegraph`` itself imports Dynamo, to register the
backend, and Inductor's pattern matcher, which the pass manager builds on.)"""
from __future__ import annotations

import importlib


def module_getattr(module: str, names: dict):
    """A module-level ``__getattr__`` for ``module`` serving ``names``: name -> (torch module, attribute or None for
    the module itself). Resolved on every access (a ``monkeypatch`` of the torch attribute is seen)."""
    def __getattr__(name: str):
        try:
            source, attr = names[name]
        except KeyError:
            raise AttributeError(f"module {module!r} has no attribute {name!r}") from None
        value = importlib.import_module(source)
        return value if attr is None else getattr(value, attr)

    return __getattr__
