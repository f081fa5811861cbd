"""Protocol v3: every SAMPLE reply carries its store's totals (total_mass, min_mass, size), over a real server.

A client sampling several servers combines their batches from these numbers alone (item k's mass is
probability_k * total_mass), so they must describe the store the draws came from: checked here against the
priorities the test inserted, through inserts, priority updates, erases and the all-zero uniform fallback.
"""

from __future__ import annotations

import numpy as np
import pytest

from apexrl import PrioritizedStore
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P

ALPHA, BETA, SHARDS = 0.7, 0.5, 4


def _expect_totals(batch, priorities: dict[int, float]) -> None:
    """The batch's totals and per-draw numbers match the store holding exactly ``priorities``."""
    masses = {k: p**ALPHA for k, p in priorities.items()}
    positive = [m for m in masses.values() if m > 0]
    assert batch.size == len(priorities)
    assert batch.total_mass == pytest.approx(sum(masses.values()), rel=1e-12)
    assert batch.min_mass == pytest.approx(min(positive), rel=1e-12)
    drawn = np.array([masses[k] for k in batch.keys.tolist()])
    assert np.all(drawn > 0)
    np.testing.assert_allclose(batch.probabilities * batch.total_mass, drawn, rtol=1e-12)
    np.testing.assert_allclose(batch.weights, (drawn / batch.min_mass) ** -BETA, rtol=1e-6)


def test_every_sample_reply_carries_the_totals_of_the_store_it_was_drawn_from(start_server):
    server = start_server("--capacity", "1000", "--shards", str(SHARDS), "--alpha", str(ALPHA), "--seed", "7")
    rng = np.random.default_rng(3)
    with ReplayClient(server.endpoint, timeout=10) as client:
        assert client.hello().num_shards == SHARDS
        priorities: dict[int, float] = {}
        for call in range(8):  # 8 inserts of 40: every lock shard gets items
            p = rng.uniform(0.01, 5.0, 40)
            keys = client.insert(p, [f"{call}-{i}".encode() for i in range(40)])
            priorities.update(zip(keys.tolist(), p.tolist()))
        _expect_totals(client.sample(64, beta=BETA), priorities)

        stats = client.stats()
        assert stats["num_shards"] == SHARDS
        assert stats["total_mass"] == pytest.approx(sum(p**ALPHA for p in priorities.values()), rel=1e-12)
        assert stats["min_mass"] == pytest.approx(min(p**ALPHA for p in priorities.values()), rel=1e-12)

        # New priorities (a new smallest one, some zeros: out of the draw but still counted in the size).
        keys = list(priorities)[:100]
        new = rng.uniform(0.01, 9.0, 100)
        new[::10] = 0.0
        new[7] = 1e-4
        assert client.update_priorities(np.array(keys, np.uint64), new) == 100
        priorities.update(zip(keys, new.tolist()))
        _expect_totals(client.sample(64, beta=BETA), priorities)

        # Erase a third, the smallest mass among them.
        gone = [k for i, k in enumerate(priorities) if i % 3 == 0 or priorities[k] == 1e-4]
        assert client.erase(np.array(gone, np.uint64)) == len(gone)
        for k in gone:
            del priorities[k]
        _expect_totals(client.sample(32, beta=BETA), priorities)

        # Every priority 0: the uniform fallback reports no mass, probabilities 1 / size and weights 1.
        keys = np.array(list(priorities), np.uint64)
        assert client.update_priorities(keys, np.zeros(len(keys))) == len(keys)
        batch = client.sample(16, beta=BETA)
        assert (batch.total_mass, batch.min_mass, batch.size) == (0.0, 0.0, len(keys))
        np.testing.assert_array_equal(batch.probabilities, np.full(16, 1.0 / len(keys)))
        np.testing.assert_array_equal(batch.weights, np.ones(16, np.float32))
        stats = client.stats()
        assert (stats["total_mass"], stats["min_mass"]) == (0.0, 0.0)
    assert server.terminate() == 0


def test_the_in_process_store_exposes_the_same_totals():
    store = PrioritizedStore(capacity=100, alpha=0.5, shards=3)
    keys = store.insert([1.0, 4.0, 9.0, 0.0], [b"a", b"b", b"c", b"d"])
    mass = dict(zip(keys.tolist(), (1.0, 2.0, 3.0, 0.0)))
    batch = store.sample(20, 0.5)
    assert (batch.total_mass, batch.min_mass, batch.size, len(batch)) == (6.0, 1.0, 4, 20)
    np.testing.assert_allclose(batch.probabilities * batch.total_mass, [mass[k] for k in batch.keys.tolist()])
    assert (store.stats()["min_mass"], store.stats()["total_priority"]) == (1.0, 6.0)


def test_a_version_2_peer_is_refused_and_the_server_keeps_serving(start_server, raw_socket):
    server = start_server("--capacity", "100")
    sock = raw_socket(server.endpoint)
    v2 = bytearray(P.Header(P.Op.SAMPLE, 41, count=4, param=0.4).pack())
    v2[4:6] = (2).to_bytes(2, "little")
    sock.send_multipart([bytes(v2)])
    assert sock.poll(10_000), "no reply to a version-2 SAMPLE"
    frames = sock.recv_multipart()
    reply = P.decode_reply(frames, P.Op.SAMPLE, 41)
    assert reply.status == P.Status.UNSUPPORTED_VERSION
    assert reply.message == "protocol version 2 is not supported; supported versions: 6"
    with ReplayClient(server.endpoint, timeout=10) as client:
        client.insert([1.0], [b"x"])
        assert client.sample(2).size == 1
    assert server.terminate() == 0
