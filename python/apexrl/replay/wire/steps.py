"""Trajectory steps on the wire: step chunks and sequence items (protocol version 6; docs/protocol.md, "Step
chunks and sequence items").

A :class:`~apexrl.replay.client.trajectory.TrajectoryWriter` sends the steps of an episode once, in *step chunks*
of up to ``chunk_length`` consecutive steps, and makes items that reference the chunks covering their step range
(server-side chunks, kept while an item references them). Both are self-describing byte strings:

* a step chunk: ``b"APXS"``, u16 version (1), u16 0, u32 header length H, H bytes of JSON
  ``{"fp": fingerprint, "k": steps, "f": [[path, dtype, shape, codec, stored_bytes], ...]}``, then each field's column (the field's
  ``steps`` values, row-major, ``steps * prod(shape)`` elements) in the header's order, lz4-compressed
  (``codec`` 1, one lz4 block) or raw (``codec`` 0: where lz4 does not pay, e.g. floats that do not compress);
* a sequence item: ``b"APXQ"``, u16 version (1), u16 0, u32 H, H bytes of JSON ``{"fp": fingerprint, "first":
  first step within the concatenation of its chunks, "n": steps, "t": max_sequence_length, "x": [[path, dtype,
  shape], ...]}`` (the extras' structure), then each extra's bytes (raw) in that order.

``path`` is the field's position in the (nested) step mapping, its keys joined with ``/``. ``fingerprint`` is
:func:`structure_fingerprint` of the step structure, the same in the item and in each chunk it references.
Decoding (:func:`decode_sequences`) checks that the item's step range lies inside its chunks and that the chunks
hold its structure; an item that breaks either is marked invalid (``valid[i]`` False, its mask all False), never
read out of bounds. Never imports torch.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import lz4.block
import numpy as np

from apexrl.replay.wire import structure as _structure

__all__ = [
    "CHUNK_MAGIC",
    "ITEM_MAGIC",
    "Field",
    "SequenceBatch",
    "decode_chunk",
    "decode_item",
    "decode_sequences",
    "encode_chunk",
    "encode_item",
    "flatten",
    "is_sequence_item",
    "structure_fingerprint",
    "structure_of",
    "unflatten",
]

CHUNK_MAGIC = b"APXS"
ITEM_MAGIC = b"APXQ"
_VERSION = 1
_PREFIX = struct.Struct("<4sHHI")
_RAW, _LZ4 = 0, 1
# lz4 is tried on these kinds (integers, booleans: observations, actions, flags compress well); floats are sent raw
# unless the compressed column is at most 3/4 of the raw one (checked, since a float column of zeros still pays).
_LZ4_PAYS = 0.75
_MAX_HEADER = 1 << 20


@dataclass(frozen=True)
class Field:
    """One leaf of a step (or extras) structure: its path (keys joined with "."), dtype and per-step shape."""

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def describe(self) -> list[Any]:
        return [self.path, self.dtype.str, list(self.shape)]


def flatten(structure: Mapping[str, Any], what: str = "step") -> dict[str, np.ndarray]:
    """The leaves of a nested mapping of array-likes by path (keys joined by ".", as a structured item's field
    names: :func:`apexrl.replay.wire.structure.flatten`, the one flattening), in sorted path order so that a
    structure's fingerprint does not depend on the order its keys were given in."""
    if not isinstance(structure, Mapping):
        raise ValueError(
            f"a {what} must be a mapping of arrays (nested mappings allowed), got {type(structure).__name__}"
        )
    leaves = _structure.flatten(structure)
    return {path: leaves[path] for path in sorted(leaves)}


unflatten = _structure.unflatten


def structure_of(leaves: Mapping[str, np.ndarray]) -> tuple[Field, ...]:
    """The structure (path, dtype, shape per leaf) of flattened leaves."""
    return tuple(Field(p, np.dtype(a.dtype).newbyteorder("<"), tuple(a.shape)) for p, a in leaves.items())


def structure_fingerprint(fields: Sequence[Field]) -> int:
    """A 63-bit fingerprint of a structure (paths, dtypes, shapes), the same in every process."""
    text = json.dumps([f.describe() for f in fields], separators=(",", ":"))
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 1


def _header(magic: bytes, meta: dict[str, Any]) -> bytes:
    text = json.dumps(meta, separators=(",", ":")).encode()
    return _PREFIX.pack(magic, _VERSION, 0, len(text)) + text


def _read_header(blob: memoryview, magic: bytes) -> tuple[dict[str, Any], int]:
    if len(blob) < _PREFIX.size:
        raise ValueError(f"{len(blob)} bytes: too short for a {magic!r} header")
    got, version, flags, length = _PREFIX.unpack_from(blob, 0)
    if got != magic:
        raise ValueError(f"magic {bytes(got)!r}, expected {magic!r}")
    if version != _VERSION or flags != 0:
        raise ValueError(f"version {version} (flags {flags}); this build reads version {_VERSION}")
    if length > _MAX_HEADER or _PREFIX.size + length > len(blob):
        raise ValueError(f"header of {length} bytes does not fit in {len(blob)}")
    meta = json.loads(bytes(blob[_PREFIX.size : _PREFIX.size + length]))
    if not isinstance(meta, dict):
        raise ValueError("header is not a JSON object")
    return meta, _PREFIX.size + length


def encode_chunk(fields: Sequence[Field], columns: Sequence[np.ndarray], fingerprint: int) -> bytes:
    """A step chunk of ``columns[j]`` (shape (k, *fields[j].shape), dtype fields[j].dtype) for k >= 1 steps."""
    k = int(columns[0].shape[0])
    parts: list[bytes] = []
    described: list[list[Any]] = []
    for f, col in zip(fields, columns, strict=True):
        raw = np.ascontiguousarray(col, dtype=f.dtype).tobytes()
        codec, blob = _RAW, raw
        if raw:
            packed = lz4.block.compress(raw, store_size=False)
            if (f.dtype.kind in "biu" or len(packed) <= _LZ4_PAYS * len(raw)) and len(packed) < len(raw):
                codec, blob = _LZ4, packed
        parts.append(blob)
        described.append([*f.describe(), codec, len(blob)])
    return _header(CHUNK_MAGIC, {"fp": fingerprint, "k": k, "f": described}) + b"".join(parts)


def decode_chunk(blob: Any) -> tuple[int, int, dict[str, np.ndarray]]:
    """(steps k, fingerprint, path -> column of shape (k, *shape)) of a step chunk; ValueError for a malformed
    one."""
    view = memoryview(blob).cast("B")
    meta, at = _read_header(view, CHUNK_MAGIC)
    k, fp = meta.get("k"), meta.get("fp")
    described = meta.get("f")
    if not isinstance(k, int) or k < 1 or not isinstance(fp, int) or not isinstance(described, list):
        raise ValueError("chunk header needs k >= 1, a fingerprint and a field list")
    out: dict[str, np.ndarray] = {}
    for entry in described:
        path, dtype, shape, codec, stored = entry
        dt = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        count = k * int(np.prod(shape, dtype=np.int64))
        raw_size = count * dt.itemsize
        if stored < 0 or at + stored > len(view):
            raise ValueError(f"chunk field {path!r}: {stored} bytes past the chunk's end")
        body = view[at : at + stored]
        at += stored
        if codec == _LZ4:
            data = lz4.block.decompress(bytes(body), uncompressed_size=raw_size)
        elif codec == _RAW:
            data = body
        else:
            raise ValueError(f"chunk field {path!r}: unknown codec {codec}")
        if len(data) != raw_size:
            raise ValueError(f"chunk field {path!r}: {len(data)} bytes, expected {raw_size}")
        out[path] = np.frombuffer(data, dtype=dt, count=count).reshape((k, *shape))
    if at != len(view):
        raise ValueError(f"chunk has {len(view) - at} trailing bytes")
    return k, fp, out


def encode_item(
    fingerprint: int, first: int, n: int, max_sequence_length: int, extras: Mapping[str, np.ndarray] | None
) -> bytes:
    """A sequence item: steps [first, first + n) of the concatenation of its chunks, its flattened extras."""
    leaves = dict(extras or {})
    fields = structure_of(leaves)
    meta = {"fp": fingerprint, "first": first, "n": n, "t": max_sequence_length, "x": [f.describe() for f in fields]}
    body = b"".join(np.ascontiguousarray(leaves[f.path], dtype=f.dtype).tobytes() for f in fields)
    return _header(ITEM_MAGIC, meta) + body


def is_sequence_item(blob: Any) -> bool:
    return bytes(memoryview(blob)[:4]) == ITEM_MAGIC


def decode_item(blob: Any) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """(header, path -> extra) of a sequence item; ValueError for a malformed one."""
    view = memoryview(blob).cast("B")
    meta, at = _read_header(view, ITEM_MAGIC)
    for key in ("fp", "first", "n", "t"):
        if not isinstance(meta.get(key), int) or meta[key] < 0:
            raise ValueError(f"item header: {key} must be an integer >= 0")
    extras: dict[str, np.ndarray] = {}
    for path, dtype, shape in meta.get("x", []):
        dt = np.dtype(dtype)
        shape = tuple(int(s) for s in shape)
        size = int(np.prod(shape, dtype=np.int64)) * dt.itemsize
        if at + size > len(view):
            raise ValueError(f"item extra {path!r} past the item's end")
        extras[path] = np.frombuffer(view[at : at + size], dtype=dt).reshape(shape)
        at += size
    if at != len(view):
        raise ValueError(f"item has {len(view) - at} trailing bytes")
    return meta, extras


@dataclass
class SequenceBatch:
    """Sequences decoded from a sampled batch: ``fields`` (nested like the appended steps) holds arrays of shape
    (n, T, ...), T the longest max_sequence_length among the batch's items; ``mask`` (n, T) is True at the valid
    steps of each item (its first ``num_steps`` positions; an item shorter than T is padded with zeros);
    ``extras`` (nested) holds arrays of shape (n, ...) (zeros where an item has none); ``valid`` (n,) is False for
    an item that could not be decoded (its mask all False)."""

    fields: dict[str, Any]
    mask: np.ndarray
    extras: dict[str, Any]
    valid: np.ndarray
    num_steps: np.ndarray


def _chunk_header(blob: memoryview) -> tuple[int, int, dict[str, tuple[np.dtype, tuple[int, ...], int, int, int]]]:
    """(steps k, fingerprint, path -> (dtype, shape, codec, stored bytes, offset in the blob)) of a step chunk,
    every column inside the blob and of a known codec; ValueError otherwise. Decompresses nothing."""
    meta, at = _read_header(blob, CHUNK_MAGIC)
    k, fp, described = meta.get("k"), meta.get("fp"), meta.get("f")
    if not isinstance(k, int) or k < 1 or not isinstance(fp, int) or not isinstance(described, list):
        raise ValueError("chunk header needs k >= 1, a fingerprint and a field list")
    fields: dict[str, tuple[np.dtype, tuple[int, ...], int, int, int]] = {}
    for path, dtype, shape, codec, stored in described:
        dt = np.dtype(dtype)
        shp = tuple(int(d) for d in shape)
        if codec not in (_RAW, _LZ4) or not isinstance(stored, int) or stored < 0 or at + stored > len(blob):
            raise ValueError(f"chunk field {path!r}: codec {codec}, {stored} bytes at {at} of {len(blob)}")
        if any(d < 0 for d in shp) or dt.hasobject or path in fields:
            raise ValueError(f"chunk field {path!r}: bad shape, dtype or a repeated path")
        fields[str(path)] = (dt, shp, int(codec), stored, at)
        at += stored
    if at != len(blob):
        raise ValueError(f"chunk has {len(blob) - at} trailing bytes")
    return k, fp, fields


def decode_sequences(
    items: Sequence[Any],
    chunk_blobs: Sequence[Any],
    refs: Sequence[np.ndarray],
    *,
    chunk_data: Any = None,
    chunk_offsets: np.ndarray | None = None,
    native: bool | None = None,
) -> SequenceBatch:
    """Decode the sequence items of a sampled batch: ``items[i]``'s bytes, the batch's chunks, and item i's
    references into them (``refs[i]``, in the item's order). With ``chunk_data`` and ``chunk_offsets`` (the
    chunks' bytes in one buffer, as a SAMPLE reply carries them) the steps are copied natively with the GIL released
    (``apexrl._core.decode_steps``; ``native=False``: numpy, the reference); the result is the same."""
    n = len(items)
    metas: list[dict[str, Any] | None] = []
    extras_of: list[dict[str, np.ndarray]] = []
    for blob in items:
        try:
            meta, extras = decode_item(blob)
        except (ValueError, TypeError, KeyError, json.JSONDecodeError):
            meta, extras = None, {}
        metas.append(meta)
        extras_of.append(extras)
    headers: dict[int, Any] = {}

    def header(c: int) -> Any:
        if c not in headers:
            try:
                headers[c] = _chunk_header(memoryview(chunk_blobs[c]).cast("B")) if 0 <= c < len(chunk_blobs) else None
            except (ValueError, TypeError, KeyError, json.JSONDecodeError):
                headers[c] = None
        return headers[c]

    # Each item's plan: its chunks and its step range, checked; the batch's structure is the first good item's.
    structure: dict[str, tuple[np.dtype, tuple[int, ...]]] | None = None
    plans: list[list[tuple[int, int, int, int]] | None] = []  # per item: (chunk, src_row, dst_row, rows)
    for i in range(n):
        meta = metas[i]
        plan = None
        chunk_ids = [int(c) for c in refs[i]] if meta is not None else []
        parts = [header(c) for c in chunk_ids]
        if meta is not None and parts and all(p is not None for p in parts):
            here = {path: (f[0], f[1]) for path, f in parts[0][2].items()}
            same = all(p[1] == meta["fp"] and {q: (f[0], f[1]) for q, f in p[2].items()} == here for p in parts)
            first, steps = int(meta["first"]), int(meta["n"])
            total = sum(p[0] for p in parts)
            # The item's step range must lie inside its chunks (else it is invalid, never read out of bounds).
            if same and here and 1 <= steps <= int(meta["t"]) and first + steps <= total:
                if structure is None:
                    structure = here
                if here == structure:
                    plan = []
                    start = 0  # the concatenation's step of this chunk's first step
                    for c, p in zip(chunk_ids, parts, strict=True):
                        lo, hi = max(first, start), min(first + steps, start + p[0])
                        if lo < hi:
                            plan.append((c, lo - start, lo - first, hi - lo))
                        start += p[0]
        plans.append(plan)
    valid = np.array([p is not None for p in plans], dtype=bool)
    t = max((int(m["t"]) for m, ok in zip(metas, valid, strict=True) if ok and m is not None), default=0)
    paths = list(structure or {})
    out: dict[str, np.ndarray] = {}
    for path in paths:
        dt, shape = (structure or {})[path]
        out[path] = np.zeros((n, t, *shape), dtype=dt.newbyteorder("="))
    if native is None:
        native = chunk_data is not None and chunk_offsets is not None
    if paths and valid.any():
        if native and chunk_offsets is not None:
            copied = _copy_native(out, paths, plans, headers, chunk_data, chunk_offsets, n, t)
        else:
            copied = _copy_numpy(out, paths, plans, headers, chunk_blobs)
        for bad in np.flatnonzero(valid & ~copied):
            valid[bad] = False
            for a in out.values():
                a[bad] = 0
    num_steps = np.array(
        [int(m["n"]) if good and m is not None else 0 for m, good in zip(metas, valid, strict=True)], dtype=np.int64
    )
    mask = np.arange(t)[None, :] < num_steps[:, None]
    # Extras: the structure of the first valid item that has them; an item without (or with others) gets zeros.
    extras_structure: dict[str, np.ndarray] = {}
    for i in range(n):
        if valid[i] and extras_of[i]:
            extras_structure = extras_of[i]
            break
    extras_out = {p: np.zeros((n, *a.shape), dtype=a.dtype.newbyteorder("=")) for p, a in extras_structure.items()}
    for i in range(n):
        if not valid[i]:
            continue
        for p, a in extras_of[i].items():
            if p in extras_out and extras_out[p].shape[1:] == a.shape:
                extras_out[p][i] = a
    return SequenceBatch(unflatten(out), mask, unflatten(extras_out), valid, num_steps)


def _copy_numpy(
    out: dict[str, np.ndarray],
    paths: list[str],
    plans: list[list[tuple[int, int, int, int]] | None],
    headers: dict[int, Any],
    chunk_blobs: Sequence[Any],
) -> np.ndarray:
    """The reference copy: each column a plan needs decompressed once; ok per item."""
    ok = np.ones(len(plans), dtype=bool)
    columns: dict[tuple[int, str], np.ndarray | None] = {}

    def column(c: int, path: str) -> np.ndarray | None:
        if (c, path) not in columns:
            k, _fp, fields = headers[c]
            dt, shape, codec, stored, at = fields[path]
            count = k * int(np.prod(shape, dtype=np.int64))
            body = memoryview(chunk_blobs[c]).cast("B")[at : at + stored]
            try:
                data = lz4.block.decompress(bytes(body), uncompressed_size=count * dt.itemsize) if codec else body
                col = np.frombuffer(data, dtype=dt, count=count).reshape((k, *shape))
            except (ValueError, lz4.block.LZ4BlockError):
                col = None
            columns[(c, path)] = col
        return columns[(c, path)]

    for i, plan in enumerate(plans):
        for c, src, dst, rows in plan or ():
            for path in paths:
                col = column(c, path)
                if col is None:
                    ok[i] = False
                    break
                out[path][i, dst : dst + rows] = col[src : src + rows]
    return ok


def _copy_native(
    out: dict[str, np.ndarray],
    paths: list[str],
    plans: list[list[tuple[int, int, int, int]] | None],
    headers: dict[int, Any],
    chunk_data: Any,
    chunk_offsets: np.ndarray,
    n: int,
    t: int,
) -> np.ndarray:
    """The same copy in C++ (apexrl._core.decode_steps), the GIL released."""
    from apexrl._core import decode_steps  # the extension, only where sequences decode

    used = sorted({c for plan in plans for c, *_ in plan or ()})
    index = {c: j for j, c in enumerate(used)}
    columns = np.zeros((len(used), len(paths), 3), dtype=np.uint64)
    steps = np.zeros(len(used), dtype=np.uint64)
    for j, c in enumerate(used):
        k, _fp, fields = headers[c]
        steps[j] = k
        base = int(chunk_offsets[c])
        for f, path in enumerate(paths):
            _dt, _shape, codec, stored, at = fields[path]
            columns[j, f] = (base + at, stored, codec)
    copies = np.array(
        [(index[c], src, i, dst, rows) for i, plan in enumerate(plans) for c, src, dst, rows in plan or ()],
        dtype=np.uint64,
    ).reshape(-1, 5)
    row_bytes = np.array([out[p][0, 0].nbytes if n and t else 0 for p in paths], dtype=np.uint64)
    ok = decode_steps(chunk_data, columns, steps, row_bytes, [out[p] for p in paths], n, t, copies)
    return ok.astype(bool)
