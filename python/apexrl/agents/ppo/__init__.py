"""PPO (Schulman et al. 2017) on the on-policy queue path, as Tonic's torch PPO.

- :mod:`~apexrl.agents.ppo.config`: :class:`PPOConfig` (Tonic's defaults) and the source of each default.
- :mod:`~apexrl.agents.ppo.learner`: the clipped ratio objective and :class:`PPOLearner` (the data path,
  GAE, the critic and the policy lag are :mod:`apexrl.agents.onpolicy`'s).
- :mod:`~apexrl.agents.ppo.presets`: ``ppo-cartpole``.
- :mod:`~apexrl.agents.ppo.agent`: ``--agent ppo``.
"""

from __future__ import annotations

from apexrl.agents.ppo.config import PPO_FIELD_SOURCES, PPOConfig
from apexrl.agents.ppo.learner import PPOLearner, clipped_objective

__all__ = ["PPOConfig", "PPOLearner", "PPO_FIELD_SOURCES", "clipped_objective"]
