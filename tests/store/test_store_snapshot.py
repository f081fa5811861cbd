"""save()/load(): a versioned, checksummed snapshot that restores the store exactly, or refuses to load."""

from __future__ import annotations

import math
import os
import pathlib
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from apexrl import PrioritizedStore, SnapshotError

# These tests drive eviction through remove_to_fit() alone: a hard ceiling far above what they insert
# (the ceiling itself is tested in test_store_limits.py).
NO_CEILING = 10**8

CONFIG_FIELDS = ("capacity", "alpha", "shards", "eviction", "alpha_evict", "seed")
# What a snapshot restores exactly (allocator figures such as a "bytes_reserved" high-water mark may differ;
# total_priority is compared to rounding).
RESTORED_STATS = (
    "size",
    "capacity",
    "shards",
    "bytes_held",
    "inserted",
    "sampled",
    "sample_calls",
    "updated",
    "stale_updates",
    "evicted",
    "erased",
    "remove_to_fit_calls",
)


def restored_stats(store):
    stats = store.stats()
    return {name: stats[name] for name in RESTORED_STATS}


def every_positive_item(store: PrioritizedStore, min_mass: float) -> dict[int, tuple[bytes, float]]:
    """key -> (bytes, probability) for every item with mass >= min_mass: a stratified batch whose segment is
    under half the smallest mass puts a draw inside every such item."""
    n = math.ceil(2.5 * store.total_priority / min_mass) + 1
    batch = store.sample(n)
    return {k: (bytes(m), p) for k, m, p in zip(batch.keys.tolist(), batch.items, batch.probabilities.tolist())}


def live(store, keys, priorities) -> list[bool]:
    return [store.update_priorities([int(k)], [float(p)]) == 1 for k, p in zip(keys, priorities)]


def config_of(store):
    return {f: getattr(store, f) for f in CONFIG_FIELDS}


def test_a_loaded_store_can_be_sampled_without_crashing_the_interpreter(tmp_path):
    # Runs first and in a child process, so a crash reads as one failed test instead of ending the session.
    script = textwrap.dedent(
        f"""
        from apexrl import PrioritizedStore
        store = PrioritizedStore(capacity=10, alpha=0.6, shards=2)
        store.insert([1.0, 2.0, 3.0], [b"hello", b"", b"world" * 100])
        store.save({str(tmp_path / "s.apx")!r})
        loaded = PrioritizedStore.load({str(tmp_path / "s.apx")!r})
        loaded.check_invariants()
        print(sorted(set(bytes(m) for m in loaded.sample(64).items)) == [b"", b"hello", b"world" * 100])
        """
    )
    child = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, f"the child exited with {child.returncode}: {child.stderr[-2000:]}"
    assert child.stdout.strip() == "True"


@pytest.fixture
def busy_store():
    """A store with history on every shard: uneven batches, zero priorities, empty items, updates (live and
    stale), erasures, samples, and an eviction; still above capacity so a later remove_to_fit has work."""
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=60, alpha=0.7, shards=3, eviction="fifo", alpha_evict=-0.3, seed=123
    )
    rng = np.random.default_rng(0)
    keys, prios, payloads = [], [], []
    for n in (70, 20, 5, 64, 1):
        p = rng.choice([0.0, 0.5, 1.0, 3.0, 10.0], size=n)
        items = [bytes(rng.integers(0, 256, size=int(rng.integers(0, 40)), dtype=np.uint8)) for _ in range(n)]
        keys += store.insert(p, items).tolist()
        prios += p.tolist()
        payloads += items
    store.update_priorities(keys[:10] + [12345], [2.0] * 11)
    prios[:10] = [2.0] * 10
    store.erase(keys[10:15])
    store.sample(32)
    assert store.remove_to_fit() == 160 - 5 - 60
    store.sample(8)
    # put it back above capacity
    more = store.insert([1.0, 4.0, 0.0], [b"late-1", b"late-2", b""]).tolist()
    keys += more
    prios += [1.0, 4.0, 0.0]
    payloads += [b"late-1", b"late-2", b""]
    return store, keys, prios, payloads


def test_a_round_trip_preserves_config_counters_size_and_total(busy_store, tmp_path):
    store, *_ = busy_store
    path = tmp_path / "store.apx"
    store.save(path)
    loaded = PrioritizedStore.load(path)
    assert config_of(loaded) == config_of(store)
    assert restored_stats(loaded) == restored_stats(store)
    assert len(loaded) == len(store) == 63
    assert loaded.total_priority == pytest.approx(store.total_priority, rel=1e-12)
    loaded.check_invariants()


def test_a_round_trip_preserves_every_item_its_bytes_and_its_probability(busy_store, tmp_path):
    store, keys, prios, payloads = busy_store
    store.save(tmp_path / "s")
    loaded = PrioritizedStore.load(tmp_path / "s")
    min_mass = min(p for p in prios if p > 0) ** 0.7
    before = every_positive_item(store, min_mass)
    after = every_positive_item(loaded, min_mass)
    assert after.keys() == before.keys()
    payload_of = dict(zip(keys, payloads))
    for key, (data, prob) in after.items():
        assert data == payload_of[key] == before[key][0]
        assert prob == pytest.approx(before[key][1], rel=1e-12)
    # zero-priority items are not sampled; they are there all the same, under the same keys
    assert live(loaded, keys, prios) == live(store, keys, prios)


def test_old_keys_still_address_the_same_items_and_stale_keys_stay_stale(busy_store, tmp_path):
    store, keys, prios, payloads = busy_store
    alive = live(store, keys, prios)
    store.save(tmp_path / "s")
    loaded = PrioritizedStore.load(tmp_path / "s")
    assert live(loaded, keys, prios) == alive
    # give one live item nearly all the mass: the loaded store returns its bytes under its key
    target = next(i for i, a in enumerate(alive) if a and payloads[i])
    loaded.update_priorities([keys[target]], [1e12])
    batch = loaded.sample(16)
    assert set(batch.keys.tolist()) == {keys[target]}
    assert {bytes(m) for m in batch.items} == {payloads[target]}
    # stale keys do not come back to life, and do not address the items that reuse their slots
    dead = [k for k, a in zip(keys, alive) if not a]
    new_keys = loaded.insert(np.ones(200), [b"new"] * 200).tolist()
    assert not set(new_keys) & set(keys)
    total = loaded.total_priority
    assert loaded.update_priorities(dead, np.full(len(dead), 7.0)) == 0
    assert loaded.total_priority == total


def test_fifo_order_survives_a_round_trip(busy_store, tmp_path):
    store, keys, prios, _ = busy_store
    alive = live(store, keys, prios)
    store.save(tmp_path / "s")
    loaded = PrioritizedStore.load(tmp_path / "s")
    assert loaded.remove_to_fit() == store.remove_to_fit() == 3
    after_original = live(store, keys, prios)
    assert live(loaded, keys, prios) == after_original
    # the three oldest of the live items went
    oldest = [i for i, a in enumerate(alive) if a][:3]
    assert [i for i, (a, b) in enumerate(zip(alive, after_original)) if a and not b] == oldest


def test_keys_issued_after_a_snapshot_are_stale_in_the_store_loaded_from_it(tmp_path):
    # The Ape-X restart: actors still hold keys the learner's store issued after its last snapshot. Some of
    # those keys name slots that were free when the snapshot was taken.
    store = PrioritizedStore(max_size=NO_CEILING, capacity=100, alpha=1.0, shards=2)
    keys = np.concatenate([store.insert(np.ones(10), [b"old"] * 10) for _ in range(2)])
    assert store.erase(keys[::3]) == 7
    store.save(tmp_path / "s")
    later = np.concatenate([store.insert(np.ones(6), [b"later"] * 6) for _ in range(2)])  # reuse the freed slots
    loaded = PrioritizedStore.load(tmp_path / "s")
    size, total = len(loaded), loaded.total_priority
    assert loaded.update_priorities(later, np.full(len(later), 50.0)) == 0
    assert loaded.total_priority == total
    loaded.check_invariants()
    assert loaded.erase(later) == 0
    assert len(loaded) == size
    loaded.check_invariants()


def test_items_inserted_after_loading_are_younger_than_every_loaded_item(tmp_path):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=6, alpha=0.6, shards=4, eviction="fifo")
    old = [int(store.insert([1.0], [b"old"])[0]) for _ in range(6)]
    store.save(tmp_path / "s")
    loaded = PrioritizedStore.load(tmp_path / "s")
    new = loaded.insert(np.ones(4), [b"new"] * 4).tolist()
    assert loaded.remove_to_fit() == 4
    assert live(loaded, old + new, [1.0] * 10) == [False] * 4 + [True] * 6


def test_a_loaded_store_continues_the_random_streams_of_the_original(tmp_path):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=100, alpha=0.6, shards=4, seed=42)
    for n in (30, 30, 30):
        store.insert(np.linspace(0.1, 3.0, n), [b"x"] * n)
    store.sample(5)
    store.save(tmp_path / "s")
    loaded = PrioritizedStore.load(tmp_path / "s")
    for _ in range(5):
        assert loaded.sample(16).keys.tolist() == store.sample(16).keys.tolist()


@pytest.mark.parametrize("eviction", ["fifo", "prioritized"])
def test_an_empty_store_round_trips(tmp_path, eviction):
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=5, alpha=0.0, shards=256, eviction=eviction, alpha_evict=0.25, seed=9
    )
    store.save(tmp_path / "empty")
    loaded = PrioritizedStore.load(tmp_path / "empty")
    assert config_of(loaded) == config_of(store)
    assert len(loaded) == 0 and restored_stats(loaded) == restored_stats(store)
    keys = loaded.insert([1.0], [b"x"])
    assert bytes(loaded.sample(1).items[0]) == b"x" and keys[0] != 0


def test_a_store_whose_every_item_was_erased_round_trips_and_keeps_its_keys_stale(tmp_path):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=5, alpha=1.0, shards=2)
    keys = store.insert(np.ones(100), [b"x"] * 100)
    store.erase(keys)
    store.save(tmp_path / "s")
    loaded = PrioritizedStore.load(tmp_path / "s")
    assert len(loaded) == 0
    assert loaded.update_priorities(keys, np.ones(100)) == 0
    new = loaded.insert(np.ones(100), [b"y"] * 100)
    assert not set(new.tolist()) & set(keys.tolist())
    loaded.check_invariants()


def test_prioritized_eviction_works_on_a_loaded_store(tmp_path):
    store = PrioritizedStore(
        max_size=NO_CEILING, capacity=10, alpha=0.6, shards=2, eviction="prioritized", alpha_evict=-0.4, seed=1
    )
    keys = store.insert([0.0] * 5 + [1.0] * 15, [b"x"] * 20).tolist()
    store.save(tmp_path / "s")
    loaded = PrioritizedStore.load(tmp_path / "s")
    assert loaded.remove_to_fit() == 10
    alive = live(loaded, keys, [0.0] * 5 + [1.0] * 15)
    assert alive[:5] == [False] * 5  # zero priorities (urgent) still go first
    assert sum(alive) == 10
    loaded.check_invariants()


# ---------------------------------------------------------------------------------------------------------------
# Files
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "as_path", [str, pathlib.Path, lambda p: pathlib.PurePosixPath(p)], ids=["str", "pathlib.Path", "PurePosixPath"]
)
def test_save_and_load_accept_str_and_path_like(tmp_path, as_path):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=5, shards=1)
    store.insert([1.0], [b"x"])
    path = as_path(str(tmp_path / "s.apx"))
    store.save(path)
    assert len(PrioritizedStore.load(path)) == 1


def test_save_leaves_only_the_snapshot_behind(tmp_path):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=5, shards=2)
    store.insert(np.ones(10), [b"x"] * 10)
    store.save(tmp_path / "s.apx")
    store.save(tmp_path / "s.apx")
    assert os.listdir(tmp_path) == ["s.apx"]


def test_saving_over_a_snapshot_replaces_it_by_rename_never_in_place(tmp_path):
    path = tmp_path / "s.apx"
    first = PrioritizedStore(max_size=NO_CEILING, capacity=5, shards=1)
    first.insert([1.0], [b"first"])
    first.save(path)
    old_bytes = path.read_bytes()
    with open(path, "rb") as reader:  # a reader of the old snapshot keeps a complete old file
        second = PrioritizedStore(max_size=NO_CEILING, capacity=5, shards=1)
        second.insert([1.0, 1.0], [b"second", b"second"])
        second.save(path)
        assert reader.read() == old_bytes
    assert path.read_bytes() != old_bytes
    assert len(PrioritizedStore.load(path)) == 2
    assert os.listdir(tmp_path) == ["s.apx"]


def test_a_failed_save_raises_snapshot_error_and_leaves_no_temporary_file(tmp_path):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=5, shards=1)
    store.insert([1.0], [b"x"])
    target = tmp_path / "a-directory"
    target.mkdir()
    (target / "inside").write_bytes(b"keep")
    with pytest.raises(SnapshotError, match="Is a directory|Directory not empty"):
        store.save(target)  # cannot rename a file over a non-empty directory
    assert sorted(os.listdir(tmp_path)) == ["a-directory"]
    assert os.listdir(target) == ["inside"]


def test_saving_into_a_missing_directory_raises_snapshot_error(tmp_path):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=5, shards=1)
    with pytest.raises(SnapshotError, match="No such file or directory"):
        store.save(tmp_path / "missing" / "s.apx")
    assert os.listdir(tmp_path) == []


def test_loading_a_missing_file_raises_os_error_not_snapshot_error(tmp_path):
    with pytest.raises(OSError) as info:
        PrioritizedStore.load(tmp_path / "nope.apx")
    assert not isinstance(info.value, ValueError)
    assert "nope.apx" in str(info.value)


# ---------------------------------------------------------------------------------------------------------------
# Damaged files
# ---------------------------------------------------------------------------------------------------------------


@pytest.fixture
def small_snapshot(tmp_path) -> bytes:
    store = PrioritizedStore(max_size=NO_CEILING, capacity=3, alpha=0.6, shards=2, eviction="prioritized", seed=5)
    keys = store.insert([1.0, 0.0, 2.5], [b"ab", b"", b"cdefg"])
    store.insert([0.5, 4.0], [b"h", b"ijk"])
    store.erase(keys[:1])
    store.update_priorities(keys[1:], [3.0, 0.25])
    store.sample(4)
    store.save(tmp_path / "small.apx")
    data = (tmp_path / "small.apx").read_bytes()
    assert restored_stats(PrioritizedStore.load(tmp_path / "small.apx")) == restored_stats(store)
    return data


def load_bytes(tmp_path, data: bytes):
    path = tmp_path / "damaged.apx"
    path.write_bytes(data)
    return PrioritizedStore.load(path)


def test_every_truncation_of_a_snapshot_raises_snapshot_error(small_snapshot, tmp_path):
    assert len(small_snapshot) > 100
    for cut in range(len(small_snapshot)):
        with pytest.raises(SnapshotError):
            load_bytes(tmp_path, small_snapshot[:cut])


@pytest.mark.parametrize("flip", [0xFF, 0x01, 0x80], ids=["invert", "low bit", "high bit"])
def test_every_flipped_byte_of_a_snapshot_raises_snapshot_error(small_snapshot, tmp_path, flip):
    for i in range(len(small_snapshot)):
        damaged = bytearray(small_snapshot)
        damaged[i] ^= flip
        with pytest.raises(SnapshotError):
            load_bytes(tmp_path, bytes(damaged))


def test_truncations_of_a_larger_snapshot_raise_snapshot_error(tmp_path):
    store = PrioritizedStore(max_size=NO_CEILING, capacity=50, alpha=0.6, shards=5, seed=1)
    for n in (100, 70, 3):
        store.insert(np.linspace(0, 2, n), [b"payload-%d" % i for i in range(n)])
    store.remove_to_fit()
    store.save(tmp_path / "big.apx")
    data = (tmp_path / "big.apx").read_bytes()
    for cut in np.random.default_rng(3).choice(len(data), size=300, replace=False).tolist() + [len(data) - 1]:
        with pytest.raises(SnapshotError):
            load_bytes(tmp_path, data[:cut])


@pytest.mark.parametrize(
    "damage, match",
    [
        (lambda d: b"", r"too short"),
        (lambda d: b"NOTASNAP" + d[8:], r"bad magic"),
        (lambda d: d[:8] + (6).to_bytes(4, "little") + d[12:], r"version 6"),
        (lambda d: d + b"\0", r"unexpected bytes after the checksum"),
        (lambda d: d[:-1] + bytes([d[-1] ^ 1]), r"checksum"),
        (lambda d: b"this is a text file, not a snapshot\n" * 3, r"bad magic"),
        (lambda d: d[:-4], r"checksum is missing"),
    ],
    ids=["empty file", "wrong magic", "unknown version", "trailing byte", "bad checksum", "text file", "no checksum"],
)
def test_damaged_or_foreign_files_raise_snapshot_error_saying_why(small_snapshot, tmp_path, damage, match):
    with pytest.raises(SnapshotError, match=match) as info:
        load_bytes(tmp_path, damage(small_snapshot))
    assert isinstance(info.value, ValueError)
    assert "damaged.apx" in str(info.value)


def test_a_snapshot_error_does_not_disturb_a_later_good_load(small_snapshot, tmp_path):
    for cut in (10, 60, len(small_snapshot) - 2):
        with pytest.raises(SnapshotError):
            load_bytes(tmp_path, small_snapshot[:cut])
    good = load_bytes(tmp_path, small_snapshot)
    good.check_invariants()
    assert len(good) == 4


def test_a_snapshot_is_written_for_its_owner_alone_and_never_through_a_planted_link(tmp_path):
    """The C++ writer creates its temporary exclusively (O_EXCL | O_NOFOLLOW) at mode 0600: the snapshot holds
    the run's experience, and a link planted at a temporary's name is refused, not followed."""
    import os

    store = PrioritizedStore(capacity=10, seed=0)
    store.insert(np.ones(2), [b"a", b"b"])
    path = tmp_path / "replay.snap"
    store.save(path)
    assert os.stat(path).st_mode & 0o777 == 0o600
    victim = tmp_path / "victim"
    victim.write_bytes(b"keep")
    for n in range(4096):  # the next temporaries' names: <path>.tmp.<pid>.<n> (n counts this process's saves)
        os.symlink(victim, f"{path}.tmp.{os.getpid()}.{n}")
    with pytest.raises(SnapshotError, match="cannot create snapshot"):
        for _ in range(4096):
            store.save(path)
    assert victim.read_bytes() == b"keep"
