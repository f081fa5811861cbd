"""The apexrl wire protocol: multipart messages of a fixed 40-byte header plus raw little-endian array frames.

One encoder and one decoder, both driven by the tables of :mod:`apexrl.replay.wire.schema` (message kinds, how each
uses the header, its frames, their types, lengths and value rules, the limits). At import every message kind is
compiled into a small plan (a tuple per frame), so the common case costs one ``struct.unpack_from``, a
comparison per header field and one ``np.frombuffer`` plus one reduction per array frame; the precise error
message is built only when a check fails. There is no second, hand-written decoder per message.

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
from typing import Any, NamedTuple

import numpy as np

from apexrl.errors import ProtocolError, ServerError
from apexrl.replay.wire import schema as S
from apexrl.replay.wire.schema import (
    HEADER_SIZE,
    MAGIC,
    MAX_BATCH,
    MAX_ERROR_MESSAGE,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Op,
    Status,
)

__all__ = [
    "HEADER_SIZE",
    "MAGIC",
    "MAX_BATCH",
    "MAX_ERROR_MESSAGE",
    "PROTOCOL_VERSION",
    "SUPPORTED_VERSIONS",
    "Header",
    "Op",
    "Reply",
    "Request",
    "Status",
    "decode_reply",
    "decode_request",
    "encode_checkpoint",
    "encode_checkpoint_reply",
    "encode_count_reply",
    "encode_error",
    "encode_get_params",
    "encode_get_params_reply",
    "encode_erase",
    "encode_hello",
    "encode_hello_reply",
    "FrameChunks",
    "encode_insert",
    "encode_insert_reply",
    "encode_protocol_error",
    "encode_remove_to_fit",
    "encode_reset",
    "encode_sample",
    "encode_sample_reply",
    "encode_stats",
    "encode_stats_reply",
    "encode_update",
    "pack_chunks",
    "pack_items",
    "server_wait",
    "split_items",
    "with_request_id",
]

_HEADER = S.HEADER
_TABLE_OPS = frozenset(int(op) for op in S.TABLE_OPS)
_FLAG_MAX_PRIORITY = S.FLAG_MAX_PRIORITY
_INSERT = int(Op.INSERT)
_REQUEST_ID = struct.Struct("<Q")  # at offset 8
_U16 = 0xFFFF
_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF
_DTYPES = {name: np.dtype(code) for name, code in S.DTYPES.items()}
_U64_DTYPE = _DTYPES["u64"]
_NO_REFS = np.zeros(0, dtype=_U64_DTYPE)
_NO_REFS.flags.writeable = False
_NO_CHUNKS = np.zeros(1, dtype=_U64_DTYPE)  # chunk_offsets of no chunk: [0]
_NO_CHUNKS.flags.writeable = False

Frame = bytes | memoryview | np.ndarray

_STATUSES = frozenset(int(s) for s in Status)
_OP_BY_INT = {int(o): o for o in Op}
_STATUS_BY_INT = {int(s): s for s in Status}
_SERVICE_OPS = {name: frozenset(int(o) for o in ops) for name, ops in S.SERVICES.items()}
_SERVICE_OF = {int(op): name for name, ops in S.SERVICES.items() for op in ops}
# Bit patterns of f64 values viewed as u64: exactly the finite values >= +0.0 lie below that of +inf
# (negative values have the sign bit set, NaNs lie above +inf), so one max() checks "finite and >= 0"
# (-0.0 fails it and takes the exact check, which accepts it).
_F64_INF_BITS = 0x7FF0_0000_0000_0000


def _bad(message: str, status: Status = Status.BAD_MESSAGE) -> ProtocolError:
    return ProtocolError(status, message)


# --------------------------------------------------------------------------------------------------- header


class Header(NamedTuple):
    """Frame 0 of every message. ``flags`` is zero except an INSERT's FLAG_MAX_PRIORITY; ``table`` names a data
    request's table, or the table a HELLO declares a spec for (0 elsewhere)."""

    op: int
    request_id: int
    status: int = Status.OK
    count: int = 0  # type: ignore[assignment]  # the wire's name; shadows tuple.count, as it always has
    param: float = 0.0
    timeout_ms: int = 0
    version: int = PROTOCOL_VERSION
    table: int = 0
    flags: int = 0

    def pack(self) -> bytes:
        """The 40-byte encoding; ValueError if a field is out of its unsigned range."""
        for name, value, limit in (
            ("version", self.version, _U16),
            ("op", self.op, _U16),
            ("request_id", self.request_id, _U64),
            ("status", self.status, _U16),
            ("count", self.count, _U32),
            ("timeout_ms", self.timeout_ms, _U32),
            ("table", self.table, _U32),
            ("flags", self.flags, _U16),
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
            int(self.flags),
            int(self.count),
            param,
            int(self.timeout_ms),
            int(self.table),
        )

    @classmethod
    def unpack(cls, frame: Any, service: str = "replay") -> Header:
        """Parse and validate frame 0 (``op`` must be one of ``service``'s); raises ProtocolError only."""
        try:
            buf = memoryview(frame).cast("B")
        except (TypeError, ValueError) as exc:
            raise _bad(f"header frame is not a contiguous bytes-like object: {exc}") from None
        return _header(buf, _SERVICE_OPS[service])


_new_header = tuple.__new__


def _header(buf: memoryview, ops: frozenset[int]) -> Header:
    """The header of ``buf`` if valid for a service serving ``ops``; the precise ProtocolError otherwise."""
    if buf.nbytes == HEADER_SIZE:
        magic, version, op, rid, status, flags, count, param, timeout_ms, table = _HEADER.unpack_from(buf)
        if (
            magic == MAGIC
            and version in SUPPORTED_VERSIONS
            and (not flags or (flags == _FLAG_MAX_PRIORITY and op == _INSERT))
            and op in ops
            and status in _STATUSES
            and (not table or op in _TABLE_OPS)
        ):
            return _new_header(
                Header, (_OP_BY_INT[op], rid, _STATUS_BY_INT[status], count, param, timeout_ms, version, table, flags)
            )
    # Something is off: find the first rule broken, in the documented order. Magic and version come first: a
    # newer peer's header may have another length, and it must be told UNSUPPORTED_VERSION (bytes 0-15 have
    # the same layout in every version).
    if buf.nbytes < 6 or bytes(buf[:4]) != MAGIC:
        raise _bad(
            f"header magic is {bytes(buf[:4]).hex()} (frame of {buf.nbytes} bytes), expected {MAGIC.hex()} ({MAGIC!r})"
        )
    (version,) = struct.unpack_from("<H", buf, 4)
    peek_op, peek_id = S.peek_ids(buf)
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
    _magic, _version, op, request_id, status, flags, count, param, timeout_ms, table = _HEADER.unpack(buf)
    ids = dict(op=op, request_id=request_id)
    if flags != 0 and not (flags == _FLAG_MAX_PRIORITY and op == _INSERT):
        must = "0 or 0x0001" if op == _INSERT else "0"
        raise ProtocolError(Status.BAD_MESSAGE, f"header flags is {flags:#06x}, must be {must}", **ids)
    if op not in ops:
        raise ProtocolError(Status.UNKNOWN_OP, f"header op {op} is unknown; known ops: {sorted(ops)}", **ids)
    if status not in _STATUSES:
        raise ProtocolError(Status.BAD_MESSAGE, f"header status {status} is unknown; known: {sorted(_STATUSES)}", **ids)
    raise ProtocolError(
        Status.BAD_MESSAGE, f"header table is {table}, must be 0 ({_OP_BY_INT[op].name} names no table)", **ids
    )


def with_request_id(frames: list[Frame], request_id: int) -> list[Frame]:
    """The same message with another request id in its header (frames validated by an encoder)."""
    header = bytearray(frames[0])
    _REQUEST_ID.pack_into(header, 8, _check_request_id(request_id))
    return [bytes(header), *frames[1:]]


# ---------------------------------------------------------------------------------------------- messages


@dataclass
class Request:
    """A decoded request. ``arrays`` holds read-only numpy views of the frames (``bytes`` frames as memoryviews)
    by the schema's frame names, e.g. INSERT: priorities (f64), offsets (u64, n+1), data."""

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
    """A decoded reply. On OK: ``arrays`` (by the schema's frame names), ``stats`` (the JSON frame: STATS's
    counters, HELLO's info) or just ``header.count`` (UPDATE_PRIORITIES, REMOVE_TO_FIT, ERASE). On error:
    ``message``."""

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


# ------------------------------------------------------------------------------------------- value checks


def _check_request_id(request_id: Any) -> int:
    if isinstance(request_id, bool) or not isinstance(request_id, (int, np.integer)) or not 0 <= request_id <= _U64:
        raise ValueError(f"request_id must be an integer in [0, 2**64), got {request_id!r}")
    return int(request_id)


def _check_count(name: str, n: int, *, minimum: int = 0) -> None:
    if not minimum <= n <= MAX_BATCH:
        raise ValueError(f"{name} has {n} entries, must be in [{minimum}, MAX_BATCH={MAX_BATCH}]")


def _check_u32(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or not 0 <= value <= _U32:
        raise ValueError(f"{name} must be an integer in [0, {_U32}], got {value!r}")


def _array(name: str, value: Any, dtype: np.dtype, length: int | None = None) -> np.ndarray:
    """A 1-D C-contiguous little-endian array of ``dtype``; copies only when a conversion is needed."""
    if _exact(value, dtype) and (length is None or value.shape[0] == length):
        return value
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
    elif dtype.kind == "f" and arr.dtype.kind not in "fiu":
        raise ValueError(f"{name} must have a real numeric dtype, got {arr.dtype}")
    if length is not None and arr.shape[0] != length:
        raise ValueError(f"{name} has {arr.shape[0]} entries, expected {length}")
    return np.ascontiguousarray(arr, dtype=dtype)


def _exact(arr: Any, dtype: np.dtype) -> bool:
    """``arr`` is a 1-D C-contiguous ndarray of exactly ``dtype`` (usable as a frame without conversion)."""
    return type(arr) is np.ndarray and arr.dtype == dtype and arr.ndim == 1 and arr.flags.c_contiguous


def _priorities_ok(priorities: np.ndarray) -> bool:
    """Fast check of a 1-D ``<f8`` array: True means all finite and >= 0 (False: run _check_priorities)."""
    return priorities.shape[0] == 0 or int(priorities.view(_U64_DTYPE).max()) < _F64_INF_BITS


def _check_priorities(name: str, priorities: np.ndarray) -> None:
    if _priorities_ok(priorities):
        return
    bad = ~np.isfinite(priorities) | (priorities < 0)
    if bad.any():
        i = int(np.argmax(bad))
        raise ValueError(f"{name}[{i}] is {priorities[i]}, priorities must be finite and >= 0")


def _offsets_ok(offsets: np.ndarray, data_len: int) -> bool:
    """Fast check of a 1-D ``<u8`` array: True means _check_offsets passes."""
    if offsets.shape[0] == 0 or offsets[0] != 0 or offsets[-1] != data_len:
        return False
    return offsets.shape[0] <= 2 or bool((offsets[1:] >= offsets[:-1]).all())


def _check_offsets(offsets: np.ndarray, data_len: int, name: str = "offsets", cut: str = "data") -> None:
    if _offsets_ok(offsets, data_len):
        return
    if offsets.shape[0] == 0:
        raise ValueError(f"{name} has no entries, must hold at least one ({name}[0] = 0)")
    if offsets[0] != 0:
        raise ValueError(f"{name}[0] is {offsets[0]}, must be 0")
    if offsets.size > 1 and bool(np.any(offsets[1:] < offsets[:-1])):
        i = int(np.argmax(offsets[1:] < offsets[:-1])) + 1
        raise ValueError(f"{name} must be non-decreasing, {name}[{i}]={offsets[i]} < {name}[{i - 1}]={offsets[i - 1]}")
    raise ValueError(f"{name}[-1] is {offsets[-1]}, must equal len({cut})={data_len}")


def _totals_ok(totals: np.ndarray) -> bool:
    """A SAMPLE reply's (total_mass, min_mass): finite, 0 <= min_mass <= total_mass, min_mass > 0 iff
    total_mass > 0 (both 0: the uniform fallback)."""
    total, least = totals.tolist()  # a fixed f64[2] frame (length checked before any rule)
    return math.isfinite(total) and 0.0 <= least <= total and (least > 0.0) == (total > 0.0)


def _check_totals(name: str, totals: np.ndarray) -> None:
    if not _totals_ok(totals):
        raise ValueError(
            f"{name} (total_mass, min_mass) is ({totals[0]}, {totals[1]}); both must be finite with "
            "0 <= min_mass <= total_mass, and min_mass > 0 exactly when total_mass > 0"
        )


def _positive_ok(values: np.ndarray) -> bool:
    """Every value >= 1 (the frames with this rule are a few elements long: a list beats a numpy reduction)."""
    return min(values.tolist(), default=1) >= 1


def _check_positive(name: str, values: np.ndarray) -> None:
    if not _positive_ok(values):
        i = int(np.argmin(values >= 1))
        raise ValueError(f"{name}[{i}] is {values[i]}, must be >= 1")


def _bytes_view(name: str, data: Any) -> memoryview:
    try:
        return memoryview(data).cast("B")
    except (TypeError, ValueError) as exc:
        raise ValueError(f"{name} must be a C-contiguous bytes-like object: {exc}") from None


def _is_stat_value(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _finite_non_negative(value: float) -> bool:
    return math.isfinite(value) and value >= 0


def server_wait(timeout: float | None) -> tuple[float, int]:
    """A call's server-side wait: ``(seconds, timeout_ms for the header)``; None means answer at once."""
    wait_s = 0.0 if timeout is None else float(timeout)
    if not wait_s >= 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")
    return wait_s, min(round(wait_s * 1000), 0xFFFF_FFFF)


def pack_items(items: Sequence[Any]) -> tuple[bytes, np.ndarray]:
    """Concatenate bytes-like items into (data, offsets) for encode_insert (copies the items once)."""
    views = [_bytes_view(f"items[{i}]", item) for i, item in enumerate(items)]
    offsets = np.zeros(len(views) + 1, dtype=_U64_DTYPE)
    np.cumsum([v.nbytes for v in views], out=offsets[1:])
    return b"".join(views), offsets


class FrameChunks(NamedTuple):
    """An INSERT's or a SAMPLE reply's frame chunks: item i references chunks
    ``item_chunks[item_chunk_offsets[i]:item_chunk_offsets[i+1]]`` (indices c into the message's chunks), chunk c
    is ``chunk_data[chunk_offsets[c]:chunk_offsets[c+1]]``."""

    item_chunks: np.ndarray  # u64[refs]
    item_chunk_offsets: np.ndarray  # u64[n+1]
    chunk_data: Any  # bytes-like
    chunk_offsets: np.ndarray  # u64[chunks+1]

    @staticmethod
    def none(n: int) -> FrameChunks:
        """The frames of ``n`` items that reference no chunk."""
        return FrameChunks(_NO_REFS, np.zeros(n + 1, dtype=_U64_DTYPE), b"", _NO_CHUNKS)

    def chunks(self) -> list[memoryview]:
        return split_items(self.chunk_offsets, self.chunk_data)

    def refs(self, i: int) -> np.ndarray:
        """Item i's chunk indices."""
        return self.item_chunks[int(self.item_chunk_offsets[i]) : int(self.item_chunk_offsets[i + 1])]


def pack_chunks(chunks: Sequence[Any], refs: Sequence[Sequence[int]]) -> FrameChunks:
    """FrameChunks of bytes-like ``chunks`` and, per item, the indices of the chunks it references."""
    data, chunk_offsets = pack_items(chunks)
    offsets = np.zeros(len(refs) + 1, dtype=_U64_DTYPE)
    np.cumsum([len(r) for r in refs], out=offsets[1:])
    flat = np.fromiter((c for r in refs for c in r), dtype=_U64_DTYPE, count=int(offsets[-1]))
    return FrameChunks(flat, offsets, data, chunk_offsets)


def split_items(offsets: np.ndarray, data: Any) -> list[memoryview]:
    """Zero-copy views of each item of a (validated) offsets/data pair."""
    view = memoryview(data).cast("B")
    bounds = offsets.tolist()
    return [view[bounds[i] : bounds[i + 1]] for i in range(len(bounds) - 1)]


# ------------------------------------------------------------------------------------------- compiled plans

_PRIORITIES, _OFFSETS, _TOTALS, _POSITIVE = 1, 2, 3, 4  # frame rules
_RULES = {"priorities": _PRIORITIES, "totals": _TOTALS, "positive": _POSITIVE}


class _FramePlan(NamedTuple):
    index: int  # type: ignore[assignment]  # shadows tuple.index; position in the message (1 = first frame after the header)
    name: str
    type: str
    dtype: np.dtype | None
    extra: int  # array length is n + extra ...
    fixed: int | None  # ... or this fixed number of elements
    any_length: bool  # ... or any whole number of elements
    rule: int  # 0, _PRIORITIES, _OFFSETS, _TOTALS or _POSITIVE
    ref: int  # _OFFSETS: index of the frame the offsets cut
    ref_itemsize: int  # _OFFSETS: 1 when that frame is bytes, its element size when it is an array
    ref_name: str  # _OFFSETS: that frame's name
    max_bytes: int | None


class _Plan(NamedTuple):
    """A MessageSpec compiled for the encoder and the decoder."""

    op: Op | None
    what: str  # "INSERT request", "SAMPLE reply", "error reply"
    nframes: int  # header included
    count: str | None  # type: ignore[assignment]  # shadows tuple.count
    count_min: int
    param: str | None
    timeout_ms: bool
    frames: tuple[_FramePlan, ...]
    arrays_only: bool  # no text frame: the decoded values all go to ``arrays``
    fast_encode: Any = None  # generated from this plan (below); None: always the generic code
    fast_decode: Any = None


def _compile(spec: S.MessageSpec) -> _Plan:
    names = [f.name for f in spec.frames]
    frames = []
    for i, f in enumerate(spec.frames, start=1):
        dtype = _DTYPES.get(f.type)
        extra, fixed, any_length = 0, None, False
        if dtype is not None:
            if f.length == "n":
                pass
            elif f.length == "n+1":
                extra = 1
            elif f.length == "any":
                any_length = True
            elif isinstance(f.length, int):
                fixed = f.length
            else:  # pragma: no cover - a schema error
                raise ValueError(f"frame {f.name}: length {f.length!r}")
        rule, ref, ref_itemsize, ref_name = 0, 0, 1, ""
        if f.rule in _RULES:
            rule = _RULES[f.rule]
        elif f.rule is not None and f.rule.startswith("offsets:"):
            rule, ref = _OFFSETS, 1 + names.index(f.rule.split(":", 1)[1])
            ref_dtype = _DTYPES.get(spec.frames[ref - 1].type)
            ref_itemsize = 1 if ref_dtype is None else ref_dtype.itemsize
            ref_name = spec.frames[ref - 1].name
        elif f.rule is not None:  # pragma: no cover - a schema error
            raise ValueError(f"frame {f.name}: rule {f.rule!r}")
        frames.append(
            _FramePlan(
                i, f.name, f.type, dtype, extra, fixed, any_length, rule, ref, ref_itemsize, ref_name, f.max_bytes
            )
        )
    what = spec.kind if spec.op is None else f"{spec.op.name} {spec.kind}"
    return _Plan(
        spec.op,
        what,
        1 + len(frames),
        spec.count,
        spec.count_min,
        spec.param,
        spec.timeout_ms,
        tuple(frames),
        all(f.type in S.DTYPES or f.type == "bytes" for f in spec.frames),
    )


# Fast paths, generated from the plans once at import: for each message kind without text frames, an encoder
# and a body decoder specialised to its frames (the loop over frames unrolled, its constants inlined). Each
# handles only the common case -- every value already of the wire's dtype and layout, every check passing --
# and returns None for anything else, which the generic code above then encodes or rejects with the precise
# error. So the result never depends on which path ran (tests/replay/test_protocol.py checks it on mutated messages);
# the generated source is built from the schema's constants alone, never from received data.

_FAST_GLOBALS = {
    "ndarray": np.ndarray,
    "frombuffer": np.frombuffer,
    "memoryview": memoryview,
    "int": int,
    "type": type,
    "len": len,
    "pack": _HEADER.pack,
    "MAGIC": MAGIC,
    "VERSION": PROTOCOL_VERSION,
    "MAX_BATCH": MAX_BATCH,
    "U64": _U64,
    "U32": _U32,
    "priorities_ok": _priorities_ok,
    "offsets_ok": _offsets_ok,
    "totals_ok": _totals_ok,
    "positive_ok": _positive_ok,
    "finite_non_negative": _finite_non_negative,
    **{f"D_{k}": v for k, v in _DTYPES.items()},
}


def _fast_source(plan: _Plan, name: str) -> tuple[str, str] | None:
    """Python source of (encoder, body decoder) specialised to ``plan``; None for plans with text frames."""
    if not plan.arrays_only or plan.op is None:
        return None
    op = int(plan.op)
    args = ", ".join(f"v{f.index}" for f in plan.frames)
    enc = [
        f"def enc_{name}(rid, values, count, param, timeout_ms, table):",
        f"    {args}{',' if len(plan.frames) == 1 else ''} = values" if plan.frames else "    pass",
        "    if type(rid) is not int or not 0 <= rid <= U64: return None",
        "    if type(table) is not int or not 0 <= table <= U32: return None"
        if op in _TABLE_OPS
        else "    if table: return None",
    ]
    dec = [f"def dec_{name}(views, n, param, timeout_ms):", f"    if len(views) != {plan.nframes}: return None"]
    if plan.timeout_ms:
        enc.append("    if type(timeout_ms) is not int or not 0 <= timeout_ms <= U32: return None")
    else:
        enc.append("    timeout_ms = 0")
        dec.append("    if timeout_ms: return None")
    if plan.param is not None:
        enc.append("    if type(param) is not float or not finite_non_negative(param): return None")
        dec.append("    if not finite_non_negative(param): return None")
    else:
        enc.append("    param = 0.0")
        dec.append("    if param != 0.0: return None")
    if plan.count is None:
        dec.append("    if n: return None")
    elif plan.count == "n":
        dec.append(f"    if n > MAX_BATCH or n < {plan.count_min}: return None")
    n_known = plan.count is not None and not any(
        f.dtype is not None and f.fixed is None and not f.any_length for f in plan.frames
    )
    if plan.count == "result" or n_known:
        enc.append(
            "    if type(count) is not int or not 0 <= count <= "
            f"{'U32' if plan.count == 'result' else 'MAX_BATCH'} or count < {plan.count_min}: return None"
        )
        enc.append("    n = count")
    elif not any(f.dtype is not None and f.fixed is None and not f.any_length for f in plan.frames):
        enc.append("    n = 0")
    have_n = plan.count == "result" or n_known
    items = []
    for f in plan.frames:
        v = f"v{f.index}"
        if f.dtype is not None:
            d = f"D_{f.type}"
            enc.append(
                f"    if type({v}) is not ndarray or {v}.dtype != {d} or {v}.ndim != 1 "
                f"or not {v}.flags.c_contiguous: return None"
            )
            if f.fixed is not None:
                length = str(f.fixed)
                enc.append(f"    if {v}.shape[0] != {f.fixed}: return None")
            elif f.any_length:
                length = None
            elif not have_n:
                length = f"n + {f.extra}" if f.extra else "n"
                enc.append(f"    n = {v}.shape[0] - {f.extra}")
                enc.append(f"    if n > MAX_BATCH or n < {plan.count_min}: return None")
                have_n = True
            else:
                length = f"n + {f.extra}" if f.extra else "n"
                enc.append(f"    if {v}.shape[0] != {length}: return None")
            if length is None:
                dec.append(f"    if views[{f.index}].nbytes % {f.dtype.itemsize}: return None")
            else:
                dec.append(f"    if views[{f.index}].nbytes != ({length}) * {f.dtype.itemsize}: return None")
            dec.append(f"    a{f.index} = frombuffer(views[{f.index}], {d})")
            check = {_PRIORITIES: "priorities_ok", _TOTALS: "totals_ok", _POSITIVE: "positive_ok"}.get(f.rule)
            if check is not None:
                enc.append(f"    if not {check}({v}): return None")
                dec.append(f"    if not {check}(a{f.index}): return None")
            items.append(f"{f.name!r}: a{f.index}")
        else:  # bytes
            enc.append(f"    {v} = memoryview({v}).cast('B')")
            items.append(f"{f.name!r}: views[{f.index}]")
    for f in plan.frames:
        if f.rule == _OFFSETS:
            enc.append(f"    if not offsets_ok(v{f.index}, v{f.ref}.nbytes // {f.ref_itemsize}): return None")
            dec.append(f"    if not offsets_ok(a{f.index}, views[{f.ref}].nbytes // {f.ref_itemsize}): return None")
    frames = "".join(f", v{f.index}" for f in plan.frames)
    enc.append(f"    return [pack(MAGIC, VERSION, {op}, rid, 0, 0, n, param, timeout_ms, table){frames}]")
    dec.append(f"    return {{{', '.join(items)}}}")
    return "\n".join(enc) + "\n", "\n".join(dec) + "\n"


def _fast_paths(plan: _Plan, name: str) -> tuple[Any, Any]:
    source = _fast_source(plan, name)
    if source is None:
        return None, None
    namespace: dict[str, Any] = {}
    exec(  # noqa: S102 - our own generated source (_fast_source), compiled once per plan
        compile(source[0] + source[1], f"<apexrl.replay.wire.protocol fast path {name}>", "exec"),
        dict(_FAST_GLOBALS),
        namespace,
    )
    return namespace[f"enc_{name}"], namespace[f"dec_{name}"]


def _with_fast_paths(plan: _Plan, name: str) -> _Plan:
    enc, dec = _fast_paths(plan, name)
    return plan._replace(fast_encode=enc, fast_decode=dec)


_REQUEST_PLANS = {int(op): _with_fast_paths(_compile(spec), f"{op.name}_request") for op, spec in S.REQUESTS.items()}
_REPLY_PLANS = {int(op): _with_fast_paths(_compile(spec), f"{op.name}_reply") for op, spec in S.REPLIES.items()}
_ERROR_PLAN = _compile(S.ERROR_REPLY)
_COUNT_REPLY_OPS = tuple(op for op, spec in S.REPLIES.items() if spec.count == "result")


# ---------------------------------------------------------------------------------------------- encoders


def _encode(
    plan: _Plan,
    request_id: Any,
    values: Sequence[Any] = (),
    *,
    count: Any = None,
    param: Any = 0.0,
    timeout_ms: Any = 0,
    status: int = 0,
    table: Any = 0,
) -> list[Frame]:
    """Frames of one message of ``plan`` with the frame ``values`` (in the schema's order); ValueError for
    anything the decoder would refuse. Arrays already of the wire's dtype and layout are used as they are."""
    if plan.fast_encode is not None:
        try:
            fast = plan.fast_encode(request_id, values, count, param, timeout_ms, table)
        except Exception:  # noqa: BLE001 - anything unusual: the generic code below decides
            fast = None
        if fast is not None:
            return fast
    op = plan.op
    if not (type(request_id) is int and 0 <= request_id <= _U64):
        request_id = _check_request_id(request_id)
    if table:
        if op is None or int(op) not in _TABLE_OPS:
            raise ValueError(f"{plan.what} names no table, got table={table!r}")
        _check_u32("table", table)
        table = int(table)
    if plan.timeout_ms and not (type(timeout_ms) is int and 0 <= timeout_ms <= _U32):
        _check_u32("timeout_ms", timeout_ms)
        timeout_ms = int(timeout_ms)
    if plan.param is not None:
        param = float(param)
        if not _finite_non_negative(param):
            raise ValueError(f"{plan.param} is {param}, must be finite and >= 0")
    if plan.count == "result":
        _check_u32("count", count)
        count = int(count)
    elif plan.count == "n" and count is not None:  # given in the header only (SAMPLE request)
        if isinstance(count, bool) or not isinstance(count, (int, np.integer)):
            raise ValueError(f"n must be an integer, got {count!r}")
        count = int(count)
        _check_count(f"{op.name.lower() if op is not None else plan.what} n", count, minimum=plan.count_min)
    n = count
    out: list[Frame] = [b""]
    for f, value in zip(plan.frames, values):
        if f.dtype is not None:
            if f.fixed is not None:
                arr = _array(f.name, value, f.dtype, f.fixed)
            elif f.any_length:
                arr = _array(f.name, value, f.dtype)
            elif n is None:  # the first n-long array sets n
                arr = _array(f.name, value, f.dtype)
                n = arr.shape[0] - f.extra
                _check_count(f.name, n, minimum=plan.count_min)
            else:
                arr = _array(f.name, value, f.dtype, n + f.extra)
            if f.rule == _PRIORITIES:
                _check_priorities(f.name, arr)
            elif f.rule == _TOTALS:
                _check_totals(f.name, arr)
            elif f.rule == _POSITIVE:
                _check_positive(f.name, arr)
            out.append(arr)
        elif f.type == "bytes":
            out.append(_bytes_view(f.name, value))
        elif f.type == "utf8":
            if not isinstance(value, str):
                raise ValueError(f"{f.name} must be a str, got {type(value).__name__}")
            raw = value.encode("utf-8", errors="replace")
            if f.max_bytes is not None and len(raw) > f.max_bytes:
                if op is not None:  # only an error message may be cut; any other text must arrive whole
                    raise ValueError(f"{f.name} is {len(raw)} bytes, at most {f.max_bytes}")
                raw = raw[: f.max_bytes].decode("utf-8", errors="ignore").encode("utf-8")  # at a character boundary
            out.append(raw)
        else:  # json
            out.append(_stats_json(value))
    for f in plan.frames:
        if f.rule == _OFFSETS:
            _check_offsets(out[f.index], memoryview(out[f.ref]).nbytes // f.ref_itemsize, f.name, f.ref_name)  # type: ignore[arg-type]  # offsets frames are arrays
    out[0] = _HEADER.pack(MAGIC, PROTOCOL_VERSION, op or 0, request_id, status, 0, n or 0, param, timeout_ms, table)
    return out


NO_INSERT_ID = (0, 0)
"""The INSERT ``insert_id`` of a request that asks for no de-duplication."""


def _stats_json(stats: Any) -> bytes:
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
    return json.dumps(clean, allow_nan=False).encode("utf-8")


_INSERT_PLAN = _REQUEST_PLANS[Op.INSERT]
_UPDATE_PLAN = _REQUEST_PLANS[Op.UPDATE_PRIORITIES]
_SAMPLE_PLAN = _REQUEST_PLANS[Op.SAMPLE]
_INSERT_REPLY_PLAN = _REPLY_PLANS[Op.INSERT]
_SAMPLE_REPLY_PLAN = _REPLY_PLANS[Op.SAMPLE]


def encode_insert(
    request_id: int,
    priorities: Any,
    data: Any,
    offsets: Any,
    timeout_ms: int = 0,
    insert_id: Any = NO_INSERT_ID,
    chunks: FrameChunks | None = None,
    table: int = 0,
    max_priority: bool = False,
) -> list[Frame]:
    """INSERT request: [header(count=n, timeout_ms), priorities f64[n], offsets u64[n+1], data, insert_id u64[2],
    item_chunks u64[refs], item_chunk_offsets u64[n+1], chunk_data, chunk_offsets u64[chunks+1]].

    ``insert_id`` = (session, sequence): the server stores a batch once per id; a retry sends the same id and
    gets the first request's keys back. (0, 0) asks for no de-duplication. ``chunks``: the frame chunks the
    items reference (None: none); a retry carries them again. ``table``: the table's index (HELLO's ``tables``),
    as in every data request. ``max_priority``: set the header's FLAG_MAX_PRIORITY (each item gets the table's
    largest priority so far; ``priorities`` is still checked, not used)."""
    if type(insert_id) is not np.ndarray:
        insert_id = np.array(insert_id, dtype=_U64_DTYPE) if _is_u64_pair(insert_id) else insert_id
    if chunks is None:
        chunks = FrameChunks.none(len(offsets) - 1 if hasattr(offsets, "__len__") and len(offsets) else 0)
    frames = _encode(
        _INSERT_PLAN, request_id, (priorities, offsets, data, insert_id, *chunks), timeout_ms=timeout_ms, table=table
    )
    if max_priority:
        header = bytearray(frames[0])
        struct.pack_into("<H", header, 18, _FLAG_MAX_PRIORITY)
        frames[0] = bytes(header)
    return frames


def _is_u64_pair(value: Any) -> bool:
    return isinstance(value, tuple) and len(value) == 2 and all(type(v) is int and 0 <= v <= _U64 for v in value)


def insert_message_bytes(n: int, data_bytes: int, refs: int = 0, chunks: int = 0, chunk_bytes: int = 0) -> int:
    """Total bytes of an INSERT request of ``n`` items holding ``data_bytes``, with ``refs`` chunk references to
    ``chunks`` chunks of ``chunk_bytes`` in all (what a server's size cap sees)."""
    return HEADER_SIZE + 8 * n + 8 * (n + 1) + data_bytes + 16 + 8 * refs + 8 * (n + 1) + chunk_bytes + 8 * (chunks + 1)


def message_bytes(frames: Sequence[Any]) -> int:
    """Total bytes of an encoded message."""
    return sum(memoryview(f).nbytes for f in frames)


def encode_sample(request_id: int, n: int, beta: float, timeout_ms: int = 0, table: int = 0) -> list[Frame]:
    """SAMPLE request: [header(count=n, param=beta, timeout_ms, table)]."""
    return _encode(_SAMPLE_PLAN, request_id, count=n, param=beta, timeout_ms=timeout_ms, table=table)


def encode_update(request_id: int, keys: Any, priorities: Any, table: int = 0) -> list[Frame]:
    """UPDATE_PRIORITIES request: [header(count=n, table), keys u64[n], priorities f64[n]]."""
    return _encode(_UPDATE_PLAN, request_id, (keys, priorities), table=table)


def encode_remove_to_fit(request_id: int, table: int = 0) -> list[Frame]:
    """REMOVE_TO_FIT request: [header(table)]."""
    return _encode(_REQUEST_PLANS[Op.REMOVE_TO_FIT], request_id, table=table)


def encode_stats(request_id: int) -> list[Frame]:
    """STATS request: [header]."""
    return _encode(_REQUEST_PLANS[Op.STATS], request_id)


def encode_hello(request_id: int, spec_json: str = "", table: int = 0) -> list[Frame]:
    """HELLO request: [header(table), spec utf8] (a TransitionSpec JSON to declare for the table ``table``; ""
    declares none)."""
    return _encode(_REQUEST_PLANS[Op.HELLO], request_id, (spec_json,), table=table)


def encode_erase(request_id: int, keys: Any, table: int = 0) -> list[Frame]:
    """ERASE request: [header(count=n, table), keys u64[n]]."""
    return _encode(_REQUEST_PLANS[Op.ERASE], request_id, (keys,), table=table)


def encode_checkpoint(request_id: int) -> list[Frame]:
    """CHECKPOINT request: [header]."""
    return _encode(_REQUEST_PLANS[Op.CHECKPOINT], request_id)


def encode_reset(request_id: int, table: int = 0) -> list[Frame]:
    """RESET request: [header(table)]."""
    return _encode(_REQUEST_PLANS[Op.RESET], request_id, table=table)


def encode_get_params(request_id: int, version: int, server_id: int) -> list[Frame]:
    """GET_PARAMS request: [header, held u64[2] = (version, server_id) of the weights held (0s: none)]."""
    return _encode(_REQUEST_PLANS[Op.GET_PARAMS], request_id, ((version, server_id),))


def encode_insert_reply(request_id: int, keys: Any, chunk_keys: Any = ()) -> list[Frame]:
    """INSERT OK reply: [header(count=n), keys u64[n], chunk_keys u64[chunks]]."""
    return _encode(_INSERT_REPLY_PLAN, request_id, (keys, np.asarray(chunk_keys, dtype=np.uint64)))


def encode_sample_reply(
    request_id: int,
    keys: Any,
    weights: Any,
    probabilities: Any,
    offsets: Any,
    data: Any,
    totals: Any,
    store_size: Any,
    chunks: FrameChunks | None = None,
) -> list[Frame]:
    """SAMPLE OK reply: [header(count=n), keys u64[n], weights f32[n], probabilities f64[n], offsets u64[n+1], data,
    totals f64[2] = (total_mass, min_mass), store_size u64[1], item_chunks u64[refs], item_chunk_offsets u64[n+1],
    chunk_data, chunk_offsets u64[chunks+1]] (``chunks`` None: the items reference none)."""
    if chunks is None:
        chunks = FrameChunks.none(len(offsets) - 1 if len(offsets) else 0)
    return _encode(
        _SAMPLE_REPLY_PLAN, request_id, (keys, weights, probabilities, offsets, data, totals, store_size, *chunks)
    )


def encode_count_reply(op: Op, request_id: int, count: int) -> list[Frame]:
    """UPDATE_PRIORITIES / REMOVE_TO_FIT / ERASE / RESET OK reply: [header(count)]."""
    if op not in _COUNT_REPLY_OPS:
        raise ValueError(f"a count reply is for {' or '.join(o.name for o in _COUNT_REPLY_OPS)}, not {op!r}")
    return _encode(_REPLY_PLANS[int(op)], request_id, count=count)


def encode_stats_reply(request_id: int, stats: dict[str, int | float]) -> list[Frame]:
    """STATS OK reply: [header, UTF-8 JSON object of str -> int|float (finite)]."""
    return _encode(_REPLY_PLANS[Op.STATS], request_id, (stats,))


def encode_hello_reply(
    request_id: int, info: dict[str, int | float], spec_json: str = "", tables_json: str = "[]"
) -> list[Frame]:
    """HELLO OK reply: [header, info JSON object of str -> int|float, spec utf8 ("" when the server has none),
    tables utf8 (a JSON array of the tables, in index order)]."""
    return _encode(_REPLY_PLANS[Op.HELLO], request_id, (info, spec_json, tables_json))


def encode_checkpoint_reply(request_id: int, path: str) -> list[Frame]:
    """CHECKPOINT OK reply: [header, path utf8 (the snapshot written)]."""
    return _encode(_REPLY_PLANS[Op.CHECKPOINT], request_id, (path,))


def encode_get_params_reply(request_id: int, version: int, server_id: int, weights: Any = b"") -> list[Frame]:
    """GET_PARAMS OK reply: [header, latest u64[2] = (version, server_id), weights (empty: not sent)]."""
    return _encode(_REPLY_PLANS[Op.GET_PARAMS], request_id, ((version, server_id), weights))


def encode_error(op: int, request_id: int, status: Status, message: str) -> list[Frame]:
    """Error reply: [header(status != OK, count=0), UTF-8 message (cut to MAX_ERROR_MESSAGE bytes)].
    ``op`` is echoed raw (any u16)."""
    if isinstance(op, bool) or not isinstance(op, (int, np.integer)) or not 0 <= op <= _U16:
        raise ValueError(f"op must be an integer in [0, {_U16}], got {op!r}")
    if status not in _STATUSES or status == Status.OK:
        raise ValueError(f"an error reply needs a non-OK Status, got {status!r}")
    frames = _encode(_ERROR_PLAN, request_id, (message,), status=int(status))
    frames[0] = _HEADER.pack(MAGIC, PROTOCOL_VERSION, int(op), int(request_id), int(status), 0, 0, 0.0, 0, 0)
    return frames


def encode_protocol_error(exc: ProtocolError) -> list[Frame]:
    """The error reply a server sends for a request that failed to decode (echoes op/request_id when known)."""
    op = exc.op if exc.op is not None else 0
    rid = exc.request_id if exc.request_id is not None else 0
    return encode_error(op, rid, exc.status, exc.message)


# ---------------------------------------------------------------------------------------------- decoders


def _views(frames: Any) -> list[memoryview]:
    if type(frames) is list or type(frames) is tuple:
        try:
            views = [memoryview(f).cast("B") for f in frames]
        except (TypeError, ValueError):
            views = None
        if views:
            return views
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


def _check_size(views: list[memoryview], max_bytes: int | None) -> None:
    if max_bytes is not None:
        total = 0
        for v in views:
            total += v.nbytes
        if total > max_bytes:
            raise _bad(f"message is {total} bytes, exceeds max_bytes={max_bytes}", Status.TOO_LARGE)


def _decode_body(plan: _Plan, h: Header, views: list[memoryview]) -> dict[str, Any]:
    """The frames of a message of ``plan`` with header ``h``, checked against the schema's rules."""
    if plan.fast_decode is not None:
        try:
            arrays = plan.fast_decode(views, h.count, h.param, h.timeout_ms)
        except Exception:  # noqa: BLE001 - anything unusual: the generic code below decides
            arrays = None
        if arrays is not None:
            return arrays
    return _decode_body_generic(plan, h, views)


def _decode_body_generic(plan: _Plan, h: Header, views: list[memoryview]) -> dict[str, Any]:
    what = plan.what
    if len(views) != plan.nframes:
        raise _bad(f"{what} must have {plan.nframes} frames (header included), got {len(views)}")
    n = h.count
    if n and plan.count is None:
        raise _bad(f"{what} header count is {n}, must be 0")
    if plan.param is None and h.param != 0.0:
        raise _bad(f"{what} header param is {h.param}, must be 0.0")
    if h.timeout_ms and not plan.timeout_ms:
        raise _bad(f"{what} header timeout_ms is {h.timeout_ms}, must be 0")
    if plan.count == "n":
        if n > MAX_BATCH:
            raise _bad(f"{what} count is {n}, exceeds MAX_BATCH={MAX_BATCH}", Status.TOO_LARGE)
        if n < plan.count_min:
            raise _bad(f"{what} count is {n}, must be >= {plan.count_min}", Status.INVALID_ARGUMENT)
    if plan.param is not None and not _finite_non_negative(h.param):
        raise _bad(f"{what} {plan.param} (header param) is {h.param}, must be finite and >= 0", Status.INVALID_ARGUMENT)
    arrays: dict[str, Any] = {}
    for f in plan.frames:
        view = views[f.index]
        dtype = f.dtype
        if dtype is not None:
            length = f.fixed if f.fixed is not None else n + f.extra
            if f.any_length:
                if view.nbytes % dtype.itemsize:
                    raise _bad(
                        f"{what} frame {f.name} is {view.nbytes} bytes, not a whole number of "
                        f"{dtype.itemsize}-byte {dtype.name} elements"
                    )
            elif view.nbytes != length * dtype.itemsize:
                raise _bad(
                    f"{what} frame {f.name} is {view.nbytes} bytes, expected {length * dtype.itemsize} "
                    f"({length} x {dtype.name})"
                )
            arr = np.frombuffer(view, dtype)
            if f.rule:
                _check_frame_values(what, f, arr, views)
            arrays[f.name] = arr
        elif f.type == "bytes":
            arrays[f.name] = view
        elif f.type == "utf8":
            if f.max_bytes is not None and view.nbytes > f.max_bytes:
                raise _bad(f"{what} {f.name} is {view.nbytes} bytes, longer than {f.max_bytes}")
            arrays[f.name] = _utf8(view, f"{what} {f.name}")
        else:
            arrays[f.name] = _stats(view, what)
    return arrays


def _check_frame_values(what: str, f: _FramePlan, arr: np.ndarray, views: list[memoryview]) -> None:
    if f.rule == _PRIORITIES:
        if not _priorities_ok(arr):
            try:
                _check_priorities(f.name, arr)
            except ValueError as exc:
                raise _bad(f"{what}: {exc}", Status.INVALID_ARGUMENT) from None
    elif f.rule in (_TOTALS, _POSITIVE):
        try:
            (_check_totals if f.rule == _TOTALS else _check_positive)(f.name, arr)
        except ValueError as exc:
            raise _bad(f"{what}: {exc}") from None
    elif not _offsets_ok(arr, views[f.ref].nbytes // f.ref_itemsize):
        try:
            _check_offsets(arr, views[f.ref].nbytes // f.ref_itemsize, f.name, f.ref_name)
        except ValueError as exc:
            raise _bad(f"{what}: {exc}") from None


def _utf8(view: memoryview, what: str) -> str:
    try:
        return str(view, "utf-8")
    except UnicodeDecodeError as exc:
        raise _bad(f"{what} is not valid UTF-8: {exc}") from None


def _reject_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not allowed")


def _stats(view: memoryview, what: str) -> dict[str, int | float]:
    text = _utf8(view, f"{what} JSON")
    try:
        stats = json.loads(text, parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:
        raise _bad(f"{what} is not valid JSON: {exc}") from None
    if not isinstance(stats, dict):
        raise _bad(f"{what} JSON must be an object, got {type(stats).__name__}")
    for key, value in stats.items():
        if not _is_stat_value(value) or (isinstance(value, float) and not math.isfinite(value)):
            raise _bad(f"{what} stats[{key!r}] must be a finite int or float, got {value!r}")
    return stats


def _with_ids(exc: ProtocolError, views: list[memoryview] | None) -> ProtocolError:
    if exc.op is None and exc.request_id is None and views:
        exc.op, exc.request_id = S.peek_ids(views[0])
    return exc


def decode_request(frames: Sequence[Any], max_bytes: int | None = None, *, service: str = "replay") -> Request:
    """Validate and decode a request for ``service`` ("replay" or "params"); raises only ProtocolError (with
    op/request_id set when readable)."""
    views: list[memoryview] | None = None
    try:
        views = _views(frames)
        _check_size(views, max_bytes)
        h = _header(views[0], _SERVICE_OPS[service])
        plan = _REQUEST_PLANS[h.op]
        if h.status:
            raise _bad(f"{plan.what} header status is {h.status}, must be OK (0)")
        return Request(h, _decode_body(plan, h, views))
    except ProtocolError as exc:
        raise _with_ids(exc, views) from None
    except Exception as exc:  # noqa: BLE001 - defence in depth: the contract is "only ProtocolError"
        raise _with_ids(_bad(f"malformed request: {type(exc).__name__}: {exc}"), views) from None


def decode_reply(frames: Sequence[Any], op: Op, request_id: int, max_bytes: int | None = None) -> Reply:
    """Validate and decode the reply to request (op, request_id); raises only ProtocolError.

    An error reply decodes to a Reply with ``ok == False`` and ``message``; call ``raise_for_status()``.
    """
    try:
        views = _views(frames)
        _check_size(views, max_bytes)
        h = _header(views[0], _SERVICE_OPS[_SERVICE_OF[int(op)]])
        if h.request_id != request_id or h.op != op:
            raise _bad(f"reply is for op {h.op} request_id {h.request_id}, expected op {op} request_id {request_id}")
        if h.status:
            plan = _ERROR_PLAN._replace(what=f"{Status(h.status).name} error reply")
            return Reply(h, message=_decode_body(plan, h, views)["message"])
        plan = _REPLY_PLANS[h.op]
        arrays = _decode_body(plan, h, views)
        if plan.arrays_only:
            return Reply(h, arrays)
        return Reply(h, arrays, stats=next((arrays.pop(f.name) for f in plan.frames if f.type == "json"), None))
    except ProtocolError:
        raise
    except Exception as exc:  # noqa: BLE001 - defence in depth: the contract is "only ProtocolError"
        raise _bad(f"malformed reply: {type(exc).__name__}: {exc}") from None
