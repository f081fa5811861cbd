"""Whole episodes as items through a trajectory writer (Acme's ``EpisodeAdder``).

Every step of an episode (:class:`~apexrl.replay.adders.base.Step`, the last observation a zero-filled step of its
own) is appended to one writer as ``{"obs", "action", "reward", "discount"}``; when the episode ends
(terminated or truncated) one item holds all its ``T + 1`` steps.

Extras (``add(..., extras=e_t)``), by ``extras_per`` as in :mod:`.sequence`: ``"item"`` (default) stores the first
``add``'s (``e_0``, e.g. the recurrent state the episode started from) once, as the item's per-item ``extras``
(None where that was None; they must then be None or a mapping of arrays: an ``add`` with other extras raises
ValueError and changes nothing); ``"step"`` stores every step's as the step field ``"extras"`` (sampled as
``.fields["extras"]``, ``(n, T, ...)``; the last observation's are zeros); ``"both"`` does both.
``start_of_episode=True`` adds Acme's per-step flag ``"start_of_episode"`` (True on the first step only).

``padding_fn`` (Acme's): None (default) makes an item of the episode's own ``T + 1`` steps. A function
``padding_fn(shape, dtype) -> array`` pads every episode to ``max_sequence_length`` steps: after the last
observation, steps whose every field is ``padding_fn(field's shape, field's dtype)`` (``np.zeros`` gives zeros;
``start_of_episode`` is False there) are appended until the item holds ``max_sequence_length`` steps. Padding is
stored data: a sampler cannot tell it from steps (``.mask`` is True there).

An episode longer than ``max_sequence_length`` steps (its last observation counted) is refused, as Acme does: the
``add`` that would make it longer raises ValueError and changes nothing; the episode stays open and the caller
decides (``reset()`` drops it; an adder with a larger ``max_sequence_length`` keeps such episodes). Refusing,
rather than cutting the episode into pieces, keeps "one item = one whole episode" true for every item of the table.

Priorities: ``priority`` None (default) passes ``None`` (the table's largest priority so far), a number that
number. Unsent data is the writer's (``flush(timeout)``); ``reset()`` ends the writer's episode without an item.
An error the writer raises propagates: ``reset()`` the episode before going on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from apexrl.replay.adders.base import (
    Step,
    TrajectoryAdder,
    check_int,
    check_item_extras,
    check_priority,
    final_step,
)
from apexrl.replay.adders.sequence import check_extras_per

__all__ = ["EpisodeAdder"]


def _padding(tree: Any, padding_fn: Callable[..., Any], name: str) -> Any:
    if isinstance(tree, Mapping):
        return {k: _padding(v, padding_fn, f"{name}/{k}") for k, v in tree.items()}
    a = np.asarray(tree)
    out = np.asarray(padding_fn(a.shape, a.dtype))
    if out.shape != a.shape:
        raise ValueError(f"padding_fn returned shape {out.shape} for field {name!r} of shape {a.shape}")
    return out.astype(a.dtype, copy=False)


class EpisodeAdder(TrajectoryAdder):
    """One item per whole episode (module docstring).

    Args:
      client: anything with ``writer(max_sequence_length=...)`` (a ReplayClient); the adder makes one writer.
      table: the table's name.
      max_sequence_length: the most steps an episode may have, its last observation included (>= 2: one action
        and the observation after it).
      priority: None or a number >= 0, every item's priority.
      padding_fn: None, or ``padding_fn(shape, dtype) -> array``: pad every item to ``max_sequence_length`` steps.
      extras_per: ``"item"`` (default), ``"step"`` or ``"both"`` (module docstring).
      start_of_episode: store Acme's per-step ``"start_of_episode"`` flag.

    Raises:
      ValueError: a bad argument.
    """

    def __init__(
        self,
        client: Any,
        table: str,
        max_sequence_length: int,
        *,
        priority: float | None = None,
        padding_fn: Callable[[tuple[int, ...], np.dtype], Any] | None = None,
        extras_per: str = "item",
        start_of_episode: bool = False,
    ):
        self.max_sequence_length = check_int("max_sequence_length", max_sequence_length, 2)
        check_priority(priority)
        if padding_fn is not None and not callable(padding_fn):
            raise ValueError(f"padding_fn must be None or a callable (shape, dtype) -> array, got {padding_fn!r}")
        self.extras_per = check_extras_per("EpisodeAdder", extras_per)
        super().__init__()
        self.table, self.priority, self.padding_fn = table, priority, padding_fn
        self.start_of_episode = bool(start_of_episode)
        self._writer = client.writer(max_sequence_length=self.max_sequence_length)
        self._steps = 0
        self._first_extras: Any = None

    def _first(self, observation: Any) -> None:
        self._steps, self._first_extras = 0, None

    def _step(self, step: Step, next_observation: Any, terminated: bool, truncated: bool) -> None:
        if self.extras_per != "step":
            check_item_extras("EpisodeAdder", step.extras)
        if self._steps + 2 > self.max_sequence_length:
            raise ValueError(
                f"EpisodeAdder: this step would make the episode {self._steps + 2} steps long (its last observation "
                f"counted), more than max_sequence_length={self.max_sequence_length}; the step is not recorded. "
                "Call reset() to drop the episode, or use an adder with a larger max_sequence_length"
            )
        self._writer.append(self._mapping(step, self._steps == 0))
        if self._steps == 0:
            self._first_extras = step.extras
        self._steps += 1
        if terminated or truncated:
            last = self._mapping(final_step(step, next_observation), False)
            self._writer.append(last)
            steps = self._steps + 1
            if self.padding_fn is not None and steps < self.max_sequence_length:
                pad = _padding(last, self.padding_fn, "step")
                if self.start_of_episode:
                    pad["start_of_episode"] = np.bool_(False)
                for _ in range(self.max_sequence_length - steps):
                    self._writer.append(pad)
                steps = self.max_sequence_length
            extras = None if self.extras_per == "step" else self._first_extras
            self._writer.create_item(self.table, steps, self.priority, extras=extras)
            self._writer.end_episode()
            self._steps, self._first_extras = 0, None

    def _drop(self) -> None:
        self._writer.end_episode()
        self._steps, self._first_extras = 0, None
