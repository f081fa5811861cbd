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

The backend is ale-py's `AtariVectorEnv` with a single environment and one worker thread: it does the frame
skip, max-pool, grey conversion, resize and stacking in C++, which measured ~1.5x the agent steps/s of driving
`ALEInterface` from Python with a numpy resize, and needs no OpenCV. The actor owns one environment per
process, so a batch of one is what it needs; the batching itself would only help an actor stepping several
environments at once.
"""

from __future__ import annotations

import functools

import numpy as np

from apexrl.envs.base import (
    Env,
    EnvFamily,
    EnvSpec,
    RenderError,
    StepResult,
    UnknownEnvError,
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

    return {rom_id_to_name(rom): rom for rom in sorted(ale_py.roms.get_all_rom_ids())
            if ale_py.ALEInterface.isSupportedROM(ale_py.roms.get_rom_path(rom))}


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


class AtariEnv(Env):
    """One Atari game with the preprocessing described in the module docstring. The first reset seeds the
    emulator and the no-op generator; later resets continue those streams, so the same seed gives the same
    sequence of episodes for the same actions."""

    def __init__(self, game: str, seed: int, *, max_episode_frames: int = MAX_EPISODE_FRAMES,
                 noop_max: int = NOOP_MAX):
        """`max_episode_frames` and `noop_max` differ from the paper's values only in tests."""
        from ale_py.vector_env import AtariVectorEnv

        self._seed: int | None = backend_seed(seed)
        self._env = AtariVectorEnv(
            _games()[game], 1,
            num_threads=1,                 # one actor process steps one game; more threads only compete
            max_num_frames_per_episode=max_episode_frames,
            repeat_action_probability=0.0,
            full_action_space=False,
            img_height=SIZE, img_width=SIZE, grayscale=True, stack_num=STACK,
            frameskip=FRAME_SKIP, maxpool=True, noop_max=noop_max,
            episodic_life=False,           # a lost life is not a terminal in Ape-X
            reward_clipping=False,         # we clip ourselves to keep the raw score
            use_fire_reset=False,          # not part of the paper's preprocessing
        )
        self._action = np.zeros(1, np.int64)
        self._last: np.ndarray | None = None  # the newest observation, for render()
        super().__init__(EnvSpec(
            name=PREFIX + game,
            obs_shape=(STACK, SIZE, SIZE),
            obs_dtype=np.dtype(np.uint8),
            num_actions=int(self._env.single_action_space.n),
            action_dim=None,
            frames_per_step=FRAME_SKIP,
            max_episode_steps=max_episode_frames // FRAME_SKIP,
        ))

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


def make(game: str, seed: int, *, evaluation: bool = False) -> AtariEnv:
    """``evaluation``: episodes capped at EVAL_EPISODE_FRAMES instead of MAX_EPISODE_FRAMES (same no-op starts)."""
    return AtariEnv(_known(game), seed,
                    max_episode_frames=EVAL_EPISODE_FRAMES if evaluation else MAX_EPISODE_FRAMES)


@functools.lru_cache(maxsize=None)
def spec(game: str) -> EnvSpec:
    # The action count is the game's minimal action set, known only once the ROM is loaded.
    with AtariEnv(_known(game), 0) as env:
        return env.spec


FAMILY = EnvFamily("atari", describe, examples, lambda game, seed, evaluation: make(game, seed, evaluation=evaluation),
                   spec)
