"""The recurrent actor's sequence and state bookkeeping (apexrl.apex.recurrent), through a real replay server.

A RecurrentActor of K MaskedCartPole environments runs against a server on 127.0.0.1 with a recording policy:
every step's input state, checked against the state the policy held before the step (zeroed where an episode
starts), and every observation's successor. Then every item the server holds is sampled back and each must be a
run of consecutive steps of one episode whose stored state (extras) is, bit for bit, the state the policy held
when it acted on the item's first step. The learner's SequenceSampler turns the same items into the batch
R2D2Learner.update trains on.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

from apexrl.agents.r2d2 import R2D2Config, R2D2Learner, check_sequences
from apexrl.apex.config import ActorConfig
from apexrl.apex.recurrent import RecurrentActor, SequenceSampler, sequence_batch
from apexrl.envs import env_spec
from apexrl.envs.masked import NAME as MASKED
from apexrl.replay.client import ReplayClient
from tests.torch_helpers import one_thread  # noqa: F401 - autouse fixture

CONFIG = R2D2Config(
    burn_in=2, trace_length=3, sequence_period=2, n_step=2, batch_size=16, lstm_size=8, hidden=(8,), stream_hidden=8
)  # items of 6 steps, a new one every 2


def _closed_port() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


class _Recorder:
    """Wraps a RecurrentPolicy's act_batch_state: checks each step's input state against the state held before
    it, and records per observation (bytes) the input state and the next observation of its environment."""

    def __init__(self, policy):
        self.policy, self.inner = policy, policy.act_batch_state
        self.state: dict[bytes, tuple[np.ndarray, np.ndarray]] = {}
        self.firsts: set[bytes] = set()
        self.last: list[bytes | None] = [None] * policy.num_envs
        self.next: dict[bytes, bytes] = {}

    def __call__(self, obs, first=None, explore=True):
        held_h, held_c = self.policy.state()
        actions, (h, c) = self.inner(obs, first, explore)
        first = np.asarray(first, bool)
        held_h[first], held_c[first] = 0.0, 0.0
        assert np.array_equal(h, held_h) and np.array_equal(c, held_c)
        for j, o in enumerate(obs):
            key = np.asarray(o).tobytes()
            assert key not in self.state  # continuous observations: none repeats
            self.state[key] = (h[j].copy(), c[j].copy())
            if first[j]:
                self.firsts.add(key)
            elif self.last[j] is not None:
                self.next[self.last[j]] = key
            self.last[j] = key
        return actions, (h, c)


def test_every_stored_state_is_the_state_the_policy_acted_from_bit_for_bit(start_server):
    server = start_server("--capacity", "100000")
    k = 3
    config = ActorConfig(
        agent="r2d2",
        env=MASKED,
        replay=server.endpoint,
        params=_closed_port(),
        envs_per_actor=k,
        agent_config=CONFIG,
        max_steps=k * 150,
        wait_for_params=0.0,
        params_timeout=0.2,
        params_every_frames=10**9,
    )
    actor = RecurrentActor(config)
    recorder = _Recorder(actor.policy)
    actor.policy.act_batch_state = recorder
    try:
        counters = actor.run()
    finally:
        actor.close()
    assert counters["steps"] == k * 150 and counters["episodes"] > 0
    assert counters["inserted"] > 0 and counters["not_inserted"] == 0
    length = CONFIG.min_sequence_length
    with ReplayClient(server.endpoint) as client:
        size = client.stats()["size"]
        assert size == counters["inserted"]
        seen: set[int] = set()
        checked = 0
        for _ in range(200):
            if len(seen) == size:
                break
            batch = client.sample(64)
            assert batch.sequences is not None and batch.sequences.valid.all()
            for i, key in enumerate(batch.keys.tolist()):
                seen.add(key)
                mask = batch.mask[i]
                n = int(mask.sum())
                assert 2 <= n <= length and mask[:n].all() and not mask[n:].any()
                obs = batch.fields["obs"][i]
                first = obs[0].tobytes()
                h, c = recorder.state[first]
                assert np.array_equal(batch.extras["state_h"][i], h)  # bit for bit, float32
                assert np.array_equal(batch.extras["state_c"][i], c)
                if first in recorder.firsts:
                    assert not h.any() and not c.any()
                # Consecutive steps of one episode: each acted-on observation's successor follows it.
                for t in range(n - 1):
                    here = obs[t].tobytes()
                    if here in recorder.next:
                        assert obs[t + 1].tobytes() == recorder.next[here]
                    else:  # the episode's last observation, never acted on, ends the item
                        assert t + 1 == n - 1 or batch.fields["discount"][i, t] == 0.0
                checked += 1
        assert len(seen) == size, "every stored item was sampled"
        # The learner's sampler hands R2D2Learner.update exactly its batch format, and it trains on it.
        spec = env_spec(MASKED)
        learner = R2D2Learner(spec, CONFIG)
        sampler = SequenceSampler(client, CONFIG.batch_size, 0.6, length, learner.invalid_items)
        got = sampler.next(timeout=5.0)
        fields, bad, _message, invalid, _why = got.decoded
        assert bad is None
        keep = np.ones(len(got.keys), bool) if invalid is None else ~invalid
        assert keep.any()
        fields = {name: v[keep] for name, v in fields.items()}
        assert check_sequences(fields, CONFIG, spec.obs_shape, got.weights[keep]) == (int(keep.sum()), length)
        priorities, metrics = learner.update(fields, got.weights[keep])
        assert priorities.shape == (int(keep.sum()),) and np.isfinite(priorities).all()
        assert metrics["valid_steps"] > 0
    assert checked > 0


def test_sequence_batch_pads_short_batches_and_masks_their_padding():
    n, t, length = 2, 3, 5
    fields = {
        "obs": np.arange(n * t * 2, dtype=np.float32).reshape(n, t, 2),
        "action": np.ones((n, t), np.int64),
        "reward": np.full((n, t), 2.0, np.float32),
        "discount": np.array([[1, 0, 0], [1, 1, 0]], np.float32),
    }
    mask = np.array([[True, True, False], [True, True, True]])
    extras = {"state_h": np.ones((n, 4), np.float32), "state_c": np.zeros((n, 4), np.float32)}
    b = sequence_batch(fields, mask, extras, length)
    assert b["obs"].shape == (n, length, 2) and b["action"].dtype == np.int32
    assert b["mask"].tolist() == [[True, True, False, False, False], [True, True, True, False, False]]
    assert b["discount"].tolist() == [[1, 0, 1, 1, 1], [1, 1, 0, 1, 1]]  # 1 where masked out
    np.testing.assert_array_equal(b["obs"][:, :t], fields["obs"])
    assert not b["obs"][:, t:].any() and not b["reward"][:, t:].any()
    np.testing.assert_array_equal(b["state_h"], extras["state_h"])
    with pytest.raises(KeyError):
        sequence_batch({k: v for k, v in fields.items() if k != "obs"}, mask, extras, length)
