"""Which decoded transitions an agent can train on: per-item value rules.

The replay server checks an item's structure (its spec), not its values: an item that decodes can still hold
an action index the network has no output for, or a NaN reward, and one such item makes a whole update
non-finite (the learner then stops: "the network diverged"). Each agent lists its rules
(``Agent.invalid_items``); the learner leaves the items that break one out of the batch, erases them from the
replay and counts them (``invalid_items`` in metrics.csv).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

__all__ = ["Rule", "all_finite", "finite", "in_range", "invalid_items"]


@dataclass(frozen=True)
class Rule:
    """``ok(values)`` -> per-value bool for ``field``; ``what`` says what a value must be, for the log."""

    field: str
    ok: Callable[[np.ndarray], np.ndarray]
    what: str


def finite(field: str) -> Rule:
    """Every value of the item's ``field`` is finite (integer fields always are)."""

    def ok(x: np.ndarray) -> np.ndarray:
        return np.isfinite(x) if x.dtype.kind in "fc" else np.ones(x.shape, dtype=bool)

    return Rule(field, ok, "must be finite")


def in_range(field: str, lo: float, hi: float) -> Rule:
    """Every value of the item's ``field`` is in ``[lo, hi]`` (NaN is not)."""
    return Rule(field, lambda x: (x >= lo) & (x <= hi), f"must be in [{lo:g}, {hi:g}]")


def invalid_items(batch: Mapping[str, np.ndarray], rules: Sequence[Rule]) -> tuple[np.ndarray | None, str | None]:
    """(mask of the items that break a rule, a message naming the first one), or (None, None) if none does."""
    bad: np.ndarray | None = None
    message: str | None = None
    for rule in rules:
        x = np.asarray(batch[rule.field])
        good = np.asarray(rule.ok(x)).reshape(len(x), -1).all(axis=1)
        if good.all():
            continue
        if message is None:
            i = int(np.flatnonzero(~good)[0])
            shown = np.array2string(x[i].reshape(-1)[:8], threshold=8) if x[i].size > 1 else repr(x[i].item())
            message = f"item {i}: {rule.field} {rule.what}, got {shown}"
        bad = ~good if bad is None else bad | ~good  # type: ignore[assignment]  # all(axis=1) of 2-D is an array
    return bad, message


def all_finite(batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
    """:func:`invalid_items` with :func:`finite` on every field: the rule for an agent that states none."""
    return invalid_items(batch, [finite(name) for name in batch])
