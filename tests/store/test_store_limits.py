"""Bounds of the store: the mass limit (no total can overflow), per-call batch limits, refused object arrays,
the max_size hard ceiling, and snapshot saves that fail cleanly."""

from __future__ import annotations

import math
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from apexrl import PrioritizedStore, ReplayClient, SnapshotError
from apexrl.errors import ServerError
from apexrl.replay.wire import protocol as P

# ------------------------------------------------------------------------------------------- mass limit


def test_two_huge_priorities_with_alpha_1_are_refused_and_change_nothing():
    store = PrioritizedStore(capacity=100, alpha=1.0, shards=2)
    keys = store.insert([1.0, 2.0], [b"a", b"b"])
    with pytest.raises(ValueError, match=r"1e\+308.*MAX_MASS = 1e\+250"):
        store.insert([1e308, 1e308], [b"x", b"y"])
    with pytest.raises(ValueError, match=r"1e\+251"):
        store.update_priorities(keys, [1.0, 1e251])
    assert len(store) == 2 and store.total_priority == 3.0
    stats = store.stats()
    assert stats["inserted"] == 2 and stats["updated"] == 0
    assert PrioritizedStore.MAX_MASS == 1e250


def mass(priority: float, alpha: float) -> float:
    """priority^alpha as the store computes it (C pow), inf where it overflows."""
    if alpha == 0.0:
        return 1.0
    try:
        return priority**alpha
    except OverflowError:
        return math.inf


@pytest.mark.parametrize("alpha", [0.0, 0.3, 1.0, 1.7, 4.0])
def test_probabilities_are_finite_and_sum_to_one_and_weights_lie_in_0_1_for_any_accepted_priorities(alpha):
    rng = np.random.default_rng(int(alpha * 10) + 1)
    store = PrioritizedStore(capacity=10_000, alpha=alpha, shards=3, seed=4)
    # The largest accepted priority: its mass is MAX_MASS (or it is the largest finite double, for small alpha).
    limit = 1e308 if alpha <= 250 / 308 else PrioritizedStore.MAX_MASS ** (1.0 / alpha)
    accepted: dict[int, float] = {}
    for _ in range(30):
        # Priorities spread over the whole double range, the largest accepted ones included.
        exponents = rng.uniform(-320, 308, size=20)
        priorities = np.concatenate([10.0**exponents, [0.0, limit, np.nextafter(limit, 0.0)]])
        masses = [mass(p, alpha) for p in priorities.tolist()]
        ok = np.array([m <= PrioritizedStore.MAX_MASS for m in masses])
        if not ok.all():
            with pytest.raises(ValueError, match="MAX_MASS"):
                store.insert(priorities, [b"x"] * len(priorities))
        keys = store.insert(priorities[ok], [b"x"] * int(ok.sum()))
        accepted.update(zip(keys.tolist(), priorities[ok].tolist()))
    total = store.total_priority
    assert math.isfinite(total) and total > 0
    masses = {k: mass(p, alpha) for k, p in accepted.items()}
    expected_total = math.fsum(masses.values())
    assert total == pytest.approx(expected_total, rel=1e-9)
    assert math.fsum(m / total for m in masses.values()) == pytest.approx(1.0, rel=1e-9)
    for beta in (0.0, 0.4, 1.0):
        batch = store.sample(512, beta)
        assert np.isfinite(batch.probabilities).all()
        assert ((batch.probabilities > 0) & (batch.probabilities <= 1)).all()
        for key, p in zip(batch.keys.tolist(), batch.probabilities.tolist()):
            assert p == pytest.approx(masses[key] / expected_total, rel=1e-9)
        weights = batch.weights
        assert np.isfinite(weights).all() and (weights > 0).all() and (weights <= 1).all()
    store.check_invariants()


def test_server_refuses_two_1e308_priorities_with_alpha_1_and_keeps_serving(start_server):
    server = start_server("--alpha", "1")
    with ReplayClient(server.endpoint, timeout=10) as client:
        client.insert([1.0], [b"ok"])
        with pytest.raises(ServerError, match="MAX_MASS") as info:
            client.insert([1e308, 1e308], [b"x", b"y"])
        assert info.value.status == P.Status.INVALID_ARGUMENT
        stats = client.stats()
        assert stats["size"] == 1 and stats["total_priority"] == 1.0
        batch = client.sample(8)
        assert (batch.probabilities == 1.0).all()
        assert len(client.insert([2.0], [b"more"])) == 1
    assert server.terminate() == 0


# ------------------------------------------------------------------------------------------- batch limits


def test_sampling_more_than_the_per_call_limit_names_the_value_and_the_limit():
    store = PrioritizedStore(capacity=10)
    store.insert([1.0], [b"a"])
    with pytest.raises(ValueError, match=f"{2**62}.*{PrioritizedStore.MAX_BATCH_ITEMS}"):
        store.sample(2**62)
    with pytest.raises(ValueError, match=str(PrioritizedStore.MAX_BATCH_ITEMS + 1)):
        store.sample(PrioritizedStore.MAX_BATCH_ITEMS + 1)
    assert len(store.sample(PrioritizedStore.MAX_BATCH_ITEMS // 1024)) == PrioritizedStore.MAX_BATCH_ITEMS // 1024


def test_inserting_more_than_the_per_call_limit_names_the_value_and_the_limit():
    store = PrioritizedStore(capacity=10)
    n = PrioritizedStore.MAX_BATCH_ITEMS + 1
    with pytest.raises(ValueError, match=f"{n}.*{PrioritizedStore.MAX_BATCH_ITEMS}"):
        store.insert(np.ones(n), np.zeros(n + 1, dtype=np.uint8), offsets=np.arange(n + 1, dtype=np.uint64) * 0)
    assert len(store) == 0


# ---------------------------------------------------------------------------------------- non-numeric input


def test_object_arrays_are_refused_as_items_and_store_nothing():
    store = PrioritizedStore(capacity=10)
    objects = np.array([[b"abc", b"def"], [b"ghi", b"jkl"]], dtype=object)
    with pytest.raises(ValueError, match="Python objects"):
        store.insert([1.0, 1.0], objects)
    with pytest.raises(ValueError, match=r"items\[1\] holds Python objects"):
        store.insert([1.0, 1.0], [b"fine", np.array([object(), object()], dtype=object)])
    structured = np.zeros((2, 1), dtype=[("a", np.int32), ("b", object)])
    with pytest.raises(ValueError, match="Python objects"):
        store.insert([1.0, 1.0], structured)
    with pytest.raises(ValueError, match="Python objects"):
        store.insert([1.0], np.zeros(8, dtype=object), offsets=[0, 8])
    assert len(store) == 0 and store.stats()["inserted"] == 0
    # Plain numeric and byte-string arrays still go in.
    store.insert([1.0, 1.0], np.arange(8, dtype=np.float32).reshape(2, 4))
    store.insert([1.0], np.array([[b"ab"]], dtype="S2"))
    assert len(store) == 3


@pytest.mark.parametrize("argument", ["priorities", "keys", "offsets"])
def test_object_and_other_non_numeric_arrays_are_refused_as_numbers(argument):
    store = PrioritizedStore(capacity=10)
    keys = store.insert([1.0, 2.0], [b"a", b"b"])
    for bad in (np.array([1.0, 2.0], dtype=object), np.array(["1", "2"]), np.array([True, False])):
        with pytest.raises(ValueError, match=argument):
            if argument == "priorities":
                store.update_priorities(keys, bad)
            elif argument == "keys":
                store.update_priorities(bad, [1.0, 1.0])
            else:
                store.insert([1.0], b"xy", offsets=bad)
    assert len(store) == 2 and store.total_priority == pytest.approx(1.0 + 2.0**0.6)


# --------------------------------------------------------------------------------------------- max_size


@pytest.mark.parametrize("eviction", ["fifo", "lowest_priority"])
def test_fifty_times_capacity_without_remove_to_fit_stays_under_max_size_and_evicts_by_policy(eviction):
    capacity, max_size = 100, 180
    store = PrioritizedStore(capacity=capacity, alpha=1.0, shards=4, eviction=eviction, max_size=max_size)
    assert store.max_size == max_size and store.stats()["max_size"] == max_size
    assert PrioritizedStore(capacity=capacity).max_size == 2 * capacity
    inserted: list[tuple[int, float]] = []
    rng = np.random.default_rng(3)

    def is_live(key: int, priority: float) -> bool:
        return store.update_priorities([key], [priority]) == 1

    before: list[tuple[int, float]] = []
    for batch in range(50):
        if batch == 49:  # what the last insert's eviction round chooses from
            before = [(k, p) for k, p in inserted if is_live(k, p)]
        priorities = rng.uniform(0.1, 10.0, size=capacity)
        keys = store.insert(priorities, [b"%d" % batch] * capacity)
        inserted.extend(zip(keys.tolist(), priorities.tolist()))
        assert len(store) <= max_size
    stats = store.stats()
    assert stats["remove_to_fit_calls"] > 0 and stats["evicted"] == len(inserted) - len(store)
    live = [(k, p) for k, p in inserted if is_live(k, p)]
    assert len(live) == len(store) == capacity
    if eviction == "fifo":  # the newest items are the ones left
        assert [k for k, _ in live] == [k for k, _ in inserted[-capacity:]]
    else:  # the last round evicted the lowest priorities of what it saw
        candidates = before + inserted[-capacity:]
        evicted = [p for k, p in candidates if k not in {k for k, _ in live}]
        assert evicted and max(evicted) <= min(p for _, p in live)
    store.check_invariants()


def test_max_size_below_capacity_is_refused():
    with pytest.raises(ValueError, match="max_size must be >= capacity"):
        PrioritizedStore(capacity=10, max_size=9)


# ---------------------------------------------------------------------------------------- failed saves


def test_a_save_that_hits_the_file_size_limit_keeps_the_previous_snapshot_and_leaves_no_temporary(tmp_path):
    # RLIMIT_FSIZE in a child process makes writes past 64 KiB fail with EFBIG, as a full disk fails them.
    script = textwrap.dedent(
        f"""
        import os, resource, signal
        from apexrl import PrioritizedStore, SnapshotError
        path = {str(tmp_path / "s.apx")!r}
        store = PrioritizedStore(capacity=1000, shards=2)
        store.insert([1.0] * 10, [b"small"] * 10)
        store.save(path)
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        store.insert([1.0] * 100, [b"x" * 4096] * 100)
        try:
            store.save(path)
        except SnapshotError as e:
            print("SnapshotError:", e)
        store.check_invariants()
        """
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr[-2000:]
    assert "SnapshotError:" in child.stdout and "File too large" in child.stdout, child.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.apx"]
    restored = PrioritizedStore.load(tmp_path / "s.apx")
    assert len(restored) == 10


def test_a_save_into_a_missing_directory_is_a_snapshot_error_with_the_reason(tmp_path):
    store = PrioritizedStore(capacity=10)
    store.insert([1.0], [b"a"])
    with pytest.raises(SnapshotError, match="No such file or directory"):
        store.save(tmp_path / "missing" / "s.apx")


def test_the_server_enforces_max_size_without_remove_to_fit(start_server):
    server = start_server("--capacity", "10", "--max-size", "15")
    with ReplayClient(server.endpoint, timeout=10) as client:
        for i in range(20):
            client.insert(np.ones(5), [b"%d" % i] * 5)
            assert client.stats()["size"] <= 15
        stats = client.stats()
        assert stats["max_size"] == 15 and stats["evicted"] == 100 - stats["size"]
    assert server.terminate() == 0


@pytest.mark.parametrize(
    "flags, reason",
    [
        (["--capacity", "10", "--max-size", "9"], "table 'default': max_size: must be >= capacity = 10, got 9"),
        (["--capacity", "200000000", "--shards", "1"], "a shard holds at most 268435455"),
    ],
)
def test_store_sizes_the_store_would_refuse_exit_2(flags, reason):
    out = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--port", "0", *flags], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and reason in out.stderr, out.stderr
