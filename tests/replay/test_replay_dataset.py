"""ReplayDataset against a real replay server on 127.0.0.1: raw and decoded batches through a DataLoader, the
refusal of worker processes, and that ``import apexrl.replay`` stays free of torch until it is used."""

from __future__ import annotations

import itertools
import subprocess
import sys

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from apexrl.replay import ReplayClient, ReplayDataset, TransitionSpec


def _insert_atari(endpoint: str, n: int = 48):
    spec = TransitionSpec.atari(frames=2, height=12, width=12)
    rng = np.random.default_rng(0)
    frames = np.repeat(rng.integers(0, 256, (n, 2, 3, 12), dtype=np.uint8), 4, axis=2)
    batch = {
        "obs": frames,
        "action": np.arange(n, dtype=np.int32),
        "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": frames[:, ::-1].copy(),
    }
    data, offsets = spec.encode(batch)
    with ReplayClient(endpoint, timeout=10) as client:
        keys = client.insert(np.linspace(1.0, 2.0, n), data=data, offsets=offsets)
    return spec, batch, data, offsets, {k: i for i, k in enumerate(keys.tolist())}


def test_decoded_batches_through_a_dataloader_with_keys_and_is_weights(start_server) -> None:
    server = start_server()
    spec, batch, _, _, row = _insert_atari(server.endpoint)
    dataset = ReplayDataset(server.endpoint, 16, beta=0.6, decode=spec, prefetch=3, decode_threads=2)
    loader = DataLoader(dataset, batch_size=None, num_workers=0)
    kept = []
    for i, b in enumerate(loader):
        assert set(b) == {"keys", "weights", "probabilities", "fields"}
        assert b["keys"].shape == (16,) and b["weights"].dtype == torch.float32
        assert bool((b["weights"] > 0).all()) and bool((b["weights"] <= 1).all())
        idx = [row[k] for k in b["keys"].numpy().tolist()]
        kept.append((idx, b["fields"]))
        if i == 5:
            break
    for idx, fields in kept:  # every batch owns its arrays: earlier ones are intact
        assert set(fields) == set(spec.names)
        for name in spec.names:
            np.testing.assert_array_equal(fields[name].numpy(), batch[name][idx])


def test_raw_batches_are_the_inserted_items_and_offsets(start_server) -> None:
    server = start_server()
    _spec, _, data, offsets, row = _insert_atari(server.endpoint)
    items = [data[int(a) : int(b)].tobytes() for a, b in itertools.pairwise(offsets)]
    with ReplayClient(server.endpoint, timeout=10) as client:
        dataset = ReplayDataset(client, 8, prefetch=2)
        b = next(iter(DataLoader(dataset, batch_size=None)))
        assert set(b) == {"keys", "weights", "probabilities", "data", "offsets"}
        raw, offs = b["data"].numpy(), b["offsets"].numpy()
        assert offs.shape == (9,) and int(offs[0]) == 0 and int(offs[-1]) == raw.size
        for j, key in enumerate(b["keys"].numpy().tolist()):
            assert raw[int(offs[j]) : int(offs[j + 1])].tobytes() == items[row[key]]
        assert client.stats()["size"] == 48  # the given client still works: the dataset used its own


def test_a_decode_callable_runs_on_every_sampled_batch(start_server) -> None:
    server = start_server()
    _insert_atari(server.endpoint)
    it = iter(ReplayDataset(server.endpoint, 4, decode=lambda raw: len(raw), prefetch=1))
    assert next(it)["decoded"] == 4
    it.close()


def test_worker_processes_are_refused_with_the_reason(start_server) -> None:
    server = start_server()
    _insert_atari(server.endpoint)
    loader = DataLoader(ReplayDataset(server.endpoint, 4), batch_size=None, num_workers=1)
    with pytest.raises(RuntimeError, match=r"num_workers > 0.*batch_size=None, num_workers=0"):
        next(iter(loader))


def test_bad_arguments_are_refused() -> None:
    with pytest.raises(ValueError, match="batch_size"):
        ReplayDataset("tcp://127.0.0.1:1", 0)
    with pytest.raises(ValueError, match="prefetch"):
        ReplayDataset("tcp://127.0.0.1:1", 4, prefetch=0)
    with pytest.raises(ValueError, match="decode_threads"):
        ReplayDataset("tcp://127.0.0.1:1", 4, decode_threads=0)
    with pytest.raises(TypeError, match="decode must be"):
        ReplayDataset("tcp://127.0.0.1:1", 4, decode="atari")
    with pytest.raises(TypeError, match="endpoint_or_client"):
        ReplayDataset(5, 4)
    with pytest.raises(ValueError, match="twice"):
        ReplayDataset("tcp://127.0.0.1:1,tcp://127.0.0.1:1", 4)


def test_import_apexrl_replay_stays_free_of_torch_until_replay_dataset_is_used() -> None:
    code = (
        "import sys, apexrl.replay as r\n"
        "r.TransitionSpec, r.ReplayClient, r.connect\n"
        "from apexrl.replay.client import sampler\n"
        "from apexrl.replay.wire import codec\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
        "r.ReplayDataset\n"
        "assert 'torch' in sys.modules\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


def test_frame_stacks_stored_once_come_back_raw_with_their_chunks_and_decoded_whole(start_server) -> None:
    from apexrl.replay.wire import protocol as P
    from apexrl.replay.wire.frames import frame_codec

    spec = TransitionSpec.atari(frames=2, height=12, width=12)
    codec = frame_codec(spec)
    n, rng = 40, np.random.default_rng(1)
    frames = rng.integers(0, 256, (n + 2, 12, 12), dtype=np.uint8)  # one stream: obs t = frames t, t+1
    batch = {
        "obs": np.stack([frames[t : t + 2] for t in range(n)]),
        "action": np.arange(n, dtype=np.int32),
        "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": np.stack([frames[t + 1 : t + 3] for t in range(n)]),
    }
    batch["obs"][0, 0] = 0  # an episode start's zero padding
    data, offsets, chunks = codec.encode(batch)
    server = start_server("--spec", codec.item_spec.to_json())
    with ReplayClient(server.endpoint, timeout=10, spec=codec.item_spec) as client:
        row = {
            k: i for i, k in enumerate(client.insert(np.ones(n), data=data, offsets=offsets, chunks=chunks).tolist())
        }
        raw = next(iter(ReplayDataset(client, 8, prefetch=2)))
        assert {"item_chunks", "item_chunk_offsets", "chunk_data", "chunk_offsets"} <= set(raw)
        rebuilt = codec.decode(
            raw["data"],
            raw["offsets"],
            P.FrameChunks(
                raw["item_chunks"], raw["item_chunk_offsets"], raw["chunk_data"].tobytes(), raw["chunk_offsets"]
            ),
        )
        decoded = next(iter(ReplayDataset(client, 8, decode=spec, prefetch=2)))
        for out, keys in ((rebuilt, raw["keys"]), (decoded["fields"], decoded["keys"])):
            idx = [row[k] for k in keys.tolist()]
            for name in spec.names:
                np.testing.assert_array_equal(out[name], batch[name][idx])


def test_a_beta_schedule_sets_each_batchs_importance_weights_by_its_index(start_server) -> None:
    """beta(k) for the k-th batch: 0 (every weight 1) for the first two, then 1 (weight x probability is the
    smallest probability in the table, the same for every item)."""
    server = start_server()
    _insert_atari(server.endpoint)
    asked: list[int] = []

    def schedule(k: int) -> float:
        asked.append(k)
        return 0.0 if k < 2 else 1.0

    it = iter(ReplayDataset(server.endpoint, 8, beta=schedule, prefetch=2))
    batches = [next(it) for _ in range(5)]
    it.close()
    for b in batches[:2]:
        np.testing.assert_array_equal(b["weights"], np.ones(8, np.float32))
    for b in batches[2:]:
        assert not np.allclose(b["weights"], 1.0) or np.ptp(b["probabilities"]) == 0
        product = b["weights"].astype(np.float64) * b["probabilities"]
        np.testing.assert_allclose(product, product[0], rtol=1e-5)
    assert set(range(5)) <= set(asked)


def test_linear_beta_and_bad_betas() -> None:
    from apexrl.replay import linear_beta

    schedule = linear_beta(0.4, 1.0, steps=100)
    assert [schedule(k) for k in (0, 50, 100, 1000)] == pytest.approx([0.4, 0.7, 1.0, 1.0])
    assert linear_beta(0.4, 1.0, steps=100, offset=50)(0) == pytest.approx(0.7)  # a resumed learner
    with pytest.raises(ValueError, match="steps"):
        linear_beta(steps=0)
    with pytest.raises(ValueError, match="beta"):
        ReplayDataset("tcp://127.0.0.1:1", 4, beta=-1.0)
    with pytest.raises(ValueError, match="beta"):
        ReplayDataset("tcp://127.0.0.1:1", 4, beta=lambda k: float("nan"))


def test_a_schedule_that_turns_bad_raises_from_the_iterator(start_server) -> None:
    server = start_server()
    _insert_atari(server.endpoint)
    it = iter(ReplayDataset(server.endpoint, 4, beta=lambda k: 0.5 if k < 1 else -1.0, prefetch=1))
    with pytest.raises(ValueError, match="for batch 1"):
        for _ in range(5):
            next(it)
    it.close()
