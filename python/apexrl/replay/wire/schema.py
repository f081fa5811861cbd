"""The apexrl wire protocol as data: the header, the message kinds of every service, their frames and limits.

Nothing here encodes or decodes: :mod:`apexrl.replay.wire.protocol` reads these tables to build its one encoder and
its one decoder, docs/protocol.md prints them (``tests/replay/test_protocol.py`` checks that the document's tables
are the ones :func:`markdown_tables` renders from this module), and a serving loop in another language can
implement the same contract from the document alone. Imports nothing from apexrl (``errors`` imports
:class:`Status` from here; nothing imports back), and never torch.

Two services share the header and the statuses: the **replay** service (``apexrl-replay-server``) and the
**params** service (the learner's :class:`~apexrl.params.service.ParamServer`). Each server answers only its own
service's ops; any other op is UNKNOWN_OP.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from enum import IntEnum

__all__ = [
    "ERROR_REPLY",
    "HEADER",
    "HEADER_FIELDS",
    "HEADER_SIZE",
    "MAGIC",
    "MAX_BATCH",
    "MAX_ERROR_MESSAGE",
    "MAX_SPEC_BYTES",
    "PARAMS_MAX_REQUEST_BYTES",
    "PROTOCOL_VERSION",
    "REPLIES",
    "REQUESTS",
    "SERVICES",
    "SUPPORTED_VERSIONS",
    "TABLE_OPS",
    "FrameSpec",
    "HeaderField",
    "MessageSpec",
    "Op",
    "Status",
    "markdown_tables",
    "peek_ids",
]

PROTOCOL_VERSION = 6
SUPPORTED_VERSIONS = (6,)
MAGIC = b"APXR"

MAX_BATCH = 1 << 20
"""Most items / keys in one message (the ``n`` of every array frame)."""
MAX_ERROR_MESSAGE = 64 * 1024
"""Most bytes of an error reply's message: encoders truncate to it, decoders refuse more."""
PARAMS_MAX_REQUEST_BYTES = 4096
"""ZMQ_MAXMSGSIZE of the params server's socket: its requests are two small frames."""
MAX_SPEC_BYTES = 64 * 1024
"""Most bytes of a TransitionSpec JSON in a HELLO request or reply (the codec's MAX_SPEC_JSON_BYTES)."""
MAX_TABLES_BYTES = 1 << 20
"""Most bytes of the HELLO reply's ``tables`` JSON."""
MAX_PATH_BYTES = 4096
"""Most bytes of the CHECKPOINT reply's ``path`` (Linux's PATH_MAX)."""


class Status(IntEnum):
    """Frame 0's ``status``: OK in every request and in a successful reply; an error reply's code otherwise."""

    OK = 0
    BAD_MESSAGE = 1
    UNSUPPORTED_VERSION = 2
    UNKNOWN_OP = 3
    TOO_LARGE = 4
    INVALID_ARGUMENT = 5
    TIMEOUT = 6
    SHUTTING_DOWN = 7
    INTERNAL = 8
    STALE_CHUNKS = 9


STATUS_MEANINGS = {
    Status.OK: "success",
    Status.BAD_MESSAGE: "malformed framing, header, lengths, offsets, JSON, or reply mismatch",
    Status.UNSUPPORTED_VERSION: "header version not in `SUPPORTED_VERSIONS`",
    Status.UNKNOWN_OP: "header op not served by this service",
    Status.TOO_LARGE: "message over the size cap or count over `MAX_BATCH`",
    Status.INVALID_ARGUMENT: "well-formed but invalid values (priorities, β, n = 0); also store `ValueError`s",
    Status.TIMEOUT: "the server could not serve within `timeout_ms`",
    Status.SHUTTING_DOWN: "the server is stopping",
    Status.INTERNAL: "unexpected server failure",
    Status.STALE_CHUNKS: "an INSERT references stored chunks (by chunk key) that are gone; nothing stored, the "
    "message lists the keys",
}


class Op(IntEnum):
    """Message kinds. 1-15: the replay service; 16-31: the params service."""

    INSERT = 1
    SAMPLE = 2
    UPDATE_PRIORITIES = 3
    REMOVE_TO_FIT = 4
    STATS = 5
    HELLO = 6
    ERASE = 7
    CHECKPOINT = 8
    RESET = 9
    GET_PARAMS = 16


SERVICES: dict[str, tuple[Op, ...]] = {
    "replay": (
        Op.INSERT,
        Op.SAMPLE,
        Op.UPDATE_PRIORITIES,
        Op.REMOVE_TO_FIT,
        Op.STATS,
        Op.HELLO,
        Op.ERASE,
        Op.CHECKPOINT,
        Op.RESET,
    ),
    "params": (Op.GET_PARAMS,),
}
"""The ops each service's server answers; a request for any other op is answered UNKNOWN_OP."""

TABLE_OPS: tuple[Op, ...] = (
    Op.INSERT,
    Op.SAMPLE,
    Op.UPDATE_PRIORITIES,
    Op.REMOVE_TO_FIT,
    Op.ERASE,
    Op.RESET,
    Op.HELLO,
)
"""The ops whose requests name a table in the header's ``table`` field (an index HELLO lists; HELLO's names the
table whose item spec it declares); every other message carries 0 there (else BAD_MESSAGE). A replay server refuses an index it has no table for with
INVALID_ARGUMENT, after decoding (the decoder does not know the server's tables)."""

FLAG_MAX_PRIORITY = 0x0001
"""The one header flag: on an INSERT, each item gets its table's largest priority so far (1.0 before any) and
the priorities frame (still sent, still checked) is not used. Every other message carries flags 0."""

# ---------------------------------------------------------------------------------------------------- header


@dataclass(frozen=True)
class HeaderField:
    name: str
    code: str  # struct code
    type: str  # wire type as documented
    meaning: str

    @property
    def size(self) -> int:
        return struct.calcsize("<" + self.code)


HEADER_FIELDS: tuple[HeaderField, ...] = (
    HeaderField("magic", "4s", "bytes", '`b"APXR"`'),
    HeaderField("version", "H", "u16", f"protocol version, `{PROTOCOL_VERSION}`"),
    HeaderField("op", "H", "u16", "`Op`, below"),
    HeaderField("request_id", "Q", "u64", "chosen by the client, echoed in the reply"),
    HeaderField("status", "H", "u16", "`Status`; 0 (OK) in every request"),
    HeaderField("flags", "H", "u16", "0; an INSERT may set FLAG_MAX_PRIORITY"),
    HeaderField("count", "I", "u32", "n (items / keys) of the array frames, or a count reply's result"),
    HeaderField("param", "d", "f64", "SAMPLE request: β; 0.0 everywhere else"),
    HeaderField("timeout_ms", "I", "u32", "INSERT and SAMPLE requests: longest the server may wait; 0 elsewhere"),
    HeaderField(
        "table",
        "I",
        "u32",
        "INSERT, SAMPLE, UPDATE_PRIORITIES, REMOVE_TO_FIT, ERASE and RESET requests: the table's index (HELLO's "
        "`tables`); 0 in every other message",
    ),
)
HEADER = struct.Struct("<" + "".join(f.code for f in HEADER_FIELDS))
HEADER_SIZE = HEADER.size  # 40
assert HEADER_SIZE == 40
_PEEK = struct.Struct("<HHQ")  # version, op, request_id at offset 4


def peek_ids(frame: memoryview) -> tuple[int | None, int | None]:
    """(op, request_id) of a header whose first 16 bytes look like ours, else (None, None).

    Bytes 0-15 (magic, version, op, request_id) keep this layout in every protocol version, so a server can
    echo op and request_id even in an UNSUPPORTED_VERSION reply, and a client can match a reply to its
    request before decoding it.
    """
    if frame.nbytes >= 16 and frame[:4] == MAGIC:
        _version, op, request_id = _PEEK.unpack_from(frame, 4)
        return op, request_id
    return None, None


# -------------------------------------------------------------------------------------------------- messages

DTYPES = {"u64": "<u8", "f64": "<f8", "f32": "<f4"}
"""Array frame types and their numpy dtype strings (little-endian)."""


@dataclass(frozen=True)
class FrameSpec:
    """One frame after the header.

    ``type``: an array type of :data:`DTYPES`, ``bytes`` (opaque), ``utf8`` (text) or ``json`` (a UTF-8 strict
    JSON object of ``str -> int | float``). ``length`` (arrays only): ``"n"`` (the header's count), ``"n+1"``,
    ``"any"`` (whatever whole number of elements the frame holds), or a fixed number of elements. ``rule``: ``"priorities"`` (every value finite and >= 0, else
    INVALID_ARGUMENT), ``"offsets:<frame>"`` (at least one entry, starts at 0, non-decreasing, ends at that
    frame's length: its bytes, or its elements for an array frame, else BAD_MESSAGE), ``"totals"`` (a pair (T, m_min): both finite, 0 <= m_min <= T, m_min > 0 exactly when
    T > 0, else BAD_MESSAGE) or ``"positive"`` (every value >= 1, else BAD_MESSAGE). ``max_bytes``: a cap for
    text frames (over it: BAD_MESSAGE).
    """

    name: str
    type: str
    length: str | int | None = None
    rule: str | None = None
    max_bytes: int | None = None
    meaning: str = ""

    def describe(self) -> str:
        if self.type in DTYPES:
            text = f"`{self.name}` {self.type}[{self.length}]"
        else:
            text = f"`{self.name}` {self.type}"
        if self.max_bytes is not None:
            text += f" ≤ {self.max_bytes} B"
        return text


@dataclass(frozen=True)
class MessageSpec:
    """One message kind: how it uses the header's count / param / timeout_ms, and its frames after the header.

    ``count``: ``"n"`` (the length of the array frames, at least ``count_min`` - else INVALID_ARGUMENT - and at
    most MAX_BATCH - else TOO_LARGE), ``"result"`` (any u32: a count reply's result) or None (must be 0).
    ``param``: ``"beta"`` (finite and >= 0, else INVALID_ARGUMENT) or None (must be 0.0). ``timeout_ms``: used,
    or must be 0. A header field that must be 0 and is not is BAD_MESSAGE.
    """

    op: Op | None
    kind: str  # "request" | "reply" | "error reply"
    frames: tuple[FrameSpec, ...] = ()
    count: str | None = None
    count_min: int = 0
    param: str | None = None
    timeout_ms: bool = False
    meaning: str = ""

    @property
    def service(self) -> str:
        return next(s for s, ops in SERVICES.items() if self.op in ops)


def _priorities(name: str = "priorities") -> FrameSpec:
    return FrameSpec(name, "f64", "n", "priorities")


_KEYS = FrameSpec("keys", "u64", "n")
_OFFSETS = FrameSpec("offsets", "u64", "n+1", "offsets:data", meaning="item i is data[offsets[i]:offsets[i+1]]")
_DATA = FrameSpec("data", "bytes", meaning="the items, concatenated")
_INSERT_ID = FrameSpec("insert_id", "u64", 2, meaning="(session, sequence): a retry reuses it; (0, 0): none")
_SPEC = FrameSpec("spec", "utf8", max_bytes=MAX_SPEC_BYTES, meaning="a TransitionSpec JSON; empty: none")
_TOTALS = FrameSpec(
    "totals",
    "f64",
    2,
    "totals",
    meaning="(total_mass, min_mass) of the store the draws were made from; (0, 0): uniform fallback",
)
_STORE_SIZE = FrameSpec("store_size", "u64", 1, "positive", meaning="items in the store when sampled")
# Frame chunks (Atari frames stored once): blobs beside the items, each item referencing some of them.
_ITEM_CHUNKS = FrameSpec(
    "item_chunks",
    "u64",
    "any",
    meaning="the items' chunk references, concatenated: a value below the message's chunk count is an index into "
    "its chunks, any other (INSERT only) the chunk key of a chunk stored earlier",
)
_ITEM_CHUNK_OFFSETS = FrameSpec(
    "item_chunk_offsets",
    "u64",
    "n+1",
    "offsets:item_chunks",
    meaning="item i references item_chunks[item_chunk_offsets[i]:item_chunk_offsets[i+1]]",
)
_CHUNK_DATA = FrameSpec("chunk_data", "bytes", meaning="the chunks, concatenated")
_CHUNK_OFFSETS = FrameSpec(
    "chunk_offsets",
    "u64",
    "any",
    "offsets:chunk_data",
    meaning="chunk c is chunk_data[chunk_offsets[c]:chunk_offsets[c+1]]",
)
_CHUNKS = (_ITEM_CHUNKS, _ITEM_CHUNK_OFFSETS, _CHUNK_DATA, _CHUNK_OFFSETS)

REQUESTS: dict[Op, MessageSpec] = {
    Op.INSERT: MessageSpec(
        Op.INSERT,
        "request",
        (_priorities(), _OFFSETS, _DATA, _INSERT_ID, *_CHUNKS),
        count="n",
        timeout_ms=True,
        meaning="store n items, once per insert_id; waits up to timeout_ms while the rate limiter holds inserts "
        "back; refused whole (INVALID_ARGUMENT) if an item does not match the server's spec, or if an item's "
        "chunk references are neither chunks of the request nor chunk keys, repeated, more than 4096, or name "
        "stored chunks of two shards, or a chunk is referenced by no item (no chunks: item_chunks empty, "
        "item_chunk_offsets all 0, chunk_offsets = [0]); refused whole (STALE_CHUNKS) if a stored chunk it "
        "references is gone",
    ),
    Op.SAMPLE: MessageSpec(
        Op.SAMPLE,
        "request",
        (),
        count="n",
        count_min=1,
        param="beta",
        timeout_ms=True,
        meaning="sample n items with IS exponent β; waits up to timeout_ms for min_size_to_sample / the rate limiter",
    ),
    Op.UPDATE_PRIORITIES: MessageSpec(
        Op.UPDATE_PRIORITIES,
        "request",
        (_KEYS, _priorities()),
        count="n",
        meaning="set new priorities",
    ),
    Op.REMOVE_TO_FIT: MessageSpec(Op.REMOVE_TO_FIT, "request", meaning="evict down to capacity"),
    Op.STATS: MessageSpec(Op.STATS, "request", meaning="the store's and the server's counters"),
    Op.HELLO: MessageSpec(
        Op.HELLO,
        "request",
        (_SPEC,),
        meaning="declare the run's TransitionSpec (the first one sticks; another: INVALID_ARGUMENT), learn the "
        "server's limits",
    ),
    Op.ERASE: MessageSpec(Op.ERASE, "request", (_KEYS,), count="n", meaning="remove these items"),
    Op.CHECKPOINT: MessageSpec(
        Op.CHECKPOINT,
        "request",
        meaning="write the snapshot of every table now, to the server's snapshot path (INVALID_ARGUMENT when it "
        "has none); an actor may not",
    ),
    Op.RESET: MessageSpec(
        Op.RESET,
        "request",
        meaning="empty the table: every item (its key stale from then on), its rate limiter's inserted and "
        "sampled counts; an actor may not",
    ),
    Op.GET_PARAMS: MessageSpec(
        Op.GET_PARAMS,
        "request",
        (FrameSpec("held", "u64", 2, meaning="(version, server_id) the requester holds; 0s: none"),),
        meaning="the latest weights, unless the requester holds them",
    ),
}

REPLIES: dict[Op, MessageSpec] = {
    Op.INSERT: MessageSpec(
        Op.INSERT,
        "reply",
        (_KEYS, FrameSpec("chunk_keys", "u64", "any", meaning="the request's chunks' keys, in its order")),
        count="n",
        meaning="the new items' keys, and the chunk keys of the chunks the request carried (a later INSERT may "
        "reference them while an item does)",
    ),
    Op.SAMPLE: MessageSpec(
        Op.SAMPLE,
        "reply",
        (
            _KEYS,
            FrameSpec("weights", "f32", "n"),
            FrameSpec("probabilities", "f64", "n"),
            _OFFSETS,
            _DATA,
            _TOTALS,
            _STORE_SIZE,
            *_CHUNKS,
        ),
        count="n",
        count_min=1,
        meaning="the sampled items, their keys, IS weights and probabilities; the store's total mass T, smallest "
        "positive mass and size when sampled (probabilities × T = the items' masses); the chunks the items "
        "reference, each once, with every item's references into them in its own order",
    ),
    Op.UPDATE_PRIORITIES: MessageSpec(
        Op.UPDATE_PRIORITIES,
        "reply",
        count="result",
        meaning="count: keys still present (evicted keys are skipped)",
    ),
    Op.REMOVE_TO_FIT: MessageSpec(Op.REMOVE_TO_FIT, "reply", count="result", meaning="count: items removed"),
    Op.STATS: MessageSpec(Op.STATS, "reply", (FrameSpec("stats", "json"),), meaning="the counters, name → number"),
    Op.HELLO: MessageSpec(
        Op.HELLO,
        "reply",
        (
            FrameSpec("info", "json"),
            _SPEC,
            FrameSpec(
                "tables",
                "utf8",
                max_bytes=MAX_TABLES_BYTES,
                meaning="a JSON array, one object per table in index order: index, name and its configuration",
            ),
        ),
        meaning="`info`: protocol_version, max_request_bytes, max_reply_bytes (and epoch when the server has "
        "one: the table `default`'s); `spec`: the server's spec (the table `default`'s), empty when it has none; "
        "`tables`: every table, its index (the header's `table` of a data request) and configuration",
    ),
    Op.ERASE: MessageSpec(Op.ERASE, "reply", count="result", meaning="count: items removed (absent keys are skipped)"),
    Op.CHECKPOINT: MessageSpec(
        Op.CHECKPOINT,
        "reply",
        (FrameSpec("path", "utf8", max_bytes=MAX_PATH_BYTES),),
        meaning="the snapshot written: its absolute path on the server's machine (what `--snapshot` restarts from)",
    ),
    Op.RESET: MessageSpec(Op.RESET, "reply", count="result", meaning="count: items removed"),
    Op.GET_PARAMS: MessageSpec(
        Op.GET_PARAMS,
        "reply",
        (
            FrameSpec("latest", "u64", 2, meaning="(version, server_id) of the latest weights; version 0: none yet"),
            FrameSpec("weights", "bytes", meaning="safetensors; empty when the requester holds them or none exist"),
        ),
        meaning="weights, or an empty frame: UNCHANGED (version > 0) or NOT_READY (version 0)",
    ),
}

ERROR_REPLY = MessageSpec(
    None,
    "error reply",
    (FrameSpec("message", "utf8", max_bytes=MAX_ERROR_MESSAGE),),
    meaning="any op: status != OK, the request's op and request_id echoed (0 when unreadable)",
)

assert set(REQUESTS) == set(REPLIES) == set(Op)

# -------------------------------------------------------------------------------------------- documentation


def _header_use(spec: MessageSpec) -> str:
    parts = []
    if spec.count == "n":
        parts.append("count n" + (f" ≥ {spec.count_min}" if spec.count_min else ""))
    elif spec.count == "result":
        parts.append("count = result")
    if spec.param:
        parts.append(f"param = {'β' if spec.param == 'beta' else spec.param}")
    if spec.timeout_ms:
        parts.append("timeout_ms")
    return ", ".join(parts) or "-"


def _frames(spec: MessageSpec) -> str:
    return ", ".join(f.describe() for f in spec.frames) or "none"


def _rules(spec: MessageSpec) -> str:
    rules = []
    for f in spec.frames:
        if f.rule == "priorities":
            rules.append(f"`{f.name}` finite, ≥ 0")
        elif f.rule == "totals":
            rules.append(f"`{f.name}` finite, 0 ≤ min_mass ≤ total_mass, min_mass > 0 iff total_mass > 0")
        elif f.rule == "positive":
            rules.append(f"`{f.name}` ≥ 1")
        elif f.rule is not None:
            rules.append(f"`{f.name}` cut `{f.rule.split(':', 1)[1]}`")
    return ", ".join(rules) or "-"


def markdown_tables() -> str:
    """The schema's tables as docs/protocol.md prints them (between its ``schema:begin``/``schema:end`` marks)."""
    lines = ["| offset | size | type | field | meaning |", "|---:|---:|---|---|---|"]
    offset = 0
    for f in HEADER_FIELDS:
        lines.append(f"| {offset} | {f.size} | {f.type} | {f.name} | {f.meaning} |")
        offset += f.size
    lines += [
        "",
        "| service | op | kind | header use | frames after the header | value rules | meaning |",
        "|---|---|---|---|---|---|---|",
    ]
    for service, ops in SERVICES.items():
        for op in ops:
            for spec in (REQUESTS[op], REPLIES[op]):
                lines.append(
                    f"| {service} | {int(op)} {op.name} | {spec.kind} | {_header_use(spec)} | {_frames(spec)} | "
                    f"{_rules(spec)} | {spec.meaning} |"
                )
    spec = ERROR_REPLY
    lines.append(f"| any | any | {spec.kind} | status ≠ OK | {_frames(spec)} | - | {spec.meaning} |")
    lines += ["", "| code | name | meaning |", "|---:|---|---|"]
    lines += [f"| {int(s)} | {s.name} | {STATUS_MEANINGS[s]} |" for s in Status]
    lines += [
        "",
        "| limit | value | meaning |",
        "|---|---:|---|",
        f"| `HEADER_SIZE` | {HEADER_SIZE} | bytes of frame 0 |",
        f"| `MAX_BATCH` | {MAX_BATCH} | most items / keys in one message (count over it: TOO_LARGE) |",
        f"| `MAX_ERROR_MESSAGE` | {MAX_ERROR_MESSAGE} | most bytes of an error message |",
        f"| `PARAMS_MAX_REQUEST_BYTES` | {PARAMS_MAX_REQUEST_BYTES} | ZMQ_MAXMSGSIZE of the params server |",
        f"| `MAX_SPEC_BYTES` | {MAX_SPEC_BYTES} | most bytes of a spec JSON (HELLO) |",
        f"| `MAX_TABLES_BYTES` | {MAX_TABLES_BYTES} | most bytes of HELLO's tables JSON |",
        f"| `MAX_PATH_BYTES` | {MAX_PATH_BYTES} | most bytes of CHECKPOINT's path |",
        f"| `PROTOCOL_VERSION` | {PROTOCOL_VERSION} | `SUPPORTED_VERSIONS` = {SUPPORTED_VERSIONS} |",
    ]
    return "\n".join(lines) + "\n"
