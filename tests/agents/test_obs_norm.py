"""Observation normalisation (``obs_norm``) of the continuous-control agents: the running statistics against
numpy, the learner folding its sampled batches in, the statistics reaching actors and evaluation with the
weights and checkpoints, the flag reaching the config, and the paper presets left without it."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from apexrl.agents import get_agent
from apexrl.agents.normalize import CLIP, EPS, ObsNormalizer
from apexrl.envs import env_spec, make_env
from apexrl.launch.presets import PRESETS
from tests.torch_helpers import one_thread  # noqa: F401 - one_thread is an autouse fixture

CONTINUOUS = ("dpg", "d4pg", "td3", "sac")


def test_running_statistics_match_numpy_over_uneven_batches():
    rng = np.random.default_rng(0)
    norm = ObsNormalizer(3)
    x = torch.tensor([[1.0, 200.0, -3.0]])
    assert torch.equal(norm(x), x)  # count 0: unchanged
    seen = []
    for n in (1, 7, 256, 3, 64):
        batch = rng.normal([5.0, -100.0, 0.0], [2.0, 30.0, 1e-3], (n, 3)).astype(np.float32)
        seen.append(batch)
        norm.update(torch.as_tensor(batch))
    data = np.concatenate(seen).astype(np.float64)
    assert norm.count.item() == len(data)
    np.testing.assert_allclose(norm.mean.numpy(), data.mean(0), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), data.var(0), rtol=1e-9)
    probe = np.array([[5.0, -100.0, 0.0], [100.0, 0.0, 1.0]], np.float32)
    expected = np.clip((probe - data.mean(0)) / np.sqrt(data.var(0) + EPS), -CLIP, CLIP)
    np.testing.assert_allclose(norm(torch.as_tensor(probe)).numpy(), expected, rtol=1e-5, atol=1e-5)
    assert norm(torch.as_tensor(probe))[1].abs().max().item() == CLIP  # far outliers are clipped


def _pendulum_batch(n: int, seed: int) -> dict[str, np.ndarray]:
    """Transitions of gymnasium's Pendulum under random actions (its angular velocity spans [-8, 8])."""
    env = make_env("gym:Pendulum-v1", seed=seed)
    rng = np.random.default_rng(seed)
    obs = env.reset()
    rows: dict[str, list] = {k: [] for k in ("obs", "action", "reward", "discount", "next_obs")}
    for _ in range(n):
        action = rng.uniform(-1, 1, 1).astype(np.float32)
        step = env.step(action)
        for k, v in zip(rows, (obs, action, step.reward, 0.99, step.obs)):
            rows[k].append(v)
        obs = env.reset() if step.terminated or step.truncated else step.obs
    return {k: np.asarray(v, np.float32) for k, v in rows.items()}


def _small(agent: str, **fields):
    config_class = get_agent(agent).config_class
    names = {f.name for f in dataclasses.fields(config_class)}
    sizes = {"actor_hidden": (16, 16), "critic_hidden": (16, 16), "batch_size": 32}
    if agent == "d4pg":
        sizes["num_atoms"] = 11
    return config_class(**{k: v for k, v in {**sizes, **fields}.items() if k in names})


@pytest.mark.parametrize("agent", CONTINUOUS)
def test_the_learner_keeps_statistics_of_its_batches_and_ships_them_to_actors_and_evaluation(agent):
    spec = env_spec("gym:Pendulum-v1")
    agent_def = get_agent(agent)
    config = _small(agent, obs_norm=True)
    learner = agent_def.make_learner(spec, config, torch.device("cpu"), 0)
    data = _pendulum_batch(96, seed=1)
    for i in range(3):
        learner.update({k: v[32 * i : 32 * (i + 1)] for k, v in data.items()}, np.ones(32))
    norm = learner.obs_norm
    assert norm.count.item() == 96  # the sampled obs of every update, once each
    np.testing.assert_allclose(norm.mean.numpy(), data["obs"].astype(np.float64).mean(0), rtol=1e-9, atol=1e-12)
    np.testing.assert_allclose(norm.var.numpy(), data["obs"].astype(np.float64).var(0), rtol=1e-6)

    weights = learner.policy_state_dict()
    assert {"obs_norm/count", "obs_norm/mean", "obs_norm/var"} <= set(weights)
    # evaluation's policy: actor 0 of 1, acting with explore=False, on a real Pendulum observation
    policy = agent_def.make_policy(spec, config, 0, 1, 0)
    policy.load_policy_state_dict(weights)
    obs = make_env("gym:Pendulum-v1", seed=2).reset()
    x = norm(torch.as_tensor(obs[None]))
    with torch.no_grad():
        out = learner.actor(x)
        expected = torch.tanh(out[0]) if agent == "sac" else out
    np.testing.assert_allclose(policy.act(obs, explore=False), expected[0].numpy(), rtol=1e-5, atol=1e-6)
    # a vectorised actor's policy normalises its stacked observations the same way
    batched = agent_def.make_batch_policy(spec, config, [0, 1], 2, 0)
    batched.load_policy_state_dict(weights)
    for got in batched.act_batch(np.stack([obs, obs]), explore=False):
        np.testing.assert_allclose(got, expected[0].numpy(), rtol=1e-5, atol=1e-6)
    # a policy without normalisation cannot load normalised weights (and the other way round)
    plain = agent_def.make_policy(spec, _small(agent), 0, 1, 0)
    with pytest.raises(ValueError, match="obs_norm"):
        plain.load_policy_state_dict(weights)
    with pytest.raises(ValueError, match="obs_norm"):
        policy.load_policy_state_dict(plain.policy_state_dict())

    # checkpoints carry the statistics
    state = learner.state_dict()
    restored = agent_def.make_learner(spec, config, torch.device("cpu"), 5)
    restored.load_state_dict(state)
    for name in ("count", "mean", "var"):
        assert torch.equal(getattr(restored.obs_norm, name), getattr(norm, name))


@pytest.mark.parametrize("agent", CONTINUOUS)
def test_normalisation_off_adds_nothing(agent):
    spec = env_spec("gym:Pendulum-v1")
    learner = get_agent(agent).make_learner(spec, _small(agent), torch.device("cpu"), 0)
    assert learner.obs_norm is None
    assert not any(k.startswith("obs_norm") for k in learner.policy_state_dict())
    assert not any(k.startswith("obs_norm") for k in learner.state_dict())


def test_every_existing_preset_runs_without_normalisation():
    for name in (
        "apex-dpg-control",
        "cartpole-swingup",
        "pendulum",
        "apex-d4pg-control",
        "d4pg-acme",
        "d4pg-cartpole-swingup",
    ):
        assert PRESETS[name].agent_config().obs_norm is False, name


def test_the_obs_norm_flag_reaches_the_config():
    from apexrl.cli.args import agent_overrides
    from apexrl.cli.main import build_parser
    from apexrl.launch.plan import plan

    for flag, value in (("on", True), ("off", False)):
        args = build_parser().parse_args(["run", "--preset", "apex-d4pg-control", "--obs-norm", flag])
        p = plan("apex-d4pg-control", agent_overrides(args))
        assert p.learner.agent_config.obs_norm is value
        assert all(a.agent_config.obs_norm is value for a in p.actors)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--obs-norm", "maybe"])
