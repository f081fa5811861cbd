"""``apexrl``: the one command a user needs (also ``python -m apexrl``).

``apexrl run`` starts a whole Ape-X system on this machine (replay server, learner, N actors; see
:mod:`apexrl.launch.local`), ``apexrl plot`` turns run directories into PNG learning curves (:mod:`apexrl.plot`).
Flags are validated here, with the same parsers the child processes use, so a run never starts only to have
its children refuse their flags.
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
from collections.abc import Sequence

from apexrl.cli.args import add_agent_arguments, float_arg, int_arg, resolve_agent

PROG = "apexrl"
ACTOR_LOG_EVERY = 5.0


def _presets_epilog() -> str:
    from apexrl.launch.presets import PRESETS

    width = max(map(len, PRESETS))
    rows = [f"  {p.name:<{width}}  {p.description} [{p.env}, {p.actors} actors, {p.minutes:g} min]"
            for p in PRESETS.values()]
    return "presets:\n" + "\n".join(rows) + "\n\nwith no flags: --preset cartpole (2 actors, 5 minutes)"


def _run_kwargs() -> dict:
    return dict(
        description="Run Ape-X on this machine: a replay server, a learner and N actors on free local ports,\n"
        "with live progress. Crashed processes are restarted; Ctrl-C (or the end of --minutes/--steps)\n"
        "stops everything cleanly and leaves the run directory (metrics.csv, episodes.csv, checkpoint, logs/).",
        epilog=_presets_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter,
    )


def _fill_run_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    add_agent_arguments(p)
    g = p.add_argument_group("run")
    g.add_argument("--actors", type=int_arg(1, 256), default=None, help="number of actors (default: the preset's)")
    g.add_argument("--minutes", type=float_arg(nonneg=True), default=None,
                   help="stop after this many minutes of wall time (default: the preset's; 0: no limit)")
    g.add_argument("--steps", type=int_arg(0), default=0, help="stop after this many learner steps (0: no limit)")
    g.add_argument("--run-dir", default=None, help="run directory (default runs/<env>/<agent>/<seed>)")
    g.add_argument("--resume", action="store_true",
                   help="continue the run directory's checkpoint (the learner starts with --resume)")
    g.add_argument("--progress-every", type=float_arg(positive=True), default=5.0,
                   help="seconds between progress lines (default 5)")
    g.add_argument("--quiet", action="store_true", help="no progress lines, only events and the summary")
    g.add_argument("--max-restarts", type=int_arg(0), default=5,
                   help="restarts of one process within a minute before the run is given up (default 5)")
    g = p.add_argument_group("pass-through flags (quote them; use --learner-args='--flag' for a single flag)")
    g.add_argument("--server-args", default="", help="extra apexrl-replay-server flags, e.g. '--shards 4'")
    g.add_argument("--learner-args", default="",
                   help="extra apexrl-learner flags, e.g. '--min-replay-size 500 --eval-every 10'")
    g.add_argument("--actor-args", default="", help="extra apexrl-actor flags, e.g. '--flush-every 20'")
    return p


def _plot_kwargs() -> dict:
    return dict(description="Write PNG learning curves from run directories: evaluation return (metrics.csv) "
                "and the actors' smoothed episode returns (episodes.csv) against env frames and wall time.")


def _fill_plot_parser(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
    p.add_argument("run_dirs", nargs="+", metavar="RUN_DIR", help="run directories holding metrics.csv")
    p.add_argument("--out", default=None,
                   help="PNG file (default RUN_DIR/curves.png for one run, curves.png for several)")
    p.add_argument("--smooth", type=int_arg(1), default=20,
                   help="episodes in the moving average of the actors' returns (default 20)")
    return p


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser (its --help lists the commands); each command parses with its own parser."""
    p = argparse.ArgumentParser(prog=PROG, description="Ape-X: distributed prioritized experience replay.")
    sub = p.add_subparsers(dest="command", metavar="{run,plot}")
    _fill_run_parser(sub.add_parser("run", help="run a replay server, a learner and N actors on this machine",
                                    **_run_kwargs()))
    _fill_plot_parser(sub.add_parser("plot", help="PNG learning curves of run directories", **_plot_kwargs()))
    return p


def _split(parser: argparse.ArgumentParser, flag: str, text: str) -> list[str]:
    try:
        return shlex.split(text)
    except ValueError as e:
        parser.error(f"{flag}: {e}")


def _fill_agent_defaults(args: argparse.Namespace) -> None:
    """With no --preset, pick one from --agent/--env (the env's action space decides the agent)."""
    if args.preset is not None:
        return
    if args.agent is None and args.env is None:
        args.preset = "cartpole"
    elif args.agent is None:
        from apexrl.envs import env_spec

        args.agent = "dqn" if env_spec(args.env).num_actions is not None else "dpg"
    elif args.env is None:
        args.preset = "cartpole" if args.agent == "dqn" else "pendulum"


def launch_config(argv: Sequence[str] | None = None):
    """Parse ``apexrl run`` flags into a :class:`~apexrl.launch.LaunchConfig` (exit 2 on bad flags)."""
    from apexrl.apex.learner import default_run_dir
    from apexrl.cli import actor as actor_cli
    from apexrl.cli import learner as learner_cli
    from apexrl.launch.local import LaunchConfig

    run_parser = _fill_run_parser(argparse.ArgumentParser(prog=f"{PROG} run", **_run_kwargs()))
    args = run_parser.parse_args(argv)
    _fill_agent_defaults(args)
    preset, _ = resolve_agent(args, run_parser)
    agent_flags = ["--preset", preset.name, "--agent", args.agent, "--env", args.env, "--seed", str(args.seed)]
    for flag in ("n_step", "gamma", "batch_size", "target_update_period"):
        if getattr(args, flag) is not None:
            agent_flags += ["--" + flag.replace("_", "-"), str(getattr(args, flag))]
    num_actors = args.actors or preset.actors
    run_dir = args.run_dir or default_run_dir(args.env, args.agent, args.seed)
    if not args.resume:
        held = [n for n in ("metrics.csv", "checkpoint.safetensors") if os.path.exists(os.path.join(run_dir, n))]
        if held:
            run_parser.error(f"{run_dir} already holds a run ({', '.join(held)}): pass --resume to continue it, "
                             "or choose another --run-dir or --seed (or remove the directory)")
    learner_args = [*agent_flags, *_split(run_parser, "--learner-args", args.learner_args)]
    actor_args = [*agent_flags, *_split(run_parser, "--actor-args", args.actor_args)]
    # The children's own parsers check the pass-through flags now, not after the run has started.
    learner_config, _ = learner_cli.parse_config(["--replay", "tcp://127.0.0.1:1", "--params-port", "1",
                                                  *learner_args])
    # The server makes samples wait for the learner's minimum too, so that after a server restart (empty) the
    # learner does not train on a handful of transitions (DESIGN §7); --server-args may still override it.
    server_args = [*preset.replay.server_args(), "--min-size-to-sample", str(learner_config.min_replay_size),
                   "--seed", str(args.seed), "--log-level", "WARNING",
                   *_split(run_parser, "--server-args", args.server_args)]
    from apexrl.cli import server as server_cli

    server_cli.parse_args(["--port", "1", *server_args])
    actor_cli.parse_config(["--replay", "tcp://127.0.0.1:1", "--params", "tcp://127.0.0.1:2", "--index", "0",
                            "--num-actors", str(num_actors), *actor_args])
    minutes = preset.minutes if args.minutes is None else args.minutes
    config = LaunchConfig(
        run_dir=run_dir, num_actors=num_actors, server_args=server_args, learner_args=learner_args,
        actor_args=actor_args, minutes=minutes, steps=args.steps, resume=args.resume,
        progress_every=args.progress_every, quiet=args.quiet, max_restarts_per_minute=args.max_restarts,
    )
    return config, preset, args


def run_main(argv: Sequence[str]) -> int:
    from apexrl.launch.local import Launcher

    config, preset, args = launch_config(argv)
    limits = [f"{config.minutes:g} min" if config.minutes else "no time limit"]
    if config.steps:
        limits.append(f"{config.steps} learner steps")
    print(f"apexrl run: preset {preset.name} [{preset.description}]; env {args.env}, {config.num_actors} actors, "
          f"seed {args.seed}, {' or '.join(limits)}; run dir {config.run_dir}. Ctrl-C stops.", flush=True)
    return Launcher(config).run()


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


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "run":
        return run_main(argv[1:])
    if argv and argv[0] == "plot":
        return plot_main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)  # --help, or an unknown command: argparse says which
    if args.command is None:
        parser.print_help(sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
