"""Fixed-length, possibly overlapping sequences of steps through a trajectory writer (Acme's ``SequenceAdder``).

Every step of an episode (:class:`~apexrl.replay.adders.base.Step`, the last observation a zero-filled step of its
own) is appended to one writer once, as ``{"obs", "action", "reward", "discount"}``; items are step ranges
of it (``writer.create_item``), so overlapping sequences do not store a step twice.

Which items, for an episode of ``T`` actions (steps ``0 .. T-1``, step ``T`` its last observation, ``E = T + 1``
steps), sequence length ``L`` and period ``p`` (Acme's rules, "ZERO_PAD" and "TRUNCATE"):

- while the episode runs: after the ``t``-th step (``t = L, L + p, L + 2p, ...``, ``t <= T``) the item of steps
  ``t - L .. t - 1``. With ``p < L`` consecutive items overlap in ``L - p`` steps; with ``p = L`` they tile the
  episode.
- at the episode's end (after the above for ``t = T``), one more item, the last one a write every ``p`` steps
  would make if the episode went on: ``delta = L - E`` when ``E <= L`` (the whole episode), else ``delta =
  (L - E) mod p``; the item starts at step ``E + delta - L`` and holds the rest of the episode, its last
  observation included: ``L - delta`` steps. With ``pad_end_of_episode`` (default) ``delta`` zero-filled steps
  (every field zeros, observation included) are appended to the writer after the last observation and the item
  holds exactly ``L`` steps; without, the item is ``L - delta`` steps long (a sequence table pads it at sampling,
  ``.mask`` False on the padding). As in Acme, when ``T`` is itself a write point this item can start at the last
  observation (``p = L``: it is the last observation and padding).

Zero-filled padding is stored data: a sampler cannot tell it from steps (its ``.mask`` is True there). A learner
that must not train on it (R2D2: ``mask`` in :mod:`apexrl.agents.r2d2.sequences`) uses
``pad_end_of_episode=False`` and the sampler's ``.mask``.

Extras: ``add(..., extras=e_t)`` is NOT stored per step. Each item gets, as its per-item ``extras``
(``writer.create_item(..., extras=...)``), the extras of the ``add`` that made its first step -- e.g. R2D2's
recurrent state when the actor acted on that step's observation, so the learner can unroll from it. An item
that starts at the episode's last observation gets zeros shaped like the last ``add``'s extras; extras None
gives ``extras=None``. Extras must be None or a mapping (nested allowed) of arrays, as the writer stores them: an
``add`` with other extras raises ValueError and changes nothing.

Priorities: ``priority`` None (default) passes ``None`` (the table's largest priority so far, as ``insert``
does); a number, that number for every item.

What is unsent at any moment is the writer's to say (``flush(timeout)`` sends it and raises what failed); the
adder itself buffers at most the extras of the last ``L`` steps. ``reset()`` ends the writer's episode without
the end-of-episode item: items already made stay, the dropped steps are referenced by no new item. An error the
writer raises propagates: the step may be half-recorded, so ``reset()`` the episode before going on.
"""

from __future__ import annotations

from collections import deque
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

__all__ = ["SequenceAdder"]


class SequenceAdder(Adder):
    """Items of ``sequence_length`` steps every ``period`` steps (module docstring).

    Args:
      client: anything with ``writer(max_sequence_length=...)`` (a ReplayClient); the adder makes one writer.
      table: the table's name.
      sequence_length: ``L``, steps per item, >= 1.
      period: ``p``, steps between the starts of consecutive items, ``1 <= p <= L`` (a larger period would leave
        steps that no item holds; Acme does not check, and its end-of-episode item can then be padding only).
      pad_end_of_episode: zero-fill the episode's last item to ``L`` steps (module docstring).
      priority: None or a number >= 0, every item's priority.

    Raises:
      ValueError: a bad argument.
    """

    def __init__(
        self,
        client: Any,
        table: str,
        sequence_length: int,
        period: int,
        pad_end_of_episode: bool = True,
        *,
        priority: float | None = None,
    ):
        length = check_int("sequence_length", sequence_length, 1)
        period = check_int("period", period, 1)
        if period > length:
            raise ValueError(f"period {period} > sequence_length {length}: steps between items would be stored in none")
        check_priority(priority)
        super().__init__()
        self.table, self.sequence_length, self.period = table, length, period
        self.pad_end_of_episode = bool(pad_end_of_episode)
        self.priority = priority
        self._writer = client.writer(max_sequence_length=length)
        self._steps = 0  # steps of the open episode appended to the writer
        self._extras: deque[Any] = deque(maxlen=length)  # extras of the last L steps, the latest last

    def _first(self, observation: Any) -> None:
        self._steps = 0
        self._extras.clear()

    def _append(self, step: Step) -> None:
        self._writer.append(step_mapping(step))
        self._extras.append(step.extras)
        self._steps += 1

    def _create(self, num_timesteps: int, first: int) -> None:
        """An item of the last ``num_timesteps`` appended steps, whose first step is episode step ``first``."""
        extras = self._extras[first - (self._steps - len(self._extras))]
        self._writer.create_item(self.table, num_timesteps, self.priority, extras=extras)

    def _step(self, step: Step, next_observation: Any, terminated: bool, truncated: bool) -> None:
        check_item_extras("SequenceAdder", step.extras)
        length, period = self.sequence_length, self.period
        self._append(step)
        t = self._steps
        if t >= length and (t - length) % period == 0:
            self._create(length, t - length)
        if not (terminated or truncated):
            return
        self._append(Step(next_observation, zeros_like(step.action), 0.0, 0.0, zeros_like(step.extras)))
        e = self._steps
        delta = length - e if e <= length else (length - e) % period
        first = e + delta - length
        if self.pad_end_of_episode:
            # The item's first step is the last observation's or earlier, so its extras are still held.
            extras = self._extras[first - (e - len(self._extras))]
            pad = Step(zeros_like(next_observation), zeros_like(step.action), 0.0, 0.0)
            for _ in range(delta):
                self._writer.append(step_mapping(pad))
            self._writer.create_item(self.table, length, self.priority, extras=extras)
        else:
            self._create(length - delta, first)
        self._writer.end_episode()

    def _drop(self) -> None:
        self._writer.end_episode()
        self._extras.clear()
        self._steps = 0

    def flush(self, timeout: float | None = None) -> None:
        """``writer.flush(timeout)``: send what the writer holds; raises what failed."""
        self._writer.flush(timeout=timeout)

    def close(self) -> None:
        """Close the writer (``writer.close()``) and refuse every further call. An open episode is not ended:
        its last item is never made (``reset()`` semantics)."""
        if not self._closed:
            self._closed = True
            self._writer.close()
