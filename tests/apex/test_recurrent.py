"""The actor's sequence path and R2D2's state bookkeeping (apexrl.apex.actor, apexrl.agents.r2d2.replay), through
a real replay server.

An R2D2 Actor of K MaskedCartPole environments runs against a server on 127.0.0.1 with a recording policy:
every step's input state, checked against the state the policy held before the step (zeroed where an episode
starts), and every observation's successor. Then every item the server holds is sampled back and each must be a
run of consecutive steps of one episode whose stored state (extras) is, bit for bit, the state the policy held
when it acted on the item's first step. The learner's readers (SequenceSampler; the prefetching sampler with a
SequenceDecoder, whose ring reuses its batches) turn the same items into the batch R2D2Learner.update trains on.
"""

from __future__ import annotations

import socket

import numpy as np
import pytest

from apexrl.agents.r2d2 import R2D2Config, R2D2Learner, check_sequences
from apexrl.agents.r2d2.replay import sequence_batch
from apexrl.apex.actor import Actor
from apexrl.apex.config import ActorConfig
from apexrl.apex.sequences import SequenceDecoder, SequenceSampler
from apexrl.envs import env_spec
from apexrl.envs.masked import NAME as MASKED
from apexrl.replay.client.replay_client import ReplayClient
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
    actor = Actor(config)
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
            seen.update(batch.keys.tolist())
            extras = batch.extras
            assert extras is not None and batch.mask is not None
            f = batch.fields
            checked += _check_items(recorder, f["obs"], batch.mask, extras["state_h"], extras["state_c"], f["discount"])
        assert len(seen) == size, "every stored item was sampled"
        # The learner's sampler hands R2D2Learner.update exactly its batch format, and it trains on it.
        spec = env_spec(MASKED)
        learner = R2D2Learner(spec, CONFIG)
        sampler = SequenceSampler(
            client, CONFIG.batch_size, 0.6, lambda f, m, e: sequence_batch(f, m, e, length), learner.invalid_items
        )
        got = sampler.next(timeout=5.0)
        fields, bad, _message, invalid, _why = got.decoded
        assert bad is None and invalid is None  # every item decodes and has a trained step
        assert check_sequences(fields, CONFIG, spec.obs_shape, got.weights) == (CONFIG.batch_size, length)
        priorities, metrics = learner.update(fields, got.weights)
        assert priorities.shape == (CONFIG.batch_size,) and np.isfinite(priorities).all()
        assert metrics["valid_steps"] > 0
        # The run's reader: prefetched, decoded in threads into a ring of reused batches. Items of different
        # lengths follow each other in a slot: each batch must still be its own items, zero past their masks.
        decoder = SequenceDecoder(lambda f, m, e: sequence_batch(f, m, e, length), learner.invalid_items)
        with client.sampler(CONFIG.batch_size, 0.6, prefetch=2, decoder=decoder, decode_threads=2) as prefetched:
            held = []
            for _ in range(8):
                got = prefetched.next(timeout=30.0)
                fields, bad, _message, invalid, _why = got.decoded
                assert bad is None and invalid is None
                assert check_sequences(fields, CONFIG, spec.obs_shape, got.weights) == (CONFIG.batch_size, length)
                m = fields["mask"]
                assert not fields["obs"][~m].any()  # a slot's earlier, longer items leave nothing behind
                f = fields
                checked += _check_items(recorder, f["obs"], m, f["state_h"], f["state_c"], f["discount"])
                held.append(fields["obs"])
            assert prefetched.counters()["slots"] <= 3  # prefetch + 1: the ring's batches were reused
            assert len({id(a) for a in held}) <= 3
    assert checked > 0


def _check_items(recorder: _Recorder, obs_batch, mask_batch, state_h, state_c, discount) -> int:
    """Each item is a run of consecutive steps of one episode with at least one trained step, stored with the
    state the policy acted from on its first step, bit for bit; returns how many were checked."""
    length = CONFIG.min_sequence_length
    for i in range(len(obs_batch)):
        mask = mask_batch[i]
        n = int(mask.sum())
        # Only items with a trained step are made: burn-in + 2 steps at least.
        assert CONFIG.burn_in + 2 <= n <= length and mask[:n].all() and not mask[n:].any()
        obs = obs_batch[i]
        first = obs[0].tobytes()
        h, c = recorder.state[first]
        assert np.array_equal(state_h[i], h)  # bit for bit, float32
        assert np.array_equal(state_c[i], c)
        if first in recorder.firsts:
            assert not h.any() and not c.any()
        # Consecutive steps of one episode: each acted-on observation's successor follows it.
        for t in range(n - 1):
            here = obs[t].tobytes()
            if here in recorder.next:
                assert obs[t + 1].tobytes() == recorder.next[here]
            else:  # the episode's last observation, never acted on, ends the item
                assert t + 1 == n - 1 or discount[i, t] == 0.0
    return len(obs_batch)


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


def test_items_without_a_trained_step_are_not_made():
    from apexrl.agents.r2d2.replay import TrainableItemsClient
    from apexrl.replay.adders import SequenceAdder

    class Writer:
        def __init__(self):
            self.items: list[int] = []

        def append(self, step):
            pass

        def create_item(self, table, num_timesteps, priority, extras=None):
            self.items.append(num_timesteps)

        def end_episode(self):
            pass

    class Client:
        def writer(self, max_sequence_length):
            self.made = Writer()
            return self.made

    client = Client()
    source = TrainableItemsClient(client, CONFIG.burn_in + 2)  # items of at least 4 steps
    adder = SequenceAdder(source, "default", CONFIG.min_sequence_length, CONFIG.sequence_period, False)
    obs = np.zeros(2, np.float32)
    for length in (1, 2, 3, 7):  # episodes of 2, 3, 4 and 8 steps (the last observation a step of its own)
        adder.add_first(obs)
        for t in range(length):
            adder.add(0, 1.0, obs, t == length - 1, False, extras={"h": np.zeros(1)})
    # The adder's items: [2], [3], [4], [6, 6 (steps 2..7)]; the 2- and 3-step ones have no trained step.
    assert client.made.items == [4, 6, 6] and source.made is not None and source.made.skipped == 2


def test_the_actor_survives_its_server_going_away_and_stops_within_its_deadlines(start_server):
    import threading

    from tests.helpers import wait_until

    server = start_server("--capacity", "100000")
    config = ActorConfig(
        agent="r2d2",
        env=MASKED,
        replay=server.endpoint,
        params=_closed_port(),
        envs_per_actor=2,
        agent_config=CONFIG,
        wait_for_params=0.0,
        params_timeout=0.2,
        params_every_frames=10**9,
        replay_timeout=0.5,
    )
    actor = Actor(config)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(actor.run()), daemon=True)
    thread.start()
    try:
        wait_until(lambda: actor.counters["inserted"] > 0, 60, "sequences stored")
        server.proc.kill()
        server.proc.wait(30)
        # Its writers give up on the gone server (each after its own retries), drop those episodes and go on.
        wait_until(lambda: actor.counters["insert_retries"] > 0, 60, "a writer failure handled")
        steps = actor.counters["steps"]
        wait_until(lambda: actor.counters["steps"] > steps, 60, "stepping on after the failure")
    finally:
        actor.stop()
        thread.join(120)
        stopped = not thread.is_alive()
        actor.close()
    assert stopped, "the actor did not stop"
    assert result["steps"] > 0 and result["inserted"] > 0


def test_an_actor_whose_agent_reads_one_queue_refuses_several_replay_servers_and_says_why():
    """R2D2 writes over any number of servers (each writer stays on one); an on-policy agent's path names one
    server (``ReplayPath.one_server``: its queue is per server): a set of endpoints is refused at start, as
    `apexrl run` refuses --replay-servers > 1 for it, naming the flag to use."""
    config = ActorConfig(
        agent="ppo",
        env="gym:CartPole-v1",
        replay=f"{_closed_port()},{_closed_port()}",
        params=_closed_port(),
        wait_for_params=0.0,
        params_timeout=0.2,
        replay_timeout=0.5,
    )
    with pytest.raises(ValueError, match=r"an on-policy agent reads one queue.*run it with --replay-servers 1"):
        Actor(config)
