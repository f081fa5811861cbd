"""Where two threads on one store lose their rates: the store they share, or the machine.

`bench_store.py`'s "2 threads" columns run an inserting thread (batches of 50) beside a learner thread
(sample 512 + update 512) on one store and report each rate as a fraction of the same loop alone. This script
takes that fraction apart, in one process, with every arrangement timed in alternating windows (so load from
elsewhere hits them all alike) and each figure the median over --rounds:

  shared store     the inserter and the learner thread on the same store (bench_store.py's arrangement)
  separate stores  the inserter on a second store of the same size: no shard lock, tree line or counter is
                   shared, only the interpreter, the memory system and the cores
  beside a sort    the learner thread beside a thread sorting a numpy array (which releases the GIL): what
                   a second busy core costs the learner thread by itself

The loss the shared store adds is "separate" minus "shared"; what is left below 1.0 in "separate" is the
interpreter (both loops run Python between the native calls) and the memory system. Run from the repository
root after `pip install '.[bench]'`:

    python bench/bench_store_threads.py                  # 2M items per store, 5 rounds of 2 s windows
    python bench/bench_store_threads.py --items 200000 --seconds 0.5 --rounds 2    # quick look
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from collections.abc import Callable

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_store import SAMPLE_BATCH, ApexrlAdapter, timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2_000_000, help="items in each store (default 2M)")
    parser.add_argument("--seconds", type=float, default=2.0, help="length of one timing window (default 2)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of alternating windows (default 5)")
    args = parser.parse_args()
    if args.items < 10 * SAMPLE_BATCH:
        parser.error(f"--items must be at least {10 * SAMPLE_BATCH}")
    if args.seconds <= 0 or args.rounds < 1:
        parser.error("--seconds must be > 0 and --rounds >= 1")

    first, second = ApexrlAdapter(args.items, 1), ApexrlAdapter(args.items, 2)
    first.fill(args.items)
    second.fill(args.items)
    sortable = np.random.default_rng(0).random(1 << 20)

    def learner(store: ApexrlAdapter) -> Callable[[], int]:
        def step() -> int:
            n = store.sample()
            store.update()
            return n

        return step

    def sort() -> int:
        np.sort(sortable)
        return 0

    arrangements: dict[str, list[Callable[[], int]]] = {
        "insert alone": [first.insert],
        "learner alone": [learner(first)],
        "shared store": [first.insert, learner(first)],
        "separate stores": [second.insert, learner(first)],
        "beside a sort": [sort, learner(first)],
    }
    rates: dict[str, list[list[float]]] = {name: [] for name in arrangements}
    for _ in range(args.rounds):
        for name, loops in arrangements.items():
            rates[name].append(timed(loops, args.seconds))
    med = {name: [statistics.median(r[i] for r in rs) for i in range(len(rs[0]))] for name, rs in rates.items()}
    alone_insert, alone_learner = med["insert alone"][0], med["learner alone"][0]
    print(f"{args.items:,} items per store; median of {args.rounds} rounds of {args.seconds:g} s windows\n")
    print("| arrangement | inserter kept | learner thread kept |")
    print("|---|---|---|")
    for name in ("shared store", "separate stores"):
        ins, learn = med[name]
        print(f"| {name} | {ins / alone_insert:.2f} | {learn / alone_learner:.2f} |")
    print(f"| beside a sort | - | {med['beside a sort'][1] / alone_learner:.2f} |")
    print(f"\nalone: insert {alone_insert / 1e6:.2f} M items/s, learner thread {alone_learner / 1e6:.2f} M sampled/s")


if __name__ == "__main__":
    main()
