"""An actor with several inserts in flight (``inserts_in_flight``), against real replay servers on 127.0.0.1:
every batch is stored exactly once across a server restart, a silent server and a rate limiter that refuses for a
while, and a stop with batches in flight reports them as not inserted."""

from __future__ import annotations

import logging
import os
import re
import signal
import threading
import time
from collections import Counter

import numpy as np
import pytest

from apexrl.agents import get_agent
from apexrl.errors import ServerTimeoutError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from tests.conftest import free_port
from tests.helpers import wait_until
from tests.replay.test_client_inserter import wait_stopped

# CartPole's transitions: a few hundred bytes each, small requests; the run is long enough for a restart.
FLUSH = 5


def make_actor(
    endpoint: str,
    *,
    in_flight: int,
    max_steps: int,
    timeout: float = 1.0,
    flush: int = FLUSH,
    pace: float = 0.0,
    k: int = 1,
    insert_max: int = 0,
):
    """An actor of one CartPole; ``pace``: seconds each step takes at least (a fast machine must not finish the
    run before the test has restarted or stopped its server)."""
    from apexrl.apex.actor import Actor
    from apexrl.apex.config import ActorConfig

    config = ActorConfig(
        agent="dqn",
        env="gym:CartPole-v1",
        replay=endpoint,
        params="tcp://127.0.0.1:9",  # nobody: the actor acts with its own weights
        index=0,
        num_actors=1,
        seed=3,
        wait_for_params=0.0,
        params_every_frames=10**15,
        params_timeout=0.05,
        flush_every=flush,
        envs_per_actor=k,
        insert_max=insert_max,
        max_steps=max_steps,
        inserts_in_flight=in_flight,
        replay_timeout=timeout,
        agent_config=get_agent("dqn").config_class(n_step=3),
        log_every=3600.0,
    )
    actor = Actor(config)
    if pace:
        assert k == 1
        act = actor.policy.act

        def paced(obs, explore=True):
            time.sleep(pace)
            return act(obs, explore)

        actor.policy.act = paced
    return actor


class Recorded:
    """Every item the actor handed over for inserting (what its inserter holds until stored), in order."""

    def __init__(self, actor):
        self.items: list[bytes] = []
        self.lock = threading.Lock()
        encode = actor._encode

        def record(batch):
            data, offsets, chunks = encode(batch)
            with self.lock:
                self.items += [bytes(m) for m in P.split_items(np.asarray(offsets, np.uint64), memoryview(data))]
            return data, offsets, chunks

        actor._encode = record


class Running:
    """``actor.run()`` in a thread; ``result`` its counters, ``error`` what it raised."""

    def __init__(self, actor):
        self.actor = actor
        self.result: dict | None = None
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        try:
            self.result = self.actor.run()
        except BaseException as exc:  # noqa: BLE001 - reported by join()
            self.error = exc

    def join(self, timeout: float) -> dict:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the actor did not finish within {timeout}s"
        if self.error is not None:
            raise self.error
        assert self.result is not None
        return self.result


def stored_items(endpoint: str) -> list[bytes]:
    """Every item the server holds, once each: with ``--alpha 0`` every item has the same mass, and a stratified
    SAMPLE of 3 draws per item puts at least two draws in every one."""
    with ReplayClient(endpoint, timeout=30) as c:
        size = int(c.stats()["size"])
        if size == 0:
            return []
        batch = c.sample(3 * size, 0.4)
        by_key = dict(zip(batch.keys.tolist(), (bytes(m) for m in batch.items)))
        assert len(by_key) == size, f"{len(by_key)} distinct items drawn of {size}"
        return list(by_key.values())


def assert_stored_once(endpoint: str, handed: list[bytes]) -> None:
    got = Counter(stored_items(endpoint))
    want = Counter(handed)
    assert len(handed) == len(want), "two transitions with the same bytes: the check could not tell them apart"
    assert got == want, (
        f"{sum((got - want).values())} items stored more than once or never handed over; "
        f"{sum((want - got).values())} handed over but not stored"
    )


def size_of(endpoint: str) -> int:
    with ReplayClient(endpoint, timeout=30) as c:
        return int(c.stats()["size"])


def close(actor) -> None:
    actor.close()


def test_batches_in_flight_are_stored_exactly_once_across_a_server_restart(start_server, tmp_path):
    port = free_port()
    snapshot = str(tmp_path / "replay.snap")
    flags = ("--alpha", "0", "--snapshot", snapshot)
    server = start_server(*flags, port=port)
    actor = make_actor(server.endpoint, in_flight=4, max_steps=4000, pace=0.001)
    recorded = Recorded(actor)
    try:
        run = Running(actor)
        wait_until(lambda: size_of(server.endpoint) >= 300, 120, "the first inserts to be stored")
        assert server.terminate() == 0  # answers what it serves, snapshots what it stored, exits
        server = start_server(*flags, port=port)  # the same endpoint: the actor reconnects by itself
        counters = run.join(300)
    finally:
        close(actor)
    assert counters["steps"] == 4000
    assert counters["inserted"] == len(recorded.items) == 4000 and counters["not_inserted"] == 0
    assert counters["insert_retries"] >= 1  # the restart was seen and the held batches resent
    assert_stored_once(server.endpoint, recorded.items)


def test_a_vectorised_actor_with_requests_split_by_insert_max_stores_each_once(start_server):
    """K = 4 environments, flushes of 4 x 5 sent as requests of at most 7 (each its own insert id), 3 in flight."""
    server = start_server("--alpha", "0")
    actor = make_actor(server.endpoint, in_flight=3, max_steps=4 * 150, k=4, insert_max=7)
    recorded = Recorded(actor)
    try:
        counters = actor.run()
    finally:
        close(actor)
    assert counters["inserted"] == len(recorded.items) == 600 and counters["not_inserted"] == 0
    assert_stored_once(server.endpoint, recorded.items)


def test_batches_resent_to_a_server_that_was_silent_are_stored_once_by_their_insert_ids(start_server):
    server = start_server("--alpha", "0")
    actor = make_actor(server.endpoint, in_flight=8, max_steps=3000, timeout=0.5, pace=0.001)
    recorded = Recorded(actor)
    try:
        run = Running(actor)
        wait_until(lambda: size_of(server.endpoint) >= 200, 120, "the first inserts to be stored")
        os.kill(server.pid, signal.SIGSTOP)  # connected but silent: the requests in flight expire
        try:
            wait_until(lambda: actor.counters["insert_retries"] >= 1, 120, "the actor to give up waiting")
        finally:
            os.kill(server.pid, signal.SIGCONT)  # serves the first attempts, then their resends
        counters = run.join(300)
        with ReplayClient(server.endpoint, timeout=30) as c:
            stats = c.stats()
    finally:
        close(actor)
    assert counters["inserted"] == len(recorded.items) == 3000 and counters["not_inserted"] == 0
    # An expired request that reached the server before it stopped is served when it resumes; its resend is then
    # answered from the insert-id window with the first keys (duplicate_inserts), and nothing is stored twice.
    assert stats["size"] == 3000
    assert_stored_once(server.endpoint, recorded.items)


def test_batches_refused_by_the_rate_limiter_are_resent_until_stored_once(start_server, tmp_path):
    # 1 sampled item per inserted item, 60 items of drift: the actor's 4 x 5 in flight are soon held back, and
    # refused (TIMEOUT) after --max-wait, until a sampler lets them through.
    snapshot = str(tmp_path / "replay.snap")
    server = start_server(
        "--alpha", "0", "--samples-per-insert", "1", "--error-buffer", "60", "--max-wait", "0.3", "--snapshot", snapshot
    )
    actor = make_actor(server.endpoint, in_flight=4, max_steps=800, timeout=10.0)
    recorded = Recorded(actor)
    try:
        run = Running(actor)
        wait_until(lambda: actor.counters["rate_limited"] >= 3, 120, "inserts refused by the rate limiter")
        assert actor.counters["not_inserted"] == 0
        with ReplayClient(server.endpoint, timeout=30) as sampler:

            def sample_in_step() -> None:
                # Each SAMPLE admits as many inserted items. On a loaded machine the sampler can run ahead of a
                # slow actor by more than the buffer: the limiter then refuses it too (TIMEOUT), which is the
                # limiter working, not a failure; the next poll samples again.
                try:
                    sampler.sample(20, 0.4, timeout=1.0)
                except ServerTimeoutError:
                    pass

            wait_until(lambda: not run.thread.is_alive(), 300, "the actor to finish", on_poll=sample_in_step)
            sampled = int(sampler.stats()["sampled"])
        counters = run.join(10)
    finally:
        close(actor)
    assert counters["inserted"] == len(recorded.items) == 800 and counters["not_inserted"] == 0
    assert counters["rate_limited"] >= 3 and counters["insert_retries"] == 0
    assert sampled >= 800 - 60 - 20  # the limiter let nothing through ahead of the samples
    # The rate limiter would hold back the SAMPLE that enumerates the store: check the snapshot instead.
    assert server.terminate() == 0
    assert_snapshot_holds_once(snapshot, recorded.items)


def assert_snapshot_holds_once(path: str, handed: list[bytes]) -> None:
    """The store a server saved holds each item handed over once (enumerated in-process, where no rate limiter
    holds the SAMPLE back)."""
    from apexrl import PrioritizedStore

    store = PrioritizedStore.load(path)
    assert len(store) == len(handed)
    batch = store.sample(3 * len(store), 0.4)  # alpha 0: every item drawn at least twice
    by_key = dict(zip(batch.keys.tolist(), (bytes(m) for m in batch.items)))
    assert len(by_key) == len(store)
    assert Counter(by_key.values()) == Counter(handed)


@pytest.mark.parametrize("interrupted", [False, True])
def test_stopping_with_batches_in_flight_reports_them_not_inserted(start_server, caplog, interrupted):
    server = start_server()
    actor = make_actor(server.endpoint, in_flight=4, max_steps=0, timeout=0.5)
    recorded = Recorded(actor)
    caplog.set_level(logging.WARNING, logger="apexrl.apex.actor")
    try:
        run = Running(actor)
        wait_until(lambda: size_of(server.endpoint) >= 50, 120, "the first inserts to be stored")
        os.kill(server.pid, signal.SIGSTOP)  # silent: what is sent from now on stays unanswered
        try:
            wait_stopped(server.pid)  # every thread: none answers a request sent after this
            # (len() only: the actor's thread changes the inserter's dicts meanwhile)
            wait_until(lambda: len(actor._inserter._in_flight) >= 2, 120, "inserts in flight to the silent server")
            actor.stop()
            if interrupted:  # the grace period is over before any reply or expiry (run_actor's timer)
                actor.replay.interrupt()
            counters = run.join(120)
        finally:
            os.kill(server.pid, signal.SIGCONT)
    finally:
        close(actor)
    # at least the two requests in flight, of one transition or more each (an episode's end sends a short one)
    assert counters["not_inserted"] >= 2
    # every transition the actor made is either acknowledged or reported
    assert counters["inserted"] + counters["not_inserted"] == counters["steps"]
    assert counters["inserted"] <= len(recorded.items)
    # the warnings name every transition not inserted (a flush under way when the stop came may warn first)
    warned = [
        re.search(r"stopping with (\d+) transitions not inserted \((.*)\)", r.getMessage()) for r in caplog.records
    ]
    warned = [m for m in warned if m]
    assert warned and sum(int(m[1]) for m in warned) == counters["not_inserted"]
    why = "did not answer in time" if interrupted else "did not take them before the stop"
    assert why in warned[-1][2]
