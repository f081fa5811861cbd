"""Whole episodes as items through a trajectory writer (Acme's ``EpisodeAdder``).

Every step of an episode (:class:`~apexrl.replay.adders.base.Step`, the last observation a zero-filled step of its
own) is appended to one writer as ``{"obs", "action", "reward", "discount"}``; when the episode ends
(terminated or truncated) one item holds all its ``T + 1`` steps. Extras: ``add(..., extras=e_t)`` is not stored
per step; the item's per-item ``extras`` is the first ``add``'s (``e_0``, e.g. the recurrent state the episode
started from), None where that was None. Extras must be None or a mapping (nested allowed) of arrays, as the
writer stores them: an ``add`` with other extras raises ValueError and changes nothing.

An episode longer than ``max_sequence_length`` steps (its last observation counted) is refused, as Acme does: the
``add`` that would make it longer raises ValueError and changes nothing; the episode stays open and the caller
decides (``reset()`` drops it; an adder with a larger ``max_sequence_length`` keeps such episodes). Refusing,
rather than cutting the episode into pieces, keeps "one item = one whole episode" true for every item of the table.

Priorities: ``priority`` None (default) passes ``None`` (the table's largest priority so far), a number that
number. Unsent data is the writer's (``flush(timeout)``); ``reset()`` ends the writer's episode without an item.
An error the writer raises propagates: ``reset()`` the episode before going on.
"""

from __future__ import annotations

from typing import Any

from apexrl.replay.adders.base import (
    Adder,
    Step,
    check_int,
    check_item_extras,
    check_priority,
    step_mapping,
    zeros_like,
)

__all__ = ["EpisodeAdder"]


class EpisodeAdder(Adder):
    """One item per whole episode (module docstring).

    Args:
      client: anything with ``writer(max_sequence_length=...)`` (a ReplayClient); the adder makes one writer.
      table: the table's name.
      max_sequence_length: the most steps an episode may have, its last observation included (>= 2: one action
        and the observation after it).
      priority: None or a number >= 0, every item's priority.

    Raises:
      ValueError: a bad argument.
    """

    def __init__(self, client: Any, table: str, max_sequence_length: int, *, priority: float | None = None):
        self.max_sequence_length = check_int("max_sequence_length", max_sequence_length, 2)
        check_priority(priority)
        super().__init__()
        self.table, self.priority = table, priority
        self._writer = client.writer(max_sequence_length=self.max_sequence_length)
        self._steps = 0
        self._first_extras: Any = None

    def _first(self, observation: Any) -> None:
        self._steps, self._first_extras = 0, None

    def _step(self, step: Step, next_observation: Any, terminated: bool, truncated: bool) -> None:
        check_item_extras("EpisodeAdder", step.extras)
        if self._steps + 2 > self.max_sequence_length:
            raise ValueError(
                f"EpisodeAdder: this step would make the episode {self._steps + 2} steps long (its last observation "
                f"counted), more than max_sequence_length={self.max_sequence_length}; the step is not recorded. "
                "Call reset() to drop the episode, or use an adder with a larger max_sequence_length"
            )
        self._writer.append(step_mapping(step))
        if self._steps == 0:
            self._first_extras = step.extras
        self._steps += 1
        if terminated or truncated:
            last = Step(next_observation, zeros_like(step.action), 0.0, 0.0)
            self._writer.append(step_mapping(last))
            self._writer.create_item(self.table, self._steps + 1, self.priority, extras=self._first_extras)
            self._writer.end_episode()
            self._steps, self._first_extras = 0, None

    def _drop(self) -> None:
        self._writer.end_episode()
        self._steps, self._first_extras = 0, None

    def flush(self, timeout: float | None = None) -> None:
        """``writer.flush(timeout)``: send what the writer holds; raises what failed."""
        self._writer.flush(timeout=timeout)

    def close(self) -> None:
        """Close the writer and refuse every further call; an open episode gets no item."""
        if not self._closed:
            self._closed = True
            self._writer.close()
