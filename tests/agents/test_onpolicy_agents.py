"""The on-policy agents (PPO, A2C, TRPO, IMPALA) through the seam: a policy's per-step extras, a learner's update on
popped items with the policy lag, weights and checkpoints."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.agents import get_agent
from apexrl.envs import env_spec
from tests.torch_helpers import one_thread  # noqa: F401  (fixture)


def _batch(spec, config, rng, n=4):
    """Popped items as ``onpolicy_batch`` makes them; behaviour parameters of a uniform / unit policy."""
    t = config.unroll + 1
    continuous = spec.num_actions is None
    action = rng.normal(size=(n, t, spec.action_dim)).astype(np.float32) if continuous else rng.integers(0, 2, (n, t))
    trained = np.ones((n, t), bool)
    trained[:, -1] = False
    return {
        "obs": rng.normal(size=(n, t, *spec.obs_shape)).astype(np.float32),
        "action": action,
        "reward": rng.normal(size=(n, t)).astype(np.float32),
        "discount": np.ones((n, t), np.float32),
        "trained": trained,
        "logp": np.full((n, t), -1.0, np.float32),
        "version": np.zeros((n, t), np.int64),
        **(
            {
                "loc": np.zeros((n, t, spec.action_dim), np.float32),
                "scale": np.ones((n, t, spec.action_dim), np.float32),
            }
            if continuous
            else {"logits": np.zeros((n, t, spec.num_actions), np.float32)}
        ),
    }


AGENTS = {"ppo": dict(minibatch_size=8, value_clip=0.5), "a2c": dict(entropy_coeff=0.01), "trpo": {}, "impala": {}}


@pytest.mark.parametrize("env", ["gym:CartPole-v1", "gym:Pendulum-v1"])
@pytest.mark.parametrize("name", list(AGENTS))
def test_the_learner_and_the_policy_through_the_seam(name, env):
    agent, spec = get_agent(name), env_spec(env)
    config = agent.config_class(unroll=6, critic_iterations=3, **AGENTS[name])
    learner = agent.make_learner(spec, config, torch.device("cpu"), 0)
    policy = agent.make_batch_policy(spec, config, [0, 1], 2, 0)
    rng = np.random.default_rng(0)
    obs = rng.normal(size=(2, *spec.obs_shape)).astype(np.float32)
    actions, extras = policy.act_batch_extras(obs, [True, False])
    params = {"trpo": {"logits"} if spec.num_actions else {"loc", "scale"}}.get(name, set())
    assert len(actions) == 2 and set(extras[0]) == {"logp", "version", *params} and extras[0]["version"] == 0
    assert np.isfinite(extras[1]["logp"]) and extras[1]["logp"] <= (0 if spec.num_actions else np.inf)
    batch = _batch(spec, config, rng)
    batch["logp"] = np.asarray(  # the uniform / unit behaviour policy's own
        torch.distributions.Categorical(logits=torch.as_tensor(batch["logits"])).log_prob(
            torch.as_tensor(batch["action"])
        )
        if spec.num_actions
        else torch.distributions.Normal(0.0, 1.0).log_prob(torch.as_tensor(batch["action"])).sum(-1),
        np.float32,
    )
    priorities, metrics = learner.update(batch, np.ones(4))
    assert priorities.tolist() == [1.0] * 4 and set(metrics) == set(learner.metric_names)
    assert metrics["policy_lag_mean"] == 0.0
    _, metrics = learner.update({**_batch(spec, config, rng), "version": np.zeros((4, 7), np.int64)}, np.ones(4))
    assert metrics["policy_lag_max"] == 1.0  # acted with version 0, the learner is at 1
    policy.load_policy_state_dict(learner.policy_state_dict())
    assert policy.version == 2
    np.testing.assert_array_equal(  # the greedy action is the learner's
        policy.act(obs[0], explore=False),
        learner.actor.greedy(learner.obs_norm(torch.as_tensor(obs[:1])))[0].numpy(),
    )
    # checkpoints: a fresh learner restores everything, bad input changes nothing
    fresh = agent.make_learner(spec, config, torch.device("cpu"), 1)
    state = learner.state_dict()
    with pytest.raises(ValueError, match="checkpoint"):
        fresh.load_state_dict({k: v for k, v in state.items() if not k.startswith("critic/")})
    assert fresh.steps == 0
    fresh.load_state_dict(state)
    assert fresh.steps == 2
    for k, v in fresh.state_dict().items():
        assert torch.equal(v, state[k]), k
    with pytest.raises(ValueError, match="policy weights"):
        policy.load_policy_state_dict({k: v for k, v in learner.policy_state_dict().items() if k != "version"})
    assert policy.version == 2


def test_impala_without_the_vtrace_correction_weighs_every_step_one():
    agent, spec = get_agent("impala"), env_spec("gym:CartPole-v1")
    rng = np.random.default_rng(0)
    for vtrace, low in ((True, True), (False, False)):
        config = agent.config_class(unroll=6, vtrace=vtrace)
        learner = agent.make_learner(spec, config, torch.device("cpu"), 0)
        batch = _batch(spec, config, rng)
        batch["logp"][:] = 0.0  # the behaviour policy was sure of every action: pi / mu < 1
        _, metrics = learner.update(batch, np.ones(4))
        assert (metrics["rho_mean"] < 0.9) == low and metrics["rho_mean"] <= 1.0


def test_the_vtrace_flag_reaches_impala_and_is_refused_elsewhere():
    import argparse

    from apexrl.cli.args import add_agent_arguments, agent_overrides
    from apexrl.launch.plan import Overrides, plan

    parser = argparse.ArgumentParser()
    add_agent_arguments(parser)
    flags = agent_overrides(parser.parse_args(["--vtrace", "off"]))
    assert flags.agent_fields == {"vtrace": False}

    assert plan("impala-cartpole", Overrides(agent_fields={"vtrace": False})).learner.agent_config.vtrace is False
    assert plan("impala-cartpole").learner.agent_config.vtrace is True
    with pytest.raises(ValueError, match="vtrace"):
        plan("ppo-cartpole", Overrides(agent_fields={"vtrace": False}))


@pytest.mark.parametrize("name", list(AGENTS))
def test_an_on_policy_agent_on_a_control_suite_task_starts_from_its_swingup_preset(name):
    """``--agent NAME --env dmc:TASK`` without a preset takes the agent's Control Suite settings (its queue and a
    min size of one batch), not the Ape-X defaults, whose min size of 50,000 no queue of 1,024 could ever reach."""
    from apexrl.launch.plan import Overrides, plan

    for env in ("dmc:cartpole-swingup", "dmc:walker-walk"):
        p = plan(overrides=Overrides(agent=name, env=env))
        assert p.preset == f"{name}-cartpole-swingup"
        assert p.learner.min_replay_size <= p.learner.agent_config.batch_size
