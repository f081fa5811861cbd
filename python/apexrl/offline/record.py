"""Recording the episodes an actor plays as a Minari dataset (``--record-dataset DIR``).

Layout: one Minari dataset per actor, ``DIR/actor<I>/`` (Minari's data directory: ``metadata.json`` and
``main_data.hdf5``), so actors never write the same file; ``minari.MinariDataset("DIR/actor0")`` opens one and
``apexrl run --offline DIR`` trains from all of them. An actor with K environments (``--envs-per-actor K``) keeps
one open episode per environment and writes each whole when it ends, so the episodes of its environments never
mix. A restarted actor (or a resumed run) appends to its dataset; one whose spaces differ is refused.

Each episode holds what the agent played, in the spaces of the apexrl environment (:func:`env_spaces`): the
observations the agent saw (T + 1 of them: the reset's and one per step, the last the episode's final one), the
actions it took (Discrete, or Box in [-1, 1] for continuous control), the training rewards (clipped to [-1, 1]
on Atari, as the learner sees them; the environment's own elsewhere), and terminations and truncations (time
limits are truncations). An episode still open when the actor stops is written with its last step truncated,
as the actor's n-step adder ends it. Observations are stored uncompressed (no JPEG: Minari's default for image
spaces is lossy).

Episodes are buffered and written every ``WRITE_EVERY_S`` seconds (and when the actor closes), so an actor
killed by SIGKILL loses the episodes it had not written yet (at most that many seconds of them).
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from apexrl.durable import make_private_dirs
from apexrl.offline import require_minari

__all__ = ["EpisodeRecorder", "WRITE_EVERY_S", "actor_dataset_dir", "check_recording", "env_spaces"]

WRITE_EVERY_S = 5.0
"""Seconds between writes of finished episodes to the dataset file."""


def actor_dataset_dir(root: str, index: int) -> str:
    """Actor ``index``'s dataset under ``--record-dataset`` ``root``."""
    return os.path.join(root, f"actor{index}")


def env_spaces(spec: Any) -> tuple[Any, Any]:
    """(observation space, action space) of an apexrl environment (an :class:`apexrl.envs.base.EnvSpec`), as
    gymnasium spaces: a Box of the observation's shape and dtype (0..255 for uint8, unbounded otherwise), and
    Discrete(num_actions) or Box(-1, 1, (action_dim,), float32)."""
    from gymnasium import spaces

    dtype = np.dtype(spec.obs_dtype)
    if dtype == np.uint8:
        obs = spaces.Box(0, 255, tuple(spec.obs_shape), np.uint8)
    else:
        obs = spaces.Box(-np.inf, np.inf, tuple(spec.obs_shape), dtype)
    if spec.num_actions is not None:
        return obs, spaces.Discrete(int(spec.num_actions))
    return obs, spaces.Box(-1.0, 1.0, (int(spec.action_dim),), np.float32)


def check_recording(root: str, spec: Any, num_actors: int) -> None:
    """Before a run starts: ValueError when an actor's directory under ``root`` holds something its recorder
    would refuse (another dataset's spaces, or files that are no Minari dataset)."""
    from minari.dataset.minari_storage import MinariStorage

    observation_space, action_space = env_spaces(spec)
    for index in range(num_actors):
        path = actor_dataset_dir(root, index)
        if not os.path.isdir(path) or not os.listdir(path):
            continue
        try:
            storage = MinariStorage.read(path)
        except Exception as e:  # noqa: BLE001 - Minari raises what h5py and json raise
            raise ValueError(
                f"--record-dataset: {path} holds no readable Minari dataset: {type(e).__name__}: {e}"
            ) from None
        if storage.observation_space != observation_space or storage.action_space != action_space:
            raise ValueError(
                f"--record-dataset: {path} holds episodes of other spaces (observations "
                f"{storage.observation_space}, actions {storage.action_space}; {spec.name} has "
                f"{observation_space}, {action_space}): choose another DIR"
            )


def _dataset_id(env: str, index: int) -> str:
    name = re.sub(r"[^A-Za-z0-9_]+", "_", env).strip("_") or "env"
    return f"apexrl/{name}_actor{index}-v0"


class EpisodeRecorder:
    """Actor ``index``'s episodes, K environments at a time, into ``actor_dataset_dir(root, index)``.

    Call :meth:`start` with an environment's first observation, :meth:`step` after every step of the K
    environments, :meth:`start` again for those whose episode ended, and :meth:`close` at the end.

    Raises:
      ImportError: Minari (the ``offline`` extra) is not installed.
      ValueError: the directory holds a dataset with other spaces, or something that is not a dataset.
    """

    def __init__(self, root: str, index: int, spec: Any, num_envs: int):
        require_minari()
        from minari import __version__ as minari_version
        from minari.dataset.minari_storage import MinariStorage

        self.path = actor_dataset_dir(root, index)
        self.observation_space, self.action_space = env_spaces(spec)
        make_private_dirs(self.path)
        if os.path.exists(os.path.join(self.path, "metadata.json")):
            try:
                self.storage = MinariStorage.read(self.path)
            except Exception as e:  # noqa: BLE001 - Minari raises what h5py and json raise
                raise ValueError(
                    f"--record-dataset: {self.path} holds no readable Minari dataset: {type(e).__name__}: {e}"
                ) from None
            if (
                self.storage.observation_space != self.observation_space
                or self.storage.action_space != self.action_space
            ):
                raise ValueError(
                    f"--record-dataset: {self.path} holds episodes of other spaces (observations "
                    f"{self.storage.observation_space}, actions {self.storage.action_space}; this "
                    f"actor plays {self.observation_space}, {self.action_space}): choose another DIR"
                )
        else:
            if os.listdir(self.path):
                raise ValueError(f"--record-dataset: {self.path} is not empty and holds no Minari dataset")
            self.storage = MinariStorage.new(
                self.path, self.observation_space, self.action_space, data_format="hdf5", jpeg_encoding=False
            )
            self.storage.update_metadata(
                {
                    "dataset_id": _dataset_id(spec.name, index),
                    "minari_version": minari_version,
                    "algorithm_name": "apexrl actor (exploration policy)",
                }
            )
        self._obs: list[list[np.ndarray]] = [[] for _ in range(num_envs)]
        self._act: list[list[Any]] = [[] for _ in range(num_envs)]
        self._rew: list[list[float]] = [[] for _ in range(num_envs)]
        self._term: list[list[bool]] = [[] for _ in range(num_envs)]
        self._trunc: list[list[bool]] = [[] for _ in range(num_envs)]
        self._done: list[Any] = []  # finished EpisodeBuffers not yet written
        self._written_at = time.monotonic()
        self.episodes = 0
        """Episodes written so far by this recorder."""

    def start(self, env: int, obs: np.ndarray) -> None:
        """Environment ``env`` begins an episode at ``obs``."""
        self._obs[env] = [np.array(obs, copy=True)]
        self._act[env], self._rew[env], self._term[env], self._trunc[env] = [], [], [], []

    def step(
        self, actions: Any, rewards: Any, next_obs: Sequence[np.ndarray] | np.ndarray, terminated: Any, truncated: Any
    ) -> None:
        """One step of every environment: ``next_obs[j]`` is environment j's observation after it (the final one
        where its episode ended). Ended episodes are queued; call :meth:`start` for them before the next step."""
        for j in range(len(self._obs)):
            self._obs[j].append(np.array(next_obs[j], copy=True))
            self._act[j].append(actions[j])
            self._rew[j].append(float(rewards[j]))
            self._term[j].append(bool(terminated[j]))
            self._trunc[j].append(bool(truncated[j]))
            if self._term[j][-1] or self._trunc[j][-1]:
                self._finish(j)
        if self._done and time.monotonic() - self._written_at >= WRITE_EVERY_S:
            self.write()

    def _finish(self, j: int) -> None:
        from minari.data_collector.episode_buffer import EpisodeBuffer

        if self._rew[j]:
            act = np.asarray(self._act[j], dtype=self.action_space.dtype)
            self._done.append(
                EpisodeBuffer(
                    observations=np.stack(self._obs[j]),
                    actions=act,
                    rewards=np.asarray(self._rew[j], np.float64),
                    terminations=np.asarray(self._term[j], bool),
                    truncations=np.asarray(self._trunc[j], bool),
                )
            )
        self._obs[j], self._act[j], self._rew[j], self._term[j], self._trunc[j] = [], [], [], [], []

    def write(self) -> None:
        """Write the finished episodes now."""
        if self._done:
            self.storage.update_episodes(self._done)
            self.episodes += len(self._done)
            self._done = []
        self._written_at = time.monotonic()

    def close(self) -> None:
        """End the open episodes as truncations (an episode with no step is dropped) and write everything."""
        for j in range(len(self._obs)):
            if self._rew[j]:
                self._trunc[j][-1] = True
            self._finish(j)
        self.write()
