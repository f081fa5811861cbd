"""Ape-X DPG against hand-computed targets, the actor-gradient clip, exploration noise, target copies and state
round trips."""

from __future__ import annotations

import copy
import dataclasses
import math

import numpy as np
import pytest
import safetensors.torch
import torch
from torch import nn

from apexrl.agents import DPGConfig, DPGLearner, DPGPolicy
from apexrl.envs.base import EnvSpec
from apexrl.replay.wire.codec import TransitionSpec
from tests.torch_helpers import one_thread, set_linear  # noqa: F401 - one_thread is an autouse fixture

ONE_D = EnvSpec("test:1d", (1,), np.dtype(np.float32), None, 1, 1, 100)
CONT = EnvSpec("test:cont", (5,), np.dtype(np.float32), None, 2, 1, 1000)
TINY = DPGConfig(actor_hidden=(1,), critic_hidden=(1, 1))
SMALL = DPGConfig(actor_hidden=(16, 8), critic_hidden=(16, 8), target_update_period=2)
T = math.tanh(0.5)


def set_constant_actor(actor, value: float) -> None:
    """pi(s) = tanh(0 * tanh(0 * s) + atanh(value)) = value."""
    set_linear(actor.body.layers[0], [[0.0]], [0.0])
    set_linear(actor.body.layers[2], [[0.0]], [math.atanh(value)])


def set_critic(critic, out_w: float, out_b: float) -> None:
    """Q(s, a) = out_w * tanh(a) + out_b  (first layer zeroed, the joint layer passes the action only)."""
    set_linear(critic.obs_layer, [[0.0]], [0.0])
    set_linear(critic.joint_layer, [[0.0, 1.0]], [0.0])
    set_linear(critic.out, [[out_w]], [out_b])


def random_batch(rng: np.random.Generator, n: int = 8, env: EnvSpec = CONT) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, env.obs_shape[0])).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, env.action_dim)).astype(np.float32),
        "reward": rng.standard_normal(n).astype(np.float32),
        "discount": np.full(n, 0.99**5, np.float32),
        "next_obs": rng.standard_normal((n, env.obs_shape[0])).astype(np.float32),
    }


def params(net: nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in net.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


# -- critic target on a hand-made batch -------------------------------------------------------------------------
#
# online actor   pi(s)  = 0          online critic  Q(s, a)  = tanh(a)
# target actor   pi'(s) = 0.5        target critic  Q'(s, a) = 2 tanh(a) + 1  ->  Q'(s', pi'(s')) = 2t + 1, t = tanh(.5)
#
#  i  a     R    D     Q(s, a)   td_target              delta
#  1  0     1    0.5   0         1 + 0.5 (2t + 1)        1.5 + t
#  2  0.5   0    0     t         0                       -t
#  3  -0.5  -1   0.25  -t        -1 + 0.25 (2t + 1)      -0.75 + 1.5 t
#
# IS weights w = (1, 0.5, 2).

HAND_BATCH = {
    "obs": np.array([[0.0], [1.0], [2.0]], np.float32),
    "action": np.array([[0.0], [0.5], [-0.5]], np.float32),
    "reward": np.array([1.0, 0.0, -1.0], np.float32),
    "discount": np.array([0.5, 0.0, 0.25], np.float32),
    "next_obs": np.array([[3.0], [-2.0], [0.0]], np.float32),
}
HAND_WEIGHTS = np.array([1.0, 0.5, 2.0])
HAND_DELTA = np.array([1.5 + T, -T, -0.75 + 1.5 * T])


def hand_learner(**config) -> DPGLearner:
    learner = DPGLearner(ONE_D, dataclasses.replace(TINY, **config), seed=0)
    set_constant_actor(learner.actor, 0.0)
    set_critic(learner.critic, 1.0, 0.0)
    set_constant_actor(learner.target_actor, 0.5)
    set_critic(learner.target_critic, 2.0, 1.0)
    return learner


def test_critic_target_loss_and_priorities_by_hand():
    learner = hand_learner(priority_eps=1e-3, critic_lr=1e-12)  # critic ~unchanged before the actor loss
    priorities, metrics = learner.update(HAND_BATCH, HAND_WEIGHTS)
    np.testing.assert_allclose(priorities, np.abs(HAND_DELTA) + 1e-3, rtol=0, atol=1e-6)
    assert metrics["critic_loss"] == pytest.approx(np.mean(HAND_WEIGHTS * 0.5 * HAND_DELTA**2), abs=1e-6)
    assert metrics["td_abs_mean"] == pytest.approx(np.mean(np.abs(HAND_DELTA)), abs=1e-6)
    assert metrics["q_mean"] == pytest.approx((0 + T - T) / 3, abs=1e-6)
    assert metrics["actor_loss"] == pytest.approx(-math.tanh(0.0), abs=1e-6)  # -mean Q(s, pi(s) = 0)
    assert set(metrics) == {"critic_loss", "actor_loss", "q_mean", "td_abs_mean"}
    assert all(isinstance(v, float) for v in metrics.values())


def test_critic_gradient_by_hand():
    """dL/dQ_i = -w_i delta_i / 3; Q = o * tanh(a) + b_out, so dL/db_out = -sum w_i delta_i / 3 and
    dL/do = -sum w_i delta_i tanh(a_i) / 3."""
    learner = hand_learner()
    learner.update(HAND_BATCH, HAND_WEIGHTS)
    tanh_a = np.tanh(HAND_BATCH["action"][:, 0].astype(np.float64))
    g = -HAND_WEIGHTS * HAND_DELTA / 3
    assert learner.critic.out.bias.grad.item() == pytest.approx(g.sum(), abs=1e-6)
    assert learner.critic.out.weight.grad.item() == pytest.approx((g * tanh_a).sum(), abs=1e-6)


def test_policy_initial_priorities_use_local_actor_and_critic():
    """Actor side: pi = 0.5, Q = tanh(a) for both roles -> Q(s', pi(s')) = t.
    delta = (1 + 0.5 t - 0, 0 - t, -1 + 0.25 t + t)."""
    policy = DPGPolicy(ONE_D, dataclasses.replace(TINY, priority_eps=1e-3), seed=0)
    set_constant_actor(policy.actor, 0.5)
    set_critic(policy.critic, 1.0, 0.0)
    expected = np.abs([1 + 0.5 * T, -T, -1 + 1.25 * T]) + 1e-3
    np.testing.assert_allclose(policy.initial_priorities(HAND_BATCH), expected, rtol=0, atol=1e-6)


# -- actor gradient clip ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("clip", [1.0, 0.25])
def test_actor_gradients_clipped_elementwise(clip):
    learner = DPGLearner(
        CONT, dataclasses.replace(SMALL, critic_lr=1e-12, actor_grad_clip=clip, dqda_clip=None), seed=0
    )
    with torch.no_grad():
        learner.critic.out.weight.mul_(3000.0)  # steep Q: large actor gradients
    batch = random_batch(np.random.default_rng(0), n=32)
    reference = copy.deepcopy(learner)
    learner.update(batch, np.ones(32))
    # The raw gradient the actor step saw: -mean Q(s, pi(s)) through the (1e-12-step) updated critic.
    obs = torch.from_numpy(batch["obs"])
    loss = -reference.critic(obs, reference.actor(obs)).mean()
    raw = torch.autograd.grad(loss, list(reference.actor.parameters()))
    raw_flat = torch.cat([g.flatten() for g in raw])
    assert (raw_flat.abs() > 2 * clip).any() and (raw_flat.abs() < clip / 2).any()
    for p, g in zip(learner.actor.parameters(), raw):
        assert p.grad.abs().max().item() <= clip
        torch.testing.assert_close(p.grad, g.clamp(-clip, clip), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("clip", [1.0, 2.2])  # |dQ/da| is 1.8-2.5 here: all clipped, or some
def test_dqda_is_clipped_before_it_flows_into_the_actor(clip):
    learner = DPGLearner(CONT, dataclasses.replace(SMALL, critic_lr=1e-12, dqda_clip=clip), seed=0)
    with torch.no_grad():
        learner.critic.out.weight.mul_(3000.0)  # steep Q: dQ/da far beyond the clip for some elements
    batch = random_batch(np.random.default_rng(0), n=32)
    reference = copy.deepcopy(learner)
    learner.update(batch, np.ones(32))
    # Independently: dQ/da per sample through the (1e-12-step) updated critic, clipped, then the actor gradient
    # of -mean_i (clipped dQ/da_i . pi(s_i)) with dQ/da held fixed -- the chain rule with a clipped middle.
    obs = torch.from_numpy(batch["obs"])
    action = reference.actor(obs)
    dqda = torch.autograd.grad(reference.critic(obs, action).sum(), action, retain_graph=True)[0]
    assert (dqda.abs() > clip).any()
    loss = -(dqda.clamp(-clip, clip).detach() * action).sum(-1).mean()
    want = torch.autograd.grad(loss, list(reference.actor.parameters()), retain_graph=True)
    unclipped = torch.autograd.grad(-(dqda.detach() * action).sum(-1).mean(), list(reference.actor.parameters()))
    for p, g, _raw in zip(learner.actor.parameters(), want, unclipped):
        torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-7)
    assert any(not torch.allclose(g, raw) for g, raw in zip(want, unclipped))


@pytest.mark.parametrize("clip", [1.0, 3.1])  # |dQ/da| is 2.9-3.3 here: every row scaled, or some
def test_dqda_clip_norm_scales_each_samples_dqda_to_the_norm(clip):
    learner = DPGLearner(CONT, dataclasses.replace(SMALL, critic_lr=1e-12, dqda_clip=None, dqda_clip_norm=clip), seed=0)
    with torch.no_grad():
        learner.critic.out.weight.mul_(3000.0)
    batch = random_batch(np.random.default_rng(0), n=32)
    reference = copy.deepcopy(learner)
    learner.update(batch, np.ones(32))
    # Independently: each row of dQ/da scaled by min(1, clip / |row|), then the chain rule (trfl's clip_by_norm).
    obs = torch.from_numpy(batch["obs"])
    action = reference.actor(obs)
    dqda = torch.autograd.grad(reference.critic(obs, action).sum(), action, retain_graph=True)[0]
    norms = dqda.norm(dim=1)
    assert (norms > clip).any() and ((norms < clip).any() or clip < 2.9)  # rows scaled (and some kept at 3.1)
    scaled = torch.stack([row * min(1.0, clip / float(row.norm())) for row in dqda])
    assert (scaled.norm(dim=1) <= clip * (1 + 1e-5)).all()
    assert not torch.allclose(scaled, dqda.clamp(-clip, clip))  # not the element-wise clip
    loss = -(scaled.detach() * action).sum(-1).mean()
    want = torch.autograd.grad(loss, list(reference.actor.parameters()))
    for p, g in zip(learner.actor.parameters(), want):
        torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-7)


def test_grad_clip_norm_bounds_each_networks_global_gradient_norm():
    batch = random_batch(np.random.default_rng(0), n=32)

    def grads(clip):
        learner = DPGLearner(CONT, dataclasses.replace(SMALL, dqda_clip=None, grad_clip_norm=clip), seed=0)
        with torch.no_grad():
            learner.critic.out.weight.mul_(3000.0)
        learner.update(batch, np.ones(32))
        return [[p.grad.clone() for p in net.parameters()] for net in (learner.critic, learner.actor)]

    def norm(gs):
        return float(torch.linalg.vector_norm(torch.cat([g.flatten() for g in gs])))

    raw, clipped = grads(None), grads(0.1)
    for raw_net, clipped_net in zip(raw, clipped):
        assert norm(raw_net) > 0.1  # so the clip acts
        assert norm(clipped_net) == pytest.approx(0.1, rel=1e-4)
        for r, c in zip(raw_net, clipped_net):  # the same direction, scaled
            torch.testing.assert_close(c, r * (0.1 / norm(raw_net)), rtol=1e-3, atol=1e-8)


def test_the_actor_loss_is_taken_at_next_obs_when_asked():
    learner = DPGLearner(
        CONT, dataclasses.replace(SMALL, critic_lr=1e-12, dqda_clip=None, actor_loss_state="next_obs"), seed=0
    )
    batch = random_batch(np.random.default_rng(0), n=16)
    reference = copy.deepcopy(learner)
    _, metrics = learner.update(batch, np.ones(16))
    actor_params = list(reference.actor.parameters())

    def grads_at(key):
        s = torch.from_numpy(batch[key])
        q = reference.critic(s, reference.actor(s))
        return -q.mean().item(), torch.autograd.grad(-q.mean(), actor_params)

    (loss_next, want), (_, at_obs) = grads_at("next_obs"), grads_at("obs")
    assert metrics["actor_loss"] == pytest.approx(loss_next, rel=1e-4)
    for p, g in zip(learner.actor.parameters(), want):
        torch.testing.assert_close(p.grad, g, rtol=1e-3, atol=1e-7)
    assert any(not torch.allclose(g, o) for g, o in zip(want, at_obs))


@pytest.mark.parametrize("weights", ["online", "target"])
def test_actors_get_the_online_or_the_target_networks(weights):
    learner = DPGLearner(CONT, dataclasses.replace(SMALL, target_update_period=1000, actor_weights=weights), seed=0)
    learner.update(random_batch(np.random.default_rng(0)), np.ones(8))  # online moves, targets stay
    sent = learner.policy_state_dict()
    nets = (
        {"actor": learner.target_actor, "critic": learner.target_critic}
        if weights == "target"
        else {"actor": learner.actor, "critic": learner.critic}
    )
    for name, net in nets.items():
        for key, value in net.state_dict().items():
            assert torch.equal(sent[f"{name}/{key}"], value.cpu())
    online = learner.actor.state_dict()["body.layers.0.weight"]
    assert torch.equal(sent["actor/body.layers.0.weight"], online) == (weights == "online")
    policy = DPGPolicy(CONT, dataclasses.replace(SMALL, actor_weights=weights), seed=1)
    policy.load_policy_state_dict(sent)  # the same names either way


def test_actor_grad_clip_none_keeps_raw_gradients():
    learner = DPGLearner(CONT, dataclasses.replace(SMALL, actor_grad_clip=None, dqda_clip=None), seed=0)
    with torch.no_grad():
        learner.critic.out.weight.mul_(3000.0)
    learner.update(random_batch(np.random.default_rng(0), n=32), np.ones(32))
    assert max(p.grad.abs().max().item() for p in learner.actor.parameters()) > 1.0


# -- exploration ------------------------------------------------------------------------------------------------


def test_noise_off_in_eval_and_actions_in_range():
    policy = DPGPolicy(CONT, SMALL, seed=0)
    obs = np.random.default_rng(1).standard_normal(5).astype(np.float32)
    mean = policy.actor(torch.from_numpy(obs)[None])[0].detach().numpy()
    for _ in range(3):
        a = policy.act(obs, explore=False)
        assert a.dtype == np.float32 and a.shape == (2,)
        np.testing.assert_array_equal(a, mean)
    noisy = np.stack([policy.act(obs) for _ in range(2000)])
    assert noisy.dtype == np.float32 and noisy.shape == (2000, 2)
    np.testing.assert_allclose(noisy.std(axis=0), 0.3, rtol=0.1)  # sigma = 0.3, rarely clipped near 0
    np.testing.assert_allclose(noisy.mean(axis=0), mean, atol=0.03)
    wild = DPGPolicy(CONT, SMALL, sigma=5.0, seed=0)
    wide = np.stack([wild.act(obs) for _ in range(500)])
    assert wide.min() == -1.0 and wide.max() == 1.0 and np.all(np.abs(wide) <= 1.0)


def test_policy_actions_are_seeded():
    a, b = (DPGPolicy(CONT, SMALL, seed=7) for _ in range(2))
    obs = np.zeros(5, np.float32)
    assert all(np.array_equal(a.act(obs), b.act(obs)) for _ in range(5))
    with pytest.raises(ValueError, match="sigma"):
        DPGPolicy(CONT, SMALL, sigma=-0.1)


# -- target copies ----------------------------------------------------------------------------------------------


def test_target_networks_copied_every_period():
    learner = DPGLearner(CONT, SMALL, seed=0)  # target_update_period = 2
    rng = np.random.default_rng(0)
    last = (params(learner.target_actor), params(learner.target_critic))
    for step in range(1, 6):
        learner.update(random_batch(rng), np.ones(8))
        now = (params(learner.target_actor), params(learner.target_critic))
        online = (params(learner.actor), params(learner.critic))
        if step % 2 == 0:
            assert same(now[0], online[0]) and same(now[1], online[1]), step
            last = now
        else:
            assert same(now[0], last[0]) and same(now[1], last[1]), step
            assert not same(now[1], online[1]), step


# -- state round trips ------------------------------------------------------------------------------------------


def test_policy_round_trip_gives_identical_actions_and_priorities():
    learner = DPGLearner(CONT, SMALL, seed=1)
    learner.update(random_batch(np.random.default_rng(0)), np.ones(8))
    weights = learner.policy_state_dict()
    assert {k.split("/")[0] for k in weights} == {"actor", "critic"}
    policy = DPGPolicy(CONT, SMALL, seed=2)
    policy.load_policy_state_dict(safetensors.torch.load(safetensors.torch.save(weights)))
    obs = np.random.default_rng(3).standard_normal((20, 5)).astype(np.float32)
    expected = learner.actor(torch.from_numpy(obs)).detach().numpy()
    got = np.stack([policy.act(o, explore=False) for o in obs])  # one by one vs batched: float32 rounding only
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    batch = random_batch(np.random.default_rng(4))
    again = DPGPolicy(CONT, SMALL, seed=3)
    again.load_policy_state_dict(policy.policy_state_dict())
    np.testing.assert_array_equal(policy.initial_priorities(batch), again.initial_priorities(batch))


def test_wrong_policy_weights_refused():
    policy = DPGPolicy(CONT, SMALL)
    before = params(policy.actor)
    weights = DPGLearner(CONT, SMALL).policy_state_dict()
    del weights["critic/out.bias"]
    weights["actor/body.layers.0.weight"] = torch.zeros(16, 6)
    with pytest.raises(ValueError) as err:
        policy.load_policy_state_dict(weights)
    assert "missing ['critic/out.bias']" in str(err.value)
    assert "actor/body.layers.0.weight: got torch.float32 (16, 6), expected torch.float32 (16, 5)" in str(err.value)
    assert same(params(policy.actor), before)


def test_checkpoint_round_trip_continues_identically():
    rng = np.random.default_rng(0)
    batches = [random_batch(rng) for _ in range(5)]
    a = DPGLearner(CONT, dataclasses.replace(SMALL, target_update_period=4), seed=0)
    for b in batches[:3]:
        a.update(b, np.ones(8))
    ckpt = safetensors.torch.load(safetensors.torch.save(a.state_dict()))
    assert int(ckpt["steps"]) == 3 and ckpt["steps"].dtype == torch.int64
    assert "optim/critic/3/exp_avg" in ckpt and "optim/actor/0/exp_avg_sq" in ckpt
    b = DPGLearner(CONT, dataclasses.replace(SMALL, target_update_period=4), seed=42)
    b.load_state_dict(ckpt)
    for batch in batches[3:]:  # the 4th update copies the targets
        pa, ma = a.update(batch, np.ones(8))
        pb, mb = b.update(batch, np.ones(8))
        np.testing.assert_array_equal(pa, pb)
        assert ma == mb
    for net in ("actor", "critic", "target_actor", "target_critic"):
        for x, y in zip(params(getattr(a, net)), params(getattr(b, net))):
            torch.testing.assert_close(x, y, rtol=0, atol=1e-6)


def test_checkpoint_refusals():
    learner = DPGLearner(CONT, SMALL)
    fresh = learner.state_dict()
    assert not any(k.startswith("optim/") for k in fresh)
    learner.update(random_batch(np.random.default_rng(0)), np.ones(8))
    ckpt = learner.state_dict()
    other = DPGLearner(CONT, SMALL, seed=1)
    other.load_state_dict(fresh)
    with pytest.raises(ValueError, match=r"missing \['optim/actor/0/exp_avg'\]"):
        other.load_state_dict({k: v for k, v in ckpt.items() if k != "optim/actor/0/exp_avg"})
    with pytest.raises(ValueError, match=r"missing \['target_critic/out.weight'\]"):
        other.load_state_dict({k: v for k, v in ckpt.items() if k != "target_critic/out.weight"})


def test_transition_spec_and_config():
    assert DPGLearner(CONT, SMALL).transition_spec == TransitionSpec.dpg(5, 2)
    c = DPGConfig()
    assert (c.n_step, c.batch_size, c.actor_lr, c.critic_lr, c.target_update_period, c.noise_sigma) == (
        3,
        256,
        1e-4,
        1e-4,
        100,
        0.3,
    )  # n = 3: the Ape-X paper's (5 is D4PG's)
    assert (c.dqda_clip_norm, c.grad_clip_norm, c.actor_loss_state, c.actor_weights) == (None, None, "obs", "online")
    assert (c.critic_hidden, c.actor_hidden, c.dqda_clip, c.actor_grad_clip) == ((400, 300), (300, 200), 1.0, None)
    for bad in [
        dict(critic_hidden=(400,)),
        dict(noise_sigma=-1.0),
        dict(actor_grad_clip=0.0),
        dict(gamma=2.0),
        dict(dqda_clip=-1.0),
        dict(dqda_clip_norm=0.0),
        dict(grad_clip_norm=-1.0),
        dict(dqda_clip=1.0, dqda_clip_norm=1.0),
        dict(actor_loss_state="s"),
        dict(actor_weights="best"),
    ]:
        with pytest.raises(ValueError):
            DPGConfig(**bad)
    with pytest.raises(ValueError, match="continuous"):
        DPGLearner(EnvSpec("test:disc", (4,), np.dtype(np.float32), 2, None, 1, 10))


def test_default_networks_shapes():
    learner = DPGLearner(CONT, seed=0)
    shapes = {k: tuple(v.shape) for k, v in learner.policy_state_dict().items()}
    assert shapes["actor/body.layers.0.weight"] == (300, 5) and shapes["actor/body.layers.4.weight"] == (2, 200)
    assert shapes["critic/obs_layer.weight"] == (400, 5) and shapes["critic/joint_layer.weight"] == (300, 402)
    assert shapes["critic/out.weight"] == (1, 300)


def test_the_paper_preset_clips_dqda_and_the_tuned_ones_say_they_clip_parameter_gradients():
    from apexrl.launch.presets import get_preset

    paper = get_preset("apex-dpg-control").agent_config()
    assert (paper.dqda_clip, paper.actor_grad_clip) == (1.0, None)
    assert paper.n_step == 3  # the Ape-X paper: "hyperparameters are otherwise as per DQN"
    for name in ("cartpole-swingup", "pendulum"):
        tuned = get_preset(name)
        assert (tuned.agent_config().dqda_clip, tuned.agent_config().actor_grad_clip) == (None, 1.0)
        assert "parameter-gradient clipping" in tuned.description
