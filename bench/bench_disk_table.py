"""A table on disk beside a memory table at the Ape-X mix, over loopback with real processes.

Each window is one ``bench_wire.run_config`` run (a fresh server, prefilled, then 2 inserter processes sending
batches of 50 DPG items, pipelined, and one learner sampling 512 and sending 512 new priorities, for
--seconds), with the server's one table ``default`` in memory, on disk with ``--durability interval``, or on
disk with ``--durability sync``. The three alternate window by window (memory, interval, sync, memory, ...) for
--rounds rounds, so load from elsewhere hits them alike; each disk window logs to a fresh directory under
--dir (default: a temporary directory beside this file, on the disk the tree is on, never a tmpfs).

Reported per mode, as medians over the rounds: inserted/s, sampled/s, the server's CPU per request (µs; and of
it, the serving loop's thread's: where a machine with cores to spare is limited), and
for the disk modes fdatasyncs per second and the ratio of each rate to the memory table's of the same round.

--old-server-python PY (an older tree's interpreter, with its apexrl installed) runs every mode's window a second
time right after, with that tree's server (the clients stay this tree's), and reports new / old per mode, round
by round: how a change to the server moved each mode, interleaved so that load from elsewhere hits both alike.

    python bench/bench_disk_table.py                  # 3 rounds of 20 s windows
    python bench/bench_disk_table.py --quick          # a smoke run, a few seconds a window
    python bench/bench_disk_table.py --modes interval --old-server-python OLD/.venv/bin/python
    python bench/bench_disk_table.py --cache-bytes 0  # every sampled item read from the files, as before the cache
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import bench_wire as W  # noqa: E402 - the wire bench's harness, from this folder

MODES = ("memory", "interval", "sync")


def server_flags(mode: str, directory: str, cache_bytes: int | None = None) -> list[str]:
    if mode == "memory":
        return []
    flags = ["--storage", "disk", "--storage-path", os.path.join(directory, "table"), "--durability", mode]
    return flags + ([] if cache_bytes is None else ["--cache-bytes", str(cache_bytes)])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=20.0)
    p.add_argument("--prefill", type=int, default=20_000, help="items stored before each window (default 20000)")
    p.add_argument("--capacity", type=int, default=2_000_000)
    p.add_argument("--dir", default=None, help="where the disk tables' logs go (default: beside this file)")
    p.add_argument("--quick", action="store_true", help="1 round of 4 s windows, 2000 items prefilled")
    p.add_argument("--json", default=None, help="also write every window's row to this file")
    p.add_argument(
        "--modes",
        nargs="+",
        choices=MODES,
        default=list(MODES),
        help="the modes to run (default all three; the ratios against memory need memory among them)",
    )
    p.add_argument(
        "--cache-bytes",
        type=int,
        default=None,
        help="the disk tables' --cache-bytes (this tree's server only; default: the server's default, 1 GiB)",
    )
    p.add_argument(
        "--old-server-python",
        default=None,
        metavar="PY",
        help="also run each window with this interpreter's server (an older tree) and report new / old",
    )
    args = p.parse_args()
    if args.old_server_python and not os.access(args.old_server_python, os.X_OK):
        p.error(f"--old-server-python {args.old_server_python}: not an executable")
    servers = [("new", None)] + ([("old", args.old_server_python)] if args.old_server_python else [])
    if args.quick:
        args.rounds, args.seconds, args.prefill = 1, 4.0, 2000
    rows: list[dict] = []
    with tempfile.TemporaryDirectory(prefix="bench_disk_", dir=args.dir or HERE) as tmp:
        batches = W.dpg_batches(0)
        payload = os.path.join(tmp, "dpg.npz")
        W.save_batches(payload, batches)
        actor_flags = ["--insert-mode", "pipelined", "--max-in-flight", "16"]
        for r in range(args.rounds):
            for mode in args.modes:
                for tree, python in servers:
                    with tempfile.TemporaryDirectory(prefix=f"{mode}_", dir=tmp) as window_dir:
                        row = W.run_config(
                            "dpg",
                            2,
                            payload,
                            batches,
                            args.capacity,
                            args.prefill,
                            args.seconds,
                            actor_flags,
                            kind="native" if python is None else "old",
                            server_python=python,
                            server_flags=server_flags(mode, window_dir, args.cache_bytes if python is None else None),
                        )
                    row.update(mode=mode, round=r, tree=tree)
                    syncs = row["disk_stats"].get("disk_syncs", 0)
                    row["syncs_per_s"] = syncs / max(row["cpu_window_s"], 1e-9)
                    row["compactions"] = row["disk_stats"].get("disk_compactions", 0)
                    hits = row["disk_stats"].get("disk_cache_hits", 0)
                    row["cache_hit_share"] = hits / max(1, hits + row["disk_stats"].get("disk_cache_misses", 0))
                    row["serve_us_per_request"] = row["server_cpu_us_per_request_by_thread"].get("serve", 0.0)
                    rows.append(row)
                    print(
                        f"round {r} {mode:8s} {tree} inserted/s {row['inserted_per_s']:10,.0f}  sampled/s "
                        f"{row['sampled_per_s']:10,.0f}  server µs/request {row['server_cpu_us_per_request']:7.1f}"
                        f" (serving thread {row['serve_us_per_request']:5.1f})"
                        + (
                            f"  fdatasyncs/s {row['syncs_per_s']:7.1f}  compactions {row['compactions']:g}"
                            f"  cached reads {row['cache_hit_share']:.0%}"
                            if mode != "memory"
                            else ""
                        ),
                        flush=True,
                    )
    print(f"\nmedians over {args.rounds} round(s), {args.seconds:g} s windows, load average {os.getloadavg()[0]:.2f}:")
    by_round = {(row["round"], row["mode"], row["tree"]): row for row in rows}
    for mode in args.modes:
        mine = [row for row in rows if row["mode"] == mode and row["tree"] == "new"]

        def med(field: str, of: list[dict] = mine) -> float:
            return statistics.median(row[field] for row in of)

        line = (
            f"  {mode:8s} inserted/s {med('inserted_per_s'):10,.0f}  sampled/s {med('sampled_per_s'):10,.0f}  "
            f"server µs/request {med('server_cpu_us_per_request'):7.1f} (serving thread {med('serve_us_per_request'):5.1f})"
        )
        if mode != "memory":
            line += f"  fdatasyncs/s {med('syncs_per_s'):7.1f}  cached reads {med('cache_hit_share'):.0%}"
            if "memory" in args.modes:
                line += "  vs memory: " + ratios(mine, by_round, lambda row: (row["round"], "memory", "new"))
        print(line)
        if args.old_server_python:
            print(f"  {mode:8s} new / old: " + ratios(mine, by_round, lambda row: (row["round"], mode, "old")))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


def ratios(rows: list[dict], by_round: dict, other) -> str:
    """Median over rounds of each row's rates and CPU per request divided by those of ``by_round[other(row)]``."""

    def ratio(field: str) -> float:
        return statistics.median(row[field] / by_round[other(row)][field] for row in rows)

    return (
        f"inserts {ratio('inserted_per_s'):.2f}x, samples {ratio('sampled_per_s'):.2f}x, "
        f"server CPU per request {ratio('server_cpu_us_per_request'):.2f}x "
        f"(serving thread {ratio('serve_us_per_request'):.2f}x)"
    )


if __name__ == "__main__":
    main()
