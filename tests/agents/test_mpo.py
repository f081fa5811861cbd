"""MPO and DMPO against hand-computed values: the temperature's dual and its gradient (autograd against the closed
form in numpy), the KL between diagonal Gaussians, the weighted M-step loss and the whole policy loss on a tiny
batch, the multipliers' updates and their projection, the n-step targets and priorities of both critics, the
periodic target copies, weights and checkpoints; then a bandit on which the policy's mean moves to the best
action."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from apexrl.agents import get_agent
from apexrl.agents.mpo import DMPOConfig, DMPOLearner, DMPOPolicy, MPOConfig, MPOLearner, MPOPolicy
from apexrl.agents.mpo.loss import (
    MIN_LOG_DUAL,
    Duals,
    gaussian_kl,
    mpo_loss,
    nonparametric_kl,
    positive,
    temperature_dual,
    weighted_nll,
)
from apexrl.envs.base import EnvSpec
from tests.torch_helpers import one_thread, set_linear  # noqa: F401 - one_thread is an autouse fixture

ONE_D = EnvSpec("test:1d", (1,), np.dtype(np.float32), None, 1, 1, 100)
TWO_A = EnvSpec("test:2a", (3,), np.dtype(np.float32), None, 2, 1, 100)
TINY = dict(actor_hidden=(4,), critic_hidden=(4, 4), num_samples=5)


def softplus(x):
    return np.log1p(np.exp(x))


def np_log_normal(x, mean, std):
    return -0.5 * ((x - mean) / std) ** 2 - np.log(std) - 0.5 * np.log(2 * np.pi)


def np_kl(mp, sp, mq, sq):
    return np.log(sq / sp) + (sp**2 + (mp - mq) ** 2) / (2 * sq**2) - 0.5


# -- the E-step -------------------------------------------------------------------------------------------------

Q = np.array([[1.0, 0.5], [2.0, -1.0], [0.0, 3.0]])  # N = 3 actions, B = 2 states


def test_temperature_dual_and_its_gradient_against_the_closed_form():
    eta, eps = 0.7, 0.1
    tempered = Q / eta
    lme = np.log(np.exp(tempered).mean(axis=0))  # log mean_j exp(Q_j / eta), per state
    w = np.exp(tempered) / np.exp(tempered).sum(axis=0)
    g = eta * (eps + lme.mean())
    dg = eps + np.mean(lme - (w * Q).sum(axis=0) / eta)

    temperature = torch.tensor(eta, dtype=torch.float64, requires_grad=True)
    weights, loss = temperature_dual(torch.tensor(Q), eps, temperature)
    loss.backward()
    np.testing.assert_allclose(weights.numpy(), w, rtol=1e-12)
    assert loss.item() == pytest.approx(g, rel=1e-12)
    assert temperature.grad.item() == pytest.approx(dg, rel=1e-10)
    # the gradient is epsilon minus the E-step's KL(q || pi_old) = sum_j w_j log(N w_j)
    kl = (w * np.log(3 * w)).sum(axis=0).mean()
    assert dg == pytest.approx(eps - kl, rel=1e-12)
    assert nonparametric_kl(weights).mean().item() == pytest.approx(kl, rel=1e-6)
    # no gradient reaches the values
    q = torch.tensor(Q, requires_grad=True)
    temperature_dual(q, eps, torch.tensor(eta, dtype=torch.float64, requires_grad=True))[1].backward()
    assert q.grad is None


def test_the_temperature_is_learned_in_log_space_through_softplus():
    """d g / d log_eta = d g / d eta * sigmoid(log_eta), eta = softplus(log_eta) + 1e-8."""
    log_eta, eps = -0.3, 0.1
    eta = softplus(log_eta) + 1e-8
    lme = np.log(np.exp(Q / eta).mean(axis=0))
    w = np.exp(Q / eta) / np.exp(Q / eta).sum(axis=0)
    dg_deta = eps + np.mean(lme - (w * Q).sum(axis=0) / eta)
    p = torch.tensor([log_eta], dtype=torch.float64, requires_grad=True)
    temperature_dual(torch.tensor(Q), eps, positive(p))[1].sum().backward()
    assert p.grad.item() == pytest.approx(dg_deta / (1 + np.exp(-log_eta)), rel=1e-9)


# -- Gaussians ---------------------------------------------------------------------------------------------------


def test_kl_between_diagonal_gaussians_against_the_formula():
    rng = np.random.default_rng(0)
    mp, mq = rng.normal(size=(5, 3)), rng.normal(size=(5, 3))
    sp, sq = rng.uniform(0.1, 2, (5, 3)), rng.uniform(0.1, 2, (5, 3))
    got = gaussian_kl(*(torch.tensor(x) for x in (mp, sp, mq, sq))).numpy()
    np.testing.assert_allclose(got, np_kl(mp, sp, mq, sq), rtol=1e-12)
    # by hand: N(0, 1) || N(1, 2): log 2 + (1 + 1) / 8 - 1/2
    one = gaussian_kl(*(torch.tensor([v]) for v in (0.0, 1.0, 1.0, 2.0))).item()
    assert one == pytest.approx(math.log(2) + 2 / 8 - 0.5, rel=1e-7)
    ref = torch.distributions.kl_divergence(
        torch.distributions.Normal(torch.tensor(mp), torch.tensor(sp)),
        torch.distributions.Normal(torch.tensor(mq), torch.tensor(sq)),
    )
    np.testing.assert_allclose(got, ref.numpy(), rtol=1e-10)
    assert gaussian_kl(*(torch.tensor(x) for x in (mp, sp, mp, sp))).abs().max().item() < 1e-12


def test_the_weighted_m_step_loss_on_a_tiny_batch():
    a = np.array([[[0.5, -0.2]], [[1.5, 0.3]]])  # N = 2, B = 1, D = 2
    a = np.concatenate([a, a[:, :, ::-1] * 0.5], axis=1)  # B = 2
    w = np.array([[0.25, 0.9], [0.75, 0.1]])
    mean, std = np.array([[0.4, 0.0], [-0.1, 0.2]]), np.array([[0.5, 1.5], [1.0, 0.3]])
    hand = -np.mean((w * np_log_normal(a, mean[None], std[None]).sum(axis=-1)).sum(axis=0))
    got = weighted_nll(*(torch.tensor(x) for x in (a, w, mean, std)))
    assert got.item() == pytest.approx(hand, rel=1e-12)


# -- the whole policy loss ---------------------------------------------------------------------------------------


def _duals(action_dim, per_dim=True, penalise=False, log_t=0.2, log_m=-0.5, log_s=1.5):
    return Duals(
        action_dim,
        init_log_temperature=log_t,
        init_log_alpha_mean=log_m,
        init_log_alpha_stddev=log_s,
        per_dim_constraining=per_dim,
        action_penalization=penalise,
    ).double()


EPS = dict(epsilon=0.1, epsilon_mean=0.01, epsilon_stddev=0.001, epsilon_penalty=0.002)
ACT = np.array([[[0.5, -0.2], [0.1, 0.9]], [[-0.7, 0.3], [0.6, 0.0]], [[0.2, 0.2], [-0.4, 0.8]]])  # N=3, B=2, D=2
TMEAN, TSTD = np.array([[0.1, 0.0], [0.3, -0.2]]), np.array([[0.6, 0.8], [0.5, 0.7]])
OMEAN, OSTD = np.array([[0.2, -0.1], [0.25, 0.0]]), np.array([[0.65, 0.7], [0.5, 0.75]])


def _loss(duals, actions=ACT, q=Q):
    return mpo_loss(
        duals,
        online_mean=torch.tensor(OMEAN),
        online_std=torch.tensor(OSTD),
        target_mean=torch.tensor(TMEAN),
        target_std=torch.tensor(TSTD),
        actions=torch.tensor(actions),
        q=torch.tensor(q),
        **EPS,
    )


def _hand(weights, per_dim=True):
    eta, am, as_ = softplus(0.2) + 1e-8, softplus(-0.5) + 1e-8, softplus(1.5) + 1e-8
    l_mean = -np.mean((weights * np_log_normal(ACT, OMEAN[None], TSTD[None]).sum(-1)).sum(0))
    l_std = -np.mean((weights * np_log_normal(ACT, TMEAN[None], OSTD[None]).sum(-1)).sum(0))
    kl_m, kl_s = np_kl(TMEAN, TSTD, OMEAN, TSTD), np_kl(TMEAN, TSTD, TMEAN, OSTD)
    if not per_dim:
        kl_m, kl_s = kl_m.sum(-1, keepdims=True), kl_s.sum(-1, keepdims=True)
    policy = l_mean + l_std + (am * kl_m.mean(0)).sum() + (as_ * kl_s.mean(0)).sum()
    g = eta * (EPS["epsilon"] + np.log(np.exp(Q / eta).mean(0)).mean())
    dual = (am * (EPS["epsilon_mean"] - kl_m.mean(0))).sum() + (as_ * (EPS["epsilon_stddev"] - kl_s.mean(0))).sum()
    return policy, dual + g


@pytest.mark.parametrize("per_dim", [True, False])
def test_the_policy_and_dual_losses_on_a_tiny_batch(per_dim):
    eta = softplus(0.2) + 1e-8
    w = np.exp(Q / eta) / np.exp(Q / eta).sum(0)
    policy, dual, stats = _loss(_duals(2, per_dim=per_dim))
    hand_policy, hand_dual = _hand(w, per_dim)
    assert policy.item() == pytest.approx(hand_policy, rel=1e-7)
    assert dual.item() == pytest.approx(hand_dual, rel=1e-7)
    assert stats.temperature == pytest.approx(eta)
    assert stats.kl_mean_rel == pytest.approx(np_kl(TMEAN, TSTD, OMEAN, TSTD).mean() * (2 if not per_dim else 1) / 0.01)


def test_action_penalisation_adds_the_penalty_objectives_weights():
    """Every sample in bounds: the cost is 0 everywhere, so the penalty's weights are uniform (1/N) and its dual
    is eta_p * epsilon_penalty. Samples out of bounds get less weight the farther out they are."""
    eta = softplus(0.2) + 1e-8
    w = np.exp(Q / eta) / np.exp(Q / eta).sum(0)
    policy, dual, _ = _loss(_duals(2, penalise=True))
    hand_policy, hand_dual = _hand(w + 1 / 3)
    assert policy.item() == pytest.approx(hand_policy, rel=1e-7)
    assert dual.item() == pytest.approx(hand_dual + eta * EPS["epsilon_penalty"], rel=1e-7)

    # costs -||a - clip(a)||: sample 0 of state 0 is 2 beyond the bound, sample 1 0.5 beyond
    far = np.zeros((3, 2, 2))
    far[0, 0], far[1, 0] = [3.0, 0.0], [-1.5, 0.0]
    cost = -torch.linalg.vector_norm(torch.tensor(far) - torch.tensor(far).clamp(-1, 1), dim=-1)
    np.testing.assert_allclose(cost.numpy(), [[-2.0, 0.0], [-0.5, 0.0], [0.0, 0.0]])
    weights, _ = temperature_dual(cost, 0.002, torch.tensor(eta))
    assert weights[0, 0] < weights[1, 0] < weights[2, 0]
    assert torch.allclose(weights[:, 1], torch.full((3,), 1 / 3, dtype=weights.dtype))


def test_a_violated_constraint_raises_its_multiplier_and_a_satisfied_one_lowers_it():
    """One Adam step of the duals moves each log by about -lr * sign(gradient), the gradient epsilon - KL."""
    duals = _duals(2)
    opt = torch.optim.Adam(duals.parameters(), lr=0.01)
    # the mean moved far (KL of the mean ~0.04 and 0.05 > 0.01) on dimension 0 and not at all on dimension 1;
    # the std moved (KL ~4e-3 > 1e-3) on dimension 1 only
    online_mean = torch.tensor(TMEAN) + torch.tensor([[0.2, 0.0], [0.15, 0.0]])
    online_std = torch.tensor(TSTD) * torch.tensor([[1.0, 1.1], [1.0, 1.1]])
    q = torch.tensor([[10.0, 10.0], [0.0, 0.0], [0.0, 0.0]])  # peaked weights: KL(q || pi_old) ~ log 3 > 0.1
    _, dual, stats = mpo_loss(
        duals,
        online_mean=online_mean,
        online_std=online_std,
        target_mean=torch.tensor(TMEAN),
        target_std=torch.tensor(TSTD),
        actions=torch.tensor(ACT),
        q=q,
        **EPS,
    )
    assert stats.kl_q_rel > 1
    before = {n: p.detach().clone() for n, p in duals.named_parameters()}
    opt.zero_grad()
    dual.backward()
    opt.step()
    step = {n: (p.detach() - before[n]).numpy() for n, p in duals.named_parameters()}
    np.testing.assert_allclose(step["log_alpha_mean"], [0.01, -0.01], rtol=1e-3)
    np.testing.assert_allclose(step["log_alpha_stddev"], [-0.01, 0.01], rtol=1e-3)
    np.testing.assert_allclose(step["log_temperature"], [0.01], rtol=1e-3)  # too peaked: a hotter temperature

    # q nearly flat: KL(q || pi_old) below epsilon, the temperature cools
    duals = _duals(2)
    opt = torch.optim.Adam(duals.parameters(), lr=0.01)
    _, dual, stats = _loss(duals, q=Q * 1e-3)
    assert stats.kl_q_rel < 1
    before_t = duals.log_temperature.item()
    dual.backward()
    opt.step()
    assert duals.log_temperature.item() == pytest.approx(before_t - 0.01, rel=1e-6)


def test_the_duals_are_projected_to_a_floor_in_log_space():
    duals = _duals(3, log_t=-30.0, log_m=-18.5, log_s=2.0)
    duals.project_()
    assert duals.log_temperature.item() == MIN_LOG_DUAL
    assert torch.all(duals.log_alpha_mean == MIN_LOG_DUAL)
    assert torch.all(duals.log_alpha_stddev == 2.0)
    assert positive(duals.log_temperature).item() > 0
    assert _duals(3, per_dim=False).log_alpha_mean.shape == (1,)


# -- the learners ------------------------------------------------------------------------------------------------

BATCH = {
    "obs": np.array([[0.0], [1.0], [2.0]], np.float32),
    "action": np.array([[0.0], [0.5], [-0.5]], np.float32),
    "reward": np.array([1.0, 0.5, 0.25], np.float32),
    "discount": np.array([0.5, 0.0, 0.5], np.float32),
    "next_obs": np.array([[3.0], [-2.0], [0.0]], np.float32),
}
WEIGHTS = np.array([1.0, 0.5, 2.0])


def test_mpo_bootstraps_from_the_target_critic_and_scores_by_td_error():
    learner = MPOLearner(ONE_D, MPOConfig(**TINY), seed=0)
    set_linear(learner.target_critic.out, [[0.0] * 4], [2.0])  # Q'(s', a') = 2 for every sample
    set_linear(learner.critic.out, [[0.0] * 4], [0.5])  # Q(s, a) = 0.5
    delta = BATCH["reward"] + BATCH["discount"] * 2.0 - 0.5
    priorities, metrics = learner.update(BATCH, WEIGHTS)
    np.testing.assert_allclose(priorities, np.abs(delta) + 1e-6, rtol=1e-6)
    assert metrics["critic_loss"] == pytest.approx(np.mean(WEIGHTS * 0.5 * delta**2), rel=1e-6)
    assert metrics["q_mean"] == pytest.approx(0.5)
    assert set(metrics) == set(learner.metric_names)


def test_dmpo_projects_the_mixture_of_the_sampled_distributions():
    """Atoms 0, 1, 2; the target critic puts all mass on atom 1 for every sample, the online critic is uniform.
    Item 0: R + D z = 1 + 0.5 z -> atom 1 -> 1.5: split 0.5 / 0.5 between atoms 1 and 2. Item 1: terminal, all
    mass at R = 0.5: split between atoms 0 and 1. Item 2: 0.25 + 0.5 = 0.75: 0.25 to atom 0, 0.75 to atom 1."""
    config = DMPOConfig(**TINY, num_atoms=3, v_min=0.0, v_max=2.0)
    learner = DMPOLearner(ONE_D, config, seed=0)
    set_linear(learner.target_critic.out, [[0.0] * 4] * 3, [0.0, 50.0, 0.0])
    set_linear(learner.critic.out, [[0.0] * 4] * 3, [0.0, 0.0, 0.0])
    m = np.array([[0.0, 0.5, 0.5], [0.5, 0.5, 0.0], [0.25, 0.75, 0.0]])
    entropy = -np.sum(np.where(m > 0, m * np.log(np.where(m > 0, m, 1)), 0), axis=1)
    priorities, metrics = learner.update(BATCH, WEIGHTS)
    np.testing.assert_allclose(priorities, np.log(3) - entropy + 1e-6, rtol=1e-5)
    assert metrics["critic_loss"] == pytest.approx(np.mean(WEIGHTS * np.log(3)), rel=1e-6)
    assert metrics["q_mean"] == pytest.approx(1.0, rel=1e-6)


@pytest.mark.parametrize("make", [MPOLearner, DMPOLearner])
def test_the_sampled_read_is_the_critic_over_the_tiled_states(make):
    """The per-state factoring of the first two layers (and tanh as 2 sigmoid(2x) - 1) gives the critic's own
    forward over each (s, a_j): values for MPO, the softmax of the logits for DMPO."""
    config = (DMPOConfig if make is DMPOLearner else MPOConfig)(**TINY)
    learner = make(TWO_A, config, seed=0)
    generator = torch.Generator().manual_seed(0)
    obs = torch.randn(7, 3, generator=generator)
    actions = torch.randn(5, 7, 2, generator=generator)
    with torch.no_grad():
        read = learner.kind.sampled(learner.critic, obs, actions)
        out = torch.stack([learner.critic(obs, a) for a in actions])
    expected = torch.softmax(out, dim=-1) if make is DMPOLearner else out
    assert read.shape == expected.shape
    torch.testing.assert_close(read, expected, rtol=0, atol=1e-6)
    torch.testing.assert_close(learner.kind.sampled_values(read), learner.kind.values(out), rtol=0, atol=1e-5)


@pytest.mark.parametrize("make", [MPOLearner, DMPOLearner])
def test_targets_are_copied_on_their_periods(make):
    config = (DMPOConfig if make is DMPOLearner else MPOConfig)(
        **TINY, target_policy_update_period=2, target_critic_update_period=3, policy_lr=0.1, critic_lr=0.1
    )
    learner = make(ONE_D, config, seed=0)

    def same(a, b):
        return all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))

    results = []
    for _ in range(3):
        learner.update(BATCH, WEIGHTS)
        results.append((same(learner.policy, learner.target_policy), same(learner.critic, learner.target_critic)))
    assert results == [(False, False), (True, False), (False, True)]


@pytest.mark.parametrize(
    ("learner_class", "policy_class", "config"),
    [
        (MPOLearner, MPOPolicy, MPOConfig(**TINY, obs_norm=True)),
        (DMPOLearner, DMPOPolicy, DMPOConfig(**TINY, obs_norm=True)),
    ],
)
def test_weights_checkpoints_and_the_actors_policy(learner_class, policy_class, config):
    learner = learner_class(TWO_A, config, seed=1)
    batch = {
        "obs": np.random.default_rng(0).normal(size=(8, 3)).astype(np.float32),
        "action": np.clip(np.random.default_rng(1).normal(size=(8, 2)), -1, 1).astype(np.float32),
        "reward": np.ones(8, np.float32),
        "discount": np.full(8, 0.9, np.float32),
        "next_obs": np.random.default_rng(2).normal(size=(8, 3)).astype(np.float32),
    }
    for _ in range(3):
        learner.update(batch, np.ones(8))
    policy = policy_class(TWO_A, config, num_envs=2, seed=3)
    policy.load_policy_state_dict(learner.policy_state_dict())
    obs = batch["obs"][:2]
    with torch.no_grad():
        mean, _ = learner.target_policy(learner.obs_norm(torch.as_tensor(obs)))  # actors act with the target
    np.testing.assert_allclose(np.stack(policy.act_batch(obs, explore=False)), mean.clamp(-1, 1).numpy(), rtol=1e-6)
    explored = np.stack(policy.act_batch(obs))
    assert explored.shape == (2, 2) and np.all(np.abs(explored) <= 1) and policy.explorations == [1.0, 1.0]
    priorities = policy.initial_priorities(batch)
    assert priorities.dtype == np.float64 and priorities.shape == (8,) and np.all(priorities > 0)

    copy = learner_class(TWO_A, config, seed=7)
    copy.load_state_dict(learner.state_dict())
    assert copy.steps == 3
    for k, v in learner.state_dict().items():
        assert torch.equal(v, copy.state_dict()[k]), k
    bad = dict(learner.state_dict())
    bad.pop("duals/log_temperature")
    fresh = learner_class(TWO_A, config, seed=7)
    before = {k: v.clone() for k, v in fresh.state_dict().items()}
    with pytest.raises(ValueError, match="duals/log_temperature"):
        fresh.load_state_dict(bad)
    assert all(torch.equal(v, fresh.state_dict()[k]) for k, v in before.items())
    with pytest.raises(ValueError, match="policy weights"):
        policy.load_policy_state_dict({k: v for k, v in learner.policy_state_dict().items() if k != "critic/out.bias"})


def test_the_agents_are_registered_and_refuse_discrete_actions():
    from apexrl.envs import env_spec

    for name, label in (("mpo", "MPO"), ("dmpo", "DMPO")):
        agent = get_agent(name)
        assert label in agent.accepts(env_spec("gym:CartPole-v1"))
        assert agent.accepts(env_spec("gym:Pendulum-v1")) is None
    with pytest.raises(ValueError, match="epsilon_mean"):
        MPOConfig(epsilon_mean=0.0)
    with pytest.raises(ValueError, match="critic_hidden must have two layers"):
        MPOConfig(critic_hidden=(8,))
    with pytest.raises(ValueError, match="v_min < v_max"):
        DMPOConfig(v_min=1.0, v_max=1.0)


@pytest.mark.parametrize("learner_class", [MPOLearner, DMPOLearner])
def test_the_policy_mean_moves_to_the_best_action_of_a_bandit(learner_class):
    """One-step episodes, reward 1 - (a - 0.4)^2 for actions drawn uniformly: the critic's loss falls and the
    policy's mean moves from ~0 towards the better actions. (Not to 0.4 itself: with std 0.7 and actions clipped
    to [-1, 1] the best mean of the clipped Gaussian lies above 0.4, and 300 steps fit the critic roughly.)"""
    config_class = DMPOConfig if learner_class is DMPOLearner else MPOConfig
    extra = dict(num_atoms=21, v_min=-3.0, v_max=1.0) if learner_class is DMPOLearner else {}
    config = config_class(
        actor_hidden=(16,),
        critic_hidden=(32, 32),
        num_samples=10,
        batch_size=64,
        policy_lr=3e-3,
        critic_lr=1e-2,
        init_log_temperature=0.0,
        target_policy_update_period=10,
        target_critic_update_period=10,
        **extra,
    )
    learner = learner_class(ONE_D, config, seed=0)
    rng = np.random.default_rng(0)
    losses, means = [], []
    for _ in range(300):
        a = rng.uniform(-1, 1, (64, 1)).astype(np.float32)
        batch = {
            "obs": np.zeros((64, 1), np.float32),
            "action": a,
            "reward": (1 - (a[:, 0] - 0.4) ** 2).astype(np.float32),
            "discount": np.zeros(64, np.float32),
            "next_obs": np.zeros((64, 1), np.float32),
        }
        _, metrics = learner.update(batch, np.ones(64))
        losses.append(metrics["critic_loss"])
        with torch.no_grad():
            means.append(learner.policy(torch.zeros(1, 1))[0].item())
    assert np.mean(losses[-20:]) < 0.5 * np.mean(losses[:20])
    assert abs(means[0]) < 0.05 and 0.15 < means[-1] < 0.9
    assert (means[-1] - 0.4) ** 2 < (means[0] - 0.4) ** 2
