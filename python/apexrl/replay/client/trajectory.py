"""TrajectoryWriter: steps appended once, items that are step ranges.

``w = client.writer(max_sequence_length=T)``; ``w.append(step)`` (a mapping of arrays for one time step, nested
mappings allowed; the structure is fixed by the first append); ``w.create_item(table, num_timesteps, priority,
extras=None)`` makes an item of the last ``num_timesteps`` appended steps of the current episode;
``w.end_episode()``; ``w.flush(timeout=None)``; ``w.close()``; a context manager (``close`` on exit).

How the steps travel (docs/protocol.md, "Step chunks and sequence items"; docs/architecture.md, "Trajectories"):

* Steps are cut into *step chunks* of ``chunk_length`` consecutive steps of one episode (default
  ``min(10, max_sequence_length)``), each field a column, lz4-compressed where that pays
  (:mod:`apexrl.replay.wire.steps`). A chunk is closed when it is full, or early when an item needs its last
  steps (so a chunk may be shorter: items made every step give one-step chunks).
* An item references the chunks covering its steps. The first INSERT that needs a chunk carries it; the server
  stores it once and returns its chunk key; later items reference it by key while any item keeps it alive. The
  server holds no "open" chunk for a writer: the steps of the current window (the last ``max_sequence_length``
  steps, as closed chunks, plus the chunk being filled) live in this process.
* When the server answers STALE_CHUNKS (the chunk's last item was evicted or sampled away, or the server
  restarted, from a snapshot that does not hold it or without one), the writer forgets those keys and sends the
  chunks again in the same request: recovery without holes. Every request carries an insert id; a request that
  got no reply is sent again with the same id (exactly-once).
* Chunk keys are per table (each table has its own store): an item of a second table that references the same
  steps stores the chunks once more there. An item's chunks live on one shard of the table's store; where the
  chunks an item needs sit on two shards (items that did not overlap, then one that spans both), the writer sends
  the minority's chunks again.

Items are sent when ``flush_items`` of them are pending, at :meth:`flush` and at :meth:`close`; ``flush`` raises
what failed (the items stay pending, so another ``flush`` tries them again).
"""

from __future__ import annotations

import time
from collections import Counter, deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from apexrl.errors import ReplayTimeout, ServerTimeoutError, StaleChunksError
from apexrl.replay.client.inserter import InsertTooLargeError
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import steps as S

__all__ = ["TrajectoryWriter"]

_SHARD_MASK = 0xFF  # a chunk key's shard bits (cpp/apexrl/common.h)
_STALE_RETRIES = 4  # rebuilds after STALE_CHUNKS before giving up (each one re-sends every chunk it names)


@dataclass(eq=False)
class _Chunk:
    start: int  # the episode step of its first step
    length: int
    blob: bytes
    keys: dict[str, int] = field(default_factory=dict)  # table -> chunk key, while the server holds it


@dataclass
class _Pending:
    priority: float | None  # None: the table's largest priority so far (the INSERT's max-priority flag)
    item: bytes
    chunks: list[_Chunk]


class TrajectoryWriter:
    """See the module docstring. ``client_factory()`` gives the writer its own client (it is not thread-safe:
    use one writer per thread)."""

    def __init__(
        self,
        client_factory: Callable[[], Any],
        max_sequence_length: int,
        chunk_length: int | None = None,
        *,
        flush_items: int = 8,
        timeout: float | None = None,
    ):
        if not isinstance(max_sequence_length, int) or max_sequence_length < 1:
            raise ValueError(f"max_sequence_length must be an integer >= 1, got {max_sequence_length!r}")
        if chunk_length is None:
            chunk_length = min(10, max_sequence_length)
        if not isinstance(chunk_length, int) or chunk_length < 1:
            raise ValueError(f"chunk_length must be an integer >= 1, got {chunk_length!r}")
        if not isinstance(flush_items, int) or flush_items < 1:
            raise ValueError(f"flush_items must be an integer >= 1, got {flush_items!r}")
        self.max_sequence_length = max_sequence_length
        self.chunk_length = chunk_length
        self.flush_items = flush_items
        self.timeout = timeout  # the server-side rate-limiter wait of each INSERT (None: none)
        self._factory = client_factory
        self._client: Any = None
        self._fields: tuple[S.Field, ...] | None = None
        self._fingerprint = 0
        self._open: list[dict[str, np.ndarray]] = []  # steps of the chunk being filled
        self._chunks: deque[_Chunk] = deque()  # closed chunks of the current episode within the window
        self._steps = 0  # steps appended in the current episode
        self._pending: dict[str, list[_Pending]] = {}
        self._closed = False
        # Counters: bytes of chunks and items sent (each attempt that reached the server and stored), and resends.
        self.chunk_bytes_sent = 0
        self.item_bytes_sent = 0
        self.chunks_resent = 0
        self.items_created = 0

    # ------------------------------------------------------------------------------------------- steps

    def append(self, step: Mapping[str, Any]) -> None:
        """Append one time step (a mapping of arrays, nested mappings allowed). The first append fixes the step
        structure; a step of another structure is refused (ValueError naming the field), changing nothing."""
        self._check_open()
        leaves = S.flatten(step)
        if self._fields is None:
            fields = S.structure_of(leaves)
            self._fields = fields
            self._fingerprint = S.structure_fingerprint(fields)
        else:
            self._check_structure(leaves)
        self._open.append({p: np.array(a, copy=True) for p, a in leaves.items()})
        self._steps += 1
        if len(self._open) >= self.chunk_length:
            self._close_chunk()

    def _check_structure(self, leaves: Mapping[str, np.ndarray]) -> None:
        assert self._fields is not None
        want = {f.path: f for f in self._fields}
        for path in want:
            if path not in leaves:
                raise ValueError(f"step field {path!r} is missing (the first step fixed the structure)")
        for path, arr in leaves.items():
            f = want.get(path)
            if f is None:
                raise ValueError(f"step field {path!r} is not in the structure the first step fixed")
            if arr.shape != f.shape or np.dtype(arr.dtype).newbyteorder("<") != f.dtype:
                raise ValueError(
                    f"step field {path!r} is {arr.dtype}{list(arr.shape)}, the first step fixed "
                    f"{f.dtype}{list(f.shape)}"
                )

    def _close_chunk(self) -> None:
        if not self._open:
            return
        assert self._fields is not None
        columns = [np.stack([s[f.path] for s in self._open]) for f in self._fields]
        blob = S.encode_chunk(self._fields, columns, self._fingerprint)
        self._chunks.append(_Chunk(self._steps - len(self._open), len(self._open), blob))
        self._open = []
        # Chunks wholly before the window can no longer be referenced by a new item.
        while self._chunks and self._chunks[0].start + self._chunks[0].length <= self._steps - self.max_sequence_length:
            self._chunks.popleft()

    # ------------------------------------------------------------------------------------------- items

    def create_item(
        self, table: str, num_timesteps: int, priority: float | None, extras: Mapping[str, Any] | None = None
    ) -> None:
        """An item of ``table`` made of the last ``num_timesteps`` steps of the current episode (1 <=
        num_timesteps <= min(max_sequence_length, steps appended in the episode)), with ``priority`` (None: the
        table's largest priority so far, as ``client.insert(None, ...)``) and optional per-item ``extras`` (a
        mapping of arrays, stored once with the item)."""
        self._check_open()
        if not isinstance(table, str) or not table:
            raise ValueError(f"table must be a table's name, got {table!r}")
        if not isinstance(num_timesteps, (int, np.integer)) or not 1 <= num_timesteps <= self.max_sequence_length:
            raise ValueError(
                f"num_timesteps must be in [1, max_sequence_length = {self.max_sequence_length}], got {num_timesteps!r}"
            )
        if num_timesteps > self._steps:
            raise ValueError(
                f"num_timesteps = {num_timesteps}, but the current episode has {self._steps} steps appended"
            )
        if priority is not None:  # None: the table's largest priority so far, as client.insert(None, ...)
            priority = float(priority)
            if not (np.isfinite(priority) and priority >= 0):
                raise ValueError(f"priority must be None or finite and >= 0, got {priority}")
        extra_leaves = S.flatten(extras, "extras") if extras is not None else None
        self._close_chunk()  # the item needs the steps of the chunk being filled: close it early
        begin = self._steps - int(num_timesteps)
        chunks = [c for c in self._chunks if c.start + c.length > begin]
        first = begin - chunks[0].start
        item = S.encode_item(self._fingerprint, first, int(num_timesteps), self.max_sequence_length, extra_leaves)
        self._pending.setdefault(table, []).append(_Pending(priority, item, chunks))
        self.items_created += 1
        if len(self._pending[table]) >= self.flush_items:
            self._send_table(table, None)

    def end_episode(self) -> None:
        """End the current episode: the next append starts a new one (its items never reach back into this one).
        Items already created stay pending until sent."""
        self._check_open()
        self._open = []
        self._chunks.clear()
        self._steps = 0

    # ------------------------------------------------------------------------------------------- sending

    def flush(self, timeout: float | None = None) -> None:
        """Send every pending item; returns when all are stored. Raises what failed (ReplayTimeout when the
        server did not answer within ``timeout`` seconds, default: the client's timeout per attempt, retried
        until then; a ServerError for a refusal); the items that were not stored stay pending."""
        self._check_open()
        deadline = None if timeout is None else time.monotonic() + float(timeout)
        for table in list(self._pending):
            self._send_table(table, deadline)

    def close(self) -> None:
        """Flush and release the connection (also when the flush raises, which it re-raises)."""
        if self._closed:
            return
        try:
            if any(self._pending.values()):
                self.flush()
        finally:
            self._closed = True
            if self._client is not None:
                self._client.close()
                self._client = None

    def discard(self) -> int:
        """Drop the pending items (not sent, or sent without a reply) on purpose, e.g. when giving up on a server
        that is gone, so that ``close`` does not send them again; returns how many. The steps of the current
        episode stay: items created later still reference them."""
        n = self.pending_items
        self._pending.clear()
        return n

    def __enter__(self) -> TrajectoryWriter:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    @property
    def pending_items(self) -> int:
        return sum(len(v) for v in self._pending.values())

    def _check_open(self) -> None:
        if self._closed:
            raise RuntimeError("this TrajectoryWriter is closed")

    def _connection(self) -> Any:
        if self._client is None:
            self._client = self._factory()
        return self._client

    def _send_table(self, table: str, deadline: float | None) -> None:
        """Send the table's pending items, oldest first, as many per request as fit the server's size limit; each
        request's items leave the queue as soon as they are stored (a later failure never sends them twice)."""
        pending = self._pending.get(table)
        while pending:
            # One request's items either all have priorities or all take the table's largest (one INSERT flag).
            default = pending[0].priority is None
            count = next((i for i, p in enumerate(pending) if (p.priority is None) != default), len(pending))
            while True:
                try:
                    self._send(table, pending[:count], deadline)
                    break
                except InsertTooLargeError:
                    if count == 1:
                        raise
                    count = (count + 1) // 2
            del pending[:count]

    def _send(self, table: str, items: list[_Pending], deadline: float | None) -> None:
        """One INSERT of ``items`` into ``table``: rebuilt after STALE_CHUNKS, re-sent with its insert id when no
        reply came (or the rate limiter held it) until ``deadline`` (None: one client timeout's worth)."""
        client = self._connection()
        if deadline is None:
            deadline = time.monotonic() + max(client.timeout, 1.0) * 3
        for _rebuild in range(_STALE_RETRIES + 1):
            new, refs = self._plan(table, items)
            chunks = P.pack_chunks([c.blob for c in new], refs)
            insert_id = client.next_insert_id()
            while True:
                try:
                    _keys, chunk_keys = client._insert_with_chunk_keys(
                        None if items[0].priority is None else [p.priority for p in items],
                        [p.item for p in items],
                        chunks=chunks,
                        table=table,
                        timeout=self.timeout,
                        insert_id=insert_id,
                    )
                except StaleChunksError as e:
                    gone = set(e.keys) if e.complete else set()  # a partial list: forget every stored key
                    for it in items:
                        for c in it.chunks:
                            key = c.keys.get(table)
                            if key is not None and (not gone or key in gone):
                                del c.keys[table]
                                self.chunks_resent += 1
                    break  # rebuild with those chunks inline, under a new insert id (nothing was stored)
                except (ReplayTimeout, ServerTimeoutError):
                    if time.monotonic() >= deadline:
                        raise
                    continue  # the same request, the same insert id: stored once whatever happened to the first
                for c, key in zip(new, chunk_keys.tolist(), strict=True):
                    c.keys[table] = int(key)
                self.chunk_bytes_sent += sum(len(c.blob) for c in new)
                self.item_bytes_sent += sum(len(p.item) for p in items)
                return
        raise RuntimeError(f"INSERT into {table!r}: stored chunks kept going stale after {_STALE_RETRIES} re-sends")

    @staticmethod
    def _plan(table: str, items: list[_Pending]) -> tuple[list[_Chunk], list[list[int]]]:
        """The chunks to send with ``items`` and each item's references (an index into them, or a chunk key).
        The stored chunks must all be on one shard: the chunks on other shards than the most common one are sent
        again."""
        shards = Counter(c.keys[table] & _SHARD_MASK for it in items for c in it.chunks if table in c.keys)
        if len(shards) > 1:
            home = shards.most_common(1)[0][0]
            for it in items:
                for c in it.chunks:
                    if table in c.keys and c.keys[table] & _SHARD_MASK != home:
                        del c.keys[table]
        new: list[_Chunk] = []
        index: dict[int, int] = {}
        refs: list[list[int]] = []
        for it in items:
            r: list[int] = []
            for c in it.chunks:
                key = c.keys.get(table)
                if key is not None:
                    r.append(key)
                else:
                    if id(c) not in index:
                        index[id(c)] = len(new)
                        new.append(c)
                    r.append(index[id(c)])
            refs.append(r)
        return new, refs
