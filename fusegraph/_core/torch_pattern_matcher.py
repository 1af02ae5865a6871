"""Adaptor for ``torch._inductor.pattern_matcher``: the names the pattern families and the pass manager use."""
from __future__ import annotations

from torch._inductor import pattern_matcher as module  # noqa: F401  (traced.py wraps its pattern generation)
from torch._inductor.pattern_matcher import (  # noqa: F401
    CallFunction,
    FailedMatch,
    KeywordArg,
    Match,
    MatchContext,
    PatternMatcherPass,
    fwd_only,
    register_graph_pattern,
    register_replacement,
)
