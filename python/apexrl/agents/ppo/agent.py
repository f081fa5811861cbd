"""``--agent ppo``: the :class:`~apexrl.agents.base.AgentDef` that registers PPO."""

from __future__ import annotations

from apexrl.agents.onpolicy.agentdef import onpolicy_agent
from apexrl.agents.ppo.config import PPO_FIELD_SOURCES, PPOConfig
from apexrl.agents.ppo.learner import PPOLearner
from apexrl.agents.ppo.presets import PPO_PRESETS

__all__ = ["AGENT"]

AGENT = onpolicy_agent(
    "ppo",
    "PPO: clipped-ratio actor-critic with GAE on sequences popped once from a queue (Tonic's defaults)",
    PPOConfig,
    PPOLearner,
    presets=PPO_PRESETS,
    field_sources=PPO_FIELD_SOURCES,
)
