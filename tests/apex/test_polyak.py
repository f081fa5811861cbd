"""Polyak-averaged evaluation weights: the average follows the learner's real steps as computed by hand, only
the policy's parameters are averaged, a resumed learner continues the checkpoint's average, and a checkpoint
scored by ``apexrl evaluate`` has its average loaded into the policy."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest
import torch

from apexrl.agents.dpg import DPGConfig, DPGLearner
from apexrl.agents.dqn import DQNLearner
from apexrl.apex.checkpoint import load_checkpoint
from apexrl.apex.config import LearnerConfig
from apexrl.apex.polyak import POLYAK_PREFIX, PolyakAverage, evaluated_weights, split_average
from apexrl.envs import EnvSpec
from tests.agents.test_dqn import SMALL, VEC, random_batch

TAU = 0.25  # large enough that a few steps move the average visibly


def _step(learner, average: PolyakAverage, rng: np.random.Generator) -> None:
    learner.update(random_batch(rng), np.ones(8))
    average.update()


def test_the_average_follows_the_real_steps_as_computed_by_hand() -> None:
    learner = DQNLearner(VEC, SMALL, seed=0)  # target copies every 3 steps: an in-place load_state_dict
    average = PolyakAverage(learner, TAU)
    by_hand = {k: v.double() for k, v in learner.policy_state_dict().items()}
    rng = np.random.default_rng(1)
    for _ in range(5):
        _step(learner, average, rng)
        online = learner.policy_state_dict()
        by_hand = {k: a + TAU * (online[k].double() - a) for k, a in by_hand.items()}
    got = average.policy_state_dict()
    assert set(got) == set(online) == set(average.names)
    for k, a in by_hand.items():
        torch.testing.assert_close(got[k].double(), a, rtol=1e-5, atol=1e-6)
        assert not torch.equal(got[k], online[k])  # 5 steps at tau 0.25 keep the average apart from the weights


def test_only_the_acting_networks_are_averaged_the_rest_is_taken_as_it_is() -> None:
    spec = EnvSpec("test:box3", (3,), np.dtype(np.float32), None, 2, 1, 100)
    learner = DPGLearner(spec, DPGConfig(actor_hidden=(8,), critic_hidden=(8, 8), obs_norm=True), seed=0)
    average = PolyakAverage(learner, TAU)
    assert average.names and all(n.startswith("actor/") for n in average.names)
    with torch.no_grad():  # what training does in place: the weights and the observation statistics move
        for p in [*learner.actor.parameters(), *learner.critic.parameters()]:
            p.add_(1.0)
        learner.obs_norm.update(torch.full((4, 3), 7.0))
    average.update()
    online, got = learner.policy_state_dict(), average.policy_state_dict()
    assert set(got) == set(online)
    for k in online:
        if k.startswith("actor/"):
            torch.testing.assert_close(got[k], online[k] - 1.0 + TAU)  # moved a quarter of the way
        else:  # the critic (initial priorities) and obs_norm/... (statistics): copied
            assert torch.equal(got[k], online[k]), k


def test_bad_settings_and_averages_are_refused_with_the_reason() -> None:
    learner = DQNLearner(VEC, SMALL, seed=0)
    with pytest.raises(ValueError, match="polyak_tau"):
        PolyakAverage(learner, 0.0)
    with pytest.raises(ValueError, match="eval_weights"):
        LearnerConfig(agent="dqn", env="gym:CartPole-v1", replay="tcp://127.0.0.1:1", eval_weights="mean")
    average = PolyakAverage(learner, TAU)
    state = average.averaged()
    name = average.names[0]
    before = average.averaged()
    with pytest.raises(ValueError, match=f"missing {name}"):
        average.load({k: v for k, v in state.items() if k != name})
    with pytest.raises(ValueError, match="expected"):
        average.load({**state, name: torch.zeros(1)})
    assert all(torch.equal(before[k], v) for k, v in average.averaged().items())  # nothing changed
    with pytest.raises(ValueError, match="does not"):
        evaluated_weights(learner.policy_state_dict(), {"q_net/extra": torch.zeros(1)})


def test_a_resumed_learner_continues_the_checkpoints_average(start_server, tmp_path) -> None:
    from apexrl.apex.learner import Learner

    server = start_server("--capacity", "1000")
    config = LearnerConfig(
        agent="dqn",
        env="gym:CartPole-v1",
        replay=server.endpoint,
        run_dir=str(tmp_path / "run"),
        eval_every=0,
        eval_weights="polyak",
        polyak_tau=TAU,
    )
    first = Learner(config)
    rng = np.random.default_rng(3)
    try:
        assert first.polyak is not None
        for _ in range(3):  # real updates on CartPole-shaped batches
            first.agent.update(random_batch(rng, env=first.env_spec), np.ones(8))
            first.polyak.update()
        assert first.save(0.0)
        saved = first.polyak.averaged()
        online = first.agent.policy_state_dict()
        scored = first._eval_weights()  # what the periodic evaluations and the best checkpoint get
        assert set(scored) == set(online) and all(torch.equal(scored[k], v) for k, v in saved.items())
    finally:
        first.close()
    tensors, meta = load_checkpoint(os.path.join(config.run_dir, "checkpoint.safetensors"))
    assert (meta["eval_weights"], meta["polyak_tau"]) == ("polyak", TAU)
    state, average = split_average(tensors)
    assert set(average) == set(saved) and not any(k.startswith(POLYAK_PREFIX) for k in state)

    resumed = Learner(dataclasses.replace(config, resume=True))
    try:
        assert resumed.polyak is not None
        got = resumed.polyak.averaged()
        for k in saved:  # the average carried on, not restarted at the resumed weights
            assert torch.equal(got[k], saved[k]) and not torch.equal(got[k], online[k])
        resumed.polyak.update()  # and it moves on from there
        for k, v in resumed.polyak.averaged().items():
            torch.testing.assert_close(v, saved[k] + TAU * (online[k] - saved[k]))
    finally:
        resumed.close()


def test_the_flags_on_the_learner_and_on_apexrl_run(tmp_path, capsys) -> None:
    from apexrl.cli import learner as learner_cli
    from apexrl.cli.main import launch_plan

    base = ["--preset", "cartpole", "--replay", "tcp://127.0.0.1:5555", "--params-port", "0"]
    config = learner_cli.parse_config(base)[0]
    assert (config.eval_weights, config.polyak_tau) == ("online", 0.005)  # nothing changes by default
    config = learner_cli.parse_config([*base, "--eval-weights", "polyak", "--polyak-tau", "0.01"])[0]
    assert (config.eval_weights, config.polyak_tau) == ("polyak", 0.01)
    for bad in (["--eval-weights", "mean"], ["--polyak-tau", "0"], ["--polyak-tau", "1.5"]):
        with pytest.raises(SystemExit):
            learner_cli.parse_config([*base, *bad])
    run = ["--preset", "cartpole", "--run-dir", str(tmp_path / "run")]
    assert launch_plan([*run, "--eval-weights", "polyak"])[0].learner.eval_weights == "polyak"
    learner = launch_plan([*run, "--learner-args", "--eval-weights polyak --polyak-tau 0.02"])[0].learner
    assert (learner.eval_weights, learner.polyak_tau) == ("polyak", 0.02)
    with pytest.raises(SystemExit):
        launch_plan([*run, "--polyak-tau", "0.01", "--learner-args", "--polyak-tau 0.02"])
    assert "give --polyak-tau once" in capsys.readouterr().err


def test_apexrl_evaluate_scores_the_checkpoints_average(tmp_path) -> None:
    from apexrl.apex.checkpoint import save_checkpoint
    from apexrl.apex.config import config_to_dict
    from apexrl.envs import env_spec
    from apexrl.evaluate import evaluate_run

    spec, config = env_spec("gym:Pendulum-v1"), DPGConfig(actor_hidden=(8,), critic_hidden=(8, 8))
    online, other = DPGLearner(spec, config, seed=0), DPGLearner(spec, config, seed=1)
    meta = {"agent": "dpg", "env": spec.name, "learner_steps": 0, "agent_config": config_to_dict(config)}

    def score(name: str, tensors: dict[str, torch.Tensor]):
        os.makedirs(tmp_path / name)
        save_checkpoint(str(tmp_path / name / "checkpoint.safetensors"), tensors, meta)
        return evaluate_run(str(tmp_path / name), episodes=1, seed=7)

    averaged = {POLYAK_PREFIX + k: v for k, v in other.policy_state_dict().items() if k.startswith("actor/")}
    with_average = score("polyak", {**online.state_dict(), **averaged})
    as_other = score("other", other.state_dict())
    as_online = score("online", online.state_dict())
    assert (with_average.eval_weights, as_other.eval_weights) == ("polyak", "online")
    assert with_average.returns == as_other.returns != as_online.returns  # the average acted, not the weights
