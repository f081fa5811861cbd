"""The TrajectoryWriter through real replay servers on 127.0.0.1.

Steps go to the server once in step chunks that outlive one INSERT; items reference them by chunk key; a chunk
that is gone (its items evicted, the server restarted) is refused with STALE_CHUNKS and sent again by the writer,
so no item ever has a hole. Every sampled sequence is checked against a reference built from the appended steps:
each step's values are a function of (episode, t), and each item carries its own (episode, first step, length) as
extras, so a sampled item names what it must hold.
"""

from __future__ import annotations

import json
import time

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apexrl.errors import ServerError, StaleChunksError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import steps as S
from apexrl.replay.wire.schema import Status


def step(ep: int, t: int) -> dict:
    """The step t of episode ep: nested, several dtypes (a uint8 image, floats, an int, a bool)."""
    return {
        "obs": {
            "image": np.random.default_rng(ep * 100_000 + t).integers(0, 256, (16, 16), dtype=np.uint8),
            "vec": np.array([ep, t, ep * t], np.float32),
        },
        "t": np.int64(t),
        "done": np.bool_(t % 3 == 0),
    }


def extras(ep: int, first: int, n: int) -> dict:
    return {"who": np.array([ep, first, n], np.int64), "state": {"h": np.full(3, ep + first / 8, np.float64)}}


def check_batch(batch, max_len: int) -> int:
    """Every item of a sampled batch against its reference; returns how many were checked."""
    seq = batch.sequences
    assert seq is not None and seq.valid.all()
    n = len(batch)
    assert batch.mask.shape == (n, max_len)
    for i in range(n):
        ep, first, length = (int(v) for v in batch.extras["who"][i])
        assert batch.mask[i].tolist() == [True] * length + [False] * (max_len - length)
        np.testing.assert_array_equal(batch.extras["state"]["h"][i], np.full(3, ep + first / 8))
        for j in range(max_len):
            if j < length:
                want = step(ep, first + j)
                np.testing.assert_array_equal(batch.fields["obs"]["image"][i, j], want["obs"]["image"])
                np.testing.assert_array_equal(batch.fields["obs"]["vec"][i, j], want["obs"]["vec"])
                assert batch.fields["t"][i, j] == first + j
                assert batch.fields["done"][i, j] == want["done"]
            else:  # padding
                assert not batch.fields["obs"]["image"][i, j].any() and batch.fields["t"][i, j] == 0
    return n


def write_episode(w, ep: int, length: int, seq_len: int, period: int, table: str = "default") -> list[tuple]:
    """Appends an episode; an item of the last min(seq_len, t) steps every `period` steps and at its end."""
    made = []
    for t in range(length):
        w.append(step(ep, t))
        if (t + 1) % period == 0 or t + 1 == length:
            n = min(seq_len, t + 1)
            w.create_item(table, n, 1.0, extras(ep, t + 1 - n, n))
            made.append((ep, t + 1 - n, n))
    w.end_episode()
    return made


def test_overlapping_items_store_each_step_once(start_server):
    # R2D2's shape scaled down: items of 12 steps, a new one every 4 steps: each step in about 3 items.
    server = start_server("--capacity", "100000")
    with ReplayClient(server.endpoint) as client:
        with client.writer(max_sequence_length=12, chunk_length=4) as w:
            made = []
            for ep in range(3):
                made += write_episode(w, ep, 50, 12, 4)
            w.flush()
            sent = w.chunk_bytes_sent + w.item_bytes_sent
            assert w.chunks_resent == 0
        stats = client.tables()["default"]
        assert stats["size"] == len(made)
        # Stored once: what the table holds is what the writer sent, not 3x the steps.
        assert stats["bytes_held"] == sent
        # Each item storing its own steps would hold about 3x that (each step is in about 3 items).
        own = sum(len(S.encode_chunk(*_columns([step(ep, t) for t in range(f, f + n)]))) for ep, f, n in made)
        assert stats["bytes_held"] * 2 < own
        checked = 0
        for _ in range(5):
            checked += check_batch(client.sample(32), 12)
        assert checked == 160


def _columns(steps: list[dict]):
    leaves = [S.flatten(s) for s in steps]
    fields = S.structure_of(leaves[0])
    return fields, [np.stack([lv[f.path] for lv in leaves]) for f in fields], S.structure_fingerprint(fields)


def test_eviction_frees_chunks_and_the_writer_sends_them_again(start_server):
    server = start_server("--capacity", "2", "--max-size", "2", "--shards", "1")
    with ReplayClient(server.endpoint) as client:
        w = client.writer(max_sequence_length=8, chunk_length=4, flush_items=1)
        for t in range(8):
            w.append(step(0, t))
        w.create_item("default", 8, 1.0, extras(0, 0, 8))  # chunks [0, 4) and [4, 8) stored
        held = client.stats()
        assert held["chunks"] == 2
        # Two items of other episodes push it out (FIFO, capacity 2): its chunks go with it.
        w2 = client.writer(max_sequence_length=2, flush_items=1)
        for ep in (1, 2):
            write_episode(w2, ep, 2, 2, 2)
        w2.close()
        stats = client.stats()
        assert stats["size"] == 2 and stats["chunks"] == 2  # the two small items' chunks only
        # The writer's next item of the same episode needs the steps of the evicted chunk [4, 8): STALE_CHUNKS,
        # then sent again with the item, which is stored whole.
        w.append(step(0, 8))
        w.create_item("default", 6, 1.0, extras(0, 3, 6))
        assert w.chunks_resent >= 1
        w.close()
        batch = client.sample(16)
        assert check_batch(batch, 8) == 16
        assert {tuple(int(v) for v in batch.extras["who"][i]) for i in range(16)} <= {(0, 3, 6), (2, 0, 2)}


def test_a_stale_chunk_key_is_refused_whole_naming_it(start_server):
    server = start_server("--capacity", "100")
    with ReplayClient(server.endpoint) as client:
        chunks = P.pack_chunks([b"x" * 10], [[0]])
        keys1, chunk_keys = client._insert_with_chunk_keys([1.0], [b"item"], chunks=chunks)
        assert chunk_keys.shape == (1,)
        key = int(chunk_keys[0])
        # Referenced by key while its item lives: stored once.
        keys2, none = client._insert_with_chunk_keys([1.0], [b"item2"], chunks=P.pack_chunks([], [[key]]))
        assert none.shape == (0,)
        assert client.stats()["chunks"] == 1 and client.stats()["bytes_held"] == 10 + 4 + 5
        assert client.erase(np.concatenate([keys1, keys2])) == 2
        assert client.stats()["size"] == 0 and client.stats()["chunks"] == 0
        before = client.stats()
        with pytest.raises(StaleChunksError) as e:
            client._insert_with_chunk_keys([1.0], [b"item3"], chunks=P.pack_chunks([b"y"], [[0, key]]))
        assert e.value.status == Status.STALE_CHUNKS and e.value.keys == [key]
        after = client.stats()
        assert after["size"] == before["size"] == 0 and after["chunks"] == 0
        # Not a chunk key at all: INVALID_ARGUMENT at once.
        with pytest.raises(ServerError) as bad:
            client._insert_with_chunk_keys([1.0], [b"item4"], chunks=P.pack_chunks([], [[12345]]))
        assert bad.value.status == Status.INVALID_ARGUMENT and "nor a chunk key" in bad.value.message


@pytest.mark.parametrize("snapshot", [False, True])
def test_server_restart_mid_episode_leaves_no_hole(start_server, tmp_path, snapshot):
    args = ["--capacity", "10000"]
    if snapshot:
        args += ["--snapshot", str(tmp_path / "replay.snap")]
    server = start_server(*args)
    port = server.endpoint.rsplit(":", 1)[1]
    client = ReplayClient(server.endpoint, timeout=2.0)
    w = client.writer(max_sequence_length=10, chunk_length=3, flush_items=1)
    made = []
    for t in range(20):
        w.append(step(5, t))
        if (t + 1) % 5 == 0:
            w.create_item("default", 10 if t >= 9 else t + 1, 1.0, extras(5, max(0, t - 9), min(10, t + 1)))
            made.append(t)
    w.flush()
    if snapshot:
        server.proc.terminate()  # graceful: the snapshot is written on exit
        server.proc.wait(30)
    else:
        server.kill9()
    server = start_server(*args, port=int(port))
    # The writer goes on in the same episode: its next items reference chunks the new server may not hold.
    for t in range(20, 35):
        w.append(step(5, t))
        if (t + 1) % 5 == 0:
            w.create_item("default", 10, 1.0, extras(5, t - 9, 10))
    deadline = time.monotonic() + 60
    while True:
        try:
            w.flush(timeout=30)
            break
        except Exception:
            if time.monotonic() > deadline:
                raise
    # Restored from the snapshot, the chunks keep their keys (nothing to send again); without one, every chunk
    # the next items reference is gone and sent again.
    assert (w.chunks_resent == 0) if snapshot else (w.chunks_resent > 0)
    w.close()
    size = client.stats()["size"]
    assert size == (7 if snapshot else 3)
    for _ in range(3):
        check_batch(client.sample(16), 10)
    client.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    lengths=st.lists(st.integers(1, 25), min_size=1, max_size=3),
    seq_len=st.integers(1, 12),
    period=st.integers(1, 6),
    chunk_length=st.integers(1, 8),
)
def test_sampled_sequences_match_the_appended_steps(start_server, lengths, seq_len, period, chunk_length):
    server = start_server("--capacity", "100000", "--shards", "3")
    with ReplayClient(server.endpoint) as client:
        with client.writer(max_sequence_length=seq_len, chunk_length=chunk_length, flush_items=3) as w:
            made = []
            for ep, length in enumerate(lengths):
                made += write_episode(w, ep, length, seq_len, period)
        assert client.stats()["size"] == len(made)
        seen = set()
        for _ in range(4):
            batch = client.sample(3 * len(made))
            check_batch(batch, seq_len)
            seen.update(tuple(int(v) for v in batch.extras["who"][i]) for i in range(len(batch)))
        assert seen <= set(made)
    server.kill()


def test_a_step_of_another_structure_is_refused_naming_the_field(start_server):
    server = start_server()
    with ReplayClient(server.endpoint) as client:
        w = client.writer(max_sequence_length=4)
        w.append(step(0, 0))
        bad = step(0, 1)
        bad["obs"]["vec"] = np.zeros(4, np.float32)
        with pytest.raises(ValueError, match="obs.vec"):
            w.append(bad)
        missing = step(0, 1)
        del missing["done"]
        with pytest.raises(ValueError, match="done"):
            w.append(missing)
        with pytest.raises(ValueError, match="num_timesteps"):
            w.create_item("default", 2, 1.0)
        w.append(step(0, 1))
        w.create_item("default", 2, 1.0, extras(0, 0, 2))
        w.close()
        assert check_batch(client.sample(4), 4) == 4


def test_items_in_two_tables_share_the_steps_each_table_once(start_server, tmp_path):
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps([{"name": "prio", "sampler": "prioritized"}, {"name": "uni", "sampler": "uniform"}]))
    server = start_server("--tables", str(tables))
    with ReplayClient(server.endpoint) as client:
        with client.writer(max_sequence_length=6, chunk_length=3) as w:
            for t in range(12):
                w.append(step(1, t))
                if t >= 5:
                    w.create_item("prio", 6, 1.0, extras(1, t - 5, 6))
                if t % 4 == 3:
                    w.create_item("uni", 4, 1.0, extras(1, t - 3, 4))
        t = client.tables()
        assert t["prio"]["size"] == 7 and t["uni"]["size"] == 3
        check_batch(client.sample(8, table="prio"), 6)
        check_batch(client.sample(8, table="uni"), 6)


def test_pending_items_over_the_request_limit_go_in_smaller_requests(start_server):
    server = start_server("--max-message-mb", "1", "--max-reply-mb", "64")
    rng = np.random.default_rng(3)
    with ReplayClient(server.endpoint) as client:
        with client.writer(max_sequence_length=4, chunk_length=4, flush_items=8) as w:
            for t in range(32):  # 100 KB of noise a step: 8 items of 4 new steps are 3.2 MB together
                w.append({"noise": rng.integers(0, 256, 100_000, dtype=np.uint8), "t": np.int64(t)})
                if t % 4 == 3:
                    w.create_item("default", 4, 1.0)
        assert client.stats()["size"] == 8
        batch = client.sample(16)
        assert batch.mask.all()
        for i in range(16):
            first = int(batch.fields["t"][i, 0])
            assert batch.fields["t"][i].tolist() == list(range(first, first + 4)) and first % 4 == 0


def test_a_retried_insert_gets_its_item_and_chunk_keys_back_and_stores_once(start_server):
    server = start_server()
    with ReplayClient(server.endpoint) as client:
        insert_id = client.next_insert_id()
        chunks = P.pack_chunks([b"c0" * 50, b"c1" * 50], [[0, 1], [1]])
        first = client._insert_with_chunk_keys([1.0, 2.0], [b"i0", b"i1"], chunks=chunks, insert_id=insert_id)
        again = client._insert_with_chunk_keys([1.0, 2.0], [b"i0", b"i1"], chunks=chunks, insert_id=insert_id)
        assert first[0].tolist() == again[0].tolist() and first[1].tolist() == again[1].tolist()
        stats = client.stats()
        assert stats["size"] == 2 and stats["chunks"] == 2


def test_an_item_created_without_a_priority_gets_the_tables_largest(start_server):
    # priority None, as insert(None, ...): the server gives the table's largest priority so far. Items with and
    # without priorities may alternate; each request carries one kind.
    server = start_server("--capacity", "1000", "--alpha", "1.0")
    with ReplayClient(server.endpoint) as client:
        with client.writer(max_sequence_length=4, flush_items=3) as w:
            for t in range(12):
                w.append(step(0, t))
                if t >= 3:
                    w.create_item("default", 4, 5.0 if t == 3 else None, extras(0, t - 3, 4))
            w.flush()
        assert client.tables()["default"]["size"] == 9
        batch = client.sample(64)
        # Every item at 5.0: uniform draws under alpha 1.
        np.testing.assert_allclose(batch.probabilities, 1.0 / 9)
        assert check_batch(batch, 4) == 64


def test_an_item_without_a_priority_gets_the_tables_largest(start_server):
    server = start_server("--alpha", "1.0")
    with ReplayClient(server.endpoint) as client:
        with client.writer(max_sequence_length=2, flush_items=2) as w:
            for t in range(8):
                w.append(step(0, t))
                if t % 2 == 1:  # priorities 5, None, None, 2: requests of one kind each (5 | None, None | 2)
                    w.create_item("default", 2, {1: 5.0, 3: None, 5: None, 7: 2.0}[t], extras(0, t - 1, 2))
        batch = client.sample(64)
        by_first = {int(batch.extras["who"][i][1]): float(batch.probabilities[i]) for i in range(len(batch))}
        assert by_first.keys() == {0, 2, 4, 6}
        # Masses 5, 5, 5, 2 (alpha 1): the items without a priority took the largest so far, 5.
        assert by_first[0] == pytest.approx(5 / 17) and by_first[2] == pytest.approx(5 / 17)
        assert by_first[4] == pytest.approx(5 / 17) and by_first[6] == pytest.approx(2 / 17)


@pytest.mark.parametrize("pad", [True, False])
def test_the_sequence_and_episode_adders_through_the_writer_and_a_real_server(start_server, tmp_path, pad):
    from apexrl.replay.adders import EpisodeAdder, SequenceAdder

    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps([{"name": "seq", "sampler": "uniform"}, {"name": "ep", "sampler": "uniform"}]))
    server = start_server("--tables", str(tables))
    with ReplayClient(server.endpoint) as client:
        seq = SequenceAdder(client, "seq", sequence_length=5, period=3, pad_end_of_episode=pad, priority=1.0)
        ep = EpisodeAdder(client, "ep", max_sequence_length=20, priority=1.0)
        for e, length in enumerate((7, 12, 2)):
            for adder in (seq, ep):
                adder.add_first(np.array([e, 0], np.float32))
                for t in range(length):
                    last = t + 1 == length
                    adder.add(np.int64(t), 1.0, np.array([e, t + 1], np.float32), terminated=last, truncated=False)
        seq.close()
        ep.close()
        # Every sampled sequence: consecutive observations of one episode, then (padding) zeros.
        batch = client.sample(64, table="seq")
        assert batch.mask.shape == (64, 5)
        for i in range(64):
            obs = batch.fields["obs"][i]
            real = int(batch.mask[i].sum()) if not pad else int((obs[:, 1] > 0).sum() + (obs[0, 1] == 0))
            steps = obs[:real]
            assert (steps[:, 0] == steps[0, 0]).all()
            assert steps[:, 1].tolist() == list(range(int(steps[0, 1]), int(steps[0, 1]) + real))
            assert not obs[real:].any()
        # Every sampled episode: all its observations, 0 to its end, in order.
        batch = client.sample(32, table="ep")
        for i in range(32):
            n = int(batch.mask[i].sum())
            obs = batch.fields["obs"][i, :n]
            assert n in (8, 13, 3) and obs[:, 1].tolist() == list(range(n)) and (obs[:, 0] == obs[0, 0]).all()


def test_discard_drops_the_pending_items_and_close_sends_nothing(start_server):
    server = start_server()
    with ReplayClient(server.endpoint) as client:
        w = client.writer(max_sequence_length=4, flush_items=100)
        for t in range(6):
            w.append(step(0, t))
            if t >= 3:
                w.create_item("default", 4, 1.0, extras(0, t - 3, 4))
        assert w.pending_items == 3
        assert w.discard() == 3 and w.pending_items == 0
        w.append(step(0, 6))
        w.create_item("default", 4, 1.0, extras(0, 3, 4))  # the episode's steps are still there
        w.close()
        assert client.tables()["default"]["size"] == 1
