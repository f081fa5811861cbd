"""``apexrl plot`` over seeds: the band across seeds, the greediest actor, evaluations at the frames their weights
were taken, on CSVs written by hand; one smoke test that the PNG is written."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from apexrl.apex.metrics import read_csv
from apexrl.plot import episode_curve, eval_curve, greediest_actor, seed_band

METRICS_HEADER = "time_s,env_frames,learner_steps,eval_return_mean,eval_return_se,eval_env_frames,eval_time_s\n"


def _run(
    tmp_path, name: str, metrics_rows: str, episodes: str | None = None, seed: int = 0, final: dict | None = None
) -> str:
    d = tmp_path / name
    d.mkdir()
    (d / "metrics.csv").write_text(METRICS_HEADER + metrics_rows)
    if episodes is not None:
        (d / "episodes.csv").write_text(episodes)
    (d / "plan.json").write_text(
        json.dumps({"preset": "cartpole", "learner": {"agent": "dqn", "env": "gym:CartPole-v1", "seed": seed}})
    )
    if final is not None:
        (d / "final_eval.json").write_text(json.dumps(final))
    return str(d)


def test_seed_band_is_the_mean_and_standard_error_on_the_common_range():
    a = (np.array([0.0, 100.0, 200.0]), np.array([0.0, 10.0, 20.0]))
    b = (np.array([50.0, 150.0, 250.0]), np.array([10.0, 10.0, 10.0]))
    grid, mean, se = seed_band([a, b], points=3)
    assert grid.tolist() == [50.0, 125.0, 200.0]  # where both seeds have data
    ya = np.array([5.0, 12.5, 20.0])
    yb = np.array([10.0, 10.0, 10.0])
    assert mean == pytest.approx((ya + yb) / 2)
    assert se == pytest.approx(np.abs(ya - yb) / 2)  # std(ddof=1)/sqrt(2) of two values = |a-b|/2
    g1, m1, s1 = seed_band([a], points=3)
    assert g1.tolist() == [0.0, 100.0, 200.0] and m1.tolist() == [0.0, 10.0, 20.0] and s1.tolist() == [0, 0, 0]
    assert all(len(v) == 0 for v in seed_band([a, (np.array([300.0, 400.0]), np.array([1.0, 2.0]))]))


def test_evaluations_are_placed_at_the_frames_and_time_of_their_weights(tmp_path):
    d = _run(tmp_path, "r", "10,1000,50,,,,\n20,2000,100,7.5,0.5,1500,15\n30,3000,150,9,1,,\n")
    frames, time_s, y = eval_curve({k: np.asarray(v) for k, v in read_csv(os.path.join(d, "metrics.csv")).items()})
    assert frames.tolist() == [1500, 3000]  # the row's own where the credit is missing (old files)
    assert time_s.tolist() == [15, 30]
    assert y.tolist() == [7.5, 9]


def test_the_greediest_actor_has_the_smallest_exploration_or_else_the_highest_index(tmp_path):
    rows = [
        {"actor": "0", "exploration": "0.4", "return": "1"},
        {"actor": "1", "exploration": "0.0016", "return": "2"},
        {"actor": "2", "exploration": "0.05", "return": "3"},
    ]
    assert greediest_actor(rows) == "1"
    assert greediest_actor([{k: v for k, v in r.items() if k != "exploration"} for r in rows]) == "2"
    assert greediest_actor([]) is None

    episodes = (
        "time_s,actor,env_frames,episode,return,length,exploration\n"
        "1,0,10,1,100,10,0.4\n1,1,20,1,7,20,0.01\n2,0,30,2,200,20,0.4\n2,1,50,2,9,30,0.01\n"
    )
    d = _run(tmp_path, "r", "1,0,0,,,,\n9,100,10,,,,\n", episodes)
    m = {k: np.asarray(v) for k, v in read_csv(os.path.join(d, "metrics.csv")).items()}
    frames, _time_s, mean = episode_curve(os.path.join(d, "episodes.csv"), m, smooth=1, greediest=True)
    assert frames.tolist() == [30.0, 80.0]  # run-wide frames (actor 0's count too), actor 1's episodes only
    assert mean.tolist() == [7.0, 9.0]


def test_with_vectorised_actors_the_greediest_environment_of_any_actor_is_drawn(tmp_path):
    # Actor 0 steps two environments (exploration 0.4 and 0.01), actor 1 one (0.1): actor 0's env 1 is greediest.
    episodes = (
        "time_s,actor,env_frames,episode,return,length,exploration,env\n"
        "1,0,10,1,100,10,0.4,0\n1,0,20,2,7,10,0.01,1\n1,1,15,1,50,15,0.1,0\n2,0,40,3,9,20,0.01,1\n"
    )
    rows = list(csv.DictReader(io.StringIO(episodes)))
    assert greediest_actor(rows) == "0/1"
    assert greediest_actor([{k: v for k, v in r.items() if k != "env"} for r in rows]) == "0"  # old files
    d = _run(tmp_path, "r", "1,0,0,,,,\n9,100,10,,,,\n", episodes)
    m = {k: np.asarray(v) for k, v in read_csv(os.path.join(d, "metrics.csv")).items()}
    frames, _, mean = episode_curve(os.path.join(d, "episodes.csv"), m, smooth=1, greediest=True)
    assert frames.tolist() == [20.0, 55.0] and mean.tolist() == [7.0, 9.0]


def test_plot_of_several_seeds_writes_a_png_with_the_final_evaluations(tmp_path):
    rows = "10,1000,50,5,1,1000,10\n20,2000,100,8,1,2000,20\n"
    episodes = "time_s,actor,env_frames,episode,return,length,exploration\n1,0,500,1,3,500,0.4\n2,0,1500,2,5,1000,0.4\n"
    final = {"mean": 9.0, "se": 0.5, "episodes": 10, "env_frames": 2100, "time_s": 21.0}
    dirs = [_run(tmp_path, f"s{i}", rows, episodes, seed=i, final=final) for i in range(3)]
    out = str(tmp_path / "seeds.png")
    done = subprocess.run(
        [sys.executable, "-m", "apexrl", "plot", *dirs, "--out", out, "--smooth", "1"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    with open(out, "rb") as f:
        assert f.read(8) == b"\x89PNG\r\n\x1a\n"


def test_plot_refuses_a_final_eval_without_numbers(tmp_path):
    d = _run(tmp_path, "r", "10,1000,50,5,1,1000,10\n", final={"mean": "high"})
    done = subprocess.run([sys.executable, "-m", "apexrl", "plot", d], capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and "final_eval.json has no number 'mean'" in done.stderr


def test_groups_name_the_environment_only_where_the_runs_environments_differ(tmp_path):
    """Legend labels stay short: on one environment (the title names it) a group is its agent and preset."""
    from apexrl.plot import _envs, _groups

    rows = "10,1000,50,5,1,1000,10\n"

    def run(name: str, agent: str, preset: str, env: str) -> str:
        d = _run(tmp_path, name, rows)
        with open(os.path.join(d, "plan.json"), "w") as f:
            json.dump({"preset": preset, "learner": {"agent": agent, "env": env, "seed": 0}}, f)
        return d

    a, b = run("a", "r2d2", "r2d2-cpu", "gym:pkg.mod:Long-v1"), run("b", "dqn", "cartpole", "gym:pkg.mod:Long-v1")
    assert [name for name, _ in _groups([a, b])] == ["r2d2 (r2d2-cpu)", "dqn (cartpole)"]
    assert _envs([a, b]) == ["gym:pkg.mod:Long-v1"]
    c = run("c", "dqn", "cartpole", "gym:CartPole-v1")
    assert [name for name, _ in _groups([a, c])] == [
        "gym:pkg.mod:Long-v1 r2d2 (r2d2-cpu)",
        "gym:CartPole-v1 dqn (cartpole)",
    ]


def _seeds_and_configs(tmp_path) -> dict[str, list[str]]:
    rows = "10,1000,50,5,1,1000,10\n20,2000,100,9,1,2000,20\n30,3000,150,12,1,3000,30\n"
    final = {"mean": 11.0, "se": 1.0, "episodes": 10, "env_frames": 3000, "time_s": 30}
    seeds = [_run(tmp_path, f"s{i}", rows, seed=i, final=final) for i in range(3)]
    other = tmp_path / "other"
    other.mkdir()
    (other / "metrics.csv").write_text(METRICS_HEADER + rows)
    (other / "plan.json").write_text(
        json.dumps({"preset": "r2d2-cpu", "learner": {"agent": "r2d2", "env": "gym:CartPole-v1", "seed": 0}})
    )
    return {"one run": seeds[:1], "three seeds": seeds, "two configurations": seeds + [str(other)]}


def test_the_legend_lies_outside_both_panels_data_areas(tmp_path):
    from apexrl.plot import draw_runs

    plt = pytest.importorskip("matplotlib.pyplot")
    for case, dirs in _seeds_and_configs(tmp_path).items():
        fig = draw_runs(dirs)
        try:
            fig.canvas.draw()
            assert len(fig.legends) == 1, case
            legend = fig.legends[0].get_window_extent()
            assert len(fig.axes) == 2
            for ax in fig.axes:
                assert ax.get_legend() is None, case
                assert not legend.overlaps(ax.get_window_extent()), (case, legend, ax.get_window_extent())
            labels = [t.get_text() for t in fig.legends[0].get_texts()]
            assert any("final evaluation" in lab for lab in labels), (case, labels)
            if case == "two configurations":
                assert any(lab.startswith("r2d2") for lab in labels) and any(lab.startswith("dqn") for lab in labels)
        finally:
            plt.close(fig)


def test_runs_of_one_preset_sharing_a_seed_are_told_apart_by_the_settings_that_differ(tmp_path):
    """Two runs of one preset and seed ran with different settings (``--learner-args``): not seeds of one
    configuration, but one group each, named by what differs (and seeds of one setting still share a band)."""
    from apexrl.plot import _groups

    rows = "10,1000,50,5,1,1000,10\n"

    def run(name: str, seed: int, **learner) -> str:
        d = _run(tmp_path, name, rows)
        plan = {"agent": "r2d2", "env": "gym:CartPole-v1", "seed": seed, "run_dir": d, **learner}
        with open(os.path.join(d, "plan.json"), "w") as f:
            json.dump({"preset": "r2d2-cpu", "learner": plan}, f)
        return d

    online, polyak = run("a", 0, eval_weights="online"), run("b", 0, eval_weights="polyak")
    assert _groups([online, polyak]) == [
        ("r2d2 (r2d2-cpu) [eval_weights=online]", [online]),
        ("r2d2 (r2d2-cpu) [eval_weights=polyak]", [polyak]),
    ]
    seed1 = run("c", 1, eval_weights="online")
    assert _groups([online, seed1]) == [("r2d2 (r2d2-cpu)", [online, seed1])]
    # Seeds of each setting, both settings over the same seeds (an on/off comparison): one band per setting.
    polyak1 = run("d", 1, eval_weights="polyak")
    assert _groups([online, seed1, polyak, polyak1]) == [
        ("r2d2 (r2d2-cpu) [eval_weights=online]", [online, seed1]),
        ("r2d2 (r2d2-cpu) [eval_weights=polyak]", [polyak, polyak1]),
    ]
    # Two runs of one setting and seed (nothing in their plans tells them apart): a group each, by directory.
    again = run("e", 0, eval_weights="online")
    groups = _groups([online, again, polyak])
    assert [dirs for _, dirs in groups] == [[online], [again], [polyak]]
    assert groups[0][0] == f"r2d2 (r2d2-cpu) [eval_weights=online, {os.path.normpath(online)}]"


def test_runs_with_a_policy_lag_get_a_lag_panel_under_each_return_panel(tmp_path):
    """On-policy runs' metrics carry policy_lag_mean/_max: the figure draws them in two lower panels with the
    same x axes; runs without them keep the two-panel figure (the test above)."""
    from apexrl.plot import draw_runs

    plt = pytest.importorskip("matplotlib.pyplot")
    d = tmp_path / "ppo"
    d.mkdir()
    (d / "metrics.csv").write_text(
        METRICS_HEADER.strip() + ",policy_lag_mean,policy_lag_max\n"
        "10,1000,5,,,,,0.5,2\n20,2000,10,400,3,2000,20,1.5,4\n30,3000,15,,,,,,\n"
    )
    (d / "plan.json").write_text(
        json.dumps({"preset": "ppo-cartpole", "learner": {"agent": "ppo", "env": "gym:CartPole-v1", "seed": 0}})
    )
    fig = draw_runs([str(d)])
    try:
        fig.canvas.draw()
        assert len(fig.axes) == 4
        lag_frames, lag_time = fig.axes[2], fig.axes[3]
        assert lag_frames.get_ylabel() == "policy lag (updates)"
        mean_line, max_line = lag_frames.get_lines()
        assert list(mean_line.get_xdata()) == [1000, 2000] and list(mean_line.get_ydata()) == [0.5, 1.5]
        assert list(max_line.get_ydata()) == [2, 4]
        assert list(lag_time.get_lines()[0].get_xdata()) == pytest.approx([10 / 60, 20 / 60])
        labels = [t.get_text() for t in fig.legends[0].get_texts()]
        assert "policy lag, mean" in labels and "policy lag, max" in labels
        for ax in fig.axes:
            assert not fig.legends[0].get_window_extent().overlaps(ax.get_window_extent())
    finally:
        plt.close(fig)
