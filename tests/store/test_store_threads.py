"""Many Python threads on one store at once: every call stays correct and the books balance exactly."""

from __future__ import annotations

import random
import struct
import threading
import time

import numpy as np
import pytest

from apexrl import PrioritizedStore

# These tests drive eviction through remove_to_fit() alone: a hard ceiling far above what they insert
# (the ceiling itself is tested in test_store_limits.py).
NO_CEILING = 10**8

JOIN_TIMEOUT_S = 60.0


def payload(uid: int) -> bytes:
    """Names its item: the id, then 0..63 bytes derived from it (so a mixed-up item cannot pass)."""
    return struct.pack("<Q", uid) + bytes((uid * 31 + j) % 251 for j in range(uid % 64))


class Workers:
    """Runs named worker functions in threads, collects their exceptions, and fails on a hang."""

    def __init__(self):
        self.errors: list[BaseException] = []
        self.threads: list[threading.Thread] = []
        self.start_line = threading.Barrier(1)

    def add(self, fn, *args):
        def run():
            try:
                self.start_line.wait()
                fn(*args)
            except BaseException as e:  # noqa: BLE001 - re-raised in the main thread
                self.errors.append(e)

        self.threads.append(threading.Thread(target=run, name=getattr(fn, "__name__", "worker"), daemon=True))

    def run(self):
        self.start_line = threading.Barrier(len(self.threads))
        for t in self.threads:
            t.start()
        deadline = time.monotonic() + JOIN_TIMEOUT_S
        for t in self.threads:
            t.join(max(0.0, deadline - time.monotonic()))
        hung = [t.name for t in self.threads if t.is_alive()]
        assert not hung, f"threads still running after {JOIN_TIMEOUT_S}s (deadlock?): {hung}"
        if self.errors:
            raise self.errors[0]


@pytest.mark.slow
@pytest.mark.parametrize("eviction", ["fifo", "prioritized"])
@pytest.mark.parametrize("shards", [1, 4])
def test_concurrent_insert_sample_update_erase_and_evict_keep_exact_accounting(eviction, shards):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=3000, alpha=0.6, shards=shards, eviction=eviction, seed=1)
    lock = threading.Lock()
    payload_of: dict[int, bytes] = {}  # key -> payload, for every item ever inserted
    issued: list[int] = []  # keys in a shared pool for updaters and erasers (append is atomic)
    tallies = {
        "inserted": 0,
        "sampled": 0,
        "sample_calls": 0,
        "updated": 0,
        "update_keys": 0,
        "erased": 0,
        "evicted": 0,
        "remove_calls": 0,
    }
    observed: list[tuple[np.ndarray, list[bytes]]] = []

    def add(**counts):
        with lock:
            for name, value in counts.items():
                tallies[name] += value

    # items from the start, so sampling never meets an empty store (eviction stops at capacity)
    floor = store.insert(np.ones(500), [payload(10**9 + i) for i in range(500)])
    payload_of.update(zip(floor.tolist(), (payload(10**9 + i) for i in range(500))))
    add(inserted=500)

    inserters_done = threading.Event()
    inserters_left = [2]

    def inserter(worker: int):
        try:
            insert_batches(worker)
        finally:
            with lock:
                inserters_left[0] -= 1
                if inserters_left[0] == 0:
                    inserters_done.set()

    def insert_batches(worker: int):
        rng = random.Random(worker)
        for call in range(300):
            n = rng.randint(1, 90)
            uids = [(worker * 1000 + call) * 100 + j for j in range(n)]
            items = [payload(u) for u in uids]
            priorities = [rng.choice([0.0, 0.1, 1.0, 5.0]) for _ in range(n)]
            keys = store.insert(priorities, items).tolist()
            with lock:
                for k, item in zip(keys, items):
                    assert k not in payload_of, f"key {k} issued twice"
                    payload_of[k] = item
            issued.extend(keys)
            add(inserted=n)

    def sampler(worker: int):
        rng = random.Random(100 + worker)
        for _ in range(600):
            n = rng.randint(1, 128)
            batch = store.sample(n, beta=0.4)
            assert len(batch) == n
            assert np.all((batch.weights > 0) & (batch.weights <= 1))
            assert np.all((batch.probabilities > 0) & (batch.probabilities <= 1))
            observed.append((batch.keys.copy(), [bytes(m) for m in batch.items]))
            add(sampled=n, sample_calls=1)

    def updater(worker: int):
        rng = random.Random(200 + worker)
        calls = 0
        while calls < 800:
            pool = issued[-2000:]
            if not pool:
                time.sleep(0.0005)
                continue
            calls += 1
            keys = [rng.choice(pool) for _ in range(rng.randint(1, 40))]
            keys.append(rng.getrandbits(64) | 1)  # a foreign key now and then: stale, never an error
            updated = store.update_priorities(np.array(keys, dtype=np.uint64), [rng.uniform(0, 3) for _ in keys])
            assert 0 <= updated <= len(keys)
            add(updated=updated, update_keys=len(keys))

    def eraser():
        # erases a few items of its own right after inserting them (so erase surely finds live items), plus
        # a few recent keys of the other threads (live, evicted or erased by now: whatever they are)
        rng = random.Random(300)
        for call in range(500):
            items = [payload((9000 + call) * 100 + j) for j in range(3)]
            own = store.insert([1.0, 1.0, 1.0], items).tolist()
            with lock:
                payload_of.update(zip(own, items))
            add(inserted=3)
            pool = issued[-500:]
            others = rng.sample(pool, min(len(pool), 5))
            add(erased=store.erase(np.array(own[:2] + others, dtype=np.uint64)))

    def evictor():  # runs until the inserters are done, so it always has work
        while not inserters_done.wait(0.001):
            add(evicted=store.remove_to_fit(), remove_calls=1)
        add(evicted=store.remove_to_fit(), remove_calls=1)

    workers = Workers()
    for w in range(2):
        workers.add(inserter, w)
    for w in range(2):
        workers.add(sampler, w)
    workers.add(updater, 0)
    workers.add(eraser)
    workers.add(evictor)
    workers.run()

    # every sampled key named the item inserted under it, byte for byte
    assert observed
    for keys, items in observed:
        for k, item in zip(keys.tolist(), items):
            assert payload_of[k] == item, f"key {k} returned a foreign item"

    stats = store.stats()
    store.check_invariants()
    assert stats["inserted"] == tallies["inserted"] == len(payload_of)
    assert stats["sampled"] == tallies["sampled"]
    assert stats["sample_calls"] == tallies["sample_calls"] == 1200
    assert stats["updated"] == tallies["updated"]
    assert stats["updated"] + stats["stale_updates"] == tallies["update_keys"]
    assert stats["erased"] == tallies["erased"]
    assert stats["evicted"] == tallies["evicted"]
    assert stats["remove_to_fit_calls"] == tallies["remove_calls"]
    assert stats["size"] == len(store) == tallies["inserted"] - tallies["evicted"] - tallies["erased"]
    # the run really exercised every path
    assert stats["evicted"] > 1000 and stats["erased"] > 200 and stats["stale_updates"] >= 800

    # and the store is still fully usable
    excess = max(0, len(store) - 3000)
    assert store.remove_to_fit() == excess
    assert len(store) == min(3000, stats["size"])
    store.check_invariants()


def test_concurrent_fifo_eviction_never_removes_more_than_the_excess():
    store = PrioritizedStore(max_size=NO_CEILING, capacity=1000, alpha=0.6, shards=8, eviction="fifo")
    store.insert(np.ones(5000), [b"x"] * 5000)
    results: list[int] = []
    workers = Workers()
    for _ in range(4):
        workers.add(lambda: results.append(store.remove_to_fit()))
    workers.run()
    assert sum(results) == 4000
    assert len(store) == 1000
    store.check_invariants()


def test_snapshots_saved_while_other_threads_write_load_to_a_consistent_store(tmp_path):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=500, alpha=0.6, shards=4, eviction="fifo", seed=2)
    payload_of: dict[int, bytes] = {}
    lock = threading.Lock()

    def inserter(worker: int):
        for call in range(150):
            items = [payload((worker * 1000 + call) * 100 + j) for j in range(20)]
            keys = store.insert(np.full(20, 1.0 + worker), items).tolist()
            with lock:
                payload_of.update(zip(keys, items))
            if call % 10 == 0:
                store.remove_to_fit()

    paths = [tmp_path / f"snap-{i}.apx" for i in range(6)]

    def saver():
        for path in paths:
            store.save(path)
            time.sleep(0.002)

    workers = Workers()
    workers.add(inserter, 0)
    workers.add(inserter, 1)
    workers.add(saver)
    workers.run()

    for path in paths:
        loaded = PrioritizedStore.load(path)
        loaded.check_invariants()
        if len(loaded) == 0:
            continue
        stats = loaded.stats()
        assert stats["size"] == stats["inserted"] - stats["evicted"] - stats["erased"]
        batch = loaded.sample(64)
        for k, item in zip(batch.keys.tolist(), batch.items):
            assert payload_of[k] == bytes(item)
