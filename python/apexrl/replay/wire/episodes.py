"""The episode record: the one item of an INSERT into a slices table (``TableConfig(kind="slices")``), which
stores a whole episode from the request's step chunks (:mod:`apexrl.replay.wire.steps`) and samples windows of
it (docs/protocol.md, "Slices tables").

A fixed little-endian binary record, checked field by field by the server before it reads through it (no JSON)::

    b"APXE", u16 version (1), u16 flags (bit 0: per-step priorities follow), u32 C chunks, u32 F fields,
    u64 fingerprint, u64 steps[C], u64 columns[C][F][3] (offset in the chunk, stored bytes, codec),
    f64 priorities[N] (only with flag bit 0; N = sum of steps)

The request's chunks 0..C-1 are the episode's, in step order; each chunk's columns are its fields' (in path
order) as its own header places them (:func:`apexrl.replay.slices.chunk_columns`). Never imports torch.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["EPISODE_MAGIC", "encode_episode"]

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
