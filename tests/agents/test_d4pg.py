"""D4PG against hand-worked projections, losses and KL priorities, the clipped actor gradient (element-wise and by
norm), the global-norm gradient clip, the actor's loss state and weights, the sigma ladder, state round trips,
and a short real run through the registry."""

from __future__ import annotations

import copy
import dataclasses
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import safetensors.torch
import torch
from torch import nn

from apexrl.agents import AGENTS, D4PGConfig, D4PGLearner, D4PGPolicy, DPGLearner
from apexrl.agents.d4pg import categorical_projection, sigma_ladder
from apexrl.apex.metrics import read_csv
from apexrl.envs.base import EnvSpec
from apexrl.launch.presets import PRESETS
from apexrl.replay.tables import SampleToInsertRatio
from apexrl.replay.wire.codec import TransitionSpec
from tests.helpers import rows_with_updates
from tests.torch_helpers import one_thread, set_linear  # noqa: F401 - one_thread is an autouse fixture

ONE_D = EnvSpec("test:1d", (1,), np.dtype(np.float32), None, 1, 1, 100)
CONT = EnvSpec("test:cont", (5,), np.dtype(np.float32), None, 2, 1, 1000)
TINY = D4PGConfig(actor_hidden=(1,), critic_hidden=(1, 1), num_atoms=3, v_min=0.0, v_max=2.0)
SMALL = D4PGConfig(
    actor_hidden=(16, 8), critic_hidden=(16, 8), target_update_period=2, num_atoms=11, v_min=-5.0, v_max=5.0
)
LN2 = math.log(2.0)
Z5 = torch.arange(5, dtype=torch.float32)  # 5 atoms on [0, 4]


def project(reward, discount, probs, z=Z5) -> np.ndarray:
    t = lambda x: torch.from_numpy(np.asarray(x, dtype=np.float32))  # noqa: E731
    return categorical_projection(t(reward), t(discount), t(probs), z).numpy()


def params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def random_batch(rng: np.random.Generator, n: int = 8, env: EnvSpec = CONT) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, env.obs_shape[0])).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, env.action_dim)).astype(np.float32),
        "reward": rng.standard_normal(n).astype(np.float32),
        "discount": np.full(n, 0.99**5, np.float32),
        "next_obs": rng.standard_normal((n, env.obs_shape[0])).astype(np.float32),
    }


# -- projection on 5 atoms z = (0, 1, 2, 3, 4) ------------------------------------------------------------------

ONE_HOT = np.eye(5, dtype=np.float32)


@pytest.mark.parametrize(
    ("reward", "discount", "probs", "expected"),
    [
        # R shifts atom 1 onto atom 2 exactly: l == u keeps the whole mass.
        (1.0, 1.0, ONE_HOT[1], [0, 0, 1, 0, 0]),
        # R = 0.5 puts every atom half-way: mass split evenly; 4.5 clips to 4 (0.2 + half of atom 3's 0.2).
        (0.5, 1.0, [0.2] * 5, [0.1, 0.2, 0.2, 0.2, 0.3]),
        # Discount scales: 0.5 * 3 = 1.5 -> half to 1, half to 2; 0.5 * 4 = 2 lands on atom 2.
        (0.0, 0.5, ONE_HOT[3], [0, 0.5, 0.5, 0, 0]),
        (0.0, 0.5, ONE_HOT[4], [0, 0, 1, 0, 0]),
        (0.25, 0.25, ONE_HOT[3], [0, 1, 0, 0, 0]),
        # Clipping below: -3 + z -> (-3, -2, -1, 0, 1) -> atom 0 holds atoms 0..3's mass.
        (-3.0, 1.0, [0.5, 0, 0, 0, 0.5], [0.5, 0.5, 0, 0, 0]),
        (-3.0, 1.0, [0.1, 0.2, 0.3, 0.15, 0.25], [0.75, 0.25, 0, 0, 0]),
        # Clipping above: 3 + z -> (3, 4, 5, 6, 7) -> atom 4 holds atoms 1..4's mass.
        (3.0, 1.0, [0.1, 0.2, 0.3, 0.15, 0.25], [0, 0, 0, 0.1, 0.9]),
        # Terminal (D = 0): all mass at clip(R), split between the neighbours of R.
        (2.25, 0.0, [0.1, 0.2, 0.3, 0.15, 0.25], [0, 0, 0.75, 0.25, 0]),
        (7.0, 0.0, [0.2] * 5, [0, 0, 0, 0, 1]),
        (-1.0, 0.0, [0.2] * 5, [1, 0, 0, 0, 0]),
        (3.0, 0.0, [0.2] * 5, [0, 0, 0, 1, 0]),
    ],
)
def test_projection_by_hand(reward, discount, probs, expected):
    got = project([reward], [discount], [probs])
    np.testing.assert_allclose(got, [expected], rtol=0, atol=1e-6)


def test_projection_rows_sum_to_one_and_keep_the_mean_when_nothing_clips():
    rng = np.random.default_rng(0)
    z = torch.linspace(-10.0, 10.0, 21)
    n = 200
    probs = rng.dirichlet(np.ones(21), n).astype(np.float32)
    discount = rng.uniform(0, 1, n).astype(np.float32)
    discount[:20] = 0.0
    reward = (rng.uniform(-1, 1, n) * 10 * (1 - discount)).astype(np.float32)  # |R| + D * 10 <= 10: no clipping
    got = project(reward, discount, probs, z)
    np.testing.assert_allclose(got.sum(1), 1.0, atol=1e-5)
    assert (got >= 0).all()
    np.testing.assert_allclose(got @ z.numpy(), reward + discount * (probs @ z.numpy()), atol=1e-4)
    # Clipping moves mass to the ends, and rows still sum to 1.
    wide = project(reward * 50, discount, probs, z)
    np.testing.assert_allclose(wide.sum(1), 1.0, atol=1e-5)


# -- critic loss and priorities on a hand-made batch ------------------------------------------------------------
#
# 3 atoms z = (0, 1, 2). Critics with zero output weights: constant distributions whatever (s, a).
#   target critic p' = (0.25, 0.5, 0.25)      online critic p = (0.5, 0.25, 0.25), Q = 0.75
#
#  i  R    D    projected target m      CE_i = -sum m log p            w
#  1  0    1    (0.25, 0.5, 0.25)       0.25 ln2 + 0.5*2ln2 + 0.25*2ln2 = 1.75 ln2    1
#  2  0.5  0    (0.5, 0.5, 0)           0.5 ln2 + 0.5*2ln2              = 1.5 ln2     0.5
#  3  1    0.5  (0, 0.5, 0.5)           2 ln2                                          2
#     (item 3: Tz = (1, 1.5, 2): 0.25 -> atom 1, 0.5 split 1/2, 0.25 -> atom 2)

HAND_BATCH = {
    "obs": np.array([[0.0], [1.0], [2.0]], np.float32),
    "action": np.array([[0.0], [0.5], [-0.5]], np.float32),
    "reward": np.array([0.0, 0.5, 1.0], np.float32),
    "discount": np.array([1.0, 0.0, 0.5], np.float32),
    "next_obs": np.array([[3.0], [-2.0], [0.0]], np.float32),
}
HAND_WEIGHTS = np.array([1.0, 0.5, 2.0])
HAND_CE = np.array([1.75, 1.5, 2.0]) * LN2
# The projected targets m = (0.25, 0.5, 0.25), (0.5, 0.5, 0), (0, 0.5, 0.5) have entropies 1.5, 1 and 1 ln2:
HAND_KL = HAND_CE - np.array([1.5, 1.0, 1.0]) * LN2  # (0.25, 0.5, 1) ln2


def set_constant_critic(critic, probs) -> None:
    set_linear(critic.out, [[0.0]] * len(probs), np.log(probs).tolist())


def hand_learner(**config) -> D4PGLearner:
    learner = D4PGLearner(ONE_D, dataclasses.replace(TINY, **config), seed=0)
    set_constant_critic(learner.critic, [0.5, 0.25, 0.25])
    set_constant_critic(learner.target_critic, [0.25, 0.5, 0.25])
    return learner


def test_critic_loss_priorities_and_q_by_hand():
    learner = hand_learner(priority_eps=1e-3)
    priorities, metrics = learner.update(HAND_BATCH, HAND_WEIGHTS)
    assert priorities.dtype == np.float64
    # Priorities are KL(m || p) = CE - H(m), not the cross-entropy the critic minimises (that floors at H(m)).
    np.testing.assert_allclose(priorities, HAND_KL + 1e-3, rtol=1e-5)
    assert metrics["critic_loss"] == pytest.approx(np.mean(HAND_WEIGHTS * HAND_CE), rel=1e-5)
    assert metrics["q_mean"] == pytest.approx(0.75, rel=1e-5)
    assert metrics["priority_mean"] == pytest.approx(np.mean(HAND_KL) + 1e-3, rel=1e-5)
    assert list(metrics) == list(D4PGLearner.metric_names)


def test_is_weights_scale_the_critic_loss_and_its_gradient():
    ones, scaled = hand_learner(critic_lr=1e-12), hand_learner(critic_lr=1e-12)
    _, m1 = ones.update(HAND_BATCH, np.ones(3))
    _, m3 = scaled.update(HAND_BATCH, np.full(3, 3.0))
    assert m3["critic_loss"] == pytest.approx(3 * m1["critic_loss"], rel=1e-5)
    assert m1["critic_loss"] == pytest.approx(HAND_CE.mean(), rel=1e-5)
    g1, g3 = ones.critic.out.bias.grad, scaled.critic.out.bias.grad
    torch.testing.assert_close(g3, 3 * g1)
    # d CE / d logits = p - m, averaged: ((0.5, 0.25, 0.25) - mean of the targets) / 1 per item.
    targets = np.array([[0.25, 0.5, 0.25], [0.5, 0.5, 0.0], [0.0, 0.5, 0.5]])
    want = (np.array([0.5, 0.25, 0.25]) - targets).mean(0)
    np.testing.assert_allclose(g1.numpy(), want, atol=1e-6)


def test_policy_initial_priorities_use_local_actor_and_critic():
    # Local critic p = (0.5, 0.25, 0.25) stands in for the target too; priority = KL(m || p) = CE - H(m):
    #   item 1 m = p: CE = H = 1.5 ln2, KL 0; item 2 m = (0.5, 0.5, 0): CE 1.5 ln2, H ln2, KL 0.5 ln2;
    #   item 3 Tz = (1, 1.5, 2): m = (0, 0.625, 0.375): CE = -ln 0.25 = 2 ln2, H = -(0.625 ln 0.625 + 0.375 ln 0.375).
    policy = D4PGPolicy(ONE_D, dataclasses.replace(TINY, priority_eps=1e-3), seed=0)
    set_constant_critic(policy.critic, [0.5, 0.25, 0.25])
    got = policy.initial_priorities(HAND_BATCH)
    assert got.dtype == np.float64
    h3 = -(0.625 * math.log(0.625) + 0.375 * math.log(0.375))
    np.testing.assert_allclose(got, np.array([0.0, 0.5 * LN2, 2 * LN2 - h3]) + 1e-3, rtol=1e-5, atol=1e-7)


def test_a_learner_and_a_policy_with_the_same_weights_give_the_same_priorities_once_targets_match():
    learner = D4PGLearner(CONT, SMALL, seed=3)
    policy = D4PGPolicy(CONT, SMALL, seed=9)
    policy.load_policy_state_dict(learner.policy_state_dict())
    batch = random_batch(np.random.default_rng(1))
    expected = policy.initial_priorities(batch)
    got, _ = learner.update(batch, np.ones(8))  # targets are copies of the online nets before the first step
    np.testing.assert_allclose(got, expected, rtol=1e-5)


# -- actor gradient, dQ/da clipped ------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", [0.5, 3.0])
def test_dqda_is_clipped_before_it_flows_into_the_actor(clip):
    learner = D4PGLearner(CONT, dataclasses.replace(SMALL, critic_lr=1e-12, dqda_clip=clip), seed=0)
    with torch.no_grad():
        learner.critic.out.weight.mul_(3000.0)  # steep distributions: dQ/da beyond the clip for some elements
    batch = random_batch(np.random.default_rng(0), n=32)
    reference = copy.deepcopy(learner)
    _, metrics = learner.update(batch, np.ones(32))
    # Independently: Q = sum_i softmax(logits)_i z_i through the (1e-12-step) updated critic, dQ/da per sample,
    # clipped, then the actor gradient of -mean_i (clipped dQ/da_i . pi(s_i)) with dQ/da held fixed.
    obs = torch.from_numpy(batch["obs"])
    z = torch.linspace(SMALL.v_min, SMALL.v_max, SMALL.num_atoms)
    action = reference.actor(obs)
    q = (torch.softmax(reference.critic(obs, action), dim=1) * z).sum(1)
    dqda = torch.autograd.grad(q.sum(), action, retain_graph=True)[0]
    assert (dqda.abs() > clip).any() and (dqda.abs() < clip).any()
    assert metrics["actor_loss"] == pytest.approx(-q.mean().item(), rel=1e-4)
    loss = -(dqda.clamp(-clip, clip).detach() * action).sum(-1).mean()
    want = torch.autograd.grad(loss, list(reference.actor.parameters()), retain_graph=True)
    unclipped = torch.autograd.grad(-(dqda.detach() * action).sum(-1).mean(), list(reference.actor.parameters()))
    for p, g in zip(learner.actor.parameters(), want):
        torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-7)
    assert any(not torch.allclose(g, raw) for g, raw in zip(want, unclipped))


def test_acmes_options_apply_to_d4pg():
    cfg = dataclasses.replace(
        SMALL,
        critic_lr=1e-12,
        dqda_clip=None,
        dqda_clip_norm=1.0,
        grad_clip_norm=0.1,
        actor_loss_state="next_obs",
        actor_weights="target",
        target_update_period=1000,
    )
    learner = D4PGLearner(CONT, cfg, seed=0)
    with torch.no_grad():
        learner.critic.out.weight.mul_(3000.0)
    batch = random_batch(np.random.default_rng(0), n=32)
    reference = copy.deepcopy(learner)
    _, metrics = learner.update(batch, np.ones(32))
    for net in (learner.critic, learner.actor):  # both networks' global gradient norms clipped to 0.1
        norm = torch.linalg.vector_norm(torch.cat([p.grad.flatten() for p in net.parameters()]))
        assert float(norm) <= 0.1 * (1 + 1e-4)
    sent = learner.policy_state_dict()  # the target networks, still the initial weights
    assert all(torch.equal(sent[f"actor/{k}"], v) for k, v in learner.target_actor.state_dict().items())
    assert not torch.equal(sent["actor/body.layers.0.weight"], learner.actor.state_dict()["body.layers.0.weight"])
    # the actor's loss is -mean Q(s', pi(s')) (a 1e-12 critic step leaves the critic as it was)
    nxt, obs = torch.from_numpy(batch["next_obs"]), torch.from_numpy(batch["obs"])
    with torch.no_grad():
        at_next = -reference.critic.q(nxt, reference.actor(nxt)).mean().item()
        at_obs = -reference.critic.q(obs, reference.actor(obs)).mean().item()
    assert metrics["actor_loss"] == pytest.approx(at_next, rel=1e-4) and at_next != pytest.approx(at_obs, rel=1e-4)


# -- exploration ------------------------------------------------------------------------------------------------


def test_sigma_ladder_is_geometric_from_max_to_min():
    assert sigma_ladder(0, 1, 0.05, 0.3) == 0.3
    assert [sigma_ladder(i, 3, 0.05, 0.2) for i in range(3)] == pytest.approx([0.2, 0.1, 0.05])
    assert [sigma_ladder(i, 2, 0.1, 0.3) for i in range(2)] == pytest.approx([0.3, 0.1])
    for bad in [(3, 3), (-1, 3), (0, 0)]:
        with pytest.raises(ValueError):
            sigma_ladder(*bad, 0.05, 0.3)
    with pytest.raises(ValueError, match="geometric or linear"):
        sigma_ladder(0, 2, 0.05, 0.3, "cubic")


def test_sigma_ladder_linear_and_the_control_suite_presets_spread():
    assert [sigma_ladder(i, 5, 0.1, 0.5, "linear") for i in range(5)] == pytest.approx([0.5, 0.4, 0.3, 0.2, 0.1])
    assert sigma_ladder(0, 1, 0.1, 0.5, "linear") == 0.5
    cfg = PRESETS["apex-d4pg-control"].agent_config()
    sigmas = [AGENTS["d4pg"].make_policy(CONT, cfg, i, 6, 0).sigma for i in range(6)]
    assert sigmas == pytest.approx([1, 1 / 2, 1 / 4, 1 / 8, 1 / 16, 1 / 32])  # 1/32 to 1, fixed per actor
    linear = dataclasses.replace(cfg, noise_sigma_spacing="linear")
    assert [AGENTS["d4pg"].make_policy(CONT, linear, i, 32, 0).sigma for i in range(32)] == pytest.approx(
        [(32 - i) / 32 for i in range(32)]
    )
    acme = PRESETS["d4pg-acme"].agent_config()
    assert {AGENTS["d4pg"].make_policy(CONT, acme, i, 4, 0).sigma for i in range(4)} == {0.3}  # on every actor


def test_actors_get_the_ladder_and_expose_it_as_exploration():
    agent = AGENTS["d4pg"]
    cfg = dataclasses.replace(SMALL, noise_sigma_min=0.05, noise_sigma_max=0.2)
    policies = [agent.make_policy(CONT, cfg, i, 3, i) for i in range(3)]
    assert [p.exploration for p in policies] == pytest.approx([0.2, 0.1, 0.05])
    assert [p.sigma for p in policies] == pytest.approx([0.2, 0.1, 0.05])
    assert agent.make_policy(CONT, cfg, 0, 1, 0).exploration == pytest.approx(0.2)


def test_evaluation_is_noiseless_and_exploration_adds_sigma_noise():
    policy = D4PGPolicy(CONT, SMALL, sigma=0.2, seed=0)
    obs = np.random.default_rng(0).standard_normal(5).astype(np.float32)
    greedy = policy.act(obs, explore=False)
    with torch.no_grad():
        want = policy.actor(torch.from_numpy(obs)[None])[0].numpy()
    np.testing.assert_array_equal(greedy, want)
    np.testing.assert_array_equal(policy.act(obs, explore=False), greedy)
    noisy = np.stack([policy.act(obs) for _ in range(2000)])
    assert noisy.dtype == np.float32 and (np.abs(noisy) <= 1).all()
    assert np.std(noisy - greedy, axis=0) == pytest.approx([0.2, 0.2], rel=0.1)


# -- state round trips ------------------------------------------------------------------------------------------


def test_policy_round_trip_and_wrong_weights_refused():
    learner = D4PGLearner(CONT, SMALL, seed=0)
    learner.update(random_batch(np.random.default_rng(0)), np.ones(8))
    policy = D4PGPolicy(CONT, SMALL, seed=5)
    weights = learner.policy_state_dict()
    assert weights["critic/out.weight"].shape == (11, 8)
    policy.load_policy_state_dict(weights)
    for x, y in zip(params(policy.critic), params(learner.critic)):
        torch.testing.assert_close(x, y, rtol=0, atol=0)
    before = params(policy.critic)
    dpg_weights = DPGLearner(CONT, dataclasses.replace(_dpg_small()), seed=0).policy_state_dict()
    with pytest.raises(ValueError, match=r"D4PG policy weights: .*critic/out.weight"):
        policy.load_policy_state_dict(dpg_weights)
    assert same(params(policy.critic), before)


def _dpg_small():
    from apexrl.agents import DPGConfig

    return DPGConfig(actor_hidden=(16, 8), critic_hidden=(16, 8))


def test_checkpoint_round_trip_continues_identically():
    rng = np.random.default_rng(0)
    batches = [random_batch(rng) for _ in range(5)]
    cfg = dataclasses.replace(SMALL, target_update_period=4)
    a = D4PGLearner(CONT, cfg, seed=0)
    for b in batches[:3]:
        a.update(b, np.ones(8))
    ckpt = safetensors.torch.load(safetensors.torch.save(a.state_dict()))
    assert int(ckpt["steps"]) == 3
    assert ckpt["target_critic/out.weight"].shape == (11, 8) and "optim/critic/5/exp_avg" in ckpt
    b = D4PGLearner(CONT, cfg, seed=42)
    b.load_state_dict(ckpt)
    for batch in batches[3:]:  # the 4th update copies the targets
        pa, ma = a.update(batch, np.ones(8))
        pb, mb = b.update(batch, np.ones(8))
        np.testing.assert_array_equal(pa, pb)
        assert ma == mb
    for net in ("actor", "critic", "target_actor", "target_critic"):
        for x, y in zip(params(getattr(a, net)), params(getattr(b, net))):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_checkpoint_mismatch_is_refused_and_changes_nothing():
    learner = D4PGLearner(CONT, SMALL, seed=0)
    learner.update(random_batch(np.random.default_rng(0)), np.ones(8))
    ckpt = learner.state_dict()
    other = D4PGLearner(CONT, SMALL, seed=1)
    before = {k: v.clone() for k, v in other.state_dict().items()}
    more_atoms = D4PGLearner(CONT, dataclasses.replace(SMALL, num_atoms=21), seed=0).state_dict()
    with pytest.raises(ValueError, match=r"D4PG checkpoint: .*critic/out.weight: got torch.float32 \(21, 8\)"):
        other.load_state_dict(more_atoms)
    with pytest.raises(ValueError, match=r"missing \['target_critic/out.weight'\]"):
        other.load_state_dict({k: v for k, v in ckpt.items() if k != "target_critic/out.weight"})
    after = other.state_dict()
    assert after.keys() == before.keys() and all(torch.equal(before[k], after[k]) for k in before)
    assert other.steps == 0


# -- config, registry, presets, a real run ----------------------------------------------------------------------


def test_config_defaults_and_refusals():
    c = D4PGConfig()
    assert (c.n_step, c.batch_size, c.actor_lr, c.critic_lr, c.target_update_period) == (5, 256, 1e-4, 1e-4, 100)
    assert (c.num_atoms, c.v_min, c.v_max, c.dqda_clip, c.critic_hidden) == (51, -150.0, 150.0, 1.0, (400, 300))
    # No 0.3 -> 0.05 ladder by default (it has no source): Acme's sigma 0.3 on every actor.
    assert (c.noise_sigma_max, c.noise_sigma_min, c.noise_sigma_spacing) == (0.3, 0.3, "geometric")
    assert D4PGLearner(CONT, SMALL).transition_spec == TransitionSpec.dpg(5, 2)
    for bad in [
        dict(num_atoms=1),
        dict(v_min=1.0, v_max=1.0),
        dict(v_max=math.inf),
        dict(noise_sigma_min=0.0),
        dict(noise_sigma_min=0.5, noise_sigma_max=0.3),
        dict(critic_hidden=(400,)),
        dict(gamma=2.0),
        dict(noise_sigma_spacing="log"),
        dict(dqda_clip_norm=1.0),
    ]:
        with pytest.raises(ValueError):
            D4PGConfig(**bad)


def test_presets_use_d4pg():
    from apexrl.launch.plan import Overrides, plan

    paper, acme, tuned = PRESETS["apex-d4pg-control"], PRESETS["d4pg-acme"], PRESETS["d4pg-cartpole-swingup"]
    d4pg_presets = [name for name, p in PRESETS.items() if p.agent == "d4pg"]
    assert d4pg_presets[:3] == ["apex-d4pg-control", "d4pg-acme", "d4pg-cartpole-swingup"]
    # The Control Suite paper's: 101 atoms on [-150, 150], n = 5, batch 256, Adam 1e-4, hard copies every 100,
    # sigma from 1 to 1/32, prioritized sampling 0.6 and eviction 0.6 (apexrl's sign: -0.6).
    c = paper.agent_config()
    assert isinstance(c, D4PGConfig) and (c.n_step, c.num_atoms, c.batch_size, c.v_min, c.v_max) == (
        5,
        101,
        256,
        -150.0,
        150.0,
    )
    assert (c.actor_lr, c.critic_lr, c.target_update_period, c.noise_sigma_max, c.noise_sigma_min) == (
        1e-4,
        1e-4,
        100,
        1.0,
        1 / 32,
    )
    assert (paper.replay.eviction, paper.replay.alpha, paper.replay.alpha_evict) == ("prioritized", 0.6, -0.6)
    assert "Tassa et al. 2018" in paper.source and any("alpha_evict = 0.6" in u for u in paper.unmatched)
    # Acme's: uniform replay with FIFO eviction, 32 samples per insert with Acme's error buffer, min size 1000,
    # sigma 0.3, dQ/da norm 1, gradient norm 40, actors on the target networks, actor loss at the next state.
    a = acme.agent_config()
    assert (
        a.num_atoms,
        a.noise_sigma_max,
        a.noise_sigma_min,
        a.dqda_clip,
        a.dqda_clip_norm,
        a.grad_clip_norm,
        a.actor_weights,
        a.actor_loss_state,
    ) == (51, 0.3, 0.3, None, 1.0, 40.0, "target", "next_obs")
    run = plan(acme, Overrides())
    t = run.server.table()
    assert (t.alpha, t.remover) == (0.0, "fifo")
    assert t.rate_limiter == SampleToInsertRatio(32.0, run.learner.min_replay_size, 1000 * 0.1 * 32)
    assert run.learner.min_replay_size == 1000
    assert "Acme" in acme.source and acme.unmatched
    assert tuned.agent_config().v_max == 100.0 and tuned.actors == 2
    assert (tuned.agent_config().noise_sigma_max, tuned.agent_config().noise_sigma_min) == (0.3, 0.1)
    assert "tuned" in tuned.description and "tuned" in tuned.source


def test_the_clis_list_d4pg():
    for module in ("apexrl.cli.learner", "apexrl.cli.actor"):
        out = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0 and "d4pg: D4PG" in out.stdout, out.stdout + out.stderr


FAST_LEARNER = "--min-replay-size 300 --eval-every 3 --eval-episodes 1 --metrics-every 1 --checkpoint-every 100"


@pytest.mark.slow
def test_a_short_real_run(spawn, tmp_path):
    """Acme's preset through real processes: uniform replay at 32 samples per insert, actors on the target
    networks, the actor's loss at the next state, dQ/da norm and gradient norm clipping."""
    run_dir = str(tmp_path / "run")
    launcher = spawn(
        "launcher",
        "apexrl",
        "run",
        "--preset",
        "d4pg-acme",
        "--env",
        "dmc:cartpole-swingup",
        "--run-dir",
        run_dir,
        "--minutes",
        "0",
        "--steps",
        "50",
        "--final-eval",
        "0",  # what this test checks ends at step 50; the final evaluation is tests/launch's
        "--actors",
        "2",
        "--quiet",
        "--batch-size",
        "32",
        f"--learner-args={FAST_LEARNER}",
    )
    assert launcher.proc.wait(300) == 0, launcher.log()
    assert "stopping: reached --steps 50" in launcher.log()
    metrics = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert metrics["learner_steps"][-1] == 50
    # A row whose interval had updates carries their means (a NaN loss would be an empty cell: NaN here too).
    updated = rows_with_updates(metrics)
    assert updated.any()
    for name in ("critic_loss", "priority_mean"):
        assert np.isfinite(np.asarray(metrics[name])[updated]).all(), (name, metrics[name], metrics["learner_steps"])
    assert os.path.exists(os.path.join(run_dir, "checkpoint.safetensors"))
