"""Bad input raises ValueError naming the offending value, and leaves the store exactly as it was."""

from __future__ import annotations

import math

import numpy as np
import pytest

import apexrl
from apexrl import PrioritizedStore

NAN = float("nan")
INF = float("inf")


def populated_store(**config) -> tuple[PrioritizedStore, np.ndarray]:
    """A store with history: items over several shards, an update, an erase, a sample, an eviction."""
    kwargs = dict(capacity=100, alpha=0.6, shards=4, seed=11)
    kwargs.update(config)
    store = PrioritizedStore(**kwargs)
    keys = np.concatenate(
        [store.insert(np.linspace(0.1, 5.0, n), [bytes([i % 256]) * (i % 9) for i in range(n)]) for n in (70, 30, 20)]
    )
    store.update_priorities(keys[:10], np.full(10, 2.5))
    store.erase(keys[10:12])
    store.sample(8)
    store.remove_to_fit()
    return store, keys


def fingerprint(store: PrioritizedStore):
    return len(store), store.total_priority, store.stats()


# Each case: (store config overrides, the failing call, a regex the message must match).
# `k` is a live key of the store, `keys` every key it ever issued.
STORE_CASES = {
    # --- insert: priorities
    "insert: NaN priority": ({}, lambda s, k, keys: s.insert([1.0, NAN], [b"a", b"b"]), r"priorities\[1\] is nan"),
    "insert: +inf priority": ({}, lambda s, k, keys: s.insert([INF], [b"a"]), r"priorities\[0\] is inf"),
    "insert: -inf priority": ({}, lambda s, k, keys: s.insert([-INF], [b"a"]), r"priorities\[0\] is -inf"),
    "insert: negative priority": (
        {},
        lambda s, k, keys: s.insert([1.0, 2.0, -0.5], [b"a"] * 3),
        r"priorities\[2\] is -0\.5",
    ),
    "insert: negative int priority": (
        {},
        lambda s, k, keys: s.insert(np.array([3, -1]), [b"a"] * 2),
        r"priorities\[1\] is -1",
    ),
    "insert: bad priority after 100 good ones": (
        {},
        lambda s, k, keys: s.insert(np.r_[np.ones(100), NAN], [b"x"] * 101),
        r"priorities\[100\] is nan",
    ),
    "insert: priority^alpha overflows": (
        {"alpha": 2.0},
        lambda s, k, keys: s.insert([1.0, 1e200], [b"a", b"b"]),
        r"priorities\[1\] = 1e\+200 has mass priority\^alpha = inf \(alpha = 2\), above the limit MAX_MASS = 1e\+250",
    ),
    "insert: priority^alpha above MAX_MASS": (
        {"alpha": 1.0},
        lambda s, k, keys: s.insert([1e308, 1e308], [b"a", b"b"]),
        r"priorities\[0\] = 1e\+308 has mass priority\^alpha = 1e\+308 \(alpha = 1\), above the limit MAX_MASS",
    ),
    "insert: string priorities": ({}, lambda s, k, keys: s.insert(["1.0"], [b"a"]), r"priorities has dtype <U3"),
    "insert: complex priorities": (
        {},
        lambda s, k, keys: s.insert([1 + 2j], [b"a"]),
        r"priorities has dtype complex128",
    ),
    "insert: bool priorities": ({}, lambda s, k, keys: s.insert([True], [b"a"]), r"priorities has dtype bool"),
    "insert: object priorities": (
        {},
        lambda s, k, keys: s.insert(np.array([1.0, None], dtype=object), [b"a"] * 2),
        r"priorities has dtype object",
    ),
    "insert: 2-D priorities": (
        {},
        lambda s, k, keys: s.insert(np.ones((2, 2)), [b"a"] * 2),
        r"priorities must be 1-D, got shape \(2, 2\)",
    ),
    "insert: scalar priority": (
        {},
        lambda s, k, keys: s.insert(1.0, [b"a"]),
        r"priorities must be 1-D, got shape \(\)",
    ),
    # --- insert: items
    "insert: fewer items than priorities": (
        {},
        lambda s, k, keys: s.insert([1.0] * 3, [b"a"]),
        r"items has 1 entries but priorities has 3",
    ),
    "insert: more items than priorities": (
        {},
        lambda s, k, keys: s.insert([1.0], [b"a", b"b"]),
        r"items has 2 entries but priorities has 1",
    ),
    "insert: an item that is a str": (
        {},
        lambda s, k, keys: s.insert([1.0, 1.0], [b"a", "b"]),
        r"items\[1\] must be a C-contiguous bytes-like object, got str",
    ),
    "insert: an item that is None": ({}, lambda s, k, keys: s.insert([1.0], [None]), r"items\[0\] .*got NoneType"),
    "insert: a non-contiguous numpy item": (
        {},
        lambda s, k, keys: s.insert([1.0], [np.arange(10, dtype=np.uint8)[::2]]),
        r"items\[0\] must be a C-contiguous",
    ),
    "insert: items is one bytes object": (
        {},
        lambda s, k, keys: s.insert([1.0, 1.0], b"ab"),
        r"items must be a sequence .*got bytes",
    ),
    "insert: items is a str": (
        {},
        lambda s, k, keys: s.insert([1.0, 1.0], "ab"),
        r"items must be a sequence .*got str",
    ),
    "insert: items is an int": ({}, lambda s, k, keys: s.insert([1.0], 5), r"items must be a sequence .*got int"),
    "insert: 1-D array items": (
        {},
        lambda s, k, keys: s.insert([1.0] * 3, np.zeros(3, dtype=np.uint8)),
        r"one row per item \(ndim >= 2\), got shape \(3,\)",
    ),
    "insert: array rows mismatch": (
        {},
        lambda s, k, keys: s.insert([1.0, 1.0], np.zeros((3, 4), dtype=np.uint8)),
        r"items has 3 rows but priorities has 2 entries",
    ),
    "insert: Fortran-ordered array items": (
        {},
        lambda s, k, keys: s.insert([1.0] * 3, np.asfortranarray(np.zeros((3, 4), dtype=np.uint8))),
        r"items must be a C-contiguous bytes-like object, got ndarray",
    ),
    "insert: strided array items": (
        {},
        lambda s, k, keys: s.insert([1.0] * 3, np.zeros((3, 8), dtype=np.uint8)[:, ::2]),
        r"items must be a C-contiguous bytes-like object, got ndarray",
    ),
    "insert: no priorities for one item": (
        {},
        lambda s, k, keys: s.insert([], [b"a"]),
        r"items has 1 entries but priorities has 0",
    ),
    # --- insert: offsets
    "insert: offsets too short": (
        {},
        lambda s, k, keys: s.insert([1.0] * 2, b"abcd", offsets=[0, 4]),
        r"offsets must hold .* = 3 entries, got 2",
    ),
    "insert: offsets decrease": (
        {},
        lambda s, k, keys: s.insert([1.0] * 2, b"abcd", offsets=[0, 3, 1]),
        r"offsets\[2\] = 1 < offsets\[1\] = 3",
    ),
    "insert: offsets past the buffer": (
        {},
        lambda s, k, keys: s.insert([1.0] * 2, b"abcd", offsets=[0, 1, 5]),
        r"offsets\[-1\] = 5 is past the end of the 4-byte buffer",
    ),
    "insert: negative offset": (
        {},
        lambda s, k, keys: s.insert([1.0] * 2, b"abcd", offsets=[0, -2, 4]),
        r"offsets\[1\] is negative: -2",
    ),
    "insert: float offsets": (
        {},
        lambda s, k, keys: s.insert([1.0], b"abcd", offsets=[0.0, 4.0]),
        r"offsets has dtype float64",
    ),
    "insert: offsets with a list of items": (
        {},
        lambda s, k, keys: s.insert([1.0], [b"abcd"], offsets=[0, 4]),
        r"items \(with offsets\) must be a C-contiguous bytes-like object, got list",
    ),
    # --- update_priorities
    "update: more priorities than keys": (
        {},
        lambda s, k, keys: s.update_priorities(keys[:2], [1.0, 2.0, 3.0]),
        r"keys and priorities differ in length: 2 vs 3",
    ),
    "update: more keys than priorities": (
        {},
        lambda s, k, keys: s.update_priorities(keys[:3], [1.0]),
        r"keys and priorities differ in length: 3 vs 1",
    ),
    "update: NaN priority": (
        {},
        lambda s, k, keys: s.update_priorities(keys[20:23], [1.0, 2.0, NAN]),
        r"priorities\[2\] is nan",
    ),
    "update: inf priority": ({}, lambda s, k, keys: s.update_priorities([k], [INF]), r"priorities\[0\] is inf"),
    "update: negative priority": (
        {},
        lambda s, k, keys: s.update_priorities(keys[20:22], [7.0, -3.0]),
        r"priorities\[1\] is -3",
    ),
    "update: priority^alpha overflows": (
        {"alpha": 3.0},
        lambda s, k, keys: s.update_priorities([k], [1e300]),
        r"priorities\[0\] = 1e\+300 has mass priority\^alpha = inf \(alpha = 3\), above the limit MAX_MASS",
    ),
    "update: string priorities": (
        {},
        lambda s, k, keys: s.update_priorities([k], ["high"]),
        r"priorities has dtype <U4",
    ),
    "update: complex priorities": (
        {},
        lambda s, k, keys: s.update_priorities([k], [1j]),
        r"priorities has dtype complex128",
    ),
    "update: float keys": (
        {},
        lambda s, k, keys: s.update_priorities(keys[20:22].astype(np.float64), [1.0, 2.0]),
        r"keys has dtype float64",
    ),
    "update: negative key": (
        {},
        lambda s, k, keys: s.update_priorities(np.array([int(k), -5]), [9.0, 9.0]),
        r"keys\[1\] is negative: -5",
    ),
    "update: string keys": ({}, lambda s, k, keys: s.update_priorities([str(k)], [1.0]), r"keys has dtype <U"),
    "update: bool keys": ({}, lambda s, k, keys: s.update_priorities([True], [1.0]), r"keys has dtype bool"),
    "update: 2-D keys": (
        {},
        lambda s, k, keys: s.update_priorities(keys[20:24].reshape(2, 2), [1.0] * 4),
        r"keys must be 1-D, got shape \(2, 2\)",
    ),
    # --- erase
    "erase: float keys": ({}, lambda s, k, keys: s.erase(keys[20:25].astype(np.float64)), r"keys has dtype float64"),
    "erase: negative key": ({}, lambda s, k, keys: s.erase(np.array([int(k), -1])), r"keys\[1\] is negative: -1"),
    "erase: string keys": ({}, lambda s, k, keys: s.erase(["1"]), r"keys has dtype <U1"),
    "erase: complex keys": ({}, lambda s, k, keys: s.erase([1j]), r"keys has dtype complex128"),
    # --- sample
    "sample: n = 0": ({}, lambda s, k, keys: s.sample(0), r"n must be >= 1, got 0"),
    "sample: n < 0": ({}, lambda s, k, keys: s.sample(-3), r"n must be >= 1, got -3"),
    "sample: float n": ({}, lambda s, k, keys: s.sample(2.5), r"n must be an integer, got float"),
    "sample: bool n": ({}, lambda s, k, keys: s.sample(True), r"n must be an integer, got bool"),
    "sample: n out of range": ({}, lambda s, k, keys: s.sample(2**70), r"n is out of range: 1180591620717411303424"),
    "sample: negative beta": (
        {},
        lambda s, k, keys: s.sample(4, beta=-0.5),
        r"beta must be finite and >= 0, got -0\.5",
    ),
    "sample: NaN beta": ({}, lambda s, k, keys: s.sample(4, beta=NAN), r"beta must be finite and >= 0, got nan"),
    "sample: infinite beta": ({}, lambda s, k, keys: s.sample(4, beta=INF), r"beta must be finite and >= 0, got inf"),
    "sample: string beta": ({}, lambda s, k, keys: s.sample(4, beta="0.4"), r"beta must be a number, got str"),
}


@pytest.mark.parametrize("config, call, match", STORE_CASES.values(), ids=list(STORE_CASES))
def test_bad_input_raises_value_error_naming_it_and_changes_nothing(config, call, match):
    store, keys = populated_store(**config)
    live_key = int(keys[-1])  # inserted last: survives the FIFO trim
    assert store.update_priorities([live_key], [1.5]) == 1
    before = fingerprint(store)
    with pytest.raises(ValueError, match=match):
        call(store, live_key, keys)
    assert fingerprint(store) == before
    store.check_invariants()


def test_a_rejected_batch_leaves_no_item_of_it_behind_even_when_most_of_it_was_valid():
    store, keys = populated_store()
    before = fingerprint(store)
    payloads = [b"new-%d" % i for i in range(200)]
    payloads[150] = "not bytes"
    with pytest.raises(ValueError, match=r"items\[150\]"):
        store.insert(np.ones(200), payloads)
    with pytest.raises(ValueError, match=r"priorities\[199\] is -1"):
        store.insert(np.r_[np.ones(199), -1.0], [b"x"] * 200)
    with pytest.raises(ValueError, match=r"priorities\[0\] is nan"):
        store.update_priorities(keys[-50:], np.r_[NAN, np.full(49, 100.0)])
    assert fingerprint(store) == before


@pytest.mark.parametrize("shards", [1, 4])
def test_sampling_an_empty_store_raises_value_error_and_changes_nothing(shards):
    store = PrioritizedStore(capacity=10, shards=shards)
    before = fingerprint(store)
    with pytest.raises(ValueError, match=r"cannot sample from an empty store"):
        store.sample(1)
    assert fingerprint(store) == before


def test_sampling_a_store_emptied_by_erase_raises_value_error_and_changes_nothing():
    store, keys = populated_store()
    store.erase(keys)
    assert len(store) == 0
    before = fingerprint(store)
    with pytest.raises(ValueError, match=r"empty"):
        store.sample(5)
    assert fingerprint(store) == before


CONFIG_CASES = {
    "capacity 0": ({"capacity": 0}, r"capacity must be >= 1, got 0"),
    "negative capacity": ({"capacity": -5}, r"capacity must be >= 1, got -5"),
    "float capacity": ({"capacity": 10.5}, r"capacity must be an integer, got float"),
    "string capacity": ({"capacity": "10"}, r"capacity must be an integer, got str"),
    "bool capacity": ({"capacity": True}, r"capacity must be an integer, got bool"),
    "capacity out of range": ({"capacity": 2**70}, r"capacity is out of range"),
    "0 shards": ({"shards": 0}, r"shards must be in \[1, 256\], got 0"),
    "257 shards": ({"shards": 257}, r"shards must be in \[1, 256\], got 257"),
    "negative shards": ({"shards": -1}, r"shards must be in \[1, 256\], got -1"),
    "float shards": ({"shards": 2.0}, r"shards must be an integer, got float"),
    "unknown eviction": ({"eviction": "lru"}, r"unknown eviction policy 'lru'"),
    "eviction in capitals": ({"eviction": "FIFO"}, r"unknown eviction policy 'FIFO'"),
    "negative alpha": ({"alpha": -0.1}, r"alpha must be finite and >= 0, got -0\.1"),
    "NaN alpha": ({"alpha": NAN}, r"alpha must be finite and >= 0, got nan"),
    "infinite alpha": ({"alpha": INF}, r"alpha must be finite and >= 0, got inf"),
    "string alpha": ({"alpha": "0.6"}, r"alpha must be a number, got str"),
    "NaN alpha_evict": ({"alpha_evict": NAN}, r"alpha_evict must be finite, got nan"),
    "infinite alpha_evict": ({"alpha_evict": -INF}, r"alpha_evict must be finite, got -inf"),
    "negative seed": ({"seed": -1}, r"seed must be >= 0, got -1"),
}


@pytest.mark.parametrize("config, match", CONFIG_CASES.values(), ids=list(CONFIG_CASES))
def test_a_bad_configuration_raises_value_error_naming_it(config, match):
    with pytest.raises(ValueError, match=match):
        PrioritizedStore(**config)


@pytest.mark.parametrize(
    "config",
    [
        {"shards": 1},
        {"shards": 256},
        {"capacity": 1},
        {"alpha": 0.0},
        {"alpha_evict": 0.0},
        {"alpha_evict": 2.0},
        {"eviction": "prioritized"},
        {"seed": 2**63 - 1},
    ],
    ids=lambda c: ", ".join(f"{k}={v}" for k, v in c.items()),
)
def test_boundary_configurations_are_accepted_and_reported_back(config):
    store = PrioritizedStore(**config)
    for name, value in config.items():
        assert getattr(store, name) == value
    assert store.stats()["size"] == 0


def test_snapshot_error_is_a_value_error():
    assert issubclass(apexrl.SnapshotError, ValueError)


def test_empty_key_arrays_are_accepted_by_update_and_erase_and_change_nothing():
    store, _ = populated_store()
    before = fingerprint(store)
    assert store.update_priorities([], []) == 0
    assert store.update_priorities(np.array([], dtype=np.uint64), np.array([], dtype=np.float64)) == 0
    assert store.erase([]) == 0
    assert store.erase(np.array([], dtype=np.int64)) == 0
    assert fingerprint(store) == before


def test_keys_never_issued_are_stale_not_errors():
    store, keys = populated_store()
    before = store.stats()
    foreign = [0, 1, 2**64 - 1, 2**63, int(keys.max()) + (1 << 40)]
    assert store.update_priorities(np.array(foreign, dtype=np.uint64), np.ones(len(foreign))) == 0
    assert store.erase(np.array(foreign, dtype=np.uint64)) == 0
    after = store.stats()
    assert after["stale_updates"] == before["stale_updates"] + len(foreign)
    assert after["size"] == before["size"] and after["total_priority"] == before["total_priority"]


@pytest.mark.parametrize("shards", [1, 3])
def test_keys_of_another_store_are_stale_even_when_they_name_a_slot_that_is_free_here(shards):
    this = PrioritizedStore(capacity=10, alpha=1.0, shards=shards)
    other = PrioritizedStore(capacity=10, alpha=1.0, shards=shards)
    for store in (this, other):  # identical histories: the same slots are free in both
        keys = np.concatenate([store.insert([1.0, 1.0, 1.0], [b"x", b"y", b"z"]) for _ in range(shards)])
        store.erase(keys[1::3])
    foreign = other.insert(np.ones(shards), [b"new"] * shards)  # reuses the freed slots of `other`
    before = fingerprint(this)
    assert this.update_priorities(foreign, np.full(shards, 5.0)) == 0
    assert this.total_priority == before[1]
    this.check_invariants()
    assert this.erase(foreign) == 0
    assert len(this) == before[0]
    this.check_invariants()


def test_priorities_of_any_real_numeric_dtype_are_accepted():
    store = PrioritizedStore(capacity=100, alpha=1.0, shards=2)
    for dtype in (np.float16, np.float32, np.float64, ">f8", np.int8, np.int64, np.uint8, np.uint64):
        store.insert(np.array([1, 2], dtype=dtype), [b"a", b"b"])
    assert len(store) == 16
    assert math.isclose(store.total_priority, 24.0)
    # -0.0 is a zero priority, not a negative one
    store.insert([-0.0], [b"z"])
    assert len(store) == 17
