"""The wire protocol: round trips, every validation rule, and hostile input that only ever raises ProtocolError."""

from __future__ import annotations

import json
import random
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl.errors import ProtocolError, ServerError
from apexrl.replay.wire import schema
from apexrl.replay.wire.protocol import (
    HEADER_SIZE,
    MAGIC,
    MAX_BATCH,
    PROTOCOL_VERSION,
    SUPPORTED_VERSIONS,
    Header,
    Op,
    Status,
    decode_reply,
    decode_request,
    encode_count_reply,
    encode_error,
    encode_insert,
    encode_insert_reply,
    encode_protocol_error,
    encode_remove_to_fit,
    encode_sample,
    encode_sample_reply,
    encode_stats,
    encode_stats_reply,
    encode_update,
    pack_items,
    split_items,
)

DERANDOMIZED = settings(derandomize=True, database=None, max_examples=60, deadline=None)
HEADER = struct.Struct("<4sHHQHHIdII")


def raw_header(
    magic=MAGIC,
    version=PROTOCOL_VERSION,
    op=1,
    request_id=5,
    status=0,
    flags=0,
    count=0,
    param=0.0,
    timeout_ms=0,
    table=0,
) -> bytes:
    return HEADER.pack(magic, version, op, request_id, status, flags, count, param, timeout_ms, table)


def as_bytes(frames) -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in frames]


def rejects(frames, status: Status, match: str, **kwargs) -> ProtocolError:
    with pytest.raises(ProtocolError, match=match) as info:
        decode_request(frames, **kwargs)
    assert info.value.status == status
    return info.value


def rejects_reply(frames, op, request_id, status: Status, match: str) -> ProtocolError:
    with pytest.raises(ProtocolError, match=match) as info:
        decode_reply(frames, op, request_id)
    assert info.value.status == status
    return info.value


def insert_frames(n=3, request_id=11, seed=0):
    rng = np.random.default_rng(seed)
    items = [rng.bytes(int(rng.integers(0, 20))) for _ in range(n)]
    data, offsets = pack_items(items)
    return encode_insert(request_id, rng.random(n) * 5, data, offsets), items


# ------------------------------------------------------------------------------------------ round trips


def test_the_header_is_exactly_40_bytes_and_round_trips():
    header = Header(Op.SAMPLE, 2**64 - 1, Status.TIMEOUT, 2**32 - 1, 0.4, 123, PROTOCOL_VERSION)
    packed = header.pack()
    assert len(packed) == HEADER_SIZE == 40 and packed[:4] == MAGIC
    assert Header.unpack(packed) == header


@given(
    n=st.integers(0, 40),
    request_id=st.integers(0, 2**64 - 1),
    seed=st.integers(0, 2**32 - 1),
)
@DERANDOMIZED
def test_an_insert_request_round_trips(n, request_id, seed):
    frames, items = insert_frames(n, request_id, seed)
    req = decode_request(as_bytes(frames))
    assert req.op == Op.INSERT and req.request_id == request_id and req.header.count == n
    np.testing.assert_array_equal(req.arrays["priorities"], np.asarray(frames[1]))
    assert [bytes(v) for v in split_items(req.arrays["offsets"], req.arrays["data"])] == items


def test_a_sample_request_round_trips():
    req = decode_request(encode_sample(9, 512, 0.4, timeout_ms=250))
    assert (req.op, req.request_id, req.header.count, req.header.param, req.header.timeout_ms) == (
        Op.SAMPLE,
        9,
        512,
        0.4,
        250,
    )
    assert req.arrays == {}


def test_an_insert_request_carries_a_timeout():
    data, offsets = pack_items([b"ab", b"c"])
    frames = encode_insert(7, [1.0, 2.0], data, offsets, timeout_ms=1500)
    req = decode_request(as_bytes(frames))
    assert (req.op, req.request_id, req.header.count, req.header.timeout_ms) == (Op.INSERT, 7, 2, 1500)
    assert decode_request(as_bytes(encode_insert(7, [1.0, 2.0], data, offsets))).header.timeout_ms == 0


def test_an_update_request_round_trips():
    keys = np.array([1, 2**63, 2**64 - 1], dtype=np.uint64)
    req = decode_request(as_bytes(encode_update(3, keys, [0.0, 1.5, 2.0])))
    np.testing.assert_array_equal(req.arrays["keys"], keys)
    np.testing.assert_array_equal(req.arrays["priorities"], [0.0, 1.5, 2.0])


@pytest.mark.parametrize(("encode", "op"), [(encode_remove_to_fit, Op.REMOVE_TO_FIT), (encode_stats, Op.STATS)])
def test_frameless_requests_round_trip(encode, op):
    req = decode_request(encode(42))
    assert (req.op, req.request_id, req.arrays) == (op, 42, {})


def test_an_insert_reply_round_trips():
    reply = decode_reply(as_bytes(encode_insert_reply(4, np.arange(5, dtype=np.uint64))), Op.INSERT, 4)
    assert reply.ok and reply.header.count == 5
    np.testing.assert_array_equal(reply.arrays["keys"], np.arange(5))


def test_a_sample_reply_round_trips():
    data, offsets = pack_items([b"ab", b"", b"cde"])
    frames = encode_sample_reply(8, [7, 8, 9], [1.0, 0.5, 0.25], [0.1, 0.2, 0.7], offsets, data, [10.0, 0.5], [4])
    reply = decode_reply(as_bytes(frames), Op.SAMPLE, 8)
    assert reply.arrays["weights"].dtype == np.float32 and reply.arrays["probabilities"].dtype == np.float64
    assert reply.arrays["totals"].tolist() == [10.0, 0.5] and reply.arrays["store_size"].tolist() == [4]
    np.testing.assert_array_equal(reply.arrays["keys"], [7, 8, 9])
    np.testing.assert_array_equal(reply.arrays["weights"], [1.0, 0.5, 0.25])
    assert [bytes(v) for v in split_items(reply.arrays["offsets"], reply.arrays["data"])] == [b"ab", b"", b"cde"]


@pytest.mark.parametrize("op", [Op.UPDATE_PRIORITIES, Op.REMOVE_TO_FIT])
def test_count_replies_round_trip(op):
    reply = decode_reply(encode_count_reply(op, 6, 2**32 - 1), op, 6)
    assert reply.ok and reply.header.count == 2**32 - 1


def test_a_stats_reply_round_trips_and_accepts_numpy_scalars():
    stats = {"size": 3, "total_priority": 2.5, "evicted": np.int64(4)}
    reply = decode_reply(encode_stats_reply(1, stats), Op.STATS, 1)
    assert reply.stats == {"size": 3, "total_priority": 2.5, "evicted": 4}


def test_an_error_reply_round_trips_and_raises_server_error():
    reply = decode_reply(encode_error(Op.SAMPLE, 77, Status.TIMEOUT, "no items within 250 ms ✓"), Op.SAMPLE, 77)
    assert not reply.ok and reply.status == Status.TIMEOUT and reply.message == "no items within 250 ms ✓"
    with pytest.raises(ServerError, match="TIMEOUT: no items") as info:
        reply.raise_for_status()
    assert info.value.status == Status.TIMEOUT


def test_decoded_arrays_share_memory_with_the_frames():
    frames, _ = insert_frames(50)
    buffers = [bytearray(b) for b in as_bytes(frames)]
    req = decode_request(buffers)
    assert np.shares_memory(req.arrays["priorities"], np.frombuffer(buffers[1], np.uint8))
    assert np.shares_memory(req.arrays["offsets"], np.frombuffer(buffers[2], np.uint8))
    buffers[3][0] ^= 0xFF  # the data view sees writes to the frame: no copy was made
    assert req.arrays["data"][0] == buffers[3][0]


def test_encoders_do_not_copy_big_arrays():
    priorities = np.linspace(0.0, 1.0, 1000)
    data = np.zeros(4000, dtype=np.uint8)
    frames = encode_insert(1, priorities, data, np.arange(0, 4004, 4, dtype=np.uint64))
    assert np.shares_memory(np.asarray(frames[1]), priorities)
    assert np.shares_memory(np.frombuffer(frames[3], np.uint8), data)


# ------------------------------------------------------------------------------------------ header rules

HEADER_CASES = {
    "bad magic": (
        raw_header(magic=b"APXQ"),
        Status.BAD_MESSAGE,
        r"magic is 41505851 \(frame of 40 bytes\), expected 41505852 \(b'APXR'\)",
    ),
    "empty header": (b"", Status.BAD_MESSAGE, r"magic"),
    "short header": (raw_header()[:39], Status.BAD_MESSAGE, r"header frame is 39 bytes, expected 40"),
    "long header": (raw_header() + b"\0", Status.BAD_MESSAGE, r"41 bytes, expected 40"),
    "nonzero flags": (raw_header(op=2, flags=1), Status.BAD_MESSAGE, r"flags is 0x0001, must be 0$"),
    "INSERT flag unknown": (raw_header(flags=2), Status.BAD_MESSAGE, r"flags is 0x0002, must be 0 or 0x0001"),
    "table on STATS": (
        raw_header(op=5, table=1 << 16),
        Status.BAD_MESSAGE,
        r"header table is 65536, must be 0 \(STATS",
    ),
    "op 0": (raw_header(op=0), Status.UNKNOWN_OP, r"op 0 is unknown"),
    "op 10": (raw_header(op=10), Status.UNKNOWN_OP, r"op 10 is unknown"),
    "op 65535": (raw_header(op=65535), Status.UNKNOWN_OP, r"op 65535 is unknown"),
    "status 10": (raw_header(status=10), Status.BAD_MESSAGE, r"status 10 is unknown"),
}
for _version in (0, 1, 2, 3, 4, 5, 7, 255, 65535):
    HEADER_CASES[f"version {_version}"] = (
        raw_header(version=_version),
        Status.UNSUPPORTED_VERSION,
        rf"protocol version {_version} is not supported; supported versions: 6",
    )
HEADER_CASES["version 7 with a longer header"] = (
    raw_header(version=7) + b"\0" * 8,
    Status.UNSUPPORTED_VERSION,
    r"version 7 is not supported",
)


@pytest.mark.parametrize(("frame", "status", "match"), HEADER_CASES.values(), ids=HEADER_CASES.keys())
def test_every_header_field_is_validated(frame, status, match):
    with pytest.raises(ProtocolError, match=match) as info:
        Header.unpack(frame)
    assert info.value.status == status
    rejects([frame], status, match)


def test_a_valid_header_reads_back_each_field():
    header = Header.unpack(raw_header(op=3, request_id=99, status=5, count=4, param=1.5, timeout_ms=8))
    assert header == Header(Op.UPDATE_PRIORITIES, 99, Status.INVALID_ARGUMENT, 4, 1.5, 8, PROTOCOL_VERSION)


def test_a_version_error_echoes_op_and_request_id_for_the_reply():
    err = rejects([raw_header(version=7, op=2, request_id=1234)], Status.UNSUPPORTED_VERSION, "version 7")
    assert (err.op, err.request_id) == (2, 1234)
    reply = decode_reply(encode_protocol_error(err), Op.SAMPLE, 1234)
    assert reply.status == Status.UNSUPPORTED_VERSION and str(SUPPORTED_VERSIONS[0]) in reply.message


def test_garbage_without_magic_gets_an_error_reply_with_zero_ids():
    err = rejects([b"GET / HTTP/1.1\r\n"], Status.BAD_MESSAGE, "magic")
    assert (err.op, err.request_id) == (None, None)
    frames = encode_protocol_error(err)
    magic, _version, op, request_id, status = HEADER.unpack(frames[0])[:5]
    assert (magic, op, request_id, status) == (MAGIC, 0, 0, Status.BAD_MESSAGE)
    assert bytes(frames[1]).decode().startswith("header magic")


def test_header_pack_rejects_out_of_range_fields():
    with pytest.raises(ValueError, match="request_id"):
        Header(Op.STATS, 2**64).pack()
    with pytest.raises(ValueError, match="count"):
        Header(Op.STATS, 1, count=-1).pack()


# ------------------------------------------------------------------------------------------ request body rules


def test_a_message_with_no_frames_is_rejected():
    rejects([], Status.BAD_MESSAGE, "no frames")


def test_a_frame_that_is_not_bytes_is_rejected():
    rejects([encode_stats(1)[0], 12], Status.BAD_MESSAGE, "frame 1 is not a contiguous bytes-like")
    rejects(12, Status.BAD_MESSAGE, "sequence of bytes-like")


def _insert_with(n=2, **frames_override):
    frames = as_bytes(insert_frames(n)[0])
    header = dict(op=1, request_id=11, count=n)
    header.update(frames_override.pop("header", {}))
    frames[0] = raw_header(**header)
    for index, value in frames_override.items():
        frames[int(index[1:])] = value
    return frames


def u64(*values):
    return np.array(values, dtype="<u8").tobytes()


def f64(*values):
    return np.array(values, dtype="<f8").tobytes()


REQUEST_CASES = {
    "insert with too few frames": (
        as_bytes(insert_frames(2)[0])[:3],
        Status.BAD_MESSAGE,
        r"INSERT request must have 9 frames \(header included\), got 3",
    ),
    "insert with an extra frame": (
        as_bytes(insert_frames(2)[0]) + [b""],
        Status.BAD_MESSAGE,
        r"must have 9 frames .* got 10",
    ),
    "insert item_chunks not whole u64s": (
        _insert_with(f5=b"\0" * 12),
        Status.BAD_MESSAGE,
        r"frame item_chunks is 12 bytes, not a whole number of 8-byte uint64 elements",
    ),
    "insert item_chunk_offsets too short": (
        _insert_with(f6=u64(0, 0)),
        Status.BAD_MESSAGE,
        r"frame item_chunk_offsets is 16 bytes, expected 24 \(3 x uint64\)",
    ),
    "insert item_chunk_offsets past item_chunks": (
        _insert_with(f6=u64(0, 0, 1)),
        Status.BAD_MESSAGE,
        r"item_chunk_offsets\[-1\] is 1, must equal len\(item_chunks\)=0",
    ),
    "insert item_chunk_offsets decreasing": (
        _insert_with(f5=u64(0, 0), f6=u64(0, 2, 1), f7=b"abc", f8=u64(0, 3)),
        Status.BAD_MESSAGE,
        r"item_chunk_offsets must be non-decreasing, item_chunk_offsets\[2\]=1 < item_chunk_offsets\[1\]=2",
    ),
    "insert chunk_offsets empty": (
        _insert_with(f8=b""),
        Status.BAD_MESSAGE,
        r"chunk_offsets has no entries, must hold at least one \(chunk_offsets\[0\] = 0\)",
    ),
    "insert chunk_offsets past chunk_data": (
        _insert_with(f7=b"abc", f8=u64(0, 5)),
        Status.BAD_MESSAGE,
        r"chunk_offsets\[-1\] is 5, must equal len\(chunk_data\)=3",
    ),
    "insert chunk_offsets starting above 0": (
        _insert_with(f7=b"abc", f8=u64(1, 3)),
        Status.BAD_MESSAGE,
        r"chunk_offsets\[0\] is 1, must be 0",
    ),
    "insert count above MAX_BATCH": (
        _insert_with(header=dict(count=MAX_BATCH + 1)),
        Status.TOO_LARGE,
        rf"count is {MAX_BATCH + 1}, exceeds MAX_BATCH={MAX_BATCH}",
    ),
    "insert priorities too short": (
        _insert_with(f1=f64(1.0)),
        Status.BAD_MESSAGE,
        r"frame priorities is 8 bytes, expected 16 \(2 x float64\)",
    ),
    "insert priorities not a multiple of 8": (
        _insert_with(f1=f64(1.0, 2.0) + b"\0"),
        Status.BAD_MESSAGE,
        r"priorities is 17 bytes, expected 16",
    ),
    "insert NaN priority": (
        _insert_with(f1=f64(1.0, float("nan"))),
        Status.INVALID_ARGUMENT,
        r"priorities\[1\] is nan",
    ),
    "insert negative priority": (
        _insert_with(f1=f64(-1.0, 1.0)),
        Status.INVALID_ARGUMENT,
        r"priorities\[0\] is -1.0",
    ),
    "insert infinite priority": (
        _insert_with(f1=f64(1.0, float("inf"))),
        Status.INVALID_ARGUMENT,
        r"priorities\[1\] is inf",
    ),
    "insert offsets of n entries": (
        _insert_with(f2=u64(0, 3)),
        Status.BAD_MESSAGE,
        r"frame offsets is 16 bytes, expected 24 \(3 x uint64\)",
    ),
    "insert offsets[0] nonzero": (
        _insert_with(f2=u64(1, 2, 3), f3=b"abc"),
        Status.BAD_MESSAGE,
        r"offsets\[0\] is 1, must be 0",
    ),
    "insert offsets decreasing": (
        _insert_with(f2=u64(0, 3, 2), f3=b"abc"),
        Status.BAD_MESSAGE,
        r"offsets\[2\]=2 < offsets\[1\]=3",
    ),
    "insert offsets[-1] short of data": (
        _insert_with(f2=u64(0, 1, 2), f3=b"abc"),
        Status.BAD_MESSAGE,
        r"offsets\[-1\] is 2, must equal len\(data\)=3",
    ),
    "insert offsets[-1] past data (huge)": (
        _insert_with(f2=u64(0, 1, 2**64 - 1), f3=b"abc"),
        Status.BAD_MESSAGE,
        r"offsets\[-1\] is 18446744073709551615",
    ),
    "insert with a param": (
        _insert_with(header=dict(param=0.5)),
        Status.BAD_MESSAGE,
        r"INSERT request header param is 0.5, must be 0.0",
    ),
    "request with a non-OK status": (
        _insert_with(header=dict(status=Status.INTERNAL)),
        Status.BAD_MESSAGE,
        r"header status is 8, must be OK",
    ),
    "sample of 0": ([raw_header(op=2, count=0, param=0.4)], Status.INVALID_ARGUMENT, r"count is 0, must be >= 1"),
    "sample above MAX_BATCH": (
        [raw_header(op=2, count=MAX_BATCH + 1, param=0.4)],
        Status.TOO_LARGE,
        r"exceeds MAX_BATCH",
    ),
    "sample NaN beta": ([raw_header(op=2, count=4, param=float("nan"))], Status.INVALID_ARGUMENT, r"beta .* is nan"),
    "sample infinite beta": ([raw_header(op=2, count=4, param=float("inf"))], Status.INVALID_ARGUMENT, r"is inf"),
    "sample negative beta": ([raw_header(op=2, count=4, param=-0.1)], Status.INVALID_ARGUMENT, r"is -0.1"),
    "sample with a frame": ([raw_header(op=2, count=4), b"x"], Status.BAD_MESSAGE, r"must have 1 frames"),
    "update keys too long": (
        [raw_header(op=3, count=1), u64(1, 2), f64(1.0)],
        Status.BAD_MESSAGE,
        r"frame keys is 16 bytes, expected 8 \(1 x uint64\)",
    ),
    "update priorities too short": (
        [raw_header(op=3, count=2), u64(1, 2), f64(1.0)],
        Status.BAD_MESSAGE,
        r"frame priorities is 8 bytes, expected 16",
    ),
    "update NaN priority": (
        [raw_header(op=3, count=1), u64(1), f64(float("nan"))],
        Status.INVALID_ARGUMENT,
        r"priorities\[0\] is nan",
    ),
    "update missing a frame": ([raw_header(op=3, count=1), u64(1)], Status.BAD_MESSAGE, r"must have 3 frames"),
    "update above MAX_BATCH": (
        [raw_header(op=3, count=MAX_BATCH + 1), b"", b""],
        Status.TOO_LARGE,
        r"exceeds MAX_BATCH",
    ),
    "remove_to_fit with a count": ([raw_header(op=4, count=1)], Status.BAD_MESSAGE, r"count is 1, must be 0"),
    "remove_to_fit with a frame": ([raw_header(op=4), b""], Status.BAD_MESSAGE, r"must have 1 frames"),
    "stats with a param": ([raw_header(op=5, param=1.0)], Status.BAD_MESSAGE, r"param is 1.0, must be 0.0"),
    "stats with a timeout": ([raw_header(op=5, timeout_ms=1)], Status.BAD_MESSAGE, r"timeout_ms is 1"),
}


@pytest.mark.parametrize(("frames", "status", "match"), REQUEST_CASES.values(), ids=REQUEST_CASES.keys())
def test_every_request_frame_rule_is_enforced(frames, status, match):
    err = rejects(frames, status, match)
    header = Header.unpack(frames[0])
    assert (err.op, err.request_id) == (header.op, header.request_id)


def test_a_request_over_max_bytes_is_too_large():
    frames = as_bytes(insert_frames(4)[0])
    total = sum(len(f) for f in frames)
    assert decode_request(frames, max_bytes=total).header.count == 4
    err = rejects(
        frames, Status.TOO_LARGE, rf"message is {total} bytes, exceeds max_bytes={total - 1}", max_bytes=total - 1
    )
    assert err.request_id == 11


def test_an_empty_insert_is_valid():
    req = decode_request(as_bytes(encode_insert(1, [], b"", [0])))
    assert req.header.count == 0 and len(req.arrays["data"]) == 0


# ------------------------------------------------------------------------------------------ reply rules


def _sample_reply(n=2, totals=(2.0, 1.0), store_size=(2,)):
    data, offsets = pack_items([b"x" * i for i in range(n)])
    frames = as_bytes(
        encode_sample_reply(5, np.arange(n), np.ones(n), np.full(n, 1 / n), offsets, data, [2.0, 1.0], [2])
    )
    # the totals as given, even ones the encoder would refuse
    return [*frames[:6], struct.pack("<2d", *totals), struct.pack(f"<{len(store_size)}Q", *store_size), *frames[8:]]


def _bad_totals(totals, store_size=(2,)):
    return (_sample_reply(totals=totals, store_size=store_size), Op.SAMPLE, 5, Status.BAD_MESSAGE)


REPLY_CASES = {
    "reply for another request_id": (
        encode_stats_reply(6, {}),
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"request_id 6, expected op 5 request_id 5",
    ),
    "reply for another op": (
        encode_count_reply(Op.REMOVE_TO_FIT, 5, 1),
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"op 4 .* expected op 5",
    ),
    "error reply for another request_id": (
        encode_error(Op.STATS, 4, Status.INTERNAL, "x"),
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"request_id 4",
    ),
    "insert reply keys too short": (
        [raw_header(op=1, count=2), u64(1), b""],
        Op.INSERT,
        5,
        Status.BAD_MESSAGE,
        r"INSERT reply frame keys is 8 bytes, expected 16",
    ),
    "insert reply without keys": ([raw_header(op=1, count=0)], Op.INSERT, 5, Status.BAD_MESSAGE, r"must have 3 frames"),
    "sample reply missing data": (
        _sample_reply()[:5],
        Op.SAMPLE,
        5,
        Status.BAD_MESSAGE,
        r"SAMPLE reply must have 12 frames",
    ),
    "sample reply of protocol 2 (no totals)": (
        _sample_reply()[:6],
        Op.SAMPLE,
        5,
        Status.BAD_MESSAGE,
        r"must have 12 frames",
    ),
    "sample reply of protocol 3 (no chunks)": (
        _sample_reply()[:8],
        Op.SAMPLE,
        5,
        Status.BAD_MESSAGE,
        r"must have 12 frames",
    ),
    "sample reply totals NaN": (*_bad_totals((float("nan"), 1.0)), r"totals \(total_mass, min_mass\) is \(nan, 1.0\)"),
    "sample reply totals inf": (*_bad_totals((float("inf"), 1.0)), r"is \(inf, 1.0\); both must be finite"),
    "sample reply negative total": (*_bad_totals((-1.0, 0.0)), r"is \(-1.0, 0.0\)"),
    "sample reply min_mass NaN": (*_bad_totals((2.0, float("nan"))), r"is \(2.0, nan\)"),
    "sample reply min_mass over total": (*_bad_totals((1.0, 2.0)), r"is \(1.0, 2.0\).*0 <= min_mass <= total_mass"),
    "sample reply negative min_mass": (*_bad_totals((1.0, -0.5)), r"is \(1.0, -0.5\)"),
    "sample reply min_mass 0 with mass": (*_bad_totals((1.0, 0.0)), r"min_mass > 0 exactly when total_mass > 0"),
    "sample reply min_mass without mass": (*_bad_totals((0.0, 1e-300)), r"is \(0.0, 1e-300\)"),
    "sample reply store_size 0": (*_bad_totals((2.0, 1.0), (0,)), r"store_size\[0\] is 0, must be >= 1"),
    "sample reply totals short": (
        _sample_reply()[:6] + [f64(1.0), u64(2)] + _sample_reply()[8:],
        Op.SAMPLE,
        5,
        Status.BAD_MESSAGE,
        r"frame totals is 8 bytes, expected 16",
    ),
    "sample reply store_size long": (
        _sample_reply()[:7] + [u64(2, 2)] + _sample_reply()[8:],
        Op.SAMPLE,
        5,
        Status.BAD_MESSAGE,
        r"frame store_size is 16 bytes, expected 8",
    ),
    "sample reply short weights": (
        _sample_reply()[:2] + [b"\0" * 4] + _sample_reply()[3:],
        Op.SAMPLE,
        5,
        Status.BAD_MESSAGE,
        r"frame weights is 4 bytes, expected 8 \(2 x float32\)",
    ),
    "sample reply short probabilities": (
        _sample_reply()[:3] + [f64(1.0)] + _sample_reply()[4:],
        Op.SAMPLE,
        5,
        Status.BAD_MESSAGE,
        r"frame probabilities is 8 bytes",
    ),
    "sample reply bad offsets": (
        _sample_reply()[:4] + [u64(0, 0, 5)] + _sample_reply()[5:],
        Op.SAMPLE,
        5,
        Status.BAD_MESSAGE,
        r"offsets\[-1\] is 5, must equal len\(data\)=1",
    ),
    "sample reply of 0": (
        [raw_header(op=2, count=0), b"", b"", b"", u64(0), b"", f64(1.0, 1.0), u64(1), b"", u64(0), b"", u64(0)],
        Op.SAMPLE,
        5,
        Status.INVALID_ARGUMENT,
        r"must be >= 1",
    ),
    "sample reply above MAX_BATCH": (
        [raw_header(op=2, count=MAX_BATCH + 1), *[b""] * 11],
        Op.SAMPLE,
        5,
        Status.TOO_LARGE,
        r"exceeds MAX_BATCH",
    ),
    "stats reply not JSON": (
        [raw_header(op=5), b"{"],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"STATS reply is not valid JSON",
    ),
    "stats reply a JSON list": (
        [raw_header(op=5), b"[1]"],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"must be an object, got list",
    ),
    "stats reply a string value": (
        [raw_header(op=5), b'{"a": "b"}'],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"stats\['a'\] must be",
    ),
    "stats reply a bool value": (
        [raw_header(op=5), b'{"a": true}'],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"stats\['a'\] must be",
    ),
    "stats reply a NaN": ([raw_header(op=5), b'{"a": NaN}'], Op.STATS, 5, Status.BAD_MESSAGE, r"non-finite number NaN"),
    "stats reply an overflowing float": (
        [raw_header(op=5), b'{"a": 1e400}'],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"finite int or float, got inf",
    ),
    "stats reply deeply nested": (
        [raw_header(op=5), b"[" * 100000],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"not valid JSON",
    ),
    "stats reply invalid UTF-8": (
        [raw_header(op=5), b'{"\xff": 1}'],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"not valid UTF-8",
    ),
    "stats reply with a count": (
        [raw_header(op=5, count=1), b"{}"],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"count is 1, must be 0",
    ),
    "count reply with a frame": (
        [raw_header(op=3, count=1), b""],
        Op.UPDATE_PRIORITIES,
        5,
        Status.BAD_MESSAGE,
        r"must have 1 frames",
    ),
    "reply with a param": ([raw_header(op=4, param=2.0)], Op.REMOVE_TO_FIT, 5, Status.BAD_MESSAGE, r"param is 2.0"),
    "error reply without a message": (
        [raw_header(op=5, status=8)],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"INTERNAL error reply must have 2 frames",
    ),
    "error reply with invalid UTF-8": (
        [raw_header(op=5, status=8), b"\xc3"],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"message is not valid UTF-8",
    ),
    "error reply with a count": (
        [raw_header(op=5, status=8, count=3), b"x"],
        Op.STATS,
        5,
        Status.BAD_MESSAGE,
        r"count is 3, must be 0",
    ),
    "reply of an unsupported version": (
        [raw_header(op=5, version=1), b"{}"],
        Op.STATS,
        5,
        Status.UNSUPPORTED_VERSION,
        r"version 1 is not supported; supported versions: 6",
    ),
}


@pytest.mark.parametrize(
    ("frames", "op", "request_id", "status", "match"), REPLY_CASES.values(), ids=REPLY_CASES.keys()
)
def test_every_reply_rule_is_enforced(frames, op, request_id, status, match):
    rejects_reply(frames, op, request_id, status, match)


def test_a_reply_over_max_bytes_is_too_large():
    frames = _sample_reply(10)
    with pytest.raises(ProtocolError, match="exceeds max_bytes=100") as info:
        decode_reply(frames, Op.SAMPLE, 5, max_bytes=100)
    assert info.value.status == Status.TOO_LARGE


# ------------------------------------------------------------------------------------------ encoder rules

ENCODER_CASES = {
    "negative request_id": (lambda: encode_stats(-1), r"request_id must be an integer"),
    "request_id of 2**64": (lambda: encode_remove_to_fit(2**64), r"request_id"),
    "2-D priorities": (lambda: encode_insert(1, [[1.0]], b"a", [0, 1]), r"priorities must be 1-D"),
    "string priorities": (lambda: encode_insert(1, ["a"], b"a", [0, 1]), r"real numeric dtype"),
    "NaN priority": (lambda: encode_insert(1, [float("nan")], b"a", [0, 1]), r"priorities\[0\] is nan"),
    "offsets of the wrong length": (lambda: encode_insert(1, [1.0], b"a", [1]), r"offsets has 1 entries, expected 2"),
    "offsets not ending at len(data)": (lambda: encode_insert(1, [1.0], b"ab", [0, 1]), r"must equal len\(data\)=2"),
    "offsets starting above 0": (lambda: encode_insert(1, [1.0], b"a", [1, 1]), r"offsets\[0\] is 1"),
    "negative offsets": (lambda: encode_insert(1, [1.0], b"a", [-1, 1]), r"offsets must be >= 0"),
    "float keys": (lambda: encode_update(1, [1.5], [1.0]), r"keys must have an integer dtype"),
    "negative keys": (lambda: encode_update(1, [-1], [1.0]), r"keys must be >= 0"),
    "keys and priorities of different lengths": (
        lambda: encode_update(1, [1, 2], [1.0]),
        r"priorities has 1 entries, expected 2",
    ),
    "data not bytes": (lambda: encode_insert(1, [1.0], 5, [0, 1]), r"data must be a C-contiguous bytes-like"),
    "sample of 0": (lambda: encode_sample(1, 0, 0.4), r"sample n has 0 entries"),
    "sample above MAX_BATCH": (lambda: encode_sample(1, MAX_BATCH + 1, 0.4), r"MAX_BATCH"),
    "sample NaN beta": (lambda: encode_sample(1, 4, float("nan")), r"beta is nan"),
    "sample negative timeout": (lambda: encode_sample(1, 4, 0.4, -1), r"timeout_ms"),
    "insert negative timeout": (lambda: encode_insert(1, [1.0], b"a", [0, 1], -1), r"timeout_ms"),
    "insert timeout over u32": (lambda: encode_insert(1, [1.0], b"a", [0, 1], 2**32), r"timeout_ms"),
    "insert bool timeout": (lambda: encode_insert(1, [1.0], b"a", [0, 1], True), r"timeout_ms"),
    "sample reply weights too short": (
        lambda: encode_sample_reply(1, [1], [], [1.0], [0, 0], b"", [1.0, 1.0], [1]),
        r"weights has 0 entries",
    ),
    "sample reply min_mass over total": (
        lambda: encode_sample_reply(1, [1], [1.0], [1.0], [0, 0], b"", [1.0, 2.0], [1]),
        r"totals .* is \(1.0, 2.0\)",
    ),
    "sample reply NaN total": (
        lambda: encode_sample_reply(1, [1], [1.0], [1.0], [0, 0], b"", [float("nan"), 0.0], [1]),
        r"totals .* is \(nan",
    ),
    "sample reply size 0": (
        lambda: encode_sample_reply(1, [1], [1.0], [1.0], [0, 0], b"", [1.0, 1.0], [0]),
        r"store_size",
    ),
    "count reply for SAMPLE": (lambda: encode_count_reply(Op.SAMPLE, 1, 1), r"UPDATE_PRIORITIES or REMOVE_TO_FIT"),
    "stats with a str value": (lambda: encode_stats_reply(1, {"a": "b"}), r"str -> int\|float"),
    "stats with a bool value": (lambda: encode_stats_reply(1, {"a": True}), r"str -> int\|float"),
    "stats with a NaN value": (lambda: encode_stats_reply(1, {"a": float("nan")}), r"must be finite"),
    "error with OK status": (lambda: encode_error(Op.STATS, 1, Status.OK, "x"), r"non-OK Status"),
}


@pytest.mark.parametrize(("call", "match"), ENCODER_CASES.values(), ids=ENCODER_CASES.keys())
def test_encoders_reject_caller_mistakes_with_value_error(call, match):
    with pytest.raises(ValueError, match=match):
        call()


# ------------------------------------------------------------------------------------------ fuzzing


def valid_messages():
    data, offsets = pack_items([b"abc", b"", b"defgh"])
    requests = [
        as_bytes(insert_frames(3, 1)[0]),
        as_bytes(encode_sample(2, 16, 0.4, 100)),
        as_bytes(encode_update(3, [1, 2, 3], [0.5, 1.0, 2.0])),
        as_bytes(encode_remove_to_fit(4)),
        as_bytes(encode_stats(5)),
    ]
    replies = [
        (as_bytes(encode_insert_reply(1, [9, 8, 7])), Op.INSERT, 1),
        (
            as_bytes(encode_sample_reply(2, [1, 2, 3], [1, 1, 1], [0.2, 0.3, 0.5], offsets, data, [1.0, 0.2], [3])),
            Op.SAMPLE,
            2,
        ),
        (as_bytes(encode_count_reply(Op.UPDATE_PRIORITIES, 3, 3)), Op.UPDATE_PRIORITIES, 3),
        (as_bytes(encode_count_reply(Op.REMOVE_TO_FIT, 4, 0)), Op.REMOVE_TO_FIT, 4),
        (as_bytes(encode_stats_reply(5, {"size": 3, "total_priority": 1.5})), Op.STATS, 5),
        (as_bytes(encode_error(Op.SAMPLE, 2, Status.TIMEOUT, "late")), Op.SAMPLE, 2),
    ]
    return requests, replies


def mutate(rng: random.Random, frames: list[bytes]) -> list:
    frames = [bytearray(f) for f in frames]
    for _ in range(rng.randint(1, 4)):
        kind = rng.randrange(7)
        i = rng.randrange(len(frames)) if frames else 0
        if kind == 0 and frames and frames[i]:  # flip bytes
            for _ in range(rng.randint(1, 3)):
                j = rng.randrange(len(frames[i]))
                frames[i][j] = rng.randrange(256)
        elif kind == 1 and frames:  # truncate a frame
            del frames[i][rng.randrange(len(frames[i]) + 1) :]
        elif kind == 2 and frames:  # drop a frame
            del frames[i]
        elif kind == 3:  # add a frame
            frames.insert(rng.randrange(len(frames) + 1), bytearray(rng.randbytes(rng.randrange(40))))
        elif kind == 4 and frames:  # extend a frame
            frames[i] += rng.randbytes(rng.randint(1, 16))
        elif kind == 5 and frames and len(frames[0]) >= 40:  # rewrite a header field with an extreme value
            offset, fmt = rng.choice([(4, "<H"), (6, "<H"), (8, "<Q"), (16, "<H"), (18, "<H"), (20, "<I"), (36, "<I")])
            value = rng.choice([0, 1, 2, 3, 5, 6, 255, (1 << (8 * struct.calcsize(fmt))) - 1])
            struct.pack_into(fmt, frames[0], offset, value)
        elif kind == 6 and frames and len(frames[0]) >= 40:  # an odd param
            struct.pack_into("<d", frames[0], 24, rng.choice([float("nan"), float("-inf"), -0.0, 1e308, -1.0]))
    if frames and rng.random() < 0.05:  # a frame that is not a contiguous bytes-like object
        frames[rng.randrange(len(frames))] = rng.choice([None, 3, "text", np.zeros((2, 2))[:, 0], [1, 2]])
    return frames


def test_fuzzed_messages_only_ever_raise_protocol_error():
    rng = random.Random(20240601)
    requests, replies = valid_messages()
    outcomes = {"decoded": 0, "rejected": 0}
    for trial in range(3000):
        if trial % 2 == 0:
            frames = mutate(rng, rng.choice(requests))
            decode = lambda f: decode_request(f, max_bytes=rng.choice([None, 64, 1 << 20]))  # noqa: E731
        else:
            base, op, request_id = rng.choice(replies)
            frames = mutate(rng, base)
            decode = lambda f, op=op, rid=request_id: decode_reply(f, op, rid)  # noqa: E731
        try:
            decode(frames)
            outcomes["decoded"] += 1
        except ProtocolError as exc:
            assert isinstance(exc.status, Status) and exc.status != Status.OK
            assert not exc.message.startswith("malformed"), f"an unexpected exception leaked: {exc.message}"
            outcomes["rejected"] += 1
    assert outcomes["rejected"] > 2000 and outcomes["decoded"] > 0


@given(st.lists(st.binary(max_size=64), max_size=7))
@settings(derandomize=True, database=None, max_examples=300, deadline=None)
def test_arbitrary_frame_lists_only_ever_raise_protocol_error(frames):
    for decode in (decode_request, lambda f: decode_reply(f, Op.SAMPLE, 1)):
        try:
            decode(frames)
        except ProtocolError as exc:
            assert not exc.message.startswith("malformed"), exc.message


def test_stats_json_is_strict_json():
    frames = encode_stats_reply(1, {"a": 1})
    assert json.loads(bytes(frames[1])) == {"a": 1}


# ------------------------------------------------------------------ fast paths agree with the full checks


def _same_request(a, b) -> None:
    assert a.header == b.header
    assert a.arrays.keys() == b.arrays.keys()
    for k in a.arrays:
        assert bytes(memoryview(a.arrays[k]).cast("B")) == bytes(memoryview(b.arrays[k]).cast("B")), k


def _mutations(frames: list[bytes], rng: random.Random):
    """Valid messages and near-misses: header fields, frame sizes, bad priorities, bad offsets."""
    yield frames
    for _ in range(40):
        fs = [bytearray(f) for f in frames]
        kind = rng.randrange(6)
        if kind == 0:  # one header byte
            i = rng.randrange(HEADER_SIZE)
            fs[0][i] = rng.randrange(256)
        elif kind == 1 and len(fs) > 1:  # truncate or extend a frame
            j = rng.randrange(1, len(fs))
            fs[j] = (
                fs[j][: rng.randrange(len(fs[j]) + 1)] if rng.random() < 0.5 else fs[j] + b"\0" * rng.randrange(1, 9)
            )
        elif kind == 2 and len(fs) > 1:  # a special f64 somewhere in an array frame
            j = rng.randrange(1, len(fs))
            if len(fs[j]) >= 8:
                at = 8 * rng.randrange(len(fs[j]) // 8)
                fs[j][at : at + 8] = struct.pack("<d", rng.choice([float("nan"), float("inf"), -1.0, -0.0, 0.0, 1e308]))
        elif kind == 3:  # drop or add a frame
            fs = fs[:-1] if rng.random() < 0.5 else fs + [bytearray(b"x")]
        elif kind == 4 and len(fs) > 2:  # swap two u64 words of a frame (decreasing offsets)
            j = rng.randrange(1, len(fs))
            if len(fs[j]) >= 16:
                a, b = 8 * rng.randrange(len(fs[j]) // 8), 8 * rng.randrange(len(fs[j]) // 8)
                fs[j][a : a + 8], fs[j][b : b + 8] = fs[j][b : b + 8], fs[j][a : a + 8]
        else:  # count, param or timeout_ms
            field = rng.choice(
                [
                    (20, "<I", rng.choice([0, 1, 2, 3, 5, MAX_BATCH + 1])),
                    (24, "<d", rng.choice([0.0, -0.0, 0.4, -1.0, float("nan")])),
                    (32, "<I", rng.choice([0, 7])),
                ]
            )
            struct.pack_into(field[1], fs[0], field[0], field[2])
        yield [bytes(f) for f in fs]


def test_fast_decoders_agree_with_the_generic_checks():
    """Every message kind with a fast path (generated from the schema) decodes well-formed messages in it; whatever
    it accepts, the generic checks must accept identically, and whatever it declines, they decide."""
    from apexrl.replay.wire import protocol as P

    rng = random.Random(3)
    accepted = 0
    for kind, op, frames in all_valid_messages():
        plans = P._REQUEST_PLANS if kind == "request" else P._REPLY_PLANS
        plan = plans[int(op)]
        if plan.fast_decode is None:
            continue
        for msg in _mutations(as_bytes(frames), rng):
            if not msg:
                continue
            views = [memoryview(f) for f in msg]
            try:
                h = P._header(views[0], P._SERVICE_OPS[schema.REQUESTS[op].service])
            except ProtocolError:
                continue
            if h.op != op or h.status:
                continue
            fast = plan.fast_decode(views, h.count, h.param, h.timeout_ms)
            try:
                full = P._decode_body_generic(plan, h, views)
            except ProtocolError:
                full = None
            if fast is not None:
                accepted += 1
                assert full is not None, msg
                _same_request(P.Request(h, fast), P.Request(h, full))
    assert accepted >= 8


def test_fast_encoders_produce_the_full_encoding():
    """The encoders' fast path (arrays already of the wire's dtypes) gives the same bytes as the generic path
    (lists), and still rejects bad values."""
    from apexrl.replay.wire import protocol as P

    for kind, op, _frames in all_valid_messages():
        plan = (P._REQUEST_PLANS if kind == "request" else P._REPLY_PLANS)[int(op)]
        if plan.fast_encode is not None:
            generic = plan._replace(fast_encode=None)
            assert plan.fast_encode is not None
            values, fields = VALID_VALUES[(kind, op)]
            assert as_bytes(P._encode(plan, 5, values, **fields)) == as_bytes(P._encode(generic, 5, values, **fields))

    data, offsets = pack_items([b"abc", b"", b"defgh"])
    prio = np.array([1.0, 0.0, 2.5])
    fast = encode_insert(7, prio, data, offsets, 9)
    full = encode_insert(7, prio.tolist(), data, offsets.tolist(), 9)
    assert as_bytes(fast) == as_bytes(full)
    keys = np.array([1, 2, 3], np.uint64)
    assert as_bytes(encode_update(3, keys, prio)) == as_bytes(encode_update(3, keys.tolist(), prio.tolist()))
    assert as_bytes(encode_insert_reply(3, keys)) == as_bytes(encode_insert_reply(3, keys.tolist()))
    for bad in (np.array([1.0, np.nan, 1.0]), np.array([1.0, np.inf, 1.0]), np.array([1.0, -1e-300, 1.0])):
        with pytest.raises(ValueError, match="priorities"):
            encode_insert(7, bad, data, offsets)
        with pytest.raises(ValueError, match="priorities"):
            encode_update(7, keys, bad)
    # -0.0 is a valid priority (it takes the exact check)
    assert as_bytes(encode_insert(7, np.array([1.0, -0.0, 1.0]), data, offsets))[1] == struct.pack(
        "<3d", 1.0, -0.0, 1.0
    )
    with pytest.raises(ValueError, match="offsets"):
        encode_insert(7, prio, data, np.array([0, 5, 3, 8], np.uint64))
    with pytest.raises(ValueError, match="offsets"):
        encode_insert(7, prio, data, np.array([0, 3, 3, 9], np.uint64))


# ------------------------------------------------------------------ driven by the schema: every message kind

_ITEMS, _ITEM_OFFSETS = b"abcdefgh", np.array([0, 3, 3, 8], np.uint64)
# Frame chunks of the 3 items: item 0 references chunk 0, item 1 none, item 2 chunks 0 and 1.
_CHUNKS = (np.array([0, 0, 1], np.uint64), np.array([0, 1, 1, 3], np.uint64), b"XYZzz", np.array([0, 3, 5], np.uint64))
VALID_VALUES = {  # (kind, op) -> (frame values in the schema's order, header fields): a valid message
    ("request", Op.INSERT): (
        (np.array([1.0, 0.0, 2.5]), _ITEM_OFFSETS, _ITEMS, np.array([3, 4], np.uint64), *_CHUNKS),
        {"timeout_ms": 9},
    ),
    ("request", Op.SAMPLE): ((), {"count": 3, "param": 0.4, "timeout_ms": 5}),
    ("request", Op.UPDATE_PRIORITIES): ((np.array([1, 2, 3], np.uint64), np.array([0.5, -0.0, 2.0])), {}),
    ("request", Op.REMOVE_TO_FIT): ((), {}),
    ("request", Op.STATS): ((), {}),
    ("request", Op.HELLO): (('{"a": 1}',), {}),
    ("request", Op.ERASE): ((np.array([1, 2], np.uint64),), {}),
    ("request", Op.CHECKPOINT): ((), {}),
    ("request", Op.RESET): ((), {}),
    ("request", Op.GET_PARAMS): ((np.array([7, 9], np.uint64),), {}),
    ("reply", Op.INSERT): ((np.array([4, 5, 6], np.uint64), np.array([1 << 52], np.uint64)), {}),
    ("reply", Op.SAMPLE): (
        (
            np.array([4, 5, 6], np.uint64),
            np.ones(3, np.float32),
            np.full(3, 0.5),
            _ITEM_OFFSETS,
            _ITEMS,
            np.array([2.0, 0.5]),
            np.array([2], np.uint64),
            *_CHUNKS,
        ),
        {},
    ),
    ("reply", Op.UPDATE_PRIORITIES): ((), {"count": 2}),
    ("reply", Op.REMOVE_TO_FIT): ((), {"count": 0}),
    ("reply", Op.STATS): (({"size": 3, "x": 1.5},), {}),
    ("reply", Op.HELLO): (({"protocol_version": 3, "max_request_bytes": 1024}, "", '[{"index": 0, "name": "t"}]'), {}),
    ("reply", Op.ERASE): ((), {"count": 2}),
    ("reply", Op.CHECKPOINT): (("/runs/replay.snap",), {}),
    ("reply", Op.RESET): ((), {"count": 7}),
    ("reply", Op.GET_PARAMS): ((np.array([7, 9], np.uint64), b"weights"), {}),
}
RID = 5


def test_every_message_kind_of_the_schema_has_a_valid_example():
    kinds = {("request", op) for op in schema.REQUESTS} | {("reply", op) for op in schema.REPLIES}
    assert set(VALID_VALUES) == kinds


def spec_of_kind(kind, op) -> schema.MessageSpec:
    return (schema.REQUESTS if kind == "request" else schema.REPLIES)[op]


def all_valid_messages():
    from apexrl.replay.wire import protocol as P

    for (kind, op), (values, fields) in VALID_VALUES.items():
        plan = (P._REQUEST_PLANS if kind == "request" else P._REPLY_PLANS)[int(op)]
        yield kind, op, P._encode(plan, RID, values, **fields)


def decode(kind, op, frames):
    """The decoder under test (the Python one; a native serving loop can be put behind the same call)."""
    if kind == "request":
        return decode_request(frames, service=spec_of_kind(kind, op).service)
    return decode_reply(frames, op, RID)


_FIELD_AT = {}
_offset = 0
for _f in schema.HEADER_FIELDS:
    _FIELD_AT[_f.name] = (_offset, "<" + _f.code)
    _offset += _f.size


def set_field(frames, name, value):
    offset, fmt = _FIELD_AT[name]
    header = bytearray(frames[0])
    struct.pack_into(fmt, header, offset, value)
    return [bytes(header), *frames[1:]]


def schema_mutations(kind, op, frames):
    """(label, frames, status, match): for every rule of this kind's spec, a message breaking just that rule."""
    spec = spec_of_kind(kind, op)
    what = f"{op.name} {kind}"
    n = len(frames)
    if n > 1:
        yield (
            "missing frame",
            frames[:-1],
            Status.BAD_MESSAGE,
            rf"{what} must have {n} frames \(header included\), got {n - 1}",
        )
    yield "extra frame", [*frames, b""], Status.BAD_MESSAGE, rf"must have {n} frames .* got {n + 1}"
    if spec.count is None:
        yield "count set", set_field(frames, "count", 1), Status.BAD_MESSAGE, r"header count is 1, must be 0"
    if spec.param is None:
        yield "param set", set_field(frames, "param", 0.5), Status.BAD_MESSAGE, r"header param is 0.5, must be 0.0"
    else:
        yield "param NaN", set_field(frames, "param", float("nan")), Status.INVALID_ARGUMENT, r"is nan, must be finite"
    if not spec.timeout_ms:
        yield "timeout set", set_field(frames, "timeout_ms", 1), Status.BAD_MESSAGE, r"timeout_ms is 1, must be 0"
    if op not in schema.TABLE_OPS:
        yield "table set", set_field(frames, "table", 3), Status.BAD_MESSAGE, r"header table is 3, must be 0"
    if spec.count == "n":
        yield (
            "count over MAX_BATCH",
            set_field(frames, "count", MAX_BATCH + 1),
            Status.TOO_LARGE,
            rf"count is {MAX_BATCH + 1}, exceeds MAX_BATCH",
        )
        if spec.count_min:
            yield "count 0", set_field(frames, "count", 0), Status.INVALID_ARGUMENT, r"count is 0, must be >= 1"
    if kind == "request":
        yield (
            "non-OK status",
            set_field(frames, "status", Status.INTERNAL),
            Status.BAD_MESSAGE,
            r"header status is 8, must be OK",
        )
        other = next(o for o in Op if o not in schema.SERVICES[spec.service])
        yield "another service's op", set_field(frames, "op", other), Status.UNKNOWN_OP, rf"op {int(other)} is unknown"
    for i, f in enumerate(spec.frames, start=1):
        cut = [*frames[:i], frames[i][:-1], *frames[i + 1 :]]
        if f.type in schema.DTYPES:
            yield f"{f.name} cut", cut, Status.BAD_MESSAGE, rf"frame {f.name} is {len(frames[i]) - 1} bytes"
        elif f.type in ("utf8", "json"):
            yield (
                f"{f.name} not UTF-8",
                [*frames[:i], b"\xff", *frames[i + 1 :]],
                Status.BAD_MESSAGE,
                r"not valid UTF-8",
            )
        if f.rule == "priorities":
            bad = bytearray(frames[i])
            bad[:8] = struct.pack("<d", float("nan"))
            yield (
                f"{f.name} NaN",
                [*frames[:i], bytes(bad), *frames[i + 1 :]],
                Status.INVALID_ARGUMENT,
                rf"{f.name}\[0\] is nan",
            )
        if f.rule is not None and f.rule.startswith("offsets:"):
            bad = bytearray(frames[i])
            bad[:8] = struct.pack("<Q", 1)
            yield (
                f"{f.name} start",
                [*frames[:i], bytes(bad), *frames[i + 1 :]],
                Status.BAD_MESSAGE,
                r"offsets\[0\] is 1",
            )
        if f.rule == "totals":
            for label, pair in (("NaN", (float("nan"), 1.0)), ("min above total", (1.0, 2.0)), ("min 0", (1.0, 0.0))):
                yield (
                    f"{f.name} {label}",
                    [*frames[:i], struct.pack("<2d", *pair), *frames[i + 1 :]],
                    Status.BAD_MESSAGE,
                    rf"{f.name} \(total_mass, min_mass\)",
                )
        if f.rule == "positive":
            bad = bytes(len(frames[i]))
            yield f"{f.name} 0", [*frames[:i], bad, *frames[i + 1 :]], Status.BAD_MESSAGE, rf"{f.name}\[0\] is 0"


SCHEMA_CASES = [
    pytest.param(kind, op, frames, status, match, id=f"{op.name}-{kind}-{label}")
    for kind, op, valid in [(k, o, as_bytes(f)) for k, o, f in all_valid_messages()]
    for label, frames, status, match in schema_mutations(kind, op, valid)
]


@pytest.mark.parametrize(("kind", "op", "frames", "status", "match"), SCHEMA_CASES)
def test_every_rule_of_every_message_kind_is_enforced(kind, op, frames, status, match):
    with pytest.raises(ProtocolError, match=match) as info:
        decode(kind, op, frames)
    assert info.value.status == status


@pytest.mark.parametrize(("kind", "op"), list(VALID_VALUES), ids=[f"{o.name}-{k}" for k, o in VALID_VALUES])
def test_every_valid_example_decodes(kind, op):
    frames = next(f for k, o, f in all_valid_messages() if (k, o) == (kind, op))
    decoded = decode(kind, op, as_bytes(frames))
    spec = spec_of_kind(kind, op)
    if kind == "request":
        assert sorted(decoded.arrays) == sorted(f.name for f in spec.frames)
    else:
        assert decoded.ok
        assert sorted(decoded.arrays) == sorted(f.name for f in spec.frames if f.type != "json")


def test_error_replies_follow_the_schema():
    limit = schema.MAX_ERROR_MESSAGE
    frames = as_bytes(
        encode_error(Op.GET_PARAMS, RID, Status.INTERNAL, "é" * limit)
    )  # cut to the cap, whole characters
    assert len(frames[1]) == limit and frames[1].decode() == "é" * (limit // 2)
    assert decode_reply(frames, Op.GET_PARAMS, RID).message == "é" * (limit // 2)
    with pytest.raises(ProtocolError, match=rf"message is {limit + 1} bytes, longer than {limit}"):
        decode_reply([frames[0], b"x" * (limit + 1)], Op.GET_PARAMS, RID)


def test_the_documented_tables_are_the_schema():
    """docs/protocol.md prints the schema's tables between its schema:begin / schema:end marks, verbatim."""
    import pathlib

    text = (pathlib.Path(__file__).parents[2] / "docs" / "protocol.md").read_text(encoding="utf-8")
    begin, end = "<!-- schema:begin -->\n", "<!-- schema:end -->"
    assert begin in text and end in text, "docs/protocol.md lost its schema marks"
    documented = text[text.index(begin) + len(begin) : text.index(end)]
    assert documented.strip() == schema.markdown_tables().strip(), (
        "docs/protocol.md is out of date: paste the output of "
        "`python -c 'from apexrl.replay.wire import schema; print(schema.markdown_tables())'` between the marks"
    )


def test_the_replay_service_never_imports_torch():
    import subprocess
    import sys

    # Every module of the replay service but ReplayDataset's, by walking the package: a new module is checked too.
    code = (
        "import importlib, pkgutil, sys; import apexrl.replay as r; "
        "mods = [m.name for m in pkgutil.walk_packages(r.__path__, 'apexrl.replay.')]; "
        "assert 'apexrl.replay.client.replay_client' in mods and 'apexrl.replay.wire.protocol' in mods, mods; "
        "[importlib.import_module(m) for m in mods if m != 'apexrl.replay.client.dataset']; "
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_errors_and_the_schema_import_no_cycle():
    """errors imports the schema for Status and nothing else of the package (but the packages above the schema and
    the extension the root imports): nothing it loads can import errors back."""
    import subprocess
    import sys

    code = (
        "import sys; import apexrl.errors; "
        "loaded = sorted(m for m in sys.modules if m == 'apexrl' or m.startswith('apexrl.')); "
        "assert loaded == ['apexrl', 'apexrl._core', 'apexrl.errors', 'apexrl.replay', 'apexrl.replay.wire', "
        "'apexrl.replay.wire.schema'], loaded; "
        "from apexrl.replay.wire.schema import Status; from apexrl.errors import ProtocolError; "
        "assert ProtocolError(Status.BAD_MESSAGE, 'x').status is Status.BAD_MESSAGE"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
