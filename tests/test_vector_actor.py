"""Vectorised actors (``--envs-per-actor K``): batched acting with per-environment exploration, the fallback for
agents without a batched policy, and a real run of K environments per actor started with ``apexrl.run`` from a
thread on a gymnasium MuJoCo task."""

from __future__ import annotations

import csv
import os
import threading

import numpy as np
import pytest
from apexrl.agents import epsilon_ladder, get_agent
from apexrl.agents.base import AgentDef, PolicyBatch, batch_policy
from apexrl.agents.d4pg import sigma_ladder
from apexrl.apex.actor import env_seed
from apexrl.envs import env_spec


def test_the_epsilon_ladder_runs_over_every_environment_of_the_run():
    dqn, spec = get_agent("dqn"), env_spec("gym:CartPole-v1")
    config = dqn.config_class()
    policies = [batch_policy(dqn, spec, config, i, 3, 4, seed=i) for i in range(3)]
    eps = [e for p in policies for e in p.explorations]
    assert eps == [epsilon_ladder(s, 12, config.epsilon_base, config.epsilon_alpha) for s in range(12)]
    # K = 1 is the actor's own rung, as without vectorising.
    assert batch_policy(dqn, spec, config, 2, 3, 1, seed=0).explorations == [epsilon_ladder(2, 3)]


def test_a_batched_act_explores_per_environment():
    dqn = get_agent("dqn")
    spec = env_spec("gym:CartPole-v1")
    policy = dqn.make_batch_policy(spec, dqn.config_class(), [0, 1], 2, 0)
    policy.epsilons = np.array([1.0, 0.0])  # env 0 always random, env 1 always greedy
    obs = np.zeros((2, 4), np.float32)
    greedy = policy.act(obs[1], explore=False)
    actions = np.array([policy.act_batch(obs) for _ in range(200)])
    assert set(actions[:, 0]) == {0, 1} and set(actions[:, 1]) == {greedy}

    d4pg = get_agent("d4pg")
    pend = env_spec("gym:Pendulum-v1")
    config = d4pg.config_class()
    policy = d4pg.make_batch_policy(pend, config, [0, 1, 2], 3, 0)
    assert policy.explorations == pytest.approx([sigma_ladder(s, 3, config.noise_sigma_min, config.noise_sigma_max)
                                                 for s in range(3)])
    policy.sigmas = np.array([0.0, 0.5, 0.0])
    a = np.array(policy.act_batch(np.zeros((3, 3), np.float32)))
    mean = policy.act(np.zeros(3, np.float32), explore=False)
    assert a.shape == (3, 1) and a[0] == pytest.approx(mean) and a[2] == pytest.approx(mean) and a[1] != a[0]


def test_an_agent_without_a_batched_policy_gets_one_policy_per_environment():
    dqn = get_agent("dqn")
    plain = AgentDef("plain", "dqn without make_batch_policy", dqn.config_class, dqn.check_env, dqn.make_learner,
                     dqn.make_policy)
    spec = env_spec("gym:CartPole-v1")
    policy = batch_policy(plain, spec, dqn.config_class(), 1, 2, 3, seed=5)
    assert isinstance(policy, PolicyBatch) and len(policy.policies) == 3
    assert policy.explorations == [epsilon_ladder(s, 6) for s in (3, 4, 5)]
    assert len(policy.act_batch(np.zeros((3, 4), np.float32))) == 3
    weights = batch_policy(dqn, spec, dqn.config_class(), 0, 1, 1, seed=9).policy_state_dict()
    policy.load_policy_state_dict(weights)
    for p in policy.policies:
        assert all(np.array_equal(weights[k], v) for k, v in p.policy_state_dict().items())


def test_environment_seeds_are_the_actors_first_then_distinct():
    assert env_seed(12345, 0) == 12345
    seeds = {env_seed(a, j) for a in range(50) for j in range(1, 20)}
    assert len(seeds) == 50 * 19 and not seeds & set(range(50))


def test_apexrl_run_from_a_thread_trains_vectorised_actors_on_a_mujoco_task(tmp_path):
    import apexrl

    out = tmp_path / "out.txt"
    result = {}

    def go():
        with open(out, "w") as f:
            result["r"] = apexrl.run(env="gym:InvertedPendulum-v5", actors=1, envs_per_actor=3, steps=30,
                                     minutes=4, final_eval=2, run_dir=str(tmp_path / "run"), out=f,
                                     learner_args=["--min-replay-size", "300", "--eval-every", "0"])

    thread = threading.Thread(target=go)
    thread.start()
    thread.join(300)
    assert not thread.is_alive()
    text = out.read_text()
    r = result["r"]
    assert r.exit_status == 0, text
    assert "agent dpg, env gym:InvertedPendulum-v5, 1 actors x 3 environments" in text  # DPG by its Box actions
    assert r.run_dir == str(tmp_path / "run") and "reached --steps 30" in text
    assert r.final_eval is not None and r.final_eval["episodes"] == 2 and np.isfinite(r.final_eval["mean"])
    with open(os.path.join(r.run_dir, "episodes.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert {row["env"] for row in rows} == {"0", "1", "2"}  # every environment finished episodes
    assert {row["exploration"] for row in rows} == {"0.3"}  # DPG: the config's sigma in every environment


def test_apexrl_run_refuses_bad_arguments_and_stops_on_request(tmp_path):
    import apexrl

    with pytest.raises(ValueError, match="envs-per-actor: 0 is out of range"):
        apexrl.run(env="gym:CartPole-v1", envs_per_actor=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'actor'"):
        apexrl.run(actor=2)
    stop = threading.Event()
    stop.set()  # stopping before the first progress line: the run ends cleanly at once
    with open(tmp_path / "out.txt", "w") as f:
        r = apexrl.run(env="gym:CartPole-v1", actors=1, run_dir=str(tmp_path / "run"), stop=stop, out=f)
    assert r.exit_status == 0 and r.final_eval is None
    assert "stopping: stop requested" in (tmp_path / "out.txt").read_text()
