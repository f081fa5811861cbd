"""A growing store's inserts: CPU of the inserting thread per item while the store fills fresh memory.

A store that grows copies each new item into memory nobody has touched, and the page faults (the kernel
zeroing each page; in a virtual machine the host backing it) land on the thread that inserts: in a server,
the thread that serves requests. This bench fills a store of --items DPG-sized items (636 bytes, batches of
50, as the Ape-X actors insert) in a fresh process per run and reports, per inserted item:

  thread   CPU of the inserting thread (time.thread_time): what the serving thread would spend
  process  CPU of the whole process (time.process_time): the inserting thread plus any helper threads
  wall     wall time

Each side runs in its own fresh process (fresh memory), the sides alternating run by run (A B A B ...) so
load from elsewhere hits both alike; figures are medians over --runs. Compare two builds of the native core:

    python bench/bench_first_touch.py --items 1000000 --runs 5 \
        --core old=/path/to/old/_core.cpython-311-x86_64-linux-gnu.so --core new=apexrl

`apexrl` names the installed package's core; a path loads that extension file instead (an older build).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys

WORKER = r"""
import importlib.util, json, sys, time
import numpy as np
core_arg, items = sys.argv[1], int(sys.argv[2])
if core_arg == "apexrl":
    from apexrl import _core
else:
    spec = importlib.util.spec_from_file_location("_core", core_arg)
    _core = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(_core)
ITEM, BATCH = 636, 50
store = _core.PrioritizedStore(capacity=items, alpha=0.6, shards=8, eviction="fifo", seed=0)
rng = np.random.default_rng(0)
pool = rng.integers(0, 256, size=(4096, ITEM), dtype=np.uint8)
offsets = np.arange(BATCH + 1, dtype=np.uint64) * ITEM
priorities = rng.random(BATCH) + 1e-3
t0, p0, w0 = time.thread_time(), time.process_time(), time.perf_counter()
for i in range(items // BATCH):
    start = (i * BATCH) % (len(pool) - BATCH)
    store.insert(priorities, pool[start : start + BATCH].reshape(-1), offsets)
t1, p1, w1 = time.thread_time(), time.process_time(), time.perf_counter()
n = items // BATCH * BATCH
print(json.dumps({"thread_us": (t1 - t0) / n * 1e6, "process_us": (p1 - p0) / n * 1e6, "wall_us": (w1 - w0) / n * 1e6}))
"""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--items", type=int, default=1_000_000, help="items each run inserts (default 1,000,000)")
    ap.add_argument("--runs", type=int, default=5, help="fresh processes per side (default 5)")
    ap.add_argument(
        "--core",
        action="append",
        metavar="NAME=CORE",
        help="a side: NAME=apexrl (the installed core) or NAME=PATH of a _core extension file; repeatable "
        "(default: new=apexrl)",
    )
    args = ap.parse_args()
    sides = [c.split("=", 1) for c in (args.core or ["new=apexrl"])]
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in sides}
    for run in range(args.runs):
        for name, core in sides:
            out = subprocess.run(
                [sys.executable, "-c", WORKER, core, str(args.items)], check=True, capture_output=True, text=True
            ).stdout
            results[name].append(json.loads(out))
            print(f"run {run} {name}: {results[name][-1]}", file=sys.stderr)
    print("| side | thread µs/item | process µs/item | wall µs/item | runs |\n|---|---:|---:|---:|---:|")
    for name, rows in results.items():
        med = {k: statistics.median(r[k] for r in rows) for k in ("thread_us", "process_us", "wall_us")}
        print(f"| {name} | {med['thread_us']:.2f} | {med['process_us']:.2f} | {med['wall_us']:.2f} | {len(rows)} |")
    if len(sides) == 2:
        (a, ra), (b, rb) = [(n, results[n]) for n, _ in sides]
        ratios = [y["thread_us"] / x["thread_us"] for x, y in zip(ra, rb)]
        print(f"\nthread µs/item {b}/{a}, run by run: " + ", ".join(f"{r:.2f}" for r in ratios))


if __name__ == "__main__":
    main()
