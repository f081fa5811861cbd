"""The apexrl replay client: the replay service's calls over one :class:`~apexrl.replay.wire.transport.Transport`.

* Every request carries a fresh request id; a reply with another id (a late answer to an earlier request
  that timed out) is discarded.
* A reply not received within ``timeout`` seconds raises :class:`~apexrl.errors.ReplayTimeout`, and the
  client closes its socket and opens a new one: stale replies can never confuse a later call, and a server
  that was restarted (same endpoint) is reached again by the next call.
* Error replies raise :class:`~apexrl.errors.ServerError` carrying the server's status and message; TIMEOUT
  raises :class:`ServerTimeoutError` (a ServerError *and* a ReplayTimeout) and SHUTTING_DOWN raises
  :class:`ServerShuttingDownError` (a ServerError *and* a ServerClosedError).

A ReplayClient is a :class:`~apexrl.replay.client.api.Replay` (and an Interruptible and a PipelinedReplay), so the
helpers it hands out -- :meth:`ReplayClient.sampler`, :meth:`ReplayClient.updater`,
:meth:`ReplayClient.inserter` -- are written against those Protocols and each get a client of their own.

Thread-safety: a client serialises its calls with a lock, so sharing one between threads is safe but the
calls then run one at a time. For throughput use one client per thread (each has its own socket).
"""

from __future__ import annotations

import functools
import itertools
import json
import secrets
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from apexrl.errors import (
    ProtocolError,
    ReplayTimeout,
    ServerError,
    ServerShuttingDownError,
    ServerTimeoutError,
    error_of,
)
from apexrl.replay.client.beta import Beta
from apexrl.replay.client.inserter import InsertTooLargeError, PipelinedInserter
from apexrl.replay.client.sampler import LearnerBatch, PrefetchingSampler, SlotDecoder
from apexrl.replay.client.updater import AsyncUpdater
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import steps as S
from apexrl.replay.wire import windows as W
from apexrl.replay.wire.codec import TransitionSpec
from apexrl.replay.wire.schema import peek_ids
from apexrl.replay.wire.structure import flatten, infer_spec, structure_mismatch, unflatten
from apexrl.replay.wire.transport import Transport, TransportClient
from apexrl.security import ClientKeys

if TYPE_CHECKING:
    from apexrl.replay.client.trajectory import TrajectoryWriter

__all__ = [
    "AsyncUpdater",
    "InsertTooLargeError",
    "LearnerBatch",
    "PipelinedInserter",
    "PrefetchingSampler",
    "ReplayClient",
    "SampledBatch",
    "ServerInfo",
    "ServerShuttingDownError",
    "ServerTimeoutError",
    "table_stats",
]


@dataclass
class SampledBatch:
    """A sampled batch; arrays are read-only views of the received frames (copy before mutating)."""

    keys: np.ndarray  # u64[n]
    weights: np.ndarray  # f32[n], importance-sampling weights normalised by the max
    probabilities: np.ndarray  # f64[n]
    data: memoryview  # the items concatenated
    offsets: np.ndarray  # u64[n+1]; item i is data[offsets[i]:offsets[i+1]]
    # The server's store when it drew the batch: probabilities[i] * total_mass is item i's mass p^alpha and
    # weights[i] = (mass_i / min_mass)^-beta; total_mass = min_mass = 0.0: uniform fallback (every mass 0,
    # probabilities 1 / size, weights 1). What a client sampling several servers combines them with.
    total_mass: float  # sum of p^alpha the draws were made from
    min_mass: float  # smallest positive mass, the weights' normaliser
    size: int  # items in the store
    # The frame chunks the items reference, each once (items without chunks: none, see P.FrameChunks).
    chunks: P.FrameChunks | None = None
    # The table's pinned item structure when the items are in it (ReplayClient.sample sets it from what its
    # client knows), else None; `fields` asks the server once more (_resolve) when it is None.
    spec: TransitionSpec | None = None
    _fields: dict[str, Any] | None = field(default=None, repr=False, compare=False)
    _resolve: Callable[[SampledBatch], TransitionSpec | None] | None = field(default=None, repr=False, compare=False)

    # Sequence items (a TrajectoryWriter's, protocol 6): the steps decoded (wire/steps.py, SequenceBatch). fields:
    # nested like the appended steps, arrays (n, T, ...); mask (n, T): valid steps; extras: arrays (n, ...);
    # sequences.valid: False for an item that could not be decoded. None for other items.
    sequences: S.SequenceBatch | None = None

    @property
    def fields(self) -> dict[str, Any]:
        """The items decoded into the table's structure: for a TrajectoryWriter's sequence items the appended
        steps' nesting with arrays (n, T, ...) (see ``mask`` and ``extras``); else the (nested) mapping of numpy
        arrays they were inserted as, each with leading dimension n, decoded natively (GIL released) on first
        access, then kept. ValueError when the table has no pinned structure or an item is not in it."""
        if self.sequences is not None:
            return self.sequences.fields
        if self._fields is None:
            if self.spec is None and self._resolve is not None:
                self.spec = self._resolve(self)  # the table may have been pinned since the client's last HELLO
            spec = self.spec
            if spec is None:
                raise ValueError(
                    "the batch's table has no pinned structure (no spec configured or declared, or its items are "
                    "not in it): read .data / .offsets"
                )
            flat = spec.decode_into(self.data, self.offsets, spec.empty_batch(len(self)))
            self._fields = unflatten(flat)
        return self._fields

    @property
    def mask(self) -> np.ndarray | None:
        """Sequence items: (n, T) bool, True on an item's valid steps; None for other items."""
        return None if self.sequences is None else self.sequences.mask

    @property
    def extras(self) -> dict[str, Any] | None:
        """Sequence items: the per-item extras, arrays (n, ...); None for other items."""
        return None if self.sequences is None else self.sequences.extras

    @property
    def items(self) -> list[memoryview]:
        return P.split_items(self.offsets, self.data)

    @property
    def frame_chunks(self) -> P.FrameChunks:
        """The batch's chunks (P.FrameChunks.none(n) when it has none)."""
        return self.chunks if self.chunks is not None else P.FrameChunks.none(len(self))

    def __len__(self) -> int:
        return int(self.keys.shape[0])


@dataclass(frozen=True)
class ServerInfo:
    """What a replay server announces in its HELLO reply."""

    protocol_version: int
    max_request_bytes: int
    max_reply_bytes: int
    spec: TransitionSpec | None  # the server's spec; None when it has none yet
    epoch: int | float | None = None
    num_shards: int | None = None  # the store's lock-shard count (servers since protocol version 3)
    tables: tuple[dict[str, Any], ...] = ()  # every table, in index order (protocol version 5)

    def table_index(self, name: str) -> int:
        """The index (the header's ``table`` field) of the table ``name``; ValueError naming the server's tables."""
        for t in self.tables:
            if t.get("name") == name:
                return int(t["index"])
        raise ValueError(f"the replay server has no table {name!r}; its tables: {[t.get('name') for t in self.tables]}")

    def table_spec(self, name: str) -> TransitionSpec | None:
        """The item structure pinned for the table ``name`` (HELLO's ``tables[i].spec``), None while it has none."""
        for t in self.tables:
            if t.get("name") == name:
                spec = t.get("spec")
                return TransitionSpec.from_json(json.dumps(spec)) if isinstance(spec, dict) else None
        raise ValueError(f"the replay server has no table {name!r}; its tables: {[t.get('name') for t in self.tables]}")


def _optional_int(value: int | float | None) -> int | None:
    return None if value is None else int(value)


def table_stats(stats: Mapping[str, Any], table: str) -> dict[str, Any]:
    """The counters of ``table`` in a STATS reply: its ``table.<name>.`` entries, without the prefix (the reply's
    own names describe the table ``default`` only). A reply with no table entries at all (a server before
    tables) -> the reply's own names; ValueError when it lists other tables but not this one."""
    prefix = f"table.{table}."
    out = {k[len(prefix) :]: v for k, v in stats.items() if k.startswith(prefix)}
    if not out:
        if any(k.startswith("table.") for k in stats):
            raise ValueError(f"the replay server has no table {table!r}")
        return dict(stats)
    return out


def sequences_of(
    data: Any, offsets: np.ndarray, chunks: P.FrameChunks | None, reuse: dict[str, np.ndarray] | None = None
) -> S.SequenceBatch | None:
    """A sampled batch's sequence items (a TrajectoryWriter's) or window items (a slices table's:
    ``windows.decode_window_items``) decoded natively; None when no item is either or the batch carries no
    chunks. One sequence item makes the batch one of sequences (any other item in it
    is invalid), so that an item of another kind drawn first cannot hide the sequences from the learner.
    ``reuse``: step arrays to decode into (``steps.decode_sequences``)."""
    if chunks is None:
        return None
    if W.is_window_reply(data, offsets):  # a slices table's windows: one native call, no header per chunk
        return W.decode_window_items(data, offsets, chunks, reuse)
    items = P.split_items(offsets, data)
    if not any(S.is_sequence_item(item) for item in items):
        return None
    return S.decode_sequences(
        items,
        chunks.chunks(),
        [chunks.refs(i) for i in range(len(items))],
        chunk_data=chunks.chunk_data,
        chunk_offsets=chunks.chunk_offsets,
        reuse=reuse,
    )


def sampled_batch(reply: P.Reply, *, sequences: bool = True) -> SampledBatch:
    """The SampledBatch of a SAMPLE OK reply; ``sequences=False`` leaves sequence items undecoded (a caller that
    merges several replies decodes the merged batch once: ShardedReplayClient)."""
    a = reply.arrays
    totals = a["totals"]
    chunks = None
    if a["item_chunks"].shape[0] or a["chunk_offsets"].shape[0] > 1:
        chunks = P.FrameChunks(a["item_chunks"], a["item_chunk_offsets"], a["chunk_data"], a["chunk_offsets"])
    return SampledBatch(
        a["keys"],
        a["weights"],
        a["probabilities"],
        a["data"],
        a["offsets"],
        float(totals[0]),
        float(totals[1]),
        int(a["store_size"][0]),
        chunks,
        sequences=sequences_of(a["data"], a["offsets"], chunks) if sequences else None,
    )


def _spec_json(spec: TransitionSpec | str | None) -> str:
    if spec is None:
        return ""
    if isinstance(spec, TransitionSpec):
        return spec.to_json()
    if isinstance(spec, str):
        return TransitionSpec.from_json(spec).to_json()  # ValueError for a bad one, before any request
    raise TypeError(f"spec must be a TransitionSpec, its JSON or None, got {type(spec).__name__}")


def _data_and_offsets(items: Sequence[Any] | None, data: Any, offsets: Any) -> tuple[Any, Any]:
    if items is not None:
        if data is not None or offsets is not None:
            raise ValueError("pass either items or data and offsets, not both")
        return P.pack_items(items)
    if data is None or offsets is None:
        raise ValueError("pass items, or both data and offsets")
    return data, offsets


class ReplayClient(TransportClient):
    """Client of an apexrl replay server at ``endpoint`` (e.g. ``tcp://127.0.0.1:5555``).

    ``timeout`` (seconds) bounds the wait for each reply (for ``insert`` / ``sample`` it is added to the
    server-side wait). ``curve`` (a key directory or :class:`~apexrl.security.ClientKeys`) turns on CURVE; the
    helpers' connections (sampler, updater, inserter) use the same keys. ``spec`` (a :class:`TransitionSpec` or its JSON) is declared to the server (HELLO)
    before the first insert, and again after a timeout (the server may have restarted); every insert
    first learns the server's request limit that way and refuses a bigger batch before sending it
    (:class:`InsertTooLargeError`).

    Inserts are exactly-once across retries: each batch gets an ``insert_id`` (this client's random session
    nonce, a sequence number); a retry of a batch must pass the id it was first sent with
    (``insert(..., insert_id=...)``, from :meth:`next_insert_id`), and the server then stores it only once.

    Tables: every data call takes ``table`` (a table's name; None: this client's ``table``, ``"default"``
    unless given). The name is resolved to the server's index once, from its HELLO reply (asked for again
    after a timeout). The helpers (:meth:`sampler`, :meth:`inserter`, :meth:`updater`) and
    :class:`ReplayDataset` work on one table each (their ``table``). :meth:`tables` lists the server's tables.

    Structured items: :meth:`insert` also takes a nested mapping of arrays (numpy, torch) with a leading batch
    dimension; each table pins one structure (a TransitionSpec, inferred from its first batch or declared with
    :meth:`hello`), and :meth:`sample` returns it as ``batch.fields``. ``insert(None, ...)``: the server gives
    each item the table's largest priority so far.
    """

    def __init__(
        self,
        endpoint: str,
        timeout: float = 10.0,
        *,
        spec: TransitionSpec | str | None = None,
        curve: ClientKeys | str | None = None,
        table: str = "default",
    ):
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if not isinstance(table, str) or not table:
            raise ValueError(f"table must be a table's name, got {table!r}")
        self.table = table
        self.endpoint = endpoint
        self.timeout = float(timeout)
        self._own_spec_json = _spec_json(spec)
        self._info: ServerInfo | None = None
        self._specs: dict[str, TransitionSpec | None] = {}  # tables' pinned specs, as the last HELLO told
        self._asked: set[str] = set()  # tables asked about again (a sampled item of an unknown spec) since then
        self._session = secrets.randbits(64) or 1
        self._sequence = itertools.count(1)
        self.transport = Transport(endpoint, name="replay client", curve=curve)

    # ------------------------------------------------------------------------------------------ calls

    def _call(self, op: P.Op, build: Callable[[int], list[Any]], wait: float) -> P.Reply:
        """Send build(request_id), wait up to ``wait`` seconds for its reply; the reply, or its error raised."""
        try:
            rid, frames = self.transport.request(build, wait, op.name)
        except ReplayTimeout:
            self._info = None  # the server may have restarted: declare the spec again before the next insert
            raise
        return self._decode(frames, op, rid)

    def _table_index(self, table: str | None = None) -> int:
        """The server's index of ``table`` (None: this client's); the first call asks the server (HELLO)."""
        name = self.table if table is None else table
        info = self.server_info
        if not info.tables and name == "default":  # pragma: no cover - a server always lists its tables
            return 0
        return info.table_index(name)

    def tables(self) -> dict[str, dict[str, Any]]:
        """The server's tables: name -> its configuration (HELLO: index, sampler, remover, capacity, max_size,
        alpha, alpha_evict, max_times_sampled, rate_limiter, ...), ``spec`` (its pinned item structure, the
        TransitionSpec JSON object; None until configured or declared, and always None for a table of sequence
        items, whose steps carry their own structure: a sample's ``fields`` shows it), its ``size`` and ``bytes_held`` and its
        counters (STATS: the ``table.<name>.`` entries, without the prefix)."""
        info = self.hello()
        stats = self.stats()
        out: dict[str, dict[str, Any]] = {}
        for t in info.tables:
            name = str(t["name"])
            out[name] = {**t, **table_stats(stats, name)}
        return out

    def _decode(self, frames: list[Any], op: P.Op, rid: int) -> P.Reply:
        """The reply in ``frames``, or its error raised (a malformed one resets the socket)."""
        try:
            reply = P.decode_reply(frames, op, rid)
        except ProtocolError:
            self.transport.reset()
            raise
        if not reply.ok:
            raise error_of(reply.status, reply.message or "")
        return reply

    def insert(
        self,
        priorities: Any,
        items: Sequence[Any] | Mapping[str, Any] | None = None,
        *,
        data: Any = None,
        offsets: Any = None,
        timeout: float | None = None,
        insert_id: tuple[int, int] | None = None,
        chunks: P.FrameChunks | None = None,
        table: str | None = None,
    ) -> np.ndarray:
        """Insert items with their priorities -> keys u64[n]. ``items``: a list of bytes-like, or ``data`` +
        ``offsets`` (encoded items, e.g. ``TransitionSpec.encode``'s), or a structured batch: a mapping (nested
        dicts allowed) of numpy arrays or torch tensors with a leading batch dimension n.

        Structured batches: nested keys become field names joined by ``.`` (``{"obs": {"pixels": x}}`` is the
        field ``obs.pixels``). The table's structure is a :class:`TransitionSpec`: the one configured
        (``TableConfig.spec``) or declared (:meth:`hello`), else inferred from this first batch (each field's
        dtype and ``shape[1:]``, uncompressed) and declared for the table, which pins it for every client. A
        batch that does not fit it raises ValueError naming the field and the difference (missing or extra
        field, dtype, shape), and nothing is sent. :meth:`sample` returns such items as ``batch.fields``.

        ``priorities``: f64[n], or None: each item gets the table's largest priority so far (given by an
        INSERT or UPDATE_PRIORITIES since the server started; 1.0 before any), chosen by the server.

        ``timeout``: seconds the server may hold the insert while the table's rate limiter blocks inserts
        (a ``SampleToInsertRatio`` whose inserters are too far ahead of the samplers, a ``Queue`` that is full);
        None (default) answers at once. Raises ServerTimeoutError (a ReplayTimeout) when the limiter did not
        let it through in time. ``insert_id``: the id of this batch's first
        attempt when retrying it (None: a new batch, a new id). InsertTooLargeError (nothing sent) when the
        request would be over the server's limit. ``chunks``: frame chunks the items reference
        (:func:`~apexrl.replay.wire.protocol.pack_chunks`), stored once and kept while an item references them.
        """
        if isinstance(items, Mapping):
            if data is not None or offsets is not None:
                raise ValueError("pass either items or data and offsets, not both")
            data, offsets = self._encode_structured(items, table)
        else:
            data, offsets = _data_and_offsets(items, data, offsets)
        wait_s, _ = P.server_wait(timeout)
        frames = self._prepare_insert(
            priorities, data, offsets, timeout=timeout, insert_id=insert_id, chunks=chunks, table=table
        )
        reply = self._call(P.Op.INSERT, lambda rid: P.with_request_id(frames, rid), self.timeout + wait_s)
        return reply.arrays["keys"]

    def _insert_with_chunk_keys(
        self,
        priorities: Any,
        items: Sequence[Any],
        *,
        chunks: P.FrameChunks,
        timeout: float | None = None,
        insert_id: tuple[int, int] | None = None,
        table: str | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The TrajectoryWriter's insert: :meth:`insert` with chunks whose references may be chunk keys of chunks
        stored earlier (protocol 6) -> (item keys u64[n], chunk keys u64[chunks]: the keys of this request's
        chunks, in its order).
        StaleChunksError (nothing stored) when a referenced stored chunk is gone."""
        data, offsets = _data_and_offsets(items, None, None)
        wait_s, _ = P.server_wait(timeout)
        frames = self._prepare_insert(
            priorities, data, offsets, timeout=timeout, insert_id=insert_id, chunks=chunks, table=table
        )
        reply = self._call(P.Op.INSERT, lambda rid: P.with_request_id(frames, rid), self.timeout + wait_s)
        return reply.arrays["keys"], reply.arrays["chunk_keys"]

    def writer(
        self,
        max_sequence_length: int,
        chunk_length: int | None = None,
        *,
        flush_items: int = 8,
        timeout: float | None = None,
    ) -> TrajectoryWriter:
        """A :class:`~apexrl.replay.client.trajectory.TrajectoryWriter`: append steps once, create items that are
        step ranges of the last ``max_sequence_length`` steps, in any table (``create_item(table, ...)``). It owns
        its own connection (same endpoint and timeout); ``chunk_length`` steps per chunk (default
        min(10, max_sequence_length)); ``timeout``: the server-side rate-limiter wait of its inserts."""
        from apexrl.replay.client.trajectory import TrajectoryWriter

        return TrajectoryWriter(
            self._same_endpoint,
            max_sequence_length,
            chunk_length,
            flush_items=flush_items,
            timeout=timeout,
        )

    def insert_episode(
        self,
        steps: Mapping[str, Any],
        priorities: Any = None,
        *,
        chunk_length: int = 16,
        table: str | None = None,
        timeout: float | None = None,
    ) -> int:
        """Insert one whole episode into a slices table (``TableConfig(kind="slices")``) -> its episode number (its
        windows' keys are ``(number << 24) | start``). ``steps`` maps each field (nested mappings allowed) to an
        array of the episode's n steps (leading dimension n), as :meth:`apexrl.replay.slices.SliceTable.insert_episode`
        takes it; it is sent once, as step chunks of ``chunk_length`` steps and one episode record
        (:mod:`apexrl.replay.wire.episodes`), in one INSERT with an insert id (retried exactly once).
        ``priorities``: one per step, one for every step, or None (the table's largest priority so far, 1 before
        any). ValueError for a malformed episode (nothing sent); the server refuses an episode it cannot take
        (INVALID_ARGUMENT: longer than the table, of another structure than its episodes', of more than 4096
        chunks) and stores nothing. :meth:`sample` on the table returns windows as sequences (``batch.fields``
        (n, burn_in + length, ...), ``batch.mask`` False past an episode's end); :meth:`update_priorities` takes
        one value per window key."""
        from apexrl.replay.wire.episodes import chunk_columns, encode_episode, episode_chunks

        if isinstance(chunk_length, bool) or not isinstance(chunk_length, int) or not 1 <= chunk_length < 1 << 24:
            raise ValueError(f"chunk_length must be an int in [1, 2^24), got {chunk_length!r}")
        name = self.table if table is None else table
        self.server_info.table_index(name)  # ValueError naming the server's tables
        kind = next(t.get("kind", "items") for t in self.server_info.tables if t.get("name") == name)
        if kind != "slices":  # a table of items would store the record as an item
            raise ValueError(
                f"insert_episode is for slices tables (TableConfig(kind='slices')); table {name!r} holds {kind}"
            )
        chunks, counts, fp = episode_chunks(steps, chunk_length)
        columns, _fields = chunk_columns(chunks)
        n = sum(counts)
        frame, per_step = None, None
        if priorities is not None:
            p = np.asarray(priorities, dtype=np.float64)
            if p.ndim == 0:
                frame = p.reshape(1)
            elif p.shape == (n,):
                frame, per_step = np.zeros(1), p  # the record's priorities stand; the frame's is not used
            else:
                raise ValueError(f"priorities must be one number or {n} (one per step), got shape {p.shape}")
            if not np.isfinite(p).all() or (p < 0).any():
                raise ValueError("priorities must be finite and >= 0")
        record = encode_episode(fp, counts, columns, per_step)
        packed = P.pack_chunks(chunks, [range(len(chunks))])
        keys = self.insert(frame, [record], chunks=packed, table=table, timeout=timeout)
        return int(keys[0])

    def next_insert_id(self) -> tuple[int, int]:
        """A fresh insert id (this client's session nonce, the next sequence number): pass it to every attempt
        of one batch."""
        return self._session, next(self._sequence)

    def _encode_structured(self, items: Mapping[str, Any], table: str | None = None) -> tuple[np.ndarray, np.ndarray]:
        """A structured batch (see :meth:`insert`) encoded in ``table``'s structure -> ``(data, offsets)``;
        pins the structure first when the table has none (HELLO). ValueError naming the field when the batch
        does not fit the table's structure."""
        name = self.table if table is None else table
        flat = flatten(items)
        spec = self._table_spec(name)
        if spec is None:
            spec = self._table_spec(name, ask=True)  # another client may have pinned it since our last HELLO
        if spec is None:
            inferred = infer_spec(flat)
            try:
                self.hello(inferred, table=name)
            except ServerError as exc:  # pinned by another client meanwhile: compare with theirs below
                if exc.status != P.Status.INVALID_ARGUMENT:
                    raise
            spec = self._table_spec(name, ask=True)
            if spec is None:  # pragma: no cover - the server pins or refuses
                raise ValueError(f"table {name!r}: the server did not pin a structure")
        why = structure_mismatch(spec, flat)
        if why is not None:
            raise ValueError(f"insert into table {name!r} refused, nothing sent: {why}")
        return spec.encode(flat)

    def _table_spec(self, name: str, *, ask: bool = False) -> TransitionSpec | None:
        """``name``'s pinned spec as the last HELLO told (``ask``: a new HELLO first)."""
        if ask:
            self.hello()
        info = self.server_info
        if name not in self._specs:
            self._specs[name] = info.table_spec(name)
        return self._specs[name]

    def _sampled_spec(self, name: str, batch: SampledBatch, *, ask: bool = False) -> TransitionSpec | None:
        """The spec ``batch``'s items are in: the table's pinned spec when the first item carries its fingerprint
        (``ask``: asking the server again, once per HELLO, when it does not: the table may have been pinned
        since). Without ``ask`` no request is sent: a sample costs what it always did."""
        offsets = batch.offsets
        if len(offsets) < 2 or int(offsets[1]) - int(offsets[0]) < 4:
            return None
        start = int(offsets[0])
        fingerprint = int.from_bytes(bytes(memoryview(batch.data).cast("B")[start : start + 4]), "little")
        spec = self._table_spec(name)
        if ask and (spec is None or spec.fingerprint != fingerprint) and name not in self._asked:
            spec = self._table_spec(name, ask=True)
            self._asked.add(name)
        return spec if spec is not None and spec.fingerprint == fingerprint else None

    def hello(self, spec: TransitionSpec | str | None = None, *, table: str | None = None) -> ServerInfo:
        """Declare ``spec`` (default: this client's) for ``table`` (default: this client's table, the one its
        inserts go to; ``"default"`` when the server has no such table) and learn the server's limits, tables
        and specs. Declaring pins the table's item structure when it has none; ServerError (INVALID_ARGUMENT,
        naming both) when it already has another."""
        spec_json = _spec_json(spec) if spec is not None else self._own_spec_json
        index = 0
        if spec_json:
            info = self._info if self._info is not None else self._hello(0, "")
            names = [t.get("name") for t in info.tables]
            if table is not None:
                index = info.table_index(table)
            elif self.table in names:
                index = info.table_index(self.table)
            elif "default" in names:
                index = info.table_index("default")
        elif table is not None:
            index = self.server_info.table_index(table)
        return self._hello(index, spec_json)

    def _hello(self, index: int, spec_json: str) -> ServerInfo:
        reply = self._call(P.Op.HELLO, lambda rid: P.encode_hello(rid, spec_json, index), self.timeout)
        info = reply.stats or {}
        text = reply.arrays["spec"]
        try:
            server_spec = TransitionSpec.from_json(text) if text else None
            tables = json.loads(reply.arrays["tables"])
            if not isinstance(tables, list) or not all(
                isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("index"), int)
                for t in tables
            ):
                raise ValueError("tables must be a list of objects with a name and an index")
            self._info = ServerInfo(
                int(info["protocol_version"]),
                int(info["max_request_bytes"]),
                int(info["max_reply_bytes"]),
                server_spec,
                info.get("epoch"),
                _optional_int(info.get("num_shards")),
                tuple(tables),
            )
            self._specs, self._asked = {}, set()
        except (KeyError, TypeError, ValueError) as exc:
            self.transport.reset()
            raise ProtocolError(P.Status.BAD_MESSAGE, f"HELLO reply: {type(exc).__name__}: {exc}") from None
        return self._info

    @property
    def server_info(self) -> ServerInfo:
        """The server's HELLO answer (asked for once, and again after a timeout)."""
        return self._info if self._info is not None else self.hello()

    def erase(self, keys: Any, *, table: str | None = None) -> int:
        """Remove items by key (e.g. ones a learner could not decode); returns how many were present. Keys of
        another table are not present in this one."""
        frames = P.encode_erase(0, keys, self._table_index(table))  # validate before touching the socket
        reply = self._call(P.Op.ERASE, lambda rid: P.with_request_id(frames, rid), self.timeout)
        return int(reply.header.count)

    def _check_size(self, frames: list[Any]) -> None:
        limit = self.server_info.max_request_bytes
        size = P.message_bytes(frames)
        if size > limit:
            n = memoryview(frames[1]).nbytes // 8
            raise InsertTooLargeError(
                f"INSERT of {n} items is {size} bytes, over the server's limit of {limit} bytes "
                "(its --max-message-mb): split the batch"
            )

    def sample(
        self,
        n: int,
        beta: float = 0.4,
        timeout: float | None = None,
        *,
        table: str | None = None,
        sequences: bool = True,
    ) -> SampledBatch:
        """Sample n items with IS exponent beta. On a table with a pinned structure, ``batch.fields`` is the
        items decoded into it (the nested mapping they were inserted as, numpy arrays with leading dimension n).

        ``timeout``: seconds the server may hold the sample while the table's rate limiter blocks samples (fewer
        items than its min_size_to_sample, a ``SampleToInsertRatio`` whose samplers are too far ahead of the
        inserters, an empty ``Queue``); None (default) answers at once. Raises ServerTimeoutError (a
        ReplayTimeout) when the limiter did not let it through in time.

        ``sequences=False`` leaves a TrajectoryWriter's sequence items undecoded (``batch.sequences`` None), for a
        sampler's decode thread to decode into a batch of its ring (:func:`sequences_of` with ``reuse``).
        """
        wait_s, timeout_ms = P.server_wait(timeout)
        P.encode_sample(0, n, beta, timeout_ms)  # validate before touching the socket
        index = self._table_index(table)
        reply = self._call(
            P.Op.SAMPLE, lambda rid: P.encode_sample(rid, n, beta, timeout_ms, index), self.timeout + wait_s
        )
        batch = sampled_batch(reply, sequences=sequences)
        name = self.table if table is None else table
        batch.spec = self._sampled_spec(name, batch)
        batch._resolve = functools.partial(self._sampled_spec, name, ask=True)
        return batch

    # Split calls, the sharded client's (not the user's): send now, collect the reply later, so that a set of
    # servers can have one request outstanding at each and the waits overlap. Don't interleave them with the
    # other calls of the same client from another thread.

    def _send(self, build: Callable[[int], list[Any]], what: str, wait_s: float = 0.0) -> tuple[int, float]:
        """Send ``build(request id)`` without waiting for the reply -> ``(request id, deadline)``: the client
        timeout plus ``wait_s`` (the server-side wait the request asks for) from now. ReplayTimeout when it
        could not be sent by then."""
        rid = self.transport.next_request_id()
        deadline = time.monotonic() + self.timeout + wait_s
        try:
            self.transport.send(build(rid), self.timeout + wait_s, what)
        except ReplayTimeout:
            self._info = None  # the server may have restarted: declare the spec again before the next insert
            raise
        return rid, deadline

    def _receive(self, op: P.Op, rid: int, deadline: float) -> P.Reply:
        """The reply of type ``op`` to request ``rid`` (sent with :meth:`_send`), or its error raised; ReplayTimeout
        (socket reset) when none came by ``deadline``."""
        try:
            frames = self.transport.wait_reply(rid, deadline, op.name)
        except ReplayTimeout:
            self._info = None
            raise
        return self._decode(frames, op, rid)

    def _try_stats(self) -> int | None:
        """Queue a STATS without waiting at all -> its request id, or None when it could not even be queued; the
        reply comes with :meth:`_poll_stats`. For probing a server that may be down."""
        rid = self.transport.next_request_id()
        return rid if self.transport.try_send(P.encode_stats(rid)) else None

    def _poll_stats(self, rid: int) -> dict[str, int | float] | None:
        """The reply to the STATS sent as ``rid`` if it is already here, else None; never waits and never resets
        the socket (so a request queued for a server that is down stays queued until it comes back)."""
        frames = self.transport.receive(0)
        while frames is not None:
            if peek_ids(memoryview(frames[0].buffer))[1] == rid:
                reply = self._decode(frames, P.Op.STATS, rid)
                assert reply.stats is not None
                return reply.stats
            frames = self.transport.receive(0)  # a late reply to an earlier request: discard
        return None

    def update_priorities(self, keys: Any, priorities: Any, *, table: str | None = None) -> int:
        """Set new priorities; returns how many keys were still present (evicted keys, and keys of another
        table, are skipped)."""
        frames = P.encode_update(0, keys, priorities, self._table_index(table))  # validate before touching the socket
        reply = self._call(P.Op.UPDATE_PRIORITIES, lambda rid: P.with_request_id(frames, rid), self.timeout)
        return int(reply.header.count)

    def remove_to_fit(self, *, table: str | None = None) -> int:
        """Evict down to capacity with the table's remover; returns the number removed."""
        index = self._table_index(table)
        return int(
            self._call(P.Op.REMOVE_TO_FIT, lambda rid: P.encode_remove_to_fit(rid, index), self.timeout).header.count
        )

    def reset(self, table: str | None = None) -> int:
        """Empty ``table`` (None: this client's; Reverb's ``Client.reset``): every item goes, its key stale from
        then on, and the table's rate limiter counts inserts and samples from 0 again. Returns how many items were
        removed. Under CURVE an actor may not (ServerError INVALID_ARGUMENT, nothing changed)."""
        index = self._table_index(table)
        return int(self._call(P.Op.RESET, lambda rid: P.encode_reset(rid, index), self.timeout).header.count)

    def checkpoint(self, timeout: float | None = None) -> str:
        """Write the server's snapshot of every table now (Reverb's ``Client.checkpoint``) and return its path on
        the server's machine: the file a server started with ``--snapshot`` at that path restores. ServerError
        INVALID_ARGUMENT when the server has no ``--snapshot``, INTERNAL when the save failed (the previous
        snapshot kept); under CURVE an actor may not. ``timeout``: seconds to wait for the save (default: this
        client's ``timeout``; a large store takes longer)."""
        wait = self.timeout if timeout is None else float(timeout)
        reply = self._call(P.Op.CHECKPOINT, P.encode_checkpoint, wait)
        return str(reply.arrays["path"])

    def stats(self) -> dict[str, int | float]:
        """A STATS request (ReplayTimeout after ``timeout`` s without an answer): the store's counters plus the
        server's per-op request/error counters and min_size_to_sample (docs/protocol.md, "STATS")."""
        reply = self._call(P.Op.STATS, P.encode_stats, self.timeout)
        assert reply.stats is not None
        return reply.stats

    # ---------------------------------------- PipelinedReplay (the inserter's calls, not the user's), Interruptible

    def _prepare_insert(
        self,
        priorities: Any,
        data: Any,
        offsets: Any,
        *,
        timeout: float | None = None,
        insert_id: tuple[int, int] | None = None,
        chunks: P.FrameChunks | None = None,
        table: str | None = None,
    ) -> list[Any]:
        """Validate and encode one INSERT for :meth:`_send_insert` (ValueError for bad arguments,
        InsertTooLargeError over the server's limit; the first call asks the server, see :meth:`hello`).
        ``priorities=None``: the server gives each item the table's largest priority so far."""
        _wait_s, timeout_ms = P.server_wait(timeout)
        max_priority = priorities is None
        if max_priority:
            n = len(offsets) - 1 if hasattr(offsets, "__len__") else 0
            priorities = np.zeros(max(n, 0), dtype=np.float64)  # sent and checked, not used (FLAG_MAX_PRIORITY)
        frames = P.encode_insert(
            0,
            priorities,
            data,
            offsets,
            timeout_ms,
            self.next_insert_id() if insert_id is None else insert_id,
            chunks,
            self._table_index(table),
            max_priority,
        )
        self._check_size(frames)
        return frames

    def _insert_limit(self) -> int:
        """The most bytes one INSERT request may have (the server's announced limit)."""
        return self.server_info.max_request_bytes

    def _send_insert(self, message: list[Any]) -> tuple[int, int]:
        """Send a prepared INSERT without waiting for its reply -> ``(request id, items)``; ReplayTimeout (socket
        reset) when no server connection came within the client timeout. Collect the reply with
        :meth:`_receive_insert`; don't mix with the other calls on this client (they would discard its reply as
        a stale one)."""
        rid = self.transport.next_request_id()
        self.transport.send(P.with_request_id(message, rid), self.timeout, "INSERT")
        return rid, len(message[1])

    def _receive_insert(self, wait: float) -> tuple[int, Any] | None:
        """The next INSERT reply within ``wait`` seconds -> ``(request id, keys)``, or ``(request id, exception)``
        for an error reply or a malformed one; None when none came (frames that are no apexrl reply are
        skipped)."""
        frames = self.transport.receive(wait)
        while frames is not None:
            _op, rid = peek_ids(memoryview(frames[0].buffer))
            if rid is not None:
                try:
                    reply = P.decode_reply(frames, P.Op.INSERT, rid)
                except ProtocolError as exc:
                    return rid, exc
                if not reply.ok:
                    return rid, error_of(reply.status, reply.message or "")
                return rid, reply.arrays["keys"]
            frames = self.transport.receive(0)
        return None

    def _forget_inserts(self) -> None:
        """Drop every INSERT reply still due (reset the socket; the next call reconnects and says HELLO)."""
        self._info = None
        self.transport.reset()

    def interrupt(self) -> None:
        """From any thread: the call in progress and every later one raise Interrupted."""
        self.transport.interrupt()

    # ------------------------------------------------------------------------------------------ helpers

    def _same_endpoint(self, table: str | None = None) -> ReplayClient:
        same = table is None or table == self.table
        return ReplayClient(
            self.endpoint,
            timeout=self.timeout,
            spec=(self._own_spec_json or None) if same else None,  # this client's spec is its own table's
            curve=self.transport.curve,
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
        """A :class:`PrefetchingSampler`: an iterator of :class:`LearnerBatch` fed by a background thread.

        The thread owns its own client (same endpoint and timeout; this client is not used) and keeps up to
        ``prefetch`` batches ready. ``decode`` (e.g. ``spec.decode_batch``) or ``decoder`` (e.g. a
        :class:`~apexrl.replay.wire.codec.BatchDecoder`, into a ring of preallocated batches) runs in
        ``decode_threads`` threads of their own; ``sample_threads`` keeps that many SAMPLE requests in flight,
        each thread on a connection of its own. ``timeout``
        is the per-request server-side wait for ``min_size_to_sample`` as in :meth:`sample`. ReplayTimeouts
        (server down or restarting, store too small) are retried until the sampler is closed; see
        :class:`PrefetchingSampler`. ``table``: the table it samples (None: this client's). ``beta``: a number,
        or a schedule of the batch index (0, 1, ...: the learner step with one update per batch), e.g.
        :func:`~apexrl.replay.client.beta.linear_beta`.
        """
        return PrefetchingSampler(
            functools.partial(self._same_endpoint, table),
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
        """A :class:`PipelinedInserter`: inserts that do not wait for their reply (for actors).

        Up to ``max_in_flight`` insert requests are outstanding at once; every reply is still received and
        counted, failures are raised by a later ``insert()`` / ``flush()`` / ``close()``. It owns its own
        socket (same endpoint and timeout); this client is not used. ``timeout`` is the server-side
        rate-limiter wait as in :meth:`insert`; ``on_ack(keys, seconds)`` is called for each acknowledged
        request with its keys and round-trip time. ``resend=True`` keeps each batch until stored and resends it
        with its own insert id after a lost connection or a TIMEOUT reply (``on_retry(error, attempts)`` is told
        first, and may wait or raise): exactly-once, as :meth:`insert` retried with the same id. ``table``: the
        table it inserts into (None: this client's).
        """
        return PipelinedInserter(
            functools.partial(self._same_endpoint, table),
            max_in_flight=max_in_flight,
            timeout=timeout,
            on_ack=on_ack,
            client_timeout=self.timeout,
            resend=resend,
            on_retry=on_retry,
        )

    def updater(self, max_pending: int = 64, *, table: str | None = None) -> AsyncUpdater:
        """An :class:`AsyncUpdater`: non-blocking priority updates sent by a background thread.

        It owns its own client (same endpoint and timeout, ``table`` or this client's); this client is not used.
        """
        return AsyncUpdater(
            functools.partial(self._same_endpoint, table), max_pending=max_pending, close_timeout=self.timeout
        )
