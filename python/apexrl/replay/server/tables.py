"""The replay server's tables: their stores (one per table, each with its own key epoch), their rate limiters as
the native loop takes them, their description for HELLO and STATS, and snapshots that hold every table.

Keys (docs/protocol.md, "Tables"): a key is valid within its table only. Every table's store issues keys of its
own epoch, and the epochs of one server life are consecutive (``choose_epochs``: the life's base epoch, then
one more per table; ``PATH.epoch`` records the last one used), so a key of one table is stale on every other
table of this life and of the lives before it (until the 4095 epochs wrap), never another table's item.

Snapshots (docs/architecture.md, "Tables"): a server whose only table is ``default`` writes today's snapshot
format, one store file (so existing runs and tools see no change). A server of several tables writes a
*tables snapshot*: ``PATH`` is a small JSON manifest ``{"format": "apexrl-tables-snapshot", "version": 1,
"generation": G, "tables": [{"name", "file", "items"}...]}`` naming one store snapshot per table
(``PATH.g<G>.<index>.snap`` beside it). Each table file is written (atomically) before the manifest, which is
replaced atomically last; files of older generations are removed after it. So a crash mid-save leaves the
previous manifest and the files it names. Tables are saved one after the other, not at one instant. Loading
accepts either format: a one-store snapshot loads into the table ``default``. A slices table (``kind="slices"``,
never a server's only table) is an entry ``{"name", "file", "kind": "slices", "episodes"}`` whose file
(``PATH.g<G>.<index>.slices``) is its SliceTable's own snapshot (every episode's chunks and step priorities,
checksummed): a new life loads its episodes under their numbers, so window keys stay valid, and draws windows as
the table is configured now.
"""

from __future__ import annotations

import contextlib
import glob
import json
import logging
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

from apexrl import PrioritizedStore
from apexrl._core import DiskTable
from apexrl._core import SliceTable as NativeSliceTable
from apexrl.durable import write_atomically
from apexrl.replay.server.epoch import SnapshotLoadError, _write_epoch_file, choose_epoch
from apexrl.replay.tables import MinSize

__all__ = [
    "TABLES_SNAPSHOT_FORMAT",
    "TABLES_SNAPSHOT_VERSION",
    "ServerTable",
    "choose_epochs",
    "is_tables_snapshot",
    "limiter_of",
    "open_tables",
    "read_tables_manifest",
    "save_tables",
    "table_description",
]

log = logging.getLogger("apexrl.replay.server")
T = TypeVar("T")

TABLES_SNAPSHOT_FORMAT = "apexrl-tables-snapshot"
TABLES_SNAPSHOT_VERSION = 1
_MAX_MANIFEST_BYTES = 1 << 20


@dataclass
class ServerTable:
    """One table of a running server: its index (the header's ``table`` field), configuration and store (or, for a
    kind="slices" table, its native SliceTable: ``store`` is then None)."""

    index: int
    name: str
    config: Any  # apexrl.replay.TableConfig
    store: PrioritizedStore | None
    limiter: dict[str, Any]
    disk: Any = None  # apexrl._core.DiskTable of a storage="disk" table (its store is `store`), else None
    slices: Any = None  # apexrl._core.SliceTable of a kind="slices" table, else None

    @property
    def native(self) -> Any:
        """What the native loop serves: the store, or the SliceTable."""
        return self.slices if self.slices is not None else self.store

    def held(self) -> int:
        """Items held (a slices table: episodes)."""
        if self.slices is not None:
            return int(self.slices.stats()["episodes"])
        assert self.store is not None
        return len(self.store)

    def stats(self) -> dict[str, Any]:
        """The store's counters, or a slices table's (its SliceTable's, and ``size``: windows, ``bytes_held``:
        chunk and metadata bytes, ``inserted``: episodes inserted, as every table reports them)."""
        if self.slices is None:
            assert self.store is not None
            return dict(self.store.stats())
        s = dict(self.slices.stats())
        return {
            **s,
            "size": s["windows"],
            "bytes_held": s["chunk_bytes"] + s["metadata_bytes"],
            "inserted": s["inserted_episodes"],
            "evicted": s["evicted_episodes"],
            "total_priority": s["total_mass"],
        }


def limiter_of(rate_limiter: Any) -> dict[str, Any]:
    """A table's rate limiter as the native loop and ``--tables`` JSON spell it (``to_json()``): ``{"kind":
    "min_size", "min_size": N}``, ``{"kind": "sample_to_insert_ratio", "samples_per_insert": X,
    "min_size_to_sample": N, "error_buffer": E}`` or ``{"kind": "queue", "size": N}``; None: MinSize(1)."""
    if rate_limiter is None:
        return MinSize(1).to_json()
    if isinstance(rate_limiter, dict):
        return dict(rate_limiter)
    return dict(rate_limiter.to_json())


def table_description(table: ServerTable, spec: Any = None) -> dict[str, Any]:
    """HELLO's entry of one table: its index, name and configuration (rate limiter as in ``--tables``), and
    ``spec``, its pinned item structure (the TransitionSpec's JSON object; None until configured or declared).
    A slices table: its kind, window (length, burn_in), sampler and options, capacity in steps."""
    c = table.config
    if table.slices is not None:
        return {
            "index": table.index,
            "name": table.name,
            "kind": "slices",
            "sampler": c.sampler,
            "capacity": int(c.capacity),
            "length": int(c.length),
            "burn_in": int(c.burn_in),
            "alpha": float(c.alpha),
            "eta": float(c.eta),
            "strict_length": bool(c.strict_length),
            "span": int(c.span),
            "rate_limiter": dict(table.limiter),
            "spec": None,
        }
    assert table.store is not None
    return {
        "kind": "items",
        "index": table.index,
        "name": table.name,
        "sampler": c.sampler,
        "remover": c.remover,
        "capacity": int(c.capacity),
        "max_size": int(table.store.max_size),
        "alpha": float(c.alpha),
        "alpha_evict": float(c.alpha_evict),
        "max_times_sampled": int(c.max_times_sampled),
        "rate_limiter": dict(table.limiter),
        "epoch": int(table.store.epoch),
        "num_shards": int(table.store.shards),
        "spec": None if spec is None else json.loads(spec.to_json()),
    }


def _wrap(epoch: int) -> int:
    return (epoch - 1) % PrioritizedStore.MAX_EPOCH + 1


def choose_epochs(snapshot: str | os.PathLike[str] | None, n: int) -> list[int]:
    """Consecutive key epochs for the ``n`` tables of a new life: the first as :func:`choose_epoch` picks it,
    the others after it; ``PATH.epoch`` records the last, so the next life starts after all of them."""
    if n < 1 or n >= PrioritizedStore.MAX_EPOCH:
        raise ValueError(f"a server holds 1..{PrioritizedStore.MAX_EPOCH - 1} tables, got {n}")
    base = choose_epoch(snapshot)  # without a path: drawn at random (and logged)
    if snapshot is None:
        return [_wrap(base + i) for i in range(n)]
    epochs = [_wrap(base + i) for i in range(n)]
    if n > 1:
        _write_epoch_file(os.fspath(snapshot) + ".epoch", epochs[-1])
    return epochs


def is_tables_snapshot(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` is a tables snapshot's manifest (else: a one-store snapshot, or not a snapshot)."""
    return _manifest_ok(path)


def _manifest_ok(path: str | os.PathLike[str]) -> bool:
    try:
        _read_manifest(path)
    except (SnapshotLoadError, OSError):
        return False
    return True


def _read_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    with open(path, "rb") as f:
        raw = f.read(_MAX_MANIFEST_BYTES + 1)
    if len(raw) > _MAX_MANIFEST_BYTES or not raw.lstrip().startswith(b"{"):
        raise SnapshotLoadError(f"{os.fspath(path)!r} is not a tables snapshot")
    try:
        manifest = json.loads(raw)
    except ValueError as exc:
        raise SnapshotLoadError(f"tables snapshot {os.fspath(path)!r} is not valid JSON: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != TABLES_SNAPSHOT_FORMAT:
        raise SnapshotLoadError(f"{os.fspath(path)!r} is not a tables snapshot")
    if manifest.get("version") != TABLES_SNAPSHOT_VERSION:
        raise SnapshotLoadError(
            f"tables snapshot {os.fspath(path)!r} has version {manifest.get('version')!r}; this server reads "
            f"version {TABLES_SNAPSHOT_VERSION}"
        )
    tables = manifest.get("tables")
    if not isinstance(tables, list) or not all(
        isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("file"), str) for t in tables
    ):
        raise SnapshotLoadError(f"tables snapshot {os.fspath(path)!r}: 'tables' must list {{name, file}} objects")
    return manifest


def _store_kwargs(config: Any, server: Any, epoch: int, seed: int) -> dict[str, Any]:
    """A table's store settings, as PrioritizedStore and DiskTable take them."""
    return dict(
        capacity=config.capacity,
        max_size=config.max_size,
        alpha=config.alpha,
        shards=server.shards,
        eviction=config.remover,
        alpha_evict=config.alpha_evict,
        seed=seed,
        epoch=epoch,
        sampler=config.sampler,
        max_times_sampled=config.max_times_sampled,
    )


def _new_store(config: Any, server: Any, epoch: int, seed: int) -> PrioritizedStore:
    return PrioritizedStore(**_store_kwargs(config, server, epoch, seed))


def _load_store(path: str, epoch: int, what: str) -> PrioritizedStore:
    return _loaded(lambda: PrioritizedStore.load(path, epoch), f"{what} {path!r}", "an empty store")


def _loaded(load: Callable[[], T], what: str, instead: str) -> T:
    """``load()``, any failure (SnapshotError, OSError, ...) raised as SnapshotLoadError naming ``what`` and how
    to start with ``instead``."""
    try:
        return load()
    except Exception as exc:
        raise SnapshotLoadError(
            f"cannot load {what}: {type(exc).__name__}: {exc} (move or delete the file to start with {instead})"
        ) from exc


def _warn_differences(store: PrioritizedStore, config: Any, server: Any, where: str) -> None:
    for name, store_name in (("capacity", "capacity"), ("alpha", "alpha"), ("alpha_evict", "alpha_evict")):
        if getattr(store, store_name) != getattr(config, name):
            log.warning(
                "%s has %s=%r, configuration says %r: the snapshot's value is used",
                where,
                name,
                getattr(store, store_name),
                getattr(config, name),
            )
    wanted_max = config.max_size if config.max_size is not None else 2 * config.capacity
    if store.max_size != wanted_max:
        log.warning(
            "%s has max_size=%r, configuration says %r: the snapshot's value is used", where, store.max_size, wanted_max
        )
    if store.shards != server.shards:
        log.warning(
            "%s has shards=%r, configuration says %r: the snapshot's value is used", where, store.shards, server.shards
        )


def open_tables(server: Any) -> list[ServerTable]:
    """The tables of a new server life (``server``: its ServerConfig), restored from its snapshot when there is
    one; SnapshotLoadError when the snapshot cannot be loaded, ValueError for a configuration it cannot serve."""
    configs = list(server.tables)  # at least one, names distinct: ServerConfig checked them
    names = [c.name for c in configs]
    path = server.snapshot
    restore = path is not None and os.path.exists(path)
    if restore and _manifest_ok(path):
        _check_left_out(_read_manifest(path), names, server.drop_tables, os.fspath(path))
    epochs = choose_epochs(path, len(configs))
    stores: dict[str, PrioritizedStore] = {}
    slice_files: dict[str, str] = {}
    if restore:
        assert path is not None
        if _manifest_ok(path):
            manifest = _read_manifest(path)
            directory = os.path.dirname(os.path.abspath(path))
            by_name = {t["name"]: t for t in manifest["tables"]}
            for i, c in enumerate(configs):
                entry = by_name.pop(c.name, None)
                if c.storage == "disk":
                    log.info("table %r is on disk: its items come from its log, not from the snapshot", c.name)
                    continue
                if entry is None:
                    log.warning("tables snapshot %s holds no table %r: it starts empty", os.fspath(path), c.name)
                    continue
                file = os.path.join(directory, os.path.basename(entry["file"]))
                if (entry.get("kind") == "slices") != (c.kind == "slices"):
                    raise SnapshotLoadError(
                        f"tables snapshot {os.fspath(path)!r} holds table {c.name!r} as a "
                        f"{entry.get('kind', 'items')} table and the configuration makes it a {c.kind} table; "
                        "nothing was loaded or changed (configure it as it was, or name the new table otherwise)"
                    )
                if c.kind == "slices":
                    slice_files[c.name] = file
                    continue
                stores[c.name] = _load_store(file, epochs[i], f"table {c.name!r} of tables snapshot")
            for name in by_name:
                log.warning(
                    "tables snapshot %s holds table %r, which is not configured: dropped on purpose "
                    "(--drop-tables); the next snapshot no longer holds its items",
                    os.fspath(path),
                    name,
                )
        elif any(c.name == "default" and c.storage == "disk" for c in configs):
            log.info("table 'default' is on disk: its items come from its log, not from snapshot %s", os.fspath(path))
        else:  # today's one-store format: the table `default`
            if "default" not in names:
                raise SnapshotLoadError(
                    f"snapshot {os.fspath(path)!r} holds one store (the format before tables), which loads into the "
                    f"table 'default', and no table of that name is configured ({names})"
                )
            stores["default"] = _load_store(os.fspath(path), epochs[names.index("default")], "snapshot")
    tables = []
    for i, c in enumerate(configs):
        if c.kind == "slices":
            tables.append(_slice_table(i, c, int(server.seed) + i, slice_files.get(c.name)))
            continue
        if c.storage == "disk":
            tables.append(_open_disk_table(i, c, server, epochs[i]))
            continue
        store = stores.get(c.name)
        if store is not None:
            _warn_differences(store, c, server, f"snapshot table {c.name!r}")
            log.info("table %r: restored %d items; new keys carry epoch %d", c.name, len(store), store.epoch)
        else:
            store = _new_store(c, server, epochs[i], int(server.seed) + i)
            log.info("table %r: new store; its keys carry epoch %d", c.name, epochs[i])
        tables.append(ServerTable(i, c.name, c, store, limiter_of(c.rate_limiter)))
    return tables


def _open_disk_table(index: int, config: Any, server: Any, epoch: int) -> ServerTable:
    """A storage="disk" table, its log replayed (OSError: another process holds it, or it cannot be read;
    ValueError: a log of another shard count); what its recovery dropped is logged as a warning."""
    disk = DiskTable(
        config.path,
        durability=config.durability,
        cache_bytes=config.cache_bytes,
        **_store_kwargs(config, server, epoch, int(server.seed) + index),
    )
    opened = disk.opened
    if opened["dropped_bytes"] or opened["dropped_segments"]:
        log.warning(
            "table %r: its log at %s ended early (%s): %d bytes and %d segments after its last whole record were "
            "dropped; the table opens at its last consistent state",
            config.name,
            config.path,
            opened["reason"],
            opened["dropped_bytes"],
            opened["dropped_segments"],
        )
    log.info(
        "table %r: on disk at %s (durability %s): %d items from %d records of %d earlier lives (%d bytes of log "
        "compacted away); new keys carry epoch %d",
        config.name,
        config.path,
        config.durability,
        opened["items"],
        opened["records"],
        opened["lives"],
        opened["compacted_bytes"],
        opened["epoch"],
    )
    return ServerTable(index, config.name, config, disk.store, limiter_of(config.rate_limiter), disk)


def _slice_table(index: int, config: Any, seed: int, snapshot: str | None = None) -> ServerTable:
    """A kind="slices" table: a new SliceTable, its episodes loaded from ``snapshot`` (its file in a tables
    snapshot) when given; SnapshotLoadError when that file cannot be loaded."""
    native = NativeSliceTable(
        int(config.capacity),
        int(config.length),
        int(config.burn_in),
        config.sampler,
        float(config.alpha),
        float(config.eta),
        bool(config.strict_length),
        int(config.span),
        seed,
    )
    restored = ""
    if snapshot is not None:
        episodes = _loaded(
            lambda: native.load(snapshot), f"slices table {config.name!r} from {snapshot!r}", "the table empty"
        )
        s = native.stats()
        restored = f"; restored {episodes} episodes, {s['steps']} steps, {s['windows']} windows"
        if s["evicted_episodes"]:
            restored += f" ({s['evicted_episodes']} older episodes did not fit its capacity and were dropped)"
    log.info(
        "table %r: slices of %d steps after %d of burn-in, %s, up to %d steps held%s",
        config.name,
        config.length,
        config.burn_in,
        config.sampler,
        config.capacity,
        restored,
    )
    return ServerTable(index, config.name, config, None, limiter_of(config.rate_limiter), slices=native)


def _check_left_out(manifest: dict[str, Any], names: list[str], drop: Sequence[str], path: str) -> None:
    """SnapshotLoadError (before anything is loaded or written) when the snapshot holds a table that the
    configuration leaves out and ``drop`` (--drop-tables) does not name: a configuration slip must not delete
    what was accepted, since the next snapshot would no longer hold it."""
    kept = [t for t in manifest["tables"] if t["name"] not in names and t["name"] not in drop]
    if kept:
        listed = ", ".join(f"{t['name']!r} ({t.get('items', '?')} items)" for t in kept)
        raise SnapshotLoadError(
            f"tables snapshot {path!r} holds table(s) {listed} that the configuration leaves out (it configures "
            f"{names}); nothing was loaded or changed. Configure them again (--tables), or delete their items on "
            f"purpose with --drop-tables {' '.join(t['name'] for t in kept)}"
        )


def read_tables_manifest(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A tables snapshot's manifest (module docstring), each entry's ``file`` made a path beside ``path``;
    SnapshotLoadError when ``path`` is not one."""
    manifest = _read_manifest(path)
    directory = os.path.dirname(os.path.abspath(path))
    for entry in manifest["tables"]:
        entry["file"] = os.path.join(directory, os.path.basename(entry["file"]))
    return manifest


def save_tables(
    tables: list[ServerTable], path: str | os.PathLike[str], specs: dict[str, str | None] | None = None
) -> int:
    """Write the snapshot of every memory table and slices table to ``path`` (module docstring; a table on disk
    is left out: its log holds its items, and a server whose only table is ``default`` on disk writes a manifest
    of no table); the items saved (a slices table's: its episodes). ``specs``: each
    table's spec JSON (None: none known), kept in the manifest for ``apexrl export``. Raises what the stores
    raise (OSError, SnapshotError), the previous snapshot kept."""
    path = os.fspath(path)
    if len(tables) == 1 and tables[0].name == "default" and tables[0].disk is None and tables[0].store is not None:
        store = tables[0].store
        assert store is not None
        n = len(store)
        store.save(path)
        return n
    directory = os.path.dirname(os.path.abspath(path))
    base = os.path.basename(path)
    generation = 1
    with contextlib.suppress(SnapshotLoadError, OSError):
        generation = int(_read_manifest(path).get("generation", 0)) + 1
    entries, total = [], 0
    for t in tables:
        if t.disk is not None:  # its log holds its items (docs/running.md, "Tables on disk")
            continue
        if t.slices is not None:
            file = f"{base}.g{generation}.{t.index}.slices"
            n = int(t.slices.save(os.path.join(directory, file)))
            entries.append({"name": t.name, "file": file, "kind": "slices", "episodes": n, "items": n})
            total += n
            continue
        file = f"{base}.g{generation}.{t.index}.snap"
        items = t.store
        assert items is not None
        n = len(items)
        items.save(os.path.join(directory, file))
        spec = (specs or {}).get(t.name)
        entries.append({"name": t.name, "file": file, "items": n, "spec": None if spec is None else json.loads(spec)})
        total += n
    manifest = {
        "format": TABLES_SNAPSHOT_FORMAT,
        "version": TABLES_SNAPSHOT_VERSION,
        "generation": generation,
        "tables": entries,
    }
    write_atomically(path, json.dumps(manifest, indent=1) + "\n")
    keep = {e["file"] for e in entries}
    older = [
        *glob.glob(os.path.join(glob.escape(directory), glob.escape(base) + ".g*.snap")),
        *glob.glob(os.path.join(glob.escape(directory), glob.escape(base) + ".g*.slices")),
    ]
    for old in older:
        if os.path.basename(old) not in keep:
            with contextlib.suppress(OSError):
                os.unlink(old)
    return total
