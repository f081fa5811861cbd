"""``apexrl bench-suite``: a real tiny suite (CartPole, short runs), its CSV rows and Markdown table with the
published-score columns, the resume rule; the table's arithmetic and the published scores beside ours on hand-made
rows; the published scores the package carries."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys

import pytest

from apexrl.envs import dmc
from apexrl.machine import MAX_SPEED_RATIO, fastest_record, machine_record, speed_mismatch
from apexrl.suite import (
    MEASUREMENTS_BEFORE_REFUSING,
    PAPER_AGENTS,
    PAPER_NOTE,
    SUITE_TABLE_HEADER,
    SUITE_TABLE_RULE,
    SuiteRun,
    first_reaching,
    format_frames,
    markdown_table,
    published_scores,
    suite_row,
)

FAST = (
    "--learner-args='--min-replay-size 300 --eval-every 3 --eval-episodes 1 --metrics-every 1 --checkpoint-every 100'"
)


def _row(
    task,
    seed,
    mean,
    agent="d4pg",
    preset="p",
    frames=1_000_000,
    time_s=1200.0,
    best=float("nan"),
    t80=float("nan"),
    step_us=float("nan"),
):
    paper = published_scores().get(task)
    return {
        "task": task,
        "agent": agent,
        "preset": preset,
        "seed": seed,
        "minutes": 20.0,
        "final_return_mean": mean,
        "env_frames": frames,
        "time_s": time_s,
        "best_eval_return": best,
        "time_to_80pct_d4pg_s": t80,
        "paper_d4pg_mean": paper["d4pg"].mean if paper else float("nan"),
        "env_step_cpu_us": step_us,
    }


def test_markdown_table_has_mean_and_se_over_seeds_budgets_and_the_published_scores():
    md = markdown_table(
        [
            _row("dmc:walker-stand", 0, 900.0, frames=3_000_000, time_s=2400.0, best=950.0, t80=600.0, step_us=86.0),
            _row("dmc:walker-stand", 1, 940.0, frames=3_200_000, time_s=2700.0, best=960.0, t80=1200.0, step_us=130.4),
            _row("dmc:walker-stand", 2, 920.0, frames=3_400_000, time_s=2700.0, best=970.0, step_us=90.0),
            _row("dmc:cartpole-swingup", 0, 800.0, best=810.0, step_us=203.0),
            _row("dmc:cartpole-swingup", 1, 820.0, best=830.0, step_us=205.0),
            _row("dmc:cartpole-swingup", 2, 810.0, best=820.0),  # a run from before the record
            _row("gym:CartPole-v1", 0, 500.0, "dqn"),
            _row("dmc:walker-walk", 0, 700.0),
        ]
    )  # no periodic evaluations to look at
    lines = md.splitlines()
    assert lines[:2] == [SUITE_TABLE_HEADER, SUITE_TABLE_RULE]
    assert SUITE_TABLE_HEADER.count("|") == SUITE_TABLE_RULE.count("|")
    # SE over seeds: std(ddof=1) of (900, 940, 920) = 20, / sqrt(3) = 11.547; frames and minutes are means over
    # seeds; the best periodic evaluation is the seeds' mean; 80 % of D4PG: the mean over the 2 seeds that got there;
    # the env step times: their range, one figure when they agree within 5 %, and how many seeds have one.
    assert (
        "| dmc:walker-stand | d4pg (p) | 3 | 3.20M | 43.3 | 86 to 130 | 920.0 ± 11.5 | 900.0 to 940.0 | 960.0 | "
        "15.0 (2/3 seeds) | 378.4 ± 3.5 | 969.8 ± 0.3 | 993.1 ± 0.3 |"
    ) in lines
    assert (
        "| dmc:cartpole-swingup | d4pg (p) | 3 | 1.00M | 20.0 | 203 (2/3 seeds) | 810.0 ± 5.8 | 800.0 to 820.0 | "
        "820.0 | not reached (0/3) | 558.4 ± 6.8 | 521.7 ± 6.1 | 845.5 ± 1.2 |"
    ) in lines
    assert (
        "| gym:CartPole-v1 | dqn (p) | 1 | 1.00M | 20.0 | n/a | 500.0 (one seed) | n/a | n/a | n/a | n/a | n/a | n/a |"
    ) in lines
    assert any(
        line.startswith("| dmc:walker-walk | d4pg (p) | 1 | 1.00M | 20.0 | n/a | 700.0 (one seed) | n/a | n/a | n/a | ")
        for line in lines
    )
    assert PAPER_NOTE in md and "10^8" in PAPER_NOTE and "Table 1" in PAPER_NOTE


def test_the_published_scores_hold_every_task_of_both_tables():
    after_steps, after_hours = published_scores("1e8_steps"), published_scores("24_hours")
    assert len(after_steps) == len(after_hours) == 28 and set(after_steps) == set(after_hours)
    for table in (after_steps, after_hours):
        for task, scores in table.items():
            assert task.startswith("dmc:") and set(scores) == set(PAPER_AGENTS)
            assert all(0.0 <= s.mean <= 1000.0 and s.se >= 0.0 for s in scores.values()), task
    # Figures as the paper prints them (Table 1 and Table 2), and task names as dm_control spells them.
    walker = after_steps["dmc:walker-stand"]
    assert (walker["d4pg"].mean, walker["ddpg"].mean, walker["a3c"].mean) == (993.1, 969.8, 378.4)
    assert after_steps["dmc:cheetah-run"]["d4pg"].mean == 736.7 and after_hours["dmc:cheetah-run"]["d4pg"].mean == 814.6
    # The 28 tasks are dm_control's benchmarking set, named as apexrl's dmc: environments name them.
    suite = dmc._suite()
    assert set(after_steps) == {f"dmc:{domain}-{task}" for domain, task in suite.BENCHMARKING}
    with pytest.raises(ValueError, match="1e8_steps"):
        published_scores("10_minutes")


@pytest.mark.slow
def test_a_tiny_suite_writes_rows_and_table_and_does_not_rerun_finished_seeds(tmp_path):
    out = str(tmp_path / "suite")
    cmd = [
        sys.executable,
        "-m",
        "apexrl",
        "bench-suite",
        "--tasks",
        "gym:CartPole-v1",
        "--seeds",
        "1",
        "--minutes",
        "0",
        "--steps",
        "100",
        "--actors",
        "1",
        "--episodes",
        "2",
        "--out",
        out,
        f"--run-args={FAST}",
    ]
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
    assert float(row["time_s"]) == pytest.approx(fe["time_s"], rel=1e-5) and fe["time_s"] > 0
    assert all(row[f"paper_{a}_{s}"] == "" for a in ("a3c", "ddpg", "d4pg") for s in ("mean", "se"))  # not published
    with open(os.path.join(out, "suite.md")) as f:
        md = f.read().splitlines()
    # Our env frames and wall time beside the published columns (n/a: gym's CartPole is not in the paper's table).
    assert md[2:4] == [SUITE_TABLE_HEADER, SUITE_TABLE_RULE]
    # The machine's speed at the task, measured before the run, kept in the run directory and the row.
    with open(os.path.join(run_dir, "machine.json")) as f:
        records = json.load(f)
    assert len(records) == 1 and records[0]["env"] == "gym:CartPole-v1" and records[0]["env_step_cpu_us"] > 0
    assert float(row["env_step_cpu_us"]) == pytest.approx(records[0]["env_step_cpu_us"], rel=1e-5)
    assert any(
        line.startswith(
            f"| gym:CartPole-v1 | dqn (cartpole) | 1 | {format_frames(fe['env_frames'])} | "
            f"{fe['time_s'] / 60:.1f} | {records[0]['env_step_cpu_us']:.0f} | "
            f"{fe['mean']:.1f} (one seed) | n/a | "
        )
        and line.endswith("| n/a | n/a | n/a | n/a |")
        for line in md
    ), md
    assert row["time_to_80pct_d4pg_s"] == row["env_frames_to_80pct_d4pg"] == ""  # no published score

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


def _metrics(path, rows):
    header = "time_s,env_frames,eval_return_mean,eval_time_s,eval_env_frames"
    with open(path, "w") as f:
        f.write(header + "\n" + "".join(",".join("" if v is None else str(v) for v in r) + "\n" for r in rows))


def test_first_reaching_names_the_weights_of_the_first_evaluation_at_the_target(tmp_path):
    # Rows without an evaluation are skipped; an evaluation names the weights it scored (eval_time_s/_env_frames).
    _metrics(
        tmp_path / "metrics.csv",
        [
            (10, 1000, None, None, None),
            (20, 2000, 500.0, 15, 1500),
            (30, 3000, 690.0, 25, 2500),
            (40, 4000, 650.0, 35, 3500),
        ],
    )
    assert first_reaching(str(tmp_path), 676.4) == (25.0, 2500.0)
    assert first_reaching(str(tmp_path), 500.0) == (15.0, 1500.0)  # at the target counts
    assert all(x != x for x in first_reaching(str(tmp_path), 700.0))  # never: NaNs
    assert all(x != x for x in first_reaching(str(tmp_path / "none"), 1.0))  # no metrics.csv: NaNs
    # The suite row: 80 % of cartpole-swingup's published D4PG mean (845.5 -> 676.4).
    fe = {"mean": 700.0, "se": 5.0, "episodes": 30, "env_frames": 4000, "learner_steps": 9, "time_s": 40.0}
    row = suite_row(SuiteRun("dmc:cartpole-swingup", "d4pg", "p", 0, str(tmp_path)), fe, 1.0)
    assert (row["time_to_80pct_d4pg_s"], row["env_frames_to_80pct_d4pg"]) == (25.0, 2500.0)
    assert row["best_eval_return"] == 690.0


def test_bad_suite_flags_exit_2_naming_the_value(tmp_path):
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl",
            "bench-suite",
            "--tasks",
            "gym:Nope-v0",
            "--minutes",
            "1",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "gym:Nope-v0" in done.stderr
    assert not os.path.exists(os.path.join(tmp_path, "suite.csv"))


def test_speed_mismatch_names_the_runs_more_than_the_ratio_apart():
    assert speed_mismatch(100.0, {"seed 0": 140.0, "seed 1": 70.0, "seed 2": float("nan")}) is None
    why = speed_mismatch(100.0, {"seed 0": 151.0, "seed 1": 100.0, "seed 2": 60.0})
    assert why is not None and "seed 0 151 µs" in why and "seed 2 60 µs" in why and "seed 1" not in why
    assert "100 µs" in why and str(MAX_SPEED_RATIO) in why


def test_the_fastest_of_several_measurements_is_kept_with_their_count():
    records = [
        {"env_step_cpu_us": 300.0, "other_cpus": 1.1},
        {"env_step_cpu_us": 250.0, "other_cpus": 0.1},
        {"env_step_cpu_us": 280.0, "measurements": 2},
    ]
    best = fastest_record(records)
    assert best["env_step_cpu_us"] == 250.0 and best["other_cpus"] == 0.1 and best["measurements"] == 4


def test_a_machine_record_says_how_busy_the_rest_of_the_machine_was():
    # A process spinning beside the measurement is other work the record must show (at least half a CPU of it
    # on a 2-core machine, whatever else runs: other_cpus counts that too).
    with subprocess.Popen(
        [sys.executable, "-c", "print(flush=True)\nwhile True: pass"], stdout=subprocess.PIPE
    ) as spinner:
        try:
            assert spinner.stdout.readline() == b"\n"  # spinning from now on
            record = machine_record("gym:CartPole-v1")
        finally:
            spinner.kill()
    assert record["env_step_cpu_us"] > 0 and record["cpus"] == os.cpu_count()
    assert 0.5 <= record["other_cpus"] <= os.cpu_count() + 0.5, record


def test_a_seed_on_a_machine_of_another_speed_is_refused_before_it_runs(tmp_path):
    # Seed 0 "finished" on a machine whose CartPole steps took 0.01 µs: no real machine is within 1.5x of that.
    out = tmp_path / "suite"
    done_dir = out / "gym-CartPole-v1" / "dqn" / "0"
    done_dir.mkdir(parents=True)
    (done_dir / "final_eval.json").write_text(json.dumps({"mean": 500.0, "se": 0.0, "episodes": 2}))
    (done_dir / "machine.json").write_text(json.dumps([{"env": "gym:CartPole-v1", "env_step_cpu_us": 0.01}]))
    cmd = [
        sys.executable,
        "-m",
        "apexrl",
        "bench-suite",
        "--tasks",
        "gym:CartPole-v1",
        "--seeds",
        "2",
        "--minutes",
        "1",
        "--out",
        str(out),
    ]
    refused = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert "seed 1 not run" in refused.stderr and "seed 0 0 µs" in refused.stderr
    assert "--mixed-machines" in refused.stderr
    # Measured again before refusing, in case other work on the machine slowed the first measurement.
    assert f"the fastest of {MEASUREMENTS_BEFORE_REFUSING} measurements" in refused.stderr
    assert not (out / "gym-CartPole-v1" / "dqn" / "1").exists()  # nothing started
    with open(out / "suite.csv", newline="") as f:  # the finished seed is still tabled
        assert [r["seed"] for r in csv.DictReader(f)] == ["0"]
