"""The on-policy agents' replay path (``AgentDef.replay``): a queue of sequences, each popped once.

Actors: one :class:`~apexrl.replay.adders.SequenceAdder` per environment on the table ``default``, items of
``unroll + 1`` steps every ``unroll`` steps of the environment's stream (``end_of_episode_behavior="continue"``:
an item may hold the end of one episode and the start of the next, ``start_of_episode`` marks where), each step
with the behaviour policy's extras (``extras_per="step"``, :mod:`apexrl.agents.onpolicy.policy`): ``logp``,
``version`` and, where the loss needs them, its distribution's parameters. Consecutive items share one step,
which the earlier one only bootstraps from, so every step is trained exactly once; with the stream continuous,
each environment makes one item per ``unroll`` steps whatever its episodes do, which is what lets synchronous
actors wait for weights after each item (``ReplayPath.wait_for_weights``).

The table: FIFO, ``max_times_sampled=1`` (an item is removed when popped: never trained on twice) and a
``Queue`` limiter (inserts wait while it is full, so its size bounds how stale a popped item can be).

Learner: :func:`onpolicy_batch` turns popped items into the batch the learners take, with ``trained``: which
steps the loss trains on.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

from apexrl.agents.base import ReplayPath
from apexrl.replay.adders import SequenceAdder
from apexrl.replay.tables import Queue, TableConfig

if TYPE_CHECKING:
    from apexrl.agents.onpolicy.config import OnPolicyConfig
    from apexrl.envs import EnvSpec

__all__ = ["ONE_SERVER", "QUEUE_TABLE", "REPLAY", "make_adders", "onpolicy_batch"]

QUEUE_TABLE = TableConfig(
    name="default", sampler="fifo", remover="fifo", capacity=1_024, max_times_sampled=1, rate_limiter=Queue(64)
)
"""The default queue (a preset sets its own): 64 items, at most 8 learner batches of the default size."""

ONE_SERVER = (
    "an on-policy agent reads one queue: over several servers each holds its own queue, so the pop order, "
    "the staleness bound (K queues of the limiter's size) and the synchronous hand-over would all be per server"
)
"""Why the on-policy agents refuse ``--replay-servers K > 1`` (``ReplayPath.one_server``)."""


def make_adders(client: Any, table: str, env_spec: EnvSpec, config: OnPolicyConfig, num_envs: int) -> list[Any]:
    adders: list[Any] = []
    try:
        for _ in range(num_envs):
            adders.append(
                SequenceAdder(
                    client,
                    table,
                    config.unroll + 1,
                    config.unroll,
                    end_of_episode_behavior="continue",
                    extras_per="step",
                    start_of_episode=True,
                )
            )
    except BaseException:
        for adder in adders:
            adder.close()
        raise
    return adders


def onpolicy_batch(
    fields: Mapping[str, Any], mask: np.ndarray, extras: Mapping[str, Any], config: OnPolicyConfig
) -> dict[str, np.ndarray]:
    """Popped items ``(n, T)`` as the learners' batch: ``obs``, ``action``, ``reward``, ``discount``, ``trained``
    and every per-step extra of the behaviour policy by its name (``logp``, ``version``, ``logits`` or ``loc`` and
    ``scale``). Step ``t`` is ``trained`` where it and step ``t + 1`` are in the item and no episode starts at
    ``t + 1`` (step ``t`` is then an action, not an episode's last observation)."""
    mask = np.asarray(mask, bool)
    n, t = mask.shape
    if t != config.unroll + 1:
        raise ValueError(f"items of {t} steps, expected unroll + 1 = {config.unroll + 1}")
    start = np.asarray(fields["start_of_episode"], bool)
    trained = np.zeros((n, t), bool)
    trained[:, :-1] = mask[:, :-1] & mask[:, 1:] & ~start[:, 1:]
    out = {
        "obs": np.asarray(fields["obs"], np.float32),
        "action": np.asarray(fields["action"]),
        "reward": np.asarray(fields["reward"], np.float32),
        "discount": np.asarray(fields["discount"], np.float32),
        "trained": trained,
    }
    step_extras = fields["extras"]
    if not isinstance(step_extras, Mapping) or "logp" not in step_extras or "version" not in step_extras:
        raise KeyError("items without the behaviour policy's per-step extras logp and version")
    for name, value in step_extras.items():
        out[name] = np.asarray(value)
    return out


REPLAY = ReplayPath(
    reader="queue",
    tables=(QUEUE_TABLE,),
    make_adder=make_adders,
    make_batch=onpolicy_batch,
    steps_per_item=lambda config: config.unroll,
    one_server=ONE_SERVER,
    wait_for_weights=lambda config: bool(config.synchronous),
)
"""The replay path every on-policy agent declares (module docstring)."""
