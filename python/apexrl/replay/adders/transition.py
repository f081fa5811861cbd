"""N-step transitions: the one n-step implementation of the package, and the transition adders built on it.

**The n-step core.** One :class:`NStepBuffer` per environment instance. With steps ``(s_t, a_t, r_t, d_t,
s_{t+1})`` (``d_t`` the environment's discount of the step, dm_env's ``TimeStep.discount``: 1 unless given, 0
where the step terminated the episode) it emits, for every ``t``, the transition ::

    obs      = s_t
    action   = a_t
    reward   = R_t = sum_{k=0}^{m-1} gamma^k d_t ... d_{t+k-1} r_{t+k}
    discount = D_t = gamma^m d_t ... d_{t+m-1}
    next_obs = s_{t+m}

with ``m = n`` in the middle of an episode and ``m < n`` for the last ``n - 1`` steps of an episode (the
horizon is cut at the episode end). Without discounts given (every ``d`` 1 but a terminal 0) that is
``R_t = sum_k gamma^k r_{t+k}`` and ``D_t = gamma^m``, or 0 when the episode *terminated* within the m steps. The
learner's target is then ``R_t + D_t * Q(s_{t+m}, .)``: one formula for every horizon, no special cases, because
the discount already holds ``gamma^m`` and the terminal flag.

Acme's ``NStepTransitionAdder`` stores the same ``R_t`` and the discount ``D'_t = gamma^(m-1) d_t ... d_{t+m-1}``,
for a learner that multiplies by gamma once more: ``D_t = gamma * D'_t``, so both give the same bootstrap factor
(``gamma * D'_t`` there, ``D_t`` here). With ``gamma = 1`` the two are equal.

Rewards and discounts may be numbers, arrays or nested mappings of arrays (vector or multi-objective rewards, a
discount per objective): the sums run per leaf with numpy broadcasting, and where one of the two is a mapping and
the other not, the other is used for every key (Acme's rule); ``R_t`` then has the shape of ``r`` broadcast with
``d``, ``D_t`` that of ``d`` (:func:`nstep_return`).

Start of an episode: by default (Ape-X's) the first transition of an episode is ``s_0 -> s_{min(n, T)}``, one
transition per step. With ``shorter_at_start=True`` (Acme's) the first ``min(n, T) - 1`` steps also emit the
shorter transitions ``s_0 -> s_1, s_0 -> s_2, ..., s_0 -> s_{min(n, T) - 1}`` (horizon ``m = 1 ..`` by the same
formula, as soon as their step is added): an episode of ``T`` steps gives ``T + min(n, T) - 1`` items instead of
``T``, and ``s_0`` is sampled more often.

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

:class:`VecNStep` is the same core for K environments stepped in lockstep, computed over arrays: the same
transitions, values and order as K NStepBuffers (tests/apex/test_nstep.py holds it).

**The adders.** :class:`NStepTransitionAdder` feeds an NStepBuffer through the call-order rules of
:mod:`apexrl.replay.adders.base` and inserts what it emits into a table with ``client.insert(priorities, mapping,
table=table)``; :class:`TransitionAdder` is it with ``n = 1``; :class:`VecNStepTransitionAdder` is it for K
environments in lockstep, over a VecNStep. The Ape-X actors insert through these (K = 1 and K > 1), with their own
priority function and their pipelined insert as the client (:mod:`apexrl.apex.actor`).
"""

from __future__ import annotations

import math
import numbers
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any, NamedTuple, TypeAlias

import numpy as np

from apexrl.replay.adders.base import (
    Adder,
    Step,
    check_discount,
    check_int,
    check_priority,
    check_reward,
    float32_tree,
    stack,
    zeros_like,
)

__all__ = [
    "NStepBuffer",
    "NStepTransitionAdder",
    "Transition",
    "TransitionAdder",
    "VecNStep",
    "VecNStepTransitionAdder",
    "nstep_return",
    "priorities_for",
]


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
      shorter_at_start: also emit, at an episode's start, the ``min(n, T) - 1`` shorter transitions from ``s_0``
        (Acme's; module docstring, "Start of an episode").

    Raises:
      ValueError: for n < 1 (or not an int) and gamma outside [0, 1] (or not finite).
    """

    def __init__(self, n: int, gamma: float, *, shorter_at_start: bool = False):
        if isinstance(n, bool) or not isinstance(n, numbers.Integral) or n < 1:
            raise ValueError(f"n must be an int >= 1, got {n!r}")
        if isinstance(gamma, bool) or not isinstance(gamma, numbers.Real) or not 0.0 <= float(gamma) <= 1.0:
            raise ValueError(f"gamma must be a float in [0, 1], got {gamma!r}")
        self.n: int = int(n)
        self.gamma: float = float(gamma)
        self.shorter_at_start: bool = bool(shorter_at_start)
        # (s_t, a_t, r_t, d_t), oldest first; d_t None: 1 (0 where the episode terminated at that step)
        self._pending: deque[tuple[Any, Any, Any, Any]] = deque()
        self._obs: np.ndarray | None = None  # the latest observation; None between episodes
        self._general: bool = False  # a step of the open episode had a discount or a non-scalar reward

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
        self._general = False

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
        self._general = False

    def add(
        self,
        action: Any,
        reward: Any,
        next_obs: np.ndarray,
        terminated: bool,
        truncated: bool,
        discount: Any = None,
    ) -> list[Transition]:
        """Record step ``(s_t, a_t, r_t, s_{t+1})`` with the environment's discount ``d_t`` (None: 1; a number in
        [0, 1] or arrays, a nested mapping of arrays; 0 where ``terminated``) and return the transitions it
        completes (oldest first). ``reward`` may be a number, an array or a nested mapping of arrays.

        Raises:
          RuntimeError: no open episode (``add_first`` was not called, or the last step ended the episode).
          ValueError: a reward that is not finite, a discount not in [0, 1].
        """
        if self._obs is None:
            raise RuntimeError(
                "NStepBuffer.add called without an open episode: call add_first(obs) first "
                "(and again after every step with terminated or truncated)"
            )
        d: Any = None
        if discount is None and type(reward) is float and math.isfinite(reward):
            r: Any = reward  # the common case (Ape-X's): a float reward, no discount
        else:
            r = check_reward(reward)
            if discount is not None:
                d = check_discount(discount)
                if terminated:
                    d = 0.0 if isinstance(d, float) else zeros_like(d)
        return self._record(action, r, next_obs, terminated, truncated, d)

    def _record(
        self, action: Any, r: Any, next_obs: Any, terminated: bool, truncated: bool, d: Any
    ) -> list[Transition]:
        """``add`` with ``r`` and ``d`` checked (``d`` None: 1, or 0 where ``terminated``; else already 0 there)."""
        if d is not None or type(r) is not float:
            self._general = True
        self._pending.append((self._obs, action, r, d))
        self._obs = next_obs

        if terminated or truncated:
            out = [self._transition(m, next_obs, bool(terminated)) for m in range(len(self._pending), 0, -1)]
            self.reset()
            return out
        m = len(self._pending)
        if m == self.n:
            return [self._transition(self.n, next_obs, False)]
        if self.shorter_at_start:  # m < n: the episode's first step is still pending, s_0 -> s_m
            return [Transition(*self._horizon(m, False), next_obs)]
        return []

    def _horizon(self, m: int, terminated: bool) -> tuple[Any, Any, Any, Any]:
        """(s_t, a_t, R_t, D_t) of the oldest pending step over the next ``m`` pending steps (module docstring)."""
        obs, action, _, _ = self._pending[0]
        if not self._general:
            reward = 0.0
            for k in range(m):
                reward += self.gamma**k * self._pending[k][2]
            return obs, action, reward, 0.0 if terminated else self.gamma**m
        steps = [self._pending[k] for k in range(m)]
        rewards = [step[2] for step in steps]
        discounts = [1.0 if step[3] is None else step[3] for step in steps]
        if terminated and steps[-1][3] is None:
            discounts[-1] = 0.0
        reward, discount = nstep_return(rewards, discounts, self.gamma)
        return obs, action, reward, discount

    def _transition(self, m: int, next_obs: np.ndarray, terminated: bool) -> Transition:
        """Pop the oldest pending step, whose horizon is the m steps now buffered, into a Transition."""
        if self._general:
            t = Transition(*self._horizon(m, terminated), next_obs)
            self._pending.popleft()
            return t
        # The scalar path, inline (Ape-X's actors step through it); len(self._pending) == m here.
        obs, action, _, _ = self._pending[0]
        reward = 0.0
        for k, (_, _, r, _) in enumerate(self._pending):
            reward += self.gamma**k * r
        self._pending.popleft()
        return Transition(obs, action, reward, 0.0 if terminated else self.gamma**m, next_obs)


def nstep_return(rewards: Sequence[Any], discounts: Sequence[Any], gamma: float) -> tuple[Any, Any]:
    """``(R, D)`` of ``m = len(rewards)`` steps with environment discounts ``d_k`` (module docstring)::

        R = r_0 + gamma d_0 r_1 + gamma^2 d_0 d_1 r_2 + ... + gamma^(m-1) d_0 ... d_(m-2) r_(m-1)
        D = gamma^m d_0 ... d_(m-1)

    Rewards and discounts are numbers, arrays or nested mappings of arrays. Where one is a mapping and the other
    is not, the other is used for every key (Acme's ``broadcast_structures``); leaves broadcast as numpy arrays
    (``R`` takes the shape of ``r`` broadcast with ``d``, ``D`` that of ``d``). Numbers give floats.

    Raises:
      ValueError: the reward's and the discount's mappings have different keys.
    """
    r0, d0 = rewards[0], discounts[0]
    if isinstance(r0, Mapping) or isinstance(d0, Mapping):
        keys = list(r0 if isinstance(r0, Mapping) else d0)
        for name, tree in (("reward", r0), ("discount", d0)):
            if isinstance(tree, Mapping) and set(tree) != set(keys):
                raise ValueError(
                    f"{name} has keys {sorted(map(str, tree))}, the other of reward and discount {sorted(map(str, keys))}"
                )
        rs: dict[Any, Any] = {}
        ds: dict[Any, Any] = {}
        for k in keys:
            rs[k], ds[k] = nstep_return(
                [r[k] if isinstance(r, Mapping) else r for r in rewards],
                [d[k] if isinstance(d, Mapping) else d for d in discounts],
                gamma,
            )
        return rs, ds
    if all(type(x) is float for x in rewards) and all(type(x) is float for x in discounts):
        total, ret = d0, r0
        for i in range(1, len(rewards)):
            total *= gamma
            ret += rewards[i] * total
            total *= discounts[i]
        return ret, gamma * total
    total_a = np.array(d0, dtype=np.float64)
    r0_a = np.asarray(r0, dtype=np.float64)
    ret_a = np.array(np.broadcast_to(r0_a, np.broadcast_shapes(r0_a.shape, total_a.shape)))
    for i in range(1, len(rewards)):
        total_a = total_a * gamma
        ret_a = ret_a + np.asarray(rewards[i], dtype=np.float64) * total_a
        total_a = total_a * np.asarray(discounts[i], dtype=np.float64)
    return ret_a, gamma * total_a


class VecNStep:
    """The n-step transitions of K environments stepped in lockstep, computed over arrays: exactly those (same
    values, same order) of K :class:`NStepBuffer` fed one environment after another at every step, without a
    Python call per environment and step. Observations are opaque int handles (the actor's observation ring).

    Observations are arrays of one shape and dtype, fixed by the first ``add_first`` (the Ape-X actor's are int
    handles into its ring of observations; :class:`VecNStepTransitionAdder`'s are the observations themselves).

    ``add`` returns the step's transitions as a dict of arrays named like :class:`Transition`'s fields,
    environment 0's first, an ended episode's longest horizon first; None when there are none. Call order per
    environment as for NStepBuffer: ``add_first`` (for the environments given), ``add`` for all K, ``add_first``
    again for those whose episode ended; ``reset`` drops environments' open episodes.
    """

    def __init__(self, k: int, n: int, gamma: float):
        NStepBuffer(n, gamma)  # the same argument checks
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.k, self.n, self.gamma = int(k), int(n), float(gamma)
        self._gk = [self.gamma**i for i in range(self.n)]
        self._discounts = np.array([self.gamma**m for m in range(self.n + 1)])
        self._obs: np.ndarray | None = None  # (K, n + 1, *obs shape): pending s_t ... and the latest at [j, len[j]]
        self._rew = np.zeros((self.k, self.n))
        self._act: np.ndarray | None = None  # (K, n, *action shape), allocated at the first add
        self._len = np.zeros(self.k, np.int64)
        self._open = np.zeros(self.k, bool)
        self._all = np.arange(self.k)

    @property
    def open(self) -> np.ndarray:
        """(K,) bool: environments with an open episode."""
        return self._open.copy()

    @property
    def pending(self) -> int:
        """Steps buffered whose transition has not been emitted yet, all environments together."""
        return int(self._len[self._open].sum())

    def add_first(self, envs: Sequence[int] | np.ndarray, handles: Sequence[int] | np.ndarray) -> None:
        envs = np.asarray(envs, np.int64)
        still = self._open[envs]
        if still.any():
            raise RuntimeError(
                f"VecNStep.add_first for environments {envs[still].tolist()} whose episode is still open; call "
                "reset(envs) first to drop those episodes on purpose"
            )
        h = np.asarray(handles)
        if len(h) != len(envs):
            raise ValueError(f"{len(envs)} environments and {len(h)} observations")
        if self._obs is None:
            self._obs = np.zeros((self.k, self.n + 1, *h.shape[1:]), h.dtype)
        self._obs[envs, 0] = h
        self._len[envs] = 0
        self._open[envs] = True

    def reset(self, envs: Sequence[int] | np.ndarray | None = None) -> None:
        """Drop the open episodes of ``envs`` (all by default): their pending steps are never emitted."""
        which = self._all if envs is None else np.asarray(envs, np.int64)
        self._len[which] = 0
        self._open[which] = False

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
            raise RuntimeError(
                f"VecNStep.add with environments {np.flatnonzero(~self._open).tolist()} not in an episode: add_first "
                "them first (and again after every step that ends their episode)"
            )
        rewards = np.asarray(rewards, np.float64)
        if not np.all(np.isfinite(rewards)):
            raise ValueError(f"reward must be finite, got {rewards.tolist()}")
        a = np.asarray(actions)
        assert self._obs is not None  # every environment is open: add_first allocated it
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
        obs_shape, obs_dtype = self._obs.shape[2:], self._obs.dtype
        out = {
            "obs": np.empty((total, *obs_shape), obs_dtype),
            "action": np.empty((total, *self._act.shape[2:]), self._act.dtype),
            "reward": np.empty(total),
            "discount": np.empty(total),
            "next_obs": np.empty((total, *obs_shape), obs_dtype),
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
            m_all = int(self._len[j])
            if m_all == 0:  # add_first and no step yet: nothing to emit
                self._open[j] = False
                continue
            assert self._act is not None and self._obs is not None  # an episode with a step has had its first add
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
        assert self._obs is not None and self._act is not None
        return {
            "obs": np.array(obs, self._obs.dtype),
            "action": np.array(action, self._act.dtype),
            "reward": np.array(reward),
            "discount": np.array(discount),
            "next_obs": np.array(next_obs, self._obs.dtype),
        }


Priority: TypeAlias = float | Callable[[dict[str, Any]], Any] | None


class _Inserts:
    """What the n-step adders share: the table their batches go to, through which client, with which priorities."""

    def __init__(self, client: Any, table: str, priority: Priority, insert_batch: int):
        if not callable(priority):
            check_priority(priority, "None, a callable")
        self.insert_batch: int = check_int("insert_batch", insert_batch, 1)
        self.client: Any = client
        self.table: str = table
        self.priority: Priority = priority

    def _send(self, batch: Any, n: int) -> None:
        """Insert a stacked batch of ``n`` items with the adder's priorities (raises what the insert raises)."""
        self.client.insert(priorities_for(self.priority, batch, n), batch, table=self.table)


class NStepTransitionAdder(Adder, _Inserts):
    """Inserts the n-step transitions of an episode stream into ``table``: Acme's ``NStepTransitionAdder`` with two
    documented differences (module docstring): the stored discount is Acme's times gamma (the same bootstrap
    factor), and Acme's shorter start-of-episode transitions are written only with ``shorter_at_start=True``.

    Each item is the mapping ::

        {"obs": s_t, "action": a_t, "reward": R_t, "discount": D_t, "next_obs": s_{t+m}}  (+ "extras": e_t)

    with ``R_t``, ``D_t`` and ``m`` as in the module docstring (``discount`` holds ``gamma^m`` times the
    environment's discounts, 0 where the episode terminated within the horizon; Acme's discount is this divided by
    gamma; reward and discount float32, per leaf where structured), observations and actions as given, and
    ``"extras"`` only where ``add`` got ``extras`` (``e_t``, the extras of the item's first step ``t``; give them
    in every step or in none: a batch that mixes the two is refused, ValueError). Items go in batches: ``client.insert(priorities, batch,
    table=table)`` with every leaf stacked on a leading batch dimension.

    ``priority``: None (default) inserts with ``priorities=None`` (the server gives each new item the table's
    largest priority so far); a number gives every item that priority; a callable gets the stacked batch mapping
    and returns one priority per item (e.g. |TD error| from the actor's own network).

    What is unsent at any moment: the at most ``n - 1`` steps of the open episode whose horizon is not complete
    (no transition yet), and the at most ``insert_batch - 1`` transitions emitted and not yet inserted. As soon
    as ``insert_batch`` are buffered they are inserted as one batch, in the same call (an episode's end can emit
    up to ``n`` at once: every full batch goes, the rest waits); :meth:`flush` inserts what is buffered
    now; :meth:`truncate` ends the open episode here as a time limit (its pending steps become transitions);
    :meth:`close` flushes and refuses further calls. :meth:`reset` drops the open episode's pending steps (never
    emitted) but keeps the buffered transitions (they belong to steps already taken). An insert that raises (server
    unreachable, refused batch) leaves the batch buffered: the step that triggered it stays recorded (the episode
    ended if it ended it), and the next add or flush tries again.

    Args:
      client: anything with ``insert(priorities, mapping, table=...)`` (a ReplayClient).
      table: the table's name.
      n: horizon, an int >= 1.
      discount: gamma, the discount per step, in [0, 1].
      priority: None, a number >= 0, or a callable (above).
      insert_batch: transitions per insert, >= 1.
      shorter_at_start: also insert Acme's ``min(n, T) - 1`` shorter transitions from ``s_0`` at an episode's
        start (module docstring, "Start of an episode"); default False, one transition per step (Ape-X's).

    Raises:
      ValueError: a bad ``n``, ``discount``, ``priority`` or ``insert_batch``.
    """

    def __init__(
        self,
        client: Any,
        table: str,
        n: int,
        discount: float,
        priority: Priority = None,
        *,
        insert_batch: int = 8,
        shorter_at_start: bool = False,
    ):
        self._core = NStepBuffer(n, discount, shorter_at_start=shorter_at_start)  # checks n and discount
        _Inserts.__init__(self, client, table, priority, insert_batch)
        Adder.__init__(self)
        self._extras: deque[Any] = deque()  # e_t of the core's pending steps, oldest first (it emits oldest first)
        self._buffer: list[tuple] = []  # emitted, not inserted yet: (obs, action, reward, discount, next_obs, extras)

    @property
    def n(self) -> int:
        return self._core.n

    @property
    def discount(self) -> float:
        return self._core.gamma

    @property
    def pending(self) -> int:
        """Steps of the open episode whose transition is not emitted yet (at most n - 1 between calls)."""
        return len(self._core)

    @property
    def buffered(self) -> int:
        """Transitions emitted and not inserted yet (fewer than ``insert_batch`` between calls)."""
        return len(self._buffer)

    def _first(self, observation: Any) -> None:
        self._core.add_first(observation)

    def _step(self, step: Step, next_observation: Any, terminated: bool, truncated: bool) -> None:
        d = step.discount
        if type(d) is float and (d == 1.0 or terminated):
            d = None  # the default discount (1, 0 where terminated): the core's scalar path
        self._extras.append(step.extras)
        # Adder.add checked the reward and the discount: the core records them as they are.
        out = self._core._record(step.action, step.reward, next_observation, terminated, truncated, d)
        if self._core.shorter_at_start and out and len(self._core._pending) == len(self._extras):
            t = out[0]  # none popped: a shorter transition from s_0, with its e_0
            self._buffer.append((t.obs, t.action, t.reward, t.discount, t.next_obs, self._extras[0]))
        else:
            self._emit(out)

    def _drop(self) -> None:
        self._core.reset()
        self._extras.clear()

    def _emit(self, transitions: list[Transition]) -> None:
        for t in transitions:  # rows, stacked a column at a time when inserted (_stack_rows): no dict per item
            self._buffer.append((t.obs, t.action, t.reward, t.discount, t.next_obs, self._extras.popleft()))

    def _after_step(self) -> None:
        while len(self._buffer) >= self.insert_batch:
            self._insert(self.insert_batch)

    def truncate(self) -> None:
        """End the open episode here as a truncation: its pending steps become transitions (shorter horizons that
        bootstrap from the latest observation), buffered like any others. A no-op between episodes."""
        self._check_not_closed()
        if self._open:
            self._emit(self._core.truncate())
            self._obs, self._open = None, False
            self._after_step()

    def flush(self) -> None:
        """Insert the buffered transitions now, in batches of at most ``insert_batch`` (the open episode's
        pending steps stay pending)."""
        while self._buffer:
            self._insert(min(len(self._buffer), self.insert_batch))

    def close(self) -> None:
        """Flush, then refuse every further call (the client stays open: it is the caller's). The open episode's
        pending steps are not inserted: call :meth:`truncate` first to keep them."""
        if not self._closed:
            self.flush()
            self._closed = True

    def discard(self) -> int:
        """Drop what this adder holds and has not inserted: the buffered transitions and the open episode's
        pending steps (which would have become transitions). Returns how many transitions that is, e.g. for a
        process that stops while its server is gone and must say what it could not hand over."""
        lost = len(self._buffer) + len(self._core)
        self._buffer.clear()
        self.reset()
        return lost

    def _insert(self, n: int) -> None:
        """Insert the oldest ``n`` buffered transitions; they leave the buffer only once the insert returned."""
        self._send(_stack_rows(self._buffer[:n]), n)
        del self._buffer[:n]


def _stack_rows(rows: list[tuple]) -> dict[str, Any]:
    """NStepTransitionAdder's buffered rows as one item mapping with a leading batch dimension (the layout in its
    docstring): reward and discount float32, ``extras`` only where the rows have them (all or none)."""
    obs, action, reward, discount, next_obs, extras = zip(*rows)
    batch = {
        "obs": _column(obs, "obs"),
        "action": _column(action, "action"),
        "reward": _float_column(reward, "reward"),
        "discount": _float_column(discount, "discount"),
        "next_obs": _column(next_obs, "next_obs"),
    }
    if any(e is not None for e in extras):
        batch["extras"] = stack(list(extras), "extras")  # ValueError where some rows have none
    return batch


def _float_column(values: Sequence[Any], name: str) -> Any:
    """Rewards or discounts stacked as float32: floats directly, arrays or mappings through ``stack``."""
    if all(type(v) is float for v in values):
        return np.array(values, np.float32)
    return float32_tree(stack(list(values), name))


def _column(values: Sequence[Any], name: str) -> Any:
    """One field of the rows stacked: arrays of one shape directly, anything else (numbers, nested mappings)
    through :func:`~apexrl.replay.adders.base.stack`, which names the field that differs."""
    first = values[0]
    kind = type(first)
    if kind is np.ndarray and all(type(v) is np.ndarray and v.shape == first.shape for v in values):
        return np.stack(values)
    if (kind in (int, float, bool) or isinstance(first, np.generic)) and all(type(v) is kind for v in values):
        return np.array(values)  # scalars of one type (discrete actions): what stack gives, in one call
    return stack(list(values), name)


def priorities_for(priority: Priority, batch: Any, n: int) -> np.ndarray | None:
    """An adder's ``priority`` for a stacked batch of ``n`` items: None, ``n`` copies of a number, or what the
    callable returns for the batch.

    Raises:
      ValueError: the callable did not return ``n`` finite priorities >= 0.
    """
    if priority is None:
        return None
    if not callable(priority):
        return np.full(n, float(priority))
    priorities = np.asarray(priority(batch), dtype=np.float64)
    if priorities.shape != (n,) or not np.all(np.isfinite(priorities)) or np.any(priorities < 0):
        raise ValueError(
            f"the priority function must return {n} finite priorities >= 0 for a batch of {n}, got "
            f"shape {priorities.shape}"
        )
    return priorities


class TransitionAdder(NStepTransitionAdder):
    """One-step transitions: :class:`NStepTransitionAdder` with ``n = 1``, items ``{obs: s_t, action: a_t,
    reward: r_{t+1}, discount, next_obs: s_{t+1}}`` (+ extras).

    ``discount`` (keyword, default 1.0) is the gamma folded into the items' discount: with the default the items
    hold the step's environment discount (1, or 0 where ``a_t`` terminated the episode) as Acme's
    ``TransitionAdder`` stores it, and the learner multiplies by its gamma; with ``discount=gamma`` they hold gamma
    or 0, the convention of the n-step items (the learner uses it as it is).
    """

    def __init__(
        self, client: Any, table: str, priority: Priority = None, *, discount: float = 1.0, insert_batch: int = 8
    ):
        super().__init__(client, table, 1, discount, priority, insert_batch=insert_batch)


class VecNStepTransitionAdder(_Inserts):
    """:class:`NStepTransitionAdder` for K environments stepped in lockstep (a vector environment): the same items,
    values and order as K NStepTransitionAdders fed one environment after another at every step and sharing one
    batch buffer, computed over arrays (:class:`VecNStep`) without a Python call per environment and step. The
    vectorised Ape-X actors insert through it.

    Call order, per environment as for :class:`NStepTransitionAdder` (refused calls raise and change nothing)::

        adder.add_first(observations)                            # all K (or add_first(obs, envs=[...]))
        adder.add(actions, rewards, next_observations, terminated, truncated)   # arrays over all K
        adder.add_first(new_observations, envs=ended)            # the environments whose episode ended

    ``next_observations[j]`` is environment j's observation after its action: where the episode ended, its last
    one (what a vector environment that resets itself hands out as the final observation), not the reset's.

    Items are those of NStepTransitionAdder: ``{"obs", "action", "reward", "discount", "next_obs"}`` (+
    ``"extras"``), reward and discount float32. Observations are arrays of one shape and dtype for all steps (fixed
    by the first ``add_first``), or a nested mapping of such arrays (dict observations); anything else (int handles
    into the caller's own store of observations, as the Ape-X actor passes) is carried as it is.

    Every input NStepTransitionAdder takes is taken here, row j for environment j: ``add(..., extras=e,
    discounts=d)`` with ``e`` and ``d`` arrays (or nested mappings of arrays) with a leading dimension K, and
    rewards of shape (K, ...) or a nested mapping of such (vector or multi-objective rewards). Two paths give the
    same items: plain inputs (array observations, rewards of shape (K,), no extras, no discounts, the default start
    of episode: what the Ape-X actors pass) go through the array core (:class:`VecNStep`); the others through K
    NStepBuffers, one per environment. The path is chosen by the first ``add_first`` (dict observations) or the
    first ``add`` (extras, discounts, structured rewards) and kept: giving those later, after plain steps, raises
    ValueError and changes nothing.

    Buffering, ``priority``, ``insert_batch``, :meth:`flush`, :meth:`truncate`, :meth:`close` and a failing insert
    behave as NStepTransitionAdder's; :meth:`reset` drops the open episodes of some or all environments,
    :meth:`discard` what is held and not inserted.

    Args:
      client: anything with ``insert(priorities, mapping, table=...)`` (a ReplayClient).
      table: the table's name.
      n: horizon, an int >= 1.
      discount: gamma, the discount per step, in [0, 1].
      num_envs: K, an int >= 1.
      priority: None, a number >= 0, or a callable of the stacked batch returning one priority per item.
      insert_batch: transitions per insert, >= 1.
      shorter_at_start: NStepTransitionAdder's (Acme's shorter transitions at an episode's start).

    Raises:
      ValueError: a bad ``n``, ``discount``, ``num_envs``, ``priority`` or ``insert_batch``.
    """

    def __init__(
        self,
        client: Any,
        table: str,
        n: int,
        discount: float,
        num_envs: int,
        priority: Priority = None,
        *,
        insert_batch: int = 8,
        shorter_at_start: bool = False,
    ):
        k = check_int("num_envs", num_envs, 1)
        self._core = VecNStep(k, n, discount)  # checks n and discount
        super().__init__(client, table, priority, insert_batch)
        self.shorter_at_start = bool(shorter_at_start)
        self._chunks: list[dict[str, np.ndarray]] = []  # emitted, not inserted yet, oldest first
        self._buffered = 0
        self._closed = False
        self._stepped = False  # an add was recorded (the path is fixed from then on)
        # The per-environment path (module docstring): one NStepTransitionAdder each, its rows moved to _rows.
        self._envs: list[NStepTransitionAdder] | None = None
        self._rows: list[tuple] = []

    @property
    def num_envs(self) -> int:
        return self._core.k

    @property
    def n(self) -> int:
        return self._core.n

    @property
    def discount(self) -> float:
        return self._core.gamma

    @property
    def in_episode(self) -> np.ndarray:
        """(K,) bool: the environments between ``add_first`` and the step that ends their episode."""
        if self._envs is not None:
            return np.array([a.in_episode for a in self._envs], bool)
        return self._core.open

    @property
    def pending(self) -> int:
        """Steps of open episodes whose transition is not emitted yet (at most K·(n - 1) between calls)."""
        if self._envs is not None:
            return sum(a.pending for a in self._envs)
        return self._core.pending

    @property
    def buffered(self) -> int:
        """Transitions emitted and not inserted yet (fewer than ``insert_batch`` between calls)."""
        return self._buffered

    def add_first(self, observations: Any, envs: Sequence[int] | np.ndarray | None = None) -> None:
        """Start an episode in each of ``envs`` (default: all K) at its row of ``observations`` (an array, or a
        nested mapping of arrays, with one row per environment listed).

        Raises:
          RuntimeError: one of them still has an open episode (``reset`` it first to drop it), or closed.
          ValueError: an environment index out of range or repeated, or not one observation per environment.
        """
        self._check_not_closed()
        if envs is None:
            which = np.arange(self.num_envs)
        else:
            which = np.asarray(envs, np.int64).reshape(-1)
            listed = which.tolist()
            if listed and (min(listed) < 0 or max(listed) >= self.num_envs or len(set(listed)) != len(listed)):
                raise ValueError(f"envs must be distinct indices in [0, {self.num_envs}), got {listed}")
        if self._envs is None and (isinstance(observations, Mapping) or self.shorter_at_start):
            self._per_environment("dict observations" if isinstance(observations, Mapping) else "shorter_at_start")
        if self._envs is None:
            self._core.add_first(which, observations)  # RuntimeError naming environments still in an episode
            return
        still = [int(j) for j in which if self._envs[j].in_episode]
        if still:
            raise RuntimeError(
                f"VecNStepTransitionAdder.add_first for environments {still} whose episode is still open; call "
                "reset(envs) first to drop those episodes on purpose"
            )
        rows = _rows_of(observations, len(which), "observations")
        for i, j in enumerate(which.tolist()):
            self._envs[j].add_first(rows[i])

    def add(
        self,
        actions: Any,
        rewards: Any,
        next_observations: Any,
        terminated: Any,
        truncated: Any,
        extras: Any = None,
        *,
        discounts: Any = None,
    ) -> None:
        """Record one step of every environment (arrays, or nested mappings of arrays, with a leading dimension
        K): ``extras`` the steps' extras (row j: environment j's ``e_t``), ``discounts`` the environments'
        discounts of the step (None: 1; as NStepTransitionAdder's ``discount``).

        Raises:
          RuntimeError: an environment has no open episode, or the adder is closed.
          ValueError: a reward that is not finite, a discount not in [0, 1], an argument without one row per
            environment, or extras, discounts or structured rewards after plain steps (class docstring).
        """
        self._check_not_closed()
        k = self.num_envs
        plain = extras is None and discounts is None and self._envs is None
        if plain and not (type(rewards) is np.ndarray and rewards.ndim == 1):
            plain = not isinstance(rewards, Mapping) and np.ndim(rewards) == 1
        if not plain:
            self._add_per_environment(actions, rewards, next_observations, terminated, truncated, extras, discounts)
            return
        if not len(actions) == len(rewards) == len(next_observations) == len(terminated) == len(truncated) == k:
            for name, value in (
                ("actions", actions),
                ("rewards", rewards),
                ("next_observations", next_observations),
                ("terminated", terminated),
                ("truncated", truncated),
            ):
                if len(value) != k:
                    raise ValueError(f"{name} has {len(value)} rows, expected one per environment ({k})")
        # The core refuses (RuntimeError, naming them) environments not in an episode, before it records anything.
        self._emit(self._core.add(actions, rewards, next_observations, terminated, truncated))
        self._stepped = True
        self._after_step()

    def _per_environment(self, why: str) -> None:
        """Switch to the per-environment path (class docstring); only before the first recorded step."""
        if self._stepped:
            raise ValueError(
                f"VecNStepTransitionAdder: {why} after steps without them; give them from the first add on (or in "
                "none). The step is not recorded"
            )
        big = 1 << 62  # the inner adders never insert: their rows are moved to this adder's buffer
        self._envs = [
            NStepTransitionAdder(
                None, self.table, self.n, self.discount, insert_batch=big, shorter_at_start=self.shorter_at_start
            )
            for _ in range(self.num_envs)
        ]
        assert self._core._obs is not None or not self._core.open.any()
        for j in np.flatnonzero(self._core.open).tolist():
            assert self._core._obs is not None
            self._envs[j].add_first(self._core._obs[j, 0])
        self._core.reset()

    def _add_per_environment(
        self,
        actions: Any,
        rewards: Any,
        next_observations: Any,
        terminated: Any,
        truncated: Any,
        extras: Any,
        discounts: Any,
    ) -> None:
        k = self.num_envs
        if self._envs is None:
            self._per_environment("extras, discounts or structured rewards")
        assert self._envs is not None
        closed = [j for j, a in enumerate(self._envs) if not a.in_episode]
        if closed:
            raise RuntimeError(
                f"VecNStepTransitionAdder.add with environments {closed} not in an episode: add_first them first "
                "(and again after every step that ends their episode)"
            )
        acts = _rows_of(actions, k, "actions")
        rews = _rows_of(rewards, k, "rewards")
        nxt = _rows_of(next_observations, k, "next_observations")
        term = _rows_of(terminated, k, "terminated")
        trunc = _rows_of(truncated, k, "truncated")
        ext = [None] * k if extras is None else _rows_of(extras, k, "extras")
        disc = [None] * k if discounts is None else _rows_of(discounts, k, "discounts")
        for j in range(k):  # every row checked before any is recorded: a refused call changes nothing
            check_reward(rews[j])
            if disc[j] is not None:
                check_discount(disc[j])
        for j, adder in enumerate(self._envs):
            adder.add(acts[j], rews[j], nxt[j], bool(term[j]), bool(trunc[j]), ext[j], discount=disc[j])
            self._rows += adder._buffer
            self._buffered += len(adder._buffer)
            adder._buffer.clear()
        self._stepped = True
        self._after_step()

    def truncate(self) -> None:
        """End every open episode here as a truncation: their pending steps become transitions (shorter horizons
        that bootstrap from the latest observation), buffered like any others."""
        self._check_not_closed()
        if self._envs is not None:
            for adder in self._envs:
                adder.truncate()
                self._rows += adder._buffer
                self._buffered += len(adder._buffer)
                adder._buffer.clear()
        else:
            self._emit(self._core.truncate())
        self._after_step()

    def reset(self, envs: Sequence[int] | np.ndarray | None = None) -> None:
        """Drop the open episodes of ``envs`` (default: all): what they have not emitted is never emitted."""
        if self._envs is not None:
            which = range(self.num_envs) if envs is None else np.asarray(envs, np.int64).reshape(-1).tolist()
            for j in which:
                self._envs[j].reset()
            return
        self._core.reset(envs)

    def flush(self) -> None:
        """Insert the buffered transitions now, in batches of at most ``insert_batch``."""
        while self._buffered:
            self._insert(min(self._buffered, self.insert_batch))

    def close(self) -> None:
        """Flush, then refuse every further call (the client stays the caller's); call :meth:`truncate` first to
        keep the open episodes' pending steps."""
        if not self._closed:
            self.flush()
            self._closed = True

    def discard(self) -> int:
        """Drop the buffered transitions and the open episodes' pending steps; how many transitions that is."""
        lost = self._buffered + self.pending
        self._chunks.clear()
        self._rows.clear()
        self._buffered = 0
        self.reset()
        return lost

    def _check_not_closed(self) -> None:
        if self._closed:
            raise RuntimeError("VecNStepTransitionAdder is closed")

    def _emit(self, chunk: dict[str, np.ndarray] | None) -> None:
        if chunk is not None:  # reward and discount float64 until inserted (float32 then, once per batch)
            self._chunks.append(chunk)
            self._buffered += len(chunk["reward"])

    def _after_step(self) -> None:
        while self._buffered >= self.insert_batch:
            self._insert(self.insert_batch)

    def _insert(self, n: int) -> None:
        """Insert the oldest ``n`` buffered transitions; they leave the buffer only once the insert returned."""
        if self._envs is not None:
            self._send(_stack_rows(self._rows[:n]), n)
            del self._rows[:n]
            self._buffered -= n
            return
        if len(self._chunks) > 1:  # one chunk of all that is buffered, so the oldest n are its first rows
            self._chunks[:] = [{name: np.concatenate([c[name] for c in self._chunks]) for name in self._chunks[0]}]
        chunk = self._chunks[0]
        batch = {name: v[:n] for name, v in chunk.items()}
        batch["reward"], batch["discount"] = batch["reward"].astype(np.float32), batch["discount"].astype(np.float32)
        self._send(batch, n)
        if len(chunk["reward"]) == n:
            self._chunks.clear()
        else:
            self._chunks[0] = {name: v[n:] for name, v in chunk.items()}
        self._buffered -= n


def _rows_of(value: Any, k: int, name: str) -> list[Any]:
    """The ``k`` rows of an array (or sequence) or of a nested mapping of arrays with a leading dimension ``k``.

    Raises:
      ValueError: a leaf without ``k`` rows, naming it.
    """
    if isinstance(value, Mapping):
        per_key = {key: _rows_of(v, k, f"{name}/{key}") for key, v in value.items()}
        return [{key: rows[j] for key, rows in per_key.items()} for j in range(k)]
    if isinstance(value, np.ndarray):
        if value.ndim == 0 or len(value) != k:
            raise ValueError(f"{name} has shape {value.shape}, expected one row per environment ({k})")
        return list(value)
    if len(value) != k:
        raise ValueError(f"{name} has {len(value)} rows, expected one per environment ({k})")
    return list(value)
