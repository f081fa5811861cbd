"""Agent steps/s of one actor process stepping K environments (``--envs-per-actor K``), policy forward pass and
inserts to a live replay server on 127.0.0.1 included, beside the environments alone (random actions, no policy,
no inserts) as the ceiling. Frames/s count 4 per Atari agent step (action repeat).

Each configuration runs a real :class:`~apexrl.apex.actor.Actor` in this process for ``--seconds`` after a warm-up
of ``--warmup`` seconds from its first step (not counted; making and seeding 64 Atari games takes seconds), against
a replay server child process; no learner runs, so the actor acts with its own initial weights and never polls for
new ones (polling a missing learner would only add its timeouts; its one poll at the start times out in 50 ms).
The configurations alternate (round-robin over ``--rounds``) so that load from elsewhere on a shared machine hits
all of them alike; each figure is the median of its rounds. ``--in-flight N ...`` runs each K with each count of
inserts in flight (``--inserts-in-flight``; 1: every insert waits for its reply, the actor as before pipelining),
interleaved in the same rounds. From the repository root::

    python bench/bench_actor.py                                  # CartPole, cartpole-swingup, Pong; K = 1 4 16 64
    python bench/bench_actor.py --envs gym:CartPole-v1 --ks 1 16 --seconds 3 --rounds 1     # quick look
    python bench/bench_actor.py --envs gym:CartPole-v1 atari:Pong --ks 1 16 --in-flight 1 4   # before / after
"""

from __future__ import annotations

import argparse
import os
import select
import statistics
import subprocess
import sys
import tempfile
import threading
import time

import numpy as np

AGENTS = {"gym:CartPole-v1": "dqn", "dmc:cartpole-swingup": "dpg", "atari:Pong": "dqn"}
PAPER_FRAMES_PER_ACTOR = 139
"""Ape-X paper (Atari): 360 actors, ~50K environment frames/s in all, so ~139 frames/s per actor."""


def start_server(log_dir: str, name: str) -> tuple[subprocess.Popen, str]:
    """A replay server of its own per environment (a server keeps the first transition spec declared to it)."""
    log = open(os.path.join(log_dir, f"server-{name.replace(':', '-')}.log"), "wb")  # noqa: SIM115 (the child's)
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "apexrl.cli.server",
            "--port",
            "0",
            "--bind",
            "127.0.0.1",
            "--capacity",
            "200000",
            "--log-level",
            "WARNING",
        ],
        stdout=subprocess.PIPE,
        stderr=log,
    )
    ready, _, _ = select.select([proc.stdout], [], [], 60)
    line = proc.stdout.readline().decode() if ready else ""
    if "listening on" not in line:
        proc.kill()
        raise SystemExit(f"replay server did not start: {line!r} (see {log.name})")
    return proc, line.strip().rsplit(" ", 1)[1]


def actor_rate(env: str, k: int, endpoint: str, seconds: float, warmup: float, in_flight: int = 1) -> float:
    """Agent steps/s of one Actor with K environments and ``in_flight`` inserts in flight over ``seconds`` after
    ``warmup``."""
    from apexrl.apex.actor import Actor
    from apexrl.apex.config import ActorConfig

    config = ActorConfig(
        agent=AGENTS.get(env, "dpg" if env.startswith("dmc:") else "dqn"),  # any Control Suite task: dpg
        env=env,
        replay=endpoint,
        params="tcp://127.0.0.1:9",
        envs_per_actor=k,
        inserts_in_flight=in_flight,
        wait_for_params=0.0,
        params_every_frames=10**15,
        params_timeout=0.05,
        log_every=3600.0,
    )
    actor = Actor(config)
    marks: list[tuple[float, int]] = []

    def clock() -> None:
        # The warm-up starts at the first step: making and seeding K Atari games (ROM loads) takes seconds.
        while actor.counters["steps"] == 0 and not actor._stop.is_set():
            time.sleep(0.01)
        time.sleep(warmup)
        marks.append((time.perf_counter(), actor.counters["steps"]))
        time.sleep(seconds)
        marks.append((time.perf_counter(), actor.counters["steps"]))
        actor.stop()

    timer = threading.Thread(target=clock, daemon=True)
    try:
        timer.start()
        actor.run()
        timer.join()
    finally:
        actor.close()
    (t0, s0), (t1, s1) = marks
    return (s1 - s0) / (t1 - t0)


def env_rate(env: str, k: int, seconds: float) -> float:
    """Agent steps/s of K environments stepped in turn with random actions (no policy, no inserts)."""
    from apexrl.apex.actor import env_seed
    from apexrl.envs import make_env

    envs = [make_env(env, env_seed(0, j)) for j in range(k)]
    spec = envs[0].spec
    rng = np.random.default_rng(0)
    for e in envs:
        e.reset()
    steps, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        for e in envs:
            a = int(rng.integers(spec.num_actions)) if spec.num_actions else rng.uniform(-1, 1, spec.action_dim)
            r = e.step(a)
            steps += 1
            if r.terminated or r.truncated:
                e.reset()
    rate = steps / (time.perf_counter() - start)
    for e in envs:
        e.close()
    return rate


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--envs", nargs="+", default=list(AGENTS))
    p.add_argument("--ks", nargs="+", type=int, default=[1, 4, 16, 64])
    p.add_argument("--seconds", type=float, default=6.0, help="measured seconds per configuration and round")
    p.add_argument("--warmup", type=float, default=2.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument(
        "--in-flight",
        nargs="+",
        type=int,
        default=[1],
        metavar="N",
        help="inserts in flight per actor (--inserts-in-flight), each K with each (default 1)",
    )
    args = p.parse_args()
    confs = [(k, n) for k in args.ks for n in args.in_flight]

    def name(k: int, n: int) -> str:
        return f"K={k}" if args.in_flight == [1] else f"K={k}, in flight {n}"

    import torch

    from apexrl.envs import env_spec

    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as tmp:
        servers = {env: start_server(tmp, env) for env in args.envs}
        try:
            results: dict[tuple[str, str], list[float]] = {}
            for _ in range(args.rounds):
                for env in args.envs:
                    results.setdefault((env, "env alone"), []).append(env_rate(env, 1, args.seconds))
                    for k, n in confs:
                        rate = actor_rate(env, k, servers[env][1], args.seconds, args.warmup, n)
                        results.setdefault((env, name(k, n)), []).append(rate)
                        print(f"  {env} {name(k, n)}: {rate:.0f} steps/s", file=sys.stderr, flush=True)
        finally:
            for server, _ in servers.values():
                server.terminate()
                server.wait(30)
    print(f"\nOne actor process, {os.cpu_count()} cores, median of {args.rounds} rounds of {args.seconds:g} s:\n")
    first = args.in_flight[0]
    extra = f" vs in flight {first}, same round (median) |" if len(args.in_flight) > 1 else ""
    print(f"| environment | configuration | agent steps/s | rounds (min–max) | frames/s | vs K={args.ks[0]} |{extra}")
    print("|---|---|---:|---:|---:|---:|" + ("---:|" if extra else ""))
    for env in args.envs:
        fps = env_spec(env).frames_per_step
        base = statistics.median(results[(env, name(args.ks[0], first))])
        rows = [("env alone", None), *((name(k, n), (k, n)) for k, n in confs)]
        for conf, kn in rows:
            rate = statistics.median(results[(env, conf)])
            spread = f"{min(results[(env, conf)]):,.0f}–{max(results[(env, conf)]):,.0f}"
            row = f"| {env} | {conf} | {rate:,.0f} | {spread} | {rate * fps:,.0f} | "
            if kn is None:
                row += " |" + (" |" if extra else "")
            else:
                row += f"{rate / base:.2f}x |"
                if extra:
                    pairs = zip(results[(env, conf)], results[(env, name(kn[0], first))])  # the same round's
                    row += f" {statistics.median(a / b for a, b in pairs):.2f}x |"
            print(row)
    print(f"\nApe-X paper: ~{PAPER_FRAMES_PER_ACTOR} frames/s per actor (Atari).")


if __name__ == "__main__":
    main()
