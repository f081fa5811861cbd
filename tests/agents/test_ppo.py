"""PPO: the clipped objective by hand, the config's checks, the learner and policy through the seam, and a short
run through `apexrl run` (then resumed) with the policy lag in metrics.csv."""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import numpy as np
import pytest
import torch

from apexrl.agents import get_agent
from apexrl.agents.ppo import PPOConfig, clipped_objective
from apexrl.envs import env_spec
from tests.torch_helpers import one_thread  # noqa: F401  (fixture)


def test_the_clipped_ratio_objective_by_hand():
    logp_b = torch.log(torch.tensor([0.5, 0.5, 0.5]))
    logp = torch.log(torch.tensor([0.75, 0.25, 0.55]))  # ratios 1.5, 0.5, 1.1
    adv = torch.tensor([1.0, 1.0, -2.0])
    objective, clipped = clipped_objective(logp, logp_b, adv, 0.2)
    # min(1.5, 1.2) * 1 = 1.2; min(0.5, 0.8) * 1 = 0.5; 1.1 * -2 = -2.2 (inside the range)
    assert objective.item() == pytest.approx((1.2 + 0.5 - 2.2) / 3, abs=1e-6)
    assert clipped.item() == pytest.approx(2 / 3)
    # no gradient through a clipped ratio that the min picks
    logp.requires_grad_(True)
    clipped_objective(logp, logp_b, adv, 0.2)[0].backward()
    assert logp.grad is not None and logp.grad[0] == 0 and logp.grad[1] != 0 and logp.grad[2] != 0


@pytest.mark.parametrize(
    "field, value, match",
    [
        ("n_step", 3, "n_step must be 1"),
        ("unroll", 0, "unroll must be an int >= 1"),
        ("lam", 1.5, "lam must be in"),
        ("ratio_clip", 0.0, "ratio_clip must be a finite number > 0"),
        ("synchronous", "yes", "synchronous must be true or false"),
        ("minibatch_size", 0, "minibatch_size must be an int >= 1"),
    ],
)
def test_the_config_refuses_bad_values(field, value, match):
    with pytest.raises(ValueError, match=match):
        PPOConfig(**{field: value})


def test_images_are_refused_with_a_reason():
    assert "vector observations" in get_agent("ppo").accepts(env_spec("atari:Pong"))


def test_more_than_one_replay_server_is_refused_with_the_reason():
    from apexrl.launch.plan import Overrides, plan

    with pytest.raises(ValueError, match="one queue"):
        plan("ppo-cartpole", Overrides(replay_servers=2))


def _rows(run_dir):
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        return list(csv.DictReader(f))


def _weight_wait_timeouts(progress: str) -> int:
    """The synchronous actor's waits for weights that ran out, over every process of the run (the progress file
    is appended to; each process counts from 0, its time from 0)."""
    with open(progress, encoding="utf-8") as f:
        records = [json.loads(line) for line in f if line.strip()]
    assert records and all("weight_wait_timeouts" in r for r in records)
    total, last = 0, None
    for r in records:
        if last is not None and r["time_s"] < last["time_s"]:  # a new process
            total += last["weight_wait_timeouts"]
        last = r
    return total + last["weight_wait_timeouts"]


@pytest.mark.slow
def test_ppo_runs_through_apexrl_run_and_resumes(tmp_path):
    run_dir = str(tmp_path / "run")
    # one actor of 2 environments: 2 items a round, the batch
    args = ["--preset", "ppo-cartpole", "--actors", "1", "--envs-per-actor", "2", "--batch-size", "2"]
    args += ["--final-eval", "0"]
    args += ["--run-dir", run_dir, "--progress-every", "2", "--minutes", "4"]
    args += ["--learner-args", "--min-replay-size 2 --eval-every 0 --metrics-every 1 --checkpoint-every 5"]
    for steps in (6, 12):
        out = subprocess.run(
            [sys.executable, "-m", "apexrl", "run", *args, "--steps", str(steps), *(["--resume"] if steps > 6 else [])],
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert out.returncode == 0, out.stdout + out.stderr
        assert f"reached --steps {steps}" in out.stdout
    rows = _rows(run_dir)
    assert int(rows[-1]["learner_steps"]) >= 12
    lags = [float(r["policy_lag_max"]) for r in rows if r["policy_lag_max"]]
    # Synchronous: the weights of the previous update, or of one before. A round the first run's actor sent after
    # its learner stopped at --steps is trained on by the resumed learner before it publishes (the test below). A
    # wait for weights that ran out (a loaded machine) lets one more round act with weights one update older.
    timeouts = _weight_wait_timeouts(os.path.join(run_dir, "logs", "actor0.progress.jsonl"))
    assert lags and all(lag <= 1 + timeouts for lag in lags), (lags, timeouts)
    if timeouts == 0:
        assert all(float(r["policy_lag_mean"]) <= 0.5 for r in rows if r["policy_lag_mean"])
    assert all(math.isfinite(float(r["critic_loss"])) for r in rows if r["critic_loss"])


@pytest.mark.parametrize("held", [2, 1])
def test_a_resumed_learner_publishes_after_training_on_the_batches_its_queue_held(tmp_path, held):
    """A resumed run's queue may hold the actors' last round, sent after the learner stopped. The synchronous
    learner trains on it before it publishes, so its actors' first weights are those trained on it; publishing
    the restored weights at once left every later round one batch behind (lag 2 in CI's resumed run). Fewer
    items than a batch: it publishes at once, as any start."""
    import threading

    from apexrl.agents.onpolicy.policy import VERSION
    from apexrl.agents.onpolicy.replay import QUEUE_TABLE, make_adders
    from apexrl.apex.config import LearnerConfig
    from apexrl.apex.learner import Learner
    from apexrl.params.service import ParamClient
    from apexrl.replay import ReplayClient, ReplayServer, ServerConfig
    from tests.helpers import wait_until

    config = PPOConfig(unroll=4, batch_size=2)
    with (
        ReplayServer(ServerConfig(port=0, tables=[QUEUE_TABLE])) as srv,
        ReplayClient(srv.endpoint, timeout=10) as c,
    ):
        adders = make_adders(c, "default", env_spec("gym:CartPole-v1"), config, held)
        extras = {"logp": np.float32(-0.69), VERSION: np.int64(0)}
        for adder in adders:  # one item each: the round sent before the stop
            adder.add_first(np.zeros(4, np.float32))
            for _ in range(config.unroll + 1):
                adder.add(0, 1.0, np.zeros(4, np.float32), False, False, extras=extras)
            adder.flush(timeout=10)
        assert c.tables()["default"]["size"] == held
        learner = Learner(
            LearnerConfig(
                agent="ppo",
                env="gym:CartPole-v1",
                replay=srv.endpoint,
                run_dir=str(tmp_path / "run"),
                agent_config=config,
                min_replay_size=2,
                publish_every=1,
                eval_every=0,
                max_steps=1,
            )
        )
        thread = threading.Thread(target=learner.run, daemon=True)
        try:
            thread.start()
            with ParamClient(learner.params.endpoint, timeout=10) as params:

                def first_weights():
                    got = params.fetch(0)
                    return got is not None and got

                fetched = wait_until(first_weights, timeout=60, what="the learner's first weights")
            first = int(fetched[1][VERSION])
            if held == 2:
                assert first == 1  # trained on the held batch; the restored weights never went out
                thread.join(timeout=60)
                assert learner.params.counters()["version"] == 1  # one publish: after the update
            else:
                assert first == 0  # nothing to train on yet: published at the start, as always
                assert c.tables()["default"]["size"] == 1
        finally:
            learner.stop()
            thread.join(timeout=60)
            learner.close()
        for adder in adders:
            adder.close()
