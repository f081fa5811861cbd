"""Table configuration: a replay server holds one or more named tables, each with its own sampler, remover,
capacity, rate limiter, ``max_times_sampled`` and item spec.

:class:`TableConfig` describes one table; :class:`MinSize`, :class:`SampleToInsertRatio` and :class:`Queue` are
its rate limiters. All are frozen dataclasses that validate at construction (ValueError naming the table, the
field and what it accepts), and round-trip through JSON (:meth:`TableConfig.to_json` /
:meth:`TableConfig.from_json`): the format of ``apexrl-replay-server --tables FILE`` and ``apexrl run --tables
FILE``, a JSON list of table objects read by :func:`load_tables`::

    [
      {"name": "default", "sampler": "prioritized", "capacity": 1000000,
       "rate_limiter": {"kind": "sample_to_insert_ratio", "samples_per_insert": 8.0,
                        "min_size_to_sample": 1000, "error_buffer": 800.0}},
      {"name": "aux", "sampler": "uniform", "capacity": 100000},
      {"name": "onpolicy", "sampler": "fifo", "capacity": 1024, "max_times_sampled": 1,
       "rate_limiter": {"kind": "queue", "size": 1024}}
    ]

A field left out takes its default. Without tables, the server's table flags (``--capacity``, ``--eviction``,
...: :mod:`apexrl.replay.server.table_flags`) build the one table ``default``. For Reverb users: Reverb's ``max_size`` is a hard limit that each insert past it evicts back to;
here that is ``capacity=N, max_size=N``. With the default ``max_size`` (2 * capacity) a table holds up to twice
its ``capacity`` until someone calls ``remove_to_fit()`` (the Ape-X learner does, every
``remove_to_fit_every`` steps) or an insert passes the ceiling.

Never imports torch.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from apexrl._core import DEFAULT_EVICTION, DEFAULT_SAMPLER, eviction_kinds, sampler_kinds
from apexrl.replay.wire.codec import TransitionSpec
from apexrl.validate import Range, check_fields

__all__ = [
    "DEFAULT_TABLE",
    "DURABILITIES",
    "KINDS",
    "MAX_TABLE_NAME",
    "MAX_TIMES_SAMPLED",
    "REMOVERS",
    "REMOVER_ALIASES",
    "SAMPLERS",
    "SAMPLER_ALIASES",
    "SLICE_SAMPLERS",
    "STORAGES",
    "MinSize",
    "Queue",
    "RateLimiter",
    "SampleToInsertRatio",
    "TableConfig",
    "check_table_names",
    "load_tables",
    "rate_limiter_from_json",
    "tables_from_json",
]

KINDS = ("items", "slices")
"""What a table holds: items (sampled as they were inserted), or episodes sampled as windows of steps chosen at
sample time (``kind="slices"``: :mod:`apexrl.replay.slices`; docs/protocol.md, "Slices tables")."""
SLICE_SAMPLERS = ("prioritized", "uniform")
"""How a slices table draws its windows' starts."""
_SLICE_DEFAULTS = {"length": None, "burn_in": 0, "eta": 0.9, "strict_length": True, "span": 0}
STORAGES = ("memory", "disk")
"""Where a table keeps its items: memory (lost with the process, but for snapshots), or disk (every change logged
under ``path`` before it is acknowledged; docs/running.md, "Tables on disk")."""
DURABILITIES = ("sync", "interval")
"""A disk table's promise: sync (fdatasynced before the reply) or interval (fdatasynced within 10 ms)."""
DEFAULT_DISK_CACHE_BYTES = 1 << 30
"""A disk table's log tail kept in memory for its reads, unless ``cache_bytes`` says otherwise (the native
DiskTable's default)."""
MAX_DISK_CACHE_BYTES = 1 << 46
"""cache_bytes at most (64 TiB): larger is a typo, not a machine."""
STORE_INT_MAX = 2**63 - 1
"""The native store takes sizes as signed 64-bit integers (as ``apexrl.replay.server.config``)."""
DEFAULT_TABLE = "default"
"""The table that a server without ``tables`` holds, and that clients use unless they name another."""
MAX_TABLE_NAME = 64
"""Most characters of a table name."""
_NAME_RE = re.compile(rf"[A-Za-z0-9_.-]{{1,{MAX_TABLE_NAME}}}")
MAX_TIMES_SAMPLED = 2**31 - 1
"""Largest ``max_times_sampled`` (a per-item draw count fits 32 bits in the store)."""
# The names come from the store's kind tables (cpp/apexrl/sampling/kinds.cc, cpp/apexrl/eviction/kinds.cc), the
# one place that also parses them: a kind added there is a valid table setting here.
SAMPLERS: tuple[str, ...] = tuple(name for _, name, _ in sampler_kinds())
"""How a table samples. prioritized: proportionally to priority^alpha, stratified, with importance weights (as
the single table of earlier versions); uniform: every item alike; fifo / lifo: the oldest / newest first;
max_heap / min_heap: the highest / lowest priority first. fifo, lifo and the heaps return distinct items in that
order; uniform and prioritized draw with replacement; only prioritized computes importance weights (the others
return ones)."""
SAMPLER_ALIASES: dict[str, str] = {alias: name for _, name, alias in sampler_kinds() if alias is not None}
"""Other names a sampler is accepted by (stored by its name in :data:`SAMPLERS`)."""
REMOVERS: tuple[str, ...] = tuple(name for _, name, _ in eviction_kinds())
"""What a table removes when it is over capacity (the store's eviction policies): fifo / lifo: the oldest /
newest; uniform: drawn, every item alike; prioritized: drawn with probability proportional to
priority^alpha_evict; lowest_priority / max_heap: the lowest / highest priorities."""
REMOVER_ALIASES: dict[str, str] = {alias: name for _, name, alias in eviction_kinds() if alias is not None}
"""Other names a remover is accepted by (``min_heap``, Reverb's, for lowest_priority); stored by its name in
:data:`REMOVERS`."""


class TableConfigError(ValueError):
    """An invalid table setting: ``table`` (its name, None when the name itself is missing or invalid),
    ``field`` (the TableConfig field, ``rate_limiter.size`` for a limiter's) and ``reason``."""

    def __init__(self, table: str | None, field_name: str, reason: str):
        self.table, self.field, self.reason = table, field_name, reason
        super().__init__(f"table {table!r}: {field_name}: {reason}" if table is not None else f"{field_name}: {reason}")

    def located(self, where: str) -> str:
        """The message with ``where`` (the file and table index) in front, naming the table and the field."""
        name = f" ({self.table!r})" if self.table is not None else ""
        return f"{where}{name}: {self.field}: {self.reason}"


def _range_reason(rng: Range, value: Any) -> str | None:
    if rng.ok(value):
        return None
    return f"must be {rng.describe()}{' (or null)' if rng.optional else ''}, got {value!r}"


def _limiter_fields(cls: type, obj: Mapping[str, Any]) -> dict[str, Any]:
    names = [f.name for f in fields(cls)]
    unknown = sorted(set(obj) - set(names) - {"kind"})
    if unknown:
        raise ValueError(
            f"{cls.__name__} ({_KIND_OF[cls]!r}) has no field {', '.join(map(repr, unknown))} "
            f"(its fields: kind, {', '.join(names)})"
        )
    missing = [n for n in names if n not in obj]
    if missing:
        raise ValueError(f"{cls.__name__} ({_KIND_OF[cls]!r}) needs {', '.join(map(repr, missing))}")
    return {n: obj[n] for n in names}


@dataclass(frozen=True)
class MinSize:
    """SAMPLEs wait (up to their timeout) until the table holds ``min_size`` items; inserts are never limited.
    Reverb's ``MinSize``."""

    min_size: int = field(metadata=Range.int(1, STORE_INT_MAX))

    def __post_init__(self) -> None:
        check_fields(self)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "min_size", "min_size": self.min_size}


@dataclass(frozen=True)
class SampleToInsertRatio:
    """Reverb's ``SampleToInsertRatio``, the limiter of ``--samples-per-insert``: ``samples_per_insert`` sampled
    items per inserted item, measured from ``min_size_to_sample`` on, with ``error_buffer`` items of slack
    (the rules and their deadlock arithmetic: :mod:`apexrl.replay.server.rate_limiter`). SAMPLEs also wait
    until the table holds ``min_size_to_sample`` items. ``error_buffer`` must be at least
    ``max(1, samples_per_insert)``, else single-item samples and inserts could both be blocked for good
    (``--error-buffer``'s default is ``max(1, samples_per_insert) * 100``)."""

    samples_per_insert: float = field(metadata=Range.float(0.0, lo_open=True))
    min_size_to_sample: int = field(metadata=Range.int(1, STORE_INT_MAX))
    error_buffer: float = field(metadata=Range.float(0.0))

    def __post_init__(self) -> None:
        check_fields(self)
        from apexrl.replay.server.rate_limiter import deadlock_reason

        spi, eb = float(self.samples_per_insert), float(self.error_buffer)
        if eb < max(1.0, spi) or deadlock_reason(1, 1, spi, eb) is not None:
            raise ValueError(
                f"SampleToInsertRatio.error_buffer must be >= max(1, samples_per_insert) = {max(1.0, spi):g}, "
                f"got {eb:g} (a smaller buffer could block both inserts and samples for good)"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": "sample_to_insert_ratio",
            "samples_per_insert": self.samples_per_insert,
            "min_size_to_sample": self.min_size_to_sample,
            "error_buffer": self.error_buffer,
        }


@dataclass(frozen=True)
class Queue:
    """A queue of ``size`` items: INSERTs wait while the table holds ``size`` items, SAMPLEs wait while it is
    empty (Reverb's ``Queue``; pair it with ``sampler="fifo"`` and ``max_times_sampled=1`` for a queue whose
    every item is handed out once)."""

    size: int = field(metadata=Range.int(1, STORE_INT_MAX))

    def __post_init__(self) -> None:
        check_fields(self)

    def to_json(self) -> dict[str, Any]:
        return {"kind": "queue", "size": self.size}


RateLimiter = MinSize | SampleToInsertRatio | Queue
_KINDS: dict[str, type] = {"min_size": MinSize, "sample_to_insert_ratio": SampleToInsertRatio, "queue": Queue}
_KIND_OF = {cls: kind for kind, cls in _KINDS.items()}


def rate_limiter_from_json(obj: Any) -> RateLimiter:
    """The limiter of its JSON form (``{"kind": "min_size", "min_size": N}``, ``{"kind":
    "sample_to_insert_ratio", "samples_per_insert": X, "min_size_to_sample": N, "error_buffer": E}`` or
    ``{"kind": "queue", "size": N}``); ValueError naming the unknown kind or field and the valid ones."""
    if not isinstance(obj, Mapping):
        raise ValueError(f"a rate limiter is a JSON object with a 'kind' ({', '.join(_KINDS)}), got {obj!r}")
    kind = obj.get("kind")
    cls = _KINDS.get(kind) if isinstance(kind, str) else None
    if cls is None:
        given = "no 'kind'" if "kind" not in obj else f"unknown kind {kind!r}"
        raise ValueError(f"{given} (valid kinds: {', '.join(_KINDS)})")
    limiter: RateLimiter = cls(**_limiter_fields(cls, obj))
    return limiter


def _spec_from_json(value: Any, base_dir: str | None) -> TransitionSpec:
    """A spec as a JSON object (TransitionSpec.to_json's), as that JSON in a string, or as the path of a file
    holding it (relative paths from ``base_dir`` when given)."""
    if isinstance(value, TransitionSpec):
        return value
    if isinstance(value, Mapping):
        return TransitionSpec.from_json(json.dumps(dict(value)))
    if isinstance(value, (str, os.PathLike)):
        from apexrl.replay.server.insert_guard import load_spec

        text = os.fspath(value)
        if base_dir is not None and not text.lstrip().startswith("{") and not os.path.isabs(text):
            text = os.path.join(base_dir, text)
        return load_spec(text)
    raise ValueError(
        f"must be a TransitionSpec, its JSON (an object or a string) or the path of a JSON file, got {value!r}"
    )


@dataclass(frozen=True)
class TableConfig:
    """One table of a replay server.

    - ``name``: unique per server; 1 to 64 characters of ``[A-Za-z0-9_.-]``. Clients name it on every request
      (``table="default"`` unless told).
    - ``sampler``: one of :data:`SAMPLERS`; ``remover``: one of :data:`REMOVERS`; an alias
      (:data:`SAMPLER_ALIASES`, :data:`REMOVER_ALIASES`: ``min_heap`` for lowest_priority) is stored by its name.
    - ``capacity``: the soft capacity in items; ``remove_to_fit`` (and an insert beyond the ceiling) evicts down
      to it; nothing else does, so a table may hold up to ``max_size`` items. ``max_size``: the hard ceiling
      (>= capacity; None: 2 * capacity): an insert that leaves more items evicts down to capacity by itself.
      **Reverb's** ``max_size=N`` (evict on every insert past N) **is** ``capacity=N, max_size=N``.
    - ``alpha``: priority exponent of the prioritized sampler; ``alpha_evict``: exponent of the prioritized
      remover.
    - ``max_times_sampled``: an item is removed right after its k-th draw (0: no limit).
    - ``rate_limiter``: :class:`MinSize`, :class:`SampleToInsertRatio` or :class:`Queue`; None: what a server
      does with default flags, ``MinSize(1)`` (:attr:`effective_rate_limiter`).
    - ``spec``: the items' :class:`~apexrl.replay.wire.codec.TransitionSpec` (every insert is checked against
      it), given as one, as its JSON (text or object) or as the path of a JSON file; always a TransitionSpec
      after construction. None: the spec the first inserter declares.
    - ``storage``: ``"memory"`` (default) or ``"disk"``: every change (insert, priority update, erase,
      eviction, a queue's pop) is logged under ``path`` (a directory, created if missing, one per table)
      before it is acknowledged, and a restarted server reopens the table with its items, priorities and keys.
      ``durability`` (disk only; default ``"sync"``): ``"sync"`` fdatasyncs before each reply (one fdatasync
      covers the changes made before it began, on a thread of the table's own), ``"interval"`` within 10 ms after it. ``cache_bytes`` (disk only; default
      :data:`DEFAULT_DISK_CACHE_BYTES`, 1 GiB; 0: none): the log's newest bytes also kept in memory, so a SAMPLE
      copies the items it finds there instead of reading each from the file; size it to the table's bytes. Items with chunks (trajectories, Atari frame chunks) need a memory
      table. docs/running.md, "Tables on disk", says what each mode can lose.
    - ``kind``: ``"items"`` (default) or ``"slices"``: a table of episodes, each inserted whole
      (``ReplayClient.insert_episode``) and stored once, sampled as windows of ``burn_in + length`` steps chosen
      at sample time (:class:`apexrl.replay.slices.SliceTable`'s rules). Its ``capacity`` counts steps (whole
      episodes are evicted oldest first to fit), ``sampler`` is ``"prioritized"`` (a window's priority ``eta *
      max + (1 - eta) * mean`` of its trained steps', to the power ``alpha``) or ``"uniform"``, ``strict_length``
      and ``span`` are TorchRL's ``SliceSampler`` options, its rate limiter a :class:`MinSize` counted in
      windows; it is kept in memory (in the server's snapshots: a restarted server loads its episodes), and is never the
      server's first table (or ``default``).
      ``length``, ``burn_in``, ``eta``, ``strict_length`` and ``span`` are for slices tables only.

    Invalid values raise :class:`TableConfigError` (a ValueError) naming the table and the field.
    """

    name: str
    sampler: str = field(default=DEFAULT_SAMPLER, metadata=Range.choice(*SAMPLERS))
    remover: str = field(default=DEFAULT_EVICTION, metadata=Range.choice(*REMOVERS))
    capacity: int = field(default=1_000_000, metadata=Range.int(1, STORE_INT_MAX))
    max_size: int | None = field(default=None, metadata=Range.int(1, STORE_INT_MAX, optional=True))
    alpha: float = field(default=0.6, metadata=Range.float(0.0))
    alpha_evict: float = field(default=-0.4, metadata=Range.float())
    max_times_sampled: int = field(default=0, metadata=Range.int(0, MAX_TIMES_SAMPLED))
    rate_limiter: RateLimiter | None = None
    spec: TransitionSpec | str | None = None
    storage: str = field(default="memory", metadata=Range.choice(*STORAGES))
    path: str | None = None
    durability: str | None = field(default=None, metadata=Range.choice(*DURABILITIES, optional=True))
    cache_bytes: int | None = field(default=None, metadata=Range.int(0, MAX_DISK_CACHE_BYTES, optional=True))
    kind: str = field(default="items", metadata=Range.choice(*KINDS))
    length: int | None = field(default=None, metadata=Range.int(1, (1 << 24) - 1, optional=True))
    burn_in: int = field(default=0, metadata=Range.int(0, (1 << 24) - 2))
    eta: float = field(default=0.9, metadata=Range.float(0.0, 1.0))
    strict_length: bool = True
    span: int = field(default=0, metadata=Range.int(0, (1 << 24) - 2))

    def __post_init__(self) -> None:
        name = self.name
        if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
            raise TableConfigError(
                None,
                "name",
                f"must be 1 to {MAX_TABLE_NAME} characters of letters, digits, '_', '.' and '-', got {name!r}",
            )
        aliases = {"sampler": SAMPLER_ALIASES, "remover": REMOVER_ALIASES}
        for key, names in aliases.items():
            value = getattr(self, key)
            if isinstance(value, str) and value in names:
                object.__setattr__(self, key, names[value])
        for f in fields(self):
            rng = f.metadata.get("apexrl_range")
            reason = None if rng is None else _range_reason(rng, getattr(self, f.name))
            if reason is not None:
                if aliases.get(f.name):
                    reason += " (" + ", ".join(f"{a}: an alias of {n}" for a, n in aliases[f.name].items()) + ")"
                raise TableConfigError(name, f.name, reason)
        if self.max_size is not None and self.max_size < self.capacity:
            raise TableConfigError(name, "max_size", f"must be >= capacity = {self.capacity}, got {self.max_size}")
        limiter = self.rate_limiter
        if limiter is not None and not isinstance(limiter, (MinSize, SampleToInsertRatio, Queue)):
            raise TableConfigError(
                name,
                "rate_limiter",
                f"must be MinSize, SampleToInsertRatio, Queue or None, got {limiter!r} "
                "(a JSON object goes through TableConfig.from_json or rate_limiter_from_json)",
            )
        if isinstance(limiter, Queue) and limiter.size > self.capacity:
            raise TableConfigError(
                name,
                "rate_limiter",
                f"Queue.size {limiter.size} exceeds capacity {self.capacity}: the remover would drop items the "
                "queue holds (give capacity >= the queue size)",
            )
        if self.spec is not None:
            try:
                object.__setattr__(self, "spec", _spec_from_json(self.spec, None))
            except ValueError as e:
                raise TableConfigError(name, "spec", str(e)) from None
        self._check_storage()
        self._check_kind()

    def _check_kind(self) -> None:
        """A slices table's settings (module constants: what it takes); an items table leaves them at defaults."""
        name = self.name
        if self.kind == "items":
            for key, default in _SLICE_DEFAULTS.items():
                if getattr(self, key) != default:
                    raise TableConfigError(name, key, "is for kind='slices' tables; this one holds items")
            return
        if not isinstance(self.strict_length, bool):
            raise TableConfigError(name, "strict_length", f"must be a bool, got {self.strict_length!r}")
        if self.length is None:
            raise TableConfigError(name, "length", "kind='slices' needs length: the trained steps of a window")
        if self.burn_in + self.length >= 1 << 24:
            raise TableConfigError(name, "burn_in", f"burn_in + length must be below 2^24, got {self.burn_in}")
        if self.span >= self.length:
            raise TableConfigError(name, "span", f"must be below length = {self.length}, got {self.span}")
        if self.capacity > 1 << 40:
            raise TableConfigError(name, "capacity", f"a slices table holds at most 2^40 steps, got {self.capacity}")
        if self.sampler not in SLICE_SAMPLERS:
            raise TableConfigError(name, "sampler", f"a slices table samples {SLICE_SAMPLERS}, got {self.sampler!r}")
        if self.rate_limiter is not None and not isinstance(self.rate_limiter, MinSize):
            raise TableConfigError(
                name, "rate_limiter", "a slices table's rate limiter is a MinSize (counted in windows) or None"
            )
        fixed = {
            "remover": (DEFAULT_EVICTION, "it evicts whole episodes oldest first"),
            "max_size": (None, "its capacity (in steps) is its hard limit"),
            "alpha_evict": (-0.4, "it evicts whole episodes oldest first"),
            "max_times_sampled": (0, "windows are drawn with replacement"),
            "spec": (None, "its steps carry their own structure"),
            "storage": ("memory", "it is kept in memory (its episodes in the server's snapshots)"),
        }
        for key, (allowed, why) in fixed.items():
            if getattr(self, key) != allowed:
                raise TableConfigError(name, key, f"a slices table takes no {key}: {why}")

    def _check_storage(self) -> None:
        """A disk table needs a path and takes a durability (default sync) and a cache size (default 1 GiB); a
        memory table takes none of them."""
        name = self.name
        if self.storage == "memory":
            for key in ("path", "durability", "cache_bytes"):
                if getattr(self, key) is not None:
                    raise TableConfigError(name, key, "is for storage='disk' tables; this one is in memory")
            return
        if self.path is None:
            raise TableConfigError(name, "path", "storage='disk' needs a path: the directory of the table's log")
        if not isinstance(self.path, (str, os.PathLike)) or not os.fspath(self.path):
            raise TableConfigError(name, "path", f"must be a directory path, got {self.path!r}")
        object.__setattr__(self, "path", os.fspath(self.path))
        if self.durability is None:
            object.__setattr__(self, "durability", "sync")
        if self.cache_bytes is None:
            object.__setattr__(self, "cache_bytes", DEFAULT_DISK_CACHE_BYTES)

    @property
    def effective_max_size(self) -> int:
        """max_size, or its default 2 * capacity."""
        return int(self.max_size) if self.max_size is not None else 2 * int(self.capacity)

    @property
    def effective_rate_limiter(self) -> RateLimiter:
        """rate_limiter, or what None means: ``MinSize(1)`` (a server's default ``--min-size-to-sample``)."""
        return self.rate_limiter if self.rate_limiter is not None else MinSize(1)

    def to_json(self) -> dict[str, Any]:
        """A JSON-able dict with every field (the rate limiter as its JSON object, the spec as its JSON object);
        :meth:`from_json` gives this config back."""
        spec = self.spec
        return {
            "name": self.name,
            "sampler": self.sampler,
            "remover": self.remover,
            "capacity": self.capacity,
            "max_size": self.max_size,
            "alpha": self.alpha,
            "alpha_evict": self.alpha_evict,
            "max_times_sampled": self.max_times_sampled,
            "rate_limiter": None if self.rate_limiter is None else self.rate_limiter.to_json(),
            "spec": None if spec is None else json.loads(spec.to_json() if isinstance(spec, TransitionSpec) else spec),
            "storage": self.storage,
            "path": self.path,
            "durability": self.durability,
            "cache_bytes": self.cache_bytes,
            "kind": self.kind,
            "length": self.length,
            "burn_in": self.burn_in,
            "eta": self.eta,
            "strict_length": self.strict_length,
            "span": self.span,
        }

    @classmethod
    def from_json(cls, obj: Any, *, base_dir: str | None = None) -> TableConfig:
        """The table of a JSON object with TableConfig's field names (left out: the default; ``name`` is
        required). ``rate_limiter`` as in :func:`rate_limiter_from_json`; ``spec`` as an object, its JSON text
        or a file path (relative to ``base_dir`` when given). :class:`TableConfigError` naming the field."""
        if not isinstance(obj, Mapping):
            raise TableConfigError(
                None, "table", f"must be a JSON object with the TableConfig fields, got {type(obj).__name__}"
            )
        names = [f.name for f in fields(cls)]
        table = obj.get("name") if isinstance(obj.get("name"), str) else None
        unknown = [k for k in obj if k not in names]
        if unknown:
            raise TableConfigError(
                table, ", ".join(map(str, unknown)), f"no such field (the fields: {', '.join(names)})"
            )
        if "name" not in obj:
            raise TableConfigError(None, "name", "is required")
        values = dict(obj)
        if values.get("rate_limiter") is not None:
            try:
                values["rate_limiter"] = rate_limiter_from_json(values["rate_limiter"])
            except ValueError as e:
                raise TableConfigError(table, "rate_limiter", str(e)) from None
        if values.get("spec") is not None:
            try:
                values["spec"] = _spec_from_json(values["spec"], base_dir)
            except ValueError as e:
                raise TableConfigError(table, "spec", str(e)) from None
        return cls(**values)


def check_table_names(tables: Sequence[TableConfig]) -> None:
    """ValueError when ``tables`` is empty, holds something other than TableConfigs, or names a table twice."""
    if len(tables) == 0:
        raise ValueError("tables must hold at least one TableConfig")
    seen: dict[str, int] = {}
    for i, t in enumerate(tables):
        if not isinstance(t, TableConfig):
            raise ValueError(f"tables[{i}] must be a TableConfig, got {type(t).__name__}")
        if t.name in seen:
            raise ValueError(f"tables {seen[t.name]} and {i} are both named {t.name!r} (names are unique per server)")
        seen[t.name] = i
    paths: dict[str, str] = {}
    for t in tables:
        if t.path is None:
            continue
        where = os.path.realpath(t.path)
        if where in paths:
            raise ValueError(f"tables {paths[where]!r} and {t.name!r} are both stored at {t.path!r} (a path per table)")
        paths[where] = t.name


def tables_from_json(obj: Any, *, where: str = "tables", base_dir: str | None = None) -> list[TableConfig]:
    """The tables of a JSON list of table objects; ValueError starting with ``where``, then the table's index
    and name and the field."""
    if not isinstance(obj, list) or not obj:
        got = "an empty list" if isinstance(obj, list) else f"a JSON {type(obj).__name__}"
        raise ValueError(f"{where}: must be a JSON list of table objects (at least one), got {got}")
    tables: list[TableConfig] = []
    for i, item in enumerate(obj):
        try:
            tables.append(TableConfig.from_json(item, base_dir=base_dir))
        except TableConfigError as e:
            raise ValueError(e.located(f"{where}: table {i}")) from None
    try:
        check_table_names(tables)
    except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
    return tables


def load_tables(path: str | os.PathLike[str]) -> list[TableConfig]:
    """The tables of a ``--tables FILE``: a JSON list of objects with TableConfig's field names (module
    docstring). A spec given as a relative path is read relative to the file. ValueError naming the file, the
    table (index and name) and the field."""
    where = os.fspath(path)
    try:
        with open(where, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ValueError(f"{where}: cannot read the tables file: {e.strerror or e}") from None
    try:
        # NaN, Infinity and -Infinity (which strict JSON lacks) are read as the floats they name, so that the
        # field's own check refuses them, naming the table and the field ("a finite number").
        obj = json.loads(text, parse_constant=float)
    except json.JSONDecodeError as e:
        raise ValueError(f"{where}: not valid JSON: {e}") from None
    except (ValueError, RecursionError) as e:
        raise ValueError(f"{where}: {e}") from None
    return tables_from_json(obj, where=where, base_dir=os.path.dirname(os.path.abspath(where)))
