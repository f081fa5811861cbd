"""gymnasium spaces to apexrl's: what the agents can take, and how observations and actions are converted.

Observations become one float32 vector (the MLP agents' input):

- ``Box`` of any shape, raveled in C order; except image-like ones (uint8 with two or more dimensions), which only
  the Atari family's preprocessing turns into something the agents take;
- ``Discrete``, ``MultiDiscrete``, ``MultiBinary`` one-hot / as gymnasium's ``spaces.flatten`` writes them;
- ``Dict`` and ``Tuple`` of the above (nested too) by ``gymnasium.spaces.flatten``: entries concatenated in the
  space's key order, which gymnasium sorts for a ``Dict`` built from a plain dict.

Actions: ``Discrete(n, start)`` (the agent's index ``i`` is action ``start + i``) and ``Box`` actions with finite
bounds (the agent's [-1, 1] rescaled linearly onto them). Anything else raises :class:`UnsupportedSpaceError`
naming the space and what is supported.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from apexrl.envs.base import UnsupportedSpaceError

OBS_SUPPORTED = (
    "Box (any shape; no uint8 images outside atari:), Discrete, MultiDiscrete, MultiBinary, and Dict or Tuple of those"
)
ACTION_SUPPORTED = "Discrete, or Box with finite bounds"


def _obs_problem(space) -> str | None:
    """Why ``space`` cannot be flattened into an agent's input, or None."""
    from gymnasium import spaces

    if isinstance(space, spaces.Box):
        if space.dtype == np.uint8 and len(space.shape) >= 2:
            return f"image observations {space} (only atari:<Game> preprocesses frames)"
        return None
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
        return None
    if isinstance(space, spaces.Dict):
        return next((p for p in map(_obs_problem, space.spaces.values()) if p), None)
    if isinstance(space, spaces.Tuple):
        return next((p for p in map(_obs_problem, space.spaces) if p), None)
    return f"observation space {space}"


def observation_flattener(name: str, space) -> tuple[int, Callable[[object], np.ndarray]]:
    """(flat size, obs -> fresh float32 vector) for ``space``; UnsupportedSpaceError otherwise."""
    from gymnasium import spaces

    problem = _obs_problem(space)
    if problem is not None:
        raise UnsupportedSpaceError(f"{name}: {problem} is not supported; observations may be {OBS_SUPPORTED}")
    if isinstance(space, spaces.Box):
        return int(np.prod(space.shape, dtype=np.int64)), lambda obs: np.array(obs, dtype=np.float32).reshape(-1)
    size = int(spaces.flatdim(space))
    return size, lambda obs: np.asarray(spaces.flatten(space, obs), dtype=np.float32).copy()


class ActionMap:
    """The agent's action (an index, or a [-1, 1] vector) -> the environment's."""

    def __init__(self, name: str, space):
        from gymnasium import spaces

        self.num_actions: int | None = None
        self.action_dim: int | None = None
        if isinstance(space, spaces.Discrete):
            self.num_actions, self._start = int(space.n), int(space.start)
        elif (
            isinstance(space, spaces.Box)
            and np.issubdtype(space.dtype, np.floating)
            and np.all(np.isfinite(space.low))
            and np.all(np.isfinite(space.high))
        ):
            self.action_dim = int(np.prod(space.shape, dtype=np.int64))
            self._low = np.asarray(space.low, np.float64).reshape(-1)
            self._high = np.asarray(space.high, np.float64).reshape(-1)
            self._shape, self._dtype = space.shape, space.dtype
        else:
            why = " (unbounded)" if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating) else ""
            raise UnsupportedSpaceError(
                f"{name}: action space {space}{why} is not supported; actions may be {ACTION_SUPPORTED}"
            )

    def discrete(self, index: int):
        return self._start + index

    def continuous(self, unit: np.ndarray) -> np.ndarray:
        from apexrl.envs.base import rescale_action

        return rescale_action(unit, self._low, self._high).astype(self._dtype).reshape(self._shape)
