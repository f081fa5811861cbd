"""``apexrl run --preset r2d2-cpu`` end to end on masked CartPole: real processes on 127.0.0.1 (a replay server
with the preset's prioritized sequence table, a learner, a vectorised recurrent actor), stopped by the learner's
step count, never by a sleep. The run must advance the learner, insert and sample sequences, write checkpoints
that ``apexrl evaluate`` scores and ``--resume`` continues from, a TensorBoard event file, and curves that
``apexrl plot`` draws."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from apexrl.apex.metrics import read_csv
from apexrl.envs.masked import NAME as MASKED

pytest.importorskip("tensorboard")

# The preset's sequences (burn-in 10, trace 20: items of 31 steps, one every 10) with a short warm-up.
FAST = "--min-replay-size 16 --eval-every 2 --eval-episodes 1 --metrics-every 1 --checkpoint-every 20"


def _apexrl(*args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apexrl", *args], capture_output=True, text=True, timeout=timeout)


def _run(run_dir: str, steps: int, *extra: str) -> subprocess.CompletedProcess:
    return _apexrl(
        "run",
        "--preset",
        "r2d2-cpu",
        "--env",
        MASKED,
        "--run-dir",
        run_dir,
        "--minutes",
        "0",
        "--steps",
        str(steps),
        "--final-eval",
        "0",
        "--actors",
        "1",
        "--envs-per-actor",
        "2",
        "--quiet",
        f"--learner-args={FAST}",
        *extra,
    )


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    base = tmp_path_factory.mktemp("r2d2")
    run_dir, board = str(base / "run"), str(base / "tb")
    done = _run(run_dir, 40, "--tensorboard", board)
    assert done.returncode == 0, done.stdout + done.stderr
    return run_dir, board


def test_the_learner_trains_on_sampled_sequences_and_checkpoints(run):
    run_dir, _ = run
    m = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert int(m["learner_steps"][-1]) == 40
    assert max(int(v) for v in m["replay_inserted"] if v is not None) >= 16  # sequences went in
    assert max(float(v) for v in m["sampled_per_s"] if v is not None) > 0  # and came out
    assert max(float(v) for v in m["valid_steps"] if v is not None) > 0  # trained steps in the sampled sequences
    # Every item decodes and has a trained step (the actor makes none of fewer than burn-in + 2 steps).
    assert int(m["undecodable_items"][-1] or 0) == 0 and int(m["invalid_items"][-1] or 0) == 0
    assert os.path.exists(os.path.join(run_dir, "checkpoint.safetensors"))
    with open(os.path.join(run_dir, "episodes.csv")) as f:
        assert len(f.read().splitlines()) > 1  # the actor's episodes


def test_evaluate_scores_the_checkpoint(run, tmp_path):
    run_dir, _ = run
    out = str(tmp_path / "eval.json")
    done = _apexrl("evaluate", run_dir, "--episodes", "2", "--json", out)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out) as f:
        r = json.load(f)
    assert (r["agent"], r["env"], r["preset"], r["learner_steps"], r["episodes"]) == ("r2d2", MASKED, "r2d2-cpu", 40, 2)
    assert all(1 <= x <= 500 for x in r["returns"])


def test_tensorboard_and_plot_show_the_run(run, tmp_path):
    run_dir, board = run
    assert any(name.startswith("events.out.tfevents") for _, _, files in os.walk(board) for name in files)
    out = str(tmp_path / "curve.png")
    done = _apexrl("plot", run_dir, "--out", out)
    assert done.returncode == 0, done.stdout + done.stderr
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_resume_continues_from_the_checkpoint(run):
    run_dir, _ = run
    done = _run(run_dir, 60, "--resume")
    assert done.returncode == 0, done.stdout + done.stderr
    m = read_csv(os.path.join(run_dir, "metrics.csv"))
    steps = [int(v) for v in m["learner_steps"]]
    assert steps[-1] == 60 and 40 in steps  # the second run's rows follow the first's


@pytest.mark.slow
def test_a_run_over_two_replay_servers_writes_to_both_and_trains_on_both(tmp_path):
    """``--replay-servers 2``: the actor's two environments each write through their own trajectory writer, and the
    sharded client keeps each writer on one server, so both servers hold sequences; the learner samples them
    globally by priority and sends new priorities back (items go in at their table's largest priority so far, so
    priorities that differ are the learner's updates; that each key's update reaches its own server is
    tests/replay/test_sharded_trajectory.py's)."""
    from apexrl import PrioritizedStore

    run_dir = str(tmp_path / "run")
    done = _run(run_dir, 20, "--replay-servers", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    m = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert int(m["learner_steps"][-1]) == 20 and int(m["replay_servers_up"][-1]) == 2
    held = [PrioritizedStore.load(os.path.join(run_dir, f"replay{s}.snap")).contents() for s in (0, 1)]
    assert all(len(h["keys"]) > 0 for h in held), [len(h["keys"]) for h in held]
    assert len({p for h in held for p in h["priorities"].tolist()}) > 1  # the learner's updates
