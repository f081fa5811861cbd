"""ShardedReplayClient: several replay servers sampled as one prioritized replay (real servers on 127.0.0.1).

The statistical test fixes every seed (servers and client), so it draws the same batches on every run; the
p-value floor guards against a wrong distribution, not against bad luck.
"""

from __future__ import annotations

import contextlib
import os
import signal
from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl import PrioritizedStore
from apexrl.errors import ReplayTimeout, ServerTimeoutError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.client.sharded import (
    ShardedReplayClient,
    connect,
    max_lock_shards,
    server_bits,
    split_endpoints,
)
from apexrl.replay.server import ReplayServer
from apexrl.replay.server.config import ServerConfig
from apexrl.replay.tables import MinSize, TableConfig
from apexrl.replay.wire import protocol as P
from tests.helpers import wait_until
from tests.store.test_sampling_stats import P_VALUE_FLOOR, chi2_sf

ALPHA, BETA = 0.6, 0.4
# Skewed masses: many light items on server 0, a few heavy ones on server 2.
PRIORITIES = [
    [0.1 * (i + 1) for i in range(12)],
    [3.0, 4.0, 5.0, 6.0, 7.0, 8.0],
    [20.0, 30.0, 40.0],
]


@contextlib.contextmanager
def running(count: int, **config):
    """``count`` in-process replay servers on 127.0.0.1 -> their endpoints; stopped on exit."""
    started: list[ReplayServer] = []
    try:
        for i in range(count):
            started.append(ReplayServer(ServerConfig(port=0, seed=11 + i, **config)).start())
        yield [s.endpoint for s in started]
    finally:
        for server in started:
            server.stop()


@pytest.fixture
def servers():
    with contextlib.ExitStack() as stack:
        yield lambda count, **config: stack.enter_context(running(count, **config))


def _stats(endpoint: str) -> dict:
    with ReplayClient(endpoint) as c:
        return c.stats()


def _fill(endpoints: list[str]) -> dict[bytes, float]:
    """Each server gets its PRIORITIES row through a plain client; returns item -> priority."""
    priority_of = {}
    for s, (endpoint, row) in enumerate(zip(endpoints, PRIORITIES)):
        items = [f"s{s}i{i}".encode() for i in range(len(row))]
        with ReplayClient(endpoint) as c:
            c.insert(row, items)
        priority_of.update(zip(items, row))
    return priority_of


def test_endpoints_and_key_bits():
    assert split_endpoints("tcp://a:1, tcp://b:2") == ["tcp://a:1", "tcp://b:2"]
    with pytest.raises(ValueError, match="given twice"):
        split_endpoints(["tcp://a:1", "tcp://a:1"])
    with pytest.raises(ValueError, match="no replay endpoint"):
        split_endpoints(" , ")
    assert [server_bits(k) for k in (1, 2, 3, 4, 5, 32)] == [0, 1, 2, 2, 3, 5]
    assert [max_lock_shards(k) for k in (1, 2, 3, 32)] == [256, 128, 64, 8]
    one = connect("tcp://127.0.0.1:9")
    many = connect("tcp://127.0.0.1:9,tcp://127.0.0.1:10")
    assert type(one) is ReplayClient and type(many) is ShardedReplayClient
    one.close()
    many.close()


def test_draws_follow_the_global_proportional_distribution_with_exact_global_weights(servers):
    endpoints = servers(3, shards=4, tables=[TableConfig("default", alpha=ALPHA)])
    priority_of = _fill(endpoints)
    masses = {item: p**ALPHA for item, p in priority_of.items()}
    total, smallest = sum(masses.values()), min(masses.values())

    # What one store holding every item reports for them: the probabilities and weights to match.
    one = PrioritizedStore(capacity=100, alpha=ALPHA, shards=1, seed=0)
    items = list(priority_of)
    one.insert(np.array([priority_of[i] for i in items]), *P.pack_items(items))
    ref = one.sample(2000, beta=BETA)
    ref_p = {bytes(it): p for it, p in zip(ref.items, ref.probabilities)}
    ref_w = {bytes(it): w for it, w in zip(ref.items, ref.weights)}

    counts: Counter[bytes] = Counter()
    batches, n = 300, 64
    with ShardedReplayClient(endpoints, seed=5) as sharded:
        for _ in range(batches):
            batch = sharded.sample(n, beta=BETA)
            got = [bytes(it) for it in batch.items]
            counts.update(got)
            assert len(batch) == n and batch.size == len(items)
            assert batch.total_mass == pytest.approx(total, rel=1e-9)
            assert batch.min_mass == pytest.approx(smallest, rel=1e-9)
            want_p = np.array([masses[i] / total for i in got])
            want_w = np.array([(masses[i] / smallest) ** -BETA for i in got])
            np.testing.assert_allclose(batch.probabilities, want_p, rtol=1e-9)
            np.testing.assert_allclose(batch.weights, want_w, rtol=1e-6)
            for it, p, w in zip(got, batch.probabilities, batch.weights):
                if it in ref_p:  # exactly one store's numbers
                    assert p == pytest.approx(ref_p[it], rel=1e-9) and w == pytest.approx(ref_w[it], rel=1e-6)
            # The keys name the server that holds each item.
            servers_of = (batch.keys & np.uint64(0xFF)) >> np.uint64(8 - server_bits(3))
            assert [int(s) for s in servers_of] == [int(i[1:2]) for i in got]
    check_draws(counts, priority_of)


def check_draws(counts: Counter[bytes], priority_of: dict[bytes, float]) -> None:
    """The items drawn (``counts``) follow the global proportional distribution over the servers of _fill: a
    chi-square test over the items, and each server's share of the draws is its share of the mass (the split,
    not only the items)."""
    items = list(priority_of)
    masses = {item: p**ALPHA for item, p in priority_of.items()}
    total, draws = sum(masses.values()), sum(counts.values())
    observed = np.array([counts[i] for i in items], dtype=float)
    expected = np.array([draws * masses[i] / total for i in items])
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2_sf(chi2, len(items) - 1) > P_VALUE_FLOOR, (chi2, observed, expected)
    for s, row in enumerate(PRIORITIES):
        share = sum(observed[i] for i, it in enumerate(items) if it.startswith(f"s{s}".encode())) / draws
        assert share == pytest.approx(sum(p**ALPHA for p in row) / total, abs=0.02)


def test_keys_route_updates_erases_and_inserts_to_their_server(servers):
    endpoints = servers(3, shards=8)
    with ShardedReplayClient(endpoints) as sharded:
        batches = [sharded.insert([1.0] * 5, [b"%d-%d" % (b, i) for i in range(5)]) for b in range(6)]
        owners = [int(k[0] & np.uint64(0xFF)) >> (8 - server_bits(3)) for k in batches]
        assert owners == [0, 1, 2, 0, 1, 2]  # round robin, a batch whole to one server
        sizes = [_stats(e)["size"] for e in endpoints]
        assert sizes == [10, 10, 10]
        assert sharded.update_priorities(np.concatenate(batches[:2]), np.full(10, 5.0)) == 10
        updated = [_stats(e)["updated"] for e in endpoints]
        assert updated == [5, 5, 0]
        assert sharded.erase(batches[2]) == 5
        assert [_stats(e)["size"] for e in endpoints] == [10, 10, 5]
        # A key naming no server (index 3 of 3) is not present, like a stale key; nothing else changes.
        foreign = (batches[0] & np.uint64(~0xFF & 0xFFFF_FFFF_FFFF_FFFF)) | np.uint64(3 << 6)
        assert sharded.update_priorities(foreign, np.ones(5)) == 0
        assert sharded.erase(batches[2]) == 0  # erased already: stale
        stats = sharded.stats()
        assert stats["size"] == 25 and stats["replay_servers"] == 3 and stats["replay_servers_up"] == 3
        assert stats["inserted"] == 30 and stats["capacity"] == 3 * TableConfig("default").capacity


def test_a_server_with_more_lock_shards_than_the_keys_leave_room_for_is_refused(servers):
    endpoints = servers(3, shards=128)  # 3 servers: 2 bits for the server, at most 64 lock shards
    with ShardedReplayClient(endpoints) as sharded:
        with pytest.raises(ValueError, match=r"has 128 lock shards: with 3 servers each may have at most 64"):
            sharded.insert(np.ones(4), [b"x"] * 4)
        with pytest.raises(ValueError, match="at most 64 lock shards"):
            sharded.sample(4)


def test_a_killed_server_degrades_sampling_to_the_others_and_comes_back(start_server):
    procs = [start_server("--seed", str(i)) for i in range(3)]
    endpoints = [p.endpoint for p in procs]
    with ShardedReplayClient(endpoints, timeout=3.0, retry_s=0.2) as sharded:
        keys = [sharded.insert(np.full(10, 1.0 + b), [b"b%d" % b] * 10) for b in range(9)]
        assert sharded.sample(32).size == 90
        procs[1].kill9()  # as a crash would
        # The next sample loses server 1 (no reply within the client timeout) and redraws its share.
        batch = sharded.sample(64)
        assert len(batch) == 64 and batch.size == 60
        owners = set(((batch.keys & np.uint64(0xFF)) >> np.uint64(6)).tolist())
        assert owners <= {0, 2}
        live_total = sum((1.0 + b) ** 0.6 * 10 for b in range(9) if b % 3 != 1)
        assert batch.total_mass == pytest.approx(live_total, rel=1e-9)
        stats = sharded.stats()
        assert (stats["replay_servers_up"], stats["replay_servers_lost"]) == (2, 1)
        # Its keys are skipped, the others' updated; inserts go to the servers that are up.
        assert sharded.update_priorities(np.concatenate(keys[:3]), np.ones(30)) == 20
        more = [sharded.insert(np.ones(4), [b"m"] * 4) for _ in range(4)]
        assert {int(k[0] & np.uint64(0xFF)) >> 6 for k in more} == {0, 2}
        # Back on the same port (empty: it had no snapshot): probed, and it takes part again.
        procs[1] = start_server("--seed", "1", port=procs[1].port)
        wait_until(lambda: sharded.stats()["replay_servers_up"] == 3, 60, "server 1 back", interval=0.05)
        owners = {int(sharded.insert(np.ones(2), [b"n"] * 2)[0] & np.uint64(0xFF)) >> 6 for _ in range(6)}
        assert owners == {0, 1, 2}
        assert _stats(endpoints[1])["size"] == 4


def test_a_timeout_reply_of_one_server_fails_the_call_and_marks_nothing_down(servers):
    endpoints = servers(2, tables=[TableConfig("default", rate_limiter=MinSize(5))])
    with ReplayClient(endpoints[0]) as c:
        c.insert(np.ones(10), [b"a"] * 10)
    with ReplayClient(endpoints[1]) as c:
        c.insert(np.ones(2), [b"b"] * 2)  # below its min_size_to_sample
    with ShardedReplayClient(endpoints, seed=0) as sharded:
        with pytest.raises(ServerTimeoutError):
            for _ in range(50):  # until a batch has a draw on server 1
                sharded.sample(8, timeout=0.05)
        assert sharded.stats()["replay_servers_up"] == 2


def test_learner_and_actors_over_two_replay_servers(spawn, tmp_path):
    from apexrl.apex.metrics import read_csv
    from tests.launch.test_launch import FAST_LEARNER

    run_dir = str(tmp_path / "run")
    launcher = spawn(
        "launcher",
        "apexrl",
        "run",
        "--run-dir",
        run_dir,
        "--minutes",
        "0",
        "--steps",
        "150",
        "--final-eval",
        "0",
        "--actors",
        "2",
        "--replay-servers",
        "2",
        "--quiet",
        f"--learner-args={FAST_LEARNER}",
    )
    assert launcher.proc.wait(180) == 0, launcher.log()
    assert read_csv(os.path.join(run_dir, "metrics.csv"))["learner_steps"][-1] == 150
    for i in range(2):  # each server took inserts and samples, and wrote its own snapshot on the stop
        assert os.path.exists(os.path.join(run_dir, f"replay{i}.snap"))
        with open(os.path.join(run_dir, "logs", f"server{i}.log"), encoding="utf-8") as f:
            assert "Traceback" not in f.read()


_op = st.one_of(
    st.tuples(st.just("insert"), st.lists(st.floats(0.01, 100.0), min_size=1, max_size=5)),
    st.tuples(st.just("update"), st.integers(0, 10**6), st.floats(0.0, 100.0)),
    st.tuples(st.just("erase"), st.integers(0, 10**6)),
)


@settings(max_examples=20, deadline=None)
@given(ops=st.lists(_op, min_size=1, max_size=20))
def test_the_set_behaves_as_one_store_under_random_operations(ops):
    """A reference model (key -> priority) against three real servers behind one client: sizes, the keys
    present, and every sampled item's global probability and weight."""
    model: dict[int, float] = {}
    with (
        running(3, shards=2, tables=[TableConfig("default", alpha=ALPHA)]) as endpoints,
        ShardedReplayClient(endpoints, seed=0) as sharded,
    ):
        for op in ops:
            if op[0] == "insert":
                keys = sharded.insert(op[1], [b"x"] * len(op[1]))
                model.update(zip(keys.tolist(), op[1]))
            elif model:
                key = sorted(model)[op[1] % len(model)]
                if op[0] == "update":
                    assert sharded.update_priorities(np.array([key], np.uint64), [op[2]]) == 1
                    model[key] = op[2]
                else:
                    assert sharded.erase(np.array([key], np.uint64)) == 1
                    del model[key]
        assert sharded.stats()["size"] == len(model)
        masses = {k: p**ALPHA for k, p in model.items()}
        total = sum(masses.values())
        if total > 0:
            batch = sharded.sample(64, beta=BETA)
            assert set(batch.keys.tolist()) <= set(model)
            assert batch.total_mass == pytest.approx(total, rel=1e-9)
            smallest = min(m for m in masses.values() if m > 0)
            for k, p, w in zip(batch.keys.tolist(), batch.probabilities, batch.weights):
                assert masses[k] > 0 and p == pytest.approx(masses[k] / total, rel=1e-9)
                assert w == pytest.approx((masses[k] / smallest) ** -BETA, rel=1e-6)


@pytest.mark.slow
def test_a_run_over_two_servers_keeps_learning_when_one_is_killed(spawn, tmp_path):
    """kill -9 of one of two replay servers mid-run: the launcher restarts it, the learner never stops."""
    from apexrl.apex.metrics import read_csv
    from tests.launch.test_launch import FAST_LEARNER, _pids

    run_dir = str(tmp_path / "run")
    launcher = spawn(
        "launcher",
        "apexrl",
        "run",
        "--run-dir",
        run_dir,
        "--minutes",
        "0",
        "--actors",
        "2",
        "--replay-servers",
        "2",
        "--progress-every",
        "1",
        f"--learner-args={FAST_LEARNER}",
    )
    metrics = os.path.join(run_dir, "metrics.csv")

    def steps() -> int:
        try:
            return int(read_csv(metrics)["learner_steps"][-1])
        except (OSError, KeyError, IndexError, ValueError):
            return 0

    wait_until(lambda: steps() > 50, 120, "learner steps", interval=0.5)
    os.kill(_pids(run_dir)["server1"], signal.SIGKILL)
    launcher.wait_for(r"server1 restarted", timeout=60)
    before = steps()
    wait_until(lambda: steps() > before + 200, 120, "learner steps after the restart", interval=0.5)
    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.proc.wait(120) == 0, launcher.log()
    assert "learner restarted" not in launcher.log() and "learner exited" not in launcher.log()
    assert os.path.exists(os.path.join(run_dir, "replay1.snap"))  # the restarted server took inserts and saved


def test_learner_and_actor_take_several_replay_endpoints():
    from apexrl.cli import actor as actor_cli
    from apexrl.cli import learner as learner_cli

    ends = ["tcp://127.0.0.1:5", "tcp://127.0.0.1:6"]
    learner, _ = learner_cli.parse_config(["--preset", "cartpole", "--replay", *ends, "--params-port", "0"])
    actor, _ = actor_cli.parse_config(
        [
            "--preset",
            "cartpole",
            "--replay",
            ends[0],
            "--replay",
            ends[1],
            "--params",
            "tcp://127.0.0.1:7",
            "--index",
            "0",
            "--num-actors",
            "1",
        ]
    )
    assert learner.replay == actor.replay == ",".join(ends)


def test_the_inserter_pipelines_over_every_server_and_returns_the_sets_keys(servers):
    """Through inserter() a set of servers keeps requests in flight to all of them at once (it is a
    PipelinedReplay); every batch is stored once, round robin, and the keys it acknowledges are the set's."""
    from apexrl.replay.client.api import PipelinedReplay

    endpoints = servers(2, shards=2)
    acked: list[np.ndarray] = []
    with ShardedReplayClient(endpoints) as sharded:
        assert isinstance(sharded, PipelinedReplay)
        with sharded.inserter(max_in_flight=8, on_ack=lambda keys, _s: acked.append(keys.copy())) as ins:
            for b in range(40):
                ins.insert(np.ones(5), [f"b{b}i{i}".encode() for i in range(5)])
            ins.flush()
            assert ins.stats()["acked"] == 40 and ins.stats()["failed"] == 0
        keys = np.concatenate(acked)
        assert len(set(keys.tolist())) == 200
        assert sharded.update_priorities(keys, np.full(200, 2.0)) == 200  # every key routes to its server
    sizes = [_stats(e)["size"] for e in endpoints]
    assert sizes == [100, 100], sizes


def test_resent_inserts_of_a_silent_server_go_to_another_and_none_is_lost(start_server):
    """The inserter with ``resend``: a server that stops answering is marked down at the expiry of its requests,
    and their batches are resent (same insert ids) to the server that is up: every batch is stored, and the rest
    once each (a batch the silent server took before it stopped may be stored there too: at-least-once across a
    server's loss, as a retried insert)."""
    from tests.replay.test_client_inserter import wait_stopped

    a, b = start_server("--alpha", "0"), start_server("--alpha", "0")
    batches = [[f"b{i}x{j}".encode() for j in range(3)] for i in range(12)]
    with ShardedReplayClient([a.endpoint, b.endpoint], timeout=0.5, retry_s=60) as sharded:
        ins = sharded.inserter(max_in_flight=4, resend=True)
        for items in batches[:4]:
            ins.insert(np.ones(3), items)
        ins.flush()
        os.kill(b.pid, signal.SIGSTOP)
        wait_stopped(b.pid)
        try:
            for items in batches[4:]:  # round robin: some go to the silent server until it is marked down
                ins.insert(np.ones(3), items)
            ins.flush()  # completes with b still silent: its batches were resent to a
            assert ins.stats()["acked"] == 12 and ins.stats()["resent"] >= 1
            assert ins._replay._servers_lost == 1  # the inserter's own set of clients
            on_a = _every_item(a.endpoint)
        finally:
            os.kill(b.pid, signal.SIGCONT)
        ins.close()
    on_b = _every_item(b.endpoint)
    stored = on_a + on_b
    want = [x for items in batches for x in items]
    assert set(stored) == set(want)  # none lost
    assert len(on_a) == len(set(on_a)) and len(on_b) == len(set(on_b))  # once per server


def _every_item(endpoint: str) -> list[bytes]:
    """Every item of a server with --alpha 0 (a stratified SAMPLE of 3 draws per item reaches each)."""
    with ReplayClient(endpoint, timeout=30) as c:
        size = int(c.stats()["size"])
        batch = c.sample(3 * size, 0.4)
        by_key = dict(zip(batch.keys.tolist(), (bytes(m) for m in batch.items)))
        assert len(by_key) == size
        return list(by_key.values())


def test_a_uniform_table_is_sampled_uniformly_across_servers_with_weights_one(servers):
    """A uniform table split over 3 servers holding 12, 6 and 3 items: every item is equally likely whichever
    server holds it (chi-square over the items, and each server's share of the draws is its share of the
    items), probabilities are 1 / (items on all servers) and IS weights 1."""
    tables = [TableConfig("default"), TableConfig("u", sampler="uniform", capacity=1000)]
    endpoints = servers(3, tables=tables)
    for s, (endpoint, row) in enumerate(zip(endpoints, PRIORITIES)):
        with ReplayClient(endpoint, table="u") as c:  # priorities are kept, not used by the sampler
            c.insert(row, [f"s{s}i{i}".encode() for i in range(len(row))])
    items = [f"s{s}i{i}".encode() for s, row in enumerate(PRIORITIES) for i in range(len(row))]
    counts: Counter[bytes] = Counter()
    with ShardedReplayClient(endpoints, seed=5, table="u") as sharded:
        for _ in range(60):
            batch = sharded.sample(64)
            counts.update(bytes(it) for it in batch.items)
            assert len(batch) == 64 and batch.size == len(items)
            np.testing.assert_array_equal(batch.weights, np.ones(64, np.float32))
            np.testing.assert_allclose(batch.probabilities, 1.0 / len(items))
    draws = sum(counts.values())
    observed = np.array([counts[i] for i in items], dtype=float)
    expected = np.full(len(items), draws / len(items))
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2_sf(chi2, len(items) - 1) > P_VALUE_FLOOR, (chi2, observed)
    for s, row in enumerate(PRIORITIES):
        share = sum(counts[f"s{s}i{i}".encode()] for i in range(len(row))) / draws
        assert share == pytest.approx(len(row) / len(items), abs=0.03)


def test_reset_and_checkpoint_reach_every_server_and_name_the_one_that_is_down(servers, start_server, tmp_path):
    endpoints = servers(1, snapshot=str(tmp_path / "a.snap")) + servers(1, snapshot=str(tmp_path / "b.snap"))
    with ShardedReplayClient(endpoints, seed=0) as sharded:
        for _ in range(4):
            sharded.insert(np.ones(5), [b"x"] * 5)
        sizes = [_stats(e)["size"] for e in endpoints]
        assert sum(sizes) == 20 and all(sizes)  # inserts went to both
        paths = sharded.checkpoint()
        assert paths == [str(tmp_path / "a.snap"), str(tmp_path / "b.snap")] and all(map(os.path.exists, paths))
        assert sharded.reset() == 20
        assert [_stats(e)["size"] for e in endpoints] == [0, 0]
    # A server that does not answer: named, and the other's reset is reported done.
    down = start_server("--seed", "5")
    with ShardedReplayClient([endpoints[0], down.endpoint], timeout=2.0, seed=0) as sharded:
        sharded.insert(np.ones(3), [b"y"] * 3)
        down.kill9()
        with pytest.raises(ReplayTimeout, match=f"{down.endpoint} down or not answering; done on {endpoints[0]}"):
            sharded.reset()
        assert sharded.stats()["replay_servers_up"] == 1
