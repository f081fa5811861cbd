"""Throughput of the transition codec (apexrl.replay.wire.codec) for the DPG-humanoid and Atari presets, in-process.

    python bench/bench_codec.py                  # batch 512, about 10 s, then the sampled section (about 1 min)
    python bench/bench_codec.py --seconds 0.3    # quick look
    python bench/bench_codec.py --only sampled --threads 1,2,4,8 --rounds 6
    python bench/bench_codec.py --only frames --threads 1,2 --rounds 6   # frames stored once (Atari layout)

Sampled section (--only sampled): real Pong frames (ale_py, random actions; as bench_wire.py makes them) are
encoded with TransitionSpec.atari() into a native PrioritizedStore; then T threads each loop "sample --batch
items from the store, decode them natively into this thread's preallocated batch" (what the learner's sampler
decode threads do, without the network), for T in --threads, run in interleaved windows (1, 2, 4, 8, 1, 2, ...)
so that load from other processes falls on every T alike. Reported: sampled-and-decoded items/s per T (median
of --rounds windows), its ratio to T = 1 (the median of the per-round ratios), and the same loop with today's
Python decoder (TransitionSpec.decode, one thread) for comparison. --learner adds the DQN learner's own
steps/s: the agent's update fed by a PrefetchingSampler over a real replay server on 127.0.0.1, for
--learner-threads decode threads and with today's Python decode hook, in interleaved windows.

Frames stored once (part of the sampled section, or alone with --only frames): the same Pong transitions stored
as Atari runs store them (apexrl.replay.wire.frames: u16 frame references per item, each insert's frames once in
lz4 chunks of 8), sampled, and the stacks rebuilt by the native FrameStackCodec.decode_valid_into (GIL
released, into each thread's preallocated batch; T threads for T in --threads) or by the Python reference
FrameStackCodec.decode_valid (1 and 2 threads), in interleaved windows, with the copy control as above; ratios
against native 1 thread.

For each preset: encode a batch of --batch transitions into store items (one uint8 buffer + offsets), and decode
such a batch back into stacked arrays (what the learner does with a SampleBatch). Figures are the median of
--windows timing windows; MB/s counts decoded (raw) transition bytes. Atari frames here are synthetic (12x12
blocks of random grey levels); their compression ratio and speed differ from real frames, which
bench_wire.py measures with real Pong frames.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable

import numpy as np

from apexrl.replay.wire.codec import TransitionSpec


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


def pong_store(transitions: int, seed: int = 0):
    """A PrioritizedStore holding `transitions` real Pong transitions encoded with TransitionSpec.atari()."""
    from apexrl import PrioritizedStore

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_wire import pong_transitions  # the same real frames the wire bench uses

    spec = TransitionSpec.atari()
    batch, source = pong_transitions(transitions, seed)
    store = PrioritizedStore(capacity=transitions, alpha=0.6, shards=8, seed=seed)
    for start in range(0, transitions, 500):
        part = {k: v[start : start + 500] for k, v in batch.items()}
        data, offsets = spec.encode(part)
        store.insert(np.random.default_rng(start).uniform(0.5, 2.0, len(part["action"])), data, offsets)
    return spec, store, source


def pong_frames_store(transitions: int, seed: int = 0):
    """The same real Pong transitions stored as the actor stores them: frames once (apexrl.replay.wire.frames), each
    insert of 500 transitions with its own lz4 frame chunks, in a native PrioritizedStore."""
    from apexrl import PrioritizedStore
    from apexrl.replay.wire.frames import frame_codec

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from bench_wire import pong_transitions  # the same real frames the wire bench uses

    codec = frame_codec(TransitionSpec.atari())
    batch, source = pong_transitions(transitions, seed)
    store = PrioritizedStore(capacity=transitions, alpha=0.6, shards=8, seed=seed)
    for start in range(0, transitions, 500):
        part = {k: v[start : start + 500] for k, v in batch.items()}
        data, offsets, fc = codec.encode(part)
        store.insert(
            np.random.default_rng(start).uniform(0.5, 2.0, len(part["action"])),
            data,
            offsets,
            chunks=fc.chunks(),
            item_chunks=fc.item_chunks,
            item_chunk_offsets=fc.item_chunk_offsets,
        )
    return codec, store, source


def _frame_chunks(b):
    from apexrl.replay.wire.protocol import FrameChunks

    return FrameChunks(b.item_chunks, b.item_chunk_offsets, b.chunk_data, b.chunk_offsets)


def _timed_threads(
    loop: Callable[[int], None],
    threads: int,
    seconds: float,
    ready: threading.Barrier,
    stop: threading.Event,
    counts: list[int],
) -> float:
    """Run ``loop(i)`` in ``threads`` threads (each waits at ``ready``, counts its items in ``counts[i]`` and ends
    at ``stop``): the items/s of all of them over one window of ``seconds``."""
    workers = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(threads)]
    for w in workers:
        w.start()
    ready.wait()
    start = time.perf_counter()
    time.sleep(seconds)
    done = sum(counts)
    elapsed = time.perf_counter() - start
    stop.set()
    for w in workers:
        w.join()
    return done / elapsed


def frames_window(codec, store, n: int, threads: int, seconds: float, mode: str) -> float:
    """Items/s sampled and rebuilt (frames stored once) by `threads` threads in one window of `seconds`; mode
    native (FrameStackCodec.decode_valid_into, this thread's preallocated batch), python (decode_valid) or copy
    (the control: no decoding, each thread copies a rebuilt batch's arrays with numpy, without the GIL)."""
    stop = threading.Event()
    counts = [0] * threads
    slots = [codec.empty_batch(n) for _ in range(threads)]
    sources = []
    if mode == "copy":
        for _ in range(threads):
            b = store.sample(n, 0.4)
            sources.append(codec.decode_valid(b.data, b.offsets, _frame_chunks(b))[0])
    ready = threading.Barrier(threads + 1)

    def loop(i: int) -> None:
        ready.wait()
        while not stop.is_set():
            if mode == "copy":
                for name, src in sources[i].items():
                    np.copyto(slots[i][name], src)
                counts[i] += n
                continue
            b = store.sample(n, 0.4)
            if mode == "native":
                _fields, bad, _message = codec.decode_valid_into(b.data, b.offsets, _frame_chunks(b), slots[i])
            else:
                _fields, bad, _message = codec.decode_valid(b.data, b.offsets, _frame_chunks(b))
            assert bad is None
            counts[i] += n

    return _timed_threads(loop, threads, seconds, ready, stop, counts)


def run_sampled_frames(args: argparse.Namespace) -> None:
    """The sampled section for frames stored once (the layout Atari runs use): native rebuild with T threads
    against the Python reference decode (1 and 2 threads), in interleaved windows."""
    threads = [int(t) for t in args.threads.split(",")]
    codec, store, source = pong_frames_store(args.transitions)
    n = args.batch
    print(
        f"\nframes stored once: sampled and stacks rebuilt, batch {n}, {len(store)} transitions of {source}; "
        f"{os.cpu_count()} CPUs; {args.rounds} interleaved rounds of {args.window:g} s windows"
    )
    b = store.sample(n, 0.4)
    ref, bad, _ = codec.decode_valid(b.data, b.offsets, _frame_chunks(b))
    got, bad2, _ = codec.decode_valid_into(b.data, b.offsets, _frame_chunks(b), codec.empty_batch(n))
    assert bad is None and bad2 is None and all(np.array_equal(ref[k], got[k]) for k in codec.spec.names)
    stored = int(b.offsets[-1]) + int(b.chunk_offsets[-1]) if len(b.chunk_offsets) else int(b.offsets[-1])
    print(
        f"sampled bytes: {stored / n:,.0f} per transition, items + their chunks (raw {codec.spec.transition_bytes:,})"
    )
    t0 = time.perf_counter()
    for _ in range(20):
        codec.decode_valid(b.data, b.offsets, _frame_chunks(b))
    t1 = time.perf_counter()
    slot = codec.empty_batch(n)
    for _ in range(20):
        codec.decode_valid_into(b.data, b.offsets, _frame_chunks(b), slot)
    t2 = time.perf_counter()
    print(
        f"one batch, decode only (no sampling), mean of 20: python {(t1 - t0) / 20 * 1e3:.2f} ms, "
        f"native {(t2 - t1) / 20 * 1e3:.2f} ms"
    )
    configs = [("python decode, 1 thr", 1, "python"), ("python decode, 2 thr", 2, "python")]
    configs += [(f"native rebuild, {t} thr", t, "native") for t in threads]
    configs += [(f"control: copy, {t} thr", t, "copy") for t in threads]
    rates: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for label, t, mode in configs:
            rates.setdefault(label, []).append(frames_window(codec, store, n, t, args.window, mode))
    print(f"{'configuration':<26}{'items/s (median)':>18}{'x its 1 thr':>14}{'min..max items/s':>24}")
    for label, _t, mode in configs:
        r = rates[label]
        base = rates[configs[2 + len(threads)][0] if mode == "copy" else configs[2][0]]
        ratio = statistics.median(x / y for x, y in zip(r, base))
        print(f"{label:<26}{statistics.median(r):>18,.0f}{ratio:>14.2f}{min(r):>13,.0f}..{max(r):<10,.0f}")
    print(
        "ratios: median over rounds of (configuration / its 1 thread in the same round; python decode against "
        "native 1 thread). The control copies a rebuilt batch with numpy (GIL released, no decoding): its ratio "
        "is what the machine's free cores and memory bandwidth allow at that moment."
    )


def sampled_window(spec: TransitionSpec, store, n: int, threads: int, seconds: float, mode: str) -> float:
    """Items/s sampled and decoded by `threads` threads in one window of `seconds`; mode native, python, or
    copy (the control: no decoding, each thread copies a decoded batch's bytes with numpy, without the GIL)."""
    stop = threading.Event()
    counts = [0] * threads
    slots = [spec.empty_batch(n) for _ in range(threads)]
    sources = [spec.decode(*_sampled(store, n)) for _ in range(threads)] if mode == "copy" else []
    ready = threading.Barrier(threads + 1)

    def loop(i: int) -> None:
        slot = slots[i]
        ready.wait()
        while not stop.is_set():
            if mode == "copy":
                for name, src in sources[i].items():
                    np.copyto(slot[name], src)
            else:
                b = store.sample(n, 0.4)
                if mode == "native":
                    spec.decode_into(b.data, b.offsets, slot)
                else:
                    spec.decode(b.data, b.offsets)
            counts[i] += n

    return _timed_threads(loop, threads, seconds, ready, stop, counts)


def _sampled(store, n: int):
    b = store.sample(n, 0.4)
    return b.data, b.offsets


def run_sampled(args: argparse.Namespace) -> None:
    threads = [int(t) for t in args.threads.split(",")]
    spec, store, source = pong_store(args.transitions)
    n = args.batch
    print(
        f"\nsampled and decoded, batch {n}, {len(store)} transitions of {source}; {os.cpu_count()} CPUs; "
        f"{args.rounds} interleaved rounds of {args.window:g} s windows"
    )
    b = store.sample(n, 0.4)
    ref = spec.decode(b.data, b.offsets)
    got = spec.decode_into(b.data, b.offsets, spec.empty_batch(n))
    assert all(np.array_equal(ref[k], got[k]) for k in spec.names)
    print(f"item bytes: {int(b.offsets[-1]) / n:,.0f} per transition (raw {spec.transition_bytes:,})")
    rates: dict[str, list[float]] = {}
    configs = [("python decode", 1, "python")]
    configs += [(f"native decode, {t} thr", t, "native") for t in threads]
    configs += [(f"control: copy, {t} thr", t, "copy") for t in threads]
    for _ in range(args.rounds):
        for label, t, mode in configs:
            rates.setdefault(label, []).append(sampled_window(spec, store, n, t, args.window, mode))
    print(f"{'configuration':<26}{'items/s (median)':>18}{'x its 1 thread':>16}{'min..max items/s':>24}")
    for label, _t, mode in configs:
        r = rates[label]
        base = rates[configs[1][0] if mode != "copy" else configs[1 + len(threads)][0]]
        ratio = statistics.median(x / y for x, y in zip(r, base))
        print(f"{label:<26}{statistics.median(r):>18,.0f}{ratio:>16.2f}{min(r):>13,.0f}..{max(r):<10,.0f}")
    print(
        "ratios: median over rounds of (T threads / 1 thread in the same round); python decode is against native 1 "
        "thread. The control copies decoded bytes with numpy (GIL released, no decoding): its ratio is what the "
        "machine's free cores and memory allow at that moment."
    )


def run_learner_steps(args: argparse.Namespace) -> None:
    """The DQN learner's own steps/s on Pong-shaped batches: agent.update fed by a PrefetchingSampler over a real
    replay server on 127.0.0.1, natively decoding with T threads into its ring, T in --learner-threads."""
    import torch

    from apexrl.agents import get_agent
    from apexrl.envs import env_spec
    from apexrl.replay import ReplayClient
    from apexrl.replay.server import ReplayServer
    from apexrl.replay.server.config import ServerConfig
    from apexrl.replay.tables import TableConfig
    from apexrl.replay.wire.codec import BatchDecoder

    torch.set_num_threads(1)
    spec, store, _source = pong_store(args.transitions)
    env = env_spec("atari:Pong")
    agent_def = get_agent("dqn")
    config = agent_def.config_class(batch_size=args.batch)
    agent = agent_def.make_learner(env, config, torch.device("cpu"), 0)
    assert agent.transition_spec == spec, (agent.transition_spec, spec)
    server = ReplayServer(
        ServerConfig(bind="127.0.0.1", port=0, tables=[TableConfig("default", capacity=args.transitions)])
    ).start()
    try:
        with ReplayClient(server.endpoint, timeout=30) as client:
            for _ in range(-(-args.transitions // 500)):
                b = store.sample(500, 0.4)
                client.insert(np.ones(500), data=np.frombuffer(b.data, np.uint8), offsets=b.offsets)
            threads = [int(t) for t in args.learner_threads.split(",")]
            configs: list[tuple[str, dict]] = [("python decode hook (before)", {"decode": spec.decode_batch})]
            configs += [
                (f"native, {t} decode thread(s)", {"decoder": BatchDecoder(spec, args.batch), "decode_threads": t})
                for t in threads
            ]
            steps: dict[str, list[float]] = {}
            for _ in range(args.learner_rounds):
                for label, hook in configs:
                    with client.sampler(args.batch, prefetch=8, **hook) as sampler:
                        sampler.next(timeout=60)
                        done, start = 0, time.perf_counter()
                        while time.perf_counter() - start < args.learner_window:
                            batch = sampler.next(timeout=60)
                            agent.update(batch.decoded, batch.weights)
                            done += 1
                        steps.setdefault(label, []).append(done / (time.perf_counter() - start))
            print(
                f"\nDQN learner steps/s (CPU, torch 1 thread, batch {args.batch}, {args.learner_rounds} interleaved "
                f"rounds of {args.learner_window:g} s):"
            )
            base = steps[configs[1][0]]
            for label, _hook in configs:
                r = steps[label]
                ratio = statistics.median(x / y for x, y in zip(r, base))
                print(
                    f"  {label:<30} {statistics.median(r):6.2f} steps/s (x{ratio:.2f} of native 1 thread; "
                    f"{min(r):.2f}..{max(r):.2f})"
                )
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=512)
    parser.add_argument("--seconds", type=float, default=2.0, help="timing budget per operation and preset")
    parser.add_argument("--windows", type=int, default=5)
    parser.add_argument(
        "--only",
        choices=("codec", "sampled", "frames"),
        default=None,
        help="one section (default: all; sampled includes frames, the frames-stored-once table)",
    )
    parser.add_argument("--threads", default="1,2,4,8", help="decode thread counts of the sampled section")
    parser.add_argument("--rounds", type=int, default=5, help="interleaved rounds of the sampled section")
    parser.add_argument("--window", type=float, default=1.0, help="seconds per window of the sampled section")
    parser.add_argument("--transitions", type=int, default=3000, help="real Pong transitions in the store")
    parser.add_argument("--learner", action="store_true", help="also the DQN learner's own steps/s")
    parser.add_argument("--learner-threads", default="1,2", help="decode thread counts of the learner section")
    parser.add_argument("--learner-window", type=float, default=10.0, help="seconds per learner window")
    parser.add_argument("--learner-rounds", type=int, default=2, help="interleaved rounds of the learner section")
    args = parser.parse_args()
    if args.only != "codec":
        if args.only != "frames":
            run_sampled(args)
        run_sampled_frames(args)
        if args.learner:
            run_learner_steps(args)
    if args.only in ("sampled", "frames"):
        return

    rng = np.random.default_rng(0)
    presets = [
        ("dpg humanoid (67, 21)", TransitionSpec.dpg(67, 21), dpg_batch),
        ("atari 4x84x84 (synthetic)", TransitionSpec.atari(), atari_batch),
    ]
    n = args.batch
    print(f"apexrl.replay.wire.codec, batch {n}, median of {args.windows} windows, MB/s of raw transition bytes")
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
