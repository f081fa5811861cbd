"""The ``--offline`` run's loader child (``python -m apexrl.cli.loader --plan RUN_DIR/plan.json``; ``apexrl run
--offline`` starts it in place of the actors): inserts the run's Minari dataset into its replay and exits. What it
does is :mod:`apexrl.offline.loader`'s.
"""

from __future__ import annotations

import argparse
import logging
import sys
import threading
from collections.abc import Sequence

from apexrl.cli.args import LOG_LEVEL
from apexrl.offline.loader import load

__all__ = ["main"]


def main(argv: Sequence[str] | None = None) -> int:
    from apexrl.apex.stopping import StopOnSignal
    from apexrl.launch.plan import RunPlan

    parser = argparse.ArgumentParser(
        prog="python -m apexrl.cli.loader",
        description="Insert an --offline run's Minari dataset into its replay "
        "(apexrl run --offline starts it; docs/offline.md).",
    )
    parser.add_argument("--plan", required=True, metavar="PLAN_JSON", help="the run plan `apexrl run` wrote")
    LOG_LEVEL.add(parser)
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=args.log_level, stream=sys.stderr, format="%(asctime)s %(name)s %(levelname)s %(message)s"
    )
    try:
        p = RunPlan.load(args.plan)
    except (OSError, ValueError) as e:
        parser.error(f"--plan: {e}")
    if p.run.offline is None:
        parser.error(f"--plan {args.plan} is not an --offline run")
    stop = threading.Event()
    try:
        with StopOnSignal(stop.set, []):
            inserted = load(p, stop)
    except (ValueError, ImportError) as e:
        print(f"apexrl offline loader: error: {e}", file=sys.stderr, flush=True)
        return 2
    print(f"loader done: {inserted} transitions inserted", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
