"""What the replay server checks before it stores an INSERT: the run's TransitionSpec and the insert's id.

* :class:`SpecGate` holds the spec the server learned -- from its configuration (``--spec``), from the sidecar
  ``SNAPSHOT.spec.json`` written next to a snapshot, or from the first HELLO that declares one. The first spec
  sticks: another one is refused naming both field lists. Once there is a spec, the native loop checks every
  INSERT batch against its item layout (cpp/apexrl/item_layout.h, held to
  :meth:`TransitionSpec.validate_items` by the tests: sizes, fingerprints, compressed block lengths) and
  refuses it whole when any item fails, so one foreign item never reaches a learner.
* Exactly-once inserts across retries (the keys replied to the last inserts, by their ``insert_id``) are kept
  by the native serving loop (cpp/apexrl/serve/insert_window.h), bounded per client identity by
  :data:`DEDUP_MAX_IDS` and :data:`DEDUP_MAX_BYTES`.

Imports no torch; thread-safe.
"""

from __future__ import annotations

import os
import threading

from apexrl.durable import write_atomically
from apexrl.replay.wire.codec import TransitionSpec

__all__ = ["DEDUP_MAX_BYTES", "DEDUP_MAX_IDS", "SpecGate", "load_spec", "spec_sidecar"]

DEDUP_MAX_IDS = 65536
"""Most insert ids the server remembers per client identity (the oldest are forgotten first)."""
DEDUP_MAX_BYTES = 64 << 20
"""Most bytes the remembered replies of one identity may take: 8 bytes per key plus 256 per id."""


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
