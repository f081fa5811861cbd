"""Any gymnasium environment: "gym:<id>" is what ``gymnasium.make(id)`` accepts.

- Registered ids: classic control ("gym:CartPole-v1", "gym:Pendulum-v1"), Box2D where installed, and the MuJoCo
  tasks ("gym:HalfCheetah-v5", "gym:Hopper-v5", ...; the ``control`` extra installs MuJoCo and imageio).
- A user's own environment in gymnasium's "module:EnvId" form: "gym:my_pkg.envs:MyEnv-v0" imports ``my_pkg.envs``
  (in every process that makes the environment), which registers ``MyEnv-v0`` with ``gymnasium.register``.

Spaces (:mod:`apexrl.envs.spaces`): observations are flattened to float32 vectors (Box of any shape, Dict,
Tuple, ...; no image observations), actions are Discrete or bounded Box (the agents' [-1, 1] rescaled to the
bounds). Anything else is refused when the environment is made, naming the space.

Terminal and truncation come straight from gymnasium: the task's own end (pole fell, goal reached) is
`terminated`; the `TimeLimit` wrapper's cut-off (500 steps for CartPole-v1, 1000 for HalfCheetah-v5) is
`truncated`, so the n-step target bootstraps through it. An id registered without a time limit gets one of
DEFAULT_EPISODE_STEPS (a truncation too), so that every episode ends and is reported.
"""

from __future__ import annotations

import functools
import importlib
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from apexrl.envs.base import (
    Env,
    EnvFamily,
    EnvSpec,
    RenderError,
    SerialVecEnv,
    StepResult,
    UnknownEnvError,
    VecEnv,
    backend_seed,
)
from apexrl.envs.spaces import ActionMap, observation_flattener

PREFIX = "gym:"
EXAMPLES = ("gym:CartPole-v1", "gym:Pendulum-v1", "gym:HalfCheetah-v5", "gym:my_pkg.envs:MyEnv-v0")
DEFAULT_EPISODE_STEPS = 1000
MUJOCO_HINT = "gymnasium's MuJoCo tasks need mujoco and imageio: pip install 'apexrl[control]'"


def describe() -> str:
    return (
        f"gym:<id> (any id gymnasium.make accepts, a module of your own as gym:<module>:<id>; e.g. "
        f"{', '.join(EXAMPLES)})"
    )


def examples() -> list[str]:
    return list(EXAMPLES[:3])


def _registered(task: str):
    """gymnasium's EnvSpec of ``task``, importing the module of a "module:EnvId" id first; UnknownEnvError if
    gymnasium does not know it."""
    import gymnasium

    module, _, env_id = task.rpartition(":")
    if module:
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is not None and module.startswith(e.name):  # the module itself, not one it imports
                raise UnknownEnvError(f"cannot import module {module!r} (is it on PYTHONPATH?)") from None
            raise
    try:
        return gymnasium.spec(env_id)
    except gymnasium.error.Error as e:
        raise UnknownEnvError(f"gymnasium has no environment {env_id!r} ({e})") from None


def _make(task: str):
    """The gymnasium environment of ``task`` (rendering into arrays where it can)."""
    import gymnasium
    from gymnasium.envs.registration import load_env_creator

    registered = _registered(task)
    kwargs: dict[str, Any] = {}
    creator = registered.entry_point
    try:
        creator = load_env_creator(creator) if isinstance(creator, str) else creator
    except (ImportError, gymnasium.error.DependencyNotInstalled) as e:
        raise ImportError(f"gym:{task}: {e}" + (f"; {MUJOCO_HINT}" if "mujoco" in str(creator) else "")) from None
    # rgb_array costs nothing until render() is called; asked only where the environment offers it (gymnasium
    # warns otherwise, and pytest makes warnings errors).
    if "rgb_array" in (getattr(creator, "metadata", None) or {}).get("render_modes", ()):
        kwargs["render_mode"] = "rgb_array"
    if registered.max_episode_steps is None:
        kwargs["max_episode_steps"] = DEFAULT_EPISODE_STEPS
    try:
        # The passive env checker only warns; our own Env checks the reset/step protocol instead.
        return gymnasium.make(registered, disable_env_checker=True, **kwargs)
    except gymnasium.error.DependencyNotInstalled as e:
        raise ImportError(f"gym:{task}: {e}" + (f"; {MUJOCO_HINT}" if "mujoco" in str(e).lower() else "")) from None


class GymEnv(Env):
    """One gymnasium environment; seeded once at the first reset, so later episodes continue the same random
    stream (same seed -> same sequence of episodes)."""

    def __init__(self, task: str, seed: int):
        name = PREFIX + task
        self._env = _make(task)
        try:
            obs_dim, self._flatten = observation_flattener(name, self._env.observation_space)
            self._actions = ActionMap(name, self._env.action_space)
        except ValueError:
            self._env.close()
            raise
        self.render_fps = float(self._env.metadata.get("render_fps") or 30)
        self._seed: int | None = backend_seed(seed)
        super().__init__(
            EnvSpec(
                name=name,
                obs_shape=(obs_dim,),
                obs_dtype=np.dtype(np.float32),
                num_actions=self._actions.num_actions,
                action_dim=self._actions.action_dim,
                frames_per_step=1,
                max_episode_steps=int(self._env.spec.max_episode_steps or DEFAULT_EPISODE_STEPS),
            )
        )

    def _reset(self) -> np.ndarray:
        obs, _ = self._env.reset(seed=self._seed)
        self._seed = None
        return self._flatten(obs)

    def _step(self, action) -> StepResult:
        if self.spec.num_actions is not None:
            a = self._actions.discrete(self._discrete_action(action))
        else:
            a = self._actions.continuous(self._unit_action(action))
        obs, reward, terminated, truncated, _ = self._env.step(a)
        terminated = bool(terminated)
        return StepResult(
            self._flatten(obs), float(reward), terminated, bool(truncated) and not terminated, float(reward)
        )

    def render(self) -> np.ndarray:
        """gymnasium's own drawing of the task (classic control needs pygame: the ``video`` extra)."""
        import gymnasium

        if self._env.render_mode != "rgb_array":
            raise RenderError(f"{self.spec.name} does not render into images (its render_modes have no rgb_array)")
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


def make_vector(task: str, seeds: Sequence[int]) -> VecEnv:
    """K training environments of ``task``: its numpy twin where it has an exact one (:mod:`apexrl.envs.gym_vector`:
    CartPole), else K GymEnvs stepped one after another."""
    from apexrl.envs.gym_vector import vector_twin

    envs = [GymEnv(task, seeds[0])]
    try:
        twin = vector_twin(envs[0]._env, envs[0].spec, seeds)
        if twin is not None:
            envs[0].close()
            return twin
        envs += [GymEnv(task, seed) for seed in seeds[1:]]
    except BaseException:
        for env in envs:
            env.close()
        raise
    return SerialVecEnv(envs)


@functools.cache
def spec(task: str) -> EnvSpec:
    env = GymEnv(task, 0)
    env.close()
    return env.spec


FAMILY = EnvFamily(
    "gym", describe, examples, lambda task, seed, evaluation: make(task, seed, evaluation=evaluation), spec, make_vector
)
