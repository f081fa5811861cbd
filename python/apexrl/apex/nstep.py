"""N-step transitions from a stream of environment steps: the actor's local adder.

One :class:`NStepBuffer` per environment instance. With steps ``(s_t, a_t, r_t, s_{t+1})`` it emits, for every
``t``, the transition ::

    obs      = s_t
    action   = a_t
    reward   = R_t = sum_{k=0}^{m-1} gamma^k r_{t+k}
    discount = D_t = gamma^m        (0.0 when the episode *terminated* within those m steps)
    next_obs = s_{t+m}

with ``m = n`` in the middle of an episode and ``m < n`` for the last ``n - 1`` steps of an episode (the
horizon is cut at the episode end). The learner's target is then ``R_t + D_t * Q(s_{t+m}, .)``: one formula
for every horizon, no special cases, because the discount already holds ``gamma^m`` and the terminal flag.

Termination vs truncation (time limits): ``terminated`` ends the MDP, so no horizon that reaches the last
step bootstraps (``D = 0``). ``truncated`` only stops the episode; the state after it still has a value, so
those horizons keep ``D = gamma^m`` and bootstrap from the last observation (Pardo et al. 2018, "Time Limits
in Reinforcement Learning"). A step that is both counts as terminated.

Timing: ``add`` returns the transition for ``s_{t-n+1}`` as soon as ``n`` steps are buffered (the first one
after the n-th step of an episode), and at an episode end the ``min(n, episode length)`` pending ones at once,
longest horizon first. Nothing is emitted twice and every step of every finished episode is emitted once.

Call order: ``add_first(s_0)``, then ``add(...)`` per step; after a step with ``terminated or truncated`` the
next episode starts with ``add_first`` again. Calling ``add_first`` while an episode is still open is an error
(it would silently drop up to ``n - 1`` transitions); call :meth:`NStepBuffer.reset` first to drop them on
purpose, e.g. after an environment crashed mid-episode.

Observations are kept by reference, not copied: environments hand out fresh arrays every step.
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

from apexrl.replay.codec import TransitionSpec

__all__ = ["NStepBuffer", "Transition", "stack_transitions"]

class Transition(NamedTuple):
    """One n-step transition (see the module docstring for the formulas)."""

    obs: np.ndarray
    action: Any
    reward: float  # sum_{k<m} gamma^k r_k
    discount: float  # gamma^m, or 0.0 if terminated within the m steps
    next_obs: np.ndarray  # the observation m steps later


class NStepBuffer:
    """Turns one episode stream into n-step transitions (see the module docstring).

    Args:
      n: horizon, an int >= 1 (n = 1 gives one-step transitions with discount gamma or 0).
      gamma: discount per step, in [0, 1].

    Raises:
      ValueError: for n < 1 (or not an int) and gamma outside [0, 1] (or not finite).
    """

    def __init__(self, n: int, gamma: float):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0.0 <= float(gamma) <= 1.0:
            raise ValueError(f"gamma must be a float in [0, 1], got {gamma!r}")
        self.n = int(n)
        self.gamma = float(gamma)
        self._pending: deque[tuple[np.ndarray, Any, float]] = deque()  # (s_t, a_t, r_t), oldest first
        self._obs: np.ndarray | None = None  # the latest observation; None between episodes

    @property
    def in_episode(self) -> bool:
        """True between ``add_first`` and the step that ends the episode."""
        return self._obs is not None

    def __len__(self) -> int:
        """Steps buffered whose transition has not been emitted yet (at most n - 1 between calls)."""
        return len(self._pending)

    def reset(self) -> None:
        """Drop the open episode and its pending steps (they are never emitted)."""
        self._pending.clear()
        self._obs = None

    def truncate(self) -> list[Transition]:
        """End the open episode here as a truncation and return its pending transitions (shorter horizons
        bootstrapping from the latest observation): what an actor that stops mid-episode still holds is
        valid experience. No-op (empty list) between episodes."""
        if self._obs is None:
            return []
        out = [self._transition(m, self._obs, False) for m in range(len(self._pending), 0, -1)]
        self.reset()
        return out

    def add_first(self, obs: np.ndarray) -> None:
        """Start an episode at observation ``s_0``.

        Raises:
          RuntimeError: an episode is still open (its last step had neither terminated nor truncated);
            call ``reset()`` first to drop it on purpose.
        """
        if self._obs is not None:
            raise RuntimeError(
                "NStepBuffer.add_first called while an episode is still open (its last add() had neither "
                "terminated nor truncated); call reset() first to drop the pending steps on purpose"
            )
        self._obs = obs

    def add(
        self, action: Any, reward: float, next_obs: np.ndarray, terminated: bool, truncated: bool
    ) -> list[Transition]:
        """Record step ``(s_t, a_t, r_t, s_{t+1})`` and return the transitions it completes (oldest first).

        Raises:
          RuntimeError: no open episode (``add_first`` was not called, or the last step ended the episode).
          ValueError: a reward that is not a finite number.
        """
        if self._obs is None:
            raise RuntimeError(
                "NStepBuffer.add called without an open episode: call add_first(obs) first "
                "(and again after every step with terminated or truncated)"
            )
        r = float(reward)
        if not math.isfinite(r):
            raise ValueError(f"reward must be finite, got {reward!r}")
        self._pending.append((self._obs, action, r))
        self._obs = next_obs

        if terminated or truncated:
            out = [self._transition(m, next_obs, bool(terminated)) for m in range(len(self._pending), 0, -1)]
            self.reset()
            return out
        if len(self._pending) == self.n:
            return [self._transition(self.n, next_obs, False)]
        return []

    def _transition(self, m: int, next_obs: np.ndarray, terminated: bool) -> Transition:
        """Pop the oldest pending step, whose horizon is the m steps now buffered, into a Transition."""
        obs, action, _ = self._pending[0]
        reward = 0.0
        for k, (_, _, r) in enumerate(self._pending):  # len(self._pending) == m here
            reward += self.gamma**k * r
        discount = 0.0 if terminated else self.gamma**m
        self._pending.popleft()
        return Transition(obs, action, reward, discount, next_obs)


def stack_transitions(ts: Sequence[Transition], spec: TransitionSpec) -> dict[str, np.ndarray]:
    """Stack transitions into the batch ``spec.encode`` takes: one array per field of ``spec`` (by name, taken
    from the :class:`Transition` field of that name), leading dim ``len(ts)``, exactly the spec's
    (native-endian) dtype and item shape.

    Raises:
      ValueError: the spec names a field the n-step adder does not produce, or a transition's value has the
        wrong shape (or does not convert to the spec's dtype).
    """
    unknown = [name for name in spec.names if name not in Transition._fields]
    if unknown:
        raise ValueError(f"spec fields {unknown} are not n-step transition fields {list(Transition._fields)}")
    out: dict[str, np.ndarray] = {}
    for f in spec.fields:
        arr = np.empty((len(ts), *f.shape), dtype=f.dtype.newbyteorder("="))
        for j, t in enumerate(ts):
            value = np.asarray(getattr(t, f.name))
            if value.shape != f.shape:
                raise ValueError(f"transition {j}: field {f.name!r} has shape {value.shape}, expected {f.shape}")
            arr[j] = value
        out[f.name] = arr
    return out
