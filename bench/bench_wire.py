"""End-to-end throughput of the replay server over loopback, with real processes.

For each configuration a fresh ``python -m apexrl.cli.server --port 0`` is started (its printed endpoint is
parsed), prefilled, and then K actor processes (K = 1, 2) insert batches of 50 pre-encoded transitions in a
loop (pipelined by default: ``client.inserter(max_in_flight=16)``, every acknowledgement awaited before the
actor's clock stops; ``--insert-mode sync`` waits for each reply) while one learner process samples 512 (and, for Atari, decodes them with ``TransitionSpec.decode_batch``)
and sends 512 new priorities through an ``AsyncUpdater`` (non-blocking, max_pending 64), all for --seconds.

    python bench/bench_wire.py                 # full run (DPG + Atari, K = 1 and 2, 1M-item RSS)
    python bench/bench_wire.py --quick         # smoke run, a few seconds
    python bench/bench_wire.py --spec-check both   # each configuration with and without a server --spec
    python bench/bench_wire.py --curve both    # every configuration without and with CURVE, and the ratio
    python bench/bench_wire.py --only dpg --floor --table-kind prioritized uniform queue
                                               # the server with a uniform table and with a FIFO queue beside
                                               # the prioritized one (and Reverb's, with --reverb-python)
    python bench/bench_wire.py --only atari --games Pong,Breakout,MsPacman --before-python OLD/.venv/bin/python
                                               # Atari frames stored once: this tree against an older one,
                                               # whole stack (server, actors, learner) each, windows interleaved

Shapes:
  DPG    TransitionSpec.dpg(67, 21) (632-byte items), capacity 2M, prefilled with --prefill (200k) items
  Atari  TransitionSpec.atari() (lz4 frame stacks), built from real Pong frames played with random actions
         through ale_py (grayscale 210x160 -> 84x84 by numpy area averaging, no cv2), 4-frame stacks;
         falls back to synthetic frames (announced loudly) when ale_py cannot be imported.
Reported per configuration: inserted/s (sum over actors), sampled/s (sampled and, for Atari, decoded),
p50/p99 of the learner's sample request (with ``--sample-threads N|auto``: its wait for each batch from the
learner's own PrefetchingSampler, N requests in flight) and of the actors' insert requests (ms), server RSS (VmRSS) and
bytes held per item (stats()["bytes_held"] / size). Separately: server RSS holding 1M DPG items, and the
cost of the server's spec check (``TransitionSpec.validate_items``) per insert batch, in-process.
``--spec-check on|both`` starts the server with ``--spec`` (every insert checked against it): ``both`` runs
each configuration without and with it, side by side, and prints the inserted/s ratio.
``--curve on`` runs server and clients with CURVE encryption and the ZAP allow-list (keys from
``apexrl.security.keygen`` in a temporary directory); ``--curve both`` runs each configuration plain, then with
CURVE, and prints the CURVE / plain ratio of inserted/s and sampled/s.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.abspath(__file__)
INSERT_BATCH, SAMPLE_BATCH, BETA = 50, 512, 0.4
N_PREENCODED_BATCHES = 64  # distinct insert batches each actor cycles through


# ---------------------------------------------------------------------------------------------- helpers


def rss_of(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def stat_cpu_seconds(path: str) -> float:
    """utime + stime from a /proc stat file (a process's: all its threads; a task's: that thread), in seconds."""
    with open(path) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """utime + stime of a process (all its threads), in seconds."""
    return stat_cpu_seconds(f"/proc/{pid}/stat")


# What each server thread does, by its name (/proc/PID/task/TID/comm): the native loop names its threads;
# libzmq names its I/O threads "ZMQbg/IO/N"; a Python server (old, floor) serves in its main thread ("other").
THREAD_GROUPS = (("apexrl-serve", "serve"), ("apexrl-worker", "workers"), ("ZMQbg/IO", "zmq_io"))


def thread_cpu_seconds(pid: int) -> dict[str, float]:
    """utime + stime of a process's live threads, summed by THREAD_GROUPS ("other" for the rest), in seconds."""
    out: dict[str, float] = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/comm") as f:
                name = f.read().strip()
            sec = stat_cpu_seconds(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # the thread ended meanwhile
            continue
        group = next((g for prefix, g in THREAD_GROUPS if name.startswith(prefix)), "other")
        out[group] = out.get(group, 0.0) + sec
    return out


def context_switches(pid: int) -> tuple[int, int]:
    """(voluntary, nonvoluntary) context switches of a process's live threads: a voluntary one is a thread that
    blocked (waiting for a message, a lock, a condition variable), so per request they count the hand-offs."""
    vol = non = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches:"):
                        vol += int(line.split()[1])
                    elif line.startswith("nonvoluntary_ctxt_switches:"):
                        non += int(line.split()[1])
        except OSError:  # the thread ended meanwhile
            continue
    return vol, non


def kill_all(procs: list[subprocess.Popen]) -> None:
    """Kill and reap the worker processes still running (a window that failed part way)."""
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def await_workers(
    procs: list[subprocess.Popen],
    names: list[str],
    outdir: str,
    start_at: float,
    pids: list[int],
    what: str = "worker",
    on_poll=None,
    by_thread: dict[str, float] | None = None,
    switches: dict[str, int] | None = None,
) -> tuple[float, list[dict]]:
    """Wait for the workers' common start, then for every worker to exit -> (the CPU seconds the processes
    ``pids`` used in between, each worker's JSON result, in ``names`` order); RuntimeError if one failed.
    ``by_thread``: filled with those CPU seconds split by thread group (:func:`thread_cpu_seconds`);
    ``switches``: with the processes' voluntary and nonvoluntary context switches in that time."""
    while time.time() < start_at:
        time.sleep(0.001)
    cpu0 = sum(cpu_seconds(pid) for pid in pids)
    threads0 = [thread_cpu_seconds(pid) for pid in pids]
    switches0 = [context_switches(pid) for pid in pids]
    while any(p.poll() is None for p in procs):
        if on_poll is not None:
            on_poll()
        time.sleep(0.05)
    cpu = sum(cpu_seconds(pid) for pid in pids) - cpu0
    if switches is not None:
        for pid, (vol0, non0) in zip(pids, switches0):
            vol, non = context_switches(pid)
            switches["voluntary"] = switches.get("voluntary", 0) + vol - vol0
            switches["nonvoluntary"] = switches.get("nonvoluntary", 0) + non - non0
    if by_thread is not None:
        for pid, before in zip(pids, threads0):
            for group, sec in thread_cpu_seconds(pid).items():
                by_thread[group] = by_thread.get(group, 0.0) + sec - before.get(group, 0.0)
    results = []
    for p, name in zip(procs, names):
        if p.wait() != 0:
            raise RuntimeError(f"{what} exited with {p.returncode}")
        with open(os.path.join(outdir, name)) as f:
            results.append(json.load(f))
    return cpu, results


def pct(lat: list[float], q: float) -> float:
    return float(np.percentile(np.asarray(lat), q)) * 1e3 if lat else float("nan")


TABLE_KINDS = ("prioritized", "uniform", "queue")


def tables_of(table_kind: str, capacity: int) -> list[dict] | None:
    """The ``--tables`` list of a server whose one table ``default`` is of ``table_kind``: None for prioritized
    (today's flags, the server command line unchanged), a uniform table, or a FIFO queue (sampler fifo,
    max_times_sampled 1, a Queue limiter as large as the capacity, so the bench's inserts are never refused)."""
    if table_kind == "prioritized":
        return None
    if table_kind == "uniform":
        return [{"name": "default", "sampler": "uniform", "capacity": capacity}]
    if table_kind == "queue":
        return [
            {
                "name": "default",
                "sampler": "fifo",
                "capacity": capacity,
                "max_times_sampled": 1,
                "rate_limiter": {"kind": "queue", "size": capacity},
            }
        ]
    raise ValueError(f"table kind must be one of {TABLE_KINDS}, got {table_kind!r}")


class Server:
    """A replay server subprocess; SIGTERM on close, SIGKILL if it does not exit."""

    def __init__(
        self,
        capacity: int,
        extra: list[str] | None = None,
        kind: str = "native",
        python: str | None = None,
        table_kind: str = "prioritized",
    ):
        """``kind``: "native" (this tree's server), "old" (``python -m apexrl.cli.server`` of the interpreter
        ``python``, e.g. an older tree's venv) or "floor" (the do-nothing pyzmq server of this file).
        ``table_kind``: its one table ``default`` (:func:`tables_of`; only this tree's server has tables)."""
        if (kind == "old") != (python is not None):  # a "native" window must never run another tree's server
            raise ValueError(f"a {kind!r} server {'needs' if kind == 'old' else 'takes no'} python interpreter")
        tables = tables_of(table_kind, capacity)
        if tables is not None and kind != "native":
            raise ValueError(f"a {kind!r} server has no {table_kind} table")
        self.tables_path = None
        if kind == "floor":
            cmd = [sys.executable, HERE, "--worker", "floor", *(extra or [])]
        else:
            table_flags = ["--capacity", str(capacity)]
            if tables is not None:  # --tables replaces the table flags (the server refuses both)
                fd, self.tables_path = tempfile.mkstemp(prefix="bench_wire_tables_", suffix=".json")
                with os.fdopen(fd, "w") as f:
                    json.dump(tables, f)
                table_flags = ["--tables", self.tables_path]
            cmd = [
                python or sys.executable,
                "-m",
                "apexrl.cli.server",
                "--port",
                "0",
                *table_flags,
                "--log-level",
                "WARNING",
                *(extra or []),
            ]
        self.kind = kind
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True)
        self.endpoint = None
        deadline = time.monotonic() + 60
        assert self.proc.stdout is not None
        while time.monotonic() < deadline:
            line = self.proc.stdout.readline()
            if not line:
                break
            if "listening on" in line:
                self.endpoint = line.strip().rsplit(" ", 1)[1]
                break
        if self.endpoint is None:
            self.close()
            raise RuntimeError("replay server did not report its endpoint")

    @property
    def pid(self) -> int:
        return self.proc.pid

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        if self.tables_path is not None:
            os.unlink(self.tables_path)
            self.tables_path = None


# --------------------------------------------------------------------------------------------- payloads


def dpg_batches(seed: int, n_batches: int = N_PREENCODED_BATCHES) -> list[tuple[np.ndarray, np.ndarray]]:
    from apexrl.replay.wire.codec import TransitionSpec

    spec = TransitionSpec.dpg(67, 21)
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n_batches):
        b = {
            "obs": rng.standard_normal((INSERT_BATCH, 67), dtype=np.float32),
            "action": rng.uniform(-1, 1, (INSERT_BATCH, 21)).astype(np.float32),
            "reward": rng.standard_normal(INSERT_BATCH, dtype=np.float32),
            "discount": np.full(INSERT_BATCH, 0.99, np.float32),
            "next_obs": rng.standard_normal((INSERT_BATCH, 67), dtype=np.float32),
        }
        out.append(spec.encode(b))
    return out


def downsample_84(gray: np.ndarray) -> np.ndarray:
    """210x160 grayscale -> 84x84 by area averaging over a nearest-index grid (numpy only, no cv2)."""
    h, w = gray.shape
    ys = (np.arange(84 + 1) * h) // 84
    xs = (np.arange(84 + 1) * w) // 84
    # Sum over row bands then column bands with reduceat (exact area average on integer boundaries).
    g = gray.astype(np.float32)
    rows = np.add.reduceat(g, ys[:-1], axis=0) / np.diff(ys)[:, None]
    cols = np.add.reduceat(rows, xs[:-1], axis=1) / np.diff(xs)[None, :]
    return np.clip(cols + 0.5, 0, 255).astype(np.uint8)


def rom_name(game: str) -> str:
    """ale-py's ROM name of a game: MsPacman -> ms_pacman."""
    return "".join("_" + c.lower() if c.isupper() and i else c.lower() for i, c in enumerate(game))


def pong_transitions(n: int, seed: int = 0, game: str = "Pong") -> tuple[dict[str, np.ndarray], str]:
    """n Atari transitions from real frames of `game` (random actions), or synthetic ones if ale_py is missing."""
    rng = np.random.default_rng(seed)
    try:
        from ale_py import ALEInterface, LoggerMode, roms

        ALEInterface.setLoggerMode(LoggerMode.Error)
        ale = ALEInterface()
        ale.setInt("random_seed", seed)
        ale.setInt("frame_skip", 1)
        ale.setFloat("repeat_action_probability", 0.0)
        ale.loadROM(roms.get_rom_path(rom_name(game)))
        actions = ale.getMinimalActionSet()
        frames, acts, rews, dones = [], [], [], []
        # DQN-style: action repeat 4, max over the last 2 raw frames, grayscale, 84x84.
        while len(frames) < n + 4:
            a = int(rng.integers(len(actions)))
            r = 0.0
            last2 = []
            for k in range(4):
                r += ale.act(actions[a])
                if k >= 2:
                    last2.append(ale.getScreenGrayscale())
            frames.append(downsample_84(np.maximum(last2[0], last2[1])))
            acts.append(a)
            rews.append(r)
            done = ale.game_over()
            dones.append(done)
            if done:
                ale.reset_game()
        source = f"REAL {game} frames (ale_py, random actions, action repeat 4, numpy area-average 84x84, no cv2)"
    except Exception as exc:  # noqa: BLE001
        msg = f"!!! ale_py unavailable ({type(exc).__name__}: {exc}): USING SYNTHETIC FRAMES, NOT REAL PONG !!!"
        print("\n" + "!" * len(msg) + "\n" + msg + "\n" + "!" * len(msg) + "\n", flush=True)
        frames = []
        base = rng.integers(0, 256, (84, 84), dtype=np.uint8) // 64 * 64
        for i in range(n + 4):
            f = base.copy()
            y, x = (i * 3) % 80, (i * 5) % 80
            f[y : y + 4, x : x + 2] = 236
            frames.append(f)
        acts = list(rng.integers(0, 6, n + 4))
        rews = [0.0] * (n + 4)
        dones = [False] * (n + 4)
        source = "SYNTHETIC frames (ale_py missing)"
    fr = np.stack(frames)  # (T, 84, 84)
    idx = np.arange(n)
    obs = np.stack([fr[idx + k] for k in range(4)], axis=1)
    nxt = np.stack([fr[idx + 1 + k] for k in range(4)], axis=1)
    batch = {
        "obs": obs,
        "action": np.asarray(acts[4 : n + 4], dtype=np.int32),
        "reward": np.asarray(rews[4 : n + 4], dtype=np.float32),
        "discount": np.where(np.asarray(dones[4 : n + 4]), 0.0, 0.99).astype(np.float32),
        "next_obs": nxt,
    }
    return batch, source


def save_batches(path: str, batches: list[tuple]) -> None:
    """(data, offsets) batches, or (data, offsets, FrameChunks) ones (Atari frames stored once)."""
    arrs = {}
    for i, b in enumerate(batches):
        arrs[f"d{i}"], arrs[f"o{i}"] = b[0], b[1]
        if len(b) > 2:
            fc = b[2]
            arrs[f"r{i}"], arrs[f"ro{i}"] = fc.item_chunks, fc.item_chunk_offsets
            arrs[f"c{i}"], arrs[f"co{i}"] = np.frombuffer(fc.chunk_data, np.uint8), fc.chunk_offsets
    np.savez(path, **arrs)


def load_batches(path: str) -> list[tuple]:
    """What save_batches wrote: chunks come back as the 4-tuple of FrameChunks' frames."""
    z = np.load(path)
    n = sum(1 for f in z.files if f.startswith("d"))
    if "r0" not in z.files:
        return [(z[f"d{i}"], z[f"o{i}"]) for i in range(n)]
    from apexrl.replay.wire.protocol import FrameChunks  # only a tree with frame chunks writes them

    return [
        (z[f"d{i}"], z[f"o{i}"], FrameChunks(z[f"r{i}"], z[f"ro{i}"], z[f"c{i}"].tobytes(), z[f"co{i}"]))
        for i in range(n)
    ]


# ---------------------------------------------------------------------------------------------- workers


def actor_main(args: argparse.Namespace) -> None:
    from apexrl.replay.client.sharded import connect

    batches = load_batches(args.payload)
    rng = np.random.default_rng(args.seed)
    prios = [rng.uniform(0.1, 2.0, INSERT_BATCH) for _ in range(16)]
    lat: list[float] = []
    n = 0
    i = 0
    removes = 0
    pipelined = args.insert_mode == "pipelined"
    with connect(args.endpoint, timeout=30, curve=args.curve_dir) as c:
        # pipelined: up to --max-in-flight inserts unanswered; latency = send to acknowledgement
        ins = c.inserter(max_in_flight=args.max_in_flight, on_ack=lambda _k, s: lat.append(s)) if pipelined else None
        while time.time() < args.start_at:
            time.sleep(0.001)
        end = args.start_at + args.seconds
        while True:
            d, o, *fc = batches[i % len(batches)]
            more = {"chunks": fc[0]} if fc else {}  # a batch's own frame chunks, sent with it
            if ins is not None:
                ins.insert(prios[i % 16], data=d, offsets=o, **more)
            else:
                t0 = time.perf_counter()
                c.insert(prios[i % 16], data=d, offsets=o, **more)
                lat.append(time.perf_counter() - t0)
            n += INSERT_BATCH
            i += 1
            if args.seed == 0 and i % 100 == 0:
                c.remove_to_fit()
                removes += 1
            if time.time() >= end:
                break
        if ins is not None:
            ins.close()  # every insert acknowledged (raises if any failed)
            st = ins.stats()
            assert st["acked_items"] == n and st["failed"] == 0, st
        elapsed = time.time() - args.start_at
    with open(args.out, "w") as f:  # a file, not stdout: a large result would fill the pipe and deadlock
        json.dump({"items": n, "elapsed": elapsed, "lat": lat, "requests": i + removes}, f)


def learner_main(args: argparse.Namespace) -> None:
    from apexrl.replay.client.sharded import connect
    from apexrl.replay.wire.codec import TransitionSpec

    spec = TransitionSpec.atari() if args.shape == "atari" else TransitionSpec.dpg(67, 21)
    codec = None
    if args.shape == "atari":
        try:  # a tree that stores Atari frames once decodes through its one decode function
            from apexrl.replay.wire.frames import decode_valid, frame_codec

            codec = frame_codec(spec)
        except ImportError:
            pass
    rng = np.random.default_rng(1234)
    lat: list[float] = []
    dec_s = 0.0
    n = 0
    mode = args.sampling
    sync_updates = args.updates == "sync"
    with connect(args.endpoint, timeout=30, curve=args.curve_dir) as c, c.updater(max_pending=64) as up:
        sampler = None
        updates_sent = 0
        if mode != "sync":  # the learner's path: a PrefetchingSampler with that many requests in flight
            threads = len(args.endpoint.split(",")) if mode == "auto" else int(mode)
            sampler = c.sampler(SAMPLE_BATCH, BETA, prefetch=16, sample_threads=threads)
        queue = args.table_kind == ["queue"]  # the worker is given one kind
        if queue and sampler is not None:
            raise SystemExit("bench_wire: a queue table's learner samples with --sample-threads sync only")
        while time.time() < args.start_at:
            time.sleep(0.001)
        end = args.start_at + args.seconds
        while True:
            t0 = time.perf_counter()
            if queue:  # a queue's SAMPLE waits while it is empty (never past the window) and may return fewer
                from apexrl.errors import ServerTimeoutError

                try:
                    b = c.sample(SAMPLE_BATCH, BETA, timeout=max(0.05, end - time.time()))
                except ServerTimeoutError:  # empty until the window's end: the actors had stopped
                    break
            else:
                b = c.sample(SAMPLE_BATCH, BETA) if sampler is None else sampler.next().raw  # sampler: the wait
            t1 = time.perf_counter()
            lat.append(t1 - t0)
            if args.shape == "atari":
                if codec is not None and getattr(b, "chunks", None) is not None:  # items referencing chunks
                    out, bad, message = decode_valid(spec, codec, b)
                    assert bad is None, message
                else:
                    out = spec.decode_batch(b)
                assert out["obs"].shape == (SAMPLE_BATCH, 4, 84, 84)
                dec_s += time.perf_counter() - t1
            # a queue's keys are gone once sampled: its updates are counted stale (the same messages as the others)
            if sync_updates:  # a client that waits for every reply
                c.update_priorities(b.keys, rng.uniform(0.1, 2.0, len(b.keys)))
                updates_sent += 1
            else:
                up.update(b.keys, rng.uniform(0.1, 2.0, len(b.keys)))
            n += len(b)
            if time.time() >= end:
                break
        elapsed = time.time() - args.start_at
        sample_requests = len(lat)
        if sampler is not None:  # requests sent: the batches fetched and the ones still in flight
            st = sampler.stats()
            sample_requests = st["fetched"] + st["in_flight"]
            sampler.close()
        ustats = up.stats()
    with open(args.out, "w") as f:
        json.dump(
            {
                "items": n,
                "elapsed": elapsed,
                "lat": lat,
                "decode_s": dec_s,
                "updater": ustats,
                "requests": sample_requests + updates_sent + ustats["sent"] + ustats["failed"],
            },
            f,
        )


def conns_main(args: argparse.Namespace) -> None:
    """--sockets DEALER sockets in this process, each an active client connection: INSERTs of 50 pre-encoded items
    sent round robin over the sockets at --rate requests/s in total (paced, so the offered load does not depend
    on the number of sockets), every reply received; then up to 10 s to collect the late ones."""
    import zmq

    from apexrl.replay.wire import protocol as P

    batches = load_batches(args.payload)
    rng = np.random.default_rng(args.seed)
    prios = [rng.uniform(0.1, 2.0, INSERT_BATCH) for _ in range(16)]
    session = int(rng.integers(1, 1 << 62))
    ctx = zmq.Context()
    socks = []
    for _ in range(args.sockets):
        sk = ctx.socket(zmq.DEALER)
        sk.setsockopt(zmq.LINGER, 0)
        sk.connect(args.endpoint)
        socks.append(sk)
    poller = zmq.Poller()
    for sk in socks:
        poller.register(sk, zmq.POLLIN)
    sent = replied = errors = 0
    seq = 0

    def drain(timeout_ms: float) -> None:
        nonlocal replied, errors
        for sk, _ev in poller.poll(max(0.0, timeout_ms)):
            while True:
                try:
                    frames = sk.recv_multipart(zmq.NOBLOCK, copy=False)
                except zmq.Again:
                    break
                replied += 1
                if frames[0].buffer[16:18] != b"\0\0":  # status != OK
                    errors += 1

    while time.time() < args.start_at:
        time.sleep(0.001)
    period = 1.0 / args.rate
    t0 = time.perf_counter()
    end = t0 + args.seconds
    next_send = t0
    while True:
        now = time.perf_counter()
        if now >= end:
            break
        if now >= next_send:
            d, o = batches[sent % len(batches)]
            seq += 1
            frames = P.encode_insert(seq, prios[sent % 16], d, o, 0, (session, seq))
            socks[sent % len(socks)].send_multipart(frames, copy=False)
            sent += 1
            next_send += period
        else:
            drain(1e3 * (next_send - now))
    send_end = time.perf_counter()
    deadline = time.perf_counter() + 10
    while replied < sent and time.perf_counter() < deadline:
        drain(50)
    for sk in socks:
        sk.close(0)
    ctx.term()
    with open(args.out, "w") as f:
        json.dump({"sent": sent, "replied": replied, "errors": errors, "send_s": send_end - t0}, f)


def floor_main(args: argparse.Namespace) -> None:
    """The bare-ZeroMQ floor: a pyzmq ROUTER that does no work. Every request gets a canned, valid reply of the
    size the replay server would send (INSERT n: header + keys 8n; SAMPLE n: header + keys 8n, weights 4n,
    probabilities 8n, offsets 8(n+1), n items of --item-bytes, totals 16, store_size 8; UPDATE_PRIORITIES,
    REMOVE_TO_FIT, ERASE: header only; HELLO and STATS: small JSON), only the request id patched in. Stops on
    SIGTERM, or by itself after --lifetime seconds."""
    import zmq

    from apexrl.replay.wire import protocol as P

    item_bytes = args.item_bytes
    stop = []
    signal.signal(signal.SIGTERM, lambda *_: stop.append(1))
    signal.signal(signal.SIGINT, lambda *_: stop.append(1))
    canned: dict[tuple[int, int], list[bytes]] = {}

    def reply_of(op: int, n: int) -> list[bytes]:
        key = (op, n if op in (P.Op.INSERT, P.Op.SAMPLE) else 0)
        frames = canned.get(key)
        if frames is None:
            if op == P.Op.INSERT:
                frames = P.encode_insert_reply(0, np.arange(n, dtype=np.uint64))
            elif op == P.Op.SAMPLE:
                frames = P.encode_sample_reply(
                    0,
                    np.arange(n, dtype=np.uint64),
                    np.ones(n, np.float32),
                    np.full(n, 1.0 / 2e6),
                    np.arange(n + 1, dtype=np.uint64) * item_bytes,
                    bytes(n * item_bytes),
                    (1.0, 0.5),
                    (2_000_000,),
                )
            elif op in (P.Op.UPDATE_PRIORITIES, P.Op.REMOVE_TO_FIT, P.Op.ERASE):
                frames = P.encode_count_reply(P.Op(op), 0, 0)
            elif op == P.Op.HELLO:
                frames = P.encode_hello_reply(
                    0,
                    {
                        "protocol_version": P.PROTOCOL_VERSION,
                        "max_request_bytes": 256 << 20,
                        "max_reply_bytes": 256 << 20,
                        "num_shards": 8,
                    },
                    # the client looks a sampled table up in HELLO's tables (v5): one table, no pinned spec
                    tables_json=json.dumps([{"name": "default", "index": 0}]),
                )
            else:  # STATS: what the bench reads afterwards
                frames = P.encode_stats_reply(0, {"size": 2_000_000, "bytes_held": 2_000_000 * item_bytes})
            frames = [bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f for f in frames]
            canned[key] = frames
        return frames

    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.SNDHWM, 0)
    sock.setsockopt(zmq.RCVHWM, 0)
    if args.curve_dir:
        from apexrl.security import secure_server_socket

        secure_server_socket(sock, args.curve_dir)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    print(f"floor server listening on tcp://127.0.0.1:{port}", flush=True)
    deadline = time.monotonic() + args.lifetime
    served = 0
    while not stop and time.monotonic() < deadline:
        if not sock.poll(100):
            continue
        for _ in range(1000):  # drain what is queued, then look at the stop flag again
            try:
                msg = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            hdr = msg[1].buffer
            op, n = int.from_bytes(hdr[6:8], "little"), int.from_bytes(hdr[20:24], "little")
            frames = reply_of(op, n)
            head = bytearray(frames[0])
            head[8:16] = hdr[8:16]  # the request id
            sock.send_multipart([msg[0], head, *frames[1:]], copy=False)
            served += 1
    sock.close(0)
    ctx.term()


# ------------------------------------------------------------------------------------------------ driver


def prefill(endpoint: str, batches: list[tuple], n_items: int, chunk: int = 20, curve_dir: str | None = None) -> None:
    """Insert n_items by sending `chunk` pre-encoded 50-item batches concatenated per request (round robin over
    the servers when `endpoint` names several); batches with frame chunks one per request, with their chunks."""
    from apexrl.replay.client.sharded import connect

    rng = np.random.default_rng(7)
    if len(batches[0]) > 2:
        with connect(endpoint, timeout=120, curve=curve_dir) as c:
            done = k = 0
            while done < n_items:
                d, o, fc = batches[k % len(batches)]
                c.insert(rng.uniform(0.1, 2.0, len(o) - 1), data=d, offsets=o, chunks=fc)
                done, k = done + len(o) - 1, k + 1
        return
    big = []
    for j in range(0, len(batches), chunk):
        part = batches[j : j + chunk]
        data = np.concatenate([d for d, _ in part])
        offs, base = [np.zeros(1, np.uint64)], 0
        for d, o in part:
            offs.append(o[1:].astype(np.uint64) + np.uint64(base))
            base += d.size
        big.append((data, np.concatenate(offs)))
    done = 0
    with connect(endpoint, timeout=120, curve=curve_dir) as c:
        k = 0
        while done < n_items:
            d, o = big[k % len(big)]
            m = len(o) - 1
            c.insert(rng.uniform(0.1, 2.0, m), data=d, offsets=o)
            done += m
            k += 1


def run_config(
    shape: str,
    k: int,
    payload: str,
    batches,
    capacity: int,
    prefill_n: int,
    seconds: float,
    actor_flags: list[str],
    spec_json: str | None = None,
    curve_dir: str | None = None,
    servers: int = 1,
    kind: str = "native",
    server_python: str | None = None,
    item_bytes: int = 632,
    worker_python: str | None = None,
    sampling: str = "sync",
    learner_flags: list[str] | None = None,
    table_kind: str = "prioritized",
    server_flags: list[str] | None = None,
) -> dict:
    """One timed window: `servers` replay servers splitting `capacity` (the workers reach them through one
    ShardedReplayClient each when there are several), k actor processes and one learner process. ``kind``:
    which server (see :class:`Server`). The servers' CPU time (utime + stime) is read when the workers start
    their clocks and again when the last one has exited (every reply received): ``server_cpu_us_per_request``
    divides it by the requests the workers sent in that time (inserts, remove_to_fit, samples, updates).
    ``worker_python``: the whole stack (server, prefill, actors, learner) under that interpreter (an older tree).
    ``sampling``: how the learner samples (see --sample-threads). ``table_kind``: the servers' one table
    ``default`` (:func:`tables_of`); the workers use the table ``default`` whatever its kind. ``server_flags``:
    more flags for every server (e.g. a disk table's ``--storage disk --storage-path DIR``)."""
    outdir = os.path.dirname(payload)
    py = worker_python or sys.executable
    if worker_python is not None:
        kind, server_python = "old", worker_python
    from apexrl.replay.client.sharded import connect

    flags = (["--spec", spec_json] if spec_json else []) + ([] if curve_dir is None else ["--curve-dir", curve_dir])
    flags += server_flags or []
    group: list[Server] = []
    procs: list[subprocess.Popen] = []
    try:
        for i in range(servers):
            if kind == "floor":
                fl = ["--item-bytes", str(item_bytes)] + ([] if curve_dir is None else ["--curve-dir", curve_dir])
                group.append(Server(0, fl, kind="floor"))
            else:
                group.append(
                    Server(
                        -(-capacity // servers),
                        flags + ["--seed", str(i)],
                        kind=kind,
                        python=server_python,
                        table_kind=table_kind,
                    )
                )
        endpoint = ",".join(s.endpoint for s in group)
        t0 = time.perf_counter()
        if worker_python is not None:  # that tree's client speaks that tree's protocol
            subprocess.run(
                [
                    py,
                    HERE,
                    "--worker",
                    "prefill",
                    "--payload",
                    payload,
                    "--endpoint",
                    endpoint,
                    "--items",
                    str(prefill_n),
                    *([] if curve_dir is None else ["--curve-dir", curve_dir]),
                ],
                check=True,
            )
        else:
            prefill(endpoint, batches, prefill_n, curve_dir=curve_dir)
        prefill_s = time.perf_counter() - t0
        start_at = time.time() + 2.0  # time for the workers to import and connect
        common = [
            "--endpoint",
            endpoint,
            "--start-at",
            repr(start_at),
            "--seconds",
            str(seconds),
            "--shape",
            shape,
            *([] if curve_dir is None else ["--curve-dir", curve_dir]),
        ]
        for a in range(k):
            procs.append(
                subprocess.Popen(
                    [
                        py,
                        HERE,
                        "--worker",
                        "actor",
                        "--payload",
                        payload,
                        "--seed",
                        str(a),
                        "--out",
                        os.path.join(outdir, f"actor{a}.json"),
                        *common,
                        *actor_flags,
                    ]
                )
            )
        procs.append(
            subprocess.Popen(
                [
                    py,
                    HERE,
                    "--worker",
                    "learner",
                    "--sampling",
                    sampling,
                    *(["--table-kind", table_kind] if table_kind != "prioritized" else []),
                    "--out",
                    os.path.join(outdir, "learner.json"),
                    *common,
                    *(learner_flags or []),
                ]
            )
        )
        # Server RSS sampled during the run (peak) and after; server CPU from the workers' start to their end.
        peak = [0]

        def sample_rss() -> None:
            peak[0] = max(peak[0], sum(rss_of(s.pid) for s in group))

        by_thread: dict[str, float] = {}
        switches: dict[str, int] = {}
        server_cpu, results = await_workers(
            procs,
            [f"actor{a}.json" for a in range(k)] + ["learner.json"],
            outdir,
            start_at,
            [s.pid for s in group],
            on_poll=sample_rss,
            by_thread=by_thread,
            switches=switches,
        )
        cpu_window = time.time() - start_at
        if worker_python is not None:  # asked in that tree's protocol
            stats_path = os.path.join(outdir, "stats.json")
            subprocess.run(
                [
                    py,
                    HERE,
                    "--worker",
                    "stats",
                    "--endpoint",
                    endpoint,
                    "--out",
                    stats_path,
                    *([] if curve_dir is None else ["--curve-dir", curve_dir]),
                ],
                check=True,
            )
            with open(stats_path) as f:
                st = json.load(f)
        else:
            with connect(endpoint, timeout=30, curve=curve_dir) as c:
                st = c.stats()
        rss = sum(rss_of(s.pid) for s in group)
    except BaseException:
        kill_all(procs)
        raise
    finally:
        for server in group:
            server.close()
    actors, learner = results[:-1], results[-1]
    ins_lat = [x for a in actors for x in a["lat"]]
    requests = sum(r["requests"] for r in results)
    size = int(st.get("size", 0))
    return {
        "shape": shape,
        "servers": servers,
        "actors": k,
        "sampling": sampling,
        "table": table_kind,
        "spec": bool(spec_json),
        "curve": curve_dir is not None,
        "prefill": prefill_n,
        "prefill_s": prefill_s,
        "inserted_per_s": sum(a["items"] / a["elapsed"] for a in actors),
        "sampled_per_s": learner["items"] / learner["elapsed"],
        "sample_p50_ms": pct(learner["lat"], 50),
        "sample_p99_ms": pct(learner["lat"], 99),
        "insert_p50_ms": pct(ins_lat, 50),
        "insert_p99_ms": pct(ins_lat, 99),
        "decode_ms_per_batch": 1e3 * learner["decode_s"] / max(1, len(learner["lat"])),
        "server_rss_gb": rss / 1e9,
        "server_peak_rss_gb": peak[0] / 1e9,
        "size": size,
        "bytes_per_item": (st.get("bytes_held", 0) / size) if size else float("nan"),
        "updater": learner["updater"],
        "kind": kind,
        "requests": requests,
        "server_cpu_s": server_cpu,
        "cpu_window_s": cpu_window,
        "server_cpu_us_per_request": 1e6 * server_cpu / max(1, requests),
        "server_voluntary_switches_per_request": switches.get("voluntary", 0) / max(1, requests),
        "server_nonvoluntary_switches_per_request": switches.get("nonvoluntary", 0) / max(1, requests),
        "disk_stats": {name[len("table.default.") :]: v for name, v in st.items() if ".disk_" in name},
        "server_cpu_us_per_request_by_thread": {
            g: 1e6 * sec / max(1, requests) for g, sec in sorted(by_thread.items())
        },
    }


def run_conns(
    kind: str,
    connections: int,
    processes: int,
    rate: float,
    seconds: float,
    payload: str,
    server_python: str | None = None,
) -> dict:
    """One window of the connection-count measure: a fresh server of ``kind``, ``processes`` client processes
    holding ``connections`` DEALER sockets in all, INSERTs of 50 at ``rate`` requests/s in total (paced). The
    server's CPU time from the start of the clients' clocks to their end (every reply received) / replies."""
    outdir = os.path.dirname(payload)
    server_python = server_python if kind == "old" else None
    server = Server(2_000_000, ["--item-bytes", "632"] if kind == "floor" else [], kind=kind, python=server_python)
    py = server_python or sys.executable  # the old server speaks its own protocol version: its tree's client code
    procs: list[subprocess.Popen] = []
    try:
        start_at = time.time() + 2.0 + connections / 200  # time to import and connect every socket
        per = [connections // processes + (1 if i < connections % processes else 0) for i in range(processes)]
        for i, m in enumerate(per):
            procs.append(
                subprocess.Popen(
                    [
                        py,
                        HERE,
                        "--worker",
                        "conns",
                        "--payload",
                        payload,
                        "--endpoint",
                        server.endpoint,
                        "--start-at",
                        repr(start_at),
                        "--seconds",
                        str(seconds),
                        "--sockets",
                        str(m),
                        "--rate",
                        str(rate / processes),
                        "--seed",
                        str(i),
                        "--out",
                        os.path.join(outdir, f"conns{i}.json"),
                    ]
                )
            )
        server_cpu, results = await_workers(
            procs,
            [f"conns{i}.json" for i in range(len(procs))],
            outdir,
            start_at,
            [server.pid],
            what="connection worker",
        )
    except BaseException:
        kill_all(procs)
        raise
    finally:
        server.close()
    sent, replied = sum(r["sent"] for r in results), sum(r["replied"] for r in results)
    return {
        "kind": kind,
        "connections": connections,
        "sent": sent,
        "replied": replied,
        "errors": sum(r["errors"] for r in results),
        "offered_per_s": sent / max(r["send_s"] for r in results),
        "server_cpu_s": server_cpu,
        "server_cpu_us_per_request": 1e6 * server_cpu / max(1, replied),
    }


REVERB_WORKER = os.path.join(os.path.dirname(HERE), "reverb_worker.py")


def run_reverb(k: int, payload: str, seconds: float, reverb_python: str, table_kind: str = "prioritized") -> dict:
    """One window of Reverb (bench/reverb_worker.py under ``reverb_python``): its server with a 2M table of
    ``table_kind`` (prioritized, uniform, or ``Table.queue``), k actor processes writing the same 632-byte items
    (flush every 50), one learner sampling 512 and mutating 512 priorities."""
    outdir = os.path.dirname(payload)
    table = ["--table", table_kind]
    server = subprocess.Popen(
        [reverb_python, REVERB_WORKER, "server", "--capacity", "2000000", *table],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    procs: list[subprocess.Popen] = []
    try:
        assert server.stdout is not None
        port = None
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            line = server.stdout.readline()
            if not line:
                break
            if "reverb listening on" in line:
                port = line.split()[-1]
                break
        if port is None:
            raise RuntimeError("reverb server did not report its port")
        start_at = time.time() + 8.0  # TensorFlow imports slowly
        common = ["--port", port, "--start-at", repr(start_at), "--seconds", str(seconds), *table]
        for a in range(k):
            procs.append(
                subprocess.Popen(
                    [
                        reverb_python,
                        REVERB_WORKER,
                        "actor",
                        "--payload",
                        payload,
                        "--seed",
                        str(a),
                        "--out",
                        os.path.join(outdir, f"rv_actor{a}.json"),
                        *common,
                    ],
                    stderr=subprocess.DEVNULL,
                )
            )
        procs.append(
            subprocess.Popen(
                [reverb_python, REVERB_WORKER, "learner", "--out", os.path.join(outdir, "rv_learner.json"), *common],
                stderr=subprocess.DEVNULL,
            )
        )
        server_cpu, results = await_workers(
            procs,
            [f"rv_actor{a}.json" for a in range(k)] + ["rv_learner.json"],
            outdir,
            start_at,
            [server.pid],
            what="reverb worker",
        )
    finally:
        kill_all(procs)
        if server.poll() is None:
            server.send_signal(signal.SIGTERM)
            try:
                server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                server.kill()
                server.wait()
        if server.stdout is not None:
            server.stdout.close()
    requests = sum(r["requests"] for r in results)
    return {
        "kind": "reverb",
        "table": table_kind,
        "curve": False,
        "inserted_per_s": sum(r["items"] / r["elapsed"] for r in results[:-1]),
        "sampled_per_s": results[-1]["items"] / results[-1]["elapsed"],
        "requests": requests,
        "server_cpu_s": server_cpu,
        "cpu_window_s": seconds,
        "server_cpu_us_per_request": 1e6 * server_cpu / max(1, requests),
    }


def rss_1m(n: int) -> dict:
    batches = dpg_batches(99)
    server = Server(max(n, 2_000_000))
    try:
        base = rss_of(server.pid)
        prefill(server.endpoint, batches, n)
        time.sleep(0.5)
        rss = rss_of(server.pid)
        from apexrl.replay.client.replay_client import ReplayClient

        with ReplayClient(server.endpoint) as c:
            st = c.stats()
    finally:
        server.close()
    return {
        "items": int(st["size"]),
        "rss_gb": rss / 1e9,
        "idle_rss_gb": base / 1e9,
        "bytes_held": int(st.get("bytes_held", 0)),
    }


def codec_speed(spec, batch: dict, payload_batches) -> dict:
    n = batch["obs"].shape[0]
    raw = spec.raw_item_bytes * n if hasattr(spec, "raw_item_bytes") else None
    t0 = time.perf_counter()
    data, offs = spec.encode(batch)
    enc = time.perf_counter() - t0
    t0 = time.perf_counter()
    reps = 3
    for _ in range(reps):
        spec.decode(data, offs)
    dec = (time.perf_counter() - t0) / reps
    raw_bytes = n * 2 * 4 * 84 * 84 + n * 12  # obs + next_obs u8 stacks + action/reward/discount
    return {
        "n": n,
        "raw_bytes": raw_bytes,
        "item_bytes": int(data.size),
        "ratio": raw_bytes / data.size,
        "bytes_per_item": data.size / n,
        "encode_mb_s": raw_bytes / enc / 1e6,
        "decode_mb_s": raw_bytes / dec / 1e6,
        "spec_raw": raw,
    }


def spec_check_cost(spec, batches, reps: int = 200) -> dict:
    """Seconds the server's spec check (validate_items) takes per insert batch, best of ``reps`` rounds."""
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        for data, offsets in batches:
            spec.validate_items(data, offsets)
        best = min(best, (time.perf_counter() - t0) / len(batches))
    n = len(batches[0][1]) - 1
    return {"us_per_batch": best * 1e6, "us_per_item": best * 1e6 / n, "items_per_batch": n}


def spec_runs(spec_check: str) -> list[bool]:
    return {"off": [False], "on": [True], "both": [False, True]}[spec_check]


def sampling_mode(text: str) -> str:
    """--sample-threads value: sync, auto or a thread count from 1 to 16."""
    if text in ("sync", "auto") or (text.isdigit() and 1 <= int(text) <= 16):
        return text
    raise argparse.ArgumentTypeError(f"{text!r}: give sync, auto or a number of threads from 1 to 16")


def configs(args: argparse.Namespace, curve_dirs: list[str | None]):
    """(actors, spec check, CURVE key dir, learner sampling, servers) of each timed window, the server counts
    innermost so that the windows compared in a ratio run next to each other."""
    for k in args.actors:
        for checked in spec_runs(args.spec_check):
            for curve_dir in curve_dirs:
                for sampling in args.sample_threads:
                    for servers in args.servers:
                        yield k, checked, curve_dir, sampling, servers


def server_ratios(rows: list[dict]) -> list[str]:
    """Each K > 1 window against the K = 1 window with the same shape, actors, spec, CURVE and learner sampling."""
    out = []
    same = lambda a, b: all(a[f] == b[f] for f in ("shape", "actors", "spec", "curve", "sampling"))  # noqa: E731
    for r in rows:
        base = next((b for b in rows if b["servers"] == 1 and same(b, r)), None)
        if r["servers"] > 1 and base is not None:
            out.append(
                f"{r['shape']}, {r['actors']} actor(s), learner sampling {r['sampling']}, "
                f"{r['servers']} servers / 1: inserted/s "
                f"{r['inserted_per_s'] / base['inserted_per_s']:.3f}, sampled/s "
                f"{r['sampled_per_s'] / base['sampled_per_s']:.3f}, sample p50 "
                f"{r['sample_p50_ms'] / base['sample_p50_ms']:.3f}"
            )
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seconds", type=float, default=10.0, help="timed window per configuration (default 10)")
    p.add_argument("--quick", action="store_true", help="smoke run: 1 s windows, small prefill, no 1M RSS")
    p.add_argument("--prefill", type=int, default=200_000, help="DPG items inserted before timing (default 200k)")
    p.add_argument("--atari-transitions", type=int, default=3000, help="distinct Pong transitions (default 3000)")
    p.add_argument("--atari-prefill", type=int, default=20_000, help="Atari items before timing (default 20k)")
    p.add_argument("--rss-items", type=int, default=1_000_000, help="DPG items for the RSS measure (default 1M)")
    p.add_argument("--actors", type=int, nargs="+", default=[1, 2])
    p.add_argument(
        "--servers",
        type=int,
        nargs="+",
        default=[1],
        help="replay server counts to run, e.g. 1 2 4: the capacity is split over them and workers use a "
        "ShardedReplayClient (default 1); the summary gives each K's ratio to K=1",
    )
    p.add_argument(
        "--sample-threads",
        metavar="MODE",
        type=sampling_mode,
        nargs="+",
        default=["sync"],
        help="how the learner samples, one window each: sync (default: client.sample(), one request "
        "at a time, the round trip in every batch), N (the learner's path: client.sampler() with N "
        "SAMPLE requests in flight, prefetch 16; its latency is the wait for each batch) or auto "
        "(N = the number of servers, the learner's default)",
    )
    p.add_argument("--only", choices=("dpg", "atari"), action="append")
    p.add_argument(
        "--insert-mode",
        choices=("pipelined", "sync"),
        default="pipelined",
        help="actors: client.inserter() with --max-in-flight unanswered inserts (default), or "
        "client.insert() waiting for every reply",
    )
    p.add_argument("--max-in-flight", type=int, default=16, help="pipelined actors: unanswered inserts (default 16)")
    p.add_argument(
        "--spec-check",
        choices=("off", "on", "both"),
        default="off",
        help="start the server with --spec (every insert checked): off (default), on, or both side by side",
    )
    p.add_argument(
        "--curve",
        choices=("off", "on", "both"),
        default="off",
        help="CURVE encryption + allow-list: off (default), on, or both (each configuration plain, then "
        "with CURVE, and their ratio)",
    )
    p.add_argument(
        "--floor",
        action="store_true",
        help="side by side mode (DPG): the bare-ZeroMQ floor (a pyzmq server that does no work) measured in "
        "the same run, every figure as a fraction of it, and the server's CPU per request beside the "
        "floor's; windows interleaved over --rounds",
    )
    p.add_argument(
        "--server-python",
        metavar="PATH",
        default=None,
        help="side by side mode: also an older server, `PATH -m apexrl.cli.server` (e.g. the venv python of "
        "a worktree of an earlier commit), as an extra column",
    )
    p.add_argument("--rounds", type=int, default=3, help="side by side mode: rounds of interleaved windows (default 3)")
    p.add_argument(
        "--clients",
        choices=("pipelined", "waiting", "both"),
        default="both",
        help="side by side mode: how the clients talk. pipelined: actors keep --max-in-flight inserts "
        "unanswered (or as --insert-mode says) and the learner updates through client.updater(); waiting: every "
        "client waits for each reply (client.insert, client.sample, client.update_priorities one after "
        "another, as actors and simple clients talk); both (default): each, windows interleaved",
    )
    p.add_argument(
        "--connections",
        type=int,
        nargs="*",
        default=[],
        help="side by side mode: the servers' CPU per request with each number of active client "
        "connections (e.g. 4 256) at the same paced total load (--conn-rate)",
    )
    p.add_argument(
        "--conn-rate",
        type=float,
        default=2000.0,
        help="connections measure: INSERTs of 50 per second in total (default 2000)",
    )
    p.add_argument(
        "--conn-processes",
        type=int,
        default=4,
        help="connections measure: client processes the sockets are spread over (default 4)",
    )
    p.add_argument(
        "--table-kind",
        choices=TABLE_KINDS,
        nargs="+",
        default=["prioritized"],
        help="side by side mode: the kinds of table this tree's server runs, one window each per round (the "
        "floor and the old server: prioritized only): prioritized (default: the Ape-X table, today's flags), "
        "uniform (sampler uniform), queue (sampler fifo, max_times_sampled 1, a Queue limiter of the capacity; "
        "the learner's SAMPLE waits while it is empty); the workers use the table default either way, and "
        "with --reverb-python Reverb's windows run the same kinds",
    )
    p.add_argument(
        "--reverb-python",
        metavar="PATH",
        default=None,
        help="side by side mode: an interpreter that imports dm-reverb, for the inserts-vs-Reverb column",
    )
    # worker mode
    p.add_argument(
        "--games",
        default="Pong",
        help="Atari: comma-separated games whose real frames the Atari windows use (default Pong), "
        "e.g. Pong,Breakout,MsPacman",
    )
    p.add_argument(
        "--before-python",
        metavar="PATH",
        default=None,
        help="Atari: also run every window with the whole stack (server, prefill, actors, learner) of "
        "this interpreter (an older tree's venv, its own item layout), interleaved with this tree's "
        "over --rounds rounds, and print after / before ratios",
    )
    p.add_argument(
        "--worker", choices=("actor", "learner", "floor", "conns", "prefill", "stats"), help=argparse.SUPPRESS
    )
    p.add_argument("--items", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--sampling", default="sync", help=argparse.SUPPRESS)
    p.add_argument("--updates", choices=("async", "sync"), default="async", help=argparse.SUPPRESS)
    p.add_argument("--item-bytes", type=int, default=632, help=argparse.SUPPRESS)
    p.add_argument("--lifetime", type=float, default=1800.0, help=argparse.SUPPRESS)
    p.add_argument("--sockets", type=int, default=1, help=argparse.SUPPRESS)
    p.add_argument("--rate", type=float, default=100.0, help=argparse.SUPPRESS)
    p.add_argument("--endpoint", help=argparse.SUPPRESS)
    p.add_argument("--payload", help=argparse.SUPPRESS)
    p.add_argument("--start-at", type=float, help=argparse.SUPPRESS)
    p.add_argument("--shape", help=argparse.SUPPRESS)
    p.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--curve-dir", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker == "actor":
        return actor_main(args)
    if args.worker == "learner":
        return learner_main(args)
    if args.worker == "floor":
        return floor_main(args)
    if args.worker == "conns":
        return conns_main(args)
    if args.worker == "prefill":
        return prefill(args.endpoint, load_batches(args.payload), args.items, curve_dir=args.curve_dir)
    if args.worker == "stats":
        from apexrl.replay.client.sharded import connect

        with connect(args.endpoint, timeout=30, curve=args.curve_dir) as c, open(args.out, "w") as f:
            json.dump(c.stats(), f)
        return None
    if args.before_python:
        return frames_before_after(args)
    if args.floor or args.server_python or args.connections:
        return side_by_side(args)
    if args.table_kind != ["prioritized"]:
        p.error("--table-kind is a side by side option: give it with --floor, --server-python or --connections")

    if args.quick:
        args.seconds, args.prefill, args.atari_transitions, args.atari_prefill = 1.0, 20_000, 400, 5_000
        args.rss_items = 0
    shapes = args.only or ["dpg", "atari"]
    from apexrl.replay.wire.codec import TransitionSpec

    rows = []
    extra: list[str] = []
    actor_flags = ["--insert-mode", args.insert_mode, "--max-in-flight", str(args.max_in_flight)]
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        curve_dirs: list[str | None] = []
        if args.curve in ("off", "both"):
            curve_dirs.append(None)
        if args.curve in ("on", "both"):
            from apexrl.security import keygen

            keygen(os.path.join(tmp, "keys"))
            curve_dirs.append(os.path.join(tmp, "keys"))
        if "dpg" in shapes:
            batches = dpg_batches(0)
            path = os.path.join(tmp, "dpg.npz")
            save_batches(path, batches)
            print(
                f"DPG: TransitionSpec.dpg(67, 21), {batches[0][0].size // INSERT_BATCH} B/item, capacity 2M, "
                f"prefill {args.prefill} items",
                flush=True,
            )
            dpg = TransitionSpec.dpg(67, 21)
            cost = spec_check_cost(dpg, batches)
            extra.append(
                f"DPG spec check (validate_items, fixed-size items): {cost['us_per_batch']:.1f} us per "
                f"{cost['items_per_batch']}-item insert ({cost['us_per_item']:.2f} us/item)"
            )
            print(extra[-1], flush=True)
            for k, checked, curve_dir, sampling, servers in configs(args, curve_dirs):
                r = run_config(
                    "dpg",
                    k,
                    path,
                    batches,
                    2_000_000,
                    args.prefill,
                    args.seconds,
                    actor_flags,
                    dpg.to_json() if checked else None,
                    curve_dir,
                    servers,
                    sampling=sampling,
                )
                print(json.dumps(r), flush=True)
                rows.append(r)
        if "atari" in shapes:
            spec = TransitionSpec.atari()
            t0 = time.perf_counter()
            batch, source = pong_transitions(args.atari_transitions)
            print(
                f"Atari: {args.atari_transitions} transitions from {source} in {time.perf_counter() - t0:.1f}s",
                flush=True,
            )
            cs = codec_speed(spec, batch, None)
            extra.append(f"Atari source: {source}")
            extra.append(
                f"Atari codec on those frames ({cs['n']} transitions): raw {cs['raw_bytes'] / cs['n']:.0f} B -> "
                f"item {cs['bytes_per_item']:.0f} B per transition, compression ratio {cs['ratio']:.1f}x; "
                f"lz4 encode {cs['encode_mb_s']:.0f} MB/s, decode {cs['decode_mb_s']:.0f} MB/s "
                "(raw MB, spec.encode / spec.decode, one thread)"
            )
            print(extra[-1], flush=True)
            n = args.atari_transitions - args.atari_transitions % INSERT_BATCH
            batches = []
            for j in range(0, n, INSERT_BATCH):
                batches.append(spec.encode({k: v[j : j + INSERT_BATCH] for k, v in batch.items()}))
            path = os.path.join(tmp, "atari.npz")
            save_batches(path, batches)
            cost = spec_check_cost(spec, batches, reps=20)
            extra.append(
                f"Atari spec check (validate_items with the lz4 block-length walk): {cost['us_per_batch']:.1f} "
                f"us per {cost['items_per_batch']}-item insert ({cost['us_per_item']:.2f} us/item)"
            )
            print(extra[-1], flush=True)
            for k, checked, curve_dir, sampling, servers in configs(args, curve_dirs):
                r = run_config(
                    "atari",
                    k,
                    path,
                    batches,
                    1_000_000,
                    args.atari_prefill,
                    args.seconds,
                    actor_flags,
                    spec.to_json() if checked else None,
                    curve_dir,
                    servers,
                    sampling=sampling,
                )
                print(json.dumps(r), flush=True)
                rows.append(r)
        if args.curve == "both":
            extra.extend(curve_wire_speed(curve_dirs[-1]))
            print("\n".join(extra[-2:]), flush=True)
    if args.rss_items:
        r = rss_1m(args.rss_items)
        extra.append(
            f"Server RSS holding {r['items']:,} DPG items: {r['rss_gb']:.3f} GB "
            f"(idle server {r['idle_rss_gb']:.3f} GB; bytes_held {r['bytes_held'] / 1e9:.3f} GB)"
        )
        print(extra[-1], flush=True)

    actor_mode = (
        f"pipelined (client.inserter(max_in_flight={args.max_in_flight}); insert latency = send to ack)"
        if args.insert_mode == "pipelined"
        else "sync (client.insert waits for each reply)"
    )
    print(
        f"\n## bench_wire ({args.seconds:g} s windows, total {time.perf_counter() - t_start:.0f} s; "
        f"learner: sample {SAMPLE_BATCH} [+ decode for Atari] + AsyncUpdater.update {SAMPLE_BATCH}; "
        f"actors: insert {INSERT_BATCH}/request, {actor_mode}; cpus {os.cpu_count()})\n"
    )
    print(
        "| shape | servers | actors | learner sampling | server --spec | CURVE | prefill | inserted/s | sampled/s "
        "| sample p50 / p99 ms | insert p50 / p99 ms | decode ms/512 | server RSS GB (peak) | bytes/item held |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        dec = f"{r['decode_ms_per_batch']:.1f}" if r["shape"] == "atari" else "-"
        print(
            f"| {r['shape']} | {r['servers']} | {r['actors']} | {r['sampling']} | {'yes' if r['spec'] else 'no'} | "
            f"{'on' if r['curve'] else 'off'} | "
            f"{r['prefill']:,} | {r['inserted_per_s']:,.0f} | "
            f"{r['sampled_per_s']:,.0f} | {r['sample_p50_ms']:.2f} / {r['sample_p99_ms']:.2f} | "
            f"{r['insert_p50_ms']:.2f} / {r['insert_p99_ms']:.2f} | {dec} | "
            f"{r['server_rss_gb']:.3f} ({r['server_peak_rss_gb']:.3f}) | {r['bytes_per_item']:.0f} |"
        )
    for r in rows:
        if r["spec"]:
            key = ("shape", "actors", "curve", "servers", "sampling")
            base = next((b for b in rows if not b["spec"] and all(b[f] == r[f] for f in key)), None)
            if base is not None:
                curve = ", CURVE on" if r["curve"] else ""
                extra.append(
                    f"{r['shape']}, {r['actors']} actor(s){curve}: inserted/s with --spec / without = "
                    f"{r['inserted_per_s'] / base['inserted_per_s']:.3f}"
                )
    print()
    for line in extra + curve_ratios(rows) + server_ratios(rows):
        print("- " + line)


def median(xs: list[float]) -> float:
    return float(np.median(np.asarray(xs))) if xs else float("nan")


def frames_before_after(args: argparse.Namespace) -> None:
    """Atari, per game: this tree (frames stored once: items + frame chunks) against --before-python's tree
    (both stacks in every item), whole stacks, windows interleaved (before, after, before, after, ...)."""
    from apexrl.replay.wire.codec import TransitionSpec
    from apexrl.replay.wire.frames import frame_codec

    if args.quick:
        args.seconds, args.atari_transitions, args.atari_prefill = 2.0, 400, 2_000
    spec, k = TransitionSpec.atari(), max(args.actors)
    codec = frame_codec(spec)
    actor_flags = ["--insert-mode", args.insert_mode, "--max-in-flight", str(args.max_in_flight)]
    rows: list[dict] = []
    t_start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for game in args.games.split(","):
            batch, source = pong_transitions(args.atari_transitions, game=game)
            print(f"{game}: {args.atari_transitions} transitions from {source}", flush=True)
            n = args.atari_transitions - args.atari_transitions % INSERT_BATCH
            parts = [{f: v[j : j + INSERT_BATCH] for f, v in batch.items()} for j in range(0, n, INSERT_BATCH)]
            payloads = {}
            for side, encode in (("before", spec.encode), ("after", codec.encode)):
                os.makedirs(os.path.join(tmp, game, side), exist_ok=True)
                path = os.path.join(tmp, game, side, "atari.npz")
                batches = [encode(part) for part in parts]
                save_batches(path, batches)
                payloads[side] = (path, batches)
            for _round in range(args.rounds):
                for side in ("before", "after"):
                    path, batches = payloads[side]
                    r = run_config(
                        "atari",
                        k,
                        path,
                        batches,
                        1_000_000,
                        args.atari_prefill,
                        args.seconds,
                        actor_flags,
                        worker_python=args.before_python if side == "before" else None,
                    )
                    r.update(game=game, side=side)
                    print(json.dumps({key: v for key, v in r.items() if key != "updater"}), flush=True)
                    rows.append(r)
    med = lambda game, side, f: float(np.median([r[f] for r in rows if r["game"] == game and r["side"] == side]))  # noqa: E731
    print(
        f"\n## bench_wire --only atari, frames stored once ({args.rounds} rounds x {args.seconds:g} s windows, "
        f"before / after interleaved, {k} actors + 1 learner, total {time.perf_counter() - t_start:.0f} s; "
        f"before: {args.before_python}; medians)\n"
    )
    print(
        "| game | tree | inserted/s | sampled+decoded/s | decode ms/512 | bytes held/item | after / before: "
        "inserted, sampled+decoded, bytes held |"
    )
    print("|---|---|---|---|---|---|---|")
    for game in args.games.split(","):
        for side in ("before", "after"):
            ratio = ""
            if side == "after":
                ratio = " / ".join(
                    f"{med(game, 'after', f) / med(game, 'before', f):.2f}"
                    for f in ("inserted_per_s", "sampled_per_s", "bytes_per_item")
                )
            print(
                f"| {game} | {side} | {med(game, side, 'inserted_per_s'):,.0f} | "
                f"{med(game, side, 'sampled_per_s'):,.0f} | {med(game, side, 'decode_ms_per_batch'):.1f} | "
                f"{med(game, side, 'bytes_per_item'):.0f} | {ratio} |"
            )


def side_by_side(args: argparse.Namespace) -> None:
    """Floor / old server / this tree's server in one run, windows interleaved (A B C A B C ...), DPG."""
    kinds = ["floor"] * bool(args.floor) + ["old"] * bool(args.server_python) + ["native"]
    # (server, table kind) of every window in a round: only this tree's server has tables other than prioritized
    servers = [(kind, tk) for kind in kinds for tk in (args.table_kind if kind == "native" else ["prioritized"])]
    names = {
        "floor": "bare ZeroMQ floor (pyzmq, no work)",
        "old": f"old server ({args.server_python})",
        "native": "native server (this tree)",
    }
    k = max(args.actors)
    # pipelined: actors keep --max-in-flight inserts unanswered (or --insert-mode), the learner's updates go
    # through client.updater(); waiting: every client waits for each reply (insert, sample, update_priorities
    # one after another), as the actors and simple clients talk
    modes = ["pipelined", "waiting"] if args.clients == "both" else [args.clients]
    client_flags = {
        "pipelined": (["--insert-mode", args.insert_mode, "--max-in-flight", str(args.max_in_flight)], []),
        "waiting": (["--insert-mode", "sync"], ["--updates", "sync"]),
    }
    t_start = time.perf_counter()
    rows: list[dict] = []
    conn_rows: list[dict] = []
    notes: list[str] = []
    with tempfile.TemporaryDirectory() as tmp:
        curve_dirs: list[str | None] = [None] * (args.curve in ("off", "both"))
        if args.curve in ("on", "both"):
            from apexrl.security import keygen

            keygen(os.path.join(tmp, "keys"))
            curve_dirs.append(os.path.join(tmp, "keys"))
        batches = dpg_batches(0)
        path = os.path.join(tmp, "dpg.npz")
        save_batches(path, batches)
        item_bytes = batches[0][0].size // INSERT_BATCH
        print(
            f"side by side: {', '.join(names[x] for x in kinds)}; tables of this tree's server: "
            f"{', '.join(args.table_kind)}; DPG {item_bytes} B/item, {k} inserter "
            f"process(es) x {INSERT_BATCH} items/request, 1 learner sampling {SAMPLE_BATCH} + "
            f"updating {SAMPLE_BATCH}, capacity 2M, prefill {args.prefill}, {args.rounds} rounds x "
            f"{args.seconds:g} s windows; clients: {', '.join(modes)}",
            flush=True,
        )
        reverb = reverb_line(args)
        print("- " + reverb, flush=True)
        for rnd in range(args.rounds):
            for tk in args.table_kind if reverb.startswith("inserts vs Reverb: measured") else ():
                r = run_reverb(k, path, args.seconds, args.reverb_python, tk)
                r["round"] = rnd
                print(json.dumps(r), flush=True)
                rows.append(r)
            for curve_dir, mode in ((c, m) for c in curve_dirs for m in modes):
                actor_flags, learner_flags = client_flags[mode]
                for kind, tk in servers:
                    # "old": the whole older stack (server, prefill, actors, learner) under its interpreter, as
                    # its protocol version differs from this tree's
                    r = run_config(
                        "dpg",
                        k,
                        path,
                        batches,
                        2_000_000,
                        args.prefill,
                        args.seconds,
                        actor_flags,
                        None,
                        curve_dir,
                        1,
                        kind,
                        item_bytes=item_bytes,
                        worker_python=args.server_python if kind == "old" else None,
                        learner_flags=learner_flags,
                        table_kind=tk,
                    )
                    r["round"] = rnd
                    r["clients"] = mode
                    del r["updater"]
                    print(json.dumps(r), flush=True)
                    rows.append(r)
            for kind in kinds if args.connections else ():
                for conns in args.connections:
                    r = run_conns(
                        kind, conns, args.conn_processes, args.conn_rate, args.seconds, path, args.server_python
                    )
                    r["round"] = rnd
                    print(json.dumps(r), flush=True)
                    conn_rows.append(r)

    print(
        f"\n## bench_wire side by side ({args.rounds} rounds x {args.seconds:g} s windows interleaved, total "
        f"{time.perf_counter() - t_start:.0f} s; {k} inserter processes x {INSERT_BATCH}/request, 1 learner "
        f"sample {SAMPLE_BATCH} + update {SAMPLE_BATCH}; clients pipelined: inserts through "
        f"client.inserter(max_in_flight={args.max_in_flight}), updates through client.updater(); waiting: "
        "client.insert, client.sample and client.update_priorities, each waiting for its reply; loopback; cpus "
        f"{os.cpu_count()}; medians over rounds, ratios taken per round then the median; switches: the server's "
        "voluntary context switches per request)\n"
    )
    if rows:
        print(
            "| clients | server | CURVE | inserted/s | sampled/s | inserted / floor | sampled / floor | server CPU "
            "us/request | CPU / floor's | switches | requests/s |"
        )
        print("|---|---|---|---|---|---|---|---|---|---|---|")
        for mode, curve in ((m, c) for m in modes for c in sorted({r["curve"] for r in rows})):
            for kind, tk in servers:
                mine = [r for r in rows if is_window(r, kind, tk) and r["curve"] == curve and r.get("clients") == mode]
                floor = {
                    r["round"]: r
                    for r in rows
                    if r["kind"] == "floor" and r["curve"] == curve and r.get("clients") == mode
                }

                def ratio(field: str) -> str:
                    xs = [r[field] / floor[r["round"]][field] for r in mine if r["round"] in floor]
                    return f"{median(xs):.2f} ({min(xs):.2f}-{max(xs):.2f})" if xs else "-"

                def med(field: str, fmt: str = ",.0f") -> str:
                    xs = [r[field] for r in mine]
                    return f"{median(xs):{fmt}} ({min(xs):{fmt}}-{max(xs):{fmt}})"

                rps = [r["requests"] / r["cpu_window_s"] for r in mine]
                print(
                    f"| {mode} | {window_name(kind, tk)} | {'on' if curve else 'off'} | {med('inserted_per_s')} | "
                    f"{med('sampled_per_s')} | {ratio('inserted_per_s')} | {ratio('sampled_per_s')} | "
                    f"{med('server_cpu_us_per_request', '.1f')} | {ratio('server_cpu_us_per_request')} | "
                    f"{med('server_voluntary_switches_per_request', '.2f')} | {median(rps):,.0f} |"
                )
        if args.server_python:
            for mode, curve in ((m, c) for m in modes for c in sorted({r["curve"] for r in rows})):
                same = lambda r, kind: is_window(r, kind) and r["curve"] == curve and r.get("clients") == mode  # noqa: E731
                new = {r["round"]: r for r in rows if same(r, "native")}
                old = {r["round"]: r for r in rows if same(r, "old")}
                both = sorted(set(new) & set(old))
                parts = []
                for field, label in (
                    ("inserted_per_s", "inserted/s"),
                    ("sampled_per_s", "sampled/s"),
                    ("server_cpu_us_per_request", "server CPU per request"),
                ):
                    parts.append(f"{label} {median([new[i][field] / old[i][field] for i in both]):.2f}")
                notes.append(
                    f"native / old, {mode} clients, CURVE {'on' if curve else 'off'}, median of per-round ratios: "
                    + ", ".join(parts)
                )
        notes.extend(table_ratios(rows, servers, modes))
        print(
            "\nServer CPU us/request by thread (median over rounds; serve: the native loop's thread, workers: its "
            "sample workers, zmq_io: libzmq's I/O thread, other: the rest, where a Python server serves):\n"
        )
        for mode, curve in ((m, c) for m in modes for c in sorted({r["curve"] for r in rows})):
            for kind, tk in servers:
                mine = [
                    r["server_cpu_us_per_request_by_thread"]
                    for r in rows
                    if is_window(r, kind, tk)
                    and r["curve"] == curve
                    and r.get("clients") == mode
                    and "server_cpu_us_per_request_by_thread" in r
                ]
                groups = sorted({g for m in mine for g in m})
                print(
                    f"- {window_name(kind, tk)}, {mode} clients, CURVE {'on' if curve else 'off'}: "
                    + ", ".join(f"{g} {median([m.get(g, 0.0) for m in mine]):.1f}" for g in groups)
                )
    if conn_rows:
        print(
            f"\nServer CPU per request with N active client connections, same paced total load "
            f"({args.conn_rate:,.0f} INSERTs of {INSERT_BATCH} per second over {args.conn_processes} client "
            f"processes, sockets round robin):\n"
        )
        hi, lo = max(args.connections), min(args.connections)
        print(
            "| server | "
            + " | ".join(f"{n} conns: CPU us/request" for n in args.connections)
            + f" | {hi} / {lo} | offered requests/s | replies missing |"
        )
        print("|---|" + "---|" * (len(args.connections) + 3))
        for kind in kinds:
            mine = [r for r in conn_rows if r["kind"] == kind]
            cells = [
                f"{median([r['server_cpu_us_per_request'] for r in mine if r['connections'] == n]):.1f}"
                for n in args.connections
            ]
            by_round = {}
            for r in mine:
                by_round.setdefault(r["round"], {})[r["connections"]] = r["server_cpu_us_per_request"]
            ratios = [v[hi] / v[lo] for v in by_round.values() if hi in v and lo in v]
            rat = f"{median(ratios):.2f} ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-"
            missing = sum(r["sent"] - r["replied"] for r in mine)
            print(
                f"| {kind} | " + " | ".join(cells) + f" | {rat} | "
                f"{median([r['offered_per_s'] for r in mine]):,.0f} | {missing} |"
            )
    if any(r["kind"] == "reverb" for r in rows):
        for mode, (kind, tk) in ((m, s) for m in modes for s in servers):
            rv = {r["round"]: r for r in rows if is_window(r, "reverb", tk)}  # Reverb's table of the same kind
            mine = {
                r["round"]: r for r in rows if is_window(r, kind, tk) and not r["curve"] and r.get("clients") == mode
            }
            both = sorted(set(rv) & set(mine))
            if not both:
                continue
            ins = median([mine[i]["inserted_per_s"] / rv[i]["inserted_per_s"] for i in both])
            smp = median([mine[i]["sampled_per_s"] / rv[i]["sampled_per_s"] for i in both])
            rv_table = "" if tk == "prioritized" else f", {'Table.queue' if tk == 'queue' else 'a ' + tk + ' table'}"
            notes.append(
                f"vs Reverb, {window_name(kind, tk)}, {mode} clients: inserted/s {ins:.2f}x, sampled/s {smp:.2f}x Reverb's "
                f"(Reverb{rv_table}: "
                f"median {median([rv[i]['inserted_per_s'] for i in both]):,.0f} inserted/s, "
                f"{median([rv[i]['sampled_per_s'] for i in both]):,.0f} sampled/s; its fastest clients: a "
                "StructuredWriter flushing every 50, a TrajectoryDataset batched by 512)"
            )
    else:
        notes.append(reverb)
    print()
    for line in notes:
        print("- " + line)


def window_name(kind: str, table_kind: str) -> str:
    """A window's name in the tables: the server, and its table kind where that is not prioritized."""
    return kind if table_kind == "prioritized" else f"{kind} {table_kind}"


def is_window(row: dict, kind: str, table_kind: str = "prioritized") -> bool:
    """Whether ``row`` is a window of that server with that kind of table (rows before tables: prioritized)."""
    return row["kind"] == kind and row.get("table", "prioritized") == table_kind


def table_ratios(rows: list[dict], servers: list[tuple[str, str]], modes: list[str]) -> list[str]:
    """Each table kind of this tree's server against its prioritized table and against the old server's
    (prioritized: it has no other tables), medians of per-round ratios, per client mode and CURVE setting."""
    notes = []
    fields = (
        ("inserted_per_s", "inserted/s"),
        ("sampled_per_s", "sampled/s"),
        ("server_cpu_us_per_request", "server CPU per request"),
    )
    for mode, curve in ((m, c) for m in modes for c in sorted({r["curve"] for r in rows})):

        def by_round(kind: str, tk: str) -> dict[int, dict]:
            return {
                r["round"]: r
                for r in rows
                if is_window(r, kind, tk) and r["curve"] == curve and r.get("clients") == mode
            }

        for kind, tk in servers:
            if kind != "native" or tk == "prioritized":
                continue
            mine = by_round(kind, tk)
            for ref_kind in ("native", "old"):
                ref = by_round(ref_kind, "prioritized")
                both = sorted(set(mine) & set(ref))
                if not both:
                    continue
                parts = [f"{name} {median([mine[i][f] / ref[i][f] for i in both]):.2f}" for f, name in fields]
                notes.append(
                    f"native {tk} / {ref_kind} prioritized, {mode} clients, CURVE {'on' if curve else 'off'}, "
                    "median of per-round ratios: " + ", ".join(parts)
                )
    return notes


def reverb_line(args: argparse.Namespace) -> str:
    """Why the inserts-vs-Reverb column is absent (it is measured only with an interpreter that imports reverb)."""
    if args.reverb_python is None:
        return (
            "inserts vs Reverb: column skipped: no --reverb-python given (dm-reverb needs its own environment "
            "with TensorFlow; see bench/README.md)"
        )
    try:
        out = subprocess.run(
            [args.reverb_python, "-c", "import importlib.metadata as m, reverb; print(m.version('dm-reverb'))"],
            capture_output=True,
            text=True,
            timeout=120,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"inserts vs Reverb: column skipped: {args.reverb_python} could not run ({exc})"
    if out.returncode != 0:
        return (
            f"inserts vs Reverb: column skipped: {args.reverb_python} cannot import reverb: "
            f"{out.stderr.strip().splitlines()[-1] if out.stderr.strip() else out.returncode}"
        )
    return f"inserts vs Reverb: measured with {args.reverb_python} (dm-reverb {out.stdout.strip()})"


def curve_wire_speed(curve_dir: str, sizes=(32_000, 324_000), seconds: float = 1.0) -> list[str]:
    """MB/s of one ZeroMQ connection carrying messages of each size one way (ROUTER to DEALER, 16 in flight),
    plain and with CURVE: the cost of the encryption alone, without the replay server around it. 32 kB is an
    INSERT of 50 DPG items, 324 kB a SAMPLE reply of 512."""
    import zmq

    from apexrl.security import secure_client_socket, secure_server_socket

    def rate(curve: bool, size: int) -> float:
        ctx = zmq.Context()
        try:
            server, client = ctx.socket(zmq.ROUTER), ctx.socket(zmq.DEALER)
            for sock in (server, client):
                sock.setsockopt(zmq.LINGER, 0)
            if curve:
                secure_server_socket(server, curve_dir)
                secure_client_socket(client, curve_dir)
            client.connect(f"tcp://127.0.0.1:{server.bind_to_random_port('tcp://127.0.0.1')}")
            client.send(b"hello")
            peer, _ = server.recv_multipart()
            msg, n, t0 = b"x" * size, 0, time.perf_counter()
            while time.perf_counter() - t0 < seconds:
                for _ in range(16):
                    server.send_multipart([peer, msg])
                for _ in range(16):
                    client.recv()
                n += 16
            mb_s = n * size / (time.perf_counter() - t0) / 1e6
            server.close()
            client.close()
            return mb_s
        finally:
            ctx.term()

    lines = []
    for size in sizes:
        plain, curve = rate(False, size), rate(True, size)
        lines.append(
            f"one connection, {size // 1000} kB messages: plain {plain:,.0f} MB/s, CURVE {curve:,.0f} MB/s "
            f"(ratio {curve / plain:.2f})"
        )
    return lines


def curve_ratios(rows: list[dict]) -> list[str]:
    """One line per configuration measured both ways: CURVE's throughput as a fraction of plain TCP's."""
    key = lambda r: (r["shape"], r["actors"], r["spec"], r["servers"], r.get("sampling"))  # noqa: E731
    plain = {key(r): r for r in rows if not r["curve"]}
    lines = []
    for r in rows:
        base = plain.get(key(r)) if r["curve"] else None
        if base is not None:
            moved, base_moved = (x["inserted_per_s"] + x["sampled_per_s"] for x in (r, base))
            spec = ", server --spec" if r["spec"] else ""
            lines.append(
                f"CURVE / plain, {r['shape']} with {r['actors']} actor(s){spec}: inserted/s "
                f"{r['inserted_per_s'] / base['inserted_per_s']:.2f}, sampled/s "
                f"{r['sampled_per_s'] / base['sampled_per_s']:.2f}, inserted + sampled "
                f"{moved / base_moved:.2f} (on a shared machine the two sides trade CPU: read the sum)"
            )
    return lines


if __name__ == "__main__":
    main()
