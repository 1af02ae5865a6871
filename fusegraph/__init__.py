"""fusegraph: a torch.compile backend that fuses DiT op chains into C++/CUDA kernels and replays
compiled graphs from a device graph (CUDA graph, Ascend NPUGraph, or a C++ host graph on CPU)."""
import torch  # noqa: F401  (loads libtorch before our extension)

from . import _C  # noqa: F401  (registers torch.ops.fusegraph.*)
from . import aot, graph, ops
from .backend import Backend, fusegraph_backend
from .config import CompilationConfig, FusionPatterns
from .explain import ExplainReport, explain
from .stats import Stats

__version__ = "0.1.0"
__all__ = ["aot", "ops", "graph", "Backend", "CompilationConfig", "FusionPatterns", "Stats", "explain", "ExplainReport",
           "__version__"]


def _register_backend_by_name() -> None:
    """torch.compile(backend="fusegraph") also where the package's entry point is not installed (a plain checkout).
    Where it is installed, Dynamo loads it on lookup and registering here too would be a duplicate."""
    from importlib.metadata import entry_points

    from ._core.torch_dynamo import register_backend

    if "fusegraph" in entry_points(group="torch_dynamo_backends").names:
        return
    try:
        register_backend(compiler_fn=fusegraph_backend, name="fusegraph")
    except AssertionError:  # already registered (entry point loaded first, or a re-import)
        pass


_register_backend_by_name()
