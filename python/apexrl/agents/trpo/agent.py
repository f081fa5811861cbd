"""``--agent trpo``: the :class:`~apexrl.agents.base.AgentDef` that registers TRPO (its actors store the
behaviour distribution's parameters per step: the KL constraint needs them)."""

from __future__ import annotations

from apexrl.agents.onpolicy.agentdef import onpolicy_agent
from apexrl.agents.trpo.config import TRPO_FIELD_SOURCES, TRPOConfig
from apexrl.agents.trpo.learner import TRPOLearner
from apexrl.agents.trpo.presets import TRPO_PRESETS

__all__ = ["AGENT"]

AGENT = onpolicy_agent(
    "trpo",
    "TRPO: conjugate-gradient natural step under a KL bound, line search, GAE, on a queue (Tonic's defaults)",
    TRPOConfig,
    TRPOLearner,
    presets=TRPO_PRESETS,
    field_sources=TRPO_FIELD_SOURCES,
    params=True,
)
