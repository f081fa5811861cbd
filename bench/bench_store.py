"""In-process throughput of the replay store against cpprb and TorchRL, on DPG-humanoid-shaped items.

Each library fills its store in a process of its own (clean resident-memory figures, no shared allocator
state); then the timing windows alternate between the libraries (A B A B ...), so load from elsewhere on a
shared machine hits all of them alike, and each figure is the median of its windows. Run from the repository
root after `pip install '.[bench]'`:

    python bench/bench_store.py                      # 2M items, all libraries, markdown table
    python bench/bench_store.py --items 200000 --seconds 1 --only apexrl    # quick look
    python bench/bench_store.py --baseline /path/to/old-venv/bin/python      # before/after a change
    python bench/bench_store.py --snapshot-stall     # longest sample() call while save() writes a 150 MB store

Besides the prioritized store (the Ape-X table, row "apexrl"), two more apexrl rows: "apexrl-uniform" (a uniform
table: sampler="uniform", no sum tree) and "apexrl-fifo-queue" (a queue: sampler="fifo", max_times_sampled=1),
each also as a ratio to the prioritized row (and to the baseline's prioritized row with --baseline).
A queue's sample removes what it returns, so its "sample 512" pushes 512 items (one insert call) and then pops
512, keeping the queue at --items items; its updates address popped (stale) keys. With --baseline, an older
apexrl without samplers skips these two rows.

Operations (the replay workloads of the Ape-X paper):
  insert      batches of 50 items into a store already holding --items items
  sample      512 items with keys, IS weights and the item bytes in hand (beta 0.4)
  update      512 priorities of keys from a sample (cycling through 256 sampled key sets)
  learner     one mixed learner step: insert 50, sample 512, update 512 (+ remove_to_fit every 100 steps)
  2 threads   one thread inserting batches of 50, one sampling 512 + updating 512, at once; each rate is
              reported as a fraction of the same operation measured alone
  memory      resident set growth while filling --items items, divided by their raw bytes
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

# DPG humanoid transition: obs 67 f32, action 21 f32, reward f32, discount f32,
# next obs 67 f32 = 628 bytes; the store issue sizes items at 636 bytes (apexrl.replay.wire.codec's DPG item is 632).
OBS, ACT = 67, 21
ITEM_BYTES = 636
INSERT_BATCH, SAMPLE_BATCH = 50, 512
ALPHA, BETA = 0.6, 0.4
UPDATE_SETS = 256  # distinct sampled key sets the update benchmark cycles through


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def rate(fn: Callable[[], int], seconds: float) -> float:
    """Units fn returned per second, calling it for `seconds`."""
    done = 0
    start = time.perf_counter()
    deadline = start + seconds
    while True:
        done += fn()
        now = time.perf_counter()
        if now >= deadline:
            return done / (now - start)


class Adapter:
    """The operations the bench times, for one library. Subclasses fill the store, insert, sample (keeping the
    sampled keys in `self.keys`) and write priorities for given keys (`_update`); `fill` also keeps
    UPDATE_SETS sampled key sets in `self.key_sets`."""

    name = ""
    keys = None
    key_sets: list = []  # noqa: RUF012 - a placeholder; every fill() assigns its own list
    new_priorities = None

    def fill(self, n: int) -> None: ...
    def insert(self) -> int: ...
    def sample(self) -> int: ...
    def _update(self, keys) -> None: ...

    def update(self) -> int:
        """Priorities for the keys of the latest sample (what the learner does)."""
        self._update(self.keys)
        return SAMPLE_BATCH

    def update_spread(self) -> int:
        """Priorities for the next of many sampled key sets, so the same 512 slots are not timed hot."""
        self.cursor_u = (getattr(self, "cursor_u", 0) + 1) % UPDATE_SETS
        self._update(self.key_sets[self.cursor_u])
        return SAMPLE_BATCH

    def learner_step(self) -> int:
        self.insert()
        self.sample()
        self.update()
        return 1


class ApexrlAdapter(Adapter):
    name = "apexrl"
    sampler_args: dict = {}  # noqa: RUF012 - read only; the sampler rows below set their own

    def __init__(self, capacity: int, seed: int):
        from apexrl import PrioritizedStore

        self.store = PrioritizedStore(
            capacity=capacity, alpha=ALPHA, shards=8, eviction="fifo", seed=seed, **self.sampler_args
        )
        self.rng = np.random.default_rng(seed)
        # A pool of distinct items, inserted as one contiguous buffer + offsets (the form the server receives).
        self.pool = self.rng.integers(0, 256, size=(4096, ITEM_BYTES), dtype=np.uint8)
        self.offsets = np.arange(INSERT_BATCH + 1, dtype=np.uint64) * ITEM_BYTES
        self.priorities = self.rng.random(INSERT_BATCH) + 1e-3
        self.cursor = 0
        self.keys = None
        self.steps = 0

    def _insert_batch(self) -> None:
        start = self.cursor % (len(self.pool) - INSERT_BATCH)
        self.cursor += INSERT_BATCH
        self.store.insert(self.priorities, self.pool[start : start + INSERT_BATCH].reshape(-1), self.offsets)

    def fill(self, n: int) -> None:
        for _ in range(n // INSERT_BATCH):
            self._insert_batch()
        # update 512 cycles through many sampled key sets, so it is not timing the same cache-hot 512 slots.
        self.key_sets = [self.store.sample(SAMPLE_BATCH, BETA).keys.copy() for _ in range(UPDATE_SETS)]
        self.new_priorities = self.rng.random(SAMPLE_BATCH) + 1e-3
        self.keys = self.key_sets[0]

    def insert(self) -> int:
        self._insert_batch()
        self.steps += 1
        if self.steps % 100 == 0:
            self.store.remove_to_fit()
        return INSERT_BATCH

    def sample(self) -> int:
        batch = self.store.sample(SAMPLE_BATCH, BETA)
        self.keys = batch.keys
        return len(batch.data) and SAMPLE_BATCH

    def _update(self, keys) -> None:
        self.store.update_priorities(keys, self.new_priorities)


class ApexrlUniformAdapter(ApexrlAdapter):
    """A uniform table: draws with replacement, every item equally likely, no sum tree."""

    name = "apexrl-uniform"
    sampler_args = {"sampler": "uniform"}  # noqa: RUF012


class ApexrlQueueAdapter(ApexrlAdapter):
    """A FIFO queue (max_times_sampled 1): each sample pops what it returns, so it pushes as many first."""

    name = "apexrl-fifo-queue"
    sampler_args = {"sampler": "fifo", "max_times_sampled": 1}  # noqa: RUF012

    def fill(self, n: int) -> None:
        for _ in range(n // INSERT_BATCH):
            self._insert_batch()
        self.key_sets = []  # of popped items: the updates address stale keys
        for _ in range(UPDATE_SETS):
            self.sample()
            self.key_sets.append(self.keys.copy())
        self.new_priorities = self.rng.random(SAMPLE_BATCH) + 1e-3
        self.keys = self.key_sets[0]

    def sample(self) -> int:
        start = self.cursor % (len(self.pool) - SAMPLE_BATCH)
        self.cursor += SAMPLE_BATCH
        self.store.insert(
            np.ones(SAMPLE_BATCH),
            self.pool[start : start + SAMPLE_BATCH].reshape(-1),
            np.arange(SAMPLE_BATCH + 1, dtype=np.uint64) * ITEM_BYTES,
        )
        # Fewer than 512 only when remove_to_fit (the 2-thread inserter's) evicted planned items meanwhile.
        batch = self.store.sample(SAMPLE_BATCH, BETA)
        self.keys = batch.keys
        return len(batch)

    def _update(self, keys) -> None:
        self.store.update_priorities(keys, self.new_priorities[: len(keys)])


class CpprbAdapter(Adapter):
    name = "cpprb"

    def __init__(self, capacity: int, seed: int):
        from cpprb import PrioritizedReplayBuffer

        env_dict = {
            "obs": {"shape": OBS, "dtype": np.float32},
            "act": {"shape": ACT, "dtype": np.float32},
            "rew": {"dtype": np.float32},
            "discount": {"dtype": np.float32},
            "next_obs": {"shape": OBS, "dtype": np.float32},
        }
        self.rb = PrioritizedReplayBuffer(capacity, env_dict, alpha=ALPHA)
        rng = np.random.default_rng(seed)
        self.rng = rng
        self.batch = {
            "obs": rng.random((INSERT_BATCH, OBS), dtype=np.float32),
            "act": rng.random((INSERT_BATCH, ACT), dtype=np.float32),
            "rew": rng.random(INSERT_BATCH, dtype=np.float32),
            "discount": rng.random(INSERT_BATCH, dtype=np.float32),
            "next_obs": rng.random((INSERT_BATCH, OBS), dtype=np.float32),
        }
        self.priorities = rng.random(INSERT_BATCH) + 1e-3

    def fill(self, n: int) -> None:
        for _ in range(n // INSERT_BATCH):
            self.rb.add(**self.batch, priorities=self.priorities)
        self.key_sets = [self.rb.sample(SAMPLE_BATCH, beta=BETA)["indexes"].copy() for _ in range(UPDATE_SETS)]
        self.keys = self.key_sets[0]
        self.new_priorities = self.rng.random(SAMPLE_BATCH) + 1e-3

    def insert(self) -> int:
        self.rb.add(**self.batch, priorities=self.priorities)
        return INSERT_BATCH

    def sample(self) -> int:
        s = self.rb.sample(SAMPLE_BATCH, beta=BETA)
        self.keys = s["indexes"]
        return SAMPLE_BATCH

    def _update(self, keys) -> None:
        self.rb.update_priorities(keys, self.new_priorities)


class TorchRLAdapter(Adapter):
    name = "torchrl"

    def __init__(self, capacity: int, seed: int):
        import torch
        from tensordict import TensorDict
        from torchrl.data import LazyTensorStorage, PrioritizedReplayBuffer

        torch.manual_seed(seed)
        self.torch = torch
        self.rb = PrioritizedReplayBuffer(
            alpha=ALPHA, beta=BETA, storage=LazyTensorStorage(capacity), batch_size=SAMPLE_BATCH
        )
        self.batch = TensorDict(
            {
                "obs": torch.rand(INSERT_BATCH, OBS),
                "act": torch.rand(INSERT_BATCH, ACT),
                "rew": torch.rand(INSERT_BATCH),
                "discount": torch.rand(INSERT_BATCH),
                "next_obs": torch.rand(INSERT_BATCH, OBS),
            },
            batch_size=[INSERT_BATCH],
        )
        self.priorities = torch.rand(INSERT_BATCH) + 1e-3

    def fill(self, n: int) -> None:
        for _ in range(n // INSERT_BATCH):
            self.insert()
        self.key_sets = []
        for _ in range(UPDATE_SETS):
            self.sample()
            self.key_sets.append(self.keys)
        self.new_priorities = self.torch.rand(SAMPLE_BATCH) + 1e-3

    def insert(self) -> int:
        idx = self.rb.extend(self.batch)
        self.rb.update_priority(idx, self.priorities)
        return INSERT_BATCH

    def sample(self) -> int:
        _, info = self.rb.sample(return_info=True)
        self.keys = info["index"]
        return SAMPLE_BATCH

    def _update(self, keys) -> None:
        self.rb.update_priority(keys, self.new_priorities)


ADAPTERS = {
    "apexrl": ApexrlAdapter,
    "apexrl-uniform": ApexrlUniformAdapter,
    "apexrl-fifo-queue": ApexrlQueueAdapter,
    "cpprb": CpprbAdapter,
    "torchrl": TorchRLAdapter,
}


def timed(loops: list[Callable[[], int]], seconds: float) -> list[float]:
    """Runs each loop body in a thread of its own, all at once, for `seconds`; returns each one's items/s."""
    stop = threading.Event()
    counts = [0] * len(loops)

    def run(i: int) -> None:
        body = loops[i]
        while not stop.is_set():
            counts[i] += body()

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(loops))]
    start = time.perf_counter()
    for t in threads:
        t.start()
    time.sleep(seconds)
    stop.set()
    for t in threads:
        t.join()
    elapsed = time.perf_counter() - start
    return [c / elapsed for c in counts]


def two_threads(adapter: Adapter, seconds: float) -> tuple[float, float]:
    """Inserter and sampler+updater running at once; returns (inserted/s, sampled/s)."""

    def learner() -> int:
        n = adapter.sample()
        adapter.update()
        return n

    inserted, sampled = timed([adapter.insert, learner], seconds)
    return inserted, sampled


OPS = {  # operation -> adapter method; "sample_update" is the 2-thread sampler's loop, timed alone
    "sample": "sample",
    "update": "update_spread",
    "insert": "insert",
    "learner": "learner_step",
    "sample_update": "sample_and_update",
}


def reply(obj: dict) -> None:
    print(json.dumps(obj), flush=True)


def worker(name: str, items: int, seed: int) -> None:
    """Fills one library's store, reports memory, then times whatever the parent asks for on stdin."""
    gc.collect()
    rss0 = rss_bytes()
    adapter = ADAPTERS[name](items, seed)
    t0 = time.perf_counter()
    adapter.fill(items)
    fill_s = time.perf_counter() - t0
    rss1 = rss_bytes()
    reply({"fill_s": fill_s, "memory_ratio": (rss1 - rss0) / (items * ITEM_BYTES), "rss_mb": rss1 / 2**20})
    adapter.sample_and_update = lambda: adapter.sample() + 0 * adapter.update()
    for line in sys.stdin:
        op, seconds = line.split()
        if op == "two_threads":
            inserted, sampled = two_threads(adapter, float(seconds))
            reply({"mt_insert": inserted, "mt_sample": sampled})
        else:
            reply({"rate": rate(getattr(adapter, OPS[op]), float(seconds))})


class Worker:
    """A running `--worker` process for one library."""

    def __init__(self, name: str, args: argparse.Namespace, python: str = sys.executable, label: str = ""):
        self.name = label or name
        cmd = [python, __file__, "--worker", name, "--items", str(args.items), "--seed", str(args.seed)]
        # One BLAS/OpenMP thread per worker: idle workers' pools otherwise spin on the cores another worker's
        # timing window is using (measured: it halved the sample+update figure of whoever ran next).
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env
        )

    def read(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            self.proc.wait()
            last = (self.proc.stderr.read().strip().splitlines() or ["(no output)"])[-1]
            raise RuntimeError(last)
        return json.loads(line)

    def ask(self, op: str, seconds: float) -> dict:
        self.proc.stdin.write(f"{op} {seconds}\n")
        self.proc.stdin.flush()
        return self.read()

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait()


def snapshot_stall(megabytes: int = 150, shards: int = 8) -> None:
    """The longest sample(32) call while save() writes the store, against the same figure with no save running.

    Before, save() held each shard's lock while writing that shard to disk (an eighth of the file); now it
    holds it only to copy the shard's block into memory. Three alternating runs of each on the shared 2-core
    box (load average 7 to 8, so single maxima are noisy), longest sample(32) during a save:
      this script:                      before 344, 838, 86 ms    after 24, 104, 232 ms
      the same loop in C++ (no GIL):    before 373, 137, 103 ms   after 11, 173, 16 ms
    where the worst "after" figures came with equally bad maxima without any save (75 and 99 ms)."""
    import tempfile

    from apexrl import PrioritizedStore

    item = 1024
    n = megabytes * (1 << 20) // item
    store = PrioritizedStore(capacity=n, alpha=ALPHA, shards=shards, seed=0)
    payload = np.random.default_rng(0).integers(0, 256, size=(10_000, item), dtype=np.uint8)
    for start in range(0, n, 10_000):
        m = min(10_000, n - start)
        store.insert(np.ones(m), payload[:m])

    def longest_sample(during: Callable[[], None]) -> float:
        worst, stop = [0.0], threading.Event()

        def sampler() -> None:
            while not stop.is_set():
                t0 = time.perf_counter()
                store.sample(32, BETA)
                worst[0] = max(worst[0], time.perf_counter() - t0)

        thread = threading.Thread(target=sampler)
        thread.start()
        time.sleep(0.05)
        during()
        stop.set()
        thread.join()
        return worst[0]

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "stall.apx")
        t0 = time.perf_counter()
        store.save(path)
        save_s = time.perf_counter() - t0
        quiet = longest_sample(lambda: time.sleep(save_s))
        saving = longest_sample(lambda: store.save(path))
    print(
        f"{megabytes} MB, {shards} shards: save {save_s * 1e3:.0f} ms; longest sample(32) "
        f"{saving * 1e3:.1f} ms during a save, {quiet * 1e3:.1f} ms without"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--items", type=int, default=2_000_000, help="items in the store (default 2M)")
    parser.add_argument(
        "--seconds",
        type=float,
        default=3.0,
        help="measuring time per operation and library, split into --windows windows (default 3)",
    )
    parser.add_argument("--windows", type=int, default=5, help="alternating timing windows per operation (default 5)")
    parser.add_argument("--only", choices=sorted(ADAPTERS), action="append", help="run only these libraries")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--json", metavar="FILE", help="also write the raw results as JSON")
    parser.add_argument(
        "--baseline",
        metavar="PYTHON",
        help="also time the apexrl installed for this interpreter (e.g. an older build in another "
        "virtualenv), in the same alternating windows: before/after figures from one run",
    )
    parser.add_argument("--worker", choices=sorted(ADAPTERS), help=argparse.SUPPRESS)
    parser.add_argument(
        "--snapshot-stall", action="store_true", help="only measure how long save() stalls sampling (a 150 MB store)"
    )
    args = parser.parse_args()
    if args.snapshot_stall:
        snapshot_stall()
        return
    if args.items < 10 * SAMPLE_BATCH:
        parser.error(f"--items must be at least {10 * SAMPLE_BATCH}")
    if args.seconds <= 0 or args.windows < 1:
        parser.error("--seconds must be > 0 and --windows >= 1")

    if args.worker:
        worker(args.worker, args.items, args.seed)
        return

    # Every library fills its store in its own process (clean resident-memory figures); then the timing
    # windows alternate between libraries (A B A B ...), so load from elsewhere on a shared machine hits all
    # of them alike and the ratios stay meaningful.
    workers, results = [], {}
    names = args.only or ["apexrl", "apexrl-uniform", "apexrl-fifo-queue", "cpprb", "torchrl"]
    planned = [Worker(name, args) for name in names]
    if args.baseline:  # each apexrl row beside the same row of the baseline build
        for name in [n for n in names if n.startswith("apexrl")]:
            at = next(i for i, w in enumerate(planned) if w.name == name) + 1
            planned.insert(at, Worker(name, args, python=args.baseline, label=name + "-baseline"))
    for w in planned:  # they fill at the same time; each reports when its store is full
        try:
            results[w.name] = {"library": w.name, "items": args.items, **w.read()}
            workers.append(w)
            print(f"# {w.name}: filled in {results[w.name]['fill_s']:.1f} s", file=sys.stderr)
        except RuntimeError as e:
            print(f"# {w.name}: skipped -- {e}", file=sys.stderr)
    window = args.seconds / args.windows
    for op in OPS:
        rates: dict[str, list[float]] = {w.name: [] for w in workers}
        for rep in range(args.windows):
            for w in workers if rep % 2 == 0 else reversed(workers):
                rates[w.name].append(w.ask(op, window)["rate"])
        for name, values in rates.items():
            results[name][op] = statistics.median(values)
    for w in workers:
        results[w.name].update(w.ask("two_threads", args.seconds))
        w.close()
    results = list(results.values())
    for r in results:
        r["mt_insert_kept"] = r["mt_insert"] / r["insert"]
        r["mt_sample_kept"] = r["mt_sample"] / r["sample_update"]

    print(
        f"\n{args.items:,} items of {ITEM_BYTES} B, alpha {ALPHA}, beta {BETA}; rates in items/s "
        f"(learner: steps/s); median of {args.windows} alternating windows, {args.seconds:g} s per op and library\n"
    )
    cols = [
        ("insert", "insert 50"),
        ("sample", "sample 512"),
        ("update", "update 512"),
        ("learner", "learner step"),
        ("mt_insert_kept", "2 thr: insert kept"),
        ("mt_sample_kept", "2 thr: sample kept"),
        ("memory_ratio", "RSS / raw bytes"),
    ]
    print("| library | " + " | ".join(c[1] for c in cols) + " |")
    print("|---|" + "---|" * len(cols))
    for r in results:
        cells = []
        for key, _ in cols:
            v = r[key]
            cells.append(
                f"{v:.2f}" if key.endswith(("kept", "ratio")) else f"{v / 1e6:.2f} M" if v > 1e5 else f"{v:,.0f}"
            )
        print(f"| {r['library']} | " + " | ".join(cells) + " |")
    base = {r["library"]: r for r in results}
    ratio_rows = []
    for name, r in base.items():
        # A -baseline row against the same row of this build; the other apexrl rows are not competitors.
        ref = name.removesuffix("-baseline") if name.endswith("-baseline") else "apexrl"
        if ref in base and not (name.startswith("apexrl") and not name.endswith("-baseline")):
            ratio_rows.append(f"| {name} | " + " | ".join(f"{base[ref][k] / r[k]:.2f}x" for k, _ in cols[:4]) + " |")
    if ratio_rows:
        print("\nRatios apexrl / other (higher is better for apexrl; a row X-baseline: row X / X of the baseline):\n")
        print("| vs | " + " | ".join(c[1] for c in cols[:4]) + " |")
        print("|---|" + "---|" * 4)
        print("\n".join(ratio_rows))
    kind_rows = []  # a uniform table and a queue against the prioritized table, this build's and the baseline's
    for name in ("apexrl-uniform", "apexrl-fifo-queue"):
        for ref in ("apexrl", "apexrl-baseline"):
            if name in base and ref in base:
                cells = " | ".join(f"{base[name][k] / base[ref][k]:.2f}x" for k, _ in cols[:4])
                kind_rows.append(f"| {name} / {ref} | {cells} |")
    if kind_rows:
        print("\nTable kinds against the prioritized table (the Ape-X row; apexrl-baseline: the older build's):\n")
        print("| rows | " + " | ".join(c[1] for c in cols[:4]) + " |")
        print("|---|" + "---|" * 4)
        print("\n".join(kind_rows))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
