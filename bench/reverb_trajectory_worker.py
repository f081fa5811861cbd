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
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time

import numpy as np


def dir_bytes(path: str) -> int:
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", required=True)
    p.add_argument("--length", type=int, default=121)
    p.add_argument("--period", type=int, default=40)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--sample-rounds", type=int, default=20)
    args = p.parse_args()
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import reverb

    z = np.load(args.steps)
    obs, action, reward, discount = z["observation"], z["action"], z["reward"], z["discount"]
    episodes, episode_length = int(z["episodes"]), int(z["episode_length"])
    h = np.zeros(512, np.float32)
    c = np.zeros(512, np.float32)
    length, period = args.length, args.period
    print("ready", flush=True)
    for _line in sys.stdin:
        with tempfile.TemporaryDirectory() as ckpt_dir:
            table = reverb.Table(
                name="t",
                sampler=reverb.selectors.Prioritized(0.6),
                remover=reverb.selectors.Fifo(),
                max_size=10_000_000,
                rate_limiter=reverb.rate_limiters.MinSize(1),
            )
            server = reverb.Server(tables=[table], checkpointer=reverb.checkpointers.DefaultCheckpointer(path=ckpt_dir))
            client = reverb.Client(f"localhost:{server.port}")
            items = 0
            t0 = time.perf_counter()
            with client.trajectory_writer(num_keep_alive_refs=length, validate_items=False) as w:
                for e in range(episodes):
                    base = e * episode_length
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
                                "t",
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
                w.flush()
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
            "steps": episodes * episode_length,
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
