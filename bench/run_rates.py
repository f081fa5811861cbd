"""Acting and learning rates of finished runs, and where their CPU went: one Markdown row per run directory.

Reads what every ``apexrl run`` writes: ``metrics.csv`` (frames, updates, items and the CPU columns the learner
samples from ``/proc``, see docs/running.md), ``plan.json`` (the agent and preset) and ``machine.json`` (the
environment step's CPU cost on that machine, which says how fast the machine was). Rows before ``--skip``
seconds (start-up: imports, the replay's minimum size, the first weights) are left out, so the figures are the
run's steady state. From the repository root::

    python bench/run_rates.py runs/n53-rates/*/*/*/0
    python bench/run_rates.py --skip 120 bench/curves/dmpo-small-walker-stand-spi16/dmpo/0

Columns: env frames per second (all actors), learner updates per second, items inserted and sampled per second
(the replay's view), the CPU of each process kind in cores (1.0 = one core busy; the learner, the replay server,
all actors together, the evaluation process) and the machine's total, the actors' CPU per env frame, the
learner's CPU per update, the learner's share of time spent waiting for a batch, and the policy lag where the
agent reports one (on-policy agents: learner version minus the version that acted, mean and max over the rows).
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import sys

HEADER = (
    "| run | agent (preset) | env step µs | frames/s | updates/s | inserted/s | sampled/s | CPU learner | CPU replay "
    "| CPU actors | CPU eval | CPU machine | actor µs CPU / frame | learner ms CPU / update | batch wait | lag mean / max |"
)
RULE = "|---|---|" + "---:|" * 14


def _float(value: str | None) -> float:
    try:
        return float(value) if value not in (None, "") else math.nan
    except ValueError:
        return math.nan


def _mean(values: list[float]) -> float:
    kept = [v for v in values if not math.isnan(v)]
    return sum(kept) / len(kept) if kept else math.nan


def _json(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def run_rates(run_dir: str, skip_s: float) -> dict[str, float | str]:
    """The steady-state figures of one run directory (see the module docstring)."""
    with open(os.path.join(run_dir, "metrics.csv"), newline="", encoding="utf-8") as f:
        rows = [{k: _float(v) for k, v in r.items()} for r in csv.DictReader(f)]
    rows = [r for r in rows if not math.isnan(r.get("time_s", math.nan))]
    window = [r for r in rows if r["time_s"] >= skip_s]
    if len(window) < 2:
        raise ValueError(
            f"{run_dir}: fewer than 2 metrics rows after {skip_s:g} s (a run this short has no steady state)"
        )
    first, last = window[0], window[-1]
    span = last["time_s"] - first["time_s"]

    def col(name: str) -> float:
        return _mean([r.get(name, math.nan) for r in window[1:]])

    plan = _json(os.path.join(run_dir, "plan.json"))
    machine = _json(os.path.join(run_dir, "machine.json"))
    frames_s = (last["env_frames"] - first["env_frames"]) / span
    updates_s = (last["learner_steps"] - first["learner_steps"]) / span
    lag_max = [r.get("policy_lag_max", math.nan) for r in window[1:]]
    out: dict[str, float | str] = {
        "run": run_dir,
        "agent": str(plan.get("learner", {}).get("agent", "?")) if isinstance(plan, dict) else "?",
        "preset": str(plan.get("preset", "?")) if isinstance(plan, dict) else "?",
        "env_step_cpu_us": _float(str(machine[-1].get("env_step_cpu_us")))
        if isinstance(machine, list) and machine
        else math.nan,
        "frames_per_s": frames_s,
        "updates_per_s": updates_s,
        "inserted_per_s": col("inserted_per_s"),
        "sampled_per_s": col("sampled_per_s"),
        "cpu_learner": col("cpu_learner"),
        "cpu_replay": col("cpu_replay"),
        "cpu_actors": col("cpu_actors"),
        "cpu_eval": col("cpu_eval"),
        "cpu_machine": col("cpu_machine"),
        "batch_wait_frac": col("batch_wait_frac"),
        "policy_lag_mean": col("policy_lag_mean"),
        "policy_lag_max": max((v for v in lag_max if not math.isnan(v)), default=math.nan),
    }
    out["actor_us_per_frame"] = out["cpu_actors"] / frames_s * 1e6 if frames_s > 0 else math.nan
    out["learner_ms_per_update"] = out["cpu_learner"] / updates_s * 1e3 if updates_s > 0 else math.nan
    return out


def _fmt(value: float | str, digits: int = 0) -> str:
    if isinstance(value, str):
        return value
    return "–" if math.isnan(value) else f"{value:,.{digits}f}"


def markdown_row(r: dict[str, float | str]) -> str:
    if isinstance(r["policy_lag_mean"], float) and math.isnan(r["policy_lag_mean"]):
        lag = "–"
    else:
        lag = f"{_fmt(r['policy_lag_mean'], 2)} / {_fmt(r['policy_lag_max'])}"
    cells = [
        r["run"],
        f"{r['agent']} (`{r['preset']}`)",
        _fmt(r["env_step_cpu_us"]),
        _fmt(r["frames_per_s"]),
        _fmt(r["updates_per_s"], 2),
        _fmt(r["inserted_per_s"], 1),
        _fmt(r["sampled_per_s"], 1),
        *(_fmt(r[k], 2) for k in ("cpu_learner", "cpu_replay", "cpu_actors", "cpu_eval", "cpu_machine")),
        _fmt(r["actor_us_per_frame"]),
        _fmt(r["learner_ms_per_update"], 1),
        _fmt(r["batch_wait_frac"], 2),
        lag,
    ]
    return "| " + " | ".join(str(c) for c in cells) + " |"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories (each with its metrics.csv)")
    parser.add_argument("--skip", type=float, default=60.0, help="seconds of start-up left out (default: 60)")
    args = parser.parse_args(argv)
    if args.skip < 0:
        parser.error(f"--skip must be >= 0, got {args.skip:g}")
    print(HEADER)
    print(RULE)
    failed = 0
    for run_dir in args.run_dirs:
        try:
            print(markdown_row(run_rates(run_dir, args.skip)))
        except (OSError, ValueError, KeyError) as e:
            print(f"run_rates: {e}", file=sys.stderr)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
