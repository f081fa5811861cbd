"""The on-policy data path and its estimators: GAE and V-trace against hand-computed values, the batch of popped
items, the policy lag, and a real queue on an in-process server whose items are each trained on once."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apexrl.agents.onpolicy.lag import policy_lag
from apexrl.agents.onpolicy.returns import gae, vtrace
from tests.torch_helpers import one_thread  # noqa: F401  (fixture)


def t(x, dtype=torch.float32):
    return torch.tensor(x, dtype=dtype)


# One item of 6 steps: an episode's last two actions (the second terminates), its last observation, an episode
# of one action cut by a time limit, its last observation, the next episode's first step (bootstrap only).
REWARD = [[1.0, 2.0, 0.0, 3.0, 0.0, 0.0]]
DISCOUNT = [[1.0, 0.0, 0.0, 1.0, 0.0, 1.0]]
VALUE = [[0.5, 1.0, 7.0, 2.0, 4.0, 9.0]]
TRAINED = [[True, True, False, True, False, False]]


def test_gae_by_hand_with_a_terminal_a_truncation_and_the_item_end():
    adv = gae(t(REWARD), t(DISCOUNT), t(VALUE), t(TRAINED, torch.bool), gamma=0.9, lam=0.5)
    # A1 = r1 - V1 (terminal: no bootstrap); A0 = (1 + 0.9 V1 - V0) + 0.9 * 0.5 * A1
    # A3 = r3 + 0.9 V4 - V3 (a time limit bootstraps from the last observation; nothing follows it)
    np.testing.assert_allclose(adv.numpy(), [[1.85, 1.0, 0.0, 4.6, 0.0, 0.0]], atol=1e-6)
    # A continuing item: its last trained step bootstraps from the item's last step, lambda carries it back.
    adv = gae(t([[1.0] * 6]), t([[1.0] * 6]), t([[0.0] * 5 + [10.0]]), t([[True] * 5 + [False]], torch.bool), 0.9, 0.5)
    want = [10.0]
    for _ in range(4):
        want.insert(0, 1.0 + 0.45 * want[0])
    np.testing.assert_allclose(adv.numpy(), [want + [0.0]], atol=1e-5)


def test_vtrace_on_policy_is_the_n_step_bootstrapped_return():
    """Espeholt et al. 2018, Remark 1: with rho_bar = c_bar = 1 and on-policy data, v_s is the n-step return."""
    rng = np.random.default_rng(0)
    reward, value = rng.normal(size=(1, 6)), rng.normal(size=(1, 6))
    trained = np.array([[True] * 5 + [False]])
    vs, pg = vtrace(t(reward), t(np.ones((1, 6))), t(value), t(trained, torch.bool), t(np.zeros((1, 6))), 0.9)
    for s in range(5):
        n_step = sum(0.9 ** (k - s) * reward[0, k] for k in range(s, 5)) + 0.9 ** (5 - s) * value[0, 5]
        assert vs[0, s].item() == pytest.approx(n_step, abs=1e-5)
        nxt = vs[0, s + 1].item() if s < 4 else value[0, 5]
        assert pg[0, s].item() == pytest.approx(reward[0, s] + 0.9 * nxt - value[0, s], abs=1e-5)
    # ... and equals GAE with lambda 1 plus the values
    adv = gae(t(reward), t(np.ones((1, 6))), t(value), t(trained, torch.bool), 0.9, 1.0)
    np.testing.assert_allclose(vs[0, :5].numpy(), (adv + t(value))[0, :5].numpy(), atol=1e-5)
    # terminals and truncations as GAE treats them
    vs, _ = vtrace(t(REWARD), t(DISCOUNT), t(VALUE), t(TRAINED, torch.bool), t(np.zeros((1, 6))), 0.9)
    adv = gae(t(REWARD), t(DISCOUNT), t(VALUE), t(TRAINED, torch.bool), 0.9, 1.0)
    np.testing.assert_allclose(
        vs.numpy()[t(TRAINED, torch.bool).numpy()], (adv + t(VALUE))[t(TRAINED, torch.bool)].numpy()
    )


def test_vtrace_off_policy_by_hand():
    # pi/mu = 2 then 0.5: rho_0 = c_0 = 1 (clipped), rho_1 = c_1 = 0.5
    log_rho = t([[math.log(2.0), math.log(0.5), 0.0]])
    vs, pg = vtrace(
        t([[1.0, 2.0, 0.0]]),
        t([[1.0, 1.0, 1.0]]),
        t([[1.0, 2.0, 3.0]]),
        t([[True, True, False]], torch.bool),
        log_rho,
        0.9,
    )
    # delta_1 = 0.5 (2 + 0.9*3 - 2) = 1.35: v_1 = 3.35; v_0 - V_0 = 1 (1 + 0.9*2 - 1) + 0.9 * 1 * 1.35 = 3.015
    np.testing.assert_allclose(vs.numpy(), [[4.015, 3.35, 0.0]], atol=1e-5)
    # pg_0 = 1 (1 + 0.9 v_1 - V_0) = 3.015; pg_1 = 0.5 (2 + 0.9 V_2 - V_1) = 1.35
    np.testing.assert_allclose(pg.numpy(), [[3.015, 1.35, 0.0]], atol=1e-5)


def test_estimators_refuse_mismatched_shapes_and_a_trained_last_step():
    with pytest.raises(ValueError, match="share one"):
        gae(t([[1.0, 2.0]]), t([[1.0]]), t([[1.0, 2.0]]), t([[True, False]], torch.bool), 0.9, 0.9)
    with pytest.raises(ValueError, match="only bootstraps"):
        gae(t([[1.0, 2.0]]), t([[1.0, 1.0]]), t([[1.0, 2.0]]), t([[True, True]], torch.bool), 0.9, 0.9)


def test_policy_lag_over_trained_steps():
    versions = np.array([[3, 3, 0], [5, 5, 0]])
    trained = np.array([[True, True, False], [True, False, False]])
    assert policy_lag(7, versions, trained) == {"policy_lag_mean": pytest.approx(10 / 3), "policy_lag_max": 4.0}
    assert policy_lag(7, versions, np.zeros_like(trained)) == {"policy_lag_mean": 0.0, "policy_lag_max": 0.0}


def test_the_metrics_row_keeps_the_largest_lag_of_its_interval():
    from apexrl.apex.metrics import Mean

    m = Mean()
    m.add({"policy_lag_mean": 1.0, "policy_lag_max": 3.0})
    m.add({"policy_lag_mean": 2.0, "policy_lag_max": 1.0})
    assert m.pop() == {"policy_lag_mean": 1.5, "policy_lag_max": 3.0}
    assert m.pop() == {}


def test_the_batch_trains_each_action_and_no_last_observation():
    from apexrl.agents.onpolicy.replay import onpolicy_batch
    from apexrl.agents.ppo import PPOConfig

    config = PPOConfig(unroll=5)
    start = np.array([[True, False, False, True, False, True]])
    fields = {
        "obs": np.zeros((1, 6, 2), np.float32),
        "action": np.zeros((1, 6), np.int64),
        "reward": np.array(REWARD, np.float32),
        "discount": np.array(DISCOUNT, np.float32),
        "start_of_episode": start,
        "extras": {"logp": np.zeros((1, 6), np.float32), "version": np.zeros((1, 6), np.int64)},
    }
    # step 2 and step 4 are last observations (an episode starts after them), step 5 the item's end
    b = onpolicy_batch(fields, np.ones((1, 6), bool), {}, config)
    assert b["trained"].tolist() == TRAINED
    assert set(b) == {"obs", "action", "reward", "discount", "trained", "logp", "version"}
    with pytest.raises(KeyError, match="logp and version"):
        onpolicy_batch({**fields, "extras": {"logp": fields["extras"]["logp"]}}, np.ones((1, 6), bool), {}, config)
    with pytest.raises(ValueError, match="unroll"):
        onpolicy_batch(fields, np.ones((1, 6), bool), {}, PPOConfig(unroll=4))


def test_a_popped_item_is_never_trained_on_twice():
    """A real queue on an in-process server: three environments' streams (episodes ending by termination and by
    time limit) through the agent's adders; the learner's sampler pops them into PPO updates. Every action of
    every item is trained on exactly once, consecutive items share only their bootstrap step, and the queue
    ends empty."""
    from apexrl.agents.onpolicy.replay import QUEUE_TABLE, make_adders, onpolicy_batch
    from apexrl.agents.ppo import PPOConfig, PPOLearner
    from apexrl.apex.sequences import SequenceSampler
    from apexrl.envs import env_spec
    from apexrl.replay import ReplayClient, ReplayServer, ServerConfig
    from apexrl.replay.client.replay_client import ServerTimeoutError

    config = PPOConfig(unroll=4, batch_size=3, critic_iterations=2)
    spec = env_spec("gym:CartPole-v1")
    rng = np.random.default_rng(1)
    with ReplayServer(ServerConfig(port=0, tables=[QUEUE_TABLE])) as srv, ReplayClient(srv.endpoint, timeout=10) as c:
        adders = make_adders(c, "default", spec, config, 3)
        written: list[list[int]] = [[] for _ in adders]
        for j, adder in enumerate(adders):
            adder.add_first(rng.normal(size=4).astype(np.float32))
            for k in range(40):
                sid = 1000 * j + k
                written[j].append(sid)
                end = rng.random() < 0.15
                terminated = end and rng.random() < 0.5
                extras = {"logp": np.float32(-0.69), "version": np.int64(0), "id": np.int64(sid)}
                obs = rng.normal(size=4).astype(np.float32)
                adder.add(int(rng.integers(2)), 1.0, obs, terminated, end and not terminated, extras=extras)
                if end:
                    adder.add_first(rng.normal(size=4).astype(np.float32))
            adder.flush(timeout=10)
        learner = PPOLearner(spec, config, torch.device("cpu"), 0)
        sampler = SequenceSampler(
            c, config.batch_size, 1.0, lambda f, m, e: onpolicy_batch(f, m, e, config), learner.invalid_items
        )
        trained: list[int] = []
        while c.tables()["default"]["size"]:
            got = sampler.next(timeout=5.0)
            fields, bad, _, invalid, _ = got.decoded
            assert bad is None and invalid is None
            trained += fields["id"][fields["trained"]].tolist()
            _, metrics = learner.update(fields, got.weights)
            assert all(np.isfinite(v) for v in metrics.values())
        assert learner.steps >= 4
        assert len(trained) == len(set(trained))  # never twice
        for j in range(3):  # each stream's actions up to its last item, none missing
            mine = sorted(i for i in trained if i // 1000 == j)
            assert len(mine) >= 30 and mine == written[j][: len(mine)]
        with pytest.raises(ServerTimeoutError, match="the queue is empty"):
            c.sample(1, timeout=0.05, table="default")
        for adder in adders:
            adder.close()


def test_the_queue_reader_pops_only_whole_batches():
    """A queue hands out fewer items than asked when it holds fewer; the learner's queue reader waits for a whole
    batch instead (so a synchronous round is trained in one update), and times out while there is none."""
    from apexrl.agents.onpolicy.replay import QUEUE_TABLE, make_adders, onpolicy_batch
    from apexrl.agents.ppo import PPOConfig
    from apexrl.apex.sequences import SequenceSampler
    from apexrl.envs import env_spec
    from apexrl.replay import ReplayClient, ReplayServer, ServerConfig

    config = PPOConfig(unroll=2, batch_size=3)
    with ReplayServer(ServerConfig(port=0, tables=[QUEUE_TABLE])) as srv, ReplayClient(srv.endpoint, timeout=10) as c:
        sampler = SequenceSampler(
            c, 3, 1.0, lambda f, m, e: onpolicy_batch(f, m, e, config), lambda b: (None, None), whole=True
        )
        (adder,) = make_adders(c, "default", env_spec("gym:CartPole-v1"), config, 1)
        adder.add_first(np.zeros(4, np.float32))
        extras = {"logp": np.float32(0.0), "version": np.int64(0)}

        def steps(n):
            for _ in range(n):
                adder.add(0, 1.0, np.zeros(4, np.float32), False, False, extras=extras)
            adder.flush(timeout=10)

        steps(6)  # items of 3 steps once 3, 5 steps are in the stream: 2 of the 3
        assert c.tables()["default"]["size"] == 2
        with pytest.raises(TimeoutError, match="fewer than 3 items"):
            sampler.next(timeout=0.2)
        assert c.tables()["default"]["size"] == 2  # nothing popped
        steps(2)
        got = sampler.next(timeout=5.0)
        assert len(got.keys) == 3 and c.tables()["default"]["size"] == 0
        adder.close()
