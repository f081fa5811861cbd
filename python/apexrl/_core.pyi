# Type stub of the native extension; keep in step with cpp/bindings/ (store_bindings.cpp, decode_bindings.cpp,
# serve_bindings.cpp, errors_bindings.cpp): tests/test_core_stub.py fails when a public name is missing here.
from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

class SnapshotError(ValueError):
    """A snapshot file is truncated, corrupted, of an unknown version, or not a snapshot; or a save failed."""

class StaleChunksError(ValueError):
    """An insert referenced stored chunks (by chunk key) that are gone; nothing was stored."""

class SampleBatch:
    @property
    def keys(self) -> npt.NDArray[np.uint64]: ...
    @property
    def weights(self) -> npt.NDArray[np.float32]: ...
    @property
    def probabilities(self) -> npt.NDArray[np.float64]: ...
    @property
    def data(self) -> npt.NDArray[np.uint8]: ...
    @property
    def offsets(self) -> npt.NDArray[np.uint64]: ...
    @property
    def item_chunk_offsets(self) -> npt.NDArray[np.uint64]:
        """n + 1 offsets into item_chunks (all 0 for items without chunks)."""
    @property
    def item_chunks(self) -> npt.NDArray[np.uint64]:
        """Item i's chunks, as indices into this batch's chunks: item_chunks[item_chunk_offsets[i]:...[i + 1]]."""
    @property
    def chunk_data(self) -> npt.NDArray[np.uint8]:
        """The bytes of every chunk the batch references, each once."""
    @property
    def chunk_offsets(self) -> npt.NDArray[np.uint64]:
        """(number of chunks) + 1 offsets into chunk_data."""
    @property
    def chunks(self) -> list[bytes]: ...
    @property
    def items(self) -> list[memoryview]: ...
    @property
    def total_mass(self) -> float: ...
    @property
    def min_mass(self) -> float: ...
    @property
    def size(self) -> int: ...
    def __len__(self) -> int: ...

class DiskTable:
    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        durability: str = ...,
        interval_s: float = ...,
        segment_bytes: int = ...,
        capacity: int = ...,
        alpha: float = ...,
        shards: int = ...,
        eviction: str = ...,
        alpha_evict: float = ...,
        seed: int = ...,
        max_size: int | None = ...,
        epoch: int = ...,
        sampler: str = ...,
        max_times_sampled: int = ...,
        cache_bytes: int = ...,
    ) -> None: ...
    @property
    def store(self) -> PrioritizedStore: ...
    @property
    def opened(self) -> dict[str, Any]: ...
    @property
    def path(self) -> str: ...
    @property
    def durability(self) -> str: ...
    @property
    def cache_bytes(self) -> int: ...
    def stats(self) -> dict[str, Any]: ...

class PrioritizedStore:
    MAX_MASS: float
    MAX_EPOCH: int
    MAX_BATCH_ITEMS: int
    def __init__(
        self,
        capacity: int = 1_000_000,
        alpha: float = 0.6,
        shards: int = 8,
        eviction: str = "fifo",
        alpha_evict: float = -0.4,
        seed: int = 0,
        max_size: int | None = None,
        epoch: int = 1,
        sampler: str = "prioritized",
        max_times_sampled: int = 0,
    ) -> None: ...
    def insert(
        self,
        priorities: npt.ArrayLike,
        items: Sequence[Any] | npt.NDArray[Any] | bytes | memoryview,
        offsets: npt.ArrayLike | None = None,
        chunks: Sequence[Any] | None = None,
        item_chunks: npt.ArrayLike | None = None,
        item_chunk_offsets: npt.ArrayLike | None = None,
        return_chunk_keys: bool = False,
    ) -> Any: ...
    def sample(self, n: int, beta: float = 0.4) -> SampleBatch: ...
    def update_priorities(self, keys: npt.ArrayLike, priorities: npt.ArrayLike) -> int: ...
    def erase(self, keys: npt.ArrayLike) -> int: ...
    def remove_to_fit(self) -> int: ...
    def stats(self) -> dict[str, int | float]: ...
    def save(self, path: str | os.PathLike[str]) -> None: ...
    @staticmethod
    def load(path: str | os.PathLike[str], epoch: int | None = None) -> PrioritizedStore: ...
    @staticmethod
    def snapshot_epoch(path: str | os.PathLike[str]) -> int: ...
    @staticmethod
    def snapshot_version(path: str | os.PathLike[str]) -> int: ...
    def contents(self) -> dict[str, Any]: ...
    def check_invariants(self) -> None: ...
    def __len__(self) -> int: ...
    @property
    def capacity(self) -> int: ...
    @property
    def alpha(self) -> float: ...
    @property
    def alpha_evict(self) -> float: ...
    @property
    def shards(self) -> int: ...
    @property
    def seed(self) -> int: ...
    @property
    def max_size(self) -> int: ...
    @property
    def epoch(self) -> int: ...
    @property
    def eviction(self) -> str: ...
    @property
    def sampler(self) -> str: ...
    @property
    def max_times_sampled(self) -> int: ...
    @property
    def total_priority(self) -> float: ...

class ItemLayout:
    """A TransitionSpec's item layout, for the server's item check and the native decoder (built by
    TransitionSpec.native_layout; immutable)."""
    def __init__(self, fingerprint: int, fields: Sequence[tuple[str, int, bool]], repr: str) -> None: ...
    @property
    def header_bytes(self) -> int: ...

def decode_items(
    layout: ItemLayout,
    data: npt.NDArray[np.uint8],
    starts: npt.NDArray[np.int64],
    sizes: npt.NDArray[np.int64],
    outs: list[npt.NDArray[Any]],
) -> None: ...
def rebuild_frame_stacks(
    depth: int,
    frame_bytes: int,
    items: npt.NDArray[np.int64],
    refs: list[npt.NDArray[np.uint16]],
    item_chunks: npt.NDArray[np.uint64],
    item_chunk_offsets: npt.NDArray[np.uint64],
    chunk_data: Any,
    chunk_offsets: npt.NDArray[np.uint64],
    outs: list[npt.NDArray[np.uint8]],
) -> npt.NDArray[np.uint8]:
    """Frame stacks of sampled items rebuilt from their u16 references and the batch's frame chunks, with the
    GIL released; returns a mask, 1 where an item's stacks were rebuilt (FrameStackCodec.decode_valid_into)."""

def decode_steps(
    chunk_data: Any,
    columns: npt.NDArray[np.uint64],
    chunk_steps: npt.NDArray[np.uint64],
    row_bytes: npt.NDArray[np.uint64],
    outs: list[npt.NDArray[Any]],
    n: int,
    t: int,
    copies: npt.NDArray[np.uint64],
) -> npt.NDArray[np.uint8]:
    """Sequence items' steps copied out of their step chunks with the GIL released (wire/steps.py); returns a
    mask, 1 where every copy of an item succeeded."""

# ------------------------------------------------------------------ the serving loop (cpp/bindings/serve_bindings.cpp)

class ServeLoop:
    """The replay server's request path (cpp/apexrl/serve/serve_loop.h), over a configured zmq ROUTER socket (its
    address, Socket.underlying) and the path of the libzmq that pyzmq loaded. Use
    apexrl.replay.server.ReplayServer."""
    def __init__(
        self,
        socket: int,
        libzmq: str,
        store: PrioritizedStore,
        *,
        max_bytes: int,
        max_reply_bytes: int,
        workers: int,
        inline_sample_max: int,
        max_wait_s: float,
        max_waiting: int,
        max_waiting_per_peer: int,
        max_waiting_bytes: int,
        max_unread_bytes: int,
        samples_per_insert: float,
        error_buffer: float,
        min_size_to_sample: int,
        dedup_max_ids: int,
        dedup_max_bytes: int,
        role_ops: dict[str, int] = ...,
        tables: list[tuple[str, PrioritizedStore, dict[str, Any]]]
        | list[tuple[str, PrioritizedStore | SliceTable, dict[str, Any], DiskTable | None]]
        | None = None,
    ) -> None:
        """``tables``: (name, store or SliceTable (a slices table), rate limiter[, DiskTable of a disk table or None])
        in index order, the limiter
        as ``--tables`` spells it; None: the one table ``default`` over ``store`` with samples_per_insert /
        error_buffer / min_size_to_sample."""
    def start(self) -> None: ...
    def stop(self) -> None: ...
    def next_control(self, timeout_s: float) -> tuple[bytes, str, int, list[bytes]] | str | None:
        """(peer, identity, op, frames) of the next HELLO/STATS, or (b'', LEVEL, 0, [text]) of a line to log;
        None after timeout_s; 'closed' once the loop has stopped and nothing is left."""
    def control_reply(self, peer: bytes, frames: list[bytes]) -> None: ...
    def set_layout(self, layout: ItemLayout, table: int | None = None) -> None:
        """The item layout a table's inserts are checked against (table: its index; None: the table `default`)."""
    @property
    def num_tables(self) -> int: ...
    def stats(self) -> dict[str, int | float]: ...

# The serving loop's pieces, for tests against their Python definitions.
def serve_decode(frames: Sequence[bytes], max_bytes: int = 0) -> tuple[int, int, int, str]:
    """(status, op, request_id, message) the serving loop's decoder gives a request."""

def serve_first_bad_item(layout: ItemLayout, data: Any, offsets: Any) -> str | None:
    """The message naming the first bad item of a batch (offsets already valid), or None."""

def serve_constants() -> dict[str, Any]: ...
def serve_plan() -> dict[str, Any]:
    """The serving loop's wire plan (serve/wire.h): the header's fields as (name, offset, size) and, per data
    op, its request's frames as (name, type, length, rule) and its use of count, param and timeout_ms."""

def serve_deadlock_reason(n: float, m: float, spi: float, eb: float) -> str | None: ...

class NativeRateLimiter:
    """The serving loop's rate limiter (tests)."""
    def __init__(self, spi: float | None, eb: float, min_size: int) -> None: ...
    def big_enough(self, size: int, /) -> bool: ...
    def insert_ok(self, n: int, size: int, inserted: int, sampled: int, /) -> bool: ...
    def sample_ok(self, n: int, size: int, inserted: int, sampled: int, /) -> bool: ...
    def try_insert(self, n: int, size: int, /) -> bool: ...
    def try_sample(self, n: int, size: int, /) -> bool: ...
    def undo(self, inserted: int = 0, sampled: int = 0) -> None: ...
    def never_admitted(self, op: int, n: int, size: int, /) -> str | None: ...
    def counts(self) -> tuple[int, int]: ...
    def describe(self) -> str: ...

class NativeInsertWindow:
    """The serving loop's exactly-once insert window (tests)."""
    def __init__(self, max_ids: int, max_bytes: int) -> None: ...
    def claim(
        self, identity: str, session: int, sequence: int, owner: int, deadline: float, now: float, /
    ) -> tuple[str, list[int] | None]: ...
    def release(self, identity: str, session: int, sequence: int, owner: int, /) -> None: ...
    def finish(self, identity: str, session: int, sequence: int, owner: int, keys: Sequence[int], /) -> None: ...
    def stats(self) -> dict[str, int]: ...

DEFAULT_EVICTION: str
DEFAULT_SAMPLER: str

def eviction_kinds() -> list[tuple[int, str, str | None]]: ...
def sampler_kinds() -> list[tuple[int, str, str | None]]: ...

class SliceSample:
    """A SliceTable sample's C++ buffers (opaque; its dict's arrays view them)."""

def decode_slices(
    sample: SliceSample, outs: list[npt.NDArray[Any]], mask: npt.NDArray[np.bool_], window: int
) -> npt.NDArray[np.uint8]:
    """A SliceTable sample's windows decoded into outs ((n, window, ...) per field, in path order) and mask, the
    GIL released; returns ok, 0 where a window did not decode (its rows and mask zero)."""

def decode_window_items(
    data: Any,
    offsets: npt.NDArray[np.uint64],
    item_chunks: npt.NDArray[np.uint64],
    item_chunk_offsets: npt.NDArray[np.uint64],
    chunk_data: Any,
    chunk_offsets: npt.NDArray[np.uint64],
    fingerprint: int,
    outs: list[npt.NDArray[Any]],
    mask: npt.NDArray[np.bool_],
    window: int,
) -> tuple[npt.NDArray[np.uint8], npt.NDArray[np.uint64]]:
    """A slices table's SAMPLE reply (window items and frames as received) decoded into outs ((n, window, ...) per
    field, in path order) and mask, the GIL released, every field checked first; returns (ok, rows), both 0 where
    a window is malformed or did not decode (its rows and mask zero)."""

class SliceTable:
    """Episodes stored once, windows drawn at sample time (apexrl.replay.slices wraps it)."""

    def __init__(
        self,
        capacity_steps: int,
        length: int,
        burn_in: int,
        sampler: str,
        alpha: float,
        eta: float,
        strict_length: bool,
        span: int,
        seed: int,
    ) -> None: ...
    def insert(self, fingerprint: int, chunks: list[Any], steps: Any, priorities: Any, columns: Any) -> int: ...
    def sample(self, n: int, beta: float, copy_chunks: bool = False) -> dict[str, Any]: ...
    def update(self, keys: Any, priorities: Any) -> int: ...
    def stats(self) -> dict[str, Any]: ...
    def windows(self) -> tuple[Any, Any]: ...
    def step_priorities(self, episode: int) -> Any: ...
    def validate(self) -> None: ...
    def clear(self) -> int: ...
    def save(self, path: str) -> int:
        """Every episode held to ``path`` (checksummed, atomic); the episodes written."""
    def load(self, path: str) -> int:
        """A new table filled from a file ``save`` wrote (SnapshotError if unusable); the episodes held."""
