"""The Replay Protocol: ReplayClient implements it (signatures included), and the sampler, updater and inserter
work over any Replay -- here an in-process stand-in around the native store, no server, no sockets."""

from __future__ import annotations

import inspect
import threading
import time

import numpy as np
import pytest

from apexrl import PrioritizedStore
from apexrl.errors import Interrupted, ServerError
from apexrl.replay.client.api import Interruptible, PipelinedReplay, Replay
from apexrl.replay.client.inserter import PipelinedInserter
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.client.sampler import PrefetchingSampler
from apexrl.replay.client.updater import AsyncUpdater
from apexrl.replay.wire import protocol as P


def protocol_methods(protocol: type) -> list[str]:
    """The calls a Protocol declares: the user's, and the pipeline's (one leading underscore), not dunders."""
    return [name for name, value in vars(protocol).items() if inspect.isfunction(value) and not name.startswith("__")]


@pytest.mark.parametrize("protocol", [Replay, Interruptible, PipelinedReplay], ids=lambda p: p.__name__)
def test_replay_client_implements_the_protocols_with_the_same_signatures(protocol):
    client = ReplayClient("tcp://127.0.0.1:9", timeout=1.0)  # connecting is lazy: nothing listens, nothing sent
    try:
        assert isinstance(client, protocol)
        names = protocol_methods(protocol)
        assert names, protocol
        for name in names:
            want = inspect.signature(getattr(protocol, name)).parameters
            got = inspect.signature(getattr(ReplayClient, name)).parameters
            # The client's one extension: a keyword-only `table` (None: the client's own table, which the
            # helpers bind per connection), so the protocol's calls keep their meaning on any table.
            extra = [p for p in got.values() if p.name == "table"]
            assert all(p.kind is p.KEYWORD_ONLY and p.default is None for p in extra), name
            got = {k: p for k, p in got.items() if k != "table"}
            assert [(p.name, p.kind, p.default) for p in got.values()] == [
                (p.name, p.kind, p.default) for p in want.values()
            ], name
    finally:
        client.close()


def test_the_replay_protocol_is_the_five_operations():
    assert sorted(protocol_methods(Replay)) == ["insert", "remove_to_fit", "sample", "stats", "update_priorities"]


class LocalReplay:
    """A Replay without a server: the native store behind a lock (what a test or a sharded client might be)."""

    def __init__(self) -> None:
        self.store = PrioritizedStore(capacity=1000, alpha=0.6, shards=2)
        self.lock = threading.Lock()
        self.calls = {"insert": 0, "sample": 0, "update_priorities": 0}

    def insert(self, priorities, items=None, *, data=None, offsets=None, timeout=None):
        if items is not None:
            data, offsets = P.pack_items(items)
        with self.lock:
            self.calls["insert"] += 1
            return self.store.insert(np.asarray(priorities, np.float64), data, np.asarray(offsets, np.uint64))

    def sample(self, n, beta=0.4, timeout=None):
        with self.lock:
            self.calls["sample"] += 1
            return self.store.sample(n, beta)

    def update_priorities(self, keys, priorities):
        with self.lock:
            self.calls["update_priorities"] += 1
            return self.store.update_priorities(keys, priorities)

    def remove_to_fit(self):
        with self.lock:
            return self.store.remove_to_fit()

    def stats(self):
        with self.lock:
            return dict(self.store.stats())


def filled(n: int = 50) -> LocalReplay:
    replay = LocalReplay()
    replay.insert(np.ones(n), [f"item-{i}".encode() for i in range(n)])
    return replay


def test_the_stand_in_is_a_replay_but_not_pipelined_or_interruptible():
    replay = LocalReplay()
    assert isinstance(replay, Replay)
    assert not isinstance(replay, PipelinedReplay) and not isinstance(replay, Interruptible)


def test_the_sampler_works_over_any_replay():
    replay = filled()
    with PrefetchingSampler(lambda: replay, 8, prefetch=2, decode=lambda b: [bytes(x) for x in b.items]) as sampler:
        for _ in range(5):
            batch = sampler.next(timeout=10)
            assert len(batch) == 8 and all(item.startswith(b"item-") for item in batch.decoded)
        assert sampler.stats()["max_queued"] <= 2
    assert replay.calls["sample"] >= 5


def test_the_updater_works_over_any_replay():
    replay = filled()
    keys = replay.sample(10).keys.copy()
    with AsyncUpdater(lambda: replay, max_pending=2) as updater:
        for i in range(6):
            updater.update(keys, np.full(10, 2.0 + i))
        updater.flush(timeout=10)
        assert updater.stats()["sent"] == 6 and updater.stats()["updated"] == 60
        assert updater.counters() == updater.stats()  # stats() is kept as an alias of counters()
    assert replay.calls["update_priorities"] == 6


def test_the_inserter_falls_back_to_one_call_at_a_time_over_a_plain_replay():
    replay = LocalReplay()
    acks = []
    with PipelinedInserter(lambda: replay, max_in_flight=4, on_ack=lambda keys, s: acks.append(len(keys))) as ins:
        for _b in range(5):
            ins.insert(np.ones(3), [b"x", b"yy", b"zzz"])
            assert ins.in_flight == 0
        with pytest.raises(ValueError, match="priorities"):
            ins.insert([float("nan")], [b"a"])
    assert acks == [3] * 5 and ins.stats()["acked_items"] == 15 and len(replay.store) == 15
    assert ins.counters() == ins.stats()  # stats() is kept as an alias of counters()


def test_a_failing_replay_call_is_raised_by_the_next_inserter_call():
    class Refusing(LocalReplay):
        def insert(self, *args, **kwargs):
            raise ServerError(P.Status.INVALID_ARGUMENT, "no")

    ins = PipelinedInserter(Refusing, max_in_flight=2)
    ins.insert(np.ones(1), [b"a"])  # counted failed, raised by the next call
    with pytest.raises(ServerError, match="no"):
        ins.insert(np.ones(1), [b"b"])
    assert ins.stats()["failed"] == 1
    ins.close()


@pytest.mark.parametrize("threads", [1, 3])
def test_close_interrupts_an_interruptible_replay_that_does_not_answer(threads):
    made = []

    class Stuck(LocalReplay):
        def __init__(self) -> None:
            super().__init__()
            self.interrupted = threading.Event()
            self.closed = False

        def sample(self, n, beta=0.4, timeout=None):
            self.interrupted.wait()
            raise Interrupted("interrupted")

        def interrupt(self) -> None:
            self.interrupted.set()

        def close(self) -> None:
            self.closed = True

    def connect() -> Stuck:
        made.append(Stuck())
        return made[-1]

    sampler = PrefetchingSampler(connect, 4, sample_threads=threads)
    assert len(made) == threads and isinstance(made[0], Interruptible)  # a connection per thread, made here
    t0 = time.monotonic()
    sampler.close()
    assert time.monotonic() - t0 < 5.0 and all(r.closed for r in made)
    assert not any(t.is_alive() for t in sampler._threads)
