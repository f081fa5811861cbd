"""Keys never address another item across restarts: epochs in the store, the server's PATH.epoch sidecar, and
what stays valid after a snapshot restore (docs/protocol.md, "Keys")."""

from __future__ import annotations

import os
import pathlib
import shutil

import numpy as np
import pytest

from apexrl import PrioritizedStore, ReplayClient, SnapshotError
from apexrl.replay.server import ReplayServer, ServerConfig, SnapshotLoadError
from apexrl.replay.tables import TableConfig


def items(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}".encode() for i in range(n)]


# ------------------------------------------------------------------------------------------------ the store


def test_a_store_restarted_with_another_epoch_issues_no_key_of_the_first_life():
    first = PrioritizedStore(capacity=1000, alpha=1.0, shards=4, epoch=5)
    old = first.insert(np.ones(100), items("old", 100))
    second = PrioritizedStore(capacity=1000, alpha=1.0, shards=4, epoch=6)
    new = second.insert(np.ones(100), items("new", 100))
    assert not set(old.tolist()) & set(new.tolist())
    assert second.update_priorities(old, np.full(100, 50.0)) == 0
    stats = second.stats()
    assert stats["stale_updates"] == 100 and stats["epoch"] == 6 and second.epoch == 6
    assert second.total_priority == 100.0


def test_load_with_a_new_epoch_keeps_restored_keys_and_stales_keys_issued_after_the_save(tmp_path):
    path = tmp_path / "s.apx"
    store = PrioritizedStore(capacity=1000, alpha=1.0, shards=2, epoch=9)
    saved = store.insert(np.ones(50), items("saved", 50))
    store.save(path)
    assert PrioritizedStore.snapshot_epoch(path) == 9
    after = store.insert(np.ones(30), items("after", 30))  # the old life goes on, then dies unsaved

    with pytest.raises(ValueError, match="epoch 9"):
        PrioritizedStore.load(path, 9)  # the saved epoch itself would let `after` keys come back
    with pytest.raises(ValueError, match="epoch"):
        PrioritizedStore.load(path, 0)
    restored = PrioritizedStore.load(path, 12)
    assert restored.epoch == 12 and restored.stats()["epoch"] == 12
    fresh = restored.insert(np.ones(30), items("fresh", 30))
    assert restored.update_priorities(saved, np.full(50, 2.0)) == 50
    assert restored.update_priorities(after, np.full(30, 1000.0)) == 0
    assert restored.total_priority == 50 * 2.0 + 30 * 1.0
    assert not set(fresh.tolist()) & set(after.tolist())
    assert PrioritizedStore.load(path).epoch == 10  # default: the saved epoch + 1
    restored.check_invariants()


def test_epoch_is_checked():
    for bad in (0, 4096, -1):
        with pytest.raises(ValueError, match="epoch"):
            PrioritizedStore(capacity=10, epoch=bad)
    assert PrioritizedStore(capacity=10, epoch=4095).epoch == 4095
    assert PrioritizedStore.MAX_EPOCH == 4095


def test_a_snapshot_of_the_previous_format_is_refused_with_the_reason(tmp_path):
    path = tmp_path / "v1.apx"
    PrioritizedStore(capacity=10).save(path)
    raw = bytearray(path.read_bytes())
    raw[8:12] = (1).to_bytes(4, "little")  # the version field, after the 8-byte magic
    path.write_bytes(bytes(raw))
    with pytest.raises(SnapshotError, match="version 1"):
        PrioritizedStore.load(path)


# ------------------------------------------------------------------------------------------ the real server


def test_restarted_empty_server_with_a_snapshot_path_stales_every_key_of_its_previous_life(start_server, tmp_path):
    snap = str(tmp_path / "replay.snap")
    server = start_server("--snapshot", snap, "--alpha", "1")
    with ReplayClient(server.endpoint, timeout=10) as client:
        old = client.insert(np.ones(100), items("old", 100))
        first_epoch = client.stats()["epoch"]
    server.kill9()  # a crash: no snapshot written, only the epoch sidecar
    assert not os.path.exists(snap)
    assert pathlib.Path(snap + ".epoch").read_text().strip() == str(first_epoch)

    restarted = start_server("--snapshot", snap, "--alpha", "1")
    with ReplayClient(restarted.endpoint, timeout=10) as client:
        new = client.insert(np.ones(100), items("new", 100))
        stats = client.stats()
        assert stats["epoch"] == first_epoch % 4095 + 1
        assert client.update_priorities(old, np.full(100, 50.0)) == 0
        stats = client.stats()
        assert stats["stale_updates"] == 100
        assert stats["total_priority"] == 100.0  # no new item was touched
        assert client.update_priorities(new, np.full(100, 2.0)) == 100
    assert restarted.terminate() == 0


def test_restart_without_a_snapshot_path_draws_a_random_epoch(start_server):
    server = start_server("--alpha", "1")
    with ReplayClient(server.endpoint, timeout=10) as client:
        old = client.insert(np.ones(100), items("old", 100))
        first_epoch = client.stats()["epoch"]
    assert server.terminate() == 0
    restarted = start_server("--alpha", "1", "--log-level", "INFO")
    with ReplayClient(restarted.endpoint, timeout=10) as client:
        client.insert(np.ones(100), items("new", 100))
        epoch = client.stats()["epoch"]
        if epoch == first_epoch:
            pytest.skip("both lives drew the same epoch: the documented 1 in 4095 chance without a snapshot path")
        assert client.update_priorities(old, np.full(100, 50.0)) == 0
        assert client.stats()["total_priority"] == 100.0
    assert restarted.terminate() == 0
    assert f"key epoch {epoch} drawn at random" in restarted.log()


def test_restore_keeps_keys_of_restored_items_and_stales_keys_issued_after_the_snapshot(tmp_path):
    snap = str(tmp_path / "replay.snap")
    config = ServerConfig(port=0, shards=4, snapshot=snap, tables=[TableConfig("default", alpha=1.0, capacity=10_000)])
    with ReplayServer(config).start() as server:
        with ReplayClient(server.endpoint, timeout=10) as client:
            restored_keys = client.insert(np.ones(100), items("kept", 100))
            server.save_snapshot()
            shutil.copy(snap, tmp_path / "as_of_the_crash.snap")
            # Items acknowledged after the last snapshot: lost in the crash below, their keys must turn stale.
            lost_keys = client.insert(np.ones(60), items("lost", 60))
            first_epoch = client.stats()["epoch"]
    # A crash after those inserts: the file on disk is the snapshot taken before them.
    os.replace(tmp_path / "as_of_the_crash.snap", snap)

    with ReplayServer(config).start() as server:
        with ReplayClient(server.endpoint, timeout=10) as client:
            stats = client.stats()
            assert stats["size"] == 100
            assert stats["epoch"] == first_epoch % 4095 + 1
            # 60 new items take the slots the lost items had.
            new_keys = client.insert(np.ones(60), items("new", 60))
            assert not set(new_keys.tolist()) & set(lost_keys.tolist())
            before = client.stats()["stale_updates"]
            old_keys = np.concatenate([restored_keys, lost_keys])
            assert client.update_priorities(old_keys, np.full(160, 5.0)) == 100
            stats = client.stats()
            assert stats["stale_updates"] == before + 60
            assert stats["total_priority"] == 100 * 5.0 + 60 * 1.0  # no new item's priority changed
            by_key = dict(zip(new_keys.tolist(), items("new", 60)))
            by_key.update(zip(restored_keys.tolist(), items("kept", 100)))
            batch = client.sample(512)
            for key, item in zip(batch.keys.tolist(), batch.items):
                assert bytes(item) == by_key[key]
    assert pathlib.Path(snap + ".epoch").read_text().strip() == str(first_epoch % 4095 + 1)


def test_the_epoch_sidecar_advances_every_life_and_wraps(tmp_path):
    snap = str(tmp_path / "r.snap")
    pathlib.Path(snap + ".epoch").write_text("4094\n")
    config = ServerConfig(port=0, snapshot=snap)
    epochs = []
    for _ in range(3):
        server = ReplayServer(config)  # the sidecar is written before the server binds
        epochs.append(server.store.epoch)
        assert pathlib.Path(snap + ".epoch").read_text().strip() == str(server.store.epoch)
        server.start().stop()
    assert epochs == [4095, 1, 2]
    assert PrioritizedStore.snapshot_epoch(snap) == 2


def test_an_unreadable_epoch_sidecar_is_a_startup_error(tmp_path):
    snap = str(tmp_path / "r.snap")
    pathlib.Path(snap + ".epoch").write_text("banana")
    with pytest.raises(SnapshotLoadError, match="banana"):
        ReplayServer(ServerConfig(port=0, snapshot=snap))
