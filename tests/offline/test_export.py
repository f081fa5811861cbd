"""``apexrl export`` reads snapshots through the native store only (``PrioritizedStore.load`` and ``contents``):
what it writes is what the saved store held, and the settings it records are the store's, named by its kind
tables. Needs no Minari (tests/offline/test_offline.py covers the export of a recorded run)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from apexrl._core import PrioritizedStore, eviction_kinds, sampler_kinds
from apexrl.offline.export import ExportError, export_snapshot, load_export, read_snapshot
from apexrl.replay.server.insert_guard import spec_sidecar
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec
from apexrl.replay.wire.frames import FrameStackCodec
from tests.replay.test_frames import SPEC as ATARI
from tests.replay.test_frames import synthetic_batch

SPEC = TransitionSpec([FieldSpec("obs", np.float32, (3,)), FieldSpec("action", np.int64)])


@pytest.mark.parametrize(
    "eviction, sampler, max_times_sampled",
    [("fifo", "prioritized", 0), ("min_heap", "uniform", 3), ("max_heap", "lifo", 0)],
)
def test_export_holds_the_saved_stores_items_in_insertion_order_and_its_settings(
    tmp_path, eviction, sampler, max_times_sampled
):
    rng = np.random.default_rng(1)
    store = PrioritizedStore(
        capacity=50, shards=3, eviction=eviction, sampler=sampler, max_times_sampled=max_times_sampled, seed=4
    )
    held: dict[int, tuple[float, dict]] = {}  # key -> (priority, fields), in insertion order
    for _ in range(4):
        batch = {"obs": rng.standard_normal((20, 3)).astype(np.float32), "action": rng.integers(0, 9, 20)}
        priorities = rng.uniform(0.5, 4.0, 20)
        keys = store.insert(priorities, *SPEC.encode(batch)).tolist()
        held.update({k: (float(priorities[i]), {n: batch[n][i] for n in SPEC.names}) for i, k in enumerate(keys)})
    store.update_priorities(list(held)[:5], [9.0] * 5)
    held.update({k: (9.0, held[k][1]) for k in list(held)[:5]})
    store.erase(list(held)[10:14])
    store.remove_to_fit()
    if max_times_sampled:
        store.sample(10)
    live = set(store.contents()["keys"].tolist())  # what the store holds when saved
    _save(store, tmp_path)
    assert len(live) == len(store) < len(held)

    out = str(tmp_path / "replay.npz")
    assert export_snapshot(str(tmp_path / "replay.snap"), out) == len(store)
    got = load_export(out)
    assert got["keys"].tolist() == [k for k in held if k in live]  # oldest first, across the shards
    assert np.all(np.diff(got["insertion"].astype(np.int64)) > 0)
    for row, key in enumerate(got["keys"].tolist()):
        assert got["priorities"][row] == held[key][0]
        for name in SPEC.names:
            np.testing.assert_array_equal(got[name][row], held[key][1][name])
    assert json.loads(got["store"]) == {
        "version": PrioritizedStore.snapshot_version(tmp_path / "replay.snap"),
        "epoch": 1,
        "capacity": 50,
        "max_size": 100,
        "alpha": 0.6,
        "shards": 3,
        "eviction": store.eviction,  # an alias is stored by the store's name
        "alpha_evict": -0.4,
        "seed": 4,
        "sampler": sampler,
        "max_times_sampled": max_times_sampled,
    }


def _save(store: PrioritizedStore, tmp_path: Path, spec: TransitionSpec = SPEC) -> str:
    path = str(tmp_path / "replay.snap")
    store.save(path)
    Path(spec_sidecar(path)).write_text(spec.to_json(), encoding="utf-8")
    return path


def test_items_referencing_chunks_come_back_with_their_chunks(tmp_path):
    codec = FrameStackCodec(ATARI, chunk_frames=4)
    store = PrioritizedStore(capacity=30, shards=2)
    batches = [synthetic_batch(np.random.default_rng(seed), envs=2, steps=12) for seed in (5, 6, 7)]
    for batch in batches:
        data, offsets, fc = codec.encode(batch)
        store.insert(
            np.ones(len(offsets) - 1),
            data,
            offsets,
            chunks=fc.chunks(),
            item_chunks=fc.item_chunks,
            item_chunk_offsets=fc.item_chunk_offsets,
        )
    store.remove_to_fit()  # the oldest items go, and the chunks only they referenced
    items = read_snapshot(_save(store, tmp_path, codec.item_spec))
    assert items.chunks is not None and len(items.keys) == len(store) == 30
    n = export_snapshot(str(tmp_path / "replay.snap"), str(tmp_path / "replay.npz"))
    z = load_export(str(tmp_path / "replay.npz"))
    assert n == 30 and TransitionSpec.from_json(z["spec"]) == ATARI
    for name in ATARI.names:  # the newest 30 transitions, stacks rebuilt from the chunks
        np.testing.assert_array_equal(z[name], np.concatenate([b[name] for b in batches])[-30:], err_msg=name)


def test_a_corrupt_snapshot_is_refused_with_the_stores_reason(tmp_path):
    path = _save(PrioritizedStore(capacity=10), tmp_path)
    blob = bytearray(Path(path).read_bytes())
    blob[20] ^= 0xFF
    Path(path).write_bytes(bytes(blob))
    with pytest.raises(ExportError, match="cannot be read"):
        export_snapshot(path, str(tmp_path / "out.npz"))
    assert not (tmp_path / "out.npz").exists()


def test_docs_offline_numbers_the_kinds_as_the_store_does():
    text = (Path(__file__).parents[2] / "docs" / "offline.md").read_text(encoding="utf-8")
    for field, kinds in (("eviction", eviction_kinds()), ("sampler", sampler_kinds())):
        m = re.search(rf"`{field}`: ((?:\d \w+(?: \(\w+\))?(?:, )?)+)", text)
        assert m, f"docs/offline.md no longer lists the snapshot's {field} numbers"
        documented = [re.fullmatch(r"(\d) (\w+)(?: \((\w+)\))?", part).groups() for part in m.group(1).split(", ")]
        assert [(int(n), name, alias) for n, name, alias in documented] == kinds
