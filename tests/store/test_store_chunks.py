"""Frame chunks in the store: blobs an insert carries beside its items, kept exactly as long as an item needs them.

A stateful model (hypothesis) inserts batches of items referencing random subsets of their batch's chunks,
erases, evicts (FIFO, so the victims are known), samples and restores snapshots, and checks after every step
that the store holds exactly the chunks some live item references (count and bytes, each chunk once), that a
sample returns each referenced chunk once with every item's chunks in its own order, and the store's own
invariants (reference counts equal to the live references). Plus: bad chunk references are refused and change
nothing, and a format-2 snapshot (written before chunks existed) still loads.
"""

from __future__ import annotations

import struct

import numpy as np
import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from apexrl import PrioritizedStore
from apexrl._core import StaleChunksError

NO_CEILING = 10**8
MAX_CHUNKS_PER_ITEM = 16


def insert_with_chunks(store, priorities, items, chunks, refs):
    """Insert items where item i references chunks[refs[i][j]] (the store's flat form)."""
    offsets = np.zeros(len(items) + 1, dtype=np.uint64)
    offsets[1:] = np.cumsum([len(r) for r in refs])
    flat = np.array([c for r in refs for c in r], dtype=np.uint64)
    return store.insert(priorities, items, chunks=chunks, item_chunks=flat, item_chunk_offsets=offsets)


class ChunkModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.items: dict[int, tuple[bytes, list[bytes], int]] = {}  # key -> (payload, its chunks, insertion number)
        self.next_uid = 0
        self.next_seq = 0

    def blob(self, tag: bytes, extra: int) -> bytes:
        self.next_uid += 1  # every payload and chunk distinct, so equal bytes name the same blob
        return tag + struct.pack("<I", self.next_uid) + bytes(j % 251 for j in range(extra))

    @initialize(shards=st.integers(1, 4), capacity=st.integers(4, 40))
    def make(self, shards, capacity):
        self.capacity = capacity
        self.store = PrioritizedStore(
            capacity=capacity, alpha=0.6, shards=shards, eviction="fifo", seed=3, max_size=NO_CEILING
        )

    @rule(data=st.data(), n=st.integers(1, 12), m=st.integers(0, 6), plain=st.booleans())
    def insert(self, data, n, m, plain):
        if plain or m == 0:  # a batch without chunks (the DPG layout), spread over shards as before
            items = [self.blob(b"i", data.draw(st.integers(0, 40))) for _ in range(n)]
            keys = self.store.insert([1.0] * n, items)
            for key, item in zip(keys.tolist(), items):
                self.items[key] = (item, [], self.next_seq)
                self.next_seq += 1
            return
        chunks = [self.blob(b"c", data.draw(st.integers(0, 300))) for _ in range(m)]
        refs = [
            data.draw(st.lists(st.integers(0, m - 1), unique=True, max_size=min(m, MAX_CHUNKS_PER_ITEM)))
            for _ in range(n)
        ]
        for c in set(range(m)) - {c for r in refs for c in r}:  # every chunk referenced by some item
            refs[data.draw(st.integers(0, n - 1))].append(c)
        items = [self.blob(b"i", data.draw(st.integers(0, 40))) for _ in range(n)]
        priorities = data.draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n))
        keys = insert_with_chunks(self.store, priorities, items, chunks, refs)
        for key, item, r in zip(keys.tolist(), items, refs):
            self.items[key] = (item, [chunks[c] for c in r], self.next_seq)
            self.next_seq += 1

    @precondition(lambda self: self.items)
    @rule(data=st.data())
    def erase(self, data):
        keys = data.draw(st.lists(st.sampled_from(sorted(self.items)), max_size=6, unique=True))
        assert self.store.erase(np.array(keys, dtype=np.uint64)) == len(keys)
        for k in keys:
            del self.items[k]

    @rule()
    def remove_to_fit(self):
        excess = max(0, len(self.items) - self.capacity)
        assert self.store.remove_to_fit() == excess
        for key in sorted(self.items, key=lambda k: self.items[k][2])[:excess]:  # FIFO: the oldest go
            del self.items[key]

    @precondition(lambda self: self.items)
    @rule(n=st.integers(1, 20))
    def sample(self, n):
        batch = self.store.sample(n)
        chunks = batch.chunks
        assert len(set(chunks)) == len(chunks), "a chunk came twice in one batch"
        used = set()
        offsets = batch.item_chunk_offsets
        for i, key in enumerate(batch.keys.tolist()):
            payload, expected, _ = self.items[key]
            assert bytes(batch.items[i]) == payload
            indices = batch.item_chunks[offsets[i] : offsets[i + 1]].tolist()
            assert [chunks[c] for c in indices] == expected
            used.update(indices)
        assert used == set(range(len(chunks))), "the batch carries a chunk no sampled item references"

    @rule(data=st.data())
    def snapshot_restore(self, data):
        path = self.tmp / f"s{self.next_uid}.snap"
        self.store.save(path)
        restored = PrioritizedStore.load(path)
        assert restored.stats()["chunks"] == self.store.stats()["chunks"]
        self.store = restored

    @invariant()
    def chunks_live_exactly_as_long_as_needed(self):
        if not hasattr(self, "store"):
            return
        self.store.check_invariants()
        live = {c for _, chunks, _ in self.items.values() for c in chunks}
        st_ = self.store.stats()
        assert st_["size"] == len(self.items)
        assert st_["chunks"] == len(live)
        assert st_["chunk_bytes"] == sum(len(c) for c in live)
        assert st_["bytes_held"] == st_["chunk_bytes"] + sum(len(p) for p, _, _ in self.items.values())


def test_chunks_model(tmp_path):
    ChunkModel.tmp = tmp_path

    class Run(ChunkModel):
        pass

    Run.TestCase.settings = settings(
        max_examples=60, stateful_step_count=25, deadline=None, suppress_health_check=[HealthCheck.too_slow]
    )
    Run.TestCase().runTest()


@pytest.mark.parametrize(
    ("chunks", "refs", "message"),
    [
        ([b"a", b"b"], [[0], [0]], r"chunks\[1\] is referenced by no item"),
        ([b"a"], [[0], [1]], r"items\[1\] references chunk 1: neither one of the call's 1 chunks nor a chunk key"),
        ([b"a"], [[0, 0], []], r"items\[0\] references chunk 0 twice"),
        ([bytes([c % 256]) for c in range(4097)], [list(range(4097)), []], r"at most 4096"),
        ([], [[], []], None),  # no chunks, no references: accepted
    ],
    ids=["unreferenced", "out of range", "twice", "too many", "empty"],
)
def test_bad_chunk_references_are_refused_and_change_nothing(chunks, refs, message):
    store = PrioritizedStore(capacity=100, shards=2)
    insert_with_chunks(store, [1.0], [b"x"], [b"kept"], [[0]])
    before = store.stats()
    if message is None:
        insert_with_chunks(store, [1.0, 2.0], [b"p", b"q"], chunks, refs)
        assert len(store) == 3
        return
    with pytest.raises(ValueError, match=message):
        insert_with_chunks(store, [1.0, 2.0], [b"p", b"q"], chunks, refs)
    assert store.stats() == before
    store.check_invariants()


def test_chunk_arguments_go_together():
    store = PrioritizedStore(capacity=10)
    with pytest.raises(ValueError, match="go together"):
        store.insert([1.0], [b"x"], chunks=[b"c"])
    with pytest.raises(ValueError, match="from 0 to len"):
        store.insert(
            [1.0],
            [b"x"],
            chunks=[b"c"],
            item_chunks=np.array([0], dtype=np.uint64),
            item_chunk_offsets=np.array([0, 2], dtype=np.uint64),
        )
    assert len(store) == 0


def test_a_chunk_goes_with_its_last_item():
    store = PrioritizedStore(capacity=10, shards=4, max_size=NO_CEILING)
    keys = insert_with_chunks(store, [1.0, 1.0, 1.0], [b"a", b"b", b"c"], [b"X" * 100, b"Y" * 50], [[0], [0, 1], [1]])
    assert (store.stats()["chunks"], store.stats()["chunk_bytes"]) == (2, 150)
    store.erase(keys[:1])
    assert store.stats()["chunks"] == 2  # X is still referenced by item b
    store.erase(keys[1:2])
    assert (store.stats()["chunks"], store.stats()["chunk_bytes"]) == (1, 50)
    store.erase(keys[2:])
    assert (store.stats()["chunks"], store.stats()["chunk_bytes"], store.stats()["bytes_held"]) == (0, 0, 0)
    store.check_invariants()


# -- a format-2 snapshot, written by hand in the layout sharded_store.cc / shard.cc document ----------------


def crc32c(data: bytes) -> int:
    table = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ (0x82F63B78 if c & 1 else 0)
        table.append(c)
    crc = 0xFFFFFFFF
    for b in data:
        crc = (crc >> 8) ^ table[(crc ^ b) & 0xFF]
    return crc ^ 0xFFFFFFFF


def format2_snapshot(items: list[tuple[float, bytes]], epoch: int = 1) -> tuple[bytes, list[int]]:
    """One shard, fifo, alpha 0.6; item i in slot i with tag (epoch, generation 1). Returns (file, keys)."""
    tag = (epoch << 16) | 1
    out = b"APXRLST1" + struct.pack("<IIQQdIIdQ", 2, epoch, 100, 200, 0.6, 1, 0, -0.4, 7)
    block = struct.pack("<IQ", 0, len(items)) + struct.pack(f"<{len(items)}I", *[tag] * len(items))
    block += struct.pack("<Q", len(items))
    for slot, (priority, payload) in enumerate(items):
        block += struct.pack("<IQdI", slot, slot + 1, priority, len(payload)) + payload
    block += struct.pack("<7Q", len(items), 0, 0, 0, 0, 0, len(items))
    out += block + struct.pack("<5Q", len(items), 1, 0, 0, 0) + b"APXRLEND"
    keys = [slot << 8 | tag << 36 for slot in range(len(items))]
    return out + struct.pack("<I", crc32c(out)), keys


def test_crc32c_matches_the_check_value():
    assert crc32c(b"123456789") == 0xE3069283


def test_format2_snapshot_still_loads(tmp_path):
    items = [(1.0, b"first"), (2.5, b""), (0.5, b"third item")]
    data, keys = format2_snapshot(items)
    path = tmp_path / "v2.snap"
    path.write_bytes(data)
    store = PrioritizedStore.load(path)
    store.check_invariants()
    assert len(store) == 3 and store.epoch == 2 and store.stats()["chunks"] == 0
    batch = store.sample(30)
    by_key = dict(zip(keys, (payload for _, payload in items)))
    for key, item in zip(batch.keys.tolist(), batch.items):
        assert bytes(item) == by_key[key]
    assert len(batch.chunks) == 0 and not batch.item_chunk_offsets.any()
    assert store.update_priorities(np.array(keys, dtype=np.uint64), [1.0, 1.0, 1.0]) == 3  # old keys still valid
    # saved again, it is a file of the current format (5) that loads too
    store.save(tmp_path / "v5.snap")
    assert struct.unpack_from("<I", (tmp_path / "v5.snap").read_bytes(), 8)[0] == 5
    assert len(PrioritizedStore.load(tmp_path / "v5.snap")) == 3


def test_newer_format_is_refused_with_a_clear_message(tmp_path):
    data, _ = format2_snapshot([(1.0, b"x")])
    body = data[:8] + struct.pack("<I", 6) + data[12:-4]
    (tmp_path / "v6.snap").write_bytes(body + struct.pack("<I", crc32c(body)))
    with pytest.raises(Exception, match=r"format version 6; this build reads versions 2 to 5 \(written by a newer"):
        PrioritizedStore.load(tmp_path / "v6.snap")


def test_stored_chunks_are_referenced_by_key_until_their_last_item_goes():
    store = PrioritizedStore(capacity=100, shards=4)
    keys, chunk_keys = store.insert(
        [1.0, 1.0],
        [b"a", b"b"],
        chunks=[b"x" * 10, b"y" * 20],
        item_chunks=[0, 0, 1],
        item_chunk_offsets=[0, 1, 3],
        return_chunk_keys=True,
    )
    assert chunk_keys.dtype == np.uint64 and len(set(chunk_keys.tolist())) == 2
    # A later call references the stored chunk y by key, beside a new chunk of its own: stored on y's shard.
    more, new = store.insert(
        [1.0],
        [b"c"],
        chunks=[b"z"],
        item_chunks=[int(chunk_keys[1]), 0],
        item_chunk_offsets=[0, 2],
        return_chunk_keys=True,
    )
    assert int(more[0]) & 0xFF == int(chunk_keys[1]) & 0xFF == int(new[0]) & 0xFF
    assert store.stats()["chunks"] == 3 and store.stats()["chunk_bytes"] == 31
    batch = store.sample(16)
    for i, key in enumerate(batch.keys.tolist()):
        refs = batch.item_chunks[batch.item_chunk_offsets[i] : batch.item_chunk_offsets[i + 1]].tolist()
        got = [bytes(batch.chunks[c]) for c in refs]
        assert (
            got
            == {int(keys[0]): [b"x" * 10], int(keys[1]): [b"x" * 10, b"y" * 20], int(more[0]): [b"y" * 20, b"z"]}[key]
        )
    # x goes with its last item; a reference to it is then refused whole, naming it, and changes nothing.
    assert store.erase(keys) == 2
    before = store.stats()
    with pytest.raises(StaleChunksError, match=str(int(chunk_keys[0]))):
        store.insert([1.0], [b"d"], chunks=[], item_chunks=[int(chunk_keys[0])], item_chunk_offsets=[0, 1])
    assert store.stats() == before
    store.check_invariants()
