"""``apexrl export SNAPSHOT --out FILE``: a replay snapshot's items, keys and priorities as one ``.npz`` file.

The snapshot is read by the native store alone (``PrioritizedStore.load``: magic, version, every length, every
priority and the CRC-32C of the whole file), so a truncated or corrupted file is refused with the store's own
reason before anything is written; the restored store then hands over its items in insertion order (oldest
first, across the lock shards: ``PrioritizedStore.contents``), which are decoded with the TransitionSpec kept
beside the snapshot (``SNAPSHOT.spec.json``, which the replay server writes with every snapshot). Atari items,
which reference frame chunks stored once (``apexrl.replay.wire.frames``), are decoded into their agent's frame
stacks: the export then holds the agent's fields (obs, next_obs stacks) and its ``spec`` is the agent's spec.

The ``.npz`` layout (docs/offline.md), N items, one array per name::

    keys          uint64 (N,)   each item's key when the snapshot was saved (shard + (slot << 8) + (tag << 36))
    priorities    float64 (N,)  each item's priority (not priority^alpha)
    insertion     uint64 (N,)   each item's insertion number in the saved store (increasing: the rows' order)
    spec          str ()        the TransitionSpec JSON of the fields below
    store         str ()        the saved store's settings as JSON (capacity, max_size, alpha, shards, ...)
    <field>       (N, *shape)   one array per field of the spec (obs, action, reward, discount, next_obs for the
                                built-in agents), in the spec's dtype

The snapshot format is the store's (``ShardedStore::Save`` in cpp/apexrl/sharded_store.cc; docs/offline.md
prints it); ``store`` records the format version the file was written in (``PrioritizedStore.snapshot_version``).
"""

from __future__ import annotations

import json
import os
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = [
    "ExportError",
    "RESERVED",
    "export_snapshot",
    "export_tables",
    "read_snapshot",
]

RESERVED = ("keys", "priorities", "insertion", "spec", "store")
"""Names of the ``.npz`` arrays that are not transition fields."""


class ExportError(Exception):
    """The snapshot or its spec sidecar is missing, unreadable or corrupt (the message says which and why)."""


@dataclass
class SnapshotItems:
    """A snapshot's live items, oldest first."""

    keys: np.ndarray
    priorities: np.ndarray
    insertion: np.ndarray
    data: np.ndarray
    offsets: np.ndarray
    store: dict
    chunks: Any = None  # the items' frame chunks (protocol.FrameChunks); None when no item references one


def read_snapshot(path: str) -> SnapshotItems:
    """The live items of snapshot ``path``, read by the native store; ExportError when it is missing, corrupt or
    of a format this build does not read."""
    from apexrl._core import PrioritizedStore, SnapshotError

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ExportError(f"snapshot {path!r} does not exist (or is not a file)")
    try:
        store = PrioritizedStore.load(path)  # the whole file: structure, ranges and checksum
        version, epoch = PrioritizedStore.snapshot_version(path), PrioritizedStore.snapshot_epoch(path)
    except (SnapshotError, ValueError, OSError) as e:
        raise ExportError(f"snapshot {path!r} cannot be read: {e}") from None
    contents = store.contents()
    settings = {
        "version": version,
        "epoch": epoch,
        "capacity": store.capacity,
        "max_size": store.max_size,
        "alpha": store.alpha,
        "shards": store.shards,
        "eviction": store.eviction,
        "alpha_evict": store.alpha_evict,
        "seed": store.seed,
        "sampler": store.sampler,
        "max_times_sampled": store.max_times_sampled,
    }
    frames = None
    if contents["chunks"]:
        from apexrl.replay.wire.protocol import pack_chunks

        frames = pack_chunks(contents["chunks"], contents["item_chunks"])
    return SnapshotItems(
        keys=contents["keys"],
        priorities=contents["priorities"],
        insertion=contents["insertion"],
        data=contents["data"],
        offsets=contents["offsets"],
        store=settings,
        chunks=frames,
    )


def export_snapshot(snapshot: str, out: str, spec: str | None = None) -> int:
    """Write snapshot ``snapshot``'s items to ``out`` (``.npz``, layout in the module docstring), decoded with
    ``spec`` (a spec JSON file or text; default the sidecar ``SNAPSHOT.spec.json``). Returns the item count.
    ExportError before anything is written when the snapshot or the spec is missing or corrupt, or an item does
    not decode with the spec."""
    from apexrl.replay.server.insert_guard import load_spec, spec_sidecar

    if not os.path.isfile(snapshot):
        raise ExportError(f"snapshot {os.fspath(snapshot)!r} does not exist (or is not a file)")
    spec_path = spec if spec is not None else spec_sidecar(snapshot)
    if spec is None and not os.path.isfile(spec_path):
        raise ExportError(
            f"the spec sidecar {spec_path!r} of snapshot {os.fspath(snapshot)!r} does not exist "
            "(the replay server writes it beside every snapshot); give the spec with --spec"
        )
    try:
        transition_spec = load_spec(spec_path)
    except ValueError as e:
        raise ExportError(f"spec of {os.fspath(snapshot)!r}: {e}") from None
    clash = sorted(set(transition_spec.names) & set(RESERVED))
    if clash:
        raise ExportError(f"spec fields {clash} clash with the export's own arrays {list(RESERVED)}")
    items = read_snapshot(snapshot)
    from apexrl.replay.wire.frames import FrameStackCodec

    codec = FrameStackCodec.from_item_spec(transition_spec)  # Atari: items referencing frame chunks
    try:
        if codec is not None:
            fields = codec.decode(items.data, items.offsets, items.chunks)
            transition_spec = codec.spec
        else:
            fields = transition_spec.decode(items.data, items.offsets)
    except ValueError as e:
        raise ExportError(f"snapshot {os.fspath(snapshot)!r} does not decode with spec {spec_path!r}: {e}") from None
    clash = sorted(set(transition_spec.names) & set(RESERVED))
    if clash:
        raise ExportError(f"spec fields {clash} clash with the export's own arrays {list(RESERVED)}")
    arrays = {
        "keys": items.keys,
        "priorities": items.priorities,
        "insertion": items.insertion,
        "spec": np.array(transition_spec.to_json()),
        "store": np.array(json.dumps(items.store)),
        **fields,
    }
    out = os.fspath(out)
    parent = os.path.dirname(os.path.abspath(out))
    if not os.path.isdir(parent):
        raise ExportError(f"--out {out!r}: directory {parent!r} does not exist")
    tmp = f"{out}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            np.savez(f, **arrays)  # type: ignore[arg-type]  # numpy's stub types **kwds as its own flags
        os.replace(tmp, out)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return len(items.keys)


def load_export(path: str) -> dict[str, np.ndarray]:
    """An export's arrays by name (``spec`` and ``store`` as str); ValueError when ``path`` is not one."""
    try:
        with np.load(path, allow_pickle=False) as z:
            out = {name: z[name] for name in z.files}
    except (OSError, ValueError, zipfile.BadZipFile) as e:
        raise ValueError(f"{path!r} is not an apexrl export: {e}") from None
    missing = [name for name in RESERVED if name not in out]
    if missing:
        raise ValueError(f"{path!r} is not an apexrl export: no {missing}")
    for name in ("spec", "store"):
        out[name] = str(out[name])
    return out


def export_tables(snapshot: str, out: str, spec: str | None = None, table: str | None = None) -> dict[str, int]:
    """Export every table of ``snapshot`` (or the one named ``table``) -> table name: items written.

    A one-store snapshot (one table, ``default``) is written to ``out`` as :func:`export_snapshot` does. A
    tables snapshot (a server of several tables; apexrl.replay.server.tables) writes the table ``default`` (or
    the one table asked for) to ``out`` and every other table to ``out`` with ``.<name>`` before its
    extension (``replay.npz`` -> ``replay.aux.npz``), each decoded with ``spec`` when given, else with the spec
    its manifest keeps (``default``: the sidecar ``SNAPSHOT.spec.json`` if the manifest has none). ExportError
    naming the table when a table has no spec, or is not in the snapshot; nothing of that table is written. A
    slices table (whole episodes) is left out, and asked for by name, refused with the reason."""
    from apexrl.replay.server.insert_guard import spec_sidecar
    from apexrl.replay.server.tables import is_tables_snapshot, read_tables_manifest

    if not os.path.isfile(snapshot):
        raise ExportError(f"snapshot {os.fspath(snapshot)!r} does not exist (or is not a file)")
    if not is_tables_snapshot(snapshot):
        if table not in (None, "default"):
            raise ExportError(f"snapshot {os.fspath(snapshot)!r} holds one table, 'default', not {table!r}")
        return {"default": export_snapshot(snapshot, out, spec=spec)}
    entries = read_tables_manifest(snapshot)["tables"]
    names = [e["name"] for e in entries]
    if table is not None:
        entries = [e for e in entries if e["name"] == table]
        if not entries:
            raise ExportError(f"tables snapshot {os.fspath(snapshot)!r} has no table {table!r}; it has {names}")
    slices = [e["name"] for e in entries if e.get("kind") == "slices"]
    if table is not None and slices:
        raise ExportError(
            f"table {table!r} of snapshot {os.fspath(snapshot)!r} is a slices table (whole episodes, windows drawn "
            "at sample time): export writes transitions of item tables; a slices table's file is its own snapshot"
        )
    root, ext = os.path.splitext(os.fspath(out))
    written: dict[str, int] = {}
    for e in entries:
        name = e["name"]
        if name in slices:  # not transitions: left out of a whole-snapshot export (docstring)
            continue
        target = os.fspath(out) if table is not None or name == "default" else f"{root}.{name}{ext or '.npz'}"
        table_spec = spec
        if table_spec is None and e.get("spec") is not None:
            table_spec = json.dumps(e["spec"])
        if table_spec is None and name == "default" and os.path.isfile(spec_sidecar(snapshot)):
            table_spec = spec_sidecar(snapshot)
        if table_spec is None:
            raise ExportError(
                f"table {name!r} of snapshot {os.fspath(snapshot)!r} has no spec kept with it (its server never "
                "learnt one); give the spec with --spec (and --table to export that table alone)"
            )
        written[name] = export_snapshot(e["file"], target, spec=table_spec)
    return written
