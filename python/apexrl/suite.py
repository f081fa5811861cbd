"""``apexrl bench-suite``: every task x seed as an ``apexrl run``, one after another, then a final evaluation of
each, gathered into ``DIR/suite.csv`` and a Markdown table ``DIR/suite.md`` beside the Control Suite paper's
published scores (:func:`published_scores`), with each run's env frames and wall time so the budgets show.

Run directories are ``DIR/<task>/<agent>/<seed>`` (":" in a task name becomes "-"). Resumable: a task x seed
whose ``final_eval.json`` exists is not run again; one whose directory holds an unfinished run (a checkpoint
but no final evaluation) is continued with ``--resume`` for what is left of its ``--minutes``/``--steps``, or
only evaluated when its checkpoint shows it had finished training. Ctrl-C (or SIGTERM) stops the current run cleanly (the
launcher checkpoints it) and the tables are still written for what finished.
"""

from __future__ import annotations

import csv
import functools
import importlib.resources
import io
import math
import os
import shlex
import signal
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import dataclass

from apexrl.durable import make_private_dirs, write_atomically
from apexrl.machine import fastest_record, machine_record, recorded_step_us, save_record, speed_mismatch
from apexrl.rundir import (
    CHECKPOINT,
    FINAL_EVAL,
    RunDirError,
    checkpoint_meta,
    final_eval,
)

__all__ = [
    "PAPER_AGENTS",
    "PAPER_NOTE",
    "PUBLISHED_TABLES",
    "SUITE_COLUMNS",
    "SUITE_TABLE_HEADER",
    "SUITE_TABLE_RULE",
    "TARGET_FRACTION",
    "PublishedScore",
    "SuiteError",
    "SuiteRun",
    "first_reaching",
    "format_frames",
    "markdown_rows",
    "markdown_table",
    "published_scores",
    "run_suite",
    "suite_row",
    "suite_rows",
]

SUITE_COLUMNS = (
    "task",
    "agent",
    "preset",
    "seed",
    "minutes",
    "learner_steps",
    "env_frames",
    "final_return_mean",
    "final_return_se",
    "episodes",
    "best_eval_return",
    "run_dir",
    "time_s",
    "paper_a3c_mean",
    "paper_a3c_se",
    "paper_ddpg_mean",
    "paper_ddpg_se",
    "paper_d4pg_mean",
    "paper_d4pg_se",
    "time_to_80pct_d4pg_s",
    "env_frames_to_80pct_d4pg",
    "env_step_cpu_us",
)
"""suite.csv's columns. ``time_s``: the learner's wall time when its final checkpoint was taken; ``paper_*``:
the task's published scores after 10^8 environment steps (:func:`published_scores`), empty for other tasks;
``best_eval_return``: the best of the run's periodic evaluations (metrics.csv), against ``final_return_*``, the
final evaluation's; ``time_to_80pct_d4pg_s`` and ``env_frames_to_80pct_d4pg``: the learner's wall time and the
env frames of the weights of the first periodic evaluation that reached 80 % of the published D4PG mean, empty
when none did (or the task has no published score); ``env_step_cpu_us``: the machine's CPU time per
environment step measured before the run (:mod:`apexrl.machine`; the median when it was resumed), empty for a
run without that record."""

TARGET_FRACTION = 0.8
"""``time_to_80pct_d4pg_s``: the fraction of the published D4PG score a run's periodic evaluation must reach."""

SCORES_FILE = "control_suite_scores.csv"
"""Package data (``apexrl/data/``): the Control Suite paper's published returns, see :func:`published_scores`."""
PUBLISHED_TABLES = {
    "1e8_steps": "Table 1, after 10^8 environment steps",
    "24_hours": "Table 2, after 24 hours of training",
}
PAPER_AGENTS = ("a3c", "ddpg", "d4pg", "d4pg_pixels")
"""The agents of the paper's tables, as the CSV's column prefixes (d4pg_pixels: D4PG learning from pixels)."""
SUITE_PAPER_AGENTS = ("a3c", "ddpg", "d4pg")
"""The published agents the suite's tables show (all learning from state features, as apexrl's agents do)."""


@dataclass(frozen=True)
class PublishedScore:
    """One agent's published return on one task: the mean and standard error the paper prints."""

    mean: float
    se: float


def published_scores(table: str = "1e8_steps") -> dict[str, dict[str, PublishedScore]]:
    """The DeepMind Control Suite paper's published returns (Tassa et al. 2018, arXiv:1801.00690): per task
    (apexrl's env name, ``dmc:<domain>-<task>``) and agent (:data:`PAPER_AGENTS`), the mean and standard error
    over 100 evaluation episodes per seed (D4PG 5 seeds, A3C and DDPG 15). ``table``: ``1e8_steps`` (the paper's
    Table 1, after 10^8 environment steps) or ``24_hours`` (Table 2, after 24 hours of training). All 28 tasks
    of the suite's benchmarking set; the paper prints cheetah-run's row as "walk"."""
    if table not in PUBLISHED_TABLES:
        raise ValueError(f"unknown published table {table!r}; choose from {', '.join(PUBLISHED_TABLES)}")
    return _load_published()[table]


@functools.cache
def _load_published() -> dict[str, dict[str, dict[str, PublishedScore]]]:
    text = importlib.resources.files("apexrl").joinpath("data").joinpath(SCORES_FILE).read_text(encoding="utf-8")
    rows = csv.DictReader(line for line in text.splitlines() if not line.startswith("#"))
    out: dict[str, dict[str, dict[str, PublishedScore]]] = {t: {} for t in PUBLISHED_TABLES}
    for r in rows:
        task = f"dmc:{r['domain']}-{r['task']}"
        if r["table"] not in out or task in out[r["table"]]:
            raise ValueError(f"{SCORES_FILE}: unexpected row {r['table']},{r['domain']},{r['task']}")
        out[r["table"]][task] = {a: PublishedScore(float(r[f"{a}_mean"]), float(r[f"{a}_se"])) for a in PAPER_AGENTS}
    return out


PAPER_NOTE = (
    "Published: A3C, DDPG and D4PG (learning from state features) after 10^8 environment steps, mean ± "
    "SE, from Table 1 of the DeepMind Control Suite paper (Tassa et al. 2018); n/a: a task not in that "
    "table. Ours: mean ± SE and range over seeds of each seed's final evaluation (of its last checkpoint), "
    "after the env frames (on Control Suite tasks one frame is one environment step) and learner wall "
    "time shown (means over seeds); best periodic evaluation: each seed's best evaluation during "
    "training (fewer episodes), averaged over seeds; first ≥ 80 %: the learner minutes of the weights "
    "of the first periodic evaluation at 80 % of the published D4PG mean, averaged over the seeds that "
    "got there; env step: the CPU time of one environment step on the machine each seed ran on, "
    "measured before its run (runs are wall-time budgets: a slower machine trains for fewer frames)."
)


class SuiteError(Exception):
    """Bad suite arguments (the message says which)."""


@dataclass(frozen=True)
class SuiteRun:
    task: str
    agent: str
    preset: str
    seed: int
    run_dir: str


def _task_dir(task: str) -> str:
    return task.replace(":", "-").replace("/", "-")


def plan_runs(tasks: Sequence[str], seeds: int, out: str, agent: str | None, preset: str | None) -> list[SuiteRun]:
    """Every task x seed with its agent and preset resolved as ``apexrl run`` would (ValueError if unknown)."""
    from apexrl.launch.plan import Overrides, resolve_preset

    runs = []
    for task in tasks:
        p, agent_name, env = resolve_preset(preset, Overrides(agent=agent, env=task))
        for seed in range(seeds):
            runs.append(
                SuiteRun(env, agent_name, p.name, seed, os.path.join(out, _task_dir(env), agent_name, str(seed)))
            )
    return runs


def _best_eval(run_dir: str) -> float:
    from apexrl.apex.metrics import read_csv

    try:
        values = [
            v for v in read_csv(os.path.join(run_dir, "metrics.csv")).get("eval_return_mean", []) if not math.isnan(v)
        ]
    except (OSError, ValueError):
        return math.nan
    return max(values) if values else math.nan


def first_reaching(run_dir: str, target: float) -> tuple[float, float]:
    """(learner wall time, env frames) of the weights of the first periodic evaluation in ``run_dir``'s
    metrics.csv whose mean return reached ``target``; NaNs when none did. An evaluation row names the weights it
    scored (``eval_time_s``, ``eval_env_frames``); a file from before those columns gives the row's own."""
    from apexrl.apex.metrics import read_csv

    try:
        cols = read_csv(os.path.join(run_dir, "metrics.csv"))
    except (OSError, ValueError):
        return math.nan, math.nan
    means = cols.get("eval_return_mean", [])
    for i, m in enumerate(means):
        if not math.isnan(m) and m >= target:

            def at(name: str, fallback: str, i: int = i) -> float:
                v = cols.get(name, [math.nan] * len(means))[i]
                return cols.get(fallback, [math.nan] * len(means))[i] if math.isnan(v) else v

            return at("eval_time_s", "time_s"), at("eval_env_frames", "env_frames")
    return math.nan, math.nan


def suite_row(run: SuiteRun, fe: dict, minutes: float) -> dict:
    """The suite.csv row (SUITE_COLUMNS) of one run and its final evaluation (``final_eval.json``'s fields)."""
    paper = _paper_cells(run.task)
    target = TARGET_FRACTION * paper["paper_d4pg_mean"]
    t80, f80 = first_reaching(run.run_dir, target) if not math.isnan(target) else (math.nan, math.nan)
    return {
        "task": run.task,
        "agent": run.agent,
        "preset": run.preset,
        "seed": run.seed,
        "minutes": minutes,
        "learner_steps": int(fe.get("learner_steps", 0)),
        "env_frames": int(fe.get("env_frames", 0)),
        "final_return_mean": float(fe["mean"]),
        "final_return_se": float(fe["se"]),
        "episodes": int(fe["episodes"]),
        "best_eval_return": _best_eval(run.run_dir),
        "run_dir": run.run_dir,
        "time_s": float(fe.get("time_s", math.nan)),
        **paper,
        "time_to_80pct_d4pg_s": t80,
        "env_frames_to_80pct_d4pg": f80,
        "env_step_cpu_us": recorded_step_us(run.run_dir),
    }


def suite_rows(runs: Sequence[SuiteRun], minutes: float) -> list[dict]:
    """One row per run that has its final evaluation (SUITE_COLUMNS)."""
    rows = []
    for r in runs:
        try:
            fe = final_eval(r.run_dir)
        except RunDirError as e:
            print(f"bench-suite: {e}; left out", file=sys.stderr, flush=True)
            continue
        if fe is not None:
            rows.append(suite_row(r, fe, minutes))
    return rows


def _paper_cells(task: str) -> dict[str, float]:
    scores = published_scores().get(task)
    cells = {}
    for a in SUITE_PAPER_AGENTS:
        s = scores[a] if scores else None
        cells[f"paper_{a}_mean"] = s.mean if s else math.nan
        cells[f"paper_{a}_se"] = s.se if s else math.nan
    return cells


def _fmt(x: float | None, digits: int = 1) -> str:
    return "n/a" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{digits}f}"


def _mean_se(xs: Sequence[float]) -> tuple[float, float]:
    mean = sum(xs) / len(xs)
    se = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1)) / math.sqrt(len(xs)) if len(xs) > 1 else math.nan
    return mean, se


def format_frames(n: float) -> str:
    """Env frames as the suite's table shows them: 12,345 below 100k, else 1.23M."""
    return "n/a" if math.isnan(n) else f"{n / 1e6:.2f}M" if n >= 1e5 else f"{n:,.0f}"


SUITE_TABLE_HEADER = (
    "| task | agent (preset) | seeds | env frames | wall time (min) | env step (CPU µs) | final "
    "return (mean ± SE over seeds) | final return (range over seeds) | best periodic evaluation (mean "
    "over seeds) | first ≥ 80 % of published D4PG (min) | published A3C | published DDPG | "
    "published D4PG |"
)
SUITE_TABLE_RULE = "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"


def _speed_cell(rs: Sequence[dict]) -> str:
    """The machines' env step times: one figure, or the range over the seeds (n/a for runs without a record)."""
    values = [float(r.get("env_step_cpu_us", math.nan)) for r in rs]
    values = [v for v in values if not math.isnan(v)]
    if not values:
        return "n/a"
    low, high = min(values), max(values)
    known = "" if len(values) == len(rs) else f" ({len(values)}/{len(rs)} seeds)"
    return (f"{low:.0f}" if high / low < 1.05 else f"{low:.0f} to {high:.0f}") + known


def _reached_cell(rs: Sequence[dict]) -> str:
    """Minutes to 80 % of the published D4PG mean: the mean over the seeds that got there, and how many did (of
    the seeds with periodic evaluations to look at)."""
    rs = [r for r in rs if not math.isnan(float(r.get("best_eval_return", math.nan)))]
    if not rs or all(math.isnan(float(r.get("paper_d4pg_mean", math.nan))) for r in rs):
        return "n/a"
    times = [float(r.get("time_to_80pct_d4pg_s", math.nan)) / 60.0 for r in rs]
    got = [t for t in times if not math.isnan(t)]
    if not got:
        return f"not reached (0/{len(rs)})"
    return f"{sum(got) / len(got):.1f} ({len(got)}/{len(rs)} seeds)"


def markdown_table(rows: Sequence[dict]) -> str:
    """Per task and agent: mean ± SE and range over seeds of the final evaluation returns, the mean of the seeds'
    best periodic evaluations, the minutes to a periodic evaluation at 80 % of the published D4PG score, with the
    env frames and wall time the runs trained for (means over seeds), beside the task's published scores."""
    lines = [SUITE_TABLE_HEADER, SUITE_TABLE_RULE, *markdown_rows(rows)]
    return "\n".join(lines) + "\n\n" + PAPER_NOTE + "\n"


def markdown_rows(rows: Sequence[dict]) -> list[str]:
    """The body lines of :func:`markdown_table` (one per task, agent and preset), for tables that add columns."""
    groups: dict[tuple[str, str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["task"], r["agent"], r["preset"]), []).append(r)
    lines = []
    published = published_scores()
    for (task, agent, preset), rs in groups.items():
        finals = [r["final_return_mean"] for r in rs]
        mean, se = _mean_se(finals)
        ours = f"{mean:.1f} ± {se:.1f}" if not math.isnan(se) else f"{mean:.1f} (one seed)"
        spread = f"{min(finals):.1f} to {max(finals):.1f}" if len(rs) > 1 else "n/a"
        bests = [float(r.get("best_eval_return", math.nan)) for r in rs]
        bests = [b for b in bests if not math.isnan(b)]
        best = _fmt(sum(bests) / len(bests)) if bests else "n/a"
        frames = _mean_se([float(r.get("env_frames", math.nan)) for r in rs])[0]
        minutes = _mean_se([float(r.get("time_s", math.nan)) / 60.0 for r in rs])[0]
        paper = published.get(task)
        cells = [f"{paper[a].mean:.1f} ± {paper[a].se:.1f}" if paper else "n/a" for a in SUITE_PAPER_AGENTS]
        lines.append(
            f"| {task} | {agent} ({preset}) | {len(rs)} | {format_frames(frames)} | {_fmt(minutes)} | "
            f"{_speed_cell(rs)} | {ours} | {spread} | {best} | {_reached_cell(rs)} | " + " | ".join(cells) + " |"
        )
    return lines


def _csv_text(rows: Sequence[dict]) -> str:
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=SUITE_COLUMNS, lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow(
            {
                k: ("" if isinstance(v, float) and math.isnan(v) else f"{v:.6g}" if isinstance(v, float) else v)
                for k, v in r.items()
            }
        )
    return buf.getvalue()


def write_tables(out: str, rows: Sequence[dict]) -> tuple[str, str]:
    make_private_dirs(out)
    csv_path, md_path = os.path.join(out, "suite.csv"), os.path.join(out, "suite.md")
    write_atomically(csv_path, _csv_text(rows))
    write_atomically(md_path, "# apexrl bench-suite\n\n" + markdown_table(rows))
    return csv_path, md_path


class _Stop:
    """SIGINT/SIGTERM: pass SIGTERM to the running child (the launcher stops its run cleanly) and stop."""

    def __init__(self) -> None:
        self.requested = False
        self.child: subprocess.Popen | None = None

    def __call__(self, signum, frame) -> None:
        self.requested = True
        if self.child is not None and self.child.poll() is None:
            self.child.send_signal(signal.SIGTERM)


def _apexrl(args: list[str], stop: _Stop) -> int:
    # Its own process group: a terminal's Ctrl-C reaches only us, and we stop the child once, in order.
    child = subprocess.Popen([sys.executable, "-m", "apexrl", *args], start_new_session=True)
    stop.child = child
    try:
        return child.wait()
    finally:
        stop.child = None


def _left(run_dir: str, minutes: float, steps: int) -> tuple[float, bool]:
    """(minutes left to train, whether training is over) for a run directory that holds a checkpoint: its
    learner's time and steps, from the checkpoint's metadata, against the suite's ``--minutes`` and ``--steps``."""
    try:
        meta = checkpoint_meta(os.path.join(run_dir, CHECKPOINT))
        trained_min, trained_steps = float(meta.get("time_s", 0.0)) / 60.0, int(meta.get("learner_steps", 0))
    except (RunDirError, TypeError, ValueError):
        return minutes, False  # unreadable: resume it and let the learner say what is wrong
    # The learner's clock starts after the launcher's start-up (10-20 s): within a minute of --minutes is done.
    if (steps and trained_steps >= steps) or (minutes and trained_min >= minutes - 1.0):
        return 0.0, True
    return (minutes - trained_min if minutes else 0.0), False


MEASUREMENTS_BEFORE_REFUSING = 3
"""How many times the suite measures the machine (keeping the fastest) before it refuses a seed for its speed."""


def _measured(record: dict) -> str:
    n = int(record.get("measurements", 1))
    said = f"the fastest of {n} measurements" if n > 1 else "one measurement"
    if record.get("other_cpus") is not None:
        said += f"; other processes used {record['other_cpus']:.2f} of {record.get('cpus')} CPUs during it"
    return said


def run_suite(
    tasks: Sequence[str],
    seeds: int,
    minutes: float,
    out: str,
    agent: str | None = None,
    preset: str | None = None,
    actors: int | None = None,
    episodes: int = 10,
    steps: int = 0,
    run_args: str = "",
    mixed_machines: bool = False,
) -> int:
    """Run the suite; returns the exit status (0: every run evaluated, 1: some failed, 130: stopped). SuiteError
    (nothing run from then on) when a seed would run on a machine of another speed than the task's finished
    seeds (see :mod:`apexrl.machine`), unless ``mixed_machines``."""
    runs = plan_runs(tasks, seeds, out, agent, preset)
    speeds: dict[str, dict] = {}  # task -> this machine's record, measured once
    stop = _Stop()
    old = {s: signal.signal(s, stop) for s in (signal.SIGINT, signal.SIGTERM)}
    failed = 0
    try:
        for r in runs:
            if stop.requested:
                break
            if os.path.exists(os.path.join(r.run_dir, FINAL_EVAL)):
                print(f"bench-suite: {r.task} seed {r.seed} already evaluated ({r.run_dir}); not rerun", flush=True)
                continue
            left, done, resume = minutes, False, os.path.exists(os.path.join(r.run_dir, CHECKPOINT))
            if resume:  # an interrupted run: train only for what is left of its minutes and steps
                left, done = _left(r.run_dir, minutes, steps)
                if done:
                    print(
                        f"bench-suite: {r.task} seed {r.seed} finished training earlier ({r.run_dir}); evaluating it",
                        flush=True,
                    )
            if not done:
                if r.task not in speeds:
                    speeds[r.task] = machine_record(r.task)
                record = speeds[r.task]
                others = {
                    f"seed {o.seed}": recorded_step_us(o.run_dir)
                    for o in runs
                    if (o.task, o.agent, o.preset) == (r.task, r.agent, r.preset)
                    and o.seed != r.seed
                    and os.path.exists(os.path.join(o.run_dir, FINAL_EVAL))
                }
                if resume:
                    others[f"its own first start (seed {r.seed})"] = recorded_step_us(r.run_dir)
                why = speed_mismatch(record["env_step_cpu_us"], others)
                while why is not None and record.get("measurements", 1) < MEASUREMENTS_BEFORE_REFUSING:
                    # Other work on the machine inflates one measurement: measure again, keep the fastest.
                    record = speeds[r.task] = fastest_record([record, machine_record(r.task)])
                    why = speed_mismatch(record["env_step_cpu_us"], others)
                if why is not None:
                    why += f" ({_measured(record)})"
                    if not mixed_machines:
                        raise SuiteError(
                            f"{r.task} seed {r.seed} not run: {why}. Run every seed on one machine "
                            "(a new --out), or give --mixed-machines to go on anyway"
                        )
                    print(
                        f"bench-suite: {r.task} seed {r.seed}: {why}; going on (--mixed-machines)",
                        file=sys.stderr,
                        flush=True,
                    )
                args = [
                    "run",
                    "--env",
                    r.task,
                    "--agent",
                    r.agent,
                    "--preset",
                    r.preset,
                    "--seed",
                    str(r.seed),
                    "--run-dir",
                    r.run_dir,
                    "--minutes",
                    f"{left:g}",
                    "--final-eval",
                    str(episodes),
                    "--quiet",
                    *shlex.split(run_args),
                ]
                if actors:
                    args += ["--actors", str(actors)]
                if steps:
                    args += ["--steps", str(steps)]
                if resume:
                    args.append("--resume")
                print(
                    f"bench-suite: {r.task} {r.agent} seed {r.seed} -> {r.run_dir} (an env step: "
                    f"{record['env_step_cpu_us']:.0f} µs of CPU here)",
                    flush=True,
                )
                code = _apexrl(args, stop)
                if os.path.isdir(r.run_dir):
                    save_record(r.run_dir, record)
            else:
                code = 0
            if stop.requested:
                break
            if code != 0:
                print(
                    f"bench-suite: the run of {r.task} seed {r.seed} exited {code} "
                    f"(logs in {r.run_dir}/logs); going on",
                    file=sys.stderr,
                    flush=True,
                )
                failed += 1
                continue
            if not os.path.exists(os.path.join(r.run_dir, FINAL_EVAL)):  # the launcher's own did not happen
                code = _apexrl(
                    ["evaluate", r.run_dir, "--episodes", str(episodes), "--json", os.path.join(r.run_dir, FINAL_EVAL)],
                    stop,
                )
                if stop.requested:
                    break
                if code != 0:
                    failed += 1
    finally:
        for s, h in old.items():
            signal.signal(s, h)
        csv_path, md_path = write_tables(out, suite_rows(runs, minutes))
        print(f"bench-suite: wrote {csv_path} and {md_path}", flush=True)
    if stop.requested:
        print("bench-suite: stopped; run it again with the same flags to go on", flush=True)
        return 130
    return 1 if failed else 0
