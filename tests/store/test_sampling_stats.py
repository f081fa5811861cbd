"""Sampling follows P(k) = p_k^alpha / sum_j p_j^alpha, stratified, with IS weights (p_k^alpha / p_min^alpha)^-beta.

The statistical tests use fixed seeds (the store's and the test's), so they are deterministic; the chi-square
threshold only decides how far from the expected frequencies a run may land before it counts as broken.
"""

from __future__ import annotations

import math
from collections import Counter

import numpy as np
import pytest

from apexrl import PrioritizedStore

P_VALUE_FLOOR = 1e-3


# ---------------------------------------------------------------------------------------------------------------
# Chi-square without scipy: Q(df/2, x/2), the regularized upper incomplete gamma (Numerical Recipes 6.2)
# ---------------------------------------------------------------------------------------------------------------


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square with df degrees of freedom."""
    a, x = df / 2.0, x / 2.0
    if x <= 0.0:
        return 1.0
    log_prefactor = -x + a * math.log(x) - math.lgamma(a)
    if x < a + 1.0:  # series for the lower function P
        term = total = 1.0 / a
        ap = a
        for _ in range(100_000):
            ap += 1.0
            term *= x / ap
            total += term
            if abs(term) < abs(total) * 1e-16:
                break
        return max(0.0, 1.0 - total * math.exp(log_prefactor))
    tiny = 1e-300  # continued fraction for Q (modified Lentz)
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 100_000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(log_prefactor) * h


def _sf_even_df(x, df):  # closed form for even df: e^(-x/2) sum_{i < df/2} (x/2)^i / i!
    return math.exp(-x / 2) * sum((x / 2) ** i / math.factorial(i) for i in range(df // 2))


@pytest.mark.parametrize(
    "x, df, p",
    [
        (3.841458820694124, 1, 0.05),
        (11.070497693516351, 5, 0.05),
        (6.6348966010212145, 1, 0.01),
        (124.34211340400407, 100, 0.05),
        (0.5, 3, math.erfc(0.5) + math.exp(-0.25) / math.sqrt(math.pi)),
        (40.0, 10, _sf_even_df(40.0, 10)),
        (7.3, 4, _sf_even_df(7.3, 4)),
        (300.0, 200, _sf_even_df(300.0, 200)),
    ],
)
def test_the_chi_square_helper_reproduces_table_values(x, df, p):
    assert chi2_sf(x, df) == pytest.approx(p, rel=1e-6)


def chi_square_p_value(counts: dict, expected_probability: dict) -> float:
    total = sum(counts.values())
    assert set(counts) <= set(expected_probability), "a draw landed outside the expected support"
    stat = 0.0
    for key, prob in expected_probability.items():
        expected = total * prob
        assert expected >= 5, "the test is too small for a chi-square approximation"
        stat += (counts.get(key, 0) - expected) ** 2 / expected
    return chi2_sf(stat, len(expected_probability) - 1)


# ---------------------------------------------------------------------------------------------------------------
# Helpers
# ---------------------------------------------------------------------------------------------------------------


def mass(priority: float, alpha: float) -> float:
    return 1.0 if alpha == 0 else priority**alpha


def build(priorities, alpha, shards, seed=1234, batches=3):
    """A store holding `priorities` (inserted in `batches` calls, so they spread over shards); returns the store
    and a dict key -> priority."""
    store = PrioritizedStore(capacity=10_000, alpha=alpha, shards=shards, seed=seed)
    by_key = {}
    for chunk in np.array_split(np.asarray(priorities, dtype=np.float64), batches):
        keys = store.insert(chunk, [b"%d" % i for i in range(len(chunk))])
        by_key.update(zip(keys.tolist(), chunk.tolist()))
    return store, by_key


def expected_probabilities(by_key, alpha):
    masses = {k: mass(p, alpha) for k, p in by_key.items()}
    total = sum(masses.values())
    if total == 0:
        return {k: 1.0 / len(masses) for k in masses}
    return {k: m / total for k, m in masses.items() if m > 0}


def draw_counts(store, calls, n, beta=0.4):
    counts = Counter()
    for _ in range(calls):
        counts.update(store.sample(n, beta=beta).keys.tolist())
    return counts


PRIORITIES = [0.0, 0.0, 0.05, 0.3, 1.0, 2.5, 7.0, 20.0] * 3


# ---------------------------------------------------------------------------------------------------------------
# Frequencies
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 4])
@pytest.mark.parametrize("alpha", [0.0, 0.6, 1.0])
@pytest.mark.parametrize("calls, n", [(4000, 7), (20000, 1)], ids=["batches of 7", "single draws"])
def test_sampling_frequencies_follow_priority_to_the_alpha(alpha, shards, calls, n):
    store, by_key = build(PRIORITIES, alpha, shards)
    expected = expected_probabilities(by_key, alpha)
    counts = draw_counts(store, calls, n)
    assert sum(counts.values()) == calls * n
    p_value = chi_square_p_value(counts, expected)
    assert p_value > P_VALUE_FLOOR, f"frequencies are off p^{alpha}: chi-square p = {p_value:.2e}"


@pytest.mark.parametrize("shards", [1, 4])
@pytest.mark.parametrize("alpha", [0.6, 1.0, 2.0])
def test_items_with_priority_zero_are_never_sampled_when_alpha_is_positive(alpha, shards):
    store, by_key = build([0.0] * 50 + [1e-6, 3.0], alpha, shards, batches=5)
    zero_keys = {k for k, p in by_key.items() if p == 0.0}
    counts = draw_counts(store, 500, 64)
    assert not zero_keys & set(counts)
    assert set(counts) <= {k for k, p in by_key.items() if p > 0}


@pytest.mark.parametrize("shards", [1, 3])
def test_alpha_zero_samples_uniformly_zero_priorities_included(shards):
    priorities = [0.0, 0.0, 0.0, 1e-9, 1.0, 1e6]
    store, by_key = build(priorities, 0.0, shards)
    counts = draw_counts(store, 3000, 5, beta=1.0)
    p_value = chi_square_p_value(counts, dict.fromkeys(by_key, 1 / 6))
    assert p_value > P_VALUE_FLOOR
    batch = store.sample(50, beta=1.0)
    assert np.all(batch.weights == 1.0)
    assert np.allclose(batch.probabilities, 1 / 6, rtol=1e-12)
    assert store.total_priority == pytest.approx(6.0)


@pytest.mark.parametrize("shards", [1, 4])
@pytest.mark.parametrize("alpha", [0.0, 0.25, 0.6, 1.0, 1.7])
def test_reported_probabilities_are_priority_to_the_alpha_over_the_total(alpha, shards):
    store, by_key = build(PRIORITIES + [0.001, 123.0], alpha, shards)
    expected = expected_probabilities(by_key, alpha)
    assert store.total_priority == pytest.approx(sum(mass(p, alpha) for p in by_key.values()), rel=1e-12)
    for _ in range(20):
        batch = store.sample(40)
        got = dict(zip(batch.keys.tolist(), batch.probabilities.tolist()))
        for key, prob in got.items():
            assert prob == pytest.approx(expected[key], rel=1e-12)


def test_probabilities_follow_priority_updates_and_erasures():
    store, by_key = build([1.0, 2.0, 3.0, 4.0], 1.0, 2)
    keys = sorted(by_key)
    store.update_priorities(keys[:2], [6.0, 0.0])
    store.erase(keys[2:3])
    # left: keys[0] -> 6, keys[1] -> 0, keys[3] -> 4
    assert store.total_priority == pytest.approx(10.0)
    counts = draw_counts(store, 2000, 5)
    assert set(counts) == {keys[0], keys[3]}
    batch = store.sample(20)
    expected = {keys[0]: 0.6, keys[3]: 0.4}
    for key, prob in zip(batch.keys.tolist(), batch.probabilities.tolist()):
        assert prob == pytest.approx(expected[key], rel=1e-12)
    assert chi_square_p_value(counts, expected) > P_VALUE_FLOOR


# ---------------------------------------------------------------------------------------------------------------
# Stratification
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 2])
def test_a_store_of_two_equal_items_sampled_two_at_a_time_returns_one_of_each_every_time(shards):
    store = PrioritizedStore(capacity=10, alpha=0.6, shards=shards, seed=3)
    a = store.insert([2.0], [b"a"])[0]
    b = store.insert([2.0], [b"b"])[0]  # a second call: the next shard when there are two
    for _ in range(2000):
        batch = store.sample(2)
        assert sorted(batch.keys.tolist()) == sorted([int(a), int(b)])
        assert sorted(bytes(m) for m in batch.items) == [b"a", b"b"]


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize(
    "alpha, priorities, n, per_call",
    [
        (1.0, [1.0, 1.0, 2.0, 4.0], 8, [1, 1, 2, 4]),
        (0.5, [1.0, 1.0, 4.0, 16.0], 8, [1, 1, 2, 4]),
        (1.0, [1.0, 1.0, 2.0, 4.0], 16, [2, 2, 4, 8]),
        (0.0, [0.0, 5.0, 0.1, 9.0, 0.0], 10, [2, 2, 2, 2, 2]),
        (1.0, [3.0, 0.0, 3.0, 0.0, 3.0], 3, [1, 0, 1, 0, 1]),
    ],
)
def test_when_every_mass_is_a_multiple_of_the_segment_each_batch_holds_exact_counts(
    shards, alpha, priorities, n, per_call
):
    store = PrioritizedStore(capacity=100, alpha=alpha, shards=shards, seed=9)
    keys = [int(store.insert([p], [b"%d" % i])[0]) for i, p in enumerate(priorities)]  # one call each: spread
    for _ in range(500):
        counts = Counter(store.sample(n).keys.tolist())
        assert [counts.get(k, 0) for k in keys] == per_call


@pytest.mark.parametrize("shards", [1, 4])
def test_every_item_whose_mass_spans_two_segments_appears_in_every_batch(shards):
    rng = np.random.default_rng(17)
    priorities = np.r_[rng.exponential(1.0, size=300), 40.0, 90.0, 250.0]
    store, by_key = build(priorities, 0.6, shards, batches=6)
    total = store.total_priority
    for n in (64, 257, 1000):
        must_appear = {k for k, p in by_key.items() if p**0.6 > 2.0 * total / n}
        assert must_appear, "the case must constrain something"
        for _ in range(50):
            assert must_appear <= set(store.sample(n).keys.tolist())


# ---------------------------------------------------------------------------------------------------------------
# Importance-sampling weights
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 3])
@pytest.mark.parametrize(
    "alpha, beta, weights_by_priority",
    [
        (0.5, 0.5, {1.0: 1.0, 4.0: 2**-0.5, 16.0: 0.5}),
        (0.5, 1.0, {1.0: 1.0, 4.0: 0.5, 16.0: 0.25}),
        (1.0, 0.4, {1.0: 1.0, 4.0: 4**-0.4, 16.0: 16**-0.4}),
        (0.5, 0.0, {1.0: 1.0, 4.0: 1.0, 16.0: 1.0}),
        (0.0, 1.0, {1.0: 1.0, 4.0: 1.0, 16.0: 1.0, 0.0: 1.0}),
    ],
)
def test_is_weights_match_a_hand_computed_case(shards, alpha, beta, weights_by_priority):
    # the zero-priority item is present but is never the minimum: p_min is the smallest positive priority
    store = PrioritizedStore(capacity=100, alpha=alpha, shards=shards, seed=4)
    priority_of = {}
    for p in (16.0, 0.0, 4.0, 1.0):
        priority_of[int(store.insert([p], [b"x"])[0])] = p
    seen = set()
    for _ in range(300):
        batch = store.sample(3, beta=beta)
        for key, w in zip(batch.keys.tolist(), batch.weights.tolist()):
            assert w == pytest.approx(weights_by_priority[priority_of[key]], rel=1e-6)
            seen.add(priority_of[key])
    assert seen == set(weights_by_priority)


def test_is_weights_equal_the_normalized_n_times_p_formula():
    priorities = np.array([0.2, 0.5, 1.0, 3.0, 8.0, 0.0])
    alpha, beta = 0.6, 0.7
    store, by_key = build(priorities, alpha, 2)
    probs = expected_probabilities(by_key, alpha)
    big_n = len(by_key)
    raw = {k: (big_n * p) ** -beta for k, p in probs.items()}
    max_raw = max(raw.values())
    for _ in range(100):
        batch = store.sample(4, beta=beta)
        for key, w in zip(batch.keys.tolist(), batch.weights.tolist()):
            assert w == pytest.approx(raw[key] / max_raw, rel=1e-6)
            assert 0.0 < w <= 1.0


def test_is_weights_stay_positive_when_they_underflow_float32():
    store = PrioritizedStore(capacity=10, alpha=1.0, shards=1, seed=0)
    store.insert([1e-300, 1e250], [b"tiny", b"huge"])  # 1e250: the largest mass the store accepts
    batch = store.sample(8, beta=1.0)  # w(huge) = 1e-550: below any float32
    assert {bytes(m) for m in batch.items} == {b"huge"}
    assert np.all(batch.weights > 0) and np.all(batch.weights <= 1)
    assert np.all(np.isfinite(batch.weights))


def test_is_weights_are_relative_to_the_store_minimum_even_when_it_is_not_in_the_batch():
    store = PrioritizedStore(capacity=10, alpha=1.0, shards=1, seed=0)
    _k_small, k_big = store.insert([1.0, 1000.0], [b"s", b"b"]).tolist()
    only_big = [b for b in (store.sample(1, beta=0.5) for _ in range(200)) if b.keys[0] == k_big]
    assert only_big, "the big item dominates single draws"
    for batch in only_big:
        assert batch.weights[0] == pytest.approx(1000.0**-0.5, rel=1e-6)


def test_is_weights_follow_the_current_minimum_after_updates_and_erasures():
    store = PrioritizedStore(capacity=10, alpha=1.0, shards=2, seed=0)
    k1 = int(store.insert([1.0], [b"1"])[0])
    k4 = int(store.insert([4.0], [b"4"])[0])
    k16 = int(store.insert([16.0], [b"16"])[0])

    def weight_of(key, beta=1.0):
        for _ in range(500):
            batch = store.sample(8, beta=beta)
            hits = batch.weights[batch.keys == key]
            if hits.size:
                return float(hits[0])
        raise AssertionError("key never sampled")

    assert weight_of(k16) == pytest.approx(1 / 16, rel=1e-6)
    store.erase([k1])  # minimum is now 4
    assert weight_of(k16) == pytest.approx(4 / 16, rel=1e-6)
    store.update_priorities([k4], [0.5])  # minimum is now 0.5
    assert weight_of(k16) == pytest.approx(0.5 / 16, rel=1e-6)
    store.update_priorities([k4], [0.0])  # zero is not a minimum: 16 is alone
    assert weight_of(k16) == pytest.approx(1.0)


# ---------------------------------------------------------------------------------------------------------------
# All priorities zero
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 3])
def test_when_every_priority_is_zero_sampling_falls_back_to_uniform_with_weight_one(shards):
    store, by_key = build([0.0] * 6, 0.6, shards)
    assert store.total_priority == 0.0
    counts = draw_counts(store, 3000, 5, beta=0.9)
    assert chi_square_p_value(counts, dict.fromkeys(by_key, 1 / 6)) > P_VALUE_FLOOR
    batch = store.sample(30, beta=0.9)
    assert np.all(batch.weights == 1.0)
    assert np.allclose(batch.probabilities, 1 / 6, rtol=1e-12)


def test_the_uniform_fallback_ends_as_soon_as_one_priority_is_positive_and_returns_when_it_is_zero_again():
    store, by_key = build([0.0] * 5, 1.0, 2)
    keys = sorted(by_key)
    assert len(set(draw_counts(store, 200, 5))) == 5
    store.update_priorities([keys[2]], [0.25])
    batch = store.sample(20, beta=1.0)
    assert set(batch.keys.tolist()) == {keys[2]}
    assert np.all(batch.probabilities == 1.0)
    assert np.all(batch.weights == 1.0)
    store.update_priorities([keys[2]], [0.0])
    assert len(set(draw_counts(store, 200, 5))) == 5


def test_updating_every_priority_to_zero_reaches_the_fallback():
    store, by_key = build([1.0, 2.0, 3.0], 0.6, 1)
    store.update_priorities(list(by_key), [0.0, 0.0, 0.0])
    assert store.total_priority == 0.0
    batch = store.sample(12)
    assert set(batch.keys.tolist()) <= set(by_key)
    assert np.allclose(batch.probabilities, 1 / 3)


# ---------------------------------------------------------------------------------------------------------------
# Reproducibility
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("shards", [1, 4])
def test_two_stores_with_the_same_seed_and_history_draw_identical_batches(shards):
    def run(seed):
        store, _ = build(PRIORITIES, 0.6, shards, seed=seed)
        return [store.sample(16).keys.tolist() for _ in range(20)]

    assert run(77) == run(77)
    assert run(77) != run(78)
