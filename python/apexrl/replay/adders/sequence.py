"""Fixed-length, possibly overlapping sequences of steps through a trajectory writer (Acme's ``SequenceAdder``).

Every step of an episode (:class:`~apexrl.replay.adders.base.Step`, the last observation a zero-filled step of its
own) is appended to one writer once, as ``{"obs", "action", "reward", "discount"}`` (plus ``"extras"`` and
``"start_of_episode"`` where asked, below); items are step ranges of it (``writer.create_item``), so overlapping
sequences do not store a step twice.

Which items, for an episode of ``T`` actions (steps ``0 .. T-1``, step ``T`` its last observation, ``E = T + 1``
steps), sequence length ``L`` and period ``p`` (Acme's rules and its four end-of-episode behaviours,
:class:`EndBehavior`):

- while the episode runs: after the ``t``-th step (``t = L, L + p, L + 2p, ...``, ``t <= T``) the item of steps
  ``t - L .. t - 1``. With ``p < L`` consecutive items overlap in ``L - p`` steps; with ``p = L`` they tile the
  episode.
- at the episode's end (after the above for ``t = T``), by ``end_of_episode_behavior``:

  - ``"zero_pad"`` (default; ``pad_end_of_episode=True``): one more item, the last one a write every ``p`` steps
    would make if the episode went on: ``delta = L - E`` when ``E <= L`` (the whole episode), else ``delta =
    (L - E) mod p``; the item starts at step ``E + delta - L`` and holds the rest of the episode, its last
    observation included, then ``delta`` zero-filled steps (every field zeros, observation included) appended to
    the writer after the last observation: exactly ``L`` steps. As in Acme, when ``E`` is itself a write point
    this is that write (``delta = 0``).
  - ``"truncate"`` (``pad_end_of_episode=False``): the same item without the padding, ``L - delta`` steps long (a
    sequence table pads it at sampling, ``.mask`` False on the padding).
  - ``"write"``: the last ``L`` steps of the episode (its last observation the last of them) whatever the period,
    no padding; nothing when the episode has fewer than ``L`` steps (``E < L``).
  - ``"continue"``: no end item and no episode break: the next episode's steps follow the last observation in the
    same stream and items keep being made every ``p`` steps of the stream, so an item may hold the end of one
    episode and the start of the next (``start_of_episode`` marks where; the last observation's discount is 0).

Zero-filled padding is stored data: a sampler cannot tell it from steps (its ``.mask`` is True there). A learner
that must not train on it (R2D2: ``mask`` in :mod:`apexrl.agents.r2d2.sequences`) uses ``"truncate"`` and the
sampler's ``.mask``.

Extras (``add(..., extras=e_t)``), by ``extras_per``:

- ``"item"`` (default): NOT stored per step. Each item gets, as its per-item ``extras``
  (``writer.create_item(..., extras=...)``, sampled as ``.extras``, arrays ``(n, ...)``), the extras of the
  ``add`` that made its first step -- e.g. R2D2's recurrent state when the actor acted on that step's
  observation, so the learner can unroll from it -- stored once per item. An item that starts at an episode's
  last observation (or padding) gets zeros shaped like the last ``add``'s extras; extras None gives
  ``extras=None``. Extras must then be None or a mapping (nested allowed) of arrays, as the writer stores them:
  an ``add`` with other extras raises ValueError and changes nothing.
- ``"step"``: every step's extras are a field of the step, ``"extras"`` (any array or nested mapping of arrays;
  the last observation's and the padding's are zeros shaped like them), sampled with a time axis as
  ``.fields["extras"]``, arrays ``(n, T, ...)`` -- what an on-policy learner needs: the behaviour policy's
  log-probabilities or logits at every step (PPO's ratio, IMPALA's V-trace), a value estimate per step. Stored
  once per step, shared by the items that overlap there, like the other fields.
- ``"both"``: the two at once (per-step ``.fields["extras"]`` and the first step's as the per-item ``.extras``).

``start_of_episode=True`` adds Acme's per-step flag ``"start_of_episode"`` (bool, True on an episode's first
step only; False on its last observation and on padding).

Priorities: ``priority`` None (default) passes ``None`` (the table's largest priority so far, as ``insert``
does); a number, that number for every item.

What is unsent at any moment is the writer's to say (``flush(timeout)`` sends it and raises what failed); the
adder itself buffers at most the extras of the last ``L`` steps. ``reset()`` ends the writer's episode (with
``"continue"``, the stream) without the end-of-episode item: items already made stay, the dropped steps are
referenced by no new item. An error the writer raises propagates: the step may be half-recorded, so ``reset()``
the episode before going on.
"""

from __future__ import annotations

import enum
from collections import deque
from typing import Any

from apexrl.replay.adders.base import (
    Step,
    TrajectoryAdder,
    check_int,
    check_item_extras,
    check_priority,
    final_step,
    zeros_like,
)

__all__ = ["EXTRAS_PER", "EndBehavior", "SequenceAdder"]

EXTRAS_PER = ("item", "step", "both")


class EndBehavior(str, enum.Enum):
    """What :class:`SequenceAdder` writes at an episode's end (module docstring; Acme's ``EndBehavior``). A
    member or its value (``"zero_pad"``, ...) is accepted."""

    ZERO_PAD = "zero_pad"
    TRUNCATE = "truncate"
    WRITE = "write"
    CONTINUE = "continue"


def check_extras_per(adder: str, extras_per: Any) -> str:
    if extras_per not in EXTRAS_PER:
        raise ValueError(f"{adder}: extras_per must be one of {EXTRAS_PER}, got {extras_per!r}")
    return str(extras_per)


class SequenceAdder(TrajectoryAdder):
    """Items of ``sequence_length`` steps every ``period`` steps (module docstring).

    Args:
      client: anything with ``writer(max_sequence_length=...)`` (a ReplayClient); the adder makes one writer.
      table: the table's name.
      sequence_length: ``L``, steps per item, >= 1.
      period: ``p``, steps between the starts of consecutive items, ``1 <= p <= L`` (a larger period would leave
        steps that no item holds; Acme does not check, and its end-of-episode item can then be padding only).
      pad_end_of_episode: True: ``"zero_pad"``, False: ``"truncate"`` (module docstring); used where
        ``end_of_episode_behavior`` is None.
      priority: None or a number >= 0, every item's priority.
      end_of_episode_behavior: an :class:`EndBehavior` (or its value); None: from ``pad_end_of_episode``.
      extras_per: ``"item"`` (default), ``"step"`` or ``"both"``: where ``add``'s extras are stored (module
        docstring).
      start_of_episode: store Acme's per-step ``"start_of_episode"`` flag.

    Raises:
      ValueError: a bad argument (``pad_end_of_episode=False`` with an ``end_of_episode_behavior`` other than
        ``"truncate"`` included).
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
        end_of_episode_behavior: EndBehavior | str | None = None,
        extras_per: str = "item",
        start_of_episode: bool = False,
    ):
        length = check_int("sequence_length", sequence_length, 1)
        period = check_int("period", period, 1)
        if period > length:
            raise ValueError(f"period {period} > sequence_length {length}: steps between items would be stored in none")
        check_priority(priority)
        if end_of_episode_behavior is None:
            behavior = EndBehavior.ZERO_PAD if pad_end_of_episode else EndBehavior.TRUNCATE
        else:
            try:
                behavior = EndBehavior(end_of_episode_behavior)
            except ValueError:
                raise ValueError(
                    f"end_of_episode_behavior must be one of {[b.value for b in EndBehavior]}, got "
                    f"{end_of_episode_behavior!r}"
                ) from None
            if not pad_end_of_episode and behavior is not EndBehavior.TRUNCATE:
                raise ValueError(
                    f"pad_end_of_episode=False means end_of_episode_behavior='truncate', got {behavior.value!r}: "
                    "give only end_of_episode_behavior"
                )
        self.extras_per = check_extras_per("SequenceAdder", extras_per)
        super().__init__()
        self.table, self.sequence_length, self.period = table, length, period
        self.end_of_episode_behavior = behavior
        self.pad_end_of_episode = behavior is EndBehavior.ZERO_PAD
        self.start_of_episode = bool(start_of_episode)
        self.priority = priority
        self._writer = client.writer(max_sequence_length=length)
        self._steps = 0  # steps appended to the writer since its episode (with "continue": its stream) began
        self._episode_steps = 0  # steps of the open episode appended
        self._extras: deque[Any] = deque(maxlen=length)  # extras of the last L steps, the latest last

    def _first(self, observation: Any) -> None:
        self._episode_steps = 0
        if self.end_of_episode_behavior is not EndBehavior.CONTINUE:
            self._steps = 0
            self._extras.clear()

    def _append(self, mapping: dict[str, Any], extras: Any) -> None:
        self._writer.append(mapping)
        self._extras.append(extras)
        self._steps += 1

    def _create(self, num_timesteps: int, first: int) -> None:
        """An item of the last ``num_timesteps`` appended steps, whose first step is stream step ``first``."""
        extras = None
        if self.extras_per != "step":
            extras = self._extras[first - (self._steps - len(self._extras))]
        self._writer.create_item(self.table, num_timesteps, self.priority, extras=extras)

    def _due(self, t: int) -> bool:
        return t >= self.sequence_length and (t - self.sequence_length) % self.period == 0

    def _step(self, step: Step, next_observation: Any, terminated: bool, truncated: bool) -> None:
        if self.extras_per != "step":
            check_item_extras("SequenceAdder", step.extras)
        length, period = self.sequence_length, self.period
        self._append(self._mapping(step, self._episode_steps == 0), step.extras)
        self._episode_steps += 1
        if self._due(self._steps):
            self._create(length, self._steps - length)
        if not (terminated or truncated):
            return
        last = final_step(step, next_observation)
        last_mapping = self._mapping(last, False)
        self._append(last_mapping, last.extras)
        e = self._steps
        behavior = self.end_of_episode_behavior
        if behavior is EndBehavior.CONTINUE:
            if self._due(e):
                self._create(length, e - length)
            return  # no episode break: the next episode's steps follow in the same stream
        if behavior is EndBehavior.WRITE:
            if e >= length:
                self._create(length, e - length)
        else:
            delta = length - e if e <= length else (length - e) % period
            first = e + delta - length
            if behavior is EndBehavior.ZERO_PAD:
                # The item's first step is the last observation's or earlier, so its extras are still held.
                extras = None if self.extras_per == "step" else self._extras[first - (e - len(self._extras))]
                pad = zeros_like(last_mapping)
                for _ in range(delta):
                    self._writer.append(pad)
                self._writer.create_item(self.table, length, self.priority, extras=extras)
            else:
                self._create(length - delta, first)
        self._writer.end_episode()
        self._steps = 0
        self._extras.clear()

    def _drop(self) -> None:
        self._writer.end_episode()
        self._extras.clear()
        self._steps = self._episode_steps = 0
