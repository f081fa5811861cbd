"""Throughput of the transition codec (apexrl.replay.codec) for the DPG-humanoid and Atari presets, in-process.

    python bench/bench_codec.py                  # batch 512, about 10 s
    python bench/bench_codec.py --seconds 0.3    # quick look

For each preset: encode a batch of --batch transitions into store items (one uint8 buffer + offsets), and decode
such a batch back into stacked arrays (what the learner does with a SampleBatch). Figures are the median of
--windows timing windows; MB/s counts decoded (raw) transition bytes. Atari frames here are synthetic (12x12
blocks of random grey levels); their compression ratio and speed differ from real frames, which
bench_wire.py measures with real Pong frames.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import numpy as np
from apexrl.replay.codec import TransitionSpec


def dpg_batch(spec: TransitionSpec, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {f.name: rng.standard_normal((n, *f.shape), dtype=np.float32) for f in spec.fields}


def atari_batch(spec: TransitionSpec, n: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    frames_per_stack, height, width = spec["obs"].shape
    coarse = rng.integers(0, 256, (n + frames_per_stack, -(-height // 12), -(-width // 12)), dtype=np.uint8)
    frames = np.repeat(np.repeat(coarse, 12, axis=1), 12, axis=2)[:, :height, :width]
    stacks = np.lib.stride_tricks.sliding_window_view(frames, frames_per_stack, axis=0).transpose(0, 3, 1, 2)
    return {
        "obs": np.ascontiguousarray(stacks[:n]),
        "action": rng.integers(0, 18, n, dtype=np.int32),
        "reward": rng.choice(np.array([-1.0, 0.0, 1.0], dtype=np.float32), n),
        "discount": np.full(n, 0.99, dtype=np.float32),
        "next_obs": np.ascontiguousarray(stacks[1 : n + 1]),
    }


def seconds_per_call(fn: Callable[[], object], seconds: float, windows: int) -> float:
    fn()  # warm up
    per_window = seconds / windows
    results = []
    for _ in range(windows):
        calls, start = 0, time.perf_counter()
        while True:
            fn()
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= per_window:
                break
        results.append(elapsed / calls)
    return statistics.median(results)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=2.0, help="timing budget per operation and preset")
    parser.add_argument("--windows", type=int, default=5)
    args = parser.parse_args()

    rng = np.random.default_rng(0)
    presets = [
        ("dpg humanoid (67, 21)", TransitionSpec.dpg(67, 21), dpg_batch),
        ("atari 4x84x84 (synthetic)", TransitionSpec.atari(), atari_batch),
    ]
    n = args.batch
    print(f"apexrl.replay.codec, batch {n}, median of {args.windows} windows, MB/s of raw transition bytes")
    header = (
        f"{'preset':<27}{'raw B/tr':>9}{'item B':>9}{'ratio':>7}"
        f"{'encode tr/s':>13}{'enc MB/s':>10}{'decode tr/s':>13}{'dec MB/s':>10}{'dec us/batch':>14}"
    )
    print(header)
    print("-" * len(header))
    for label, spec, make in presets:
        batch = make(spec, n, rng)
        data, offsets = spec.encode(batch)
        decoded = spec.decode(data, offsets)
        assert all(np.array_equal(decoded[k], batch[k]) for k in spec.names)
        raw = spec.transition_bytes
        t_enc = seconds_per_call(lambda: spec.encode(batch), args.seconds, args.windows)
        t_dec = seconds_per_call(lambda: spec.decode(data, offsets), args.seconds, args.windows)
        print(
            f"{label:<27}{raw:>9,}{data.size / n:>9,.0f}{raw * n / data.size:>7.2f}"
            f"{n / t_enc:>13,.0f}{raw * n / t_enc / 1e6:>10,.0f}"
            f"{n / t_dec:>13,.0f}{raw * n / t_dec / 1e6:>10,.0f}{t_dec * 1e6:>14,.0f}"
        )
    print("note: Atari frames are synthetic block frames; real Pong frames are measured in bench_wire.py.")


if __name__ == "__main__":
    main()
