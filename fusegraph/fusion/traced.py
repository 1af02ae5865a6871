"""Traced search patterns kept across processes: a process registers the pattern families without tracing them.

Registering the families traces ~400 search patterns (``register_replacement`` -> ``gen_pattern_and_search_gm``:
make_fx, decomposed and functionalized, per pattern): 14 s on one core here, paid by every process at its first
fused compile — most of fusegraph's first-call time over plain ``torch.compile``'s. Inductor ships its own
search patterns pre-traced (``torch/_inductor/fx_passes/serialized_patterns``); this does the same for fusegraph's
(as JSON of the pattern objects: Inductor's ``PatternPrettyPrinter`` writes lists of patterns as unreadable text):

- While a family registers (``passes.pattern_pass``, this thread only), ``gen_pattern_and_search_gm`` is wrapped:
  each traced pattern is written as JSON (``_encode``: its nodes, fields, ops by name) and kept with its search
  graph's text
  (which ``register_replacement``'s duplicate check reads), under the family's key, the call's position, the search
  function's module, name and (flattened) argument names and its example inputs' shapes and dtypes. A later
  registration reads the pattern back (``_decode``) instead of tracing.
- An entry read back is used only when it is the one written for that key and fits the search function: it holds a
  digest of its key (``_tag``: an entry moved to another key is dropped when the file is read), and the pattern's
  argument nodes (``KeywordArg``) name exactly the search function's flattened arguments — the names a match
  hands to ``register_replacement``'s check, which fails the compile when one is missing. An entry that does not
  fit is traced instead, with one warning naming its file (``_core.cache``); the next store rewrites the file.
- A pattern is kept only when what is read back equals the traced one, node by node (``_same``); a pattern holding
  anything ``_encode`` does not know is traced every time.
- Only the search pattern is kept: ``register_replacement`` is called as before (no ``search_fn_pattern``), so at
  a match Inductor still re-traces the search function on the match's own arguments and checks that specific
  pattern, and traces the replacement then — the matching is exactly the uncached one.
- The entries are keyed by ``source_key()``: the pattern families' sources, this module, ``passes.py`` (the
  decompositions) and torch's version. Files: the one ``make build`` writes into the package
  (``traced_patterns.json``, every family with its default options: ``passes.ship_patterns``, run by ``make build``) and one
  per user next to Inductor's cache (``<inductor cache>/fusegraph/patterns/<key>.json``, other options), both read through
  ``_core.cache.read_json`` (a bad file is ignored with a warning, never a failed compile). The package's entries
  take precedence: the user's file only adds patterns the package's lacks.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import inspect
import itertools
import json
import math
import os
import threading
import types
from typing import Optional

import torch
from torch.fx.immutable_collections import immutable_list

from .._core import cache
from .._core.cache import read_json
from .._core.torch_dispatcher import OpOverload
from .._core.torch_pattern_matcher import module as _pm

VERSION = 3  # 3: entries [JSON text of [pattern source, search graph text], digest of their key]
SHIPPED = os.path.join(os.path.dirname(__file__), "traced_patterns.json")

_lock = threading.Lock()
# key -> [JSON text of [pattern source, search graph text], _tag(key)]. Each entry stays text until a registration
# looks it up: decoded all at once, the package's ~400 entries were ~125,000 Python objects (+19 MiB resident, most
# of it still held after they were dropped) in every process that compiled once (BENCHMARKS §1.3).
_entries: Optional[dict] = None
_origin: dict = {}  # key -> the file its entry was read from
_new: dict = {}  # entries traced in this process, not yet written


@functools.lru_cache(maxsize=None)
def source_key() -> str:
    from .._core.torch_inductor import get_hash_for_files

    here = os.path.dirname(__file__)
    folder = os.path.join(here, "patterns")
    files = [os.path.join(folder, f) for f in sorted(os.listdir(folder)) if f.endswith(".py")]
    files += [os.path.join(here, "passes.py"), __file__]
    digest = get_hash_for_files(tuple(files)).hex()
    return hashlib.sha256(repr((digest, torch.__version__, VERSION)).encode()).hexdigest()[:32]


def user_path() -> str:
    return cache.path("patterns", f"{source_key()}.json")


def _tag(key: str) -> str:
    """What binds an entry to its key: an entry moved under another key does not carry that key's tag."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def _checker(path: str):
    def check(data) -> dict:
        if data["key"] != source_key():
            return {}  # written for other sources or another torch: nothing in it applies
        entries = {}
        for k, v in data["entries"].items():
            if not (isinstance(k, str) and isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) for x in v)):
                raise TypeError(f"an entry is not [text, tag]: {str(v)[:60]}")
            entries[k] = v
        good = {k: v for k, v in entries.items() if v[1] == _tag(k)}
        if len(good) != len(entries):
            cache._warn_once(path, f"{len(entries) - len(good)} entries stored under another pattern's key")
        return good

    return check


def _load() -> dict:
    global _entries
    if _entries is None:
        entries, origin = {}, {}
        for path in (user_path(), SHIPPED):  # the package's entries win: a user's file only adds to them
            read = read_json(path, _checker(path)) or {}
            entries.update(read)
            origin.update(dict.fromkeys(read, path))
        _entries = entries
        _origin.clear()
        _origin.update(origin)
    return _entries


_DERIVED = ("fns_set", "flatten", "flat_args_kwargs")  # recomputed from fns/args/kwargs, as __init__ does


def _encode(pattern) -> dict:
    """A pattern as JSON: its nodes in a table (shared nodes stay shared), each a class name and its fields; ops by
    qualified name, Python functions by module and name. Raises on anything else (the pattern is not kept)."""
    table, index = [], {}

    def value(v):
        if isinstance(v, _pm.PatternExpr):
            if id(v) not in index:
                fields = {k: x for k, x in vars(v).items() if k not in _DERIVED}
                index[id(v)] = len(table)
                table.append(None)
                table[index[id(v)]] = [type(v).__name__, {k: value(x) for k, x in fields.items()}]
            return {"node": index[id(v)]}
        if v is None or isinstance(v, (bool, str, int)):
            return v
        if isinstance(v, float):
            return {"float": repr(v)}
        if type(v) in (list, tuple, immutable_list):
            return {type(v).__name__: [value(x) for x in v]}
        if type(v) is dict and all(isinstance(k, str) for k in v):
            return {"dict": {k: value(x) for k, x in v.items()}}
        if isinstance(v, OpOverload):
            return {"op": [v.namespace, v._schema.name.split("::")[-1], v._overloadname]}
        if isinstance(v, (torch.dtype, torch.layout, torch.memory_format)):
            return {"torch": str(v).split(".")[-1]}
        if isinstance(v, torch.device):
            return {"device": str(v)}
        if v is _pm.MULTIPLE:
            return {"multiple": True}
        if callable(v) and _function(v.__module__, v.__qualname__) is v:
            return {"fn": [v.__module__, v.__qualname__]}
        raise TypeError(f"cannot keep a {type(v).__name__} in a traced pattern")

    root = value(pattern)
    return {"root": root, "nodes": table}


def _function(module: str, qualname: str):
    import importlib

    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _decode(data: dict, argnames=None):
    """The pattern ``_encode`` wrote. With ``argnames``: ValueError unless the pattern's argument nodes name exactly
    those (the search function's flattened arguments, which every match must bind)."""
    nodes: dict = {}
    found: set = set()  # the names of the argument nodes reached

    def value(v):
        if v is None or isinstance(v, (bool, str, int)):
            return v
        (kind, x), = v.items()
        if kind == "node":
            return node(x)
        if kind == "float":
            return float(x)
        if kind in ("list", "tuple", "immutable_list"):
            items = [value(i) for i in x]
            return {"list": list, "tuple": tuple, "immutable_list": immutable_list}[kind](items)
        if kind == "dict":
            return {k: value(i) for k, i in x.items()}
        if kind == "op":
            return getattr(getattr(getattr(torch.ops, x[0]), x[1]), x[2])
        if kind == "torch":
            return getattr(torch, x)
        if kind == "device":
            return torch.device(x)
        if kind == "multiple":
            return _pm.MULTIPLE
        if kind == "fn":
            return _function(*x)
        raise ValueError(f"unknown value {kind!r}")

    def node(i: int):
        if i not in nodes:
            name, fields = data["nodes"][i]
            cls = getattr(_pm, name)
            if not (isinstance(cls, type) and issubclass(cls, _pm.PatternExpr)):
                raise ValueError(f"{name!r} is not a pattern class")
            obj = nodes[i] = cls.__new__(cls)
            obj.__dict__.update({k: value(x) for k, x in fields.items()})
            if cls is _pm.KeywordArg or cls is _pm.ExclusiveKeywordArg:
                found.add(obj.name)
            if isinstance(obj, _pm._TargetExpr):
                obj.fns_set = _pm.OrderedSet(obj.fns)
            if isinstance(obj, _pm._TargetArgsExpr):
                nested = any(isinstance(x, (dict, list, tuple)) for x in (*obj.args, *obj.kwargs.values()))
                obj.flatten = obj.pytree_flatten if nested else obj.simple_flatten
                obj.flat_args_kwargs = obj.flatten(obj.args, obj.kwargs)
        return nodes[i]

    root = value(data["root"])
    if argnames is not None and found != set(argnames):
        raise ValueError(f"its arguments {sorted(found)} are not the search function's {sorted(argnames)}")
    return root


def _argnames(search_fn, example_inputs, args, kwargs) -> list:
    """The names ``gen_pattern_and_search_gm`` gives the search function's (flattened) arguments."""
    names = [*inspect.signature(search_fn).parameters]
    scalar_workaround = kwargs.get("scalar_workaround", args[0] if args else None) or {}
    if not scalar_workaround and len(example_inputs) == len(names) and \
            all(isinstance(x, torch.Tensor) for x in example_inputs):
        return names  # one tensor per argument: the names as they are
    if hasattr(_pm, "_trace_arg_info"):  # torch that flattens structured arguments
        flat = _pm._trace_args_for_initial_trace(names, example_inputs, scalar_workaround)
        return _pm._trace_arg_info(names, flat).flat_argnames
    return names


def _same(a, b, seen=None) -> bool:
    """Two patterns equal node by node (types, targets, arguments, user counts)."""
    seen = set() if seen is None else seen
    if (id(a), id(b)) in seen:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, _pm.PatternExpr):
        seen.add((id(a), id(b)))
        va, vb = _fields(a), _fields(b)
        return va.keys() == vb.keys() and all(_same(va[k], vb[k], seen) for k in va)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y, seen) for x, y in zip(a, b))
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k], seen) for k in a)
    if isinstance(a, float) and math.isnan(a):
        return math.isnan(b)
    return a == b


def _fields(p) -> dict:
    """A pattern node's attributes that matching reads: fx_to_pattern also sets ``users`` on argument nodes
    (``KeywordArg``...), which only target nodes (``_TargetExpr``: ``_match_users``) read and the printer writes."""
    fields = vars(p)
    if not isinstance(p, _pm._TargetExpr):
        fields = {k: v for k, v in fields.items() if k != "users"}
    return fields


class _Text:
    def __init__(self, text: str):
        self._text = text

    def __str__(self) -> str:
        return self._text


def _GraphText(text: str):
    """Stands for the search graph module in ``register_replacement`` (it reads ``str(gm.graph)`` only)."""
    return types.SimpleNamespace(graph=_Text(text))


def _signature(example_inputs) -> list:
    return [(tuple(x.shape), str(x.dtype)) if isinstance(x, torch.Tensor) else repr(x) for x in example_inputs]


@contextlib.contextmanager
def cached(family_key) -> None:
    """While a family registers, in this thread: search patterns read back instead of traced where kept."""
    original = _pm.gen_pattern_and_search_gm
    owner = threading.get_ident()
    position = itertools.count()

    def gen(search_fn, example_inputs, trace_fn, *args, **kwargs):
        if threading.get_ident() != owner:
            return original(search_fn, example_inputs, trace_fn, *args, **kwargs)
        at = next(position)
        try:
            argnames = _argnames(search_fn, example_inputs, args, kwargs)
        except Exception:  # noqa: BLE001 - a search function this cannot name: traced every time
            return original(search_fn, example_inputs, trace_fn, *args, **kwargs)
        key = repr((family_key, at, getattr(search_fn, "__module__", "?"),
                    getattr(search_fn, "__qualname__", "?"), argnames, getattr(trace_fn, "__name__", "?"),
                    _signature(example_inputs), args, sorted(kwargs)))
        with _lock:
            hit = _load().get(key)
        if hit is not None:
            try:
                source, graph_text = json.loads(hit[0])
                return _decode(source, argnames), _GraphText(str(graph_text))
            except Exception as e:  # noqa: BLE001 - an entry that does not read back or fit: trace it
                cache._warn_once(_origin.get(key, "?"), f"an entry does not fit its pattern: {str(e)[:120]}")
        pattern, gm = original(search_fn, example_inputs, trace_fn, *args, **kwargs)
        try:
            source = _encode(pattern)
            text = json.dumps([source, str(gm.graph)])
            if _same(_decode(json.loads(text)[0], argnames), pattern):
                with _lock:
                    _load()[key] = _new[key] = [text, _tag(key)]
                    _origin.pop(key, None)
        except Exception:  # noqa: BLE001 - a pattern the printer cannot write: traced every time
            pass
        return pattern, gm

    _pm.gen_pattern_and_search_gm = gen
    try:
        yield
    finally:
        _pm.gen_pattern_and_search_gm = original
        flush()


def _write(path: str, entries: dict) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"key": source_key(), "entries": entries}, f)
    os.replace(tmp, path)


def flush() -> None:
    """Writes this process's newly traced patterns to the user's file (merged with what it holds)."""
    with _lock:
        if not _new:
            return
        path = user_path()
        entries = read_json(path, _checker(path)) or {}
        entries.update(_new)
        _new.clear()
        try:
            _write(path, entries)
        except OSError:  # a cache, never worth failing a compile
            pass


def ship(register_all) -> int:
    """Runs ``register_all()`` (which registers every family with its default options) with nothing cached, so each
    pattern is traced afresh, and writes what was traced to the package's file."""
    global _entries
    with _lock:
        _entries = {}
        _origin.clear()
        _new.clear()
    register_all()
    with _lock:
        entries = dict(_entries)
    _write(SHIPPED, entries)
    return len(entries)


def shipped_is_current() -> bool:
    return bool(read_json(SHIPPED, lambda data: data["key"] == source_key()))
