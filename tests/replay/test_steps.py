"""Step chunks and sequence items (apexrl.replay.wire.steps) without a server: the decoder against a reference
built from the steps (hypothesis over episode lengths, item ranges and chunk lengths), the native copy
(apexrl._core.decode_steps) equal to the numpy one, and damaged items marked invalid by both, never read out of
bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import steps as S


def step(t: int) -> dict:
    return {
        "obs": {"img": np.full((3, 2), t % 256, np.uint8), "x": np.array([t, -t], np.float32)},
        "r": np.float64(t / 2),
        "zero": np.zeros((0,), np.int32),
    }


def build(length: int, chunk_length: int, items: list[tuple[int, int]], t_max: int):
    """Chunks of `chunk_length` steps of an episode of `length` steps, and items (first, n) over them: the bytes
    a SAMPLE reply would carry (items, one chunk buffer, each item's references)."""
    leaves = [S.flatten(step(t)) for t in range(length)]
    fields = S.structure_of(leaves[0])
    fp = S.structure_fingerprint(fields)
    starts = list(range(0, length, chunk_length))
    chunks = [
        S.encode_chunk(fields, [np.stack([lv[f.path] for lv in leaves[s : s + chunk_length]]) for f in fields], fp)
        for s in starts
    ]
    blobs, refs = [], []
    for first, n in items:
        cs = [c for c, s in enumerate(starts) if s < first + n and s + chunk_length > first]
        blobs.append(S.encode_item(fp, first - starts[cs[0]], n, t_max, {"first": np.int64(first)}))
        refs.append(cs)
    fc = P.pack_chunks(chunks, refs)
    return blobs, fc


def decode(blobs, fc, native: bool):
    return S.decode_sequences(
        blobs,
        fc.chunks(),
        [fc.refs(i) for i in range(len(blobs))],
        chunk_data=fc.chunk_data,
        chunk_offsets=fc.chunk_offsets,
        native=native,
    )


def check(seq, items, t_max):
    assert seq.valid.all()
    assert seq.mask.shape == (len(items), t_max)
    for i, (first, n) in enumerate(items):
        assert seq.mask[i].tolist() == [True] * n + [False] * (t_max - n)
        assert int(seq.extras["first"][i]) == first
        for j in range(t_max):
            want = step(first + j) if j < n else None
            got_img = seq.fields["obs"]["img"][i, j]
            if want is None:
                assert not got_img.any() and seq.fields["r"][i, j] == 0
            else:
                np.testing.assert_array_equal(got_img, want["obs"]["img"])
                np.testing.assert_array_equal(seq.fields["obs"]["x"][i, j], want["obs"]["x"])
                assert seq.fields["r"][i, j] == want["r"]
        assert seq.fields["zero"].shape[1:] == (t_max, 0)


@settings(max_examples=60, deadline=None)
@given(st.data(), st.integers(1, 40), st.integers(1, 9), st.integers(1, 12))
def test_decoded_sequences_match_the_steps_natively_and_in_numpy(data, length, chunk_length, t_max):
    items = data.draw(
        st.lists(
            st.integers(0, length - 1).flatmap(
                lambda first: st.tuples(st.just(first), st.integers(1, min(t_max, length - first)))
            ),
            min_size=1,
            max_size=6,
        )
    )
    blobs, fc = build(length, chunk_length, items, t_max)
    for native in (False, True):
        check(decode(blobs, fc, native), items, t_max)


@pytest.mark.parametrize("native", [False, True])
def test_damaged_items_are_invalid_and_their_neighbours_decode(native):
    items = [(0, 4), (2, 5), (5, 3)]
    blobs, fc = build(10, 3, items, 6)
    bad = list(blobs)
    # Item 1 claims steps past its chunks; item 2's header is cut.
    meta, extras = S.decode_item(blobs[1])
    bad[1] = S.encode_item(meta["fp"], meta["first"] + 4, meta["n"], meta["t"], extras)
    bad[2] = blobs[2][:-3]
    seq = decode(bad, fc, native)
    assert seq.valid.tolist() == [True, False, False]
    assert seq.mask[1:].sum() == 0 and not seq.fields["obs"]["img"][1:].any()
    check(S.SequenceBatch(seq.fields, seq.mask[:1], seq.extras, seq.valid[:1], seq.num_steps[:1]), items[:1], 6)


@pytest.mark.parametrize("native", [False, True])
def test_a_corrupted_chunk_marks_the_items_that_use_it(native):
    items = [(0, 3), (3, 3), (1, 4)]
    blobs, fc = build(6, 3, items, 4)
    data = bytearray(fc.chunk_data)
    # Garble chunk 1's compressed image column (the header stays readable): items 1 and 2 read it, item 0 does not.
    start, end = int(fc.chunk_offsets[1]), int(fc.chunk_offsets[2])
    _k, _fp, fields, _key = S._chunk_header(memoryview(bytes(data[start:end])))
    _dt, _shape, codec, stored, at = fields["obs.img"]
    for b in range(start + at, start + at + stored):
        data[b] ^= 0xFF
    broken = P.FrameChunks(fc.item_chunks, fc.item_chunk_offsets, bytes(data), fc.chunk_offsets)
    seq = decode(blobs, broken, native)
    if codec == 0:  # stored raw: garbled values, still well-formed
        assert seq.valid.all()
    else:
        assert seq.valid.tolist() == [True, False, False]
    check(S.SequenceBatch(seq.fields, seq.mask[:1], seq.extras, seq.valid[:1], seq.num_steps[:1]), items[:1], 4)


def test_structure_and_fingerprint_are_stable():
    fields = S.structure_of(S.flatten(step(0)))
    assert [f.path for f in fields] == ["obs.img", "obs.x", "r", "zero"]
    assert S.structure_fingerprint(fields) == S.structure_fingerprint(S.structure_of(S.flatten(step(5))))
    other = S.structure_of(S.flatten({**step(0), "r": np.float32(0)}))
    assert S.structure_fingerprint(other) != S.structure_fingerprint(fields)
    with pytest.raises(ValueError, match="numeric or bool"):
        S.flatten({"a": np.array(["x"])})
    with pytest.raises(ValueError, match="not an ASCII identifier"):
        S.flatten({"a/b": 1})


def test_a_writer_request_keeps_its_stored_chunks_on_one_shard():
    from apexrl.replay.client.trajectory import TrajectoryWriter, _Chunk, _Pending

    def key(shard: int, cid: int) -> int:
        return (1 << 16 | 1) << 36 | cid << 8 | shard

    a, b, c, d = (_Chunk(i, 1, bytes([i])) for i in range(4))
    a.keys["t"], b.keys["t"], c.keys["t"] = key(2, 0), key(2, 1), key(5, 0)
    items = [_Pending(1.0, b"x", [a, b]), _Pending(1.0, b"y", [b, c, d])]
    new, refs = TrajectoryWriter._plan("t", items)
    # Shard 2 holds two of the three stored chunks: c (shard 5) is sent again, with d, the new one.
    assert new == [c, d] and "t" not in c.keys
    assert refs == [[key(2, 0), key(2, 1)], [key(2, 1), 0, 1]]
    # Keys of another table are not this request's business.
    d.keys["other"] = key(7, 0)
    new, refs = TrajectoryWriter._plan("t", [_Pending(1.0, b"z", [d])])
    assert new == [d] and refs == [[0]]
