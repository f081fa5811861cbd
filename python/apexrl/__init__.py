"""apexrl: distributed prioritized experience replay (Ape-X) with a native lock-sharded replay store.

The store::

    from apexrl import PrioritizedStore
    store = PrioritizedStore(capacity=1_000_000, alpha=0.6, shards=8, eviction="fifo")
    keys = store.insert(priorities, items)
    batch = store.sample(512, beta=0.4)          # batch.keys, batch.weights, batch.items ...
    store.update_priorities(batch.keys, new_priorities)

A whole run, as ``apexrl run`` does it (keyword arguments named like its flags; see :mod:`apexrl.api`)::

    import apexrl
    result = apexrl.run(env="gym:CartPole-v1", actors=2, envs_per_actor=4, minutes=5)
    result.run_dir, result.exit_status, result.final_eval
"""

from __future__ import annotations

from apexrl._core import PrioritizedStore, SampleBatch, SnapshotError

__all__ = [
    "PrioritizedStore",
    "ReplayClient",
    "RunResult",
    "SampleBatch",
    "ShardedReplayClient",
    "SnapshotError",
    "__version__",
    "run",
]


def __getattr__(name: str):
    # The client pulls in pyzmq; import it on first use so `import apexrl` stays light.
    if name == "ReplayClient":
        from apexrl.replay.client.replay_client import ReplayClient

        return ReplayClient
    if name == "ShardedReplayClient":
        from apexrl.replay.client.sharded import ShardedReplayClient

        return ShardedReplayClient
    if name in ("run", "RunResult"):  # the launcher and the agents: imported on first use too
        from apexrl import api

        return getattr(api, name)
    raise AttributeError(f"module 'apexrl' has no attribute {name!r}")


__version__ = "0.1.0"
