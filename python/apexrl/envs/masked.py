"""Masked CartPole: gymnasium's CartPole with its two velocities removed from the observation.

The observation is ``(cart position, pole angle)``, float32; the dynamics, rewards, ends and the 500-step time
limit are CartPole-v1's. Each observation leaves the state's velocities unknown, so a policy that sees only the
current observation cannot balance the pole for long; one with memory (an LSTM) can infer them from the last
few observations. No frame stacking: the memory has to be the agent's.

Importing this module registers ``MaskedCartPole-v1`` with gymnasium, so the ``gym`` family reaches it in
gymnasium's "module:EnvId" form::

    apexrl.envs.make_env("gym:apexrl.envs.masked:MaskedCartPole-v1", seed)

A vectorised actor steps K of them one after another (apexrl.envs.gym_vector's numpy twin is CartPole's only,
and the wrapper keeps it from applying).
"""

from __future__ import annotations

from typing import Any

import gymnasium
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleEnv

__all__ = ["ENV_ID", "KEPT", "MaskedCartPole", "NAME"]

ENV_ID = "MaskedCartPole-v1"
NAME = f"gym:{__name__}:{ENV_ID}"
"""The apexrl name of the environment."""
KEPT = (0, 2)
"""Indices of CartPole's observation ``(x, x_dot, theta, theta_dot)`` that stay: position and angle."""


class MaskedCartPole(gymnasium.ObservationWrapper):
    """``CartPoleEnv`` whose observations are only ``(x, theta)`` (float32, bounds CartPole's own)."""

    metadata = CartPoleEnv.metadata

    def __init__(self, render_mode: str | None = None, **kwargs: Any):
        super().__init__(CartPoleEnv(render_mode=render_mode, **kwargs))
        inner = self.env.observation_space
        assert isinstance(inner, gymnasium.spaces.Box)
        self.observation_space = gymnasium.spaces.Box(inner.low[list(KEPT)], inner.high[list(KEPT)], dtype=np.float32)

    def observation(self, observation: np.ndarray) -> np.ndarray:
        return np.asarray(observation, dtype=np.float32)[list(KEPT)]


if ENV_ID not in gymnasium.registry:
    gymnasium.register(id=ENV_ID, entry_point=MaskedCartPole, max_episode_steps=500, reward_threshold=475.0)
