"""Ape-X agents: DQN (dueling, double-Q, n-step) and DPG (deterministic actor-critic, n-step).

Each agent has a learner side (``*Learner``: ``update(batch, weights) -> (priorities, metrics)``, weights for
actors, flat checkpoints) and an actor side (``*Policy``: ``act``, ``initial_priorities``, weight loading).
"""

from __future__ import annotations

from apexrl.agents.base import epsilon_ladder
from apexrl.agents.config import DPGConfig, DQNConfig
from apexrl.agents.dpg import DPGLearner, DPGPolicy, dpg_transition_spec
from apexrl.agents.dqn import DQNLearner, DQNPolicy, dqn_transition_spec

__all__ = [
    "DPGConfig",
    "DPGLearner",
    "DPGPolicy",
    "DQNConfig",
    "DQNLearner",
    "DQNPolicy",
    "dpg_transition_spec",
    "dqn_transition_spec",
    "epsilon_ladder",
]
