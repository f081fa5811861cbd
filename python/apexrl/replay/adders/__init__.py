"""Adders (issue 38 section 3, Acme's shape): an environment loop in, replay items out.

- :class:`TransitionAdder`, :class:`NStepTransitionAdder` (:mod:`.transition`): one item per (n-step) transition,
  inserted in batches with ``client.insert(priorities, mapping, table=...)``; :class:`VecNStepTransitionAdder`, the
  same items for K environments stepped in lockstep. The Ape-X actors insert through these two.
- :class:`SequenceAdder` (:mod:`.sequence`): overlapping fixed-length sequences through ``client.writer``.
- :class:`EpisodeAdder` (:mod:`.episode`): whole episodes through ``client.writer``.

Call order, terminated vs truncated and the step layout: :mod:`.base`. Never imports torch.
"""

from __future__ import annotations

from apexrl.replay.adders.base import Adder, Step
from apexrl.replay.adders.episode import EpisodeAdder
from apexrl.replay.adders.sequence import EndBehavior, SequenceAdder
from apexrl.replay.adders.transition import NStepTransitionAdder, TransitionAdder, VecNStepTransitionAdder

__all__ = [
    "Adder",
    "EndBehavior",
    "EpisodeAdder",
    "NStepTransitionAdder",
    "SequenceAdder",
    "Step",
    "TransitionAdder",
    "VecNStepTransitionAdder",
]
