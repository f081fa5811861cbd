"""The local launcher (``apexrl run``) and the plots (``apexrl plot``), with real processes.

The main test runs the cartpole preset (with a small warm-up so learning starts within seconds), kills an
actor with SIGKILL and checks that the launcher restarts it, then stops the run with SIGINT and checks that
every process it ever started is gone, the run directory holds the CSVs and a checkpoint, and that the plot
command turns it into a PNG.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys

import pytest
import torch

from apexrl.apex.checkpoint import load_checkpoint
from apexrl.apex.metrics import read_csv
from apexrl.launch.progress import Progress
from apexrl.plot import episode_curve
from apexrl.rundir import best_eval
from tests.helpers import wait_until

FAST_LEARNER = "--min-replay-size 300 --eval-every 3 --eval-episodes 1 --metrics-every 1 --checkpoint-every 100"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def _pids(run_dir: str) -> dict[str, int]:
    with open(os.path.join(run_dir, "pids.json"), encoding="utf-8") as f:
        return json.load(f)["children"]


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


def _alive(pid: int) -> bool:
    """True while the pid is a live (not zombie) process."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.mark.slow
def test_run_restarts_a_killed_actor_and_stops_everything_on_sigint(spawn, tmp_path):
    run_dir = str(tmp_path / "run")
    launcher = spawn(
        "launcher",
        "apexrl",
        "run",
        "--run-dir",
        run_dir,
        "--minutes",
        "0",
        "--progress-every",
        "2",
        f"--learner-args={FAST_LEARNER}",
    )
    server_port = int(launcher.wait_for(r"replay server tcp://127\.0\.0\.1:(\d+) \(pid", timeout=60).group(1))
    params_port = int(launcher.wait_for(r"serving weights on tcp://127\.0\.0\.1:(\d+)", timeout=30).group(1))
    assert server_port != params_port
    launcher.wait_for(r"steps [1-9]\d* \(.* episodes [1-9]", timeout=90)  # progress: learner and actors
    pids = _pids(run_dir)
    assert set(pids) == {"server", "learner", "actor0", "actor1"}
    first_actor0 = pids["actor0"]

    os.kill(first_actor0, signal.SIGKILL)
    launcher.wait_for(r"actor0 exited unexpectedly \(killed by SIGKILL\); restarting", timeout=20)
    m = launcher.wait_for(r"actor0 restarted \(pid (\d+), restart 1\)", timeout=20)
    new_actor0 = int(m.group(1))
    assert new_actor0 != first_actor0 and _alive(new_actor0)
    wait_until(lambda: _pids(run_dir).get("actor0") == new_actor0, 5, "pids.json to show the new actor", interval=0.3)
    launcher.wait_for(r"restarts 1", timeout=20)  # the progress line counts it
    launcher.wait_for(r"eval -?\d+\.\d", timeout=60)
    actor0_log = os.path.join(run_dir, "logs", "actor0.log")
    wait_until(
        lambda: "actor=0 time_s=" in _read(actor0_log).split("restart 1 at", 1)[-1],
        60,
        "the restarted actor0 to make progress",
        interval=0.3,
    )

    launcher.signal(signal.SIGINT)
    assert launcher.proc.wait(90) == 0, launcher.log()
    log = launcher.log()
    assert "stopping: received SIGINT" in log
    assert f"apexrl plot {run_dir}" in log
    assert "Traceback" not in log
    for name, pid in {**pids, "actor0": new_actor0}.items():
        assert not _alive(pid), f"{name} (pid {pid}) is still running"
    assert _pids(run_dir) == {}
    assert "learner done:" in _read(os.path.join(run_dir, "logs", "learner.log"))  # checkpointed on SIGTERM
    assert re.search(r"actor 0 done: \d+ steps", _read(actor0_log))  # the restarted actor flushed and exited 0
    for name in ("metrics.csv", "episodes.csv", "checkpoint.safetensors", "logs/learner.log"):
        assert os.path.exists(os.path.join(run_dir, name)), name
    metrics = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert metrics["learner_steps"][-1] > 0
    episodes = read_csv(os.path.join(run_dir, "episodes.csv"))
    assert set(episodes["actor"]) == {0.0, 1.0}

    out = subprocess.run([sys.executable, "-m", "apexrl", "plot", run_dir], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    png = os.path.join(run_dir, "curves.png")
    with open(png, "rb") as f:
        data = f.read()
    assert data.startswith(PNG_SIGNATURE)
    assert 20_000 < len(data) < 2_000_000


@pytest.mark.slow
def test_run_stops_by_itself_at_steps(spawn, tmp_path):
    run_dir = str(tmp_path / "run")
    launcher = spawn(
        "launcher",
        "apexrl",
        "run",
        "--run-dir",
        run_dir,
        "--minutes",
        "0",
        "--steps",
        "200",
        "--final-eval",
        "3",
        "--actors",
        "1",
        "--quiet",
        "--eval-weights",
        "polyak",
        f"--learner-args={FAST_LEARNER}",
    )
    assert launcher.proc.wait(120) == 0, launcher.log()
    assert "stopping: reached --steps 200" in launcher.log()
    assert read_csv(os.path.join(run_dir, "metrics.csv"))["learner_steps"][-1] == 200
    assert os.path.exists(os.path.join(run_dir, "checkpoint.safetensors"))
    assert not any(_alive(pid) for pid in _pids(run_dir).values())
    # The run reached its end, so the launcher evaluated the final checkpoint (--final-eval 3).
    with open(os.path.join(run_dir, "final_eval.json"), encoding="utf-8") as f:
        final = json.load(f)
    assert final["episodes"] == 3 and len(final["returns"]) == 3 and final["learner_steps"] == 200
    assert final["mean"] == pytest.approx(sum(final["returns"]) / 3)
    assert (final["checkpoint_kind"], final["chosen_by"]) == ("last", None)  # the final evaluation is the last's
    # --eval-weights polyak: the checkpoint carries the average beside the online weights, and it was scored.
    assert final["eval_weights"] == "polyak" and "Polyak-averaged weights" in launcher.log()
    tensors, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.safetensors"))
    assert meta["eval_weights"] == "polyak"
    averaged = [k for k in tensors if k.startswith("polyak/")]
    assert averaged and all(not torch.equal(tensors[k], tensors[k.removeprefix("polyak/")]) for k in averaged)
    assert "final evaluation: return" in launcher.log()
    best = best_eval(run_dir)  # None when no periodic evaluation finished in the run's few seconds
    assert (best is None) == ("best periodic evaluation" not in launcher.log())
    if best is not None:
        assert f"return {best['mean']:.1f} over {best['episodes']} episodes at learner step" in launcher.log()
        best_tensors, _ = load_checkpoint(os.path.join(run_dir, "best_checkpoint.safetensors"))
        assert set(averaged) <= set(best_tensors)  # the average its evaluation scored


def test_a_stopped_run_gets_no_final_evaluation(spawn, tmp_path):
    run_dir = str(tmp_path / "run")
    launcher = spawn(
        "launcher",
        "apexrl",
        "run",
        "--run-dir",
        run_dir,
        "--minutes",
        "0",
        "--final-eval",
        "3",
        "--actors",
        "1",
        "--quiet",
        f"--learner-args={FAST_LEARNER}",
    )
    wait_until(lambda: os.path.exists(os.path.join(run_dir, "metrics.csv")), 120, "metrics.csv", interval=0.3)
    launcher.proc.send_signal(signal.SIGINT)
    assert launcher.proc.wait(60) == 0, launcher.log()
    assert "received SIGINT" in launcher.log() and "final evaluation" not in launcher.log()
    assert not os.path.exists(os.path.join(run_dir, "final_eval.json"))


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--preset", "nope"], "valid presets: apex-dqn-atari, apex-dqn-atari-cpu, apex-dpg-control, cartpole"),
        (["--env", "gym:NoSuchEnv-v9"], "gym:CartPole-v1"),
        (["--actors", "0"], "must be an int in [1, 256]"),
        (["--minutes", "soon"], "'soon' is not a number"),
        (["--minutes", "-1"], "must be a finite number >= 0"),
        (["--learner-args", "--no-such-flag 1"], "unrecognized arguments: --no-such-flag"),
    ],
)
def test_bad_run_flags_are_refused_with_the_valid_values(args, message):
    out = subprocess.run([sys.executable, "-m", "apexrl", "run", *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert message in out.stderr, out.stderr


@pytest.mark.parametrize("held", ["metrics.csv", "best_checkpoint.safetensors"])
def test_a_directory_that_holds_a_run_needs_resume(tmp_path, held):
    (tmp_path / held).write_text("time_s\n")
    out = subprocess.run(
        [sys.executable, "-m", "apexrl", "run", "--run-dir", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2
    assert f"already holds a run ({held})" in out.stderr and "--resume" in out.stderr


def test_plot_refuses_a_directory_without_metrics(tmp_path):
    out = subprocess.run(
        [sys.executable, "-m", "apexrl", "plot", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 1
    assert "has no metrics.csv" in out.stderr


def test_progress_counts_episodes_across_actor_restarts():
    p = Progress(num_actors=2)
    p.feed("actor0", [{"role": "actor", "actor": 0, "time_s": 5, "steps": 100, "episodes": 7, "return_mean10": 20.0}])
    p.feed(
        "actor0", [{"role": "actor", "actor": 0, "time_s": 1, "steps": 10, "episodes": 2, "return_mean10": None}]
    )  # restarted
    assert p.feed(
        "learner",
        [
            {
                "role": "learner",
                "time_s": 9,
                "learner_steps": 50,
                "env_frames": 900,
                "learner_steps_per_s": 5.0,
                "replay_size": 800,
                "inserted_per_s": 100,
                "sampled_per_s": 640,
                "eval_return_mean": 31.5,
            }
        ],
    )
    line = p.line(elapsed=65, limit_s=300, max_steps=None)
    assert "episodes 9" in line and "return10 20.0" in line and "eval 31.5" in line
    assert "[1:05/5:00 (left 3:55)]" in line and "steps 50 (5/s)" in line


def test_episode_curve_sums_frames_over_actors_and_restarts(tmp_path):
    path = tmp_path / "episodes.csv"
    path.write_text(
        "time_s,actor,env_frames,episode,return,length\n"
        "1,0,10,1,1.0,10\n1,1,20,1,2.0,20\n2,0,30,2,3.0,20\n"
        "0.5,0,5,1,4.0,5\n"
    )  # actor 0 restarted: its counter began again at 0
    metrics = {"env_frames": [0.0, 100.0], "time_s": [0.0, 10.0]}
    import numpy as np

    frames, time_s, mean = episode_curve(str(path), {k: np.asarray(v) for k, v in metrics.items()}, smooth=2)
    assert frames.tolist() == [30, 50, 55]
    assert time_s.tolist() == [3.0, 5.0, 5.5]
    assert mean.tolist() == [1.5, 2.5, 3.5]


def test_resume_upgrades_an_older_episodes_csv_and_actors_refuse_a_foreign_one(tmp_path):
    from apexrl.apex.actor import _check_episodes_header
    from apexrl.apex.config import EPISODE_COLUMNS
    from apexrl.cli.main import upgrade_episodes_csv

    path = tmp_path / "episodes.csv"
    path.write_text("time_s,actor,env_frames,episode,return,length\n1,0,10,1,1.5,10\n2,1,2")  # torn last row
    with pytest.raises(ValueError, match="has columns"):
        _check_episodes_header(str(path))
    upgrade_episodes_csv(str(path))
    _check_episodes_header(str(path))  # now the actors append to it
    assert path.read_text() == ",".join(EPISODE_COLUMNS) + "\n1,0,10,1,1.5,10,,\n"
    episodes = read_csv(str(path))
    assert episodes["return"] == [1.5] and episodes["exploration"][0] != episodes["exploration"][0]  # NaN
    # A file from before the env column (vectorised actors): its rows get an empty env.
    path.write_text("time_s,actor,env_frames,episode,return,length,exploration\n1,0,10,1,1.5,10,0.4\n")
    upgrade_episodes_csv(str(path))
    assert path.read_text() == ",".join(EPISODE_COLUMNS) + "\n1,0,10,1,1.5,10,0.4,\n"
    path.write_text("when,who\n1,0\n")
    with pytest.raises(ValueError, match="has columns 'when,who'"):
        upgrade_episodes_csv(str(path))
    upgrade_episodes_csv(str(tmp_path / "absent.csv"))  # nothing to upgrade
    assert not (tmp_path / "absent.csv").exists()


def test_run_resume_refuses_a_foreign_episodes_csv_with_the_reason(tmp_path, capsys):
    from apexrl.cli.main import launch_plan

    (tmp_path / "episodes.csv").write_text("when,who\n1,0\n")
    with pytest.raises(SystemExit) as e:
        launch_plan(["--preset", "cartpole", "--run-dir", str(tmp_path), "--resume"])
    assert e.value.code == 2 and "episodes.csv has columns 'when,who'" in capsys.readouterr().err
    assert (tmp_path / "episodes.csv").read_text() == "when,who\n1,0\n"  # refused: nothing changed


def _free_run_of_ports(n: int) -> int:
    """A port p with p .. p + n - 1 free a moment ago."""
    import socket

    for _ in range(100):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            base = s.getsockname()[1]
        if base + n > 65535:
            continue
        socks = []
        try:
            for i in range(n):
                socks.append(socket.socket())
                socks[-1].bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise AssertionError("no run of free ports")


@pytest.mark.slow
def test_run_on_fixed_ports_and_a_clear_refusal_when_one_is_taken(spawn, tmp_path):
    import socket

    base = _free_run_of_ports(3)
    run_dir = str(tmp_path / "run")
    launcher = spawn(
        "launcher",
        "apexrl",
        "run",
        "--run-dir",
        run_dir,
        "--minutes",
        "0",
        "--steps",
        "30",
        "--final-eval",
        "0",
        "--actors",
        "1",
        "--replay-servers",
        "2",
        "--ports",
        str(base),
        "--quiet",
        f"--learner-args={FAST_LEARNER}",
    )
    assert launcher.proc.wait(180) == 0, launcher.log()
    with open(os.path.join(run_dir, "plan.json"), encoding="utf-8") as f:
        plan = json.load(f)
    assert [s["port"] for s in plan["servers"]] == [base, base + 1] and plan["learner"]["params_port"] == base + 2
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", base + 1))
        taken.listen()
        out = subprocess.run(
            [
                sys.executable,
                "-m",
                "apexrl",
                "run",
                "--run-dir",
                str(tmp_path / "run2"),
                "--replay-servers",
                "2",
                "--ports",
                str(base),
            ],
            capture_output=True,
            text=True,
            timeout=120,
        )
    assert out.returncode == 2, out.stdout + out.stderr
    assert f"port {base + 1} on 127.0.0.1 is not free" in out.stdout
    assert not _pids(str(tmp_path / "run2"))  # nothing was started
    assert "replay server tcp" not in out.stdout and "run finished" not in out.stdout
