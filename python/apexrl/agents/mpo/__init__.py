"""MPO (Abdolmaleki et al. 2018) and DMPO (MPO with D4PG's categorical critic, as Acme's) on Ape-X's replay.

- :mod:`~apexrl.agents.mpo.config`: :class:`MPOConfig`, :class:`DMPOConfig` (Acme's defaults) and each default's
  source.
- :mod:`~apexrl.agents.mpo.loss`: the E-step (the temperature's dual and the sample weights), the M-step with
  decoupled KL constraints on the mean and the standard deviation, the Lagrange multipliers in log space, the
  action penalisation (MO-MPO).
- :mod:`~apexrl.agents.mpo.nets`: the diagonal Gaussian policy (Acme's layer-normed torso and head).
- :mod:`~apexrl.agents.mpo.critics`: MPO's scalar critic (DPG's) and DMPO's categorical one (D4PG's), their
  n-step targets from N target-policy samples and their priorities.
- :mod:`~apexrl.agents.mpo.learner`, :mod:`~apexrl.agents.mpo.policy`: the learner and the actors' policy.
- :mod:`~apexrl.agents.mpo.agent`: ``--agent mpo`` and ``--agent dmpo``.
"""

from __future__ import annotations

from apexrl.agents.mpo.agent import DMPO_AGENT, MPO_AGENT, DMPOLearner, DMPOPolicy
from apexrl.agents.mpo.config import DMPO_FIELD_SOURCES, MPO_FIELD_SOURCES, DMPOConfig, MPOConfig
from apexrl.agents.mpo.learner import MPOLearner
from apexrl.agents.mpo.policy import MPOPolicy

__all__ = [
    "DMPOConfig",
    "DMPOLearner",
    "DMPOPolicy",
    "DMPO_AGENT",
    "DMPO_FIELD_SOURCES",
    "MPOConfig",
    "MPOLearner",
    "MPOPolicy",
    "MPO_AGENT",
    "MPO_FIELD_SOURCES",
]
