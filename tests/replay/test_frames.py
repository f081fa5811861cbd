"""Atari frames stored once (apexrl.replay.wire.frames): the stacks a learner samples are, bit for bit, the stacks the
actor saw, across episode boundaries (zero-padded starts) and interleaved environments.

The end-to-end test plays real ale-py Pong (two games in one vector environment, short episodes so that several
end), turns its steps into n-step transitions, inserts them through a real replay server on 127.0.0.1 as the
actor does (items plus frame chunks, a retry carrying its chunks again) and checks every sampled transition
against what was inserted under its key.
"""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.apex.nstep import NStepBuffer, stack_transitions
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire.codec import TransitionSpec
from apexrl.replay.wire.frames import PAD, FrameStackCodec, decode_valid, frame_codec, wire_spec

SPEC = TransitionSpec.atari(4, 12, 10)  # small frames: the unit tests' stacks are cheap


def synthetic_batch(rng, envs=3, steps=30, n=3, episode=11):
    """Transitions of `envs` interleaved frame streams with episodes of `episode` steps (zero-padded stacks)."""
    buffers = [NStepBuffer(n, 0.9) for _ in range(envs)]
    history = [[] for _ in range(envs)]
    out = []

    def stack(j):
        s = np.zeros((4, 12, 10), np.uint8)
        for i, f in enumerate(history[j][-4:][::-1]):
            s[3 - i] = f
        return s

    def new_frame(j):
        frame = rng.integers(1, 4, (12, 10), dtype=np.uint8) * (j + 1)  # never all zero
        history[j].append(frame)
        return stack(j)

    for j in range(envs):
        buffers[j].add_first(new_frame(j))
    for t in range(steps):
        for j in range(envs):
            ended = (t + 1) % episode == 0
            out += buffers[j].add(int(rng.integers(6)), 1.0, new_frame(j), ended, False)
            if ended:
                history[j].clear()
                buffers[j].add_first(new_frame(j))
    return stack_transitions(out, SPEC)


def test_encode_decode_is_exact_and_stores_each_frame_once():
    rng = np.random.default_rng(1)
    batch = synthetic_batch(rng)
    codec = FrameStackCodec(SPEC, chunk_frames=8)
    data, offsets, fc = codec.encode(batch)
    out = codec.decode(data, offsets, fc)
    for name in SPEC.names:
        assert np.array_equal(out[name], batch[name]), name
    distinct = {f.tobytes() for name in ("obs", "next_obs") for f in batch[name].reshape(-1, 12, 10) if f.any()}
    raw = b"".join(__import__("lz4.block").block.decompress(bytes(c)) for c in fc.chunks())
    assert len(raw) == len(distinct) * 120  # every distinct non-zero frame once
    refs = codec.item_spec.decode(data, offsets)
    assert (refs["obs_frames"] == PAD).any()  # episode starts are zero-padded, and not stored
    assert int(np.diff(fc.item_chunk_offsets).max()) <= 8


def test_a_damaged_chunk_or_reference_marks_its_items_bad_and_keeps_the_rest():
    rng = np.random.default_rng(2)
    batch = synthetic_batch(rng, envs=2, steps=20)
    codec = FrameStackCodec(SPEC, chunk_frames=4)
    data, offsets, fc = codec.encode(batch)
    cut = bytearray(fc.chunk_data)
    cut[0:4] = (10**9).to_bytes(4, "little")  # chunk 0 claims a huge size: refused before any allocation
    fields, bad, message = codec.decode_valid(data, offsets, fc._replace(chunk_data=bytes(cut)))
    users = {i for i in range(len(offsets) - 1) if 0 in fc.refs(i).tolist()}
    assert bad is not None and set(np.flatnonzero(bad)) == users and "frame reference" in message
    keep = ~bad
    for name in SPEC.names:
        assert np.array_equal(fields[name], batch[name][keep])


def test_frame_codec_applies_to_frame_stacks_only():
    assert frame_codec(TransitionSpec.dpg(3, 2)) is None
    assert wire_spec(TransitionSpec.dpg(3, 2)) == TransitionSpec.dpg(3, 2)
    item = wire_spec(TransitionSpec.atari())
    assert item.names == ("obs_frames", "action", "reward", "discount", "next_obs_frames", "frame")
    assert item.fixed_item_bytes == 4 + 8 + 4 + 4 + 4 + 8
    codec = FrameStackCodec.from_item_spec(item)  # the item spec alone (a snapshot's sidecar) is enough
    assert codec is not None and codec.spec == TransitionSpec.atari() and codec.item_spec == item
    assert FrameStackCodec.from_item_spec(TransitionSpec.atari()) is None


@pytest.fixture(scope="module")
def pong():
    from apexrl.envs import atari

    if not atari.available():
        pytest.skip("ale-py is not installed")
    env = atari.AtariVecEnv("Pong", [3, 4], max_episode_frames=240)  # episodes of 60 steps: several end
    yield env
    env.close()


def play(env, steps: int, n: int = 3):
    """n-step transitions of random play, with stack_transitions' arrays (the stacks the actor saw)."""
    rng = np.random.default_rng(0)
    k = env.num_envs
    buffers = [NStepBuffer(n, 0.99) for _ in range(k)]
    obs = env.reset()
    for j in range(k):
        buffers[j].add_first(obs[j])
    out, episodes = [], 0
    for _ in range(steps):
        step = env.step(rng.integers(env.spec.num_actions, size=k))
        for j in range(k):
            ended = bool(step.terminated[j] or step.truncated[j])
            last = step.final_obs[j] if ended else step.obs[j]
            out += buffers[j].add(0, float(step.reward[j]), last, bool(step.terminated[j]), bool(step.truncated[j]))
            if ended:
                episodes += 1
                buffers[j].add_first(step.obs[j])
    return out, episodes


def test_sampled_pong_stacks_equal_the_inserted_ones_across_episodes(pong, start_server):
    spec = TransitionSpec.atari()
    codec = frame_codec(spec)
    transitions, episodes = play(pong, 200)
    assert episodes >= 4
    server = start_server("--capacity", "100000", "--shards", "2", "--spec", codec.item_spec.to_json())
    expected = {}
    with ReplayClient(server.endpoint, spec=codec.item_spec) as client:
        for lo in range(0, len(transitions), 50):  # the actor's flushes: each its own chunks
            batch = stack_transitions(transitions[lo : lo + 50], spec)
            data, offsets, chunks = codec.encode(batch)
            insert_id = client.next_insert_id()
            keys = client.insert(
                np.ones(len(offsets) - 1), data=data, offsets=offsets, chunks=chunks, insert_id=insert_id
            )
            again = client.insert(
                np.ones(len(offsets) - 1), data=data, offsets=offsets, chunks=chunks, insert_id=insert_id
            )  # a retry carries its chunks again and is stored once
            assert again.tolist() == keys.tolist()
            for i, key in enumerate(keys.tolist()):
                expected[key] = {name: batch[name][i] for name in spec.names}
        stats = client.stats()
        assert stats["size"] == len(transitions)
        old_bytes = len(spec.encode(stack_transitions(transitions, spec))[0])
        assert stats["bytes_held"] * 4 < old_bytes  # each frame once, chunks compressed together
        seen = set()
        for _ in range(6):
            sampled = client.sample(128)
            fields, bad, message = decode_valid(spec, codec, sampled)
            assert bad is None, message
            for i, key in enumerate(sampled.keys.tolist()):
                for name in spec.names:
                    assert np.array_equal(fields[name][i], expected[key][name]), (key, name)
                seen.add(key)
        starts = [k for k, t in expected.items() if not t["obs"][0].any()]
        assert any(k in seen for k in starts)  # zero-padded starts were sampled and rebuilt exactly


def test_export_rebuilds_the_stacks_of_an_atari_snapshot(tmp_path):
    """`apexrl export` of a snapshot whose items reference frame chunks: the agent's fields, stacks rebuilt."""
    from apexrl import PrioritizedStore
    from apexrl.offline.export import export_snapshot, load_export
    from apexrl.replay.server.insert_guard import spec_sidecar

    codec = FrameStackCodec(SPEC, chunk_frames=4)
    store = PrioritizedStore(capacity=1000, shards=2)
    batches = [synthetic_batch(np.random.default_rng(seed), envs=2, steps=12) for seed in (5, 6)]
    for batch in batches:
        data, offsets, fc = codec.encode(batch)
        store.insert(
            np.ones(len(offsets) - 1),
            data,
            offsets,
            chunks=fc.chunks(),
            item_chunks=fc.item_chunks,
            item_chunk_offsets=fc.item_chunk_offsets,
        )
    path = str(tmp_path / "replay.snap")
    store.save(path)
    with open(spec_sidecar(path), "w") as f:
        f.write(codec.item_spec.to_json())
    n = export_snapshot(path, str(tmp_path / "replay.npz"))
    z = load_export(str(tmp_path / "replay.npz"))
    assert n == sum(len(b["obs"]) for b in batches) and TransitionSpec.from_json(z["spec"]) == SPEC
    for name in SPEC.names:  # oldest first: the batches in insertion order
        assert np.array_equal(z[name], np.concatenate([b[name] for b in batches])), name
