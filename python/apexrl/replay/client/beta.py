"""The importance-sampling exponent beta as a number or a schedule over the batches a learner takes.

Prioritized replay (Schaul et al.) anneals beta towards 1 as training goes on, so that the bias of sampling by
priority is fully corrected by the end. A sampler or ``ReplayDataset`` given a callable asks it for the beta of
each batch it requests, by that batch's index (0, 1, 2, ...): with one update per batch, the learner step.
"""

from __future__ import annotations

import math
from collections.abc import Callable

__all__ = ["Beta", "beta_at", "linear_beta"]

Beta = float | Callable[[int], float]
"""A fixed beta, or a function of the batch index giving the beta of that batch."""


def beta_at(beta: Beta, index: int) -> float:
    """The beta of batch ``index``: ``beta`` itself, or ``beta(index)``; ValueError unless finite and >= 0."""
    value = beta(index) if callable(beta) else beta
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not (math.isfinite(value) and value >= 0):
        raise ValueError(
            f"beta must be a finite number >= 0, got {value!r}" + (f" for batch {index}" if callable(beta) else "")
        )
    return float(value)


def linear_beta(start: float = 0.4, end: float = 1.0, steps: int = 100_000, offset: int = 0) -> Callable[[int], float]:
    """beta going linearly from ``start`` to ``end`` over ``steps`` batches, then ``end``: PER's schedule
    (start 0.4, end 1). ``offset`` is added to each batch index: a learner resumed at step S passes S."""
    beta_at(start, 0)
    beta_at(end, 0)
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"steps must be an integer >= 1, got {steps!r}")
    if isinstance(offset, bool) or not isinstance(offset, int) or offset < 0:
        raise ValueError(f"offset must be an integer >= 0, got {offset!r}")

    def schedule(index: int) -> float:
        return start + (end - start) * min(1.0, (index + offset) / steps)

    return schedule
