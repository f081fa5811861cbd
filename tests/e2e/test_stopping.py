"""Stopping and disk-full behaviour of the real processes (server, learner, actors on gym:CartPole-v1).

* Simultaneous SIGTERM (what ``docker compose down`` or a pod deletion delivers): every process exits within
  5 s whatever its peers do, and the actors say what they could not hand over.
* Disk full during a learner checkpoint (writes fail with EFBIG under RLIMIT_FSIZE, as with ENOSPC): no
  temporary file stays behind, the previous checkpoint stays valid, the learner warns, counts the failure,
  keeps training and retries at the next interval.
"""

from __future__ import annotations

import glob
import os
import resource
import signal
import time

from apexrl.apex.checkpoint import load_checkpoint
from apexrl.apex.metrics import read_csv
from tests.conftest import free_port
from tests.e2e.test_apex_processes import LEARNER_FAST, learner_steps, start_system
from tests.helpers import wait_until

STOP_WITHIN_S = 5.0


def test_simultaneous_sigterm_every_process_exits_within_five_seconds(start_server, spawn, tmp_path):
    run_dir = str(tmp_path / "run")
    server, learner, actors = start_system(start_server, spawn, run_dir)
    wait_until(lambda: learner_steps(run_dir) >= 100, 120, "100 learner steps", interval=0.5)
    for a in actors:  # each actor in its loop (its signal handler installed): one alone can feed the learner
        a.wait_for(r"steps=[1-9]", timeout=120)
    procs = {"server": server.proc, "learner": learner.proc, **{f"actor{i}": a.proc for i, a in enumerate(actors)}}
    t0 = time.monotonic()
    for p in procs.values():
        p.send_signal(signal.SIGTERM)
    exited: dict[str, float] = {}
    while len(exited) < len(procs) and time.monotonic() - t0 < 60:
        for name, p in procs.items():
            if name not in exited and p.poll() is not None:
                exited[name] = time.monotonic() - t0
        time.sleep(0.05)
    logs = {"learner": learner.log(), **{f"actor{i}": a.log() for i, a in enumerate(actors)}}
    slow = {name: round(t, 2) for name, t in exited.items() if t > STOP_WITHIN_S}
    assert len(exited) == len(procs) and not slow, (exited, logs)
    assert {name: p.returncode for name, p in procs.items()} == dict.fromkeys(procs, 0), logs
    for i, a in enumerate(actors):  # each says what it handed over and what not
        assert a.wait_for(rf"actor {i} done: \d+ steps, \d+ inserted, \d+ not inserted", timeout=5)
        assert "Traceback" not in a.log(), a.log()
    assert "Traceback" not in learner.log(), learner.log()


def _file_size_limit(nbytes: int):
    def limit() -> None:  # in the child: writes past nbytes fail with EFBIG (Python ignores SIGXFSZ)
        resource.setrlimit(resource.RLIMIT_FSIZE, (nbytes, nbytes))

    return limit


def test_checkpoint_on_a_full_disk_keeps_the_previous_one_and_training_goes_on(start_server, spawn, tmp_path):
    run_dir = str(tmp_path / "run")
    ckpt = os.path.join(run_dir, "checkpoint.safetensors")
    params_port = free_port()
    server, learner, actors = start_system(start_server, spawn, run_dir, params_port=params_port)
    wait_until(lambda: os.path.exists(ckpt) and learner_steps(run_dir) >= 100, 120, "a checkpoint", interval=0.5)
    assert learner.terminate() == 0, learner.log()
    _, meta = load_checkpoint(ckpt)
    saved_step = meta["learner_steps"]
    assert os.path.getsize(ckpt) > 64 * 1024  # so the limit below makes every checkpoint fail

    # The same learner resumed where checkpoints cannot be written (its metrics rows are far below the limit).
    budget = saved_step + 300
    full = spawn(
        "learner-full",
        "apexrl.cli.learner",
        "--replay",
        server.endpoint,
        "--params-port",
        str(params_port),
        "--run-dir",
        run_dir,
        "--resume",
        "--max-steps",
        str(budget),
        *LEARNER_FAST,
        preexec_fn=_file_size_limit(64 * 1024),
    )
    full.wait_for(r"learner resumed from", timeout=60)
    full.wait_for(r"checkpoint at step \d+ not written", timeout=120)
    code = full.proc.wait(180)
    log = full.log()
    assert code == 1, log  # it trained to its budget; only the final checkpoint could not be written
    assert "Traceback" not in log, log
    assert log.count("not written") >= 3, log  # warned at each interval, retried each time
    assert f"the checkpoint of step {saved_step} stays valid" in log, log
    assert not glob.glob(ckpt + ".tmp.*")  # no partial file left behind
    _, meta_after = load_checkpoint(ckpt)  # the previous checkpoint is intact
    assert meta_after["learner_steps"] == saved_step
    rows = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert rows["learner_steps"][-1] >= budget  # training went on past every failed save
    assert rows["checkpoint_failures"][-1] >= 3
    for a in actors:
        assert a.terminate() == 0, a.log()
