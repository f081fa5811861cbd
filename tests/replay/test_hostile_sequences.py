"""Sequence items a hostile (or broken) writer stored: the decoder marks each bad item invalid and decodes the rest
of its batch, natively and in numpy, and never allocates more than the batch's bytes can justify.

Any peer allowed to INSERT can store an item; before these checks one such item made every ``sample()`` that drew
it raise (RecursionError, "array is too big", "n and t must be below 2^24"), stopping the learner. Cases: headers
that nest deeply, absurd ``t``, chunk headers that declare shapes their bytes cannot hold, wrong JSON types, odd
dtypes, paths that do not nest, an item of another structure drawn first; then hypothesis over arbitrary headers
and chunk layouts; then the issue's reproduction through a real server on 127.0.0.1.
"""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apexrl.replay import ReplayClient
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import steps as S


def blob(magic: bytes, header: bytes | str | dict, body: bytes = b"") -> bytes:
    text = header if isinstance(header, bytes) else (header if isinstance(header, str) else json.dumps(header))
    raw = text.encode() if isinstance(text, str) else text
    return magic + struct.pack("<HHI", 1, 0, len(raw)) + raw + body


def chunk(k: int = 10, fields=None, body: bytes | None = None, fp: int = 1) -> bytes:
    """A raw step chunk of `k` steps of one float32 pair ("obs"), its steps 0, 1, 2, ... (the issue's layout)."""
    if fields is None:
        fields = [["obs", "<f4", [2], 0, 8 * k]]
    if body is None:
        body = np.arange(2 * k, dtype="<f4").tobytes()
    return blob(S.CHUNK_MAGIC, {"fp": fp, "k": k, "f": fields}, body)


def item(first: int = 0, n: int = 2, t: int = 2, fp: int = 1, x=None, body: bytes = b"", **extra) -> bytes:
    return blob(S.ITEM_MAGIC, {"fp": fp, "first": first, "n": n, "t": t, "x": x or [], **extra}, body)


def decode(items, chunks, refs, native: bool) -> S.SequenceBatch:
    fc = P.pack_chunks(chunks, refs)
    return S.decode_sequences(
        items,
        fc.chunks(),
        [fc.refs(i) for i in range(len(items))],
        chunk_data=fc.chunk_data,
        chunk_offsets=fc.chunk_offsets,
        native=native,
    )


def assert_invalid_rows_empty(seq: S.SequenceBatch) -> None:
    for i in np.flatnonzero(~seq.valid):
        assert not seq.mask[i].any() and seq.num_steps[i] == 0

    def leaves(node):
        for v in node.values():
            yield from leaves(v) if isinstance(v, dict) else [v]

    for a in [*leaves(seq.fields), *leaves(seq.extras)]:
        assert not a[~seq.valid].any()


def check_good_rows(seq: S.SequenceBatch, good: list[int], t: int, firsts: dict[int, int] | None = None) -> None:
    """Rows `good` (only they) hold the issue chunk's steps [first, first + 2) (first: firsts[row], else 0), the
    batch's length is t, the other rows are empty."""
    assert np.flatnonzero(seq.valid).tolist() == good
    assert seq.mask.shape == (len(seq.valid), t)
    for i in good:
        first = (firsts or {}).get(i, 0)
        np.testing.assert_array_equal(seq.fields["obs"][i, :2], np.arange(2 * first, 2 * first + 4).reshape(2, 2))
        assert seq.mask[i].tolist() == [True, True] + [False] * (t - 2)
    assert_invalid_rows_empty(seq)


NATIVE = pytest.mark.parametrize("native", [False, True])


@NATIVE
@pytest.mark.parametrize("t", [2**62, 2**25, 2**24 + 1, 2**20])
def test_an_absurd_t_makes_only_its_item_invalid(native, t):
    # t = 2^20 looks honest, but a batch of 8 at 2^20 steps of 9 bytes (steps and mask) is 75 MB: far more than a
    # reply of 1 KiB can justify (the floor is 64 MiB).
    seq = decode([item(), item(t=t)] + [item(first=4, t=3)] * 6, [chunk()], [[0]] * 8, native)
    check_good_rows(seq, [0, 2, 3, 4, 5, 6, 7], 3, dict.fromkeys(range(2, 8), 4))
    assert seq.fields["obs"].shape == (8, 3, 2)


@NATIVE
def test_a_t_within_the_budget_is_padding_as_usual(native):
    seq = decode([item(t=4096)], [chunk()], [[0]], native)
    assert seq.valid.tolist() == [True] and seq.mask.shape == (1, 4096) and seq.mask.sum() == 2


@NATIVE
@pytest.mark.parametrize(
    "header",
    [
        b'{"fp":1,"first":0,"n":2,"t":2,"x":' + b"[" * 50_000 + b"]" * 50_000 + b"}",
        b'{"fp":1,"first":0,"n":2,"t":2,"x":[],"deep":' + b"{" * 600 + b"}" * 600 + b"}",
        # brackets hidden in a string with an escape: refused, never parsed
        b'{"fp":1,"first":0,"n":2,"t":2,"x":[],"s":"\\"' + b"]" * 100 + b'","d":' + b"[" * 100 + b"]" * 100 + b"}",
        b"[" * 100_000,
    ],
)
def test_a_deeply_nested_header_is_refused_before_it_is_parsed(native, header):
    seq = decode([item(), blob(S.ITEM_MAGIC, header)], [chunk()], [[0], [0]], native)
    check_good_rows(seq, [0], 2)


@NATIVE
@pytest.mark.parametrize(
    "fields, body",
    [
        ([["obs", "<f4", [2**61], 0, 0]], b""),  # the issue's: a huge shape, an empty column
        ([["obs", "<f4", [2**61], 1, 4]], b"\0" * 4),  # lz4 cannot expand 4 bytes that far
        ([["obs", "<f4", [2**40, 2**40], 0, 0]], b""),  # int64 would wrap to 0
        ([["obs", "<f4", [-1], 0, 0]], b""),
        ([["obs", "<f4", [1] * 40, 0, 40]], b"\0" * 40),  # too many dimensions
        ([["obs", "|O", [2], 0, 80]], b"\0" * 80),  # object dtype
        ([["obs", [["a", "<f4"]], [2], 0, 80]], b"\0" * 80),  # a structured dtype as a JSON list
        ([["obs", "<f4", [2], True, 80]], b"\0" * 80),  # a bool where the codec goes
        ([["obs", "<f4", [2], 7, 80]], b"\0" * 80),
        ([["obs", "<f4", [2], 0, 81]], b"\0" * 80),  # past the chunk's end
        ([["obs", "<f4", [2], 0, 80], ["obs", "<f4", [2], 0, 0]], b"\0" * 80),  # a repeated path
        ([["o/bs", "<f4", [2], 0, 80]], b"\0" * 80),  # not identifiers joined by '.'
        ([["obs", "<f4", [2], 0]], b"\0" * 80),  # an entry too short
    ],
)
def test_a_chunk_that_declares_what_its_bytes_cannot_hold_is_refused(native, fields, body):
    seq = decode([item(), item()], [chunk(), chunk(fields=fields, body=body)], [[0], [1]], native)
    check_good_rows(seq, [0], 2)
    # drawn first, its declared shape once sized the whole batch's arrays
    seq = decode([item(), item()], [chunk(fields=fields, body=body), chunk()], [[0], [1]], native)
    check_good_rows(seq, [1], 2)


@NATIVE
def test_a_chunk_whose_paths_do_not_nest_is_refused(native):
    fields = [["a", "<f4", [], 0, 40], ["a.b", "<f4", [], 0, 40]]
    seq = decode([item(), item()], [chunk(), chunk(fields=fields, body=b"\0" * 80)], [[0], [1]], native)
    check_good_rows(seq, [0], 2)


@NATIVE
@pytest.mark.parametrize(
    "bad",
    [
        item(n=True),
        item(t=2.0),
        item(t=-1),
        item(first=-1),
        item(n=0),
        item(fp=2**64),
        item(fp=None),
        item(t="2"),
        item(x={"a": 1}),
        item(x=[["e", "<f4", [1]]], body=b"\0" * 3),  # extras past the end
        item(x=[["e", "<f4", [1]], ["e.f", "<f4", [1]]], body=b"\0" * 8),  # extras that do not nest
        item(x=[["e", "<U4", [1]]], body=b"\0" * 16),
        item(x=[["e", "<f4", [2**40, 2**40]]]),
        item(n=3, t=2),
        item(first=9),  # past its chunks
        item(fp=5),  # another fingerprint than its chunks'
        blob(S.ITEM_MAGIC, b'{"fp":1,"first":0,"n":2,"t":2,"x":[]'),  # cut
        blob(S.ITEM_MAGIC, b'{"fp":1,"first":0,"n":2,"t":' + b"9" * 5000 + b',"x":[]}'),  # too many digits
        blob(S.ITEM_MAGIC, b'{"fp":1,"first":0,"n":2,"t":1e999,"x":[]}'),
        blob(S.ITEM_MAGIC, b"\xff\xfe"),
        blob(S.ITEM_MAGIC, b"[1]"),
        b"APXQ\x02\x00",
    ],
)
def test_an_item_whose_header_is_wrong_is_invalid_and_its_batch_decodes(native, bad):
    seq = decode([item(), bad, item(first=4)], [chunk()], [[0], [0], [0]], native)
    check_good_rows(seq, [0, 2], 2, {2: 4})


@NATIVE
def test_an_item_of_another_structure_drawn_first_does_not_decide_the_batch(native):
    other = chunk(fields=[["pixels", "|u1", [3], 0, 30]], body=b"\1" * 30)
    seq = decode([item(), item(), item()], [other, chunk()], [[0], [1], [1]], native)
    check_good_rows(seq, [1, 2], 2)


@NATIVE
def test_extras_that_would_outgrow_the_budget_are_invalid(native, monkeypatch):
    monkeypatch.setattr(S, "_DECODE_FLOOR", 1 << 16)
    # One item's 16 KiB of extras become a batch-wide array of n x 16 KiB: for 3 items within the floor (64 KiB
    # here); for 1000 items 16 MB, more than 256 x the ~80 KB the batch came in.
    big = item(x=[["e", "<f4", [4096]]], body=np.zeros(4096, np.float32).tobytes())
    small = decode([big, item(), item()], [chunk()], [[0], [0], [0]], native)
    assert small.valid.all() and small.extras["e"].shape == (3, 4096)
    many = decode([big] + [item()] * 999, [chunk()], [[0]] * 1000, native)
    assert not many.valid[0] and many.valid[1:].all() and many.extras == {}


# ---------------------------------------------------------------------------------------------- hypothesis

JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False) | st.text(max_size=6),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=4), inner, max_size=4),
    max_leaves=12,
)
SIZES = st.one_of(st.integers(0, 4), st.sampled_from([2**24, 2**31, 2**62, 2**63, -1]), JSON)
DTYPES = st.one_of(st.sampled_from(["<f4", "|u1", "<i8", "|b1", "<c8", "<f2", ">f4", "|O", "<U2", "V3", "<M8"]), JSON)
PATHS = st.one_of(st.sampled_from(["obs", "obs.x", "obs.y", "r", "a.b", "a"]), JSON)


@st.composite
def chunk_blobs(draw):
    k = draw(st.one_of(st.integers(1, 6), SIZES))
    fields, body = [], b""
    for _ in range(draw(st.integers(0, 3))):
        shape = draw(st.one_of(st.lists(st.integers(0, 3), max_size=2), st.lists(SIZES, max_size=3), JSON))
        codec = draw(st.one_of(st.sampled_from([0, 1]), JSON))
        column = draw(st.binary(max_size=64))
        if codec == 1 and draw(st.booleans()):
            import lz4.block

            column = lz4.block.compress(column, store_size=False)
        stored = draw(st.one_of(st.just(len(column)), SIZES))
        fields.append([draw(PATHS), draw(DTYPES), shape, codec, stored])
        body += column
    header = draw(st.one_of(st.just({"fp": draw(st.sampled_from([1, 2])), "k": k, "f": fields}), JSON))
    return blob(S.CHUNK_MAGIC, header, body)


@st.composite
def item_blobs(draw):
    def num(low, high):
        return draw(st.one_of(st.integers(low, high), SIZES))

    extras, body = [], b""
    for _ in range(draw(st.integers(0, 2))):
        shape = draw(st.one_of(st.lists(st.integers(0, 3), max_size=2), st.lists(SIZES, max_size=2)))
        extras.append([draw(PATHS), draw(DTYPES), shape])
        body += draw(st.binary(max_size=24))
    header = {"fp": draw(st.sampled_from([1, 2])), "first": num(0, 8), "n": num(1, 6), "t": num(1, 8), "x": extras}
    return blob(S.ITEM_MAGIC, draw(st.one_of(st.just(header), JSON)), body)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_arbitrary_headers_and_chunk_layouts_never_raise(data):
    chunks = data.draw(st.lists(st.one_of(chunk_blobs(), st.just(chunk())), min_size=1, max_size=4))
    items = data.draw(st.lists(st.one_of(item_blobs(), st.just(item())), min_size=1, max_size=5))
    refs = [data.draw(st.lists(st.integers(0, len(chunks) - 1), min_size=1, max_size=3)) for _ in items]
    results = [decode(items, chunks, refs, native) for native in (False, True)]
    for seq in results:
        assert_invalid_rows_empty(seq)
        assert (seq.mask.sum(axis=1) == seq.num_steps).all()
        source = sum(map(len, items)) + sum(map(len, chunks))
        held = seq.mask.nbytes + sum(a.nbytes for a in _leaves(seq.fields)) + sum(a.nbytes for a in _leaves(seq.extras))
        assert held <= max(S._DECODE_FLOOR, S._DECODE_RATIO * source)
    numpy_seq, native_seq = results
    assert numpy_seq.valid.tolist() == native_seq.valid.tolist()
    assert numpy_seq.mask.tolist() == native_seq.mask.tolist()
    for a, b in zip(_leaves(numpy_seq.fields), _leaves(native_seq.fields), strict=True):
        np.testing.assert_array_equal(a, b)


def _leaves(node):
    for v in node.values():
        yield from _leaves(v) if isinstance(v, dict) else [v]


# ---------------------------------------------------------------------------------------------- a real server


def test_a_hostile_item_stored_through_a_real_server_leaves_the_learner_sampling(start_server):
    server = start_server("--capacity", "100")
    good, bad = item(), item(t=2**62)
    with ReplayClient(server.endpoint) as client:
        keys = client.insert(np.ones(2), [good, bad], chunks=P.pack_chunks([chunk()], [[0], [0]])).tolist()
        seen = set()
        for _ in range(20):
            batch = client.sample(2)  # raised before: ValueError("array is too big")
            seq = batch.sequences
            assert seq is not None
            for i, key in enumerate(batch.keys.tolist()):
                seen.add(key)
                assert bool(seq.valid[i]) == (key == keys[0])
            check_good_rows(seq, np.flatnonzero(seq.valid).tolist(), 2)
        assert seen == set(keys)


def test_a_plain_item_drawn_first_does_not_hide_the_sequences(start_server):
    server = start_server("--capacity", "100")
    with ReplayClient(server.endpoint) as client:
        client.insert(np.ones(1), [b"not a sequence item"])
        client.insert(np.ones(1), [item()], chunks=P.pack_chunks([chunk()], [[0]]))
        for _ in range(20):
            batch = client.sample(2)
            kinds = [S.is_sequence_item(bytes(x)) for x in batch.items]
            if any(kinds):
                assert batch.sequences is not None and batch.sequences.valid.tolist() == kinds
            else:
                assert batch.sequences is None
