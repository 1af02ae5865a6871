"""Fused AOTInductor packages: ``package`` compiles a model once into a ``.pt2`` file whose code calls fusegraph's
fused ops; ``load`` runs it in any process, with no compile (a C++ program runs it too: examples/aot_runner).

    package(model, args, kwargs, path, config, dynamic_shapes)
        torch.export.export (non-strict)  ->  ExportedProgram          (or the caller's own)
        AOTInductor (aot_compile), with fusegraph's fusion as Inductor's post-grad custom pass
        (inductor_pass.FusionPass: the families and the per-site choice of the Inductor route)
        -> the package: AOTInductor's files, plus metadata compiled into its .so (csrc/aot/package_check.h)
           and the fusion's record (extra/fusegraph.json: counts, sites lowered, fallbacks, final ops)
    load(path) -> AOTModel
        checks the process can run it (torch, the CPU's instruction sets, the ops registered), then each call
        checks its inputs against the exported ones and runs the package (AOTIModelPackageLoader.boxed_run).

The passes reach AOTInductor as its post-grad custom pass rather than by rewriting the exported graph first:
AOTInductor decomposes the exported program and runs its own joint-graph and post-grad passes before codegen, so
a graph fused in advance would be traced again through those decompositions (the fused ops survive as extern
calls, but the patterns' per-site choice needs the post-grad graph Inductor will lower, the one the JIT Inductor
route chooses on). The same pass object on both routes gives the same fused sites by construction.
"""
from __future__ import annotations

import collections
import copy
import json
import os
import shutil
import tempfile
import zipfile
import zlib
from typing import Any, Optional, Union

import torch

from . import _C
from ._core import torch_inductor
from ._core.torch_dispatcher import OpOverload, cpu_capabilities, pytree
from .config import CompilationConfig
from .fusion import passes
from .fusion.inductor_pass import FusionPass
from .fusion.job import FusionJob
from .fusion.patterns import PATTERN_NAMES
from .stats import Stats

_ASSERT_METADATA = torch.ops.aten._assert_tensor_metadata.default
# load_weights' answer, as nn.Module.load_state_dict's
IncompatibleKeys = collections.namedtuple("IncompatibleKeys", ["missing_keys", "unexpected_keys"])
_ROPE = torch.ops.fusegraph.rope.default
RECORD = "fusegraph.json"  # the fusion's record, in the package's extra/ folder
# the package's files and their CRC-32s, in its extra/ folder: "crc32 size name" lines (csrc/aot/package_check.h)
FILES = "fusegraph.files"
WEIGHTS = ("embedded", "separate")


def package(model: Union[torch.nn.Module, "torch.export.ExportedProgram"], args: tuple = (),
            kwargs: Optional[dict] = None, path: Optional[str] = None, config=None, dynamic_shapes=None, *,
            weights: str = "separate", stats: Optional[Stats] = None) -> str:
    """Exports ``model`` (an ``nn.Module``, called as ``model(*args, **kwargs)``; or an ``ExportedProgram``, whose
    example inputs are used), compiles it with AOTInductor and fusegraph's fusion, and writes the package to
    ``path`` (a ``.pt2`` file); returns ``path``.

    ``config``: a ``CompilationConfig``, a dict of its fields, or None (the defaults); its fusion settings and
    ``inductor_options`` apply (``{"cpp.march": "x86-64-v3"}`` with ``ATEN_CPU_CAPABILITY=avx2`` in the environment: code for every AVX2 CPU
    rather than this one's; cpp.march alone does not lower the vector ISA of Inductor's kernels).
    ``dynamic_shapes``: ``torch.export``'s (``torch.export.Dim``). ``weights``: ``"separate"`` (default) keeps the
    parameters beside the compiled code, in the package, where ``AOTModel.load_weights`` replaces them without a
    compile; ``"embedded"`` compiles them into the .so. ``stats``: a ``Stats`` that receives the fusion's counts
    (``Stats.patterns``, ``lowered``, ``fallbacks``)."""
    cfg = _config(config)
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path).endswith(".pt2"):
        raise ValueError(f"fusegraph.aot.package: path must be a file name ending in .pt2, got {path!r}")
    if weights not in WEIGHTS:
        raise ValueError(f"fusegraph.aot.package: weights must be one of {WEIGHTS}, got {weights!r}")
    path = os.fspath(path)
    ep = _export(model, args, kwargs, dynamic_shapes)
    flat_args, flat_kwargs = ep.example_inputs
    device = _device(ep)

    job = FusionJob(cfg, 0, log_dir=passes.prepare_log_dir(cfg.graph_log_url), label="fusegraph.aot")
    for reason in _unused_settings(cfg):
        job.note_fallback(reason)
    fusion_pass = FusionPass(cfg, job)
    metadata = {"fusegraph.torch": ".".join(torch.__version__.split("+")[0].split(".")[:2]),
                "fusegraph.device": device.type,
                "fusegraph.cpu_flags": ",".join(_cpu_flags(cfg)) if device.type == "cpu" else "",
                "fusegraph.inputs": _inputs_spec(ep),
                "fusegraph.ops": ""}  # filled by the pass, before codegen reads the metadata (_OpsRecorder)
    options = {**cfg.inductor_options,
               "post_grad_custom_pre_pass": _OpsRecorder(fusion_pass, metadata),
               # the pass must run to count and record its sites: no FX graph cache serving a package build
               "fx_graph_cache": False,
               "aot_inductor.package": True,
               "aot_inductor.metadata": metadata,
               "aot_inductor.package_constants_in_so": weights == "embedded",
               # every weight a constant the package can replace: Inductor otherwise compiles a 0-d or <= 8-element
               # parameter (a final projection's bias) into the code as literals, which load_weights cannot reach
               "always_keep_tensor_constants": True}
    if weights == "separate" and not (ep.state_dict or ep.constants):
        # no weights at all: a separate blob would be empty, which the loader cannot map; nothing to replace anyway
        options["aot_inductor.package_constants_in_so"] = True
    elif weights == "separate":
        options["aot_inductor.package_constants_on_disk_format"] = "binary_blob"
    with torch.no_grad():
        files = torch_inductor.aot_compile(ep.module(), flat_args, flat_kwargs, options=options)
    if not job.pass_ran:
        raise RuntimeError("fusegraph.aot.package: AOTInductor compiled the model without running fusegraph's "
                           "fusion pass (its FX graph cache served it?); nothing was fused")
    record = {"counts": job.counts, "lowered": job.lowered, "fallbacks": job.pass_fallbacks + job.tally.fallbacks,
              "ops": dict(job.ops), "device": device.type, "weights": weights, "metadata": metadata,
              "constants": _constant_leaves(ep), "state": _state_spec(ep)}
    # written whole under its own name (the archive's folder is named after the file) in a fresh folder beside it,
    # then moved into place: a reader never sees a half-written package
    folder = tempfile.mkdtemp(prefix=".fusegraph-aot-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        tmp = os.path.join(folder, os.path.basename(path))
        torch_inductor.package_pt2(tmp, aoti_files=files, extra_files={RECORD: json.dumps(record, sort_keys=True),
                                                                        FILES: _files_manifest(files)})
        os.replace(tmp, path)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    if stats is not None:
        stats.absorb(job.tally)
    return path


class AOTModel:
    """A loaded package: call it as the model was called (``args``/``kwargs`` of the same structure; tensors of
    the exported dtypes, devices and shapes, a dynamic dim within its range)."""

    def __init__(self, path: str, loader, record: dict):
        self.path = path
        self._loader = loader  # torch's AOTIModelPackageLoader (C++), as a C++ program would hold it
        self.record = record  # the fusion's record: counts, lowered, fallbacks, ops, weights, metadata
        self.metadata = loader.get_metadata()
        spec = loader.get_call_spec()
        self._in_spec = pytree.treespec_loads(spec[0])
        self._out_spec = pytree.treespec_loads(spec[1])

    @property
    def counts(self) -> dict:
        """Sites fused per family, as the package's fusion pass counted them."""
        return {name: (self.record.get("counts") or {}).get(name, 0) for name in PATTERN_NAMES}

    def __call__(self, *args, **kwargs):
        flat = self.flat_inputs(args, kwargs)
        return pytree.tree_unflatten(self._loader.boxed_run(flat), self._out_spec)

    def flat_inputs(self, args: tuple, kwargs: dict) -> list:
        """The call's tensors in the package's order, checked against the exported inputs (dtype, device, shape, the
        dims the export tied together, the non-tensor arguments' values) and laid out as the package takes them."""
        extra = sorted(set(kwargs) - set(_kwarg_names(self._in_spec)))
        if extra:
            raise TypeError(f"fusegraph.aot: {self.path} was exported without the keyword arguments {extra}; it takes "
                            f"{_kwarg_names(self._in_spec)}")
        try:
            leaves, spec = pytree.tree_flatten((args, _reorder(kwargs, self._in_spec)))
        except KeyError as e:
            raise TypeError(f"fusegraph.aot: {self.path} takes the keyword arguments "
                            f"{_kwarg_names(self._in_spec)}; got {sorted(kwargs)}: missing {e}") from None
        exported = self._in_spec.child(0).num_children if self._in_spec.num_children else 0
        if spec != self._in_spec and len(args) != exported:
            tensors = [e.split("|")[0] for e in self.metadata.get("fusegraph.inputs", "").split(";") if e]
            raise TypeError(f"fusegraph.aot: {self.path} was exported with {exported} positional argument(s); got "
                            f"{len(args)} (its tensor inputs, positional then keyword: {', '.join(tensors)})")
        if spec != self._in_spec:
            raise TypeError(f"fusegraph.aot: {self.path} was exported for arguments structured as\n  "
                            f"{self._in_spec}\ngot\n  {spec}")
        for i, exported in self.record.get("constants") or ():
            if i < len(leaves) and not _same_constant(leaves[i], exported):
                shown = exported["repr"] if isinstance(exported, dict) else repr(exported)
                raise ValueError(f"fusegraph.aot: {self.path}: argument leaf {i} was {shown} when the package was "
                                 f"exported and is {leaves[i]!r} now: a non-tensor argument is compiled into the "
                                 "package as a constant; package again for this value, or pass it as a tensor")
        flat = [x for x in leaves if isinstance(x, torch.Tensor)]
        # checked, and each laid out as the package's code indexes it (another layout is copied into it)
        return _C.aot_prepare_inputs(self.metadata, flat)

    def serve(self, module: torch.nn.Module) -> torch.nn.Module:
        """Makes ``module`` (the model the package was made from, or one like it) run its forward from the package:
        its attributes (a diffusers model's ``config``, ``dtype``, ``cache_context``) stay, so a pipeline keeps
        working as ``pipe.transformer``; its own parameters are no longer read. Returns ``module``."""
        module.forward = self
        return module

    def weight_names(self) -> list:
        """The names of the weights the package holds (the model's ``state_dict`` names)."""
        return list(self._loader.get_constant_fqns())

    def load_weights(self, state_dict: dict, *, strict: bool = True) -> "IncompatibleKeys":
        """Replaces the package's weights by ``state_dict``'s (copied), as ``nn.Module.load_state_dict`` would: a
        LoRA-merged state dict, a fine-tune, the model's own ``state_dict()``. Returns the ``missing_keys`` and
        ``unexpected_keys``, as ``load_state_dict`` does.

        Each tensor must have the shape of the weight it replaces: the package's code is compiled for those shapes and
        reads the bytes it is given as them (another shape would be read past its end). Another dtype or device is
        converted into the weight's, as ``load_state_dict``'s ``copy_`` converts (a float64 or bf16 copy of an fp32
        weight loads rounded to fp32); a non-contiguous tensor (``w.t()``) is copied contiguous, the layout the code
        reads. ``strict``: every weight of the package must be given, except the non-persistent buffers
        (``state_dict()`` leaves them out), and every name given must be one of the model's; ``strict=False`` loads the
        names the package holds and ignores the others. A name the model had but the package does not hold (a
        submodule its forward never calls, compiled out) is ignored either way. Everything is checked before any weight
        is replaced: an error leaves the package's weights as they were."""
        names = self.weight_names()
        state = self.record.get("state")
        if state is None and names:
            raise RuntimeError(f"fusegraph.aot: {self.path} was packaged by a fusegraph that did not record its "
                               "weights' shapes and dtypes, which load_weights must check (the code reads the bytes "
                               "it is given as the exported shapes): package it again")
        state = state or {}
        held = set(names)
        unexpected = sorted(set(state_dict) - held - set(state))
        # a name the export did not describe (a constant Inductor made itself) is neither required nor replaceable
        missing = sorted(n for n in names if n not in state_dict and (state.get(n) or {}).get("persistent", False))
        undescribed = sorted(n for n in names if n in state_dict and n not in state)
        if undescribed:
            raise KeyError(f"fusegraph.aot: {self.path}: load_weights cannot replace {_some(undescribed)}: the "
                           "package holds them, but not as weights of the exported model (no shape to check against)")
        if strict and (unexpected or missing):
            what = []
            if missing:
                what.append(f"missing {_some(missing)}")
            if unexpected:
                what.append(f"the model had no weights named {_some(unexpected)}")
            raise KeyError(f"fusegraph.aot: {self.path}: load_weights(strict=True) needs every weight of the package "
                           f"and only the model's: {'; '.join(what)} (strict=False loads the names it holds)")
        # a tied weight given only under a name the package does not hold fills the held name it is tied to (torch's
        # load_state_dict copies into the one shared tensor; its missing_keys still name the other key)
        given = dict(state_dict)
        tie = {n: (state.get(n) or {}).get("tied", n) for n in state}
        for name in names:
            if name not in given and name in tie:
                other = next((n for n in state_dict if n not in held and tie.get(n) == tie[name]), None)
                if other is not None:
                    given[name] = state_dict[other]
        constants = {name: self._weight(name, given[name], state[name]) for name in names if name in given}
        # (constants, use_inactive, check_full_update, user_managed, allow_h2d_copy): copied into the active set
        self._loader.load_constants(constants, False, False, False, False)
        return IncompatibleKeys(missing, unexpected)

    def _weight(self, name: str, value, spec: dict) -> torch.Tensor:
        """``value`` as the package's weight ``name`` must be handed to its loader: checked against the exported
        shape, converted to the weight's dtype and device, contiguous."""
        shape, dtype = tuple(spec["shape"]), getattr(torch, spec["dtype"])
        expected = f"a {spec['dtype']} tensor of shape {list(shape)}"
        if not isinstance(value, torch.Tensor):
            raise TypeError(f"fusegraph.aot: {self.path}: load_weights got a {type(value).__name__} for weight "
                            f"{name!r}; expected {expected}")
        if tuple(value.shape) != shape:
            raise ValueError(f"fusegraph.aot: {self.path}: load_weights got weight {name!r} of shape "
                             f"{list(value.shape)}; the package's is {expected}: its code is compiled for that "
                             "shape (package the model again for another)")
        if value.is_complex() != dtype.is_complex:
            raise ValueError(f"fusegraph.aot: {self.path}: load_weights got weight {name!r} of dtype "
                             f"{str(value.dtype).replace('torch.', '')}; the package's is {expected} (a complex "
                             "value does not convert to a real one, nor the other way)")
        device = self.record.get("device") or "cpu"
        return value.detach().to(device=device, dtype=dtype).contiguous()


def load(path: str, *, check_weights: bool = True) -> AOTModel:
    """Loads a package made by ``package`` and checks this process can run it: the package whole (every file it was
    written with present, of its size and CRC-32: a damaged shared object would crash the process when loaded, a
    damaged weights blob compute garbage), the torch it was compiled with, the CPU's instruction sets (Inductor's
    code is compiled for the packaging machine's, or for ``cpp.march``), the fused ops registered. Any problem is a
    RuntimeError naming it; nothing runs.

    ``check_weights=False`` skips the CRC of the weights blob (its presence and size are still checked): the CRC
    reads it whole: ~0.65 s per GB, where the load itself (which extracts it) takes ~1.5 s per GB (a 257 MB package
    loads in 0.55 s checked, 0.38 s not). For a package whose bytes were checked once already (on arrival) and that
    is loaded often."""
    path = os.fspath(path)
    if not os.path.isfile(path):
        raise FileNotFoundError(f"fusegraph.aot.load: no package at {path!r}")
    if not zipfile.is_zipfile(path):
        raise RuntimeError(f"fusegraph.aot.load: {path!r} is not a .pt2 package (not a zip archive, or one cut short)")
    record = _read_record(path)
    _check_files(path, weights=check_weights)
    metadata = record.get("metadata") or {}
    problems = _C.aot_package_problems({str(k): str(v) for k, v in metadata.items()}, path)
    if problems:  # before loading the .so: its code may not run on this CPU
        raise RuntimeError("fusegraph.aot.load: cannot run this package here:\n  " +
                           problems.strip().replace("\n", "\n  "))
    # torch's C++ loader directly: torch._inductor.aoti_load_package also probes the CPU's vector ISA by compiling
    # test programs (1-8 s in a fresh process) for a warning this check has already made exact
    loader = torch_inductor.AOTIModelPackageLoader(path, "model", False, 1, -1)
    return AOTModel(path, loader, record)


# ---- helpers -------------------------------------------------------------------------------------------------------

class _OpsRecorder:
    """The fusion pass, recording which fusegraph ops the final graph calls into the package's metadata (read by
    AOTInductor's codegen after the post-grad passes)."""

    def __init__(self, fusion_pass: FusionPass, metadata: dict):
        self.fusion_pass = fusion_pass
        self.metadata = metadata

    def __call__(self, graph: torch.fx.Graph, is_inference: bool = True) -> None:
        # torch.export keeps a dtype/device assert per .to()/.float() of the source (aten._assert_tensor_metadata):
        # facts of the exported graph, checked at export, and one more user of a value inside every pattern that
        # converts (RoPE's x.float()), which would refuse the match. Inductor drops them when it lowers anyway.
        for node in list(graph.nodes):
            if node.op == "call_function" and node.target is _ASSERT_METADATA and not node.users:
                graph.erase_node(node)
        self.fusion_pass(graph, is_inference)
        # AOTInductor's proxy-executor call spells a bool given to a Scalar argument (the schema's default too) as Python's `True` in C++ (a
        # compile error); rope's `interleaved` takes the ints 1/0 for the same meaning (csrc/ops/rope.cpp).
        for node in graph.nodes:
            if node.op == "call_function" and node.target is _ROPE:
                node.kwargs = {**node.kwargs, "interleaved": int(node.kwargs.get("interleaved", True))}
        ops = sorted({f"{n.target.namespace}::{n.target._opname}.{n.target._overloadname}" for n in graph.nodes
                      if n.op == "call_function" and isinstance(n.target, OpOverload)
                      and n.target.namespace == "fusegraph"})
        self.metadata["fusegraph.ops"] = ",".join(ops)
        # AOTInductor compiles the metadata it holds in its (patched, copied) config into the .so at codegen
        torch_inductor.config.aot_inductor.metadata["fusegraph.ops"] = ",".join(ops)

    def uuid(self):
        return None  # never cached (package sets fx_graph_cache=False)

    def __deepcopy__(self, memo):
        return self


def _config(config) -> CompilationConfig:
    if config is None:
        return CompilationConfig()
    if isinstance(config, dict):
        return CompilationConfig(**config)
    if isinstance(config, CompilationConfig):
        return copy.deepcopy(config)
    raise TypeError(f"fusegraph.aot.package: config must be a CompilationConfig, a dict of its fields or None, "
                    f"got {type(config).__name__}")


def _unused_settings(cfg: CompilationConfig) -> list:
    reasons = []
    if cfg.graph_with_compile or cfg.graph_only:
        reasons.append("graph route requested: a package runs AOTInductor's code without a device graph")
    if not cfg.inductor:
        reasons.append("inductor=False: a package is AOTInductor's code; the fusion and the per-site choice are "
                       "the Inductor route's")
    return reasons


def _export(model, args, kwargs, dynamic_shapes):
    if isinstance(model, torch.export.ExportedProgram):
        if args or kwargs or dynamic_shapes is not None:
            raise ValueError("fusegraph.aot.package: an ExportedProgram carries its own example inputs and dynamic "
                             "shapes; pass no args, kwargs or dynamic_shapes with it")
        if model.example_inputs is None:
            raise ValueError("fusegraph.aot.package: the ExportedProgram has no example_inputs")
        return model
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"fusegraph.aot.package: model must be an nn.Module or a torch.export.ExportedProgram, got "
                        f"{type(model).__name__}")
    if not isinstance(args, tuple):
        raise TypeError(f"fusegraph.aot.package: args must be a tuple, got {type(args).__name__}")
    with torch.no_grad():
        return torch.export.export(model, args, kwargs or {}, dynamic_shapes=dynamic_shapes, strict=False)


def _device(ep) -> torch.device:
    devices = {t.device for t in pytree.tree_leaves(ep.example_inputs) if isinstance(t, torch.Tensor)}
    devices |= {t.device for t in ep.state_dict.values() if isinstance(t, torch.Tensor)}
    if len(devices) != 1:
        raise ValueError(f"fusegraph.aot.package: the model and its inputs must be on one device, found "
                         f"{sorted(str(d) for d in devices) or 'none'}")
    return devices.pop()


# The x86-64 micro-architecture levels (the x86-64 psABI's; gcc's and clang's -march=x86-64-v*), each as the
# instruction sets cpuinfo names (at::cpu::get_cpu_capabilities) that it adds to the level below; the ones cpuinfo
# does not report (cmov, cx16, lahf, movbe, xsave) every CPU with the named ones has.
_X86_64_LEVELS = (
    ("x86-64", ("sse", "sse2")),
    ("x86-64-v2", ("popcnt", "sse3", "sse4_1", "sse4_2", "ssse3")),
    ("x86-64-v3", ("avx", "avx2", "bmi", "bmi2", "f16c", "fma3", "lzcnt")),
    ("x86-64-v4", ("avx512_bw", "avx512_cd", "avx512_dq", "avx512_f", "avx512_vl")),
)


# Inductor's CPU vector ISAs (``str(pick_vec_isa())``) as the cpuinfo flags their kernels need.
_VEC_ISA_FLAGS = {
    "": (),  # no vector ISA: scalar code
    "avx2": ("avx2", "fma3"),
    "avx512": ("avx512_f", "avx512_bw", "avx512_dq", "avx512_vl"),
    "avx512 avx512_vnni": ("avx512_f", "avx512_bw", "avx512_dq", "avx512_vl", "avx512_vnni"),
    "avx512 avx512_vnni amx_tile": ("avx512_f", "avx512_bw", "avx512_dq", "avx512_vl", "avx512_vnni", "amx_tile",
                                    "amx_bf16"),
}


def _cpu_flags(cfg: Optional[CompilationConfig] = None) -> list:
    """The instruction sets the package's code may use, as cpuinfo names them (``at::cpu::get_cpu_capabilities``):
    those of the x86-64 level ``cpp.march`` names when it names one, with those of the vector ISA Inductor's kernels
    are written for (``x86-64-v3`` under ``ATEN_CPU_CAPABILITY=avx2``: every AVX2 machine can load the package;
    recording this CPU's AVX-512 and AMX would refuse them all), else this CPU's (Inductor compiles
    with ``-march=native``, or for a CPU model this code does not map: the packaging CPU stands in for it)."""
    march = (cfg.inductor_options.get("cpp.march") if cfg is not None else None) \
        or getattr(getattr(torch_inductor.config, "cpp", None), "march", None)
    caps = cpu_capabilities()
    own = sorted(k for k, v in caps.items() if v is True)
    flags = []
    for level, added in _X86_64_LEVELS:
        flags += added
        if march == level:
            # Inductor's kernels also use the vector ISA it picks (this CPU's best, or ATEN_CPU_CAPABILITY's), which
            # cpp.march does not lower: its flags are required too (an x86-64-v3 package with AVX-512 kernels would
            # pass an AVX2 machine's check and die there of an illegal instruction).
            isa = _VEC_ISA_FLAGS.get(str(torch_inductor.pick_vec_isa() or ""))
            if isa is None:  # an ISA this code does not map: the packaging CPU's flags, as without a level
                return own
            return sorted(set(flags) | set(isa))
    return own


def _state_spec(ep) -> dict:
    """{name: {shape, dtype, persistent}} for the exported program's weights (its parameters, buffers and lifted
    constants): what ``load_weights`` checks a replacement against, and which names a ``state_dict()`` holds (a
    non-persistent buffer or a lifted constant it does not)."""
    non_persistent = set(ep.graph_signature.non_persistent_buffers)
    spec, first = {}, {}
    for source in (ep.state_dict, ep.constants):
        for name, value in source.items():
            if isinstance(value, torch.Tensor):
                spec[name] = {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", ""),
                              "persistent": source is ep.state_dict and name not in non_persistent}
                # a tied weight (one tensor under two names; the package holds one of them): "tied" names the
                # first, so a state dict that gives it under the other name still loads it
                key = (value.untyped_storage().data_ptr(), value.storage_offset(), tuple(value.shape),
                       tuple(value.stride())) if value.device.type != "meta" else None
                if key is not None and key in first:
                    spec[name]["tied"] = first[key]
                elif key is not None:
                    first[key] = name
    return spec


def _some(names: list) -> str:
    return f"{names[:5]}{' ...' if len(names) > 5 else ''}"


def _crc32(path: str) -> int:
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            crc = zlib.crc32(chunk, crc)
    return crc


def _files_manifest(files) -> str:
    """extra/fusegraph.files: "crc32 size name" per file AOTInductor wrote (its code, metadata, weights), name being
    the file's name in the archive's folders; checked before a load (``_check_files``,
    csrc/aot/package_check.h's package_file_problems)."""
    lines = []
    for f in files:
        if isinstance(f, (str, os.PathLike)) and os.fspath(f) and os.path.isfile(f):
            lines.append(f"{_crc32(f):08x} {os.path.getsize(f)} {os.path.basename(f)}")
    return "\n".join(lines) + "\n"


def _check_files(path: str, weights: bool = True) -> None:
    """Checks the package at ``path`` is whole: every file listed in its extra/fusegraph.files present, of the size
    and CRC-32 it was written with. Reads each in full (the loader extracts every one of them anyway, the weights blob
    included, so this adds a CRC pass over bytes read at load, not a second read of a cold file); ``weights=False``
    leaves the weights blob's bytes unread (its size is checked). A RuntimeError names the package and the file. A
    package from before the list is not checked."""
    try:
        with zipfile.ZipFile(path) as z:
            infos = {}
            for info in z.infolist():
                infos.setdefault(info.filename.rsplit("/", 1)[-1], info)
            listed = [n for n in z.namelist() if n.endswith("/extra/" + FILES) or n == "extra/" + FILES]
            if not listed:
                return
            manifest = _read_member(z, path, listed[0]).decode("utf-8", "replace")
            for line in manifest.splitlines():
                fields = line.split(" ", 2)
                if not line.strip():
                    continue
                if len(fields) != 3 or not fields[1].isdigit() or \
                        not all(c in "0123456789abcdefABCDEF" for c in fields[0]) or not fields[0]:
                    raise RuntimeError(f"fusegraph.aot.load: {path!r} is damaged: its extra/{FILES} has the line "
                                       f"{line!r}; expected 'crc32 size name'")
                crc, size, name = int(fields[0], 16), int(fields[1]), fields[2]
                info = infos.get(name)
                if info is None:
                    raise RuntimeError(f"fusegraph.aot.load: {path!r} is damaged: its file {name} is missing (the "
                                       "package was written with it)")
                if info.file_size != size or info.CRC != crc:
                    raise RuntimeError(f"fusegraph.aot.load: {path!r} is damaged: its file {info.filename} has "
                                       f"{info.file_size} bytes, CRC-32 {info.CRC:08x}; the package was written with "
                                       f"{size} bytes, CRC-32 {crc:08x}")
                if not weights and name.endswith(".blob"):
                    continue
                # zipfile checks the bytes read against the archive's CRC-32 (equal to the one written, above)
                with z.open(info) as f:
                    try:
                        while f.read(1 << 22):
                            pass
                    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
                        raise RuntimeError(f"fusegraph.aot.load: {path!r} is damaged: its file {info.filename} does "
                                           f"not read back as written ({e})") from None
    except zipfile.BadZipFile as e:
        raise RuntimeError(f"fusegraph.aot.load: {path!r} is damaged: {e}") from None


def _read_member(z: zipfile.ZipFile, path: str, name: str) -> bytes:
    try:
        return z.read(name)
    except (zipfile.BadZipFile, zlib.error, EOFError, OSError) as e:
        raise RuntimeError(f"fusegraph.aot.load: {path!r} is damaged: its file {name} does not read back as written "
                           f"({e})") from None


def _inputs_spec(ep) -> str:
    """fusegraph.inputs (csrc/aot/package_check.h): name|dtype|device|dims for each tensor input, in order."""
    ranges = ep.range_constraints
    placeholders = {n.name: n for n in ep.graph.nodes if n.op == "placeholder"}
    entries = []
    for name in ep.graph_signature.user_inputs:
        if not isinstance(name, str) or name not in placeholders:
            continue  # a constant input (return_dict=False): not a tensor the package takes
        val = placeholders[name].meta.get("val")
        if not isinstance(val, torch.Tensor):
            continue
        dims = []
        for d, size in enumerate(val.shape):
            if isinstance(size, int):
                dims.append(str(size))
                continue
            expr = size.node.expr
            form = _linear_form(expr)
            if form is None:
                raise ValueError(f"fusegraph.aot.package: input {name!r} dim {d} is exported as {expr}, not a Dim or "
                                 "a linear form of one (2*B, B+1): the package could not check it at a call")
            symbol, coef, offset = form
            vr = ranges.get(expr)
            # an unbounded dim's upper bound is torch's int_oo, which is neither is_infinite nor an int
            lo = int(vr.lower) if vr is not None and getattr(vr.lower, "is_Integer", False) else 0
            hi = str(int(vr.upper)) if vr is not None and getattr(vr.upper, "is_Integer", False) else "inf"
            dims.append(f"{symbol}*{coef}+{offset}={lo}:{hi}")
        entries.append(f"{name}|{str(val.dtype).replace('torch.', '')}|{val.device.type}|{','.join(dims)}|"
                       f"{_layout(name, val)}")
    return ";".join(entries)


def _linear_form(expr):
    """(symbol name, coef, offset) for ``coef*symbol + offset`` (ints, coef >= 1), else None."""
    free = list(getattr(expr, "free_symbols", ()))
    if len(free) != 1:
        return None
    poly = expr.as_poly(free[0])
    if poly is None or poly.degree() != 1:
        return None
    coef, offset = poly.all_coeffs()
    if not (coef.is_Integer and offset.is_Integer) or int(coef) < 1:
        return None
    return str(free[0]), int(coef), int(offset)


def _layout(name, val) -> str:
    """The layout the package's code indexes the input with (csrc/aot/package_check.h): contiguous,
    channels-last, or (static sizes only) the exported strides."""
    if val.is_contiguous():
        return "c"
    if val.dim() == 4 and val.is_contiguous(memory_format=torch.channels_last):
        return "cl"
    if val.dim() == 5 and val.is_contiguous(memory_format=torch.channels_last_3d):
        return "cl3d"
    strides = val.stride()
    if all(isinstance(s, int) for s in strides):
        return "s:" + ",".join(str(s) for s in strides)
    raise ValueError(f"fusegraph.aot.package: input {name!r} is exported with strides {tuple(strides)}, neither "
                     "contiguous nor channels-last, and with dynamic sizes: export with a contiguous example input")


def _constant_leaves(ep) -> list:
    """[[flat position, value]] for the example inputs' leaves that are not tensors: compiled into the package as
    constants, so a call must pass the same (a value JSON cannot hold is kept as its repr)."""
    out = []
    for i, leaf in enumerate(pytree.tree_leaves(ep.example_inputs)):
        if isinstance(leaf, torch.Tensor):
            continue
        try:
            json.dumps(leaf)
            out.append([i, leaf])
        except (TypeError, ValueError):
            out.append([i, {"repr": repr(leaf)}])
    return out


def _same_constant(given, exported) -> bool:
    if isinstance(exported, dict) and set(exported) == {"repr"}:
        return repr(given) == exported["repr"]
    try:
        return bool(given == exported)
    except Exception:  # a leaf whose == does not give a truth value
        return False


def _reorder(kwargs: dict, in_spec) -> dict:
    """kwargs in the order of the exported call (pytree flattens dicts in insertion order)."""
    if not kwargs:
        return {}
    names = _kwarg_names(in_spec)
    return {k: kwargs[k] for k in names}


def _kwarg_names(in_spec) -> list:
    return list(in_spec.child(1).context) if in_spec.num_children > 1 else []


def _read_record(path: str) -> dict:
    with zipfile.ZipFile(path) as z:
        names = [n for n in z.namelist() if n.endswith("/extra/" + RECORD) or n == "extra/" + RECORD]
        if not names:
            raise RuntimeError(f"fusegraph.aot.load: {path!r} was not made by fusegraph.aot.package (no "
                               f"extra/{RECORD}); load it with torch._inductor.aoti_load_package")
        data = _read_member(z, path, names[0])
    try:
        return json.loads(data)
    except ValueError as e:
        raise RuntimeError(f"fusegraph.aot.load: {path!r} is damaged: its {names[0]} is not the JSON "
                           f"fusegraph.aot.package writes ({e})") from None
