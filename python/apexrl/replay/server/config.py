"""Settings of the replay server, validated in one place (the CLI, the run plan and tests build the same class)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from apexrl._core import DEFAULT_EVICTION
from apexrl.replay.tables import (
    DEFAULT_TABLE,
    REMOVER_ALIASES,
    REMOVERS,
    MinSize,
    RateLimiter,
    SampleToInsertRatio,
    TableConfig,
    check_table_names,
    tables_from_json,
)
from apexrl.security import check_exposure, load_server_keys
from apexrl.validate import Range, check_fields

__all__ = [
    "EVICTION_POLICIES",
    "MAX_REPLAY_SERVERS",
    "MAX_SHARDS",
    "MAX_SLOTS_PER_SHARD",
    "STORE_INT_MAX",
    "TABLE_FIELDS",
    "TABLE_FLAGS",
    "ServerConfig",
    "check_snapshot_dir",
    "server_config_from_dict",
    "server_config_to_dict",
]


STORE_INT_MAX = 2**63 - 1
"""The native store takes capacity and seed as signed 64-bit integers."""
MAX_SHARDS = 256
"""The store's key has 8 bits for the shard."""
MAX_REPLAY_SERVERS = 32
"""Most replay servers one ShardedReplayClient spreads over: its keys carry the server in the store's 8-bit
shard field, above the server's own lock shards (5 bits for 32 servers leave 3: 8 lock shards each)."""
MAX_SLOTS_PER_SHARD = 2**28 - 1
"""The store's key has 28 bits for the slot: a shard holds at most this many items."""
EVICTION_POLICIES = (*REMOVERS, *REMOVER_ALIASES)
"""``PrioritizedStore(eviction=...)`` values, the store's names then their aliases (the store's kind table, as
:data:`~apexrl.replay.tables.REMOVERS`): which items ``remove_to_fit`` takes. The store reports an alias by its
name (min_heap as lowest_priority)."""


TABLE_FIELDS = (
    "capacity",
    "max_size",
    "alpha",
    "eviction",
    "alpha_evict",
    "min_size_to_sample",
    "samples_per_insert",
    "error_buffer",
    "spec",
)
"""The ServerConfig fields that configure the one table ``default`` when ``tables`` is not given (a server
with ``tables`` refuses a value other than their default)."""

TABLE_FLAGS = {name: "--" + name.replace("_", "-") for name in TABLE_FIELDS}
"""Their flags on ``apexrl-replay-server`` (``--capacity``, ``--max-size``, ...), refused beside ``--tables``."""


@dataclass
class ServerConfig:
    """Settings of a :class:`~apexrl.replay.server.ReplayServer`; the flags of ``apexrl-replay-server`` map 1:1
    and take their ranges from here (``apexrl.validate``). Invalid values raise ValueError at construction.

    The server's tables: ``tables`` (a list of :class:`~apexrl.replay.tables.TableConfig`, ``--tables FILE``),
    or, when it is None, the one table ``default`` that the fields of :data:`TABLE_FIELDS` configure (as
    before tables existed); :meth:`table_configs` gives them either way. Every other field is server-wide."""

    bind: str = "127.0.0.1"
    port: int = field(default=0, metadata=Range.int(0, 65535))
    """0: an ephemeral port; the real one is ReplayServer.endpoint."""
    capacity: int = field(default=1_000_000, metadata=Range.int(1, STORE_INT_MAX))
    max_size: int | None = field(default=None, metadata=Range.int(1, STORE_INT_MAX, optional=True))
    """Hard ceiling of the store (>= capacity): an insert that leaves more items evicts down to capacity by
    itself, whether or not a learner calls REMOVE_TO_FIT. None: 2 * capacity."""
    alpha: float = field(default=0.6, metadata=Range.float(0.0))
    eviction: str = field(default=DEFAULT_EVICTION, metadata=Range.choice(*EVICTION_POLICIES))
    alpha_evict: float = field(default=-0.4, metadata=Range.float())
    shards: int = field(default=8, metadata=Range.int(1, MAX_SHARDS))
    seed: int = field(default=0, metadata=Range.int(0, STORE_INT_MAX))
    min_size_to_sample: int = field(default=1, metadata=Range.int(0, STORE_INT_MAX))
    snapshot: str | os.PathLike[str] | None = None
    snapshot_every: float | None = field(default=None, metadata=Range.float(0.0, lo_open=True, optional=True))
    """Seconds between snapshots; None: only on stop()."""
    max_message_mb: float = field(default=256, metadata=Range.float(0.0, lo_open=True))
    workers: int = field(default=2, metadata=Range.int(1, 256))
    inline_sample_max: int = field(default=1024, metadata=Range.int(0, STORE_INT_MAX))
    """SAMPLEs of at most this many items are served by the receiving thread."""
    samples_per_insert: float | None = field(default=None, metadata=Range.float(0.0, lo_open=True, optional=True))
    """None: no rate limiting (Reverb's SampleToInsertRatio)."""
    error_buffer: float | None = field(default=None, metadata=Range.float(0.0, optional=True))
    """None: max(1, samples_per_insert) * 100."""
    spec: str | None = None
    """The run's TransitionSpec: its JSON, or the path of a JSON file; None: learnt from the first HELLO."""
    curve_dir: str | None = None
    """Key directory of `apexrl keygen`: CURVE encryption and the client allow-list (None: plain TCP)."""
    insecure: bool = False
    """Allow binding beyond loopback without curve_dir (apexrl.security.check_exposure)."""
    # Bounds on what peers can make the server hold or wait for (docs/protocol.md, "Limits").
    max_wait_s: float = field(default=60.0, metadata=Range.float(0.0, lo_open=True))
    """Longest a request waits on the server (min size, rate limiter); a larger timeout_ms is clipped to it."""
    max_waiting: int = field(default=16384, metadata=Range.int(0, STORE_INT_MAX))
    """Most requests waiting at once, from all peers; more are answered TIMEOUT at once."""
    max_waiting_per_peer: int = field(default=1024, metadata=Range.int(1, STORE_INT_MAX))
    """Most requests of one peer waiting at once; one more and its oldest waiting request is answered TIMEOUT."""
    max_waiting_mb: float = field(default=256, metadata=Range.float(0.0))
    """Most MiB of waiting INSERTs held at once; more are answered TIMEOUT at once."""
    max_reply_mb: float | None = field(default=None, metadata=Range.float(0.0, lo_open=True, optional=True))
    """Largest SAMPLE reply in MiB (estimated before sampling; over it: TOO_LARGE); None: max_message_mb."""
    max_unread_mb: float = field(default=256, metadata=Range.float(0.0, lo_open=True))
    """Most MiB of replies one client may have sent to it and not yet taken (queued in the server's libzmq); a
    SAMPLE that would go over it is refused TIMEOUT."""
    handshake_s: float = field(default=5.0, metadata=Range.float(0.0))
    """ZMQ_HANDSHAKE_IVL: a connection that has not completed the ZMTP handshake by then is closed (0: never)."""
    heartbeat_s: float = field(default=10.0, metadata=Range.float(0.0))
    """ZMQ_HEARTBEAT_IVL: ping every peer this often and close a connection silent for 3x as long (0: off)."""
    tables: list[TableConfig] | None = None
    """The server's tables (names unique); None: the one table ``default`` of the fields in TABLE_FIELDS. Given
    with any of those fields at a value other than its default, ValueError."""
    drop_tables: tuple[str, ...] = ()
    """Tables the snapshot holds and this configuration leaves out, whose items are to be deleted on purpose.
    A snapshot table that is neither configured nor named here stops the server at start (SnapshotLoadError),
    so that a configuration slip never deletes what was accepted."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every range above, and the rules between fields; ValueError naming the first broken one."""
        check_fields(self)
        if self.tables is not None:
            self._check_tables()
        if self.max_size is not None and self.max_size < self.capacity:
            raise ValueError(f"max_size must be >= capacity = {self.capacity}, got {self.max_size}")
        ceiling = self.effective_max_size
        per_shard = -(-ceiling // self.shards)
        if per_shard > MAX_SLOTS_PER_SHARD:
            raise ValueError(
                f"max_size {ceiling} (default 2 * capacity) over {self.shards} shards needs {per_shard} slots per "
                f"shard; a shard holds at most {MAX_SLOTS_PER_SHARD} (use more shards or a smaller capacity/max_size)"
            )
        if self.samples_per_insert is None:
            if self.error_buffer is not None:
                raise ValueError("error_buffer needs samples_per_insert")
        else:
            spi = float(self.samples_per_insert)
            eb = self.effective_error_buffer
            assert eb is not None
            if eb < max(1.0, spi):
                raise ValueError(
                    f"error_buffer must be >= max(1, samples_per_insert) = {max(1.0, spi)}, "
                    f"got {eb} (a smaller buffer could block both inserts and samples for good)"
                )
        if self.spec is not None:
            from apexrl.replay.server.insert_guard import load_spec

            load_spec(self.spec)  # ValueError naming the value
        if self.snapshot_every is not None and self.snapshot is None:
            raise ValueError("snapshot_every needs a snapshot path")
        self.drop_tables = tuple(self.drop_tables)
        if self.drop_tables:
            if self.snapshot is None:
                raise ValueError("drop_tables (--drop-tables) names tables of a snapshot: it needs a snapshot path")
            configured = sorted({c.name for c in self.table_configs()} & set(self.drop_tables))
            if configured:
                raise ValueError(f"drop_tables (--drop-tables) names configured table(s) {configured}: keep or drop")
        check_exposure(self.bind, self.curve_dir, self.insecure, "bind")
        if self.curve_dir is not None:
            load_server_keys(self.curve_dir)  # CurveKeyError (a ValueError) naming the missing or unsafe file

    def _check_tables(self) -> None:
        if isinstance(self.tables, (str, bytes)) or not isinstance(self.tables, (list, tuple)):
            raise ValueError(f"ServerConfig.tables must be a list of TableConfig (or None), got {self.tables!r}")
        self.tables = list(self.tables)
        check_table_names(self.tables)
        defaults = {f.name: f.default for f in fields(ServerConfig) if f.name in TABLE_FIELDS}
        given = [name for name in TABLE_FIELDS if getattr(self, name) != defaults[name]]
        if given:
            values = ", ".join(f"{name}={getattr(self, name)!r}" for name in given)
            raise ValueError(
                f"ServerConfig: tables and the table settings of the one table {DEFAULT_TABLE!r} ({values}) are "
                "given together; with tables, set those in each TableConfig (capacity, max_size, alpha, remover, "
                "alpha_evict, rate_limiter, spec)"
            )
        for t in self.tables:
            per_shard = -(-t.effective_max_size // self.shards)
            if per_shard > MAX_SLOTS_PER_SHARD:
                raise ValueError(
                    f"table {t.name!r}: max_size {t.effective_max_size} (default 2 * capacity) over {self.shards} "
                    f"shards needs {per_shard} slots per shard; a shard holds at most {MAX_SLOTS_PER_SHARD} (use "
                    "more shards or a smaller capacity/max_size)"
                )

    def table_configs(self) -> list[TableConfig]:
        """The server's tables: ``tables``, or the one table ``default`` that the fields of TABLE_FIELDS
        configure (sampler prioritized, remover ``eviction``, rate limiter ``SampleToInsertRatio`` with
        ``samples_per_insert``, else ``MinSize(min_size_to_sample)``, where a min size of 0 counts as 1 as it
        always did; with every one of those fields at its default, exactly ``TableConfig("default")``)."""
        if self.tables is not None:
            return list(self.tables)
        return [
            TableConfig(
                DEFAULT_TABLE,
                sampler="prioritized",
                remover=self.eviction,
                capacity=self.capacity,
                max_size=self.max_size,
                alpha=self.alpha,
                alpha_evict=self.alpha_evict,
                rate_limiter=self._default_rate_limiter(),
                spec=self.spec,
            )
        ]

    def _default_rate_limiter(self) -> RateLimiter | None:
        min_size = max(1, int(self.min_size_to_sample))  # the native limiter raises 0 to 1
        if self.samples_per_insert is not None:
            eb = self.effective_error_buffer
            assert eb is not None
            return SampleToInsertRatio(float(self.samples_per_insert), min_size, eb)
        return None if min_size == 1 else MinSize(min_size)

    def table(self, name: str = DEFAULT_TABLE) -> TableConfig | None:
        """The table named ``name`` among :meth:`table_configs`, or None."""
        return next((t for t in self.table_configs() if t.name == name), None)

    @property
    def effective_error_buffer(self) -> float | None:
        """error_buffer, or its default max(1, samples_per_insert) * 100; None without rate limiting."""
        if self.samples_per_insert is None:
            return None
        if self.error_buffer is None:
            return max(1.0, float(self.samples_per_insert)) * 100.0
        return float(self.error_buffer)

    @property
    def effective_max_size(self) -> int:
        """max_size, or its default 2 * capacity."""
        return int(self.max_size) if self.max_size is not None else 2 * int(self.capacity)

    @property
    def max_bytes(self) -> int:
        return int(self.max_message_mb * (1 << 20))

    @property
    def max_reply_bytes(self) -> int:
        return int((self.max_message_mb if self.max_reply_mb is None else self.max_reply_mb) * (1 << 20))

    @property
    def max_unread_bytes(self) -> int:
        return int(self.max_unread_mb * (1 << 20))

    @property
    def max_waiting_bytes(self) -> int:
        return int(self.max_waiting_mb * (1 << 20))


def server_config_to_dict(cfg: ServerConfig) -> dict[str, Any]:
    """A JSON-able dict of ``cfg`` (a run plan's server entry): its fields, the tables as their JSON objects
    (``tables`` left out when None, so a plan without tables reads as before)."""
    d = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "tables"}
    if d["snapshot"] is not None:
        d["snapshot"] = os.fspath(d["snapshot"])
    if cfg.tables is not None:
        d["tables"] = [t.to_json() for t in cfg.tables]
    return d


def server_config_from_dict(d: dict[str, Any]) -> ServerConfig:
    """The ServerConfig of :func:`server_config_to_dict`'s dict (validated; ValueError / TypeError)."""
    d = dict(d)
    tables = d.pop("tables", None)
    return ServerConfig(**d, tables=None if tables is None else tables_from_json(tables, where="server tables"))


def check_snapshot_dir(path: str | os.PathLike[str]) -> None:
    """ValueError naming the reason when the snapshot ``path`` could never be written: its directory is missing,
    not a directory or not writable, or the path is a directory. Checked at start, not at the first save."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        raise ValueError(f"snapshot path {path!r} is a directory (give a file path)")
    if not os.path.isdir(directory):
        raise ValueError(f"snapshot directory {directory!r} does not exist (create it first)")
    if not os.access(directory, os.W_OK | os.X_OK):
        raise ValueError(f"snapshot directory {directory!r} is not writable")
