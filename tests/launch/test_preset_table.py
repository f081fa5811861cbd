"""One source for what the presets follow: docs/running.md's presets table and the `apexrl run --help` epilog are
generated from the presets, every setting has a source, and the agent flags reach the config."""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess
import sys

import pytest

from apexrl.launch import preset_table
from apexrl.launch.plan import plan
from apexrl.launch.presets import PRESETS, Preset, ReplaySettings

DOCS = pathlib.Path(__file__).parents[2] / "docs" / "running.md"


def test_the_documented_presets_table_is_the_presets():
    """docs/running.md prints preset_table.markdown() between its presets:begin / presets:end marks, verbatim."""
    text = DOCS.read_text(encoding="utf-8")
    begin, end = "<!-- presets:begin -->\n", "<!-- presets:end -->"
    assert begin in text and end in text, "docs/running.md lost its presets marks"
    documented = text[text.index(begin) + len(begin) : text.index(end)]
    assert documented == preset_table.markdown(), (
        "docs/running.md is out of date: paste the output of `python -m apexrl.launch.preset_table` between the "
        "presets marks"
    )


def test_the_run_help_epilog_is_generated_from_the_presets():
    out = subprocess.run([sys.executable, "-m", "apexrl", "run", "--help"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert preset_table.epilog() in out.stdout
    for p in PRESETS.values():
        assert f"  {p.name} " in out.stdout
    assert "noise_sigma_min=0.03125 [Control Suite]" in out.stdout
    assert "actor_weights=target [Acme]" in out.stdout
    assert "Life loss is not terminal" in out.stdout


def test_every_setting_of_every_preset_has_a_known_source():
    for p in PRESETS.values():
        rows = preset_table.settings(p)
        names = [name for name, *_ in rows]
        assert len(names) == len(set(names)), p.name
        config_fields = {f.name for f in dataclasses.fields(type(p.agent_config()))}
        assert config_fields <= set(names), p.name  # every agent hyperparameter is listed
        replay = {"capacity", "eviction", "alpha"} if p.tables is None else {"tables"}  # tables replace them
        assert replay | {"min_replay_size", "beta", "is_weights", "actors"} <= set(names)
        assert all(source in preset_table.SOURCES for *_, source, _ in rows)
        assert p.source, f"preset {p.name} does not say what it follows"
        # a preset that sets an agent field names where the value comes from (or its "*" source)
        for name in p.agent_overrides:
            assert name in p.sources or "*" in p.sources, (p.name, name)


def test_a_setting_without_a_source_is_an_error_not_a_blank():
    base = PRESETS["apex-dpg-control"]
    unsourced = dataclasses.replace(base, name="x", agent_overrides={"critic_lr": 3e-4}, sources={})
    with pytest.raises(ValueError, match="preset x: setting critic_lr has no source"):
        preset_table.settings(unsourced)
    unknown = dataclasses.replace(base, name="y", sources={**base.sources, "n_step": "a blog"})
    with pytest.raises(ValueError, match="names source 'a blog'"):
        preset_table.settings(unknown)
    ok = Preset(
        name="z",
        description="",
        agent="dpg",
        env="dmc:cartpole-swingup",
        replay=ReplaySettings(capacity=10),
        learner=dict(min_replay_size=5, eval_episodes=3),
        sources={"*": "tuned"},
    )
    rows = {name: (value, source) for name, value, source, _ in preset_table.settings(ok)}
    assert rows["n_step"] == ("3", "Ape-X") and rows["capacity"] == ("10", "tuned")
    assert "alpha_evict" not in rows and "error_buffer" not in rows  # FIFO eviction, no rate limiter
    assert rows["beta"] == ("0.4", "Ape-X") and rows["is_weights"] == ("global_min", "apexrl")
    with pytest.raises(ValueError, match="setting min_replay_size has no source"):
        preset_table.settings(dataclasses.replace(ok, learner={}))


def test_tuned_presets_say_so_and_only_they_use_a_sigma_ladder_without_a_source():
    for p in PRESETS.values():
        rows = {name: source for name, _, source, _ in preset_table.settings(p)}
        if rows.get("noise_sigma_min") == "tuned":
            assert "tuned" in p.description and "tuned" in p.source
        config = p.agent_config()
        if getattr(config, "noise_sigma_min", None) == 0.05:
            pytest.fail(f"{p.name} uses the 0.3 -> 0.05 ladder, which no source gives")


def _run_args(*flags: str):
    from apexrl.cli.args import agent_overrides
    from apexrl.cli.main import build_parser

    args = build_parser().parse_args(["run", *flags])
    return agent_overrides(args)


def test_the_agent_flags_reach_the_config_of_every_process():
    o = _run_args(
        "--preset",
        "apex-d4pg-control",
        "--dqda-clip",
        "none",
        "--dqda-clip-norm",
        "2",
        "--grad-clip-norm",
        "40",
        "--actor-loss-state",
        "next_obs",
        "--actor-weights",
        "target",
        "--noise-sigma-max",
        "0.5",
        "--noise-sigma-min",
        "0.1",
        "--noise-sigma-spacing",
        "linear",
    )
    p = plan("apex-d4pg-control", o)
    c = p.learner.agent_config
    assert (c.dqda_clip, c.dqda_clip_norm, c.grad_clip_norm, c.actor_loss_state, c.actor_weights) == (
        None,
        2.0,
        40.0,
        "next_obs",
        "target",
    )
    assert (c.noise_sigma_max, c.noise_sigma_min, c.noise_sigma_spacing) == (0.5, 0.1, "linear")
    assert all(a.agent_config == c for a in p.actors)
    # none switches a clip off that the preset sets
    assert plan("d4pg-acme", _run_args("--grad-clip-norm", "none")).learner.agent_config.grad_clip_norm is None
    assert plan("cartpole", _run_args("--grad-clip-norm", "10")).learner.agent_config.grad_clip_norm == 10.0
    # --lr: the one learning rate of DQN and R2D2, the same in the learner and every actor
    p = plan("r2d2-cpu", _run_args("--lr", "1e-4", "--target-update-period", "2500"))
    assert (p.learner.agent_config.lr, p.learner.agent_config.target_update_period) == (1e-4, 2500)
    assert all(a.agent_config == p.learner.agent_config for a in p.actors)
    assert plan("cartpole", _run_args("--lr", "3e-4")).learner.agent_config.lr == 3e-4


@pytest.mark.parametrize(
    "flags, reason",
    [
        (["--preset", "cartpole", "--actor-weights", "target"], "agent dqn has no setting actor_weights"),
        (["--preset", "apex-dpg-control", "--dqda-clip-norm", "1"], "set dqda_clip .* or dqda_clip_norm"),
        (["--preset", "apex-dpg-control", "--noise-sigma-min", "0.1"], "agent dpg has no setting noise_sigma_min"),
        (["--preset", "d4pg-small", "--lr", "1e-4"], "agent d4pg has no setting lr .* actor_lr, "),
    ],
)
def test_agent_flags_the_agent_cannot_take_are_refused_with_the_reason(flags, reason):
    with pytest.raises(ValueError, match=reason):
        plan(flags[1], _run_args(*flags))


@pytest.mark.parametrize(
    "flags, reason",
    [
        (["--dqda-clip", "-1"], "--dqda-clip"),
        (["--actor-loss-state", "s"], "invalid choice"),
        (["--noise-sigma-spacing", "log"], "invalid choice"),
        (["--lr", "0"], "--lr: 0 is out of range"),
    ],
)
def test_bad_agent_flag_values_exit_2(flags, reason):
    out = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.learner", "--preset", "apex-d4pg-control", *flags],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2 and reason in out.stderr, out.stderr


def test_d4pg_acmes_replay_samples_uniformly_with_unit_weights():
    """alpha 0 (d4pg-acme): every priority counts as 1, so sampling is uniform and every IS weight is 1."""
    import numpy as np

    from apexrl import PrioritizedStore

    r = PRESETS["d4pg-acme"].replay
    store = PrioritizedStore(capacity=100, alpha=r.alpha, shards=1, eviction=r.eviction, seed=0)
    store.insert(np.array([1e-6, 1.0, 100.0, 0.0]), [b"a", b"b", b"c", b"d"])
    counts = {}
    for _ in range(40):
        batch = store.sample(100, beta=0.4)
        assert np.all(batch.weights == 1.0) and np.allclose(batch.probabilities, 0.25)
        for item in batch.items:
            counts[bytes(item)] = counts.get(bytes(item), 0) + 1
    assert set(counts) == {b"a", b"b", b"c", b"d"} and min(counts.values()) > 850  # 1000 expected each
