"""Items go in, in any of the three accepted forms, and come back byte-exact under the key insert returned."""

from __future__ import annotations

import gc
import math
import os
import struct

import numpy as np
import pytest

from apexrl import PrioritizedStore

# These tests drive eviction through remove_to_fit() alone: a hard ceiling far above what they insert
# (the ceiling itself is tested in test_store_limits.py).
NO_CEILING = 10**8


def every_item(store: PrioritizedStore) -> dict[int, bytes]:
    """Every item of a store with alpha=0 (all masses 1): a stratified sample of n >= 2 * len draws puts at
    least one draw inside every item's unit interval, so the batch covers the whole store."""
    assert store.alpha == 0.0, "every_item() relies on uniform masses"
    batch = store.sample(2 * len(store) + 2)
    found: dict[int, bytes] = {}
    for key, item in zip(batch.keys.tolist(), batch.items):
        data = bytes(item)
        assert found.setdefault(key, data) == data, f"key {key} returned two different payloads"
    assert len(found) == len(store), "stratified coverage missed an item"
    return found


def tagged(i: int, extra: int = 0) -> bytes:
    """A payload that names its item: 4-byte id, then `extra` bytes derived from it."""
    return struct.pack("<I", i) + bytes((i * 7 + j) % 256 for j in range(extra))


def uniform_store(shards: int = 3) -> PrioritizedStore:
    return PrioritizedStore(max_size=NO_CEILING, capacity=1000, alpha=0.0, shards=shards, seed=5)


# ---------------------------------------------------------------------------------------------------------------
# The three forms
# ---------------------------------------------------------------------------------------------------------------


def _as_list_of_bytes(payloads):
    return {"items": list(payloads)}


def _as_list_of_mixed_buffers(payloads):
    kinds = [bytes, bytearray, memoryview, lambda b: np.frombuffer(b, dtype=np.uint8).copy()]
    return {"items": [kinds[i % len(kinds)](p) for i, p in enumerate(payloads)]}


def _as_buffer_with_offsets(payloads):
    offsets = np.zeros(len(payloads) + 1, dtype=np.int64)
    np.cumsum([len(p) for p in payloads], out=offsets[1:])
    return {"items": b"".join(payloads), "offsets": offsets}


def _as_bytearray_with_list_offsets(payloads):
    offsets = [0]
    for p in payloads:
        offsets.append(offsets[-1] + len(p))
    return {"items": bytearray(b"".join(payloads)), "offsets": offsets}


VARIABLE_FORMS = {
    "list of bytes": _as_list_of_bytes,
    "list of bytes, bytearray, memoryview and numpy rows": _as_list_of_mixed_buffers,
    "one bytes buffer with numpy offsets": _as_buffer_with_offsets,
    "one bytearray with list offsets": _as_bytearray_with_list_offsets,
}


@pytest.mark.parametrize("form", VARIABLE_FORMS, ids=list(VARIABLE_FORMS))
@pytest.mark.parametrize("shards", [1, 4])
def test_variable_size_items_come_back_byte_exact_under_their_keys(form, shards):
    payloads = [tagged(i, extra=i % 23) for i in range(150)]  # > 64 items: spread over several shards
    store = uniform_store(shards)
    keys = store.insert(np.ones(len(payloads)), **VARIABLE_FORMS[form](payloads))
    assert every_item(store) == dict(zip(keys.tolist(), payloads))
    assert store.stats()["bytes_held"] == sum(map(len, payloads))
    store.check_invariants()


@pytest.mark.parametrize(
    "dtype, row_shape",
    [(np.uint8, (5,)), (np.float32, (3,)), (np.int64, (2, 2)), (np.uint8, (0,))],
    ids=["uint8 rows", "float32 rows", "int64 2x2 blocks", "zero-width rows"],
)
def test_a_numpy_array_is_one_item_per_row(dtype, row_shape):
    rng = np.random.default_rng(0)
    array = (rng.random((70,) + row_shape) * 100).astype(dtype)
    store = uniform_store()
    keys = store.insert(np.ones(len(array)), array)
    expected = {k: array[i].tobytes() for i, k in enumerate(keys.tolist())}
    assert every_item(store) == expected
    assert store.stats()["bytes_held"] == array.nbytes


def test_offsets_may_start_past_zero_and_leave_bytes_unused():
    buffer = b"HEADERabcdeFGtrailer"
    store = uniform_store(1)
    keys = store.insert([1.0, 1.0, 1.0], buffer, offsets=[6, 11, 11, 13])
    assert every_item(store) == dict(zip(keys.tolist(), [b"abcde", b"", b"FG"]))


def test_insert_copies_the_payloads_so_later_changes_to_the_source_do_not_leak_in():
    source = bytearray(b"original")
    array = np.zeros((2, 4), dtype=np.uint8)
    store = uniform_store(1)
    k1 = store.insert([1.0], [source])[0]
    k2, k3 = store.insert([1.0, 1.0], array).tolist()
    source[:] = b"CHANGED!"
    array[:] = 255
    assert every_item(store) == {int(k1): b"original", k2: bytes(4), k3: bytes(4)}


# ---------------------------------------------------------------------------------------------------------------
# Keys
# ---------------------------------------------------------------------------------------------------------------


def test_keys_are_uint64_nonzero_distinct_and_in_item_order():
    store = uniform_store(4)
    keys = np.concatenate(
        [store.insert(np.ones(n), [tagged(n * 1000 + i) for i in range(n)]) for n in (1, 64, 65, 200)]
    )
    assert keys.dtype == np.uint64
    assert len(keys) == 330
    assert 0 not in keys.tolist()
    assert len(set(keys.tolist())) == len(keys)
    # the i-th key of each call names the i-th item of that call
    items = every_item(store)
    for n, start in ((1, 0), (64, 1), (65, 65), (200, 130)):
        for i in range(n):
            assert items[int(keys[start + i])] == tagged(n * 1000 + i)


@pytest.mark.parametrize(
    "call",
    [
        lambda s: s.insert([], []),
        lambda s: s.insert(np.array([], dtype=np.float64), []),
        lambda s: s.insert([], b"", offsets=[0]),
        lambda s: s.insert([], np.zeros((0, 8), dtype=np.uint8)),
    ],
    ids=["empty lists", "empty float array", "empty buffer with one offset", "array with zero rows"],
)
def test_inserting_zero_items_returns_an_empty_key_array_and_changes_nothing(call):
    store = uniform_store()
    store.insert([1.0], [b"x"])
    before = store.stats()
    keys = call(store)
    assert isinstance(keys, np.ndarray) and keys.dtype == np.uint64 and keys.shape == (0,)
    assert store.stats() == before
    assert len(store) == 1


# ---------------------------------------------------------------------------------------------------------------
# Edge-sized items
# ---------------------------------------------------------------------------------------------------------------


def test_empty_items_are_stored_and_sampled_as_empty_bytes():
    store = uniform_store(2)
    keys = store.insert([1.0, 1.0, 1.0], [b"", b"x", b""])
    assert every_item(store) == dict(zip(keys.tolist(), [b"", b"x", b""]))
    assert store.stats()["bytes_held"] == 1
    only_empty = PrioritizedStore(max_size=NO_CEILING, capacity=10, alpha=0.6, shards=1)
    only_empty.insert([2.0], [b""])
    batch = only_empty.sample(3)
    assert [bytes(m) for m in batch.items] == [b"", b"", b""]
    assert batch.data.size == 0
    assert batch.offsets.tolist() == [0, 0, 0, 0]


def test_a_large_item_round_trips_byte_exact():
    big = np.random.default_rng(1).integers(0, 256, size=9 * 1024 * 1024 + 7, dtype=np.uint8).tobytes()
    store = PrioritizedStore(max_size=NO_CEILING, capacity=10, alpha=1.0, shards=2)
    store.insert([1.0, 0.0], [big, b"small"])  # the zero-priority item is never sampled
    batch = store.sample(2)
    assert bytes(batch.items[0]) == big and bytes(batch.items[1]) == big
    assert store.stats()["bytes_held"] == len(big) + 5


SIZES_AROUND_BOUNDARIES = [
    0,
    1,
    7,
    8,
    9,
    15,
    16,
    17,
    31,
    32,
    33,
    1023,
    1024,
    1025,
    1151,
    1152,
    1153,
    2047,
    2048,
    2049,
    4095,
    4096,
    4097,
    65535,
    65536,
    65537,
    2**20 - 1,
    2**20,
    2**20 + 1,
]


@pytest.mark.parametrize("shards", [1, 2])
def test_items_of_every_size_class_survive_churn_byte_exact(shards):
    """Item memory is recycled inside a shard: erased items' blocks go to later inserts of other sizes. Every
    live item must keep its exact bytes throughout."""
    rng = np.random.default_rng(21)

    def make(size: int) -> bytes:
        return rng.integers(0, 256, size=size, dtype=np.uint8).tobytes()

    store = uniform_store(shards)
    live: dict[int, bytes] = {}
    for round_ in range(4):
        sizes = SIZES_AROUND_BOUNDARIES[round_ % 2 :: 1 + round_ % 2] + [int(x) for x in rng.integers(0, 3000, 40)]
        payloads = [make(n) for n in sizes]
        keys = store.insert(np.ones(len(payloads)), payloads).tolist()
        live.update(zip(keys, payloads))
        victims = [k for i, k in enumerate(sorted(live)) if i % 3 == round_ % 3]
        assert store.erase(victims) == len(victims)
        for k in victims:
            del live[k]
        assert every_item(store) == live
        assert store.stats()["bytes_held"] == sum(map(len, live.values()))
        store.check_invariants()


def _resident_mib() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs Linux /proc")
@pytest.mark.parametrize("how", ["store dropped", "items erased", "items evicted"])
def test_the_memory_of_large_items_is_returned_when_they_or_their_store_go_away(how):
    big = np.ones(40 * 2**20, dtype=np.uint8)  # above every size class (and glibc's mmap threshold)
    small = [b"s" * 100] * 100
    start = _resident_mib()
    for _ in range(12):  # 480 MiB in all if nothing came back
        store = PrioritizedStore(max_size=NO_CEILING, capacity=1, shards=2)
        keys = store.insert([1.0], [big])
        store.insert(np.ones(100), small)
        if how == "items erased":
            assert store.erase(keys) == 1
        elif how == "items evicted":
            assert store.remove_to_fit() == 100
        del store
        gc.collect()
    growth = _resident_mib() - start
    assert growth < 160, f"resident memory grew by {growth:.0f} MiB"


# ---------------------------------------------------------------------------------------------------------------
# The batch object
# ---------------------------------------------------------------------------------------------------------------


def test_a_batch_exposes_typed_arrays_whose_offsets_frame_the_data():
    payloads = [tagged(i, extra=i) for i in range(40)]
    store = PrioritizedStore(max_size=NO_CEILING, capacity=100, alpha=0.6, shards=3, seed=2)
    keys = store.insert(np.linspace(0.5, 3.0, 40), payloads)
    by_key = dict(zip(keys.tolist(), payloads))
    batch = store.sample(33, beta=0.4)
    assert len(batch) == 33
    assert batch.keys.dtype == np.uint64 and batch.keys.shape == (33,)
    assert batch.weights.dtype == np.float32 and batch.weights.shape == (33,)
    assert batch.probabilities.dtype == np.float64 and batch.probabilities.shape == (33,)
    assert batch.data.dtype == np.uint8
    assert batch.offsets.dtype == np.uint64 and batch.offsets.shape == (34,)
    assert batch.offsets[0] == 0 and batch.offsets[-1] == batch.data.size
    assert np.all(np.diff(batch.offsets.astype(np.int64)) >= 0)
    assert len(batch.items) == 33
    for i, key in enumerate(batch.keys.tolist()):
        lo, hi = int(batch.offsets[i]), int(batch.offsets[i + 1])
        assert batch.data[lo:hi].tobytes() == by_key[key]
        assert bytes(batch.items[i]) == by_key[key]


def test_item_memoryviews_stay_valid_after_the_batch_and_the_store_are_gone():
    payloads = [tagged(i, extra=3000) for i in range(20)]
    store = PrioritizedStore(max_size=NO_CEILING, capacity=100, alpha=1.0, shards=2)
    keys = store.insert(np.arange(1, 21, dtype=np.float64), payloads)
    by_key = dict(zip(keys.tolist(), payloads))
    batch = store.sample(50)
    items = batch.items
    sampled_keys = batch.keys.tolist()
    data = batch.data
    del batch, store
    gc.collect()
    # churn the allocator so freed memory would be overwritten
    junk = [bytes([i % 256]) * 4096 for i in range(2000)]
    assert len(junk) == 2000
    assert [bytes(m) for m in items] == [by_key[k] for k in sampled_keys]
    assert data.tobytes() == b"".join(by_key[k] for k in sampled_keys)


def test_batch_items_are_read_only_memoryviews():
    store = PrioritizedStore(max_size=NO_CEILING, capacity=10, alpha=1.0, shards=1)
    store.insert([1.0], [b"abc"])
    batch = store.sample(2)
    for m in batch.items:
        assert isinstance(m, memoryview)
        assert m.readonly, "SampleBatch.items is documented as 'list of read-only memoryviews'"


def test_writing_into_a_batch_never_changes_the_stored_item():
    store = PrioritizedStore(max_size=NO_CEILING, capacity=10, alpha=1.0, shards=1)
    store.insert([1.0], [b"abc"])
    batch = store.sample(2)
    if batch.data.flags.writeable:
        batch.data[:] = 0
    assert bytes(store.sample(1).items[0]) == b"abc"


def test_a_batch_keeps_its_bytes_after_the_items_are_erased_or_evicted():
    store = PrioritizedStore(max_size=NO_CEILING, capacity=1, alpha=1.0, shards=2)
    keys = store.insert([1.0, 1.0], [b"first", b"second"])
    batch = store.sample(4)
    expected = [bytes(m) for m in batch.items]
    store.erase(keys[:1])
    store.insert([1.0, 1.0], [b"third!", b"fourth"])
    assert store.remove_to_fit() == 2
    assert [bytes(m) for m in batch.items] == expected
    assert set(expected) <= {b"first", b"second"}


# ---------------------------------------------------------------------------------------------------------------
# Malformed item forms are refused (the exhaustive table lives in test_store_errors.py)
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "items, offsets, match",
    [
        (b"abcdef", [0, 2], r"offsets must hold len\(priorities\) \+ 1 = 4 entries, got 2"),
        (b"abcdef", [0, 2, 4, 6, 6], r"offsets must hold len\(priorities\) \+ 1 = 4 entries, got 5"),
        (b"abcdef", [0, 4, 2, 6], r"offsets must not decrease: offsets\[2\] = 2 < offsets\[1\] = 4"),
        (b"abcdef", [0, 2, 4, 7], r"offsets\[-1\] = 7 is past the end of the 6-byte buffer"),
        (b"abcdef", [0, -1, 4, 6], r"offsets\[1\] is negative: -1"),
        (b"abcdef", [0.0, 2.0, 4.0, 6.0], r"offsets has dtype float64"),
        ("abcdef", [0, 2, 4, 6], r"must be a C-contiguous bytes-like object, got str"),
        (np.zeros((6, 2), dtype=np.uint8)[:, 0], [0, 2, 4, 6], r"C-contiguous"),
    ],
    ids=["too few", "too many", "decreasing", "past the end", "negative", "float", "str buffer", "strided buffer"],
)
def test_bad_offsets_are_refused_and_nothing_is_inserted(items, offsets, match):
    store = uniform_store()
    store.insert([1.0], [b"kept"])
    before = store.stats()
    with pytest.raises(ValueError, match=match):
        store.insert([1.0, 1.0, 1.0], items, offsets=offsets)
    assert store.stats() == before


def test_item_sizes_in_a_batch_sum_to_bytes_held_across_removals():
    store = uniform_store(3)
    keys = store.insert(np.ones(100), [b"x" * i for i in range(100)])
    assert store.stats()["bytes_held"] == sum(range(100))
    store.erase(keys[:10])
    assert store.stats()["bytes_held"] == sum(range(10, 100))
    assert math.isclose(store.total_priority, 90.0)
