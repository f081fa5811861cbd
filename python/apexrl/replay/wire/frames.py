"""Atari frames stored once: stacked-frame transitions <-> items that reference shared frame chunks.

An Atari transition holds two stacks of ``S`` frames (obs and next_obs, ``(S, H, W)`` uint8, oldest first), but
consecutive observations of one environment share ``S - 1`` frames, so storing both stacks in every item stores
each frame about ``2 S`` times. :class:`FrameStackCodec` stores each distinct frame of an insert batch once:

- **encode** (actor, once per insert): the batch's frames are de-duplicated by content; frames are linked into
  chains by the stacks they appear in (frame ``i`` of a stack is followed by frame ``i + 1``), so a chain is one
  environment's frames in time order, whatever the number of environments and however their transitions
  interleave; the chains, concatenated, are cut into chunks of at most ``chunk_frames`` frames, each chunk
  lz4-compressed as one block (consecutive frames compress together 7-9x where one frame alone gains 1.5-2.6x).
  Item ``i`` keeps its action, reward and discount and, for each stack, ``S`` u16 frame references: ``slot << 8 |
  index`` (frame ``index`` of the item's ``slot``-th chunk) or ``0xFFFF`` for an all-zero frame (the zero
  padding before an episode's first frame, rebuilt as zeros, not stored).
- **decode** (learner, once per sampled batch): every chunk a well-referenced item uses decompressed once, its
  frames copied straight to the stack slots that reference them. The result is bit for bit the batch that was
  encoded (frames equal by content are interchangeable). Two implementations with the same result, bad-item
  mask and first message: :meth:`FrameStackCodec.decode_valid` in Python (the reference), and
  :meth:`FrameStackCodec.decode_valid_into`, native (cpp/apexrl/frame_decode.h) with the GIL released, into
  preallocated batches (:class:`FrameBatchDecoder`, the learner's decode threads).

The items are those of :attr:`FrameStackCodec.item_spec`, a plain :class:`TransitionSpec` (``obs_frames`` and
``next_obs_frames`` u16[S] beside the other fields, and a zero-byte ``frame`` field of shape (0, H, W) that
records the frame size), which the server checks and fingerprints like any other; :meth:`FrameStackCodec.
from_item_spec` rebuilds the codec from it alone (a snapshot's spec sidecar is enough to decode its items).
Chunks never span two insert batches: each encode makes its own. Never imports torch.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any

import lz4.block
import numpy as np

from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

__all__ = [
    "CHUNK_FRAMES",
    "PAD",
    "FrameBatchDecoder",
    "FrameStackCodec",
    "applies",
    "decode_valid",
    "frame_codec",
    "wire_spec",
]

CHUNK_FRAMES = 8
"""Frames per chunk. Measured on Pong (bench/README.md): 8 holds 133 B per transition (16: 125, 4: 154) and a
sampled item drags in less of a chunk it does not need than with 16 (smaller replies, less to decompress)."""
PAD = 0xFFFF
"""A frame reference that stands for an all-zero frame."""
_STACKS = ("obs", "next_obs")
_MAX_CHUNKS_PER_ITEM = 16  # the store's kMaxChunksPerItem; an item needs at most 2 S <= 16 chunks


class FrameStackCodec:
    """Encodes batches of ``spec`` (with ``obs``/``next_obs`` u8 stacks) into items of :attr:`item_spec` plus
    frame chunks, and decodes sampled items with their chunks back into ``spec``'s batches."""

    def __init__(self, spec: TransitionSpec, chunk_frames: int = CHUNK_FRAMES):
        if not applies(spec):
            raise ValueError(f"{spec!r} has no obs/next_obs uint8 frame stacks of the same shape")
        if not 1 <= chunk_frames <= 255:
            raise ValueError(f"chunk_frames must be in [1, 255], got {chunk_frames}")
        self.spec = spec
        self.chunk_frames = chunk_frames
        self.stack, self.height, self.width = spec["obs"].shape
        self.frame_bytes = self.height * self.width
        fields = []
        for f in spec.fields:
            if f.name in _STACKS:
                fields.append(FieldSpec(f"{f.name}_frames", "<u2", (self.stack,)))
            else:
                fields.append(f)
        fields.append(FieldSpec("frame", "u1", (0, self.height, self.width)))  # zero bytes: the frame size
        self.item_spec = TransitionSpec(fields)

    @classmethod
    def from_item_spec(cls, item_spec: TransitionSpec) -> FrameStackCodec | None:
        """The codec whose :attr:`item_spec` is ``item_spec`` (None when it is no frame codec's item spec)."""
        names = item_spec.names
        if "frame" not in names or not all(f"{name}_frames" in names for name in _STACKS):
            return None
        _zero, height, width = (item_spec["frame"].shape + (0, 0, 0))[:3]
        stack = item_spec["obs_frames"].shape[0] if item_spec["obs_frames"].shape else 0
        fields = []
        for f in item_spec.fields:
            if f.name == "frame":
                continue
            if f.name.endswith("_frames") and f.name[: -len("_frames")] in _STACKS:
                fields.append(FieldSpec(f.name[: -len("_frames")], "u1", (stack, height, width), compress=True))
            else:
                fields.append(f)
        try:
            codec = cls(TransitionSpec(fields))
        except ValueError:
            return None
        return codec if codec.item_spec == item_spec else None

    # -- encode ------------------------------------------------------------------------------------------------

    def encode(self, batch: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray, P.FrameChunks]:
        """``(data, offsets, chunks)`` of the n transitions of ``batch`` (a batch of :attr:`spec`): the items of
        :attr:`item_spec` and the chunks they reference, ready for ``insert(..., chunks=chunks)``."""
        n, arrays = self.spec._check_batch(batch)
        s = self.stack
        stacks = np.concatenate(
            [np.ascontiguousarray(arrays[name], np.uint8).reshape(n * s, self.frame_bytes) for name in _STACKS]
        )  # (2 n s, H W): obs stacks, then next_obs stacks
        ids = np.empty(2 * n * s, np.int64)  # each stack frame's distinct-frame id; -1: all zeros
        frames: list[bytes] = []
        seen: dict[bytes, int] = {}
        zero = bytes(self.frame_bytes)
        for r in range(2 * n * s):
            key = stacks[r].tobytes()
            if key == zero:
                ids[r] = -1
                continue
            i = seen.get(key)
            if i is None:
                i = seen[key] = len(frames)
                frames.append(key)
            ids[r] = i
        # Chains: frame i of a stack is followed by frame i + 1 (the first link found for a frame wins).
        m = len(frames)
        nxt = np.full(m, -1, np.int64)
        has_prev = np.zeros(m, bool)
        grid = ids.reshape(2 * n, s)
        for row in grid.tolist():
            for a, b in itertools.pairwise(row):
                if a >= 0 and b >= 0 and a != b and nxt[a] < 0 and not has_prev[b]:
                    nxt[a], has_prev[b] = b, True
        order: list[int] = []
        placed = np.zeros(m, bool)
        for head in range(m):
            if has_prev[head] or placed[head]:
                continue
            f = head
            while f >= 0 and not placed[f]:
                placed[f] = True
                order.append(f)
                f = int(nxt[f])
        for f in range(m):  # frames on a cycle (possible only with repeated content): in id order
            if not placed[f]:
                order.append(f)
        where = np.empty(m, np.int64)  # distinct frame -> position in the concatenated chains
        where[np.asarray(order, np.int64)] = np.arange(m)
        chunks = [
            lz4.block.compress(b"".join(frames[f] for f in order[c : c + self.chunk_frames]))
            for c in range(0, m, self.chunk_frames)
        ]
        # Each item's chunks (its slots) and its u16 references.
        pos = np.where(ids >= 0, where[np.maximum(ids, 0)], -1).reshape(2, n, s)
        refs_out = np.full((2, n, s), PAD, np.uint16)
        item_refs: list[list[int]] = []
        for i in range(n):
            slots: dict[int, int] = {}
            for k in range(2):
                for j in range(s):
                    p = int(pos[k, i, j])
                    if p < 0:
                        continue
                    c = p // self.chunk_frames
                    slot = slots.setdefault(c, len(slots))
                    refs_out[k, i, j] = slot << 8 | (p - c * self.chunk_frames)
            item_refs.append(list(slots))
        items = {name: arrays[name] for name in self.spec.names if name not in _STACKS}
        items["obs_frames"] = refs_out[0]
        items["next_obs_frames"] = refs_out[1]
        items["frame"] = np.zeros((n, 0, self.height, self.width), np.uint8)
        data, offsets = self.item_spec.encode(items)
        return data, offsets, P.pack_chunks(chunks, item_refs)

    # -- decode ------------------------------------------------------------------------------------------------

    def decode(self, data: Any, offsets: Any, chunks: P.FrameChunks | None) -> dict[str, np.ndarray]:
        """The batch of :attr:`spec` that sampled items (``data``/``offsets`` of :attr:`item_spec`) and their
        ``chunks`` hold. ValueError naming the first item that does not decode."""
        fields, bad, message = self.decode_valid(data, offsets, chunks)
        if bad is not None:
            raise ValueError(message)
        return fields

    def decode_valid(
        self, data: Any, offsets: Any, chunks: P.FrameChunks | None
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None]:
        """As :meth:`TransitionSpec.decode_valid`: (the fields of the items that decode, a mask of those that do
        not or None, the first reason), so a learner can erase what it cannot use and train on the rest."""
        fields, bad, message = self.item_spec.decode_valid(data, offsets)
        fields.pop("frame", None)
        n_all = len(offsets) - 1
        good = np.flatnonzero(~bad) if bad is not None else np.arange(n_all)
        fc = chunks if chunks is not None else P.FrameChunks.none(n_all)
        # Each frame reference -> (chunk, index in it), checked; then every chunk decompressed once and its frames
        # copied straight to the stack slots that reference them (no intermediate frame table). A chunk's
        # stored size is checked before lz4 allocates anything: a whole number of frames, at most 255.
        co = np.asarray(fc.chunk_offsets, np.int64)
        nchunks = max(len(co) - 1, 0)
        blob = np.frombuffer(fc.chunk_data, np.uint8) if nchunks else np.zeros(0, np.uint8)
        lengths = np.diff(co) if nchunks else np.zeros(0, np.int64)
        prefix = np.zeros(nchunks, np.int64)
        has = lengths >= 4
        if has.any():
            at = co[:-1][has]
            prefix[has] = (
                blob[at].astype(np.int64)
                | blob[at + 1].astype(np.int64) << 8
                | blob[at + 2].astype(np.int64) << 16
                | blob[at + 3].astype(np.int64) << 24
            )
        chunk_ok = has & (prefix % self.frame_bytes == 0) & (prefix > 0) & (prefix <= 255 * self.frame_bytes)
        frames_in = np.append(np.where(chunk_ok, prefix // self.frame_bytes, 0), 0)  # [nchunks]: none
        s_ = self.stack
        refs = np.stack([fields.pop(f"{name}_frames").astype(np.int64) for name in _STACKS])  # (2, n_good, S)
        slot, index, pad = refs >> 8, refs & 0xFF, refs == PAD
        item_chunks = np.asarray(fc.item_chunks, np.int64)
        ico = np.asarray(fc.item_chunk_offsets, np.int64)
        first, count = ico[good], ico[good + 1] - ico[good]
        at = first[None, :, None] + slot
        named = ~pad & (slot < count[None, :, None]) & (at >= 0) & (at < len(item_chunks))
        chunk = np.where(
            named, item_chunks[np.clip(at, 0, max(len(item_chunks) - 1, 0))] if len(item_chunks) else nchunks, nchunks
        )
        chunk = np.where((chunk >= 0) & (chunk < nchunks), chunk, nchunks)
        valid = pad | (named & (index < frames_in[chunk]))
        ok = valid.reshape(2, len(good), s_).all(axis=(0, 2))
        out = np.empty((2 * len(good) * s_, self.height * self.width), np.uint8)
        out[np.flatnonzero(pad.reshape(-1))] = 0  # zero frames; every other slot of a kept item is copied below
        use = (valid & ~pad & ok[None, :, None]).reshape(-1)
        targets = np.flatnonzero(use)
        chunk_t, index_t = chunk.reshape(-1)[targets], index.reshape(-1)[targets]
        order = np.argsort(chunk_t, kind="stable")
        chunk_t, index_t, targets = chunk_t[order], index_t[order], targets[order]
        cuts = np.flatnonzero(np.diff(chunk_t)) + 1
        view = memoryview(fc.chunk_data).cast("B") if nchunks else memoryview(b"")
        dst = memoryview(out.reshape(-1))  # type: ignore[arg-type]  # an ndarray is a buffer; numpy's stubs lack __buffer__
        fb = self.frame_bytes
        decompress = lz4.block.decompress
        failed = []
        # Frame copies as memoryview slices: cheaper than a numpy gather per chunk for the few frames of each.
        t_list, i_list, co_list, prefix_list = targets.tolist(), index_t.tolist(), co.tolist(), prefix.tolist()
        for lo, hi in zip([0, *cuts.tolist()], [*cuts.tolist(), len(targets)]):
            if lo == hi:
                continue
            c = int(chunk_t[lo])
            try:
                raw = decompress(view[co_list[c] : co_list[c + 1]])
                if len(raw) != prefix_list[c]:
                    raise ValueError("chunk size")
            except Exception:  # noqa: BLE001 - a corrupted chunk: the items using it are bad
                failed.append(c)
                continue
            src = memoryview(raw)
            for t, i in zip(t_list[lo:hi], i_list[lo:hi]):
                dst[t * fb : (t + 1) * fb] = src[i * fb : (i + 1) * fb]
        if failed:
            ok &= ~np.isin(chunk, failed).reshape(2, len(good), s_).any(axis=(0, 2))
        out = out.reshape(2, len(good), s_, self.height, self.width)
        for k, name in enumerate(_STACKS):
            fields[name] = out[k]
        return self._keep_rebuilt(fields, ok, good, n_all, bad, message)

    def _keep_rebuilt(
        self,
        fields: dict[str, np.ndarray],
        ok: np.ndarray,
        good: np.ndarray,
        n_all: int,
        bad: np.ndarray | None,
        message: str | None,
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None]:
        """``decode_valid``'s triple once the stacks are rebuilt: ``ok[j]`` says whether item ``good[j]``'s frame
        references all named frames; the items whose did not join the bad ones (the first named in the message
        if none was before), and only the others' rows are kept."""
        if not ok.all():
            reason = f"item {int(good[np.argmin(ok)])}: a frame reference names no frame of its chunks"
            bad = np.zeros(n_all, bool) if bad is None else bad.copy()
            bad[good[~ok]] = True
            message = message or reason
            for key in list(fields):
                fields[key] = fields[key][ok]
        return {name: fields[name] for name in self.spec.names}, bad, message

    def empty_batch(self, n: int, *, pin_memory: bool = False) -> dict[str, np.ndarray]:
        """Arrays for :meth:`decode_valid_into` to fill: :attr:`spec`'s fields (``pin_memory``: page-locked, as
        :meth:`TransitionSpec.empty_batch`), plus the item fields that only :attr:`item_spec` has (the frame
        references, scratch space of the decode)."""
        out = self.spec.empty_batch(n, pin_memory=pin_memory)
        for name, a in self.item_spec.empty_batch(n).items():
            out.setdefault(name, a)
        return out

    def decode_valid_into(
        self, data: Any, offsets: Any, chunks: P.FrameChunks | None, out: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None]:
        """:meth:`decode_valid`, natively and into ``out`` (from :meth:`empty_batch`, at least as many rows as
        items): the item fields by :meth:`TransitionSpec.decode_valid_into`, then the stacks rebuilt from the
        chunks with the GIL released, so several decode threads work side by side. The same bad mask and first
        message as :meth:`decode_valid`. When every item decodes, the arrays are views of ``out`` (valid until it
        is written again); otherwise the good items' rows are copied out (a rare, slow path)."""
        from apexrl._core import rebuild_frame_stacks  # the extension, only where items decode

        missing = [name for name in (*self.spec.names, *self.item_spec.names) if name not in out]
        if missing:
            raise ValueError(f"out lacks the arrays {missing} (FrameStackCodec.empty_batch makes them)")
        fields, bad, message = self.item_spec.decode_valid_into(
            data, offsets, {name: out[name] for name in self.item_spec.names}
        )
        fields = dict(fields)
        fields.pop("frame", None)
        n_all = len(offsets) - 1
        good = np.flatnonzero(~bad) if bad is not None else np.arange(n_all, dtype=np.int64)
        fc = chunks if chunks is not None else P.FrameChunks.none(n_all)
        shape = (self.stack, self.height, self.width)
        for name in _STACKS:
            a = out[name]
            if (
                not isinstance(a, np.ndarray)
                or a.dtype != np.uint8
                or a.shape[1:] != shape
                or a.ndim != 4
                or a.shape[0] < good.size
                or not a.flags.c_contiguous
                or not a.flags.writeable
            ):
                what = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                raise ValueError(
                    f"out[{name!r}]: expected a writable C-contiguous uint8 array of shape "
                    f"(>= {good.size}, *{shape}), got {what}"
                )
        refs = [np.ascontiguousarray(fields.pop(f"{name}_frames"), np.uint16) for name in _STACKS]
        chunk_data = fc.chunk_data if len(fc.chunk_data) else b""
        ok = rebuild_frame_stacks(
            self.stack,
            self.frame_bytes,
            good.astype(np.int64, copy=False),
            refs,
            np.ascontiguousarray(fc.item_chunks, np.uint64),
            np.ascontiguousarray(fc.item_chunk_offsets, np.uint64),
            chunk_data,
            np.ascontiguousarray(fc.chunk_offsets, np.uint64),
            [out[name] for name in _STACKS],
        ).view(bool)
        for name in _STACKS:
            fields[name] = out[name][: good.size]
        return self._keep_rebuilt(fields, ok, good, n_all, bad, message)


class FrameBatchDecoder:
    """:class:`~apexrl.replay.wire.codec.BatchDecoder` for items of a :class:`FrameStackCodec`: the decode hook of a
    :class:`~apexrl.replay.client.sampler.PrefetchingSampler` whose sampled batches carry frame chunks (Atari).
    ``allocate`` makes one slot of the sampler's ring (:meth:`FrameStackCodec.empty_batch`), ``decode_into(raw,
    slot)`` rebuilds a sampled batch (``data``, ``offsets``, ``chunks``) into it natively with the GIL released.

    ``valid=True`` returns :meth:`FrameStackCodec.decode_valid_into`'s triple (arrays, bad mask or None, first
    error or None) instead of raising on a bad item. ``pin_memory=True`` allocates page-locked stacks."""

    def __init__(self, codec: FrameStackCodec, batch_size: int, *, valid: bool = False, pin_memory: bool = False):
        if not isinstance(codec, FrameStackCodec):
            raise TypeError(f"codec must be a FrameStackCodec, got {type(codec).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.codec = codec
        self.batch_size = batch_size
        self.valid = bool(valid)
        self.pin_memory = bool(pin_memory)

    def allocate(self) -> dict[str, np.ndarray]:
        return self.codec.empty_batch(self.batch_size, pin_memory=self.pin_memory)

    def decode_into(self, raw: Any, out: dict[str, np.ndarray]) -> Any:
        fields, bad, message = self.codec.decode_valid_into(raw.data, raw.offsets, getattr(raw, "chunks", None), out)
        if self.valid:
            return fields, bad, message
        if bad is not None:
            raise ValueError(message)
        return fields


def applies(spec: TransitionSpec) -> bool:
    """Whether ``spec`` has the frame stacks this codec stores once (``obs`` and ``next_obs``, uint8 (S, H, W))."""
    try:
        obs, nxt = spec["obs"], spec["next_obs"]
    except KeyError:
        return False
    return (
        obs.dtype == np.uint8
        and nxt.dtype == np.uint8
        and len(obs.shape) == 3
        and obs.shape == nxt.shape
        and 2 * obs.shape[0] <= _MAX_CHUNKS_PER_ITEM
        and obs.shape[0] >= 1
        and obs.shape[1] * obs.shape[2] > 0
    )


def frame_codec(spec: TransitionSpec) -> FrameStackCodec | None:
    """The frame codec of an agent's spec when it has frame stacks (Atari), else None (items as the spec's)."""
    return FrameStackCodec(spec) if applies(spec) else None


def wire_spec(spec: TransitionSpec) -> TransitionSpec:
    """The spec of the items the replay holds for an agent's ``spec``: the frame codec's item spec, or ``spec``."""
    codec = frame_codec(spec)
    return codec.item_spec if codec is not None else spec


def decode_valid(
    spec: TransitionSpec, codec: FrameStackCodec | None, batch: Any
) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None]:
    """The one decode of a sampled batch (``data``, ``offsets`` and, for frame stacks, ``chunks``), whichever
    layout its items have: (fields of the items that decode, mask of those that do not or None, first reason).
    ``codec``: ``frame_codec(spec)``, made once by the caller."""
    if codec is None:
        return spec.decode_valid(batch.data, batch.offsets)
    return codec.decode_valid(batch.data, batch.offsets, getattr(batch, "chunks", None))
