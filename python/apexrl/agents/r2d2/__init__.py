"""R2D2 (Kapturowski et al. 2019): recurrent Ape-X on replayed sequences -- the agent, built and tested ahead of
the sequence replay it needs.

What is here:

- :mod:`~apexrl.agents.r2d2.config`: :class:`R2D2Config` (the paper's settings as defaults) and the source of
  each default.
- :mod:`~apexrl.agents.r2d2.sequences`: the sequence batch format -- obs, action, reward, discount, mask and the
  stored LSTM state (h, c), with each field's shape and meaning -- and :func:`sequence_spec`, its replay codec.
- :mod:`~apexrl.agents.r2d2.nets`: the network (Nature torso or MLP, LSTM, dueling heads) and the invertible
  value rescaling h and h^-1.
- :mod:`~apexrl.agents.r2d2.learner`: the loss (burn-in, double Q, n-step targets inside the sequence under
  value rescaling, masking past an episode's end, IS weights, sequence priorities) and :class:`R2D2Learner`.
- :mod:`~apexrl.agents.r2d2.policy`: :class:`RecurrentPolicy`, the vectorised actor's recurrent epsilon-greedy
  policy, which returns each step's input state for the adder.
- :mod:`~apexrl.agents.r2d2.presets`: ``r2d2-atari`` and ``r2d2-cpu`` as data, with a source per setting.
- :mod:`~apexrl.agents.r2d2.replay`: its replay path -- one ``SequenceAdder`` per environment (the state at each
  item's first step stored as its extras ``state_h``/``state_c``), and sampled items (``.fields``/``.mask``/
  ``.extras``) into the batch of :mod:`~apexrl.agents.r2d2.sequences`.

The wiring: :mod:`~apexrl.agents.r2d2.agent` registers ``--agent r2d2`` (an ``AgentDef`` whose ``replay`` is
that path), which the generic actor (:mod:`apexrl.apex.actor`, the policy's state carried across steps and
stored through the adders) and the learner's sequence sampler (:mod:`apexrl.apex.sequences`) follow; the same
``AgentDef`` declares the presets ``r2d2-atari`` and ``r2d2-cpu`` (each with a prioritized table ``default``),
which ``apexrl.launch.presets.PRESETS`` lists. bench/r2d2_masked_cartpole.py runs the agent in one process (its
own adder and buffer).
"""

from __future__ import annotations

from apexrl.agents.r2d2.config import R2D2_FIELD_SOURCES, R2D2Config
from apexrl.agents.r2d2.learner import R2D2Learner, sequence_loss, sequence_priorities, valid_steps
from apexrl.agents.r2d2.nets import (
    RecurrentQNetwork,
    inverse_value_rescale,
    make_recurrent_q_network,
    value_rescale,
)
from apexrl.agents.r2d2.policy import RecurrentPolicy, recurrent_batch_policy
from apexrl.agents.r2d2.presets import R2D2_PRESETS, R2D2_SOURCE
from apexrl.agents.r2d2.sequences import SEQUENCE_FIELDS, check_sequences, empty_sequences, sequence_spec

__all__ = [
    "R2D2Config",
    "R2D2Learner",
    "R2D2_FIELD_SOURCES",
    "R2D2_PRESETS",
    "R2D2_SOURCE",
    "RecurrentPolicy",
    "RecurrentQNetwork",
    "SEQUENCE_FIELDS",
    "check_sequences",
    "empty_sequences",
    "inverse_value_rescale",
    "make_recurrent_q_network",
    "recurrent_batch_policy",
    "sequence_loss",
    "sequence_priorities",
    "sequence_spec",
    "valid_steps",
    "value_rescale",
]
