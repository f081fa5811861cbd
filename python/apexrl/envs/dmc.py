"""DeepMind Control Suite tasks through dm-control ("dmc:cartpole-swingup", "dmc:humanoid-run", ...).

- Name: "dmc:<domain>-<task>" with the suite's own domain and task names (they contain underscores, never
  hyphens: "dmc:ball_in_cup-catch", "dmc:point_mass-easy").
- Observation: the suite's observation dict flattened into one float32 vector, entries concatenated in
  SORTED KEY order (each entry raveled in C order). Sorted keys, not the dict's insertion order, so the
  layout depends only on the set of keys and is the same in every process and dm-control version.
- Action: float32 in [-1, 1], rescaled linearly to the action spec's [minimum, maximum].
- Episode end: dm_env's LAST step. With discount 0 it is `terminated`; with a non-zero discount it is the
  suite's time limit (1000 agent steps for every task but the two LQR tasks) and reported as `truncated`,
  because the state is not terminal and the n-step target bootstraps through it. Tasks without a time limit
  (lqr-*) are truncated by us after 1000 steps.

The suite is imported lazily with MUJOCO_GL defaulting to "disable": training never renders, and the default
backend search tries GLFW, which warns about a missing DISPLAY on headless machines. ``render()`` (videos)
needs an offscreen backend chosen before the first import: ``MUJOCO_GL=egl`` (``apexrl evaluate --video``
sets it; on Debian the packages libegl1 and libgl1-mesa-dri) or ``osmesa``.
"""

from __future__ import annotations

import functools
import math
import os

import numpy as np

from apexrl.envs.base import (
    Env,
    EnvFamily,
    EnvSpec,
    RenderError,
    StepResult,
    UnknownEnvError,
    backend_seed,
    rescale_action,
)

PREFIX = "dmc:"
INSTALL_HINT = "pip install 'apexrl[control]'"
DEFAULT_EPISODE_STEPS = 1000
RENDER_HEIGHT, RENDER_WIDTH = 240, 320


def _suite():
    os.environ.setdefault("MUJOCO_GL", "disable")
    try:
        from dm_control import suite
    except ImportError as e:
        raise ImportError(f"dmc:* environments need dm-control: {INSTALL_HINT}") from e
    return suite


def available() -> bool:
    try:
        _suite()
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _tasks() -> tuple[str, ...]:
    return tuple(f"{domain}-{task}" for domain, task in _suite().ALL_TASKS)


EXAMPLES = ("dmc:cartpole-swingup", "dmc:walker-walk", "dmc:humanoid-run")


def examples() -> list[str]:
    return list(EXAMPLES) if available() else []


def describe() -> str:
    needs = "" if available() else f"; needs {INSTALL_HINT}"
    return f"dmc:<domain>-<task> (any Control Suite task, e.g. {', '.join(EXAMPLES)}{needs})"


def _known(task: str) -> str:
    """``task``, or UnknownEnvError listing the suite's tasks (ImportError naming the extra without dm-control)."""
    if task not in _tasks():
        raise UnknownEnvError(f"the Control Suite has no task {task!r}; tasks: {', '.join(_tasks())}")
    return task


class DmcEnv(Env):
    """One Control Suite task. The task's random state is seeded at construction and continues across
    episodes, so the same seed gives the same sequence of initial states."""

    def __init__(self, name: str, seed: int):
        domain, task = name.split("-", 1)
        self._env = _suite().load(domain, task, task_kwargs={"random": backend_seed(seed)})
        self._keys = sorted(self._env.observation_spec())
        action_spec = self._env.action_spec()
        self._low = np.asarray(action_spec.minimum, np.float64)
        self._high = np.asarray(action_spec.maximum, np.float64)
        # dm-control exposes the step limit only as a private attribute; it is the time limit divided by the
        # control timestep (1000 for the suite's tasks, infinite for LQR).
        limit = float(getattr(self._env, "_step_limit", math.inf))
        self._own_limit = not math.isfinite(limit)
        self._steps = 0
        self.render_fps = 1.0 / float(self._env.control_timestep())
        obs_dim = sum(int(np.prod(self._env.observation_spec()[k].shape)) for k in self._keys)
        super().__init__(
            EnvSpec(
                name=PREFIX + name,
                obs_shape=(obs_dim,),
                obs_dtype=np.dtype(np.float32),
                num_actions=None,
                action_dim=int(np.prod(action_spec.shape)),
                frames_per_step=1,
                max_episode_steps=DEFAULT_EPISODE_STEPS if self._own_limit else int(limit),
            )
        )

    def _flatten(self, observation) -> np.ndarray:
        # np.concatenate always allocates, so the result is fresh.
        return np.concatenate([np.asarray(observation[k], np.float32).ravel() for k in self._keys])

    def _reset(self) -> np.ndarray:
        self._steps = 0
        return self._flatten(self._env.reset().observation)

    def _step(self, action) -> StepResult:
        a = rescale_action(self._unit_action(action), self._low, self._high)
        ts = self._env.step(a)
        self._steps += 1
        reward = float(ts.reward or 0.0)
        terminated = ts.last() and ts.discount == 0.0
        truncated = (ts.last() and not terminated) or (
            self._own_limit and not terminated and self._steps >= self.spec.max_episode_steps
        )
        return StepResult(self._flatten(ts.observation), reward, bool(terminated), bool(truncated), reward)

    def render(self) -> np.ndarray:
        """Camera 0 of the task, RENDER_HEIGHT x RENDER_WIDTH, drawn offscreen."""
        backend = os.environ.get("MUJOCO_GL", "")
        if backend == "disable":
            raise RenderError(
                f"{self.spec.name}: rendering is off (MUJOCO_GL=disable); set MUJOCO_GL=egl (or osmesa) "
                "before the first dmc environment is made"
            )
        try:
            return self._env.physics.render(height=RENDER_HEIGHT, width=RENDER_WIDTH, camera_id=0)
        except Exception as e:  # noqa: BLE001 - each OpenGL backend fails in its own way
            raise RenderError(
                f"{self.spec.name}: offscreen rendering with MUJOCO_GL={backend or '(unset)'} failed "
                f"({type(e).__name__}: {e}); on Debian: apt-get install libegl1 libgl1-mesa-dri"
            ) from None

    def close(self) -> None:
        self._env.close()


def make(name: str, seed: int, *, evaluation: bool = False) -> DmcEnv:
    """Evaluation episodes are the training ones (same time limit)."""
    return DmcEnv(_known(name), seed)


@functools.cache
def spec(name: str) -> EnvSpec:
    with DmcEnv(_known(name), 0) as env:
        return env.spec


FAMILY = EnvFamily(
    "dmc", describe, examples, lambda task, seed, evaluation: make(task, seed, evaluation=evaluation), spec
)
