"""Bytes the replay server holds per n-step transition: today's items (NStepTransitionAdder: ``obs`` and
``next_obs`` copied into every item) against items that reference the steps they span (Reverb's
``TrajectoryWriter.history`` way: every step appended once through a trajectory writer, each transition an item
of its ``n + 1`` steps with the n-step return and discount as per-item extras), on DMC layouts. The
Atari layout is not here: its frames are already stored once (bench/held_per_transition.py).

Random float observations and actions (they do not compress, like real proprioceptive states); episodes of
``--episode`` steps. Reads the server's ``bytes_held`` (items) and ``chunk_bytes`` (steps) after ``--steps``
steps (``bytes_held`` counts every step chunk once, ``chunk_bytes`` is that part) divided by the items held.
From the repository root::

    python bench/nstep_storage.py                       # cheetah-run and humanoid-run layouts, n = 3 and 5
"""

from __future__ import annotations

import argparse

import numpy as np

from apexrl.replay import NStepTransitionAdder, ReplayClient, ReplayServer, ServerConfig, TableConfig
from apexrl.replay.adders.transition import nstep_return

LAYOUTS = {"dmc:cheetah-run": (17, 6), "dmc:humanoid-run": (67, 21)}


def today(client: ReplayClient, table: str, obs: np.ndarray, act: np.ndarray, n: int, episode: int) -> None:
    adder = NStepTransitionAdder(client, table, n, 0.99, insert_batch=64)
    for start in range(0, len(act), episode):
        adder.add_first(obs[start])
        for t in range(start, min(start + episode, len(act))):
            adder.add(act[t], 1.0, obs[t + 1], False, t == min(start + episode, len(act)) - 1)
    adder.close()


def referencing(client: ReplayClient, table: str, obs: np.ndarray, act: np.ndarray, n: int, episode: int) -> None:
    """Steps once; item t = steps t .. t+m (m <= n) with R and D as extras: what a history-based adder stores."""
    with client.writer(max_sequence_length=n + 1, flush_items=64) as w:
        for start in range(0, len(act), episode):
            end = min(start + episode, len(act))
            rewards = [1.0] * (end - start)
            for t in range(start, end + 1):  # the episode's last observation is a step of its own
                last = t == end
                w.append({"obs": obs[t], "action": np.zeros_like(act[0]) if last else act[t],
                          "reward": np.float32(0.0 if last else 1.0), "discount": np.float32(0.0 if last else 1.0)})  # fmt: skip
                first = t - n  # the transition whose horizon ends here (mid-episode), else the pending ones
                starts = [first] if not last and first >= start else []
                if last:
                    starts = list(range(max(start, t - n), t))
                for s in starts:
                    m = t - s
                    r, d = nstep_return(rewards[s - start : s - start + m], [1.0] * m, 0.99)
                    extras = {"R": np.float32(r), "D": np.float32(d)}
                    w.create_item(table, t - s + 1, None, extras=extras)
            w.end_episode()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=20_000)
    p.add_argument("--episode", type=int, default=1000)
    p.add_argument("--ns", nargs="+", type=int, default=[3, 5])
    args = p.parse_args()
    rng = np.random.default_rng(0)
    rows = []
    tables = [TableConfig(f"t{i}", capacity=10 * args.steps) for i in range(2 * len(LAYOUTS) * len(args.ns))]
    with ReplayServer(ServerConfig(port=0, tables=tables)) as server, ReplayClient(server.endpoint) as client:
        i = 0
        for layout, (obs_dim, act_dim) in LAYOUTS.items():
            obs = rng.normal(size=(args.steps + 1, obs_dim)).astype(np.float32)
            act = rng.uniform(-1, 1, size=(args.steps, act_dim)).astype(np.float32)
            for n in args.ns:
                for way, fn in (("today (copies)", today), ("referencing steps", referencing)):
                    table = f"t{i}"
                    i += 1
                    fn(client, table, obs, act, n, args.episode)
                    info = client.tables()[table]
                    per = info["bytes_held"] / info["size"]  # bytes_held counts each chunk once
                    rows.append((layout, n, way, info["size"], info["bytes_held"], info["chunk_bytes"], per))
    print("| layout | n | items | transitions | bytes_held | of which step chunks | bytes held / transition |")
    print("|---|---|---|---|---|---|---|")
    for layout, n, way, size, held, chunks, per in rows:
        print(f"| {layout} | {n} | {way} | {size:,} | {held:,} | {chunks:,} | {per:.0f} |")


if __name__ == "__main__":
    main()
