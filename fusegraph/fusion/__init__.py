"""FX-graph fusion: the pass manager (passes.py) and one pattern family per file (patterns/<family>.py)."""
from .passes import FAMILIES, fuse_graph

__all__ = ["FAMILIES", "fuse_graph"]
