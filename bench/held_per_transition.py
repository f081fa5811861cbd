"""Bytes the replay server holds per transition in a real Ape-X DQN run on Atari (frames stored once).

For each game, and for each interpreter given (this tree's and, with --before-python, an older tree's venv),
starts ``apexrl run --preset apex-dqn-atari --env atari:GAME --actors N`` with that interpreter, reads the
replay server's STATS (through that tree's own client) every few seconds until it holds at least --min-size
transitions, records ``bytes_held / size``, and stops the run (SIGINT: the launcher's ordered shutdown).

    python bench/held_per_transition.py --games Pong,Breakout,MsPacman --before-python OLD/.venv/bin/python
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

STATS = (
    "import json, sys\nfrom apexrl.replay.client.replay_client import ReplayClient\n"
    "with ReplayClient(sys.argv[1], timeout=10) as c: print(json.dumps(c.stats()))"
)


def held(python: str, game: str, actors: int, min_size: int, port: int, timeout: float) -> dict:
    with tempfile.TemporaryDirectory() as run_dir:
        cmd = [
            python,
            "-m",
            "apexrl.cli.main",
            "run",
            "--preset",
            "apex-dqn-atari",
            "--env",
            f"atari:{game}",
            "--actors",
            str(actors),
            "--ports",
            str(port),
            "--run-dir",
            run_dir,
            "--quiet",
        ]
        proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        endpoint = f"tcp://127.0.0.1:{port}"
        t0 = time.monotonic()
        last: dict = {}
        try:
            while time.monotonic() - t0 < timeout:
                time.sleep(5)
                if proc.poll() is not None:
                    raise RuntimeError(f"apexrl run exited with {proc.returncode}: {cmd}")
                out = subprocess.run([python, "-c", STATS, endpoint], capture_output=True, text=True)
                if out.returncode != 0:
                    continue  # not up yet
                last = json.loads(out.stdout)
                if last.get("size", 0) >= min_size:
                    break
            else:
                raise RuntimeError(f"{game}: only {last.get('size', 0)} transitions after {timeout:.0f} s")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
                try:
                    proc.wait(120)
                except subprocess.TimeoutExpired:
                    os.killpg(proc.pid, signal.SIGKILL)
                    proc.wait()
        size = int(last["size"])
        return {
            "game": game,
            "python": python,
            "size": size,
            "bytes_held": int(last["bytes_held"]),
            "per_transition": last["bytes_held"] / size,
            "chunks": last.get("chunks"),
            "seconds": time.monotonic() - t0,
        }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--games", default="Pong,Breakout,MsPacman", help="comma-separated Atari games")
    p.add_argument("--actors", type=int, default=2, help="actors per run (default 2)")
    p.add_argument("--min-size", type=int, default=50_000, help="transitions the server must hold (default 50k)")
    p.add_argument(
        "--before-python",
        metavar="PATH",
        default=None,
        help="also run each game with this interpreter (an older tree's venv) and print the ratio",
    )
    p.add_argument("--port", type=int, default=47100, help="base port of the runs (--ports; default 47100)")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per run before giving up (default 900)")
    args = p.parse_args()
    pythons = [("after", sys.executable)] + ([("before", args.before_python)] if args.before_python else [])
    rows = []
    for game in args.games.split(","):
        for side, python in pythons:
            r = held(python, game, args.actors, args.min_size, args.port, args.timeout)
            r["side"] = side
            print(json.dumps(r), flush=True)
            rows.append(r)
    print(
        f"\n## bytes held per transition, apexrl run --preset apex-dqn-atari --actors {args.actors}, "
        f"server STATS once it holds >= {args.min_size:,}\n"
    )
    print("| game | tree | transitions | bytes_held / size | before / after |")
    print("|---|---|---|---|---|")
    for game in args.games.split(","):
        by = {r["side"]: r for r in rows if r["game"] == game}
        for side in ("before", "after"):
            if side in by:
                ratio = (
                    f"{by['before']['per_transition'] / by['after']['per_transition']:.1f}x"
                    if side == "after" and "before" in by
                    else ""
                )
                print(f"| {game} | {side} | {by[side]['size']:,} | {by[side]['per_transition']:.0f} | {ratio} |")


if __name__ == "__main__":
    main()
