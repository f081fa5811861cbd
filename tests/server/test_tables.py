"""Several named tables on one real replay server, on 127.0.0.1: each request reaches the table it
names and no other, keys of one table are stale on another, each table's rate limiter waits and refuses on its
own, an unknown table is refused while the server serves on, HELLO and STATS describe every table, and a
snapshot holds every table (a one-store snapshot of the format before tables loads into ``default``)."""

from __future__ import annotations

import json
import os
import pathlib
import re
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import zmq

from apexrl import PrioritizedStore
from apexrl.errors import ServerError, ServerTimeoutError
from apexrl.replay import ReplayClient, ReplayServer, ServerConfig
from apexrl.replay.client.replay_client import table_stats
from apexrl.replay.server.epoch import SnapshotLoadError
from apexrl.replay.server.tables import TABLES_SNAPSHOT_FORMAT, choose_epochs
from apexrl.replay.tables import MinSize, Queue, SampleToInsertRatio, TableConfig
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec
from apexrl.replay.wire.schema import Status


def three_tables() -> list[TableConfig]:
    """A prioritized table, a prioritized one with another remover and a min size, and a queue."""
    return [
        TableConfig("default", capacity=1000),
        TableConfig("aux", remover="uniform", capacity=50, rate_limiter=MinSize(3)),
        TableConfig("queue", capacity=100, rate_limiter=Queue(4)),
    ]


@pytest.fixture
def server():
    with ReplayServer(ServerConfig(port=0, tables=three_tables())) as srv:
        yield srv


@pytest.fixture
def client(server):
    with ReplayClient(server.endpoint, timeout=10) as c:
        yield c


def items(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}{i}".encode() for i in range(n)]


def wait_until(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.01)


def test_each_request_reaches_only_its_table_and_keys_are_stale_elsewhere(client):
    keys_d = client.insert(np.ones(4), items("d", 4))
    keys_a = client.insert(np.ones(3), items("a", 3), table="aux")
    assert not set(keys_d.tolist()) & set(keys_a.tolist())
    sizes = {name: t["size"] for name, t in client.tables().items()}
    assert sizes == {"default": 4, "aux": 3, "queue": 0}
    # default's keys on aux and queue: stale there, nothing touched anywhere
    assert client.erase(keys_d, table="aux") == 0
    assert client.erase(keys_d, table="queue") == 0
    assert client.update_priorities(keys_d, np.full(4, 9.0), table="aux") == 0
    assert client.update_priorities(keys_a, np.full(3, 9.0), table="default") == 0
    sizes = {name: t["size"] for name, t in client.tables().items()}
    assert sizes == {"default": 4, "aux": 3, "queue": 0}
    # a sample draws its own table's items only
    batch = client.sample(32, table="aux")
    assert set(batch.keys.tolist()) <= set(keys_a.tolist())
    assert {bytes(x)[:1] for x in batch.items} == {b"a"}
    assert set(client.sample(32).keys.tolist()) <= set(keys_d.tolist())
    # an update on the right table takes, and changes only that table's mass
    before = client.stats()
    assert client.update_priorities(keys_a, np.full(3, 5.0), table="aux") == 3
    after = client.stats()
    assert after["table.default.total_mass"] == before["table.default.total_mass"]
    assert after["table.aux.total_mass"] != before["table.aux.total_mass"]
    # erase and remove_to_fit on one table leave the others
    assert client.erase(keys_a[:2], table="aux") == 2
    assert client.remove_to_fit(table="queue") == 0
    sizes = {name: t["size"] for name, t in client.tables().items()}
    assert sizes == {"default": 4, "aux": 1, "queue": 0}


def test_keys_of_distinct_tables_carry_distinct_consecutive_epochs(server, client):
    epochs = [t.store.epoch for t in server.tables]
    assert len(set(epochs)) == 3
    assert [(e - epochs[0]) % PrioritizedStore.MAX_EPOCH for e in epochs] == [0, 1, 2]
    described = {name: t["epoch"] for name, t in client.tables().items()}
    assert described == {t.name: t.store.epoch for t in server.tables}


def test_min_size_table_holds_samples_until_it_is_big_enough_other_tables_do_not_release_them(client, server):
    client.insert(np.ones(2), items("a", 2), table="aux")
    with pytest.raises(ServerTimeoutError, match="fewer than min_size_to_sample=3"):
        client.sample(1, table="aux")
    got: dict[str, object] = {}

    def waiting_sample() -> None:
        with ReplayClient(server.endpoint, timeout=30) as c:
            got["batch"] = c.sample(2, timeout=20, table="aux")

    t = threading.Thread(target=waiting_sample)
    t.start()
    wait_until(lambda: client.stats()["table.aux.deferred"] == 1, "the aux sample to wait")
    client.insert(np.ones(5), items("d", 5))  # another table's inserts release nothing here
    assert client.stats()["table.aux.deferred"] == 1
    client.insert(np.ones(1), items("a", 1), table="aux")
    t.join(30)
    assert not t.is_alive()
    assert len(got["batch"]) == 2  # type: ignore[arg-type]


def test_queue_table_waits_while_full_refuses_what_never_fits_and_hands_out_once_drained(client, server):
    with pytest.raises(ServerTimeoutError, match="the queue is empty"):
        client.sample(1, timeout=0.05, table="queue")
    client.insert(np.ones(4), items("q", 4), table="queue")
    with pytest.raises(ServerError, match=r"never holds 5 items.*Queue\(size=4\)") as info:
        client.insert(np.ones(5), items("q", 5), table="queue")
    assert info.value.status == Status.INVALID_ARGUMENT
    with pytest.raises(ServerTimeoutError, match="the queue has room"):
        client.insert(np.ones(1), items("x", 1), table="queue")
    with pytest.raises(ServerTimeoutError, match=r"the queue holds 4 of at most 4 items"):
        client.insert(np.ones(1), items("x", 1), timeout=0.05, table="queue")
    # a waiting insert goes in once the queue has room (here: an erase makes it)
    keys = client.sample(4, table="queue").keys
    got: dict[str, object] = {}

    def waiting_insert() -> None:
        with ReplayClient(server.endpoint, timeout=30) as c:
            got["keys"] = c.insert(np.ones(1), items("w", 1), timeout=20, table="queue")

    t = threading.Thread(target=waiting_insert)
    t.start()
    wait_until(lambda: client.stats()["table.queue.deferred"] == 1, "the queue insert to wait")
    assert client.erase(np.unique(keys)[:1], table="queue") == 1
    t.join(30)
    assert not t.is_alive()
    assert len(got["keys"]) == 1  # type: ignore[arg-type]
    assert client.tables()["queue"]["size"] == 4


def test_ratio_limited_table_limits_only_itself():
    tables = [
        TableConfig("default"),
        TableConfig("ratio", rate_limiter=SampleToInsertRatio(1.0, min_size_to_sample=1, error_buffer=2.0)),
    ]
    with ReplayServer(ServerConfig(port=0, tables=tables)) as srv, ReplayClient(srv.endpoint, timeout=10) as c:
        c.insert(np.ones(2), items("r", 2), table="ratio")  # filling up to min size: never limited
        c.insert(np.ones(1), items("r", 1), table="ratio")  # (3 - 1) * 1 - 0 = 2 <= 2
        with pytest.raises(ServerTimeoutError, match="rate limited"):  # (4 - 1) * 1 - 0 = 3 > 2 ...
            c.insert(np.ones(1), items("r", 1), table="ratio")
        for _ in range(20):  # ... while the other table takes anything
            c.insert(np.ones(2), items("d", 2))
        c.sample(2, table="ratio")
        c.insert(np.ones(1), items("r", 1), table="ratio")
        stats = c.stats()
        assert stats["table.ratio.rate_limiter_inserted_items"] == 4
        assert stats["table.default.rate_limiter_inserted_items"] == 40


def test_unknown_table_is_refused_and_the_server_keeps_serving(server, client):
    with pytest.raises(ValueError, match=r"no table 'nope'.*\['default', 'aux', 'queue'\]"):
        client.sample(1, table="nope")
    ctx = zmq.Context.instance()
    sock = ctx.socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(server.endpoint)
    try:
        for rid, table in enumerate((3, 17, 0xFFFF_FFFF), start=1):
            for frames in (
                P.encode_sample(rid, 1, 0.4, table=table),
                P.encode_erase(rid, np.array([1], np.uint64), table=table),
                P.encode_insert(rid, np.ones(1), b"x", np.array([0, 1], np.uint64), table=table),
            ):
                sock.send_multipart(frames)
                assert sock.poll(10_000)
                reply = P.decode_reply(sock.recv_multipart(), P.Op(P.Header.unpack(frames[0]).op), rid)
                assert reply.status == Status.INVALID_ARGUMENT
                assert f"unknown table index {table}" in (reply.message or "")
                assert "2 'queue'" in (reply.message or "")
        # a request that names no table must carry 0 there
        stats = P.encode_stats(9)
        bad = bytearray(stats[0])
        bad[36:40] = (1).to_bytes(4, "little")
        sock.send_multipart([bytes(bad)])
        assert sock.poll(10_000)
        reply = P.decode_reply(sock.recv_multipart(), P.Op.STATS, 9)
        assert reply.status == Status.BAD_MESSAGE and "header table is 1, must be 0" in (reply.message or "")
    finally:
        sock.close()
    assert client.stats()["requests_refused_table"] == 9
    assert len(client.insert(np.ones(1), items("d", 1))) == 1  # still serving
    assert sum(t["size"] for t in client.tables().values()) == 1


def test_hello_and_stats_describe_every_table(client):
    info = client.hello()
    assert info.protocol_version == P.PROTOCOL_VERSION == 6
    assert [(t["index"], t["name"]) for t in info.tables] == [(0, "default"), (1, "aux"), (2, "queue")]
    by_name = {t["name"]: t for t in info.tables}
    assert by_name["aux"]["remover"] == "uniform" and by_name["aux"]["capacity"] == 50
    assert by_name["aux"]["rate_limiter"] == {"kind": "min_size", "min_size": 3}
    assert by_name["queue"]["rate_limiter"] == {"kind": "queue", "size": 4}
    assert by_name["default"]["sampler"] == "prioritized"
    client.insert(np.ones(2), items("d", 2))
    client.insert(np.ones(3), items("q", 3), table="queue")
    stats = client.stats()
    # today's names describe `default`; every table under table.<name>.; totals under tables_total.
    assert stats["size"] == stats["table.default.size"] == 2
    assert stats["table.queue.size"] == 3 and stats["table.aux.size"] == 0
    assert stats["tables_total.size"] == 5
    assert stats["tables"] == 3
    assert stats["table.queue.queue_size"] == 4
    assert stats["table.aux.min_size_to_sample"] == 3
    tables = client.tables()
    assert set(tables) == {"default", "aux", "queue"}
    assert tables["queue"]["size"] == 3 and tables["queue"]["bytes_held"] == 6
    assert tables["queue"]["rate_limiter_inserted_items"] == 3


def test_helpers_and_dataset_work_on_their_table(server, client):
    client.insert(np.ones(6), items("a", 6), table="aux")
    with client.sampler(2, prefetch=2, table="aux") as sampler:
        batch = next(iter(sampler))
        assert {bytes(x)[:1] for x in batch.raw.items} == {b"a"}
    with client.inserter(table="queue") as inserter:
        inserter.insert(np.ones(2), items("q", 2))
        inserter.flush()
    assert client.tables()["queue"]["size"] == 2
    keys = client.sample(2, table="queue").keys
    with client.updater(table="queue") as updater:
        updater.update(keys, np.full(len(keys), 3.0))
    wait_until(lambda: client.stats()["table.queue.updated"] == len(keys), "the updater's updates")
    stats = client.stats()
    assert stats["table.queue.updated"] == len(keys)
    assert stats["table.default.updated"] == 0


def test_a_clients_spec_goes_to_its_own_table_and_not_with_a_helper_to_another(server):
    spec = TransitionSpec([FieldSpec("x", "f4", (2,))])
    with ReplayClient(server.endpoint, timeout=10, spec=spec, table="aux") as c:
        c.insert(np.ones(2), {"x": np.zeros((2, 2), np.float32)})
        tables = c.tables()
        assert TransitionSpec.from_json(json.dumps(tables["aux"]["spec"])) == spec
        assert tables["default"]["spec"] is None and tables["queue"]["spec"] is None
        # A helper on another table does not carry the client's spec there: raw items go in unchecked.
        with c.inserter(table="queue") as inserter:
            inserter.insert(np.ones(2), items("q", 2))
            inserter.flush()
        tables = c.tables()
        assert tables["queue"]["spec"] is None and tables["queue"]["size"] == 2


def test_table_stats_reads_one_tables_counters_of_a_stats_reply(client):
    client.insert(np.ones(3), items("q", 3), table="queue")
    stats = client.stats()
    assert stats["size"] == 0  # the reply's own names describe `default`
    queue = table_stats(stats, "queue")
    assert queue["size"] == 3 and queue["inserted"] == 3
    assert table_stats({"size": 7}, "queue") == {"size": 7}  # a server before tables: its one store's
    with pytest.raises(ValueError, match="no table 'nope'"):
        table_stats(stats, "nope")


def test_a_snapshot_holds_every_table_and_a_restart_restores_them(tmp_path):
    snap = str(tmp_path / "replay.snap")
    cfg = ServerConfig(port=0, tables=three_tables(), snapshot=snap)
    with ReplayServer(cfg) as srv, ReplayClient(srv.endpoint, timeout=10) as c:
        old = {
            "default": c.insert(np.arange(1.0, 5.0), items("d", 4)),
            "aux": c.insert(np.ones(2), items("a", 2), table="aux"),
            "queue": c.insert(np.ones(3), items("q", 3), table="queue"),
        }
    manifest = json.loads(pathlib.Path(snap).read_text())
    assert manifest["format"] == TABLES_SNAPSHOT_FORMAT
    assert [t["name"] for t in manifest["tables"]] == ["default", "aux", "queue"]
    assert [t["items"] for t in manifest["tables"]] == [4, 2, 3]
    with ReplayServer(cfg) as srv, ReplayClient(srv.endpoint, timeout=10) as c:
        assert {n: t["size"] for n, t in c.tables().items()} == {"default": 4, "aux": 2, "queue": 3}
        # restored keys stay valid in their own table, and stale in the others
        assert c.update_priorities(old["aux"], np.full(2, 2.0), table="aux") == 2
        assert c.update_priorities(old["aux"], np.full(2, 2.0), table="default") == 0
        assert c.erase(old["queue"], table="aux") == 0
        assert {bytes(x)[:1] for x in c.sample(8, table="queue").items} == {b"q"}
        c.insert(np.ones(1), items("d", 1))
    # a second save replaces the first generation's files
    manifest2 = json.loads(pathlib.Path(snap).read_text())
    assert manifest2["generation"] == manifest["generation"] + 1
    files = sorted(f for f in os.listdir(tmp_path) if ".g" in f and f.endswith(".snap"))
    assert files == sorted(t["file"] for t in manifest2["tables"])


def test_an_old_one_store_snapshot_loads_into_default(tmp_path):
    snap = str(tmp_path / "replay.snap")
    store = PrioritizedStore(capacity=100, epoch=5)
    keys = store.insert(np.ones(3), items("o", 3))
    store.save(snap)
    cfg = ServerConfig(port=0, tables=three_tables(), snapshot=snap)
    with ReplayServer(cfg) as srv, ReplayClient(srv.endpoint, timeout=10) as c:
        assert {n: t["size"] for n, t in c.tables().items()} == {"default": 3, "aux": 0, "queue": 0}
        assert c.update_priorities(keys, np.full(3, 2.0)) == 3
        assert c.update_priorities(keys, np.full(3, 2.0), table="aux") == 0
    # saved again with every table: now a tables snapshot
    assert json.loads(pathlib.Path(snap).read_text())["format"] == TABLES_SNAPSHOT_FORMAT
    # and a server without a table `default` refuses the old format, saying why
    store.save(str(tmp_path / "old.snap"))
    with pytest.raises(Exception, match="loads into the table 'default'"):
        ReplayServer(ServerConfig(port=0, tables=[TableConfig("other")], snapshot=str(tmp_path / "old.snap")))


def test_a_default_only_server_keeps_writing_the_one_store_format(tmp_path):
    snap = str(tmp_path / "replay.snap")
    with ReplayServer(ServerConfig(port=0, snapshot=snap)) as srv, ReplayClient(srv.endpoint, timeout=10) as c:
        c.insert(np.ones(2), items("d", 2))
    assert len(PrioritizedStore.load(snap, 7)) == 2


def test_epochs_of_consecutive_lives_never_meet(tmp_path):
    snap = str(tmp_path / "x.snap")
    first = choose_epochs(snap, 3)
    second = choose_epochs(snap, 3)
    assert len(set(first) | set(second)) == 6
    assert pathlib.Path(snap + ".epoch").read_text().strip() == str(second[-1])


def test_two_tables_of_one_name_are_refused():
    with pytest.raises(ValueError, match="both named .q."):
        ReplayServer(ServerConfig(port=0, tables=[TableConfig("q"), TableConfig("q")]))


def test_a_sharded_client_serves_a_table_over_several_servers():
    from apexrl.replay import ShardedReplayClient

    servers = [
        ReplayServer(ServerConfig(port=0, seed=3 + i, tables=[TableConfig("aux"), TableConfig("default")])).start()
        for i in range(2)
    ]
    try:
        endpoints = [s.endpoint for s in servers]
        with ShardedReplayClient(endpoints, seed=1) as sharded:
            keys_d = np.concatenate([sharded.insert(np.ones(2), items("d", 2)) for _ in range(2)])
            keys_a = np.concatenate([sharded.insert(np.full(2, 4.0), items("a", 2), table="aux") for _ in range(2)])
            assert [len(s.tables[0].store) for s in servers] == [2, 2]  # aux is index 0 on each server
            batch = sharded.sample(16, table="aux")
            assert set(batch.keys.tolist()) <= set(keys_a.tolist())
            assert {bytes(x)[:1] for x in batch.items} == {b"a"}
            assert np.isclose(batch.probabilities.sum() / 16, 0.25)  # 4 equal items over both servers
            assert sharded.update_priorities(keys_a, np.ones(4)) == 0  # the set's table is default
            assert sharded.update_priorities(keys_a, np.ones(4), table="aux") == 4
            assert sharded.erase(keys_d, table="aux") == 0
            assert sharded.erase(keys_d) == 4
        with ShardedReplayClient(endpoints, table="aux") as aux:
            assert set(aux.sample(8).keys.tolist()) <= set(keys_a.tolist())
            assert aux.tables()["aux"]["size"] == 2
    finally:
        for s in servers:
            s.stop()


def _consume(endpoint: str, out_path: str, done_path: str) -> None:
    """A consumer process: samples the queue table until the producer is done and the queue stays empty."""
    got: list[str] = []
    with ReplayClient(endpoint, timeout=30) as c:
        while True:
            try:
                batch = c.sample(3, timeout=0.2, table="q")
            except ServerTimeoutError:
                if os.path.exists(done_path):
                    break
                continue
            got.extend(bytes(x).decode() for x in batch.items)
    pathlib.Path(out_path).write_text("\n".join(got))


def test_a_fifo_queue_hands_every_item_to_exactly_one_of_four_consumer_processes(tmp_path):
    import multiprocessing

    tables = [TableConfig("q", sampler="fifo", capacity=64, max_times_sampled=1, rate_limiter=Queue(16))]
    with ReplayServer(ServerConfig(port=0, tables=tables)) as srv:
        ctx = multiprocessing.get_context("spawn")
        done = str(tmp_path / "done")
        outs = [str(tmp_path / f"c{i}.txt") for i in range(4)]
        consumers = [ctx.Process(target=_consume, args=(srv.endpoint, out, done)) for out in outs]
        for p in consumers:
            p.start()
        sent = [f"item{i}" for i in range(600)]
        with ReplayClient(srv.endpoint, timeout=30) as c:
            for i in range(0, len(sent), 5):  # waits while the queue is full
                c.insert(np.ones(5), [s.encode() for s in sent[i : i + 5]], timeout=20, table="q")
            wait_until(lambda: c.tables()["q"]["size"] == 0, "the consumers to drain the queue", 60)
        pathlib.Path(done).write_text("")
        for p in consumers:
            p.join(60)
            assert p.exitcode == 0
    received = [line for out in outs for line in pathlib.Path(out).read_text().splitlines() if line]
    assert sorted(received) == sorted(sent)  # none lost, none twice


def test_a_prioritized_a_uniform_and_a_fifo_queue_table_on_one_server():
    tables = [
        TableConfig("default"),
        TableConfig("aux", sampler="uniform", capacity=100, rate_limiter=MinSize(2)),
        TableConfig("onpolicy", sampler="fifo", capacity=8, max_times_sampled=1, rate_limiter=Queue(8)),
    ]
    with ReplayServer(ServerConfig(port=0, tables=tables)) as srv, ReplayClient(srv.endpoint, timeout=10) as c:
        c.insert(np.array([1.0, 100.0]), items("d", 2))
        c.insert(np.array([1.0, 100.0]), items("a", 2), table="aux")
        c.insert(np.ones(5), items("q", 5), table="onpolicy")
        prioritized = c.sample(64, beta=1.0)
        assert not np.allclose(prioritized.weights, 1.0)  # importance weights of unequal priorities
        uniform = c.sample(64, table="aux")
        assert np.allclose(uniform.weights, 1.0)  # no IS weights: ones
        assert {bytes(x) for x in uniform.items} == {b"a0", b"a1"}
        first = c.sample(3, table="onpolicy")
        assert [bytes(x) for x in first.items] == [b"q0", b"q1", b"q2"]  # oldest first, each once
        rest = c.sample(3, table="onpolicy")
        assert [bytes(x) for x in rest.items] == [b"q3", b"q4"]  # fewer: the queue held fewer
        assert c.tables()["onpolicy"]["size"] == 0
        with pytest.raises(ServerTimeoutError, match="the queue is empty"):
            c.sample(1, timeout=0.05, table="onpolicy")
        info = {t["name"]: t for t in c.hello().tables}
        assert (info["aux"]["sampler"], info["onpolicy"]["sampler"]) == ("uniform", "fifo")
        assert info["onpolicy"]["max_times_sampled"] == 1


def test_a_sharded_fifo_queue_returns_a_short_batch_rather_than_drop_what_it_handed_out():
    from apexrl.replay import ShardedReplayClient

    tables = [TableConfig("q", sampler="fifo", capacity=8, max_times_sampled=1, rate_limiter=Queue(8))]
    servers = [ReplayServer(ServerConfig(port=0, seed=i, tables=tables)).start() for i in range(2)]
    try:
        with ShardedReplayClient([s.endpoint for s in servers], table="q", seed=2) as sharded:
            for _ in range(2):  # round robin: one batch on each server
                sharded.insert(np.ones(2), items("x", 2))
            got = []
            while len(got) < 4:
                got.extend(bytes(x) for x in sharded.sample(8, timeout=1.0).items)
            assert sorted(got) == [b"x0", b"x0", b"x1", b"x1"]  # every item handed out once, none lost
            assert sum(len(s.tables[0].store) for s in servers) == 0
    finally:
        for s in servers:
            s.stop()


def two_tables_snapshot(tmp_path) -> tuple[str, list[TableConfig]]:
    """A tables snapshot of `replay` and `ordered`, 100 items each (the issue's first run)."""
    snap = str(tmp_path / "replay.snap")
    both = [TableConfig("replay", capacity=1000), TableConfig("ordered", capacity=1000, sampler="fifo")]
    with ReplayServer(ServerConfig(port=0, tables=both, snapshot=snap)) as srv, ReplayClient(srv.endpoint) as c:
        c.insert(np.ones(100), items("r", 100), table="replay")
        c.insert(np.ones(100), items("o", 100), table="ordered")
    return snap, both


def snapshot_files(tmp_path) -> dict[str, bytes]:
    return {f: (tmp_path / f).read_bytes() for f in sorted(os.listdir(tmp_path)) if f.startswith("replay.snap")}


def test_a_restart_that_leaves_a_table_out_refuses_to_start_and_changes_nothing(tmp_path):
    snap, both = two_tables_snapshot(tmp_path)
    before = snapshot_files(tmp_path)
    with pytest.raises(SnapshotLoadError) as e:
        ReplayServer(ServerConfig(port=0, tables=both[:1], snapshot=snap))
    message = str(e.value)
    assert "holds table(s) 'ordered' (100 items) that the configuration leaves out" in message
    assert "--drop-tables ordered" in message and "nothing was loaded or changed" in message
    assert snapshot_files(tmp_path) == before  # not even the epoch file moved
    # configured again, both tables come back whole (they came back empty before)
    with ReplayServer(ServerConfig(port=0, tables=both, snapshot=snap)) as srv, ReplayClient(srv.endpoint) as c:
        assert {n: t["size"] for n, t in c.tables().items()} == {"replay": 100, "ordered": 100}


def test_drop_tables_deletes_a_left_out_table_on_purpose(tmp_path, caplog):
    snap, both = two_tables_snapshot(tmp_path)
    cfg = ServerConfig(port=0, tables=both[:1], snapshot=snap, drop_tables=("ordered",))
    with caplog.at_level("WARNING"), ReplayServer(cfg) as srv, ReplayClient(srv.endpoint) as c:
        assert {n: t["size"] for n, t in c.tables().items()} == {"replay": 100}
    assert "holds table 'ordered', which is not configured: dropped on purpose" in caplog.text
    assert [t["name"] for t in json.loads(pathlib.Path(snap).read_text())["tables"]] == ["replay"]
    with ReplayServer(ServerConfig(port=0, tables=both, snapshot=snap)) as srv, ReplayClient(srv.endpoint) as c:
        assert {n: t["size"] for n, t in c.tables().items()} == {"replay": 100, "ordered": 0}


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"drop_tables": ("ordered",)}, "it needs a snapshot path"),
        ({"drop_tables": ("default",), "snapshot": "x.snap"}, "names configured table(s) ['default']"),
    ],
)
def test_drop_tables_is_checked(kwargs, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        ServerConfig(port=0, **kwargs)


def test_the_server_cli_names_the_left_out_table_and_exits(tmp_path):
    snap, both = two_tables_snapshot(tmp_path)
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps([both[0].to_json()]))
    args = [sys.executable, "-m", "apexrl.cli.server", "--port", "0", "--tables", str(tables), "--snapshot", snap]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "'ordered' (100 items)" in done.stderr and "--drop-tables ordered" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("count", [9_000_000_000_000_001, 2**63 - 1])
def test_counts_above_2_to_the_53_reach_the_native_limiter_exactly(start_server, tmp_path, count):
    # Read through a double, these counts were refused at start ("min_size must be a count >= 0") although
    # the flag's and the field's documented range is [1, 2^63 - 1].
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps([{"name": "big", "rate_limiter": {"kind": "min_size", "min_size": count}}]))
    for args, table in ((("--min-size-to-sample", str(count)), "default"), (("--tables", str(tables)), "big")):
        server = start_server(*args)
        with ReplayClient(server.endpoint, timeout=10) as c:
            c.insert(np.ones(3), items("x", 3), table=table)
            with pytest.raises(ServerTimeoutError):
                c.sample(1, table=table, timeout=0.2)
            assert c.tables()[table]["size"] == 3


def test_a_count_past_2_to_the_63_is_refused_by_the_cli_with_its_range():
    args = [sys.executable, "-m", "apexrl.cli.server", "--port", "0", "--min-size-to-sample", str(2**63)]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "9223372036854775807" in done.stderr
