"""Ape-X agents: DQN (dueling, double-Q, n-step), DPG (deterministic actor-critic, n-step) and D4PG (DPG with a
categorical critic).

Each agent is one module ending in an :class:`~apexrl.agents.base.AgentDef` (config class, learner side,
actor side, the environments it accepts); the lines below register them. An agent that lives in another
distribution registers itself with an ``apexrl.agents`` entry point instead (see docs/architecture.md).
"""

from __future__ import annotations

from apexrl.agents import d4pg, dpg, dqn
from apexrl.agents.base import AGENTS, Agent, AgentDef, Policy, agent_names, get_agent
from apexrl.agents.common import epsilon_ladder
from apexrl.agents.config import D4PGConfig, DPGConfig, DQNConfig
from apexrl.agents.d4pg import D4PGLearner, D4PGPolicy
from apexrl.agents.dpg import DPGLearner, DPGPolicy, dpg_transition_spec
from apexrl.agents.dqn import DQNLearner, DQNPolicy, dqn_transition_spec

# The registry: one line per agent.
AGENTS.register(dqn.AGENT)
AGENTS.register(dpg.AGENT)
AGENTS.register(d4pg.AGENT)

__all__ = [
    "AGENTS",
    "Agent",
    "AgentDef",
    "D4PGConfig",
    "D4PGLearner",
    "D4PGPolicy",
    "DPGConfig",
    "DPGLearner",
    "DPGPolicy",
    "DQNConfig",
    "DQNLearner",
    "DQNPolicy",
    "Policy",
    "agent_names",
    "dpg_transition_spec",
    "dqn_transition_spec",
    "epsilon_ladder",
    "get_agent",
]
