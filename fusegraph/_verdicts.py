"""A measured verdict per key, kept in memory and in a JSON file next to Inductor's cache (the way Inductor's
autotuning keeps its timings): the conv-packing verdicts (``fusegraph.packing``) and the per-graph choice
(``fusegraph.fusion.measured``)."""
from __future__ import annotations

import json
import logging
import os
import threading
from typing import Callable

log = logging.getLogger("fusegraph")


class VerdictFile:
    """``key -> verdict`` (a JSON-able list). The file is read once per process, on the first lookup; each new
    verdict is merged into what other processes wrote and the file replaced atomically. A file that cannot be read
    or written only costs a measurement again."""

    def __init__(self, path: Callable[[], str]):
        self._path = path  # called at each read/write, so a test (or the Inductor cache dir) can move it
        self._lock = threading.Lock()
        self._verdicts: dict | None = None

    def _load(self) -> dict:
        if self._verdicts is None:
            try:
                with open(self._path()) as f:
                    data = json.load(f)
                self._verdicts = dict(data) if isinstance(data, dict) else {}
            except (OSError, ValueError):
                self._verdicts = {}
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
                try:
                    with open(path) as f:
                        on_disk = json.load(f)
                except (OSError, ValueError):
                    on_disk = {}
                on_disk = on_disk if isinstance(on_disk, dict) else {}
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
