"""The learner's evaluation process: its death is a warning and a fresh process next time, never the learner's
error."""

from __future__ import annotations

import os
import signal

import torch

from apexrl.apex.evaluator import Evaluator
from apexrl.launch.plan import Overrides, plan
from tests.helpers import wait_until


def test_an_evaluator_killed_before_it_read_its_weights_is_dropped_not_raised(tmp_path):
    """A run's SIGTERM reaches the learner's whole process group: an evaluation process still importing dies
    with the weights message unread, which resets the pipe (ConnectionResetError) rather than closing it."""
    config = plan("cartpole", Overrides(run_dir=str(tmp_path))).learner
    evaluator = Evaluator(config)
    evaluator.start({"w": torch.zeros(4)}, learner_steps=1, env_frames=2, time_s=3.0)
    pid = evaluator.pid
    assert pid is not None and evaluator.busy
    os.kill(pid, signal.SIGKILL)  # long before the spawned child has imported torch and read the pipe
    wait_until(lambda: evaluator.pid is None, timeout=30, what="the evaluation process to exit")
    assert evaluator.pop_result() is None
    assert not evaluator.busy and evaluator.pid is None
    evaluator.close()
