"""A user's own gymnasium environments, outside apexrl, for ``gym:corridor_envs:<Id>`` (tests put this directory on
PYTHONPATH). Importing the module registers them, as gymnasium's "module:EnvId" form expects."""

from __future__ import annotations

from typing import ClassVar

import gymnasium
import numpy as np
from gymnasium import spaces


class Corridor(gymnasium.Env):
    """Walk right along a corridor of LENGTH cells to the goal (reward 1, terminal); a step costs 0.01. The
    observation is a Dict (position one-hot, a 2x2 Box of noise), so it exercises flattening. 20-step limit."""

    metadata: ClassVar[dict] = {"render_modes": []}
    LENGTH = 5

    def __init__(self):
        self.observation_space = spaces.Dict(
            {
                "position": spaces.Discrete(self.LENGTH),
                "noise": spaces.Box(-1.0, 1.0, (2, 2), np.float64),
            }
        )
        self.action_space = spaces.Discrete(2, start=-1)  # -1 left, 0 right: a start that is not 0
        self._pos = 0

    def _obs(self):
        return {"position": self._pos, "noise": self.np_random.uniform(-1, 1, (2, 2))}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self._pos = 0
        return self._obs(), {}

    def step(self, action):
        assert self.action_space.contains(action), action
        self._pos = min(max(self._pos + (1 if action == 0 else -1), 0), self.LENGTH - 1)
        done = self._pos == self.LENGTH - 1
        return self._obs(), 1.0 if done else -0.01, done, False, {}


class Pixels(Corridor):
    """Image observations: refused outside Atari."""

    def __init__(self):
        super().__init__()
        self.observation_space = spaces.Box(0, 255, (8, 8, 3), np.uint8)


class Unbounded(Corridor):
    """Unbounded continuous actions: refused."""

    def __init__(self):
        super().__init__()
        self.action_space = spaces.Box(-np.inf, np.inf, (2,), np.float32)


gymnasium.register("Corridor-v0", entry_point=Corridor, max_episode_steps=20)
gymnasium.register("Pixels-v0", entry_point=Pixels, max_episode_steps=20)
gymnasium.register("Unbounded-v0", entry_point=Unbounded, max_episode_steps=20)
