"""The removers beside FIFO and prioritized: lifo (newest first), max_heap / lowest_priority (= min_heap; highest /
lowest priority first) and uniform, held to a reference model. An ordered remover's survivors are exactly the
model's, through random batches (split over shards), priority updates and erases; uniform's victims are equally
likely (chi-square, fixed seeds)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apexrl import PrioritizedStore
from apexrl.replay.server.table_flags import EVICTION_POLICIES
from tests.store.test_eviction import NO_CEILING, chi2_sf, live

# eviction -> the rank the model removes first (smallest first): by insertion number i or by priority p
ORDERED = {
    "fifo": lambda i, p: i,
    "lifo": lambda i, p: -i,
    "lowest_priority": lambda i, p: p,
    "min_heap": lambda i, p: p,
    "max_heap": lambda i, p: -p,
}


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    eviction=st.sampled_from(sorted(ORDERED)),
    shards=st.sampled_from([1, 3, 8]),
    capacity=st.integers(1, 60),
    batches=st.lists(st.integers(1, 70), min_size=1, max_size=6),
    updates=st.integers(0, 20),
    erases=st.integers(0, 10),
    seed=st.integers(0, 2**16),
)
def test_an_ordered_remover_keeps_exactly_what_the_model_keeps(
    eviction, shards, capacity, batches, updates, erases, seed
):
    rng = np.random.default_rng(seed)
    store = PrioritizedStore(max_size=NO_CEILING, capacity=capacity, alpha=0.6, shards=shards, eviction=eviction)
    items: dict[int, tuple[int, float]] = {}  # key -> (insertion number, priority)
    n = 0
    for size in batches:
        # distinct priorities: a heap's order among equal priorities is not specified
        prios = (rng.permutation(10_000)[:size] + 1) / 7.0 + n
        for k, p in zip(store.insert(prios, [b"x"] * size).tolist(), prios.tolist()):
            items[k] = (n, p)
            n += 1
    keys = list(items)
    for k in rng.choice(keys, size=min(updates, len(keys)), replace=False).tolist():
        p = float(rng.integers(1, 10**6)) / 3.0 + 0.5  # distinct from the insert priorities (thirds, not sevenths)
        assert store.update_priorities([k], [p]) == 1
        items[k] = (items[k][0], p)
    for k in rng.choice(keys, size=min(erases, len(keys)), replace=False).tolist():
        assert store.erase([k]) == 1
        del items[k]
    rank = ORDERED[eviction]
    model = sorted(items, key=lambda k: rank(*items[k]))
    excess = max(0, len(model) - capacity)
    assert store.remove_to_fit() == excess
    kept = set(model[excess:])
    alive = live(store, list(items), [items[k][1] for k in items])
    assert {k for k, a in zip(items, alive) if a} == kept
    store.check_invariants()


@pytest.mark.parametrize("shards", [1, 4])
def test_uniform_victims_are_equally_likely(shards):
    # 20 items (5 per shard with 4), capacity 10: each item survives with probability 1/2 by symmetry.
    trials, n, capacity = 1500, 20, 10
    survived = np.zeros(n)
    for t in range(trials):
        store = PrioritizedStore(
            max_size=NO_CEILING, capacity=capacity, alpha=0.6, shards=shards, eviction="uniform", seed=t
        )
        prios = np.linspace(0.01, 100.0, n)  # wildly different priorities: uniform ignores them
        keys = store.insert(prios, [b"x"] * n).tolist()
        assert store.remove_to_fit() == n - capacity
        survived += live(store, keys, prios.tolist())
    expected = trials * capacity / n
    chi2 = float(((survived - expected) ** 2 / expected).sum() + ((survived - expected) ** 2 / expected).sum())
    # survivors and victims per item: 2n cells, n - 1 degrees of freedom (each item's two cells sum to trials)
    assert chi2_sf(chi2, n - 1) > 1e-3, survived


def test_uniform_eviction_holds_no_per_item_state_and_keeps_the_store_consistent():
    store = PrioritizedStore(max_size=NO_CEILING, capacity=50, alpha=0.6, shards=3, eviction="uniform", seed=4)
    for i in range(5):
        store.insert(np.ones(40), [b"y"] * 40)
        store.remove_to_fit()
        assert len(store) == min(50, 40 * (i + 1))
    store.check_invariants()
    assert np.all(store.sample(8).weights > 0)


@pytest.mark.parametrize("eviction", ["lifo", "uniform", "max_heap"])
def test_the_new_removers_survive_a_snapshot(tmp_path, eviction):
    store = PrioritizedStore(capacity=10, eviction=eviction)
    store.insert(np.arange(1, 16, dtype=float), [b"z"] * 15)
    store.save(tmp_path / "s.bin")
    again = PrioritizedStore.load(tmp_path / "s.bin")
    assert again.eviction == eviction
    assert again.remove_to_fit() == 5


def test_min_heap_is_lowest_priority_by_another_name():
    store = PrioritizedStore(capacity=10, eviction="min_heap")
    assert store.eviction == "lowest_priority"
    assert set(EVICTION_POLICIES) >= {
        "fifo",
        "lifo",
        "prioritized",
        "uniform",
        "lowest_priority",
        "min_heap",
        "max_heap",
    }
    with pytest.raises(ValueError, match="'max_heap'"):
        PrioritizedStore(capacity=10, eviction="max-heap")
