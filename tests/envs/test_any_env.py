"""Any gymnasium environment and the user's own: a module of the test tree in gymnasium's "module:EnvId" form, the
spaces apexrl takes or refuses, gymnasium's MuJoCo tasks, and a family plugged in through ``apexrl.envs``."""

from __future__ import annotations

import csv
import os
import subprocess
import sys

import numpy as np
import pytest

from apexrl.envs import EnvSpec, UnsupportedSpaceError, env_names, env_spec, make_env

CUSTOM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "custom_envs")


@pytest.fixture
def custom_path(monkeypatch):
    monkeypatch.syspath_prepend(CUSTOM)


def test_a_users_module_is_imported_and_its_dict_observations_flattened(custom_path):
    spec = env_spec("gym:corridor_envs:Corridor-v0")
    # Dict keys in gymnasium's sorted order: noise (2x2 Box, raveled), then position (Discrete(5), one-hot).
    assert spec == EnvSpec("gym:corridor_envs:Corridor-v0", (9,), np.dtype(np.float32), 2, None, 1, 20)
    with make_env("gym:corridor_envs:Corridor-v0", 3) as env:
        obs = env.reset()
        assert obs.dtype == np.float32 and list(obs[4:]) == [1, 0, 0, 0, 0]
        assert np.all(np.abs(obs[:4]) <= 1) and np.any(obs[:4] != 0)
        # Agent action 1 is the space's start + 1 = 0, "right" (the env asserts the action is in its space).
        results = [env.step(1) for _ in range(4)]
    assert [r.terminated for r in results] == [False, False, False, True]
    assert list(results[-1].obs[4:]) == [0, 0, 0, 0, 1]
    assert results[-1].reward == 1.0 and results[0].reward == -0.01


@pytest.mark.parametrize(
    "env_id, named",
    [
        ("Pixels-v0", r"image observations Box\(0, 255, \(8, 8, 3\), uint8\)"),
        ("Unbounded-v0", r"action space Box\(-inf, inf, \(2,\), float32\) \(unbounded\)"),
    ],
)
def test_unsupported_spaces_are_refused_naming_the_space_and_what_is_supported(custom_path, env_id, named):
    with pytest.raises(UnsupportedSpaceError, match=named) as err:
        env_spec(f"gym:corridor_envs:{env_id}")
    assert "Discrete" in str(err.value) and "Box" in str(err.value)


def test_a_missing_user_module_is_an_unknown_environment():
    with pytest.raises(ValueError, match="cannot import module 'no_such_pkg.envs'"):
        env_spec("gym:no_such_pkg.envs:Thing-v0")


def test_a_gymnasium_mujoco_task_steps_with_rescaled_actions():
    import gymnasium

    with make_env("gym:Hopper-v5", 1) as env:
        assert env.spec.action_dim == 3 and env.spec.obs_shape == (11,)
        env.reset()
        raw = gymnasium.make("Hopper-v5", disable_env_checker=True)
        assert np.all(raw.action_space.high == 1.0)  # Hopper's bounds are [-1, 1]: unit actions pass unchanged
        raw.close()
        steps = [env.step(np.full(3, 0.5, np.float32)) for _ in range(5)]
    assert all(s.obs.shape == (11,) and np.isfinite(s.reward) for s in steps)


# --- through apexrl run -------------------------------------------------------------------------------------------


def _run(tmp_path, env_name: str, *flags: str, pythonpath: list[str]) -> tuple[subprocess.CompletedProcess, str]:
    run_dir = str(tmp_path / "run")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*pythonpath, os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl",
            "run",
            "--env",
            env_name,
            "--actors",
            "1",
            "--final-eval",
            "0",
            "--minutes",
            "4",
            "--run-dir",
            run_dir,
            "--progress-every",
            "2",
            *flags,
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out, run_dir


def _rows(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def test_a_custom_gymnasium_module_from_the_test_tree_trains_through_apexrl_run(tmp_path):
    out, run_dir = _run(
        tmp_path,
        "gym:corridor_envs:Corridor-v0",
        "--steps",
        "60",
        "--learner-args",
        "--min-replay-size 200 --eval-every 0 --metrics-every 1",
        pythonpath=[CUSTOM],
    )
    assert "agent dqn" in out.stdout and "reached --steps 60" in out.stdout  # DQN by its Discrete actions
    assert int(_rows(os.path.join(run_dir, "metrics.csv"))[-1]["learner_steps"]) >= 60
    episodes = _rows(os.path.join(run_dir, "episodes.csv"))
    assert episodes and all(int(e["length"]) <= 20 for e in episodes)


@pytest.fixture
def chain_plugin(tmp_path):
    """A distribution adding the ``chain`` family with an ``apexrl.envs`` entry point."""
    root = tmp_path / "plugin"
    info = root / "apexrl_chain-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: apexrl-chain\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text("[apexrl.envs]\nchain = chain_family:FAMILY\n")
    return [str(root), CUSTOM]


def test_a_family_plugged_in_through_an_entry_point_runs_through_apexrl_run(tmp_path, chain_plugin):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([*chain_plugin, os.environ.get("PYTHONPATH", "")])}
    code = "from apexrl.envs import env_names, env_families; print(env_names()); print(env_families())"
    listed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert "'chain:4'" in listed and "chain:<length> (a test family" in listed
    assert "chain:4" not in env_names()  # not installed in this process
    out, run_dir = _run(
        tmp_path,
        "chain:4",
        "--steps",
        "30",
        "--learner-args",
        "--min-replay-size 100 --eval-every 0 --metrics-every 1",
        pythonpath=chain_plugin,
    )
    assert "agent dqn, env chain:4" in out.stdout and "preset dqn-defaults" in out.stdout
    episodes = _rows(os.path.join(run_dir, "episodes.csv"))
    assert episodes and {e["return"] for e in episodes} <= {"0", "1"}
