"""``apexrl run --preset dmpo-small`` end to end on gymnasium's Pendulum: real processes on 127.0.0.1 (replay server,
learner, one actor), stopped by the learner's step count. DMPO runs every part MPO has (the policy, the duals,
the sampled bootstrap) plus D4PG's categorical critic; the run must train, log MPO's metrics, checkpoint and
evaluate the final checkpoint."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from apexrl.agents.mpo import DMPOLearner
from apexrl.apex.metrics import read_csv
from tests.helpers import rows_with_updates

FAST = "--min-replay-size 300 --eval-every 1000 --metrics-every 1 --checkpoint-every 50"


@pytest.mark.slow  # about 20 s: three processes, 60 learner steps and a final evaluation
def test_dmpo_runs_end_to_end_through_apexrl_run(tmp_path):
    run_dir = str(tmp_path / "run")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl",
            "run",
            "--preset",
            "dmpo-small",
            "--env",
            "gym:Pendulum-v1",
            "--run-dir",
            run_dir,
            "--minutes",
            "0",
            "--steps",
            "60",
            "--actors",
            "1",
            "--final-eval",
            "1",
            "--quiet",
            f"--learner-args={FAST}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "stopping: reached --steps 60" in out.stdout
    metrics = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert metrics["learner_steps"][-1] == 60
    # MPO's columns finite in every row whose interval had updates (the row at the stop may have none)
    updated = rows_with_updates(metrics)
    assert updated.any()
    for name in DMPOLearner.metric_names:
        assert np.all(np.isfinite(np.asarray(metrics[name], float)[updated])), name
    # the temperature follows its dual down from Acme's start (softplus(10) ~ 10): the E-step's KL is below 0.1
    temperature = np.asarray(metrics["temperature"])[updated]
    assert temperature[-1] < temperature[0] < 10.01
    with open(os.path.join(run_dir, "final_eval.json"), encoding="utf-8") as f:
        final = json.load(f)
    assert final["agent"] == "dmpo" and final["learner_steps"] == 60 and len(final["returns"]) == 1
