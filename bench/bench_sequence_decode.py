"""Sequence batches decoded per second by ``decode_sequences`` (the client's half of a SAMPLE of sequence items),
without a server, optionally beside another version of the decoder in the same process, windows interleaved.

A batch is ``--batch`` items of ``--t`` steps drawn from ``--episodes`` episodes, step chunks of
``--chunk-length`` steps; per-item extras are a float32[64] (a recurrent state's size class). Observations are
``--obs atari`` (84x84 uint8, mostly zero with a few bright pixels: lz4 compresses them, so every chunk header
differs) or ``--obs vector`` (float32[64]: stored raw, so chunk headers repeat).

``--against FILE``: a ``steps.py`` of another commit (``git show OLD:python/apexrl/replay/wire/steps.py > FILE``),
timed in turn with this tree's, ratio new/old per window, medians printed. ``--fresh-headers`` empties this tree's
parsed-header cache before every batch (the worst case: no chunk drawn before).

    python bench/bench_sequence_decode.py [--obs atari|vector] [--batch 32] [--t 80] [--windows 5]
        [--seconds 1] [--against OLD_STEPS.py] [--fresh-headers]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from types import ModuleType

import numpy as np

from apexrl.replay.wire import protocol as P
from apexrl.replay.wire import steps as NEW


def load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("apexrl_steps_other", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"--against {path}: not a Python file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def batches(args: argparse.Namespace, count: int = 16) -> list[tuple]:
    """``count`` sampled batches' decode arguments (items, chunks, refs, chunk buffer and offsets)."""
    rng = np.random.default_rng(0)
    length = args.episode_length

    def obs() -> np.ndarray:
        if args.obs == "vector":
            return rng.standard_normal(64).astype(np.float32)
        return ((rng.random((84, 84)) < 0.05) * 200).astype(np.uint8)

    episodes = []
    for _ in range(args.episodes):
        leaves = [
            NEW.flatten({"obs": obs(), "action": np.int64(i % 18), "reward": np.float32(1), "discount": np.float32(1)})
            for i in range(length)
        ]
        fields = NEW.structure_of(leaves[0])
        fp = NEW.structure_fingerprint(fields)
        starts = list(range(0, length, args.chunk_length))
        chunks = [
            NEW.encode_chunk(
                fields, [np.stack([lv[f.path] for lv in leaves[s : s + args.chunk_length]]) for f in fields], fp
            )
            for s in starts
        ]
        episodes.append((fp, starts, chunks))
    out = []
    for _ in range(count):
        chunks, refs, items, index = [], [], [], {}
        for _ in range(args.batch):
            e = int(rng.integers(len(episodes)))
            fp, starts, eps_chunks = episodes[e]
            first = int(rng.integers(0, length - args.t))
            cs = [c for c, s in enumerate(starts) if s < first + args.t and s + args.chunk_length > first]
            for c in cs:
                if (e, c) not in index:
                    index[(e, c)] = len(chunks)
                    chunks.append(eps_chunks[c])
            refs.append([index[(e, c)] for c in cs])
            state = {"state": rng.standard_normal(64).astype(np.float32)}
            items.append(NEW.encode_item(fp, first - starts[cs[0]], args.t, args.t, state))
        fc = P.pack_chunks(chunks, refs)
        out.append((items, fc.chunks(), [fc.refs(i) for i in range(len(items))], fc.chunk_data, fc.chunk_offsets))
    return out


def rate(module: ModuleType, work: list[tuple], seconds: float, fresh: bool) -> float:
    done, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        items, chunks, refs, data, offsets = work[done % len(work)]
        if fresh and hasattr(module, "_chunk_layout"):
            module._chunk_layout.cache_clear()
        module.decode_sequences(items, chunks, refs, chunk_data=data, chunk_offsets=offsets)
        done += 1
    return done / (time.perf_counter() - start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--obs", choices=("atari", "vector"), default="atari")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--t", type=int, default=80, help="steps per item (R2D2: 40 burn-in + 80 trained, here 80)")
    p.add_argument("--chunk-length", type=int, default=10)
    p.add_argument("--episodes", type=int, default=4)
    p.add_argument("--episode-length", type=int, default=400)
    p.add_argument("--windows", type=int, default=5)
    p.add_argument("--seconds", type=float, default=1.0, help="seconds per window")
    p.add_argument("--against", metavar="FILE", help="another commit's steps.py, timed in turn with this one")
    p.add_argument("--fresh-headers", action="store_true", help="empty the parsed-header cache before each batch")
    args = p.parse_args()
    if args.t > args.episode_length - 1:
        p.error("--t must be below --episode-length")
    work = batches(args)
    other = load(args.against) if args.against else None
    ours, theirs, ratios = [], [], []
    for _ in range(args.windows):
        ours.append(rate(NEW, work, args.seconds, args.fresh_headers))
        if other is not None:
            theirs.append(rate(other, work, args.seconds, False))
            ratios.append(ours[-1] / theirs[-1])
    line = f"{args.obs}, batch {args.batch} x {args.t} steps: this tree {statistics.median(ours):.1f} batches/s"
    if other is not None:
        line += f", --against {statistics.median(theirs):.1f} batches/s, ratio (median of windows) "
        line += f"{statistics.median(ratios):.3f} [{min(ratios):.3f}, {max(ratios):.3f}]"
    print(line)


if __name__ == "__main__":
    main()
