"""Learner steps/s of a preset's agent on random batches shaped for an environment, with fused Adam on and off
(``APEXRL_FUSED_ADAM``): the update alone, no replay, one torch thread (``--torch-threads``: as many as the
learner's flag of that name). The configurations alternate
(round-robin over ``--rounds``) so that load from elsewhere on a shared machine hits all of them alike; each
figure is the median of its rounds. The last column divides fused Adam's steps by the process's CPU seconds
rather than wall seconds: on a shared machine it moves less with the other processes' load (with one torch
thread it is the step rate the learner gets from a whole core). From the repository root::

    python bench/bench_learner_step.py                         # apex-dpg-control and the small presets
    python bench/bench_learner_step.py --presets sac-small --seconds 2 --rounds 1
    python bench/bench_learner_step.py --presets d4pg-small --torch-threads 2   # what a second core buys
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np
import torch


def batch(rng: np.random.Generator, n: int, obs_dim: int, action_dim: int) -> dict[str, np.ndarray]:
    return {
        "obs": rng.standard_normal((n, obs_dim)).astype(np.float32),
        "action": rng.uniform(-1, 1, (n, action_dim)).astype(np.float32),
        "reward": rng.uniform(0, 1, n).astype(np.float32),
        "discount": np.full(n, 0.99**3, np.float32),
        "next_obs": rng.standard_normal((n, obs_dim)).astype(np.float32),
    }


def steps_per_s(preset_name: str, env: str, fused: bool, seconds: float) -> tuple[float, float]:
    """(steps per wall second, steps per CPU second of this process)."""
    from apexrl.agents import get_agent
    from apexrl.agents.optim import FUSED_ADAM_ENV
    from apexrl.envs import env_spec
    from apexrl.launch.presets import get_preset

    os.environ[FUSED_ADAM_ENV] = "1" if fused else "0"
    preset = get_preset(preset_name)
    config = preset.agent_config()
    spec = env_spec(env)
    learner = get_agent(preset.agent).make_learner(spec, config, torch.device("cpu"), 0)
    b = batch(np.random.default_rng(0), config.batch_size, spec.obs_shape[0], spec.action_dim)
    w = np.ones(config.batch_size)
    for _ in range(10):  # warm-up (first steps allocate the optimiser state)
        learner.update(b, w)
    n, start, cpu_start = 0, time.perf_counter(), time.process_time()
    while time.perf_counter() - start < seconds:
        learner.update(b, w)
        n += 1
    return n / (time.perf_counter() - start), n / (time.process_time() - cpu_start)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--presets",
        nargs="+",
        default=["apex-dpg-control", "d4pg-small", "td3-small", "sac-small", "mpo-small", "dmpo-small"],
    )
    p.add_argument("--env", default="dmc:walker-stand", help="shapes of the batches (default dmc:walker-stand)")
    p.add_argument("--seconds", type=float, default=3.0, help="measured seconds per configuration and round")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--torch-threads", type=int, default=1, help="torch CPU threads (default 1, as the learner's)")
    args = p.parse_args()
    if args.torch_threads < 1:
        p.error("--torch-threads must be at least 1")
    torch.set_num_threads(args.torch_threads)
    results: dict[tuple[str, bool], list[tuple[float, float]]] = {}
    for _ in range(args.rounds):
        for name in args.presets:
            for fused in (False, True):
                results.setdefault((name, fused), []).append(steps_per_s(name, args.env, fused, args.seconds))
    threads = "one torch thread" if args.torch_threads == 1 else f"{args.torch_threads} torch threads"
    print(f"\nLearner steps/s on {args.env} batches, {threads}, median of {args.rounds} rounds:\n")
    print("| preset | plain Adam | fused Adam | fused / plain | fused Adam, per CPU second |")
    print("|---|---:|---:|---:|---:|")
    for name in args.presets:
        plain, fused = (statistics.median(wall for wall, _ in results[(name, f)]) for f in (False, True))
        fused_cpu = statistics.median(cpu for _, cpu in results[(name, True)])
        print(f"| {name} | {plain:.1f} | {fused:.1f} | {fused / plain:.2f}x | {fused_cpu:.1f} |")


if __name__ == "__main__":
    main()
