"""``apexrl evaluate``: a real run's checkpoint scored (mean ± SE, --json keys), videos (GIF, MP4, dm_control
offscreen), clear exit-2 errors that write nothing; episodes.csv's exploration column."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import numpy as np
import pytest

FAST = "--min-replay-size 300 --eval-every 3 --eval-episodes 1 --metrics-every 1 --checkpoint-every 100"
JSON_KEYS = {
    "agent",
    "env",
    "preset",
    "checkpoint",
    "checkpoint_kind",
    "chosen_by",
    "eval_weights",
    "learner_steps",
    "env_frames",
    "time_s",
    "episodes",
    "mean",
    "std",
    "se",
    "returns",
    "seed",
}


def _apexrl(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apexrl", *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    """One real CartPole run of 2 actors, stopped at 100 learner steps."""
    d = str(tmp_path_factory.mktemp("evaluate") / "run")
    done = _apexrl(
        "run",
        "--run-dir",
        d,
        "--minutes",
        "0",
        "--steps",
        "100",
        "--final-eval",
        "0",
        "--actors",
        "2",
        "--quiet",
        f"--learner-args={FAST}",
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return d


def test_evaluate_prints_mean_and_se_and_writes_the_json(run_dir, tmp_path):
    out = str(tmp_path / "eval.json")
    done = _apexrl("evaluate", run_dir, "--episodes", "3", "--json", out)
    assert done.returncode == 0, done.stderr
    with open(out) as f:
        r = json.load(f)
    assert set(r) == JSON_KEYS
    assert (r["checkpoint_kind"], r["chosen_by"], r["eval_weights"]) == ("last", None, "online")
    assert r["checkpoint"] == os.path.join(os.path.abspath(run_dir), "checkpoint.safetensors")
    assert (r["agent"], r["env"], r["preset"], r["episodes"], r["learner_steps"]) == (
        "dqn",
        "gym:CartPole-v1",
        "cartpole",
        3,
        100,
    )
    assert r["env_frames"] > 0 and r["time_s"] > 0 and len(r["returns"]) == 3
    assert r["mean"] == pytest.approx(np.mean(r["returns"]))
    assert r["se"] == pytest.approx(np.std(r["returns"], ddof=1) / np.sqrt(3))
    assert r["seed"] == 5003  # the run's seed 0 * 10007 + 5003, the learner's evaluation stream
    assert f"{r['mean']:.2f} ± {r['se']:.2f} (SE) over 3 episodes" in done.stdout
    assert "learner step 100" in done.stdout


@pytest.mark.parametrize("suffix", [".gif", ".mp4"])
def test_video_records_the_first_scored_episode_without_changing_the_returns(run_dir, tmp_path, suffix):
    plain, filmed = str(tmp_path / "plain.json"), str(tmp_path / "filmed.json")
    video = str(tmp_path / f"episode{suffix}")
    assert _apexrl("evaluate", run_dir, "--episodes", "2", "--seed", "7", "--json", plain).returncode == 0
    done = _apexrl("evaluate", run_dir, "--episodes", "2", "--seed", "7", "--json", filmed, "--video", video)
    assert done.returncode == 0, done.stderr
    with open(plain) as a, open(filmed) as b:
        assert json.load(a)["returns"] == json.load(b)["returns"]
    with open(video, "rb") as f:
        head = f.read(12)
    assert head.startswith(b"GIF89a") if suffix == ".gif" else head[4:8] == b"ftyp"
    assert [n for n in os.listdir(tmp_path) if ".tmp." in n] == []
    if suffix == ".gif":
        from PIL import Image

        with Image.open(video) as im:
            assert im.n_frames >= 5 and im.size == (600, 400)  # gymnasium's CartPole drawing


def test_dmc_renders_offscreen_with_egl():
    code = (
        "from apexrl.envs import make_env\n"
        "e = make_env('dmc:cartpole-swingup', 0); e.reset(); f = e.render()\n"
        "print(f.shape, f.dtype, int(f.std() > 0), e.render_fps)"
    )
    # Explicitly: this test process may hold MUJOCO_GL=disable (set by apexrl.envs.dmc for training).
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "MUJOCO_GL": "egl"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["(240,", "320,", "3)", "uint8", "1", "100.0"]


def test_atari_renders_what_the_agent_sees():
    pytest.importorskip("ale_py")
    from apexrl.envs import make_env

    with make_env("atari:Pong", 0, evaluation=True) as e:
        obs = e.reset()
        f = e.render()
    assert f.shape == (336, 336, 3) and f.dtype == np.uint8
    assert np.array_equal(f[::4, ::4, 0], obs[-1])


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["/no/such/run"], "/no/such/run is not a directory"),
        (["{empty}"], "has no checkpoint.safetensors"),
        (["{run}", "--video", "{tmp}/v.avi"], "must end in .gif or .mp4"),
        (["{run}", "--episodes", "0"], "--episodes: 0 is out of range, must be an int in [1, 100000]"),
        (["{bad_agent}"], "unknown agent 'nope'"),
        (["{last_only}", "--best"], "has no best_checkpoint.safetensors"),
    ],
)
def test_errors_exit_2_with_one_clear_line_and_write_nothing(run_dir, tmp_path, args, message):
    empty = tmp_path / "empty"
    empty.mkdir()
    bad = tmp_path / "bad"
    bad.mkdir()
    from apexrl.apex.checkpoint import load_checkpoint, save_checkpoint

    tensors, meta = load_checkpoint(os.path.join(run_dir, "checkpoint.safetensors"))
    save_checkpoint(str(bad / "checkpoint.safetensors"), tensors, {**meta, "agent": "nope"})
    last_only = tmp_path / "last_only"  # a run whose checkpoint was written before any evaluation finished
    save_checkpoint(str(last_only / "checkpoint.safetensors"), tensors, meta)
    args = [a.format(empty=empty, run=run_dir, tmp=tmp_path, bad_agent=bad, last_only=last_only) for a in args]
    out = str(tmp_path / "r.json")
    done = _apexrl("evaluate", *args, "--json", out)
    assert done.returncode == 2, done.stdout + done.stderr
    assert message in done.stderr and "Traceback" not in done.stderr
    assert not os.path.exists(out)


def test_episodes_csv_says_how_much_each_actor_explores(start_server, tmp_path):
    # Both actors of a run of 2, in turn, into one file; 501 steps each: CartPole-v1 ends an episode within 500
    # (a short run's second actor may still be starting when the run stops, so a run is not used here).
    from apexrl.apex.actor import Actor
    from apexrl.apex.config import ActorConfig

    server, path = start_server(), str(tmp_path / "episodes.csv")
    for index in (0, 1):
        actor = Actor(
            ActorConfig(
                agent="dqn",
                env="gym:CartPole-v1",
                replay=server.endpoint,
                params="tcp://127.0.0.1:9",
                index=index,
                num_actors=2,
                episodes_csv=path,
                max_steps=501,
                wait_for_params=0.0,
                params_timeout=0.05,
                params_every_frames=10**15,
                log_every=3600.0,
            )
        )
        try:
            actor.run()
        finally:
            actor.close()
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    eps = {r["actor"]: float(r["exploration"]) for r in rows}
    assert eps == {"0": pytest.approx(0.4), "1": pytest.approx(0.4**8)}  # DQN's ladder for 2 actors


@pytest.mark.parametrize(("before", "after"), [(None, "egl"), ("disable", "egl"), ("osmesa", "osmesa")])
def test_video_picks_egl_unless_the_user_chose_a_backend(monkeypatch, before, after):
    """A MUJOCO_GL=disable inherited from apexrl's own training processes is not a user's choice."""
    from apexrl.video import prepare_rendering

    if before is None:
        monkeypatch.delenv("MUJOCO_GL", raising=False)
    else:
        monkeypatch.setenv("MUJOCO_GL", before)
    prepare_rendering("dmc:cartpole-swingup")
    assert os.environ["MUJOCO_GL"] == after
