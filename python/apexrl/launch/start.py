"""Starting an ``apexrl run``: the one home of what the ``apexrl run`` command and :func:`apexrl.run` share.

:func:`fill_run_parser` declares the run's options (``apexrl run``'s flags; :func:`apexrl.run`'s keywords are
named after them), :func:`launch_plan` turns them into a validated :class:`~apexrl.launch.plan.RunPlan` (with
the same refusals, exit status 2 and the reason), :func:`run_banner` is the line printed before starting and
:func:`make_launcher` the launcher (local, or Ray with ``--ray``). The pass-through flags (``--server-args``,
``--learner-args``, ``--actor-args``) are checked by the child processes' own parsers (:mod:`apexrl.cli.server`,
:mod:`apexrl.cli.learner`, :mod:`apexrl.cli.actor`), which sit below this module; the ``apexrl`` command
(:mod:`apexrl.cli.main`) and :mod:`apexrl.api` sit above it.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence
from typing import Any

from apexrl.cli.actor import ENVS_PER_ACTOR
from apexrl.cli.args import (
    RECORD_DATASET,
    add_agent_arguments,
    add_curve_arguments,
    agent_overrides,
    agent_setting,
    float_arg,
    given_flags,
)
from apexrl.cli.flags import Flag
from apexrl.cli.learner import DECODE_THREADS, EVAL_WEIGHT_FLAGS
from apexrl.cli.server import SERVER_FLAG_DECLS, TABLE_FLAG_DECLS

__all__ = [
    "ACTORS",
    "AGENT_DESTS",
    "MINUTES",
    "STEPS",
    "PROG",
    "SERVER_OWN",
    "fill_run_parser",
    "issue_run_actor_key",
    "launch_plan",
    "make_launcher",
    "run_banner",
    "run_kwargs",
    "upgrade_episodes_csv",
]

PROG = "apexrl"

AGENT_DESTS = ("agent", "env", "preset", "seed", "n_step", "gamma", "batch_size", "target_update_period")
SERVER_OWN = (*(flag.field for flag in (*SERVER_FLAG_DECLS, *TABLE_FLAG_DECLS)), "log_level")
"""apexrl-replay-server flags `apexrl run --server-args` may set (its --seed overrides the run's)."""


# apexrl.launch.plan imports the presets and torch: only building the parser needs it, not `apexrl keygen`.
_OVERRIDES, _RUN_SETTINGS = "apexrl.launch.plan:Overrides", "apexrl.launch.plan:RunSettings"
ACTORS = Flag(_OVERRIDES, "actors", "number of actors")
MINUTES = Flag(_RUN_SETTINGS, "minutes", "stop after this many minutes of wall time (0: no limit)")
STEPS = Flag(_RUN_SETTINGS, "steps", "stop after this many learner steps (0: no limit)")
"""``--actors``, ``--minutes`` and ``--steps`` of ``apexrl run`` and of ``apexrl bench-suite`` (per run)."""
FINAL_EVAL = Flag(
    _RUN_SETTINGS,
    "final_eval_episodes",
    "when the run reaches --minutes/--steps, evaluate the final checkpoint over this many episodes "
    "(apexrl evaluate; RUN_DIR/final_eval.json; 0: none)",
    option="--final-eval",
    metavar="EPISODES",
    dest="final_eval",
)
PROGRESS_EVERY = Flag(_RUN_SETTINGS, "progress_every", "seconds between progress lines")
MAX_RESTARTS = Flag(
    _RUN_SETTINGS,
    "max_restarts_per_minute",
    "restarts of one process within a minute before the run is given up",
    option="--max-restarts",
    dest="max_restarts",
)
SNAPSHOT_EVERY = Flag(
    _OVERRIDES,
    "snapshot_every",
    "seconds between snapshots of the replay to RUN_DIR/replay.snap; a restarted server restores it, so a "
    "server crash loses at most one interval (0: no snapshots)",
    metavar="SECONDS",
)
PORTS = Flag(
    _RUN_SETTINGS,
    "port_base",
    "fixed ports for a firewall: the replay servers listen on BASE, BASE+1, ..., the learner's parameter "
    "service on the next one (0: free ports picked at start)",
    option="--ports",
    metavar="BASE",
    dest="ports",
)
REPLAY_SERVERS = Flag(
    _OVERRIDES,
    "replay_servers",
    "replay servers sharing the replay: capacity and minimum size split evenly, one snapshot each "
    "(RUN_DIR/replay0.snap, ...); the learner samples across them in proportion to their priority mass and the "
    "actors spread their inserts",
    metavar="K",
)


def _presets_epilog() -> str:
    from apexrl.launch.preset_table import epilog

    return epilog()


def run_kwargs() -> dict:
    return dict(
        description="Run Ape-X on this machine: a replay server, a learner and N actors on free local ports,\n"
        "with live progress (--ray: on a Ray cluster). Crashed processes are restarted; Ctrl-C (or the end\n"
        "of --minutes/--steps) stops everything cleanly and leaves the run directory (metrics.csv,\n"
        "episodes.csv, checkpoint, logs/).",
        epilog=_presets_epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def fill_run_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_agent_arguments(p)
    g = p.add_argument_group("run")
    ACTORS.add_preset(g)
    ENVS_PER_ACTOR.add_preset(g)
    for flag in (DECODE_THREADS, *EVAL_WEIGHT_FLAGS):
        flag.add_preset(g)
    MINUTES.add_preset(g, shown="default: the preset's")
    STEPS.add(g)
    FINAL_EVAL.add_preset(g, shown="default: the preset's, 30")
    g.add_argument(
        "--agent-set",
        metavar="NAME=VALUE",
        type=agent_setting,
        action="append",
        default=[],
        help="set any field of the agent's config that has no flag of its own, for every process of the run "
        "(repeat it for several): e.g. --agent-set num_samples=40 --agent-set actor_hidden=[256,256]; values "
        "are JSON where they parse (null: off), else strings; the agent's config checks each (an unknown name "
        "is refused with the agent's settings listed); the plan (RUN_DIR/plan.json) records the result",
    )
    g.add_argument("--run-dir", default=None, help="run directory (default runs/<env>/<agent>/<seed>)")
    Flag(_RUN_SETTINGS, "resume", "continue the run directory's checkpoint (the learner starts with --resume)").add(g)
    PROGRESS_EVERY.add(g)
    Flag(_RUN_SETTINGS, "quiet", "no progress lines, only events and the summary").add(g)
    g.add_argument(
        "--tensorboard",
        metavar="DIR",
        default=None,
        help="also write the rows of RUN_DIR/metrics.csv (learner and evaluations) and episodes.csv (every "
        "actor's episode returns) to a TensorBoard event file in DIR as they come, to watch the run live "
        "(tensorboard --logdir DIR); the CSV files stay the record; pip install 'apexrl[tensorboard]'",
    )
    for flag in (MAX_RESTARTS, SNAPSHOT_EVERY, PORTS, REPLAY_SERVERS):
        flag.add(g)
    g.add_argument(
        "--tables",
        metavar="FILE",
        default=None,
        help="the replay servers' tables from a JSON file, as apexrl-replay-server --tables FILE takes it "
        "(apexrl-replay-server --help shows the format); it must hold the agent's table ('default' unless its "
        "replay path names another), which the learner and the actors use; replaces the preset's replay "
        "settings (docs/running.md, Tables)",
    )
    g = p.add_argument_group("offline data (pip install 'apexrl[offline]'; docs/offline.md)")
    RECORD_DATASET.add(g)
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

    run_parser = fill_run_parser(argparse.ArgumentParser(prog=f"{PROG} run", **run_kwargs()))
    args = run_parser.parse_args(argv)
    if args.tensorboard is not None:
        from apexrl.tensorboard import TensorBoardMissing, check_logdir

        try:
            check_logdir(args.tensorboard)
        except (TensorBoardMissing, ValueError) as e:
            run_parser.error(str(e))
    o = agent_overrides(args)
    for name, value in args.agent_set:
        if name in o.agent_settings:
            run_parser.error(f"--agent-set {name}=... is given twice")
        o.agent_settings[name] = value
    o.actors, o.minutes, o.steps, o.run_dir = args.actors, args.minutes, args.steps, args.run_dir
    o.final_eval = args.final_eval
    o.resume, o.progress_every, o.quiet, o.max_restarts_per_minute = (
        args.resume,
        args.progress_every,
        args.quiet,
        args.max_restarts,
    )
    o.snapshot_every = args.snapshot_every
    o.curve_dir, o.insecure = args.curve_dir, args.insecure
    o.replay_servers, o.port_base = args.replay_servers, args.ports
    if args.tables is not None:
        from apexrl.replay.tables import load_tables

        try:
            o.tables = load_tables(args.tables)
        except ValueError as e:
            run_parser.error(f"--tables {e}")
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
    for flag in (DECODE_THREADS, *EVAL_WEIGHT_FLAGS):  # learner settings `apexrl run` takes directly too
        value = getattr(args, flag.key)
        if value is not None:
            if flag.field in o.learner:
                run_parser.error(f"give {flag.name} once: to `apexrl run` or in --learner-args, not both")
            o.learner[flag.field] = value
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
            from apexrl.launch.presets import get_preset

            tables_given = o.tables is not None or get_preset(p.preset).tables is not None
            steps = check_offline(p, min_replay_given="min_replay_size" in o.learner, tables_given=tables_given)
            if "min_replay_size" not in o.learner:  # learning starts once the whole dataset is in the replay
                o.learner["min_replay_size"] = steps
                p = plan(args.preset, o)
        except (ValueError, ImportError) as e:
            run_parser.error(str(e))
    if not p.run.resume:
        names = [
            "metrics.csv",
            "checkpoint.safetensors",
            "best_checkpoint.safetensors",
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
        from apexrl.launch.plan import resolve_preset
        from apexrl.offline.loader import size_offline

        try:
            preset_tables = resolve_preset(args.preset, o)[0].tables
        except ValueError:
            return  # the plan says what is wrong with the preset
        try:
            size_offline(args.offline, o.server, o.learner, o.tables is not None or preset_tables is not None)
        except (ValueError, ImportError) as e:
            run_parser.error(str(e))


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
