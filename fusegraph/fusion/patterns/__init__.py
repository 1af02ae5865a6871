"""Pattern families: the one table every other part of fusegraph reads (pass order, config switches, options,
stats keys).

Each module ``<family>.py`` defines ``register(pm, opts)``, which registers that family's search/replace patterns
(``torch._inductor.pattern_matcher.register_replacement``) into the ``PatternMatcherPass`` ``pm``; ``opts`` is a
``FusionPatterns`` snapshot. The pass manager (``fusegraph.fusion.passes``) owns caching and counting."""
from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType
from typing import Callable, Optional

from . import adaln, adaln_noshift, adaln_rms, gelu, gemv, kv_attention, linear, mul_add, rms_norm, rope


@dataclass(frozen=True)
class Family:
    name: str  # the key in Stats.patterns / Stats.lowered, the explain report and the cost table
    switch: str  # the FusionPatterns field that turns it on
    module: ModuleType  # register(pm, opts)
    options: tuple = ()  # further FusionPatterns fields that change what ``module`` registers
    listed: int = 0  # its place in Stats.patterns and the INFO line (SPEC §1.3's order, then newer families)
    # Whether the switch's value turns the family on on this machine (default: the value is truthy).
    active: Optional[Callable] = None

    def on(self, opts) -> bool:
        value = getattr(opts, self.switch)
        return bool(value) if self.active is None else self.active(value)


# Pass order: a family whose pattern contains another's runs first (adaln and rope before mul_add, ...).
# adaln_rms and adaln_noshift match on the fused rms_norm op, so they run after rms_norm (in the same round);
# adaln runs before adaln_noshift, so a LayerNorm modulation with a shift is never split into two ops; both run
# before gelu and mul_add, which would otherwise take the modulation's ``* (1 + scale) + shift``.
FAMILIES: tuple = (
    Family("adaln", "enable_adalayernorm", adaln, listed=2),
    Family("rope", "enable_rope", rope, listed=1),
    Family("rms_norm", "enable_rms_norm", rms_norm, listed=0),
    Family("adaln_rms", "enable_adalayernorm", adaln_rms, listed=5),
    Family("adaln_noshift", "enable_adalayernorm", adaln_noshift, listed=6),
    Family("gelu", "enable_fast_gelu", gelu, options=("gelu_approximation",), listed=3),
    Family("mul_add", "enable_mul_add", mul_add, listed=4),
    Family("kv_attention", "enable_kv_attention", kv_attention, listed=7),
    Family("gemv", "enable_gemv", gemv, listed=8),
    Family("linear", "enable_linear", linear, listed=9, active=linear.uses_onednn),
)

FAMILY_NAMES: tuple = tuple(f.name for f in FAMILIES)  # pass order
PATTERN_NAMES: tuple = tuple(f.name for f in sorted(FAMILIES, key=lambda f: f.listed))  # listing order
BY_NAME: dict = {f.name: f for f in FAMILIES}
SWITCHES: tuple = tuple(dict.fromkeys(f.switch for f in FAMILIES))  # each FusionPatterns switch once

__all__ = ["Family", "FAMILIES", "FAMILY_NAMES", "PATTERN_NAMES", "BY_NAME", "SWITCHES"]
