"""FX-graph fusion: the family table (patterns/__init__.py, one pattern family per file), the pass manager
(passes.py), Inductor's custom pass (inductor_pass.py) and the per-site choice (choice.py)."""
from .passes import fuse_graph
from .patterns import FAMILIES, FAMILY_NAMES, PATTERN_NAMES

__all__ = ["FAMILIES", "FAMILY_NAMES", "PATTERN_NAMES", "fuse_graph"]
