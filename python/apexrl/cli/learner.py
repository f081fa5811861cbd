"""``apexrl-learner``: the Ape-X learner process (also ``python -m apexrl.cli.learner``).

Prints ``learner params on ENDPOINT run_dir DIR`` once its parameter service is up, then one progress line per
metrics interval. SIGTERM/SIGINT: checkpoint and exit 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from apexrl.apex.config import IS_WEIGHT_MODES, LearnerConfig
from apexrl.cli.args import (
    LOG_LEVEL,
    REPLAY,
    add_agent_arguments,
    add_curve_arguments,
    exit_process,
    refuse_beside_plan,
    resolve_agent,
)
from apexrl.cli.flags import Flag

PROG = "apexrl-learner"

DECODE_THREADS = Flag(
    LearnerConfig,
    "decode_threads",
    "the learner's threads decoding sampled batches side by side (natively, without the GIL) into a ring of "
    "prefetch + 1 preallocated batches, page-locked on a GPU; more use more cores for Atari frames",
    metavar="N",
)
"""``--decode-threads`` of the learner and of ``apexrl run``."""
EVAL_WEIGHT_FLAGS = (
    Flag(
        LearnerConfig,
        "eval_weights",
        "weights the evaluations score (periodic, best checkpoint, final): online, the actors' weights; polyak, "
        "an exponential moving average of them updated every learner step (Polyak-Juditsky averaging), kept in "
        "the checkpoints; smooths step-to-step swings of fast-moving weights instead of picking the luckiest "
        "evaluation; the actors act with the online weights either way",
    ),
    Flag(
        LearnerConfig,
        "polyak_tau",
        "rate of the polyak average, average += tau * (online - average) per learner step, about 1/tau steps "
        "remembered; 0.005 is TD3's and SAC's soft-update rate",
        metavar="TAU",
    ),
)
"""``--eval-weights`` and ``--polyak-tau`` of the learner and of ``apexrl run``."""

SETTING_FLAGS = (
    Flag(LearnerConfig, "beta", "importance-sampling exponent β"),
    Flag(LearnerConfig, "min_replay_size", "transitions the replay must hold before the first update"),
    Flag(LearnerConfig, "prefetch", "decoded batches kept ready"),
    DECODE_THREADS,
    Flag(
        LearnerConfig,
        "sample_threads",
        "SAMPLE requests kept in flight, each thread on a connection of its own, so their round trips overlap; "
        "0: one per replay server (1 with one server)",
        metavar="N",
    ),
    Flag(LearnerConfig, "publish_every", "learner steps between weight publishes"),
    Flag(LearnerConfig, "checkpoint_every", "learner steps between checkpoints"),
    Flag(LearnerConfig, "remove_to_fit_every", "learner steps between replay evictions down to capacity"),
    Flag(LearnerConfig, "metrics_every", "seconds between metrics.csv rows"),
    Flag(LearnerConfig, "eval_every", "seconds between evaluations (greedy/noiseless episodes; 0: none)"),
    Flag(LearnerConfig, "eval_episodes", "episodes per evaluation"),
    *EVAL_WEIGHT_FLAGS,
)
"""The learner settings whose default is the preset's (and ``--is-weights``, whose choices are no field range)."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Ape-X learner: samples prioritized batches from the replay server, trains, sends "
        "priorities back, serves weights to the actors, writes metrics.csv and checkpoints.",
    )
    add_agent_arguments(p)
    g = p.add_argument_group("endpoints")
    g.add_argument(
        "--plan",
        metavar="PLAN_JSON",
        default=None,
        help="take every setting from a run plan written by `apexrl run` (then only --resume, "
        "--tensorboard and --log-level may be given besides)",
    )
    REPLAY.add(g)
    port = Flag(LearnerConfig, "params_port", "port of the parameter service the actors poll (0: pick a free one)")
    port.add(g, default=None, shown="required")
    g.add_argument(
        "--params-bind",
        default="127.0.0.1",
        help="address the parameter service binds (default 127.0.0.1; 0.0.0.0 = all interfaces)",
    )
    g = p.add_argument_group("run")
    g.add_argument("--run-dir", default="", help="metrics.csv and checkpoint (default runs/<env>/<agent>/<seed>)")
    Flag(LearnerConfig, "resume", "continue from the run directory's checkpoint").add(g)
    Flag(LearnerConfig, "max_steps", "stop after this many learner steps (0: none)").add(g)
    Flag(LearnerConfig, "max_minutes", "stop after this many minutes of training (0: none)").add(g)
    g.add_argument("--device", default="auto", help="cpu, cuda, cuda:N or auto (default)")
    g.add_argument(
        "--tensorboard",
        metavar="DIR",
        default=None,
        help="also write each metrics.csv row to a TensorBoard event file in DIR, to watch the run live "
        "(tensorboard --logdir DIR); metrics.csv stays the record; pip install 'apexrl[tensorboard]'",
    )
    LOG_LEVEL.add(g)
    g = p.add_argument_group("learner settings (default: the preset's)")
    for flag in SETTING_FLAGS:
        flag.add_preset(g)
    g.add_argument(
        "--is-weights",
        choices=IS_WEIGHT_MODES,
        default=None,
        help="IS-weight normalisation (the Ape-X paper does not say which): global_min (divide by the "
        "replay's largest weight) "
        "or batch_max (by the batch's largest); default: the preset's, else global_min",
    )
    Flag(LearnerConfig, "torch_threads", "torch CPU threads").add(g)
    add_curve_arguments(p, binds=True)
    return p


SETTINGS = (*(f.field for f in SETTING_FLAGS), "is_weights")
"""Flags whose default is the preset's."""
OWN = ("device", "torch_threads", "max_minutes", "params_bind", *SETTINGS)
"""LearnerConfig fields `apexrl run --learner-args` may set (the launcher sets the others)."""


def parse_config(argv: Sequence[str] | None = None):
    """(LearnerConfig, parsed flags); exit 2 with the reason on a bad flag or setting."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.tensorboard is not None:
        from apexrl.tensorboard import TensorBoardMissing, check_logdir

        try:
            check_logdir(args.tensorboard)
        except (TensorBoardMissing, ValueError) as e:
            parser.error(str(e))
    try:
        if args.plan is not None:
            return config_from_plan(parser, args, argv), args
        for flag in ("replay", "params_port"):
            if getattr(args, flag) is None:
                parser.error(f"--{flag.replace('_', '-')} is required (or give --plan)")
        preset, agent_config = resolve_agent(args, parser)
        settings = {**preset.learner, **{k: getattr(args, k) for k in SETTINGS if getattr(args, k) is not None}}
        config = LearnerConfig(
            agent=args.agent,
            env=args.env,
            replay=",".join(args.replay),
            params_port=args.params_port,
            params_bind=args.params_bind,
            run_dir=args.run_dir,
            resume=args.resume,
            seed=args.seed,
            agent_config=agent_config,
            max_steps=args.max_steps,
            max_minutes=args.max_minutes,
            device=args.device,
            torch_threads=args.torch_threads,
            extra={"preset": preset.name},
            curve_dir=args.curve_dir,
            insecure=args.insecure,
            tensorboard=args.tensorboard,
            **settings,
        )
    except ValueError as e:
        parser.error(str(e))
    return config, args


def config_from_plan(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str] | None):
    """The learner's config in ``--plan`` (``--resume`` and ``--tensorboard`` added when given)."""
    import dataclasses

    from apexrl.launch.plan import RunPlan

    refuse_beside_plan(parser, argv, "resume", "tensorboard")
    try:
        config = RunPlan.load(args.plan).learner
    except OSError as e:
        parser.error(f"--plan: {e}")
    if args.tensorboard is not None:
        config = dataclasses.replace(config, tensorboard=args.tensorboard)
    return dataclasses.replace(config, resume=True) if args.resume else config


def main(argv: Sequence[str] | None = None) -> int:
    config, args = parse_config(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    from apexrl.apex.checkpoint import CheckpointError
    from apexrl.apex.learner import run_learner

    try:
        summary = run_learner(config)
    except (CheckpointError, ValueError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    if summary["failure"] is not None:
        print(f"{PROG}: error: {summary['failure']}; checkpoint {summary['checkpoint']}", file=sys.stderr, flush=True)
        return 1
    if summary["checkpoint_error"] is not None:  # the last save failed: say what is not in any checkpoint
        kept = summary["checkpoint_step"]
        print(
            f"{PROG}: error: the final checkpoint could not be written to {summary['checkpoint']} "
            f"({summary['checkpoint_error']}); "
            + (
                f"the checkpoint of step {kept} stays valid, steps after it are lost"
                if kept is not None
                else "no checkpoint was written"
            ),
            file=sys.stderr,
            flush=True,
        )
        return 1
    print(f"learner done: {summary['learner_steps']} steps, checkpoint {summary['checkpoint']}", flush=True)
    best = summary["best_eval"]
    if best is not None:
        print(
            f"best periodic evaluation: return {best['mean']:.2f} over {best['episodes']} episodes at learner step "
            f"{best['learner_steps']} -> {summary['best_checkpoint']}",
            flush=True,
        )
    return 0


def entry() -> NoReturn:
    """The console script: :func:`main`, then a fast exit (see :func:`~apexrl.cli.args.exit_process`)."""
    exit_process(main())


if __name__ == "__main__":
    entry()
