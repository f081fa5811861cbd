"""Window items (a slices table's SAMPLE reply, apexrl.replay.wire.windows) decoded natively: honest windows give
what the generic sequence decoder gives for the same windows; a hostile or corrupt item, reference or frame makes
only its window invalid (mask and rows zero), never a crash or a read outside the reply; hypothesis over
arbitrary fields and frames."""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apexrl._core import decode_window_items as native_decode
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import windows as W
from apexrl.replay.wire.episodes import chunk_columns, episode_chunks

T = 5


def episode(n: int) -> dict:
    t = np.arange(n)
    return {"obs": np.stack([t, -t], axis=1).astype(np.float32), "act": (t % 3).astype(np.int64)}


CHUNKS, COUNTS, FP = episode_chunks(episode(11), 4)  # chunks of 4, 4, 3 steps
COLUMNS, _ = chunk_columns(CHUNKS)


def window(first: int, rows: int, refs: list[int], **change) -> bytes:
    """The honest item of the window of `rows` steps from step `first` of chunks `refs`; `change` overrides a
    header field (fp, first, rows, t) or the places (steps, columns)."""
    steps = change.get("steps", [COUNTS[c] for c in refs])
    columns = change.get("columns", COLUMNS[refs])
    return W.encode_window_item(
        change.get("fp", FP), change.get("first", first), change.get("rows", rows), change.get("t", T), steps, columns
    )


HONEST = [(window(1, 5, [0, 1]), [0, 1]), (window(2, 5, [1, 2]), [1, 2]), (window(0, 3, [2]), [2])]


def decode(items: list[bytes], refs: list[list[int]], native: bool = True):
    data, offsets = P.pack_items(items)
    return W.decode_window_items(data, offsets, P.pack_chunks(CHUNKS, refs), native=native)


def check_consistent(seq) -> None:
    assert (seq.mask.sum(axis=1) == seq.num_steps).all()
    for i in np.flatnonzero(~seq.valid):
        assert not seq.mask[i].any() and seq.num_steps[i] == 0
    for a in (seq.fields.get("obs"), seq.fields.get("act")):
        if a is not None:
            assert not a[~seq.valid].any() and not a[~seq.mask].any()


@pytest.mark.parametrize("native", [True, False])
def test_honest_windows_decode_their_steps_padded_past_their_rows(native):
    seq = decode([w for w, _ in HONEST], [r for _, r in HONEST], native)
    assert seq.valid.all() and seq.num_steps.tolist() == [5, 5, 3]
    np.testing.assert_array_equal(seq.fields["obs"][0, :, 0], [1, 2, 3, 4, 5])
    np.testing.assert_array_equal(seq.fields["act"][1], [6 % 3, 7 % 3, 8 % 3, 9 % 3, 10 % 3])
    np.testing.assert_array_equal(seq.fields["obs"][2, :, 0], [8, 9, 10, 0, 0])
    assert seq.mask[2].tolist() == [True, True, True, False, False]
    check_consistent(seq)


BAD = {
    "short item": (b"APXW" + bytes(20), [0]),
    "magic": (b"APXQ" + window(0, 3, [0])[4:], [0]),
    "version": (window(0, 3, [0])[:4] + struct.pack("<H", 2) + window(0, 3, [0])[6:], [0]),
    "flags": (window(0, 3, [0])[:6] + struct.pack("<H", 1) + window(0, 3, [0])[8:], [0]),
    "trailing byte": (window(0, 3, [0]) + b"\0", [0]),
    "fewer refs than places": (window(0, 3, [0, 1]), [0]),
    "fingerprint": (window(0, 3, [0], fp=FP ^ 1), [0]),
    "t": (window(0, 3, [0], t=T + 1), [0]),
    "rows 0": (window(0, 0, [0]), [0]),
    "rows past t": (window(0, T + 1, [0, 1]), [0, 1]),
    "steps past its chunks": (window(2, 3, [0]), [0]),
    "first past its chunks": (window(2**63, 1, [0]), [0]),
    "a chunk of no steps": (window(0, 3, [0], steps=[0]), [0]),
    "a chunk of more steps than it holds": (window(0, 5, [0], steps=[5]), [0]),
    "a reference past the chunks": (window(0, 3, [0]), [7]),
    "places unlike an earlier window's": (window(0, 3, [0], columns=COLUMNS[[0]] + 1), [0]),
    "a column outside its chunk": (window(0, 3, [0], columns=COLUMNS[[0]] * 1000), [0]),
    "an unknown codec": (window(0, 3, [0], columns=COLUMNS[[0]] * [1, 1, 0] + [0, 0, 7]), [0]),
}


@pytest.mark.parametrize("bad", list(BAD))
def test_a_bad_window_is_invalid_alone(bad):
    item, refs = BAD[bad]
    seq = decode([HONEST[0][0], item, HONEST[1][0]], [HONEST[0][1], refs, HONEST[1][1]])
    assert seq.valid.tolist() == [True, False, True], bad
    check_consistent(seq)
    np.testing.assert_array_equal(seq.fields["obs"][2, :, 0], [2 + 4, 3 + 4, 4 + 4, 5 + 4, 6 + 4])


def test_corrupt_frames_make_their_windows_invalid_never_read_outside():
    data, offsets = P.pack_items([w for w, _ in HONEST])
    fc = P.pack_chunks(CHUNKS, [r for _, r in HONEST])
    outs = [np.zeros((3, T), np.int64), np.zeros((3, T, 2), np.float32)]  # act, obs: path order

    def run(**frames):
        args = dict(
            data=data,
            offsets=offsets,
            item_chunks=fc.item_chunks,
            item_chunk_offsets=fc.item_chunk_offsets,
            chunk_data=fc.chunk_data,
            chunk_offsets=fc.chunk_offsets,
        )
        args.update(frames)
        mask = np.ones((3, T), dtype=bool)
        ok, rows = native_decode(fingerprint=FP, outs=outs, mask=mask, window=T, **args)
        assert not mask[ok == 0].any() and (rows[ok == 0] == 0).all()
        return ok.tolist()

    assert run() == [1, 1, 1]
    assert run(offsets=np.array([0, len(data) + 1, 0, 0], np.uint64)) == [0, 0, 0]
    assert run(offsets=offsets + np.uint64(1)) == [0, 0, 0]
    assert run(item_chunk_offsets=np.array([0, 2, 1, 5], np.uint64)) == [1, 0, 0]
    assert run(item_chunk_offsets=np.array([0, 2, 4, 99], np.uint64)) == [1, 1, 0]
    assert run(chunk_offsets=np.array([0, 10**9, 0, len(fc.chunk_data)], np.uint64))[:2] == [0, 0]
    assert run(chunk_data=bytes(memoryview(fc.chunk_data))[:-1]) == [1, 0, 0]  # chunk 2 runs past its frame
    with pytest.raises(ValueError, match="one offset per item"):
        run(item_chunk_offsets=np.array([0, 2], np.uint64))
    outs[1] = np.zeros((2, T, 2), np.float32)  # not one row per window
    with pytest.raises(ValueError, match=r"outs\[1\] must be"):
        run()


U64 = st.one_of(st.integers(0, 12), st.sampled_from([2**24, 2**32, 2**63, 2**64 - 1]))


@st.composite
def hostile_items(draw):
    refs = draw(st.lists(st.integers(0, 4), min_size=0, max_size=3))
    steps = [draw(st.one_of(st.just(COUNTS[c]), U64)) if c < len(CHUNKS) else draw(U64) for c in refs]
    columns = np.array([COLUMNS[c] if c < len(CHUNKS) else COLUMNS[0] for c in refs], dtype=np.uint64)
    columns = columns.reshape(len(refs), 2, 3)
    if refs and draw(st.booleans()):
        c, f, j = draw(st.integers(0, len(refs) - 1)), draw(st.integers(0, 1)), draw(st.integers(0, 2))
        columns[c, f, j] = draw(U64)
    head = {k: draw(st.one_of(st.just(v), U64)) for k, v in {"fp": FP, "first": 0, "rows": 3, "t": T}.items()}
    blob = W.encode_window_item(head["fp"] % 2**64, head["first"], head["rows"], head["t"], steps, columns)
    cut = draw(st.one_of(st.just(len(blob)), st.integers(0, len(blob) + 8)))
    blob = (blob + draw(st.binary(min_size=8, max_size=8)))[:cut]
    return blob, refs


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(hostile_items(), st.sampled_from(HONEST)), min_size=1, max_size=5))
def test_arbitrary_window_items_never_raise(batch):
    items, refs = [b for b, _ in batch], [r for _, r in batch]
    seq = decode(items, refs)
    check_consistent(seq)
    if all(window in HONEST for window in batch):  # else a hostile window may decide the batch's structure or t
        ref = decode(items, refs, native=False)
        assert seq.valid.all() and ref.valid.all()
        for path in ("obs", "act"):
            np.testing.assert_array_equal(seq.fields[path], ref.fields[path])
