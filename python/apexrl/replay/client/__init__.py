"""The replay service's client side: :mod:`.replay_client` (ReplayClient, one server), :mod:`.sharded`
(ShardedReplayClient, several servers as one replay; ``connect`` picks the client), :mod:`.api` (the Replay
Protocols), the helpers written against them (:mod:`.sampler`, :mod:`.updater`, :mod:`.inserter`) and
:mod:`.dataset` (ReplayDataset, the one module that imports torch).

``apexrl.replay.client`` was one module, now :mod:`.replay_client`: its names are importable from here as before.
"""

from __future__ import annotations

from apexrl.replay.client import replay_client as _replay_client
from apexrl.replay.client.replay_client import *  # noqa: F403 - the old module's public names
from apexrl.replay.client.replay_client import __all__ as __all__

# The rest of the old module's namespace (its helpers and what it imported), for code that imported them from here.
globals().update({k: v for k, v in vars(_replay_client).items() if not k.startswith("__") and k not in globals()})
