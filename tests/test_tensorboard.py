"""``--tensorboard DIR`` of ``apexrl run`` and ``apexrl-learner``: real runs on gym:CartPole-v1, their event files
read back with TensorBoard's own reader and compared with the CSV rows, scalar by scalar; the error without the
tensorboard package."""

from __future__ import annotations

import csv
import os
import signal
import subprocess
import sys

import numpy as np
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from tests.e2e.test_apex_processes import start_actor, start_learner
from tests.helpers import wait_until

FAST_LEARNER = "--min-replay-size 300 --eval-every 3 --eval-episodes 1 --metrics-every 1 --checkpoint-every 100"


def _scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
    """Every scalar of the event files in ``logdir``: tag -> [(step, value)] in the order written."""
    if not os.path.isdir(logdir):
        return {}
    acc = EventAccumulator(logdir, size_guidance={"scalars": 0}, purge_orphaned_data=False)
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


def _f32(text: str) -> float:
    """A CSV cell as the event file stores it (a float32 scalar)."""
    return float(np.float32(float(text)))


def _expected_from_metrics(rows: list[dict[str, str]]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for r in rows:
        for name, text in r.items():
            if text == "" or name in ("learner_steps", "eval_learner_steps"):
                continue
            if name.startswith("eval_"):
                out.setdefault(f"eval/{name[5:]}", []).append((int(r["eval_learner_steps"]), _f32(text)))
            else:
                out.setdefault(f"learner/{name}", []).append((int(r["learner_steps"]), _f32(text)))
    return out


@pytest.mark.slow
def test_run_shows_metrics_evaluations_and_episodes_live_and_the_event_file_equals_the_csvs(spawn, tmp_path):
    run_dir, board = str(tmp_path / "run"), str(tmp_path / "tb")
    launcher = spawn(
        "launcher",
        "apexrl",
        "run",
        "--run-dir",
        run_dir,
        "--minutes",
        "0",
        "--actors",
        "1",
        "--final-eval",
        "0",
        "--quiet",
        "--tensorboard",
        board,
        f"--learner-args={FAST_LEARNER}",
    )
    # Live: the learner's rows, an evaluation and the actor's episodes reach the event file while the run goes on.
    wait_until(
        lambda: (
            launcher.alive()
            and {"learner/sampled_per_s", "eval/return_mean", "episodes/return/actor_0"} <= set(_scalars(board))
        ),
        180,
        "learner, evaluation and episode scalars in the event file",
        interval=0.3,
    )
    launcher.signal(signal.SIGINT)
    assert launcher.proc.wait(120) == 0, launcher.log()

    got = _scalars(board)
    metrics = _rows(os.path.join(run_dir, "metrics.csv"))
    expected = _expected_from_metrics(metrics)
    assert len(metrics) >= 2 and expected["learner/sampled_per_s"] and expected["eval/return_mean"]
    assert {t: v for t, v in got.items() if not t.startswith("episodes/")} == expected
    episodes = _rows(os.path.join(run_dir, "episodes.csv"))
    assert len(episodes) >= 2
    assert got["episodes/return/actor_0"] == [(int(r["env_frames"]), _f32(r["return"])) for r in episodes]
    assert got["episodes/length/actor_0"] == [(int(r["env_frames"]), _f32(r["length"])) for r in episodes]
    assert sorted(t for t in got if t.startswith("episodes/")) == ["episodes/length/actor_0", "episodes/return/actor_0"]


def test_learner_writes_each_metrics_row_to_the_event_file(start_server, spawn, tmp_path):
    run_dir, board = str(tmp_path / "run"), str(tmp_path / "tb")
    server = start_server("--capacity", "20000", "--min-size-to-sample", "300")
    learner, params = start_learner(spawn, server.endpoint, run_dir, "--max-steps", "150", "--tensorboard", board)
    actor = start_actor(spawn, server.endpoint, params, 0, num=1)
    assert learner.proc.wait(180) == 0, learner.log()
    actor.terminate()

    metrics = _rows(os.path.join(run_dir, "metrics.csv"))
    assert metrics[-1]["learner_steps"] == "150"
    got = _scalars(board)
    assert got == _expected_from_metrics(metrics)
    assert got["learner/env_frames"][-1] == (150, _f32(metrics[-1]["env_frames"]))


def test_without_the_tensorboard_package_both_commands_exit_2_naming_the_extra(tmp_path):
    board, run_dir = str(tmp_path / "tb"), str(tmp_path / "run")
    # sys.modules[name] = None makes `import name` raise ImportError, as on a machine without the package.
    blocked = "import sys; sys.modules['tensorboard'] = None; from apexrl.cli.{} import main; sys.exit(main({!r}))"
    for module, argv in (
        ("main", ["run", "--run-dir", run_dir, "--tensorboard", board]),
        (
            "learner",
            ["--replay", "tcp://127.0.0.1:1", "--params-port", "0", "--run-dir", run_dir, "--tensorboard", board],
        ),
    ):
        done = subprocess.run(
            [sys.executable, "-c", blocked.format(module, argv)], capture_output=True, text=True, timeout=120
        )
        assert done.returncode == 2, done.stdout + done.stderr
        assert "--tensorboard needs the tensorboard package: pip install 'apexrl[tensorboard]'" in done.stderr
        assert not os.path.exists(board) and not os.path.exists(run_dir)


def test_the_mirror_adds_complete_rows_once_and_a_resumed_run_only_its_new_rows(tmp_path):
    from apexrl.apex.config import EPISODE_COLUMNS
    from apexrl.apex.metrics import CSVWriter
    from apexrl.tensorboard import RunMirror

    run_dir, board = str(tmp_path / "run"), str(tmp_path / "tb")
    metrics = CSVWriter(
        os.path.join(run_dir, "metrics.csv"),
        ["time_s", "learner_steps", "loss", "eval_return_mean", "eval_learner_steps"],
    )
    metrics.write({"time_s": 1.0, "learner_steps": 10, "loss": 0.5})
    episodes = open(os.path.join(run_dir, "episodes.csv"), "w", encoding="utf-8")  # noqa: SIM115 - kept open: the torn row is finished below
    episodes.write(",".join(EPISODE_COLUMNS) + "\n0.5,0,200,1,21.0,200,0.4,gym:CartPole-v1\n0.7,1,30")
    episodes.flush()  # the second row is torn (its actor is writing it): it waits for its newline

    mirror = RunMirror(board, run_dir)
    mirror.poll()
    assert _scalars(board) == {
        "learner/time_s": [(10, 1.0)],
        "learner/loss": [(10, 0.5)],
        "episodes/return/actor_0": [(200, 21.0)],
        "episodes/length/actor_0": [(200, 200.0)],
    }
    episodes.write("0,1,30.0,30,0.1,gym:CartPole-v1\n")
    episodes.close()
    metrics.write({"time_s": 2.0, "learner_steps": 20, "loss": 0.25, "eval_return_mean": 9.5, "eval_learner_steps": 12})
    mirror.close()
    got = _scalars(board)
    assert got["learner/loss"] == [(10, 0.5), (20, 0.25)] and got["eval/return_mean"] == [(12, 9.5)]
    assert got["episodes/return/actor_1"] == [(300, 30.0)]  # "0.7,1,30" + "0,1,30.0,...": 300 frames

    # A resumed run with the same DIR: the rows already in the event file are not added again.
    metrics.write({"time_s": 3.0, "learner_steps": 30, "loss": 0.125})
    metrics.close()
    again = RunMirror(board, run_dir)
    again.close()
    assert _scalars(board)["learner/loss"] == [(10, 0.5), (20, 0.25)]
    # ...but a new DIR gets the whole history from the CSV files.
    fresh = str(tmp_path / "tb2")
    RunMirror(fresh, run_dir).close()
    assert _scalars(fresh)["learner/loss"] == [(10, 0.5), (20, 0.25), (30, 0.125)]


def test_a_tensorboard_path_that_is_a_file_is_refused_before_anything_starts(tmp_path):
    import pytest

    import apexrl

    path = tmp_path / "not-a-dir"
    path.write_text("x")
    with pytest.raises(ValueError, match="--tensorboard .*not-a-dir: not a directory"):
        apexrl.run(run_dir=str(tmp_path / "run"), tensorboard=str(path))
    assert not os.path.exists(tmp_path / "run")
