"""Slices tables on a real replay server (127.0.0.1): episodes inserted whole over the wire, windows sampled as
window items whose native decode equals the in-process SliceTable's for the same seed (keys, weights, steps,
masks) and the generic sequence decoder's, priority updates by window key, hostile episode records refused with
nothing changed and the server serving on, the ops a slices table refuses, RESET, its MinSize counted in windows,
HELLO and STATS, and its configuration's errors."""

from __future__ import annotations

import pathlib
import threading

import numpy as np
import pytest

from apexrl.errors import ServerError, ServerTimeoutError
from apexrl.replay import ReplayClient, ReplayServer, ServerConfig
from apexrl.replay.server.epoch import SnapshotLoadError
from apexrl.replay.server.tables import read_tables_manifest
from apexrl.replay.slices import SliceTable
from apexrl.replay.tables import MinSize, Queue, TableConfig, tables_from_json
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import windows as W
from apexrl.replay.wire.episodes import chunk_columns, encode_episode, episode_chunks
from apexrl.replay.wire.schema import Status
from tests.helpers import wait_until

SEED = 3
EQ = {"capacity": 64, "length": 3, "burn_in": 2, "sampler": "prioritized", "strict_length": False, "span": 1}


def episode(n: int, base: int = 0) -> dict:
    t = np.arange(base, base + n)
    return {"obs": np.stack([t, -t, 2 * t], axis=1).astype(np.float32), "act": {"a": t.astype(np.int64)}}


@pytest.fixture(scope="module")
def server():
    tables = [
        TableConfig("default", capacity=100),
        TableConfig("eq", kind="slices", **EQ),  # index 1: seed SEED + 1
        TableConfig("w", kind="slices", capacity=40, length=4, sampler="uniform", rate_limiter=MinSize(3)),
    ]
    with ReplayServer(ServerConfig(port=0, seed=SEED, tables=tables)) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    with ReplayClient(server.endpoint, timeout=10) as c:
        yield c


def test_windows_over_the_wire_equal_the_in_process_reference(client):
    ref = SliceTable(EQ["capacity"], EQ["length"], burn_in=EQ["burn_in"], strict_length=False, span=1, seed=SEED + 1)
    rng = np.random.default_rng(0)
    for i, n in enumerate([5, 9, 2, 12, 4]):
        p = rng.uniform(0.1, 3.0, size=n)
        assert client.insert_episode(episode(n, 100 * i), p, table="eq") == ref.insert_episode(episode(n, 100 * i), p)
    for beta in (0.4, 0.0):
        got, want = client.sample(16, beta, table="eq"), ref.sample(16, beta)
        np.testing.assert_array_equal(got.keys, want.keys)
        np.testing.assert_allclose(got.weights, want.weights)
        np.testing.assert_allclose(got.probabilities, want.probabilities)
        assert got.sequences is not None and got.sequences.valid.all()
        # The reply's window items, decoded natively, give what the generic sequence decoder gives for them.
        assert W.is_window_reply(got.data, got.offsets)
        generic = W.decode_window_items(got.data, got.offsets, got.chunks, native=False)
        assert generic.valid.all()
        np.testing.assert_array_equal(got.sequences.mask, generic.mask)
        np.testing.assert_array_equal(got.sequences.num_steps, generic.num_steps)
        np.testing.assert_array_equal(got.fields["obs"], generic.fields["obs"])
        np.testing.assert_array_equal(got.fields["act"]["a"], generic.fields["act"]["a"])
        np.testing.assert_array_equal(got.mask, want.steps.mask)
        assert not got.mask.all()  # span and a short episode: some windows run past their episode's end
        np.testing.assert_array_equal(got.fields["obs"], want.steps.fields["obs"])
        np.testing.assert_array_equal(got.fields["act"]["a"], want.steps.fields["act"]["a"])
        # The window's first step: its episode's step `start` (obs[:, 0] is base + step).
        episodes, starts = want.episodes, want.starts
        np.testing.assert_array_equal(got.fields["obs"][:, 0, 0], 100 * episodes + starts)
    # One value per window lands on its trained steps on both sides: the same masses, the same next draws.
    keys = got.keys[:5]
    assert client.update_priorities(keys, np.arange(1.0, 6.0), table="eq") == ref.update_priorities(
        keys, np.arange(1.0, 6.0)
    )
    stats = client.tables()["eq"]
    assert stats["total_mass"] == pytest.approx(ref.stats()["total_mass"])
    assert stats["slice_windows"] == stats["size"] == ref.stats()["windows"]
    np.testing.assert_array_equal(client.sample(8, table="eq").keys, ref.sample(8).keys)


def good_parts(n: int = 6, chunk_length: int = 4):
    chunks, counts, fp = episode_chunks(episode(n), chunk_length)
    columns, _ = chunk_columns(chunks)
    return chunks, counts, fp, columns


def hostile_inserts():
    """(what, record, chunks, refs) of INSERTs a slices table must refuse."""
    chunks, counts, fp, columns = good_parts()
    ok = encode_episode(fp, counts, columns)
    refs = [list(range(len(chunks)))]
    far = columns.copy()
    far[1, 0, 0] = 10**6  # a column past its chunk's end
    codec = columns.copy()
    codec[0, 1, 2] = 7
    nan = encode_episode(fp, counts, columns, np.r_[np.ones(5), np.nan])
    yield "bad magic", b"APXX" + ok[4:], chunks, refs
    yield "short header", ok[:20], chunks, refs
    yield "truncated", ok[:-8], chunks, refs
    yield "trailing bytes", ok + b"\0" * 8, chunks, refs
    yield "unknown flags", ok[:6] + b"\x02\x00" + ok[8:], chunks, refs
    yield (
        "more chunks than sent",
        encode_episode(fp, [*counts, 2], np.concatenate([columns, columns[:1]])),
        chunks,
        refs,
    )
    yield "a chunk of 0 steps", encode_episode(fp, [0, *counts[1:]], columns), chunks, refs
    yield "column outside its chunk", encode_episode(fp, counts, far), chunks, refs
    yield "unknown codec", encode_episode(fp, counts, codec), chunks, refs
    yield "nan step priority", nan, chunks, refs
    yield "chunks out of order", ok, chunks, [refs[0][::-1]]
    yield "longer than the table", *_long_episode()


def _long_episode():
    chunks, counts, fp, columns = good_parts(41, 8)
    return encode_episode(fp, counts, columns), chunks, [list(range(len(chunks)))]


def test_hostile_records_are_refused_change_nothing_and_the_server_serves_on(client):
    client.reset(table="w")
    before = client.tables()["w"]
    for what, record, chunks, refs in hostile_inserts():
        with pytest.raises(ServerError) as e:
            client.insert(np.ones(1), [record], chunks=P.pack_chunks(chunks, refs), table="w")
        assert e.value.status == Status.INVALID_ARGUMENT, what
        assert "INSERT refused, nothing stored" in e.value.message, what
    # Two episodes in one INSERT: one per request.
    chunks, counts, fp, columns = good_parts()
    record = encode_episode(fp, counts, columns)
    two = P.pack_chunks(chunks + chunks, [range(len(chunks)), range(len(chunks), 2 * len(chunks))])
    with pytest.raises(ServerError, match="one episode per INSERT"):
        client.insert(np.ones(2), [record, record], chunks=two, table="w")
    after = client.tables()["w"]
    for key in ("slice_inserted_episodes", "slice_steps", "size", "rate_limiter_inserted_items"):
        assert after[key] == before[key], key
    # It serves on: a good episode goes in and its windows come out.
    assert client.insert_episode(episode(6), table="w", chunk_length=4) >= 0
    batch = client.sample(4, table="w")
    assert batch.mask.shape == (4, 4) and batch.mask.all()
    # An episode of another field count than the table's episodes: what only the table knows, refused the same way.
    with pytest.raises(ServerError, match="INSERT refused, nothing stored: an episode of 1 fields") as e:
        client.insert_episode({"x": np.zeros(5)}, table="w")
    assert (
        e.value.status == Status.INVALID_ARGUMENT
        and client.tables()["w"]["slice_inserted_episodes"] == 1 + before["slice_inserted_episodes"]
    )
    big = client.sample(1500, table="w")  # above the loop's inline_sample_max: drawn by a worker thread
    assert big.sequences is not None and big.sequences.valid.all() and big.mask.all()
    with client.sampler(4, table="w", prefetch=2) as windows:  # the learner's prefetching threads serve windows too
        ahead = next(iter(windows))
    assert ahead.raw.mask.shape == (4, 4) and ahead.raw.fields["obs"].shape == (4, 4, 3)


def test_min_size_counts_windows_reset_clears_and_item_ops_are_refused(server, client):
    client.reset(table="w")
    client.insert_episode(episode(5), table="w")  # 2 windows of 4 steps: fewer than MinSize(3)
    with pytest.raises(ServerTimeoutError, match="windows, fewer than min_size_to_sample=3"):
        client.sample(2, table="w")
    # A SAMPLE that may wait waits for windows, and the episode that brings them releases it.
    got: list = []
    with ReplayClient(server.endpoint, timeout=30) as learner:
        waiter = threading.Thread(target=lambda: got.append(learner.sample(2, table="w", timeout=30)))
        waiter.start()
        wait_until(lambda: client.tables()["w"]["deferred"] == 1, 30, "the SAMPLE to wait")
        client.insert_episode(episode(4), 2.0, table="w")
        waiter.join(30)
    assert got and got[0].keys.shape == (2,) and got[0].mask.shape == (2, 4)
    for call in (lambda: client.erase(np.zeros(1, np.uint64), table="w"), lambda: client.remove_to_fit(table="w")):
        with pytest.raises(ServerError, match="this is a slices table") as e:
            call()
        assert e.value.status == Status.INVALID_ARGUMENT
    assert client.reset(table="w") == 2
    w = client.tables()["w"]
    assert (w["size"], w["slice_episodes"], w["kind"], w["length"], w["burn_in"]) == (0, 0, "slices", 4, 0)
    assert client.tables()["default"]["kind"] == "items"
    with pytest.raises(ValueError, match="table 'default' holds items"):
        client.insert_episode(episode(5), table="default")


def test_slices_table_configuration_errors():
    with pytest.raises(ValueError, match="needs length"):
        TableConfig("s", kind="slices")
    with pytest.raises(ValueError, match="rate_limiter.*MinSize"):
        TableConfig("s", kind="slices", length=4, rate_limiter=Queue(4))
    with pytest.raises(ValueError, match="length: is for kind='slices'"):
        TableConfig("s", length=4)
    with pytest.raises(ValueError, match="span: must be below length"):
        TableConfig("s", kind="slices", length=4, span=4)
    with pytest.raises(ValueError, match="takes no max_size"):
        TableConfig("s", kind="slices", length=4, max_size=10**7)
    with pytest.raises(ValueError, match=r"table 1 \('s'\): sampler"):
        tables_from_json([{"name": "default"}, {"name": "s", "kind": "slices", "length": 2, "sampler": "fifo"}])
    t = TableConfig("s", kind="slices", length=8, burn_in=2, eta=0.5, span=3)
    assert TableConfig.from_json(t.to_json()) == t
    with pytest.raises(ValueError, match="cannot be the server's main table"):
        ServerConfig(port=0, tables=[t, TableConfig("aux")]).validate()


def test_a_checkpoint_holds_a_slices_tables_episodes_and_the_next_life_serves_them_under_the_same_keys(tmp_path):
    snapshot = str(tmp_path / "replay.snap")
    s = TableConfig("s", kind="slices", capacity=20, length=2, burn_in=1)
    tables = [TableConfig("default", capacity=10), s]
    p = np.array([0.5, 1.0, 2.0, 4.0, 8.0])
    with ReplayServer(ServerConfig(port=0, tables=tables, snapshot=snapshot)) as srv, ReplayClient(srv.endpoint) as c:
        c.insert(np.ones(3), [b"a", b"b", b"c"])
        assert c.insert_episode(episode(5), p, table="s") == 0
        assert c.insert_episode(episode(7, 100), table="s") == 1
        keys = c.sample(6, table="s").keys
        assert c.update_priorities(keys[:2], [3.0, 5.0], table="s") == 2
        before = c.tables()["s"]
        assert c.checkpoint() == snapshot
    manifest = read_tables_manifest(snapshot)
    (entry,) = [e for e in manifest["tables"] if e["name"] == "s"]
    assert (entry["kind"], entry["episodes"]) == ("slices", 2) and entry["file"].endswith(".slices")
    with ReplayServer(ServerConfig(port=0, tables=tables, snapshot=snapshot)) as srv, ReplayClient(srv.endpoint) as c:
        t = c.tables()
        assert t["default"]["size"] == 3
        for k in ("size", "episodes", "steps", "chunk_bytes", "total_mass"):
            assert t["s"][k] == pytest.approx(before[k]), k
        # The keys of the life before address the same windows: updates land (none stale), samples decode them.
        assert c.update_priorities(keys, np.ones(len(keys)), table="s") == len(keys)
        got = c.sample(32, table="s")
        episodes, starts = got.keys >> 24, got.keys & ((1 << 24) - 1)
        np.testing.assert_array_equal(got.fields["obs"][:, 0, 0], 100 * episodes + starts)
        assert c.insert_episode(episode(4, 200), table="s") == 2  # numbering goes on
    # A new life may draw other windows from the same episodes: here 4 trained steps after 1 of burn-in.
    longer = TableConfig("s", kind="slices", capacity=20, length=4, burn_in=1)
    with ReplayServer(ServerConfig(port=0, tables=[tables[0], longer], snapshot=snapshot)) as srv:
        with ReplayClient(srv.endpoint) as c:
            t = c.tables()["s"]
            # The second life's stop saved its new episode too: 5, 7 and 4 steps, whose windows of 5 steps (strict)
            # start at 0, at 0..2, and nowhere.
            assert (t["episodes"], t["steps"], t["size"]) == (3, 16, 1 + 3 + 0)


def test_a_slices_tables_snapshot_file_that_is_corrupt_or_of_another_kind_stops_the_start_and_changes_nothing(
    tmp_path,
):
    snapshot = str(tmp_path / "replay.snap")
    tables = [TableConfig("default", capacity=10), TableConfig("s", kind="slices", capacity=20, length=2)]
    with ReplayServer(ServerConfig(port=0, tables=tables, snapshot=snapshot)) as srv, ReplayClient(srv.endpoint) as c:
        c.insert_episode(episode(5), table="s")
        c.checkpoint()
    (entry,) = [e for e in read_tables_manifest(snapshot)["tables"] if e["name"] == "s"]
    as_items = [tables[0], TableConfig("s", capacity=20)]
    with pytest.raises(SnapshotLoadError, match="holds table 's' as a slices table"):
        ReplayServer(ServerConfig(port=0, tables=as_items, snapshot=snapshot)).start()
    file = pathlib.Path(entry["file"])
    data = bytearray(file.read_bytes())
    data[len(data) // 2] ^= 0xFF
    file.write_bytes(bytes(data))
    with pytest.raises(SnapshotLoadError, match="cannot load slices table 's'"):
        ReplayServer(ServerConfig(port=0, tables=tables, snapshot=snapshot)).start()
    file.write_bytes(bytes(data[:40]))
    with pytest.raises(SnapshotLoadError, match="truncated"):
        ReplayServer(ServerConfig(port=0, tables=tables, snapshot=snapshot)).start()
    assert file.stat().st_size == 40  # nothing rewrote it
