"""The whole Ape-X system as real processes on 127.0.0.1: replay server, learner, actors on gym:CartPole-v1.

The smoke test runs everything for a while and checks that transitions flow, priorities come back, the
learner trains, writes metrics and a checkpoint, and that every process exits 0 on SIGTERM. The fault tests
kill or restart one process and check that the others recover by themselves.
"""

from __future__ import annotations

import os
import re
import time

import pytest

from apexrl.apex.metrics import read_csv
from apexrl.replay.client.replay_client import ReplayClient
from tests.conftest import free_port
from tests.helpers import csv_columns, wait_until

# Small, fast settings: the point is the plumbing, not the learning.
LEARNER_FAST = [
    "--agent",
    "dqn",
    "--env",
    "gym:CartPole-v1",
    "--preset",
    "cartpole",
    "--min-replay-size",
    "300",
    "--batch-size",
    "32",
    "--metrics-every",
    "1",
    "--checkpoint-every",
    "50",
    "--eval-every",
    "3",
    "--eval-episodes",
    "1",
    "--log-level",
    "WARNING",
]
ACTOR_FAST = [
    "--agent",
    "dqn",
    "--env",
    "gym:CartPole-v1",
    "--preset",
    "cartpole",
    "--batch-size",
    "32",
    "--log-every",
    "1",
    "--log-level",
    "WARNING",
]


def start_learner(spawn, replay: str, run_dir: str, *extra: str, name: str = "learner", params_port: int = 0):
    learner = spawn(
        name,
        "apexrl.cli.learner",
        "--replay",
        replay,
        "--params-port",
        str(params_port),
        "--run-dir",
        run_dir,
        *LEARNER_FAST,
        *extra,
    )
    m = learner.wait_for(r"learner params on (tcp://\S+)", timeout=60)
    return learner, m.group(1)


def start_actor(spawn, replay: str, params: str, index: int, num: int = 2):
    return spawn(
        f"actor{index}",
        "apexrl.cli.actor",
        "--replay",
        replay,
        "--params",
        params,
        "--index",
        str(index),
        "--num-actors",
        str(num),
        *ACTOR_FAST,
    )


def start_system(start_server, spawn, run_dir: str, *, port: int = 0, params_port: int = 0):
    """A replay server, a learner and two actors: (server, learner, actors)."""
    server = start_server("--capacity", "20000", "--min-size-to-sample", "300", port=port)
    learner, params = start_learner(spawn, server.endpoint, run_dir, params_port=params_port)
    actors = [start_actor(spawn, server.endpoint, params, i) for i in range(2)]
    return server, learner, actors


def learner_steps(run_dir: str) -> int:
    columns = csv_columns(os.path.join(run_dir, "metrics.csv"), "learner_steps")
    return int(columns["learner_steps"][-1]) if columns and columns["learner_steps"] else 0


def evaluated(run_dir: str) -> bool:
    """metrics.csv holds a finished evaluation (a non-empty eval_return_mean)."""
    columns = csv_columns(os.path.join(run_dir, "metrics.csv"), "eval_return_mean")
    return columns is not None and any(v == v for v in columns["eval_return_mean"])  # v == v: not NaN


def test_smoke_server_learner_two_actors_train_checkpoint_and_exit_zero(start_server, spawn, tmp_path):
    run_dir = str(tmp_path / "run")
    server, learner, actors = start_system(start_server, spawn, run_dir)

    wait_until(lambda: learner_steps(run_dir) >= 300, 120, "300 learner steps in metrics.csv", interval=0.5)
    wait_until(lambda: evaluated(run_dir), 60, "an evaluation in metrics.csv", interval=0.5)
    for a in actors:
        a.wait_for(r"params_version=[1-9]", timeout=30)  # actors pulled weights the learner published
        a.wait_for(r"episodes=[1-9]", timeout=30)
    with ReplayClient(server.endpoint, timeout=10) as client:
        stats = client.stats()
    assert stats["inserted"] > 1000
    assert stats["updated"] > 0  # the learner's priorities reached the store
    assert stats["sampled"] >= 300 * 32

    for a in actors:
        assert a.terminate() == 0, a.log()
    assert learner.terminate() == 0, learner.log()
    assert server.terminate() == 0
    assert os.path.exists(os.path.join(run_dir, "checkpoint.safetensors"))
    cols = read_csv(os.path.join(run_dir, "metrics.csv"))
    for name in ("time_s", "env_frames", "learner_steps", "eval_return_mean"):
        assert name in cols
    assert cols["env_frames"][-1] > 1000
    assert cols["learner_steps"] == sorted(cols["learner_steps"])
    for p in (learner, *actors):
        assert "Traceback" not in p.log(), p.log()


def test_killing_an_actor_does_not_stop_learning(start_server, spawn, tmp_path):
    run_dir = str(tmp_path / "run")
    server, learner, actors = start_system(start_server, spawn, run_dir)
    wait_until(lambda: learner_steps(run_dir) >= 100, 120, "100 learner steps", interval=0.5)
    actors[0].kill9()
    with ReplayClient(server.endpoint, timeout=10) as client:
        inserted = client.stats()["inserted"]
        steps = learner_steps(run_dir)
        wait_until(lambda: learner_steps(run_dir) >= steps + 200, 60, "learning to go on after the kill", interval=0.5)
        assert client.stats()["inserted"] > inserted  # the surviving actor still feeds the replay
    assert actors[1].terminate() == 0
    assert learner.terminate() == 0


def test_actors_and_learner_recover_from_a_replay_server_restart(start_server, spawn, tmp_path):
    port = free_port()
    run_dir = str(tmp_path / "run")
    server, learner, actors = start_system(start_server, spawn, run_dir, port=port)
    wait_until(lambda: learner_steps(run_dir) >= 100, 120, "100 learner steps", interval=0.5)

    server.kill9()  # a crash: no snapshot, the new server starts empty
    time.sleep(2.0)
    server = start_server("--capacity", "20000", "--min-size-to-sample", "300", port=port)
    with ReplayClient(server.endpoint, timeout=10) as client:
        wait_until(lambda: client.stats()["inserted"] > 500, 60, "actors to refill the restarted server", interval=0.5)
        steps = learner_steps(run_dir)
        wait_until(
            lambda: learner_steps(run_dir) >= steps + 100, 90, "the learner to train on the new server", interval=0.5
        )
        assert client.stats()["sampled"] > 0
    for a in actors:
        assert a.terminate() == 0, a.log()
    assert learner.terminate() == 0, learner.log()


def test_learner_killed_and_resumed_continues_its_counters_and_weights(start_server, spawn, tmp_path):
    run_dir = str(tmp_path / "run")
    params_port = free_port()
    server, learner, actors = start_system(start_server, spawn, run_dir, params_port=params_port)
    ckpt = os.path.join(run_dir, "checkpoint.safetensors")
    wait_until(lambda: learner_steps(run_dir) >= 120 and os.path.exists(ckpt), 120, "a checkpoint", interval=0.5)
    learner.kill9()

    from apexrl.apex.checkpoint import load_checkpoint

    _tensors, meta = load_checkpoint(ckpt)
    saved_steps = meta["learner_steps"]
    assert saved_steps >= 50
    learner2, _ = start_learner(spawn, server.endpoint, run_dir, "--resume", name="learner2", params_port=params_port)
    m = learner2.wait_for(r"resumed from \S+ at step (\d+)", timeout=30)
    assert int(m.group(1)) == saved_steps
    wait_until(lambda: learner_steps(run_dir) >= saved_steps + 100, 90, "the resumed learner to train", interval=0.5)
    rows = read_csv(os.path.join(run_dir, "metrics.csv"))
    resumed = [s for s in rows["learner_steps"] if s >= saved_steps]
    assert resumed and min(resumed) >= saved_steps  # counters continue, they do not restart at 0
    # Actors keep running across the learner's restart and take the resumed learner's weights.
    for a in actors:
        start = len(a.log())
        a.wait_for(r"params_version=\d+", timeout=30, start=start)
        assert a.alive()
    for a in actors:
        assert a.terminate() == 0, a.log()
    assert learner2.terminate() == 0, learner2.log()
    _, meta2 = load_checkpoint(ckpt)
    assert meta2["learner_steps"] > saved_steps
    assert meta2["time_s"] > meta["time_s"]


@pytest.mark.parametrize(
    ("module", "args", "message"),
    [
        (
            "apexrl.cli.learner",
            [
                "--agent",
                "no-such-agent",
                "--env",
                "gym:CartPole-v1",
                "--replay",
                "tcp://127.0.0.1:1",
                "--params-port",
                "0",
            ],
            "valid agents: dqn, dpg",
        ),
        (
            "apexrl.cli.learner",
            ["--agent", "dqn", "--env", "gym:NoSuchEnv-v9", "--replay", "tcp://127.0.0.1:1", "--params-port", "0"],
            "CartPole",
        ),
        (
            "apexrl.cli.learner",
            ["--agent", "dqn", "--env", "gym:Pendulum-v1", "--replay", "tcp://127.0.0.1:1", "--params-port", "0"],
            "needs a discrete action space",
        ),
        (
            "apexrl.cli.learner",
            ["--preset", "nope", "--replay", "tcp://127.0.0.1:1", "--params-port", "0"],
            "valid presets",
        ),
        (
            "apexrl.cli.learner",
            ["--agent", "dqn", "--env", "gym:CartPole-v1", "--replay", "localhost:5", "--params-port", "0"],
            "tcp://HOST:PORT",
        ),
        (
            "apexrl.cli.actor",
            [
                "--agent",
                "dqn",
                "--env",
                "gym:CartPole-v1",
                "--replay",
                "tcp://127.0.0.1:1",
                "--params",
                "tcp://127.0.0.1:2",
                "--index",
                "2",
                "--num-actors",
                "2",
            ],
            "must be <",
        ),
        (
            "apexrl.cli.actor",
            [
                "--agent",
                "dpg",
                "--env",
                "gym:Pendulum-v1",
                "--replay",
                "tcp://127.0.0.1:1",
                "--params",
                "tcp://127.0.0.1:2",
                "--index",
                "0",
                "--num-actors",
                "1",
                "--gamma",
                "1.5",
            ],
            "must be a finite number in [0, 1]",
        ),
    ],
)
def test_bad_flags_are_refused_with_the_reason(module, args, message):
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2, out
    assert re.search(re.escape(message), out.stderr), out.stderr
