"""Why apexrl declares its flags with its own table (``apexrl.cli.flags``) and not a flags library.

For each of argparse with :mod:`apexrl.cli.flags`, jsonargparse, simple-parsing and cyclopts: the import time it
adds to a command that already imports numpy and the server's config (the CPU time of the import, so that a busy
machine changes it little; the median over fresh interpreters), and
what each prints for ``--help`` and does with ``--capacity -5`` when given the table flags' dataclass
(:class:`~apexrl.replay.server.table_flags.TableFlags`, whose fields carry their ranges and choices as
``apexrl.validate`` metadata) the way its documentation shows.

The libraries are not apexrl's dependencies; install them beside it, e.g.::

    pip install --target /tmp/flaglibs jsonargparse simple-parsing cyclopts
    PYTHONPATH=/tmp/flaglibs python bench/compare_flag_libraries.py --runs 7

bench/README.md ("Flags declared once: a library or our own table") has the figures.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys

BASE = "import numpy, apexrl.replay.server.config"
LIBRARIES = {
    "argparse + apexrl.cli.flags": "import argparse, apexrl.cli.flags",
    "jsonargparse": "import jsonargparse",
    "simple-parsing": "import simple_parsing",
    "cyclopts": "import cyclopts",
}

# Each library's CLI for TableFlags, as its documentation builds one from a dataclass; prints --help, then tries
# a capacity the field's range refuses.
CLIS = {
    "argparse + apexrl.cli.flags": """
import argparse
from apexrl.cli.flags import add_flags
from apexrl.cli.server import TABLE_FLAG_DECLS as FLAGS
p = argparse.ArgumentParser(prog="server")
add_flags(p, FLAGS)
p.print_help()
print(p.parse_args(["--capacity", "-5"]))
""",
    "jsonargparse": """
import jsonargparse
from apexrl.replay.server.table_flags import TableFlags
jsonargparse.set_parsing_settings(docstring_parse_attribute_docstrings=True)
p = jsonargparse.ArgumentParser(prog="server")
p.add_class_arguments(TableFlags, "table")
p.print_help()
print(p.parse_args(["--table.capacity", "-5"]))
""",
    "simple-parsing": """
import simple_parsing
from apexrl.replay.server.table_flags import TableFlags
p = simple_parsing.ArgumentParser(prog="server")
p.add_arguments(TableFlags, dest="table")
p.print_help()
print(p.parse_args(["--capacity", "-5"]))
""",
    "cyclopts": """
import cyclopts
from apexrl.replay.server.table_flags import TableFlags
app = cyclopts.App(name="server", result_action="return_value")
@app.default
def main(*, table: TableFlags = TableFlags()):
    return table
app(["--help"])
print(app(["--table.capacity", "-5"]))
""",
}


def import_seconds(statement: str, runs: int) -> float:
    code = f"import time; t = time.process_time(); {statement}; print(time.process_time() - t)"
    return statistics.median(
        float(subprocess.check_output([sys.executable, "-c", code], text=True)) for _ in range(runs)
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=7, help="fresh interpreters per import timing (default 7)")
    parser.add_argument("--help-lines", type=int, default=14, help="lines of each --help shown (default 14)")
    args = parser.parse_args()
    base = import_seconds(BASE, args.runs)
    print(f"{BASE}: {base * 1e3:.0f} ms (median of {args.runs})")
    for name, statement in LIBRARIES.items():
        try:
            added = import_seconds(f"{BASE}; {statement}", args.runs) - base
        except subprocess.CalledProcessError:
            print(f"{name}: not installed")
            continue
        print(f"{name}: +{added * 1e3:.0f} ms")
    for name, code in CLIS.items():
        print(f"\n=== {name}")
        run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
        lines = run.stdout.splitlines()
        print("\n".join(lines[: args.help_lines]), "\n  ...")
        print("--capacity -5:", (lines[-1] if run.returncode == 0 else run.stderr.strip().splitlines()[-1])[:300])


if __name__ == "__main__":
    main()
