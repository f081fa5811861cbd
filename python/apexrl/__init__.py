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

__all__ = ["PrioritizedStore", "SampleBatch", "SnapshotError", "__version__"]
__version__ = "0.1.0"
