"""Helpers shared by the test modules (fixtures are in conftest.py)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any, TypeVar

T = TypeVar("T")


def wait_until(
    cond: Callable[[], T],
    timeout: float,
    what: str = "condition",
    *,
    interval: float = 0.05,
    on_poll: Callable[[], Any] | None = None,
) -> T:
    """Poll ``cond()`` every ``interval`` seconds until it returns something truthy and return that; an
    AssertionError naming ``what`` after ``timeout`` seconds. ``on_poll`` runs after every poll (a test that must
    keep a peer busy meanwhile)."""
    deadline = time.monotonic() + timeout
    while True:
        value = cond()
        if on_poll is not None:
            on_poll()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def rows_with_updates(metrics: dict[str, list[float]]) -> Any:
    """A boolean mask over a metrics.csv's rows (``read_csv`` columns): True where learner_steps grew since the row
    before, i.e. the row's interval had updates and carries their means. The row written at a run's stop may
    follow the previous one with none: its agent columns are empty cells, read back as NaN."""
    import numpy as np

    steps = np.asarray(metrics["learner_steps"])
    return np.diff(steps, prepend=0) > 0


def csv_columns(path: str, *needed: str) -> dict[str, list[float]] | None:
    """A metrics or episodes CSV's columns (``apexrl.apex.metrics.read_csv``), or None while the file is not
    there or its header is not whole yet (a process writing it creates the file, then writes the header: a poll
    can fall between the two) -- the header is whole once it names every column of ``needed``."""
    from apexrl.apex.metrics import read_csv

    try:
        columns = read_csv(path)
    except (FileNotFoundError, ValueError):  # ValueError: empty
        return None
    return columns if all(name in columns for name in needed) else None
