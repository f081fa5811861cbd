"""``apexrl-actor``: one Ape-X actor process (also ``python -m apexrl.cli.actor``).

Prints one progress line every ``--log-every`` seconds (``actor=I time_s=... episodes=... return_mean10=...``).
SIGTERM/SIGINT: insert the transitions it holds and exit 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import NoReturn

from apexrl.apex.config import ActorConfig
from apexrl.cli.args import (
    LOG_LEVEL,
    RECORD_DATASET,
    REPLAY,
    add_agent_arguments,
    add_curve_arguments,
    exit_process,
    refuse_beside_plan,
    resolve_agent,
    tcp_endpoint,
)
from apexrl.cli.flags import Flag

PROG = "apexrl-actor"

ENVS_PER_ACTOR = Flag(
    ActorConfig,
    "envs_per_actor",
    "environments each actor steps in lockstep with one batched forward pass, each with its own n-step buffer, "
    "seed and exploration: environment j of actor i explores as slot i*K + j of the run's N*K (the exploration "
    "ladder runs over every environment of the run)",
    metavar="K",
)
"""``--envs-per-actor`` of the actor and of ``apexrl run``."""

SETTING_FLAGS = (
    ENVS_PER_ACTOR,
    Flag(
        ActorConfig,
        "flush_every",
        "B, transitions per environment per insert request: with K environments the actor inserts every B steps, "
        "B*K transitions",
    ),
    Flag(
        ActorConfig,
        "insert_max",
        "most transitions in one insert request; a larger flush goes in several (0: the whole flush in one; "
        "apexrl run sets it where the replay's rate limiter needs smaller requests)",
    ),
    Flag(
        ActorConfig,
        "inserts_in_flight",
        "most insert requests left unanswered while the actor steps on; each batch is held until the server "
        "stored it and resent with its own insert id after a reconnect or a rate-limiter refusal (exactly-once); "
        "1: every insert waits for its reply",
        metavar="N",
    ),
    Flag(ActorConfig, "params_every_frames", "env frames between weight requests"),
)
"""The actor settings whose default is the preset's."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Ape-X actor: steps its environment with a local copy of the policy and its own "
        "exploration, sends n-step transitions with initial priorities to the replay server, and pulls "
        "new weights from the learner.",
    )
    add_agent_arguments(p)
    g = p.add_argument_group("endpoints")
    g.add_argument(
        "--plan",
        metavar="PLAN_JSON",
        default=None,
        help="take every setting of actor --index from a run plan written by `apexrl run` (then only "
        "--index and --log-level may be given besides)",
    )
    REPLAY.add(g)
    g.add_argument("--params", type=tcp_endpoint, help="the learner's parameter service, tcp://HOST:PORT (required)")
    g = p.add_argument_group("actor")
    Flag(ActorConfig, "index", "this actor's index i in [0, N): DQN exploration ε_i = 0.4^(1 + 7·i/(N−1))").add(
        g, default=None, shown="required"
    )
    Flag(ActorConfig, "num_actors", "N, actors in the run").add(g, default=None, shown="required")
    for flag in SETTING_FLAGS:
        flag.add_preset(g)
    Flag(ActorConfig, "max_steps", "stop after this many agent steps (0: none)").add(g)
    g.add_argument("--episodes-csv", default=None, help="append one row per finished episode to this CSV")
    RECORD_DATASET.add(g)
    Flag(ActorConfig, "wait_for_params", "seconds to wait for the learner's first weights").add(g)
    Flag(ActorConfig, "log_every", "seconds between progress lines").add(g)
    LOG_LEVEL.add(g)
    add_curve_arguments(p, binds=False)
    return p


SETTINGS = tuple(flag.field for flag in SETTING_FLAGS)
"""Flags whose default is the preset's."""
OWN = ("max_steps", "wait_for_params", "flush_every", "params_every_frames", "insert_max", "inserts_in_flight")
"""ActorConfig fields `apexrl run --actor-args` may set (the launcher sets the others)."""


def parse_config(argv: Sequence[str] | None = None):
    """(ActorConfig, parsed flags); exit 2 with the reason on a bad flag or setting."""
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.plan is not None:
            return config_from_plan(parser, args, argv), args
        for flag in ("replay", "params", "index", "num_actors"):
            if getattr(args, flag) is None:
                parser.error(f"--{flag.replace('_', '-')} is required (or give --plan)")
        preset, agent_config = resolve_agent(args, parser)
        if args.record_dataset is not None:
            from apexrl.offline import require_minari

            try:
                require_minari()
            except ImportError as e:
                parser.error(f"--record-dataset: {e}")
        settings = {**preset.actor, **{k: getattr(args, k) for k in SETTINGS if getattr(args, k) is not None}}
        config = ActorConfig(
            agent=args.agent,
            env=args.env,
            replay=",".join(args.replay),
            params=args.params,
            index=args.index,
            num_actors=args.num_actors,
            seed=args.seed,
            agent_config=agent_config,
            max_steps=args.max_steps,
            episodes_csv=args.episodes_csv,
            wait_for_params=args.wait_for_params,
            log_every=args.log_every,
            curve_dir=args.curve_dir,
            record_dataset=args.record_dataset,
            **settings,
        )
    except ValueError as e:
        parser.error(str(e))
    return config, args


def config_from_plan(parser: argparse.ArgumentParser, args: argparse.Namespace, argv: Sequence[str] | None):
    """Actor ``--index``'s config in ``--plan``."""
    from apexrl.launch.plan import RunPlan

    refuse_beside_plan(parser, argv, "index")
    if args.index is None:
        parser.error("--plan needs --index")
    try:
        actors = RunPlan.load(args.plan).actors
    except OSError as e:
        parser.error(f"--plan: {e}")
    if args.index >= len(actors):
        parser.error(f"--index {args.index}: the plan has {len(actors)} actors")
    return actors[args.index]


def run_actor(config: ActorConfig) -> dict[str, int]:
    """Build the agent's actor (:class:`~apexrl.apex.actor.Actor`; the agent's replay path says what it writes),
    stop it on SIGTERM/SIGINT (after inserting what it holds), return counters."""
    from apexrl.apex.actor import Actor
    from apexrl.apex.stopping import StopOnSignal

    actor = Actor(config)
    try:
        with StopOnSignal(actor.stop, [actor.replay.interrupt, actor.params.transport.interrupt]):
            return actor.run()
    finally:
        actor.close()


def main(argv: Sequence[str] | None = None) -> int:
    config, args = parse_config(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        counters = run_actor(config)
    except (ValueError, OSError, ImportError) as exc:  # ImportError: --record-dataset without Minari
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(
        f"actor {config.index} done: {counters['steps']} steps, {counters['inserted']} inserted, "
        f"{counters['not_inserted']} not inserted",
        flush=True,
    )
    return 0


def entry() -> NoReturn:
    """The console script: :func:`main`, then a fast exit (see :func:`~apexrl.cli.args.exit_process`)."""
    exit_process(main())


if __name__ == "__main__":
    entry()
