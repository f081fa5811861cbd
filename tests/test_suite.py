"""``apexrl bench-suite``: a real tiny suite (CartPole, short runs), its CSV rows and Markdown table, the resume
rule; the table's arithmetic on hand-made rows."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

from apexrl.suite import PAPER_NOTE, markdown_table

FAST = ("--learner-args='--min-replay-size 300 --eval-every 3 --eval-episodes 1 --metrics-every 1 "
        "--checkpoint-every 100'")


def _row(task, seed, mean, agent="d4pg", preset="p"):
    return {"task": task, "agent": agent, "preset": preset, "seed": seed, "minutes": 20.0, "final_return_mean": mean}


def test_markdown_table_has_mean_and_se_over_seeds_beside_the_paper():
    md = markdown_table([_row("dmc:walker-stand", 0, 900.0), _row("dmc:walker-stand", 1, 940.0),
                         _row("dmc:walker-stand", 2, 920.0), _row("dmc:cartpole-swingup", 0, 800.0)])
    lines = md.splitlines()
    # SE over seeds: std(ddof=1) of (900, 940, 920) = 20, / sqrt(3) = 11.547
    assert "| dmc:walker-stand | d4pg (p) | 3 | 20 | 920.0 ± 11.5 | 993.1 | 969.8 |" in lines
    assert "| dmc:cartpole-swingup | d4pg (p) | 1 | 20 | 800.0 (one seed) | n/a | n/a |" in lines
    assert PAPER_NOTE in md and "10^8" in PAPER_NOTE


def test_a_tiny_suite_writes_rows_and_table_and_does_not_rerun_finished_seeds(tmp_path):
    out = str(tmp_path / "suite")
    cmd = [sys.executable, "-m", "apexrl", "bench-suite", "--tasks", "gym:CartPole-v1", "--seeds", "1",
           "--minutes", "0", "--steps", "100", "--actors", "1", "--episodes", "2", "--out", out, f"--run-args={FAST}"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stdout + done.stderr
    run_dir = os.path.join(out, "gym-CartPole-v1", "dqn", "0")
    with open(os.path.join(out, "suite.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 1
    row = rows[0]
    with open(os.path.join(run_dir, "final_eval.json")) as f:
        fe = json.load(f)
    assert (row["task"], row["agent"], row["preset"], row["seed"]) == ("gym:CartPole-v1", "dqn", "cartpole", "0")
    assert row["run_dir"] == run_dir and row["episodes"] == "2" and int(row["learner_steps"]) == 100
    assert float(row["final_return_mean"]) == fe["mean"] and int(row["env_frames"]) == fe["env_frames"] > 0
    with open(os.path.join(out, "suite.md")) as f:
        md = f.read()
    assert f"| gym:CartPole-v1 | dqn (cartpole) | 1 | 0 | {fe['mean']:.1f} (one seed) | n/a | n/a |" in md

    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert "already evaluated" in again.stdout and "replay server" not in again.stdout

    # Trained but not evaluated (say, Ctrl-C during the final evaluation): evaluated again, not trained again.
    os.remove(os.path.join(run_dir, "final_eval.json"))
    third = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert third.returncode == 0, third.stdout + third.stderr
    assert "finished training earlier" in third.stdout and "replay server" not in third.stdout
    with open(os.path.join(run_dir, "final_eval.json")) as f:
        assert json.load(f)["learner_steps"] == 100


def test_bad_suite_flags_exit_2_naming_the_value(tmp_path):
    done = subprocess.run([sys.executable, "-m", "apexrl", "bench-suite", "--tasks", "gym:Nope-v0", "--minutes", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "gym:Nope-v0" in done.stderr
    assert not os.path.exists(os.path.join(tmp_path, "suite.csv"))
