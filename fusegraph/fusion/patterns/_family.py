"""The records a pattern family is made of: ``Family`` (one per ``patterns/<family>.py``, its ``FAMILY``),
``Form`` (one source form: search, replacement, example inputs, check) and ``Candidate`` (what explain
looks for when the family did not fuse).

Everything else in fusegraph that is per family reads these records through the table
(``patterns.FAMILIES``): the pass manager (``register``, ``switch``, ``options``), the stats keys (``name``),
the Inductor route's choice (``ops``, ``claims``, ``lowerings``, ``calibration``) and the explain report
(``candidates``). No other module keeps a list of families (``tests/fusion/test_family_table.py``)."""
from __future__ import annotations

import functools
import sys
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Callable, Mapping, Optional

import torch


class NoSite(str):
    """A candidate's reason that says it is no site of the family at all (a LayerNorm with no modulation):
    explain lists it as "no site", not as a missed fusion."""


@dataclass(frozen=True)
class Candidate:
    """What explain reports as a missed site of a family when its pass left it in the graph."""

    anchor: Callable  # node -> a label (the op that makes it a candidate: "rsqrt", "tanh") or None
    # (anchor, ops after it) -> a NoSite reason when the candidate turns out to be no site of the family; consulted
    # when no registered form matched
    no_site: Optional[Callable] = None
    # node -> the nodes whose source line, when it is another family's candidate's line, make this candidate that
    # op's inside (a LayerNorm's affine step, GELU's polynomial) and no site; None: always a site
    inner: Optional[Callable] = None


@dataclass(frozen=True)
class Form:
    """One source form of a family, registered with ``register_replacement``: the search function (traced into
    the pattern), the replacement, the example inputs it is traced with and the check on a match's operands.

    ``examples(*combination)`` gives the lists of example inputs (tensors, and the stand-ins of captured scalars)
    for one combination of the family's registration loop (dtypes, a style; none for a form registered once):
    each list is one registered pattern, in order; an empty result skips the combination. ``check`` is the
    family's check on a match's operands (None: the family's default); ``check_of(example inputs)`` makes it
    for a check that depends on the traced dtypes. ``scalars``: the captured scalars' stand-ins
    (``scalar_workaround``; None: the family's default)."""

    search: Callable
    replace: Callable
    examples: Callable
    check: Optional[Callable] = None
    check_of: Optional[Callable] = None
    scalars: Optional[Mapping] = None


def register_forms(pm, forms, *combination, trace_fn, check=None, scalars=None) -> None:
    """Registers ``forms`` (in order) for one ``combination`` of the family's loop into ``pm``: each form's
    example-input lists, one ``register_replacement`` each (duplicates skipped). A match with symbolic shapes is
    re-checked by ``_trace.symbolic_recheck`` instead of the matcher's own re-check (see there)."""
    from ..._core.torch_pattern_matcher import register_replacement

    from ._trace import on_symbolic, symbolic_recheck

    for form in forms:
        for inputs in form.examples(*combination):
            if form.check_of is not None:
                extra_check = form.check_of(inputs)
            else:
                extra_check = form.check if form.check is not None else check
            workaround = form.scalars if form.scalars is not None else scalars
            kwargs = {} if extra_check is None else {"extra_check": extra_check}
            if workaround is not None:
                kwargs["scalar_workaround"] = dict(workaround)
            before = {id(e) for entries in pm.patterns.values() for e in entries}
            register_replacement(form.search, form.replace, inputs, trace_fn, pm, skip_duplicates=True, **kwargs)
            symbolic = symbolic_recheck(form.search, form.replace, inputs, trace_fn, extra_check)
            for entries in pm.patterns.values():
                for entry in entries:
                    if id(entry) not in before:
                        entry.extra_check = on_symbolic(entry.extra_check, symbolic)


def _frozen(mapping) -> Mapping:
    return MappingProxyType(dict(mapping))


@dataclass(frozen=True, eq=False)
class Family:
    """One pattern family: everything fusegraph knows per family."""

    name: str  # the key in Stats.patterns / Stats.lowered, the explain report and the cost table
    switch: str  # the FusionPatterns field that turns it on
    register: Callable  # register(pm, opts): its patterns into the PatternMatcherPass pm
    options: tuple = ()  # further FusionPatterns fields that change what ``register`` registers
    # Whether the switch's value turns the family on on this machine (default: the value is truthy).
    active: Optional[Callable] = None
    # The fused op overloads its replacements emit, as "op.overload" of torch.ops.fusegraph ("mul_add.Scalar").
    ops: tuple = ()
    # For an op that several families emit (adaln): node -> whether this fused node is this family's site.
    claims: Optional[Callable] = None
    # "op.overload" -> lowering(out_dtype, *args, **kwargs): the op's exact semantics in torch ops, which the
    # Inductor route puts back where Inductor's own code is faster (a keyword ``out_dtype`` of the op arrives as
    # ``out_dtype_arg``). Empty: the choice never weighs the family (it replaces an extern call: SDPA, mm).
    lowerings: Mapping = field(default_factory=dict)
    # (numel, rnd(*shape, dt=dtype)) -> (op overload, args, kwargs): one representative site of ``numel`` elements
    # for ``python -m fusegraph bench calibrate``; None: not calibrated.
    calibration: Optional[Callable] = None
    # Whether the site's cost depends on its row width (a norm's reduction length), not only on its elements: the
    # calibration site then takes ``row=`` and the cost table may hold other widths than ``_lowering.ROW`` (keys
    # "<dtype>@<row>"); the choice reads the measured width nearest the site's.
    row_wise: bool = False
    candidates: tuple = ()  # Candidate records: explain's unfused candidates of this family
    # Form records: every source form the family may register with register_replacement (``register`` decides
    # the order and the combinations); empty for families registered as graph patterns (kv_attention, gemv, linear)
    forms: tuple = ()

    def __post_init__(self):
        object.__setattr__(self, "lowerings", _frozen(self.lowerings))
        unknown = set(self.lowerings) - set(self.ops)
        if unknown:
            raise ValueError(f"family {self.name}: lowerings of ops it does not emit: {sorted(unknown)}")

    @property
    def module(self) -> ModuleType:
        """The module that defines the family (``patterns/<family>.py``)."""
        return sys.modules[self.register.__module__]

    @property
    def calibrated(self) -> bool:
        return self.calibration is not None

    def on(self, opts) -> bool:
        value = getattr(opts, self.switch)
        return bool(value) if self.active is None else self.active(value)


@functools.lru_cache(maxsize=None)
def overload(name: str):
    """``torch.ops.fusegraph.<op>.<overload>`` for "op.overload" (the ops are registered on first use)."""
    from ... import ops  # noqa: F401  (registers the ops)

    op, _, which = name.partition(".")
    return getattr(getattr(torch.ops.fusegraph, op), which or "default")
