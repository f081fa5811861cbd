"""The episode record: the one item of an INSERT into a slices table (``TableConfig(kind="slices")``), which
stores a whole episode from the request's step chunks (:mod:`apexrl.replay.wire.steps`) and samples windows of
it (docs/protocol.md, "Slices tables").

A fixed little-endian binary record, checked field by field by the server before it reads through it (no JSON)::

    b"APXE", u16 version (1), u16 flags (bit 0: per-step priorities follow), u32 C chunks, u32 F fields,
    u64 fingerprint, u64 steps[C], u64 columns[C][F][3] (offset in the chunk, stored bytes, codec),
    f64 priorities[N] (only with flag bit 0; N = sum of steps)

The request's chunks 0..C-1 are the episode's, in step order; each chunk's columns are its fields' (in path
order) as its own header places them (:func:`chunk_columns`); :func:`episode_chunks` cuts an episode into its
chunks. Never imports torch.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from apexrl.replay.wire import steps as S

__all__ = ["EPISODE_MAGIC", "chunk_columns", "encode_episode", "episode_chunks"]

EPISODE_MAGIC = b"APXE"
_VERSION = 1
_STEP_PRIORITIES = 1
_HEADER = struct.Struct("<4sHHIIQ")


def encode_episode(fingerprint: int, steps: Sequence[int], columns: Any, priorities: Any = None) -> bytes:
    """The record of an episode of ``len(steps)`` chunks holding ``steps[c]`` steps each; ``columns``: an array
    (chunks, fields, 3) of (offset, stored bytes, codec); ``priorities``: one per step, or None (the request's
    priority, or the table's largest, stands for every step)."""
    counts = np.asarray(steps, dtype="<u8")
    cols = np.asarray(columns, dtype="<u8")
    if counts.ndim != 1 or cols.ndim != 3 or cols.shape[0] != counts.shape[0] or cols.shape[2] != 3:
        raise ValueError(f"columns must be (chunks={counts.shape[0]}, fields, 3), got shape {cols.shape}")
    flags, tail = 0, b""
    if priorities is not None:
        p = np.asarray(priorities, dtype="<f8")
        if p.shape != (int(counts.sum()),):
            raise ValueError(f"priorities must be one per step ({int(counts.sum())}), got shape {p.shape}")
        flags, tail = _STEP_PRIORITIES, p.tobytes()
    head = _HEADER.pack(EPISODE_MAGIC, _VERSION, flags, counts.shape[0], cols.shape[1], int(fingerprint))
    return head + counts.tobytes() + cols.tobytes() + tail


def episode_chunks(steps: Mapping[str, Any], chunk_length: int) -> tuple[list[bytes], list[int], int]:
    """(step chunks, steps per chunk, structure fingerprint) of an episode: ``steps`` maps each field (nested
    mappings allowed) to an array of the episode's n steps (leading dimension n, the same for every field), cut
    ``chunk_length`` steps a chunk. ValueError for anything else."""
    leaves = S.flatten(steps)
    if not leaves:
        raise ValueError("an episode needs at least one field")
    arrays = {p: np.asarray(a) for p, a in leaves.items()}
    lengths = {a.shape[0] if a.ndim else 0 for a in arrays.values()}
    if len(lengths) != 1 or min(lengths) < 1:
        raise ValueError(f"every field must hold the episode's steps along its first axis, got lengths {lengths}")
    n = lengths.pop()
    odd = [p for p, a in arrays.items() if a.dtype.kind not in "biufc" or a.dtype.fields is not None]
    if odd:
        raise ValueError(f"fields {odd} are not numeric or bool arrays")
    structure = tuple(S.Field(p, np.dtype(a.dtype).newbyteorder("<"), tuple(a.shape[1:])) for p, a in arrays.items())
    fp = S.structure_fingerprint(structure)
    chunks, counts = [], []
    for lo in range(0, n, chunk_length):
        hi = min(n, lo + chunk_length)
        chunks.append(S.encode_chunk(structure, [arrays[f.path][lo:hi] for f in structure], fp))
        counts.append(hi - lo)
    return chunks, counts, fp


def chunk_columns(
    chunks: Sequence[Any], want: list[tuple[str, np.dtype, tuple[int, ...]]] | None = None
) -> tuple[np.ndarray, list[tuple[str, np.dtype, tuple[int, ...]]]]:
    """Where each chunk's field columns lie, (chunks, fields, (offset, stored, codec)) with the fields in path
    order (what a slice table keeps for its native decode, and an episode record carries), and the fields
    (path, dtype, shape); ValueError where a chunk's fields differ from ``want`` (None: the first chunk's)."""
    if want is None:
        want = [(path, dt, shape) for path, dt, shape, *_ in _fields(chunks[0])]
    columns = np.empty((len(chunks), len(want), 3), dtype=np.uint64)
    for c, blob in enumerate(chunks):
        fields = _fields(blob)
        if [(path, dt, shape) for path, dt, shape, *_ in fields] != want:
            raise ValueError(f"chunk {c}'s fields (names, dtypes, shapes) differ from the table's")
        columns[c] = [(at, stored, codec) for *_, codec, stored, at in fields]
    return columns, want


def _fields(blob: Any) -> list[tuple[str, np.dtype, tuple[int, ...], int, int, int]]:
    """A chunk's fields in the table's column order (by path): (path, dtype, shape, codec, stored bytes, offset)."""
    _k, _fp, fields, _key = S._chunk_header(memoryview(blob).cast("B"))
    return [(path, *fields[path]) for path in sorted(fields)]
