"""One table of every ``apexrl bench-suite`` output committed under ``bench/curves/`` (each ``*/suite.csv``):
the rows of all presets and tasks together, in the suite's own Markdown format with a first column naming the
suite directory. Each directory keeps its own rows: two suites of one preset and task (say, run on machines of
different speeds) are never averaged together. From the repository root::

    python bench/suite_tables.py                 # all of them
    python bench/suite_tables.py --glob 'apex-*-cartpole-swingup'
"""

from __future__ import annotations

import argparse
import csv
import glob
import math
import os

from apexrl.suite import PAPER_NOTE, SUITE_TABLE_HEADER, SUITE_TABLE_RULE, markdown_rows

TEXT = ("task", "agent", "preset", "run_dir")


def read_rows(pattern: str) -> dict[str, list[dict]]:
    """Suite directory name -> its suite.csv rows."""
    suites = {}
    for path in sorted(glob.glob(os.path.join(pattern, "suite.csv")), key=os.path.dirname):
        with open(path, newline="", encoding="utf-8") as f:
            suites[os.path.basename(os.path.dirname(path))] = [
                {k: v if k in TEXT else (float(v) if v else math.nan) for k, v in r.items()} for r in csv.DictReader(f)
            ]
    return suites


def combined_table(suites: dict[str, list[dict]]) -> str:
    """One Markdown table: each suite's own rows (grouped within that suite alone), a first column naming it."""
    body = [f"| {name} {line}" for name, rows in suites.items() for line in markdown_rows(rows)]
    return (
        "\n".join([f"| suite (bench/curves/) {SUITE_TABLE_HEADER}", f"|---{SUITE_TABLE_RULE}", *body])
        + "\n\n"
        + PAPER_NOTE
        + "\n"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--glob", default="*", help="suite directories under bench/curves (default: all)")
    args = p.parse_args()
    suites = read_rows(os.path.join(os.path.dirname(os.path.abspath(__file__)), "curves", args.glob))
    if not suites:
        raise SystemExit(f"no suite.csv under bench/curves/{args.glob}")
    print(combined_table(suites), end="")


if __name__ == "__main__":
    main()
