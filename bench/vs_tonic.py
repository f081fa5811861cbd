"""An on-policy agent of apexrl beside Tonic's own, on one Control Suite task, for the same wall time.

For each seed, one after the other on the same machine (run it on an otherwise idle one): Tonic's torch agent with
its defaults (``python -m tonic.train``, one environment, its trainer testing 5 episodes after each epoch) for
``--minutes``, then ``apexrl run --preset AGENT-TASK`` for the same minutes. Tonic runs from its own interpreter
(``--tonic-python``; Tonic needs gym 0.26 and its own dependencies, so it lives in a virtual environment of its
own), with ``--tonic-path`` on its ``PYTHONPATH`` if it is not installed there. Both sides count their evaluations'
time in their wall time.

Reported per seed and over seeds: each side's best periodic evaluation and when it came, its last one (Tonic: the
test after its last epoch; apexrl: also the final evaluation of its last checkpoint), and when apexrl's periodic
evaluations first reached Tonic's best (the issue's target: within half the wall time, ending at least as high),
and when each side's first reached 95 % of Tonic's best. ``--only report`` runs nothing and reports the folders of
``--seeds`` (Tonic's and ``apexrl[-LABEL]``'s) together.

    python bench/vs_tonic.py --tonic-python TONIC/bin/python --tonic-path TONIC_SRC --agent ppo \\
        --task cartpole-swingup --minutes 20 --seeds 0 1 2 --out runs/vs-tonic
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import os
import shlex
import shutil
import signal
import subprocess
import sys
from dataclasses import asdict, dataclass

TONIC_AGENTS = {"ppo": "PPO", "a2c": "A2C", "trpo": "TRPO"}
NEAR = 0.95
"""The report also times each side to this fraction of Tonic's best: a plateau a few points under Tonic's single
best test (5 episodes) never "reaches" it, and the time to near it still says which side learns faster."""


@dataclass
class Side:
    """One run's evaluations: (seconds since its start, mean return) in order, and its final figure."""

    curve: list[tuple[float, float]]
    final: float | None = None

    @property
    def best(self) -> tuple[float, float] | None:
        return max(self.curve, key=lambda tr: tr[1]) if self.curve else None

    def first_reaching(self, score: float) -> float | None:
        return next((t for t, r in self.curve if r >= score), None)


def run_tonic(args: argparse.Namespace, seed: int, out: str) -> Side:
    os.makedirs(out, exist_ok=True)
    env = dict(os.environ, MUJOCO_GL=os.environ.get("MUJOCO_GL", "egl"))
    if args.tonic_path:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [args.tonic_path, env.get("PYTHONPATH")]))
    cmd = [
        args.tonic_python,
        "-m",
        "tonic.train",
        "--header",
        "import tonic.torch",
        "--agent",
        f"tonic.torch.agents.{TONIC_AGENTS[args.agent]}()",
        "--environment",
        f'tonic.environments.ControlSuite("{args.task}")',
        # Steps beyond reach: the wall time ends the run. Tonic's epochs of 20,000 steps (its default) each end
        # with its test of 5 episodes.
        "--trainer",
        f"tonic.Trainer(steps=int(1e9), epoch_steps={args.tonic_epoch_steps}, save_steps=int(1e9))",
        "--seed",
        str(seed),
    ]
    shutil.rmtree(os.path.join(out, args.task), ignore_errors=True)  # never report an earlier run's log
    log_path = os.path.join(out, "tonic.log")
    with open(log_path, "w", encoding="utf-8") as log:
        proc = subprocess.Popen(cmd, cwd=out, env=env, stdout=log, stderr=subprocess.STDOUT)
        try:
            if proc.wait(args.minutes * 60) != 0:
                raise SystemExit(f"Tonic exited with {proc.returncode} before its time: see {log_path}")
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
    return read_tonic(args, seed, out)


def read_tonic(args: argparse.Namespace, seed: int, out: str) -> Side:
    """Tonic's log.csv: one row per epoch, its test's mean score and the seconds since the start."""
    path = os.path.join(out, args.task, TONIC_AGENTS[args.agent], str(seed), "log.csv")
    if not os.path.exists(path):
        raise SystemExit(f"Tonic wrote no {path}: see {os.path.join(out, 'tonic.log')}")
    with open(path, encoding="utf-8") as f:
        curve = [(float(r["train/seconds"]), float(r["test/episode_score/mean"])) for r in csv.DictReader(f)]
    return Side(curve, final=curve[-1][1] if curve else None)


def run_apexrl(args: argparse.Namespace, seed: int, out: str) -> Side:
    cmd = [
        sys.executable,
        "-m",
        "apexrl",
        "run",
        "--preset",
        f"{args.agent}-{args.task}",
        "--env",
        f"dmc:{args.task}",
        "--seed",
        str(seed),
        "--minutes",
        str(args.minutes),
        "--run-dir",
        out,
        "--quiet",
        *shlex.split(args.apexrl_args),
    ]
    subprocess.run(cmd, check=True)
    return read_apexrl(out)


def read_apexrl(out: str) -> Side:
    """An apexrl run folder's periodic evaluations (metrics.csv) and its final evaluation (final_eval.json)."""
    if not os.path.exists(os.path.join(out, "metrics.csv")):
        raise SystemExit(f"no apexrl run in {out}: metrics.csv is missing")
    with open(os.path.join(out, "metrics.csv"), encoding="utf-8") as f:
        rows = [r for r in csv.DictReader(f) if r["eval_return_mean"]]
    curve = [(float(r["eval_time_s"] or r["time_s"]), float(r["eval_return_mean"])) for r in rows]
    final = None
    if os.path.exists(os.path.join(out, "final_eval.json")):
        with open(os.path.join(out, "final_eval.json"), encoding="utf-8") as f:
            final = float(json.load(f)["mean"])
    return Side(curve, final=final)


def _f(x: float | None) -> str:
    return "—" if x is None else f"{x:.1f}"


def _mean_se(xs: list[float]) -> str:
    if not xs:
        return "—"
    m = sum(xs) / len(xs)
    if len(xs) == 1:
        return f"{m:.1f}"
    se = math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1) / len(xs))
    return f"{m:.1f} ± {se:.1f}"


def report(rows: list[dict], minutes: float) -> str:
    lines = [
        "| seed | Tonic best (at s) | Tonic last | apexrl best (at s) | apexrl last periodic | apexrl final "
        "(last checkpoint) | apexrl reached Tonic's best at s | 95 % of Tonic's best: Tonic / apexrl at s |",
        "|---:|---|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        tonic, ours = r["tonic"], r["apexrl"]
        tb, ab = tonic.best, ours.best
        reach = ours.first_reaching(tb[1]) if tb else None
        near = [side.first_reaching(NEAR * tb[1]) if tb else None for side in (tonic, ours)]
        cells = [
            str(r["seed"]),
            f"{tb[1]:.1f} ({tb[0]:.0f})" if tb else "—",
            _f(tonic.final),
            f"{ab[1]:.1f} ({ab[0]:.0f})" if ab else "—",
            _f(ours.curve[-1][1] if ours.curve else None),
            _f(ours.final),
            f"{reach:.0f}" if reach is not None else "never",
            " / ".join(f"{t:.0f}" if t is not None else "never" for t in near),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        f"\nover seeds (mean ± SE), {minutes:g} min each: Tonic best "
        f"{_mean_se([r['tonic'].best[1] for r in rows if r['tonic'].best])}, Tonic last "
        f"{_mean_se([r['tonic'].final for r in rows if r['tonic'].final is not None])}; apexrl best "
        f"{_mean_se([r['apexrl'].best[1] for r in rows if r['apexrl'].best])}, apexrl final "
        f"{_mean_se([r['apexrl'].final for r in rows if r['apexrl'].final is not None])}"
    )
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tonic-python", required=True, help="a Python interpreter that can import tonic and torch")
    p.add_argument("--tonic-path", help="Tonic's source folder, put on that interpreter's PYTHONPATH")
    p.add_argument("--agent", choices=sorted(TONIC_AGENTS), default="ppo")
    p.add_argument("--task", default="cartpole-swingup", help="a Control Suite task with an apexrl preset AGENT-TASK")
    p.add_argument("--minutes", type=float, default=20.0, help="wall time of each run (default: 20)")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--tonic-epoch-steps", type=int, default=20_000, help="Tonic's steps per epoch (its default)")
    p.add_argument("--out", default="runs/vs-tonic", help="where both sides' run folders and report.md go")
    p.add_argument(
        "--only",
        choices=["tonic", "apexrl", "report"],
        help="run one side only (the other's folders must exist); report: run nothing, report the seeds' folders",
    )
    p.add_argument(
        "--apexrl-args",
        default="",
        help='more `apexrl run` flags for apexrl\'s side, e.g. "--batch-size 16" (quote them); its run folders then '
        "go to OUT/apexrl-LABEL/SEED with --apexrl-label",
    )
    p.add_argument("--apexrl-label", default="", help="names apexrl's run folders OUT/apexrl-LABEL (default: apexrl)")
    args = p.parse_args()
    try:
        shlex.split(args.apexrl_args)
    except ValueError as e:
        p.error(f"--apexrl-args: {e}")
    if args.apexrl_label and not args.apexrl_label.replace("-", "").replace("_", "").isalnum():
        p.error(f"--apexrl-label takes letters, digits, - and _, got {args.apexrl_label!r}")
    if args.minutes <= 0:
        p.error(f"--minutes must be positive, got {args.minutes}")

    rows = []
    for seed in args.seeds:
        tonic_out = os.path.join(args.out, "tonic", str(seed))
        apexrl_out = os.path.join(
            args.out, "apexrl" + (f"-{args.apexrl_label}" if args.apexrl_label else ""), str(seed)
        )
        row: dict = {"seed": seed}
        if args.only in (None, "tonic"):
            row["tonic"] = run_tonic(args, seed, tonic_out)
        else:
            row["tonic"] = read_tonic(args, seed, tonic_out)
        if args.only in (None, "apexrl"):
            row["apexrl"] = run_apexrl(args, seed, apexrl_out)
        else:
            row["apexrl"] = read_apexrl(apexrl_out) if args.only == "report" else Side([])
        rows.append(row)
        print(report(rows, args.minutes), flush=True)
    text = report(rows, args.minutes)
    name = "report" + (f"-{args.apexrl_label}" if args.apexrl_label else "")
    with open(os.path.join(args.out, f"{name}.md"), "w", encoding="utf-8") as f:
        f.write(text + "\n")
    with open(os.path.join(args.out, f"{name}.json"), "w", encoding="utf-8") as f:
        json.dump([{k: asdict(v) if isinstance(v, Side) else v for k, v in r.items()} for r in rows], f, indent=1)


if __name__ == "__main__":
    main()
