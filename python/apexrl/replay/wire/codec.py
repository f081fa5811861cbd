"""Transition codec: batches of transitions <-> opaque byte items for :class:`apexrl.PrioritizedStore`.

A :class:`TransitionSpec` names the fields of one transition (name, dtype, per-item shape, lz4 or not). Actors
``encode`` a batch of ``n`` transitions (a mapping of arrays with leading dimension ``n``) into one ``uint8``
buffer plus ``n + 1`` offsets, exactly the form ``PrioritizedStore.insert(priorities, data, offsets)`` takes;
the learner ``decode``\\ s sampled items (``SampleBatch.data`` / ``.offsets``) back into stacked arrays.
The spec travels once (``to_json`` / ``from_json``); every item carries the spec's 32-bit ``fingerprint`` so a
foreign or corrupted item is caught on decode.

Item layout (all integers little-endian)::

    offset 0                 u32   spec fingerprint (crc32 of the spec's canonical JSON)
    offset 4                 raw   every field with compress=False, in spec order, its raw little-endian
                                   bytes (C order); fixed size: spec.raw_item_bytes in total
    offset 4 + raw_item_bytes      for every field with compress=True, in spec order:
                             u32   L, the length of the compressed block
                             L     lz4.block.compress(field bytes, store_size=False); the decompressed size
                                   is field.nbytes, known from the spec (zero-size fields: L = 0, no block)

An item holds nothing else: its size is exactly ``4 + raw_item_bytes + sum(4 + L)``. A spec without
compressed fields therefore has fixed-size items (``spec.fixed_item_bytes``). Decoded arrays are fresh,
writable, native-endian copies: they never alias the input buffer.

No pickle, no eval: the spec JSON is parsed strictly (exact keys, exact types, whitelisted dtypes, size caps).
"""

from __future__ import annotations

import json
import math
import operator
import re
import zlib
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import lz4.block
import numpy as np

__all__ = [
    "FORMAT_VERSION",
    "MAX_FIELDS",
    "MAX_ITEM_BYTES",
    "MAX_NDIM",
    "MAX_SPEC_JSON_BYTES",
    "BatchDecoder",
    "FieldSpec",
    "TransitionSpec",
]

FORMAT_VERSION = 1
"""Version of the item layout and of the spec JSON; part of the fingerprint."""

MAX_FIELDS = 64
MAX_NDIM = 8
MAX_ITEM_BYTES = 64 << 20
"""Cap on one decoded transition (all fields, uncompressed): 64 MiB."""
MAX_SPEC_JSON_BYTES = 64 << 10

_FINGERPRINT_BYTES = 4
_LENGTH_BYTES = 4
_WORD = np.arange(4, dtype=np.intp)  # byte offsets of a u32 (fingerprints, block lengths)
# A field name: an identifier, or identifiers joined by "." (a nested mapping's path, see
# apexrl.replay.wire.structure); at most 64 characters. Names without a "." are what they always were, so old
# specs keep their JSON and fingerprint.
_NAME_RE = re.compile(r"(?=.{1,64}\Z)[A-Za-z_][A-Za-z0-9_]*(?:\.[A-Za-z_][A-Za-z0-9_]*)*")
_ALLOWED_KINDS = frozenset("biufc")  # bool, signed, unsigned, float, complex: fixed-size numeric only


def _canonical_dtype(dtype: Any) -> np.dtype:
    """Little-endian form of a fixed-size numeric or bool dtype; ValueError for anything else."""
    if dtype is None:
        raise ValueError("dtype None is not allowed (numpy would read it as float64)")
    try:
        parsed = np.dtype(dtype)
    except (TypeError, ValueError) as e:
        raise ValueError(f"dtype {dtype!r} is not a numpy dtype") from e
    # kind rules out object, str, bytes, void (structured, subarray), datetime and timedelta dtypes.
    if parsed.kind not in _ALLOWED_KINDS or parsed.metadata:
        raise ValueError(f"dtype {dtype!r} is not a fixed-size numeric or bool dtype")
    return parsed.newbyteorder("<") if parsed.itemsize > 1 else parsed


_ALLOWED_DTYPE_STRS = frozenset(
    np.dtype(code).newbyteorder("<").str if np.dtype(code).itemsize > 1 else np.dtype(code).str
    for code in ("?", "i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8", "f2", "f4", "f8", "c8", "c16")
)
"""The canonical dtype strings the spec JSON may contain ('|b1', '|u1', '<f4', ...)."""


@dataclass(frozen=True)
class FieldSpec:
    """One field of a transition: per-item ``shape`` (``()`` for a scalar) of ``dtype``; ``compress`` puts
    the field's bytes through lz4 per item (worth it for frames; float features rarely compress)."""

    name: str
    dtype: Any  # any dtype-like (np.dtype, "<f4", np.float32); a canonical np.dtype after __post_init__
    shape: tuple[int, ...] = ()
    compress: bool = False

    def __post_init__(self) -> None:
        name, shape, compress = self.name, self.shape, self.compress
        if not isinstance(name, str) or _NAME_RE.fullmatch(name) is None:
            raise ValueError(
                f"field name {name!r} is not an identifier (or identifiers joined by '.') of at most 64 ASCII characters"
            )
        canonical = _canonical_dtype(self.dtype)
        if isinstance(shape, (str, bytes)) or not isinstance(shape, Sequence):
            raise ValueError(f"field {name!r}: shape {shape!r} is not a sequence of ints")
        dims: list[int] = []
        for d in shape:
            if isinstance(d, (bool, np.bool_)):
                raise ValueError(f"field {name!r}: shape {tuple(shape)!r} holds a bool")
            try:
                dim = operator.index(d)
            except TypeError as e:
                raise ValueError(f"field {name!r}: shape {tuple(shape)!r} holds a non-integer") from e
            if dim < 0:
                raise ValueError(f"field {name!r}: shape {tuple(shape)!r} has a negative dimension")
            dims.append(int(dim))
        if len(dims) > MAX_NDIM:
            raise ValueError(f"field {name!r}: {len(dims)} dimensions, at most {MAX_NDIM}")
        if canonical.itemsize * math.prod(dims) > MAX_ITEM_BYTES:
            raise ValueError(f"field {name!r}: {tuple(dims)} x {canonical} exceeds {MAX_ITEM_BYTES} bytes per item")
        if not isinstance(compress, (bool, np.bool_)):
            raise ValueError(f"field {name!r}: compress must be a bool, got {compress!r}")
        object.__setattr__(self, "dtype", canonical)
        object.__setattr__(self, "shape", tuple(dims))
        object.__setattr__(self, "compress", bool(compress))

    @property
    def nbytes(self) -> int:
        """Bytes of this field in one transition, uncompressed."""
        return self.dtype.itemsize * math.prod(self.shape)

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, "dtype": self.dtype.str, "shape": list(self.shape), "compress": self.compress}


class _ItemBatch(Protocol):
    @property
    def data(self) -> Any: ...
    @property
    def offsets(self) -> Any: ...


_TOP_KEYS = frozenset({"version", "fields"})
_FIELD_KEYS = frozenset({"name", "dtype", "shape", "compress"})


def _note(why: dict[int, str], mask: np.ndarray, message: Callable[[int], str]) -> None:
    """Keep the message of the lowest bad item seen so far (only the first bad item's message is shown)."""
    if mask.any():
        i = int(np.flatnonzero(mask)[0])
        if not why or i < min(why):
            why.clear()
            why[i] = message(i)


def _item_index(message: str) -> int | None:
    """The index an ``item {i}: ...`` error message names, else None."""
    match = re.match(r"item (\d+): ", message)
    return int(match.group(1)) if match else None


def _no_duplicate_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in pairs:
        if k in out:
            raise ValueError(f"spec JSON: duplicate key {k!r}")
        out[k] = v
    return out


def _reject_constant(name: str) -> Any:
    raise ValueError(f"spec JSON: {name} is not allowed")


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


class TransitionSpec:
    """The ordered fields of a transition, and the codec between batches of them and store items.

    Immutable and thread-safe; ``encode`` and ``decode`` hold no state between calls.
    """

    __slots__ = (
        "_by_name",
        "_compressed",
        "_fields",
        "_fingerprint",
        "_fingerprint_bytes",
        "_header_bytes",
        "_json",
        "_layout",
        "_packed",
        "_raw",
        "_raw_item_bytes",
    )

    def __init__(self, fields: Sequence[FieldSpec]):
        if isinstance(fields, (str, bytes)) or not isinstance(fields, Sequence):
            raise ValueError("fields must be a sequence of FieldSpec")
        fields = tuple(fields)
        if not fields:
            raise ValueError("a transition spec needs at least one field")
        if len(fields) > MAX_FIELDS:
            raise ValueError(f"{len(fields)} fields, at most {MAX_FIELDS}")
        names: dict[str, FieldSpec] = {}
        for f in fields:
            if not isinstance(f, FieldSpec):
                raise ValueError(f"fields must be FieldSpec instances, got {type(f).__name__}")
            if f.name in names:
                raise ValueError(f"duplicate field name {f.name!r}")
            names[f.name] = f
        total = sum(f.nbytes for f in fields)
        if total > MAX_ITEM_BYTES:
            raise ValueError(f"one transition holds {total} bytes, at most {MAX_ITEM_BYTES}")
        self._fields = fields
        self._by_name = names
        self._raw = tuple(f for f in fields if not f.compress)
        self._compressed = tuple(f for f in fields if f.compress)
        self._raw_item_bytes = sum(f.nbytes for f in self._raw)
        self._header_bytes = _FINGERPRINT_BYTES + self._raw_item_bytes
        self._json = json.dumps(
            {"version": FORMAT_VERSION, "fields": [f.to_dict() for f in fields]},
            sort_keys=True,
            separators=(",", ":"),
        )
        self._fingerprint = zlib.crc32(self._json.encode("ascii")) & 0xFFFFFFFF
        self._fingerprint_bytes = np.frombuffer(self._fingerprint.to_bytes(4, "little"), dtype=np.uint8)
        self._packed = np.zeros(1, dtype=np.uint64)  # offsets of packed fixed-size items, grown on demand
        self._layout: Any = None  # native_layout(), built on first use

    # -- description -------------------------------------------------------------------------------------------

    @property
    def fields(self) -> tuple[FieldSpec, ...]:
        return self._fields

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self._fields)

    @property
    def raw_item_bytes(self) -> int:
        """Bytes per item of the fields stored uncompressed (the fixed-size part after the fingerprint)."""
        return self._raw_item_bytes

    @property
    def transition_bytes(self) -> int:
        """Bytes of one decoded transition: every field, uncompressed (no fingerprint)."""
        return sum(f.nbytes for f in self._fields)

    @property
    def fixed_item_bytes(self) -> int | None:
        """Size of every item when no field is compressed (4 + raw_item_bytes); None otherwise."""
        return None if self._compressed else self._header_bytes

    @property
    def fingerprint(self) -> int:
        """crc32 of the canonical JSON: the same in every process, on every machine."""
        return self._fingerprint

    def __getitem__(self, name: str) -> FieldSpec:
        return self._by_name[name]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TransitionSpec) and self._json == other._json

    def __hash__(self) -> int:
        return hash(self._json)

    def __repr__(self) -> str:
        parts = ", ".join(f"{f.name}:{f.dtype.str}{list(f.shape)}{'+lz4' if f.compress else ''}" for f in self._fields)
        return f"TransitionSpec({parts}; fingerprint=0x{self._fingerprint:08x})"

    def native_layout(self) -> Any:
        """The spec's item layout for native code (``_core.ItemLayout``, cpp/apexrl/item_layout.h): the one
        conversion behind both the server's item check on INSERT and the native decoder of ``decode_into``.
        Built on first use and kept (immutable; threads that race here build equal layouts)."""
        if self._layout is None:
            from apexrl import _core  # the extension, only where items are checked or decoded natively

            self._layout = _core.ItemLayout(
                self._fingerprint, [(f.name, f.nbytes, f.compress) for f in self._fields], repr(self)
            )
        return self._layout

    # -- JSON --------------------------------------------------------------------------------------------------

    def to_json(self) -> str:
        """Canonical JSON (sorted keys, no spaces, little-endian dtype strings); its crc32 is the fingerprint."""
        return self._json

    @classmethod
    def from_json(cls, s: str | bytes | bytearray) -> TransitionSpec:
        """Parse a spec sent by a peer. Strict: exactly the keys ``to_json`` writes, exact JSON types, only
        canonical dtype strings, at most MAX_SPEC_JSON_BYTES; anything else raises ValueError."""
        if isinstance(s, (bytes, bytearray, memoryview)):
            if len(s) > MAX_SPEC_JSON_BYTES:
                raise ValueError(f"spec JSON of {len(s)} bytes, at most {MAX_SPEC_JSON_BYTES}")
            try:
                s = bytes(s).decode("utf-8")
            except UnicodeDecodeError as e:
                raise ValueError(f"spec JSON is not UTF-8: {e}") from e
        elif not isinstance(s, str):
            raise TypeError(f"spec JSON must be str or bytes, got {type(s).__name__}")
        if len(s) > MAX_SPEC_JSON_BYTES:
            raise ValueError(f"spec JSON of {len(s)} characters, at most {MAX_SPEC_JSON_BYTES}")
        try:
            doc = json.loads(s, object_pairs_hook=_no_duplicate_keys, parse_constant=_reject_constant)
        except RecursionError as e:
            raise ValueError("spec JSON nested too deeply") from e
        except ValueError as e:  # json.JSONDecodeError is a ValueError; keep one message shape
            raise ValueError(f"spec JSON does not parse: {e}") from e
        if not isinstance(doc, dict) or set(doc) != _TOP_KEYS:
            got = sorted(doc) if isinstance(doc, dict) else type(doc).__name__
            raise ValueError(f"spec JSON: expected an object with keys {sorted(_TOP_KEYS)}, got {got}")
        if not _is_int(doc["version"]) or doc["version"] != FORMAT_VERSION:
            raise ValueError(f"spec JSON: version {doc['version']!r} is not supported (expected {FORMAT_VERSION})")
        raw_fields = doc["fields"]
        if not isinstance(raw_fields, list) or not 1 <= len(raw_fields) <= MAX_FIELDS:
            raise ValueError(f"spec JSON: 'fields' must be a list of 1 to {MAX_FIELDS} objects")
        fields = []
        for i, rf in enumerate(raw_fields):
            if not isinstance(rf, dict) or set(rf) != _FIELD_KEYS:
                got = sorted(rf) if isinstance(rf, dict) else type(rf).__name__
                raise ValueError(f"spec JSON: field {i}: expected keys {sorted(_FIELD_KEYS)}, got {got}")
            name, dtype, shape, compress = rf["name"], rf["dtype"], rf["shape"], rf["compress"]
            if not isinstance(name, str):
                raise ValueError(f"spec JSON: field {i}: name must be a string, got {name!r}")
            if not isinstance(dtype, str) or dtype not in _ALLOWED_DTYPE_STRS:
                raise ValueError(
                    f"spec JSON: field {name!r}: dtype {dtype!r} is not one of {sorted(_ALLOWED_DTYPE_STRS)}"
                )
            if (
                not isinstance(shape, list)
                or len(shape) > MAX_NDIM
                or not all(_is_int(d) and 0 <= d <= MAX_ITEM_BYTES for d in shape)
            ):
                raise ValueError(f"spec JSON: field {name!r}: shape {shape!r} is not a list of small non-negative ints")
            if not isinstance(compress, bool):
                raise ValueError(f"spec JSON: field {name!r}: compress must be true or false, got {compress!r}")
            fields.append(FieldSpec(name, dtype, tuple(shape), compress))
        return cls(fields)

    # -- presets -----------------------------------------------------------------------------------------------

    @classmethod
    def dpg(cls, obs_dim: int, act_dim: int) -> TransitionSpec:
        """Continuous control (D4PG/DDPG): float32 obs, action, reward, discount, next_obs; no compression."""
        return cls(
            [
                FieldSpec("obs", "f4", (obs_dim,)),
                FieldSpec("action", "f4", (act_dim,)),
                FieldSpec("reward", "f4"),
                FieldSpec("discount", "f4"),
                FieldSpec("next_obs", "f4", (obs_dim,)),
            ]
        )

    @classmethod
    def atari(cls, frames: int = 4, height: int = 84, width: int = 84) -> TransitionSpec:
        """Atari (DQN): uint8 frame stacks through lz4, int32 action, float32 reward and discount."""
        return cls(
            [
                FieldSpec("obs", "u1", (frames, height, width), compress=True),
                FieldSpec("action", "i4"),
                FieldSpec("reward", "f4"),
                FieldSpec("discount", "f4"),
                FieldSpec("next_obs", "u1", (frames, height, width), compress=True),
            ]
        )

    # -- encode ------------------------------------------------------------------------------------------------

    def _check_batch(self, batch: Mapping[str, Any]) -> tuple[int, dict[str, np.ndarray]]:
        """Every field present, none extra, one leading dim n, exact trailing shape, safe dtype."""
        if not isinstance(batch, Mapping):
            raise ValueError(f"batch must be a mapping of field name to array, got {type(batch).__name__}")
        missing = [name for name in self._by_name if name not in batch]
        if missing:
            raise ValueError(f"batch is missing field(s) {missing}; expected exactly {list(self.names)}")
        extra = sorted(str(k) for k in batch if k not in self._by_name)
        if extra:
            raise ValueError(f"batch has unknown field(s) {extra}; expected exactly {list(self.names)}")
        arrays: dict[str, np.ndarray] = {}
        n: int | None = None
        first = ""
        for f in self._fields:
            arr = np.asarray(batch[f.name])
            if not np.can_cast(arr.dtype, f.dtype, casting="safe"):
                raise ValueError(
                    f"field {f.name!r}: expected dtype {f.dtype} (or one that casts to it safely), got {arr.dtype}"
                )
            if arr.ndim == 0:
                raise ValueError(f"field {f.name!r}: expected shape (n, *{f.shape}), got a scalar")
            if arr.shape[1:] != f.shape:
                raise ValueError(f"field {f.name!r}: expected shape (n, *{f.shape}), got {arr.shape}")
            if n is None:
                n, first = arr.shape[0], f.name
            elif arr.shape[0] != n:
                raise ValueError(
                    f"field {f.name!r}: expected leading dim {n} (as field {first!r}), got shape {arr.shape}"
                )
            arrays[f.name] = arr
        assert n is not None
        return n, arrays

    def encode(self, batch: Mapping[str, Any]) -> tuple[np.ndarray, np.ndarray]:
        """Encode n transitions (arrays with leading dim n) into ``(data uint8, offsets uint64[n + 1])`` with
        ``offsets[0] == 0``, ready for ``PrioritizedStore.insert(priorities, data, offsets)``.

        Raises ValueError naming the field (expected vs received) before producing anything when a field is
        missing or extra, has the wrong trailing shape or leading dim, or a dtype that does not cast safely.
        """
        n, arrays = self._check_batch(batch)
        header = np.empty((n, self._header_bytes), dtype=np.uint8)
        header[:, :_FINGERPRINT_BYTES] = self._fingerprint_bytes
        pos = _FINGERPRINT_BYTES
        for f in self._raw:
            nb = f.nbytes
            if nb:
                dst = header[:, pos : pos + nb].view(f.dtype)  # (n, prod(shape)), unaligned is fine
                np.copyto(dst, arrays[f.name].reshape(n, dst.shape[1]), casting="safe")
            pos += nb

        if not self._compressed:
            offsets = np.arange(n + 1, dtype=np.uint64) * np.uint64(self._header_bytes)
            return header.reshape(-1), offsets

        compress = lz4.block.compress
        blocks: list[list[bytes]] = []
        sizes = np.full(n, self._header_bytes, dtype=np.int64)
        for f in self._compressed:
            if f.nbytes == 0:
                col = [b""] * n
            else:
                src = np.ascontiguousarray(arrays[f.name], dtype=f.dtype).reshape(n, f.nbytes // f.dtype.itemsize)
                src = src.view(np.uint8)
                col = [compress(src[i], store_size=False) for i in range(n)]
            blocks.append(col)
            sizes += _LENGTH_BYTES + np.fromiter(map(len, col), dtype=np.int64, count=n)
        offsets = np.zeros(n + 1, dtype=np.uint64)
        np.cumsum(sizes, out=offsets[1:])
        data = np.empty(int(offsets[-1]), dtype=np.uint8)
        starts = offsets[:-1].astype(np.intp)
        data[starts[:, None] + np.arange(self._header_bytes, dtype=np.intp)] = header  # one scatter
        mv = memoryview(data)  # type: ignore[arg-type]  # an ndarray is a buffer; numpy's stubs lack __buffer__
        p_list = (starts + self._header_bytes).tolist()
        for i in range(n):
            p = p_list[i]
            for col in blocks:
                block = col[i]
                mv[p : p + _LENGTH_BYTES] = len(block).to_bytes(_LENGTH_BYTES, "little")
                p += _LENGTH_BYTES
                mv[p : p + len(block)] = block
                p += len(block)
        return data, offsets

    # -- decode ------------------------------------------------------------------------------------------------

    def _check_items(self, data: Any, offsets: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Vectorised checks of the buffer, the offsets, every item's size, fingerprint and block lengths.
        Returns (data as contiguous uint8, starts intp, sizes intp)."""
        buf, starts, sizes = self._check_buffer(data, offsets)
        if self._items_ok(buf, starts, sizes):  # the common case, in a few numpy calls
            return buf, starts, sizes
        bad, reason = self._item_problems(buf, starts, sizes)
        if reason is not None:
            i = int(np.flatnonzero(bad)[0])
            if sizes[i] < 0:
                raise ValueError(f"item {i}: offsets decrease ({int(starts[i])} -> {int(starts[i] + sizes[i])})")
            raise ValueError(reason(i))
        return buf, starts, sizes

    @staticmethod
    def _check_buffer(data: Any, offsets: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The buffer as contiguous uint8, and the items' starts and sizes (ValueError if unusable)."""
        if isinstance(data, np.ndarray):
            if data.dtype != np.uint8 or data.ndim != 1:
                raise ValueError(f"data must be a 1-D uint8 array, got {data.dtype} with shape {data.shape}")
            buf = np.ascontiguousarray(data)
        else:
            try:
                buf = np.frombuffer(data, dtype=np.uint8)
            except TypeError as e:
                raise ValueError(f"data must be a uint8 array or a bytes-like object, got {type(data).__name__}") from e
        offs = np.asarray(offsets)
        if offs.ndim != 1 or offs.size < 1 or offs.dtype.kind not in "iu":
            raise ValueError(f"offsets must be a 1-D integer array of length n + 1, got {offs.dtype} {offs.shape}")
        if offs.dtype.kind == "i" and int(offs.min()) < 0:
            raise ValueError("offsets must be non-negative")
        if int(offs.max()) > buf.size:
            raise ValueError(f"offsets reach {int(offs.max())}, past the {buf.size}-byte buffer")
        offs = offs.astype(np.intp)
        return buf, offs[:-1], np.diff(offs)

    def _items_ok(self, buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray) -> bool:
        """True when every item passes the rules of :meth:`_item_problems` (False: let it find which fails).
        The server runs this on every insert, so it is the least numpy work that decides the rules."""
        n = starts.size
        if n == 0:
            return True
        hdr = self._header_bytes
        if not self._compressed:
            if not (sizes == hdr).all():
                return False
            if int(starts[0]) == 0 and buf.size == n * hdr:  # packed back to back, as encode writes them
                return bool((buf.reshape(n, hdr)[:, :_FINGERPRINT_BYTES] == self._fingerprint_bytes).all())
        if buf.size < _FINGERPRINT_BYTES:
            return False
        # Reads are clipped into the buffer, so an item too short for them reads garbage instead of failing;
        # it still fails below: positions only grow, so a walk that overruns its item never ends exactly at
        # the item's end. Conversely a walk that ends exactly there read only inside its item (all L >= 0).
        last = buf.size - _LENGTH_BYTES
        fp = buf[np.minimum(starts, last)[:, None] + _WORD].view("<u4")
        if not (fp == self._fingerprint).all():
            return False
        end = starts + sizes
        p = starts + hdr
        for f in self._compressed:
            lengths = buf[np.minimum(p, last)[:, None] + _WORD].view("<u4").ravel()
            if f.nbytes == 0 and lengths.any():
                return False
            p = p + lengths + _LENGTH_BYTES  # int64 + u32: no wrap-around
        return bool((p == end).all())

    def _item_problems(
        self, buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray
    ) -> tuple[np.ndarray, Callable[[int], str] | None]:
        """(bad mask, message of item i) for items of the wrong size, fingerprint or compressed block lengths;
        the message function is None when every item is good. Vectorised: one pass per check (and per
        compressed field), never one Python step per item."""
        n = starts.size
        if n == 0:
            return np.zeros(0, dtype=bool), None
        hdr = self._header_bytes
        if self._compressed:
            least = hdr + _LENGTH_BYTES * len(self._compressed)
            bad = sizes < least
            want = f"at least {least}"
        else:
            bad = sizes != hdr
            want = f"exactly {hdr}"
        if bad.any():
            return bad, lambda i: f"item {i}: {int(sizes[i])} bytes, expected {want} for {self!r}"
        fp = buf[starts[:, None] + np.arange(_FINGERPRINT_BYTES, dtype=np.intp)].view("<u4").ravel()
        bad = fp != self._fingerprint
        if bad.any():
            return (
                bad,
                lambda i: (
                    f"item {i}: spec fingerprint 0x{int(fp[i]):08x}, expected "
                    f"0x{self._fingerprint:08x} (an item of another spec, or corrupted)"
                ),
            )
        if self._compressed:
            return self._block_problems(buf, starts, sizes)
        return bad, None

    def _block_problems(
        self, buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray
    ) -> tuple[np.ndarray, Callable[[int], str] | None]:
        """The length walk over every item's compressed blocks, all items at once (field by field): each
        block's u32 length stays inside its item, zero-size fields have empty blocks, nothing trails."""
        end = starts + sizes
        p = starts + self._header_bytes  # every item holds all its length words (checked by the size rule)
        bad = np.zeros(starts.size, dtype=bool)
        why: dict[int, str] = {}
        word = np.arange(_LENGTH_BYTES, dtype=np.intp)
        for f in self._compressed:
            fits = ~bad & (p + _LENGTH_BYTES <= end)
            newly = ~bad & ~fits
            _note(why, newly, lambda i, f=f: f"item {i}: field {f.name!r}: truncated before its length")  # type: ignore[misc]  # mypy cannot type a lambda's defaults
            bad |= newly
            lengths = np.zeros(starts.size, dtype=np.intp)
            idx = np.flatnonzero(fits)
            lengths[idx] = buf[p[idx, None] + word].view("<u4").ravel()
            p = p + _LENGTH_BYTES
            over = ~bad & (lengths > end - p)
            _note(
                why,
                over,
                lambda i, f=f, L=lengths: f"item {i}: field {f.name!r}: block of {int(L[i])} bytes overruns the item",  # type: ignore[misc]  # mypy cannot type a lambda's defaults
            )
            bad |= over
            if f.nbytes == 0:
                nonempty = ~bad & (lengths != 0)
                _note(
                    why,
                    nonempty,
                    lambda i, f=f, L=lengths: (  # type: ignore[misc]  # mypy cannot type a lambda's defaults
                        f"item {i}: field {f.name!r}: zero-size field with a {int(L[i])}-byte block"
                    ),
                )
                bad |= nonempty
            p = p + np.where(bad, 0, lengths)
        trailing = ~bad & (p != end)
        _note(why, trailing, lambda i, e=end, q=p: f"item {i}: {int(e[i] - q[i])} trailing bytes after the last field")  # type: ignore[misc]  # mypy cannot type a lambda's defaults
        bad |= trailing
        if not bad.any():
            return bad, None
        return bad, lambda i: why[i]

    def validate_items(self, data: Any, offsets: Any) -> int:
        """The cheap, vectorised part of ``decode``: offsets in bounds, item sizes, fingerprints and, for
        compressed fields, the walk over the block lengths (lz4 payloads themselves are only checked by
        ``decode``). Returns n. Raises ValueError naming the first bad item, its size and what is expected."""
        n = self._packed_ok(data, offsets)
        if n is not None:
            return n
        return int(self._check_items(data, offsets)[1].size)

    def _packed_ok(self, data: Any, offsets: Any) -> int | None:
        """n when the batch is fixed-size items packed back to back (what ``encode`` writes and the wire
        carries: u64 offsets) and every item is good; None to take the general checks. Five numpy calls."""
        if self._compressed or type(offsets) is not np.ndarray or offsets.dtype != np.uint64 or offsets.ndim != 1:
            return None
        n = offsets.shape[0] - 1
        hdr = self._header_bytes
        try:
            buf = data if type(data) is np.ndarray else np.frombuffer(data, dtype=np.uint8)
        except (TypeError, ValueError):
            return None
        if n < 1 or buf.dtype != np.uint8 or buf.ndim != 1 or buf.size != n * hdr:
            return None
        packed = self._packed
        if packed.shape[0] < n + 1:
            packed = self._packed = np.arange(max(n + 1, 2 * packed.shape[0]), dtype=np.uint64) * np.uint64(hdr)
        if not (offsets == packed[: n + 1]).all():
            return None
        if not (buf.reshape(n, hdr)[:, :_FINGERPRINT_BYTES] == self._fingerprint_bytes).all():
            return None
        return n

    def invalid_items(self, data: Any, offsets: Any) -> tuple[np.ndarray, str | None]:
        """(bool mask of the items ``validate_items`` would refuse, the message for the first of them or None).
        Raises ValueError only when the buffer and offsets themselves are unusable."""
        buf, starts, sizes = self._check_buffer(data, offsets)
        if (sizes < 0).any():
            raise ValueError("offsets decrease")
        bad, reason = self._item_problems(buf, starts, sizes)
        if reason is None:
            return bad, None
        first = int(np.flatnonzero(bad)[0])
        # An item can break several rules; check the rest of them one rule later, on the items still good.
        good = np.flatnonzero(~bad)
        if good.size:
            more, _ = self._item_problems(buf, starts[good], sizes[good])
            bad[good[more]] = True
        return bad, reason(first)

    def decode(self, data: Any, offsets: Any) -> dict[str, np.ndarray]:
        """Decode n items (a uint8 buffer and n + 1 offsets, e.g. a SampleBatch's ``data`` and ``offsets``)
        into a dict of stacked arrays with leading dim n, in spec order. Fields stored raw are gathered for
        all items at once; only lz4 fields take one Python step per item. Raises ValueError naming the item
        index on a size, fingerprint, length or lz4 error."""
        buf, starts, sizes = self._check_items(data, offsets)
        n = starts.size
        hdr = self._header_bytes
        out: dict[str, np.ndarray] = {}

        # Raw part: one (n, hdr) gather, then one copy per field.
        if n and not self._compressed and int(starts[0]) == 0 and int(starts[-1]) == (n - 1) * hdr:
            raw = buf[: n * hdr].reshape(n, hdr)  # fixed-size items packed back to back: a view, no gather
        elif n:
            raw = buf[starts[:, None] + np.arange(hdr, dtype=np.intp)]
        else:
            raw = np.empty((0, hdr), dtype=np.uint8)
        pos = _FINGERPRINT_BYTES
        for f in self._fields:
            if f.compress:
                out[f.name] = np.empty((n, *f.shape), dtype=f.dtype.newbyteorder("="))
                continue
            nb = f.nbytes
            if nb:
                arr = raw[:, pos : pos + nb].copy().view(f.dtype).reshape(n, *f.shape)
                out[f.name] = arr.astype(f.dtype.newbyteorder("="), copy=False)
            else:
                out[f.name] = np.empty((n, *f.shape), dtype=f.dtype.newbyteorder("="))
            pos += nb

        if self._compressed and n:
            self._decode_compressed(buf, starts, sizes, out)
        return out

    def _decode_compressed(
        self, buf: np.ndarray, starts: np.ndarray, sizes: np.ndarray, out: dict[str, np.ndarray]
    ) -> None:
        decompress = lz4.block.decompress
        n = starts.size
        mv = memoryview(buf)  # type: ignore[arg-type]  # an ndarray is a buffer; numpy's stubs lack __buffer__
        targets = []
        for f in self._compressed:
            arr = out[f.name]
            # Native-endian target; bytes are little-endian on the wire, so view the target as the wire dtype.
            flat = arr.reshape(n, f.nbytes // f.dtype.itemsize).view(np.uint8) if f.nbytes else None
            targets.append((f.name, f.nbytes, flat))  # flat is None only where nbytes is 0
        begin = (starts + self._header_bytes).tolist()
        end = (starts + sizes).tolist()
        for i in range(n):
            p, stop = begin[i], end[i]
            for name, nb, flat in targets:
                if p + _LENGTH_BYTES > stop:
                    raise ValueError(f"item {i}: field {name!r}: truncated before its length")
                length = int.from_bytes(mv[p : p + _LENGTH_BYTES], "little")
                p += _LENGTH_BYTES
                if length > stop - p:
                    raise ValueError(f"item {i}: field {name!r}: block of {length} bytes overruns the item")
                if nb == 0:
                    if length:
                        raise ValueError(f"item {i}: field {name!r}: zero-size field with a {length}-byte block")
                    continue
                try:
                    plain = decompress(mv[p : p + length], uncompressed_size=nb)
                except lz4.block.LZ4BlockError as e:
                    raise ValueError(f"item {i}: field {name!r}: corrupted lz4 block ({e})") from e
                if len(plain) != nb:
                    raise ValueError(f"item {i}: field {name!r}: decompressed to {len(plain)} bytes, expected {nb}")
                flat[i] = np.frombuffer(plain, dtype=np.uint8)  # type: ignore[index]  # nb > 0 here
                p += length
            if p != stop:
                raise ValueError(f"item {i}: {stop - p} trailing bytes after the last field")
        # Wire bytes are little-endian; on a big-endian host the targets need a byte swap.
        if not np.little_endian:  # pragma: no cover - no big-endian CI
            for name, nb, _ in targets:
                if nb and out[name].dtype.itemsize > 1:
                    out[name].byteswap(inplace=True)

    def decode_valid(self, data: Any, offsets: Any) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None]:
        """Decode what can be decoded: ``(arrays of the good items, bad mask or None, first error or None)``.

        For a learner that must survive a foreign or corrupted item: instead of refusing the whole batch, the
        items that break a rule (size, fingerprint, block lengths, lz4 payload) are left out and marked in the
        mask (None when every item decoded). ValueError only when the buffer and offsets are unusable."""
        try:
            return self.decode(data, offsets), None, None
        except ValueError:
            pass
        bad, message = self.invalid_items(data, offsets)
        buf, starts, sizes = self._check_buffer(data, offsets)
        good = np.flatnonzero(~bad)
        while True:  # an lz4 payload error names one item; leave it out and decode the rest again
            sub_offsets = np.zeros(good.size + 1, dtype=np.intp)
            np.cumsum(sizes[good], out=sub_offsets[1:])
            sub = (
                buf[np.concatenate([np.arange(s, s + z) for s, z in zip(starts[good], sizes[good])])]
                if good.size
                else buf[:0]
            )
            try:
                return self.decode(sub, sub_offsets), bad, message
            except ValueError as exc:
                i = _item_index(str(exc))
                if i is None or not 0 <= i < good.size:
                    raise
                if message is None:
                    message = f"item {int(good[i])}: {str(exc).split(': ', 1)[1]}"
                bad[good[i]] = True
                good = np.delete(good, i)

    def empty_batch(self, n: int, *, pin_memory: bool = False) -> dict[str, np.ndarray]:
        """Arrays for ``decode_into`` to fill: ``{name: empty (n, *shape) array of the field's native dtype}``.
        ``pin_memory=True`` allocates them in page-locked memory through torch (imported only then), so a
        learner on a GPU copies them to the device asynchronously."""
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise ValueError(f"n must be an integer >= 0, got {n!r}")
        out: dict[str, np.ndarray] = {}
        for f in self._fields:
            dtype = f.dtype.newbyteorder("=")
            if pin_memory:
                import torch  # only a learner on a GPU pins its batches

                nbytes = n * f.nbytes
                out[f.name] = (
                    torch.empty(nbytes, dtype=torch.uint8, pin_memory=True).numpy().view(dtype).reshape(n, *f.shape)
                )
            else:
                out[f.name] = np.empty((n, *f.shape), dtype=dtype)
        return out

    def decode_into(self, data: Any, offsets: Any, out: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """``decode``, written into preallocated arrays instead of fresh ones, by the native decoder with the
        GIL released (so several threads decode side by side).

        ``out`` maps every field name to a writable C-contiguous array of shape ``(m, *field.shape)``, ``m >= n``,
        of the field's native dtype (:meth:`empty_batch` makes them). Returns ``{name: out[name][:n]}``: views,
        valid until ``out`` is written again. The same checks as ``decode``, in the same order, and the same
        ValueError messages (lz4 is the same library version's ``LZ4_decompress_safe``); after an error the
        rows of ``out`` are unspecified. A ValueError also when ``out`` does not fit the spec."""
        buf, starts, sizes = self._check_buffer(data, offsets)
        n = starts.size
        targets = []
        if not isinstance(out, Mapping) or set(out) != set(self._by_name):
            got = sorted(map(str, out)) if isinstance(out, Mapping) else type(out).__name__
            raise ValueError(f"out must map exactly the fields {list(self.names)}, got {got}")
        for f in self._fields:
            a = out[f.name]
            dtype = f.dtype.newbyteorder("=")
            if (
                not isinstance(a, np.ndarray)
                or a.dtype != dtype
                or a.shape[1:] != f.shape
                or a.ndim == 0
                or a.shape[0] < n
                or not a.flags.c_contiguous
                or not a.flags.writeable
            ):
                what = f"{a.dtype} {a.shape}" if isinstance(a, np.ndarray) else type(a).__name__
                raise ValueError(
                    f"out[{f.name!r}]: expected a writable C-contiguous {dtype} array of shape "
                    f"(>= {n}, *{f.shape}), got {what}"
                )
            targets.append(a)
        if not np.little_endian:  # pragma: no cover - no big-endian CI; the native decoder copies wire bytes
            decoded = self.decode(data, offsets)
            for f, a in zip(self._fields, targets):
                a[:n] = decoded[f.name]
            return {f.name: a[:n] for f, a in zip(self._fields, targets)}
        layout = self._layout if self._layout is not None else self.native_layout()
        from apexrl._core import decode_items  # cached by the import system after the first call

        decode_items(layout, buf, starts.astype(np.int64, copy=False), sizes.astype(np.int64, copy=False), targets)
        return {f.name: a[:n] for f, a in zip(self._fields, targets)}

    def decode_valid_into(
        self, data: Any, offsets: Any, out: Mapping[str, np.ndarray]
    ) -> tuple[dict[str, np.ndarray], np.ndarray | None, str | None]:
        """``decode_valid`` through ``decode_into``: when every item decodes, ``(views of out, None, None)``;
        otherwise the good items go through ``decode_valid`` (fresh arrays; a rare, slow path)."""
        try:
            return self.decode_into(data, offsets, out), None, None
        except ValueError:
            return self.decode_valid(data, offsets)

    def decode_batch(self, batch: _ItemBatch) -> dict[str, np.ndarray]:
        """``decode(batch.data, batch.offsets)``, for a ``SampleBatch`` (keys and weights stay on the batch)."""
        return self.decode(batch.data, batch.offsets)


class BatchDecoder:
    """The decode hook a :class:`~apexrl.replay.client.sampler.PrefetchingSampler`'s decode threads call: ``allocate``
    makes one slot of its ring of preallocated batches, ``decode_into(raw, slot)`` decodes a sampled batch
    (anything with ``data`` and ``offsets``) into it, natively with the GIL released.

    ``valid=True`` returns ``decode_valid``'s triple (arrays, bad mask or None, first error or None) instead of
    raising on a bad item, for a learner that must survive foreign or corrupted items. ``pin_memory=True``
    allocates page-locked slots (a learner on a GPU)."""

    def __init__(self, spec: TransitionSpec, batch_size: int, *, valid: bool = False, pin_memory: bool = False):
        if not isinstance(spec, TransitionSpec):
            raise TypeError(f"spec must be a TransitionSpec, got {type(spec).__name__}")
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        self.spec = spec
        self.batch_size = batch_size
        self.valid = bool(valid)
        self.pin_memory = bool(pin_memory)

    def allocate(self) -> dict[str, np.ndarray]:
        return self.spec.empty_batch(self.batch_size, pin_memory=self.pin_memory)

    def decode_into(self, raw: _ItemBatch, out: dict[str, np.ndarray]) -> Any:
        if self.valid:
            return self.spec.decode_valid_into(raw.data, raw.offsets, out)
        return self.spec.decode_into(raw.data, raw.offsets, out)
