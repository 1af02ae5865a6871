"""fusegraph's files, all in one folder of Inductor's cache (``path``: ``<inductor cache>/fusegraph/``), read so that
no file can fail a compile (``read_json``), and a measured verdict per key kept in memory and in such a file (the
way Inductor's autotuning keeps its timings: ``VerdictFile``).

What lives there: ``cost_v<N>.json`` (the calibrated cost table, ``bench calibrate``), ``packing/conv_v<N>.json``
(the conv-packing verdicts, ``pack_weights=True`` only), ``counts/<key>.json`` (what each compiled graph fused, for
FX-graph-cache hits) and ``patterns/<key>.json`` (search patterns traced for non-default options)."""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Callable, Optional

log = logging.getLogger("fusegraph")

def path(*parts: str) -> str:
    """``<inductor cache>/fusegraph/<parts...>``: the one folder fusegraph writes."""
    from .torch_inductor import cache_dir

    return os.path.join(cache_dir(), "fusegraph", *parts)


_warned: set = set()  # paths already warned about in this process
_warned_lock = threading.Lock()


def _warn_once(path: str, why: str) -> None:
    with _warned_lock:
        if path in _warned:
            return
        _warned.add(path)
    log.warning("fusegraph: ignoring the cache file %s (%s); it is rewritten at the next store", path, why)


def read_json(path: str, check: Optional[Callable] = None):
    """The JSON value of the cache file ``path``, passed through ``check`` (which returns the value to use and raises
    on one of the wrong shape), or None: the file is missing, or it cannot be read, parsed (truncated, not JSON,
    nested past the parser's recursion limit, not UTF-8) or checked — then with one warning per path and process.
    These files are written by other processes and versions, or by hand: they are never trusted."""
    try:
        with open(path, "rb") as f:
            text = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        _warn_once(path, f"{type(e).__name__}: {e}")
        return None
    try:
        data = json.loads(text)
        return check(data) if check is not None else data
    except Exception as e:  # noqa: BLE001 - RecursionError, ValueError, TypeError, KeyError, ...: all mean "ignore"
        _warn_once(path, f"{type(e).__name__}: {str(e)[:120]}")
        return None


def number(x) -> float:
    """``x`` when it is a finite JSON number (not a bool), else ValueError."""
    if isinstance(x, bool) or not isinstance(x, (int, float)) or x != x or x in (float("inf"), float("-inf")):
        raise ValueError(f"expected a number, got {repr(x)[:40]}")
    return float(x)


def is_timed_verdict(verdict, choices) -> bool:
    """``[choice, t_a, t_b]``: a choice among ``choices`` and two timings (seconds, numbers)."""
    return (isinstance(verdict, list) and len(verdict) == 3 and type(verdict[0]) in {type(c) for c in choices}
            and verdict[0] in choices and all(number(t) >= 0 for t in verdict[1:]))


class VerdictFile:
    """``key -> verdict`` (a JSON-able list that ``valid`` accepts). The file is read once per process, on the first
    lookup; each new verdict is merged into what other processes wrote and the file replaced atomically. A file that
    cannot be read, or is not a JSON object, is ignored with one warning; entries ``valid`` rejects are dropped (with
    the same warning); the next store rewrites the file without them. It only costs a measurement again."""

    def __init__(self, path: Callable[[], str], valid: Callable[[object], bool] = lambda v: True):
        self._path = path  # called at each read/write, so a test (or the Inductor cache dir) can move it
        self._valid = valid
        self._lock = threading.Lock()
        self._verdicts: dict | None = None

    def _read(self) -> dict:
        path = self._path()

        def check(data):
            if not isinstance(data, dict):
                raise TypeError(f"expected a JSON object, got {type(data).__name__}")
            good = {k: v for k, v in data.items() if isinstance(k, str) and self._ok(v)}
            if len(good) != len(data):
                _warn_once(path, f"{len(data) - len(good)} malformed entries")
            return good

        return read_json(path, check) or {}

    def _ok(self, verdict) -> bool:
        try:
            return bool(self._valid(verdict))
        except Exception:  # noqa: BLE001 - a validator tripping over a foreign value: not a verdict
            return False

    def _load(self) -> dict:
        if self._verdicts is None:
            self._verdicts = self._read()
        return self._verdicts

    def get(self, key: str):
        with self._lock:
            return self._load().get(key)

    def put(self, key: str, verdict: list) -> None:
        with self._lock:
            self._load()[key] = verdict
            path = self._path()
            try:
                os.makedirs(os.path.dirname(path), exist_ok=True)
                on_disk = self._read()
                on_disk[key] = verdict
                tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
                with open(tmp, "w") as f:
                    json.dump(on_disk, f, indent=0, sort_keys=True)
                os.replace(tmp, path)
            except OSError as e:
                log.debug("fusegraph: verdict cache %s not written (%s)", path, e)

    def forget(self) -> None:
        """Drops this process's verdicts: the next lookup reads the file again (a new process, as far as the cache
        is concerned)."""
        with self._lock:
            self._verdicts = None
