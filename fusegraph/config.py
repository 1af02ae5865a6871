"""Compilation settings (SPEC §1.1).

Class attributes are the process-wide defaults, seed style::

    CompilationConfig.graph_with_compile = True           # or its seed alias aclgraph_with_compile
    CompilationConfig.fusion_patterns.enable_rope = False

An instance ``CompilationConfig(**overrides)`` copies the defaults at construction and applies its
overrides; a ``Backend`` snapshots (deep-copies) its config, so later changes never half-apply to it.
Every write, on the class or on an instance, is validated: unknown names raise ``ValueError``,
ill-typed values ``TypeError`` and out-of-range values ``ValueError``, each naming the field.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Callable


class _Field:
    """One setting: default, validator and docstring. Reads come from the class's defaults dict
    (class access) or the instance's values dict (instance access)."""

    def __init__(self, default: Any, check: Callable[[str, Any], Any], doc: str):
        self.default = default
        self.check = check
        self.__doc__ = doc
        self.name = "?"

    def __set_name__(self, owner, name):
        self.name = name

    def __get__(self, obj, owner):
        if obj is None:
            return owner._defaults[self.name]
        return obj._values[self.name]


def _bool(name, v):
    if not isinstance(v, bool):
        raise TypeError(f"{name} must be a bool, got {v!r} ({type(v).__name__})")
    return v


def _auto_bool(name, v):
    if v != "auto" and not isinstance(v, bool):
        raise TypeError(f"{name} must be True, False or 'auto', got {v!r} ({type(v).__name__})")
    return v


def _nonneg_int(name, v):
    if isinstance(v, bool) or not isinstance(v, int):
        raise TypeError(f"{name} must be an int, got {v!r} ({type(v).__name__})")
    if v < 0:
        raise ValueError(f"{name} must be >= 0, got {v}")
    if v >= 2**63:  # the runtime stores it as a C++ int64
        raise ValueError(f"{name} must be < 2**63 (a 64-bit count), got {v}")
    return v


def _choice(*choices):
    def check(name, v):
        if not isinstance(v, str):
            raise TypeError(f"{name} must be one of {choices}, got {v!r} ({type(v).__name__})")
        if v not in choices:
            raise ValueError(f"{name} must be one of {choices}, got {v!r}")
        return v

    return check


def _buckets(name, v):
    if isinstance(v, list):
        v = tuple(v)
    if not isinstance(v, tuple):
        raise TypeError(f"{name} must be a tuple of strictly increasing positive ints (e.g. (1, 2, 4, 8)), or () "
                        f"for off; got {v!r} ({type(v).__name__})")
    for b in v:
        if isinstance(b, bool) or not isinstance(b, int):
            raise TypeError(f"{name} must be a tuple of strictly increasing positive ints (e.g. (1, 2, 4, 8)), or "
                            f"() for off; got {v!r}: {b!r} is a {type(b).__name__}")
    for i, b in enumerate(v):
        if b <= 0 or b >= 2**63 or (i and b <= v[i - 1]):
            raise ValueError(f"{name} must be a tuple of strictly increasing positive ints (e.g. (1, 2, 4, 8)), or "
                             f"() for off; got {v!r}")
    return v


def _optional_path(name, v):
    if v is None:
        return None
    if not isinstance(v, (str, os.PathLike)):
        raise TypeError(f"{name} must be None or a directory path, got {v!r} ({type(v).__name__})")
    if str(v) == "":
        raise ValueError(f"{name} must be None or a non-empty directory path, got ''")
    return os.fspath(v)


class _ConfigMeta(type):
    """Validates class-level writes (process defaults) and resolves seed aliases on the class."""

    def __init__(cls, name, bases, ns):
        super().__init__(name, bases, ns)
        cls._fields = {k: v for k, v in ns.items() if isinstance(v, _Field)}
        cls._defaults = {k: f.default for k, f in cls._fields.items()}

    def _resolve(cls, name: str) -> str:
        name = cls._aliases.get(name, name)
        if name not in cls._fields:
            raise ValueError(f"unknown {cls.__name__} field {name!r}; known fields: {', '.join(sorted(cls._fields))}"
                             + (f"; aliases: {', '.join(sorted(cls._aliases))}" if cls._aliases else ""))
        return name

    def __getattr__(cls, name):  # only called when normal lookup fails: aliases
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(cls, cls._resolve(name))

    def __setattr__(cls, name, value):
        if name.startswith("_"):
            return super().__setattr__(name, value)
        name = cls._resolve(name)
        cls._defaults[name] = cls._convert(name, value, defaults=True)

    def __delattr__(cls, name):
        raise AttributeError(f"{cls.__name__} fields cannot be deleted ({name!r})")


class _ConfigBase(metaclass=_ConfigMeta):
    _aliases: dict = {}

    def __init__(self, **overrides):
        object.__setattr__(self, "_values", {k: copy.deepcopy(v) for k, v in type(self)._defaults.items()})
        for name, value in overrides.items():
            setattr(self, name, value)

    @classmethod
    def _convert(cls, name, value, defaults=False):
        return cls._fields[name].check(name, value)

    def __getattr__(self, name):  # aliases only; fields are descriptors
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self, type(self)._resolve(name))

    def __setattr__(self, name, value):
        name = type(self)._resolve(name)
        self._values[name] = type(self)._convert(name, value)

    def as_dict(self) -> dict:
        return {k: (v.as_dict() if isinstance(v, _ConfigBase) else v) for k, v in self._values.items()}

    def __eq__(self, other):
        return type(self) is type(other) and self.as_dict() == other.as_dict()

    def __repr__(self):
        body = ", ".join(f"{k}={v!r}" for k, v in self._values.items())
        return f"{type(self).__name__}({body})"

    def __deepcopy__(self, memo):
        new = object.__new__(type(self))
        object.__setattr__(new, "_values", copy.deepcopy(self._values, memo))
        return new


class FusionPatterns(_ConfigBase):
    """Which fusion pattern families run (SPEC §3). Class attributes are the process defaults."""

    enable_rms_norm = _Field(True, _bool, "Fuse RMSNorm forms (torch.nn.RMSNorm / F.rms_norm, diffusers RMSNorm, "
                                          "Wan's across-heads RMSNorm) into fusegraph.rms_norm.")
    enable_rope = _Field(True, _bool, "Fuse rotary embeddings (diffusers apply_rotary_emb, Wan's RoPE) into "
                                      "fusegraph.rope.")
    enable_adalayernorm = _Field(True, _bool, "Fuse adaptive norm modulation into fusegraph.adaln: three "
                                              "families, switched together: adaln (layer_norm(x)*(1+scale)+shift), "
                                              "adaln_rms (RMSNorm(x)*(1+scale)+shift) and adaln_noshift "
                                              "(LayerNorm or RMSNorm(x)*(1+scale), no shift).")
    enable_fast_gelu = _Field(True, _bool, "Fuse tanh-GELU (gelu(x, approximate='tanh')) into one kernel.")
    enable_mul_add = _Field(True, _bool, "Fuse a*b+c (gated residuals, x*scalar+y) into fusegraph.mul_add.")
    enable_kv_attention = _Field(True, _bool, "Fuse a decode step's attention over a KV cache (SDPA of at most 8 "
                                              "queries per head over cat([k_cache, k_new]), CPU) into "
                                              "fusegraph.kv_attention.")
    enable_gemv = _Field("auto", _auto_bool,
                         "Run linear layers of at most 8 rows with a large weight (a decode step's projections, CPU) "
                         "as fusegraph.gemv, one bandwidth-bound pass over the weight. 'auto': for the dtypes and row "
                         "counts where the table measured for this CPU class says it is faster than the kernel eager "
                         "calls (a class not measured: where every class measured on its architecture says so, so an "
                         "ARM CPU keeps eager's kernel; `bench gemm --calibrate` measures yours); True: every such "
                         "linear; False: never.")
    enable_linear = _Field("auto", _auto_bool,
                           "Run linear layers of more than 8 rows and at least 2^20 multiply-adds (CPU) through "
                           "fusegraph.linear (oneDNN's float32 matmul on the module's own weight; bf16/fp16 "
                           "widened to float32 block by block) instead of ATen's addmm. 'auto': the dtypes for "
                           "which the table measured for this CPU class says it is the faster kernel (a class not "
                           "measured keeps addmm; `bench gemm --calibrate` measures yours); True: every dtype on "
                           "any CPU; False: never.")
    gelu_approximation = _Field("tanh", _choice("tanh", "sigmoid"),
                                "'tanh': tanh-GELU becomes fusegraph.gelu_tanh (exact); 'sigmoid': "
                                "fusegraph.fast_gelu x*sigmoid(1.702x), the NPU fast-gelu (up to 0.02 "
                                "different; opt-in only).")

    def enabled_families(self) -> tuple:
        """Pattern families switched on, in pass order (``fusegraph.fusion.patterns.FAMILIES``)."""
        from .fusion.patterns import FAMILIES

        return tuple(f.name for f in FAMILIES if f.on(self))


def _inductor_options(name, v):
    """A dict of Inductor option names (``torch._inductor.config``, ``-`` read as ``_``) to values, type-checked as
    ``torch.compile(options=...)`` checks them for Inductor. The three that fusegraph sets itself per graph are
    refused here, naming the field that says the same."""
    if not isinstance(v, dict):
        raise TypeError(f"{name} must be a dict of Inductor option names to values, got {v!r} ({type(v).__name__})")
    from typing import get_origin

    from ._core.torch_inductor import config as inductor_config

    known = inductor_config.get_config_copy()
    out = {}
    for key, value in v.items():
        if not isinstance(key, str):
            raise TypeError(f"{name}: option names are strings, got {key!r} ({type(key).__name__})")
        attr = key.replace("-", "_")
        if attr in _INDUCTOR_OWNED:
            raise ValueError(f"{name}: {key!r} is set by fusegraph per graph; {_INDUCTOR_OWNED[attr]}")
        if attr not in known:
            raise ValueError(f"{name}: {key!r} is not an Inductor option (torch._inductor.list_options() names them)")
        expected = inductor_config.get_type(attr)
        if get_origin(expected) is None and isinstance(expected, type) and not isinstance(value, expected):
            raise TypeError(f"{name}: Inductor option {key!r} must be a {expected.__name__}, got {value!r} "
                            f"({type(value).__name__})")
        out[attr] = value
    return out


# Inductor options fusegraph sets on each compile of the Inductor route, and where a user says the same.
_INDUCTOR_OWNED = {"post_grad_custom_pre_pass": "fusegraph's fusion pass runs there",
                   "freezing": "use enable_freezing (torch.compile(options={'freezing': True}) sets it)",
                   "cpp_wrapper": "use the cpp_wrapper field (torch.compile(options={'cpp_wrapper': ...}) sets it)"}


def _fusion_patterns(name, v):
    if isinstance(v, FusionPatterns):
        return copy.deepcopy(v)
    if isinstance(v, dict):
        fp = FusionPatterns()
        for k, x in v.items():
            try:
                setattr(fp, k, x)
            except (TypeError, ValueError) as e:
                raise type(e)(f"{name}: {e}") from None
        return fp
    raise TypeError(f"{name} must be a FusionPatterns or a dict of its fields, got {v!r} ({type(v).__name__})")


class CompilationConfig(_ConfigBase):
    """Settings of one fusegraph ``Backend``; class attributes are the process-wide defaults."""

    _aliases = {"aclgraph_only": "graph_only", "aclgraph_with_compile": "graph_with_compile",
                "aclgraph_lazy_capture": "graph_lazy_capture", "aclgraph_max_entries": "graph_max_entries"}

    graph_only = _Field(False, _bool, "Skip fusion; capture the graph as traced into a device graph.")
    graph_with_compile = _Field(False, _bool, "Fusion first, then capture (wins when graph_only is set too).")
    graph_lazy_capture = _Field(False, _bool, "Capture at the first real call (static inputs share the caller's "
                                              "storage); False: capture at compile time on detach().clone() "
                                              "buffers.")
    graph_max_entries = _Field(0, _nonneg_int, ">0: at most this many graphs per compiled function; past it one "
                                               "is evicted (graph_eviction picks which). 0: no limit.")
    graph_eviction = _Field("fifo", _choice("fifo", "lru"), "Which graph to evict first: 'fifo' or 'lru'.")
    graph_memory_budget = _Field(0, _nonneg_int, "Bytes; >0: evict until the graphs' measured memory fits. 0: no "
                                                 "budget.")
    graph_recapture = _Field(True, _bool, "A new input signature captures a new graph; False: raise RuntimeError "
                                          "on an input mismatch.")
    graph_warmup_runs = _Field(1, _nonneg_int, "Eager runs before a capture (JIT/autotuning outside the capture).")
    graph_fallback = _Field("eager", _choice("eager", "raise"), "When a capture fails: 'eager' runs that signature "
                                                                "uncaptured and records why; 'raise' re-raises.")
    device_graph = _Field("auto", _choice("auto", "cuda", "npu", "host", "none"),
                          "Device graph kind: 'auto' (the inputs' device), 'cuda', 'npu', 'host' or 'none'.")
    safe_output_mode = _Field(True, _bool, "Replay returns clones; False returns the graph's own output buffers "
                                           "(overwritten by the next replay; on CUDA/NPU, whose graphs share one "
                                           "memory pool, by the next replay of any signature).")
    graph_batch_buckets = _Field((), _buckets, "Batch buckets (opt-in; only for functions whose rows along dim 0 are "
                                               "independent): a tuple of strictly increasing batch sizes, e.g. "
                                               "(1, 2, 4, 8). A call's batched inputs are padded up to the next "
                                               "bucket (the last row repeated), that bucket's graph is replayed and "
                                               "the outputs are sliced back; beyond the largest bucket the call runs "
                                               "uncaptured (stats.bucket_overflows). () = off.")
    graph_rank_check = _Field("call", _choice("call", "capture"),
                              "Multi-process graphs with collectives: 'call' compares the ranks' input signatures "
                              "on every call (one tiny all_reduce; a rank that differs raises naming it, never "
                              "hangs); 'capture' only before each capture (replay free of any exchange).")
    enable_freezing = _Field(False, _auto_bool,
                             "Fold parameters into constants on the Inductor route (Inductor's freezing; inference "
                             "only). False (default; 'auto' reads the same): no route folds parameters — measured, "
                             "folding buys no speed by itself (BENCHMARKS §6), and parameters read where they live "
                             "see every in-place edit. True: the Inductor route freezes; the frozen compile serves "
                             "the parameters it folded while unchanged (a per-call guard: identity, storage, "
                             "version), any other call runs one unfrozen compile of the graph; edits through .data "
                             "are not seen. pack_weights and concat_linear freeze too. The aten and graph routes "
                             "never fold.")
    concat_linear = _Field(False, _bool, "Freeze (as enable_freezing=True) and run linears that read the same input "
                                         "(q/k/v projections) as one GEMM on concatenated weights (Inductor's "
                                         "concat-linear freezing pattern). The compiled graph holds a concatenated "
                                         "copy of those weights.")
    pack_weights = _Field(False, _bool, "Freeze (as enable_freezing=True) and pack weights for oneDNN where the CPU "
                                        "class's measurements say the copy pays: bf16/fp16 linears where the class "
                                        "has native 16-bit dot products, float32 linears where its GEMM table says "
                                        "pack 'onednn' (bench gemm --calibrate), convolutions where measured faster. "
                                        "The compiled graph holds packed copies of those weights (memory: up to one "
                                        "more copy of the model).")
    inductor = _Field(True, _bool, "Default route: hand the fused graph to Inductor's codegen; False: run it as "
                                   "fused aten ops (fast compile, the seed's behaviour).")
    cpp_wrapper = _Field(True, _bool, "Inductor route on CPU: the compiled graph is driven by Inductor's C++ wrapper "
                                      "(one C++ function calls its kernels, extern GEMMs and fusegraph's ops) instead "
                                      "of its Python wrapper, which costs 1-3 us of Python per op and allocation "
                                      "per call. Where the C++ wrapper fails to compile, the Python one is used "
                                      "(logged, stats.fallbacks), and for a graph of more than "
                                      "pipeline.CPP_WRAPPER_MAX_OPS (600) ops, whose C++ wrapper g++ would compile "
                                      "in superlinear time (logged at INFO). Plain torch.compile uses the Python "
                                      "wrapper.")
    fusion_choice = _Field("auto", _choice("auto", "model", "always"),
                           "Inductor route only: 'auto' (alias 'model') keeps a fused op where it is "
                           "predicted faster than Inductor's own code for the site and lowers it back to aten ops "
                           "elsewhere, decided at compile time from the site's shapes, dtype, device and thread "
                           "count by fusegraph.fusion.choice's cost model (a table of kernel measurements shipped with "
                           "the package, or one `python -m fusegraph bench calibrate` measured on this machine): one "
                           "compile per graph, nothing timed on the user's calls; 'always' keeps every fused op. The "
                           "aten and graph routes always fuse.")
    inductor_options = _Field({}, _inductor_options,
                              "Inductor options (torch._inductor.config names, as torch.compile(options=...) takes "
                              "them for Inductor) for the Inductor route's compile, e.g. {'max_autotune': True}; "
                              "torch.compile's mode and options set them too (GUIDE §1.12). The aten and graph routes "
                              "compile no Inductor code: there they are unused (said in stats.fallbacks).")
    graph_log_url = _Field(None, _optional_path, "A directory: each pass writes the graph before and after it "
                                                 "there, as readable text.")
    fusion_patterns = _Field(None, _fusion_patterns, "Which fusion pattern families run (FusionPatterns).")
    verify = _Field(False, _bool, "Compile-time safety net: run each graph on its real example inputs before and "
                                  "after fusion; a pattern family that changes the result beyond the output "
                                  "dtype's tolerance is undone for that graph, logged with its sites' source "
                                  "lines and counted in stats.fallbacks. Costs about two graph runs and one "
                                  "extra fusion per graph. Env FUSEGRAPH_VERIFY=1 sets the process default.")

    def __init__(self, **overrides):
        super().__init__()
        self._values["fusion_patterns"] = FusionPatterns()  # a fresh copy of FusionPatterns' process defaults
        for name, value in overrides.items():
            setattr(self, name, value)

    @classmethod
    def _convert(cls, name, value, defaults=False):
        if name == "fusion_patterns" and defaults:
            # Class level: CompilationConfig.fusion_patterns = {...} updates FusionPatterns' defaults.
            new = _fusion_patterns(name, value)
            for k, v in new._values.items():
                setattr(FusionPatterns, k, v)
            return FusionPatterns  # what the class-level field stays (CompilationConfig.fusion_patterns.enable_x = ...)
        return super()._convert(name, value, defaults)


# torch.compile(mode=...) -> (the route, Inductor's settings of that mode). See with_compile_args.
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs", "lite")


def with_compile_args(config: CompilationConfig, mode=None, options=None) -> CompilationConfig:
    """``config`` with ``torch.compile``'s ``mode`` and ``options`` applied, as a new config (``config`` unchanged).

    The rule: the config is the base; ``mode`` then picks the route, keeping the config's choices within it;
    ``options`` then set fields by name. ``mode``:
      - ``"default"``: the config as it is;
      - ``"reduce-overhead"``: a graph route (the device graph is fusegraph's answer to CUDA graphs):
        ``graph_with_compile=True`` unless the config already asks for one (``graph_only`` stays unfused);
      - ``"max-autotune"``, ``"max-autotune-no-cudagraphs"``: the Inductor route (``inductor=True``, no graph
        route) with that mode's Inductor settings (``torch._inductor.list_mode_options``) under ``inductor_options``;
      - ``"lite"`` (Inductor's mode that turns its graph passes off): the aten route (``inductor=False``): the
        fusion without code generation, fusegraph's fastest compile.
    ``options``: each name is a ``CompilationConfig`` field (or alias), a ``FusionPatterns`` field, or an Inductor
    option (``torch._inductor.config``; ``freezing`` and ``cpp_wrapper`` set the fields of those names), added to
    ``inductor_options``. Anything else raises ``ValueError`` naming it."""
    new = copy.deepcopy(config)
    if mode is not None:
        if not isinstance(mode, str) or mode not in MODES:
            raise ValueError(f"mode={mode!r} is not a torch.compile mode fusegraph knows; expected one of "
                             f"{', '.join(map(repr, MODES))}")
        if mode == "reduce-overhead":
            if not (new.graph_only or new.graph_with_compile):
                new.graph_with_compile = True
        elif mode.startswith("max-autotune"):
            from ._core.torch_inductor import list_mode_options

            new.graph_only = new.graph_with_compile = False
            new.inductor = True
            new.inductor_options = {**new.inductor_options, **list_mode_options(mode)}
        elif mode == "lite":
            new.graph_only = new.graph_with_compile = False
            new.inductor = False
    if options is None:
        return new
    if not isinstance(options, dict):
        raise TypeError(f"options must be a dict of option names to values, got {options!r} "
                        f"({type(options).__name__})")
    inductor = {}
    for name, value in options.items():
        if not isinstance(name, str):
            raise TypeError(f"options: names are strings, got {name!r} ({type(name).__name__})")
        field = {"freezing": "enable_freezing"}.get(name, name)
        if field in CompilationConfig._fields or field in CompilationConfig._aliases:
            try:
                setattr(new, field, value)
            except (TypeError, ValueError) as e:
                raise type(e)(f"options[{name!r}]: {e}") from None
        elif name in FusionPatterns._fields:
            try:
                setattr(new.fusion_patterns, name, value)
            except (TypeError, ValueError) as e:
                raise type(e)(f"options[{name!r}]: {e}") from None
        else:
            from ._core.torch_inductor import config as inductor_config

            if name.replace("-", "_") not in inductor_config.get_config_copy():
                raise ValueError(f"options: unknown option {name!r}: not a CompilationConfig field, a FusionPatterns "
                                 f"field nor an Inductor option (torch._inductor.list_options())")
            inductor[name] = value
    if inductor:
        new.inductor_options = {**new.inductor_options, **_inductor_options("options", inductor)}
    return new


def _env_bool(var: str, field: str) -> None:
    """Sets the process default of a bool field from an environment variable, read once at import. A value that
    is not a boolean warns (naming the variable and the field) and leaves the default alone: a typo in the
    environment should not make ``import fusegraph`` fail."""
    raw = os.environ.get(var)
    if raw is None:
        return
    value = raw.strip().lower()
    if value in ("1", "true", "yes", "on"):
        setattr(CompilationConfig, field, True)
    elif value in ("0", "false", "no", "off", ""):
        setattr(CompilationConfig, field, False)
    else:
        import warnings

        warnings.warn(f"{var}={raw!r} is not a boolean (1/0, true/false, yes/no, on/off); "
                      f"CompilationConfig.{field} keeps its default {getattr(CompilationConfig, field)!r}",
                      RuntimeWarning, stacklevel=2)


_env_bool("FUSEGRAPH_VERIFY", "verify")

# Class level, fusion_patterns is FusionPatterns itself (so CompilationConfig.fusion_patterns.enable_rope = False
# sets a process default); an instance gets its own FusionPatterns copied at construction.
CompilationConfig._defaults["fusion_patterns"] = FusionPatterns
