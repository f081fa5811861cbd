"""gymnasium classic control tasks ("gym:CartPole-v1", "gym:Pendulum-v1", ...) for quick runs and tests.

Observations are float32 vectors. Terminal and truncation come straight from gymnasium: the task's own end
(pole fell, goal reached) is `terminated`; the `TimeLimit` wrapper's cut-off (e.g. 500 steps for CartPole-v1,
200 for Pendulum-v1) is `truncated`. Continuous actions in [-1, 1] are rescaled to the task's action bounds
(Pendulum-v1: torque in [-2, 2]).
"""

from __future__ import annotations

import os

import numpy as np

from apexrl.envs.base import (
    Env,
    EnvSpec,
    RenderError,
    StepResult,
    backend_seed,
    rescale_action,
)

PREFIX = "gym:"
TASKS = ("CartPole-v1", "Pendulum-v1", "Acrobot-v1", "MountainCar-v0", "MountainCarContinuous-v0")


def names() -> list[str]:
    return [PREFIX + t for t in TASKS]


def describe() -> str:
    return ", ".join(names())


def is_known(task: str) -> bool:
    return task in TASKS


class GymEnv(Env):
    """One gymnasium classic-control environment; seeded once at the first reset, so later episodes continue
    the same random stream (same seed -> same sequence of episodes)."""

    def __init__(self, task: str, seed: int):
        import gymnasium

        # The passive env checker only warns (and pytest turns warnings into errors); our own Env checks the
        # reset/step protocol instead.
        # rgb_array costs nothing until render() is called (pygame is imported then).
        self._env = gymnasium.make(task, disable_env_checker=True, render_mode="rgb_array")
        self.render_fps = float(self._env.metadata.get("render_fps") or 30)
        self._seed: int | None = backend_seed(seed)
        space = self._env.action_space
        discrete = isinstance(space, gymnasium.spaces.Discrete)
        if not discrete:
            self._low = np.asarray(space.low, np.float64)
            self._high = np.asarray(space.high, np.float64)
        super().__init__(EnvSpec(
            name=PREFIX + task,
            obs_shape=tuple(self._env.observation_space.shape),
            obs_dtype=np.dtype(np.float32),
            num_actions=int(space.n) if discrete else None,
            action_dim=None if discrete else int(np.prod(space.shape)),
            frames_per_step=1,
            max_episode_steps=int(self._env.spec.max_episode_steps),
        ))

    def _reset(self) -> np.ndarray:
        obs, _ = self._env.reset(seed=self._seed)
        self._seed = None
        return np.array(obs, dtype=np.float32)

    def _step(self, action) -> StepResult:
        if self.spec.num_actions is not None:
            a = self._discrete_action(action)
        else:
            a = rescale_action(self._unit_action(action), self._low, self._high).astype(np.float32)
        obs, reward, terminated, truncated, _ = self._env.step(a)
        terminated = bool(terminated)
        return StepResult(np.array(obs, dtype=np.float32), float(reward), terminated,
                          bool(truncated) and not terminated, float(reward))

    def render(self) -> np.ndarray:
        """gymnasium's own drawing of the task (needs pygame: the ``video`` extra)."""
        import gymnasium

        # Offscreen: no window, no sound device (SDL complains about a missing one on headless machines).
        os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
        os.environ.setdefault("SDL_AUDIODRIVER", "dummy")
        try:
            return np.asarray(self._env.render(), dtype=np.uint8)
        except gymnasium.error.DependencyNotInstalled as e:
            raise RenderError(f"{self.spec.name}: rendering needs pygame: pip install 'apexrl[video]' ({e})") from None

    def close(self) -> None:
        self._env.close()


def make(task: str, seed: int, *, evaluation: bool = False) -> GymEnv:
    """Evaluation episodes are the training ones (same time limit)."""
    return GymEnv(task, seed)


def spec(task: str) -> EnvSpec:
    env = GymEnv(task, 0)
    env.close()
    return env.spec
