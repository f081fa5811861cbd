"""The best checkpoint in a real system on 127.0.0.1 (replay server, DQN learner, actor on CartPole): the learner
writes ``best_checkpoint.safetensors`` holding the state of its best periodic evaluation, ``apexrl evaluate
--best`` scores it and says so, and a resumed learner keeps a best that its evaluations do not beat."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from apexrl.apex.best import BEST_CHECKPOINT, load_best
from apexrl.apex.checkpoint import save_checkpoint
from tests.conftest import free_port
from tests.e2e.test_apex_processes import start_actor, start_learner
from tests.helpers import csv_columns, wait_until

EVAL = ("--eval-every", "1", "--eval-episodes", "2")


def _evaluations(run_dir: str) -> dict[str, np.ndarray]:
    """metrics.csv's rows that report an evaluation (empty before the first)."""
    rows = csv_columns(os.path.join(run_dir, "metrics.csv"), "eval_return_mean")
    if rows is None:  # not written yet, or created and its header not yet whole
        return {"eval_return_mean": np.zeros(0)}
    m = {k: np.asarray(v, dtype=float) for k, v in rows.items() if k.startswith("eval_")}
    ev = ~np.isnan(m["eval_return_mean"])
    return {k: v[ev] for k, v in m.items()}


def test_the_best_evaluation_is_kept_scored_with_best_and_survives_a_resume(start_server, spawn, tmp_path):
    run_dir = str(tmp_path / "run")
    best_path = os.path.join(run_dir, BEST_CHECKPOINT)
    params_port = free_port()
    server = start_server("--capacity", "20000", "--min-size-to-sample", "300")
    learner, params = start_learner(spawn, server.endpoint, run_dir, *EVAL, params_port=params_port)
    actor = start_actor(spawn, server.endpoint, params, 0, num=1)
    wait_until(lambda: _evaluations(run_dir)["eval_return_mean"].size >= 3, 240, "three evaluations", interval=0.5)
    assert learner.terminate() == 0, learner.log()

    # The file holds the first evaluation with the highest mean (ties keep the earlier), and its state.
    ev = _evaluations(run_dir)
    first_best = int(np.argmax(ev["eval_return_mean"]))
    tensors, meta, record = load_best(best_path)
    assert record["mean"] == ev["eval_return_mean"][first_best]
    assert record["learner_steps"] == ev["eval_learner_steps"][first_best] == meta["learner_steps"]
    assert record["env_frames"] == ev["eval_env_frames"][first_best] == meta["env_frames"]
    assert record["time_s"] == pytest.approx(ev["eval_time_s"][first_best], abs=2e-3)  # the CSV keeps 6 digits
    assert record["episodes"] == 2 and (meta["agent"], meta["env"]) == ("dqn", "gym:CartPole-v1")
    assert int(tensors["steps"]) == record["learner_steps"]  # the learner state at the scored weights' step
    assert f"best periodic evaluation: return {record['mean']:.2f} over 2 episodes" in learner.log()

    out = str(tmp_path / "best.json")
    done = subprocess.run(
        [sys.executable, "-m", "apexrl", "evaluate", run_dir, "--best", "--episodes", "2", "--json", out],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out) as f:
        scored = json.load(f)
    assert (scored["checkpoint_kind"], scored["chosen_by"]) == ("best", record)
    assert scored["checkpoint"] == os.path.abspath(best_path)
    assert scored["learner_steps"] == record["learner_steps"] and scored["episodes"] == 2
    assert "best checkpoint at learner step" in done.stdout and "optimistic" in done.stdout

    # A best that no CartPole evaluation can reach (returns are at most 500): the resumed learner, whose own
    # evaluations finish and are logged, must leave the file as it is.
    unbeatable = {**record, "mean": 1000.0}
    save_checkpoint(best_path, tensors, {**meta, "evaluation": unbeatable})
    before = Path(best_path).read_bytes()
    resumed, _ = start_learner(
        spawn, server.endpoint, run_dir, *EVAL, "--resume", name="learner2", params_port=params_port
    )
    resumed.wait_for(r"learner resumed from", timeout=60)
    seen = ev["eval_return_mean"].size
    wait_until(lambda: _evaluations(run_dir)["eval_return_mean"].size >= seen + 2, 240, "two more evaluations")
    assert resumed.terminate() == 0, resumed.log()
    assert actor.terminate() == 0, actor.log()
    assert Path(best_path).read_bytes() == before
    assert "best periodic evaluation: return 1000.00 over 2 episodes" in resumed.log()
