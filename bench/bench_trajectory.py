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
        [--windows N] [--total-steps N] [--reverb-python PY] [--torchrl-python PY]
    python bench/bench_trajectory.py --held 1600 100000 1000000 [--windows N] [--sample-rounds N] [--reverb-python PY]
    python bench/bench_trajectory.py --slices 1600 100000 1000000 [--sampler uniform|prioritized]
        [--windows N] [--sample-rounds N] [--torchrl-python PY] [--slices-server]

``--held``: tables of several sizes held at once in one process, sampled in turn window by window, so that the
sizes are compared under the same load (the sampled rate per size and its ratio to the first size's). With
``--reverb-python``, Reverb's tables of the same sizes beside them (bench/reverb_trajectory_worker.py ``--held``:
one Reverb server in a process of its own holding a table per size, sampled through its ``TrajectoryDataset``
or ``--reverb-sampler client``), the two sides interleaved window by window: apexrl over Reverb per size, and the
bytes each holds (apexrl: bytes_held; Reverb: its server's memory growth while filling, as it reports none).

``--slices``: windows chosen at sample time. One ``SliceTable`` per size (apexrl.replay.slices, in process), all
held at once, each holding whole episodes (the bench's cycled, each copy a new episode, its steps chunked once
and stored once) with the recurrent state as two per-step fields (2 x 512 float32 zeros: a window may start at
any step, so no item carries it); windows of ``--burn-in`` + ``--trained`` + 1 steps, drawn uniformly or by
priority (``--sampler``; every priority the default 1), sampled and decoded (``SliceTable.sample``, the native
decode into reused arrays) ``--sample-rounds`` batches per size in turn, ``--windows`` rounds. Beside it TorchRL
(``--torchrl-python``: bench/torchrl_slices_worker.py, its own process: a ``SliceSampler`` or
``PrioritizedSliceSampler`` over a ``LazyTensorStorage`` of the same steps, one buffer per size held at once),
the two sides interleaved round by round. Prints windows sampled+decoded/s per size, each size's ratio to the
first size's, apexrl over TorchRL, and the bytes each holds (apexrl: chunk bytes + priorities, sum tree and chunk
index; TorchRL: its storage tensors).

``--slices --slices-server``: the same tables as slices tables of a replay server (``TableConfig(kind="slices")``,
in this process, its native threads serving 127.0.0.1), the episodes inserted with ``ReplayClient.insert_episode``
and the windows sampled over the wire (``ReplayClient.sample``: the server draws them and replies with one window
item per window, carrying its chunks' column places, and the chunks they reference; the client decodes them in one
native call, apexrl.replay.wire.windows). Prints windows sampled+decoded/s per size and the share of each sample
spent in the client's decode (the rest is the request: the server's draw and copy, the reply on the wire).

Beside Reverb (``--reverb-python``: an interpreter that imports dm-reverb; bench/reverb_trajectory_worker.py:
its trajectory writer, items every ``--period`` steps, ``client.sample``) and TorchRL (``--torchrl-python``:
bench/torchrl_trajectory_worker.py: a ``SliceSampler`` over a ``LazyTensorStorage``), each in its own process,
the windows interleaved (apexrl, Reverb, TorchRL in turn, ``--windows`` rounds); a side without its interpreter,
or whose interpreter cannot import the library, is skipped with one line saying why. ``--total-steps`` appends
that many steps per window (the episodes cycled) on apexrl's and TorchRL's side; Reverb's appends the episodes
once. bench/README.md says how each side lays the steps and the recurrent state out.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable

import numpy as np

from apexrl.replay import ReplayClient, ReplayServer, ServerConfig

HERE = os.path.dirname(os.path.abspath(__file__))


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


def append_steps(client: ReplayClient, steps: list, args: argparse.Namespace, length: int, n_steps: int) -> dict:
    """``n_steps`` steps appended through one writer (the episodes cycled), an item every ``--period`` steps."""
    state = {"h": np.zeros(512, np.float32), "c": np.zeros(512, np.float32)}
    t0 = time.perf_counter()
    items = done = e = 0
    with client.writer(max_sequence_length=length, chunk_length=args.chunk_length) as w:
        while done < n_steps:
            for t, s in enumerate(steps[e % len(steps)]):
                w.append(s)
                if t + 1 >= length and (t + 1 - length) % args.period == 0:
                    w.create_item("default", length, 1.0, state)
                    items += 1
            w.end_episode()
            done += len(steps[e % len(steps)])
            e += 1
        w.flush()
    return {
        "steps": done,
        "items": items,
        "sent": w.chunk_bytes_sent + w.item_bytes_sent,
        "chunk_sent": w.chunk_bytes_sent,
        "appended_s": time.perf_counter() - t0,
    }


def sample_rounds(client: ReplayClient, args: argparse.Namespace) -> float:
    """Seconds for ``--sample-rounds`` batches of sequences sampled and decoded."""
    t1 = time.perf_counter()
    for _ in range(args.sample_rounds):
        batch = client.sample(args.batch)
        assert batch.mask is not None and batch.mask.all()
    return time.perf_counter() - t1


def sample_rounds_pipelined(client: ReplayClient, args: argparse.Namespace) -> float:
    """Seconds for ``--sample-rounds`` batches through the learner's prefetching sampler (a thread keeps 2
    batches ahead, as Reverb's TrajectoryDataset keeps samples in flight): a new sampler per call, its first batch
    taken before the clock starts, so that nothing fetched between calls is counted."""
    sampler = client.sampler(args.batch, prefetch=2)
    try:
        first = next(sampler)
        assert first.raw.mask is not None
        t1 = time.perf_counter()
        for _ in range(args.sample_rounds):
            batch = next(sampler)
            assert batch.raw.mask is not None and batch.raw.mask.all()
        return time.perf_counter() - t1
    finally:
        sampler.close()


def run_ours(steps: list, args: argparse.Namespace, length: int, n_steps: int) -> dict:
    """One window of apexrl: a fresh in-process server, ``n_steps`` steps appended (the episodes cycled), then
    ``sample_rounds`` batches of sequences sampled and decoded."""
    server = ReplayServer(ServerConfig(bind="127.0.0.1", port=0)).start()
    try:
        with ReplayClient(server.endpoint, timeout=30) as client:
            r = append_steps(client, steps, args, length, n_steps)
            r["held"] = client.tables()["default"]["bytes_held"]
            r["sampled_s"] = sample_rounds(client, args)
    finally:
        server.stop()
    return r


def run_held(steps: list, args: argparse.Namespace, length: int, worker: Worker | None) -> None:
    """``--held``: one server per size appended once, then ``--windows`` rounds sampling each in turn (and
    Reverb's tables in its worker after them); the sequences sampled+decoded/s per size and, per round, each size's
    rate over the first size's and over Reverb's at that size."""
    servers, clients = [], []
    held_bytes = []
    try:
        for n_steps in args.held:
            servers.append(ReplayServer(ServerConfig(bind="127.0.0.1", port=0)).start())
            clients.append(ReplayClient(servers[-1].endpoint, timeout=30))
            r = append_steps(clients[-1], steps, args, length, n_steps)
            held_bytes.append(clients[-1].tables()["default"]["bytes_held"])
            print(
                f"{r['steps']:,} steps held: {r['items']:,} items, bytes_held {held_bytes[-1]:,}, "
                f"appended {r['steps'] / r['appended_s']:,.0f} steps/s",
                flush=True,
            )
        reverb_filled = worker.read() if worker is not None else None
        if reverb_filled is not None:
            for f in reverb_filled["filled"]:
                print(
                    f"Reverb {f['steps']:,} steps held: {f['items']:,} items, server memory +{f['rss_growth']:,} B, "
                    f"appended {f['steps'] / f['appended_s']:,.0f} steps/s",
                    flush=True,
                )
        rates: list[list[float]] = [[] for _ in args.held]
        theirs: list[list[float]] = [[] for _ in args.held]
        for win in range(args.windows):
            measure = sample_rounds_pipelined if args.held_sampler == "pipelined" else sample_rounds
            for rate, client in zip(rates, clients):
                rate.append(args.sample_rounds * args.batch / measure(client, args))
            line = f"window {win + 1}: " + ", ".join(f"{r[-1]:,.0f}" for r in rates) + " sequences/s"
            if worker is not None:
                for their, rate in zip(theirs, worker.window()["rates"]):
                    their.append(rate)
                line += "; Reverb " + ", ".join(f"{t[-1]:,.0f}" for t in theirs)
            print(line, flush=True)
    finally:
        for client in clients:
            client.close()
        for server in servers:
            server.stop()
    for i, (n_steps, rate) in enumerate(zip(args.held, rates)):
        ratio = statistics.median(a / b for a, b in zip(rate, rates[0]))
        print(
            f"{n_steps:,} steps held: sequences sampled+decoded/s (batches of {args.batch}) {med(rate)}, "
            f"{ratio:.2f}x the {args.held[0]:,}-step table's (median of per-window ratios)"
        )
        if worker is not None and reverb_filled is not None:
            vs = statistics.median(a / b for a, b in zip(rate, theirs[i]))
            grown = reverb_filled["filled"][i]["rss_growth"]
            print(
                f"  Reverb: {med(theirs[i])}, {statistics.median(a / b for a, b in zip(theirs[i], theirs[0])):.2f}x its "
                f"first size's; apexrl / Reverb {vs:.2f}x (median of per-window ratios); bytes: apexrl bytes_held "
                f"{held_bytes[i]:,}, Reverb's server grew {grown:,} B filling it"
            )


def held_reverb(steps: list, args: argparse.Namespace, length: int) -> None:
    """``--held`` with Reverb's worker beside it where its interpreter imports reverb."""

    def command(npz: str) -> list[str]:
        cmd = [os.path.join(HERE, "reverb_trajectory_worker.py"), "--steps", npz, "--length", str(length)]
        cmd += ["--period", str(args.period), "--batch", str(args.batch), "--sample-rounds", str(args.sample_rounds)]
        cmd += ["--sampler", args.reverb_sampler, "--held", *map(str, args.held)]
        return cmd + (["--in-process"] if args.reverb_in_process else [])

    with_worker(
        steps,
        args,
        ("Reverb", args.reverb_python, "--reverb-python", "import reverb, tensorflow"),
        command,
        lambda worker: run_held(steps, args, length, worker),
    )


def slice_episodes(steps: list) -> list[dict]:
    """The bench's episodes as per-step columns, the recurrent state a per-step field (zeros, as TorchRL's)."""
    zeros = np.zeros((len(steps[0]), 512), np.float32)
    return [{**{k: np.stack([s[k] for s in ep]) for k in ep[0]}, "h": zeros, "c": zeros} for ep in steps]


def run_slices(steps: list, args: argparse.Namespace, length: int, worker: Worker | None) -> None:
    """``--slices``: one SliceTable per size held at once, then ``--windows`` rounds of each size sampled in turn
    (and TorchRL's buffers in its worker after them)."""
    from apexrl.replay.slices import SliceTable

    tables, reuses = [], []
    chunks = None  # the bench's episodes chunked once: every copy of an episode stores the same chunks
    for size in args.slices:
        n_eps = -(-size // args.episode_length)
        t = SliceTable(
            n_eps * args.episode_length,
            args.trained + 1,
            burn_in=args.burn_in,
            sampler=args.sampler,
            chunk_length=args.chunk_length,
        )
        if chunks is None:
            chunks = [t.episode_chunks(ep)[0] for ep in slice_episodes(steps)]
        t0 = time.perf_counter()
        for i in range(n_eps):
            t.insert_chunks(chunks[i % len(chunks)])
        inserted = n_eps * args.episode_length / (time.perf_counter() - t0)
        print(f"{size:,} steps: {n_eps:,} episodes inserted, {inserted:,.0f} steps/s", flush=True)
        tables.append(t)
        reuses.append({})
    held = [t.stats()["chunk_bytes"] + t.stats()["metadata_bytes"] for t in tables]
    theirs = worker.read() if worker is not None else None
    for i, t in enumerate(tables):
        line = f"{t.stats()['steps']:,} steps held: apexrl {held[i]:,} B"
        if theirs is not None:
            line += f"; TorchRL {theirs['storage_bytes'][i]:,} B ({theirs['steps'][i]:,} steps)"
        print(line, flush=True)
    ours: list[list[float]] = [[] for _ in tables]
    other: list[list[float]] = [[] for _ in tables]
    for win in range(args.windows):
        for rate, t, reuse in zip(ours, tables, reuses):
            t0 = time.perf_counter()
            for _ in range(args.sample_rounds):
                batch = t.sample(args.batch, reuse=reuse)
                assert batch.steps.mask.all() and batch.steps.fields["observation"].shape[1] == length
            rate.append(args.sample_rounds * args.batch / (time.perf_counter() - t0))
        line = f"window {win + 1}: apexrl " + ", ".join(f"{r[-1]:,.0f}" for r in ours)
        if worker is not None:
            x = worker.window()
            for rate, sec in zip(other, x["seconds"]):
                rate.append(x["sampled"] / sec)
            line += "; TorchRL " + ", ".join(f"{r[-1]:,.0f}" for r in other)
        print(line + " windows/s", flush=True)
    print(
        f"slices of {args.burn_in} burn-in + {args.trained + 1} steps, {args.sampler}, batches of {args.batch}, "
        f"chunks of {args.chunk_length} steps, obs {args.obs}; windows sampled+decoded/s (median, range), "
        f"ratio to the {args.slices[0]:,}-step table's (median of per-window ratios)"
    )
    for i, size in enumerate(args.slices):
        line = f"  {size:,} steps: apexrl {med(ours[i])}, {statistics.median(a / b for a, b in zip(ours[i], ours[0])):.2f}x"
        if worker is not None and theirs is not None:
            line += (
                f"; TorchRL {med(other[i])}, {statistics.median(a / b for a, b in zip(other[i], other[0])):.2f}x; "
                f"apexrl/TorchRL {statistics.median(a / b for a, b in zip(ours[i], other[i])):.2f}x windows/s, "
                f"{held[i] / theirs['storage_bytes'][i]:.3f}x bytes"
            )
        print(line)


def run_slices_server(steps: list, args: argparse.Namespace, length: int) -> None:
    """``--slices --slices-server``: one slices table per size on a replay server, sampled in turn over the wire."""
    from apexrl.replay import ReplayClient, ReplayServer, ServerConfig
    from apexrl.replay.client.replay_client import sequences_of
    from apexrl.replay.tables import TableConfig

    names = [f"slices{i}" for i in range(len(args.slices))]
    sizes = [-(-size // args.episode_length) * args.episode_length for size in args.slices]
    tables = [TableConfig("default", capacity=16)] + [
        TableConfig(
            name, kind="slices", capacity=size, length=args.trained + 1, burn_in=args.burn_in, sampler=args.sampler
        )
        for name, size in zip(names, sizes)
    ]
    episodes = slice_episodes(steps)
    config = ServerConfig(port=0, tables=tables, max_message_mb=512.0)
    with ReplayServer(config) as server, ReplayClient(server.endpoint, timeout=120) as client:
        for name, size in zip(names, sizes):
            for i in range(size // args.episode_length):
                client.insert_episode(episodes[i % len(episodes)], chunk_length=args.chunk_length, table=name)
        tables_now = client.tables()
        for name in names:
            t = tables_now[name]
            print(f"{t['steps']:,} steps held: apexrl server {t['bytes_held']:,} B", flush=True)
        rates: list[list[float]] = [[] for _ in names]
        decode_share: list[list[float]] = [[] for _ in names]
        reuses: list[dict] = [{} for _ in names]
        for win in range(args.windows):
            for rate, share, name, reuse in zip(rates, decode_share, names, reuses):
                decoding = 0.0
                t0 = time.perf_counter()
                for _ in range(args.sample_rounds):
                    batch = client.sample(args.batch, table=name, sequences=False)
                    t1 = time.perf_counter()
                    seq = sequences_of(batch.data, batch.offsets, batch.chunks, reuse)
                    decoding += time.perf_counter() - t1
                    assert seq is not None and seq.mask.all() and seq.mask.shape[1] == length
                elapsed = time.perf_counter() - t0
                rate.append(args.sample_rounds * args.batch / elapsed)
                share.append(decoding / elapsed)
            print(f"window {win + 1}: apexrl server " + ", ".join(f"{r[-1]:,.0f}" for r in rates) + " windows/s")
    print(
        f"slices tables of a replay server, {args.burn_in} burn-in + {args.trained + 1} steps, {args.sampler}, "
        f"batches of {args.batch}, chunks of {args.chunk_length} steps, obs {args.obs}; windows sampled over "
        "127.0.0.1 and decoded/s (median, range), ratio to the first size's, the client's decode share of a sample"
    )
    for i, size in enumerate(args.slices):
        ratio = statistics.median(a / b for a, b in zip(rates[i], rates[0]))
        print(f"  {size:,} steps: {med(rates[i])}, {ratio:.2f}x, decode {statistics.median(decode_share[i]):.0%}")


class Worker:
    """A Reverb or TorchRL worker in its own interpreter: one window per line written, one JSON line back."""

    def __init__(self, name: str, cmd: list[str]) -> None:
        self.name = name
        self.proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        while line and not line.startswith("ready"):  # the libraries' own log lines
            line = self.proc.stdout.readline()
        if not line:
            self.proc.kill()
            raise RuntimeError(f"{name} worker did not start (exit {self.proc.wait()})")
        self.banner = line.strip()

    def window(self) -> dict:
        assert self.proc.stdin is not None
        self.proc.stdin.write("w\n")
        self.proc.stdin.flush()
        return self.read()

    def read(self) -> dict:
        """The worker's next JSON line."""
        assert self.proc.stdout is not None
        line = self.proc.stdout.readline()
        while line and not line.startswith("{"):  # the libraries' own log lines
            line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.name} worker exited ({self.proc.wait()})")
        return json.loads(line)

    def close(self) -> None:
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()


def probe(python: str | None, flag: str, what: str, code: str) -> str | None:
    """None when ``python`` imports ``what``; else the one skip line to print."""
    if python is None:
        return f"{what}: skipped: no {flag} given ({what} needs its own environment)"
    try:
        out = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"{what}: skipped: {python} could not run ({exc})"
    if out.returncode != 0:
        last = (out.stderr.strip().splitlines() or ["?"])[-1]
        return f"{what}: skipped: {python} cannot import it: {last}"
    return None


def slices_torchrl(steps: list, args: argparse.Namespace, length: int) -> None:
    """``--slices`` with TorchRL's worker beside it where its interpreter imports torchrl."""

    def command(npz: str) -> list[str]:
        cmd = [os.path.join(HERE, "torchrl_slices_worker.py"), "--steps", npz, "--length", str(length)]
        cmd += ["--batch", str(args.batch), "--sample-rounds", str(args.sample_rounds)]
        return cmd + ["--sampler", args.sampler, "--sizes", *map(str, args.slices)]

    probe_code = "import torch, torchrl; from torchrl.data.replay_buffers.samplers import PrioritizedSliceSampler"
    with_worker(
        steps,
        args,
        ("TorchRL", args.torchrl_python, "--torchrl-python", probe_code),
        command,
        lambda worker: run_slices(steps, args, length, worker),
    )


def with_worker(
    steps: list,
    args: argparse.Namespace,
    library: tuple[str, str | None, str, str],
    command: Callable[[str], list[str]],
    run: Callable[[Worker | None], None],
) -> None:
    """``run(worker)`` with a worker of ``library`` (name, interpreter, its flag, the import that proves it) in
    its own process, started with ``command(npz)`` (the bench's steps in an .npz it reads), where that interpreter
    imports the library; else ``run(None)`` and the one line saying why that side is skipped."""
    name, python, flag, code = library
    skip = probe(python, flag, name, code)
    worker = None
    with tempfile.TemporaryDirectory() as tmp:
        if skip is None:
            assert python is not None
            npz = os.path.join(tmp, "steps.npz")
            flat = [s for ep in steps for s in ep]
            columns = {k: np.stack([s[k] for s in flat]) for k in flat[0]}
            np.savez(npz, **columns, episodes=args.episodes, episode_length=args.episode_length)
            worker = Worker(name, [python, *command(npz)])
            print(worker.banner.removeprefix("ready").strip(), flush=True)
        try:
            run(worker)
        finally:
            if worker is not None:
                worker.close()
    if skip is not None:
        print(skip)


def med(xs: list[float]) -> str:
    return f"{statistics.median(xs):,.0f}" + (f" ({min(xs):,.0f}-{max(xs):,.0f})" if len(xs) > 1 else "")


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
    p.add_argument("--windows", type=int, default=1, help="interleaved windows (ours, Reverb, TorchRL in turn)")
    p.add_argument(
        "--total-steps",
        type=int,
        default=0,
        help="steps appended per window by apexrl and TorchRL (the episodes cycled; 0: each episode once); "
        "Reverb always appends the episodes once",
    )
    p.add_argument(
        "--held",
        type=int,
        nargs="+",
        metavar="STEPS",
        help="one table per size held at once (e.g. 1600 100000 1000000), appended once, then each sampled in "
        "turn, --windows rounds, beside Reverb's tables of the same sizes (--reverb-python); TorchRL is not run",
    )
    p.add_argument(
        "--slices",
        type=int,
        nargs="+",
        metavar="STEPS",
        help="windows chosen at sample time: one SliceTable per size held at once (e.g. 1600 100000 1000000), "
        "each sampled in turn, --windows rounds, beside TorchRL's SliceSampler (--torchrl-python); Reverb is not run",
    )
    p.add_argument(
        "--sampler", choices=("uniform", "prioritized"), default="uniform", help="--slices: how windows are drawn"
    )
    p.add_argument(
        "--slices-server",
        action="store_true",
        help="--slices: the tables on a replay server (kind='slices'), sampled over 127.0.0.1; TorchRL is not run",
    )
    p.add_argument("--reverb-python", help="an interpreter that imports dm-reverb (bench/reverb_trajectory_worker.py)")
    p.add_argument(
        "--reverb-sampler",
        choices=("dataset", "client"),
        default="dataset",
        help="--held: Reverb samples through its TrajectoryDataset (tf.data, the default) or client.sample",
    )
    p.add_argument(
        "--held-sampler",
        choices=("sync", "pipelined"),
        default="sync",
        help="--held: apexrl samples each batch in turn (sync: client.sample) or through the learner's "
        "prefetching sampler, 2 batches ahead (pipelined: client.sampler; beside Reverb's TrajectoryDataset)",
    )
    p.add_argument(
        "--reverb-in-process",
        action="store_true",
        help="--held: Reverb's server in its worker's process (default: a process of its own, as apexrl's "
        "samples cross a socket)",
    )
    p.add_argument("--torchrl-python", help="an interpreter that imports torchrl (bench/torchrl_trajectory_worker.py)")
    args = p.parse_args()
    length = args.burn_in + args.trained + 1
    rng = np.random.default_rng(0)
    steps = []
    for _ in range(args.episodes):
        background = (rng.integers(0, 4, (84, 84)) * 40).astype(np.uint8)  # a textured screen, fixed per episode
        steps.append([make_step(rng, t, args.obs, background) for t in range(args.episode_length)])
    if args.held:
        if min(args.held) < 1:
            p.error("--held sizes must be >= 1 step")
        held_reverb(steps, args, length)
        return
    if args.slices:
        if min(args.slices) < 1:
            p.error("--slices sizes must be >= 1 step")
        if args.slices_server:
            run_slices_server(steps, args, length)
            return
        slices_torchrl(steps, args, length)
        return
    raw = sum(sum(np.asarray(v).nbytes for v in s.values()) for ep in steps for s in ep)
    n_steps = max(args.total_steps, args.episodes * args.episode_length)
    raw_total = raw * n_steps / (args.episodes * args.episode_length)

    skip = {
        "Reverb": probe(args.reverb_python, "--reverb-python", "Reverb", "import reverb"),
        "TorchRL": probe(
            args.torchrl_python,
            "--torchrl-python",
            "TorchRL",
            "import torch, torchrl; from torchrl.data.replay_buffers.samplers import SliceSampler",
        ),
    }
    workers: dict[str, Worker] = {}
    tmp = tempfile.TemporaryDirectory()
    if skip["Reverb"] is None or skip["TorchRL"] is None:
        flat = [s for ep in steps for s in ep]
        npz = os.path.join(tmp.name, "steps.npz")
        np.savez(
            npz,
            **{k: np.stack([s[k] for s in flat]) for k in flat[0]},
            episodes=args.episodes,
            episode_length=args.episode_length,
        )
        common = ["--steps", npz, "--length", str(length), "--batch", str(args.batch)]
        common += ["--sample-rounds", str(args.sample_rounds)]
        if skip["Reverb"] is None:
            assert args.reverb_python is not None
            workers["Reverb"] = Worker(
                "Reverb",
                [
                    args.reverb_python,
                    os.path.join(HERE, "reverb_trajectory_worker.py"),
                    *common,
                    "--period",
                    str(args.period),
                ],
            )
        if skip["TorchRL"] is None:
            assert args.torchrl_python is not None
            workers["TorchRL"] = Worker(
                "TorchRL",
                [
                    args.torchrl_python,
                    os.path.join(HERE, "torchrl_trajectory_worker.py"),
                    *common,
                    "--total-steps",
                    str(n_steps),
                ],
            )
    rows: dict[str, list[dict]] = {"apexrl": [], **{k: [] for k in workers}}
    try:
        for win in range(args.windows):
            r = run_ours(steps, args, length, n_steps)
            rows["apexrl"].append(r)
            line = (
                f"window {win + 1}: apexrl {r['steps'] / r['appended_s']:,.0f} steps/s, "
                f"{args.sample_rounds * args.batch / r['sampled_s']:,.0f} sequences/s"
            )
            for name, wk in workers.items():
                x = wk.window()
                rows[name].append(x)
                line += f"; {name} {x['steps'] / x['appended_s']:,.0f} steps/s, {x['sampled'] / x['sampled_s']:,.0f} sequences/s"
            print(line, flush=True)
    finally:
        for wk in workers.values():
            wk.close()
        tmp.cleanup()

    r = rows["apexrl"][-1]
    items, sent, chunk_sent, held = r["items"], r["sent"], r["chunk_sent"], r["held"]
    steps_in_items = items * length
    print(
        f"R2D2 layout: items of {length} steps every {args.period}, chunks of {args.chunk_length} steps, obs {args.obs}"
    )
    print(f"  {n_steps} steps appended, {items} items ({steps_in_items / n_steps:.2f} items per step)")
    print(f"  steps raw {raw_total:.0f} B; writer sent {sent} B (chunks {chunk_sent} B, items {sent - chunk_sent} B)")
    print(
        f"  table bytes_held {held} B: {held / sent:.3f}x what the writer sent, {held / chunk_sent:.3f}x the steps "
        f"appended once (their chunks; the rest is the items' own bytes: headers, the 4 KiB recurrent state), "
        f"{held / raw_total:.3f}x the raw steps"
    )
    per_item_raw = steps_in_items * raw_total / n_steps
    print(f"  (items storing their own steps raw: {per_item_raw:.0f} B, {per_item_raw / held:.1f}x bytes_held)")
    ours = rows["apexrl"]
    print(f"  steps appended/s (append, create_item, inserts): {med([x['steps'] / x['appended_s'] for x in ours])}")
    print(
        f"  sequences sampled+decoded/s (batches of {args.batch}): "
        f"{med([args.sample_rounds * args.batch / x['sampled_s'] for x in ours])}"
    )
    for name in ("Reverb", "TorchRL"):
        if skip[name] is not None:
            print(skip[name])
            continue
        xs = rows[name]
        print(
            f"{name} ({workers[name].banner.removeprefix('ready').strip() or 'worker'}), {xs[-1]['steps']} steps per window:"
        )
        print(f"  steps appended/s: {med([x['steps'] / x['appended_s'] for x in xs])}")
        print(
            f"  sequences sampled+decoded/s (batches of {args.batch}): {med([x['sampled'] / x['sampled_s'] for x in xs])}"
        )
        if name == "Reverb":
            b = xs[-1]["checkpoint_bytes"]
            print(
                f"  bytes: Reverb's server_info has none; its checkpoint of the table is {b} B "
                f"({b / held:.3f}x apexrl's bytes_held for {xs[-1]['steps']} steps)"
                if xs[-1]["steps"] == n_steps
                else f"  bytes: Reverb's server_info has none; its checkpoint of the table is {b} B"
            )
        else:
            b = xs[-1]["storage_bytes"]
            print(f"  storage tensors {b} B ({b / held:.2f}x apexrl's bytes_held; uncompressed, state at every step)")
        sa = [x["steps"] / x["appended_s"] for x in xs]
        so = [x["sampled"] / x["sampled_s"] for x in xs]
        oa = [x["steps"] / x["appended_s"] for x in ours]
        oo = [args.sample_rounds * args.batch / x["sampled_s"] for x in ours]
        print(
            f"  apexrl / {name}, median of per-window ratios: steps appended/s "
            f"{statistics.median(a / b for a, b in zip(oa, sa)):.2f}x, sequences sampled/s "
            f"{statistics.median(a / b for a, b in zip(oo, so)):.2f}x"
        )


if __name__ == "__main__":
    main()
