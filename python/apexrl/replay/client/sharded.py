"""Several replay servers as one prioritized replay: :class:`ShardedReplayClient`.

Sampling is **globally proportional**: a batch is distributed as one store holding every item of every server
would sample it. The n draws are split over the servers the way the store splits them over its lock shards --
the total mass sum_s T_s is cut into n equal segments with one uniform point in each, and a point in server
s's stretch is one of s's draws -- and each server then draws its share from its own sum-tree. The split uses
the totals each server reported with its previous reply (every SAMPLE reply carries the store's total mass,
smallest positive mass and size at the moment of sampling; a server that got no draws is asked for STATS at
most every ``REFRESH_S``). The probabilities and IS weights of the batch are recomputed from the totals that
came with it: item k of server s has mass m_k = P_s(k) * T_s, global probability m_k / sum_s T_s, and weight
(m_k / m_min)^-beta with m_min the smallest positive mass over all servers -- the weights of one store, which
the batch's own maximum does not normalise. With static stores the batch is exactly one store's sample; while
items arrive, the split lags their masses by one batch.

Keys carry the server that issued them: a server's keys use the low bits of the key's 8-bit shard field for
their lock shard, and the client puts the server's index into the high ``server_bits(K)`` bits (so each server
may have at most ``max_lock_shards(K)`` lock shards; a server with more is refused at its first reply). Updates
and erases are routed by those bits; a key naming no server is counted as not present, like a stale key.

Inserts go round robin over the servers that are up, a batch whole to one server; through :meth:`inserter`
they are pipelined, requests in flight to every server at once (the set is a PipelinedReplay). Retries of a batch (same
``insert_id``) go to the server its first attempt went to, so the server stores it once -- unless that server
stopped answering meanwhile: then the batch is sent to the next server, and it may end up stored twice
(at-least-once across a server's loss, never lost). The inserter with ``resend`` (an actor with several inserts
in flight) does the same: a server whose oldest pipelined insert expired unanswered is marked down
(:meth:`_insert_unanswered`), and the batches it held are resent to the others.

Losing a server degrades instead of stopping: a server that does not answer within the client timeout (or
says it is shutting down) is marked down (logged), its draws are redrawn from the others within the same call,
its keys' updates are skipped, and inserts avoid it. A down server is probed with a STATS request at most every
``retry_s`` seconds, without waiting for it (the probe is answered, or not, by the next call); once it answers
it takes part again. Rate limiting, ``min_size_to_sample`` and ``remove_to_fit`` stay per server: a SAMPLE
that one server holds back (TIMEOUT) fails the whole call with that error, as it would with one server.

Tables: a set serves one table on every server (``table``, default ``"default"``; each server resolves its name
to its own index); a call naming another table goes through a set of that table's, made on first use. A
prioritized or uniform table is sampled globally proportionally (uniformly: every item of every server alike)
as above. A FIFO, LIFO, heap or queue table is ordered **per server**: each server hands out its own items in
its table's order, and a batch is the servers' shares side by side, not one global order.

Trajectories: :meth:`writer` gives a TrajectoryWriter that lives on **one** server for its whole life (writers go
round robin over the servers up, in the order they are made), so an item's step chunks are all on its server
and an item never spans servers. Each writer keeps the single-server writer's guarantees on its server
(exactly-once inserts, ``flush`` raising what failed, STALE_CHUNKS recovery after a restart); it does not move
to another server when its own is lost (chunk keys are one server's): its ``flush`` raises until that server is
back, or the caller drops its items (``discard``). Sampling a sequence table merges the servers' parts and decodes
the merged batch once: ``.fields`` (n, T, ...), ``.mask`` (n, T) and ``.extras`` as from one server.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import secrets
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
import zmq

from apexrl.errors import (
    Interrupted,
    ReplayTimeout,
    ServerClosedError,
    ServerTimeoutError,
)
from apexrl.replay.client.beta import Beta
from apexrl.replay.client.inserter import PipelinedInserter
from apexrl.replay.client.replay_client import ReplayClient, SampledBatch, sampled_batch, sequences_of
from apexrl.replay.client.sampler import PrefetchingSampler, SlotDecoder
from apexrl.replay.client.updater import AsyncUpdater
from apexrl.replay.server.config import MAX_REPLAY_SERVERS
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.codec import TransitionSpec
from apexrl.replay.wire.schema import Status
from apexrl.security import ClientKeys

if TYPE_CHECKING:
    from apexrl.replay.client.trajectory import TrajectoryWriter

T = TypeVar("T")

__all__ = ["REFRESH_S", "ShardedReplayClient", "connect", "max_lock_shards", "server_bits", "split_endpoints"]

log = logging.getLogger("apexrl.replay.client.sharded")  # its name before the move to replay/client/

KEY_SHARD_BITS = 8
"""Bits of a key naming its shard: the server's lock shard, and above it (sharded) the server."""
REFRESH_S = 0.5
"""Oldest totals of a server that got no draws before it is asked for fresh ones (STATS, not waited for)."""
_ID_ROUTES = 4096  # insert ids whose server is remembered (a retry goes where its first attempt went)
_FLT_MIN = float(np.finfo(np.float32).tiny)
_MAX_STATS = frozenset({"max_item_bytes", "deferred_examined_max", "protocol_version", "spec_fingerprint"})
_FIRST_STATS = frozenset({"samples_per_insert", "error_buffer"})
_MIN_STATS = frozenset({"min_mass", "spec_declared"})
_OWN_STATS = frozenset({"epoch"})  # one server's, meaningless for the set


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


def connect(
    endpoints: str | Sequence[str],
    timeout: float = 10.0,
    *,
    spec: TransitionSpec | str | None = None,
    curve: ClientKeys | str | None = None,
    table: str = "default",
) -> ReplayClient | ShardedReplayClient:
    """A client of the replay at ``endpoints``: a :class:`ReplayClient` for one server, a
    :class:`ShardedReplayClient` for several (comma-separated or a sequence); ``table``: the table its calls
    use when they name none."""
    items = split_endpoints(endpoints)
    if len(items) == 1:
        return ReplayClient(items[0], timeout=timeout, spec=spec, curve=curve, table=table)
    return ShardedReplayClient(items, timeout=timeout, spec=spec, curve=curve, table=table)


@dataclass
class _Server:
    """One server of the set: its client and what the client last heard from it."""

    index: int
    client: ReplayClient
    table: str = "default"
    total_mass: float = 0.0
    min_mass: float = 0.0
    size: int = 0
    heard_at: float | None = None  # time.monotonic() of the totals; None: never heard from
    down_since: float | None = None
    probe: tuple[int, float] | None = None  # a STATS request not yet collected: (request id, sent at)
    probed_at: float = 0.0
    stats: dict[str, int | float] = field(default_factory=dict)  # the latest STATS reply

    @property
    def up(self) -> bool:
        return self.down_since is None

    def note(self, total_mass: float, min_mass: float, size: int) -> None:
        self.total_mass, self.min_mass, self.size = float(total_mass), float(min_mass), int(size)
        self.heard_at = time.monotonic()

    def note_stats(self, stats: dict[str, int | float]) -> None:
        self.stats = stats
        prefix = f"table.{self.table}."
        if prefix + "size" in stats:  # a server of tables: this table's totals
            self.note(
                float(stats[prefix + "total_mass"]), float(stats[prefix + "min_mass"]), int(stats[prefix + "size"])
            )
        else:
            self.note(float(stats["total_mass"]), float(stats["min_mass"]), int(stats["size"]))


def _is_loss(exc: BaseException) -> bool:
    """Whether an error means the server is gone (no answer, or shutting down), not that it refused or held
    the request back (a TIMEOUT reply is an answer)."""
    return isinstance(exc, (ReplayTimeout, ServerClosedError)) and not isinstance(exc, ServerTimeoutError)


class ShardedReplayClient:
    """One prioritized replay over the servers at ``endpoints`` (see the module docstring); a
    :class:`~apexrl.replay.client.api.Replay` and :class:`~apexrl.replay.client.api.Interruptible`.

    ``timeout``, ``spec`` and ``curve`` are each server client's (:class:`ReplayClient`); ``retry_s`` is how
    often a server that is down is probed; ``seed`` seeds the split of the draws (None: random).
    Thread-safety: calls are serialised by a lock; the helpers (:meth:`sampler`, :meth:`updater`) get clients
    of their own.
    """

    def __init__(
        self,
        endpoints: str | Sequence[str],
        timeout: float = 10.0,
        *,
        spec: TransitionSpec | str | None = None,
        curve: ClientKeys | str | None = None,
        retry_s: float = 1.0,
        seed: int | None = None,
        table: str = "default",
    ):
        items = split_endpoints(endpoints)
        if not isinstance(table, str) or not table:
            raise ValueError(f"table must be a table's name, got {table!r}")
        self.table = table
        self._others: dict[str, ShardedReplayClient] = {}  # sets of the other tables named in calls
        if not retry_s > 0:
            raise ValueError(f"retry_s must be > 0 seconds, got {retry_s}")
        self.endpoints = items
        self.endpoint = ",".join(items)
        self.timeout = float(timeout)
        self.retry_s = float(retry_s)
        self._spec = spec
        self._curve = curve
        self._bits = server_bits(len(items))
        self._local_bits = KEY_SHARD_BITS - self._bits
        self._rng = np.random.default_rng(seed)
        self._lock = threading.RLock()
        self._session = secrets.randbits(64) or 1
        self._sequence = itertools.count(1)
        self._next_insert = 0
        self._next_writer = 0  # writers handed out (round robin over the servers up)
        self._routes: collections.OrderedDict[tuple[int, int], int] = collections.OrderedDict()
        self._servers: list[_Server] = []
        try:
            for i, endpoint in enumerate(items):
                client = ReplayClient(endpoint, timeout=timeout, spec=spec, curve=curve, table=table)
                self._servers.append(_Server(i, client, table))
        except BaseException:
            self.close()
            raise
        self._pipe_ids = itertools.count(1)  # request ids of pipelined inserts, over all servers
        self._pipe: dict[tuple[int, int], int] = {}  # (server index, its request id) -> the set's request id
        self._servers_lost = 0  # times a server was marked down
        self._redrawn = 0  # draws of a lost server redrawn from the others

    # ------------------------------------------------------------------------------------------ keys

    def _for(self, table: str | None) -> ShardedReplayClient | None:
        """The set serving ``table`` when it is another table than this set's (made on first use), else None."""
        if table is None or table == self.table:
            return None
        with self._lock:
            other = self._others.get(table)
            if other is None:
                other = self._others[table] = self._same_endpoints(table)
            return other

    def _ask(self, server: _Server, call: Callable[[ReplayClient], T]) -> tuple[T | None, BaseException | None]:
        """``(call(server.client), None)``, or ``(None, the loss)`` when the server is lost on the way (it is then
        marked lost); any other error propagates."""
        try:
            return call(server.client), None
        except Interrupted:
            raise
        except Exception as exc:
            if not _is_loss(exc):
                raise
            self._lost(server, exc)
            return None, exc

    def _table_of(self, server: _Server) -> int | None:
        """The server's index of this set's table (its HELLO, asked once); None when the server is lost asking."""
        return self._ask(server, lambda client: client._table_index())[0]

    def _global_keys(self, index: int, keys: np.ndarray) -> np.ndarray:
        """A server's keys -> the set's (its index in the high bits of the shard field)."""
        keys = np.asarray(keys, dtype=np.uint64)
        local = keys & np.uint64(0xFF)
        if self._bits and keys.size and int(local.max()) >> self._local_bits:
            raise self._too_many_shards(index, f"issued a key of lock shard {int(local.max())}")
        return keys | np.uint64(index << self._local_bits)

    def _too_many_shards(self, index: int, what: str) -> ValueError:
        return ValueError(
            f"replay server {self.endpoints[index]} {what}: with {len(self.endpoints)} servers each "
            f"may have at most {1 << self._local_bits} lock shards (its --shards), since a key "
            "carries its server and lock shard in 8 bits"
        )

    def _heard(self, server: _Server, stats: dict[str, int | float]) -> None:
        """Note a server's STATS; ValueError when it has more lock shards than its keys leave room for."""
        shards = int(stats.get("num_shards", stats.get("shards", 1)))  # canonical name; older servers: shards
        if shards > 1 << self._local_bits:
            raise self._too_many_shards(server.index, f"has {shards} lock shards")
        server.note_stats(stats)

    def _route(self, keys: Any) -> tuple[np.ndarray, np.ndarray]:
        """The set's keys -> (server index of each, the server's own key)."""
        keys = np.ascontiguousarray(keys, dtype=np.uint64)
        if keys.ndim != 1:
            raise ValueError(f"keys must be a 1-d array, got shape {keys.shape}")
        servers = (keys & np.uint64(0xFF)) >> np.uint64(self._local_bits)
        mask = np.uint64(~(((1 << self._bits) - 1) << self._local_bits) & 0xFFFF_FFFF_FFFF_FFFF)
        return servers.astype(np.int64), keys & mask

    # ------------------------------------------------------------------------------------------ up and down

    def _lost(self, server: _Server, exc: BaseException) -> None:
        if server.up:
            server.down_since = server.probed_at = time.monotonic()
            self._servers_lost += 1
            live = sum(s.up for s in self._servers)
            log.warning(
                "replay server %s lost (%s); going on with %d of %d servers",
                server.client.endpoint,
                exc,
                live,
                len(self._servers),
            )
        server.probe = None

    def _back(self, server: _Server) -> None:
        if not server.up:
            log.warning(
                "replay server %s is back after %.1f s",
                server.client.endpoint,
                time.monotonic() - (server.down_since or 0.0),
            )
            server.down_since = None

    def _collect_probe(self, server: _Server) -> None:
        """Take a probe's reply if it has come (never waits); drop a probe unanswered for ``retry_s`` (reset: a
        new socket, and a new probe later)."""
        if server.probe is None:
            return
        rid, sent = server.probe
        try:
            stats = server.client._poll_stats(rid)
        except Interrupted:
            raise
        except Exception as exc:  # noqa: BLE001 - an error reply is still an answer: the server is there
            server.probe = None
            log.debug("probe of %s answered with %s", server.client.endpoint, exc)
            self._back(server)
            return
        if stats is not None:
            server.probe = None
            self._heard(server, stats)
            self._back(server)
        elif time.monotonic() - sent > max(self.retry_s, REFRESH_S) * 4:
            server.client.transport.reset()
            server.probe = None

    def _refresh(self, lagging: Sequence[_Server] = ()) -> None:
        """Collect the probes that came; probe each down server every ``retry_s`` and the ``lagging`` ones
        (probes are STATS requests nobody waits for)."""
        now = time.monotonic()
        for server in self._servers:
            self._collect_probe(server)
            due = (not server.up and now - server.probed_at >= self.retry_s) or (server.up and server in lagging)
            if due and server.probe is None:
                rid = server.client._try_stats()
                server.probed_at = now
                if rid is not None:
                    server.probe = rid, now

    def _scatter(
        self, requests: Sequence[tuple[_Server, P.Op, Callable[[int], list[Any]], float]]
    ) -> list[tuple[_Server, P.Reply]]:
        """Send each ``(server, op, build, wait_s)`` request, then collect the replies (the waits overlap) -> the
        replies of the servers that answered. A server that does not answer is marked down and left out; the
        first refusal (an error reply, TIMEOUT included) is raised once every reply is in."""
        pending = []
        for server, op, build, wait_s in requests:
            sent, lost = self._ask(server, lambda client: client._send(build, op.name, wait_s))  # noqa: B023 (called now)
            if lost is None:
                assert sent is not None
                pending.append((server, op, *sent))
        got, error = [], None
        for server, op, rid, deadline in pending:
            try:
                got.append((server, server.client._receive(op, rid, deadline)))
            except Interrupted:
                raise
            except Exception as exc:  # noqa: BLE001 - sorted below: a lost server, else the first error, raised
                if _is_loss(exc):
                    self._lost(server, exc)
                elif error is None:
                    error = exc
        if error is not None:
            raise error
        return got

    def _stats_of(self, servers: Sequence[_Server]) -> None:
        """Ask ``servers`` for STATS and wait for the replies; one that does not answer is marked down."""
        for server in servers:
            server.probe = None
        for server, reply in self._scatter([(s, P.Op.STATS, P.encode_stats, 0.0) for s in servers]):
            assert reply.stats is not None
            self._heard(server, reply.stats)
            self._back(server)

    # ------------------------------------------------------------------------------------------ sample

    def _split(self, n: int, servers: list[_Server]) -> np.ndarray:
        """Draws per server: stratified over the total mass (one uniform point in each of n equal segments),
        over the sizes when every mass is 0 (uniform, as one store falls back to)."""
        weights = np.array([s.total_mass for s in servers], dtype=np.float64)
        if not weights.sum() > 0:
            weights = np.array([s.size for s in servers], dtype=np.float64)
        total = weights.sum()
        points = (np.arange(n) + self._rng.random(n)) * (total / n)
        bounds = np.cumsum(weights)
        bounds[-1] = np.inf  # rounding past the last bound: the last server (with weight > 0, below)
        which = np.searchsorted(bounds, points, side="right")
        last = int(np.flatnonzero(weights > 0)[-1])
        which = np.minimum(which, last)
        return np.bincount(which, minlength=len(servers))

    def _live(self) -> list[_Server]:
        live = [s for s in self._servers if s.up]
        unheard = [s for s in live if s.heard_at is None]
        if unheard:
            self._stats_of(unheard)
            live = [s for s in self._servers if s.up]
        return live

    def sample(
        self,
        n: int,
        beta: float = 0.4,
        timeout: float | None = None,
        *,
        table: str | None = None,
        sequences: bool = True,
    ) -> SampledBatch:
        """n items drawn globally proportionally over the servers -> a batch with the set's keys, global
        probabilities and IS weights (see the module docstring); arguments and errors as
        :meth:`ReplayClient.sample`. ReplayTimeout when no server is reachable."""
        other = self._for(table)
        if other is not None:
            return other.sample(n, beta, timeout, sequences=sequences)
        wait_s, timeout_ms = P.server_wait(timeout)
        P.encode_sample(0, n, beta, timeout_ms)  # validate before any request
        with self._lock:
            deadline = time.monotonic() + wait_s
            parts: list[tuple[_Server, SampledBatch]] = []
            missing = n
            while missing:
                self._refresh()
                live = self._live()
                if not live:
                    self._stats_of(self._servers)  # all down: ask them all once more, waiting
                    live = [s for s in self._servers if s.up]
                    if not live:
                        raise ReplayTimeout(f"no replay server of {self.endpoint} answered")
                if not any(s.size for s in live):
                    self._stats_of(live)
                    if not any(s.size for s in self._servers if s.up):
                        if time.monotonic() < deadline:
                            time.sleep(min(0.05, max(deadline - time.monotonic(), 0.0)))
                            continue
                        raise ServerTimeoutError(Status.TIMEOUT, f"every replay server of {self.endpoint} is empty")
                    continue
                counts = self._split(missing, live)
                got = self._scatter_sample(live, counts, beta, timeout)
                parts.extend(got)
                drawn = sum(len(b) for _s, b in got)
                if drawn and drawn < missing and self._short_batches(got):
                    break  # its servers handed out what they held: drawing again would wait for more
                if drawn < missing and parts:
                    self._redrawn += missing - drawn
                missing -= drawn
                self._refresh(
                    [
                        s
                        for s, c in zip(live, counts)
                        if c == 0 and s.heard_at is not None and time.monotonic() - s.heard_at > REFRESH_S
                    ]
                )
            return self._combine(parts, beta, sequences)

    def _short_batches(self, got: list[tuple[_Server, SampledBatch]]) -> bool:
        """Whether this set's table may answer a SAMPLE with fewer items than asked (an ordered sampler, or items
        handed out a limited number of times): then a short batch is returned as it is, since the items it
        holds have been handed out and must not be dropped while the call waits for more."""
        for server, _batch in got:
            for t in server.client.server_info.tables:
                if t.get("name") == self.table:
                    return t.get("sampler") not in ("prioritized", "uniform") or bool(t.get("max_times_sampled"))
        return False

    def _scatter_sample(
        self, live: list[_Server], counts: np.ndarray, beta: float, timeout: float | None
    ) -> list[tuple[_Server, SampledBatch]]:
        """Each server's draws (see :meth:`_scatter`: a server lost meanwhile contributes nothing, and the
        caller redraws its share)."""
        wait_s, timeout_ms = P.server_wait(timeout)
        requests = []
        for server, count in zip(live, counts):
            index = self._table_of(server) if count else None
            if index is not None:
                build = partial(P.encode_sample, n=int(count), beta=beta, timeout_ms=timeout_ms, table=index)
                requests.append((server, P.Op.SAMPLE, build, wait_s))
        got = []
        for server, reply in self._scatter(requests):
            batch = sampled_batch(reply, sequences=False)  # decoded once, merged (_combine)
            server.note(batch.total_mass, batch.min_mass, batch.size)
            got.append((server, batch))
        return got

    def _combine(self, parts: list[tuple[_Server, SampledBatch]], beta: float, sequences: bool = True) -> SampledBatch:
        """One batch from the servers' parts, with the set's keys, probabilities and weights (over the servers
        up, and any that gave a part before it was lost within this call)."""
        gave = {server.index for server, _batch in parts}
        live = [s for s in self._servers if s.up or s.index in gave]
        total = sum(s.total_mass for s in live)
        size = sum(s.size for s in live)
        positive = [s.min_mass for s in live if s.min_mass > 0 and s.total_mass > 0]
        min_mass = min(positive) if positive else 0.0
        keys, probabilities, weights, datas, offsets = [], [], [], [], []
        refs, ref_offsets, chunk_datas, chunk_offsets = [], [], [], []
        base = ref_base = chunk_base = chunk_count = 0
        with_chunks = any(batch.chunks is not None for _server, batch in parts)
        for server, batch in parts:
            keys.append(self._global_keys(server.index, batch.keys))
            p_local = np.asarray(batch.probabilities, dtype=np.float64)
            if total > 0 and batch.total_mass > 0:
                masses = p_local * batch.total_mass
                probabilities.append(masses / total)
                with np.errstate(divide="ignore"):
                    w = np.exp(beta * (math.log(min_mass) - np.log(masses))) if beta > 0 else np.ones_like(masses)
                weights.append(np.clip(np.where(masses > 0, w, 1.0), _FLT_MIN, 1.0))
            else:  # every mass 0: uniform over the items, weights 1
                probabilities.append(np.full(len(batch), 1.0 / max(size, 1)))
                weights.append(np.ones(len(batch)))
            data = memoryview(batch.data).cast("B")
            datas.append(data)
            offsets.append(np.asarray(batch.offsets[:-1], dtype=np.uint64) + np.uint64(base))
            base += data.nbytes
            if with_chunks:  # each server's chunks after the ones before, its references shifted to match
                fc = batch.frame_chunks
                refs.append(np.asarray(fc.item_chunks, dtype=np.uint64) + np.uint64(chunk_count))
                ref_offsets.append(np.asarray(fc.item_chunk_offsets[:-1], dtype=np.uint64) + np.uint64(ref_base))
                ref_base += int(fc.item_chunks.shape[0])
                cdata = memoryview(fc.chunk_data).cast("B")
                chunk_datas.append(cdata)
                chunk_offsets.append(np.asarray(fc.chunk_offsets[:-1], dtype=np.uint64) + np.uint64(chunk_base))
                chunk_base += cdata.nbytes
                chunk_count += int(fc.chunk_offsets.shape[0]) - 1
        offsets.append(np.array([base], dtype=np.uint64))
        chunks = None
        if with_chunks:
            ref_offsets.append(np.array([ref_base], dtype=np.uint64))
            chunk_offsets.append(np.array([chunk_base], dtype=np.uint64))
            chunks = P.FrameChunks(
                np.concatenate(refs),
                np.concatenate(ref_offsets),
                memoryview(b"".join(chunk_datas)),
                np.concatenate(chunk_offsets),
            )
        data_all, offsets_all = memoryview(b"".join(datas)), np.concatenate(offsets)
        return SampledBatch(
            np.concatenate(keys),
            np.concatenate(weights).astype(np.float32),
            np.concatenate(probabilities),
            data_all,
            offsets_all,
            total_mass=total,
            min_mass=min_mass,
            size=size,
            chunks=chunks,
            # Sequence items (every item's chunks are on its own server, so the merged chunks hold them all):
            # decoded once, from the merged batch, as one server's (T: the longest among all the items).
            sequences=sequences_of(data_all, offsets_all, chunks) if sequences else None,
        )

    # ------------------------------------------------------------------------------------------ insert

    def next_insert_id(self) -> tuple[int, int]:
        """A fresh insert id: pass it to every attempt of one batch (see the module docstring)."""
        return self._session, next(self._sequence)

    def _insert_target(self, insert_id: tuple[int, int]) -> _Server:
        index = self._routes.get(insert_id)
        if index is not None and self._servers[index].up:
            return self._servers[index]
        live = [s for s in self._servers if s.up] or self._servers  # all down: try them in turn anyway
        server = live[self._next_insert % len(live)]
        self._next_insert += 1
        self._routes[insert_id] = server.index
        self._routes.move_to_end(insert_id)
        while len(self._routes) > _ID_ROUTES:
            self._routes.popitem(last=False)
        return server

    def _insert_server(self, insert_id: tuple[int, int]) -> _Server:
        """The server a batch goes to, heard from at least once (its lock shards checked before it issues keys);
        ReplayTimeout when it does not answer that first contact."""
        self._refresh()
        server = self._insert_target(insert_id)
        if server.heard_at is None:
            self._stats_of([server])
            if not server.up:
                raise ReplayTimeout(f"replay server {server.client.endpoint} did not answer")
        return server

    def insert(
        self,
        priorities: Any,
        items: Sequence[Any] | None = None,
        *,
        data: Any = None,
        offsets: Any = None,
        timeout: float | None = None,
        insert_id: tuple[int, int] | None = None,
        chunks: P.FrameChunks | None = None,
        table: str | None = None,
    ) -> np.ndarray:
        """Insert a batch, whole, into one server (round robin over those up) -> the set's keys; arguments and
        errors as :meth:`ReplayClient.insert`. A server that does not answer is marked down and the error
        raised: retry with the same ``insert_id`` and the batch goes to another server."""
        other = self._for(table)
        if other is not None:
            return other.insert(
                priorities, items, data=data, offsets=offsets, timeout=timeout, insert_id=insert_id, chunks=chunks
            )
        with self._lock:
            insert_id = self.next_insert_id() if insert_id is None else insert_id
            server = self._insert_server(insert_id)
            try:
                keys = server.client.insert(
                    priorities, items, data=data, offsets=offsets, timeout=timeout, insert_id=insert_id, chunks=chunks
                )
            except Interrupted:
                raise
            except Exception as exc:
                if _is_loss(exc):
                    self._lost(server, exc)
                raise
            if not server.up:
                self._back(server)
            return self._global_keys(server.index, keys)

    # ------------------------------------------------ PipelinedReplay: the inserter's pipelined inserts, not the user's

    def _prepare_insert(
        self,
        priorities: Any,
        data: Any,
        offsets: Any,
        *,
        timeout: float | None = None,
        insert_id: tuple[int, int] | None = None,
        chunks: P.FrameChunks | None = None,
    ) -> tuple[int, list[Any]]:
        """Validate one insert and pick its server (round robin over those up, as :meth:`insert`) -> the message
        for :meth:`_send_insert`."""
        with self._lock:
            insert_id = self.next_insert_id() if insert_id is None else insert_id
            server = self._insert_server(insert_id)
            return server.index, server.client._prepare_insert(
                priorities, data, offsets, timeout=timeout, insert_id=insert_id, chunks=chunks
            )

    def _insert_limit(self) -> int:
        """The most bytes one INSERT may have on every server (the smallest announced limit)."""
        with self._lock:
            return min(s.client._insert_limit() for s in ([s for s in self._servers if s.up] or self._servers))

    def _send_insert(self, message: tuple[int, list[Any]]) -> tuple[int, int]:
        """Send a prepared insert to its server without waiting -> ``(the set's request id, items)``."""
        index, frames = message
        with self._lock:
            server = self._servers[index]
            try:
                rid, n = server.client._send_insert(frames)
            except ReplayTimeout as exc:
                self._lost(server, exc)
                raise
            pipe_id = next(self._pipe_ids)
            self._pipe[(index, rid)] = pipe_id
            return pipe_id, n

    def _receive_insert(self, wait: float) -> tuple[int, Any] | None:
        """The next reply of any server to a pipelined insert within ``wait`` seconds -> ``(the set's request
        id, the set's keys or the error)``; None if none came."""
        deadline = time.monotonic() + max(0.0, wait)
        with self._lock:
            while True:
                waiting = sorted({index for index, _rid in self._pipe})
                for index in waiting:
                    server = self._servers[index]
                    got = server.client._receive_insert(0)
                    if got is None:
                        continue
                    rid, result = got
                    pipe_id = self._pipe.pop((index, rid), None)
                    if pipe_id is None:
                        continue  # a late reply to a request forgotten meanwhile
                    if not isinstance(result, BaseException):
                        if not server.up:
                            self._back(server)
                        result = self._global_keys(index, result)
                    return pipe_id, result
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not waiting:
                    return None
                poller = zmq.Poller()
                for index in waiting:
                    sock = self._servers[index].client.transport.pollable()
                    if sock is not None:
                        poller.register(sock, zmq.POLLIN)
                poller.poll(max(1, int(remaining * 1000)))

    def _insert_unanswered(self, pipe_id: int) -> None:
        """A pipelined insert (the set's request id) went unanswered past the inserter's expiry: mark its server
        down, as :meth:`insert` does on a timeout, so that a resend of its batch (same insert id) goes to another
        server."""
        with self._lock:
            for (index, _rid), pid in self._pipe.items():
                if pid == pipe_id:
                    server = self._servers[index]
                    self._lost(server, ReplayTimeout(f"INSERT to {server.client.endpoint}: no reply in time"))
                    return

    def _forget_inserts(self) -> None:
        """Drop every insert reply still due, from every server (each client resets its connection)."""
        with self._lock:
            for index in sorted({index for index, _rid in self._pipe}):
                self._servers[index].client._forget_inserts()
            self._pipe.clear()

    # ------------------------------------------------------------------------------------------ by key

    def _by_server(
        self,
        op: P.Op,
        keys: np.ndarray,
        encode: Callable[[np.ndarray, np.ndarray | None, int], list[Any]],
        values: Any = None,
    ) -> int:
        """Send each server that is up its share of ``keys`` (and ``values``), ``encode(keys, values)`` -> the sum
        of the counts they answer; keys of a server that is down, or of none, count as not present."""
        servers, local = self._route(keys)
        values = None if values is None else np.asarray(values)
        requests = []
        for index in np.unique(servers).tolist():
            if 0 <= index < len(self._servers) and self._servers[index].up:
                table = self._table_of(self._servers[index])
                if table is None:
                    continue  # lost while asked for its tables: its keys count as not present
                mine = servers == index
                frames = encode(local[mine], None if values is None else values[mine], table)
                requests.append((self._servers[index], op, partial(P.with_request_id, frames), 0.0))
        return sum(int(reply.header.count) for _server, reply in self._scatter(requests))

    def update_priorities(self, keys: Any, priorities: Any, *, table: str | None = None) -> int:
        """New priorities, each sent to the server its key names -> how many keys were still present (those of
        a server that is down are skipped)."""
        other = self._for(table)
        if other is not None:
            return other.update_priorities(keys, priorities)
        keys_arr = np.ascontiguousarray(keys, dtype=np.uint64)
        P.encode_update(0, keys_arr, priorities)  # validate the whole batch before any request
        with self._lock:
            self._refresh()
            return self._by_server(
                P.Op.UPDATE_PRIORITIES, keys_arr, lambda k, v, t: P.encode_update(0, k, v, t), priorities
            )

    def erase(self, keys: Any, *, table: str | None = None) -> int:
        """Remove items by key, each at the server its key names -> how many were present."""
        other = self._for(table)
        if other is not None:
            return other.erase(keys)
        keys_arr = np.ascontiguousarray(keys, dtype=np.uint64)
        P.encode_erase(0, keys_arr)
        with self._lock:
            self._refresh()
            return self._by_server(P.Op.ERASE, keys_arr, lambda k, _v, t: P.encode_erase(0, k, t))

    def remove_to_fit(self, *, table: str | None = None) -> int:
        """Every server up evicts down to its own capacity -> how many were removed in all."""
        other = self._for(table)
        if other is not None:
            return other.remove_to_fit()
        with self._lock:
            self._refresh()
            requests = []
            for s in self._servers:
                index = self._table_of(s) if s.up else None
                if index is not None:
                    requests.append((s, P.Op.REMOVE_TO_FIT, partial(P.encode_remove_to_fit, table=index), 0.0))
            replies = self._scatter(requests)
            return sum(int(reply.header.count) for _server, reply in replies)

    def reset(self, table: str | None = None) -> int:
        """Empty ``table`` (None: this set's) on every server (Reverb's ``Client.reset``; see
        :meth:`ReplayClient.reset`) -> the items removed in all. Every server must take it: one that is down or
        lost on the way raises ReplayTimeout naming it and the servers that were emptied (a reset is not undone;
        call again once it is back). Under CURVE an actor may not (ServerError)."""
        other = self._for(table)
        if other is not None:
            return other.reset()
        counts = self._on_every_server("reset", lambda client: client.reset())
        return sum(counts)

    def checkpoint(self, timeout: float | None = None) -> list[str]:
        """Every server writes its snapshot now (Reverb's ``Client.checkpoint``; see
        :meth:`ReplayClient.checkpoint`) -> the paths, one per server in the order of :attr:`endpoints`, each on
        its server's machine. A server that is down or lost on the way raises ReplayTimeout naming it and the
        servers that did write theirs; ServerError as from one server (no ``--snapshot``, a failed save)."""
        return self._on_every_server("checkpoint", lambda client: client.checkpoint(timeout))

    def _on_every_server(self, what: str, call: Callable[[ReplayClient], T]) -> list[T]:
        """``call`` on each server in turn -> their answers; ReplayTimeout naming the servers that did not answer
        (down, or lost on the way) and those that did, once every server up was asked."""
        with self._lock:
            self._refresh()
            answers: list[T] = []
            missed: list[str] = []
            error: BaseException | None = None
            for server in self._servers:
                answer, lost = self._ask(server, call) if server.up else (None, None)
                if server.up and lost is None:
                    answers.append(answer)  # type: ignore[arg-type]  # None only with a loss
                else:
                    missed.append(self.endpoints[server.index])
                    error = lost or error
            if missed:
                done = [e for e in self.endpoints if e not in missed]
                raise ReplayTimeout(
                    f"{what} of table {self.table!r}: replay server(s) {', '.join(missed)} down or not answering; "
                    f"done on {', '.join(done) if done else 'none'}"
                ) from error
            return answers

    def tables(self) -> dict[str, dict[str, Any]]:
        """The tables of the first server that answers, as :meth:`ReplayClient.tables` (every server of a set is
        configured alike; sizes and counters are that server's)."""
        with self._lock:
            error: BaseException | None = None
            for server in [s for s in self._servers if s.up] or self._servers:
                tables, error = self._ask(server, lambda client: client.tables())
                if error is None:
                    assert tables is not None
                    return tables
            raise ReplayTimeout(f"no replay server of {self.endpoint} answered HELLO") from error

    def stats(self) -> dict[str, int | float]:
        """The servers' counters added up (a server that is down contributes its last known ones; maxima and
        minima where a sum means nothing), plus ``replay_servers``, ``replay_servers_up``,
        ``replay_servers_lost`` (times a server was marked down) and ``redrawn`` (draws of a lost server taken
        from the others). ReplayTimeout when no server answers."""
        with self._lock:
            self._refresh()
            self._stats_of([s for s in self._servers if s.up] or self._servers)
            if not any(s.up for s in self._servers):
                raise ReplayTimeout(f"no replay server of {self.endpoint} answered STATS")
            out: dict[str, int | float] = {}
            for server in self._servers:
                for key, value in server.stats.items():
                    if key in _OWN_STATS:
                        continue
                    if key not in out:
                        out[key] = value
                    elif key in _MAX_STATS:
                        out[key] = max(out[key], value)
                    elif key in _MIN_STATS:
                        out[key] = min(out[key], value)
                    elif key not in _FIRST_STATS:
                        out[key] += value
            out.update(
                replay_servers=len(self._servers),
                replay_servers_up=sum(s.up for s in self._servers),
                replay_servers_lost=self._servers_lost,
                redrawn=self._redrawn,
            )
            return out

    # ------------------------------------------------------------------------------------------ lifetime

    def interrupt(self) -> None:
        """From any thread: the call in progress and every later one raise Interrupted."""
        for server in self._servers:
            server.client.interrupt()

    def close(self) -> None:
        for other in list(getattr(self, "_others", {}).values()):
            other.close()
        for server in self._servers:
            server.client.close()

    @property
    def closed(self) -> bool:
        return all(server.client.closed for server in self._servers)

    def __enter__(self) -> ShardedReplayClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ helpers

    def _same_endpoints(self, table: str | None = None) -> ShardedReplayClient:
        same = table is None or table == self.table
        return ShardedReplayClient(
            self.endpoints,
            timeout=self.timeout,
            spec=self._spec if same else None,  # this set's spec is its own table's
            curve=self._curve,
            retry_s=self.retry_s,
            table=self.table if table is None else table,
        )

    def sampler(
        self,
        batch_size: int,
        beta: Beta = 0.4,
        prefetch: int = 16,
        decode: Callable[[SampledBatch], Any] | None = None,
        timeout: float | None = None,
        *,
        decoder: SlotDecoder | None = None,
        decode_threads: int = 1,
        sample_threads: int = 1,
        table: str | None = None,
    ) -> PrefetchingSampler:
        """A :class:`PrefetchingSampler` over the set (each sampling thread with clients of its own), as
        :meth:`ReplayClient.sampler`. Each thread's split of the draws follows the totals of its own previous
        reply; with ``sample_threads`` = the number of servers, a batch waiting for its slowest server no
        longer holds up the next one."""
        return PrefetchingSampler(
            partial(self._same_endpoints, table),
            batch_size,
            beta=beta,
            prefetch=prefetch,
            decode=decode,
            timeout=timeout,
            decoder=decoder,
            decode_threads=decode_threads,
            sample_threads=sample_threads,
        )

    def inserter(
        self,
        max_in_flight: int = 8,
        *,
        timeout: float | None = None,
        on_ack: Callable[[np.ndarray, float], Any] | None = None,
        resend: bool = False,
        on_retry: Callable[[BaseException, int], Any] | None = None,
        table: str | None = None,
    ) -> PipelinedInserter:
        """A :class:`PipelinedInserter` over the set (its own clients), as :meth:`ReplayClient.inserter`: up to
        ``max_in_flight`` inserts in flight, spread round robin over the servers."""
        return PipelinedInserter(
            partial(self._same_endpoints, table),
            max_in_flight=max_in_flight,
            timeout=timeout,
            on_ack=on_ack,
            client_timeout=self.timeout,
            resend=resend,
            on_retry=on_retry,
        )

    def updater(self, max_pending: int = 64, *, table: str | None = None) -> AsyncUpdater:
        """An :class:`AsyncUpdater` over the set (its own clients), as :meth:`ReplayClient.updater`."""
        return AsyncUpdater(partial(self._same_endpoints, table), max_pending=max_pending, close_timeout=self.timeout)

    def insert_episode(
        self,
        steps: Any,
        priorities: Any = None,
        *,
        chunk_length: int = 16,
        table: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Refused: a slices table (``TableConfig(kind="slices")``) is served by one server; insert its episodes
        and sample its windows with a :class:`~apexrl.replay.client.replay_client.ReplayClient` of that server."""
        raise NotImplementedError(
            "ShardedReplayClient does not serve slices tables: their episodes and windows live on one server; "
            "use ReplayClient(endpoint).insert_episode / sample on that server"
        )

    def writer(
        self,
        max_sequence_length: int,
        chunk_length: int | None = None,
        *,
        flush_items: int = 8,
        timeout: float | None = None,
    ) -> TrajectoryWriter:
        """A :class:`~apexrl.replay.client.trajectory.TrajectoryWriter` on one server of the set, as
        :meth:`ReplayClient.writer` (same arguments and guarantees, on that server): all its chunks and items
        go there, so an item never spans servers. Writers are spread round robin over the servers up, in the
        order they are made (an actor makes its writer once, so that is also the fewest writers per server; a
        writer's close is not reported to the set). The writer opens its connection at its first insert and
        keeps to its server when that one is lost (see the module docstring). It exposes no item keys; sampled
        items carry the set's keys."""
        from apexrl.replay.client.trajectory import TrajectoryWriter

        with self._lock:
            self._refresh()
            live = [s for s in self._servers if s.up] or self._servers  # all down: one of them anyway
            server = live[self._next_writer % len(live)]
            self._next_writer += 1
        return TrajectoryWriter(
            partial(
                _WriterClient,
                server.client.endpoint,
                max_shards=1 << self._local_bits,
                servers=len(self._servers),
                timeout=self.timeout,
                spec=self._spec,
                curve=self._curve,
                table=self.table,
            ),
            max_sequence_length,
            chunk_length,
            flush_items=flush_items,
            timeout=timeout,
        )


class _WriterClient(ReplayClient):
    """A writer's connection to its server of a set: before it inserts, the server's lock shards are checked
    against what the set's keys leave room for (as the set checks a server before its first insert), so that
    no item is stored whose key the set could not tell from another server's."""

    def __init__(self, endpoint: str, *, max_shards: int, servers: int, **kwargs: Any):
        super().__init__(endpoint, **kwargs)
        self._max_shards, self._servers = max_shards, servers

    def _insert_with_chunk_keys(self, *args: Any, **kwargs: Any) -> tuple[np.ndarray, np.ndarray]:
        shards = self.server_info.num_shards  # HELLO, asked once (and again after a timeout)
        if shards is not None and shards > self._max_shards:
            raise ValueError(
                f"replay server {self.endpoint} has {shards} lock shards: with {self._servers} servers each may "
                f"have at most {self._max_shards} lock shards (its --shards), since a key carries its server and "
                "lock shard in 8 bits"
            )
        return super()._insert_with_chunk_keys(*args, **kwargs)
