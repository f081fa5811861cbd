"""Ape-X DQN against numbers worked out by hand: dueling aggregation, double-Q n-step target, IS-weighted loss,
gradients, priorities; target-copy schedule; epsilon ladder; weights for actors; checkpoints."""

from __future__ import annotations

import dataclasses
import io
import math

import numpy as np
import pytest
import safetensors.torch
import torch
from torch import nn

from apexrl.agents import DQNConfig, DQNLearner, DQNPolicy, epsilon_ladder
from apexrl.agents.dqn import DuelingQNetwork
from apexrl.envs.base import EnvSpec
from apexrl.replay.wire.codec import TransitionSpec
from tests.torch_helpers import one_thread, set_linear  # noqa: F401 - one_thread is an autouse fixture

VEC = EnvSpec("test:vec2", (2,), np.dtype(np.float32), 2, None, 1, 100)
ATARI = EnvSpec("test:atari", (4, 84, 84), np.dtype(np.uint8), 6, None, 4, 27000)
SMALL = DQNConfig(hidden=(16,), target_update_period=3)
LINEAR = DQNConfig(hidden=())  # no torso: Q is linear in the observation, so it can be set by hand


def set_q(net: DuelingQNetwork, v_w, v_b, a_w, a_b) -> None:
    set_linear(net.value.layers[0], [v_w], [v_b])
    set_linear(net.advantage.layers[0], a_w, a_b)


def random_batch(rng: np.random.Generator, n: int = 8, env: EnvSpec = VEC) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, *env.obs_shape)).astype(np.float32),
        "action": rng.integers(0, env.num_actions, n).astype(np.int32),
        "reward": rng.standard_normal(n).astype(np.float32),
        "discount": np.full(n, 0.9, np.float32),
        "next_obs": rng.standard_normal((n, *env.obs_shape)).astype(np.float32),
    }


# -- dueling aggregation --------------------------------------------------------------------------------------


def test_dueling_aggregation_by_hand():
    net = DuelingQNetwork(nn.Identity(), 2, 3)
    set_q(net, [1, 2], 0.5, [[1, 0], [0, 1], [1, 1]], [0, 0, 3])
    q = net(torch.tensor([[1.0, 2.0], [0.0, 0.0]]))
    # s = (1, 2): V = 1 + 4 + 0.5 = 5.5, A = (1, 2, 6), mean 3 -> Q = 5.5 + (-2, -1, 3)
    # s = (0, 0): V = 0.5,               A = (0, 0, 3), mean 1 -> Q = 0.5 + (-1, -1, 2)
    torch.testing.assert_close(q, torch.tensor([[3.5, 4.5, 8.5], [-0.5, -0.5, 2.5]]), rtol=0, atol=1e-6)


# -- the update on a hand-made batch --------------------------------------------------------------------------
#
# Online net:  V = 0, A(s) = s            -> Q(s) = s - mean(s)        = ((a - b)/2, (b - a)/2) for s = (a, b)
# Target net:  V = a + b, A(s) = (2a, 0)  -> Q'(s) = (2a + b, b)
#
#  i  s      a  R      D      s'     Q(s,a)  argmax Q(s')  Q'(s', a*)  td_target          delta
#  1  (1,0)  0  1      0.5    (1,3)  0.5     1 (-1, 1)     3 (max 5)   1 + 0.5*3  = 2.5    2.0
#  2  (0,2)  1  -1.5   0      (5,0)  1       -             -           -1.5               -2.5
#  3  (2,2)  0  0.25   0.125  (2,0)  0       0 (1, -1)     4           0.25+0.125*4=0.75   0.75
#
# IS weights w = (1, 0.5, 0.25).

HAND_BATCH = {
    "obs": np.array([[1, 0], [0, 2], [2, 2]], np.float32),
    "action": np.array([0, 1, 0], np.int32),
    "reward": np.array([1, -1.5, 0.25], np.float32),
    "discount": np.array([0.5, 0, 0.125], np.float32),
    "next_obs": np.array([[1, 3], [5, 0], [2, 0]], np.float32),
}
HAND_WEIGHTS = np.array([1, 0.5, 0.25])


def hand_learner(**config) -> DQNLearner:
    learner = DQNLearner(VEC, dataclasses.replace(LINEAR, **config), seed=0)
    set_q(learner.q_net, [0, 0], 0, [[1, 0], [0, 1]], [0, 0])
    set_q(learner.target_q_net, [1, 1], 0, [[2, 0], [0, 0]], [0, 0])
    return learner


LOSS_CASES = [
    # squared: mean(w * delta^2 / 2) = (1*2 + 0.5*3.125 + 0.25*0.28125) / 3
    dict(name="squared (paper)", huber_delta=None, loss=(2 + 1.5625 + 0.0703125) / 3),
    # Huber(1): |d| - 1/2 beyond 1: (1.5, 2.0, 0.28125) weighted -> (1.5 + 1.0 + 0.0703125) / 3
    dict(name="huber 1", huber_delta=1.0, loss=(1.5 + 1.0 + 0.0703125) / 3),
]


@pytest.mark.parametrize("case", LOSS_CASES, ids=[c["name"] for c in LOSS_CASES])
def test_double_q_target_loss_and_priorities_by_hand(case):
    learner = hand_learner(huber_delta=case["huber_delta"], priority_eps=1e-3)
    priorities, metrics = learner.update(HAND_BATCH, HAND_WEIGHTS)
    np.testing.assert_allclose(priorities, [2.001, 2.501, 0.751], rtol=0, atol=1e-6)
    assert priorities.dtype == np.float64
    assert metrics["loss"] == pytest.approx(case["loss"], abs=1e-6)
    assert metrics["td_abs_mean"] == pytest.approx((2 + 2.5 + 0.75) / 3, abs=1e-6)
    assert metrics["q_mean"] == pytest.approx((0.5 + 1 + 0) / 3, abs=1e-6)
    assert set(metrics) == {"loss", "td_abs_mean", "q_mean", "grad_norm"}
    assert all(isinstance(v, float) for v in metrics.values())


def test_gradients_by_hand():
    """Squared loss: dL/dq_i = -w_i delta_i / 3 = (-2/3, 5/12, -1/16); dq/dV = 1, dq/dA_k = [k = a_i] - 1/2."""
    learner = hand_learner()
    _, metrics = learner.update(HAND_BATCH, HAND_WEIGHTS)
    value, adv = learner.q_net.value.layers[0], learner.q_net.advantage.layers[0]
    expected = {
        "value bias": (value.bias.grad, [-2 / 3 + 5 / 12 - 1 / 16]),
        "value weight": (value.weight.grad, [[-2 / 3 - 1 / 8, 5 / 6 - 1 / 8]]),
        "advantage bias": (adv.bias.grad, [-55 / 96, 55 / 96]),
        "advantage weight": (adv.weight.grad, [[-19 / 48, -23 / 48], [19 / 48, 23 / 48]]),
    }
    for name, (got, want) in expected.items():
        torch.testing.assert_close(got, torch.tensor(want), rtol=0, atol=1e-6, msg=name)
    sq = (15 / 48) ** 2 + (19 / 24) ** 2 + (17 / 24) ** 2 + 2 * (55 / 96) ** 2 + 2 * (19**2 + 23**2) / 48**2
    assert metrics["grad_norm"] == pytest.approx(math.sqrt(sq), abs=1e-5)


def test_is_weights_scale_the_loss_not_the_priorities():
    p1, m1 = hand_learner().update(HAND_BATCH, HAND_WEIGHTS)
    p2, m2 = hand_learner().update(HAND_BATCH, 2 * HAND_WEIGHTS)
    p3, m3 = hand_learner().update(HAND_BATCH, np.array([0.0, 0.0, 1.0]))
    assert m2["loss"] == pytest.approx(2 * m1["loss"], rel=1e-6)
    assert m3["loss"] == pytest.approx(0.5 * 0.75**2 / 3, abs=1e-7)  # only the third sample counts
    np.testing.assert_array_equal(p1, p2)
    np.testing.assert_array_equal(p1, p3)


def test_policy_initial_priorities_use_the_local_net_as_target():
    """Actor: Q(s', argmax Q(s')) from the one local net = max_a Q(s', a).
    delta = (1 + 0.5*1 - 0.5, -1.5 - 1, 0.25 + 0.125*1 - 0) = (1.0, -2.5, 0.375)."""
    policy = DQNPolicy(VEC, dataclasses.replace(LINEAR, priority_eps=1e-3), epsilon=0.0)
    set_q(policy.q_net, [0, 0], 0, [[1, 0], [0, 1]], [0, 0])
    np.testing.assert_allclose(policy.initial_priorities(HAND_BATCH), [1.001, 2.501, 0.376], rtol=0, atol=1e-6)


# -- schedule, clipping -----------------------------------------------------------------------------------------


def params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_target_copied_exactly_every_period():
    learner = DQNLearner(VEC, SMALL, seed=0)  # target_update_period = 3
    rng = np.random.default_rng(0)
    initial = params(learner.target_q_net)
    for step in range(1, 8):
        learner.update(random_batch(rng), np.ones(8))
        assert learner.steps == step
        online, target = params(learner.q_net), params(learner.target_q_net)
        if step % 3 == 0:
            assert same(target, online), step
            copied = target
        else:
            assert not same(target, online), step
            assert same(target, initial if step < 3 else copied), step


def test_gradient_norm_is_clipped():
    learner = DQNLearner(VEC, dataclasses.replace(SMALL, grad_clip_norm=0.5), seed=0)
    batch = random_batch(np.random.default_rng(1))
    batch["reward"] *= 1000
    _, metrics = learner.update(batch, np.ones(8))
    assert metrics["grad_norm"] > 100  # reported before clipping
    norms = [torch.linalg.vector_norm(p.grad) for p in learner.q_net.parameters()]
    clipped = torch.linalg.vector_norm(torch.stack(norms))
    assert clipped.item() == pytest.approx(0.5, rel=1e-4)


# -- epsilon ladder -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "i, n, expected",
    [(0, 8, 0.4), (7, 8, 0.4**8), (0, 1, 0.4), (1, 3, 0.4**4.5), (0, 360, 0.4), (359, 360, 0.4**8)],
)
def test_epsilon_ladder(i, n, expected):
    assert epsilon_ladder(i, n) == pytest.approx(expected, rel=1e-12)


def test_epsilon_ladder_parameters_and_errors():
    assert epsilon_ladder(1, 2, base=0.5, alpha=1.0) == pytest.approx(0.25)
    for i, n in [(-1, 4), (4, 4), (0, 0)]:
        with pytest.raises(ValueError):
            epsilon_ladder(i, n)


# -- acting, weights for actors ---------------------------------------------------------------------------------


def test_policy_loads_learner_weights_and_acts_greedily_the_same():
    learner = DQNLearner(VEC, SMALL, seed=1)
    learner.update(random_batch(np.random.default_rng(2)), np.ones(8))
    policy = DQNPolicy(VEC, SMALL, epsilon=0.5, seed=2)
    weights = learner.policy_state_dict()
    assert all(k.startswith("q_net/") and v.device.type == "cpu" and v.is_contiguous() for k, v in weights.items())
    policy.load_policy_state_dict(weights)
    obs = np.random.default_rng(3).standard_normal((64, 2)).astype(np.float32)
    greedy = learner.q_net(torch.from_numpy(obs)).argmax(dim=1).tolist()
    assert [policy.act(o, explore=False) for o in obs] == greedy
    assert len(set(greedy)) == 2  # not a trivial constant policy
    assert same(params(policy.q_net), params(learner.q_net))


def test_policy_epsilon():
    policy = DQNPolicy(VEC, SMALL, epsilon=1.0, seed=0)
    actions = [policy.act(np.zeros(2, np.float32)) for _ in range(200)]
    assert set(actions) == {0, 1}  # all random
    policy.epsilon = 0.0
    assert len({policy.act(np.zeros(2, np.float32)) for _ in range(20)}) == 1
    with pytest.raises(ValueError, match="epsilon"):
        DQNPolicy(VEC, SMALL, epsilon=1.5)


def test_wrong_weights_are_refused_naming_the_problem():
    learner, policy = DQNLearner(VEC, SMALL), DQNPolicy(VEC, SMALL, seed=3)
    before = params(policy.q_net)
    weights = learner.policy_state_dict()
    weights["q_net/extra.weight"] = weights.pop("q_net/value.layers.0.bias")
    weights["q_net/torso.layers.0.weight"] = torch.zeros(16, 3)
    with pytest.raises(ValueError) as err:
        policy.load_policy_state_dict(weights)
    msg = str(err.value)
    assert "missing ['q_net/value.layers.0.bias']" in msg
    assert "unexpected ['q_net/extra.weight']" in msg
    assert "q_net/torso.layers.0.weight: got torch.float32 (16, 3), expected torch.float32 (16, 2)" in msg
    assert same(params(policy.q_net), before)  # nothing loaded
    other = DQNLearner(VEC, dataclasses.replace(SMALL, hidden=(8,)))
    with pytest.raises(ValueError, match=r"got torch.float32 \(8, 2\), expected torch.float32 \(16, 2\)"):
        policy.load_policy_state_dict(other.policy_state_dict())


# -- checkpoints ---------------------------------------------------------------------------------------------------


def through_safetensors(d: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    return safetensors.torch.load(safetensors.torch.save(d))


def test_checkpoint_round_trip_continues_identically():
    rng = np.random.default_rng(0)
    batches = [random_batch(rng) for _ in range(5)]
    a = DQNLearner(VEC, SMALL, seed=0)
    for b in batches[:2]:  # target_update_period 3: the copy falls after the restore
        a.update(b, np.ones(8))
    ckpt = through_safetensors(a.state_dict())
    assert ckpt["steps"].dtype == torch.int64 and int(ckpt["steps"]) == 2
    assert {"optim/q_net/0/step", "optim/q_net/0/square_avg", "optim/q_net/0/grad_avg"} <= set(ckpt)
    b = DQNLearner(VEC, SMALL, seed=99)
    b.load_state_dict(ckpt)
    assert b.steps == 2
    for batch in batches[2:]:
        pa, ma = a.update(batch, np.ones(8))
        pb, mb = b.update(batch, np.ones(8))
        np.testing.assert_array_equal(pa, pb)
        assert ma == mb
    for net in ("q_net", "target_q_net"):
        for x, y in zip(params(getattr(a, net)), params(getattr(b, net))):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_checkpoint_before_any_update_and_refusals():
    fresh = DQNLearner(VEC, SMALL, seed=0).state_dict()
    assert not any(k.startswith("optim/") for k in fresh)
    DQNLearner(VEC, SMALL, seed=1).load_state_dict(through_safetensors(fresh))

    learner = DQNLearner(VEC, SMALL, seed=0)
    learner.update(random_batch(np.random.default_rng(0)), np.ones(8))
    ckpt = learner.state_dict()
    target = DQNLearner(VEC, SMALL, seed=1)
    broken = dict(ckpt)
    del broken["optim/q_net/0/grad_avg"]
    broken["target_q_net/value.layers.0.weight"] = torch.zeros(1, 3)
    with pytest.raises(ValueError) as err:
        target.load_state_dict(broken)
    assert "missing ['optim/q_net/0/grad_avg']" in str(err.value)
    assert "target_q_net/value.layers.0.weight: got torch.float32 (1, 3), expected torch.float32 (1, 16)" in str(
        err.value
    )
    assert target.steps == 0
    with pytest.raises(ValueError, match=r"unexpected \['rng'\]"):
        target.load_state_dict({**ckpt, "rng": torch.zeros(1)})
    with pytest.raises(ValueError, match="steps"):
        target.load_state_dict({**ckpt, "steps": torch.tensor(-1)})


def test_state_dict_is_safetensors_compatible():
    learner = DQNLearner(VEC, SMALL, seed=0)
    learner.update(random_batch(np.random.default_rng(0)), np.ones(8))
    sd = learner.state_dict()
    assert all(isinstance(v, torch.Tensor) and v.is_contiguous() and v.device.type == "cpu" for v in sd.values())
    assert len({v.untyped_storage().data_ptr() for v in sd.values()}) == len(sd)  # no shared storage
    safetensors.torch.save(sd)
    buf = io.BytesIO(safetensors.torch.save(learner.policy_state_dict()))
    assert buf.getbuffer().nbytes > 0


# -- Atari shapes, specs, config ----------------------------------------------------------------------------------


def test_atari_network_and_update_on_uint8_frames():
    learner = DQNLearner(ATARI, seed=0)
    assert learner.transition_spec == TransitionSpec.atari(4, 84, 84)
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 256, (2, 4, 84, 84), dtype=np.uint8)
    q = learner.q_net(torch.from_numpy(frames))
    assert q.shape == (2, 6) and q.dtype == torch.float32 and torch.isfinite(q).all()
    batch = {
        "obs": frames,
        "action": np.array([0, 5], np.int32),
        "reward": np.ones(2, np.float32),
        "discount": np.full(2, 0.99**3, np.float32),
        "next_obs": frames[::-1].copy(),
    }
    priorities, _ = learner.update(batch, np.ones(2))
    assert priorities.shape == (2,) and np.all(priorities > 0)
    policy = DQNPolicy(ATARI, epsilon=0.0)
    assert 0 <= policy.act(frames[0]) < 6


def test_vector_transition_spec():
    spec = DQNLearner(VEC, SMALL).transition_spec
    assert [(f.name, f.dtype.str, f.shape, f.compress) for f in spec.fields] == [
        ("obs", "<f4", (2,), False),
        ("action", "<i4", (), False),
        ("reward", "<f4", (), False),
        ("discount", "<f4", (), False),
        ("next_obs", "<f4", (2,), False),
    ]


def test_seeds_decide_the_weights():
    same_a, same_b, other = (DQNLearner(VEC, SMALL, seed=s) for s in (4, 4, 5))
    assert same(params(same_a.q_net), params(same_b.q_net))
    assert not same(params(same_a.q_net), params(other.q_net))


def test_config_validation_and_replace():
    assert DQNConfig().lr == 0.00025 / 4 and DQNConfig().target_update_period == 2500
    assert dataclasses.replace(DQNConfig(), lr=1e-3).lr == 1e-3
    for bad in [dict(n_step=0), dict(gamma=1.5), dict(lr=0.0), dict(hidden=(0,)), dict(huber_delta=-1.0)]:
        with pytest.raises(ValueError):
            DQNConfig(**bad)
    with pytest.raises(ValueError, match="discrete"):
        DQNLearner(EnvSpec("test:cont", (3,), np.dtype(np.float32), None, 1, 1, 10), SMALL)
