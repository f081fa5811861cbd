"""Progress records of the actor and learner processes: one dict, two renderings.

Each record goes to stdout as one human-readable ``key=value`` line (what a person running a process by hand
reads) and, when the process has a progress file (the run plan gives one to every child of ``apexrl run``),
as one JSON object per line appended there: what the launcher reads (:class:`apexrl.launch.progress.Progress`).
No consumer parses the text lines.
"""

from __future__ import annotations

import json
import math
import os
import sys
from collections.abc import Mapping
from typing import Any, TextIO

__all__ = ["ProgressReporter"]


def _text(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    if isinstance(v, float):
        return f"{v:.6g}"
    return str(v)


def _json_value(v: Any) -> Any:
    return None if isinstance(v, float) and not math.isfinite(v) else v


class ProgressReporter:
    """Writes records of one process (``role``: "learner" or "actor"). Single-threaded by contract."""

    def __init__(self, role: str, path: str | None, *, prefix: bool = True, out: TextIO | None = None):
        self.role = role
        self.prefix = f"{role} " if prefix else ""
        self.path = path
        self._out = out
        self._file: TextIO | None = None
        if path:
            os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
            self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - open for the reporter's life; close() closes it

    def emit(self, record: Mapping[str, Any], text_keys: tuple[str, ...] | None = None) -> None:
        """Print ``[role ]k=v ...`` (only ``text_keys`` when given) and append the whole record as JSON."""
        keys = text_keys if text_keys is not None else tuple(record)
        line = " ".join(f"{k}={_text(record.get(k))}" for k in keys if k in record)
        print(f"{self.prefix}{line}", file=self._out or sys.stdout, flush=True)
        if self._file is not None:
            full = {"role": self.role, **{k: _json_value(v) for k, v in record.items()}}
            self._file.write(json.dumps(full) + "\n")
            self._file.flush()

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
