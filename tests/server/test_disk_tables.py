"""Tables on disk (storage="disk") on real server processes: nothing acknowledged under durability "sync" is lost
to kill -9 (items with their keys and priorities, a queue's pops), a torn or corrupt log opens at its last
consistent state and says what it dropped, a full disk (RLIMIT_FSIZE) is refused request by request while the
server serves on, and the configuration's errors (docs/running.md, "Tables on disk").

What a killed server left on disk is read by opening the table's log in this process (``_core.DiskTable``: the
code the server opens it with), once the server is gone and its LOCK with it."""

from __future__ import annotations

import json
import os
import random
import resource
import signal
import subprocess
import sys

import numpy as np
import pytest

from apexrl._core import DiskTable
from apexrl.errors import ServerError, ServerTimeoutError
from apexrl.replay import ReplayClient
from apexrl.replay.server.config import ServerConfig
from apexrl.replay.tables import DEFAULT_DISK_CACHE_BYTES, TableConfig, TableConfigError, tables_from_json
from apexrl.replay.wire import protocol as P
from tests.conftest import free_port
from tests.helpers import wait_until
from tests.server.test_queue_delivery import server_connections

DEADLINE = 60.0
SHARDS = 8  # the server's default --shards, which a log must be reopened with

# Inserts 10 items per request into the table `disk` and then raises their priorities, writing each step to its
# file before it is sent ("P" insert, "Q" update) and after it is acknowledged ("I" with the keys, "U"), so the
# test knows what was acknowledged when the server was killed. Runs until killed.
WRITER = r"""
import sys
import numpy as np
from apexrl.replay import ReplayClient
endpoint, out_path, tag = sys.argv[1:4]
with open(out_path, "a", encoding="ascii") as out, ReplayClient(endpoint, timeout=30, table="disk") as client:
    r = 0
    while True:
        items = [f"{tag}-{r}-{i}".encode() for i in range(10)]
        prio = float(r % 7 + 1)
        out.write(f"P {tag}-{r} {prio}\n"); out.flush()
        keys = client.insert(np.full(10, prio), items)
        out.write(f"I {tag}-{r} {prio} " + " ".join(str(int(k)) for k in keys) + "\n"); out.flush()
        out.write(f"Q {tag}-{r} {prio + 0.5}\n"); out.flush()
        client.update_priorities(keys, np.full(10, prio + 0.5))
        out.write(f"U {tag}-{r}\n"); out.flush()
        r += 1
"""

# Pops batches of up to 8 from the queue `queue` and writes each acknowledged batch to its file. Runs until killed.
CONSUMER = r"""
import sys
from apexrl.errors import ServerTimeoutError
from apexrl.replay import ReplayClient
endpoint, out_path = sys.argv[1:3]
with open(out_path, "a", encoding="ascii") as out, ReplayClient(endpoint, timeout=30, table="queue") as client:
    while True:
        try:
            batch = client.sample(8, timeout=0.5)
        except ServerTimeoutError:
            continue
        out.write(" ".join(bytes(item).decode("ascii") for item in batch.items) + "\n"); out.flush()
"""


def tables_file(tmp_path, *tables: dict) -> str:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(list(tables)))
    return str(path)


def disk_queue(path: str) -> dict:
    """The table ``queue``: a FIFO queue of 1,000 items, each handed out once, on disk at ``path`` (sync)."""
    return {
        "name": "queue",
        "sampler": "fifo",
        "remover": "fifo",
        "capacity": 1000,
        "max_times_sampled": 1,
        "rate_limiter": {"kind": "queue", "size": 1000},
        "storage": "disk",
        "path": path,
    }


def on_disk(path: str, **config) -> dict[int, tuple[float, bytes]]:
    """key -> (priority, bytes) of every item the table's log at `path` holds (the server must be gone)."""
    disk = DiskTable(path, shards=SHARDS, **config)
    c = disk.store.contents()
    data, offsets = c["data"], c["offsets"]
    return {
        int(k): (float(p), bytes(data[offsets[i] : offsets[i + 1]]))
        for i, (k, p) in enumerate(zip(c["keys"], c["priorities"]))
    }


def lines(path: str) -> list[list[str]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="ascii") as f:
        return [line.split() for line in f if line.endswith("\n")]


def kill9(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)


@pytest.mark.parametrize("lives", [3, pytest.param(50, marks=pytest.mark.soak)])  # 50 lives: pytest -m soak
def test_kill9_under_sync_keeps_every_acknowledged_insert_and_update(start_server, tmp_path, lives):
    path, port = str(tmp_path / "disk"), free_port()
    flags = ("--tables", tables_file(tmp_path, {"name": "disk", "storage": "disk", "path": path}))
    out = str(tmp_path / "writer.txt")
    rng = random.Random(lives)
    for life in range(lives):  # each life killed at a random point of the writer's inserts and updates
        server = start_server(*flags, port=port)
        writer = subprocess.Popen([sys.executable, "-c", WRITER, server.endpoint, out, f"L{life}"])
        try:
            acked = sum(1 for w in lines(out) if w[0] in "IU")
            target = acked + rng.randint(4, 12)
            wait_until(lambda: sum(1 for w in lines(out) if w[0] in "IU") >= target, DEADLINE, "acknowledged writes")
            kill9(server.proc)
        finally:
            kill9(writer)
        held = on_disk(path)
        inserted: dict[str, tuple[float, list[int]]] = {}
        pending_insert: dict[str, float] = {}
        pending_update: dict[str, float] = {}
        updated: set[str] = set()
        for w in lines(out):
            if w[0] == "P":
                pending_insert[w[1]] = float(w[2])
            elif w[0] == "I":
                inserted[w[1]] = (float(w[2]), [int(k) for k in w[3:]])
            elif w[0] == "Q":
                pending_update[w[1]] = float(w[2])
            elif w[0] == "U":
                updated.add(w[1])
        for batch, (prio, keys) in inserted.items():
            for i, key in enumerate(keys):
                assert key in held, f"acknowledged item {batch}-{i} (key {key}) lost"
                priority, data = held[key]
                assert data == f"{batch}-{i}".encode()
                if batch in updated:
                    assert priority == prio + 0.5, (batch, priority)
                else:  # its update was sent or not, never acknowledged
                    assert priority in (prio, pending_update.get(batch, prio)), (batch, priority)
        # What was never acknowledged (the batch in flight at each kill) is whole or absent: all of it or none.
        known = {k for _, keys in inserted.values() for k in keys}
        extra = [(p, d.decode()) for k, (p, d) in held.items() if k not in known]
        unacked = {b for b in pending_insert if b not in inserted}
        assert len(unacked) <= life + 1
        for batch in {d.rsplit("-", 1)[0] for _, d in extra}:
            assert batch in unacked, f"{batch} is there though never sent"
            assert sorted(d for p, d in extra if d.startswith(batch + "-")) == sorted(f"{batch}-{i}" for i in range(10))
            assert {p for p, d in extra if d.startswith(batch + "-")} == {pending_insert[batch]}
    # The keys acknowledged in the first life still address their items through a restarted server.
    server = start_server(*flags, port=port)
    first = next(keys for b, (_, keys) in inserted.items() if b.startswith("L0-"))
    with ReplayClient(server.endpoint, timeout=30, table="disk") as client:
        assert client.update_priorities(np.array(first, dtype=np.uint64), np.full(10, 9.0)) == 10
        assert client.tables()["disk"]["size"] == len(held)
    assert server.terminate() == 0


def test_a_queue_on_disk_never_hands_out_an_acknowledged_pop_again_after_kill9(start_server, tmp_path):
    path, port = str(tmp_path / "queue"), free_port()
    queue = disk_queue(path)
    flags = ("--tables", tables_file(tmp_path, queue))
    server = start_server(*flags, port=port)
    items = [f"item{i:04d}" for i in range(400)]
    with ReplayClient(server.endpoint, timeout=30, table="queue") as client:
        for start in range(0, len(items), 50):
            client.insert(np.ones(50), [s.encode() for s in items[start : start + 50]])
    out = str(tmp_path / "popped.txt")
    consumer = subprocess.Popen([sys.executable, "-c", CONSUMER, server.endpoint, out])
    try:
        wait_until(lambda: len(lines(out)) >= 10, DEADLINE, "10 acknowledged pops")
        kill9(server.proc)
    finally:
        kill9(consumer)
    before = [item for batch in lines(out) for item in batch]
    server = start_server(*flags, port=port)
    after: list[str] = []
    with ReplayClient(server.endpoint, timeout=30, table="queue") as client:
        while True:
            try:
                after += [bytes(item).decode() for item in client.sample(50, timeout=0.5).items]
            except ServerTimeoutError:
                break
    assert len(set(before)) == len(before) and len(set(after)) == len(after)
    assert not set(before) & set(after), "an acknowledged pop was handed out again after the restart"
    assert after == sorted(after), "the queue's order was lost"
    # Popped but never recorded: at most the batch in flight and one the consumer had not written when killed.
    missing = set(items) - set(before) - set(after)
    assert len(missing) <= 16, sorted(missing)
    assert server.terminate() == 0


def segments(path: str) -> list[str]:
    return sorted(os.path.join(path, f) for f in os.listdir(path) if f.startswith("seg-"))


def test_a_torn_then_a_corrupt_log_opens_at_its_last_consistent_state(start_server, tmp_path):
    path, port = str(tmp_path / "table"), free_port()
    flags = ("--storage", "disk", "--storage-path", path, "--durability", "interval")
    server = start_server(*flags, port=port)
    with ReplayClient(server.endpoint, timeout=30) as client:
        for i in range(20):
            client.insert(np.ones(1), [f"item{i:02d}".encode() * 8])
    assert server.terminate() == 0
    last = segments(path)[-1]
    os.truncate(last, os.path.getsize(last) - 3)  # a torn write: the last insert cut short
    server = start_server(*flags, port=port)
    with ReplayClient(server.endpoint, timeout=30) as client:
        s = client.stats()
        assert s["table.default.disk_dropped_bytes"] > 0
        assert s["table.default.size"] == 19
    assert server.terminate() == 0
    with open(server.log_path, encoding="utf-8") as f:
        assert "ended early" in f.read()
    first = segments(path)[0]
    with open(first, "r+b") as f:  # a corrupt block in the middle of the first segment
        f.seek(os.path.getsize(first) // 2)
        byte = f.read(1)
        f.seek(-1, os.SEEK_CUR)
        f.write(bytes([byte[0] ^ 0xFF]))
    server = start_server(*flags, port=port)
    with ReplayClient(server.endpoint, timeout=30) as client:
        s = client.stats()
        assert 0 < s["table.default.size"] < 19
        assert s["table.default.disk_dropped_segments"] >= 1  # the later lives' segments went with it
        kept = s["table.default.size"]
        client.insert(np.ones(1), [b"after"])  # serves on
        assert client.tables()["default"]["size"] == kept + 1
    assert server.terminate() == 0


def drop_page_cache(directory: str) -> None:
    """Drops the kernel's cached pages of every file in ``directory`` (clean ones: dirty pages stay until written),
    so that what is read next comes from the disk."""
    for name in os.listdir(directory):
        try:
            fd = os.open(os.path.join(directory, name), os.O_RDONLY)
        except FileNotFoundError:  # a compaction's file, gone meanwhile
            continue
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def test_a_sync_tables_reply_leaves_once_an_fdatasync_has_covered_its_change(start_server, tmp_path):
    """The table's syncer fdatasyncs off the serving loop, and the loop holds a change's reply until an fdatasync
    has covered the writes made before it: with one client (nothing else writes), nothing is unsynced when the
    reply of an insert, an update, an erase or a reset arrives. Were a reply sent before its fdatasync, the
    counter read right after it would now and then still count its write."""
    path = str(tmp_path / "sync")
    server = start_server("--storage", "disk", "--storage-path", path)
    with ReplayClient(server.endpoint, timeout=30) as client:
        syncs = client.stats()["table.default.disk_syncs"]

        def unsynced() -> int:
            return int(client.stats()["table.default.disk_unsynced_writes"])

        for r in range(25):
            keys = client.insert(np.full(4, 1.0), [f"{r}-{i}".encode() * 64 for i in range(4)])
            assert unsynced() == 0, f"round {r}: the INSERT's reply came before its fdatasync"
            assert client.update_priorities(keys, np.full(4, 2.0 + r)) == 4
            assert unsynced() == 0, f"round {r}: the UPDATE_PRIORITIES reply came before its fdatasync"
            assert client.erase(keys[:1]) == 1
            assert unsynced() == 0, f"round {r}: the ERASE reply came before its fdatasync"
        assert client.stats()["table.default.disk_syncs"] >= syncs + 75  # one (at least) a change
        client.reset()
        assert unsynced() == 0
        keys = client.insert(np.ones(2), [b"a", b"b"])
    kill9(server.proc)
    assert sorted(on_disk(path)) == sorted(int(k) for k in keys)


def test_interval_writes_synced_are_read_back_from_the_disk_and_survive_kill9(start_server, tmp_path):
    path = str(tmp_path / "interval")
    # No cache of the log's tail: every sampled item is read from the file.
    server = start_server("--storage", "disk", "--storage-path", path, "--durability", "interval", "--cache-bytes", "0")
    acked: dict[int, tuple[float, bytes]] = {}
    with ReplayClient(server.endpoint, timeout=30) as client:
        for r in range(40):
            items = [f"r{r}-{i}".encode() * 50 for i in range(5)]
            keys = client.insert(np.full(5, 1.0 + r), items)
            acked.update({int(k): (1.0 + r, b) for k, b in zip(keys, items)})
        # Every acknowledged write fdatasynced by the table's syncer (no wait of the loop's), then its pages dropped:
        wait_until(lambda: client.stats()["table.default.disk_unsynced_writes"] == 0, DEADLINE, "the interval sync")
        drop_page_cache(path)
        # the server reads the sampled items back from the disk, each checked against its record.
        for _ in range(10):
            batch = client.sample(32)
            for k, item in zip(batch.keys, batch.items):
                assert bytes(item) == acked[int(k)][1]
        s = client.stats()
        assert s["table.default.bytes_held"] == 16 * len(acked)  # where each item lies, not its bytes
        assert (s["table.default.disk_cache_hits"], s["table.default.disk_cache_misses"]) == (0, 320)
        assert s["table.default.disk_cache_bytes"] == 0
    kill9(server.proc)
    drop_page_cache(path)
    assert on_disk(path, durability="interval") == acked


def test_the_newest_items_are_sampled_from_the_cached_log_tail_the_others_from_the_files(start_server, tmp_path):
    """A cache of 64 KiB (16 blocks of 4 KiB) and 120 KB of items: the newest are copied from memory, the others
    read from the files, every item's bytes right either way; a restarted server fills its cache from the log's
    end, so its first samples find the newest items there too."""
    path = str(tmp_path / "cached")
    flags = ("--storage", "disk", "--storage-path", path, "--cache-bytes", "65536")
    acked: dict[int, bytes] = {}

    def sample_and_check(client: ReplayClient) -> tuple[int, int]:
        before = client.stats()
        for _ in range(20):
            batch = client.sample(32)
            for k, item in zip(batch.keys, batch.items):
                assert bytes(item) == acked[int(k)]
        after = client.stats()
        hits, misses = (
            after[f"table.default.disk_cache_{x}"] - before[f"table.default.disk_cache_{x}"] for x in ("hits", "misses")
        )
        assert hits + misses == 640 and 0 < after["table.default.disk_cache_bytes"] <= 65536
        return hits, misses

    server = start_server(*flags)
    with ReplayClient(server.endpoint, timeout=30) as client:
        for r in range(48):
            items = [f"{r}-{i}".encode().ljust(250, b"x") for i in range(10)]
            keys = client.insert(np.full(10, 1.0), items)
            acked.update({int(k): b for k, b in zip(keys, items)})
        hits, misses = sample_and_check(client)
        # 480 records of 283 bytes: the cache holds the newest ~200 of them (60 KB of 136 KB); uniform priorities.
        assert 0.2 < hits / 640 < 0.7, (hits, misses)
    kill9(server.proc)
    server = start_server(*flags)
    with ReplayClient(server.endpoint, timeout=30) as client:
        hits, misses = sample_and_check(client)
        assert 0.2 < hits / 640 < 0.7, (hits, misses)


def test_a_snapshot_leaves_a_disk_table_out_and_a_restart_reads_it_from_its_log(start_server, tmp_path):
    snapshot, log_dir = str(tmp_path / "snap"), str(tmp_path / "d")
    flags = (
        "--snapshot",
        snapshot,
        "--tables",
        tables_file(tmp_path, {"name": "m"}, {"name": "d", "storage": "disk", "path": log_dir}),
    )
    server = start_server(*flags)
    with (
        ReplayClient(server.endpoint, timeout=30, table="m") as m,
        ReplayClient(server.endpoint, timeout=30, table="d") as d,
    ):
        m.insert(np.ones(3), [b"m0", b"m1", b"m2"])
        d.insert(np.ones(2), [b"d0", b"d1"])
        assert m.checkpoint() == os.path.abspath(snapshot)
    with open(snapshot, encoding="utf-8") as f:
        assert [t["name"] for t in json.load(f)["tables"]] == ["m"]  # the disk table's log is its durable form
    assert server.terminate() == 0
    server = start_server(*flags)
    with ReplayClient(server.endpoint, timeout=30, table="d") as client:
        assert {name: t["size"] for name, t in client.tables().items()} == {"m": 3, "d": 2}
        assert {bytes(i) for i in client.sample(64).items} == {b"d0", b"d1"}
    assert server.terminate() == 0


def limit_file_size() -> None:
    """In the server process: files may grow to 64 KiB, and a write past that fails with EFBIG (SIGXFSZ
    ignored), as on a full disk."""
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 << 10, resource.RLIM_INFINITY))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)


def test_a_full_disk_refuses_what_it_cannot_store_and_the_server_serves_on(start_server, tmp_path):
    path = str(tmp_path / "full")
    server = start_server("--storage", "disk", "--storage-path", path, preexec_fn=limit_file_size)
    acked: list[int] = []
    refused = 0
    with ReplayClient(server.endpoint, timeout=30) as client:
        for r in range(20):  # 8 KiB a request: the log reaches 64 KiB after 7
            try:
                acked += [int(k) for k in client.insert(np.ones(4), [bytes([r]) * 2048] * 4)]
            except ServerError as exc:
                assert "nothing changed" in str(exc) and "File too large" in str(exc), exc
                refused += 1
        assert acked and refused
        s = client.stats()
        assert s["table.default.disk_write_errors"] == refused
        assert s["table.default.size"] == len(acked)  # the refused inserts were undone
        assert len(client.sample(4)) == 4  # serves on
    kill9(server.proc)
    assert sorted(on_disk(path)) == sorted(acked)


def test_a_pop_a_full_disk_cannot_log_is_refused_and_its_items_stay_queued(start_server, tmp_path):
    """A queue's pops are logged (on the loop) after a worker drew and read the batch: a log that cannot take the
    erase answers the SAMPLE with an error, the items go back to the queue's front, and a restart finds them all."""
    path = str(tmp_path / "queue")
    queue = disk_queue(path)
    server = start_server("--tables", tables_file(tmp_path, queue), preexec_fn=limit_file_size)
    acked: list[int] = []
    with ReplayClient(server.endpoint, timeout=30, table="queue") as client:
        for size in (2048, 256, 1):  # the log filled to within an INSERT of one byte (about 50 bytes) of its limit
            while True:
                try:
                    acked += [int(k) for k in client.insert(np.ones(1), [b"x" * size])]
                except ServerError as exc:
                    assert "nothing changed" in str(exc) and "File too large" in str(exc), exc
                    break
        with pytest.raises(ServerError, match="SAMPLE refused, nothing changed.*File too large"):
            client.sample(16, timeout=5)  # an ERASE of 16 keys: 128 bytes and its head
        s = client.stats()
        assert s["table.queue.size"] == len(acked)  # nothing popped
        assert s["table.queue.disk_failed"] == 0  # a write refused, not a sync failed: the table serves on
    kill9(server.proc)
    assert sorted(on_disk(path, sampler="fifo", max_times_sampled=1)) == sorted(acked)


def test_disk_table_configuration_errors(tmp_path):
    with pytest.raises(TableConfigError, match="path: storage='disk' needs a path"):
        TableConfig("t", storage="disk")
    with pytest.raises(TableConfigError, match="path: is for storage='disk'"):
        TableConfig("t", path=str(tmp_path))
    with pytest.raises(TableConfigError, match="durability: is for storage='disk'"):
        TableConfig("t", durability="sync")
    with pytest.raises(TableConfigError, match="durability: must be one of sync, interval"):
        TableConfig("t", storage="disk", path=str(tmp_path), durability="often")
    with pytest.raises(TableConfigError, match="storage: must be one of memory, disk"):
        TableConfig("t", storage="tape")
    assert TableConfig("t", storage="disk", path=str(tmp_path)).durability == "sync"
    with pytest.raises(TableConfigError, match="cache_bytes: is for storage='disk'"):
        TableConfig("t", cache_bytes=1 << 20)
    with pytest.raises(TableConfigError, match="cache_bytes: must be"):
        TableConfig("t", storage="disk", path=str(tmp_path), cache_bytes=-1)
    assert TableConfig("t", storage="disk", path=str(tmp_path)).cache_bytes == DEFAULT_DISK_CACHE_BYTES
    assert TableConfig("t", storage="disk", path=str(tmp_path), cache_bytes=0).cache_bytes == 0
    # The native table's default is the config's.
    assert DiskTable(str(tmp_path / "default_cache"), shards=SHARDS).cache_bytes == DEFAULT_DISK_CACHE_BYTES
    with pytest.raises(ValueError, match="table 0.*path: storage='disk' needs a path"):
        tables_from_json([{"name": "t", "storage": "disk"}])
    with pytest.raises(ValueError, match="both stored at"):
        tables_from_json([{"name": n, "storage": "disk", "path": str(tmp_path / "x")} for n in ("a", "b")])
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(ValueError, match="is not a directory"):
        ServerConfig(tables=[TableConfig("t", storage="disk", path=str(a_file))])
    with pytest.raises(ValueError, match="parent directory .* does not exist"):
        ServerConfig(tables=[TableConfig("t", storage="disk", path=str(tmp_path / "no" / "t"))])
    # A second opener of a log (another server) is refused by its LOCK, and the log is left as it was.
    first = DiskTable(str(tmp_path / "locked"), shards=SHARDS)
    with pytest.raises(OSError, match="LOCK|lock|held"):
        DiskTable(str(tmp_path / "locked"), shards=SHARDS)
    assert first.opened["items"] == 0


def test_help_explains_the_storage_flags():
    text = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--help"], capture_output=True, text=True, check=True
    ).stdout
    for flag in ("--storage", "--storage-path", "--durability", "--cache-bytes"):
        assert flag in text
    bad = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--port", "1", "--cache-bytes", "1024"],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2 and "cache_bytes" in bad.stderr and "storage='disk'" in bad.stderr, bad.stderr


def test_a_pop_whose_reply_cannot_be_sent_is_logged_again_and_survives_kill9(start_server, tmp_path, raw_socket):
    """A consumer sends a SAMPLE that waits on the empty disk queue, then leaves; the reply fails (EHOSTUNREACH),
    the item goes back to the queue and, its pop logged already, is logged again: after kill -9 the queue still
    holds it. As in test_queue_delivery, libzmq may take the reply before it sees the peer go (then nothing is
    given back and the attempt proves nothing): up to 5 attempts."""
    path = str(tmp_path / "queue")
    queue = {
        "name": "queue",
        "sampler": "fifo",
        "max_times_sampled": 1,
        "capacity": 100,
        "rate_limiter": {"kind": "queue", "size": 100},
        "storage": "disk",
        "path": path,
    }
    server = start_server("--tables", tables_file(tmp_path, queue))
    given_back = None
    with ReplayClient(server.endpoint, timeout=30, table="queue") as client:
        index = int(client.tables()["queue"]["index"])
        for attempt in range(5):
            before = server_connections(server.port)
            start = client.stats()
            gone = raw_socket(server.endpoint)
            gone.send_multipart(P.encode_sample(1, 1, 0.4, timeout_ms=600_000, table=index))
            wait_until(lambda: client.stats()["table.queue.deferred"] == 1, DEADLINE, "the SAMPLE waiting")
            gone.close(linger=0)
            wait_until(lambda: server_connections(server.port) == before, DEADLINE, "the server to close its end")
            for _ in range(3):
                client.stats()
            client.insert(np.ones(1), [f"item{attempt}".encode()])
            wait_until(lambda: client.stats()["table.queue.deferred"] == 0, DEADLINE, "the SAMPLE served")
            s = client.stats()
            if s["replies_dropped"] == start["replies_dropped"]:  # libzmq took the reply: popped for good
                assert s["table.queue.size"] == 0, s
                continue
            assert s["table.queue.items_returned"] - start["table.queue.items_returned"] == 1, s
            assert s["table.queue.disk_items_logged_again"] == 1, s
            given_back = f"item{attempt}".encode()
            break
    assert given_back is not None, "in 5 attempts the server never saw the consumer go before replying"
    kill9(server.proc)
    assert [data for _, data in on_disk(path, sampler="fifo", max_times_sampled=1).values()] == [given_back]
