"""Sample-time slices: episodes stored once, windows of ``burn_in + length`` steps chosen when sampled.

A :class:`SliceTable` holds whole episodes (or long trajectories) as step chunks (:mod:`apexrl.replay.wire.steps`,
the format a :class:`~apexrl.replay.client.trajectory.TrajectoryWriter` sends), each step once, with a priority per
step. A sample draws windows: ``burn_in`` steps that only warm up a recurrent state, then ``length`` trained steps,
all from one episode, at any start step -- uniformly over the valid starts, or by priority, a window's priority
being R2D2's ``eta * max + (1 - eta) * mean`` of its trained steps' priorities. Priority updates address windows
(the keys a sample returns) and land on their steps; every window overlapping those steps gets its new mass.

Which windows can be drawn (TorchRL's ``SliceSampler`` options and defaults; W = burn_in + length, n an episode's
steps): starts ``t`` in ``[0, e(n))`` with ``e(n) = 0`` when ``strict_length`` and ``n < W``, else
``max(0, min(n - burn_in, max(1, n - W + 1 + span)))``. So a window never crosses episodes, holds at least one
trained step, and holds all W steps unless ``span`` lets it run past its episode's end (keeping at least
``length - span`` trained steps; ``span=True`` is ``length - 1``) or ``strict_length=False`` admits an episode
shorter than W (one window, at its start). Steps past an episode's end come back as padding, ``mask`` False. The
burn-in always lies inside the episode: its first ``burn_in`` steps warm up, never train (R2D2's stored sequences
do the same).

Where TorchRL differs (on purpose): its uniform ``SliceSampler`` draws an episode, then a start in it (a short
episode's windows are likelier); here every valid window is equally likely. Its ``PrioritizedSliceSampler``
weighs a window by its start step's priority; here by its trained steps' (``eta=1``: their max, ``eta=0``: their
mean). Left spans (windows starting before the episode) are not offered, as in its prioritized sampler.

Keys: ``(episode << 24) | start``; an evicted episode's keys are stale (an update skips and counts them). The table
holds at most ``capacity_steps`` steps: an insert evicts the oldest episodes first (FIFO).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from apexrl.replay.wire import steps as S
from apexrl.replay.wire.episodes import chunk_columns, episode_chunks

__all__ = ["SliceBatch", "SliceTable", "decode_windows", "window_keys"]

START_BITS = 24
_SAMPLERS = ("prioritized", "uniform")


def window_keys(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(episode numbers, start steps) of window keys."""
    k = np.asarray(keys, dtype=np.uint64)
    return (k >> np.uint64(START_BITS)).astype(np.int64), (k & np.uint64((1 << START_BITS) - 1)).astype(np.int64)


@dataclass
class SliceBatch:
    """Sampled windows: ``steps`` (a :class:`~apexrl.replay.wire.steps.SequenceBatch`: fields of shape (n, W, ...),
    ``mask`` (n, W) False on padding past an episode's end) and per window its key, importance weight, probability,
    episode number and start step. ``total_mass``/``min_mass``: the masses the draws were made from (0 for uniform
    draws); ``windows``: the valid starts held when sampled."""

    keys: np.ndarray
    weights: np.ndarray
    probabilities: np.ndarray
    episodes: np.ndarray
    starts: np.ndarray
    steps: S.SequenceBatch
    total_mass: float
    min_mass: float
    windows: int


def decode_windows(
    sample: Mapping[str, Any], window: int, reuse: dict[str, np.ndarray] | None = None, *, native: bool = True
) -> S.SequenceBatch:
    """Decodes a sample's windows (the dict a :class:`SliceTable` samples, with its ``structure``: window i is
    ``rows[i]`` steps from step ``first[i]`` of its chunks) into arrays of ``window`` steps. Natively, with the GIL
    released, reading the chunks where the table holds them and the column places it kept at insert (no header
    parsed, one call per batch); ``native=False``: through the generic sequence decoder, the reference, with the
    same result, from the chunks' bytes of a sample made with ``copy_chunks=True``. ``reuse``: as
    :func:`~apexrl.replay.wire.steps.decode_sequences`'."""
    if native:
        return _decode_native(sample, window, reuse)
    if len(sample["chunk_offsets"]) != len(sample["chunk_steps"]) + 1:
        raise ValueError("the reference decoder reads the chunks' bytes: sample with copy_chunks=True")
    rows, first, fps = sample["rows"], sample["first"], sample["fingerprints"]
    offsets, refs = sample["window_chunk_offsets"], sample["window_chunks"]
    n = len(rows)
    items = [S.encode_item(int(fps[i]), int(first[i]), int(rows[i]), window, None) for i in range(n)]
    per_window = [refs[offsets[i] : offsets[i + 1]] for i in range(n)]
    data, chunk_offsets = sample["chunk_data"], sample["chunk_offsets"]
    blobs = [data[chunk_offsets[c] : chunk_offsets[c + 1]] for c in range(len(chunk_offsets) - 1)]
    return S.decode_sequences(items, blobs, per_window, chunk_data=data, chunk_offsets=chunk_offsets, reuse=reuse)


def _decode_native(sample: Mapping[str, Any], window: int, reuse: dict[str, np.ndarray] | None) -> S.SequenceBatch:
    from apexrl._core import decode_slices  # the extension, only where slices are used

    rows = sample["rows"]
    n = len(rows)
    out = S.output_arrays(sample["structure"], (n, window), reuse)
    mask = np.empty((n, window), dtype=bool)
    valid = decode_slices(sample["native"], list(out.values()), mask, window).astype(bool)
    num_steps = np.where(valid, rows, 0).astype(np.int64)
    return S.SequenceBatch(S.unflatten(out), mask, S.unflatten({}), valid, num_steps)


def _int(value: Any, name: str, low: int, high: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer) or value < low:
        raise ValueError(f"{name} must be an int >= {low}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{name} must be at most {high}, got {value!r}")
    return int(value)


def _span(span: bool | int, length: int) -> int:
    if isinstance(span, bool):
        return length - 1 if span else 0
    if not isinstance(span, int | np.integer) or not 0 <= span < length:
        raise ValueError(f"span must be a bool or an int in [0, length = {length}), got {span!r}")
    return int(span)


class SliceTable:
    """An in-process table of episodes sampled as windows (see the module's docstring for the contract).

    ``capacity_steps``: steps held at most (FIFO eviction of whole episodes). ``length`` (L) trained steps per
    window after ``burn_in`` (B) steps. ``sampler``: ``"prioritized"`` (mass ``(eta*max + (1-eta)*mean)**alpha``
    over the trained steps' priorities) or ``"uniform"``. ``strict_length``, ``span``: as TorchRL's
    ``SliceSampler`` (defaults True, False). ``chunk_length``: steps per stored chunk for :meth:`insert_episode`.
    Thread-safe: the native table takes its own lock, and sampling and decoding release the GIL."""

    def __init__(
        self,
        capacity_steps: int,
        length: int,
        *,
        burn_in: int = 0,
        sampler: str = "prioritized",
        alpha: float = 0.6,
        eta: float = 0.9,
        strict_length: bool = True,
        span: bool | int = False,
        chunk_length: int = 16,
        seed: int = 0,
    ) -> None:
        from apexrl._core import SliceTable as _Native  # the extension, only where slices are used

        self.capacity_steps = _int(capacity_steps, "capacity_steps", 1, 1 << 40)
        self.length = _int(length, "length", 1, (1 << START_BITS) - 1)
        self.burn_in = _int(burn_in, "burn_in", 0, (1 << START_BITS) - 1 - self.length)
        if sampler not in _SAMPLERS:
            raise ValueError(f"sampler must be one of {_SAMPLERS}, got {sampler!r}")
        for name, value in (("alpha", alpha), ("eta", eta)):
            if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
                raise ValueError(f"{name} must be a finite number >= 0, got {value!r}")
        if eta > 1:
            raise ValueError(f"eta must be in [0, 1], got {eta!r}")
        if not isinstance(strict_length, bool):
            raise ValueError(f"strict_length must be a bool, got {strict_length!r}")
        self.sampler, self.alpha, self.eta, self.strict_length = sampler, float(alpha), float(eta), strict_length
        self.span = _span(span, self.length)
        self.chunk_length = _int(chunk_length, "chunk_length", 1, (1 << START_BITS) - 1)
        self.window = self.burn_in + self.length
        self._native = _Native(
            self.capacity_steps,
            self.length,
            self.burn_in,
            sampler,
            self.alpha,
            self.eta,
            strict_length,
            self.span,
            _int(seed, "seed", 0, (1 << 64) - 1),
        )
        self._fingerprint: int | None = None  # of the first episode's structure: every episode's
        self._structure: list[tuple[str, np.dtype, tuple[int, ...]]] = []  # its fields, in path order

    def valid_starts(self, steps: int) -> int:
        """How many windows an episode of ``steps`` steps offers (e(n) above)."""
        b, w = self.burn_in, self.window
        if steps <= b or (self.strict_length and steps < w):
            return 0
        return max(0, min(steps - b, max(1, steps - w + 1 + self.span)))

    def insert_episode(self, steps: Mapping[str, Any], priorities: Any = None) -> int:
        """Stores an episode: ``steps`` maps each field (nested mappings allowed) to an array of the episode's n
        steps (leading dimension n, the same for every field and the same structure in every episode);
        ``priorities``: one per step, one for all, or None (the largest priority ever set; 1 before any).
        Returns its episode number. ValueError for anything else, storing nothing."""
        chunks, counts, fp = self.episode_chunks(steps)
        return self._insert(chunks, counts, fp, priorities)

    def episode_chunks(self, steps: Mapping[str, Any]) -> tuple[list[bytes], list[int], int]:
        """(chunks, steps per chunk, structure fingerprint) of an episode cut as :meth:`insert_episode` cuts it,
        ``chunk_length`` steps a chunk: what :meth:`insert_chunks` takes (to store one episode several times
        without encoding it again). ValueError as :meth:`insert_episode`."""
        return episode_chunks(steps, self.chunk_length)

    def insert_chunks(self, chunks: Sequence[Any], priorities: Any = None) -> int:
        """Stores an episode already cut into step chunks (:mod:`apexrl.replay.wire.steps`, e.g. a
        :class:`~apexrl.replay.client.trajectory.TrajectoryWriter`'s), in step order, as :meth:`insert_episode`
        does: every chunk's header is checked, and they must share the table's structure."""
        if isinstance(chunks, bytes | bytearray | memoryview) or not len(chunks):
            raise ValueError("chunks must be a non-empty sequence of step chunks")
        counts, fps = [], set()
        for c, blob in enumerate(chunks):
            try:
                k, fp, _key = S.chunk_summary(blob)
            except (TypeError, ValueError) as e:
                raise ValueError(f"chunk {c} is not a step chunk: {e}") from None
            counts.append(k)
            fps.add(fp)
        if len(fps) != 1:
            raise ValueError("the chunks of one episode must share one structure (their fingerprints differ)")
        return self._insert(list(chunks), counts, fps.pop(), priorities)

    def _insert(self, chunks: list[Any], counts: list[int], fingerprint: int, priorities: Any) -> int:
        if self._fingerprint is not None and fingerprint != self._fingerprint:
            raise ValueError(
                "the episode's structure (fields, dtypes, shapes) differs from the table's first episode's"
            )
        columns, structure = chunk_columns(chunks, self._structure or None)
        n = sum(counts)
        p = None
        if priorities is not None:
            p = np.asarray(priorities, dtype=np.float64)
            if p.ndim == 0:
                p = np.full(n, float(p))
            if p.shape != (n,):
                raise ValueError(f"priorities must be one number or {n} (one per step), got shape {p.shape}")
        number = int(self._native.insert(fingerprint, chunks, np.asarray(counts, dtype=np.uint64), p, columns))
        self._fingerprint, self._structure = fingerprint, structure
        return number

    def sample(self, batch_size: int, beta: float = 0.4, reuse: dict[str, np.ndarray] | None = None) -> SliceBatch:
        """``batch_size`` windows, drawn with replacement, decoded (``reuse``: as
        :func:`~apexrl.replay.wire.steps.decode_sequences`'). ValueError when no window can be drawn."""
        raw = self._raw_sample(batch_size, beta)
        episodes, starts = window_keys(raw["keys"])
        return SliceBatch(
            keys=raw["keys"],
            weights=raw["weights"],
            probabilities=raw["probabilities"],
            episodes=episodes,
            starts=starts,
            steps=decode_windows(raw, self.window, reuse),
            total_mass=raw["total_mass"],
            min_mass=raw["min_mass"],
            windows=int(raw["windows"]),
        )

    def _raw_sample(self, batch_size: int, beta: float = 0.4, copy_chunks: bool = False) -> dict[str, Any]:
        """The native sample (what :func:`decode_windows` takes), with the table's ``structure``: its fields
        (path, dtype, shape) in column order."""
        raw = self._native.sample(_int(batch_size, "batch_size", 1, 1 << 24), float(beta), copy_chunks)
        raw["structure"] = self._structure
        return raw

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Writes new priorities to the trained steps of the windows ``keys`` names: ``priorities`` one per window
        (n,) or one per trained step (n, length). Returns how many keys were live (the rest are counted stale)."""
        k = np.asarray(keys)
        if k.ndim != 1 or (k.size and k.dtype.kind not in "iu") or (k.dtype.kind == "i" and (k < 0).any()):
            raise ValueError("keys must be a 1-D array of the non-negative integer keys a sample returned")
        return int(self._native.update(k.astype(np.uint64), np.asarray(priorities, dtype=np.float64)))

    def clear(self) -> int:
        """Drops every episode (the counters stay, episode numbers go on, the largest priority is 1 again, the
        next episode may have another structure) -> how many were dropped."""
        dropped = int(self._native.clear())
        self._fingerprint, self._structure = None, []
        return dropped

    def stats(self) -> dict[str, Any]:
        """Episodes, steps and windows held, chunk and metadata bytes, masses and counters."""
        return dict(self._native.stats())

    def windows(self) -> tuple[np.ndarray, np.ndarray]:
        """(keys, masses) of every valid window, oldest episode first (tests, introspection)."""
        keys, masses = self._native.windows()
        return keys, masses

    def step_priorities(self, episode: int) -> np.ndarray:
        return self._native.step_priorities(int(episode))

    def validate(self) -> None:
        """Raises RuntimeError at the first broken invariant of the native table (tests)."""
        self._native.validate()

    def __len__(self) -> int:
        return int(self.stats()["episodes"])
