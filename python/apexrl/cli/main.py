"""``apexrl``: the one command a user needs (also ``python -m apexrl``).

``apexrl run`` starts a whole Ape-X system on this machine (replay server, learner, N actors; see
:mod:`apexrl.launch.local`), or with ``--ray`` on a Ray cluster (:mod:`apexrl.launch.ray_launcher`), ``apexrl plot`` turns run directories into PNG learning curves (:mod:`apexrl.plot`),
``apexrl evaluate RUN_DIR`` scores a checkpoint (:mod:`apexrl.evaluate`), ``apexrl bench-suite`` runs tasks x seeds
(:mod:`apexrl.suite`), ``apexrl keygen DIR`` writes the CURVE keys that ``--curve-dir DIR`` of every command uses (:mod:`apexrl.security`),
``apexrl export SNAPSHOT --out FILE`` writes a replay snapshot's items to ``.npz`` (:mod:`apexrl.offline.export`).
Flags are validated here, with the same parsers the child processes use, so a run never starts only to have
its children refuse their flags.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence

from apexrl.cli.args import AGENT, PRESET, int_arg
from apexrl.cli.flags import Option
from apexrl.launch.start import (
    ACTORS,
    MINUTES,
    PROG,
    STEPS,
    fill_run_parser,
    launch_plan,
    make_launcher,
    run_banner,
    run_kwargs,
)
from apexrl.launch.start import (  # the run's options and start, shared with apexrl.run
    AGENT_DESTS as AGENT_DESTS,
)
from apexrl.launch.start import (
    SERVER_OWN as SERVER_OWN,
)
from apexrl.launch.start import (
    issue_run_actor_key as issue_run_actor_key,
)
from apexrl.launch.start import (
    upgrade_episodes_csv as upgrade_episodes_csv,
)

ACTOR_LOG_EVERY = 5.0
EPISODES = Option("--episodes", "evaluation episodes (default 10)", type=int_arg(1, 100_000), default=10)
"""``--episodes`` of ``apexrl evaluate`` and of each final evaluation of ``apexrl bench-suite``."""
# their names before they moved to launch/start.py
_fill_run_parser, _run_kwargs = fill_run_parser, run_kwargs


def _keygen_kwargs() -> dict:
    return dict(
        description="Issue CURVE keys, one per role or host (secret keys with mode 0600, directories 0700). "
        "`keygen DIR`: the server's key pair and the learner's client pair, authorized in DIR/authorized/ "
        "(the replay server and the learner use DIR). `keygen DIR --role actor --name HOST`: a key for one "
        "actor host in DIR/actors/HOST/ (copy that directory to the host: it holds no server secret), "
        "authorized in DIR/authorized/. Actors may only HELLO, INSERT, STATS and GET_PARAMS. See the "
        "security section of docs/running.md."
    )


def _fill_keygen_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("dir", metavar="DIR", help="directory for the keys (created if needed; keys are never overwritten)")
    p.add_argument(
        "--role",
        choices=("learner", "actor"),
        default="learner",
        help="learner (default: a new DIR with the server's keys) or actor (one more key in DIR)",
    )
    p.add_argument("--name", default=None, help="the actor's name, e.g. its host name (required with --role actor)")
    return p


def _plot_kwargs() -> dict:
    return dict(
        description="Write PNG learning curves from run directories: evaluation return (metrics.csv, at the "
        "frames and time its weights were taken) and the greediest actor's smoothed episode returns "
        "(episodes.csv) against env frames and wall time; seeds of one configuration as mean ± SE bands."
    )


def _fill_plot_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories holding metrics.csv")
    p.add_argument(
        "--out", default=None, help="PNG file (default RUN_DIR/curves.png for one run, curves.png for several)"
    )
    p.add_argument(
        "--smooth",
        type=int_arg(1),
        default=20,
        help="episodes in the moving average of the actors' returns (default 20)",
    )
    return p


def _evaluate_kwargs() -> dict:
    return dict(
        description="Score RUN_DIR/checkpoint.safetensors (the last; --best: the best) with N evaluation episodes "
        "(DQN: epsilon 0.001, DPG/D4PG: no noise; Atari capped at 108,000 frames) and print mean ± standard "
        "error, with the learner step, env frames and time the checkpoint was taken at. Exit status 2 when the "
        "run cannot be evaluated (missing directory, checkpoint, agent or video package)."
    )


def _fill_evaluate_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory holding checkpoint.safetensors")
    p.add_argument(
        "--best",
        action="store_true",
        help="score RUN_DIR/best_checkpoint.safetensors instead of the last checkpoint: the learner state whose "
        "periodic evaluation had the highest mean return of the run (kept by every run beside the last). "
        "Choosing by evaluation return is a selection: the choosing evaluation's return, the highest of many "
        "noisy ones, is an optimistic estimate; these fresh episodes score the chosen weights again. Report it "
        "beside the last checkpoint's score, named as the best. --json records which checkpoint was scored "
        "(checkpoint_kind) and the evaluation that chose it (chosen_by)",
    )
    EPISODES.add(p)
    p.add_argument(
        "--seed",
        type=int_arg(0, 2**63 - 1),
        default=None,
        help="seed of the evaluation environment and policy (default: the run's seed * 10007 + 5003, "
        "the learner's evaluation stream; with --best + 6007 instead, episodes the choosing evaluations did "
        "not play)",
    )
    p.add_argument(
        "--video",
        metavar="FILE",
        default=None,
        help="also write the first episode as FILE.gif (Pillow) or FILE.mp4 (imageio-ffmpeg); pip install "
        "'apexrl[video]'",
    )
    p.add_argument(
        "--json",
        metavar="PATH",
        default=None,
        help="write the result as JSON (agent, env, preset, checkpoint, checkpoint_kind, chosen_by, "
        "eval_weights: online or polyak, the run's Polyak average stored in its checkpoints, learner_steps, env_frames, time_s, episodes, mean, std, se, returns, seed)",
    )
    p.add_argument(
        "--device",
        default="cpu",
        help="torch device the checkpoint's learner is loaded on (default cpu; the policy acts on CPU)",
    )
    return p


def _suite_kwargs() -> dict:
    return dict(
        description="Run each task x seed one after another as `apexrl run` (run directories "
        "OUT/<task>/<agent>/<seed>), evaluate each (apexrl evaluate --json RUN_DIR/final_eval.json), and "
        "write OUT/suite.csv and OUT/suite.md (mean ± SE over seeds, with the env frames and wall time of the "
        "runs, beside the Control Suite paper's published A3C, DDPG and D4PG scores after 10^8 steps). "
        "Resumable: a task x seed whose final_eval.json exists is not rerun; one with an "
        "unfinished run is continued with --resume. Ctrl-C stops the current run cleanly and still writes "
        "the tables for what finished."
    )


def _fill_suite_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("--tasks", nargs="+", required=True, metavar="TASK", help="environments, e.g. dmc:walker-stand")
    p.add_argument("--seeds", type=int_arg(1, 1000), default=3, help="seeds 0..N-1 per task (default 3)")
    MINUTES.add(p, required=True)
    STEPS.add(p)
    for option in (AGENT, PRESET):
        option.add(p)
    ACTORS.add_preset(p)
    EPISODES.add(p)
    p.add_argument("--out", default="suite", help="output directory (default ./suite)")
    p.add_argument("--run-args", default="", help="extra `apexrl run` flags for every run, quoted")
    p.add_argument(
        "--mixed-machines",
        action="store_true",
        help="add seeds even on a machine whose environment steps are more than 1.5x faster or slower "
        "than where the task's finished seeds ran (default: measure three times, keep the fastest, then "
        "refuse; runs are wall-time budgets, so their frames would not compare; each run's speed is in "
        "RUN_DIR/machine.json and suite.csv; other work on the machine inflates it, so measure it quiet)",
    )
    return p


def _export_kwargs() -> dict:
    return dict(
        description="Write a replay snapshot's items (decoded with the spec kept beside it, SNAPSHOT.spec.json), "
        "their keys and priorities to an .npz file, oldest first; layout in docs/offline.md. Exit status 2 "
        "when the snapshot or its spec is missing or corrupt (nothing is written then)."
    )


def _fill_export_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("snapshot", metavar="SNAPSHOT", help="a replay server's snapshot, e.g. RUN_DIR/replay.snap")
    p.add_argument("--out", metavar="FILE", required=True, help="the .npz file to write (replaced if it exists)")
    p.add_argument(
        "--spec",
        metavar="SPEC_JSON",
        default=None,
        help="decode with this TransitionSpec (JSON text or file) instead of SNAPSHOT.spec.json",
    )
    p.add_argument(
        "--table",
        metavar="NAME",
        default=None,
        help="export this table of a snapshot of several tables alone (default: every table; `default` to FILE, "
        "each other table to FILE with .NAME before its extension)",
    )
    return p


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (its --help lists the commands); each command parses with its own parser."""
    p = argparse.ArgumentParser(prog=PROG, description="Ape-X: distributed prioritized experience replay.")
    sub = p.add_subparsers(dest="command", metavar="{run,plot,evaluate,bench-suite,keygen,export}")
    fill_run_parser(
        sub.add_parser("run", help="run a replay server, a learner and N actors on this machine", **run_kwargs())
    )
    _fill_plot_parser(sub.add_parser("plot", help="PNG learning curves of run directories", **_plot_kwargs()))
    _fill_evaluate_parser(
        sub.add_parser(
            "evaluate", help="score a run's checkpoint (mean ± SE), optionally on video", **_evaluate_kwargs()
        )
    )
    _fill_suite_parser(
        sub.add_parser(
            "bench-suite", help="runs x seeds, final evaluations, CSV and Markdown tables", **_suite_kwargs()
        )
    )
    _fill_keygen_parser(sub.add_parser("keygen", help="write CURVE keys for --curve-dir", **_keygen_kwargs()))
    _fill_export_parser(
        sub.add_parser("export", help="a replay snapshot's items and priorities as .npz", **_export_kwargs())
    )
    return p


def run_main(argv: Sequence[str]) -> int:
    from apexrl.launch.local import PlacementError

    p, log_level, args = launch_plan(argv)
    try:
        launcher = make_launcher(p, log_level, args)
    except PlacementError as e:
        print(f"{PROG} run: error: {e}", file=sys.stderr, flush=True)
        return 2
    print(run_banner(p) + " Ctrl-C stops.", flush=True)
    return launcher.run()


def plot_main(argv: Sequence[str]) -> int:
    from apexrl.plot import PlotError, plot_runs

    args = _fill_plot_parser(argparse.ArgumentParser(prog=f"{PROG} plot", **_plot_kwargs())).parse_args(argv)
    try:
        out = plot_runs(args.run_dirs, args.out, smooth=args.smooth)
    except PlotError as e:
        print(f"{PROG} plot: error: {e}", file=sys.stderr, flush=True)
        return 1
    print(f"wrote {out}", flush=True)
    return 0


def evaluate_main(argv: Sequence[str]) -> int:
    from apexrl.evaluate import EvaluateError, evaluate_run, write_json

    args = _fill_evaluate_parser(argparse.ArgumentParser(prog=f"{PROG} evaluate", **_evaluate_kwargs())).parse_args(
        argv
    )
    try:
        result = evaluate_run(
            args.run_dir, episodes=args.episodes, seed=args.seed, video=args.video, device=args.device, best=args.best
        )
        if args.json:
            write_json(result, args.json)
    except (EvaluateError, OSError) as e:
        print(f"{PROG} evaluate: error: {e}", file=sys.stderr, flush=True)
        return 2
    print(result.summary(), flush=True)
    if args.video:
        print(f"wrote {args.video} (the first episode)", flush=True)
    if args.json:
        print(f"wrote {args.json}", flush=True)
    return 0


def suite_main(argv: Sequence[str]) -> int:
    from apexrl.suite import SuiteError, run_suite

    parser = _fill_suite_parser(argparse.ArgumentParser(prog=f"{PROG} bench-suite", **_suite_kwargs()))
    args = parser.parse_args(argv)
    if args.minutes == 0 and args.steps == 0:
        parser.error("--minutes 0 needs --steps N (else the runs never end)")
    try:
        return run_suite(
            args.tasks,
            args.seeds,
            args.minutes,
            args.out,
            agent=args.agent,
            preset=args.preset,
            actors=args.actors,
            episodes=args.episodes,
            steps=args.steps,
            run_args=args.run_args,
            mixed_machines=args.mixed_machines,
        )
    except (ValueError, SuiteError) as e:
        parser.error(str(e))


def export_main(argv: Sequence[str]) -> int:
    from apexrl.offline.export import ExportError, export_tables

    args = _fill_export_parser(argparse.ArgumentParser(prog=f"{PROG} export", **_export_kwargs())).parse_args(argv)
    try:
        written = export_tables(args.snapshot, args.out, spec=args.spec, table=args.table)
    except (ExportError, OSError) as e:
        print(f"{PROG} export: error: {e}", file=sys.stderr, flush=True)
        return 2
    if list(written) == ["default"]:
        print(f"wrote {written['default']} items to {args.out}", flush=True)
    else:
        print("wrote " + ", ".join(f"table {name!r}: {n} items" for name, n in written.items()), flush=True)
    return 0


def keygen_main(argv: Sequence[str]) -> int:
    from apexrl.security import CurveKeyError, keygen

    parser = _fill_keygen_parser(argparse.ArgumentParser(prog=f"{PROG} keygen", **_keygen_kwargs()))
    args = parser.parse_args(argv)
    try:
        paths = keygen(args.dir, args.role, args.name)
    except (CurveKeyError, OSError) as e:
        print(f"{PROG} keygen: error: {e}", file=sys.stderr, flush=True)
        return 1
    print("wrote " + ", ".join(paths), flush=True)
    if args.role == "actor":
        node = os.path.dirname(os.path.abspath(paths[0]))
        print(
            f"copy {node} to the actor's host and give it --curve-dir with that copy; restart the servers "
            f"(the allow-list is read at start)",
            flush=True,
        )
    else:
        print(
            f"give the replay server and the learner --curve-dir {os.path.abspath(args.dir)} (or APEXRL_CURVE_DIR); "
            f"issue each actor host its own key with `{PROG} keygen {args.dir} --role actor --name HOST` "
            "(docs/running.md, Security)",
            flush=True,
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        return run_main(argv[1:])
    if argv and argv[0] == "plot":
        return plot_main(argv[1:])
    if argv and argv[0] == "keygen":
        return keygen_main(argv[1:])
    if argv and argv[0] == "export":
        return export_main(argv[1:])
    if argv and argv[0] == "evaluate":
        return evaluate_main(argv[1:])
    if argv and argv[0] == "bench-suite":
        return suite_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)  # --help, or an unknown command: argparse says which
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
