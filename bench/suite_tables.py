"""One table of every ``apexrl bench-suite`` output committed under ``bench/curves/`` (each ``*/suite.csv``):
the rows of all presets and tasks together, in the suite's own Markdown format. From the repository root::

    python bench/suite_tables.py                 # all of them
    python bench/suite_tables.py --glob 'apex-*-cartpole-swingup'
"""

from __future__ import annotations

import argparse
import csv
import glob
import math
import os

from apexrl.suite import markdown_table

TEXT = ("task", "agent", "preset", "run_dir")


def read_rows(pattern: str) -> list[dict]:
    rows = []
    for path in sorted(glob.glob(os.path.join(pattern, "suite.csv"))):
        with open(path, newline="", encoding="utf-8") as f:
            for r in csv.DictReader(f):
                rows.append({k: v if k in TEXT else (float(v) if v else math.nan) for k, v in r.items()})
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--glob", default="*", help="suite directories under bench/curves (default: all)")
    args = p.parse_args()
    rows = read_rows(os.path.join(os.path.dirname(os.path.abspath(__file__)), "curves", args.glob))
    if not rows:
        raise SystemExit(f"no suite.csv under bench/curves/{args.glob}")
    print(markdown_table(rows))


if __name__ == "__main__":
    main()
