"""apexrl: distributed prioritized experience replay (Ape-X) with a native lock-sharded replay store.

The store::

    from apexrl import PrioritizedStore
    store = PrioritizedStore(capacity=1_000_000, alpha=0.6, shards=8, eviction="fifo")
    keys = store.insert(priorities, items)
    batch = store.sample(512, beta=0.4)          # batch.keys, batch.weights, batch.items ...
    store.update_priorities(batch.keys, new_priorities)
"""

from __future__ import annotations

from apexrl._core import PrioritizedStore, SampleBatch, SnapshotError

__all__ = ["PrioritizedStore", "ReplayClient", "SampleBatch", "ShardedReplayClient", "SnapshotError", "__version__"]


def __getattr__(name: str):
    # The client pulls in pyzmq; import it on first use so `import apexrl` stays light.
    if name == "ReplayClient":
        from apexrl.replay.client import ReplayClient

        return ReplayClient
    if name == "ShardedReplayClient":
        from apexrl.replay.sharded import ShardedReplayClient

        return ShardedReplayClient
    raise AttributeError(f"module 'apexrl' has no attribute {name!r}")
__version__ = "0.1.0"
