"""The TrajectoryWriter on R2D2's layout: storage held against bytes sent, steps appended/s, sequences sampled/s.

R2D2 (Kapturowski et al., 2019) stores sequences of 40 burn-in + 80 trained steps (+1 for the last bootstrap),
a new one every 40 steps, so each step is in about 3 items. The writer sends each step once (step chunks of
``--chunk-length`` steps, lz4 where it pays) and items reference the chunks; this prints the replay table's
``bytes_held`` against what the writer sent and against the steps' raw bytes (target: held <= 1.2x the bytes of
the same steps appended once), the steps appended per second (append + create_item + the INSERTs) and the
sequences sampled and decoded per second.

Observations are Atari-like (84x84 uint8: a textured screen fixed per episode with moving bars and a few noisy
pixels; consecutive frames compress together as real ones do, several-fold) unless ``--obs vector`` (a float32[64]); the recurrent state extras are 2 x 512 float32.

    python bench/bench_trajectory.py [--episodes 4] [--episode-length 400] [--obs atari|vector]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from apexrl.replay import ReplayClient, ReplayServer, ServerConfig


def make_step(rng: np.random.Generator, t: int, obs: str, background: np.ndarray) -> dict:
    if obs == "atari":
        frame = background.copy()
        frame[(t * 3) % 84, :] = 200  # a moving bar and a few noisy pixels, as a game screen changes
        frame[:, (t * 5) % 84] = 120
        frame[rng.integers(0, 84, 8), rng.integers(0, 84, 8)] = rng.integers(0, 255, 8)
        o = frame
    else:
        o = rng.standard_normal(64).astype(np.float32)
    return {
        "observation": o,
        "action": np.int64(rng.integers(0, 18)),
        "reward": np.float32(rng.standard_normal()),
        "discount": np.float32(0.997),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--episode-length", type=int, default=400)
    p.add_argument("--burn-in", type=int, default=40)
    p.add_argument("--trained", type=int, default=80)
    p.add_argument("--period", type=int, default=40)
    p.add_argument("--chunk-length", type=int, default=10)
    p.add_argument("--obs", choices=("atari", "vector"), default="atari")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--sample-rounds", type=int, default=20)
    args = p.parse_args()
    length = args.burn_in + args.trained + 1
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(args.episodes):
        background = (rng.integers(0, 4, (84, 84)) * 40).astype(np.uint8)  # a textured screen, fixed per episode
        steps.append([make_step(rng, t, args.obs, background) for t in range(args.episode_length)])
    raw = sum(sum(np.asarray(v).nbytes for v in s.values()) for ep in steps for s in ep)
    state = {"h": np.zeros(512, np.float32), "c": np.zeros(512, np.float32)}
    server = ReplayServer(ServerConfig(bind="127.0.0.1", port=0, capacity=1_000_000)).start()
    try:
        with ReplayClient(server.endpoint, timeout=30) as client:
            t0 = time.perf_counter()
            items = 0
            with client.writer(max_sequence_length=length, chunk_length=args.chunk_length) as w:
                for ep in steps:
                    for t, s in enumerate(ep):
                        w.append(s)
                        if t + 1 >= length and (t + 1 - length) % args.period == 0:
                            w.create_item("default", length, 1.0, state)
                            items += 1
                    w.end_episode()
                w.flush()
                sent = w.chunk_bytes_sent + w.item_bytes_sent
                chunk_sent = w.chunk_bytes_sent
            appended_s = time.perf_counter() - t0
            held = client.tables()["default"]["bytes_held"]
            n_steps = args.episodes * args.episode_length
            steps_in_items = items * length
            t1 = time.perf_counter()
            for _ in range(args.sample_rounds):
                batch = client.sample(args.batch)
                assert batch.mask is not None and batch.mask.all()
            sampled_s = time.perf_counter() - t1
    finally:
        server.stop()
    print(
        f"R2D2 layout: items of {length} steps every {args.period}, chunks of {args.chunk_length} steps, obs {args.obs}"
    )
    print(f"  {n_steps} steps appended, {items} items ({steps_in_items / n_steps:.2f} items per step)")
    print(f"  steps raw {raw} B; writer sent {sent} B (chunks {chunk_sent} B, items {sent - chunk_sent} B)")
    print(
        f"  table bytes_held {held} B: {held / sent:.3f}x what the writer sent, {held / chunk_sent:.3f}x the steps "
        f"appended once (their chunks; the rest is the items' own bytes: headers, the 4 KiB recurrent state), "
        f"{held / raw:.3f}x the raw steps"
    )
    per_item_raw = steps_in_items * raw / n_steps
    print(f"  (items storing their own steps raw: {per_item_raw:.0f} B, {per_item_raw / held:.1f}x bytes_held)")
    print(f"  steps appended/s (append, create_item, inserts): {n_steps / appended_s:,.0f}")
    print(
        f"  sequences sampled+decoded/s (batches of {args.batch}): {args.sample_rounds * args.batch / sampled_s:,.0f}"
    )


if __name__ == "__main__":
    main()
