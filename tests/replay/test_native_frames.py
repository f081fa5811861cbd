"""The native frame-stack rebuild (FrameStackCodec.decode_valid_into, FrameBatchDecoder) against the Python
reference FrameStackCodec.decode_valid: the same stacks and fields, the same bad-item mask and the same first
message on random batches with corrupted chunks (size prefixes, lz4 bytes, truncation), frame references and
chunk lists (a differential test); and a PrefetchingSampler with FrameBatchDecoder over a real replay server."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.codec import TransitionSpec
from apexrl.replay.wire.frames import FrameBatchDecoder, FrameStackCodec


def stacked_batch(
    spec: TransitionSpec, rng: np.random.Generator, envs: int, steps: int, episode: int
) -> dict[str, np.ndarray]:
    """Transitions of `envs` interleaved frame streams, episodes of `episode` steps (zero-padded first stacks)."""
    s, h, w = spec["obs"].shape
    obs, nxt = [], []
    for _ in range(envs):
        history: list[np.ndarray] = []
        for t in range(steps):
            if t % episode == 0:
                history = []
            history.append(rng.integers(1, 4, (h, w), dtype=np.uint8))
            if len(history) < 2:
                continue
            for out, frames in ((obs, history[:-1]), (nxt, history)):
                stack = np.zeros((s, h, w), np.uint8)
                tail = frames[-s:]
                stack[s - len(tail) :] = tail
                out.append(stack)
    n = len(obs)
    return {
        "obs": np.array(obs, np.uint8).reshape(n, s, h, w),
        "action": rng.integers(0, 6, n).astype(np.int32),
        "reward": rng.standard_normal(n).astype(np.float32),
        "discount": np.full(n, 0.9, np.float32),
        "next_obs": np.array(nxt, np.uint8).reshape(n, s, h, w),
    }


def rechunk(fc: P.FrameChunks, chunks: list[bytes]) -> P.FrameChunks:
    data, offsets = P.pack_items(chunks)
    return fc._replace(chunk_data=data, chunk_offsets=offsets)


@st.composite
def corrupted(
    draw: st.DrawFn, codec: FrameStackCodec, data: np.ndarray, offsets: np.ndarray, fc: P.FrameChunks
) -> tuple[np.ndarray, P.FrameChunks, int]:
    data = data.copy()
    chunks = [bytes(c) for c in fc.chunks()]
    item_chunks = np.array(fc.item_chunks, np.uint64)
    n = len(offsets) - 1
    damage = draw(st.integers(0, 3))
    for _ in range(damage):
        kind = draw(st.sampled_from(["prefix", "frames", "flip", "truncate", "ref", "chunk_list", "item"]))
        event(kind)
        if kind in ("prefix", "frames", "flip", "truncate") and chunks:
            c = draw(st.integers(0, len(chunks) - 1))
            raw = bytearray(chunks[c])
            if kind == "prefix":  # any u32
                raw[:4] = draw(st.integers(0, 2**32 - 1)).to_bytes(4, "little")
            elif kind == "frames":  # a whole number of frames, possibly more than 255 or other than held
                raw[:4] = (draw(st.integers(0, 260)) * codec.frame_bytes).to_bytes(4, "little")
            elif not raw:  # an earlier damage cut this chunk to nothing: nothing left to flip or cut
                pass
            elif kind == "flip":
                for _ in range(draw(st.integers(1, 3))):
                    raw[draw(st.integers(0, len(raw) - 1))] ^= draw(st.integers(1, 255))
            else:
                del raw[len(raw) - draw(st.integers(1, len(raw))) :]
            chunks[c] = bytes(raw)
        elif kind == "ref" and n:  # one u16 reference of one stack of one item (raw field at a known place)
            i, k, j = draw(st.integers(0, n - 1)), draw(st.integers(0, 1)), draw(st.integers(0, codec.stack - 1))
            at = int(offsets[i]) + 4 + (0 if k == 0 else 2 * codec.stack + 12) + 2 * j
            value = draw(
                st.one_of(st.integers(0, 0xFFFF), st.integers(0, 3).map(lambda x: x << 8 | 0), st.just(0xFFFF))
            )
            data[at : at + 2] = np.frombuffer(value.to_bytes(2, "little"), np.uint8)
        elif kind == "chunk_list" and item_chunks.size:
            at = draw(st.integers(0, item_chunks.size - 1))
            item_chunks[at] = draw(st.one_of(st.integers(0, len(chunks) + 2), st.integers(2**63, 2**64 - 1)))
        elif kind == "item" and n:  # an item's own bytes (fingerprint, fields): the item decoder marks it
            at = draw(st.integers(int(offsets[0]), int(offsets[-1]) - 1))
            data[at] ^= draw(st.integers(1, 255))
    return data, rechunk(fc._replace(item_chunks=item_chunks), chunks), damage


@settings(max_examples=250, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_native_rebuild_equals_python_decode_valid_on_corrupted_batches(data: st.DataObject) -> None:
    depth = data.draw(st.sampled_from([1, 2, 4]))
    spec = TransitionSpec.atari(depth, 5, 6)
    codec = FrameStackCodec(spec, chunk_frames=data.draw(st.sampled_from([1, 3, 8])))
    rng = np.random.default_rng(data.draw(st.integers(0, 2**32 - 1)))
    batch = stacked_batch(
        spec, rng, data.draw(st.integers(1, 3)), data.draw(st.integers(1, 12)), data.draw(st.integers(2, 7))
    )
    encoded, offsets, fc = codec.encode(batch)
    items, chunks, damage = data.draw(corrupted(codec, encoded, offsets, fc))
    n = len(offsets) - 1
    out = codec.empty_batch(n + data.draw(st.integers(0, 2)))
    for a in out.values():  # stale rows from an earlier batch must not leak into the result
        a.view(np.uint8)[...] = 0xAB
    want, want_bad, want_message = codec.decode_valid(items, offsets, chunks)
    got, bad, message = codec.decode_valid_into(items, offsets, chunks, out)
    event("bad items" if want_bad is not None else "all good")
    assert message == want_message
    assert (bad is None) == (want_bad is None)
    if bad is not None:
        assert np.array_equal(bad, want_bad)
    assert list(got) == list(want) == list(spec.names)
    for name in spec.names:
        assert got[name].dtype == want[name].dtype and np.array_equal(got[name], want[name]), name
    if not damage:  # and both are what was encoded
        for name in spec.names:
            assert np.array_equal(got[name], batch[name]), name


def test_decode_valid_into_refuses_outputs_that_do_not_fit():
    spec = TransitionSpec.atari(2, 5, 6)
    codec = FrameStackCodec(spec)
    batch = stacked_batch(spec, np.random.default_rng(0), 1, 6, 10)
    data, offsets, fc = codec.encode(batch)
    with pytest.raises(ValueError, match="out lacks the arrays"):
        codec.decode_valid_into(data, offsets, fc, spec.empty_batch(10))
    small = codec.empty_batch(2)
    with pytest.raises(ValueError, match="out\\['obs'\\]: expected a writable C-contiguous uint8 array"):
        codec.decode_valid_into(data, offsets, fc, small)
    from apexrl._core import rebuild_frame_stacks

    u64 = np.zeros(2, np.uint64)
    with pytest.raises(ValueError, match="not an item"):
        rebuild_frame_stacks(
            2,
            30,
            np.array([1], np.int64),
            [np.zeros((1, 2), np.uint16)] * 2,
            u64[:0],
            u64,
            b"",
            u64[:1],
            [np.zeros(60, np.uint8)] * 2,
        )


def test_sampler_with_frame_batch_decoder_rebuilds_inserted_stacks(start_server):
    """The learner's path: a PrefetchingSampler over a real server, 2 decode threads rebuilding natively into
    the ring; every sampled stack equals the one inserted under its key."""
    spec = TransitionSpec.atari(4, 12, 10)
    codec = FrameStackCodec(spec)
    server = start_server("--capacity", "10000", "--shards", "2", "--spec", codec.item_spec.to_json())
    expected = {}
    with ReplayClient(server.endpoint, spec=codec.item_spec) as client:
        for seed in range(3):
            batch = stacked_batch(spec, np.random.default_rng(seed), 3, 20, 9)
            data, offsets, fc = codec.encode(batch)
            keys = client.insert(np.ones(len(offsets) - 1), data=data, offsets=offsets, chunks=fc)
            for i, key in enumerate(keys.tolist()):
                expected[key] = {name: batch[name][i] for name in spec.names}
        sampler = client.sampler(
            64, prefetch=4, timeout=1.0, decoder=FrameBatchDecoder(codec, 64, valid=True), decode_threads=2
        )
        try:
            for _ in range(8):
                b = sampler.next(timeout=60)
                fields, bad, message = b.decoded
                assert bad is None, message
                for i, key in enumerate(b.keys.tolist()):
                    for name in spec.names:
                        assert np.array_equal(fields[name][i], expected[key][name]), (key, name)
        finally:
            sampler.close()


def test_the_learner_decode_hook_rebuilds_atari_batches_natively(start_server, tmp_path):
    """The real learner (DQN on Pong's spec, in-process) over a real server: its sampler hook decodes items with
    frame chunks into the ring of preallocated batches, and the stacks are the inserted ones."""
    from apexrl.envs import atari

    if not atari.available():
        pytest.skip("ale-py is not installed")
    from apexrl.apex.config import LearnerConfig
    from apexrl.apex.learner import Learner
    from apexrl.replay.wire.frames import frame_codec

    spec = TransitionSpec.atari()
    codec = frame_codec(spec)
    server = start_server("--capacity", "10000", "--shards", "2", "--spec", codec.item_spec.to_json())
    expected = {}
    with ReplayClient(server.endpoint, spec=codec.item_spec) as client:
        batch = stacked_batch(spec, np.random.default_rng(7), 2, 40, 15)
        data, offsets, fc = codec.encode(batch)
        for i, key in enumerate(
            client.insert(np.ones(len(offsets) - 1), data=data, offsets=offsets, chunks=fc).tolist()
        ):
            expected[key] = {name: batch[name][i] for name in spec.names}
    learner = Learner(
        LearnerConfig(
            agent="dqn", env="atari:Pong", replay=server.endpoint, run_dir=str(tmp_path / "run"), device="cpu"
        )
    )
    try:
        hook = learner._decode_hook()
        assert set(hook) == {"decoder"}  # a ring of preallocated batches, not a Python decode callable
        sampler = learner.replay.sampler(64, prefetch=2, timeout=1.0, decode_threads=2, **hook)
        try:
            b = sampler.next(timeout=60)
        finally:
            sampler.close()
        fields, bad, message, invalid, _why = b.decoded
        assert bad is None and invalid is None, message
        for i, key in enumerate(b.keys.tolist()):
            for name in spec.names:
                assert np.array_equal(fields[name][i], expected[key][name]), (key, name)
    finally:
        learner.close()
