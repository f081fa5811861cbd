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

from apexrl.replay.wire.codec import TransitionSpec

__all__ = ["NStepBuffer", "Transition", "VecNStep", "stack_transitions"]


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
        self.n: int = int(n)
        self.gamma: float = float(gamma)
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


class VecNStep:
    """The n-step transitions of K environments stepped in lockstep, computed over arrays: exactly those (same
    values, same order) of K :class:`NStepBuffer` fed one environment after another at every step, without a
    Python call per environment and step. Observations are opaque int handles (the actor's observation ring).

    ``add`` returns the step's transitions as a dict of arrays named like :class:`Transition`'s fields (``obs`` and
    ``next_obs`` handles), environment 0's first, an ended episode's longest horizon first; None when there are
    none. Call order per environment as for NStepBuffer: ``add_first`` (for the environments given), ``add`` for
    all K, ``add_first`` again for those whose episode ended.
    """

    def __init__(self, k: int, n: int, gamma: float):
        NStepBuffer(n, gamma)  # the same argument checks
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k, self.n, self.gamma = int(k), int(n), float(gamma)
        self._gk = [self.gamma**i for i in range(self.n)]
        self._discounts = np.array([self.gamma**m for m in range(self.n + 1)])
        self._obs = np.zeros((self.k, self.n + 1), np.int64)  # pending s_t ... and the latest at [j, len[j]]
        self._rew = np.zeros((self.k, self.n))
        self._act: np.ndarray | None = None  # (K, n, *action shape), allocated at the first add
        self._len = np.zeros(self.k, np.int64)
        self._open = np.zeros(self.k, bool)
        self._all = np.arange(self.k)

    def add_first(self, envs: Sequence[int] | np.ndarray, handles: Sequence[int] | np.ndarray) -> None:
        envs = np.asarray(envs, np.int64)
        if self._open[envs].any():
            raise RuntimeError("VecNStep.add_first for an environment whose episode is still open")
        self._obs[envs, 0] = handles
        self._len[envs] = 0
        self._open[envs] = True

    def _horizon(self, j: int, start: int, m: int) -> float:
        reward = 0.0
        for i in range(m):  # NStepBuffer's order of additions, so the float sums are the same
            reward += self._gk[i] * float(self._rew[j, start + i])
        return reward

    def add(
        self,
        actions: Sequence[Any] | np.ndarray,
        rewards: np.ndarray,
        next_handles: np.ndarray,
        terminated: np.ndarray,
        truncated: np.ndarray,
    ) -> dict[str, np.ndarray] | None:
        if not self._open.all():
            raise RuntimeError("VecNStep.add with an environment whose episode is not open: add_first it first")
        rewards = np.asarray(rewards, np.float64)
        if not np.all(np.isfinite(rewards)):
            raise ValueError(f"reward must be finite, got {rewards.tolist()}")
        a = np.asarray(actions)
        if self._act is None:
            self._act = np.zeros((self.k, self.n, *a.shape[1:]), a.dtype)
        ar, length = self._all, self._len
        self._act[ar, length] = a
        self._rew[ar, length] = rewards
        length += 1
        self._obs[ar, length] = next_handles
        terminated = np.asarray(terminated, bool)
        ended = terminated | np.asarray(truncated, bool)
        full = ~ended & (length == self.n)
        counts = np.where(ended, length, full)
        total = int(counts.sum())
        if total == 0:
            return None
        at = np.cumsum(counts) - counts  # each environment's first row
        out = {
            "obs": np.empty(total, np.int64),
            "action": np.empty((total, *self._act.shape[2:]), self._act.dtype),
            "reward": np.empty(total),
            "discount": np.empty(total),
            "next_obs": np.empty(total, np.int64),
        }
        if full.any():
            rows, envs = at[full], ar[full]
            out["obs"][rows] = self._obs[envs, 0]
            out["action"][rows] = self._act[envs, 0]
            reward = np.zeros(len(envs))
            for i in range(self.n):
                reward = reward + self._gk[i] * self._rew[envs, i]
            out["reward"][rows] = reward
            out["discount"][rows] = self._discounts[self.n]
            out["next_obs"][rows] = self._obs[envs, self.n]
            self._obs[envs, : self.n] = self._obs[envs, 1:]
            self._act[envs, : self.n - 1] = self._act[envs, 1:]
            self._rew[envs, : self.n - 1] = self._rew[envs, 1:]
            length[envs] = self.n - 1
        for j in np.flatnonzero(ended).tolist():
            m_all, row = int(length[j]), int(at[j])
            for i in range(m_all):  # longest horizon first, as NStepBuffer
                m = m_all - i
                out["obs"][row + i] = self._obs[j, i]
                out["action"][row + i] = self._act[j, i]
                out["reward"][row + i] = self._horizon(j, i, m)
                out["discount"][row + i] = 0.0 if terminated[j] else self._discounts[m]
                out["next_obs"][row + i] = self._obs[j, m_all]
            length[j] = 0
            self._open[j] = False
        return out

    def truncate(self) -> dict[str, np.ndarray] | None:
        """End every open episode here as a truncation (``NStepBuffer.truncate`` per environment, in order)."""
        rows: list[tuple] = []
        for j in np.flatnonzero(self._open).tolist():
            assert self._act is not None  # an open episode has had its first add
            m_all = int(self._len[j])
            for i in range(m_all):
                m = m_all - i
                rows.append(
                    (self._obs[j, i], self._act[j, i], self._horizon(j, i, m), self._discounts[m], self._obs[j, m_all])
                )
            self._len[j] = 0
            self._open[j] = False
        if not rows:
            return None
        obs, action, reward, discount, next_obs = zip(*rows)
        return {
            "obs": np.array(obs, np.int64),
            "action": np.array(action),
            "reward": np.array(reward),
            "discount": np.array(discount),
            "next_obs": np.array(next_obs, np.int64),
        }
