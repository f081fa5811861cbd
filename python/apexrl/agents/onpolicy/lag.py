"""The policy lag of a popped batch: how many learner updates behind the weights that acted were."""

from __future__ import annotations

import numpy as np

__all__ = ["LAG_METRICS", "policy_lag"]

LAG_METRICS = ("policy_lag_mean", "policy_lag_max")
"""metrics.csv's columns of the lag (docs/running.md): the mean over the interval's batches of each batch's mean
lag over its trained steps, and the largest lag of any trained step in the interval."""


def policy_lag(learner_version: int, versions: np.ndarray, trained: np.ndarray) -> dict[str, float]:
    """``learner_version - version`` over the trained steps: their mean and max (0 and 0 when none is trained)."""
    lag = learner_version - np.asarray(versions, np.int64)[np.asarray(trained, bool)]
    if lag.size == 0:
        return {"policy_lag_mean": 0.0, "policy_lag_max": 0.0}
    return {"policy_lag_mean": float(lag.mean()), "policy_lag_max": float(lag.max())}
