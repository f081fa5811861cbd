"""What every adder shares: the call order of an episode, the :class:`Step` it is cut into, and stacking.

An adder turns an environment loop into replay items (Acme's adders)::

    adder.add_first(obs_0)
    adder.add(a_0, r_1, obs_1, terminated, truncated, extras=e_0)
    adder.add(a_1, r_2, obs_2, ...)                  # ... until a step with terminated or truncated
    adder.add_first(obs_0 of the next episode)

Call-order rules (the same for every adder, enforced here; a refused call raises and changes nothing):

- ``add_first`` once per episode, and only between episodes: calling it while an episode is still open (its last
  ``add`` had neither ``terminated`` nor ``truncated``) raises RuntimeError, because it would silently drop that
  episode's unfinished items. Call :meth:`Adder.reset` first to drop the open episode on purpose (an environment
  that crashed mid-episode, an actor that restarts its environment).
- ``add`` only inside an episode (after ``add_first``, before the step that ends it): else RuntimeError.
- ``reward`` must be a finite number: else ValueError.
- ``terminated`` ends the MDP: the state after it has no value, nothing bootstraps from it (the step's
  ``discount`` is 0). ``truncated`` (a time limit) only stops the episode: the last observation still has a value
  and targets bootstrap from it (discount 1; Pardo et al. 2018, "Time Limits in Reinforcement Learning"). A step
  that is both counts as terminated. Either ends the episode: the next call is ``add_first``.
- ``reset()`` drops the open episode (if any) and never emits what it held; a no-op between episodes.

Steps (Acme's layout): the ``add`` for time ``t`` completes the step ::

    Step(observation=obs_t, action=a_t, reward=r_{t+1}, discount=d_t, extras=e_t)

where ``r_{t+1}`` is the reward that followed ``a_t`` (a float, or the reward's arrays as given), ``d_t`` is 0.0
(zeros shaped like the ``discount`` given) when ``a_t`` ended the episode by termination and otherwise the
``discount`` given, 1.0 when none was (gamma is NOT in it: the learner multiplies), and ``e_t`` is what ``add``
got as ``extras`` (anything: None, an array, a nested mapping of arrays; e.g. the policy's logits or recurrent
state at ``obs_t``, its log-probability of ``a_t``, a value estimate). An episode of ``T`` actions has ``T + 1``
steps: after its last action, its last observation is a step of its own with zero-filled action, reward, discount
and extras (zeros shaped like the step before; extras stay None where the step before had None) -- what a
sequence learner needs to bootstrap from it. Where an adder sends steps to a writer it sends them as the mapping
``{"obs", "action", "reward", "discount"}`` (reward and discount float32, per leaf where they are structured;
``obs`` as in the transition items and in R2D2's sequence batches, :mod:`apexrl.agents.r2d2.sequences`); what
becomes of ``extras`` (per step, per item, or both) is each adder's to say.

Values are kept by reference, not copied (environments hand out fresh arrays every step), and numpy arrays, numbers
or anything ``numpy.asarray`` takes (a CPU torch tensor included, without this package importing torch) may be
leaves; nested mappings (dicts) are structures. A tuple or list is a leaf (an array), not a structure.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np

__all__ = [
    "Adder",
    "Step",
    "TrajectoryAdder",
    "check_discount",
    "check_int",
    "check_item_extras",
    "check_priority",
    "check_reward",
    "final_step",
    "float32_tree",
    "stack",
    "step_mapping",
    "zeros_like",
]


class Step(NamedTuple):
    """One step of an episode (module docstring)."""

    observation: Any
    action: Any
    reward: Any  # a float, or the reward's arrays (an array or a nested mapping of arrays) as given
    discount: Any  # 0.0 where the action terminated the episode (and on the zero-filled last step), else the
    # discount given to add (1.0 when none was): a float, or arrays shaped like the discount given
    extras: Any = None


def check_int(name: str, value: Any, low: int) -> int:
    """``value`` as an int; ValueError unless it is an int (not a bool) >= ``low``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    return int(value)


def check_priority(priority: Any, also: str = "None") -> None:
    """ValueError unless ``priority`` is None or a finite number >= 0 (``also``: what else the message allows)."""
    if priority is None:
        return
    if isinstance(priority, bool) or not isinstance(priority, numbers.Real) or not math.isfinite(float(priority)):
        raise ValueError(f"priority must be {also} or a finite number >= 0, got {priority!r}")
    if float(priority) < 0.0:
        raise ValueError(f"priority must be {also} or a finite number >= 0, got {priority!r}")


def check_item_extras(adder: str, extras: Any) -> None:
    """ValueError unless ``extras`` is None or a mapping: a writer stores an item's extras as a mapping of arrays,
    so the adders that write through one check at ``add``, before the step is recorded."""
    if extras is not None and not isinstance(extras, Mapping):
        raise ValueError(
            f"{adder}: extras must be None or a mapping of arrays (the writer stores an item's extras as a "
            f"mapping), got {type(extras).__name__}; e.g. pass {{'state': value}}. The step is not recorded"
        )


def _leaves(tree: Any, name: str) -> Any:
    """``tree`` with every leaf as a float64 array, mappings kept; ValueError naming a leaf that is not numeric."""
    if isinstance(tree, Mapping):
        if not tree:
            raise ValueError(f"{name} is an empty mapping")
        return {k: _leaves(v, f"{name}/{k}") for k, v in tree.items()}
    try:
        a = np.asarray(tree, dtype=np.float64)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a number or an array of numbers, got {type(tree).__name__}") from None
    return a


def _check_leaves(tree: Any, name: str, check: Any, what: str) -> None:
    if isinstance(tree, Mapping):
        for k, v in tree.items():
            _check_leaves(v, f"{name}/{k}", check, what)
    elif not check(tree):
        raise ValueError(f"{name} must be {what}, got {tree.tolist()!r}")


def check_reward(reward: Any) -> Any:
    """The step's reward: a float for a number (as before), else the reward itself (an array, a nested mapping of
    arrays). ValueError naming the field unless every value is finite."""
    if isinstance(reward, numbers.Real) or (isinstance(reward, np.ndarray) and reward.ndim == 0):
        r = float(reward)
        if not math.isfinite(r):
            raise ValueError(f"reward must be finite, got {reward!r}")
        return r
    _check_leaves(_leaves(reward, "reward"), "reward", lambda a: bool(np.all(np.isfinite(a))), "finite")
    return reward


def check_discount(discount: Any) -> Any:
    """The step's environment discount: a float for a number, else the arrays (an array, a nested mapping of
    arrays) as float64. ValueError naming the field unless every value is in [0, 1]."""
    if isinstance(discount, numbers.Real) or (isinstance(discount, np.ndarray) and discount.ndim == 0):
        d = float(discount)
        if not 0.0 <= d <= 1.0:  # NaN fails too
            raise ValueError(f"discount must be a number in [0, 1], got {discount!r}")
        return d
    tree = _leaves(discount, "discount")
    _check_leaves(tree, "discount", lambda a: bool(np.all((a >= 0.0) & (a <= 1.0))), "in [0, 1]")
    return tree


def float32_tree(tree: Any) -> Any:
    """A float (np.float32) or arrays (float32 arrays, mappings kept): how steps hold reward and discount."""
    if isinstance(tree, float):
        return np.float32(tree)
    if isinstance(tree, Mapping):
        return {k: float32_tree(v) for k, v in tree.items()}
    return np.asarray(tree, dtype=np.float32)


def zeros_like(tree: Any) -> Any:
    """Zeros shaped like ``tree``'s leaves, in its structure (None stays None)."""
    if tree is None:
        return None
    if isinstance(tree, Mapping):
        return {k: zeros_like(v) for k, v in tree.items()}
    return np.zeros_like(np.asarray(tree))


def final_step(step: Step, next_observation: Any) -> Step:
    """The zero-filled step of an episode's last observation, after ``step`` (the episode's last action): action,
    reward, discount and extras zeros shaped like ``step``'s (a float reward or discount: 0.0; extras None stays
    None)."""
    return Step(
        next_observation,
        zeros_like(step.action),
        0.0 if isinstance(step.reward, float) else zeros_like(step.reward),
        0.0 if isinstance(step.discount, float) else zeros_like(step.discount),
        zeros_like(step.extras),
    )


def step_mapping(step: Step) -> dict[str, Any]:
    """What an adder appends to a writer for ``step``: observation, action, reward and discount (float32)."""
    return {
        "obs": step.observation,
        "action": step.action,
        "reward": float32_tree(step.reward),
        "discount": float32_tree(step.discount),
    }


def stack(trees: Sequence[Any], name: str = "item") -> Any:
    """Stack same-structured nested mappings into one with a leading batch dimension per leaf.

    Raises:
      ValueError: the structures differ (a key missing, a mapping against a leaf, None against a value) or a
        leaf's shape differs, with the field's path named.
    """
    first = trees[0]
    if first is None:
        if any(t is not None for t in trees):
            raise ValueError(f"field {name!r} is None in some items and not in others")
        return None
    if isinstance(first, Mapping):
        keys = list(first)
        for t in trees:
            if not isinstance(t, Mapping) or set(t) != set(keys):
                got = sorted(map(str, t)) if isinstance(t, Mapping) else type(t).__name__
                raise ValueError(f"field {name!r} has keys {sorted(map(str, keys))} in one item and {got} in another")
        return {k: stack([t[k] for t in trees], f"{name}/{k}") for k in keys}
    arrays = []
    for t in trees:
        if t is None or isinstance(t, Mapping):
            raise ValueError(f"field {name!r} is a value in one item and {type(t).__name__} in another")
        arrays.append(np.asarray(t))
    shapes = {a.shape for a in arrays}
    if len(shapes) > 1:
        raise ValueError(f"field {name!r} has shapes {sorted(shapes)} across the items of one batch")
    return np.stack(arrays)


class Adder:
    """The episode bookkeeping and call-order rules of every adder (module docstring).

    Subclasses implement ``_first(observation)``, ``_step(step, next_observation, terminated, truncated)`` (called
    with the completed :class:`Step` of the ``add``; ``terminated``/``truncated`` as bools) and ``_drop()`` (the
    open episode is dropped by ``reset``). Checks happen here, before any of them runs. ``_after_step()`` runs
    once the episode state is updated: what may fail there (sending) leaves the step recorded and the call order
    consistent.
    """

    def __init__(self) -> None:
        self._obs: Any = None
        self._open = False
        self._closed = False

    @property
    def in_episode(self) -> bool:
        """True between ``add_first`` and the step that ends the episode."""
        return self._open

    def add_first(self, observation: Any) -> None:
        """Start an episode at ``observation``.

        Raises:
          RuntimeError: an episode is still open (call ``reset()`` first to drop it), or the adder is closed.
        """
        self._check_not_closed()
        if self._open:
            raise RuntimeError(
                f"{type(self).__name__}.add_first called while an episode is still open (its last add() had neither "
                "terminated nor truncated); call reset() first to drop that episode on purpose"
            )
        self._first(observation)
        self._obs, self._open = observation, True

    def add(
        self,
        action: Any,
        reward: Any,
        next_observation: Any,
        terminated: bool,
        truncated: bool,
        extras: Any = None,
        *,
        discount: Any = None,
    ) -> None:
        """Record the step ``(obs_t, a_t) -> (r_{t+1}, obs_{t+1})``; ``extras``: the step's extras (``e_t``);
        ``discount``: the environment's discount of the step (None: 1; module docstring).

        Raises:
          RuntimeError: no open episode (``add_first`` was not called, or the last step ended the episode), or the
            adder is closed.
          ValueError: ``reward`` is not finite, ``discount`` not in [0, 1] (naming the field), or a subclass refuses
            the step (see its docstring).
        """
        self._check_not_closed()
        if not self._open:
            raise RuntimeError(
                f"{type(self).__name__}.add called without an open episode: call add_first(observation) first "
                "(and again after every step with terminated or truncated)"
            )
        if type(reward) is float and math.isfinite(reward):  # the common case, checked without a call
            r: Any = reward
        else:
            r = check_reward(reward)
        terminated, truncated = bool(terminated), bool(truncated)
        if discount is None:
            d: Any = 0.0 if terminated else 1.0
        else:
            d = check_discount(discount)
            if terminated:
                d = zeros_like(d) if not isinstance(d, float) else 0.0
        step = Step(self._obs, action, r, d, extras)
        self._step(step, next_observation, terminated, truncated)
        if terminated or truncated:
            self._obs, self._open = None, False
        else:
            self._obs = next_observation
        self._after_step()

    def reset(self) -> None:
        """Drop the open episode, if any: what it has not emitted yet is never emitted."""
        if self._open:
            self._drop()
        self._obs, self._open = None, False

    def _check_not_closed(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} is closed")

    def _first(self, observation: Any) -> None:  # pragma: no cover - every adder overrides
        raise NotImplementedError

    def _step(self, step: Step, next_observation: Any, terminated: bool, truncated: bool) -> None:  # pragma: no cover
        raise NotImplementedError

    def _drop(self) -> None:  # pragma: no cover
        raise NotImplementedError

    def _after_step(self) -> None:
        pass


class TrajectoryAdder(Adder):
    """An adder that writes its steps through a :class:`~apexrl.replay.client.trajectory.TrajectoryWriter`
    (``self._writer``): what the sequence and episode adders share -- each step's mapping (per-step extras and
    the start-of-episode flag when asked for: ``self.extras_per``, ``self.start_of_episode``), the writer's
    counters, and its flush, discard and close."""

    extras_per: str
    start_of_episode: bool
    _writer: Any

    def _mapping(self, step: Step, start: bool) -> dict[str, Any]:
        mapping = step_mapping(step)
        if self.extras_per != "item" and step.extras is not None:
            mapping["extras"] = step.extras
        if self.start_of_episode:
            mapping["start_of_episode"] = np.bool_(start)
        return mapping

    def counters(self) -> dict[str, int]:
        """What an actor reports of this adder: items its writer made that the server took (``stored``), items
        it still holds (``pending``: not sent, or sent without a reply), items not made (``skipped``: none)."""
        pending = int(self._writer.pending_items)
        return {"stored": int(self._writer.items_created) - pending, "pending": pending, "skipped": 0}

    def discard(self) -> int:
        """Give up the items the writer still holds (``writer.discard()``, e.g. stopping while the server is gone),
        so that ``close`` does not send them again; returns how many."""
        return int(self._writer.discard())

    def flush(self, timeout: float | None = None) -> None:
        """``writer.flush(timeout)``: send what the writer holds; raises what failed."""
        self._writer.flush(timeout=timeout)

    def close(self) -> None:
        """Close the writer (``writer.close()``) and refuse every further call. An open episode is not ended:
        its last item is never made (``reset()`` semantics)."""
        if not self._closed:
            self._closed = True
            self._writer.close()
