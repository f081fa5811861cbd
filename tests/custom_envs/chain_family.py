"""An environment family from another distribution: ``chain:<length>`` (tests register it with an ``apexrl.envs``
entry point in a dist-info directory on PYTHONPATH)."""

from __future__ import annotations

import numpy as np

from apexrl.envs import Env, EnvFamily, EnvSpec, StepResult, UnknownEnvError


class Chain(Env):
    """A chain of ``length`` states: action 1 moves right (reward 1 at the end, terminal), action 0 stays."""

    def __init__(self, length: int, seed: int):
        self._length, self._pos = length, 0
        self._rng = np.random.default_rng(seed)
        super().__init__(EnvSpec(f"chain:{length}", (length,), np.dtype(np.float32), 2, None, 1, 4 * length))
        self._steps = 0

    def _obs(self) -> np.ndarray:
        obs = np.zeros(self._length, np.float32)
        obs[self._pos] = 1.0
        return obs

    def _reset(self) -> np.ndarray:
        self._pos, self._steps = 0, 0
        return self._obs()

    def _step(self, action) -> StepResult:
        self._pos += self._discrete_action(action)
        self._steps += 1
        terminated = self._pos == self._length - 1
        truncated = not terminated and self._steps >= self.spec.max_episode_steps
        reward = 1.0 if terminated else 0.0
        return StepResult(self._obs(), reward, terminated, truncated, reward)


def _length(key: str) -> int:
    if not key.isdigit() or not 2 <= int(key) <= 100:
        raise UnknownEnvError(f"chain:<length> takes a length in 2..100, got {key!r}")
    return int(key)


FAMILY = EnvFamily(
    name="chain",
    describe=lambda: "chain:<length> (a test family, e.g. chain:4)",
    examples=lambda: ["chain:4"],
    make=lambda key, seed, evaluation: Chain(_length(key), seed),
    spec=lambda key: Chain(_length(key), 0).spec,
)
