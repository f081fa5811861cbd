"""Cost of ``eval_weights="polyak"``: the in-place update of the Polyak average (one ``torch._foreach_lerp_`` over
the policy's parameters, :mod:`apexrl.apex.polyak`) per learner step, on each preset's own network, beside one
learner update on a random batch of the preset's batch size (R2D2: random sequences of its length), one torch
thread. Each figure is the median of ``--rounds`` rounds, alternating presets. From the repository root::

    python bench/bench_polyak.py                               # r2d2-cpu, cartpole, d4pg-small, sac-small
    python bench/bench_polyak.py --presets r2d2-cpu --device cuda
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import numpy as np
import torch


def _batch(agent: str, config: Any, spec: Any, rng: np.random.Generator) -> dict[str, np.ndarray]:
    n = config.batch_size
    if agent == "r2d2":
        from apexrl.agents.r2d2 import empty_sequences

        out = empty_sequences(n, config.min_sequence_length, spec.obs_shape, spec.obs_dtype, config.lstm_size)
        out["obs"][...] = rng.standard_normal(out["obs"].shape)
        out["action"][...] = rng.integers(0, spec.num_actions, out["action"].shape)
        out["reward"][...] = rng.standard_normal(out["reward"].shape)
        out["mask"][...] = True
        return out
    obs = rng.standard_normal((n, *spec.obs_shape)).astype(np.float32)
    action = (
        rng.integers(0, spec.num_actions, n).astype(np.int32)
        if spec.num_actions is not None
        else rng.uniform(-1, 1, (n, spec.action_dim)).astype(np.float32)
    )
    return {
        "obs": obs,
        "action": action,
        "reward": rng.standard_normal(n).astype(np.float32),
        "discount": np.full(n, 0.97, np.float32),
        "next_obs": rng.standard_normal((n, *spec.obs_shape)).astype(np.float32),
    }


def _median_s(fn: Any, seconds: float, device: torch.device) -> float:
    """Seconds per call of ``fn``, timed over about ``seconds`` (synchronised on a GPU)."""
    for _ in range(5):
        fn()
    n, start = 0, time.perf_counter()
    while time.perf_counter() - start < seconds:
        fn()
        n += 1
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / n


def measure(name: str, device: torch.device, seconds: float) -> tuple[int, float, float]:
    """(averaged parameters, seconds per average update, seconds per learner update) of preset ``name``."""
    from apexrl.agents import get_agent
    from apexrl.apex.polyak import PolyakAverage
    from apexrl.envs import env_spec
    from apexrl.launch.presets import get_preset

    preset = get_preset(name)
    config = preset.agent_config()
    spec = env_spec(preset.env)
    learner = get_agent(preset.agent).make_learner(spec, config, device, 0)
    average = PolyakAverage(learner, 0.005)
    batch, weights = _batch(preset.agent, config, spec, np.random.default_rng(0)), np.ones(config.batch_size)
    count = sum(t.numel() for t in average.averaged().values())
    return (
        count,
        _median_s(average.update, seconds, device),
        _median_s(lambda: learner.update(batch, weights), seconds, device),
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--presets", nargs="+", default=["r2d2-cpu", "cartpole", "d4pg-small", "sac-small"])
    p.add_argument("--device", default="cpu")
    p.add_argument("--seconds", type=float, default=2.0, help="measured seconds per figure and round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    results: dict[str, list[tuple[int, float, float]]] = {}
    for _ in range(args.rounds):
        for name in args.presets:
            results.setdefault(name, []).append(measure(name, device, args.seconds))
    print(f"\nPolyak average update vs learner update on {device}, one torch thread, median of {args.rounds}:\n")
    print("| preset | averaged parameters | average update (µs) | learner update (ms) | share of a step |")
    print("|---|---:|---:|---:|---:|")
    for name, rows in results.items():
        avg_s = statistics.median(r[1] for r in rows)
        step_s = statistics.median(r[2] for r in rows)
        print(f"| {name} | {rows[0][0]:,} | {avg_s * 1e6:.1f} | {step_s * 1e3:.2f} | {avg_s / step_s:.2%} |")


if __name__ == "__main__":
    main()
