"""Where a run's CPU goes: the CPU share of the learner and of the run's other processes on its machine, for
metrics.csv.

A process's CPU share over an interval is the CPU time it used (user + system, all its threads, from
``/proc/<pid>/stat``) divided by the interval's wall time: 1.0 is one core kept busy, so on a 2-core machine the
shares of all processes add up to at most 2. The learner finds the run's other processes in ``RUN_DIR/pids.json``
(written by ``apexrl run``; absent when the learner runs alone) and measures those on its own machine: the replay
servers, the actors, and its own evaluation process. ``cpu_machine`` is the whole machine's busy time in cores
(``/proc/stat``), every process included, the run's and others': a value above the run's own sum says the
machine is shared.

No psutil: Linux's ``/proc`` is read directly (psutil is only a test and bench dependency). Elsewhere every
value is empty.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterable, Mapping

__all__ = ["CPU_COLUMNS", "CPUMeter", "machine_busy_seconds", "process_cpu_seconds"]

CPU_COLUMNS = (
    "cpu_learner",
    "cpu_eval",
    "cpu_replay",
    "cpu_actors",
    "cpu_actor_min",
    "cpu_actor_max",
    "cpu_machine",
)
"""metrics.csv's CPU columns, in cores (see the module docstring and docs/running.md)."""

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def process_cpu_seconds(pid: int) -> tuple[float, int] | None:
    """(user + system CPU seconds, start time in clock ticks after boot) of process ``pid``, or None when it is
    gone or unreadable. The start time tells a restarted process (a reused pid) from the one measured before."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            text = f.read().decode("ascii", "replace")
    except OSError:
        return None
    # The command name (field 2) may hold spaces and parentheses: the fields after it follow the last ')'.
    rest = text[text.rfind(")") + 2 :].split()
    try:
        utime, stime, start = int(rest[11]), int(rest[12]), int(rest[19])
    except (IndexError, ValueError):
        return None
    return (utime + stime) / _TICKS, start


def machine_busy_seconds() -> float | None:
    """CPU seconds the whole machine has been busy since boot, every core (``/proc/stat``: all but idle and
    iowait), or None."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    ticks = [int(x) for x in fields[1:9]]  # user nice system idle iowait irq softirq steal
    return (sum(ticks) - ticks[3] - ticks[4]) / _TICKS


def _read_pids(run_dir: str | None) -> tuple[list[int], dict[str, int]]:
    """(replay server pids, {actor name: pid}) of this machine from RUN_DIR/pids.json; empty without it."""
    if not run_dir:
        return [], {}
    try:
        with open(os.path.join(run_dir, "pids.json"), encoding="utf-8") as f:
            pids = json.load(f)
        children: Mapping[str, int] = pids.get("children", {})
        remote = set(pids.get("nodes", {}))  # children on other machines: their pids mean nothing here
    except (OSError, ValueError, AttributeError):
        return [], {}
    servers: list[int] = []
    actors: dict[str, int] = {}
    for name, pid in children.items():
        if name in remote or not isinstance(pid, int):
            continue
        if name.startswith("server"):
            servers.append(pid)
        elif name.startswith("actor"):
            actors[name] = pid
    return servers, actors


class CPUMeter:
    """CPU shares since the previous :meth:`sample` (the first one only sets the baseline: every value None).

    Args:
      run_dir: where ``pids.json`` is (None: the learner alone).
      pid: the learner's own process (default: this one).
    """

    def __init__(self, run_dir: str | None, pid: int | None = None):
        self.run_dir = run_dir
        self.pid = os.getpid() if pid is None else pid
        self._last: dict[int, tuple[float, int]] = {}
        self._last_time: float | None = None
        self._last_machine: float | None = None
        self.actors: dict[str, float] = {}
        """Each local actor's share in the last interval, by its name in pids.json (``actor0``, ...): what the
        learner's progress file and its own TensorBoard file get as ``cpu_actor0``, ... (metrics.csv keeps the
        fixed columns)."""

    def _shares(self, pids: Iterable[int], dt: float, now: dict[int, tuple[float, int]]) -> list[float]:
        out = []
        for pid in pids:
            got = process_cpu_seconds(pid)
            if got is None:
                continue
            now[pid] = got
            before = self._last.get(pid)
            if before is not None and before[1] == got[1] and dt > 0:  # same process as last time
                out.append(max(0.0, got[0] - before[0]) / dt)
        return out

    def sample(self, eval_pid: int | None = None) -> dict[str, float | None]:
        """The :data:`CPU_COLUMNS` for the interval since the last call (``eval_pid``: the learner's evaluation
        process, when one runs)."""
        t = time.monotonic()
        dt = 0.0 if self._last_time is None else t - self._last_time
        servers, actors = _read_pids(self.run_dir)
        now: dict[int, tuple[float, int]] = {}
        learner = self._shares([self.pid], dt, now)
        evaluation = self._shares([] if eval_pid is None else [eval_pid], dt, now)
        replay = self._shares(servers, dt, now)
        self.actors = {}
        for name, pid in actors.items():
            share = self._shares([pid], dt, now)
            if share:
                self.actors[name] = share[0]
        acting = list(self.actors.values())
        machine = machine_busy_seconds()
        row: dict[str, float | None] = {
            "cpu_learner": learner[0] if learner else None,
            "cpu_eval": evaluation[0] if evaluation else None,
            "cpu_replay": sum(replay) if replay else None,
            "cpu_actors": sum(acting) if acting else None,
            "cpu_actor_min": min(acting) if acting else None,
            "cpu_actor_max": max(acting) if acting else None,
            "cpu_machine": None,
        }
        if machine is not None and self._last_machine is not None and dt > 0:
            row["cpu_machine"] = max(0.0, machine - self._last_machine) / dt
        self._last, self._last_time, self._last_machine = now, t, machine
        return row
