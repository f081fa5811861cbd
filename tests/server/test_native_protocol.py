"""The native serving loop's copies of the protocol rules, held to their Python definitions.

* its constants are the schema's;
* its decoder (``_core.serve_decode``) gives every request the Python decoder's answer -- the same status, the
  same echoed op and request id, the same message up to how each side writes a number (``same_message``: the
  same words naming the same frame and rule, the same values) -- on valid requests and on mutated ones
  (hypothesis);
* its item check (``_core.serve_first_bad_item``) refuses exactly the batches ``TransitionSpec.validate_items``
  refuses, with the same message.
"""

from __future__ import annotations

import math
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl import _core
from apexrl.errors import ProtocolError
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import schema as S
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

MAX_BYTES = 1 << 20


def test_constants_are_the_schemas():
    c = _core.serve_constants()
    assert c["MAGIC"] == S.MAGIC and c["PROTOCOL_VERSION"] == S.PROTOCOL_VERSION
    assert c["HEADER_SIZE"] == S.HEADER_SIZE and c["MAX_BATCH"] == S.MAX_BATCH
    assert c["MAX_ERROR_MESSAGE"] == S.MAX_ERROR_MESSAGE
    assert c["OPS"] == {op.name: int(op) for op in S.SERVICES["replay"]}
    assert c["MAX_STATUS"] == max(S.Status)


PYTHON_OPS = (S.Op.HELLO, S.Op.STATS, S.Op.CHECKPOINT)
"""The requests the native loop hands to Python (serve/wire.h ServedInPython)."""


def schema_plan() -> dict[str, object]:
    """The wire plan the schema gives, in the shape of _core.serve_plan()."""
    header, offset = [], 0
    for f in S.HEADER_FIELDS:
        header.append((f.name, offset, f.size))
        offset += f.size
    requests = {}
    for op in S.SERVICES["replay"]:
        if op in PYTHON_OPS:  # decoded in Python, which serves them: the loop reads their header only
            continue
        spec = S.REQUESTS[op]
        requests[op.name] = {
            "frames": [(f.name, f.type, f.length, f.rule) for f in spec.frames],
            "count": spec.count,
            "count_min": spec.count_min,
            "param": spec.param,
            "timeout_ms": spec.timeout_ms,
        }
    return {"HEADER": header, "REQUESTS": requests}


def test_the_native_wire_plan_is_the_schemas():
    """serve/wire.h's plan (the header's fields; each data op's frames, their types, lengths and rules, and its
    use of count, param and timeout_ms) is schema.REQUESTS / HEADER_FIELDS: a protocol change fails here until
    the C++ plan agrees, as docs/protocol.md's tables are held to the schema in tests/replay/test_protocol.py."""
    native, expected = _core.serve_plan(), schema_plan()
    assert native["HEADER"] == expected["HEADER"]
    assert native["REQUESTS"].keys() == expected["REQUESTS"].keys()
    for op, plan in expected["REQUESTS"].items():
        assert native["REQUESTS"][op] == plan, f"serve/wire.cc's plan of {op} differs from schema.REQUESTS"


def python_answer(frames: list[bytes], cap: int = MAX_BYTES) -> tuple[int, int, int, str]:
    try:
        req = P.decode_request(frames, cap)
    except ProtocolError as exc:
        return int(exc.status), exc.op or 0, exc.request_id or 0, exc.message
    return 0, int(req.header.op), req.request_id, ""


# A number as either side writes it: Python's repr ("1.0", "1e-05", "inf") or C++'s shortest form ("1", "1e-05").
_NUMBER = re.compile(r"(?<![\w.])-?(?:inf|nan|\d+(?:\.\d*)?(?:e[+-]?\d+)?)(?![\w.])")


def same_message(native: str, python: str) -> bool:
    """The two messages say the same: equal text between the numbers, and equal numbers (by value)."""
    if _NUMBER.sub("#", native) != _NUMBER.sub("#", python):
        return False
    values = [(float(a), float(b)) for a, b in zip(_NUMBER.findall(native), _NUMBER.findall(python), strict=True)]
    return all(a == b or (math.isnan(a) and math.isnan(b)) for a, b in values)


def test_same_message_compares_numbers_by_value_and_words_exactly():
    assert same_message("priorities[2] is 1, must be 0", "priorities[2] is 1.0, must be 0")
    assert same_message("beta is -inf, x=1e+300", "beta is -inf, x=1e+300")
    assert not same_message("priorities[2] is 1", "priorities[3] is 1.0")
    assert not same_message("offsets[0] is 1", "offsets[-1] is 1")
    assert not same_message("frame data is 8 bytes", "frame offsets is 8 bytes")


def seeds() -> list[list[bytes]]:
    def raw(frames):
        return [bytes(memoryview(f)) for f in frames]

    data, offsets = P.pack_items([b"abc", b"", b"defgh"])
    return [
        raw(P.encode_insert(7, np.array([1.0, 0.0, 2.5]), data, offsets, timeout_ms=100, insert_id=(5, 9))),
        raw(
            P.encode_insert(
                7,
                np.array([1.0, 0.0, 2.5]),
                data,
                offsets,
                timeout_ms=100,
                insert_id=(5, 9),
                chunks=P.pack_chunks([b"chunk0", b"", b"chunk two"], [[0], [], [2, 1, 0]]),
            )
        ),
        raw(P.encode_sample(8, 512, 0.4, timeout_ms=1000)),
        raw(P.encode_update(9, np.array([1, 2], np.uint64), np.array([0.5, 3.0]))),
        raw(P.encode_remove_to_fit(10)),
        raw(P.encode_erase(11, np.array([4], np.uint64))),
        raw(P.encode_reset(12, table=1)),
        raw(P.encode_checkpoint(13)),
    ]


EDGES = [0, 1, 2**16 - 1, 2**20, 2**20 + 1, 2**32 - 1, 2**63, 2**64 - 1]
F64_EDGES = [0.0, -0.0, -1.0, 1e300, float("inf"), float("nan"), 0.5]


@st.composite
def mutated(draw) -> list[bytes]:
    frames = [bytearray(f) for f in draw(st.sampled_from(seeds()))]
    for _ in range(draw(st.integers(0, 4))):
        kind = draw(st.integers(0, 7))
        i = draw(st.integers(0, len(frames) - 1)) if frames else 0
        if not frames:
            frames.append(bytearray())
        f = frames[i]
        if kind == 0 and f:  # flip a byte
            j = draw(st.integers(0, len(f) - 1))
            f[j] ^= draw(st.integers(1, 255))
        elif kind == 1:  # cut
            del f[draw(st.integers(0, len(f))) :]
        elif kind == 2:  # extend
            f.extend(draw(st.binary(max_size=24)))
        elif kind == 3 and len(frames) > 1:  # drop a frame
            frames.pop(i)
        elif kind == 4:  # add a frame
            frames.insert(draw(st.integers(0, len(frames))), bytearray(draw(st.binary(max_size=16))))
        elif kind == 5 and len(frames[0]) == 40:  # a u32/u16 header field at an edge value
            at, size = draw(st.sampled_from([(4, 2), (6, 2), (16, 2), (18, 2), (20, 4), (32, 4), (36, 4)]))
            v = draw(st.sampled_from(EDGES)) % (1 << (8 * size))
            frames[0][at : at + size] = v.to_bytes(size, "little")
        elif kind == 6 and len(frames[0]) == 40:  # the f64 param
            frames[0][24:32] = np.array([draw(st.sampled_from(F64_EDGES))]).tobytes()
        elif kind == 7 and len(f) >= 8:  # an 8-byte word: a priority or offset at an edge value
            j = 8 * draw(st.integers(0, len(f) // 8 - 1))
            word = draw(
                st.one_of(
                    st.sampled_from(EDGES).map(lambda v: v.to_bytes(8, "little")),
                    st.sampled_from(F64_EDGES).map(lambda v: np.array([v]).tobytes()),
                )
            )
            f[j : j + 8] = word
    return [bytes(f) for f in frames]


@settings(max_examples=1500, deadline=None)
@given(frames=mutated())
def test_the_native_decoder_answers_as_the_python_decoder(frames):
    status, op, rid, message = _core.serve_decode(frames, MAX_BYTES)
    if status == 0 and op in PYTHON_OPS:
        return  # the native loop hands these to Python, which decodes their bodies itself
    want = python_answer(frames)
    assert (status, op, rid) == want[:3] and same_message(message, want[3]), ((status, op, rid, message), want)


def test_every_seed_decodes_and_oversized_messages_are_refused_alike():
    for frames in seeds():
        assert _core.serve_decode(frames, MAX_BYTES)[0] == 0
        assert _core.serve_decode(frames, 41) == python_answer(frames, 41)


SPECS = [
    TransitionSpec.dpg(3, 2),
    TransitionSpec(
        [
            FieldSpec("obs", "u1", (4, 6), compress=True),
            FieldSpec("a", "<i4", ()),
            FieldSpec("none", "<f4", (0,), compress=True),
            FieldSpec("r", "<f4", ()),
        ]
    ),
]


@pytest.mark.parametrize("spec", SPECS, ids=["dpg", "compressed"])
@settings(max_examples=300, deadline=None)
@given(data=st.data())
def test_the_native_item_check_refuses_what_validate_items_refuses(spec, data):
    n = data.draw(st.integers(1, 5))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    batch = {f.name: rng.integers(0, 3, size=(n, *f.shape)).astype(f.dtype) for f in spec.fields}
    buf, offsets = spec.encode(batch)
    buf = bytearray(buf.tobytes())
    offs = offsets.astype(np.uint64)
    for _ in range(data.draw(st.integers(0, 3))):  # corrupt bytes, or move a cut between items
        if data.draw(st.booleans()) and buf:
            j = data.draw(st.integers(0, len(buf) - 1))
            buf[j] = data.draw(st.integers(0, 255))
        elif n > 1:
            k = data.draw(st.integers(1, n - 1))
            offs[k] = data.draw(st.integers(int(offs[k - 1]), int(offs[k + 1])))
    try:
        spec.validate_items(bytes(buf), offs)
        expected = None
    except ValueError as exc:
        expected = str(exc)
    got = _core.serve_first_bad_item(spec.native_layout(), bytes(buf), offs.tobytes())
    assert got == expected
