"""How fast this machine runs a task: the CPU time of one environment step, kept beside wall-clock runs.

``apexrl bench-suite`` trains each seed for ``--minutes`` of wall time, so a seed run on a machine twice as
slow is a run half as long (half the env frames and learner steps), and averaging it with seeds from a faster
machine mixes two budgets. Before each run the suite measures the CPU time one agent step of the task's
environment takes here (:func:`env_step_us`: random actions, one process), keeps it in the run directory
(:data:`MACHINE_FILE`, one record per start, a resumed run adding one) and in suite.csv (``env_step_cpu_us``),
and refuses to add a seed on a machine more than :data:`MAX_SPEED_RATIO` times faster or slower than the one
the task's finished seeds ran on, unless told to (``--mixed-machines``).

CPU time is not immune to other work on the machine: on a 2-vCPU virtual machine, a busy sibling thread or the
hypervisor's steal makes the same step take up to 1.8x the CPU time (measured here: 252 µs for a walker step
quiet, 271-425 µs beside a training run). So the figure is the fastest of several stretches (interference only
adds), each record says how many CPUs' worth other processes used during it (``other_cpus``), and the suite
measures again before it refuses a seed.
"""

from __future__ import annotations

import json
import math
import os
import platform
import statistics
import time
from typing import Any

import numpy as np

from apexrl.durable import write_atomically

__all__ = [
    "MACHINE_FILE",
    "MAX_SPEED_RATIO",
    "env_step_us",
    "fastest_record",
    "machine_record",
    "recorded_step_us",
    "save_record",
    "speed_mismatch",
]

MACHINE_FILE = "machine.json"
"""A run directory's machine records (a JSON list, one per start of the run)."""
MAX_SPEED_RATIO = 1.5
"""Most a new seed's env step time may differ (either way) from the finished seeds' before the suite refuses."""


def env_step_us(env_name: str, seed: int = 0, cpu_seconds: float = 1.5, min_steps: int = 300, parts: int = 5) -> float:
    """Microseconds of this process's CPU time per agent step of ``env_name`` (``reset()`` not counted), with
    uniformly random actions: the fastest of ``parts`` stretches, each of at least ``min_steps / parts`` steps
    and ``cpu_seconds / parts`` of CPU time (the fastest, as contention only ever slows a stretch)."""
    from apexrl.envs import make_env

    env = make_env(env_name, seed)
    rng = np.random.default_rng(seed)
    spec = env.spec

    def action() -> Any:
        if spec.num_actions is not None:
            return int(rng.integers(spec.num_actions))
        return rng.uniform(-1.0, 1.0, spec.action_dim).astype(np.float32)

    try:
        env.reset()
        for _ in range(20):  # warm-up: first-call costs are not the step's
            result = env.step(action())
            if result.terminated or result.truncated:
                env.reset()
        over = False
        per_step = []
        for _ in range(parts):
            steps, cpu = 0, 0.0
            while steps < min_steps / parts or cpu < cpu_seconds / parts:
                if over:
                    env.reset()
                a = action()
                t0 = time.process_time()
                result = env.step(a)
                cpu += time.process_time() - t0
                steps += 1
                over = result.terminated or result.truncated
            per_step.append(1e6 * cpu / steps)
        return min(per_step)
    finally:
        env.close()


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _machine_busy_s() -> float | None:
    """CPU seconds the whole machine has spent not idle since boot (all CPUs, steal included: time the hypervisor
    gave to other guests is time this one's work waited for), from /proc/stat; None where there is none."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu" or len(fields) < 9:
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def machine_record(env_name: str) -> dict[str, Any]:
    """This machine now: ``env``, ``env_step_cpu_us`` (:func:`env_step_us`), ``other_cpus`` (how many CPUs'
    worth of time the rest of the machine used meanwhile, None where unknown), ``cpu_model``, ``cpus``,
    ``time``."""
    busy0, own0, wall0 = _machine_busy_s(), time.process_time(), time.monotonic()
    step_us = env_step_us(env_name)
    busy1, own1, wall = _machine_busy_s(), time.process_time(), time.monotonic() - wall0
    other = None
    if busy0 is not None and busy1 is not None and wall > 0:
        other = round(max(0.0, (busy1 - busy0) - (own1 - own0)) / wall, 2)
    return {
        "env": env_name,
        "env_step_cpu_us": round(step_us, 2),
        "other_cpus": other,
        "cpu_model": _cpu_model(),
        "cpus": os.cpu_count(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def fastest_record(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The least disturbed of several measurements of one machine: the one with the fastest env step, carrying
    how many were taken (``measurements``)."""
    best = min(records, key=lambda r: r["env_step_cpu_us"])
    return {**best, "measurements": sum(int(r.get("measurements", 1)) for r in records)}


def _records(run_dir: str) -> list[dict[str, Any]]:
    try:
        with open(os.path.join(run_dir, MACHINE_FILE), encoding="utf-8") as f:
            records = json.load(f)
    except (OSError, ValueError):
        return []
    return [r for r in records if isinstance(r, dict)] if isinstance(records, list) else []


def save_record(run_dir: str, record: dict[str, Any]) -> None:
    """Add ``record`` to ``run_dir``'s :data:`MACHINE_FILE`."""
    write_atomically(os.path.join(run_dir, MACHINE_FILE), json.dumps(_records(run_dir) + [record], indent=1) + "\n")


def recorded_step_us(run_dir: str) -> float:
    """The median env step time of ``run_dir``'s records (NaN when it has none)."""
    values = [
        float(r["env_step_cpu_us"])
        for r in _records(run_dir)
        if isinstance(r.get("env_step_cpu_us"), (int, float)) and r["env_step_cpu_us"] > 0
    ]
    return statistics.median(values) if values else math.nan


def speed_mismatch(step_us: float, others: dict[str, float]) -> str | None:
    """Why a run at ``step_us`` should not join runs measured at ``others`` (label -> their step time): None
    when each is within :data:`MAX_SPEED_RATIO` of it (runs without a record are not compared)."""
    far = {
        label: us
        for label, us in others.items()
        if not math.isnan(us) and max(us, step_us) / min(us, step_us) > MAX_SPEED_RATIO
    }
    if not far:
        return None
    listed = ", ".join(f"{label} {us:.0f} µs" for label, us in sorted(far.items()))
    return (
        f"an environment step takes {step_us:.0f} µs of CPU on this machine, against {listed} where the earlier "
        f"seeds ran (more than {MAX_SPEED_RATIO:g}x apart): runs of the same --minutes would have different "
        "budgets of env frames and learner steps"
    )
