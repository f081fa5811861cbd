"""remove_to_fit(): FIFO removes the globally oldest items; prioritized draws victims proportional to p^alpha_evict."""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from apexrl import PrioritizedStore

# These tests drive eviction through remove_to_fit() alone: a hard ceiling far above what they insert
# (the ceiling itself is tested in test_store_limits.py).
NO_CEILING = 10**8


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x), X ~ chi-square(df): the regularized upper incomplete gamma Q(df/2, x/2) (series / Lentz)."""
    a, x = df / 2.0, x / 2.0
    if x <= 0.0:
        return 1.0
    log_prefactor = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:
        term = total = 1.0 / a
        ap = a
        while abs(term) >= abs(total) * 1e-16:
            ap += 1.0
            term *= x / ap
            total += term
        return max(0.0, 1.0 - total * math.exp(log_prefactor))
    tiny, b = 1e-300, x + 1.0 - a
    c, d = 1.0 / tiny, 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = 1.0 / (tiny if abs(d) < tiny else d)
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        h *= d * c
        if abs(d * c - 1.0) < 1e-16:
            break
    return math.exp(log_prefactor) * h


def test_the_chi_square_helper_matches_the_closed_form_for_even_df():
    for x, df in ((7.3, 4), (40.0, 10), (2.0, 2)):
        closed = math.exp(-x / 2) * sum((x / 2) ** i / math.factorial(i) for i in range(df // 2))
        assert chi2_sf(x, df) == pytest.approx(closed, rel=1e-9)


def live(store: PrioritizedStore, keys, priorities) -> list[bool]:
    """Which keys still address an item (probed one at a time by re-setting each item's own priority)."""
    return [store.update_priorities([int(k)], [float(p)]) == 1 for k, p in zip(keys, priorities)]


def insert_in_batches(store, sizes, priority=lambda i: 1.0):
    """Inserts batches of the given sizes (calls rotate over shards; >64 items split); returns keys and
    priorities in insertion order."""
    keys, prios, i = [], [], 0
    for n in sizes:
        p = [priority(i + j) for j in range(n)]
        keys.extend(store.insert(p, [b"item-%d" % (i + j) for j in range(n)]).tolist())
        prios.extend(p)
        i += n
    return keys, prios


# ---------------------------------------------------------------------------------------------------------------
# FIFO
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 3, 8])
@pytest.mark.parametrize("capacity", [1, 17, 100, 299])
def test_fifo_evicts_exactly_the_oldest_items_across_shards(shards, capacity):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=capacity, alpha=0.6, shards=shards, eviction="fifo")
    keys, prios = insert_in_batches(store, [5, 70, 1, 130, 3, 64, 27], priority=lambda i: (i * 37 % 11) / 3.0)
    assert len(store) == 300
    assert store.remove_to_fit() == 300 - capacity
    assert len(store) == capacity
    assert live(store, keys, prios) == [False] * (300 - capacity) + [True] * capacity
    stats = store.stats()
    assert stats["evicted"] == 300 - capacity
    assert stats["remove_to_fit_calls"] == 1
    store.check_invariants()


@pytest.mark.slow
def test_fifo_eviction_of_more_items_than_one_round_handles_keeps_exactly_the_newest():
    # one FIFO round gathers a bounded number of candidates per shard; 200k items need several rounds
    n, capacity = 200_000, 10
    store = PrioritizedStore(max_size=NO_CEILING, capacity=capacity, alpha=0.6, shards=8, eviction="fifo")
    keys = np.concatenate(
        [store.insert(np.ones(m), bytes(8 * m), offsets=np.arange(m + 1) * 8) for m in (150_000, 49_990, 10)]
    )
    assert store.remove_to_fit() == n - capacity
    assert len(store) == capacity
    assert store.update_priorities(keys[: n - capacity], np.ones(n - capacity)) == 0
    assert store.update_priorities(keys[n - capacity :], np.ones(capacity)) == capacity
    store.check_invariants()


def test_fifo_eviction_ignores_priorities_and_updates():
    store = PrioritizedStore(max_size=NO_CEILING, capacity=4, alpha=1.0, shards=2, eviction="fifo")
    keys, prios = insert_in_batches(store, [3, 3], priority=lambda i: [100.0, 0.0, 5.0, 0.0, 1e-3, 7.0][i])
    store.update_priorities(keys[:2], [1e6, 1e6])
    prios[:2] = [1e6, 1e6]
    assert store.remove_to_fit() == 2
    assert live(store, keys, prios) == [False, False, True, True, True, True]


def test_fifo_eviction_skips_erased_items_and_counts_only_what_it_removed():
    store = PrioritizedStore(max_size=NO_CEILING, capacity=5, alpha=0.6, shards=3, eviction="fifo")
    keys, prios = insert_in_batches(store, [4, 4, 4])
    assert store.erase([keys[0], keys[2], keys[9]]) == 3
    assert store.remove_to_fit() == 4  # 9 left, capacity 5
    expected = [False] * 12
    for i in (7, 8, 10, 11, 6):  # the five youngest survivors; 1, 3, 4, 5 were the oldest left
        expected[i] = True
    assert live(store, keys, prios) == expected
    assert store.stats()["erased"] == 3 and store.stats()["evicted"] == 4


def test_fifo_eviction_over_several_calls_keeps_the_global_order():
    store = PrioritizedStore(max_size=NO_CEILING, capacity=10, alpha=0.6, shards=4, eviction="fifo")
    all_keys, all_prios = [], []
    for _round in range(6):
        keys, prios = insert_in_batches(store, [3, 65, 2])
        all_keys += keys
        all_prios += prios
        store.remove_to_fit()
        assert len(store) == 10
    assert live(store, all_keys, all_prios) == [False] * (len(all_keys) - 10) + [True] * 10


@pytest.mark.parametrize("eviction", ["fifo", "prioritized"])
def test_remove_to_fit_under_capacity_removes_nothing_but_counts_the_call(eviction):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=10, shards=2, eviction=eviction)
    keys, prios = insert_in_batches(store, [10])
    assert store.remove_to_fit() == 0
    assert store.remove_to_fit() == 0
    assert all(live(store, keys, prios))
    stats = store.stats()
    assert stats["evicted"] == 0 and stats["remove_to_fit_calls"] == 2
    empty = PrioritizedStore(max_size=NO_CEILING, capacity=1, eviction=eviction)
    assert empty.remove_to_fit() == 0


# ---------------------------------------------------------------------------------------------------------------
# Prioritized
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 4])
def test_prioritized_eviction_removes_low_priorities_far_more_often_than_high(shards):
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=900, alpha=0.6, shards=shards, eviction="prioritized", alpha_evict=-0.4, seed=8
    )
    keys, prios = insert_in_batches(store, [100] * 10, priority=lambda i: 0.1 if i % 2 else 10.0)
    assert store.remove_to_fit() == 100
    alive = live(store, keys, prios)
    evicted = Counter(p for p, a in zip(prios, alive) if not a)
    assert evicted[0.1] + evicted[10.0] == 100
    # weights 0.1^-0.4 = 2.51 vs 10^-0.4 = 0.40: about 86% of the victims are expected to be low
    assert evicted[0.1] >= 75, evicted
    assert len(store) == 900
    store.check_invariants()


@pytest.mark.parametrize("shards", [1, 2])
@pytest.mark.parametrize("alpha_evict", [-0.4, -1.0, 0.0, 0.7])
def test_a_single_prioritized_victim_is_drawn_proportional_to_priority_to_the_alpha_evict(shards, alpha_evict):
    priorities = [0.25, 0.5, 1.0, 2.0, 4.0]
    weights = np.array(priorities) ** alpha_evict
    expected = weights / weights.sum()
    victims = Counter()
    trials = 2500
    for seed in range(trials):
        store = PrioritizedStore(
            max_size=NO_CEILING,
            capacity=4,
            alpha=0.6,
            shards=shards,
            eviction="prioritized",
            alpha_evict=alpha_evict,
            seed=seed,
        )
        keys = [int(store.insert([p], [b"x"])[0]) for p in priorities]  # one call each: spread over shards
        assert store.remove_to_fit() == 1
        alive = live(store, keys, priorities)
        assert alive.count(False) == 1
        victims[alive.index(False)] += 1
    stat = sum((victims[i] - trials * e) ** 2 / (trials * e) for i, e in enumerate(expected))
    p_value = chi2_sf(stat, len(priorities) - 1)
    assert p_value > 1e-3, (dict(victims), (trials * expected).round(1).tolist())


def test_prioritized_eviction_finishes_when_one_shard_is_asked_for_more_victims_than_it_holds():
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=50, alpha=0.6, shards=4, eviction="prioritized", alpha_evict=-0.4, seed=3
    )
    # ten items of eviction weight (1e-6)^-0.4 = 251 in one shard; 90 of weight 100^-0.4 = 0.16 elsewhere
    weak = store.insert(np.full(10, 1e-6), [b"weak"] * 10).tolist()
    strong = [k for _ in range(3) for k in store.insert(np.full(30, 100.0), [b"strong"] * 30).tolist()]
    assert store.remove_to_fit() == 50
    assert len(store) == 50
    assert live(store, weak, [1e-6] * 10) == [False] * 10
    assert sum(live(store, strong, [100.0] * 90)) == 50
    store.check_invariants()


@pytest.mark.parametrize("shards", [1, 3])
def test_prioritized_eviction_keeps_size_at_capacity_and_survivors_are_a_subset(shards):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=50, alpha=0.6, shards=shards, eviction="prioritized", seed=1)
    rng = np.random.default_rng(2)
    keys, prios = insert_in_batches(store, [40, 70, 9], priority=lambda i: float(rng.exponential()))
    assert store.remove_to_fit() == 69
    assert len(store) == 50
    assert sum(live(store, keys, prios)) == 50
    assert store.stats()["evicted"] == 69
    more, more_prios = insert_in_batches(store, [30])
    assert store.remove_to_fit() == 30
    assert sum(live(store, keys + more, prios + more_prios)) == 50
    store.check_invariants()


# ---------------------------------------------------------------------------------------------------------------
# Priority zero
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 4])
def test_with_negative_alpha_evict_zero_priority_items_go_before_anything_else(shards):
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=20, alpha=0.6, shards=shards, eviction="prioritized", alpha_evict=-0.4, seed=5
    )
    # 30 items, every third one has priority 0 (10 of them), spread over shards
    keys, prios = insert_in_batches(store, [7, 7, 7, 9], priority=lambda i: 0.0 if i % 3 == 0 else 1e-3)
    assert store.remove_to_fit() == 10
    alive = live(store, keys, prios)
    assert [a for a, p in zip(alive, prios) if p == 0.0] == [False] * 10
    assert all(a for a, p in zip(alive, prios) if p > 0.0)


@pytest.mark.parametrize("shards", [1, 4])
def test_when_zero_priority_items_outnumber_the_excess_only_zero_priority_items_are_evicted(shards):
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=25, alpha=0.6, shards=shards, eviction="prioritized", alpha_evict=-0.4, seed=6
    )
    keys, prios = insert_in_batches(store, [10, 10, 10], priority=lambda i: 0.0 if i % 2 else 0.01)
    assert store.remove_to_fit() == 5
    alive = live(store, keys, prios)
    assert all(a for a, p in zip(alive, prios) if p > 0.0)
    assert sum(not a for a, p in zip(alive, prios) if p == 0.0) == 5


@pytest.mark.parametrize("alpha_evict", [-0.4, 0.0, 0.5])
@pytest.mark.parametrize("eviction", ["fifo", "prioritized"])
@pytest.mark.parametrize("shards", [1, 3])
def test_all_zero_priorities_break_neither_policy(eviction, alpha_evict, shards):
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=7, alpha=0.6, shards=shards, eviction=eviction, alpha_evict=alpha_evict
    )
    keys, prios = insert_in_batches(store, [10, 10], priority=lambda i: 0.0)
    assert store.remove_to_fit() == 13
    alive = live(store, keys, prios)
    assert sum(alive) == 7
    if eviction == "fifo":
        assert alive == [False] * 13 + [True] * 7
    store.check_invariants()
    batch = store.sample(10)  # the uniform fallback still works on what is left
    assert np.all(batch.weights == 1.0)


@pytest.mark.parametrize("shards", [1, 3])
def test_with_positive_alpha_evict_a_zero_priority_item_is_kept_while_it_can_be(shards):
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=9, alpha=0.6, shards=shards, eviction="prioritized", alpha_evict=0.5, seed=2
    )
    keys, prios = insert_in_batches(store, [10], priority=lambda i: 0.0 if i == 4 else 1.0 + i)
    assert store.remove_to_fit() == 1
    assert live(store, keys, prios)[4] is True


# ---------------------------------------------------------------------------------------------------------------
# Keys of evicted items
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("eviction", ["fifo", "prioritized"])
@pytest.mark.parametrize("shards", [1, 4])
def test_keys_of_evicted_items_are_stale_forever_even_after_their_slots_are_reused(eviction, shards):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=30, alpha=1.0, shards=shards, eviction=eviction, seed=3)
    keys, prios = insert_in_batches(store, [40, 40])
    assert store.remove_to_fit() == 50
    alive = live(store, keys, prios)
    dead = [k for k, a in zip(keys, alive) if not a]
    assert len(dead) == 50
    stats = store.stats()
    # new items reuse the freed slots
    new_keys, _ = insert_in_batches(store, [60])
    assert not set(new_keys) & set(keys)
    total = store.total_priority
    assert store.update_priorities(dead, np.full(len(dead), 1000.0)) == 0
    assert store.total_priority == total  # no newer item was touched
    assert store.erase(dead) == 0
    assert len(store) == 90
    after = store.stats()
    assert after["stale_updates"] == stats["stale_updates"] + 50
    assert after["updated"] == stats["updated"]
    assert after["erased"] == 0
    store.check_invariants()
