"""Frame chunks through a real replay server on 127.0.0.1: INSERT carries them, SAMPLE returns each once.

Checks the served path end to end: the native loop decodes the chunk frames, the store keeps them once
(``bytes_held`` counts each once), a retried insert (same insert_id, chunks carried again) is stored once, bad
references are refused whole, replies bring back exactly the chunks their items reference (also across two
servers behind the sharded client), and a snapshot keeps them.
"""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.errors import ServerError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.client.sharded import ShardedReplayClient
from apexrl.replay.wire import protocol as P


def batch_with_chunks(tag: int, n: int = 6):
    """n items; chunk c of this batch holds 100 + c bytes; item i references chunks {i // 2, i // 2 + 1}."""
    chunks = [bytes([tag, c]) * ((100 + c) // 2) for c in range(n // 2 + 1)]
    refs = [[i // 2, i // 2 + 1] for i in range(n)]
    items = [bytes([tag, i]) * 5 for i in range(n)]
    return items, chunks, refs


def check_sample(batch, expected: dict[int, tuple[bytes, list[bytes]]]) -> None:
    fc = batch.frame_chunks
    chunks = [bytes(c) for c in fc.chunks()]
    assert len(set(chunks)) == len(chunks)
    used = set()
    for i, key in enumerate(batch.keys.tolist()):
        item, item_chunks = expected[key]
        assert bytes(batch.items[i]) == item
        refs = fc.refs(i).tolist()
        assert [chunks[c] for c in refs] == item_chunks
        used.update(refs)
    assert used == set(range(len(chunks)))


def test_insert_sample_retry_and_refusal(start_server):
    server = start_server("--capacity", "1000", "--shards", "2")
    with ReplayClient(server.endpoint) as client:
        expected = {}
        held = 0
        batches = []
        for tag in range(3):
            items, chunks, refs = batch_with_chunks(tag)
            insert_id = client.next_insert_id()
            fc = P.pack_chunks(chunks, refs)
            keys = client.insert(np.ones(len(items)), items, chunks=fc, insert_id=insert_id)
            again = client.insert(np.ones(len(items)), items, chunks=fc, insert_id=insert_id)  # a retry
            assert again.tolist() == keys.tolist()
            batches.append(keys)
            for key, item, r in zip(keys.tolist(), items, refs):
                expected[key] = (item, [chunks[c] for c in r])
            held += sum(map(len, items)) + sum(map(len, chunks))
        stats = client.stats()
        assert stats["size"] == 18 and stats["chunks"] == 12 and stats["bytes_held"] == held
        for _ in range(5):
            check_sample(client.sample(16), expected)

        items, chunks, _refs = batch_with_chunks(9, 2)
        with pytest.raises(ServerError, match=r"chunks\[1\] is referenced by no item"):
            client.insert(np.ones(2), items, chunks=P.pack_chunks(chunks, [[0], [0]]))
        with pytest.raises(
            ServerError, match=r"items\[1\] references chunk 7: neither one of the 2 chunks sent nor a chunk key"
        ):
            client.insert(np.ones(2), items, chunks=P.pack_chunks(chunks, [[0, 1], [7]]))
        assert client.stats()["size"] == 18 and client.stats()["chunks"] == 12

        client.erase(batches[0])  # batch 0 whole: its chunks go too
        assert client.stats()["chunks"] == 8


def test_items_without_chunks_sample_without_chunks(start_server):
    server = start_server("--capacity", "100")
    with ReplayClient(server.endpoint) as client:
        client.insert(np.ones(3), [b"a", b"bb", b"ccc"])
        batch = client.sample(8)
        assert batch.chunks is None
        assert batch.frame_chunks.item_chunks.shape[0] == 0
        assert client.stats()["chunks"] == 0


def test_sharded_client_combines_the_servers_chunks(start_server):
    servers = [start_server("--capacity", "1000", "--shards", "1") for _ in range(2)]
    with ShardedReplayClient([s.endpoint for s in servers], seed=1) as client:
        expected = {}
        for tag in range(4):  # round robin: each server gets two batches
            items, chunks, refs = batch_with_chunks(tag)
            keys = client.insert(np.ones(len(items)), items, chunks=P.pack_chunks(chunks, refs))
            for key, item, r in zip(keys.tolist(), items, refs):
                expected[key] = (item, [chunks[c] for c in r])
        for _ in range(5):
            batch = client.sample(32)
            check_sample(batch, expected)


def test_snapshot_keeps_the_chunks(start_server, tmp_path):
    path = str(tmp_path / "replay.snap")
    server = start_server("--capacity", "100", "--snapshot", path)
    items, chunks, refs = batch_with_chunks(5)
    with ReplayClient(server.endpoint) as client:
        keys = client.insert(np.ones(len(items)), items, chunks=P.pack_chunks(chunks, refs))
    assert server.terminate() == 0
    server = start_server("--capacity", "100", "--snapshot", path)
    with ReplayClient(server.endpoint) as client:
        assert client.stats()["chunks"] == len(chunks)
        expected = {k: (item, [chunks[c] for c in r]) for k, item, r in zip(keys.tolist(), items, refs)}
        check_sample(client.sample(12), expected)


def test_the_reply_estimate_counts_the_chunks_an_item_brings(start_server):
    """Items of a few bytes that each reference a 300 KB chunk: a SAMPLE of 8 would be ~2.4 MB, over a 1 MiB
    reply cap, and is refused before sampling by the estimate (which counts the chunks), not after."""
    server = start_server("--capacity", "100", "--max-reply-mb", "1")
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 256, 300_000, dtype=np.uint8).tobytes() for _ in range(8)]
    items = [bytes([i]) * 4 for i in range(8)]
    with ReplayClient(server.endpoint) as client:
        client.insert(np.ones(8), items, chunks=P.pack_chunks(chunks, [[i] for i in range(8)]))
        with pytest.raises(ServerError, match=r"SAMPLE of 8 items refused: its reply would be about"):
            client.sample(8)
        assert len(client.sample(2)) == 2  # ~600 KB: under the cap
