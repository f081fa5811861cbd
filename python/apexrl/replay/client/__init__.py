"""The replay service's client side: :mod:`.replay_client` (ReplayClient, one server), :mod:`.sharded`
(ShardedReplayClient, several servers as one replay; ``connect`` picks the client), :mod:`.api` (the Replay
Protocols), the helpers written against them (:mod:`.sampler`, :mod:`.updater`, :mod:`.inserter`),
:mod:`.trajectory` (TrajectoryWriter) and :mod:`.dataset` (ReplayDataset, the one module that imports torch).
"""
