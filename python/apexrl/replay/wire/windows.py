"""A slices table's windows on the wire: the *window items* of its SAMPLE replies (docs/protocol.md, "Slices
tables"), decoded natively as the in-process :class:`~apexrl.replay.slices.SliceTable` decodes its samples.

A window item is fixed little-endian binary: ``b"APXW"``, u16 version (1), u16 flags (0), u32 F (fields), u32 R
(chunks it references), u64 fingerprint, u64 first (its first step in the concatenation of its chunks), u64 rows
(its steps), u64 t (steps per window), then per chunk it references, in the reply's order: u64 steps and F x
(u64 offset in the chunk, u64 stored bytes, u64 codec) -- each column's place, in path order, as the table kept
it from the episode's record. So the client decodes the batch in one native call with the GIL released, parsing
one chunk header (the batch's structure) instead of every chunk's. Never imports torch.
"""

from __future__ import annotations

import math
import struct
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import steps as S

__all__ = ["WINDOW_MAGIC", "decode_window_items", "encode_window_item", "is_window_reply"]

WINDOW_MAGIC = b"APXW"
_VERSION = 1
_HEAD = struct.Struct("<4sHHIIQQQQ")


def encode_window_item(
    fingerprint: int, first: int, rows: int, t: int, chunk_steps: Sequence[int], columns: Any
) -> bytes:
    """A window item (what a slices table's SAMPLE reply carries; tests and tools): ``columns`` is an array of
    shape (len(chunk_steps), fields, 3) of (offset, stored bytes, codec) per chunk and field."""
    cols = np.asarray(columns, dtype="<u8")
    if cols.ndim != 3 or cols.shape[0] != len(chunk_steps) or cols.shape[2] != 3:
        raise ValueError(f"columns must be (chunks={len(chunk_steps)}, fields, 3), got shape {cols.shape}")
    head = _HEAD.pack(WINDOW_MAGIC, _VERSION, 0, cols.shape[1], len(chunk_steps), fingerprint, first, rows, t)
    per_chunk = b"".join(struct.pack("<Q", k) + cols[c].tobytes() for c, k in enumerate(chunk_steps))
    return head + per_chunk


def is_window_reply(data: Any, offsets: np.ndarray) -> bool:
    """Whether a SAMPLE reply's first item is a window item (a slices table's reply)."""
    if len(offsets) < 2:
        return False
    lo = int(offsets[0])
    return bytes(memoryview(data).cast("B")[lo : lo + 4]) == WINDOW_MAGIC


def _heads(view: memoryview, bounds: list[int]) -> list[tuple[int, int] | None]:
    """(fingerprint, t) of each item that is long enough to be a window item and starts with its magic (None for
    the others); the native decode checks the rest. A loop: faster than numpy's gathers at a batch's size."""
    out: list[tuple[int, int] | None] = []
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        if lo + _HEAD.size <= hi <= len(view) and view[lo : lo + 4] == WINDOW_MAGIC:
            head = _HEAD.unpack_from(view, lo)
            out.append((head[5], head[8]))
        else:
            out.append(None)
    return out


def decode_window_items(
    data: Any,
    offsets: np.ndarray,
    chunks: P.FrameChunks,
    reuse: dict[str, np.ndarray] | None = None,
    *,
    native: bool = True,
) -> S.SequenceBatch:
    """The windows of a slices table's SAMPLE reply (its items ``data``/``offsets`` and its chunk frames) as a
    :class:`~apexrl.replay.wire.steps.SequenceBatch`, the one the generic sequence decoder gives for the same
    windows as sequence items (``native=False`` decodes them that way: the reference).

    The batch's structure is that of the fingerprint most windows carry (the earliest on a tie), read from the
    header of the first chunk such a window references; its ``t`` that window's. Never raises on what the reply
    holds: a window whose item is malformed, of another fingerprint or ``t``, or that does not decode (a field or
    offset out of its frame, steps past its chunks, a column that does not decompress to its size) is invalid
    (``valid`` False, its mask and rows zero), and the rest decode; so is every window when no chunk header
    parses or the batch would exceed the decode budget (steps and mask at most half of
    max(64 MiB, 256 x the reply's bytes)). ``reuse``: as decode_sequences'."""
    if not native:
        return _reference(data, offsets, chunks, reuse)
    view = memoryview(data).cast("B")
    bounds = offsets.tolist()
    n = len(bounds) - 1
    heads = _heads(view, bounds)
    counts = Counter(h[0] for h in heads if h is not None)
    fp = max(counts, key=lambda k: counts[k]) if counts else None  # the earliest on a tie
    fields: list[tuple[str, np.dtype, tuple[int, ...]]] = []
    t = 0
    for i, h in enumerate(heads):
        if h is not None and h[0] == fp:
            t = h[1]
            fields = _structure(chunks, i, fp)
            break
    source = view.nbytes + memoryview(chunks.chunk_data).nbytes
    budget = max(S._DECODE_FLOOR, S._DECODE_RATIO * source)
    row = sum(dt.itemsize * math.prod(shape) for _p, dt, shape in fields) + 1
    if fp is None or not fields or not 1 <= t <= S._MAX_T or 2 * n * t * row > budget:
        return S.SequenceBatch({}, np.zeros((n, 0), dtype=bool), {}, np.zeros(n, dtype=bool), np.zeros(n, np.int64))
    from apexrl._core import decode_window_items as native_decode  # the extension, only where slices are used

    out = S.output_arrays(fields, (n, t), reuse)
    mask = np.empty((n, t), dtype=bool)
    ok, rows = native_decode(
        data,
        offsets,
        chunks.item_chunks,
        chunks.item_chunk_offsets,
        chunks.chunk_data,
        chunks.chunk_offsets,
        fp,
        list(out.values()),
        mask,
        t,
    )
    return S.SequenceBatch(S.unflatten(out), mask, {}, ok.astype(bool), rows.astype(np.int64))


def _structure(chunks: P.FrameChunks, i: int, fp: int | None) -> list[tuple[str, np.dtype, tuple[int, ...]]]:
    """(path, dtype, shape) in path order of the first chunk window i references whose header parses with the
    fingerprint ``fp``; [] when none does."""
    lo, hi = int(chunks.item_chunk_offsets[i]), int(chunks.item_chunk_offsets[i + 1])
    bounds = chunks.chunk_offsets
    blob = memoryview(chunks.chunk_data).cast("B")
    for c in chunks.item_chunks[lo:hi].tolist():
        if not 0 <= c < len(bounds) - 1:
            continue
        try:
            _k, chunk_fp, described, _key = S._chunk_header(blob[int(bounds[c]) : int(bounds[c + 1])])
        except S._MALFORMED:
            continue
        if chunk_fp == fp:
            return [(path, described[path][0], described[path][1]) for path in sorted(described)]
    return []


def _reference(
    data: Any, offsets: np.ndarray, chunks: P.FrameChunks, reuse: dict[str, np.ndarray] | None
) -> S.SequenceBatch:
    """The windows as sequence items (fingerprint, first, rows, t) through decode_sequences, reading every chunk's
    header; a window item too short or of another magic becomes an empty (invalid) item."""
    view = memoryview(data).cast("B")
    bounds = offsets.tolist()
    items: list[bytes] = []
    for i in range(len(bounds) - 1):
        lo, hi = bounds[i], bounds[i + 1]
        if lo + _HEAD.size <= hi <= len(view) and view[lo : lo + 4] == WINDOW_MAGIC:
            head = _HEAD.unpack_from(view, lo)
            items.append(S.encode_item(head[5], head[6], head[7], head[8], None) if head[7] and head[8] else b"")
        else:
            items.append(b"")
    return S.decode_sequences(
        items,
        chunks.chunks(),
        [chunks.refs(i) for i in range(len(items))],
        chunk_data=chunks.chunk_data,
        chunk_offsets=chunks.chunk_offsets,
        reuse=reuse,
    )
