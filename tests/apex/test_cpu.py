"""CPU shares for metrics.csv (apexrl.apex.cpu): real processes read from /proc, found through pids.json."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from apexrl.apex.cpu import CPU_COLUMNS, CPUMeter, machine_busy_seconds, process_cpu_seconds
from apexrl.apex.learner import BASE_COLUMNS

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/self/stat"), reason="reads Linux's /proc")

BUSY = "import time\nt = time.time()\nwhile time.time() - t < 60: pass\n"


def _burn_until(pid: int, seconds: float, timeout: float = 60.0) -> None:
    """Wait until process ``pid`` has used ``seconds`` more CPU (this process burns its own while waiting)."""
    start = process_cpu_seconds(pid)
    assert start is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        sum(i * i for i in range(20_000))
        now = process_cpu_seconds(pid)
        if now is not None and now[0] - start[0] >= seconds:
            return
    pytest.fail(f"process {pid} did not use {seconds} s of CPU in {timeout} s")


def test_shares_of_the_learner_and_of_the_run_s_local_processes(tmp_path):
    actor = subprocess.Popen([sys.executable, "-c", BUSY])
    remote = subprocess.Popen([sys.executable, "-c", BUSY])
    try:
        pids = {
            "launcher": os.getpid(),
            "children": {"server": 999_999_999, "learner": os.getpid(), "actor0": actor.pid, "actor1": remote.pid},
            "nodes": {"actor1": "10.0.0.7"},  # on another machine: its pid means nothing here
        }
        (tmp_path / "pids.json").write_text(json.dumps(pids))
        meter = CPUMeter(str(tmp_path))
        first = meter.sample()
        assert set(first) == set(CPU_COLUMNS) and all(v is None for v in first.values())  # the baseline
        _burn_until(actor.pid, 0.2)
        _burn_until(os.getpid(), 0.2)
        row = meter.sample()
        cores = os.cpu_count() or 1
        assert 0 < row["cpu_learner"] <= cores + 0.5
        # one local actor: the sum, the least and the most busy are the same process
        assert 0 < row["cpu_actors"] <= 1.5 and row["cpu_actor_min"] == row["cpu_actor_max"] == row["cpu_actors"]
        assert meter.actors == {"actor0": row["cpu_actors"]}  # each local actor by name (not actor1: remote)
        assert row["cpu_replay"] is None  # its pid is gone
        assert row["cpu_eval"] is None
        assert row["cpu_machine"] is not None and row["cpu_machine"] >= row["cpu_actors"] * 0.5
    finally:
        for p in (actor, remote):
            p.kill()
            p.wait()


def test_a_learner_alone_measures_itself_only():
    meter = CPUMeter(None)
    meter.sample()
    _burn_until(os.getpid(), 0.1)
    row = meter.sample()
    assert row["cpu_learner"] > 0
    assert row["cpu_actors"] is row["cpu_replay"] is None


def test_readers_of_proc():
    cpu, start = process_cpu_seconds(os.getpid())
    assert cpu > 0 and start > 0
    assert process_cpu_seconds(999_999_999) is None
    assert machine_busy_seconds() > 0


def test_metrics_csv_has_the_wait_and_cpu_columns():
    assert "batch_wait_frac" in BASE_COLUMNS and set(CPU_COLUMNS) <= set(BASE_COLUMNS)
