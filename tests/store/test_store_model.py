"""Stateful property test: the store agrees, call by call, with a small pure-Python reference model.

The model is a dict key -> (priority, payload, insertion number) plus the counters the store reports. Every
rule calls the store and the model and compares what comes back; the invariants compare size, total mass,
every counter, and the store's own internal checks after every step.
"""

from __future__ import annotations

import math
import random
import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from apexrl import PrioritizedStore

# These tests drive eviction through remove_to_fit() alone: a hard ceiling far above what they insert
# (the ceiling itself is tested in test_store_limits.py).
NO_CEILING = 10**8

PRIORITIES = st.one_of(
    st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False),
)
# Priority mixes, chosen once per run: "zeros" inserts only zeros and updates mostly to zero, so the uniform
# fallback (every mass 0) and the urgent zero-priority evictions get exercised.
PRIORITY_MIXES = {
    "mixed": (PRIORITIES, PRIORITIES),
    "zero-heavy": (st.one_of(st.just(0.0), PRIORITIES), st.one_of(st.just(0.0), PRIORITIES)),
    "zeros": (st.just(0.0), st.one_of(*[st.just(0.0)] * 4, PRIORITIES)),
}
COUNTERS = (
    "inserted",
    "sampled",
    "sample_calls",
    "updated",
    "stale_updates",
    "evicted",
    "erased",
    "remove_to_fit_calls",
)


class StoreModel(RuleBasedStateMachine):
    shard_choices: tuple[int, ...] = (1,)

    def __init__(self):
        super().__init__()
        self.store: PrioritizedStore | None = None
        self.items: dict[int, list] = {}  # key -> [priority, payload, insertion number]
        self.issued: set[int] = set()
        self.dead: list[int] = []
        self.next_seq = 0
        self.next_uid = 0
        self.counts = dict.fromkeys(COUNTERS, 0)

    # -- helpers ------------------------------------------------------------------------------------------------

    def mass(self, priority: float) -> float:
        return 1.0 if self.alpha == 0 else priority**self.alpha

    def payload(self, extra: int) -> bytes:
        self.next_uid += 1
        return struct.pack("<I", self.next_uid) + bytes((self.next_uid + j) % 256 for j in range(extra))

    def forget(self, key: int) -> None:
        del self.items[key]
        self.dead.append(key)

    def keys_strategy(self, max_size: int):
        choices = [st.integers(min_value=0, max_value=2**64 - 1), st.just(0)]
        if self.items:
            live = sorted(self.items)
            choices += [st.sampled_from(live)] * 3
        if self.dead:
            choices += [st.sampled_from(self.dead)] * 2
        return st.lists(st.one_of(*choices), max_size=max_size)

    def probe_alive(self, keys: list[int]) -> list[bool]:
        """Which keys the store still holds, learned by re-setting each model priority (counted as updates)."""
        alive = []
        for k in keys:
            priority = self.items[k][0] if k in self.items else 1.0
            hit = self.store.update_priorities(np.array([k], dtype=np.uint64), [priority])
            alive.append(hit == 1)
            self.counts["updated" if hit else "stale_updates"] += 1
        return alive

    # -- rules --------------------------------------------------------------------------------------------------

    @initialize(data=st.data())
    def create(self, data):
        self.alpha = data.draw(st.sampled_from([0.0, 0.6, 1.0]), label="alpha")
        self.capacity = data.draw(st.integers(min_value=1, max_value=24), label="capacity")
        mix = data.draw(st.sampled_from(sorted(PRIORITY_MIXES)), label="priority mix")
        self.insert_priorities, self.update_priorities_strategy = PRIORITY_MIXES[mix]
        self.shards = data.draw(st.sampled_from(self.shard_choices), label="shards")
        self.eviction = data.draw(st.sampled_from(["fifo", "prioritized"]), label="eviction")
        self.alpha_evict = data.draw(st.sampled_from([-0.4, -1.0, 0.0, 0.5]), label="alpha_evict")
        seed = data.draw(st.integers(min_value=0, max_value=2**32), label="seed")
        self.store = PrioritizedStore(
            max_size=NO_CEILING,
            capacity=self.capacity,
            alpha=self.alpha,
            shards=self.shards,
            eviction=self.eviction,
            alpha_evict=self.alpha_evict,
            seed=seed,
        )

    @rule(data=st.data())
    def insert(self, data):
        n = data.draw(st.one_of(st.integers(1, 10), st.integers(0, 80)), label="n")  # > 64: split over shards
        # A few drawn priorities spread over the batch by a drawn seed: big batches stay cheap to generate.
        palette = data.draw(st.lists(self.insert_priorities, min_size=1, max_size=4), label="priority palette")
        rng = random.Random(data.draw(st.integers(min_value=0, max_value=2**32), label="batch seed"))
        priorities = [rng.choice(palette) for _ in range(n)]
        form = data.draw(st.sampled_from(["list", "offsets", "array"]), label="form")
        if form == "array":
            width = data.draw(st.sampled_from([0, 4, 9]), label="row width")
            payloads = [self.payload(width - 4) if width else b"" for _ in range(n)]
            items = np.frombuffer(b"".join(payloads), dtype=np.uint8).reshape(n, width)
            keys = self.store.insert(np.array(priorities, dtype=np.float64), items)
        else:
            extras = [rng.randint(-1, 20) for _ in range(n)]  # -1: an empty item
            payloads = [b"" if e < 0 else self.payload(e) for e in extras]
            if form == "list":
                kinds = (bytes, bytearray, memoryview)
                keys = self.store.insert(priorities, [kinds[i % 3](p) for i, p in enumerate(payloads)])
            else:
                offsets = np.concatenate([[0], np.cumsum([len(p) for p in payloads], dtype=np.int64)])
                keys = self.store.insert(priorities, b"".join(payloads), offsets=offsets)
        assert keys.dtype == np.uint64 and keys.shape == (n,)
        keys = keys.tolist()
        assert 0 not in keys
        assert len(set(keys)) == n and not set(keys) & self.issued, "a key was issued twice"
        for key, priority, item in zip(keys, priorities, payloads):
            self.next_seq += 1
            self.items[key] = [priority, item, self.next_seq]
        self.issued.update(keys)
        self.counts["inserted"] += n

    @rule(data=st.data())
    def update_priorities(self, data):
        keys = data.draw(self.keys_strategy(12), label="keys")
        priorities = data.draw(
            st.lists(self.update_priorities_strategy, min_size=len(keys), max_size=len(keys)), label="priorities"
        )
        expected = 0
        for key, priority in zip(keys, priorities):
            if key in self.items:
                self.items[key][0] = priority
                expected += 1
        got = self.store.update_priorities(np.array(keys, dtype=np.uint64), priorities)
        assert got == expected
        self.counts["updated"] += expected
        self.counts["stale_updates"] += len(keys) - expected

    @rule(data=st.data())
    def erase(self, data):
        keys = data.draw(self.keys_strategy(6), label="keys")
        expected = 0
        for key in keys:
            if key in self.items:
                self.forget(key)
                expected += 1
        as_list = data.draw(st.booleans(), label="keys as a list") and all(k < 2**63 for k in keys)
        got = self.store.erase(keys if as_list else np.array(keys, dtype=np.uint64))
        assert got == expected
        self.counts["erased"] += expected

    @rule()
    def remove_to_fit(self):
        excess = max(0, len(self.items) - self.capacity)
        event(f"remove_to_fit: {self.eviction}, {'evicts' if excess else 'nothing to evict'}")
        assert self.store.remove_to_fit() == excess
        self.counts["remove_to_fit_calls"] += 1
        self.counts["evicted"] += excess
        if self.eviction == "fifo":
            victims = sorted(self.items, key=lambda k: self.items[k][2])[:excess]
            for key in victims:
                self.forget(key)
            assert not any(self.probe_alive(victims)), "FIFO evicted something other than the oldest"
            assert all(self.probe_alive(sorted(self.items)))
            return
        before = sorted(self.items)
        alive = self.probe_alive(before)
        victims = [k for k, a in zip(before, alive) if not a]
        assert len(victims) == excess
        if self.alpha_evict < 0:  # priority 0 is urgent: it leaves before anything drawn
            zeros = {k for k in before if self.items[k][0] == 0.0}
            how_many = "no" if not zeros else "fewer" if len(zeros) < excess else "enough"
            event(f"prioritized eviction with {how_many} zero priorities")
            if len(zeros) >= excess:
                assert set(victims) <= zeros
            else:
                assert zeros <= set(victims)
        for key in victims:
            self.forget(key)

    @rule(n=st.integers(min_value=1, max_value=40), beta=st.sampled_from([0.0, 0.4, 1.0]))
    def sample(self, n, beta):
        if not self.items:  # sampling an empty store is an error case: test_store_errors.py
            return
        batch = self.store.sample(n, beta=beta)
        self.counts["sampled"] += n
        self.counts["sample_calls"] += 1
        assert len(batch) == n and batch.offsets.shape == (n + 1,) and batch.offsets[-1] == batch.data.size
        masses = {k: self.mass(v[0]) for k, v in self.items.items()}
        total = sum(masses.values())
        event("sample: every mass 0 (uniform fallback)" if total == 0 else "sample: proportional")
        positive = [m for m in masses.values() if m > 0]
        min_mass = min(positive) if positive else math.inf
        sampled = batch.keys.tolist()
        for key, item, prob, weight in zip(sampled, batch.items, batch.probabilities.tolist(), batch.weights.tolist()):
            assert key in self.items, f"sampled key {key} is not live"
            assert bytes(item) == self.items[key][1]
            if total > 0:
                assert masses[key] > 0, "an item of mass 0 was sampled"
                assert math.isclose(prob, masses[key] / total, rel_tol=1e-9), (prob, masses[key] / total)
                assert math.isclose(weight, (masses[key] / min_mass) ** -beta, rel_tol=1e-6), weight
            else:  # every priority 0 (alpha > 0): uniform, weights 1
                assert math.isclose(prob, 1 / len(self.items), rel_tol=1e-9), prob
                assert weight == 1.0
        if total > 0:  # stratified: an item spanning two whole segments is always drawn
            must = {k for k, m in masses.items() if m > 2.001 * total / n}
            assert must <= set(sampled)

    # -- invariants ---------------------------------------------------------------------------------------------

    @invariant()
    def agrees_with_the_model(self):
        if self.store is None:
            return
        assert len(self.store) == len(self.items)
        expected_total = sum(self.mass(v[0]) for v in self.items.values())
        assert self.store.total_priority == pytest.approx(expected_total, rel=1e-9, abs=1e-12)
        stats = self.store.stats()
        assert {name: stats[name] for name in COUNTERS} == self.counts
        assert stats["size"] == len(self.items)
        assert stats["bytes_held"] == sum(len(v[1]) for v in self.items.values())
        assert stats["capacity"] == self.capacity and stats["shards"] == self.shards
        assert stats["total_priority"] == self.store.total_priority
        self.store.check_invariants()


class ShardedStoreModel(StoreModel):
    shard_choices = (2, 3, 8)


MODEL_SETTINGS = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

TestOneShardStoreMatchesTheReferenceModel = StoreModel.TestCase
TestOneShardStoreMatchesTheReferenceModel.settings = MODEL_SETTINGS
TestShardedStoreMatchesTheReferenceModel = ShardedStoreModel.TestCase
TestShardedStoreMatchesTheReferenceModel.settings = MODEL_SETTINGS
