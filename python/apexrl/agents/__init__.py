"""Ape-X agents: DQN (dueling, double-Q, n-step), DPG (deterministic actor-critic, n-step), D4PG (DPG with a
categorical critic), TD3 (twin critics, delayed policy updates, target smoothing), SAC (squashed Gaussian
policy, twin critics, learned temperature) and R2D2 (recurrent Ape-X on replayed sequences, :mod:`.r2d2`); and
the on-policy agents PPO, A2C, TRPO and IMPALA on queue tables (:mod:`.ppo`, :mod:`.a2c`, :mod:`.trpo`,
:mod:`.impala`, sharing :mod:`.onpolicy`).

Each agent is one module ending in an :class:`~apexrl.agents.base.AgentDef` (config class, learner side,
actor side, the environments it accepts, and optionally its presets, their sources and its config's field
sources); the lines below register them, one per agent. An agent that lives in another
distribution registers itself with an ``apexrl.agents`` entry point instead (see docs/architecture.md).
"""

from __future__ import annotations

from apexrl.agents import d4pg, dpg, dqn, sac, td3
from apexrl.agents.a2c.agent import AGENT as A2C_AGENT
from apexrl.agents.base import AGENTS, Agent, AgentDef, Policy, agent_names, get_agent
from apexrl.agents.common import epsilon_ladder
from apexrl.agents.config import D4PGConfig, DPGConfig, DQNConfig, SACConfig, TD3Config
from apexrl.agents.d4pg import D4PGLearner, D4PGPolicy
from apexrl.agents.dpg import DPGLearner, DPGPolicy, dpg_transition_spec
from apexrl.agents.dqn import DQNLearner, DQNPolicy, dqn_transition_spec
from apexrl.agents.impala.agent import AGENT as IMPALA_AGENT
from apexrl.agents.mpo import DMPO_AGENT, MPO_AGENT
from apexrl.agents.ppo.agent import AGENT as PPO_AGENT
from apexrl.agents.r2d2.agent import AGENT as R2D2_AGENT
from apexrl.agents.sac import SACLearner, SACPolicy
from apexrl.agents.td3 import TD3Learner, TD3Policy
from apexrl.agents.trpo.agent import AGENT as TRPO_AGENT

# The registry: one line per agent.
AGENTS.register(dqn.AGENT)
AGENTS.register(dpg.AGENT)
AGENTS.register(d4pg.AGENT)
AGENTS.register(td3.AGENT)
AGENTS.register(sac.AGENT)
# MPO and DMPO before R2D2: the order their presets take in PRESETS (and in docs/running.md's table).
AGENTS.register(MPO_AGENT)
AGENTS.register(DMPO_AGENT)
AGENTS.register(R2D2_AGENT)
AGENTS.register(PPO_AGENT)
AGENTS.register(A2C_AGENT)
AGENTS.register(TRPO_AGENT)
AGENTS.register(IMPALA_AGENT)

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
