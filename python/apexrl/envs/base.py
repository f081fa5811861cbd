"""The environment interface every actor steps: `EnvSpec`, `StepResult` and the `Env` base class.

An episode is `reset()` followed by `step()` calls until a step reports `terminated` or `truncated`:

- `terminated`: the MDP really ended (game over, pole fell). The n-step target must not bootstrap past it.
- `truncated`: a time limit cut the episode short. The state is not terminal, so the n-step target bootstraps
  through it from `obs` of that step.

Exactly one end flag is set on the last step of an episode (never both); after it, `reset()` must be called
before the next `step()`. Every array an `Env` returns is fresh: no later call writes into it, so actors may
keep observations in their local buffers without copying.

Actions: an `int` in `[0, num_actions)` for discrete environments; for continuous ones a float array of shape
`(action_dim,)` in `[-1, 1]` that the environment rescales to its own bounds (values outside are clipped, so
exploration noise never produces an invalid action).

An `Env` is single-threaded: one instance belongs to one thread.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np


@dataclass(frozen=True)
class EnvSpec:
    """What an agent needs to know about an environment without stepping it."""

    name: str
    """Canonical name, e.g. "gym:CartPole-v1", "atari:Pong", "dmc:cartpole-swingup"."""
    obs_shape: tuple[int, ...]
    """(4, 84, 84) for Atari (frame stack, newest last), (d,) otherwise."""
    obs_dtype: np.dtype
    """uint8 for Atari, float32 otherwise."""
    num_actions: int | None
    """Discrete action count (DQN); None for continuous environments."""
    action_dim: int | None
    """Continuous action size (DPG); actions are always in [-1, 1]. None for discrete environments."""
    frames_per_step: int
    """Environment frames per agent step: 4 for Atari (action repeat), else 1."""
    max_episode_steps: int
    """Agent steps after which an episode is truncated (time limit, not a terminal)."""


class StepResult(NamedTuple):
    """One agent step's outcome."""

    obs: np.ndarray
    """Fresh array, dtype and shape as in the spec."""
    reward: float
    """Training reward: clipped to [-1, 1] for Atari, unchanged otherwise."""
    terminated: bool
    """True end of the MDP: no bootstrap."""
    truncated: bool
    """Time limit: the n-step target bootstraps through it."""
    raw_reward: float
    """Unclipped score, for reporting episode returns."""


class UnknownEnvError(ValueError):
    """A family does not know the id (``make_env`` adds the list of families to the message)."""


class UnsupportedSpaceError(ValueError):
    """The environment exists but its observation or action space is not one apexrl supports (the message names
    the space and what is supported)."""


@dataclass(frozen=True)
class EnvFamily:
    """One family of environment names, ``"<name>:<id>"``. The built-in families are ``gym``, ``atari`` and
    ``dmc``; another distribution adds one with an ``apexrl.envs`` entry point naming an ``EnvFamily``."""

    name: str
    """The prefix before the colon, e.g. ``"gym"``."""
    describe: Callable[[], str]
    """One line for ``--help`` and the unknown-environment message: the name pattern with examples (and the pip
    extra it needs when that is missing)."""
    examples: Callable[[], list[str]]
    """A few valid full names (``apexrl.envs.env_names()``); empty when the family's package is missing."""
    make: Callable[[str, int, bool], Env]
    """``(id, seed, evaluation) -> Env``; UnknownEnvError for an id the family does not know, ImportError naming
    the pip extra when its package is missing."""
    spec: Callable[[str], EnvSpec]
    """``id -> EnvSpec``, with the same errors as ``make``."""
    make_vector: Callable[[str, Sequence[int]], VecEnv] | None = None
    """Optional ``(id, seeds) -> VecEnv``: K training environments (one per seed) stepped together by a backend
    that batches them (Atari: ale-py's vector environment and its threads). Environment ``j`` must produce exactly
    the episodes of ``make(id, seeds[j], False)`` for the same actions. None: :class:`SerialVecEnv` steps K
    ``make`` environments in turn."""


class RenderError(RuntimeError):
    """The environment cannot draw a frame here (missing package or OpenGL backend; the message says which)."""


class Env:
    """One environment instance. Subclasses implement `_reset` and `_step`; this class enforces the episode
    protocol (reset before the first step and after every episode end), so that no backend silently
    auto-resets or steps a finished episode."""

    spec: EnvSpec
    render_fps: float = 30.0
    """Agent steps per second of real time, the frame rate of a video of ``render()`` frames."""

    def __init__(self, spec: EnvSpec):
        self.spec = spec
        self._episode_over = True

    def reset(self) -> np.ndarray:
        """Starts a new episode and returns its first observation."""
        obs = self._reset()
        self._episode_over = False
        return obs

    def step(self, action) -> StepResult:
        """Advances one agent step (`spec.frames_per_step` environment frames)."""
        if self._episode_over:
            raise RuntimeError(f"{self.spec.name}: step() called before reset() or after the episode ended")
        result = self._step(action)
        self._episode_over = result.terminated or result.truncated
        return result

    def close(self) -> None:
        """Releases the backend's resources. Idempotent."""

    def render(self) -> np.ndarray:
        """The current state as an HxWx3 uint8 RGB image (videos); RenderError when it cannot be drawn."""
        raise RenderError(f"{self.spec.name} cannot render frames")

    def _reset(self) -> np.ndarray:
        raise NotImplementedError

    def _step(self, action) -> StepResult:
        raise NotImplementedError

    def __enter__(self) -> Env:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _discrete_action(self, action) -> int:
        """Validates a discrete action; numpy integers are accepted (policies return them)."""
        n = self.spec.num_actions
        assert n is not None  # only discrete environments call this
        if isinstance(action, (bool, np.bool_)) or not isinstance(action, (int, np.integer)):
            raise TypeError(f"{self.spec.name}: discrete action must be an int, got {type(action).__name__}")
        if not 0 <= action < n:
            raise ValueError(f"{self.spec.name}: action {action} out of range [0, {n})")
        return int(action)

    def _unit_action(self, action) -> np.ndarray:
        """Validates a continuous action and clips it to [-1, 1]."""
        a = np.asarray(action, dtype=np.float32)
        if a.shape != (self.spec.action_dim,):
            raise ValueError(f"{self.spec.name}: action shape {a.shape} != ({self.spec.action_dim},)")
        if not np.all(np.isfinite(a)):
            raise ValueError(f"{self.spec.name}: action {a} is not finite")
        return np.clip(a, -1.0, 1.0)


def rescale_action(unit: np.ndarray, low: np.ndarray, high: np.ndarray) -> np.ndarray:
    """Maps an action in [-1, 1] linearly onto [low, high] (elementwise): -1 -> low, 1 -> high."""
    return low + (unit.astype(np.float64) + 1.0) * 0.5 * (high - low)


def backend_seed(seed: int) -> int:
    """A 31-bit seed for a backend derived from the user's seed. Backends take different seed ranges
    (ALE: int32, numpy RandomState: uint32); hashing through SeedSequence accepts any non-negative int
    without aliasing nearby seeds and fits all of them."""
    if isinstance(seed, (bool, np.bool_)) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed!r}")
    return int(np.random.SeedSequence(int(seed)).generate_state(1, np.uint32)[0] >> 1)


class VecStep(NamedTuple):
    """One agent step of the K environments of a :class:`VecEnv`: arrays with a leading dim K."""

    obs: np.ndarray
    """(K, *obs_shape): the observations to act on next. Where an episode ended this step, the first observation
    of the environment's next episode (it was reset within the step)."""
    reward: np.ndarray
    """(K,) float64 training rewards (Atari: clipped)."""
    terminated: np.ndarray
    """(K,) bool."""
    truncated: np.ndarray
    """(K,) bool; never set together with ``terminated``."""
    raw_reward: np.ndarray
    """(K,) float64 unclipped scores."""
    final_obs: dict[int, np.ndarray]
    """The last observation of each environment whose episode ended this step (its key), the one
    ``StepResult.obs`` holds for a single environment: the n-step targets bootstrap from it."""


class VecEnv:
    """K environments of one spec stepped in lockstep, each resetting on its own when its episode ends (so there
    is no reset between steps). Every array returned is fresh; rows are views into it. Single-threaded."""

    spec: EnvSpec
    num_envs: int

    def reset(self) -> np.ndarray:
        """Starts every environment's first episode; (K, *obs_shape). Call once, before the first step."""
        raise NotImplementedError

    def step(self, actions: Sequence) -> VecStep:
        """One agent step of every environment, ``actions[j]`` for environment ``j``."""
        raise NotImplementedError

    def close(self) -> None:
        """Releases the backends. Idempotent."""

    def __enter__(self) -> VecEnv:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class SerialVecEnv(VecEnv):
    """K :class:`Env` instances stepped one after the other in this thread (the default for every family)."""

    def __init__(self, envs: Sequence[Env]):
        if not envs:
            raise ValueError("a vector environment needs at least one environment")
        self.envs = list(envs)
        self.spec = self.envs[0].spec
        self.num_envs = len(self.envs)

    def reset(self) -> np.ndarray:
        return np.stack([env.reset() for env in self.envs])

    def step(self, actions: Sequence) -> VecStep:
        k = self.num_envs
        if len(actions) != k:
            raise ValueError(f"{len(actions)} actions for {k} environments")
        obs: list[Any] = [None] * k
        reward, raw = np.empty(k), np.empty(k)
        terminated, truncated = np.zeros(k, bool), np.zeros(k, bool)
        final: dict[int, np.ndarray] = {}
        for j, env in enumerate(self.envs):
            r = env.step(actions[j])
            reward[j], raw[j], terminated[j], truncated[j] = r.reward, r.raw_reward, r.terminated, r.truncated
            if r.terminated or r.truncated:
                final[j] = r.obs
                obs[j] = env.reset()
            else:
                obs[j] = r.obs
        return VecStep(np.stack(obs), reward, terminated, truncated, raw, final)

    def close(self) -> None:
        for env in self.envs:
            env.close()
