"""Atari 2600 games through ale-py ("atari:Pong", "atari:Breakout", ...) with the Ape-X / DQN preprocessing.

One agent step (`frames_per_step` = 4):

- the action is repeated for 4 emulator frames; the observed frame is the pixel-wise max of the last two of
  those 4 raw frames (Atari sprites flicker between frames), converted to grey and resized to 84x84 (area);
- the observation is a stack of the 4 newest such frames, shape (4, 84, 84) uint8, oldest first and newest
  last; at the start of an episode the slots before the first frame are zeros;
- `reward` is the sum of the 4 frames' scores clipped to [-1, 1]; `raw_reward` is the unclipped sum;
- `terminated` is game over (losing a life is not a terminal); an episode longer than 50 000 frames
  (12 500 agent steps, counted after the no-op start) ends with `truncated`; evaluation environments
  (`make_env(..., evaluation=True)`) allow 108 000 frames, the evaluation protocol's cap;
- each episode starts with a random number of no-op frames, 0 to 29 (ale-py draws below `noop_max` = 30)
  from the seeded generator;
- no sticky actions (repeat_action_probability = 0), the game's minimal action set, no FIRE on reset.

The backend is ale-py's `AtariVectorEnv`: it does the frame skip, max-pool, grey conversion, resize and stacking
in C++, which measured ~1.5x the agent steps/s of driving `ALEInterface` from Python with a numpy resize, and
needs no OpenCV. `AtariEnv` (evaluation, and an actor with one environment) holds a vector environment of one;
a vectorised actor (`--envs-per-actor K`) gets `AtariVecEnv`: one vector environment of K games stepped by its
worker threads (one per core, at most K), each game resetting itself within the step that ends its episode
(ale-py's "SameStep" autoreset, the last observation coming back as `final_obs`). Game `j` of `AtariVecEnv`
plays exactly the episodes of `AtariEnv` with the same seed for the same actions (tests/apex/test_vector_actor.py).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Sequence

import numpy as np

from apexrl.envs.base import (
    Env,
    EnvFamily,
    EnvSpec,
    RenderError,
    StepResult,
    UnknownEnvError,
    VecEnv,
    VecStep,
    backend_seed,
)

PREFIX = "atari:"
INSTALL_HINT = "pip install 'apexrl[atari]'"
FRAME_SKIP = 4
STACK = 4
SIZE = 84
NOOP_MAX = 30
MAX_EPISODE_FRAMES = 50_000
EVAL_EPISODE_FRAMES = 108_000
"""Evaluation episodes are capped at 108,000 frames (30 minutes of play at 60 Hz), the Ape-X / Rainbow protocol."""


def _ale_py():
    try:
        import ale_py
    except ImportError as e:
        raise ImportError(f"atari:* environments need ale-py: {INSTALL_HINT}") from e
    return ale_py


def available() -> bool:
    try:
        _ale_py()
    except ImportError:
        return False
    return True


@functools.lru_cache(maxsize=1)
def _games() -> dict[str, str]:
    """Game name (as in gymnasium's "ALE/<Name>-v5") -> ROM id, for the single-player ROMs ale-py supports.
    ale-py ships a few multiplayer-only ROMs (Combat, Joust, MazeCraze, Warlords) that it refuses to load, and
    the vectorised env then exits the process instead of raising, so they are left out here."""
    ale_py = _ale_py()
    from ale_py.registration import rom_id_to_name

    return {
        rom_id_to_name(rom): rom
        for rom in sorted(ale_py.roms.get_all_rom_ids())
        if ale_py.ALEInterface.isSupportedROM(ale_py.roms.get_rom_path(rom))
    }


EXAMPLES = ("atari:Pong", "atari:Breakout", "atari:SpaceInvaders")


def examples() -> list[str]:
    return list(EXAMPLES) if available() else []


def describe() -> str:
    needs = "" if available() else f"; needs {INSTALL_HINT}"
    return f"atari:<Game> (any single-player ALE game, e.g. {', '.join(EXAMPLES)}{needs})"


def _known(game: str) -> str:
    """``game``, or UnknownEnvError listing the games (ImportError naming the extra without ale-py)."""
    if game not in _games():
        raise UnknownEnvError(f"ale-py has no single-player game {game!r}; games: {', '.join(_games())}")
    return game


def clip_reward(r: float) -> float:
    """The paper's training reward: the score change clipped to [-1, 1]."""
    return -1.0 if r < -1.0 else 1.0 if r > 1.0 else float(r)


def _vector_env(
    game: str, num_envs: int, num_threads: int, max_episode_frames: int, noop_max: int, autoreset_mode: str
):
    from ale_py.vector_env import AtariVectorEnv

    return AtariVectorEnv(
        _games()[game],
        num_envs,
        num_threads=num_threads,
        max_num_frames_per_episode=max_episode_frames,
        repeat_action_probability=0.0,
        full_action_space=False,
        img_height=SIZE,
        img_width=SIZE,
        grayscale=True,
        stack_num=STACK,
        frameskip=FRAME_SKIP,
        maxpool=True,
        noop_max=noop_max,
        episodic_life=False,  # a lost life is not a terminal in Ape-X
        reward_clipping=False,  # we clip ourselves to keep the raw score
        use_fire_reset=False,  # not part of the paper's preprocessing
        autoreset_mode=autoreset_mode,
    )


def _spec(game: str, num_actions: int, max_episode_frames: int) -> EnvSpec:
    return EnvSpec(
        name=PREFIX + game,
        obs_shape=(STACK, SIZE, SIZE),
        obs_dtype=np.dtype(np.uint8),
        num_actions=num_actions,
        action_dim=None,
        frames_per_step=FRAME_SKIP,
        max_episode_steps=max_episode_frames // FRAME_SKIP,
    )


class AtariEnv(Env):
    """One Atari game with the preprocessing described in the module docstring. The first reset seeds the
    emulator and the no-op generator; later resets continue those streams, so the same seed gives the same
    sequence of episodes for the same actions."""

    def __init__(self, game: str, seed: int, *, max_episode_frames: int = MAX_EPISODE_FRAMES, noop_max: int = NOOP_MAX):
        """`max_episode_frames` and `noop_max` differ from the paper's values only in tests."""
        self._seed: int | None = backend_seed(seed)
        # One game, one worker thread; its own resets (NextStep: the env never resets itself here, since the Env
        # protocol ends each episode with an explicit reset()).
        self._env = _vector_env(game, 1, 1, max_episode_frames, noop_max, "NextStep")
        self._action = np.zeros(1, np.int64)
        self._last: np.ndarray | None = None  # the newest observation, for render()
        super().__init__(_spec(game, int(self._env.single_action_space.n), max_episode_frames))

    def _reset(self) -> np.ndarray:
        obs, _ = self._env.reset(seed=self._seed)
        self._seed = None
        self._last = obs[0].copy()
        return self._last

    def _step(self, action) -> StepResult:
        self._action[0] = self._discrete_action(action)
        obs, reward, terminated, truncated, _ = self._env.step(self._action)
        raw = float(reward[0])
        term = bool(terminated[0])
        self._last = obs[0].copy()  # shared with the caller, who never writes into it
        return StepResult(self._last, clip_reward(raw), term, bool(truncated[0]) and not term, raw)

    render_fps = 60.0 / FRAME_SKIP

    def render(self) -> np.ndarray:
        """What the agent sees, not the console's colour screen (ale-py's vector env returns only the
        preprocessed frames): the newest 84x84 grey frame, scaled 4x (nearest) to 336x336, as RGB."""
        if self._last is None:
            raise RenderError(f"{self.spec.name}: render() before reset()")
        big = np.repeat(np.repeat(self._last[-1], 4, axis=0), 4, axis=1)
        return np.stack([big] * 3, axis=-1)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


class AtariVecEnv(VecEnv):
    """K games in one ale-py vector environment (see the module docstring); game ``j`` seeded as
    ``AtariEnv(game, seeds[j])``. ``num_threads``: ale-py's worker threads, by default one per core this process
    may run on, at most K."""

    def __init__(
        self,
        game: str,
        seeds: Sequence[int],
        *,
        max_episode_frames: int = MAX_EPISODE_FRAMES,
        noop_max: int = NOOP_MAX,
        num_threads: int | None = None,
    ):
        if not seeds:
            raise ValueError("AtariVecEnv needs at least one seed")
        self.num_envs = k = len(seeds)
        self._seeds = np.array([backend_seed(s) for s in seeds], np.int64)
        if num_threads is None:
            num_threads = min(
                k, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
            )
        self._env = _vector_env(game, k, num_threads, max_episode_frames, noop_max, "SameStep")
        self.spec = _spec(game, int(self._env.single_action_space.n), max_episode_frames)

    def reset(self) -> np.ndarray:
        obs, _ = self._env.reset(seed=self._seeds)
        return np.array(obs)  # fresh: ale-py may reuse its buffers

    def step(self, actions: Sequence) -> VecStep:
        a = np.asarray(actions)
        n = self.spec.num_actions
        if a.shape != (self.num_envs,) or a.dtype.kind not in "iu":
            raise ValueError(f"{self.spec.name}: expected {self.num_envs} int actions, got {a.dtype} {a.shape}")
        if a.size and (a.min() < 0 or a.max() >= n):
            raise ValueError(f"{self.spec.name}: an action out of range [0, {n}) in {a.tolist()}")
        obs, reward, terminated, truncated, info = self._env.step(a.astype(np.int64))
        raw = np.asarray(reward, np.float64)
        terminated = np.array(terminated, bool)
        truncated = np.array(truncated, bool) & ~terminated
        ended = np.flatnonzero(terminated | truncated)
        final = {int(j): np.array(info["final_obs"][j]) for j in ended}
        return VecStep(np.array(obs), np.clip(raw, -1.0, 1.0), terminated, truncated, raw, final)

    def close(self) -> None:
        if self._env is not None:
            self._env.close()
            self._env = None


def make_vector(game: str, seeds: Sequence[int]) -> AtariVecEnv:
    """A vectorised actor's K training games (MAX_EPISODE_FRAMES cap, read at each call like ``make``'s)."""
    return AtariVecEnv(_known(game), seeds, max_episode_frames=MAX_EPISODE_FRAMES)


def make(game: str, seed: int, *, evaluation: bool = False) -> AtariEnv:
    """``evaluation``: episodes capped at EVAL_EPISODE_FRAMES instead of MAX_EPISODE_FRAMES (same no-op starts)."""
    return AtariEnv(_known(game), seed, max_episode_frames=EVAL_EPISODE_FRAMES if evaluation else MAX_EPISODE_FRAMES)


@functools.cache
def spec(game: str) -> EnvSpec:
    # The action count is the game's minimal action set, known only once the ROM is loaded.
    with AtariEnv(_known(game), 0) as env:
        return env.spec


FAMILY = EnvFamily(
    "atari",
    describe,
    examples,
    lambda game, seed, evaluation: make(game, seed, evaluation=evaluation),
    spec,
    make_vector,
)
