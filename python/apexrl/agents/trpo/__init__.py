"""TRPO (Schulman et al. 2015) on the on-policy queue path, as Tonic's torch TRPO: :mod:`~apexrl.agents.trpo.config`,
:mod:`~apexrl.agents.trpo.optimizer` (conjugate gradient, line search under the KL bound),
:mod:`~apexrl.agents.trpo.learner` and ``--agent trpo`` (:mod:`~apexrl.agents.trpo.agent`)."""

from __future__ import annotations

from apexrl.agents.trpo.config import TRPO_FIELD_SOURCES, TRPOConfig
from apexrl.agents.trpo.learner import TRPOLearner
from apexrl.agents.trpo.optimizer import LineSearch, conjugate_gradient, line_search, trust_region_step

__all__ = [
    "LineSearch",
    "TRPOConfig",
    "TRPOLearner",
    "TRPO_FIELD_SOURCES",
    "conjugate_gradient",
    "line_search",
    "trust_region_step",
]
