"""Pass manager: the redundant-node pass, then the pattern families in order, to a fixpoint (SPEC §3).

Input is an aten graph as aot_autograd produces it for inference (functionalized, decomposed with
Inductor's ``select_decomp_table()``, the same table the patterns are traced with). Each family is one
``PatternMatcherPass``, built once per process per relevant option set (registration traces every
pattern, which is slow) and shared by every Backend whose options match.
"""
from __future__ import annotations

import copy
import importlib
import logging
import operator
import os
import threading
import warnings
from typing import Optional

import torch
import torch.fx
from torch._inductor.pattern_matcher import PatternMatcherPass

from ..stats import PATTERN_NAMES

log = logging.getLogger("fusegraph")

# Pass order: a family whose pattern contains another's runs first (adaln and rope before mul_add, ...).
FAMILIES = ("adaln", "rope", "rms_norm", "gelu", "mul_add")
assert set(FAMILIES) == set(PATTERN_NAMES)

# Options (FusionPatterns attribute names) that change what a family registers, beyond its on/off switch.
_FAMILY_OPTIONS = {"gelu": ("gelu_approximation",)}
_MAX_ROUNDS = 8

_passes: dict = {}
_passes_lock = threading.RLock()


def _fusion_patterns(config):
    """A FusionPatterns from a CompilationConfig, a FusionPatterns, or None (process defaults)."""
    from ..config import CompilationConfig, FusionPatterns

    if config is None:
        return FusionPatterns()
    if isinstance(config, CompilationConfig):
        return config.fusion_patterns
    if isinstance(config, FusionPatterns):
        return config
    raise TypeError(f"config must be a CompilationConfig, a FusionPatterns or None, got {type(config).__name__}")


def family_key(family: str, opts) -> tuple:
    """What a family's registered patterns depend on: its name and its relevant options."""
    return (family,) + tuple((name, getattr(opts, name)) for name in _FAMILY_OPTIONS.get(family, ()))


def pattern_pass(family: str, opts) -> PatternMatcherPass:
    """The family's PatternMatcherPass for these options, registered on first use and cached."""
    if family not in FAMILIES:
        raise ValueError(f"unknown pattern family {family!r}; known: {FAMILIES}")
    key = family_key(family, opts)
    with _passes_lock:
        pm = _passes.get(key)
        if pm is None:
            pm = PatternMatcherPass(pass_name=f"fusegraph_{family}")
            module = importlib.import_module(f"{__package__}.patterns.{family}")
            # Trace patterns outside any fake mode / tracing context the caller may be in (as Inductor's own
            # lazily registered patterns do), on fresh fake tensors.
            from torch._dynamo.utils import counters
            from torch._subclasses.fake_tensor import FakeTensorMode, unset_fake_temporarily

            saved = counters["inductor"].copy()
            # Tracing mixed-dtype patterns (e.g. Wan's fp32 LayerNorm of a bf16 input) makes ATen warn about
            # its unfused layer_norm path; that is about the pattern's trace, not the user's model.
            with torch._guards.tracing(None), unset_fake_temporarily(), FakeTensorMode(), \
                    warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Mismatch dtype between input and weight")
                module.register(pm, copy.deepcopy(opts))
            counters["inductor"] = saved
            _guard_entries(pm)
            _passes[key] = pm
    return pm


def _has_no_scaled_add(match) -> bool:
    """Inductor's matcher compares a node's positional arguments but not extra keyword arguments, so
    ``add(c, p, alpha=2.5)`` would match a pattern traced from ``c + p``; such a match is refused."""
    for node in match.nodes:
        if node.op == "call_function" and node.kwargs.get("alpha", 1) != 1:
            return False
    return True


def _guard_entries(pm: PatternMatcherPass) -> None:
    """Adds the framework's own checks to every pattern a family registered."""
    for entries in pm.patterns.values():
        for entry in entries:
            check = entry.extra_check
            entry.extra_check = (lambda m, check=check: _has_no_scaled_add(m) and check(m))


# ---------------------------------------------------------------------------------------------------------
# Redundant-node pass


def remove_redundant_nodes(graph: torch.fx.Graph) -> int:
    """Drops no-op clones, identity views/reshapes/slices/casts (Inductor's ``remove_noop_ops``, which never
    creates new input/output aliasing) and single-piece splits. Returns the number of nodes removed."""
    from torch._inductor.fx_passes.post_grad import remove_noop_ops

    before = len(graph.nodes)
    _remove_single_piece_splits(graph)
    remove_noop_ops(graph)
    graph.eliminate_dead_code()
    return before - len(graph.nodes)


_SPLITS = (torch.ops.aten.split.Tensor, torch.ops.aten.split_with_sizes.default, torch.ops.aten.chunk.default)


def _remove_single_piece_splits(graph: torch.fx.Graph) -> None:
    outputs = set()
    out = next(iter(reversed(graph.nodes)))
    torch.fx.node.map_arg(out.args, outputs.add)
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target not in _SPLITS:
            continue
        val = node.meta.get("val")
        src = node.args[0]
        src_val = src.meta.get("val") if isinstance(src, torch.fx.Node) else None
        if not isinstance(val, (list, tuple)) or len(val) != 1 or src_val is None:
            continue
        if tuple(val[0].shape) != tuple(src_val.shape) or val[0].stride() != src_val.stride():
            continue
        for user in list(node.users):
            if user.op == "call_function" and user.target is operator.getitem and user.args[1] == 0:
                if user in outputs and src.op == "placeholder":
                    continue  # would make an output the input itself
                user.replace_all_uses_with(src)
                graph.erase_node(user)
        if not node.users:
            graph.erase_node(node)


# ---------------------------------------------------------------------------------------------------------
# Graph log (graph_log_url)


def prepare_log_dir(path) -> Optional[str]:
    """Creates the graph_log_url directory; a path that exists and is not a directory is an error."""
    if path is None:
        return None
    path = os.fspath(path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise ValueError(f"graph_log_url={path!r} exists and is not a directory; expected a directory for graph logs")
    try:
        os.makedirs(path, exist_ok=True)
    except OSError as e:
        raise ValueError(f"graph_log_url={path!r}: cannot create the directory ({e})") from e
    return path


class GraphLog:
    """Writes the graph before and after each pass as ``<graph>_<step>_<pass>_{before,after}.txt``."""

    def __init__(self, folder: Optional[str], graph_name: str):
        self.folder = folder
        self.graph_name = graph_name
        self.step = 0

    def write(self, pass_name: str, when: str, graph: torch.fx.Graph) -> None:
        if self.folder is None:
            return
        gm = graph.owning_module
        try:
            text = gm.print_readable(print_output=False, include_stride=True) if gm is not None else str(graph)
        except Exception:  # print_readable needs a recompiled module; the IR text is always available
            text = str(graph)
        name = f"{self.graph_name}_{self.step:03d}_{pass_name}_{when}.txt"
        with open(os.path.join(self.folder, name), "w") as f:
            f.write(text)
        if when == "after":
            self.step += 1


# ---------------------------------------------------------------------------------------------------------
# Entry point


def _run(name, fn, graph, glog):
    if glog is not None:
        glog.write(name, "before", graph)
    n = fn(graph)
    if glog is not None:
        glog.write(name, "after", graph)
    return n


def fuse_graph(gm_or_graph, config=None, *, stats=None, graph_log: Optional[GraphLog] = None,
               redundant: bool = True) -> dict:
    """Runs the redundant-node pass and the enabled pattern families (in ``FAMILIES`` order) on the graph
    until nothing changes. ``config`` is a CompilationConfig, a FusionPatterns or None (process defaults).
    Returns ``{family: replacements}`` for every family (0 when disabled) and adds it to ``stats.patterns``."""
    opts = _fusion_patterns(config)
    graph = gm_or_graph.graph if isinstance(gm_or_graph, torch.fx.GraphModule) else gm_or_graph
    counts = {name: 0 for name in FAMILIES}
    families = [(f, pattern_pass(f, opts)) for f in opts.enabled_families()]
    for _ in range(_MAX_ROUNDS):
        changed = 0
        if redundant:
            changed += _run("redundant", remove_redundant_nodes, graph, graph_log)
        replaced = 0
        for family, pm in families:
            n = _run(family, pm.apply, graph, graph_log)
            counts[family] += n
            replaced += n
        if not replaced:
            break
    else:
        log.warning("fusegraph: fusion did not reach a fixpoint in %d rounds", _MAX_ROUNDS)
    graph.eliminate_dead_code()
    graph.lint()
    if isinstance(gm_or_graph, torch.fx.GraphModule):
        gm_or_graph.recompile()
    if stats is not None:
        stats.add_patterns(counts)
    return counts
