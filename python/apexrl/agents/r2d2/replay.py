"""R2D2's replay path (``AgentDef.replay``): what its actors write and how its learner reads.

Actors: one :class:`~apexrl.replay.adders.SequenceAdder` per environment on the table ``default``: items of
``R2D2Config.min_sequence_length`` steps (burn-in + trace + 1), a new one every ``sequence_period`` steps,
``pad_end_of_episode=False`` (the sampler's ``.mask`` pads an item cut by the episode's end; the learner trains
on no step where it is False). An item's extras are those of its first step: the recurrent state the policy held
when it acted on that step's observation, so the learner unrolls from exactly that state. Items go in at
priority None: the table's largest priority so far (the usual default for new experience, and what Acme's R2D2
does) -- the adder makes an item only once its steps are appended, without handing the sequence back. An item
of fewer than ``burn_in + 2`` steps (an episode's end cuts it short) holds no trained step: it is not made
(:class:`TrainableItems`; ``untrainable`` in the actor's counters), where the learner would only erase it.

Learner: :func:`sequence_batch` turns sampled items (``.fields``/``.mask``/``.extras``) into the batch of
:mod:`apexrl.agents.r2d2.sequences`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from apexrl.agents.base import ReplayPath
from apexrl.agents.r2d2.config import R2D2Config
from apexrl.replay.adders import SequenceAdder
from apexrl.replay.tables import TableConfig

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["REPLAY", "R2D2SequenceAdder", "TrainableItems", "TrainableItemsClient", "make_adders", "sequence_batch"]


class TrainableItems:
    """A trajectory writer that makes only items with a trained step: an item of fewer than burn_in + 2 steps
    (an episode's last item cut short by its end, or an episode shorter than that) holds none -- the learner would
    erase it as invalid (``R2D2Learner.invalid_items``) -- so it is not sent (counted in ``skipped``)."""

    def __init__(self, writer: Any, min_steps: int):
        self.writer, self.min_steps, self.skipped = writer, min_steps, 0

    def append(self, step: Any) -> None:
        self.writer.append(step)

    def create_item(self, table: str, num_timesteps: int, priority: float | None, extras: Any = None) -> None:
        if num_timesteps < self.min_steps:
            self.skipped += 1
            return
        self.writer.create_item(table, num_timesteps, priority, extras=extras)

    def end_episode(self) -> None:
        self.writer.end_episode()

    def flush(self, timeout: float | None = None) -> None:
        self.writer.flush(timeout=timeout)

    def close(self) -> None:
        self.writer.close()


class TrainableItemsClient:
    """What a SequenceAdder takes as its client: ``writer(...)`` makes the replay client's writer, wrapped."""

    def __init__(self, client: Any, min_steps: int):
        self.client, self.min_steps = client, min_steps
        self.made: TrainableItems | None = None

    def writer(self, max_sequence_length: int) -> TrainableItems:
        self.made = TrainableItems(self.client.writer(max_sequence_length=max_sequence_length), self.min_steps)
        return self.made


class R2D2SequenceAdder(SequenceAdder):
    """One environment's sequence adder (module docstring); its ``counters()`` count the items not made (no
    trained step) as ``skipped``."""

    def __init__(self, client: Any, table: str, config: R2D2Config):
        source = TrainableItemsClient(client, config.burn_in + 2)
        super().__init__(source, table, config.min_sequence_length, config.sequence_period, pad_end_of_episode=False)
        assert source.made is not None  # SequenceAdder makes its writer on construction
        self.items = source.made

    def counters(self) -> dict[str, int]:
        w = self.items.writer
        pending = int(w.pending_items)
        return {"stored": int(w.items_created) - pending, "pending": pending, "skipped": self.items.skipped}

    def discard(self) -> int:
        return int(self.items.writer.discard())


def make_adders(client: Any, table: str, env_spec: EnvSpec, config: R2D2Config, num_envs: int) -> list[Any]:
    adders: list[Any] = []
    try:
        for _ in range(num_envs):
            adders.append(R2D2SequenceAdder(client, table, config))
    except BaseException:
        for adder in adders:
            adder.close()
        raise
    return adders


def sequence_batch(
    fields: Mapping[str, Any], mask: np.ndarray, extras: Mapping[str, Any], length: int
) -> dict[str, np.ndarray]:
    """The R2D2 batch (:mod:`apexrl.agents.r2d2.sequences`) of sampled sequence items: the writer's steps
    ``{obs, action, reward, discount}`` (n, T, ...), ``mask`` (n, T) and extras ``{state_h, state_c}``; T is
    padded (mask False, discount 1) or cut to ``length``. When T is ``length`` the batch's ``obs`` is
    ``fields["obs"]`` itself (zero where the mask is False, as the sampler decodes it): the largest array is not
    copied again."""
    n, t = mask.shape
    obs = np.asarray(fields["obs"])
    out = {
        "obs": obs if t == length else np.zeros((n, length, *obs.shape[2:]), obs.dtype),
        "action": np.zeros((n, length), np.int32),
        "reward": np.zeros((n, length), np.float32),
        "discount": np.ones((n, length), np.float32),
        "mask": np.zeros((n, length), bool),
    }
    m = min(t, length)
    if t != length:
        out["obs"][:, :m] = obs[:, :m]
    out["action"][:, :m] = np.asarray(fields["action"])[:, :m]
    out["reward"][:, :m] = np.asarray(fields["reward"])[:, :m]
    out["discount"][:, :m] = np.where(mask[:, :m], np.asarray(fields["discount"])[:, :m], 1.0)
    out["mask"][:, :m] = mask[:, :m]
    out["state_h"] = np.ascontiguousarray(extras["state_h"], np.float32)
    out["state_c"] = np.ascontiguousarray(extras["state_c"], np.float32)
    return out


def _batch(fields: Mapping[str, Any], mask: np.ndarray, extras: Mapping[str, Any], config: R2D2Config) -> dict:
    return sequence_batch(fields, mask, extras, config.min_sequence_length)


REPLAY = ReplayPath(
    reader="sequences",
    # The paper's replay: 100,000 part-overlapping sequences, prioritized with exponent 0.9 (the presets' own
    # tables set it per preset; these are for a run without a preset for its environment).
    tables=(TableConfig(name="default", sampler="prioritized", remover="fifo", capacity=100_000, alpha=0.9),),
    make_adder=make_adders,
    make_batch=_batch,
    # A sequence item stands for the sequence_period new steps between consecutive items of an episode (an
    # estimate: an episode's last item is shorter).
    steps_per_item=lambda config: config.sequence_period,
    # Any number of replay servers: the sharded client keeps each environment's trajectory writer (its episode's
    # chunks) on one server, samples sequences from all of them by priority and routes the updates back.
)
"""R2D2's replay path (module docstring)."""
