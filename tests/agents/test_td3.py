"""TD3 against hand-computed targets: the clipped double-Q target, the smoothing noise's clip, the delayed actor
and Polyak target updates, priorities from both critics, and checkpoints; then a few steps on gymnasium's
Pendulum."""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import pytest
import torch

from apexrl.agents import TD3Config, TD3Learner, TD3Policy, get_agent
from apexrl.agents.td3 import clipped_double_q_target, smoothed_target_action
from apexrl.envs.base import EnvSpec
from tests.torch_helpers import one_thread, set_linear  # noqa: F401 - one_thread is an autouse fixture

ONE_D = EnvSpec("test:1d", (1,), np.dtype(np.float32), None, 1, 1, 100)
TINY = TD3Config(actor_hidden=(1,), critic_hidden=(1,), target_noise=0.0, priority_eps=1e-6)


def set_constant_actor(actor, value: float) -> None:
    """pi(s) = tanh(0 * relu(0 * s) + atanh(value)) = value."""
    set_linear(actor.body.layers[0], [[0.0]], [0.0])
    set_linear(actor.body.layers[2], [[0.0]], [math.atanh(value)])


def set_q(mlp, slope: float, bias: float) -> None:
    """Q([s, a]) = slope * relu(a + 1) + bias = slope * (a + 1) + bias for a in [-1, 1]."""
    set_linear(mlp.layers[0], [[0.0, 1.0]], [1.0])
    set_linear(mlp.layers[2], [[slope]], [bias])


# Hand-made batch; the online critics are the constants Q_1 = 0.5, Q_2 = -0.5 and the target critics
#   Q'_1(s, a) = 2 (a + 1)        Q'_2(s, a) = (a + 1) + 1        so min(Q'_1, Q'_2) = 2a + 2 (a < 0), a + 2 (a >= 0)
# With the target actor at 0.9 and no smoothing noise a' = 0.9: Q'_1 = 3.8, Q'_2 = 2.9, min = 2.9.
#
#  i   R    D      y = R + D * 2.9     delta_1 = y - 0.5   delta_2 = y + 0.5   priority (|d1| + |d2|) / 2
#  1   1    0.5    2.45                1.95                2.95                2.45
#  2   0    0      0                   -0.5                0.5                 0.5
#  3   -1   0.25   -0.275              -0.775              0.225               0.5
HAND_BATCH = {
    "obs": np.array([[0.0], [1.0], [2.0]], np.float32),
    "action": np.array([[0.0], [0.5], [-0.5]], np.float32),
    "reward": np.array([1.0, 0.0, -1.0], np.float32),
    "discount": np.array([0.5, 0.0, 0.25], np.float32),
    "next_obs": np.array([[3.0], [-2.0], [0.0]], np.float32),
}
HAND_WEIGHTS = np.array([1.0, 0.5, 2.0])
HAND_D1 = np.array([1.95, -0.5, -0.775])
HAND_D2 = np.array([2.95, 0.5, 0.225])


def hand_learner(config: TD3Config = TINY, target_action: float = 0.9) -> TD3Learner:
    learner = TD3Learner(ONE_D, config, seed=0)
    set_constant_actor(learner.target_actor, target_action)
    set_q(learner.target_critic.q1, 2.0, 0.0)
    set_q(learner.target_critic.q2, 1.0, 1.0)
    set_linear(learner.critic.q1.layers[0], [[0.0, 0.0]], [0.0])
    set_linear(learner.critic.q1.layers[2], [[0.0]], [0.5])
    set_linear(learner.critic.q2.layers[0], [[0.0, 0.0]], [0.0])
    set_linear(learner.critic.q2.layers[2], [[0.0]], [-0.5])
    return learner


def test_clipped_double_q_target_loss_and_priorities_by_hand():
    learner = hand_learner()
    priorities, metrics = learner.update(HAND_BATCH, HAND_WEIGHTS)
    np.testing.assert_allclose(priorities, [2.45 + 1e-6, 0.5 + 1e-6, 0.5 + 1e-6], rtol=1e-6)
    loss = np.mean(HAND_WEIGHTS * 0.5 * (HAND_D1**2 + HAND_D2**2))
    assert metrics["critic_loss"] == pytest.approx(loss, rel=1e-6)
    assert metrics["q_mean"] == pytest.approx(0.5, rel=1e-6)
    assert metrics["td_abs_mean"] == pytest.approx(np.mean([2.45, 0.5, 0.5]), rel=1e-5)
    assert math.isnan(metrics["actor_loss"])  # no actor update at step 1 (policy_delay 2)


def test_the_target_is_the_minimum_of_the_two_target_critics():
    r, d = torch.tensor([1.0, 1.0]), torch.tensor([0.5, 0.5])
    y = clipped_double_q_target(r, d, torch.tensor([3.0, -2.0]), torch.tensor([4.0, -1.0]))
    assert y.tolist() == [2.5, 0.0]  # min 3 then min -2


def test_smoothing_noise_is_clipped_then_the_action():
    c = TD3Config(target_noise=0.2, target_noise_clip=0.5)
    target = torch.tensor([[0.9, 0.0, 0.0, -0.2]])
    normal = torch.tensor([[5.0, -5.0, 1.0, -2.0]])
    # noise 0.2 n = (1, -1, 0.2, -0.4) -> clipped (0.5, -0.5, 0.2, -0.4); actions (1.4 -> 1, -0.5, 0.2, -0.6)
    got = smoothed_target_action(target, normal, c)
    np.testing.assert_allclose(got.numpy(), [[1.0, -0.5, 0.2, -0.6]], rtol=1e-6)


@pytest.mark.parametrize("target_action", [0.25, 0.9])
def test_the_learner_smooths_the_target_action_with_clipped_noise(target_action):
    """Noise std 10 clipped to 0.5: nearly every draw lands on +-0.5; the target uses exactly those actions."""
    config = dataclasses.replace(TINY, target_noise=10.0, target_noise_clip=0.5)
    learner = hand_learner(config, target_action)
    replay = torch.Generator().set_state(learner.noise.get_state())
    normal = torch.randn((3, 1), generator=replay).numpy()[:, 0].astype(np.float64)
    a = np.clip(target_action + np.clip(10.0 * normal, -0.5, 0.5), -1.0, 1.0)
    assert np.sum(np.abs(a - target_action) == 0.5) + np.sum(a == 1.0) >= 2  # the clips are exercised
    q_min = np.minimum(2 * (a + 1), (a + 1) + 1)
    y = HAND_BATCH["reward"] + HAND_BATCH["discount"] * q_min
    priorities, _ = learner.update(HAND_BATCH, HAND_WEIGHTS)
    np.testing.assert_allclose(priorities, 0.5 * (np.abs(y - 0.5) + np.abs(y + 0.5)) + 1e-6, rtol=1e-5)


def _params(net) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def test_actor_and_targets_move_only_every_policy_delay_steps():
    config = TD3Config(actor_hidden=(8,), critic_hidden=(8,), policy_delay=2, tau=0.1)
    learner = TD3Learner(ONE_D, config, seed=3)
    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.standard_normal((16, 1)).astype(np.float32),
        "action": rng.uniform(-1, 1, (16, 1)).astype(np.float32),
        "reward": rng.standard_normal(16).astype(np.float32),
        "discount": np.full(16, 0.99, np.float32),
        "next_obs": rng.standard_normal((16, 1)).astype(np.float32),
    }
    w = np.ones(16)
    actor0, critic0 = _params(learner.actor), _params(learner.critic)
    t_actor0, t_critic0 = _params(learner.target_actor), _params(learner.target_critic)
    learner.update(batch, w)  # step 1: critic only
    assert all(torch.equal(a, b) for a, b in zip(actor0, _params(learner.actor)))
    assert not all(torch.equal(a, b) for a, b in zip(critic0, _params(learner.critic)))
    assert all(torch.equal(a, b) for a, b in zip(t_actor0, _params(learner.target_actor)))
    assert all(torch.equal(a, b) for a, b in zip(t_critic0, _params(learner.target_critic)))

    actor_before = TD3Learner(ONE_D, config, seed=3).actor
    actor_before.load_state_dict(learner.actor.state_dict())
    _, metrics = learner.update(batch, w)  # step 2: critic, actor, then Polyak
    assert not all(torch.equal(a, b) for a, b in zip(actor0, _params(learner.actor)))
    with torch.no_grad():
        obs = torch.as_tensor(batch["obs"])
        expected_loss = -learner.critic.first(obs, actor_before(obs)).mean().item()  # Q_1 of the updated critic
    assert metrics["actor_loss"] == pytest.approx(expected_loss, rel=1e-5)
    for t0, t, p in zip(t_actor0, _params(learner.target_actor), _params(learner.actor)):
        torch.testing.assert_close(t, 0.9 * t0 + 0.1 * p)
    for t0, t, p in zip(t_critic0, _params(learner.target_critic), _params(learner.critic)):
        torch.testing.assert_close(t, 0.9 * t0 + 0.1 * p)
    t_actor2 = _params(learner.target_actor)
    _, metrics3 = learner.update(batch, w)  # step 3: critic only again
    assert metrics3["actor_loss"] == metrics["actor_loss"]
    assert all(torch.equal(a, b) for a, b in zip(t_actor2, _params(learner.target_actor)))


def test_policy_noise_priorities_and_weights():
    learner = hand_learner()
    set_constant_actor(learner.actor, 0.9)
    set_constant_actor(learner.target_actor, 0.9)
    learner.target_critic.load_state_dict(learner.critic.state_dict())
    set_q(learner.critic.q1, 2.0, 0.0)
    set_q(learner.critic.q2, 1.0, 1.0)
    policy = TD3Policy(ONE_D, TINY, seed=1)
    policy.load_policy_state_dict(learner.policy_state_dict())
    assert policy.act(np.zeros(1, np.float32), explore=False)[0] == pytest.approx(0.9, rel=1e-6)
    noisy = np.array([policy.act(np.zeros(1, np.float32))[0] for _ in range(200)])
    assert np.all(noisy <= 1.0) and np.all(noisy >= -1.0) and noisy.std() > 0.02
    # local nets stand in for the targets, no smoothing: y = R + D min(3.8, 2.9); Q_1(s, a) = 2(a+1), Q_2 = a+2
    a = HAND_BATCH["action"][:, 0].astype(np.float64)
    y = HAND_BATCH["reward"] + HAND_BATCH["discount"] * 2.9
    expected = 0.5 * (np.abs(y - 2 * (a + 1)) + np.abs(y - (a + 2))) + 1e-6
    np.testing.assert_allclose(policy.initial_priorities(HAND_BATCH), expected, rtol=1e-5)
    with pytest.raises(ValueError, match="TD3 policy weights"):
        policy.load_policy_state_dict({k: v for k, v in learner.policy_state_dict().items() if "q2" not in k})


def test_checkpoint_round_trip_continues_identically():
    config = TD3Config(actor_hidden=(8,), critic_hidden=(8,))
    rng = np.random.default_rng(1)
    batch = {
        "obs": rng.standard_normal((8, 1)).astype(np.float32),
        "action": rng.uniform(-1, 1, (8, 1)).astype(np.float32),
        "reward": rng.standard_normal(8).astype(np.float32),
        "discount": np.full(8, 0.99, np.float32),
        "next_obs": rng.standard_normal((8, 1)).astype(np.float32),
    }
    a = TD3Learner(ONE_D, config, seed=0)
    for _ in range(3):
        a.update(batch, np.ones(8))
    b = TD3Learner(ONE_D, config, seed=9)
    b.load_state_dict(a.state_dict())
    b.noise.set_state(a.noise.get_state())
    assert b.steps == 3
    for _ in range(2):
        pa, _ = a.update(batch, np.ones(8))
        pb, _ = b.update(batch, np.ones(8))
        np.testing.assert_array_equal(pa, pb)
    with pytest.raises(ValueError, match="TD3 checkpoint"):
        b.load_state_dict({k: v for k, v in a.state_dict().items() if not k.startswith("target_actor")})


def test_td3_learns_pendulum_transitions_from_a_real_environment():
    """Transitions of gymnasium's Pendulum through the policy; updates stay finite and the critic fits them."""
    from apexrl.envs import env_spec, make_env

    spec = env_spec("gym:Pendulum-v1")
    agent = get_agent("td3")
    config = TD3Config(batch_size=64, actor_hidden=(32, 32), critic_hidden=(32, 32))
    learner = agent.make_learner(spec, config, torch.device("cpu"), 0)
    policy = agent.make_policy(spec, config, 0, 1, 0)
    policy.load_policy_state_dict(learner.policy_state_dict())
    env = make_env("gym:Pendulum-v1", seed=0)
    obs = env.reset()
    rows: dict[str, list] = {k: [] for k in ("obs", "action", "reward", "discount", "next_obs")}
    for _ in range(400):
        action = policy.act(obs)
        step = env.step(action)
        for k, v in zip(rows, (obs, action, step.reward, 0.0 if step.terminated else 0.99, step.obs)):
            rows[k].append(v)
        obs = env.reset() if step.terminated or step.truncated else step.obs
    batch = {k: np.asarray(v, np.float32) for k, v in rows.items()}
    first = None
    for i in range(60):
        idx = np.random.default_rng(i).integers(0, 400, 64)
        _, metrics = learner.update({k: v[idx] for k, v in batch.items()}, np.ones(64))
        assert all(math.isfinite(v) for k, v in metrics.items() if k != "actor_loss" or i > 0)
        first = metrics["critic_loss"] if first is None else first
    assert metrics["critic_loss"] < first
    assert np.all(np.isfinite(policy.initial_priorities(batch)))
