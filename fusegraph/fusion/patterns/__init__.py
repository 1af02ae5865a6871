"""Pattern families: the one table every other part of fusegraph reads (pass order, config switches, options,
stats keys, the fused ops and their lowerings, the calibration sites, explain's candidates).

Each module ``<family>.py`` declares its ``FAMILY`` (``_family.Family``): its name and switch, its
``register(pm, opts)``, which registers that family's search/replace patterns (its ``Form`` records, with
``torch._inductor.pattern_matcher.register_replacement``, or graph patterns) into the ``PatternMatcherPass``
``pm`` (``opts`` is a ``FusionPatterns`` snapshot), the fused ops it emits and their lowerings to aten, its
calibration site and its explain candidates. This file only orders them. The pass manager
(``fusegraph.fusion.passes``) owns caching and counting; the choice (``choice.py``) and ``fusegraph.explain``
derive their per-family data from ``FAMILIES``."""
from __future__ import annotations

from . import adaln, adaln_noshift, adaln_rms, gelu, gemv, kv_attention, linear, mul_add, rms_norm, rope
from ._family import Candidate, Family, Form, NoSite

# Pass order: a family whose pattern contains another's runs first (adaln and rope before mul_add, ...).
# adaln_rms and adaln_noshift match on the fused rms_norm op, so they run after rms_norm (in the same round);
# adaln runs before adaln_noshift, so a LayerNorm modulation with a shift is never split into two ops; both run
# before gelu and mul_add, which would otherwise take the modulation's ``* (1 + scale) + shift``.
FAMILIES: tuple = tuple(m.FAMILY for m in (adaln, rope, rms_norm, adaln_rms, adaln_noshift, gelu, mul_add,
                                           kv_attention, gemv, linear))

# Listing order: Stats.patterns, Stats.lowered and the INFO line (SPEC §1.3's order, then newer families).
_LISTED: tuple = tuple(m.FAMILY for m in (rms_norm, rope, adaln, gelu, mul_add, adaln_rms, adaln_noshift,
                                          kv_attention, gemv, linear))
assert set(_LISTED) == set(FAMILIES) and len(_LISTED) == len(FAMILIES)

FAMILY_NAMES: tuple = tuple(f.name for f in FAMILIES)  # pass order
PATTERN_NAMES: tuple = tuple(f.name for f in _LISTED)  # listing order
BY_NAME: dict = {f.name: f for f in FAMILIES}
SWITCHES: tuple = tuple(dict.fromkeys(f.switch for f in FAMILIES))  # each FusionPatterns switch once
assert len(BY_NAME) == len(FAMILIES), "two families with one name"

__all__ = ["Candidate", "Family", "Form", "NoSite", "FAMILIES", "FAMILY_NAMES", "PATTERN_NAMES", "BY_NAME",
           "SWITCHES"]
