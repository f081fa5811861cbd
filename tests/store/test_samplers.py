"""The samplers beside prioritized (uniform, fifo, lifo, max_heap, min_heap) and max_times_sampled, held to a plain
Python reference model: an ordered sampler returns exactly the model's first min(n, size) distinct items in its
store-wide order, through random batches (split over shards), priority updates, erases, remove_to_fit with every
remover, samples that remove items and snapshot round trips; a with-replacement sampler never returns an item
beyond its allowance and removes it right after its last draw; uniform draws are equally likely store-wide
(chi-square, fixed seeds); a queue (fifo, max_times_sampled 1) fed and drained by threads hands out every item
exactly once."""

from __future__ import annotations

import struct
import threading

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apexrl import PrioritizedStore
from tests.store.test_eviction import NO_CEILING, chi2_sf, live
from tests.store.test_store_chunks import crc32c

ORDERED_SAMPLERS = ("fifo", "lifo", "max_heap", "min_heap")
SAMPLERS = ("prioritized", "uniform", *ORDERED_SAMPLERS)
REMOVERS = ("fifo", "lifo", "min_heap", "max_heap", "prioritized", "uniform")

# an ordered sampler or remover -> the rank it takes first (smallest first): by insertion number i or priority p
RANK = {
    "fifo": lambda i, p: i,
    "lifo": lambda i, p: -i,
    "min_heap": lambda i, p: p,
    "max_heap": lambda i, p: -p,
}


class Model:
    """What the store holds: key -> [insertion number, priority, times sampled, payload]."""

    def __init__(self, sampler: str, eviction: str, capacity: int, max_times: int) -> None:
        self.sampler, self.eviction, self.capacity, self.max_times = sampler, eviction, capacity, max_times
        self.items: dict[int, list] = {}
        self.n = 0
        self.used: set[float] = set()  # priorities ever given: kept distinct (a heap's order among ties is open)

    def priority(self, rng: np.random.Generator) -> float:
        while True:
            p = float(rng.integers(1, 10**9)) / 8.0
            if p not in self.used:
                self.used.add(p)
                return p

    def order(self, rank_of: str) -> list[int]:
        rank = RANK[rank_of]
        return sorted(self.items, key=lambda k: rank(self.items[k][0], self.items[k][1]))

    def drawn(self, keys: list[int]) -> None:
        """Counts one draw of each key (in batch order); drops the items that reached their allowance."""
        for k in keys:
            item = self.items[k]
            item[2] += 1
            assert self.max_times == 0 or item[2] <= self.max_times, "an item was returned beyond its allowance"
            if self.max_times and item[2] == self.max_times:
                del self.items[k]


def check_store(store: PrioritizedStore, model: Model, everything: list[tuple[int, float]]) -> None:
    """The store holds exactly the model's items (probing every key ever issued, a live one with its own
    priority, so the probe changes no order)."""
    keys = list(dict.fromkeys(k for k, _ in everything))
    alive = live(store, keys, [model.items[k][1] if k in model.items else 1.0 for k in keys])
    assert {k for k, a in zip(keys, alive) if a} == set(model.items)
    assert len(store) == len(model.items)
    store.check_invariants()


operations = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.integers(1, 40)),
        st.tuples(st.just("sample"), st.integers(1, 30)),
        st.tuples(st.just("update"), st.integers(1, 10)),
        st.tuples(st.just("erase"), st.integers(1, 6)),
        st.tuples(st.just("remove_to_fit"), st.just(0)),
        st.tuples(st.just("snapshot"), st.just(0)),
    ),
    min_size=1,
    max_size=14,
)


def run(store, model, op, arg, rng, tmp_path, everything, batch_check):
    """Applies one operation to store and model; returns the store (a snapshot round trip replaces it)."""
    if op == "insert":
        prios = [model.priority(rng) for _ in range(arg)]
        payloads = [b"%d" % (model.n + j) for j in range(arg)]
        for j, (k, p) in enumerate(zip(store.insert(prios, payloads).tolist(), prios)):
            model.items[k] = [model.n + j, p, 0, payloads[j]]
            everything.append((k, p))
        model.n += arg
    elif op == "sample":
        if not model.items:
            with pytest.raises(ValueError, match="empty store"):
                store.sample(arg)
            return store
        batch = store.sample(arg)
        keys = batch.keys.tolist()
        for k, item in zip(keys, batch.items):
            assert k in model.items and bytes(item) == model.items[k][3], "a key returned a foreign item"
        batch_check(batch, arg)
        model.drawn(keys)
    elif op == "update" and model.items:
        for k in rng.choice(list(model.items), size=min(arg, len(model.items)), replace=False).tolist():
            p = model.priority(rng)
            assert store.update_priorities([k], [p]) == 1
            model.items[k][1] = p
            everything.append((k, p))
    elif op == "erase" and model.items:
        for k in rng.choice(list(model.items), size=min(arg, len(model.items)), replace=False).tolist():
            assert store.erase([k]) == 1
            del model.items[k]
    elif op == "remove_to_fit":
        excess = max(0, len(model.items) - model.capacity)
        assert store.remove_to_fit() == excess
        if model.eviction in RANK:
            for k in model.order(model.eviction)[:excess]:
                del model.items[k]
        else:  # a drawn remover: which ones is random (test_removers.py checks how); the model follows
            keys = list(model.items)
            for k, a in zip(keys, live(store, keys, [model.items[k][1] for k in keys])):
                if not a:
                    del model.items[k]
            assert len(model.items) == len(keys) - excess
    elif op == "snapshot":
        path = tmp_path / "round.snap"
        before = store.stats()
        store.save(path)
        store = PrioritizedStore.load(path)
        after = store.stats()
        assert (store.sampler, store.max_times_sampled) == (model.sampler, model.max_times)
        for name in ("size", "inserted", "sampled", "removed_by_sampling", "erased", "evicted"):
            assert after[name] == before[name], name
    check_store(store, model, everything)
    return store


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    sampler=st.sampled_from(ORDERED_SAMPLERS),
    eviction=st.sampled_from(REMOVERS),
    shards=st.sampled_from([1, 3, 8]),
    capacity=st.integers(1, 60),
    max_times=st.sampled_from([0, 1, 2, 3]),
    ops=operations,
    seed=st.integers(0, 2**16),
)
def test_an_ordered_sampler_returns_exactly_the_models_first_items(
    tmp_path, sampler, eviction, shards, capacity, max_times, ops, seed
):
    rng = np.random.default_rng(seed)
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=capacity, shards=shards, eviction=eviction, sampler=sampler,
        max_times_sampled=max_times, seed=seed,
    )  # fmt: skip
    model = Model(sampler, eviction, capacity, max_times)
    everything: list[tuple[int, float]] = []

    def batch_check(batch, n):
        expected = model.order(sampler)[:n]  # before the model counts the draws
        assert batch.keys.tolist() == expected
        assert len(batch) == min(n, len(model.items))
        assert batch.size == len(model.items)
        assert np.all(batch.weights == 1.0) and np.all(batch.probabilities == 1.0)
        assert batch.total_mass == 0.0 and batch.min_mass == 0.0

    for op, arg in [("insert", 10), *ops]:
        store = run(store, model, op, arg, rng, tmp_path, everything, batch_check)
    assert store.stats()["removed_by_sampling"] + store.stats()["evicted"] + store.stats()["erased"] == model.n - len(
        model.items
    )


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture]
)
@given(
    sampler=st.sampled_from(["prioritized", "uniform"]),
    eviction=st.sampled_from(REMOVERS),
    shards=st.sampled_from([1, 4]),
    capacity=st.integers(5, 60),
    max_times=st.sampled_from([0, 1, 2, 3]),
    ops=operations,
    seed=st.integers(0, 2**16),
)
def test_a_with_replacement_sampler_never_exceeds_max_times_sampled(
    tmp_path, sampler, eviction, shards, capacity, max_times, ops, seed
):
    rng = np.random.default_rng(seed)
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=capacity, shards=shards, eviction=eviction, sampler=sampler,
        max_times_sampled=max_times, seed=seed,
    )  # fmt: skip
    model = Model(sampler, eviction, capacity, max_times)
    everything: list[tuple[int, float]] = []

    def batch_check(batch, n):
        keys = batch.keys.tolist()
        if max_times == 0:
            assert len(keys) == n  # no limit: always n draws with replacement
        else:
            assert 1 <= len(keys) <= n
            counts: dict[int, int] = {}
            for k in keys:
                counts[k] = counts.get(k, 0) + 1
            for k, c in counts.items():  # never past the allowance, within the batch either
                assert model.items[k][2] + c <= max_times
        assert batch.size == len(model.items)
        if sampler == "uniform":
            assert np.all(batch.weights == 1.0)
            np.testing.assert_allclose(batch.probabilities, 1.0 / len(model.items))
            assert batch.total_mass == 0.0
        else:
            masses = np.array([model.items[k][1] for k in keys]) ** 0.6
            np.testing.assert_allclose(batch.probabilities * batch.total_mass, masses, rtol=1e-9)
            assert np.all((batch.weights > 0) & (batch.weights <= 1))

    for op, arg in [("insert", 10), *ops]:
        store = run(store, model, op, arg, rng, tmp_path, everything, batch_check)


@pytest.mark.parametrize("shards", [1, 5])
def test_uniform_draws_are_equally_likely_across_the_store(shards):
    # 30 items over uneven shards (batches of 7), priorities spanning 6 decades and some zeros: uniform ignores
    # them. 60,000 draws, chi-square with 29 degrees of freedom.
    store = PrioritizedStore(capacity=100, shards=shards, sampler="uniform", seed=11)
    prios = [0.0 if i % 6 == 0 else 10.0 ** (i % 7 - 3) for i in range(30)]
    keys = []
    for b in range(0, 30, 7):
        keys.extend(store.insert(prios[b : b + 7], [b"%d" % i for i in range(b, min(b + 7, 30))]).tolist())
    index = {k: i for i, k in enumerate(keys)}
    counts = np.zeros(30)
    for _ in range(300):
        batch = store.sample(200)
        assert len(batch) == 200
        np.add.at(counts, [index[k] for k in batch.keys.tolist()], 1)
    expected = counts.sum() / 30
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    assert chi2_sf(chi2, 29) > 1e-3, counts


def test_the_uniform_sampler_reports_weights_one_probabilities_one_over_n_and_keeps_no_tree():
    store = PrioritizedStore(capacity=100, shards=3, sampler="uniform")
    store.insert([1.0, 2.0, 1000.0, 0.0], [b"a", b"b", b"c", b"d"])
    batch = store.sample(50, beta=0.9)
    assert len(batch) == 50 and np.all(batch.weights == 1.0)
    np.testing.assert_array_equal(batch.probabilities, np.full(50, 0.25))
    assert (batch.total_mass, batch.min_mass, batch.size) == (0.0, 0.0, 4)
    assert store.total_priority == 0.0 and store.stats()["total_priority"] == 0.0  # no sum tree


@pytest.mark.parametrize("sampler", ORDERED_SAMPLERS)
def test_an_ordered_sample_of_more_than_the_store_holds_returns_each_item_once(sampler):
    store = PrioritizedStore(capacity=100, shards=4, sampler=sampler)
    keys = store.insert([3.0, 1.0, 2.0], [b"x", b"y", b"z"]).tolist()
    batch = store.sample(10)
    order = {"fifo": [0, 1, 2], "lifo": [2, 1, 0], "max_heap": [0, 2, 1], "min_heap": [1, 2, 0]}[sampler]
    assert batch.keys.tolist() == [keys[i] for i in order]
    assert [bytes(b) for b in batch.items] == [[b"x", b"y", b"z"][i] for i in order]
    assert len(store) == 3  # sampling does not remove


def test_a_queue_hands_out_items_in_order_and_frees_them():
    store = PrioritizedStore(capacity=1000, shards=4, sampler="fifo", max_times_sampled=1)
    for b in range(10):
        store.insert(np.ones(7), [b"%d" % (7 * b + i) for i in range(7)])
    got = []
    while len(store):
        got.extend(bytes(x) for x in store.sample(9).items)
    assert got == [b"%d" % i for i in range(70)]
    stats = store.stats()
    assert (stats["removed_by_sampling"], stats["size"], stats["bytes_held"], stats["sampled"]) == (70, 0, 0, 70)
    with pytest.raises(ValueError, match="empty store"):
        store.sample(1)


def test_sampler_arguments_are_checked():
    with pytest.raises(ValueError, match="'prioritized', 'uniform', 'fifo', 'lifo', 'max_heap' or 'min_heap'"):
        PrioritizedStore(sampler="queue")
    with pytest.raises(ValueError, match="max_times_sampled"):
        PrioritizedStore(max_times_sampled=-1)
    store = PrioritizedStore()
    assert (store.sampler, store.max_times_sampled, store.stats()["removed_by_sampling"]) == ("prioritized", 0, 0)
    assert "sampler" not in repr(store)
    assert "sampler='lifo', max_times_sampled=2" in repr(PrioritizedStore(sampler="lifo", max_times_sampled=2))


def as_format3(data: bytes) -> bytes:
    """A format-5 snapshot of a store without a limit (every times_sampled 0) and without chunks rewritten as
    format 3: no sampler and max_times_sampled in the header, no times_sampled per item, six counters per shard
    (format 5 differs from 4 only in its chunks' tags)."""
    head = struct.calcsize("<8sIIQQdIIdQ")
    version, shards = struct.unpack_from("<I", data, 8)[0], struct.unpack_from("<I", data, 8 + 4 + 4 + 8 + 8 + 8)[0]
    assert version == 5 and struct.unpack_from("<II", data, head) == (0, 0)
    out = bytearray(data[:8] + struct.pack("<I", 3) + data[12:head])
    pos = head + 8
    for _ in range(shards):
        _, num_slots = struct.unpack_from("<IQ", data, pos)
        end = pos + 12 + 4 * num_slots
        (num_chunks,) = struct.unpack_from("<Q", data, end)
        assert num_chunks == 0
        end += 8
        (num_live,) = struct.unpack_from("<Q", data, end)
        end += 8
        out += data[pos:end]
        pos = end
        for _ in range(num_live):
            _, _, _, size, k, times = struct.unpack_from("<IQdIII", data, pos)
            assert times == 0
            out += data[pos : pos + 28]  # slot, seq, priority, size, num_chunks
            pos += 32
            out += data[pos : pos + 4 * k + size]
            pos += 4 * k + size
        counters = struct.unpack_from("<8Q", data, pos)  # 7 counters, max_seq
        assert counters[6] == 0
        out += struct.pack("<7Q", *counters[:6], counters[7])
        pos += 64
    out += data[pos:-4]
    return bytes(out) + struct.pack("<I", crc32c(bytes(out)))


def test_a_format3_snapshot_loads_as_a_prioritized_store_without_a_limit(tmp_path):
    store = PrioritizedStore(capacity=100, shards=3, eviction="lifo")
    keys = store.insert([1.0, 2.0, 3.0, 4.0], [b"a", b"bb", b"", b"dddd"]).tolist()
    store.sample(5)
    store.save(tmp_path / "v4.snap")
    (tmp_path / "v3.snap").write_bytes(as_format3((tmp_path / "v4.snap").read_bytes()))
    old = PrioritizedStore.load(tmp_path / "v3.snap")
    old.check_invariants()
    assert (old.sampler, old.max_times_sampled, old.eviction, len(old)) == ("prioritized", 0, "lifo", 4)
    assert old.stats()["sampled"] == 5 and old.stats()["removed_by_sampling"] == 0
    assert old.update_priorities(keys, [1.0] * 4) == 4
    assert len(old.sample(20)) == 20


@pytest.mark.parametrize("sampler", SAMPLERS)
def test_counts_survive_a_snapshot_so_the_allowance_holds_across_a_restart(tmp_path, sampler):
    store = PrioritizedStore(capacity=100, shards=2, sampler=sampler, max_times_sampled=2, seed=3)
    store.insert(np.arange(1.0, 9.0), [b"%d" % i for i in range(8)])
    times: dict[bytes, int] = {}
    for item in store.sample(5).items:
        times[bytes(item)] = times.get(bytes(item), 0) + 1
    store.save(tmp_path / "s.snap")
    store = PrioritizedStore.load(tmp_path / "s.snap")
    assert (store.sampler, store.max_times_sampled) == (sampler, 2)
    while len(store):
        for item in store.sample(3).items:
            times[bytes(item)] = times.get(bytes(item), 0) + 1
    assert times == {b"%d" % i: 2 for i in range(8)}


@pytest.mark.parametrize("sampler", ["fifo", "uniform"])
def test_a_queue_fed_and_drained_by_threads_hands_out_every_item_exactly_once(sampler):
    store = PrioritizedStore(capacity=10**6, shards=4, sampler=sampler, max_times_sampled=1, seed=9)
    per_thread, inserters_left = 3000, [2]
    lock = threading.Lock()
    got: list[list[int]] = [[], [], []]
    errors: list[BaseException] = []

    def insert(t: int) -> None:
        try:
            for b in range(0, per_thread, 10):
                store.insert(np.ones(10), [b"%d" % (t * 10**6 + b + i) for i in range(10)])
        except BaseException as e:  # noqa: BLE001 - reported on the main thread
            errors.append(e)
        finally:
            with lock:
                inserters_left[0] -= 1

    def drain(i: int) -> None:
        try:
            while True:
                with lock:
                    done = inserters_left[0] == 0
                if done and len(store) == 0:
                    return
                try:
                    batch = store.sample(16)
                except ValueError:  # empty for now
                    continue
                got[i].extend(int(bytes(x)) for x in batch.items)
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    threads = [threading.Thread(target=insert, args=(t,)) for t in range(2)]
    threads += [threading.Thread(target=drain, args=(i,)) for i in range(3)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(timeout=120)
    assert not any(th.is_alive() for th in threads)
    assert not errors, errors
    all_items = sorted(x for g in got for x in g)
    assert all_items == sorted(t * 10**6 + i for t in range(2) for i in range(per_thread))
    assert store.stats()["removed_by_sampling"] == 2 * per_thread
    store.check_invariants()
