"""What reaches the replay and how often (foreign items, priorities, exactly-once inserts), with real servers.

* The server knows the run's TransitionSpec (``--spec``, a snapshot's sidecar, or the first HELLO) and refuses
  a batch holding any foreign item; a learner that still meets one (a server without a spec) erases it, counts
  it and keeps training.
* A client learns the server's request limit from HELLO and refuses (ReplayClient) or splits
  (PipelinedInserter) a batch over it, instead of being disconnected by libzmq and timing out.
* An INSERT carries an insert_id; the same id again gets the first request's keys and stores nothing.
"""

from __future__ import annotations

import os
import time

import numpy as np
import pytest
import zmq

from apexrl._core import NativeInsertWindow as InsertWindow
from apexrl.apex.metrics import read_csv
from apexrl.errors import ServerError
from apexrl.replay.client.inserter import InsertTooLargeError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.server import ReplayServer
from apexrl.replay.server.config import ServerConfig
from apexrl.replay.server.insert_guard import spec_sidecar
from apexrl.replay.server.table_flags import table_from_flags
from apexrl.replay.tables import SampleToInsertRatio, TableConfig
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec
from tests.e2e.test_apex_processes import start_learner
from tests.helpers import wait_until

CARTPOLE = TransitionSpec(
    [
        FieldSpec("obs", "f4", (4,)),
        FieldSpec("action", "i4"),
        FieldSpec("reward", "f4"),
        FieldSpec("discount", "f4"),
        FieldSpec("next_obs", "f4", (4,)),
    ]
)
FOREIGN = b"\x01" * 41  # the 41-byte item of the issue: no CartPole transition


def cartpole_items(n: int, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    return CARTPOLE.encode(
        {
            "obs": rng.normal(size=(n, 4)).astype(np.float32),
            "action": rng.integers(0, 2, n).astype(np.int32),
            "reward": np.ones(n, np.float32),
            "discount": np.full(n, 0.99, np.float32),
            "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
        }
    )


def with_foreign_item(n_valid: int, at: int) -> list[bytes]:
    data, offsets = cartpole_items(n_valid)
    items = [bytes(it) for it in P.split_items(offsets, data)]
    items.insert(at, FOREIGN)
    return items


@pytest.fixture
def make_server():
    """make_server(**ServerConfig fields) -> a started in-process ReplayServer on 127.0.0.1 (stopped after)."""
    servers: list[ReplayServer] = []

    def make(**fields) -> ReplayServer:
        servers.append(ReplayServer(ServerConfig(bind="127.0.0.1", port=0, **fields)).start())
        return servers[-1]

    yield make
    for srv in servers:
        srv.stop()


@pytest.fixture
def server(make_server):
    return make_server()


def raw(endpoint: str) -> zmq.Socket:
    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(endpoint)
    return sock


def raw_call(sock: zmq.Socket, frames: list, op: P.Op, rid: int, wait_ms: int = 20000) -> P.Reply:
    sock.send_multipart(frames, copy=False)
    assert sock.poll(wait_ms), f"no reply to {op.name} {rid}"
    return P.decode_reply(sock.recv_multipart(), op, rid)


# ------------------------------------------------------------------------------------ case 2: the spec


def test_a_learner_erases_a_foreign_item_counts_it_and_trains_to_its_step_budget(start_server, spawn, tmp_path):
    """1,999 CartPole items and one 41-byte item through a server WITHOUT a spec (as in the issue): the real
    apexrl-learner keeps training past the item, exits 0 at --max-steps, metrics.csv counts the item, and the
    item is gone from the replay."""
    srv = start_server("--capacity", "20000", "--min-size-to-sample", "300")
    with ReplayClient(srv.endpoint, timeout=20) as client:
        items = with_foreign_item(1999, at=16)
        priorities = np.ones(len(items))
        priorities[16] = 1e4  # sampled in the learner's first batches, whatever the seed
        keys = client.insert(priorities, items)
        assert client.stats()["size"] == 2000
    run_dir = str(tmp_path / "run")
    steps = 120
    learner, _params = start_learner(spawn, srv.endpoint, run_dir, "--max-steps", str(steps), "--eval-every", "0")
    assert learner.proc.wait(300) == 0, learner.log()[-4000:]
    cols = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert cols["learner_steps"][-1] >= steps
    assert cols["undecodable_items"][-1] >= 1
    assert "Traceback" not in learner.log(), learner.log()[-4000:]
    assert "undecodable" in learner.log()
    with ReplayClient(srv.endpoint, timeout=20) as client:
        stats = client.stats()
        assert stats["size"] == 1999 and stats["erased_items"] == 1
        assert client.update_priorities(keys[16:17], [1.0]) == 0  # the foreign item's key addresses nothing
        assert client.update_priorities(keys[:16], np.ones(16)) == 16


def test_a_server_started_with_a_spec_refuses_a_batch_with_a_foreign_item(start_server, tmp_path):
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(CARTPOLE.to_json(), encoding="utf-8")
    srv = start_server("--spec", str(spec_path))
    with ReplayClient(srv.endpoint, timeout=20) as client:
        with pytest.raises(
            ServerError, match=r"item 16: 41 bytes, expected exactly 48 for TransitionSpec\(obs"
        ) as info:
            client.insert(np.ones(2000), with_foreign_item(1999, at=16))
        assert info.value.status == P.Status.INVALID_ARGUMENT
        assert "nothing stored" in str(info.value)
        stats = client.stats()
        assert stats["size"] == 0 and stats["spec_refused_inserts"] == 1
        assert stats["spec_fingerprint"] == CARTPOLE.fingerprint
        data, offsets = cartpole_items(10)
        assert len(client.insert(np.ones(10), data=data, offsets=offsets)) == 10  # the server keeps serving
        assert client.hello().spec == CARTPOLE


def test_a_foreign_fingerprint_and_a_wrong_block_length_are_refused(server):
    atari = TransitionSpec.atari(2, 8, 8)
    with ReplayClient(server.endpoint, timeout=20, spec=atari) as client:
        rng = np.random.default_rng(0)
        batch = {
            "obs": rng.integers(0, 255, (3, 2, 8, 8), dtype=np.uint8),
            "action": np.zeros(3, np.int32),
            "reward": np.zeros(3, np.float32),
            "discount": np.ones(3, np.float32),
            "next_obs": rng.integers(0, 255, (3, 2, 8, 8), dtype=np.uint8),
        }
        data, offsets = atari.encode(batch)
        assert len(client.insert(np.ones(3), data=data, offsets=offsets)) == 3  # declares the spec first
        bad = data.copy()
        bad[int(offsets[1]) + 4 + atari.raw_item_bytes + 3] ^= 0x7F  # item 1: first block length, high byte
        with pytest.raises(ServerError, match=r"item 1: field 'obs': block of \d+ bytes overruns the item"):
            client.insert(np.ones(3), data=bad, offsets=offsets)
        other = data.copy()
        other[int(offsets[2])] ^= 1  # item 2's fingerprint
        with pytest.raises(ServerError, match=r"item 2: spec fingerprint 0x[0-9a-f]+, expected"):
            client.insert(np.ones(3), data=other, offsets=offsets)
        assert client.stats()["size"] == 3


def test_the_first_declared_spec_sticks_and_another_is_refused_naming_both(server):
    with ReplayClient(server.endpoint, timeout=20) as anonymous:
        info = anonymous.hello()
        assert info.spec is None
        assert info.protocol_version == P.PROTOCOL_VERSION == 6
        assert info.max_request_bytes == info.max_reply_bytes == server.config.max_bytes
    with ReplayClient(server.endpoint, timeout=20, spec=CARTPOLE) as first:
        assert first.hello().spec == CARTPOLE
    other = TransitionSpec.dpg(3, 1)
    with ReplayClient(server.endpoint, timeout=20, spec=other) as second:
        with pytest.raises(
            ServerError,
            match=r"declared spec TransitionSpec\(obs:<f4\[3\].*differs from the server's "
            r"spec TransitionSpec\(obs:<f4\[4\], action:<i4",
        ) as exc:
            second.insert(np.ones(1), [b"x" * other.fixed_item_bytes])
        assert exc.value.status == P.Status.INVALID_ARGUMENT
    with ReplayClient(server.endpoint, timeout=20) as client:
        assert client.hello().spec == CARTPOLE and client.stats()["size"] == 0


def test_a_snapshot_restart_keeps_the_declared_spec(tmp_path):
    snap = str(tmp_path / "replay.snap")
    with ReplayServer(ServerConfig(port=0, snapshot=snap)) as srv:
        with ReplayClient(srv.endpoint, timeout=20, spec=CARTPOLE) as client:
            data, offsets = cartpole_items(5)
            client.insert(np.ones(5), data=data, offsets=offsets)
    with open(spec_sidecar(snap), encoding="utf-8") as f:
        assert TransitionSpec.from_json(f.read()) == CARTPOLE
    with ReplayServer(ServerConfig(port=0, snapshot=snap)) as srv:
        with ReplayClient(srv.endpoint, timeout=20) as client:
            assert client.hello().spec == CARTPOLE
            with pytest.raises(ServerError, match=r"item 0: 41 bytes, expected exactly 48"):
                client.insert([1.0], [FOREIGN])
            assert client.stats()["size"] == 5
    with pytest.raises(ValueError, match=r"differs from the spec .* kept with the snapshot"):
        ReplayServer(
            ServerConfig(port=0, snapshot=snap, tables=[TableConfig("default", spec=TransitionSpec.dpg(2, 1))])
        )


def test_a_bad_spec_option_is_refused_naming_it(tmp_path):
    with pytest.raises(ValueError, match=r"spec 'no/such/spec.json' is neither spec JSON nor a readable file"):
        table_from_flags({"spec": "no/such/spec.json"})
    with pytest.raises(ValueError, match=r"spec JSON"):
        table_from_flags({"spec": '{"fields": []}'})


def test_erase_removes_items_and_counts_them(server):
    with ReplayClient(server.endpoint, timeout=20) as client:
        keys = client.insert(np.ones(4), [b"a", b"b", b"c", b"d"])
        assert client.erase(keys[:2]) == 2
        assert client.erase(keys[:2]) == 0  # already gone
        stats = client.stats()
        assert stats["size"] == 2 and stats["erased_items"] == 2 and stats["requests_erase"] == 2
        assert set(client.sample(16).keys.tolist()) <= set(keys[2:].tolist())


def test_decode_valid_leaves_out_bad_items_and_names_the_first():
    data, offsets = cartpole_items(5)
    items = [bytes(it) for it in P.split_items(offsets, data)]
    items[1] = FOREIGN
    items[3] = b"\0\0\0\0" + items[3][4:]  # another fingerprint
    data2, offsets2 = P.pack_items(items)
    mask, first = CARTPOLE.invalid_items(data2, offsets2)
    assert mask.tolist() == [False, True, False, True, False]
    assert first.startswith("item 1: 41 bytes, expected exactly 48")
    fields, bad, message = CARTPOLE.decode_valid(data2, offsets2)
    assert bad.tolist() == mask.tolist() and message == first
    whole = CARTPOLE.decode(data, offsets)
    np.testing.assert_array_equal(fields["obs"], whole["obs"][[0, 2, 4]])
    fields, bad, message = CARTPOLE.decode_valid(data, offsets)
    assert bad is None and message is None and fields["obs"].shape == (5, 4)


def test_decode_valid_finds_a_corrupted_lz4_payload():
    atari = TransitionSpec.atari(2, 8, 8)
    rng = np.random.default_rng(1)
    batch = {
        "obs": rng.integers(0, 4, (3, 2, 8, 8), dtype=np.uint8),
        "action": np.arange(3, dtype=np.int32),
        "reward": np.zeros(3, np.float32),
        "discount": np.ones(3, np.float32),
        "next_obs": rng.integers(0, 4, (3, 2, 8, 8), dtype=np.uint8),
    }
    data, offsets = atari.encode(batch)
    start = int(offsets[2]) + 4 + atari.raw_item_bytes + 4
    data[start : start + 4] = 0xFF  # item 2's first lz4 block: lengths intact, payload garbage
    atari.validate_items(data, offsets)  # the length walk cannot see it ...
    fields, bad, message = atari.decode_valid(data, offsets)  # ... decoding can
    assert bad.tolist() == [False, False, True] and message.startswith("item 2: ")
    assert fields["action"].tolist() == [0, 1]


# ---------------------------------------------------------------------------- case 9: over the size cap


def test_an_insert_over_the_servers_limit_is_refused_before_sending(start_server):
    srv = start_server("--max-message-mb", "1")
    with ReplayClient(srv.endpoint, timeout=5) as client:
        items = [b"\x07" * 4096] * 300  # 1.2 MB of items, each small
        with pytest.raises(
            InsertTooLargeError,
            match=r"INSERT of 300 items is 12\d{5} bytes, over the server's "
            r"limit of 1048576 bytes",
        ) as info:
            client.insert(np.ones(300), items)
        assert isinstance(info.value, ValueError)
        stats = client.stats()
        assert stats["requests_insert"] == 0 and stats["size"] == 0  # nothing was sent
        assert len(client.insert(np.ones(100), items[:100])) == 100  # the connection is fine

        with client.inserter(max_in_flight=2) as inserter:  # the inserter splits instead
            inserter.insert(np.ones(300), items)
            inserter.flush()
            counts = inserter.stats()
            assert counts["acked_items"] == 300 and counts["failed"] == 0 and counts["split_requests"] >= 1
            with pytest.raises(InsertTooLargeError, match=r"item 1 of the batch is 1100000 bytes"):
                inserter.insert(np.ones(2), [b"a", b"b" * 1_100_000])
            assert inserter.stats()["submitted_items"] == 300  # nothing of that batch was sent
        assert client.stats()["size"] == 400


# ---------------------------------------------------------------------------------- exactly-once inserts


def test_the_same_insert_sent_twice_is_stored_once_with_the_same_keys(server):
    sock = raw(server.endpoint)
    try:
        data, offsets = P.pack_items([b"one", b"two", b"three"])
        first = raw_call(sock, P.encode_insert(1, [1.0, 2.0, 3.0], data, offsets, 0, (0xABCD, 7)), P.Op.INSERT, 1)
        again = raw_call(sock, P.encode_insert(2, [1.0, 2.0, 3.0], data, offsets, 0, (0xABCD, 7)), P.Op.INSERT, 2)
        assert first.ok and again.ok
        assert again.arrays["keys"].tolist() == first.arrays["keys"].tolist()
        other = raw_call(sock, P.encode_insert(3, [1.0], b"x", [0, 1], 0, (0xABCD, 8)), P.Op.INSERT, 3)
        plain = [raw_call(sock, P.encode_insert(4 + i, [1.0], b"y", [0, 1]), P.Op.INSERT, 4 + i) for i in range(2)]
        assert plain[0].arrays["keys"].tolist() != plain[1].arrays["keys"].tolist()  # (0, 0): no de-duplication
        stats = raw_call(sock, P.encode_stats(9), P.Op.STATS, 9).stats
        assert stats["size"] == 3 + 1 + 2 and stats["inserted"] == 6
        assert stats["duplicate_inserts"] == 1 and len(other.arrays["keys"]) == 1
    finally:
        sock.close(linger=0)


def test_a_retry_after_a_client_timeout_while_the_insert_waited_is_stored_once(make_server):
    """The first request waits in the rate limiter; the client gives up (new socket) and sends the same batch
    again with the same id; once the learner samples, the batch is stored once and the retry gets its keys."""
    server = make_server(tables=[TableConfig("default", rate_limiter=SampleToInsertRatio(1.0, 1, 10.0))])
    with ReplayClient(server.endpoint, timeout=20) as learner:
        learner.insert(
            np.ones(10), [b"%d" % i for i in range(10)]
        )  # I = 10: an insert of 5 is over the bound (14 > 10)
        data, offsets = P.pack_items([b"a", b"b", b"c", b"d", b"e"])
        insert_id = (0x5EED, 1)
        first = raw(server.endpoint)
        first.send_multipart(P.encode_insert(21, np.ones(5), data, offsets, 60_000, insert_id), copy=False)
        wait_until(lambda: learner.stats()["rate_limiter_waits_insert"] >= 1, 30, "the insert to wait", interval=0.5)
        first.close(linger=0)  # the client timed out: its socket (and the late reply) is gone
        retry = raw(server.endpoint)
        retry.send_multipart(P.encode_insert(22, np.ones(5), data, offsets, 60_000, insert_id), copy=False)
        assert retry.poll(300) == 0  # held back while the first request waits
        assert len(learner.sample(10, timeout=10)) == 10  # the learner catches up: the first request is served
        assert retry.poll(30_000), "the retry got no answer"
        reply = P.decode_reply(retry.recv_multipart(), P.Op.INSERT, 22)
        retry.close(linger=0)
        assert reply.ok, reply.message
        stats = learner.stats()
        assert stats["size"] == 15 and stats["inserted"] == 15 and stats["duplicate_inserts"] == 1
        assert learner.update_priorities(reply.arrays["keys"], np.ones(5)) == 5  # the keys of the stored batch


def test_the_client_reuses_an_insert_id_across_retries(server):
    with ReplayClient(server.endpoint, timeout=20) as client:
        insert_id = client.next_insert_id()
        a = client.insert([1.0, 1.0], [b"p", b"q"], insert_id=insert_id)
        b = client.insert([1.0, 1.0], [b"p", b"q"], insert_id=insert_id)  # as the actor's retry loop does
        c = client.insert([1.0, 1.0], [b"p", b"q"])  # a new batch: a new id
        assert a.tolist() == b.tolist() != c.tolist()
        assert client.next_insert_id()[0] == insert_id[0] and client.next_insert_id()[1] > insert_id[1]
        assert client.stats()["size"] == 4
    with ReplayClient(server.endpoint, timeout=20) as other:
        assert other.next_insert_id()[0] != insert_id[0]  # another session


def test_the_window_is_bounded_by_count_and_by_bytes():
    window = InsertWindow(max_ids=3, max_bytes=10_000)
    now = time.monotonic()
    for i in range(5):
        assert window.claim("", 1, i, i, now + 1, now)[0] == "new"
        window.finish("", 1, i, i, [0, 1])
    stats = window.stats()
    assert (stats["duplicate_inserts"], stats["insert_ids_remembered"], stats["insert_ids_forgotten"]) == (0, 3, 2)
    assert stats["insert_ids_pending"] == 0
    state, keys = window.claim("", 1, 4, 99, 0.0, now)
    assert state == "done" and keys == [0, 1]
    assert window.claim("", 1, 0, 100, now + 1, now)[0] == "new"  # forgotten: stored again
    big = InsertWindow(max_ids=100, max_bytes=10_000)
    for i in range(3):
        big.claim("", 2, i, i, 0.0, now)
        big.finish("", 2, i, i, [0] * 500)  # 4,000 bytes of keys each
    assert big.stats()["insert_ids_remembered"] == 2


def test_a_duplicate_of_a_request_still_waiting_is_held_back_not_stored():
    window = InsertWindow(max_ids=65536, max_bytes=64 << 20)
    owner, retry = 1, 2
    now = time.monotonic()
    assert window.claim("", 3, 1, owner, now + 60, now)[0] == "new"
    assert window.claim("", 3, 1, retry, now + 60, now)[0] == "busy"
    assert window.stats()["insert_ids_pending"] == 1
    window.release("", 3, 1, owner)  # the first request failed without storing: the retry may store
    assert window.claim("", 3, 1, retry, now + 60, now)[0] == "new"
    window.finish("", 3, 1, retry, [9])
    state, keys = window.claim("", 3, 1, owner, 0.0, now)
    assert state == "done" and keys == [9]
    assert window.stats()["insert_ids_pending"] == 0


def test_an_owner_past_its_deadline_never_blocks_a_retry():
    window = InsertWindow(max_ids=16, max_bytes=1 << 20)
    now = time.monotonic()
    assert window.claim("", 4, 1, 1, now + 2, now)[0] == "new"
    assert window.claim("", 4, 1, 2, now + 2, now + 1)[0] == "busy"
    assert window.claim("", 4, 1, 2, now + 5, now + 3)[0] == "new"  # the first owner's (clipped) deadline passed


def test_each_client_identity_has_its_own_window():
    """One identity's 65,536 new ids never push out another's (the insert id window is per identity)."""
    window = InsertWindow(max_ids=4, max_bytes=1 << 20)
    now = time.monotonic()
    window.claim("learner", 1, 1, 1, now + 1, now)
    window.finish("learner", 1, 1, 1, [42])
    for i in range(50):
        window.claim("actor:a", 9, i, 100 + i, now + 1, now)
        window.finish("actor:a", 9, i, 100 + i, [i])
    assert window.claim("learner", 1, 1, 999, now + 1, now) == ("done", [42])
    assert window.claim("actor:a", 1, 1, 1000, now + 1, now)[0] == "new"  # ids are per identity


def test_the_protocol_doc_describes_the_window_bounds():
    from apexrl.replay.server import insert_guard

    with open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "protocol.md"), encoding="utf-8") as f:
        text = f.read()
    assert f"{insert_guard.DEDUP_MAX_IDS:,}" in text and f"{insert_guard.DEDUP_MAX_BYTES >> 20} MiB" in text


@pytest.mark.parametrize(
    "spec",
    [
        CARTPOLE,
        TransitionSpec.atari(2, 6, 6),
        TransitionSpec(
            [FieldSpec("a", "u1", (0,), compress=True), FieldSpec("b", "i4"), FieldSpec("c", "u1", (5,), compress=True)]
        ),
    ],
    ids=["fixed", "atari", "zero-size-lz4"],
)
def test_the_fast_item_check_agrees_with_the_precise_one(spec):
    """The server's fast path (_items_ok) accepts exactly the batches the precise rules (_item_problems) accept,
    on thousands of mutated batches: flipped bytes (lengths, fingerprints), moved offsets, cut items."""
    rng = np.random.default_rng(7)
    batch = {f.name: rng.integers(0, 3, (6, *f.shape)).astype(f.dtype) for f in spec.fields}
    data, offsets = spec.encode(batch)
    agreed = {True: 0, False: 0}
    for _ in range(3000):
        d, o = data.copy(), offsets.astype(np.int64)
        for _ in range(int(rng.integers(1, 3))):
            kind = rng.integers(0, 3)
            if kind == 0 and d.size:
                d[rng.integers(0, d.size)] ^= np.uint8(1 << int(rng.integers(0, 8)))
            elif kind == 1:
                i = int(rng.integers(1, len(o) - 1))
                o[i] = np.clip(o[i] + rng.integers(-6, 7), o[i - 1], o[i + 1])
            else:
                i = int(rng.integers(0, len(o) - 1))
                cut = min(int(rng.integers(1, 6)), int(o[i + 1] - o[i]))
                d = np.delete(d, np.arange(int(o[i + 1]) - cut, int(o[i + 1])))
                o[i + 1 :] -= cut
        buf, starts, sizes = spec._check_buffer(d, o)
        fast = spec._items_ok(buf, starts, sizes)
        _bad, reason = spec._item_problems(buf, starts, sizes)
        assert fast == (reason is None), (fast, reason)
        if spec._packed_ok(d, o.astype(np.uint64)) is not None:  # the packed fixed-size path never errs either
            assert reason is None
        agreed[fast] += 1
    assert agreed[True] and agreed[False] > 1000, agreed
