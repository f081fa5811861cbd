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
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from apexrl.apex.config import ActorConfig, LearnerConfig
from apexrl.cli.args import (
    add_agent_arguments,
    add_curve_arguments,
    agent_overrides,
    field_arg,
    float_arg,
    given_flags,
    int_arg,
)
from apexrl.replay.server.config import MAX_REPLAY_SERVERS

AGENT_DESTS = ("agent", "env", "preset", "seed", "n_step", "gamma", "batch_size", "target_update_period")
SERVER_OWN = (
    "bind",
    "capacity",
    "alpha",
    "eviction",
    "alpha_evict",
    "shards",
    "seed",
    "min_size_to_sample",
    "snapshot",
    "snapshot_every",
    "max_message_mb",
    "workers",
    "inline_sample_max",
    "samples_per_insert",
    "error_buffer",
    "spec",
    "max_size",
    "max_wait_s",
    "max_waiting",
    "max_waiting_per_peer",
    "max_waiting_mb",
    "max_reply_mb",
    "max_unread_mb",
    "handshake_s",
    "heartbeat_s",
    "log_level",
)
"""apexrl-replay-server flags `apexrl run --server-args` may set (its --seed overrides the run's)."""

PROG = "apexrl"
ACTOR_LOG_EVERY = 5.0


def _presets_epilog() -> str:
    from apexrl.launch.preset_table import epilog

    return epilog()


def _run_kwargs() -> dict:
    return dict(
        description="Run Ape-X on this machine: a replay server, a learner and N actors on free local ports,\n"
        "with live progress (--ray: on a Ray cluster). Crashed processes are restarted; Ctrl-C (or the end\n"
        "of --minutes/--steps) stops everything cleanly and leaves the run directory (metrics.csv,\n"
        "episodes.csv, checkpoint, logs/).",
        epilog=_presets_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _fill_run_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_agent_arguments(p)
    g = p.add_argument_group("run")
    g.add_argument("--actors", type=int_arg(1, 256), default=None, help="number of actors (default: the preset's)")
    g.add_argument(
        "--envs-per-actor",
        metavar="K",
        type=field_arg(ActorConfig, "envs_per_actor"),
        default=None,
        help="environments each actor steps in lockstep with one batched forward pass; the exploration "
        "ladder runs over all actors x K environments (default: the preset's, 1)",
    )
    g.add_argument(
        "--decode-threads",
        metavar="N",
        type=field_arg(LearnerConfig, "decode_threads"),
        default=None,
        help="the learner's threads decoding sampled batches side by side (natively, without the GIL); "
        "more use more cores for Atari frames (default 1; as --learner-args='--decode-threads N')",
    )
    g.add_argument(
        "--minutes",
        type=float_arg(nonneg=True),
        default=None,
        help="stop after this many minutes of wall time (default: the preset's; 0: no limit)",
    )
    g.add_argument("--steps", type=int_arg(0), default=0, help="stop after this many learner steps (0: no limit)")
    g.add_argument(
        "--final-eval",
        metavar="EPISODES",
        type=int_arg(0, 100_000),
        default=None,
        help="when the run reaches --minutes/--steps, evaluate the final checkpoint over this many episodes "
        "(apexrl evaluate; RUN_DIR/final_eval.json) (default: the preset's, 30; 0: none)",
    )
    g.add_argument("--run-dir", default=None, help="run directory (default runs/<env>/<agent>/<seed>)")
    g.add_argument(
        "--resume",
        action="store_true",
        help="continue the run directory's checkpoint (the learner starts with --resume)",
    )
    g.add_argument(
        "--progress-every",
        type=float_arg(positive=True),
        default=5.0,
        help="seconds between progress lines (default 5)",
    )
    g.add_argument("--quiet", action="store_true", help="no progress lines, only events and the summary")
    g.add_argument(
        "--tensorboard",
        metavar="DIR",
        default=None,
        help="also write the rows of RUN_DIR/metrics.csv (learner and evaluations) and episodes.csv (every "
        "actor's episode returns) to a TensorBoard event file in DIR as they come, to watch the run live "
        "(tensorboard --logdir DIR); the CSV files stay the record; pip install 'apexrl[tensorboard]'",
    )
    g.add_argument(
        "--max-restarts",
        type=int_arg(0),
        default=5,
        help="restarts of one process within a minute before the run is given up (default 5)",
    )
    g.add_argument(
        "--snapshot-every",
        type=float_arg(nonneg=True),
        default=None,
        metavar="SECONDS",
        help="seconds between snapshots of the replay to RUN_DIR/replay.snap; a restarted server "
        "restores it, so a server crash loses at most one interval (default 300; 0: no snapshots)",
    )
    g.add_argument(
        "--ports",
        metavar="BASE",
        type=int_arg(1, 65535),
        default=0,
        help="fixed ports for a firewall: the replay servers listen on BASE, BASE+1, ..., the learner's "
        "parameter service on the next one (default: free ports picked at start)",
    )
    g.add_argument(
        "--replay-servers",
        metavar="K",
        type=int_arg(1, MAX_REPLAY_SERVERS),
        default=1,
        help="replay servers sharing the replay: capacity and minimum size split evenly, one snapshot "
        "each (RUN_DIR/replay0.snap, ...); the learner samples across them in proportion to their "
        "priority mass and the actors spread their inserts (default 1)",
    )
    g = p.add_argument_group("offline data (pip install 'apexrl[offline]'; docs/offline.md)")
    g.add_argument(
        "--record-dataset",
        metavar="DIR",
        type=os.path.abspath,
        default=None,
        help="each actor records the episodes it plays as a Minari dataset in DIR/actor<I>/ (appending to one there)",
    )
    g.add_argument(
        "--offline",
        metavar="DATASET",
        default=None,
        help="train with no actors from a Minari dataset on disk: a dataset directory, a --record-dataset "
        "DIR, or the id of a dataset in Minari's local store (never downloaded); its episodes become "
        "the run's n-step transitions, loaded into the replay with priorities",
    )
    g = p.add_argument_group("on a Ray cluster (pip install 'apexrl[ray]'; docs/running.md, Several machines on Ray)")
    g.add_argument(
        "--ray",
        metavar="ADDRESS",
        default=None,
        help="run on Ray: auto (the running cluster), HOST:PORT (that cluster's head) or local (a private "
        "one-node cluster on 127.0.0.1); replay server(s) and learner on the node with the resource "
        "apexrl_replay, actors spread over the nodes",
    )
    g.add_argument(
        "--ray-actor-cpus",
        metavar="N",
        type=float_arg(positive=True),
        default=1.0,
        help="CPUs Ray reserves for each actor (default 1)",
    )
    g = p.add_argument_group("pass-through flags (quote them; use --learner-args='--flag' for a single flag)")
    g.add_argument("--server-args", default="", help="extra apexrl-replay-server flags, e.g. '--shards 4'")
    g.add_argument(
        "--learner-args", default="", help="extra apexrl-learner flags, e.g. '--min-replay-size 500 --eval-every 10'"
    )
    g.add_argument("--actor-args", default="", help="extra apexrl-actor flags, e.g. '--flush-every 20'")
    add_curve_arguments(p, binds=True)
    return p


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
        description="Score RUN_DIR/checkpoint.safetensors with N evaluation episodes (DQN: epsilon 0.001, "
        "DPG/D4PG: no noise; Atari capped at 108,000 frames) and print mean ± standard error, with the "
        "learner step, env frames and time the checkpoint was taken at. Exit status 2 when the run "
        "cannot be evaluated (missing directory, checkpoint, agent or video package)."
    )


def _fill_evaluate_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("run_dir", metavar="RUN_DIR", help="run directory holding checkpoint.safetensors")
    p.add_argument("--episodes", type=int_arg(1, 100_000), default=10, help="evaluation episodes (default 10)")
    p.add_argument(
        "--seed",
        type=int_arg(0, 2**63 - 1),
        default=None,
        help="seed of the evaluation environment and policy (default: the run's seed * 10007 + 5003, "
        "the learner's evaluation stream)",
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
        help="write the result as JSON (agent, env, preset, checkpoint, learner_steps, env_frames, time_s, "
        "episodes, mean, std, se, returns, seed)",
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
    p.add_argument(
        "--minutes",
        type=float_arg(nonneg=True),
        required=True,
        help="wall-time minutes of each run (0: no limit, then give --steps)",
    )
    p.add_argument("--steps", type=int_arg(0), default=0, help="also stop each run at this many learner steps")
    p.add_argument("--agent", default=None, help="agent (default: the preset's or the env's default)")
    p.add_argument("--preset", default=None, help="preset (default: the default for the env)")
    p.add_argument("--actors", type=int_arg(1, 256), default=None, help="actors per run (default: the preset's)")
    p.add_argument(
        "--episodes", type=int_arg(1, 100_000), default=10, help="episodes of each final evaluation (default 10)"
    )
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
    return p


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (its --help lists the commands); each command parses with its own parser."""
    p = argparse.ArgumentParser(prog=PROG, description="Ape-X: distributed prioritized experience replay.")
    sub = p.add_subparsers(dest="command", metavar="{run,plot,evaluate,bench-suite,keygen,export}")
    _fill_run_parser(
        sub.add_parser("run", help="run a replay server, a learner and N actors on this machine", **_run_kwargs())
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


def _split(parser: argparse.ArgumentParser, flag: str, text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as e:
        parser.error(f"{flag}: {e}")


def _pass_through(
    run_parser: argparse.ArgumentParser,
    flag: str,
    text: str,
    child: argparse.ArgumentParser,
    allowed: tuple[str, ...],
    agent_dests: tuple[str, ...] = AGENT_DESTS,
) -> dict[str, Any]:
    """Config fields set by ``--server-args/--learner-args/--actor-args``: parsed and range-checked by the
    child's own parser (it exits 2 naming the flag), and refused when the launcher or the agent flags own
    them (so actors and learner cannot disagree)."""
    given = given_flags(child, _split(run_parser, flag, text))
    for dest in given:
        name = "--" + dest.replace("_", "-")
        if dest in agent_dests:
            run_parser.error(f"{flag}: give {name} to `apexrl run` itself (every process of the run needs it)")
        if dest not in allowed:
            run_parser.error(f"{flag}: {name} is set by `apexrl run`")
    return given


def issue_run_actor_key(curve_dir: str) -> str | None:
    """Give a local run's actors their own key: ``DIR/actors/run`` (role actor), issued once with `apexrl keygen
    DIR --role actor --name run` when DIR holds the server's keys; returns its path, or None when DIR cannot
    have one (the actors then use the learner's key, as :func:`apexrl.launch.plan.actor_curve_dir` says)."""
    from apexrl.launch.plan import RUN_ACTOR_KEY
    from apexrl.security import AUTHORIZED, CurveKeyError, keygen

    node = os.path.join(curve_dir, "actors", RUN_ACTOR_KEY)
    if os.path.isdir(node):
        return node
    if not (
        os.path.exists(os.path.join(curve_dir, "server.key_secret"))
        and os.path.isdir(os.path.join(curve_dir, AUTHORIZED))
    ):
        return None
    try:
        keygen(curve_dir, "actor", RUN_ACTOR_KEY)
    except (CurveKeyError, OSError) as e:
        print(
            f"{PROG} run: the actors use the learner's key: could not issue their own in {node}: {e}",
            file=sys.stderr,
            flush=True,
        )
        return None
    print(f"{PROG} run: issued the actors' own key (role actor) in {node}", flush=True)
    return node


def launch_plan(argv: Sequence[str] | None = None):
    """Parse ``apexrl run`` flags into a validated :class:`~apexrl.launch.plan.RunPlan` (exit 2 with the reason on
    a bad flag, setting or combination)."""
    from apexrl.cli import actor as actor_cli
    from apexrl.cli import learner as learner_cli
    from apexrl.cli import server as server_cli
    from apexrl.launch.plan import plan, snapshot_name

    run_parser = _fill_run_parser(argparse.ArgumentParser(prog=f"{PROG} run", **_run_kwargs()))
    args = run_parser.parse_args(argv)
    if args.tensorboard is not None:
        from apexrl.tensorboard import TensorBoardMissing, check_logdir

        try:
            check_logdir(args.tensorboard)
        except (TensorBoardMissing, ValueError) as e:
            run_parser.error(str(e))
    o = agent_overrides(args)
    o.actors, o.minutes, o.steps, o.run_dir = args.actors, args.minutes, args.steps, args.run_dir
    o.final_eval = args.final_eval
    o.resume, o.progress_every, o.quiet, o.max_restarts_per_minute = (
        args.resume,
        args.progress_every,
        args.quiet,
        args.max_restarts,
    )
    if args.snapshot_every is not None:
        o.snapshot_every = args.snapshot_every
    o.curve_dir, o.insecure = args.curve_dir, args.insecure
    o.replay_servers, o.port_base = args.replay_servers, args.ports
    o.server = _pass_through(
        run_parser, "--server-args", args.server_args, server_cli.build_parser(), SERVER_OWN, agent_dests=()
    )
    log_level = o.server.pop("log_level", "WARNING")
    o.learner = _pass_through(
        run_parser, "--learner-args", args.learner_args, learner_cli.build_parser(), learner_cli.OWN
    )
    o.actor = _pass_through(run_parser, "--actor-args", args.actor_args, actor_cli.build_parser(), actor_cli.OWN)
    if args.envs_per_actor is not None:
        o.actor["envs_per_actor"] = args.envs_per_actor
    if args.decode_threads is not None:
        if "decode_threads" in o.learner:
            run_parser.error("give --decode-threads once: to `apexrl run` or in --learner-args, not both")
        o.learner["decode_threads"] = args.decode_threads
    _offline_flags(run_parser, args, o)
    if o.curve_dir is not None and args.ray is None:
        issue_run_actor_key(o.curve_dir)
    try:
        p = plan(args.preset, o)
        if args.ray is not None and not os.path.isabs(p.run.run_dir):  # the processes run in other folders
            o.run_dir = os.path.abspath(p.run.run_dir)
            p = plan(args.preset, o)
    except ValueError as e:
        run_parser.error(str(e))
    if args.record_dataset is not None:
        from apexrl.envs import env_spec
        from apexrl.offline.record import check_recording

        try:
            check_recording(args.record_dataset, env_spec(p.env), len(p.actors))
        except ValueError as e:
            run_parser.error(str(e))
    if p.run.offline is not None:
        from apexrl.offline.loader import check_offline

        try:
            steps = check_offline(p, min_replay_given="min_replay_size" in o.learner)
            if "min_replay_size" not in o.learner:  # learning starts once the whole dataset is in the replay
                o.learner["min_replay_size"] = steps
                p = plan(args.preset, o)
        except (ValueError, ImportError) as e:
            run_parser.error(str(e))
    if not p.run.resume:
        names = [
            "metrics.csv",
            "checkpoint.safetensors",
            *(snapshot_name(i, k) for k in (1, len(p.servers)) for i in range(k)),
        ]
        held = [n for n in dict.fromkeys(names) if os.path.exists(os.path.join(p.run.run_dir, n))]
        if held:
            run_parser.error(
                f"{p.run.run_dir} already holds a run ({', '.join(held)}): pass --resume to continue "
                "it, or choose another --run-dir or --seed (or remove the directory)"
            )
    else:
        try:
            upgrade_episodes_csv(os.path.join(p.run.run_dir, "episodes.csv"))
        except ValueError as e:
            run_parser.error(str(e))
    return p, log_level, args


def _offline_flags(run_parser: argparse.ArgumentParser, args: argparse.Namespace, o) -> None:
    """``--record-dataset`` and ``--offline`` into the overrides; exit 2 when they cannot work."""
    if args.record_dataset is not None:
        from apexrl.offline import require_minari

        try:
            require_minari()
        except ImportError as e:
            run_parser.error(f"--record-dataset: {e}")
        o.actor["record_dataset"] = args.record_dataset
    if args.offline is not None:
        clash = [
            flag
            for flag, given in (
                ("--record-dataset", args.record_dataset),
                ("--actors", args.actors),
                ("--envs-per-actor", args.envs_per_actor),
                ("--actor-args", args.actor_args),
                ("--ray", args.ray),
            )
            if given
        ]
        if clash:
            run_parser.error(f"--offline runs no actors (and only locally): leave out {', '.join(clash)}")
        o.offline = args.offline


def upgrade_episodes_csv(path: str) -> None:
    """Before a resumed run's actors append to it: give an ``episodes.csv`` written by an older version the
    current header (its rows get the new columns empty), so old and new rows read as one table; a torn last
    line is dropped. ValueError when the file has columns this version does not write."""
    from apexrl.apex.config import EPISODE_COLUMNS
    from apexrl.apex.metrics import CSVWriter

    if os.path.exists(path) and os.path.getsize(path) > 0:
        CSVWriter(path, EPISODE_COLUMNS).close()


def run_banner(p) -> str:
    """The line ``apexrl run`` (and ``apexrl.run``) prints before starting: what runs, how long, where."""
    from apexrl.launch.presets import PRESETS

    limits = [f"{p.run.minutes:g} min" if p.run.minutes else "no time limit"]
    if p.run.steps:
        limits.append(f"{p.run.steps} learner steps")
    description = PRESETS[p.preset].description if p.preset in PRESETS else "agent defaults"
    if p.run.offline is not None:
        who = f"no actors: offline from {p.run.offline}"
    else:
        k = p.actors[0].envs_per_actor
        who = f"{len(p.actors)} actors" + (f" x {k} environments" if k > 1 else "")
    return (
        f"apexrl run: preset {p.preset} [{description}]; agent {p.agent}, env {p.env}, {who}, seed {p.seed}, "
        f"{' or '.join(limits)}; run dir {p.run.run_dir}."
    )


def make_launcher(p, log_level: str, args: argparse.Namespace, out=None):
    """The launcher of a parsed ``apexrl run`` (local, or Ray with ``--ray``); PlacementError when Ray is missing."""
    from apexrl.launch.local import Launcher

    if args.ray is not None:
        from apexrl.launch.ray_launcher import RayLauncher, require_ray

        require_ray(args.ray)
        return RayLauncher(
            p, args.ray, actor_cpus=args.ray_actor_cpus, server_log_level=log_level, tensorboard=args.tensorboard
        )
    return Launcher(p, server_log_level=log_level, out=out, tensorboard=args.tensorboard)


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
            args.run_dir, episodes=args.episodes, seed=args.seed, video=args.video, device=args.device
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
    from apexrl.offline.export import ExportError, export_snapshot

    args = _fill_export_parser(argparse.ArgumentParser(prog=f"{PROG} export", **_export_kwargs())).parse_args(argv)
    try:
        n = export_snapshot(args.snapshot, args.out, spec=args.spec)
    except (ExportError, OSError) as e:
        print(f"{PROG} export: error: {e}", file=sys.stderr, flush=True)
        return 2
    print(f"wrote {n} items to {args.out}", flush=True)
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
