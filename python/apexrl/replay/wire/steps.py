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
    """One leaf of a step (or extras) structure: its path (keys joined with "/"), dtype and per-step shape."""

    path: str
    dtype: np.dtype
    shape: tuple[int, ...]

    def describe(self) -> list[Any]:
        return [self.path, self.dtype.str, list(self.shape)]


def flatten(structure: Mapping[str, Any], what: str = "step") -> dict[str, np.ndarray]:
    """The leaves of a nested mapping of array-likes, by path ("a/b"), in sorted key order at every level."""
    if not isinstance(structure, Mapping):
        raise TypeError(
            f"a {what} must be a mapping of arrays (nested mappings allowed), got {type(structure).__name__}"
        )
    out: dict[str, np.ndarray] = {}

    def walk(node: Mapping[str, Any], prefix: str) -> None:
        for key in sorted(node):
            if not isinstance(key, str) or not key or "/" in key:
                raise ValueError(f"{what} field names must be non-empty strings without '/', got {key!r}")
            value = node[key]
            path = f"{prefix}{key}"
            if isinstance(value, Mapping):
                if not value:
                    raise ValueError(f"{what} field {path!r} is an empty mapping")
                walk(value, path + "/")
            else:
                if hasattr(value, "detach") and hasattr(value, "cpu"):  # a torch tensor, without importing torch
                    value = value.detach().cpu().numpy()
                arr = np.asarray(value)
                if arr.dtype.kind not in "biufc" or arr.dtype.hasobject:
                    raise TypeError(f"{what} field {path!r} has dtype {arr.dtype}; numeric or bool arrays only")
                out[path] = arr

    walk(structure, "")
    if not out:
        raise ValueError(f"a {what} needs at least one field")
    return out


def unflatten(leaves: Mapping[str, Any]) -> dict[str, Any]:
    """The nested mapping of ``flatten``'s leaves."""
    out: dict[str, Any] = {}
    for path, value in leaves.items():
        node = out
        parts = path.split("/")
        for p in parts[:-1]:
            node = node.setdefault(p, {})
        node[parts[-1]] = value
    return out


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


def decode_sequences(items: Sequence[Any], chunk_blobs: Sequence[Any], refs: Sequence[np.ndarray]) -> SequenceBatch:
    """Decode the sequence items of a sampled batch: ``items[i]``'s bytes, the batch's chunks, and item i's
    references into them (``refs[i]``, in the item's order)."""
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
    cache: dict[int, tuple[int, int, dict[str, np.ndarray]] | None] = {}

    def chunk(c: int) -> tuple[int, int, dict[str, np.ndarray]] | None:
        if c not in cache:
            try:
                cache[c] = decode_chunk(chunk_blobs[c]) if 0 <= c < len(chunk_blobs) else None
            except (ValueError, TypeError, KeyError, json.JSONDecodeError, lz4.block.LZ4BlockError):
                cache[c] = None
        return cache[c]

    # The step structure: the first decodable chunk's (every item's chunks must match it).
    structure: dict[str, tuple[np.dtype, tuple[int, ...]]] | None = None
    columns: list[dict[str, np.ndarray] | None] = []
    for i in range(n):
        meta = metas[i]
        cols: dict[str, np.ndarray] | None = None
        if meta is not None:
            parts = [chunk(int(c)) for c in refs[i]]
            if parts and all(p is not None for p in parts):
                decoded = [p[2] for p in parts if p is not None]
                keys = list(decoded[0])
                same = all(p is not None and p[1] == meta["fp"] for p in parts) and all(
                    list(d) == keys for d in decoded
                )
                total = sum(p[0] for p in parts if p is not None)
                first, steps = int(meta["first"]), int(meta["n"])
                # The item's step range must lie inside its chunks (else it is invalid, never read out of bounds).
                if same and 1 <= steps <= int(meta["t"]) and first + steps <= total:
                    here = {p: (decoded[0][p].dtype, decoded[0][p].shape[1:]) for p in keys}
                    if all((d[p].dtype, d[p].shape[1:]) == here[p] for d in decoded for p in keys) and (
                        structure is None or structure == here
                    ):
                        structure = here
                        cols = {p: np.concatenate([d[p] for d in decoded])[first : first + steps] for p in keys}
        columns.append(cols)
    valid = np.array([c is not None for c in columns], dtype=bool)
    t = max((int(m["t"]) for m, ok in zip(metas, valid, strict=True) if ok and m is not None), default=0)
    num_steps = np.zeros(n, dtype=np.int64)
    mask = np.zeros((n, t), dtype=bool)
    out: dict[str, np.ndarray] = {}
    for p, (dt, shape) in (structure or {}).items():
        out[p] = np.zeros((n, t, *shape), dtype=dt.newbyteorder("="))
    for i, cols in enumerate(columns):
        if cols is None:
            continue
        steps = next(iter(cols.values())).shape[0]
        num_steps[i] = steps
        mask[i, :steps] = True
        for p, col in cols.items():
            out[p][i, :steps] = col
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
