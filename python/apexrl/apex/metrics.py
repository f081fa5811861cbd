"""Metrics as CSV: one row per interval, a fixed header, appended across restarts.

``CSVWriter(path, columns)`` writes the header once. When the file already exists (a resumed learner) its
header must list the same columns -- or some of them, written by an older version (then the file is rewritten
once with the new header, the new columns empty in the old rows) -- and rows are appended after the last complete line (a torn last line from
a killed process is dropped). Empty cells mean "no value in this interval" (e.g. ``eval_return_mean`` when
no evaluation finished). Rows are flushed as they are written, so a reader (``apexrl plot``, the launcher's
progress display) sees them at once.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

from apexrl.durable import append_private, make_private_dirs, write_atomically

__all__ = ["CSVWriter", "Mean", "cell_text", "read_csv"]


class CSVWriter:
    def __init__(self, path: str, columns: Sequence[str]):
        if len(set(columns)) != len(columns):
            raise ValueError(f"duplicate metric columns in {list(columns)}")
        self.path = path
        self.columns = list(columns)
        make_private_dirs(os.path.dirname(os.path.abspath(path)))
        existing = os.path.exists(path) and os.path.getsize(path) > 0
        if existing:
            self._check_existing()
        self._file = append_private(path, newline="", encoding="utf-8")  # created 0600, never through a link
        if not existing:
            self._file.write(",".join(self.columns) + "\n")
            self._file.flush()

    def _check_existing(self) -> None:
        with open(self.path, "rb+") as f:
            data = f.read()
            header = data.split(b"\n", 1)[0].decode("utf-8", "replace").strip()
            old = header.split(",")
            if old != self.columns and len(set(old)) == len(old) and set(old) < set(self.columns):
                self._add_columns(old, data[: data.rfind(b"\n") + 1])
                return
            if old != self.columns:
                raise ValueError(
                    f"{self.path} has columns {header!r}, expected {','.join(self.columns)!r}: "
                    "use another run directory"
                )
            if not data.endswith(b"\n"):  # a row torn by a kill: drop it
                f.truncate(data.rfind(b"\n") + 1)

    def _add_columns(self, old: list[str], data: bytes) -> None:
        """Rewrite the file (atomically) with this writer's header; old rows get empty new columns."""
        rows = list(csv.reader(io.StringIO(data.decode("utf-8", "replace"))))[1:]
        buf = io.StringIO()
        out = csv.writer(buf, lineterminator="\n")
        out.writerow(self.columns)
        for r in rows:
            if len(r) == len(old):
                cells = dict(zip(old, r))
                out.writerow([cells.get(c, "") for c in self.columns])
        write_atomically(self.path, buf.getvalue())

    def write(self, row: Mapping[str, Any]) -> None:
        unknown = set(row) - set(self.columns)
        if unknown:
            raise ValueError(f"unknown metric column(s) {sorted(unknown)}")
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerow([cell_text(row.get(c)) for c in self.columns])
        self._file.write(buf.getvalue())
        self._file.flush()

    def close(self) -> None:
        if not self._file.closed:
            self._file.close()


def cell_text(v: Any) -> str:
    """A value as metrics.csv writes it: floats to six significant digits, None and NaN as an empty cell."""
    if v is None:
        return ""
    if isinstance(v, float):
        if math.isnan(v):
            return ""
        return f"{v:.6g}"
    return str(v)


class Mean:
    """Running means of named floats over one interval; ``pop()`` returns them and starts a new interval. A name
    ending in ``_max`` keeps the interval's largest value instead: a mean of maxima would hide the worst case."""

    def __init__(self) -> None:
        self._sum: dict[str, float] = {}
        self._n: dict[str, int] = {}
        self._max: dict[str, float] = {}

    def add(self, values: Mapping[str, float]) -> None:
        for k, v in values.items():
            if k.endswith("_max"):
                self._max[k] = max(self._max.get(k, float(v)), float(v))
                continue
            self._sum[k] = self._sum.get(k, 0.0) + float(v)
            self._n[k] = self._n.get(k, 0) + 1

    def pop(self) -> dict[str, float]:
        out = {k: self._sum[k] / self._n[k] for k in self._sum}
        out.update(self._max)
        self._max = {}
        self._sum.clear()
        self._n.clear()
        return out


def read_csv(path: str) -> dict[str, list[float]]:
    """Columns of a metrics CSV as lists of floats (NaN for empty cells)."""
    with open(path, newline="", encoding="utf-8") as f:
        rows = list(csv.reader(f))
    if not rows:
        raise ValueError(f"{path} is empty")
    header, body = rows[0], [r for r in rows[1:] if len(r) == len(rows[0])]
    return {name: [float(r[i]) if r[i] else math.nan for r in body] for i, name in enumerate(header)}
