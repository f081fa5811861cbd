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

``path`` is the field's position in the (nested) step mapping, its keys joined with ``.``. ``fingerprint`` is
:func:`structure_fingerprint` of the step structure, the same in the item and in each chunk it references.
Decoding (:func:`decode_sequences`) checks that the item's step range lies inside its chunks and that the chunks
hold its structure; an item that breaks either is marked invalid (``valid[i]`` False, its mask all False), never
read out of bounds. Never imports torch.
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import json
import math
import re
import struct
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
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
    "chunk_summary",
    "decode_chunk",
    "decode_item",
    "decode_sequences",
    "encode_chunk",
    "encode_item",
    "flatten",
    "is_sequence_item",
    "output_arrays",
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
# What a decoder accepts, checked before it allocates anything an item or chunk declares (docs/protocol.md,
# "Decoding hostile items"). A header nests at most as deep as its own form ({"f": [[path, dtype, [shape], ...]]});
# a field has at most 32 dimensions and 2 GiB per step; an lz4 block expands at most ~255-fold, so a column that
# claims more than 256 times its stored bytes cannot be one.
_MAX_DEPTH = 4
_MAX_NDIM = 32
_MAX_ROW_BYTES = 1 << 31
_LZ4_MAX_RATIO = 256
# A decoded batch (steps, mask and extras) holds at most max(_DECODE_FLOOR, _DECODE_RATIO x the bytes it was
# decoded from): padding (an item's t beyond its steps) and items that share chunks are paid for by the floor,
# decompression by the ratio. An item that would take the batch past it is invalid, alone; the rest decode.
_DECODE_FLOOR = 64 << 20
_DECODE_RATIO = 256
_MAX_T = 1 << 24  # the native copy's bound on a batch's sequence length (and on its items)
_DTYPE = re.compile(r"[<>|=][biufc][0-9]{1,2}")
_PATH = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
# What a parser may raise on bytes a peer wrote: each marks that item (or chunk) invalid, never the batch.
_MALFORMED = (ValueError, TypeError, KeyError, OverflowError, RecursionError, lz4.block.LZ4BlockError)


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


# Strings as the encoder writes them (field paths, dtypes): no escapes, so a string is '"' ... '"' with no '"' or
# '\' inside. A header with any other string is refused before it is parsed.
_PLAIN_STRING = re.compile(rb'"[^"\\]*"')
_BRACKETS = bytes(range(256)).translate(None, b"[]{}")  # every byte but the brackets, to delete


def _nesting(text: bytes) -> int:
    """How deep ``text`` (JSON with plain strings only) nests its lists and objects, counted without parsing it
    (Python's parser recurses, so a deep header must be refused before it is parsed); a string with an escape
    counts as too deep."""
    if b"\\" in text:
        return _MAX_DEPTH + 1
    brackets = _PLAIN_STRING.sub(b"", text).translate(None, _BRACKETS)
    if len(brackets) <= _MAX_DEPTH:  # no more brackets than the deepest form: an item header without extras
        return len(brackets)
    if len(brackets) > 4096:  # long: in numpy (a header of a few fields has a few dozen brackets)
        codes = np.frombuffer(brackets, dtype=np.uint8)
        opens = (codes == ord("[")) | (codes == ord("{"))
        return int(np.cumsum(np.where(opens, 1, -1)).max())
    depth = deepest = 0
    for code in brackets:
        if code == 91 or code == 123:  # "[" or "{"
            depth += 1
            if depth > deepest:
                deepest = depth
        else:
            depth -= 1
    return deepest


def _header_text(blob: memoryview, magic: bytes) -> tuple[bytes, int]:
    """(the header's JSON text, where the body starts) of a chunk's or item's bytes; ValueError for a wrong
    prefix or a header that does not fit."""
    if len(blob) < _PREFIX.size:
        raise ValueError(f"{len(blob)} bytes: too short for a {magic!r} header")
    got, version, flags, length = _PREFIX.unpack_from(blob, 0)
    if got != magic:
        raise ValueError(f"magic {bytes(got)!r}, expected {magic!r}")
    if version != _VERSION or flags != 0:
        raise ValueError(f"version {version} (flags {flags}); this build reads version {_VERSION}")
    if length > _MAX_HEADER or _PREFIX.size + length > len(blob):
        raise ValueError(f"header of {length} bytes does not fit in {len(blob)}")
    return bytes(blob[_PREFIX.size : _PREFIX.size + length]), _PREFIX.size + length


def _parse(text: bytes) -> dict[str, Any]:
    """A header's JSON object, its nesting checked first."""
    if _nesting(text) > _MAX_DEPTH:
        raise ValueError(f"header nests deeper than {_MAX_DEPTH} or holds a string with an escape")
    meta = json.loads(text)
    if not isinstance(meta, dict):
        raise ValueError("header is not a JSON object")
    return meta


def _read_header(blob: memoryview, magic: bytes) -> tuple[dict[str, Any], int]:
    text, at = _header_text(blob, magic)
    return _parse(text), at


def _count(value: Any, what: str, low: int = 0) -> int:
    """``value`` if it is a JSON integer (not a bool) in [low, 2^63); ValueError otherwise."""
    if type(value) is not int or not low <= value < 1 << 63:
        raise ValueError(f"{what} must be an integer in [{low}, 2^63), got {value!r}")
    return value


@functools.lru_cache(maxsize=256)
def _dtype(text: str) -> np.dtype:
    """A field's dtype from its wire form: numeric or bool, one byte order character, no structure."""
    if not _DTYPE.fullmatch(text):
        raise ValueError(f"dtype {text!r} is not a numeric or bool dtype's wire form (e.g. '<f4')")
    dt = np.dtype(text)
    if dt.kind not in "biufc" or dt.fields is not None or dt.subdtype is not None:
        raise ValueError(f"dtype {text!r} is not numeric or bool")
    return dt


def _field(entry: Any, width: int) -> tuple[str, np.dtype, tuple[int, ...], int]:
    """(path, dtype, shape, bytes per step) of a header's field entry ``[path, dtype, shape, ...]`` of ``width``
    elements; ValueError for any other form. Sizes are Python integers: nothing overflows, nothing allocates."""
    if type(entry) is not list or len(entry) != width:
        raise ValueError(f"a field entry must be a list of {width} elements, got {entry!r:.80}")
    path, dtype, shape = entry[0], entry[1], entry[2]
    if type(path) is not str or not _PATH.fullmatch(path):
        raise ValueError(f"field path {path!r:.80} is not ASCII identifiers joined by {_structure.SEPARATOR!r}")
    if type(dtype) is not str:
        raise ValueError(f"field {path!r}: dtype must be a string")
    if type(shape) is not list or len(shape) > _MAX_NDIM:
        raise ValueError(f"field {path!r}: shape must be a list of at most {_MAX_NDIM} sizes")
    size = 1
    for d in shape:
        if type(d) is not int or not 0 <= d < 1 << 63:
            raise ValueError(f"field {path!r}: a shape's size must be an integer in [0, 2^63), got {d!r:.40}")
        size *= d
    dt = _dtype(dtype)
    return path, dt, tuple(shape), dt.itemsize * size


def _check_paths(paths: Sequence[str], what: str) -> None:
    """ValueError for a repeated path or one that is another's parent (``a`` beside ``a.b``): such fields would
    not nest back into one mapping."""
    ordered = sorted(paths)
    for a, b in itertools.pairwise(ordered):  # a parent sorts right before its first child ('.' sorts first)
        if b == a or b.startswith(a + _structure.SEPARATOR):
            raise ValueError(f"{what}: field paths {a!r} and {b!r} do not nest into one mapping")


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


def chunk_summary(blob: Any) -> tuple[int, int, tuple[Any, ...]]:
    """(steps k, fingerprint, the structure as a comparable key) of a step chunk, its header checked as
    :func:`decode_sequences` checks it (ValueError for a malformed one); decompresses nothing."""
    k, fp, _fields, key = _chunk_header(memoryview(blob).cast("B"))
    return k, fp, key


def decode_chunk(blob: Any) -> tuple[int, int, dict[str, np.ndarray]]:
    """(steps k, fingerprint, path -> column of shape (k, *shape)) of a step chunk; ValueError for a malformed
    one (its header checked as :func:`decode_sequences` checks it, before anything is decompressed)."""
    view = memoryview(blob).cast("B")
    k, fp, fields, _key = _chunk_header(view)
    out: dict[str, np.ndarray] = {}
    for path, (dt, shape, codec, stored, at) in fields.items():
        count = k * math.prod(shape)
        body = view[at : at + stored]
        try:
            data = lz4.block.decompress(bytes(body), uncompressed_size=count * dt.itemsize) if codec == _LZ4 else body
        except lz4.block.LZ4BlockError as e:
            raise ValueError(f"chunk field {path!r}: {e}") from None
        if len(data) != count * dt.itemsize:
            raise ValueError(f"chunk field {path!r}: {len(data)} bytes, expected {count * dt.itemsize}")
        out[path] = np.frombuffer(data, dtype=dt, count=count).reshape((k, *shape))
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
    """(header, path -> extra) of a sequence item; ValueError for a malformed one: a header field missing or not
    an integer in [0, 2^63) (``n`` and ``t`` at least 1), an extra of another form than ``[path, dtype, shape]``,
    past the item's end or nesting badly beside another, trailing bytes."""
    view = memoryview(blob).cast("B")
    meta, at = _read_header(view, ITEM_MAGIC)
    for key, low in (("fp", 0), ("first", 0), ("n", 1), ("t", 1)):
        _count(meta.get(key), f"item header: {key}", low)
    described = meta.get("x", [])
    if type(described) is not list:
        raise ValueError("item header: x must be a list of extras")
    extras: dict[str, np.ndarray] = {}
    for entry in described:
        path, dt, shape, size = _field(entry, 3)
        if at + size > len(view):
            raise ValueError(f"item extra {path!r} past the item's end")
        if path in extras:
            raise ValueError(f"item extra {path!r} repeated")
        extras[path] = np.frombuffer(view[at : at + size], dtype=dt).reshape(shape)
        at += size
    if at != len(view):
        raise ValueError(f"item has {len(view) - at} trailing bytes")
    _check_paths(list(extras), "item extras")
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


_ChunkFields = dict[str, tuple[np.dtype, tuple[int, ...], int, int, int]]


def _chunk_header(blob: memoryview) -> tuple[int, int, _ChunkFields, tuple[Any, ...]]:
    """(steps k, fingerprint, path -> (dtype, shape, codec, stored bytes, offset in the blob), the structure as a
    comparable key) of a step chunk, every column inside the blob, of a known codec and of a size its stored
    bytes can hold (raw: exactly; lz4: at most _LZ4_MAX_RATIO times); ValueError otherwise. Decompresses
    nothing, allocates nothing the header declares. The result is shared: do not change it."""
    text, at = _header_text(blob, CHUNK_MAGIC)
    return _chunk_layout(text, at, len(blob))


@functools.lru_cache(maxsize=4096)
def _chunk_layout(text: bytes, at: int, size: int) -> tuple[int, int, _ChunkFields, tuple[Any, ...]]:
    """_chunk_header's work on a header's text, the body starting at ``at`` of ``size`` bytes: cached, since a
    chunk drawn again (its items share it, a later batch draws it again) brings the same header."""
    meta = _parse(text)
    k = _count(meta.get("k"), "chunk header: k", 1)
    fp = _count(meta.get("fp"), "chunk header: fp")
    described = meta.get("f")
    if type(described) is not list:
        raise ValueError("chunk header: f must be a list of fields")
    fields: _ChunkFields = {}
    for entry in described:
        path, dt, shp, row = _field(entry, 5)
        codec, stored = entry[3], entry[4]
        if type(codec) is not int or codec not in (_RAW, _LZ4):
            raise ValueError(f"chunk field {path!r}: unknown codec {codec!r}")
        stored = _count(stored, f"chunk field {path!r}: stored bytes")
        if at + stored > size:
            raise ValueError(f"chunk field {path!r}: {stored} bytes at {at} of {size}")
        if row > _MAX_ROW_BYTES or (stored != k * row if codec == _RAW else k * row > _LZ4_MAX_RATIO * stored):
            raise ValueError(
                f"chunk field {path!r}: {k} steps of {row} bytes cannot be {stored} bytes of codec {codec}"
            )
        if path in fields:
            raise ValueError(f"chunk field {path!r} repeated")
        fields[path] = (dt, shp, codec, stored, at)
        at += stored
    if at != size:
        raise ValueError(f"chunk has {size - at} trailing bytes")
    _check_paths(list(fields), "chunk")
    key = tuple(sorted((path, f[0].str, f[1]) for path, f in fields.items()))
    return k, fp, fields, key


def decode_sequences(
    items: Sequence[Any],
    chunk_blobs: Sequence[Any],
    refs: Sequence[np.ndarray],
    *,
    chunk_data: Any = None,
    chunk_offsets: np.ndarray | None = None,
    native: bool | None = None,
    reuse: dict[str, np.ndarray] | None = None,
) -> SequenceBatch:
    """Decode the sequence items of a sampled batch: ``items[i]``'s bytes, the batch's chunks, and item i's
    references into them (``refs[i]``, in the item's order). With ``chunk_data`` and ``chunk_offsets`` (the
    chunks' bytes in one buffer, as a SAMPLE reply carries them) the steps are copied natively with the GIL released
    (``apexrl._core.decode_steps``; ``native=False``: numpy, the reference); the result is the same.

    Never raises on what the items and chunks hold: an item that does not decode, whose structure is not the
    batch's (the one most items have), or that would take the batch's arrays past the decode budget (its ``t`` or
    its extras too large for the bytes the batch came in) is invalid (``valid[i]`` False, its mask all False, its
    rows zero), and the rest of the batch decodes.

    ``reuse``: the step arrays of an earlier call (by flattened path), filled in place when a path's shape and
    dtype are the same, else replaced there by a new array: a learner's ring of batches allocates nothing per
    batch once warm (the result's step arrays are then those of ``reuse``, valid until its next call)."""
    n = len(items)
    source_bytes = sum(memoryview(b).nbytes for b in items)
    if chunk_data is not None:
        source_bytes += memoryview(chunk_data).nbytes
    else:
        source_bytes += sum(memoryview(c).nbytes for c in chunk_blobs)
    budget = max(_DECODE_FLOOR, _DECODE_RATIO * source_bytes)
    metas: list[dict[str, Any] | None] = []
    extras_of: list[dict[str, np.ndarray]] = []
    for blob in items:
        try:
            meta, extras = decode_item(blob)
        except _MALFORMED:
            meta, extras = None, {}
        metas.append(meta)
        extras_of.append(extras)
    headers: dict[int, Any] = {}

    def header(c: int) -> Any:
        if c not in headers:
            try:
                headers[c] = _chunk_header(memoryview(chunk_blobs[c]).cast("B")) if 0 <= c < len(chunk_blobs) else None
            except _MALFORMED:
                headers[c] = None
        return headers[c]

    # Each item's plan: its chunks and its step range, checked (else it is invalid, never read out of bounds).
    candidates: list[tuple[tuple[Any, ...], list[tuple[int, int, int, int]]] | None] = []
    for i in range(n):
        meta = metas[i]
        candidate = None
        chunk_ids = [int(c) for c in refs[i]] if meta is not None else []
        parts = [header(c) for c in chunk_ids]
        if meta is not None and parts and all(p is not None for p in parts):
            key = parts[0][3]
            first, steps = meta["first"], meta["n"]
            total = sum(p[0] for p in parts)
            same = all(p[1] == meta["fp"] and p[3] == key for p in parts)
            if key and same and steps <= meta["t"] and first + steps <= total:
                copies: list[tuple[int, int, int, int]] = []
                start = 0  # the concatenation's step of this chunk's first step
                for c, p in zip(chunk_ids, parts, strict=True):
                    lo, hi = max(first, start), min(first + steps, start + p[0])
                    if lo < hi:
                        copies.append((c, lo - start, lo - first, hi - lo))
                    start += p[0]
                candidate = (key, copies)
        candidates.append(candidate)
    # The batch's structure: the one most items have (the earliest on a tie), so that an item of another
    # structure cannot make the others invalid by coming first.
    counts = Counter(cand[0] for cand in candidates if cand is not None)
    key = max(counts, key=lambda k: counts[k]) if counts else None
    structure: dict[str, tuple[np.dtype, tuple[int, ...]]] = {}
    for cand in candidates:
        if cand is not None and cand[0] == key:
            fields = headers[cand[1][0][0]][2]  # the plan's first chunk (a plan holds at least one)
            structure = {path: (f[0], f[1]) for path, f in fields.items()}
            break
    row = sum(dt.itemsize * math.prod(shape) for dt, shape in structure.values()) + 1  # + the mask's byte
    plans: list[list[tuple[int, int, int, int]] | None] = []
    for i, cand in enumerate(candidates):
        meta = metas[i]
        plan: list[tuple[int, int, int, int]] | None = None
        if cand is not None and cand[0] == key and meta is not None:
            # Steps with the mask and extras each within half the budget: t sizes every row of the batch.
            x = sum(a.nbytes for a in extras_of[i].values())
            if meta["t"] <= _MAX_T and 2 * n * meta["t"] * row <= budget and 2 * n * x <= budget:
                plan = cand[1]
        plans.append(plan)
    valid = np.array([p is not None for p in plans], dtype=bool)
    t = max((int(m["t"]) for m, ok in zip(metas, valid, strict=True) if ok and m is not None), default=0)
    paths = list(structure)
    # Not zero-filled: the copies write every row of the mask, and only the rows past it are zeroed (below).
    out = output_arrays(((path, *structure[path]) for path in paths), (n, t), reuse)
    if native is None:
        native = chunk_data is not None and chunk_offsets is not None
    if paths and valid.any():
        if native and chunk_offsets is not None and n <= _MAX_T:
            copied = _copy_native(out, paths, plans, headers, chunk_data, chunk_offsets, n, t)
        else:
            copied = _copy_numpy(out, paths, plans, headers, chunk_blobs)
        valid &= copied  # an item a copy failed for: its rows are zeroed with the mask's
    num_steps = np.array(
        [int(m["n"]) if good and m is not None else 0 for m, good in zip(metas, valid, strict=True)], dtype=np.int64
    )
    mask = np.arange(t)[None, :] < num_steps[:, None]
    if not mask.all():
        for a in out.values():
            a[~mask] = 0
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
            k, _fp, fields, _key = headers[c]
            dt, shape, codec, stored, at = fields[path]
            count = k * math.prod(shape)
            body = memoryview(chunk_blobs[c]).cast("B")[at : at + stored]
            try:
                data = lz4.block.decompress(bytes(body), uncompressed_size=count * dt.itemsize) if codec else body
                col = np.frombuffer(data, dtype=dt, count=count).reshape((k, *shape))
            except _MALFORMED:
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
        k, _fp, fields, _key = headers[c]
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


def output_arrays(
    fields: Iterable[tuple[str, np.dtype, tuple[int, ...]]],
    lead: tuple[int, ...],
    reuse: dict[str, np.ndarray] | None,
) -> dict[str, np.ndarray]:
    """One array per ``(path, dtype, shape)`` of shape ``lead + shape`` in native byte order, not initialised (the
    decoders write every row they return): ``reuse``'s array of that path when its shape and dtype fit, else a
    new one, kept in ``reuse`` for the next call."""
    out: dict[str, np.ndarray] = {}
    for path, dt, shape in fields:
        dtype, full = dt.newbyteorder("="), (*lead, *shape)
        old = reuse.get(path) if reuse is not None else None
        if old is not None and old.shape == full and old.dtype == dtype:
            out[path] = old
        else:
            out[path] = np.empty(full, dtype=dtype)
            if reuse is not None:
                reuse[path] = out[path]
    return out
