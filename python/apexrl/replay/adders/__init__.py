"""Adders (Acme's shape): an environment loop in, replay items out.

- :class:`TransitionAdder`, :class:`NStepTransitionAdder` (:mod:`.transition`): one item per (n-step) transition,
  inserted in batches with ``client.insert(priorities, mapping, table=...)``; :class:`VecNStepTransitionAdder`, the
  same items for K environments stepped in lockstep. The Ape-X actors insert through these two.
- :class:`SequenceAdder` (:mod:`.sequence`): overlapping fixed-length sequences through ``client.writer``, with
  Acme's four end-of-episode behaviours (:class:`EndBehavior`).
- :class:`EpisodeAdder` (:mod:`.episode`): whole episodes through ``client.writer`` (``padding_fn`` as Acme's).

Every adder takes Acme's inputs: ``add(..., extras=e_t, discount=d_t)`` (the environment's per-step discount),
rewards that are arrays or nested mappings, dict observations; the sequence and episode adders store extras per
item (the first step's, default), per step (``extras_per="step"``) or both. Where the adders keep a deliberate
difference from Acme (the n-step discount holds gamma once more; Acme's shorter start-of-episode transitions are
``shorter_at_start=True``), :mod:`.transition` says so; tests/replay/test_adders_acme.py runs Acme's own test cases.

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
