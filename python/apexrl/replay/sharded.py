"""Several replay servers as one prioritized replay: :class:`ShardedReplayClient`.

A placeholder module header; the client follows.
"""

from __future__ import annotations

from collections.abc import Sequence

from apexrl.replay.config import MAX_REPLAY_SERVERS

__all__ = ["max_lock_shards", "server_bits", "split_endpoints"]

KEY_SHARD_BITS = 8
"""Bits of a key naming its shard: the server's lock shard, and above it (sharded) the server."""


def split_endpoints(endpoints: str | Sequence[str]) -> list[str]:
    """Endpoints given as one comma-separated string (a config's ``replay``) or a sequence -> a list; ValueError
    for none, a repeat, or more than MAX_REPLAY_SERVERS."""
    items = endpoints.split(",") if isinstance(endpoints, str) else list(endpoints)
    items = [e.strip() for e in items if e.strip()]
    if not items:
        raise ValueError("no replay endpoint given")
    if len(set(items)) != len(items):
        raise ValueError(f"a replay endpoint is given twice: {items}")
    if len(items) > MAX_REPLAY_SERVERS:
        raise ValueError(f"at most {MAX_REPLAY_SERVERS} replay servers, got {len(items)}")
    return items


def server_bits(count: int) -> int:
    """Bits of a key's shard field that name the server among ``count`` (0 for one server)."""
    return (count - 1).bit_length()


def max_lock_shards(count: int) -> int:
    """Most lock shards (``--shards``) each of ``count`` servers may have: their keys share 8 bits with the
    server's index."""
    return 1 << (KEY_SHARD_BITS - server_bits(count))
