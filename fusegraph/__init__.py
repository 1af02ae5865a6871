"""fusegraph: a torch.compile backend that fuses DiT op chains into C++/CUDA kernels and replays
compiled graphs from a device graph (CUDA graph, Ascend NPUGraph, or a C++ host graph on CPU)."""
import torch  # noqa: F401  (loads libtorch before our extension)

from . import _C  # noqa: F401  (registers torch.ops.fusegraph.*)
from . import ops

__version__ = "0.1.0"
__all__ = ["ops", "__version__"]
