"""The evaluation protocol and the learner's bookkeeping: evaluation statistics, DQN's evaluation epsilon,
evaluation environments, IS-weight normalisation, the paper presets' replay ratio, and -- in a real system on
127.0.0.1 -- evaluations credited to the weights they scored, the measured replay ratio and the mean IS weight
in metrics.csv."""

from __future__ import annotations

import dataclasses
import math
import os

import numpy as np
import pytest

from apexrl.agents import DPGConfig, DPGPolicy, DQNConfig, DQNPolicy
from apexrl.apex.evaluator import EvalResult, play_episodes
from apexrl.apex.learner import normalise_is_weights
from apexrl.apex.metrics import read_csv
from apexrl.envs import env_spec, make_env
from apexrl.launch.plan import Overrides, plan
from apexrl.launch.presets import get_preset
from apexrl.replay.client.replay_client import ReplayClient
from tests.e2e.test_apex_processes import start_actor, start_learner
from tests.helpers import wait_until
from tests.torch_helpers import one_thread  # noqa: F401 - autouse fixture

# -- statistics ---------------------------------------------------------------------------------------------


def test_eval_result_mean_std_and_standard_error_on_hand_numbers():
    r = EvalResult.of([1.0, 2.0, 3.0, 4.0], learner_steps=7, env_frames=900, time_s=12.5)
    assert r.mean == 2.5 and r.episodes == 4
    assert r.std == pytest.approx(math.sqrt(1.25))  # population std: mean of (1.5², 0.5², 0.5², 1.5²)
    assert r.se == pytest.approx(math.sqrt(5.0 / 3.0) / 2.0)  # sample std sqrt(5/3) over sqrt(4)
    assert (r.learner_steps, r.env_frames, r.time_s) == (7, 900, 12.5)
    assert EvalResult.of([3.0], 0, 0, 0.0).se == 0.0
    with pytest.raises(ValueError, match="at least one episode"):
        EvalResult.of([], 0, 0, 0.0)


# -- what evaluation episodes act with ------------------------------------------------------------------------

CARTPOLE = env_spec("gym:CartPole-v1")


def test_dqn_evaluates_with_the_protocols_epsilon_not_the_actors():
    assert DQNConfig().eval_epsilon == 0.001
    obs = np.zeros(4, np.float32)
    greedy = DQNPolicy(CARTPOLE, dataclasses.replace(DQNConfig(), hidden=(8,), eval_epsilon=0.0), epsilon=1.0, seed=1)
    best = greedy.act(obs, explore=False)
    assert {greedy.act(obs, explore=False) for _ in range(200)} == {best}  # epsilon 1 only when exploring
    assert len({greedy.act(obs, explore=True) for _ in range(200)}) == 2
    noisy = DQNPolicy(CARTPOLE, dataclasses.replace(DQNConfig(), hidden=(8,), eval_epsilon=1.0), epsilon=0.0, seed=1)
    assert len({noisy.act(obs, explore=False) for _ in range(200)}) == 2
    assert {noisy.act(obs, explore=True) for _ in range(200)} == {noisy.act(obs, explore=True)}
    assert greedy.exploration == 1.0 and noisy.exploration == 0.0
    with pytest.raises(ValueError, match="eval_epsilon"):
        DQNConfig(eval_epsilon=1.5)


def test_dpg_policy_exposes_its_noise_as_exploration():
    spec = env_spec("gym:Pendulum-v1")
    assert DPGPolicy(spec, DPGConfig(actor_hidden=(4,), critic_hidden=(4, 4)), sigma=0.2).exploration == 0.2


def test_play_episodes_returns_each_episodes_return_and_calls_on_frame_per_frame():
    class Always0:
        def act(self, obs, explore=True):
            assert explore is False
            return 0

    frames = []
    with make_env("gym:CartPole-v1", seed=3, evaluation=True) as env:
        returns = play_episodes(env, Always0(), 3, on_frame=lambda e: frames.append(e))
    assert len(returns) == 3 and all(8 <= r < 100 for r in returns)  # pushing left topples the pole soon
    assert len(frames) == 3 + sum(returns)  # one per reset, one per step (CartPole pays 1 per step)


def test_atari_evaluation_episodes_are_capped_at_108k_frames():
    pytest.importorskip("ale_py")
    with make_env("atari:Pong", 0) as train, make_env("atari:Pong", 0, evaluation=True) as ev:
        assert train.spec.max_episode_steps == 50_000 // 4
        assert ev.spec.max_episode_steps == 108_000 // 4


# -- IS weights, replay ratio ---------------------------------------------------------------------------------


def test_is_weight_normalisations():
    w = np.array([0.25, 0.5, 0.125])
    assert normalise_is_weights(w, "global_min") is w
    np.testing.assert_allclose(normalise_is_weights(w, "batch_max"), [0.5, 1.0, 0.25])
    with pytest.raises(ValueError, match="unknown IS-weight normalisation"):
        normalise_is_weights(w, "mean")


def test_paper_presets_hold_the_papers_replay_ratio_and_evaluation_protocol(tmp_path):
    dqn = plan("apex-dqn-atari", Overrides(run_dir=str(tmp_path)))
    assert dqn.server.table().rate_limiter.samples_per_insert == pytest.approx(19 * 512 / 12_500)
    assert dqn.learner.agent_config.optimizer == "rmsprop_tf"
    dpg = plan("apex-dpg-control", Overrides(run_dir=str(tmp_path)))
    assert dpg.server.table().rate_limiter.samples_per_insert == pytest.approx(22_000 / 14_000)
    assert dpg.learner.agent_config.n_step == 3 and dpg.learner.agent_config.dqda_clip == 1.0
    d4pg = plan("apex-d4pg-control", Overrides(run_dir=str(tmp_path)))
    # the DPG paper preset's replay, with the Control Suite paper's eviction exponent (0.6; apexrl's sign: -0.6)
    table = dataclasses.replace(dpg.server.table(), alpha_evict=-0.6)
    assert d4pg.server == dataclasses.replace(dpg.server, seed=d4pg.server.seed, tables=[table])
    assert d4pg.learner.agent_config.n_step == 5 and d4pg.learner.agent_config.num_atoms == 101
    for p in (dqn, dpg, d4pg):
        assert p.learner.eval_episodes >= 10 and p.run.final_eval_episodes >= 30
    for name in ("cartpole", "cartpole-swingup", "pendulum", "d4pg-cartpole-swingup"):
        assert "tuned" in get_preset(name).description  # small-machine presets say they are not the paper's
    assert plan("cartpole", Overrides(run_dir=str(tmp_path), final_eval=0)).run.final_eval_episodes == 0


# -- a real system ------------------------------------------------------------------------------------------


def test_learner_credits_evaluations_to_their_weights_and_logs_replay_ratio(start_server, spawn, tmp_path):
    """A rate-limited server (0.5 sampled per inserted): metrics.csv's replay_ratio is the server's measured
    ratio, is_weight_mean is a mean of weights in (0, 1], and each evaluation is credited to the learner step,
    frames and time at which its weights were taken -- before the row that reports it."""
    spi = 0.5
    server = start_server(
        "--capacity", "20000", "--min-size-to-sample", "300", "--samples-per-insert", str(spi), "--error-buffer", "200"
    )
    run_dir = str(tmp_path / "run")
    learner, params = start_learner(
        spawn, server.endpoint, run_dir, "--eval-every", "1", "--eval-episodes", "2", "--is-weights", "batch_max"
    )
    actor = start_actor(spawn, server.endpoint, params, 0, num=1)
    path = os.path.join(run_dir, "metrics.csv")

    def evaluations() -> int:
        return os.path.exists(path) and int(np.sum(~np.isnan(read_csv(path)["eval_learner_steps"])))

    wait_until(lambda: evaluations() >= 3, 180, "three evaluations in metrics.csv", interval=0.5)
    with ReplayClient(server.endpoint, timeout=10) as client:
        stats = client.stats()
    assert actor.terminate() == 0, actor.log()
    assert learner.terminate() == 0, learner.log()
    m = {k: np.asarray(v) for k, v in read_csv(path).items()}

    ev = ~np.isnan(m["eval_learner_steps"])
    assert (m["eval_episodes"][ev] == 2).all()
    assert (m["eval_learner_steps"][ev] <= m["learner_steps"][ev]).all()
    assert (m["eval_time_s"][ev] < m["time_s"][ev]).all()
    assert (m["eval_env_frames"][ev] <= m["env_frames"][ev]).all()
    assert (np.diff(m["eval_learner_steps"][ev]) >= 0).all()  # in the order their weights were taken
    assert (m["eval_return_se"][ev] >= 0).all()

    # The limiter holds sampled <= inserted * spi + error buffer; the learner is throttled to it.
    assert stats["sampled"] <= stats["inserted"] * spi + 200
    ratio = m["replay_ratio"][~np.isnan(m["replay_ratio"])]
    assert ratio.size >= 3 and (ratio >= 0).all()
    rows = ~np.isnan(m["replay_inserted"])
    sampled = (m["learner_steps"][rows][-1] - m["learner_steps"][rows][0]) * 32
    inserted = m["replay_inserted"][rows][-1] - m["replay_inserted"][rows][0]
    # Over the rows: spi, plus the error buffer and the fill-up's head start (at most min size x spi) as slack.
    assert sampled / inserted <= spi + 600 / inserted
    w = m["is_weight_mean"][~np.isnan(m["is_weight_mean"])]
    assert w.size and ((w > 0) & (w <= 1.0)).all()
