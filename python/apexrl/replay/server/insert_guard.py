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


def spec_sidecar(snapshot: str | os.PathLike[str], table: str = "default") -> str:
    """The file that keeps a table's spec beside the snapshot: ``SNAPSHOT.spec.json`` for the table ``default``
    (the name it always had, so older snapshots load), ``SNAPSHOT.table-NAME.spec.json`` for any other."""
    if table == "default":
        return os.fspath(snapshot) + ".spec.json"
    return f"{os.fspath(snapshot)}.table-{table}.spec.json"


class SpecGate:
    """One table's TransitionSpec (None until one is configured or declared: the table's structure, pinned) and
    the INSERT check. The server keeps one per table; a table's sidecar file keeps its spec beside the snapshot.
    """

    def __init__(
        self,
        configured: TransitionSpec | str | os.PathLike[str] | None,
        snapshot: str | os.PathLike[str] | None,
        table: str = "default",
    ):
        self._lock = threading.Lock()
        self.table = table
        self._sidecar = spec_sidecar(snapshot, table) if snapshot is not None else None
        self.spec: TransitionSpec | None = None
        stored = None
        if self._sidecar is not None and os.path.exists(self._sidecar):
            stored = load_spec(self._sidecar)
        if isinstance(configured, TransitionSpec) or configured is None:
            wanted = configured
        else:
            wanted = load_spec(configured)
        if stored is not None and wanted is not None and stored != wanted:
            what = "--spec" if table == "default" else f"table {table!r}: spec"
            raise ValueError(
                f"{what} {wanted!r} differs from the spec {stored!r} kept with the snapshot in {self._sidecar}"
            )
        self.spec = wanted or stored
        if self.spec is not None and stored is None:
            self._persist(self.spec)

    def _persist(self, spec: TransitionSpec) -> None:
        if self._sidecar is not None:
            write_atomically(self._sidecar, spec.to_json())

    def declare(self, spec_json: str) -> TransitionSpec | None:
        """A HELLO's spec ("" declares none) -> the table's spec afterwards. The first one sticks (written to
        the sidecar before it is used); another raises ValueError naming both. Atomic: of two declarations at
        once, one pins and the other is compared with it."""
        if not spec_json:
            return self.spec
        spec = TransitionSpec.from_json(spec_json)
        with self._lock:
            if self.spec is None:
                self._persist(spec)
                self.spec = spec
            elif spec != self.spec:
                raise ValueError(
                    f"declared spec {spec!r} differs from the server's spec {self.spec!r} for table {self.table!r}"
                )
            return self.spec
