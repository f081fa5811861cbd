"""Reverb's side of bench_wire's inserts-vs-Reverb column; run with an interpreter that imports dm-reverb (its own
venv: dm-reverb 0.14 needs TensorFlow 2.15). Imports nothing from apexrl.

    PY reverb_worker.py server --capacity N --lifetime S        # prints "reverb listening on PORT"
    PY reverb_worker.py actor  --port P --payload NPZ --start-at T --seconds S --out JSON
    PY reverb_worker.py learner --port P --start-at T --seconds S --out JSON

The table is what the apexrl server holds: prioritized (alpha 0.6), FIFO removal, max_size N, MinSize(1); with
``--table uniform`` a uniform table (FIFO removal, max_size N, MinSize(1)), with ``--table queue`` Reverb's
``Table.queue(max_size=N)`` (FIFO sampler and remover, max_times_sampled 1, a Queue(N) limiter). Give every mode
the same ``--table``. The learner stops once the table stayed empty for 1 s (a queue) or 10 s (the others; the
actors have stopped), its time then ending at its last batch.
Reverb's fastest clients, measured on the 2-core machine (one process, 2026-11-27, loaded): inserts through a
``StructuredWriter`` (its config makes one item per step on the C++ side: 23.7k items/s) rather than a
``TrajectoryWriter`` with a Python ``create_item`` per item (12.2k/s); samples through a ``TrajectoryDataset``
batched by 512 (tf.data, samples in flight: 86.7k/s) rather than ``client.sample`` (a Python generator). An actor
appends the bench's pre-encoded DPG items (632 B each, as uint8 arrays) with their priority, one step each, and
flushes every 50 (one round trip per 50, like one apexrl INSERT); the config's priority is the step's own
(``td_error`` of one step with max weight 1: its absolute value). The learner takes batches of 512 from the
dataset and sends 512 new priorities with ``mutate_priorities``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import time

import numpy as np

SAMPLE = 512


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=("server", "actor", "learner"))
    p.add_argument("--capacity", type=int, default=2_000_000)
    p.add_argument("--lifetime", type=float, default=600.0)
    p.add_argument("--port", type=int)
    p.add_argument("--payload")
    p.add_argument("--start-at", type=float)
    p.add_argument("--seconds", type=float)
    p.add_argument("--out")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--table", choices=("prioritized", "uniform", "queue"), default="prioritized")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import reverb

    if args.mode == "server":
        if args.table == "queue":
            table = reverb.Table.queue(name="t", max_size=args.capacity)
        else:
            table = reverb.Table(
                name="t",
                sampler=reverb.selectors.Prioritized(0.6)
                if args.table == "prioritized"
                else reverb.selectors.Uniform(),
                remover=reverb.selectors.Fifo(),
                max_size=args.capacity,
                rate_limiter=reverb.rate_limiters.MinSize(1),
            )
        server = reverb.Server(tables=[table])
        print(f"reverb listening on {server.port}", flush=True)
        stop = []
        signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
        deadline = time.monotonic() + args.lifetime
        while not stop and time.monotonic() < deadline:
            time.sleep(0.1)
        server.stop()
        return

    client = reverb.Client(f"localhost:{args.port}")
    rng = np.random.default_rng(args.seed)
    n = requests = 0
    elapsed: float | None = None
    if args.mode == "actor":
        from reverb import structured_writer as sw

        z = np.load(args.payload)
        items = []
        for i in range(len(z.files) // 2):
            d, o = z[f"d{i}"], z[f"o{i}"]
            items.append([np.asarray(d[o[j] : o[j + 1]], np.uint8) for j in range(len(o) - 1)])
        prios = rng.uniform(0.1, 2.0, 4096).astype(np.float32)
        step = {"x": None, "p": None}
        config = sw.create_config(
            pattern=sw.pattern_from_transform(step, lambda s: {"x": s["x"][-1], "p": s["p"][-1]}),
            table="t",
            priority=sw.td_error(1.0, step, lambda s: s["p"]),
        )
        w = client.structured_writer([config])
        while time.time() < args.start_at:
            time.sleep(0.001)
        end = args.start_at + args.seconds
        b = 0
        while time.time() < end:
            batch = items[b % len(items)]
            for j, item in enumerate(batch):
                w.append({"x": item, "p": prios[(n + j) % 4096]})
            w.flush()
            n += len(batch)
            b += 1
            requests += 1
    else:
        import tensorflow as tf

        dataset = reverb.TrajectoryDataset(
            server_address=f"localhost:{args.port}",
            table="t",
            dtypes={"x": tf.uint8, "p": tf.float32},
            shapes={"x": tf.TensorShape([632]), "p": tf.TensorShape([])},
            max_in_flight_samples_per_worker=2 * SAMPLE,
            # the dataset ends once the table stayed empty this long (the actors stopped, or never started
            # in time on a loaded machine): a queue empties whenever the learner catches up, so 1 s there
            rate_limiter_timeout_ms=1000 if args.table == "queue" else 10_000,
        ).batch(SAMPLE)
        while time.time() < args.start_at:
            time.sleep(0.001)
        end = args.start_at + args.seconds
        last = None
        for sample in dataset:
            keys = sample.info.key.numpy()
            client.mutate_priorities(
                "t", updates={int(k): float(v) for k, v in zip(keys, rng.uniform(0.1, 2.0, len(keys)))}
            )
            n += len(keys)
            requests += 2
            last = time.time()
            if last >= end:
                break
        else:  # the dataset ended on an empty table: the learner's time ends at its last batch, not the wait
            if last is not None:
                elapsed = last - args.start_at
    if elapsed is None:
        elapsed = time.time() - args.start_at
    with open(args.out, "w") as f:
        json.dump({"items": n, "elapsed": elapsed, "requests": requests}, f)


if __name__ == "__main__":
    main()
