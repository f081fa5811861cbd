"""``apexrl run --agent-set NAME=VALUE``: any field of the agent's config without a flag of its own, through the
real parser and the plan to every process; each misuse refused with the reason (exit 2)."""

from __future__ import annotations

import argparse

import pytest

from apexrl.cli.args import agent_setting
from apexrl.launch.start import launch_plan


def _plan(tmp_path, *flags: str):
    p, _, _ = launch_plan(["--preset", "dmpo-small", "--run-dir", str(tmp_path / "run"), *flags])
    return p


def _error(capsys, tmp_path, *flags: str) -> str:
    with pytest.raises(SystemExit) as e:
        _plan(tmp_path, *flags)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_settings_reach_the_learner_and_every_actor_through_the_plan(tmp_path):
    p = _plan(
        tmp_path,
        "--agent-set",
        "init_log_alpha_stddev=10",
        "--agent-set",
        "num_samples=8",
        "--agent-set=actor_hidden=[64, 64]",
    )
    configs = [p.learner.agent_config, *(a.agent_config for a in p.actors)]
    for c in configs:
        assert (c.init_log_alpha_stddev, c.num_samples, c.actor_hidden) == (10, 8, (64, 64))
        assert c.critic_hidden == (256, 256)  # the preset's other settings stay
    default = _plan(tmp_path / "other").learner.agent_config
    assert (default.init_log_alpha_stddev, default.num_samples) == (1000.0, 20)


def test_misuse_is_refused_with_the_reason(capsys, tmp_path):
    err = _error(capsys, tmp_path, "--agent-set", "banana=3")
    assert "agent dmpo has no setting banana" in err and "num_samples" in err  # its settings listed
    err = _error(capsys, tmp_path, "--agent-set", "n_step=3")
    assert "n_step has its own flag, --n-step" in err
    err = _error(capsys, tmp_path, "--agent-set", "num_samples=0")
    assert "num_samples" in err
    err = _error(capsys, tmp_path, "--agent-set", "num_samples=4", "--agent-set", "num_samples=8")
    assert "--agent-set num_samples=... is given twice" in err
    err = _error(capsys, tmp_path, "--agent-set", "num_samples")
    assert "expected NAME=VALUE" in err
    assert not (tmp_path / "run").exists()  # nothing was started or written


def test_values_read_as_json_else_as_strings():
    assert agent_setting("lr=1e-4") == ("lr", 1e-4)
    assert agent_setting("obs-norm=true") == ("obs_norm", True)
    assert agent_setting("hidden=[1,2]") == ("hidden", (1, 2))
    assert agent_setting("optimizer=rmsprop_tf") == ("optimizer", "rmsprop_tf")
    assert agent_setting("grad_clip_norm=null") == ("grad_clip_norm", "none")  # off, as the flags spell it
    for bad in ("=3", "x=", "1x=2", 'x={"a": 1}'):
        with pytest.raises(argparse.ArgumentTypeError):
            agent_setting(bad)


def test_apexrl_run_from_python_takes_agent_set_as_a_mapping_or_a_list():
    from apexrl.api import to_argv

    assert to_argv({"agent_set": {"num_samples": 40, "actor_hidden": (64, 64)}}) == [
        "--agent-set=num_samples=40",
        "--agent-set=actor_hidden=[64, 64]",
    ]
    assert to_argv({"agent_set": ["num_samples=40"]}) == ["--agent-set=num_samples=40"]
