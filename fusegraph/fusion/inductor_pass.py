"""The fusion as Inductor's custom post-grad pass (``post_grad_custom_pre_pass``) on the default route.

``FusionPass`` runs the pattern families (``passes.fuse_graph``) and the per-site choice (``choice.choose``) on
Inductor's post-grad graph, and keys Inductor's caches by everything its result depends on (``uuid()``), as
vLLM's ``PostGradPassManager`` does. Inductor serves a cached graph without calling the pass, so the pass also
keeps a record of what it produced (counts, fallbacks, pass logs, sites lowered, the final graph's ops) on disk,
under a key of the graph and the pass options; a cache hit reads it back (``after_compile``).
"""
from __future__ import annotations

import functools
import hashlib
import json
import os
import threading
from typing import Optional

import torch

from .._core import cache
from .._core.cache import read_json
from .._core.torch_dispatcher import OpOverload
from .._core.torch_inductor import custom_graph_pass_base

from . import choice, passes, patterns
from .patterns import linear as linear_rule
from .job import FusionJob

_PassBase = custom_graph_pass_base()



@functools.lru_cache(maxsize=None)
def _source_hash() -> str:
    """The fusion's source: the family modules, the pass manager, the choice, this pass, the job and the compile
    pipeline (what the record holds, and the freezing's packing policy)."""
    from .._core.torch_inductor import get_hash_for_files

    from . import patterns

    folder = os.path.dirname(patterns.__file__)
    files = [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".py")]
    package = os.path.dirname(os.path.dirname(__file__))
    files += [passes.__file__, choice.__file__, __file__, os.path.join(os.path.dirname(__file__), "job.py"),
              os.path.join(package, "pipeline.py"), os.path.join(package, "backend.py"),
              os.path.join(package, "freezing.py"), os.path.join(package, "packing.py")]
    return get_hash_for_files(tuple(files)).hex()


def _choice_key() -> str:
    """The cost model the per-site choice reads (Inductor's cache key must change when it does)."""
    model = choice.cost_model()
    return hashlib.sha256(repr((model.source, sorted(model.tables.items(), key=str), choice.MARGIN,
                                sorted(choice.CONTEXT_US.items()))).encode()).hexdigest()[:16]


class FusionPass(_PassBase):
    """Runs fusegraph's passes on Inductor's post-grad graph (inference graphs only) for one compile, whose
    ``FusionJob`` keeps what they did."""

    def __init__(self, config, job: FusionJob):
        self.config = config
        self.job = job

    def __call__(self, graph: torch.fx.Graph, is_inference: bool = True) -> None:
        self.job.pass_ran = True
        if not is_inference:
            reason = "autograd graph: fusion skipped (fused ops have no backward)"
            self.job.pass_fallbacks.append(reason)
            self.job.note_fallback(reason)
            return
        choosing = self.config.fusion_choice in ("auto", "model")
        original = _snapshot(graph) if choosing else None
        self.job.fuse(graph)
        if choosing:
            self.job.choose(graph)
            # Every site lowered back (or none matched): Inductor gets the graph exactly as it came, not the
            # fusion's prepared form (shared norm cores split per weight, no-ops removed), which compiles to
            # other, not better, code (the zoo's LuminaNextDiT: 0.96x plain Inductor before, 1.17x after).
            if not any(_is_fused(n) for n in graph.nodes) and _restore(graph, original):
                self.job.record_ops(graph)

    def uuid(self):
        """Inductor's cache key for what this pass does; None (Inductor and AOTAutograd then bypass their caches)
        while verifying with several ranks: verify exchanges with the other ranks (``passes._verified``), so the
        pass must run on every rank that compiles, and a cache warm on one rank and cold on another would have the
        pass, and its collectives, run on some ranks only."""
        from .._core.ranks import distributed_world

        if self.config.verify and distributed_world():
            return None
        fp = self.config.fusion_patterns
        opts = tuple(sorted(fp.as_dict().items())) + (("verify", self.config.verify),
                                                      ("choice", self.config.fusion_choice == "always", _choice_key(),
                                                       torch.get_num_threads()),
                                                      ("weights", "opt-in freezing; packing: linear bf16/fp16 "
                                                       "only, conv measured", self.config.concat_linear,
                                                       self.config.pack_weights),  # freezing.py
                                                      ("cpp_wrapper", self.config.cpp_wrapper),
                                                      ("linear", patterns.BY_NAME["linear"].on(fp),
                                                       [str(d) for d in linear_rule.routed_dtypes(fp.enable_linear)]),
                                                      ("gemv", _few_row_key(fp.enable_gemv)))
        return hashlib.sha256(repr((_source_hash(), opts)).encode()).hexdigest()

    def __deepcopy__(self, memo):  # Inductor may deep-copy its config; the pass is stateless as far as it is concerned
        return self

    def after_compile(self, gm, example_inputs, freeze: bool) -> Optional[dict]:
        """After ``compile_fx``: stores the job's record when the pass ran; otherwise (Inductor's cache served the
        graph) returns the record of the compile that ran it, or None when there is none."""
        key = _record_key(gm, example_inputs, self.uuid(), freeze)
        job = self.job
        if job.pass_ran:
            _store_record(key, {"counts": job.counts, "fallbacks": job.pass_fallbacks, "log": job.glog.entries,
                                "lowered": job.lowered, "ops": dict(job.ops)})
            return None
        return _load_record(key)


def _is_fused(node: torch.fx.Node) -> bool:
    return node.op == "call_function" and isinstance(node.target, OpOverload) \
        and node.target.namespace == "fusegraph"


def _snapshot(graph: torch.fx.Graph) -> torch.fx.Graph:
    """A copy of ``graph``'s nodes (names, targets, meta) in a graph of its own."""
    copy = torch.fx.Graph(owning_module=graph.owning_module)
    value, output = copy.graph_copy(graph, {}, return_output_node=True)
    copy.output(value, type_expr=output.type).meta = dict(output.meta)
    return copy


def _restore(graph: torch.fx.Graph, saved: torch.fx.Graph) -> bool:
    """Replaces ``graph``'s nodes, in place, by ``saved``'s, under their own names (a fresh name space: the
    erased nodes' names would otherwise stay taken). False, ``graph`` untouched, where this torch's Graph keeps
    its names elsewhere."""
    if not hasattr(graph, "_graph_namespace"):
        return False
    namespace = type(graph._graph_namespace)
    for node in reversed(list(graph.nodes)):
        graph.erase_node(node)
    graph._graph_namespace = namespace()
    value, output = graph.graph_copy(saved, {}, return_output_node=True)
    graph.output(value, type_expr=output.type).meta = dict(output.meta)
    graph.lint()
    return True


def _few_row_key(mode) -> list:
    """What ``enable_gemv=mode`` fuses here, per dtype and row count (the class's table under "auto")."""
    from . import gemm_table
    from .patterns import gemv, linear as linear_family

    if mode != "auto":
        return [bool(mode)]
    return [gemm_table.gemv_lookup(d, m)[0] for d in linear_family.DTYPES for m in range(1, gemv.MAX_ROWS + 1)]


def _record_key(gm, example_inputs, pass_uuid, freezing) -> str:
    """Identifies one Inductor compile of a Dynamo graph as far as fusion is concerned."""
    inputs = [(tuple(x.shape), tuple(x.stride()), str(x.dtype), x.device.type, x.requires_grad)
              if isinstance(x, torch.Tensor) else repr(x) for x in example_inputs]
    text = repr((gm.code, inputs, pass_uuid, freezing, torch.is_grad_enabled(), torch.__version__))
    return hashlib.sha256(text.encode()).hexdigest()


def _record_path(key: str) -> str:
    return cache.path("counts", key + ".json")


_records: dict = {}  # this process's records, by key (the files serve other processes)


def _store_record(key: str, record: dict) -> None:
    _records[key] = record
    try:
        path = _record_path(key)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "w") as f:
            json.dump(record, f)
        os.replace(tmp, path)
    except OSError:  # counts are a report, never worth failing a compile
        pass


def _load_record(key: str) -> Optional[dict]:
    if key in _records:
        return _records[key]
    def check(data) -> dict:
        counts, lowered = data["counts"], data.get("lowered")
        return {"counts": None if counts is None else {str(k): int(v) for k, v in counts.items()},
                "lowered": None if lowered is None else {str(k): int(v) for k, v in lowered.items()},
                "ops": {str(k): int(v) for k, v in (data.get("ops") or {}).items()},
                "fallbacks": [str(r) for r in data["fallbacks"]], "log": [[str(a), str(b)] for a, b in data["log"]]}

    return read_json(_record_path(key), check)  # a malformed record: one warning, the counts unknown
