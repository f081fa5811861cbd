"""The native decoder (TransitionSpec.decode_into, BatchDecoder) against TransitionSpec.decode: equal arrays
for good items, the same ValueError message for bad ones (a differential test over random specs, batches and
corruptions), and its checks of the output arrays."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from apexrl.replay.wire.codec import BatchDecoder, FieldSpec, TransitionSpec

DTYPES = ["u1", "i2", "<i4", "<f4", "<f8", "?"]


@st.composite
def specs(draw: st.DrawFn) -> TransitionSpec:
    count = draw(st.integers(1, 4))
    fields = []
    for i in range(count):
        shape = tuple(draw(st.lists(st.integers(0, 5), max_size=3)))
        fields.append(FieldSpec(f"f{i}", draw(st.sampled_from(DTYPES)), shape, draw(st.booleans())))
    return TransitionSpec(fields)


def batch_for(spec: TransitionSpec, n: int, seed: int) -> dict[str, np.ndarray]:
    """Values from a few levels, so lz4 finds matches (and corrupting a match offset is an lz4 error)."""
    rng = np.random.default_rng(seed)
    out = {}
    for f in spec.fields:
        levels = rng.integers(0, 3, (n, *f.shape))
        out[f.name] = levels.astype(f.dtype) if f.dtype.kind != "b" else levels > 0
    return out


def outcome(fn):
    try:
        return "ok", fn()
    except ValueError as e:
        return "error", str(e)


@st.composite
def corruptions(draw: st.DrawFn, data: np.ndarray, offsets: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    data, offsets = data.copy(), offsets.copy()
    kind = draw(st.sampled_from(["none", "flip", "flip", "truncate", "grow", "swap", "foreign"]))
    if kind == "flip" and data.size:
        for _ in range(draw(st.integers(1, 3))):
            pos = draw(st.integers(0, data.size - 1))
            data[pos] ^= draw(st.integers(1, 255))
    elif kind in ("truncate", "grow") and offsets.size > 1:
        i = draw(st.integers(0, offsets.size - 2))
        items = [data[int(a) : int(b)].tobytes() for a, b in itertools.pairwise(offsets)]
        cut = draw(st.integers(1, 8))
        items[i] = (
            items[i][:-cut] if kind == "truncate" else items[i] + bytes(draw(st.binary(min_size=cut, max_size=cut)))
        )
        offsets = np.zeros(len(items) + 1, dtype=np.uint64)
        np.cumsum([len(x) for x in items], out=offsets[1:])
        data = np.frombuffer(b"".join(items), dtype=np.uint8).copy()
    elif kind == "swap" and offsets.size > 2:
        i = draw(st.integers(1, offsets.size - 2))
        offsets[i], offsets[i + 1] = offsets[i + 1], offsets[i]
    elif kind == "foreign" and offsets.size > 1:
        i = draw(st.integers(0, offsets.size - 2))
        data[int(offsets[i]) : int(offsets[i]) + 4] ^= np.uint8(0x5A)
    return data, offsets


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.data())
def test_native_decode_equals_python_decode_on_random_specs_and_corrupted_items(data: st.DataObject) -> None:
    spec = data.draw(specs())
    n = data.draw(st.integers(0, 6))
    encoded, offsets = spec.encode(batch_for(spec, n, data.draw(st.integers(0, 2**32 - 1))))
    buf, offs = data.draw(corruptions(encoded, offsets))
    spare = data.draw(st.integers(0, 2))
    out = spec.empty_batch(n + spare)
    for a in out.values():  # stale rows from an earlier batch must not leak into the result
        a.view(np.uint8)[...] = 0xAB
    want = outcome(lambda: spec.decode(buf, offs))
    got = outcome(lambda: spec.decode_into(buf, offs, out))
    event("decoded" if want[0] == "ok" else "lz4 error" if "lz4" in want[1] else "layout error")
    assert got[0] == want[0], (want, got)
    if want[0] == "error":
        assert got[1] == want[1]
        return
    for f in spec.fields:
        assert got[1][f.name].dtype == want[1][f.name].dtype
        assert got[1][f.name].shape == want[1][f.name].shape
        np.testing.assert_array_equal(got[1][f.name], want[1][f.name])
        assert np.shares_memory(got[1][f.name], out[f.name]) or got[1][f.name].size == 0


def _atari(n: int) -> tuple[TransitionSpec, np.ndarray, np.ndarray]:
    spec = TransitionSpec.atari(frames=2, height=12, width=12)
    rng = np.random.default_rng(1)
    frames = np.repeat(rng.integers(0, 256, (n, 2, 3, 12), dtype=np.uint8), 4, axis=2)
    batch = {
        "obs": frames,
        "action": np.arange(n, dtype=np.int32),
        "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": frames[:, ::-1].copy(),
    }
    data, offsets = spec.encode(batch)
    return spec, data, offsets


def test_decode_into_writes_the_given_arrays_and_returns_views_of_the_first_n_rows() -> None:
    spec, data, offsets = _atari(5)
    out = spec.empty_batch(8)
    got = spec.decode_into(data, offsets, out)
    want = spec.decode(data, offsets)
    for name in spec.names:
        assert got[name].base is out[name] or got[name] is out[name] or np.shares_memory(got[name], out[name])
        np.testing.assert_array_equal(got[name], want[name])
        np.testing.assert_array_equal(out[name][:5], want[name])


@pytest.mark.parametrize(
    ("mutate", "match"),
    [
        (lambda out: out.pop("obs"), "out must map exactly the fields"),
        (lambda out: out.update(extra=np.zeros(8)), "out must map exactly the fields"),
        (lambda out: out.update(obs=out["obs"][:3]), r"out\['obs'\]: expected .* shape \(>= 5"),
        (lambda out: out.update(action=out["action"].astype(np.int64)), r"out\['action'\]: expected .*int32"),
        (lambda out: out.update(obs=out["obs"][::2]), r"out\['obs'\]"),
        (lambda out: out.update(reward=out["reward"].reshape(8, 1)), r"out\['reward'\]"),
        (lambda out: out["next_obs"].setflags(write=False), r"out\['next_obs'\]: expected a writable"),
    ],
)
def test_decode_into_refuses_output_arrays_that_do_not_fit_the_spec(mutate, match) -> None:
    spec, data, offsets = _atari(5)
    out = spec.empty_batch(8)
    mutate(out)
    with pytest.raises(ValueError, match=match):
        spec.decode_into(data, offsets, out)


def test_batch_decoder_with_valid_leaves_out_a_corrupted_item_and_names_it() -> None:
    spec, data, offsets = _atari(4)
    decoder = BatchDecoder(spec, 4, valid=True)
    slot = decoder.allocate()
    assert {k: v.shape for k, v in slot.items()} == {k: (4, *spec[k].shape) for k in spec.names}

    class Raw:
        def __init__(self, d, o):
            self.data, self.offsets = d, o

    fields, bad, message = decoder.decode_into(Raw(data, offsets), slot)
    assert bad is None and message is None and np.shares_memory(fields["obs"], slot["obs"])
    broken = data.copy()
    broken[int(offsets[2])] ^= 1  # item 2's fingerprint
    fields, bad, message = decoder.decode_into(Raw(broken, offsets), slot)
    assert bad.tolist() == [False, False, True, False]
    assert message.startswith("item 2: spec fingerprint")
    np.testing.assert_array_equal(fields["action"], [0, 1, 3])
    with pytest.raises(ValueError, match="item 2: spec fingerprint"):
        BatchDecoder(spec, 4).decode_into(Raw(broken, offsets), slot)


def test_batch_decoder_refuses_bad_arguments() -> None:
    spec = TransitionSpec.atari(frames=2, height=12, width=12)
    with pytest.raises(TypeError, match="TransitionSpec"):
        BatchDecoder("atari", 4)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="batch_size"):
        BatchDecoder(spec, 0)


# ---------------------------------------------------------------------------- the sampler's decode threads


class RecordingClient:
    """A real ReplayClient that records the order in which it returned sampled batches."""

    def __init__(self, endpoint: str, order: list[int]):
        from apexrl.replay.client.replay_client import ReplayClient

        self._client = ReplayClient(endpoint, timeout=10)
        self.endpoint = endpoint
        self._order = order

    def sample(self, *args, **kwargs):
        batch = self._client.sample(*args, **kwargs)
        self._order.append(id(batch))
        return batch

    def interrupt(self) -> None:
        self._client.interrupt()

    def close(self) -> None:
        self._client.close()


def test_decode_threads_fill_a_bounded_ring_and_keep_the_sampled_order(start_server) -> None:
    import threading

    from apexrl.replay.client.replay_client import ReplayClient
    from apexrl.replay.client.sampler import PrefetchingSampler

    spec, data, offsets = _atari(64)
    want = spec.decode(data, offsets)
    server = start_server()
    with ReplayClient(server.endpoint, timeout=10) as client:
        keys = client.insert(np.ones(64), data=data, offsets=offsets)
    row = {k: i for i, k in enumerate(keys.tolist())}
    order: list[int] = []
    first_waits = threading.Event()
    second_done = threading.Event()
    native = BatchDecoder(spec, 8)

    class HoldFirst:
        """Decodes the first sampled batch only once another thread has decoded a later one."""

        def allocate(self):
            return native.allocate()

        def decode_into(self, raw, slot):
            if id(raw) == order[0]:
                first_waits.set()
                assert second_done.wait(30), "no other decode thread finished a later batch"
            out = native.decode_into(raw, slot)
            if id(raw) != order[0]:
                second_done.set()
            return {"fields": out, "keys": raw.keys.copy(), "raw": id(raw)}

    prefetch = 4
    with PrefetchingSampler(
        lambda: RecordingClient(server.endpoint, order), 8, prefetch=prefetch, decoder=HoldFirst(), decode_threads=3
    ) as sampler:
        seen = []
        for _ in range(30):
            batch = sampler.next(timeout=30)
            assert np.array_equal(batch.decoded["keys"], batch.keys)
            idx = [row[k] for k in batch.keys.tolist()]
            for name in spec.names:  # checked now: the slot is reused after the next next()
                np.testing.assert_array_equal(batch.decoded["fields"][name], want[name][idx])
            seen.append(batch.decoded["raw"])
        assert first_waits.is_set() and second_done.is_set()
        assert seen == order[:30]  # the consumer got them in the order they were sampled
        stats = sampler.stats()
        assert 2 <= stats["slots"] <= prefetch + 1
        assert stats["max_queued"] <= prefetch
    assert len(order) >= 30


def test_a_decode_thread_error_reaches_the_consumer_and_stops_every_thread(start_server) -> None:
    from apexrl.replay.client.replay_client import ReplayClient

    spec, data, offsets = _atari(16)
    broken = data.copy()
    broken[int(offsets[3])] ^= 1
    server = start_server()
    with ReplayClient(server.endpoint, timeout=10) as client:
        client.insert(np.ones(16), data=broken, offsets=offsets)
        sampler = client.sampler(16, prefetch=2, decoder=BatchDecoder(spec, 16), decode_threads=2)
        with pytest.raises(ValueError, match="spec fingerprint"):
            sampler.next(timeout=30)
        assert not any(t.is_alive() for t in sampler._threads) and not any(t.is_alive() for t in sampler._workers)
        with pytest.raises(StopIteration):
            sampler.next(timeout=1)
        sampler.close()


def test_sampler_refuses_bad_decode_arguments(start_server) -> None:
    from apexrl.replay.client.sampler import PrefetchingSampler

    def never():  # the factory is not reached: arguments are checked first
        raise AssertionError("connected")

    spec = TransitionSpec.atari(frames=2, height=12, width=12)
    with pytest.raises(ValueError, match="decode_threads"):
        PrefetchingSampler(never, 4, decode=spec.decode_batch, decode_threads=0)
    with pytest.raises(ValueError, match="not both"):
        PrefetchingSampler(never, 4, decode=spec.decode_batch, decoder=BatchDecoder(spec, 4))
    with pytest.raises(TypeError, match="allocate"):
        PrefetchingSampler(never, 4, decoder=spec)  # type: ignore[arg-type]


def test_decode_threads_flag_on_the_learner_and_on_apexrl_run(tmp_path, capsys) -> None:
    from apexrl.cli import learner as learner_cli
    from apexrl.cli.main import launch_plan

    base = ["--preset", "cartpole", "--replay", "tcp://127.0.0.1:5555", "--params-port", "0"]
    assert learner_cli.parse_config(base)[0].decode_threads == 1
    assert learner_cli.parse_config([*base, "--decode-threads", "3"])[0].decode_threads == 3
    with pytest.raises(SystemExit):
        learner_cli.parse_config([*base, "--decode-threads", "0"])
    run = ["--preset", "cartpole", "--run-dir", str(tmp_path / "run")]
    assert launch_plan(run)[0].learner.decode_threads == 1
    assert launch_plan([*run, "--decode-threads", "2"])[0].learner.decode_threads == 2
    assert launch_plan([*run, "--learner-args", "--decode-threads 4"])[0].learner.decode_threads == 4
    with pytest.raises(SystemExit):
        launch_plan([*run, "--decode-threads", "2", "--learner-args", "--decode-threads 4"])
    assert "not both" in capsys.readouterr().err


def test_empty_batch_allocates_each_field_and_refuses_a_bad_size() -> None:
    spec, _data, _offsets = _atari(3)
    out = spec.empty_batch(3)
    assert {k: (v.shape, v.dtype) for k, v in out.items()} == {
        f.name: ((3, *f.shape), f.dtype.newbyteorder("=")) for f in spec.fields
    }
    with pytest.raises(ValueError, match="n must be"):
        spec.empty_batch(-1)


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="page-locked memory needs a CUDA device")
def test_pinned_batches_are_page_locked_and_decode_like_the_others() -> None:
    import torch

    spec, data, offsets = _atari(4)
    slot = BatchDecoder(spec, 4, pin_memory=True).allocate()
    got = spec.decode_into(data, offsets, slot)
    for name, arr in spec.decode(data, offsets).items():
        np.testing.assert_array_equal(got[name], arr)
        assert torch.from_numpy(slot[name]).is_pinned()


def test_the_binding_refuses_items_outside_the_buffer_and_short_outputs() -> None:
    from apexrl import _core

    spec, data, offsets = _atari(2)
    spec.decode_into(data, offsets, spec.empty_batch(2))  # builds the layout
    layout = spec._layout
    starts = offsets[:-1].astype(np.int64)
    sizes = np.diff(offsets).astype(np.int64)
    outs = [spec.empty_batch(2)[f.name] for f in spec.fields]
    with pytest.raises(ValueError, match="item 1: outside the"):
        _core.decode_items(layout, data, starts, sizes + np.array([0, 1]), outs)
    with pytest.raises(ValueError, match="item 0: outside the"):
        _core.decode_items(layout, data, starts - np.array([1, 0]), sizes, outs)
    with pytest.raises(ValueError, match="'obs' holds"):
        _core.decode_items(layout, data, starts, sizes, [outs[0][:1], *outs[1:]])
    with pytest.raises(ValueError, match="expected 5 output arrays"):
        _core.decode_items(layout, data, starts, sizes, outs[:4])
    with pytest.raises(TypeError, match="uint8"):
        _core.decode_items(layout, data.astype(np.int8), starts, sizes, outs)
    with pytest.raises(TypeError, match="int64"):
        _core.decode_items(layout, data, starts.astype(np.int32), sizes, outs)
    _core.decode_items(layout, data, starts, sizes, outs)  # the same arguments, whole, decode
    np.testing.assert_array_equal(outs[0], spec.decode(data, offsets)["obs"])
