"""What the replay server checks before it stores an INSERT: the run's TransitionSpec and the insert's id.

* :class:`SpecGate` holds the spec the server learned -- from its configuration (``--spec``), from the sidecar
  ``SNAPSHOT.spec.json`` written next to a snapshot, or from the first HELLO that declares one. The first spec
  sticks: another one is refused naming both field lists. Once there is a spec, every INSERT batch is checked
  with :meth:`TransitionSpec.validate_items` (vectorised: sizes, fingerprints, compressed block lengths) and
  refused whole when any item fails, so one foreign item never reaches a learner.
* :class:`InsertWindow` makes inserts exactly-once across retries: the keys replied to the last inserts, by
  their ``insert_id`` (session, sequence), bounded by count and by memory. An id seen again gets the first
  request's keys without storing anything; an id whose first request is still waiting (rate limiter) or being
  served is held back until that one is answered.

Neither imports torch; both are thread-safe.
"""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from typing import Any

import numpy as np

from apexrl.durable import write_atomically
from apexrl.replay.codec import TransitionSpec

__all__ = ["DEDUP_MAX_BYTES", "DEDUP_MAX_IDS", "InsertWindow", "SpecGate", "load_spec", "spec_sidecar"]

DEDUP_MAX_IDS = 65536
"""Most insert ids the server remembers (the oldest are forgotten first)."""
DEDUP_MAX_BYTES = 64 << 20
"""Most bytes the remembered replies may take: 8 bytes per key plus _ENTRY_OVERHEAD per id."""
_ENTRY_OVERHEAD = 256
_ABANDONED_GRACE_S = 1.0  # a waiting first request this long past its deadline was dropped without an answer

NEW, DONE, BUSY = "new", "done", "busy"


def load_spec(value: str | os.PathLike[str]) -> TransitionSpec:
    """A spec given as its JSON text (starting with ``{``) or as the path of a JSON file; ValueError naming the
    value when it is neither a readable file nor a valid spec."""
    text = os.fspath(value)
    if not text.lstrip().startswith("{"):
        try:
            with open(text, encoding="utf-8") as f:
                text = f.read()
        except OSError as exc:
            raise ValueError(f"spec {os.fspath(value)!r} is neither spec JSON nor a readable file: {exc}") from None
    try:
        return TransitionSpec.from_json(text)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"spec {os.fspath(value)!r}: {exc}") from None


def spec_sidecar(snapshot: str | os.PathLike[str]) -> str:
    """The file that keeps a snapshot's spec: ``SNAPSHOT.spec.json``."""
    return os.fspath(snapshot) + ".spec.json"


class SpecGate:
    """The server's TransitionSpec (None until one is configured or declared) and the INSERT check."""

    def __init__(self, configured: str | os.PathLike[str] | None, snapshot: str | os.PathLike[str] | None):
        self._lock = threading.Lock()
        self._sidecar = spec_sidecar(snapshot) if snapshot is not None else None
        self.spec: TransitionSpec | None = None
        self.refused_inserts = 0
        stored = None
        if self._sidecar is not None and os.path.exists(self._sidecar):
            stored = load_spec(self._sidecar)
        wanted = load_spec(configured) if configured is not None else None
        if stored is not None and wanted is not None and stored != wanted:
            raise ValueError(
                f"--spec {wanted!r} differs from the spec {stored!r} kept with the snapshot in {self._sidecar}"
            )
        self.spec = wanted or stored
        if self.spec is not None and stored is None:
            self._persist(self.spec)

    def _persist(self, spec: TransitionSpec) -> None:
        if self._sidecar is not None:
            write_atomically(self._sidecar, spec.to_json())

    def declare(self, spec_json: str) -> TransitionSpec | None:
        """A HELLO's spec ("" declares none) -> the server's spec afterwards. The first one sticks; another
        raises ValueError naming both."""
        if not spec_json:
            return self.spec
        spec = TransitionSpec.from_json(spec_json)
        with self._lock:
            if self.spec is None:
                self._persist(spec)
                self.spec = spec
            elif spec != self.spec:
                raise ValueError(f"declared spec {spec!r} differs from the server's spec {self.spec!r}")
            return self.spec

    def check(self, data: Any, offsets: Any) -> None:
        """ValueError naming the first bad item, its size and what the spec expects; nothing without a spec."""
        spec = self.spec
        if spec is None:
            return
        try:
            spec.validate_items(data, offsets)
        except ValueError as exc:
            with self._lock:
                self.refused_inserts += 1
            raise ValueError(f"INSERT refused, nothing stored: {exc}") from None

    def stats(self) -> dict[str, int]:
        spec = self.spec
        return {"spec_declared": int(spec is not None), "spec_fingerprint": spec.fingerprint if spec else 0,
                "spec_refused_inserts": self.refused_inserts}


class InsertWindow:
    """Replies to recent inserts by id, bounded by ``max_ids`` and ``max_bytes``; see the module docstring."""

    def __init__(self, max_ids: int = DEDUP_MAX_IDS, max_bytes: int = DEDUP_MAX_BYTES):
        self.max_ids = max_ids
        self.max_bytes = max_bytes
        self._lock = threading.Lock()
        self._done: OrderedDict[tuple[int, int], np.ndarray] = OrderedDict()
        self._pending: dict[tuple[int, int], tuple[Any, float]] = {}  # id -> (first request, its deadline)
        self._bytes = 0
        self.duplicates = 0
        self.forgotten = 0

    def claim(self, insert_id: tuple[int, int], req: Any, deadline: float) -> tuple[str, np.ndarray | None]:
        """(DONE, keys) for an id already stored; (BUSY, None) while another request with this id waits or is
        served; else (NEW, None) and ``req`` owns the id until :meth:`finish` or :meth:`release`."""
        with self._lock:
            keys = self._done.get(insert_id)
            if keys is not None:
                self.duplicates += 1
                return DONE, keys
            owner = self._pending.get(insert_id)
            if owner is not None and owner[0] is not req and time.monotonic() < owner[1] + _ABANDONED_GRACE_S:
                return BUSY, None
            self._pending[insert_id] = (req, deadline)
            if len(self._pending) > self.max_ids:  # owners dropped without an answer: forget them
                now = time.monotonic()
                for key in [k for k, (_r, d) in self._pending.items() if now >= d + _ABANDONED_GRACE_S]:
                    del self._pending[key]
            return NEW, None

    def release(self, insert_id: tuple[int, int], req: Any) -> None:
        """``req`` was answered without storing (an error): a retry may store the batch."""
        with self._lock:
            owner = self._pending.get(insert_id)
            if owner is not None and owner[0] is req:
                del self._pending[insert_id]

    def finish(self, insert_id: tuple[int, int], req: Any, keys: np.ndarray) -> None:
        """``req`` stored its batch as ``keys``: remember them (evicting the oldest ids past the bounds)."""
        keys = np.asarray(keys, dtype=np.uint64)  # the store's fresh array; never written after this
        with self._lock:
            owner = self._pending.get(insert_id)
            if owner is not None and owner[0] is req:
                del self._pending[insert_id]
            self._done[insert_id] = keys
            self._bytes += keys.nbytes + _ENTRY_OVERHEAD
            while self._done and (len(self._done) > self.max_ids or self._bytes > self.max_bytes):
                _id, old = self._done.popitem(last=False)
                self._bytes -= old.nbytes + _ENTRY_OVERHEAD
                self.forgotten += 1

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"duplicate_inserts": self.duplicates, "insert_ids_remembered": len(self._done),
                    "insert_ids_forgotten": self.forgotten}
