"""``apexrl-actor``: one Ape-X actor process (also ``python -m apexrl.cli.actor``).

Prints one progress line every ``--log-every`` seconds (``actor=I time_s=... episodes=... return_mean10=...``).
SIGTERM/SIGINT: insert the transitions it holds and exit 0.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from apexrl.cli.args import (
    add_agent_arguments,
    float_arg,
    int_arg,
    resolve_agent,
    tcp_endpoint,
)

PROG = "apexrl-actor"


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=PROG,
        description="Ape-X actor: steps its environment with a local copy of the policy and its own "
        "exploration, sends n-step transitions with initial priorities to the replay server, and pulls "
        "new weights from the learner.",
    )
    add_agent_arguments(p)
    g = p.add_argument_group("endpoints")
    g.add_argument("--replay", type=tcp_endpoint, required=True, help="replay server, tcp://HOST:PORT")
    g.add_argument("--params", type=tcp_endpoint, required=True,
                   help="the learner's parameter service, tcp://HOST:PORT")
    g = p.add_argument_group("actor")
    g.add_argument("--index", type=int_arg(0), required=True,
                   help="this actor's index i in [0, N): DQN exploration ε_i = 0.4^(1 + 7·i/(N−1))")
    g.add_argument("--num-actors", type=int_arg(1), required=True, help="N, actors in the run")
    g.add_argument("--flush-every", type=int_arg(1, 100_000), default=None,
                   help="transitions per insert request (default: the preset's, 50)")
    g.add_argument("--params-every-frames", type=int_arg(1), default=None,
                   help="env frames between weight requests (default: the preset's, 400 for the paper presets)")
    g.add_argument("--max-steps", type=int_arg(0), default=0, help="stop after this many agent steps (0: none)")
    g.add_argument("--episodes-csv", default=None, help="append one row per finished episode to this CSV")
    g.add_argument("--wait-for-params", type=float_arg(nonneg=True), default=120.0,
                   help="seconds to wait for the learner's first weights (default 120)")
    g.add_argument("--log-every", type=float_arg(positive=True), default=10.0,
                   help="seconds between progress lines (default 10)")
    g.add_argument("--log-level", choices=["DEBUG", "INFO", "WARNING", "ERROR"], default="INFO",
                   help="logging level (stderr)")
    return p


def parse_config(argv: Sequence[str] | None = None):
    from apexrl.apex.config import ActorConfig

    parser = build_parser()
    args = parser.parse_args(argv)
    if args.index >= args.num_actors:
        parser.error(f"--index {args.index} must be < --num-actors {args.num_actors}")
    preset, agent_config = resolve_agent(args, parser)
    settings = dict(preset.actor)
    for name in ("flush_every", "params_every_frames"):
        if getattr(args, name) is not None:
            settings[name] = getattr(args, name)
    config = ActorConfig(
        agent=args.agent, env=args.env, replay=args.replay, params=args.params, index=args.index,
        num_actors=args.num_actors, seed=args.seed, agent_config=agent_config, max_steps=args.max_steps,
        episodes_csv=args.episodes_csv, wait_for_params=args.wait_for_params, log_every=args.log_every,
        **settings,
    )
    return config, args


def main(argv: Sequence[str] | None = None) -> int:
    config, args = parse_config(argv)
    logging.basicConfig(level=args.log_level, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    from apexrl.apex.actor import run_actor

    try:
        counters = run_actor(config)
    except (ValueError, OSError) as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    print(f"actor {config.index} done: {counters['steps']} steps, {counters['inserted']} inserted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
