"""PrefetchingSampler with several SAMPLE requests in flight (``sample_threads``): the requests really overlap,
never more than ``prefetch`` batches exist ahead of the consumer, batches from one or several real servers (on
127.0.0.1) keep their distribution, and an error in one thread stops them all (close() with several threads: in
test_replay_api.py).

The statistical test fixes every seed (servers, client split and stores), so it draws the same batches on every
run; the p-value floor guards against a wrong distribution, not against bad luck.
"""

from __future__ import annotations

import threading
import time
from collections import Counter

import numpy as np
import pytest

from apexrl.errors import ReplayTimeout, ServerError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.client.sampler import MAX_SAMPLE_THREADS, PrefetchingSampler
from apexrl.replay.client.sharded import ShardedReplayClient
from apexrl.replay.tables import TableConfig
from apexrl.replay.wire import protocol as P
from tests.helpers import wait_until
from tests.replay.test_replay_api import LocalReplay, filled
from tests.replay.test_sharded import ALPHA, BETA, _fill, check_draws, running


class Overlapping(LocalReplay):
    """Each sample() waits at ``barrier`` first: it returns only while that many requests are in flight together."""

    def __init__(self, barrier: threading.Barrier, items: int) -> None:
        super().__init__()
        self.barrier = barrier
        self.insert(np.ones(items), [f"item-{i}".encode() for i in range(items)])

    def sample(self, n, beta=0.4, timeout=None):
        self.barrier.wait()
        return super().sample(n, beta)


def test_sample_threads_keep_that_many_requests_in_flight_at_once():
    barrier = threading.Barrier(3, timeout=30)
    replay = Overlapping(barrier, 20)
    with PrefetchingSampler(lambda: replay, 4, prefetch=3, sample_threads=3) as sampler:
        for _ in range(9):
            assert len(sampler.next(timeout=60)) == 4
        assert sampler.stats()["max_queued"] <= 3
        barrier.abort()  # release the threads already waiting for the next round, so close() need not wait


def test_fewer_threads_than_the_overlap_needs_never_get_there():
    # The same barrier, one thread short: the first batch never comes and the broken barrier reaches the consumer.
    replay = Overlapping(threading.Barrier(3, timeout=1.0), 5)
    with PrefetchingSampler(lambda: replay, 2, prefetch=3, sample_threads=2) as sampler:
        with pytest.raises(threading.BrokenBarrierError):
            sampler.next(timeout=60)
        with pytest.raises(StopIteration):
            sampler.next(timeout=1)


def test_requests_in_flight_count_against_prefetch():
    replay = filled(30)
    with PrefetchingSampler(lambda: replay, 5, prefetch=4, sample_threads=8) as sampler:
        wait_until(lambda: sampler.stats()["queued"] == 4, 30, "4 batches ready", interval=0.01)
        time.sleep(0.2)  # room for 4 only: 8 threads must not have sent a 5th request meanwhile
        assert replay.calls["sample"] == 4 and sampler.stats()["in_flight"] == 0
        sampler.next(timeout=10)
        wait_until(lambda: replay.calls["sample"] == 5, 30, "one more request", interval=0.01)
        wait_until(lambda: sampler.stats()["queued"] == 4, 30, "4 batches ready again", interval=0.01)
        assert replay.calls["sample"] == 5


def test_a_refusal_in_one_thread_stops_them_all_and_is_raised_once():
    calls = Counter()

    class RefusesTheThird(LocalReplay):
        def sample(self, n, beta=0.4, timeout=None):
            with self.lock:
                calls["n"] += 1
                third = calls["n"] == 3
            if third:
                raise ServerError(P.Status.INVALID_ARGUMENT, "refused")
            return super().sample(n, beta)

    replay = RefusesTheThird()
    replay.insert(np.ones(10), [f"i{i}".encode() for i in range(10)])
    sampler = PrefetchingSampler(lambda: replay, 2, prefetch=2, sample_threads=4)
    with pytest.raises(ServerError, match="refused"):
        for _ in range(100):
            sampler.next(timeout=30)
    with pytest.raises(StopIteration):
        sampler.next(timeout=1)
    assert not any(t.is_alive() for t in sampler._threads)
    sampler.close()


def test_timeouts_of_every_thread_are_retried_and_counted():
    class SlowToFill(LocalReplay):
        def __init__(self) -> None:
            super().__init__()
            self.refusals = 6

        def sample(self, n, beta=0.4, timeout=None):
            with self.lock:
                if self.refusals:
                    self.refusals -= 1
                    raise ReplayTimeout("not yet")
            return super().sample(n, beta)

    replay = SlowToFill()
    replay.insert(np.ones(4), [b"a", b"b", b"c", b"d"])
    with PrefetchingSampler(lambda: replay, 3, prefetch=4, sample_threads=3) as sampler:
        for _ in range(8):
            assert len(sampler.next(timeout=30)) == 3
        assert sampler.stats()["retries"] == 6 and sampler.stats()["in_flight"] <= 4


@pytest.mark.parametrize("bad", [0, MAX_SAMPLE_THREADS + 1, True, 2.0])
def test_a_bad_thread_count_is_refused_before_any_connection(bad):
    def never():
        raise AssertionError("connected")

    with pytest.raises(ValueError, match="sample_threads"):
        PrefetchingSampler(never, 4, sample_threads=bad)


def test_a_failed_connection_closes_the_ones_made_before():
    made = []

    def connect():
        if len(made) == 2:
            raise OSError("no more")
        replay = filled(3)
        replay.closed = False
        replay.close = lambda r=replay: setattr(r, "closed", True)
        made.append(replay)
        return replay

    with pytest.raises(OSError, match="no more"):
        PrefetchingSampler(connect, 2, sample_threads=3)
    assert len(made) == 2 and all(r.closed for r in made)


def test_threads_over_one_real_server_hand_out_whole_valid_batches():
    with running(1) as (endpoint,):
        items = [f"item-{i}".encode() for i in range(200)]
        with ReplayClient(endpoint) as client:
            client.insert(np.linspace(0.1, 2.0, 200), items)
            with client.sampler(16, prefetch=6, sample_threads=3) as sampler:
                seen = Counter()
                for _ in range(60):
                    batch = sampler.next(timeout=30)
                    got = [bytes(x) for x in batch.raw.items]
                    assert len(got) == 16 and set(got) <= set(items)
                    assert client.update_priorities(batch.keys, np.ones(16)) == 16  # keys of items present
                    seen.update(got)
                fetched = sampler.stats()["fetched"]
            stats = client.stats()
    assert len(seen) > 100
    # every SAMPLE request sent became a batch, or was one of at most `prefetch` ahead of the consumer
    assert fetched <= stats["requests_sample"] <= 60 + 6 + 3, stats


def test_threads_over_sharded_servers_keep_the_global_proportional_distribution():
    with running(3, shards=4, tables=[TableConfig("default", alpha=ALPHA)]) as endpoints:
        priority_of = _fill(endpoints)
        total = sum(p**ALPHA for p in priority_of.values())
        counts: Counter[bytes] = Counter()
        with (
            ShardedReplayClient(endpoints, seed=5) as sharded,
            sharded.sampler(64, beta=BETA, prefetch=4, sample_threads=3) as sampler,
        ):
            for _ in range(200):
                batch = sampler.next(timeout=30)
                got = [bytes(it) for it in batch.raw.items]
                counts.update(got)
                np.testing.assert_allclose(
                    batch.probabilities, [priority_of[i] ** ALPHA / total for i in got], rtol=1e-9
                )
    check_draws(counts, priority_of)


def test_sample_threads_flag_on_the_learner_and_through_apexrl_run(tmp_path):
    from apexrl.cli import learner as learner_cli
    from apexrl.cli.main import launch_plan

    base = ["--preset", "cartpole", "--replay", "tcp://127.0.0.1:5555", "--params-port", "0"]
    assert learner_cli.parse_config(base)[0].sample_threads == 0  # one per replay server
    assert learner_cli.parse_config([*base, "--sample-threads", "3"])[0].sample_threads == 3
    for bad in ("-1", "17", "x"):
        with pytest.raises(SystemExit):
            learner_cli.parse_config([*base, "--sample-threads", bad])
    run = ["--preset", "cartpole", "--run-dir", str(tmp_path / "run")]
    assert launch_plan([*run, "--learner-args", "--sample-threads 2"])[0].learner.sample_threads == 2
