"""Placeholder: the rope wrapper and fake kernel are being written (see csrc/ops/registration.cpp for the schema)."""


def rope(*args, **kwargs):
    raise NotImplementedError("fusegraph.ops.rope: not implemented yet")
