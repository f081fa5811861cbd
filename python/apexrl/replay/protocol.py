"""The apexrl wire protocol: multipart messages of a fixed 40-byte header plus raw little-endian array frames.

No pickle, no eval: arrays travel as raw bytes and are decoded with ``np.frombuffer`` (zero copy); only the
STATS reply and error messages are text (UTF-8, strict JSON for STATS). Every decoder checks every header
field and every frame length against the frames actually received before touching the payload, and raises
only :class:`~apexrl.errors.ProtocolError`. See docs/protocol.md for the specification.
"""

from __future__ import annotations

import json
import math
import struct
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any, Union

import numpy as np

from apexrl.errors import ProtocolError, ServerError

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "MAX_BATCH",
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "Header",
    "Op",
    "Reply",
    "Request",
    "Status",
    "decode_reply",
    "decode_request",
    "encode_count_reply",
    "encode_error",
    "encode_insert",
    "encode_insert_reply",
    "encode_protocol_error",
    "encode_remove_to_fit",
    "encode_sample",
    "encode_sample_reply",
    "encode_stats",
    "encode_stats_reply",
    "encode_update",
    "pack_items",
    "split_items",
    "with_request_id",
]

PROTOCOL_VERSION = 1
SUPPORTED_VERSIONS = (1,)
MAGIC = b"APXR"
MAX_BATCH = 1 << 20  # most items / keys in one message

_HEADER = struct.Struct("<4sHHQHHIdI4x")
HEADER_SIZE = _HEADER.size  # 40
_HEADER_RESERVED = struct.Struct("<4sHHQHHIdII")  # the same layout with the reserved bytes as a u32
_REQUEST_ID = struct.Struct("<Q")  # at offset 8
_U16 = 0xFFFF
_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF

_KEY = np.dtype("<u8")
_OFFSET = np.dtype("<u8")
_PRIORITY = np.dtype("<f8")
_WEIGHT = np.dtype("<f4")
_PROBABILITY = np.dtype("<f8")

Frame = Union[bytes, memoryview, np.ndarray]


class Op(IntEnum):
    INSERT = 1
    SAMPLE = 2
    UPDATE_PRIORITIES = 3
    REMOVE_TO_FIT = 4
    STATS = 5


class Status(IntEnum):
    OK = 0
    BAD_MESSAGE = 1
    UNSUPPORTED_VERSION = 2
    UNKNOWN_OP = 3
    TOO_LARGE = 4
    INVALID_ARGUMENT = 5
    TIMEOUT = 6
    SHUTTING_DOWN = 7
    INTERNAL = 8


_OPS = frozenset(int(o) for o in Op)
_STATUSES = frozenset(int(s) for s in Status)
_OP_BY_INT = {int(o): o for o in Op}
_STATUS_BY_INT = {int(s): s for s in Status}
_INSERT, _SAMPLE, _UPDATE, _REMOVE_TO_FIT, _STATS = (int(o) for o in Op)
# Bit patterns of f64 values viewed as u64: exactly the finite values >= +0.0 lie below that of +inf
# (negative values have the sign bit set, NaNs lie above +inf), so one max() checks "finite and >= 0"
# (-0.0 fails it and takes the exact check, which accepts it).
_F64_INF_BITS = 0x7FF0_0000_0000_0000


def _bad(message: str, status: Status = Status.BAD_MESSAGE) -> ProtocolError:
    return ProtocolError(status, message)


# --------------------------------------------------------------------------------------------------- header


@dataclass(frozen=True)
class Header:
    """Frame 0 of every message. ``flags`` and the 4 trailing bytes are always zero in version 1."""

    op: int
    request_id: int
    status: int = Status.OK
    count: int = 0
    param: float = 0.0
    timeout_ms: int = 0
    version: int = PROTOCOL_VERSION

    def pack(self) -> bytes:
        """The 40-byte encoding; ValueError if a field is out of its unsigned range."""
        for name, value, limit in (
            ("version", self.version, _U16),
            ("op", self.op, _U16),
            ("request_id", self.request_id, _U64),
            ("status", self.status, _U16),
            ("count", self.count, _U32),
            ("timeout_ms", self.timeout_ms, _U32),
        ):
            if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= limit:
                raise ValueError(f"header {name} must be an integer in [0, {limit}], got {value!r}")
        try:
            param = float(self.param)
        except (TypeError, ValueError):
            raise ValueError(f"header param must be a float, got {self.param!r}") from None
        return _HEADER.pack(
            MAGIC,
            int(self.version),
            int(self.op),
            int(self.request_id),
            int(self.status),
            0,
            int(self.count),
            param,
            int(self.timeout_ms),
        )

    @classmethod
    def unpack(cls, frame: Any) -> Header:
        """Parse and validate frame 0; raises ProtocolError (never anything else)."""
        try:
            buf = memoryview(frame).cast("B")
        except (TypeError, ValueError) as exc:
            raise _bad(f"header frame is not a contiguous bytes-like object: {exc}") from None
        # Magic and version first: a newer peer's header may have another length, and it must be told
        # UNSUPPORTED_VERSION (bytes 0-15 have the same layout in every version).
        if buf.nbytes < 6 or bytes(buf[:4]) != MAGIC:
            raise _bad(f"header magic is {bytes(buf[:4])!r} (frame of {buf.nbytes} bytes), expected {MAGIC!r}")
        (version,) = struct.unpack_from("<H", buf, 4)
        peek_op, peek_id = _peek_ids(buf)
        if version not in SUPPORTED_VERSIONS:
            raise ProtocolError(
                Status.UNSUPPORTED_VERSION,
                f"protocol version {version} is not supported; supported versions: "
                f"{', '.join(map(str, SUPPORTED_VERSIONS))}",
                op=peek_op,
                request_id=peek_id,
            )
        if buf.nbytes != HEADER_SIZE:
            raise ProtocolError(
                Status.BAD_MESSAGE,
                f"header frame is {buf.nbytes} bytes, expected {HEADER_SIZE}",
                op=peek_op,
                request_id=peek_id,
            )
        _magic, _version, op, request_id, status, flags, count, param, timeout_ms = _HEADER.unpack(buf)
        ids = dict(op=op, request_id=request_id)
        if flags != 0:
            raise ProtocolError(Status.BAD_MESSAGE, f"header flags is {flags:#06x}, must be 0 in version 1", **ids)
        if bytes(buf[36:40]) != b"\0\0\0\0":
            raise ProtocolError(
                Status.BAD_MESSAGE, f"header reserved bytes are {bytes(buf[36:40]).hex()}, must be zero", **ids
            )
        if op not in _OPS:
            raise ProtocolError(
                Status.UNKNOWN_OP, f"header op {op} is unknown; known ops: {sorted(_OPS)}", **ids
            )
        if status not in _STATUSES:
            raise ProtocolError(
                Status.BAD_MESSAGE, f"header status {status} is unknown; known: {sorted(_STATUSES)}", **ids
            )
        return cls(Op(op), request_id, Status(status), count, param, timeout_ms, version)


def _make_header(op: int, request_id: int, status: int, count: int, param: float, timeout_ms: int,
                 version: int) -> Header:
    """A Header from already validated fields, without the frozen dataclass's per-field __setattr__."""
    h = object.__new__(Header)
    h.__dict__.update(op=_OP_BY_INT[op], request_id=request_id, status=_STATUS_BY_INT[status], count=count,
                      param=param, timeout_ms=timeout_ms, version=version)
    return h


def with_request_id(frames: list[Frame], request_id: int) -> list[Frame]:
    """The same message with another request id in its header (frames validated by an encoder)."""
    header = bytearray(frames[0])
    _REQUEST_ID.pack_into(header, 8, _check_request_id(request_id))
    return [bytes(header), *frames[1:]]


def _peek_ids(frame: memoryview) -> tuple[int | None, int | None]:
    """(op, request_id) from a header whose first 16 bytes look like ours, else (None, None).

    Bytes 0-15 (magic, version, op, request_id) keep this layout in every protocol version, so a server
    can echo op and request_id even in its UNSUPPORTED_VERSION reply.
    """
    if frame.nbytes >= 16 and bytes(frame[:4]) == MAGIC:
        _version, op, request_id = struct.unpack_from("<HHQ", frame, 4)
        return op, request_id
    return None, None


# ---------------------------------------------------------------------------------------------- messages


@dataclass
class Request:
    """A decoded request. ``arrays`` holds read-only numpy views of the frames (and ``data`` as a memoryview):

    INSERT: priorities (f64), offsets (u64, n+1), data; UPDATE_PRIORITIES: keys (u64), priorities (f64);
    SAMPLE / REMOVE_TO_FIT / STATS: none (SAMPLE reads n, beta and timeout_ms from the header).
    """

    header: Header
    arrays: dict[str, Any] = field(default_factory=dict)

    @property
    def op(self) -> Op:
        return Op(self.header.op)

    @property
    def request_id(self) -> int:
        return self.header.request_id


@dataclass
class Reply:
    """A decoded reply. On OK: ``arrays`` (INSERT: keys; SAMPLE: keys, weights, probabilities, offsets, data),
    ``stats`` (STATS) or just ``header.count`` (UPDATE_PRIORITIES, REMOVE_TO_FIT). On error: ``message``."""

    header: Header
    arrays: dict[str, Any] = field(default_factory=dict)
    stats: dict[str, int | float] | None = None
    message: str | None = None

    @property
    def status(self) -> Status:
        return Status(self.header.status)

    @property
    def ok(self) -> bool:
        return self.header.status == Status.OK

    def raise_for_status(self) -> Reply:
        """Return self if OK, else raise ServerError with the server's status and message."""
        if not self.ok:
            raise ServerError(self.status, self.message or "")
        return self


# ---------------------------------------------------------------------------------------------- encoders


def _check_request_id(request_id: Any) -> int:
    if isinstance(request_id, bool) or not isinstance(request_id, (int, np.integer)) or not 0 <= request_id <= _U64:
        raise ValueError(f"request_id must be an integer in [0, 2**64), got {request_id!r}")
    return int(request_id)


def _check_count(name: str, n: int, *, minimum: int = 0) -> None:
    if not minimum <= n <= MAX_BATCH:
        raise ValueError(f"{name} has {n} entries, must be in [{minimum}, MAX_BATCH={MAX_BATCH}]")


def _array(name: str, value: Any, dtype: np.dtype, length: int | None = None) -> np.ndarray:
    """A 1-D C-contiguous little-endian array of ``dtype``; copies only when a conversion is needed."""
    try:
        arr = np.asarray(value)
    except Exception as exc:  # noqa: BLE001 - arbitrary caller objects
        raise ValueError(f"{name} is not array-like: {exc}") from None
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if dtype.kind == "u":
        if arr.size == 0 and arr.dtype.kind == "f":  # np.asarray([]) is float64
            arr = arr.astype(dtype)
        if arr.dtype.kind not in "ui":
            raise ValueError(f"{name} must have an integer dtype, got {arr.dtype}")
        if arr.dtype.kind == "i" and arr.size and arr.min() < 0:
            raise ValueError(f"{name} must be >= 0, got {arr.min()}")
    elif dtype.kind == "f":
        if arr.dtype.kind not in "fiu":
            raise ValueError(f"{name} must have a real numeric dtype, got {arr.dtype}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name} has {arr.shape[0]} entries, expected {length}")
    return np.ascontiguousarray(arr, dtype=dtype)


def _priorities_ok(priorities: np.ndarray) -> bool:
    """Fast check of a 1-D ``<f8`` array: True means all finite and >= 0 (False: run _check_priorities)."""
    return priorities.shape[0] == 0 or int(priorities.view(_KEY).max()) < _F64_INF_BITS


def _offsets_ok(offsets: np.ndarray, data_len: int) -> bool:
    """Fast check of a 1-D ``<u8`` array of n+1 >= 1 entries: True means _check_offsets passes."""
    if offsets[0] != 0 or offsets[-1] != data_len:
        return False
    return offsets.shape[0] <= 2 or bool((offsets[1:] >= offsets[:-1]).all())


def _exact(arr: Any, dtype: np.dtype) -> bool:
    """``arr`` is a 1-D C-contiguous ndarray of exactly ``dtype`` (usable as a frame without conversion)."""
    return type(arr) is np.ndarray and arr.dtype == dtype and arr.ndim == 1 and arr.flags.c_contiguous


def _check_priorities(name: str, priorities: np.ndarray) -> None:
    if _priorities_ok(priorities):
        return
    bad = ~np.isfinite(priorities) | (priorities < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}[{i}] is {priorities[i]}, priorities must be finite and >= 0")


def _bytes_view(name: str, data: Any) -> memoryview:
    try:
        return memoryview(data).cast("B")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a C-contiguous bytes-like object: {exc}") from None


def _check_offsets(offsets: np.ndarray, data_len: int) -> None:
    if offsets[0] != 0:
        raise ValueError(f"offsets[0] is {offsets[0]}, must be 0")
    if offsets.size > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
        i = int(np.argmax(offsets[1:] < offsets[:-1])) + 1
        raise ValueError(f"offsets must be non-decreasing, offsets[{i}]={offsets[i]} < offsets[{i - 1}]={offsets[i - 1]}")
    if offsets[-1] != data_len:
        raise ValueError(f"offsets[-1] is {offsets[-1]}, must equal len(data)={data_len}")


def _check_timeout_ms(timeout_ms: Any) -> None:
    if isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, np.integer)) or not 0 <= timeout_ms <= _U32:
        raise ValueError(f"timeout_ms must be an integer in [0, {_U32}], got {timeout_ms!r}")


def pack_items(items: Sequence[Any]) -> tuple[bytes, np.ndarray]:
    """Concatenate bytes-like items into (data, offsets) for encode_insert (copies the items once)."""
    views = [_bytes_view(f"items[{i}]", item) for i, item in enumerate(items)]
    offsets = np.zeros(len(views) + 1, dtype=_OFFSET)
    np.cumsum([v.nbytes for v in views], out=offsets[1:])
    return b"".join(views), offsets


def split_items(offsets: np.ndarray, data: Any) -> list[memoryview]:
    """Zero-copy views of each item of a (validated) offsets/data pair."""
    view = memoryview(data).cast("B")
    bounds = offsets.tolist()
    return [view[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


def encode_insert(
    request_id: int, priorities: Any, data: Any, offsets: Any, timeout_ms: int = 0
) -> list[Frame]:
    """INSERT request: [header(count=n, timeout_ms), priorities f64[n], offsets u64[n+1], data]."""
    # Fast path: arrays already of the wire's dtypes and layout, every check passing; anything else takes
    # the full path below (which converts, or raises the precise ValueError).
    if (type(request_id) is int and 0 <= request_id <= _U64 and type(timeout_ms) is int and 0 <= timeout_ms <= _U32
            and _exact(priorities, _PRIORITY) and _exact(offsets, _OFFSET)):
        n = priorities.shape[0]
        if n <= MAX_BATCH and offsets.shape[0] == n + 1 and _priorities_ok(priorities):
            try:
                view = memoryview(data).cast("B")
            except (TypeError, ValueError):
                view = None
            if view is not None and _offsets_ok(offsets, view.nbytes):
                return [_HEADER.pack(MAGIC, PROTOCOL_VERSION, _INSERT, request_id, 0, 0, n, 0.0, timeout_ms),
                        priorities, offsets, view]
    rid = _check_request_id(request_id)
    _check_timeout_ms(timeout_ms)
    prio = _array("priorities", priorities, _PRIORITY)
    n = prio.shape[0]
    _check_count("priorities", n)
    _check_priorities("priorities", prio)
    offs = _array("offsets", offsets, _OFFSET, n + 1)
    view = _bytes_view("data", data)
    _check_offsets(offs, view.nbytes)
    return [Header(Op.INSERT, rid, count=n, timeout_ms=int(timeout_ms)).pack(), prio, offs, view]


def encode_sample(request_id: int, n: int, beta: float, timeout_ms: int = 0) -> list[Frame]:
    """SAMPLE request: [header(count=n, param=beta, timeout_ms)]."""
    rid = _check_request_id(request_id)
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)):
        raise ValueError(f"n must be an integer, got {n!r}")
    _check_count("sample n", int(n), minimum=1)
    beta = float(beta)
    if not math.isfinite(beta) or beta < 0:
        raise ValueError(f"beta is {beta}, must be finite and >= 0")
    _check_timeout_ms(timeout_ms)
    return [Header(Op.SAMPLE, rid, count=int(n), param=beta, timeout_ms=int(timeout_ms)).pack()]


def encode_update(request_id: int, keys: Any, priorities: Any) -> list[Frame]:
    """UPDATE_PRIORITIES request: [header(count=n), keys u64[n], priorities f64[n]]."""
    if type(request_id) is int and 0 <= request_id <= _U64 and _exact(keys, _KEY) and _exact(priorities, _PRIORITY):
        n = keys.shape[0]
        if n <= MAX_BATCH and priorities.shape[0] == n and _priorities_ok(priorities):
            return [_HEADER.pack(MAGIC, PROTOCOL_VERSION, _UPDATE, request_id, 0, 0, n, 0.0, 0), keys, priorities]
    rid = _check_request_id(request_id)
    k = _array("keys", keys, _KEY)
    n = k.shape[0]
    _check_count("keys", n)
    prio = _array("priorities", priorities, _PRIORITY, n)
    _check_priorities("priorities", prio)
    return [Header(Op.UPDATE_PRIORITIES, rid, count=n).pack(), k, prio]


def encode_remove_to_fit(request_id: int) -> list[Frame]:
    """REMOVE_TO_FIT request: [header]."""
    return [Header(Op.REMOVE_TO_FIT, _check_request_id(request_id)).pack()]


def encode_stats(request_id: int) -> list[Frame]:
    """STATS request: [header]."""
    return [Header(Op.STATS, _check_request_id(request_id)).pack()]


def encode_insert_reply(request_id: int, keys: Any) -> list[Frame]:
    """INSERT OK reply: [header(count=n), keys u64[n]]."""
    if type(request_id) is int and 0 <= request_id <= _U64 and _exact(keys, _KEY) and keys.shape[0] <= MAX_BATCH:
        return [_HEADER.pack(MAGIC, PROTOCOL_VERSION, _INSERT, request_id, 0, 0, keys.shape[0], 0.0, 0), keys]
    rid = _check_request_id(request_id)
    k = _array("keys", keys, _KEY)
    _check_count("keys", k.shape[0])
    return [Header(Op.INSERT, rid, count=k.shape[0]).pack(), k]


def encode_sample_reply(
    request_id: int, keys: Any, weights: Any, probabilities: Any, offsets: Any, data: Any
) -> list[Frame]:
    """SAMPLE OK reply: [header(count=n), keys u64[n], weights f32[n], probabilities f64[n], offsets u64[n+1], data]."""
    if (type(request_id) is int and 0 <= request_id <= _U64 and _exact(keys, _KEY) and _exact(weights, _WEIGHT)
            and _exact(probabilities, _PROBABILITY) and _exact(offsets, _OFFSET)):
        n = keys.shape[0]
        if 1 <= n <= MAX_BATCH and weights.shape[0] == n and probabilities.shape[0] == n and offsets.shape[0] == n + 1:
            try:
                view = memoryview(data).cast("B")
            except (TypeError, ValueError):
                view = None
            if view is not None and _offsets_ok(offsets, view.nbytes):
                return [_HEADER.pack(MAGIC, PROTOCOL_VERSION, _SAMPLE, request_id, 0, 0, n, 0.0, 0),
                        keys, weights, probabilities, offsets, view]
    rid = _check_request_id(request_id)
    k = _array("keys", keys, _KEY)
    n = k.shape[0]
    _check_count("keys", n, minimum=1)
    w = _array("weights", weights, _WEIGHT, n)
    p = _array("probabilities", probabilities, _PROBABILITY, n)
    offs = _array("offsets", offsets, _OFFSET, n + 1)
    view = _bytes_view("data", data)
    _check_offsets(offs, view.nbytes)
    return [Header(Op.SAMPLE, rid, count=n).pack(), k, w, p, offs, view]


def encode_count_reply(op: Op, request_id: int, count: int) -> list[Frame]:
    """UPDATE_PRIORITIES / REMOVE_TO_FIT OK reply: [header(count)]."""
    if op not in (Op.UPDATE_PRIORITIES, Op.REMOVE_TO_FIT):
        raise ValueError(f"a count reply is for UPDATE_PRIORITIES or REMOVE_TO_FIT, not {op!r}")
    rid = _check_request_id(request_id)
    if isinstance(count, bool) or not isinstance(count, (int, np.integer)) or not 0 <= count <= _U32:
        raise ValueError(f"count must be an integer in [0, {_U32}], got {count!r}")
    return [Header(Op(op), rid, count=int(count)).pack()]


def _is_stat_value(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def encode_stats_reply(request_id: int, stats: dict[str, int | float]) -> list[Frame]:
    """STATS OK reply: [header, UTF-8 JSON object of str -> int|float (finite)]."""
    rid = _check_request_id(request_id)
    if not isinstance(stats, dict):
        raise ValueError(f"stats must be a dict, got {type(stats).__name__}")
    clean: dict[str, int | float] = {}
    for key, value in stats.items():
        if isinstance(value, np.generic):
            value = value.item()
        if not isinstance(key, str) or not _is_stat_value(value):
            raise ValueError(f"stats entries must be str -> int|float, got {key!r}: {value!r}")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError(f"stats[{key!r}] is {value}, must be finite (strict JSON)")
        clean[key] = value
    return [Header(Op.STATS, rid).pack(), json.dumps(clean, allow_nan=False).encode("utf-8")]


def encode_error(op: int, request_id: int, status: Status, message: str) -> list[Frame]:
    """Error reply: [header(status != OK, count=0), UTF-8 message]. ``op`` is echoed raw (any u16)."""
    if isinstance(op, bool) or not isinstance(op, (int, np.integer)) or not 0 <= op <= _U16:
        raise ValueError(f"op must be an integer in [0, {_U16}], got {op!r}")
    rid = _check_request_id(request_id)
    if status not in _STATUSES or status == Status.OK:
        raise ValueError(f"an error reply needs a non-OK Status, got {status!r}")
    if not isinstance(message, str):
        raise ValueError(f"message must be a str, got {type(message).__name__}")
    return [Header(int(op), rid, status=Status(status)).pack(), message.encode("utf-8", errors="replace")]


def encode_protocol_error(exc: ProtocolError) -> list[Frame]:
    """The error reply a server sends for a request that failed to decode (echoes op/request_id when known)."""
    op = exc.op if exc.op is not None else 0
    rid = exc.request_id if exc.request_id is not None else 0
    return encode_error(op, rid, exc.status, exc.message)


# ---------------------------------------------------------------------------------------------- decoders


def _views(frames: Any) -> list[memoryview]:
    try:
        frames = list(frames)
    except TypeError:
        raise _bad(f"frames must be a sequence of bytes-like objects, got {type(frames).__name__}") from None
    if not frames:
        raise _bad("message has no frames, expected at least the header")
    views = []
    for i, frame in enumerate(frames):
        try:
            views.append(memoryview(frame).cast("B"))
        except (TypeError, ValueError) as exc:
            raise _bad(f"frame {i} is not a contiguous bytes-like object: {exc}") from None
    return views


def _expect_frames(views: list[memoryview], expected: int, what: str) -> None:
    if len(views) != expected:
        raise _bad(f"{what} must have {expected} frames (header included), got {len(views)}")


def _check_n(header: Header, what: str, *, minimum: int = 0) -> int:
    n = header.count
    if n > MAX_BATCH:
        raise _bad(f"{what} count is {n}, exceeds MAX_BATCH={MAX_BATCH}", Status.TOO_LARGE)
    if n < minimum:
        raise _bad(f"{what} count is {n}, must be >= {minimum}", Status.INVALID_ARGUMENT)
    return n


def _frame_array(view: memoryview, name: str, dtype: np.dtype, length: int, what: str) -> np.ndarray:
    expected = length * dtype.itemsize
    if view.nbytes != expected:
        raise _bad(
            f"{what} frame {name} is {view.nbytes} bytes, expected {expected} ({length} x {dtype.name})"
        )
    return np.frombuffer(view, dtype=dtype)


def _decode_offsets(view: memoryview, data: memoryview, n: int, what: str) -> np.ndarray:
    offsets = _frame_array(view, "offsets", _OFFSET, n + 1, what)
    try:
        _check_offsets(offsets, data.nbytes)
    except ValueError as exc:
        raise _bad(f"{what}: {exc}") from None
    return offsets


def _decode_priorities(view: memoryview, n: int, what: str) -> np.ndarray:
    prio = _frame_array(view, "priorities", _PRIORITY, n, what)
    try:
        _check_priorities("priorities", prio)
    except ValueError as exc:
        raise _bad(f"{what}: {exc}", Status.INVALID_ARGUMENT) from None
    return prio


def _check_unused(header: Header, what: str, *, count: bool, param: bool = True, timeout: bool = True) -> None:
    if count and header.count != 0:
        raise _bad(f"{what} header count is {header.count}, must be 0")
    if param and header.param != 0.0:
        raise _bad(f"{what} header param is {header.param}, must be 0.0")
    if timeout and header.timeout_ms != 0:
        raise _bad(f"{what} header timeout_ms is {header.timeout_ms}, must be 0")


def _check_size(views: list[memoryview], max_bytes: int | None) -> None:
    if max_bytes is not None:
        total = sum(v.nbytes for v in views)
        if total > max_bytes:
            raise _bad(f"message is {total} bytes, exceeds max_bytes={max_bytes}", Status.TOO_LARGE)


def _with_ids(exc: ProtocolError, views: list[memoryview] | None) -> ProtocolError:
    if exc.op is None and exc.request_id is None and views:
        exc.op, exc.request_id = _peek_ids(views[0])
    return exc


def decode_request(frames: Sequence[Any], max_bytes: int | None = None) -> Request:
    """Validate and decode a request; raises only ProtocolError (with op/request_id set when readable)."""
    try:
        req = _decode_request_fast(frames, max_bytes)
    except Exception:  # noqa: BLE001 - anything unusual: the full path below decides
        req = None
    if req is not None:
        return req
    return _decode_request_full(frames, max_bytes)


def _decode_request_full(frames: Sequence[Any], max_bytes: int | None) -> Request:
    views: list[memoryview] | None = None
    try:
        views = _views(frames)
        _check_size(views, max_bytes)
        header = Header.unpack(views[0])
        return _decode_request_body(header, views)
    except ProtocolError as exc:
        raise _with_ids(exc, views) from None
    except Exception as exc:  # noqa: BLE001 - defence in depth: the contract is "only ProtocolError"
        raise _with_ids(_bad(f"malformed request: {type(exc).__name__}: {exc}"), views) from None


def _fast_views(frames: Any, max_bytes: int | None) -> list[memoryview] | None:
    if type(frames) is not list and type(frames) is not tuple:
        return None
    views = [memoryview(f).cast("B") for f in frames]
    if not views or views[0].nbytes != HEADER_SIZE:
        return None
    if max_bytes is not None:
        total = 0
        for v in views:
            total += v.nbytes
        if total > max_bytes:
            return None
    return views


def _decode_request_fast(frames: Any, max_bytes: int | None) -> Request | None:
    """The common case of decode_request in few operations: a Request when *every* check of the full path
    passes, None otherwise (the full path then produces the result or the precise error)."""
    views = _fast_views(frames, max_bytes)
    if views is None:
        return None
    magic, version, op, rid, status, flags, n, param, timeout_ms, reserved = _HEADER_RESERVED.unpack_from(views[0])
    if magic != MAGIC or version not in SUPPORTED_VERSIONS or flags or reserved or status or n > MAX_BATCH:
        return None
    nf = len(views)
    if op == _INSERT:
        if nf != 4 or param != 0.0 or views[1].nbytes != 8 * n or views[2].nbytes != 8 * (n + 1):
            return None
        prio = np.frombuffer(views[1], _PRIORITY)
        offsets = np.frombuffer(views[2], _OFFSET)
        data = views[3]
        if not (_priorities_ok(prio) and _offsets_ok(offsets, data.nbytes)):
            return None
        arrays: dict[str, Any] = {"priorities": prio, "offsets": offsets, "data": data}
    elif op == _UPDATE:
        if nf != 3 or param != 0.0 or timeout_ms or views[1].nbytes != 8 * n or views[2].nbytes != 8 * n:
            return None
        prio = np.frombuffer(views[2], _PRIORITY)
        if not _priorities_ok(prio):
            return None
        arrays = {"keys": np.frombuffer(views[1], _KEY), "priorities": prio}
    elif op == _SAMPLE:
        if nf != 1 or n < 1 or not (math.isfinite(param) and param >= 0):
            return None
        arrays = {}
    elif op == _REMOVE_TO_FIT or op == _STATS:
        if nf != 1 or n or param != 0.0 or timeout_ms:
            return None
        arrays = {}
    else:
        return None
    return Request(_make_header(op, rid, 0, n, param, timeout_ms, version), arrays)


def _decode_reply_fast(frames: Any, op: int, request_id: int, max_bytes: int | None) -> Reply | None:
    """The common OK replies (INSERT, SAMPLE, count replies) in few operations; None: use the full path."""
    views = _fast_views(frames, max_bytes)
    if views is None:
        return None
    magic, version, hop, rid, status, flags, n, param, timeout_ms, reserved = _HEADER_RESERVED.unpack_from(views[0])
    if (magic != MAGIC or version not in SUPPORTED_VERSIONS or flags or reserved or status or hop != op
            or rid != request_id or n > MAX_BATCH or param != 0.0 or timeout_ms):
        return None
    nf = len(views)
    if op == _INSERT:
        if nf != 2 or views[1].nbytes != 8 * n:
            return None
        arrays: dict[str, Any] = {"keys": np.frombuffer(views[1], _KEY)}
    elif op == _SAMPLE:
        if (nf != 6 or n < 1 or views[1].nbytes != 8 * n or views[2].nbytes != 4 * n or views[3].nbytes != 8 * n
                or views[4].nbytes != 8 * (n + 1)):
            return None
        offsets = np.frombuffer(views[4], _OFFSET)
        if not _offsets_ok(offsets, views[5].nbytes):
            return None
        arrays = {
            "keys": np.frombuffer(views[1], _KEY),
            "weights": np.frombuffer(views[2], _WEIGHT),
            "probabilities": np.frombuffer(views[3], _PROBABILITY),
            "offsets": offsets,
            "data": views[5],
        }
    elif op == _UPDATE or op == _REMOVE_TO_FIT:
        if nf != 1:
            return None
        arrays = {}
    else:
        return None
    return Reply(_make_header(op, rid, 0, n, param, timeout_ms, version), arrays)


def _decode_request_body(header: Header, views: list[memoryview]) -> Request:
    op = header.op
    what = f"{Op(op).name} request"
    if header.status != Status.OK:
        raise _bad(f"{what} header status is {header.status}, must be OK (0)")
    if op == Op.INSERT:
        _expect_frames(views, 4, what)
        _check_unused(header, what, count=False, timeout=False)  # timeout_ms: rate-limiter wait
        n = _check_n(header, what)
        prio = _decode_priorities(views[1], n, what)
        offsets = _decode_offsets(views[2], views[3], n, what)
        return Request(header, {"priorities": prio, "offsets": offsets, "data": views[3]})
    if op == Op.SAMPLE:
        _expect_frames(views, 1, what)
        _check_n(header, what, minimum=1)
        beta = header.param
        if not math.isfinite(beta) or beta < 0:
            raise _bad(f"{what} beta (header param) is {beta}, must be finite and >= 0", Status.INVALID_ARGUMENT)
        return Request(header, {})
    if op == Op.UPDATE_PRIORITIES:
        _expect_frames(views, 3, what)
        _check_unused(header, what, count=False)
        n = _check_n(header, what)
        keys = _frame_array(views[1], "keys", _KEY, n, what)
        prio = _decode_priorities(views[2], n, what)
        return Request(header, {"keys": keys, "priorities": prio})
    # REMOVE_TO_FIT, STATS
    _expect_frames(views, 1, what)
    _check_unused(header, what, count=True)
    return Request(header, {})


def decode_reply(
    frames: Sequence[Any], op: Op, request_id: int, max_bytes: int | None = None
) -> Reply:
    """Validate and decode the reply to request (op, request_id); raises only ProtocolError.

    An error reply decodes to a Reply with ``ok == False`` and ``message``; call ``raise_for_status()``.
    """
    try:
        reply = _decode_reply_fast(frames, op, request_id, max_bytes)
    except Exception:  # noqa: BLE001 - anything unusual: the full path below decides
        reply = None
    if reply is not None:
        return reply
    return _decode_reply_full(frames, op, request_id, max_bytes)


def _decode_reply_full(frames: Sequence[Any], op: Op, request_id: int, max_bytes: int | None) -> Reply:
    try:
        views = _views(frames)
        _check_size(views, max_bytes)
        header = Header.unpack(views[0])
        if header.request_id != request_id or header.op != op:
            raise _bad(
                f"reply is for op {header.op} request_id {header.request_id}, "
                f"expected op {op} request_id {request_id}"
            )
        return _decode_reply_body(header, views)
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - defence in depth: the contract is "only ProtocolError"
        raise _bad(f"malformed reply: {type(exc).__name__}: {exc}") from None


def _utf8(view: memoryview, what: str) -> str:
    try:
        return str(view, "utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"{what} is not valid UTF-8: {exc}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")


def _decode_reply_body(header: Header, views: list[memoryview]) -> Reply:
    op = header.op
    what = f"{Op(op).name} reply"
    if header.status != Status.OK:
        what = f"{Status(header.status).name} error reply"
        _expect_frames(views, 2, what)
        _check_unused(header, what, count=True)
        return Reply(header, message=_utf8(views[1], f"{what} message"))
    _check_unused(header, what, count=False)
    if op == Op.INSERT:
        _expect_frames(views, 2, what)
        n = _check_n(header, what)
        return Reply(header, {"keys": _frame_array(views[1], "keys", _KEY, n, what)})
    if op == Op.SAMPLE:
        _expect_frames(views, 6, what)
        n = _check_n(header, what, minimum=1)
        arrays = {
            "keys": _frame_array(views[1], "keys", _KEY, n, what),
            "weights": _frame_array(views[2], "weights", _WEIGHT, n, what),
            "probabilities": _frame_array(views[3], "probabilities", _PROBABILITY, n, what),
            "offsets": _decode_offsets(views[4], views[5], n, what),
            "data": views[5],
        }
        return Reply(header, arrays)
    if op == Op.STATS:
        _expect_frames(views, 2, what)
        if header.count != 0:
            raise _bad(f"{what} header count is {header.count}, must be 0")
        text = _utf8(views[1], f"{what} JSON")
        try:
            stats = json.loads(text, parse_constant=_reject_constant)
        except (ValueError, RecursionError) as exc:
            raise _bad(f"{what} is not valid JSON: {exc}") from None
        if not isinstance(stats, dict):
            raise _bad(f"{what} JSON must be an object, got {type(stats).__name__}")
        for key, value in stats.items():
            if not _is_stat_value(value) or (isinstance(value, float) and not math.isfinite(value)):
                raise _bad(f"{what} stats[{key!r}] must be a finite int or float, got {value!r}")
        return Reply(header, stats=stats)
    # UPDATE_PRIORITIES, REMOVE_TO_FIT: the count is the result
    _expect_frames(views, 1, what)
    return Reply(header)
