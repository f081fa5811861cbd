"""Settings of the replay server, validated in one place (the CLI, the run plan and tests build the same class)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field, fields
from typing import Any

from apexrl.replay.server.table_flags import TABLE_FLAGS, TableFlags, table_from_flags
from apexrl.replay.tables import DEFAULT_TABLE, TableConfig, check_table_names, tables_from_json
from apexrl.security import check_exposure, load_server_keys
from apexrl.validate import Range, check_fields

__all__ = [
    "MAX_REPLAY_SERVERS",
    "MAX_SHARDS",
    "MAX_SLOTS_PER_SHARD",
    "STORE_INT_MAX",
    "ServerConfig",
    "check_disk_table_dir",
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


def _default_tables() -> list[TableConfig]:
    return [TableConfig(DEFAULT_TABLE)]


@dataclass
class ServerConfig:
    """Settings of a :class:`~apexrl.replay.server.ReplayServer`; the flags of ``apexrl-replay-server`` map 1:1
    and take their ranges from here (``apexrl.validate``). Invalid values raise ValueError at construction.

    ``tables`` (:class:`~apexrl.replay.tables.TableConfig`, which validates each) are the server's tables; every
    other field is server-wide. The server's table flags (``--capacity``, ``--eviction``, ...) build the one
    table ``default`` (:mod:`apexrl.replay.server.table_flags`)."""

    bind: str = "127.0.0.1"
    port: int = field(default=0, metadata=Range.int(0, 65535))
    """0: an ephemeral port; the real one is ReplayServer.endpoint."""
    shards: int = field(default=8, metadata=Range.int(1, MAX_SHARDS))
    seed: int = field(default=0, metadata=Range.int(0, STORE_INT_MAX))
    snapshot: str | os.PathLike[str] | None = None
    snapshot_every: float | None = field(default=None, metadata=Range.float(0.0, lo_open=True, optional=True))
    """Seconds between snapshots; None: only on stop()."""
    max_message_mb: float = field(default=256, metadata=Range.float(0.0, lo_open=True))
    workers: int = field(default=2, metadata=Range.int(1, 256))
    inline_sample_max: int = field(default=1024, metadata=Range.int(0, STORE_INT_MAX))
    """SAMPLEs of at most this many items are served by the receiving thread."""
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
    tables: list[TableConfig] = field(default_factory=_default_tables)
    """The server's tables (at least one, names unique); default: the one table ``default`` with
    TableConfig's defaults."""
    drop_tables: tuple[str, ...] = ()
    """Tables the snapshot holds and this configuration leaves out, whose items are to be deleted on purpose.
    A snapshot table that is neither configured nor named here stops the server at start (SnapshotLoadError),
    so that a configuration slip never deletes what was accepted."""

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Every range above, and the rules between fields; ValueError naming the first broken one."""
        check_fields(self)
        self._check_tables()
        if self.snapshot_every is not None and self.snapshot is None:
            raise ValueError("snapshot_every needs a snapshot path")
        self.drop_tables = tuple(self.drop_tables)
        if self.drop_tables:
            if self.snapshot is None:
                raise ValueError("drop_tables (--drop-tables) names tables of a snapshot: it needs a snapshot path")
            configured = sorted({t.name for t in self.tables} & set(self.drop_tables))
            if configured:
                raise ValueError(f"drop_tables (--drop-tables) names configured table(s) {configured}: keep or drop")
        check_exposure(self.bind, self.curve_dir, self.insecure, "bind")
        if self.curve_dir is not None:
            load_server_keys(self.curve_dir)  # CurveKeyError (a ValueError) naming the missing or unsafe file

    def _check_tables(self) -> None:
        """The tables as a list of distinct TableConfigs (each validated itself), and the one rule a table
        cannot check alone: its ceiling must fit the store's slots over this server's shards."""
        if isinstance(self.tables, (str, bytes)) or not isinstance(self.tables, (list, tuple)):
            raise ValueError(f"ServerConfig.tables must be a list of TableConfig, got {self.tables!r}")
        self.tables = list(self.tables)
        check_table_names(self.tables)
        main = next((t for t in self.tables if t.name == DEFAULT_TABLE), self.tables[0])
        if main.kind == "slices":
            # Today's top-level STATS and HELLO names (and snapshots of one table) describe the main table's store.
            raise ValueError(
                f"table {main.name!r}: a slices table cannot be the server's main table (the one named "
                f"{DEFAULT_TABLE!r}, else the first): list a table of items first"
            )
        for t in self.tables:
            if t.kind == "slices":
                continue
            if t.storage == "disk":
                assert t.path is not None  # TableConfig checked it
                check_disk_table_dir(t.name, t.path)
            per_shard = -(-t.effective_max_size // self.shards)
            if per_shard > MAX_SLOTS_PER_SHARD:
                raise ValueError(
                    f"table {t.name!r}: max_size {t.effective_max_size} (default 2 * capacity) over {self.shards} "
                    f"shards needs {per_shard} slots per shard; a shard holds at most {MAX_SLOTS_PER_SHARD} (use "
                    "more shards or a smaller capacity/max_size)"
                )

    def table(self, name: str = DEFAULT_TABLE) -> TableConfig | None:
        """The table named ``name``, or None."""
        return next((t for t in self.tables if t.name == name), None)

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
    """A JSON-able dict of ``cfg`` (a run plan's server entry): its fields, the tables as their JSON objects."""
    d = {f.name: getattr(cfg, f.name) for f in fields(cfg) if f.name != "tables"}
    if d["snapshot"] is not None:
        d["snapshot"] = os.fspath(d["snapshot"])
    d["tables"] = [t.to_json() for t in cfg.tables]
    return d


def server_config_from_dict(d: dict[str, Any]) -> ServerConfig:
    """The ServerConfig of :func:`server_config_to_dict`'s dict (validated; ValueError / TypeError).

    A plan written before ServerConfig held only tables has the table flags' fields (``capacity``, ``eviction``,
    ...) at its top level, and ``tables`` only where it had several: those fields build the table ``default``,
    and must be at their defaults beside ``tables``."""
    d = dict(d)
    flags = {name: d.pop(name) for name in TABLE_FLAGS if name in d}
    tables = d.pop("tables", None)
    if tables is not None:
        defaults = TableFlags()
        given = sorted(name for name, value in flags.items() if value != getattr(defaults, name))
        if given:
            raise ValueError(
                f"server tables and the table flags of the one table {DEFAULT_TABLE!r} ({', '.join(given)}) are "
                "given together: set those in the tables"
            )
        return ServerConfig(**d, tables=tables_from_json(tables, where="server tables"))
    return ServerConfig(**d, tables=[table_from_flags(flags)])


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


def check_disk_table_dir(table: str, path: str | os.PathLike[str]) -> None:
    """ValueError naming the reason when a disk table's directory could not hold its log: it is something other
    than a directory, or it is missing and its parent is missing or not writable, or it is not writable."""
    path = os.fspath(path)
    where = f"table {table!r}: path {path!r}"
    if os.path.exists(path):
        if not os.path.isdir(path):
            raise ValueError(f"{where} is not a directory (a disk table keeps its log in a directory)")
        if not os.access(path, os.W_OK | os.X_OK):
            raise ValueError(f"{where} is not writable")
        return
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"{where}: its parent directory {parent!r} does not exist (create it first)")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{where}: its parent directory {parent!r} is not writable, so it cannot be created")
