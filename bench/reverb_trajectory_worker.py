"""Reverb's side of bench_trajectory.py; run with an interpreter that imports dm-reverb (its own venv: dm-reverb
0.14 needs TensorFlow 2.15). Imports nothing from apexrl.

    PY reverb_trajectory_worker.py --steps NPZ --length 121 --period 40 --batch 32 --sample-rounds 20

Loads the bench's steps (the same arrays apexrl's side appends), prints "ready", then runs one window for each
line it reads on stdin and prints one JSON line per window. A window starts a fresh in-process Reverb server (a
prioritized table: Prioritized(0.6), Fifo remover, MinSize(1), as bench_wire's Reverb table) with a checkpointer
in a temporary directory, then:

- appends every step with Reverb's fastest writer, ``client.trajectory_writer(num_keep_alive_refs=length,
  validate_items=False)`` (its default auto-tuned chunker), and every ``period`` steps, once ``length`` steps
  are held, ``create_item(table, priority 1.0, trajectory)`` with the last ``length`` steps of each step column;
- the recurrent state (2 x 512 float32) is two step columns ``h`` and ``c`` that are written only at the steps
  where an item starts (every ``period`` steps of an episode; the other steps leave them None), and the item
  references that one step (``history['h'][-length]``), so each state is stored once per item, as apexrl's
  item extras are;
- samples ``sample_rounds`` batches of ``batch`` sequences with ``client.sample(table, num_samples=batch *
  sample_rounds, emit_timesteps=False)`` (one sampler, samples in flight; no tf.data), stacking each batch's
  sequences into (batch, length, ...) numpy arrays per column, as apexrl's sample decodes them;
- (the server is in this process, as apexrl's is in bench_trajectory's: Reverb's sampler then reads the table
  directly, without gRPC, which apexrl's client does not: its SAMPLE goes over loopback TCP; the writer's
  inserts go through gRPC);
- writes a checkpoint and reports its size on disk (Reverb's server_info has no byte count; the checkpoint
  holds the table's chunks, compressed as the server holds them, and its items).

``--held 1600 100000 1000000`` (bench_trajectory.py's ``--held``): one table per size on one Reverb server, in its
own process unless ``--in-process`` (so that, as apexrl's client over loopback TCP, every sample crosses a
socket: gRPC), each table filled once with the episodes cycled to its size; prints "ready", then one JSON line
with what the filling took (seconds, items, the server's resident memory growth per table: Reverb reports no
bytes held), then for each line read samples ``sample_rounds`` batches from every table in turn and prints their
sequences per second. Sampling is Reverb's ``TrajectoryDataset`` batched by tf.data and turned into numpy
(``--sampler dataset``, the default: Reverb's own input pipeline) or ``client.sample`` as above.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import subprocess
import sys
import tempfile
import time

import numpy as np


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def append_episodes(client, table: str, z, length: int, period: int, n_steps: int) -> int:
    """Appends the bench's episodes (cycled) until ``n_steps`` steps, an item every ``period`` steps once
    ``length`` are held; returns the items created."""
    import numpy as np

    obs, action, reward, discount = z["observation"], z["action"], z["reward"], z["discount"]
    episodes, episode_length = int(z["episodes"]), int(z["episode_length"])
    h = np.zeros(512, np.float32)
    c = np.zeros(512, np.float32)
    items = done = e = 0
    with client.trajectory_writer(num_keep_alive_refs=length, validate_items=False) as w:
        while done < n_steps:
            base = (e % episodes) * episode_length
            for t in range(episode_length):
                i = base + t
                starts = t % period == 0  # an item may start here: its recurrent state is written
                w.append(
                    {
                        "observation": obs[i],
                        "action": action[i],
                        "reward": reward[i],
                        "discount": discount[i],
                        "h": h if starts else None,
                        "c": c if starts else None,
                    }
                )
                if t + 1 >= length and (t + 1 - length) % period == 0:
                    hist = w.history
                    w.create_item(
                        table,
                        1.0,
                        {
                            "observation": hist["observation"][-length:],
                            "action": hist["action"][-length:],
                            "reward": hist["reward"][-length:],
                            "discount": hist["discount"][-length:],
                            "h": hist["h"][-length],
                            "c": hist["c"][-length],
                        },
                    )
                    items += 1
            w.end_episode()
            done += episode_length
            e += 1
        w.flush()
    return items


def make_table(name: str):
    """The bench's Reverb table: as bench_wire's (Prioritized(0.6), Fifo, MinSize(1)), room for every item."""
    import reverb

    return reverb.Table(
        name=name,
        sampler=reverb.selectors.Prioritized(0.6),
        remover=reverb.selectors.Fifo(),
        max_size=10_000_000,
        rate_limiter=reverb.rate_limiters.MinSize(1),
    )


SERVER_CODE = """
import os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
sys.path.insert(0, {here!r})
import reverb
from reverb_trajectory_worker import make_table
server = reverb.Server(tables=[make_table(n) for n in {names!r}])
print("port", server.port, flush=True)
sys.stdin.read()  # serves until the worker closes this pipe
server.stop()
"""


def rss_bytes(pid: int) -> int:
    """Resident memory of process ``pid`` (Linux /proc), 0 where unreadable."""
    try:
        with open(f"/proc/{pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def held_mode(args: argparse.Namespace, z) -> None:
    """``--held``: one table per size on one Reverb server (in its own process unless ``--in-process``), each
    filled once (the episodes cycled), then for each line read, every table sampled in turn."""
    import numpy as np
    import reverb
    import tensorflow as tf

    names = [f"t{n}" for n in args.held]
    if args.in_process:
        server = reverb.Server(tables=[make_table(n) for n in names])
        port, server_pid, proc = server.port, os.getpid(), None
    else:
        code = SERVER_CODE.format(here=os.path.dirname(os.path.abspath(__file__)), names=names)
        proc = subprocess.Popen([sys.executable, "-c", code], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None
        line = proc.stdout.readline()
        while line and not line.startswith("port "):
            line = proc.stdout.readline()
        if not line:
            raise SystemExit(f"the Reverb server process exited ({proc.wait()})")
        port, server_pid = int(line.split()[1]), proc.pid
    address = f"localhost:{port}"
    client = reverb.Client(address)
    length = args.length
    filled = []
    for name, n_steps in zip(names, args.held):
        before = rss_bytes(server_pid)
        t0 = time.perf_counter()
        items = append_episodes(client, name, z, length, args.period, n_steps)
        filled.append(
            {
                "steps": n_steps,
                "items": items,
                "appended_s": time.perf_counter() - t0,
                "rss_growth": rss_bytes(server_pid) - before,
                "table_size": int(client.server_info()[name].current_size),
            }
        )
    shapes = {
        "observation": (length, *z["observation"].shape[1:]),
        "action": (length,),
        "reward": (length,),
        "discount": (length,),
        "h": (512,),
        "c": (512,),
    }
    dtypes = {
        "observation": tf.as_dtype(z["observation"].dtype),
        "action": tf.as_dtype(z["action"].dtype),
        "reward": tf.float32,
        "discount": tf.float32,
        "h": tf.float32,
        "c": tf.float32,
    }

    def dataset(name: str):
        return reverb.TrajectoryDataset(
            server_address=address,
            table=name,
            dtypes=dtypes,
            shapes={k: tf.TensorShape(v) for k, v in shapes.items()},
            max_in_flight_samples_per_worker=2 * args.batch,
        ).batch(args.batch, drop_remainder=True)

    datasets = [dataset(name) if args.sampler == "dataset" else None for name in names]
    version = importlib.metadata.version("dm-reverb")
    print(
        f"ready Reverb {version}, server {'in this process' if proc is None else 'in its own process'}, {args.sampler}",
        flush=True,
    )
    print(json.dumps({"filled": filled, "server_rss": rss_bytes(server_pid)}), flush=True)
    for _line in sys.stdin:
        rates = []
        for name, ds in zip(names, datasets):
            if ds is not None:
                # A new iterator per window, its first batch taken before the clock starts: what its workers
                # fetched while the other side was measured is not counted (apexrl's sampler is used alike).
                it = iter(ds)
                next(it)
            t1 = time.perf_counter()
            if ds is not None:  # TrajectoryDataset: batches of (batch, length, ...) tensors, to numpy
                for _ in range(args.sample_rounds):
                    sample = next(it)
                    cols = {k: v.numpy() for k, v in sample.data.items()}
                    assert cols["observation"].shape == (args.batch, *shapes["observation"])
            else:  # client.sample, stacked per batch as the per-window mode does
                batch: list = []
                for s in client.sample(name, num_samples=args.batch * args.sample_rounds, emit_timesteps=False):
                    batch.append(s.data)
                    if len(batch) == args.batch:
                        cols = [np.stack([b[k] for b in batch]) for k in range(len(batch[0]))]
                        batch = []
            rates.append(args.batch * args.sample_rounds / (time.perf_counter() - t1))
            if ds is not None:
                del it  # stops its workers before the next table is measured
        print(json.dumps({"rates": rates}), flush=True)
    if proc is not None:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(timeout=60)
    else:
        server.stop()


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", required=True)
    p.add_argument("--length", type=int, default=121)
    p.add_argument("--period", type=int, default=40)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--sample-rounds", type=int, default=20)
    p.add_argument("--held", type=int, nargs="+", help="one table per size, filled once, sampled per window line")
    p.add_argument("--in-process", action="store_true", help="--held: the server in this process")
    p.add_argument("--sampler", choices=("dataset", "client"), default="dataset", help="--held: how to sample")
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import reverb

    z = np.load(args.steps)
    if args.held:
        held_mode(args, z)
        return
    length, period = args.length, args.period
    steps = int(z["episodes"]) * int(z["episode_length"])
    print("ready", flush=True)
    for _line in sys.stdin:
        with tempfile.TemporaryDirectory() as ckpt_dir:
            server = reverb.Server(
                tables=[make_table("t")], checkpointer=reverb.checkpointers.DefaultCheckpointer(path=ckpt_dir)
            )
            client = reverb.Client(f"localhost:{server.port}")
            t0 = time.perf_counter()
            items = append_episodes(client, "t", z, length, period, steps)
            appended_s = time.perf_counter() - t0
            n = args.batch * args.sample_rounds
            t1 = time.perf_counter()
            got = 0
            batch: list = []
            for s in client.sample("t", num_samples=n, emit_timesteps=False):
                batch.append(s.data)
                got += 1
                if len(batch) == args.batch:
                    cols = [np.stack([b[k] for b in batch]) for k in range(len(batch[0]))]
                    assert cols[0].shape[0] == args.batch
                    batch = []
            sampled_s = time.perf_counter() - t1
            shapes = [list(np.shape(x)) for x in s.data]
            info = client.server_info()["t"]
            ckpt = client.checkpoint()
            ckpt_bytes = dir_bytes(ckpt_dir)
            server.stop()
        out = {
            "steps": steps,
            "items": items,
            "table_size": int(info.current_size),
            "appended_s": appended_s,
            "sampled": got,
            "sampled_s": sampled_s,
            "sample_shapes": shapes,
            "checkpoint_bytes": ckpt_bytes,
            "checkpoint_path": ckpt,
        }
        print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
