"""Pattern families. Each module ``<family>.py`` defines ``register(pm, opts)``, which registers that family's
search/replace patterns (``torch._inductor.pattern_matcher.register_replacement``) into the
``PatternMatcherPass`` ``pm``; ``opts`` is a ``FusionPatterns`` snapshot. The pass manager
(``fusegraph.fusion.passes``) owns order, caching and counting."""
