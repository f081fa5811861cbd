"""Trajectories through a sharded replay: ShardedReplayClient.writer keeps each writer on
one server, the set's samples of a sequence table carry the sequences, and ReplayDataset(decode="structure")
yields them, from one server and from several (real servers on 127.0.0.1).

Every sampled sequence is checked against the steps appended (tests/server/test_trajectory_writer.py: a step's
values are a function of (episode, t); an item's extras name its episode, first step and length). Writer k writes
the episodes 100 * k + e, so a sampled item also names the writer, hence the server, it came from.
"""

from __future__ import annotations

import contextlib
import itertools
from typing import Any

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from apexrl.replay import ReplayDataset
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.client.sharded import ShardedReplayClient, max_lock_shards
from apexrl.replay.server import ReplayServer
from apexrl.replay.server.config import ServerConfig
from tests.helpers import wait_until
from tests.server.test_trajectory_writer import check_batch, step, write_episode


@contextlib.contextmanager
def running(count: int, **config):
    """``count`` in-process replay servers on 127.0.0.1 -> their endpoints; stopped on exit."""
    started: list[ReplayServer] = []
    try:
        for i in range(count):
            started.append(ReplayServer(ServerConfig(port=0, seed=21 + i, **config)).start())
        yield [s.endpoint for s in started]
    finally:
        for server in started:
            server.stop()


def _stats(endpoint: str) -> dict:
    with ReplayClient(endpoint) as c:
        return c.stats()


def _server_of(keys: np.ndarray, count: int) -> list[int]:
    """The server each of the set's keys names (its index above the lock shard in the key's shard byte)."""
    return ((np.asarray(keys, dtype=np.uint64) & np.uint64(0xFF)) // np.uint64(max_lock_shards(count))).tolist()


def _write(writers: list[Any], lengths: list[int], seq_lens: list[int], period: int) -> list[list[tuple]]:
    """Writer k writes the episodes 100 * k + e (interleaved episode by episode) -> the items each made."""
    made: list[list[tuple]] = [[] for _ in writers]
    for e, length in enumerate(lengths):
        for k, w in enumerate(writers):
            made[k] += write_episode(w, 100 * k + e, length, seq_lens[k], period)
    return made


def test_each_writer_stays_on_one_server_and_the_sets_samples_are_its_sequences():
    with running(2) as endpoints, ShardedReplayClient(endpoints, seed=0) as sharded:
        # Four writers, round robin: writers 0 and 2 on server 0, 1 and 3 on server 1; server 1's items are longer
        # (T = 9 against 6), so a merged batch pads server 0's items to 9.
        seq_lens = [6, 9, 6, 9]
        writers = [sharded.writer(max_sequence_length=t, chunk_length=4, flush_items=3) for t in seq_lens]
        made = _write(writers, [13, 4, 21], seq_lens, period=3)  # episode ends: items shorter than T
        sent = [0, 0]
        for k, w in enumerate(writers):
            w.close()
            assert w.chunks_resent == 0
            sent[k % 2] += w.chunk_bytes_sent + w.item_bytes_sent
        # Every item and every chunk on its writer's server: each server holds exactly what its writers sent.
        for s, endpoint in enumerate(endpoints):
            stats = _stats(endpoint)
            assert stats["size"] == len(made[s]) + len(made[s + 2])
            assert stats["bytes_held"] == sent[s] and stats["chunks"] > 0
        everything = {who for items in made for who in items}
        seen = set()
        for _ in range(6):
            batch = sharded.sample(32)
            assert batch.fields["t"].shape == (32, 9) and batch.mask.shape == (32, 9)
            check_batch(batch, 9)  # values, masks (episode ends, padding to 9) and extras against the steps
            who = [tuple(int(v) for v in batch.extras["who"][i]) for i in range(len(batch))]
            # The item's key names the server its writer wrote to.
            assert _server_of(batch.keys, 2) == [(ep // 100) % 2 for ep, _first, _n in who]
            seen.update(who)
        assert seen <= everything and {ep // 100 for ep, _f, _n in seen} == {0, 1, 2, 3}
        # The set's keys route back: every sampled item's priority can be updated at its server.
        assert sharded.update_priorities(batch.keys, np.full(len(batch), 2.0)) == len(batch)


def test_a_writer_refuses_a_server_with_more_lock_shards_than_the_keys_leave_room_for():
    with running(3, shards=128) as endpoints, ShardedReplayClient(endpoints) as sharded:  # at most 64 each
        w = sharded.writer(max_sequence_length=2, flush_items=1)
        w.append(step(0, 0))
        with pytest.raises(ValueError, match=r"has 128 lock shards: with 3 servers each may have at most 64"):
            w.create_item("default", 1, 1.0)
        assert w.discard() == 1
        w.close()
        assert all(_stats(e)["size"] == 0 for e in endpoints)


def test_a_writers_server_restarting_mid_episode_recovers_its_items_and_leaves_the_other_alone(start_server):
    procs = [start_server("--seed", str(i), "--capacity", "10000") for i in range(2)]
    endpoints = [p.endpoint for p in procs]
    with ShardedReplayClient(endpoints, timeout=2.0, retry_s=0.2) as sharded:
        w0, w1 = (sharded.writer(max_sequence_length=8, chunk_length=3, flush_items=4) for _ in range(2))
        for t in range(16):
            for k, w in enumerate((w0, w1)):
                w.append(step(k * 100, t))
                if t >= 7 and t % 4 == 3:
                    w.create_item("default", 8, 1.0, {"who": np.array([k * 100, t - 7, 8], np.int64)})
        w0.flush()
        w1.flush()
        procs[1].kill9()  # w1's server: no snapshot, so every chunk it stored is gone
        procs[1] = start_server("--seed", "1", "--capacity", "10000", port=procs[1].port)
        for t in range(16, 24):  # the same episodes go on: w1's next items reference chunks the server lost
            for k, w in enumerate((w0, w1)):
                w.append(step(k * 100, t))
                if t % 4 == 3:
                    w.create_item("default", 8, 1.0, {"who": np.array([k * 100, t - 7, 8], np.int64)})
        w0.flush()
        wait_until(lambda: _flushed(w1), 60, "w1's items stored on its restarted server", interval=0.05)
        assert w0.chunks_resent == 0 and w1.chunks_resent > 0  # sent again whole: no hole
        w0.close()
        w1.close()
        assert _stats(endpoints[0])["size"] == 5 and _stats(endpoints[1])["size"] == 2
        wait_until(lambda: sharded.stats()["replay_servers_up"] == 2 and sharded.stats()["size"] == 7, 60, "both up")
        for _ in range(3):
            batch = sharded.sample(16)
            for i in range(len(batch)):  # the extras here are only "who": check the steps by hand
                ep, first, n = (int(v) for v in batch.extras["who"][i])
                assert _server_of(batch.keys[i : i + 1], 2) == [ep // 100]
                assert batch.mask[i].all() and batch.fields["t"][i].tolist() == list(range(first, first + n))
                for j in range(n):
                    np.testing.assert_array_equal(
                        batch.fields["obs"]["image"][i, j], step(ep, first + j)["obs"]["image"]
                    )


def _flushed(w: Any) -> bool:
    try:
        w.flush(timeout=5)
    except Exception:  # noqa: BLE001 - the server is still starting: try again
        return False
    return True


class _Yielded:
    """A ReplayDataset batch (tensors) seen as a sampled batch, for check_batch."""

    def __init__(self, b: dict[str, Any]):
        def numpy(x: Any) -> Any:
            return {k: numpy(v) for k, v in x.items()} if isinstance(x, dict) else x.numpy()

        self.fields, self.mask, self.extras = numpy(b["fields"]), b["mask"].numpy(), numpy(b["extras"])
        self.sequences = self
        self.valid = b["valid"].numpy()

    def __len__(self) -> int:
        return int(self.mask.shape[0])


@pytest.mark.parametrize("servers", [1, 2])
def test_replay_dataset_yields_the_sequences_of_one_server_and_of_a_set(servers):
    with running(servers) as endpoints:
        client: Any = ReplayClient(endpoints[0]) if servers == 1 else ShardedReplayClient(endpoints, seed=1)
        with client:
            seq_lens = [7] * (2 * servers)
            writers = [client.writer(max_sequence_length=7, chunk_length=3) for _ in seq_lens]
            made = _write(writers, [11, 3], seq_lens, period=2)
            for w in writers:
                w.close()
            dataset = ReplayDataset(client, 12, beta=0.5, decode="structure", prefetch=2, decode_threads=2)
            seen = set()
            for b in itertools.islice(DataLoader(dataset, batch_size=None, num_workers=0), 5):
                assert set(b) == {"keys", "weights", "probabilities", "fields", "mask", "extras", "valid"}
                assert b["mask"].dtype == torch.bool and b["mask"].shape == (12, 7) and bool(b["valid"].all())
                assert b["fields"]["obs"]["image"].shape == (12, 7, 16, 16) and b["extras"]["who"].shape == (12, 3)
                assert bool((b["weights"] > 0).all()) and bool((b["weights"] <= 1).all())
                check_batch(_Yielded(b), 7)
                who = [tuple(int(v) for v in b["extras"]["who"][i]) for i in range(12)]
                if servers == 2:
                    assert _server_of(b["keys"].numpy(), 2) == [(ep // 100) % 2 for ep, _f, _n in who]
                seen.update(who)
            assert seen <= {who for items in made for who in items}
            # The keys are the client's: new priorities reach every sampled item.
            assert client.update_priorities(b["keys"].numpy(), np.ones(12)) == 12


def test_replay_dataset_reports_an_item_it_cannot_decode_in_valid():
    with running(1) as endpoints, ReplayClient(endpoints[0]) as client:
        with client.writer(max_sequence_length=4, chunk_length=2) as w:
            write_episode(w, 3, 8, 4, 2)
        # A sequence item whose step range lies past its only chunk (4 steps from step 1 of a 2-step chunk).
        from apexrl.replay.wire import protocol as P
        from apexrl.replay.wire import steps as S

        leaves = S.flatten(step(9, 0))
        fields = S.structure_of(leaves)
        fp = S.structure_fingerprint(fields)
        chunk = S.encode_chunk(fields, [np.stack([leaves[f.path]] * 2) for f in fields], fp)
        client._insert_with_chunk_keys([50.0], [S.encode_item(fp, 1, 4, 4, None)], chunks=P.pack_chunks([chunk], [[0]]))
        dataset = ReplayDataset(client, 16, decode="structure", prefetch=1)
        b = next(iter(dataset))
        bad = ~b["valid"]
        assert bad.any() and not b["mask"][bad].any() and not b["fields"]["t"][bad].any()
        assert b["mask"][~bad].any(axis=1).all()


def test_episode_adders_over_a_set_keep_each_episode_whole_on_its_writers_server():
    from apexrl.replay.adders import EpisodeAdder

    with running(2) as endpoints, ShardedReplayClient(endpoints, seed=2) as sharded:
        adders = [EpisodeAdder(sharded, "default", max_sequence_length=20, priority=1.0) for _ in range(2)]
        for e, length in enumerate((7, 12, 2)):
            for k, adder in enumerate(adders):  # adder k's observations carry 10 * k + e
                adder.add_first(np.array([10 * k + e, 0], np.float32))
                for t in range(length):
                    obs = np.array([10 * k + e, t + 1], np.float32)
                    adder.add(np.int64(t), 1.0, obs, terminated=t + 1 == length, truncated=False)
        for adder in adders:
            adder.close()
        assert [_stats(e)["size"] for e in endpoints] == [3, 3]
        batch = sharded.sample(32)
        for i in range(32):
            n = int(batch.mask[i].sum())
            obs = batch.fields["obs"][i, :n]
            assert n in (8, 13, 3) and obs[:, 1].tolist() == list(range(n)) and (obs[:, 0] == obs[0, 0]).all()
            assert _server_of(batch.keys[i : i + 1], 2) == [int(obs[0, 0]) // 10]
