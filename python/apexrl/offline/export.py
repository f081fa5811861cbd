"""``apexrl export SNAPSHOT --out FILE``: a replay snapshot's items, keys and priorities as one ``.npz`` file.

The snapshot is checked whole by the native store first (``PrioritizedStore.load``: magic, version, every length,
every priority and the CRC-32C of the whole file), so a truncated or corrupted file is refused with the store's
own reason before anything is written. Its items are then read in insertion order (oldest first, across the lock
shards) from the snapshot's documented layout (below) and decoded with the TransitionSpec kept beside it
(``SNAPSHOT.spec.json``, which the replay server writes with every snapshot). Atari items, which reference frame
chunks stored once (``apexrl.replay.wire.frames``), are decoded into their agent's frame stacks: the export then
holds the agent's fields (obs, next_obs stacks) and its ``spec`` is the agent's spec.

The ``.npz`` layout (docs/offline.md), N items, one array per name::

    keys          uint64 (N,)   each item's key when the snapshot was saved (shard + (slot << 8) + (tag << 36))
    priorities    float64 (N,)  each item's priority (not priority^alpha)
    insertion     uint64 (N,)   each item's insertion number in the saved store (increasing: the rows' order)
    spec          str ()        the TransitionSpec JSON of the fields below
    store         str ()        the saved store's settings as JSON (capacity, max_size, alpha, shards, ...)
    <field>       (N, *shape)   one array per field of the spec (obs, action, reward, discount, next_obs for the
                                built-in agents), in the spec's dtype

Snapshot layout (format version 5, little-endian, written by ``ShardedStore::Save`` and ``Shard::Serialize``)::

    "APXRLST1" | u32 version | u32 epoch | u64 capacity | u64 max_size | f64 alpha | u32 shards |
    u32 eviction | f64 alpha_evict | u64 seed | u32 sampler | u32 max_times_sampled |
    per shard: u32 index | u64 num_slots | u32 tag[num_slots] |
               u64 num_chunks | per chunk: u32 id | u32 tag | u32 size | size bytes |
               u64 num_live |
               per item, oldest first: u32 slot | u64 seq | f64 priority | u32 size | u32 num_chunks |
                                       u32 times_sampled | u32 chunk_id[num_chunks] | size bytes |
               u64 counters[7] | u64 max_seq
    u64 next_seq | u64 next_shard | u64 sample_calls | u64 eviction_calls | u64 invalid_shard_keys |
    "APXRLEND" | u32 crc32c

Format 4 (before chunk keys) has no chunk tags. Format 3 (before samplers) has no sampler, max_times_sampled, times_sampled nor the seventh counter
(removed_by_sampling); format 2 (before frame chunks) also has neither the chunk table nor the items' num_chunks
and chunk ids. All four read.
"""

from __future__ import annotations

import json
import os
import struct
import zipfile
from dataclasses import dataclass
from typing import Any

import numpy as np

from apexrl._core import eviction_kinds, sampler_kinds

__all__ = [
    "ExportError",
    "RESERVED",
    "SNAPSHOT_VERSION",
    "SNAPSHOT_VERSIONS",
    "export_snapshot",
    "export_tables",
    "read_snapshot",
]

SNAPSHOT_VERSION = 5
"""The snapshot format the store writes (``kSnapshotVersion`` in cpp/apexrl/sharded_store.cc)."""
SNAPSHOT_VERSIONS = (2, 3, 4, 5)
"""The formats this reader knows."""
RESERVED = ("keys", "priorities", "insertion", "spec", "store")
"""Names of the ``.npz`` arrays that are not transition fields."""
_MAGIC, _END = b"APXRLST1", b"APXRLEND"
_EVICTION = {number: name for number, name, _ in eviction_kinds()}  # a snapshot's u32 kinds, by the store's tables
_SAMPLER = {number: name for number, name, _ in sampler_kinds()}
_SHARD_BITS, _SLOT_BITS = 8, 28


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
    """The live items of snapshot ``path`` (checked by the native store first); ExportError when it is missing,
    corrupt or of another version."""
    from apexrl._core import PrioritizedStore, SnapshotError

    path = os.fspath(path)
    if not os.path.isfile(path):
        raise ExportError(f"snapshot {path!r} does not exist (or is not a file)")
    try:
        PrioritizedStore.load(path)  # the whole file: structure, ranges and checksum
    except (SnapshotError, ValueError, OSError) as e:
        raise ExportError(f"snapshot {path!r} cannot be read: {e}") from None
    with open(path, "rb") as f:
        buf = f.read()
    try:
        return _parse(buf)
    except (struct.error, ValueError) as e:  # the store read it, so this reader is out of step with the writer
        raise ExportError(
            f"snapshot {path!r}: unexpected layout ({e}); this reader knows format versions {list(SNAPSHOT_VERSIONS)}"
        ) from None


def _parse(buf: bytes) -> SnapshotItems:
    if buf[:8] != _MAGIC:
        raise ValueError("not a snapshot (bad magic)")
    version, epoch, capacity, max_size, alpha, shards, eviction, alpha_evict, seed = struct.unpack_from(
        "<IIQQdIIdQ", buf, 8
    )
    if version not in SNAPSHOT_VERSIONS:
        raise ValueError(f"format version {version}")
    pos = 8 + struct.calcsize("<IIQQdIIdQ")
    sampler, max_times_sampled = 0, 0
    if version >= 4:
        sampler, max_times_sampled = struct.unpack_from("<II", buf, pos)
        pos += 8
    keys: list[int] = []
    prios: list[float] = []
    seqs: list[int] = []
    chunks: list[bytes] = []
    sizes: list[int] = []
    frame_chunks: list[bytes] = []  # every shard's chunks, one table
    refs: list[list[int]] = []  # per item, indices into frame_chunks
    item = struct.Struct("<IQdI")
    for expect in range(shards):
        index, num_slots = struct.unpack_from("<IQ", buf, pos)
        if index != expect:
            raise ValueError(f"shard {index} where {expect} was expected")
        pos += 12
        tags = np.frombuffer(buf, dtype="<u4", count=num_slots, offset=pos)
        pos += 4 * num_slots
        table: dict[int, int] = {}  # this shard's chunk id -> index in frame_chunks
        if version >= 3:
            (num_chunks,) = struct.unpack_from("<Q", buf, pos)
            pos += 8
            for _ in range(num_chunks):
                if version >= 5:  # u32 id, u32 tag, u32 size
                    cid, _tag, csize = struct.unpack_from("<III", buf, pos)
                    pos += 12
                else:
                    cid, csize = struct.unpack_from("<II", buf, pos)
                    pos += 8
                table[cid] = len(frame_chunks)
                frame_chunks.append(buf[pos : pos + csize])
                pos += csize
        (num_live,) = struct.unpack_from("<Q", buf, pos)
        pos += 8
        for _ in range(num_live):
            slot, seq, priority, size = item.unpack_from(buf, pos)
            pos += item.size
            ids: tuple[int, ...] = ()
            if version >= 3:
                (k,) = struct.unpack_from("<I", buf, pos)
                pos += 4
                if version >= 4:
                    pos += 4  # times_sampled
                ids = struct.unpack_from(f"<{k}I", buf, pos)
                pos += 4 * k
            refs.append([table[c] for c in ids])
            chunks.append(buf[pos : pos + size])
            sizes.append(size)
            pos += size
            keys.append((int(tags[slot]) << (_SHARD_BITS + _SLOT_BITS)) | (slot << _SHARD_BITS) | index)
            prios.append(priority)
            seqs.append(seq)
        pos += (8 if version >= 4 else 7) * 8  # the counters (7 from format 4, else 6) and max_seq
    pos += 5 * 8
    if buf[pos : pos + 8] != _END or len(buf) != pos + 12:
        raise ValueError("the end marker is not where the items end")
    order = np.argsort(np.asarray(seqs, np.uint64), kind="stable")
    offsets = np.zeros(len(sizes) + 1, np.uint64)
    np.cumsum(np.asarray(sizes, np.uint64)[order], out=offsets[1:])
    store = {
        "version": version,
        "epoch": epoch,
        "capacity": capacity,
        "max_size": max_size,
        "alpha": alpha,
        "shards": shards,
        "eviction": _EVICTION.get(eviction, str(eviction)),
        "alpha_evict": alpha_evict,
        "seed": seed,
        "sampler": _SAMPLER.get(sampler, str(sampler)),
        "max_times_sampled": max_times_sampled,
    }
    frames = None
    if frame_chunks:
        from apexrl.replay.wire.protocol import pack_chunks

        frames = pack_chunks(frame_chunks, [refs[i] for i in order.tolist()])
    return SnapshotItems(
        keys=np.asarray(keys, np.uint64)[order],
        priorities=np.asarray(prios, np.float64)[order],
        insertion=np.asarray(seqs, np.uint64)[order],
        data=np.frombuffer(b"".join(chunks[i] for i in order.tolist()), np.uint8),
        offsets=offsets,
        store=store,
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
    naming the table when a table has no spec, or is not in the snapshot; nothing of that table is written."""
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
    root, ext = os.path.splitext(os.fspath(out))
    written: dict[str, int] = {}
    for e in entries:
        name = e["name"]
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
