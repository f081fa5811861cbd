"""``--agent a2c``: the :class:`~apexrl.agents.base.AgentDef` that registers A2C."""

from __future__ import annotations

from apexrl.agents.a2c.config import A2C_FIELD_SOURCES, A2CConfig
from apexrl.agents.a2c.learner import A2CLearner
from apexrl.agents.a2c.presets import A2C_PRESETS
from apexrl.agents.onpolicy.agentdef import onpolicy_agent

__all__ = ["AGENT"]

AGENT = onpolicy_agent(
    "a2c",
    "A2C: synchronous advantage actor-critic with GAE on sequences popped once from a queue (Tonic's defaults)",
    A2CConfig,
    A2CLearner,
    presets=A2C_PRESETS,
    field_sources=A2C_FIELD_SOURCES,
)
