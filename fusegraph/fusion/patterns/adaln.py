"""adaln pattern family: written on branch `patterns`; until it lands this registers nothing."""


def register(pm, opts) -> None:
    """Registers no patterns yet (placeholder so the pass manager runs)."""
    return None
