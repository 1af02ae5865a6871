"""Placeholder: the adaln wrapper and fake kernel are being written (see csrc/ops/registration.cpp for the schema)."""


def adaln(*args, **kwargs):
    raise NotImplementedError("fusegraph.ops.adaln: not implemented yet")
