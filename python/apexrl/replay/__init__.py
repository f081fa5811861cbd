"""The replay service: wire protocol, transition codec, the ZeroMQ replay server and its clients.

Never imports torch (a test checks it), except on first use of ``ReplayDataset`` (a torch dataset): a replay
server, or a tool that only talks to one, starts in a fraction of a second and runs where torch is not installed.

The names below are imported on first use, so that importing one submodule (``apexrl.replay.wire.schema``, which
``apexrl.errors`` imports) does not import the others (which import ``apexrl.errors``).
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = [
    "EndBehavior",
    "EpisodeAdder",
    "FieldSpec",
    "MinSize",
    "NStepTransitionAdder",
    "Queue",
    "ReplayClient",
    "ReplayDataset",
    "ReplayServer",
    "SampleToInsertRatio",
    "SampledBatch",
    "SequenceAdder",
    "ServerConfig",
    "ShardedReplayClient",
    "TableConfig",
    "TransitionAdder",
    "TrajectoryWriter",
    "TransitionSpec",
    "connect",
    "linear_beta",
    "load_tables",
    "rate_limiter_from_json",
]

_HOMES = {
    "FieldSpec": "apexrl.replay.wire.codec",
    "TransitionSpec": "apexrl.replay.wire.codec",
    "ReplayClient": "apexrl.replay.client.replay_client",
    "ReplayDataset": "apexrl.replay.client.dataset",  # the one name that imports torch
    "SampledBatch": "apexrl.replay.client.replay_client",
    "ReplayServer": "apexrl.replay.server",
    "ServerConfig": "apexrl.replay.server.config",
    "ShardedReplayClient": "apexrl.replay.client.sharded",
    "TrajectoryWriter": "apexrl.replay.client.trajectory",
    "connect": "apexrl.replay.client.sharded",
    "linear_beta": "apexrl.replay.client.beta",
    "MinSize": "apexrl.replay.tables",
    "Queue": "apexrl.replay.tables",
    "SampleToInsertRatio": "apexrl.replay.tables",
    "TableConfig": "apexrl.replay.tables",
    "load_tables": "apexrl.replay.tables",
    "rate_limiter_from_json": "apexrl.replay.tables",
    "EndBehavior": "apexrl.replay.adders",
    "EpisodeAdder": "apexrl.replay.adders",
    "NStepTransitionAdder": "apexrl.replay.adders",
    "SequenceAdder": "apexrl.replay.adders",
    "TransitionAdder": "apexrl.replay.adders",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'apexrl.replay' has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
