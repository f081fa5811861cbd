"""SAC against hand-computed values: the tanh-corrected log-probability, the soft target with its entropy term,
the temperature's gradient (sign and value) and step, deterministic evaluation, checkpoints; then a few steps on
gymnasium's Pendulum."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apexrl.agents import SACConfig, SACLearner, SACPolicy, get_agent
from apexrl.agents.sac import sample, soft_target, squashed_log_prob, temperature_loss
from apexrl.envs.base import EnvSpec
from tests.torch_helpers import one_thread, set_linear  # noqa: F401 - one_thread is an autouse fixture

ONE_D = EnvSpec("test:1d", (1,), np.dtype(np.float32), None, 1, 1, 100)
TWO_A = EnvSpec("test:2a", (3,), np.dtype(np.float32), None, 2, 1, 100)
TINY = SACConfig(actor_hidden=(1,), critic_hidden=(1,), init_alpha=0.5)
HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def set_policy(actor, mu: float, log_std: float) -> None:
    """(mu, log_std)(s) = the constants given (the hidden layer's output is multiplied by 0)."""
    set_linear(actor.body.layers[0], [[0.0]], [0.0])
    set_linear(actor.body.layers[2], [[0.0], [0.0]], [mu, log_std])


def set_const_q(mlp, value: float) -> None:
    set_linear(mlp.layers[0], [[0.0, 0.0]], [0.0])
    set_linear(mlp.layers[2], [[0.0]], [value])


def test_squashed_log_prob_by_hand():
    # mu 0, std 1, u 0: log N(0; 0, 1) = -0.5 log 2 pi; tanh'(0) = 1, no correction
    zero = torch.zeros(1, 1)
    assert squashed_log_prob(zero, zero, zero).item() == pytest.approx(-HALF_LOG_2PI, rel=1e-6)
    # u = 1, mu = 0.5, std = 2: log N = -0.5 (0.25)^2 - log 2 - 0.5 log 2 pi; correction -log(1 - tanh(1)^2)
    u, mu, ls = torch.tensor([[1.0]]), torch.tensor([[0.5]]), torch.tensor([[math.log(2.0)]])
    hand = -0.5 * 0.25**2 - math.log(2.0) - HALF_LOG_2PI - math.log(1 - math.tanh(1.0) ** 2)
    assert squashed_log_prob(u, mu, ls).item() == pytest.approx(hand, rel=1e-6)
    # dimensions add; large |u| stays finite where log(1 - tanh(u)^2) would be log(0)
    u2 = torch.tensor([[0.3, -12.0]])
    mu2, ls2 = torch.tensor([[0.0, -11.0]]), torch.tensor([[0.0, 0.0]])
    hand2 = sum(
        -0.5 * (x - m) ** 2 - HALF_LOG_2PI - 2 * (math.log(2) - x - math.log1p(math.exp(-2 * x)))
        for x, m in ((0.3, 0.0), (-12.0, -11.0))
    )
    got = squashed_log_prob(u2, mu2, ls2).item()
    assert math.isfinite(got) and got == pytest.approx(hand2, rel=1e-6)


def test_squashed_log_prob_matches_torch_distributions():
    g = torch.Generator().manual_seed(0)
    mu, log_std = torch.randn(64, 3, generator=g), torch.randn(64, 3, generator=g).clamp(-2, 1)
    u = mu + log_std.exp() * torch.randn(64, 3, generator=g)
    # the naive formula in float64 (in float32, 1 - tanh(u)^2 loses its digits at |u| of a few)
    u64, mu64, std64 = u.double(), mu.double(), log_std.double().exp()
    ref = torch.distributions.Normal(mu64, std64).log_prob(u64).sum(1) - torch.log(1 - torch.tanh(u64) ** 2).sum(1)
    torch.testing.assert_close(squashed_log_prob(u, mu, log_std).double(), ref, rtol=1e-5, atol=1e-4)


def test_temperature_gradient_sign_and_value_by_hand():
    """d/d log_alpha of -mean(log_alpha (logp + H)) = -mean(logp + H)."""
    target = -2.0
    # entropy 1 (mean logp -1) above the target -2: gradient +1 > 0, descent lowers alpha
    log_alpha = torch.tensor(math.log(0.5), requires_grad=True)
    temperature_loss(log_alpha, torch.tensor([-0.5, -1.5]), target).backward()
    assert log_alpha.grad.item() == pytest.approx(-np.mean([-0.5 - 2.0, -1.5 - 2.0]))
    assert log_alpha.grad.item() > 0
    # entropy -3 (mean logp 3) below the target: gradient -1 < 0, descent raises alpha
    log_alpha = torch.tensor(0.0, requires_grad=True)
    temperature_loss(log_alpha, torch.tensor([4.0, 2.0]), target).backward()
    assert log_alpha.grad.item() == pytest.approx(-1.0)
    # logp is detached: nothing flows back into the policy
    logp = torch.tensor([1.0], requires_grad=True)
    temperature_loss(torch.tensor(0.3, requires_grad=True), logp, target).backward()
    assert logp.grad is None


@pytest.mark.parametrize(("target_entropy", "direction"), [(5.0, +1), (-50.0, -1)])
def test_the_learner_moves_alpha_towards_the_target_entropy(target_entropy, direction):
    """One Adam step of log_alpha: -lr * sign(gradient) on the first step; up when the policy's entropy is
    below the target, down when above. The gradient's value is recomputed from the same draws."""
    config = SACConfig(actor_hidden=(1,), critic_hidden=(1,), init_alpha=0.5, target_entropy=target_entropy)
    learner = SACLearner(ONE_D, config, seed=0)
    set_policy(learner.actor, 0.2, math.log(0.5))
    batch = {
        "obs": np.zeros((4, 1), np.float32),
        "action": np.zeros((4, 1), np.float32),
        "reward": np.zeros(4, np.float32),
        "discount": np.zeros(4, np.float32),
        "next_obs": np.zeros((4, 1), np.float32),
    }
    replay = torch.Generator().set_state(learner.noise.get_state())
    torch.randn((4, 1), generator=replay)  # the target's draw
    n = torch.randn((4, 1), generator=replay)  # the actor step's draw
    u = 0.2 + 0.5 * n
    logp = squashed_log_prob(u, torch.full_like(u, 0.2), torch.full_like(u, math.log(0.5)))
    grad = -(logp + target_entropy).mean().item()
    assert np.sign(grad) == -direction
    before = learner.temperature.log_alpha.item()
    _, metrics = learner.update(batch, np.ones(4))
    step = learner.temperature.log_alpha.item() - before
    assert step == pytest.approx(direction * config.alpha_lr, rel=1e-3)
    assert metrics["alpha"] == pytest.approx(math.exp(before + step), rel=1e-6)
    assert metrics["entropy"] == pytest.approx(-logp.mean().item(), rel=1e-5)


# Soft target by hand: the policy is mu = 0, log_std = -20 (std 2e-9), so a' = tanh(2e-9 n) ~ 0 and
#   logp' = -n^2 / 2 + 20 - log(2 pi) / 2 - 2 (log 2 - u - softplus(-2u)) with u ~ 0, the last term 0;
# target critics 2 and 3 (min 2), alpha 0.5, online critics 0.5 and -0.5:
#   y = R + D * (2 - 0.5 * logp'),  delta_1 = y - 0.5,  delta_2 = y + 0.5.
HAND_BATCH = {
    "obs": np.array([[0.0], [1.0], [2.0]], np.float32),
    "action": np.array([[0.0], [0.5], [-0.5]], np.float32),
    "reward": np.array([1.0, 0.0, -1.0], np.float32),
    "discount": np.array([0.5, 0.0, 0.25], np.float32),
    "next_obs": np.array([[3.0], [-2.0], [0.0]], np.float32),
}
HAND_WEIGHTS = np.array([1.0, 0.5, 2.0])


def test_soft_target_with_the_entropy_term_by_hand():
    learner = SACLearner(ONE_D, TINY, seed=0)
    set_policy(learner.actor, 0.0, -20.0)
    set_const_q(learner.target_critic.q1, 2.0)
    set_const_q(learner.target_critic.q2, 3.0)
    set_const_q(learner.critic.q1, 0.5)
    set_const_q(learner.critic.q2, -0.5)
    replay = torch.Generator().set_state(learner.noise.get_state())
    n = torch.randn((3, 1), generator=replay).numpy()[:, 0].astype(np.float64)
    logp_next = -0.5 * n**2 + 20.0 - HALF_LOG_2PI
    y = HAND_BATCH["reward"] + HAND_BATCH["discount"] * (2.0 - 0.5 * logp_next)
    d1, d2 = y - 0.5, y + 0.5
    priorities, metrics = learner.update(HAND_BATCH, HAND_WEIGHTS)
    np.testing.assert_allclose(priorities, 0.5 * (np.abs(d1) + np.abs(d2)) + 1e-6, rtol=1e-5)
    assert metrics["critic_loss"] == pytest.approx(np.mean(HAND_WEIGHTS * 0.5 * (d1**2 + d2**2)), rel=1e-5)
    assert metrics["q_mean"] == pytest.approx(0.5, rel=1e-6)


def test_soft_target_helper():
    y = soft_target(
        torch.tensor([1.0]),
        torch.tensor([0.5]),
        torch.tensor([4.0]),
        torch.tensor([3.0]),
        torch.tensor(0.2),
        torch.tensor([-5.0]),
    )
    assert y.item() == pytest.approx(1.0 + 0.5 * (3.0 + 1.0))


def test_actor_loss_and_targets():
    """actor_loss = mean(alpha logp - min Q) on the actor step's draw; target critics move by tau."""
    learner = SACLearner(TWO_A, SACConfig(actor_hidden=(8,), critic_hidden=(8,), tau=0.25), seed=2)
    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.standard_normal((8, 3)).astype(np.float32),
        "action": rng.uniform(-1, 1, (8, 2)).astype(np.float32),
        "reward": rng.standard_normal(8).astype(np.float32),
        "discount": np.full(8, 0.99, np.float32),
        "next_obs": rng.standard_normal((8, 3)).astype(np.float32),
    }
    target0 = [p.detach().clone() for p in learner.target_critic.parameters()]
    actor0 = SACLearner(TWO_A, learner.config, seed=2).actor
    replay = torch.Generator().set_state(learner.noise.get_state())
    torch.randn((8, 2), generator=replay)
    n = torch.randn((8, 2), generator=replay)
    _, metrics = learner.update(batch, np.ones(8))
    with torch.no_grad():
        obs = torch.as_tensor(batch["obs"])
        mu, log_std = actor0(obs)
        a, logp = sample(mu, log_std, n)
        # alpha at the step is the initial 1.0; the critics are the updated ones (the actor step comes after)
        expected = (1.0 * logp - torch.minimum(*learner.critic(obs, a))).mean().item()
    assert metrics["actor_loss"] == pytest.approx(expected, rel=1e-4)
    for t0, t, p in zip(target0, learner.target_critic.parameters(), learner.critic.parameters()):
        torch.testing.assert_close(t.detach(), 0.75 * t0 + 0.25 * p.detach())


def test_policy_samples_explore_and_evaluates_deterministically():
    learner = SACLearner(ONE_D, TINY, seed=0)
    set_policy(learner.actor, 0.7, math.log(0.3))
    policy = get_agent("sac").make_policy(ONE_D, TINY, 0, 1, 5)
    policy.load_policy_state_dict(learner.policy_state_dict())
    obs = np.zeros(1, np.float32)
    assert policy.act(obs, explore=False)[0] == pytest.approx(math.tanh(0.7), rel=1e-6)
    draws = np.array([policy.act(obs)[0] for _ in range(2000)])
    assert np.all(np.abs(draws) <= 1.0)
    # tanh of N(0.7, 0.3^2): its median is tanh(0.7)
    assert np.median(draws) == pytest.approx(math.tanh(0.7), abs=0.02) and draws.std() > 0.05
    batch_policy = get_agent("sac").make_batch_policy(ONE_D, TINY, [0, 1, 2], 3, 5)
    assert batch_policy.explorations == [1.0, 1.0, 1.0]
    assert len(batch_policy.act_batch(np.zeros((3, 1), np.float32))) == 3
    assert np.all(np.isfinite(policy.initial_priorities(HAND_BATCH)))
    with pytest.raises(ValueError, match="SAC policy weights"):
        policy.load_policy_state_dict({k: v for k, v in learner.policy_state_dict().items() if "temperature" not in k})


def test_checkpoint_round_trip_continues_identically():
    config = SACConfig(actor_hidden=(8,), critic_hidden=(8,))
    rng = np.random.default_rng(1)
    batch = {
        "obs": rng.standard_normal((8, 3)).astype(np.float32),
        "action": rng.uniform(-1, 1, (8, 2)).astype(np.float32),
        "reward": rng.standard_normal(8).astype(np.float32),
        "discount": np.full(8, 0.99, np.float32),
        "next_obs": rng.standard_normal((8, 3)).astype(np.float32),
    }
    a = SACLearner(TWO_A, config, seed=0)
    for _ in range(3):
        a.update(batch, np.ones(8))
    b = SACLearner(TWO_A, config, seed=7)
    b.load_state_dict(a.state_dict())
    b.noise.set_state(a.noise.get_state())
    assert b.steps == 3 and b.temperature.log_alpha.item() == a.temperature.log_alpha.item()
    for _ in range(2):
        pa, ma = a.update(batch, np.ones(8))
        pb, mb = b.update(batch, np.ones(8))
        np.testing.assert_array_equal(pa, pb)
        assert ma == mb
    with pytest.raises(ValueError, match="SAC checkpoint"):
        b.load_state_dict({k: v for k, v in a.state_dict().items() if not k.startswith("temperature/")})


def test_sac_learns_pendulum_transitions_from_a_real_environment():
    from apexrl.envs import env_spec, make_env

    spec = env_spec("gym:Pendulum-v1")
    config = SACConfig(batch_size=64, actor_hidden=(32, 32), critic_hidden=(32, 32))
    learner = get_agent("sac").make_learner(spec, config, torch.device("cpu"), 0)
    policy = SACPolicy(spec, config, seed=0)
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
    alphas = []
    for i in range(60):
        idx = np.random.default_rng(i).integers(0, 400, 64)
        _, metrics = learner.update({k: v[idx] for k, v in batch.items()}, np.ones(64))
        assert all(math.isfinite(v) for v in metrics.values())
        alphas.append(metrics["alpha"])
    # the initial policy's entropy (about log std 0 per dim, squashed) is above -|A| = -1: alpha falls
    assert alphas[-1] < alphas[0] < 1.0
