"""Transitions go through the codec and a real store and come back equal; bad batches and bad items are refused."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import numpy as np
import pytest

from apexrl import PrioritizedStore
from apexrl.replay.wire.codec import MAX_SPEC_JSON_BYTES, FieldSpec, TransitionSpec

DPG = TransitionSpec.dpg(67, 21)
ATARI = TransitionSpec.atari()

# Frozen format: changing one of these breaks every peer and every snapshot of encoded items.
DPG_67_21_FINGERPRINT = 0xCF514634
ATARI_FINGERPRINT = 0x4E07F8ED


def dpg_batch(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.standard_normal((n, 67), dtype=np.float32),
        "action": rng.uniform(-1, 1, (n, 21)).astype(np.float32),
        "reward": rng.standard_normal(n, dtype=np.float32),
        "discount": rng.choice(np.array([0.0, 0.99], dtype=np.float32), n),
        "next_obs": rng.standard_normal((n, 67), dtype=np.float32),
    }


def synthetic_frames(count: int, rng: np.random.Generator, height: int = 84, width: int = 84) -> np.ndarray:
    """Frames made of 12x12 blocks of one random grey level each: structured enough for lz4 to compress."""
    block = 12
    coarse = rng.integers(0, 256, (count, -(-height // block), -(-width // block)), dtype=np.uint8)
    return np.repeat(np.repeat(coarse, block, axis=1), block, axis=2)[:, :height, :width]


def atari_batch(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    frames = synthetic_frames(n + 4, rng)
    stacks = np.lib.stride_tricks.sliding_window_view(frames, 4, axis=0).transpose(0, 3, 1, 2)
    return {
        "obs": np.ascontiguousarray(stacks[:n]),
        "action": rng.integers(0, 18, n, dtype=np.int32),
        "reward": rng.choice(np.array([-1.0, 0.0, 1.0], dtype=np.float32), n),
        "discount": np.full(n, 0.99, dtype=np.float32),
        "next_obs": np.ascontiguousarray(stacks[1 : n + 1]),
    }


def split_items(data: np.ndarray, offsets: np.ndarray) -> list[bytes]:
    return [data[int(a) : int(b)].tobytes() for a, b in itertools.pairwise(offsets)]


def join_items(items: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    offsets = np.zeros(len(items) + 1, dtype=np.uint64)
    np.cumsum([len(i) for i in items], out=offsets[1:])
    return np.frombuffer(b"".join(items), dtype=np.uint8).copy(), offsets


# ---------------------------------------------------------------------------------------------------------------
# Round trips
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("spec", "make_batch", "n"),
    [(DPG, dpg_batch, 300), (ATARI, atari_batch, 40)],
    ids=["dpg-67-21", "atari-4x84x84"],
)
def test_transitions_come_back_equal_after_a_trip_through_the_store(spec, make_batch, n):
    batch = make_batch(n, seed=1)
    data, offsets = spec.encode(batch)
    assert data.dtype == np.uint8 and data.ndim == 1
    assert offsets.dtype == np.uint64 and offsets.shape == (n + 1,) and offsets[0] == 0 and offsets[-1] == data.size

    store = PrioritizedStore(capacity=1000, alpha=0.0, shards=3, seed=7)
    keys = store.insert(np.ones(n), data, offsets)
    index_of = {int(k): i for i, k in enumerate(keys)}
    sample = store.sample(2 * n + 2)  # alpha 0, stratified: every item is drawn at least once
    decoded = spec.decode_batch(sample)

    assert list(decoded) == list(spec.names)
    rows = np.array([index_of[int(k)] for k in sample.keys])
    assert set(rows.tolist()) == set(range(n))
    for name, original in batch.items():
        got = decoded[name]
        assert got.dtype == original.dtype and got.shape == (len(sample), *original.shape[1:])
        np.testing.assert_array_equal(got, original[rows], err_msg=name)


def test_decoded_arrays_are_writable_copies_that_do_not_alias_the_input():
    for spec, batch in ((DPG, dpg_batch(1)), (ATARI, atari_batch(1))):
        data, offsets = spec.encode(batch)
        before = data.copy()
        decoded = spec.decode(data, offsets)
        for arr in decoded.values():
            assert arr.flags.writeable and arr.flags.c_contiguous
            arr[...] = 0
        np.testing.assert_array_equal(data, before)


def test_a_spec_without_compression_has_fixed_size_items_of_fingerprint_plus_raw_bytes():
    assert DPG.raw_item_bytes == 4 * (67 + 21 + 1 + 1 + 67)
    assert DPG.fixed_item_bytes == 4 + DPG.raw_item_bytes
    _data, offsets = DPG.encode(dpg_batch(5))
    assert np.all(np.diff(offsets) == DPG.fixed_item_bytes)
    assert ATARI.fixed_item_bytes is None and ATARI.raw_item_bytes == 12
    assert ATARI.transition_bytes == 2 * 4 * 84 * 84 + 12


def test_item_bytes_follow_the_documented_layout():
    spec = TransitionSpec(
        [FieldSpec("a", "<i2", (2,)), FieldSpec("img", "u1", (3, 4), compress=True), FieldSpec("b", "f8")]
    )
    batch = {"a": np.array([[1, -2]], np.int16), "img": np.full((1, 3, 4), 9, np.uint8), "b": np.array([0.5])}
    data, _offsets = spec.encode(batch)
    item = data.tobytes()
    assert item[:4] == spec.fingerprint.to_bytes(4, "little")
    assert item[4:8] == np.array([1, -2], "<i2").tobytes()
    assert item[8:16] == np.array([0.5], "<f8").tobytes()
    length = int.from_bytes(item[16:20], "little")
    assert len(item) == 20 + length
    import lz4.block

    assert lz4.block.decompress(item[20:], uncompressed_size=12) == bytes([9] * 12)


def test_safe_casts_and_big_endian_input_are_accepted_and_stored_little_endian():
    batch = dpg_batch(3)
    batch["reward"] = np.array([1, 2, 3], dtype=np.int16)  # int16 -> float32 is safe
    batch["obs"] = batch["obs"].astype(">f4")
    decoded = DPG.decode(*DPG.encode(batch))
    np.testing.assert_array_equal(decoded["reward"], [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(decoded["obs"], batch["obs"])
    assert decoded["obs"].dtype == np.dtype("<f4")


def test_an_empty_batch_encodes_to_no_bytes_and_decodes_to_empty_arrays():
    data, offsets = ATARI.encode({k: v[:0] for k, v in atari_batch(2).items()})
    assert data.size == 0 and offsets.tolist() == [0]
    decoded = ATARI.decode(data, offsets)
    assert decoded["obs"].shape == (0, 4, 84, 84) and decoded["reward"].shape == (0,)


def test_zero_size_fields_round_trip():
    fields = [FieldSpec("x", "f4", (0,)), FieldSpec("z", "u1", (2, 0), compress=True), FieldSpec("r", "f4")]
    spec = TransitionSpec(fields)
    batch = {"x": np.zeros((3, 0), np.float32), "z": np.zeros((3, 2, 0), np.uint8), "r": np.arange(3, dtype=np.float32)}
    decoded = spec.decode(*spec.encode(batch))
    assert decoded["x"].shape == (3, 0) and decoded["z"].shape == (3, 2, 0)
    np.testing.assert_array_equal(decoded["r"], [0, 1, 2])


def test_an_atari_item_compresses_more_than_twice_on_structured_frames():
    data, offsets = ATARI.encode(atari_batch(64, seed=3))
    ratio = 64 * ATARI.transition_bytes / data.size
    assert ratio > 2, ratio
    assert int(np.diff(offsets).max()) < ATARI.transition_bytes / 2


# ---------------------------------------------------------------------------------------------------------------
# Spec, JSON and fingerprint
# ---------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("spec", [DPG, ATARI, TransitionSpec([FieldSpec("flag", bool, (2,)), FieldSpec("c", "c8")])])
def test_a_spec_survives_a_json_round_trip_with_the_same_fingerprint(spec):
    again = TransitionSpec.from_json(spec.to_json())
    assert again == spec and again.fingerprint == spec.fingerprint and again.fields == spec.fields
    assert TransitionSpec.from_json(spec.to_json().encode()) == spec


def test_equivalent_dtype_spellings_give_the_same_spec():
    a = TransitionSpec([FieldSpec("x", np.float32, [3]), FieldSpec("y", "uint8", (2,))])
    b = TransitionSpec([FieldSpec("x", ">f4", (3,)), FieldSpec("y", np.dtype("u1"), (np.int64(2),))])
    assert a == b and a.fingerprint == b.fingerprint
    assert a["x"].dtype.str == "<f4" and a["x"].shape == (3,)


def test_the_fingerprint_is_the_same_in_another_process_and_frozen():
    code = "from apexrl.replay.wire.codec import TransitionSpec as T; print(T.dpg(67, 21).fingerprint, T.atari().fingerprint)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env={"PYTHONHASHSEED": "12345"}
    )
    assert out.stdout.split() == [str(DPG.fingerprint), str(ATARI.fingerprint)]
    assert (DPG.fingerprint, ATARI.fingerprint) == (DPG_67_21_FINGERPRINT, ATARI_FINGERPRINT)
    assert TransitionSpec.dpg(67, 22).fingerprint != DPG.fingerprint


def _doc(**changes):
    doc = json.loads(DPG.to_json())
    doc.update(changes)
    return doc


def _field_doc(**changes):
    doc = json.loads(DPG.to_json())
    doc["fields"][0].update(changes)
    return doc


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("not json", id="garbage"),
        pytest.param("[]", id="not-an-object"),
        pytest.param(json.dumps(_doc(extra=1)), id="unknown-top-key"),
        pytest.param(json.dumps({"fields": _doc()["fields"]}), id="missing-version"),
        pytest.param(json.dumps(_doc(version=2)), id="unknown-version"),
        pytest.param(json.dumps(_doc(version=True)), id="bool-version"),
        pytest.param(json.dumps(_doc(version="1")), id="string-version"),
        pytest.param(json.dumps(_doc(fields=[])), id="no-fields"),
        pytest.param(json.dumps(_doc(fields={})), id="fields-not-a-list"),
        pytest.param(json.dumps(_doc(fields=_doc()["fields"] * 40)), id="too-many-fields"),
        pytest.param(json.dumps(_doc(fields=_doc()["fields"] * 2)), id="duplicate-names"),
        pytest.param(json.dumps(_field_doc(units="m")), id="unknown-field-key"),
        pytest.param(json.dumps(_field_doc(name=1)), id="name-not-a-string"),
        pytest.param(json.dumps(_field_doc(name="a b")), id="name-not-an-identifier"),
        pytest.param(json.dumps(_field_doc(dtype="float32")), id="non-canonical-dtype"),
        pytest.param(json.dumps(_field_doc(dtype="|O")), id="object-dtype"),
        pytest.param(json.dumps(_field_doc(dtype="<U4")), id="str-dtype"),
        pytest.param(json.dumps(_field_doc(dtype="[('a', '<f4')]")), id="structured-dtype"),
        pytest.param(json.dumps(_field_doc(shape=[-1])), id="negative-dim"),
        pytest.param(json.dumps(_field_doc(shape=[2.0])), id="float-dim"),
        pytest.param(json.dumps(_field_doc(shape=[True])), id="bool-dim"),
        pytest.param(json.dumps(_field_doc(shape=5)), id="shape-not-a-list"),
        pytest.param(json.dumps(_field_doc(shape=[1] * 9)), id="too-many-dims"),
        pytest.param(json.dumps(_field_doc(shape=[1 << 20, 1 << 20])), id="item-too-large"),
        pytest.param(json.dumps(_field_doc(compress=1)), id="compress-not-a-bool"),
        pytest.param(DPG.to_json().replace('"version":1', '"version":1,"version":1'), id="duplicate-key"),
        pytest.param(DPG.to_json().replace("[67]", "[NaN]", 1), id="nan"),
        pytest.param("[" * 100_000, id="too-long"),
        pytest.param("[" * 30_000 + "]" * 30_000, id="deeply-nested"),
        pytest.param(DPG.to_json() + " " * MAX_SPEC_JSON_BYTES, id="padded-past-the-cap"),
    ],
)
def test_from_json_rejects_malformed_specs_with_value_error(text):
    with pytest.raises(ValueError):
        TransitionSpec.from_json(text)


def test_from_json_rejects_invalid_utf8_and_non_text():
    with pytest.raises(ValueError):
        TransitionSpec.from_json(b"\xff\xfe{}")
    with pytest.raises(TypeError):
        TransitionSpec.from_json(12)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (("1x", "f4"), "name"),
        (("", "f4"), "name"),
        (("x", "O"), "dtype"),
        (("x", "U3"), "dtype"),
        (("x", "M8[s]"), "dtype"),
        (("x", [("a", "f4")]), "dtype"),
        (("x", "(2,)f4"), "dtype"),
        (("x", None), "dtype"),
        (("x", "no-such-dtype"), "dtype"),
        (("x", "f4", (-1,)), "negative"),
        (("x", "f4", (1.5,)), "non-integer"),
        (("x", "f4", (True,)), "bool"),
        (("x", "f4", 3), "sequence"),
        (("x", "f4", (), "yes"), "compress"),
    ],
)
def test_field_spec_rejects_bad_names_dtypes_shapes_and_flags(args, match):
    with pytest.raises(ValueError, match=match):
        FieldSpec(*args)


def test_transition_spec_rejects_duplicate_names_and_empty_field_lists():
    with pytest.raises(ValueError, match="duplicate"):
        TransitionSpec([FieldSpec("x", "f4"), FieldSpec("x", "i4")])
    with pytest.raises(ValueError):
        TransitionSpec([])


# ---------------------------------------------------------------------------------------------------------------
# Encode refuses mismatched batches
# ---------------------------------------------------------------------------------------------------------------


def _without(batch, name):
    return {k: v for k, v in batch.items() if k != name}


@pytest.mark.parametrize(
    ("mutate", "words"),
    [
        pytest.param(lambda b: _without(b, "discount"), ["missing", "discount"], id="missing-field"),
        pytest.param(lambda b: {**b, "info": np.zeros(4)}, ["unknown", "info"], id="extra-field"),
        pytest.param(lambda b: {**b, "obs": b["obs"][:, :66]}, ["'obs'", "(4, 66)", "(67,)"], id="wrong-shape"),
        pytest.param(lambda b: {**b, "action": b["action"][:, None]}, ["'action'", "(4, 1, 21)"], id="extra-dim"),
        pytest.param(
            lambda b: {**b, "reward": b["reward"][:3]}, ["'reward'", "leading dim 4", "(3,)"], id="leading-dim"
        ),
        pytest.param(lambda b: {**b, "reward": np.float32(1.0)}, ["'reward'", "scalar"], id="scalar"),
        pytest.param(lambda b: {**b, "obs": b["obs"].astype(np.float64)}, ["'obs'", "float32", "float64"], id="f64"),
        pytest.param(lambda b: {**b, "reward": np.arange(4)}, ["'reward'", "float32", "int64"], id="int64"),
        pytest.param(lambda b: {**b, "reward": np.array(list("abcd"))}, ["'reward'", "<U1"], id="str"),
        pytest.param(lambda b: {**b, "reward": np.array([1.0, 2, 3, None])}, ["'reward'", "object"], id="object"),
    ],
)
def test_encode_rejects_a_mismatched_batch_naming_the_field_expected_and_received(mutate, words):
    with pytest.raises(ValueError) as info:
        DPG.encode(mutate(dpg_batch(4)))
    for word in words:
        assert word in str(info.value), (word, str(info.value))


@pytest.mark.parametrize("bad_field", ["action", "next_obs"])
def test_encode_checks_every_field_before_compressing_anything(bad_field, monkeypatch):
    import lz4.block

    def no_compression(*args, **kwargs):
        raise AssertionError("compressed before validating")

    monkeypatch.setattr(lz4.block, "compress", no_compression)
    batch = atari_batch(3)
    batch[bad_field] = batch[bad_field][:2]  # the last field in spec order is checked before any work starts
    with pytest.raises(ValueError, match=f"'{bad_field}'.*leading dim 3"):
        ATARI.encode(batch)


def test_an_unsafe_uint8_frame_cast_is_refused_for_atari():
    batch = atari_batch(2)
    batch["obs"] = batch["obs"].astype(np.int16)
    with pytest.raises(ValueError, match="'obs'.*uint8.*int16"):
        ATARI.encode(batch)


# ---------------------------------------------------------------------------------------------------------------
# Decode refuses foreign and corrupted items, naming the item
# ---------------------------------------------------------------------------------------------------------------


def test_an_item_of_another_spec_is_rejected_naming_its_index():
    items = split_items(*DPG.encode(dpg_batch(5)))
    assert TransitionSpec.dpg(67, 21).validate_items(*join_items(items)) == 5  # an equal spec built elsewhere
    # Same item size, different spec (int32 actions): only the fingerprint tells them apart.
    foreign = TransitionSpec([FieldSpec(f.name, "i4" if f.name == "action" else f.dtype, f.shape) for f in DPG.fields])
    foreign_batch = {**dpg_batch(1), "action": np.zeros((1, 21), np.int32)}
    items[3] = split_items(*foreign.encode(foreign_batch))[0]
    with pytest.raises(ValueError, match=r"item 3: spec fingerprint"):
        DPG.decode(*join_items(items))


def test_items_of_the_wrong_size_are_rejected_naming_the_first_bad_index():
    items = split_items(*DPG.encode(dpg_batch(4)))
    with pytest.raises(ValueError, match=r"item 2: 631 bytes, expected exactly 632"):
        DPG.decode(*join_items(items[:2] + [items[2][:-1]] + items[3:]))
    atari_items = split_items(*ATARI.encode(atari_batch(3)))
    with pytest.raises(ValueError, match=r"item 1: "):
        ATARI.decode(*join_items([atari_items[0], atari_items[1][:-5], atari_items[2]]))
    with pytest.raises(ValueError, match=r"item 2: 3 trailing bytes"):
        ATARI.decode(*join_items(atari_items[:2] + [atari_items[2] + b"xyz"]))
    with pytest.raises(ValueError, match=r"item 0: "):
        ATARI.decode(*join_items([atari_items[0][:10]]))


@pytest.mark.parametrize("where", ["length", "block"])
def test_a_corrupted_lz4_block_is_rejected_naming_the_item(where):
    items = [bytearray(i) for i in split_items(*ATARI.encode(atari_batch(4, seed=2)))]
    hdr = 4 + ATARI.raw_item_bytes
    if where == "length":
        items[2][hdr : hdr + 4] = (10**9).to_bytes(4, "little")
    else:
        items[2][hdr + 4 : hdr + 40] = bytes(range(200, 236))  # garbage tokens inside the first block
    with pytest.raises(ValueError, match=r"item 2: field 'obs'"):
        ATARI.decode(*join_items([bytes(i) for i in items]))


def test_bad_offsets_are_rejected():
    data, offsets = DPG.encode(dpg_batch(3))
    with pytest.raises(ValueError, match="past"):
        DPG.decode(data, offsets + np.uint64(1))
    with pytest.raises(ValueError, match="decrease"):
        DPG.decode(data, np.array([0, 632, 0, 1896]))
    with pytest.raises(ValueError, match="non-negative"):
        DPG.decode(data, np.array([-632, 0]))
    with pytest.raises(ValueError, match="past"):
        DPG.decode(data[:632], np.array([2**64 - 1, 631], dtype=np.uint64))
    with pytest.raises(ValueError, match="integer"):
        DPG.decode(data, offsets.astype(np.float64))
    with pytest.raises(ValueError, match="uint8"):
        DPG.decode(data.view(np.int8), offsets)


def test_decode_accepts_bytes_and_a_buffer_with_room_left_after_the_items():
    data, offsets = DPG.encode(dpg_batch(3))
    a = DPG.decode(data.tobytes() + b"spare", offsets)
    b = DPG.decode(data, offsets)
    for name in DPG.names:
        np.testing.assert_array_equal(a[name], b[name])
