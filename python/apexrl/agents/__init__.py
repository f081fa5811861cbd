"""Ape-X agents: DQN (dueling, double-Q, n-step), DPG (deterministic actor-critic, n-step), D4PG (DPG with a
categorical critic), TD3 (twin critics, delayed policy updates, target smoothing), SAC (squashed Gaussian
policy, twin critics, learned temperature) and R2D2 (recurrent Ape-X on replayed sequences, :mod:`.r2d2`); and
the on-policy agents PPO, A2C, TRPO and IMPALA on queue tables (:mod:`.ppo`, :mod:`.a2c`, :mod:`.trpo`,
:mod:`.impala`, sharing :mod:`.onpolicy`).

Each agent is one module ending in an :class:`~apexrl.agents.base.AgentDef` (config class, learner side,
actor side, the environments it accepts); the lines below register them. An agent that lives in another
distribution registers itself with an ``apexrl.agents`` entry point instead (see docs/architecture.md).
"""

from __future__ import annotations

from apexrl.agents import d4pg, dpg, dqn, sac, td3
from apexrl.agents.a2c import A2C_FIELD_SOURCES, A2CConfig
from apexrl.agents.a2c.agent import AGENT as A2C_AGENT
from apexrl.agents.base import AGENTS, Agent, AgentDef, Policy, agent_names, get_agent
from apexrl.agents.common import epsilon_ladder
from apexrl.agents.config import FIELD_SOURCES, D4PGConfig, DPGConfig, DQNConfig, SACConfig, TD3Config
from apexrl.agents.d4pg import D4PGLearner, D4PGPolicy
from apexrl.agents.dpg import DPGLearner, DPGPolicy, dpg_transition_spec
from apexrl.agents.dqn import DQNLearner, DQNPolicy, dqn_transition_spec
from apexrl.agents.impala import IMPALA_FIELD_SOURCES, IMPALAConfig
from apexrl.agents.impala.agent import AGENT as IMPALA_AGENT
from apexrl.agents.mpo import DMPO_AGENT, DMPO_FIELD_SOURCES, MPO_AGENT, MPO_FIELD_SOURCES, DMPOConfig, MPOConfig
from apexrl.agents.ppo import PPO_FIELD_SOURCES, PPOConfig
from apexrl.agents.ppo.agent import AGENT as PPO_AGENT
from apexrl.agents.r2d2.agent import AGENT as R2D2_AGENT
from apexrl.agents.r2d2.config import R2D2_FIELD_SOURCES, R2D2Config
from apexrl.agents.sac import SACLearner, SACPolicy
from apexrl.agents.td3 import TD3Learner, TD3Policy
from apexrl.agents.trpo import TRPO_FIELD_SOURCES, TRPOConfig
from apexrl.agents.trpo.agent import AGENT as TRPO_AGENT

# The registry: one line per agent.
AGENTS.register(dqn.AGENT)
AGENTS.register(dpg.AGENT)
AGENTS.register(d4pg.AGENT)
AGENTS.register(td3.AGENT)
AGENTS.register(sac.AGENT)
AGENTS.register(R2D2_AGENT)
AGENTS.register(MPO_AGENT)
AGENTS.register(DMPO_AGENT)
FIELD_SOURCES[R2D2Config] = R2D2_FIELD_SOURCES  # the preset table's sources of R2D2's defaults
FIELD_SOURCES[MPOConfig] = MPO_FIELD_SOURCES
FIELD_SOURCES[DMPOConfig] = DMPO_FIELD_SOURCES
AGENTS.register(PPO_AGENT)
AGENTS.register(A2C_AGENT)
AGENTS.register(TRPO_AGENT)
AGENTS.register(IMPALA_AGENT)
FIELD_SOURCES[PPOConfig] = PPO_FIELD_SOURCES  # and the other on-policy agents' sources of their defaults
FIELD_SOURCES[A2CConfig] = A2C_FIELD_SOURCES
FIELD_SOURCES[TRPOConfig] = TRPO_FIELD_SOURCES
FIELD_SOURCES[IMPALAConfig] = IMPALA_FIELD_SOURCES

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
    "SACConfig",
    "SACLearner",
    "SACPolicy",
    "TD3Config",
    "TD3Learner",
    "TD3Policy",
    "agent_names",
    "dpg_transition_spec",
    "dqn_transition_spec",
    "epsilon_ladder",
    "get_agent",
]
