"""Sample-time slices (apexrl.replay.slices) against a pure-Python reference model: which windows can be drawn,
their masses and draw probabilities (chi-square, fixed seeds), masks at episode ends, priority updates landing on
the right steps and masses, FIFO eviction of whole episodes, bad input refused without a change."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apexrl.replay.slices import SliceTable, decode_windows, window_keys
from apexrl.replay.wire import steps as S
from tests.store.test_sampling_stats import P_VALUE_FLOOR, chi2_sf


class Reference:
    """The contract written plainly: episodes as lists of step priorities, windows enumerated by their rules."""

    def __init__(self, capacity, length, burn_in, sampler, alpha, eta, strict_length, span):
        self.capacity, self.length, self.burn_in = capacity, length, burn_in
        self.sampler, self.alpha, self.eta = sampler, alpha, eta
        self.strict, self.span = strict_length, span
        self.episodes: dict[int, list[float]] = {}  # number -> step priorities, oldest first
        self.next = 0
        self.max_priority = 1.0
        self.stale = 0

    def trained(self, n, t):
        return range(t + self.burn_in, min(t + self.burn_in + self.length, n))

    def valid(self, n, t):
        w = self.burn_in + self.length
        k = len(self.trained(n, t))
        if k < 1 or (self.strict and n < w):
            return False
        return k >= self.length - self.span or (not self.strict and n < w and t == 0)

    def insert(self, priorities):
        n = len(priorities)
        while sum(map(len, self.episodes.values())) + n > self.capacity:
            del self.episodes[min(self.episodes)]
        self.episodes[self.next] = list(priorities)
        self.max_priority = max([self.max_priority, *priorities])
        self.next += 1
        return self.next - 1

    def mass(self, e, t):
        if self.sampler == "uniform":
            return 1.0
        p = [self.episodes[e][j] for j in self.trained(len(self.episodes[e]), t)]
        return (self.eta * max(p) + (1 - self.eta) * (sum(p) / len(p))) ** self.alpha

    def windows(self):
        return {
            (e, t): self.mass(e, t) for e, p in self.episodes.items() for t in range(len(p)) if self.valid(len(p), t)
        }

    def update(self, keys, values):
        for key, v in zip(keys, values, strict=True):
            e, t = key >> 24, key & (2**24 - 1)
            if e not in self.episodes or not self.valid(len(self.episodes[e]), t):
                self.stale += 1
                continue
            for i, j in enumerate(self.trained(len(self.episodes[e]), t)):
                self.episodes[e][j] = v[i] if np.ndim(v) else v
                self.max_priority = max(self.max_priority, self.episodes[e][j])


def make(capacity=64, length=3, burn_in=1, sampler="prioritized", alpha=0.7, eta=0.9, strict_length=True, span=0):
    ref_span = length - 1 if span is True else span  # TorchRL's span=True: at least one trained step
    args = (capacity, length, burn_in, sampler, alpha, eta, strict_length, ref_span)
    table = SliceTable(
        *args[:2],
        burn_in=burn_in,
        sampler=sampler,
        alpha=alpha,
        eta=eta,
        strict_length=strict_length,
        span=span,
        chunk_length=4,
        seed=7,
    )
    return table, Reference(*args)


def episode(number, n):
    """Steps whose ``id`` field names the episode and step, so every decoded row says where it came from."""
    ids = number * 1000 + np.arange(n, dtype=np.int64)
    return {"id": ids, "obs": {"x": np.stack([ids, -ids], axis=1).astype(np.float32)}}


def assert_matches(table, ref):
    table.validate()
    keys, masses = table.windows()
    episodes, starts = window_keys(keys)
    got = {(int(e), int(t)): float(m) for e, t, m in zip(episodes, starts, masses, strict=True)}
    want = ref.windows()
    assert got.keys() == want.keys()
    for k, m in want.items():
        assert got[k] == pytest.approx(m, rel=1e-12), k
    for e, p in ref.episodes.items():
        np.testing.assert_array_equal(table.step_priorities(e), p)
        assert table.valid_starts(len(p)) == sum(1 for k in want if k[0] == e)  # e(n), the documented formula
    stats = table.stats()
    assert (stats["episodes"], stats["steps"], stats["windows"]) == (
        len(ref.episodes),
        sum(map(len, ref.episodes.values())),
        len(want),
    )
    assert stats["stale_updates"] == ref.stale


CONFIGS = st.fixed_dictionaries(
    {
        "length": st.integers(1, 4),
        "burn_in": st.integers(0, 2),
        "sampler": st.sampled_from(["prioritized", "uniform"]),
        "eta": st.sampled_from([0.0, 0.9, 1.0]),
        "strict_length": st.booleans(),
        "span": st.integers(0, 3),
        "capacity": st.integers(8, 30),
    }
).filter(lambda c: c["span"] < c["length"])
PRIORITY = st.floats(0.0, 10.0) | st.sampled_from([0.0, 1.0])


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(config=CONFIGS, data=st.data())
def test_windows_masses_updates_and_eviction_follow_the_reference(config, data):
    table, ref = make(**config)
    for _ in range(data.draw(st.integers(1, 8))):
        if ref.episodes and data.draw(st.booleans()):
            live = sorted(ref.windows())
            picks = data.draw(st.lists(st.sampled_from(live), min_size=1, max_size=4)) if live else []
            keys = [(e << 24) | t for e, t in picks]
            keys += data.draw(st.lists(st.integers(0, (ref.next + 1) << 24), max_size=2))  # maybe stale or invalid
            if data.draw(st.booleans()):
                values = [data.draw(PRIORITY) for _ in keys]
            else:
                values = [[data.draw(PRIORITY) for _ in range(config["length"])] for _ in keys]
            live_keys = sum(_live(ref, k) for k in keys)
            assert table.update_priorities(np.array(keys, dtype=np.uint64), values) == live_keys
            ref.update(keys, values)
        else:
            n = data.draw(st.integers(1, config["capacity"]))
            given_priorities = data.draw(st.none() | st.lists(PRIORITY, min_size=n, max_size=n))
            number = table.insert_episode(episode(ref.next, n), given_priorities)
            assert number == ref.insert(given_priorities if given_priorities is not None else [ref.max_priority] * n)
        assert_matches(table, ref)


def _live(ref, key):
    e, t = key >> 24, key & (2**24 - 1)
    return e in ref.episodes and ref.valid(len(ref.episodes[e]), t)


@pytest.mark.parametrize("sampler", ["prioritized", "uniform"])
def test_draws_follow_the_reference_masses(sampler):
    table, ref = make(capacity=40, length=3, burn_in=1, sampler=sampler, strict_length=False, span=1)
    rng = np.random.default_rng(3)
    for n in (2, 5, 9, 13):  # 2 < B + L: one short window at its start; the others end in span windows
        p = rng.uniform(0.0, 4.0, size=n)
        ref.insert(list(p))
        table.insert_episode(episode(ref.next - 1, n), p)
    want = ref.windows()
    total = sum(want.values())
    counts: Counter = Counter()
    draws = 0
    for _ in range(200):
        raw = table._native.sample(96, 0.5)  # the draws alone: decoding is checked below
        episodes, starts = window_keys(raw["keys"])
        for e, t, prob in zip(episodes, starts, raw["probabilities"], strict=True):
            assert prob == pytest.approx(want[(int(e), int(t))] / total, rel=1e-9)
            counts[(int(e), int(t))] += 1
        draws += len(episodes)
    expected = np.array([draws * m / total for m in want.values()])
    observed = np.array([counts[k] for k in want])
    assert sum(observed) == draws  # every draw is a valid window
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2_sf(chi2, len(want) - 1) > P_VALUE_FLOOR, (chi2, observed, expected)


def test_windows_decode_with_masks_at_episode_ends_and_weights():
    table, ref = make(capacity=60, length=4, burn_in=2, strict_length=False, span=True)
    lengths = [3, 10, 7]
    for i, n in enumerate(lengths):
        ref.insert([1.0 + i + 0.1 * j for j in range(n)])
        table.insert_episode(episode(i, n), ref.episodes[i])
    want = ref.windows()
    batch = table.sample(256, beta=0.5)
    seen_short = False
    for i, (e, t) in enumerate(zip(batch.episodes, batch.starts, strict=True)):
        e, t = int(e), int(t)
        assert (e, t) in want
        rows = min(6, lengths[e] - t)
        seen_short |= rows < 6
        ids = e * 1000 + np.arange(t, t + rows)
        np.testing.assert_array_equal(batch.steps.mask[i], np.arange(6) < rows)
        np.testing.assert_array_equal(batch.steps.fields["id"][i, :rows], ids)
        np.testing.assert_array_equal(batch.steps.fields["obs"]["x"][i, :rows], np.stack([ids, -ids], 1))
        assert (batch.steps.fields["id"][i, rows:] == 0).all()
        weight = (want[(e, t)] / min(want.values())) ** -0.5
        assert batch.weights[i] == pytest.approx(weight, rel=1e-6)
    assert seen_short and batch.steps.valid.all()


def test_an_update_lands_on_the_trained_steps_and_moves_the_draws():
    table, ref = make(capacity=30, length=2, burn_in=1, alpha=1.0, eta=1.0)
    for i in range(2):
        ref.insert([1.0] * 8)
        table.insert_episode(episode(i, 8), 1.0)
    key = (1 << 24) | 3  # episode 1, start 3: burn-in step 3, trained steps 4 and 5
    assert table.update_priorities(np.array([key], dtype=np.uint64), [[0.0, 500.0]]) == 1
    np.testing.assert_array_equal(table.step_priorities(1), [1, 1, 1, 1, 0, 500, 1, 1])
    ref.update([key], [[0.0, 500.0]])
    assert_matches(table, ref)
    batch = table.sample(64)
    # Windows whose trained steps hold step 5 (starts 3 and 4) carry 500 of the ~512 mass.
    assert np.isin(batch.starts[batch.episodes == 1], [3, 4]).sum() > 50


def test_chunks_written_elsewhere_are_stored_as_they_come():
    fields = (S.Field("id", np.dtype("<i8"), ()),)
    fp = S.structure_fingerprint(fields)
    chunks = [S.encode_chunk(fields, [np.arange(lo, hi, dtype=np.int64)], fp) for lo, hi in ((0, 3), (3, 4), (4, 9))]
    table = SliceTable(20, 3, burn_in=1, sampler="uniform", span=True)
    assert table.insert_chunks(chunks, priorities=2.0) == 0
    np.testing.assert_array_equal(table.step_priorities(0), [2.0] * 9)
    batch = table.sample(64)
    for i, t in enumerate(batch.starts):
        rows = int(batch.steps.mask[i].sum())
        assert rows == min(4, 9 - t)
        np.testing.assert_array_equal(batch.steps.fields["id"][i, :rows], np.arange(t, t + rows))
    with pytest.raises(ValueError, match="structure"):  # the table's structure is the first episode's
        table.insert_episode({"id": np.zeros(5, dtype=np.int32)})


def test_fifo_eviction_removes_whole_episodes_and_their_keys_turn_stale():
    table, ref = make(capacity=20, length=2, burn_in=0)
    for i in range(3):
        ref.insert([1.0] * 8)
        table.insert_episode(episode(i, 8))
    assert list(ref.episodes) == [1, 2]
    assert_matches(table, ref)
    assert table.update_priorities(np.array([0 << 24, 1 << 24], dtype=np.uint64), [5.0, 5.0]) == 1
    ref.update([0, 1 << 24], [5.0, 5.0])
    assert_matches(table, ref)
    assert set(table.sample(64).episodes.tolist()) <= {1, 2}
    assert table.stats()["evicted_episodes"] == 1


def test_bad_input_is_refused_and_changes_nothing():
    table, ref = make(capacity=20, length=2)
    table.insert_episode(episode(0, 5))
    ref.insert([1.0] * 5)
    bad_inserts = [
        (episode(1, 21), None),  # longer than the capacity
        (episode(1, 4), [1.0, float("nan"), 1.0, 1.0]),
        (episode(1, 4), [1.0, -1.0, 1.0, 1.0]),
        (episode(1, 4), [1.0, 2.0]),  # not one per step
        ({"id": np.zeros(4, dtype=np.int32)}, None),  # another structure
        ({"id": np.zeros(4), "obs": {"x": np.zeros((3, 2))}}, None),  # fields of different lengths
        ({"id": np.array(["a", "b"]), "obs": {"x": np.zeros((2, 2), dtype=np.float32)}}, None),  # not numeric
    ]
    for steps, priorities in bad_inserts:
        with pytest.raises(ValueError):
            table.insert_episode(steps, priorities)
    good = table._native  # insert_chunks checks every chunk's header and the table's structure
    chunk = S.encode_chunk((S.Field("id", np.dtype("<i8"), ()),), [np.zeros(3, dtype=np.int64)], 5)
    # A chunk that claims the table's fingerprint but holds other fields: its columns could not be decoded.
    other = (S.Field("id", np.dtype("<i4"), ()), S.Field("obs.x", np.dtype("<f4"), (2,)))
    forged = S.encode_chunk(other, [np.zeros(3, dtype=np.int32), np.zeros((3, 2), np.float32)], table._fingerprint)
    for chunks in ([], [b"not a chunk"], [chunk], [forged]):
        with pytest.raises(ValueError):
            table.insert_chunks(chunks)
    assert table._native is good
    bad_updates = [([1], [1.0, 2.0]), ([1], [[1.0, 2.0, 3.0]]), ([1], [float("inf")]), ([-1], [1.0]), ([[1]], [1.0])]
    for keys, values in bad_updates:
        with pytest.raises(ValueError):
            table.update_priorities(np.array(keys), values)
    assert_matches(table, ref)
    for kwargs in ({"length": 0}, {"length": 2, "span": 2}, {"length": 2, "sampler": "fifo"}, {"length": 2, "eta": 2}):
        with pytest.raises(ValueError):
            SliceTable(10, **kwargs)
    empty, _ = make(length=6, burn_in=0)
    empty.insert_episode(episode(0, 5))  # shorter than the window, strict_length: no window
    with pytest.raises(ValueError, match="empty"):
        empty.sample(4)


@pytest.mark.parametrize("seed", range(4))
def test_native_decode_equals_the_sequence_decoder(seed):
    """decode_windows' native path gives what the generic sequence decoder gives on the same sample: random
    episodes (some shorter than the window), random chunk lengths, a compressible frame field beside raw ones,
    windows running past their episode's end (span) and masks there."""
    rng = np.random.default_rng(seed)
    length, burn_in = int(rng.integers(1, 6)), int(rng.integers(0, 4))
    table = SliceTable(
        400,
        length,
        burn_in=burn_in,
        sampler=("uniform", "prioritized")[seed % 2],
        strict_length=bool(seed % 2),
        span=int(rng.integers(0, length)),
        chunk_length=int(rng.integers(1, 7)),
        seed=seed,
    )
    for e in range(12):
        n = int(rng.integers(1, 3 * table.window + 2))
        frames = np.repeat(rng.integers(0, 3, (n, 1, 12), dtype=np.uint8), 12, axis=1)  # lz4 pays on these
        steps = {"frame": frames, "core": {"h": rng.standard_normal((n, 3)).astype(np.float32)}, "a": np.arange(n) + e}
        table.insert_episode(steps, rng.uniform(0.1, 2.0, n))
    table.insert_episode(_long(rng, table.window + 3))  # so that some window is valid
    reuse: dict[str, np.ndarray] = {}
    for _ in range(3):
        raw = table._raw_sample(int(rng.integers(1, 40)), 0.4, copy_chunks=True)
        want = decode_windows(raw, table.window, native=False)
        got = decode_windows(raw, table.window, reuse)
        np.testing.assert_array_equal(got.mask, want.mask)
        np.testing.assert_array_equal(got.valid, want.valid)
        np.testing.assert_array_equal(got.num_steps, want.num_steps)
        assert got.extras == want.extras == {}
        flat_got, flat_want = S.flatten(got.fields), S.flatten(want.fields)
        assert flat_got.keys() == flat_want.keys()
        for path, a in flat_want.items():
            assert flat_got[path].dtype == a.dtype
            np.testing.assert_array_equal(flat_got[path], a, err_msg=path)
        assert got.valid.all() and (got.num_steps == raw["rows"]).all()
    assert S.flatten(got.fields)["frame"] is reuse["frame"]  # the reused arrays are filled in place


def _long(rng, n):
    return {
        "frame": np.zeros((n, 12, 12), dtype=np.uint8),
        "core": {"h": rng.standard_normal((n, 3)).astype(np.float32)},
        "a": np.arange(n),
    }
