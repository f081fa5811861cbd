"""The best checkpoint (apexrl.apex.best) with real agents' learner states and real files: which evaluation
replaces it (strictly better, finite), that it holds the state taken with the scored weights, that a resumed
keeper keeps its best, that a writer dying or failing mid-write leaves the old best intact, and that
``apexrl evaluate --best`` loads it for every agent."""

from __future__ import annotations

import dataclasses
import glob
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from apexrl.agents import get_agent
from apexrl.apex.best import BEST_CHECKPOINT, BestCheckpoint, load_best
from apexrl.apex.checkpoint import CheckpointError, load_checkpoint, save_checkpoint
from apexrl.apex.evaluator import EvalResult
from apexrl.envs import env_spec
from apexrl.envs.masked import NAME as MASKED
from apexrl.evaluate import EvaluateError, evaluate_run
from apexrl.launch.local import best_line
from apexrl.launch.presets import get_preset
from apexrl.rundir import best_eval
from tests.torch_helpers import one_thread  # noqa: F401 - autouse fixture

CARTPOLE = "gym:CartPole-v1"


def _learner(preset: str, env: str):
    p = get_preset(preset)
    cfg = p.agent_config()
    return get_agent(p.agent).make_learner(env_spec(env), cfg, torch.device("cpu"), 0), cfg, p.agent


def _meta(agent: str, env: str, cfg, steps: int) -> dict:
    """What the learner's checkpoint metadata holds (Learner._meta)."""
    return {
        "format": 1,
        "agent": agent,
        "env": env,
        "learner_steps": steps,
        "time_s": 1.5 * steps,
        "frames_base": 0,
        "last_inserted": 10 * steps,
        "env_frames": 10 * steps,
        "agent_config": json.loads(json.dumps(dataclasses.asdict(cfg), default=list)),
        "extra": {},
    }


def _result(mean: float, steps: int, episodes: int = 3) -> EvalResult:
    return EvalResult(mean, 0.0, 0.0, episodes, steps, 10 * steps, 1.5 * steps)


@pytest.fixture
def dqn():
    return _learner("cartpole", CARTPOLE)


def _offer(keeper: BestCheckpoint, learner, cfg, mean: float, steps: int) -> bool:
    keeper.hold(learner.state_dict(), _meta("dqn", CARTPOLE, cfg, steps))
    return keeper.offer(_result(mean, steps))


def test_the_first_evaluation_writes_the_best_with_its_record_and_the_held_state(dqn, tmp_path):
    learner, cfg, _ = dqn
    keeper = BestCheckpoint(str(tmp_path))
    held = {k: v.clone() for k, v in learner.state_dict().items()}
    keeper.hold(learner.state_dict(), _meta("dqn", CARTPOLE, cfg, 0))
    with torch.no_grad():  # training goes on while the evaluation runs
        for p in learner.q_net.parameters():
            p.add_(1.0)
    assert keeper.offer(_result(20.0, 0))
    tensors, meta, record = load_best(str(tmp_path / BEST_CHECKPOINT))
    assert record == dataclasses.asdict(_result(20.0, 0)) == keeper.record
    assert record["episodes"] == 3 and record["learner_steps"] == meta["learner_steps"] == 0
    assert set(tensors) == set(held) and all(torch.equal(tensors[k], held[k]) for k in held)  # not the live ones
    live = learner.policy_state_dict()
    assert all(not torch.equal(tensors[k], live[k]) for k in live)
    assert best_eval(str(tmp_path)) == record  # readable without torch too (apexrl.rundir)
    assert best_line(str(tmp_path)) == (  # apexrl run's closing line
        "best periodic evaluation: return 20.0 over 3 episodes at learner step 0 (the highest of the run's: "
        f"optimistic) -> {BEST_CHECKPOINT}; score it: apexrl evaluate {tmp_path} --best"
    )


def test_only_a_strictly_higher_finite_mean_replaces_the_best(dqn, tmp_path):
    learner, cfg, _ = dqn
    keeper = BestCheckpoint(str(tmp_path))
    path = tmp_path / BEST_CHECKPOINT
    assert not _offer(keeper, learner, cfg, float("nan"), 1)  # a NaN mean is never the best
    assert not path.exists() and keeper.record is None
    assert _offer(keeper, learner, cfg, 50.0, 2)
    first = path.read_bytes()
    for mean, steps in ((49.9, 3), (50.0, 4), (float("nan"), 5), (float("inf"), 6)):
        assert not _offer(keeper, learner, cfg, mean, steps)  # worse, a tie (the earlier stays), non-finite
        assert path.read_bytes() == first
    assert _offer(keeper, learner, cfg, 50.5, 7)
    assert load_best(str(path))[2]["learner_steps"] == 7 and keeper.record["mean"] == 50.5
    assert not keeper.offer(_result(99.0, 8))  # nothing held: a result without its state writes nothing
    keeper.hold(learner.state_dict(), _meta("dqn", CARTPOLE, cfg, 9))
    assert not keeper.offer(_result(99.0, 10))  # a result never goes with a state it did not score
    assert load_best(str(path))[2]["learner_steps"] == 7
    assert not glob.glob(str(path) + ".tmp.*")


def test_a_resumed_keeper_keeps_its_best_and_refuses_another_runs(dqn, tmp_path):
    learner, cfg, _ = dqn
    assert _offer(BestCheckpoint(str(tmp_path)), learner, cfg, 80.0, 5)
    path = tmp_path / BEST_CHECKPOINT
    first = path.read_bytes()
    resumed = BestCheckpoint(str(tmp_path))
    resumed.resume("dqn", CARTPOLE)
    assert resumed.record["mean"] == 80.0 and resumed.record["learner_steps"] == 5
    assert not _offer(resumed, learner, cfg, 79.0, 6)
    assert path.read_bytes() == first
    assert _offer(resumed, learner, cfg, 81.0, 7)
    with pytest.raises(ValueError, match="is for agent='dqn', this learner has 'dpg'"):
        BestCheckpoint(str(tmp_path)).resume("dpg", CARTPOLE)
    with pytest.raises(ValueError, match="is for env="):
        BestCheckpoint(str(tmp_path)).resume("dqn", "gym:Acrobot-v1")


def test_a_resumed_keeper_replaces_an_unreadable_best(dqn, tmp_path, caplog):
    learner, cfg, _ = dqn
    path = tmp_path / BEST_CHECKPOINT
    path.write_bytes(b"not a checkpoint")
    keeper = BestCheckpoint(str(tmp_path))
    keeper.resume("dqn", CARTPOLE)
    assert keeper.record is None and "the next evaluation replaces it" in caplog.text
    assert best_line(str(tmp_path)).startswith(f"best checkpoint unreadable: {path} is not a readable apexrl")
    assert _offer(keeper, learner, cfg, 1.0, 1)
    assert load_best(str(path))[2]["mean"] == 1.0


def test_a_checkpoint_without_an_evaluation_record_is_no_best(dqn, tmp_path):
    learner, cfg, _ = dqn
    save_checkpoint(str(tmp_path / BEST_CHECKPOINT), learner.state_dict(), _meta("dqn", CARTPOLE, cfg, 0))
    with pytest.raises(CheckpointError, match="holds no record of the evaluation that chose it"):
        load_best(str(tmp_path / BEST_CHECKPOINT))
    with pytest.raises(EvaluateError, match="holds no record"):
        evaluate_run(str(tmp_path), episodes=1, best=True)


# A writer in its own process: resumes the best of RUN_DIR, holds the best's own state and offers a better
# evaluation of it, with writes limited to LIMIT bytes. SIGXFSZ at its default kills the process inside write()
# (a crash mid-write); ignored (Python's own default) the write fails with EFBIG (a full disk).
_WRITER = """
import json, resource, signal, sys
from apexrl.apex.best import BestCheckpoint, load_best
from apexrl.apex.evaluator import EvalResult
run_dir, limit, die = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "die"
tensors, meta, record = load_best(run_dir + "/best_checkpoint.safetensors")
keeper = BestCheckpoint(run_dir)
keeper.resume(meta["agent"], meta["env"])
keeper.hold(tensors, {**meta, "learner_steps": 99})
resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
signal.signal(signal.SIGXFSZ, signal.SIG_DFL if die else signal.SIG_IGN)
written = keeper.offer(EvalResult.of([record["mean"] + 100.0], 99, 0, 0.0))
print(json.dumps({"written": written, "failures": keeper.failures, "record": keeper.record}))
"""


def _writer(run_dir: str, limit: int, mode: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", _WRITER, run_dir, str(limit), mode], capture_output=True, text=True, timeout=120
    )


@pytest.mark.parametrize("mode", ["die", "fail"])
def test_a_writer_dying_or_failing_mid_write_leaves_the_old_best_intact(dqn, tmp_path, mode):
    learner, cfg, _ = dqn
    keeper = BestCheckpoint(str(tmp_path))
    assert _offer(keeper, learner, cfg, 30.0, 4)
    path = str(tmp_path / BEST_CHECKPOINT)
    old = Path(path).read_bytes()
    limit = len(old) // 2  # the new best is as large as the old: its write stops halfway

    done = _writer(str(tmp_path), limit, mode)
    if mode == "die":
        assert done.returncode == -signal.SIGXFSZ, done.stdout + done.stderr  # killed inside write()
        (temporary,) = glob.glob(path + ".tmp.*")  # the torn new best, never renamed over the old
        assert os.path.getsize(temporary) == limit
    else:
        assert done.returncode == 0, done.stderr
        report = json.loads(done.stdout)
        assert report["written"] is False and report["failures"] == 1
        assert report["record"]["mean"] == 30.0  # the record in memory still names the file on disk
        assert "not written" in done.stderr and "the previous best stays valid" in done.stderr
        assert not glob.glob(path + ".tmp.*")  # a failed write removes its temporary
    assert Path(path).read_bytes() == old
    assert load_best(path)[2]["learner_steps"] == 4

    resumed = BestCheckpoint(str(tmp_path))  # the next learner keeps the old best, then replaces it
    resumed.resume("dqn", CARTPOLE)
    assert resumed.record["mean"] == 30.0
    assert _offer(resumed, learner, cfg, 31.0, 5)
    assert load_best(path)[2]["learner_steps"] == 5
    assert not glob.glob(path + ".tmp.*")  # a dead writer's temporary is removed by the next write


@pytest.mark.parametrize(
    ("preset", "env"),
    [
        ("cartpole", CARTPOLE),
        ("pendulum", "gym:Pendulum-v1"),
        ("d4pg-small", "gym:Pendulum-v1"),
        ("td3-small", "gym:Pendulum-v1"),
        ("sac-small", "gym:Pendulum-v1"),
        ("r2d2-cpu", MASKED),
    ],
)
def test_evaluate_best_scores_the_best_checkpoint_of_every_agent(preset, env, tmp_path):
    learner, cfg, agent = _learner(preset, env)
    run_dir = str(tmp_path)
    with pytest.raises(EvaluateError, match=f"has no {BEST_CHECKPOINT}"):
        evaluate_run(run_dir, episodes=1, best=True)
    keeper = BestCheckpoint(run_dir)
    keeper.hold(learner.state_dict(), _meta(agent, env, cfg, 0))
    assert keeper.offer(_result(-5.0, 0, episodes=2))
    save_checkpoint(os.path.join(run_dir, "checkpoint.safetensors"), learner.state_dict(), _meta(agent, env, cfg, 0))

    r = evaluate_run(run_dir, episodes=1, best=True)
    assert (r.agent, r.env, r.checkpoint_kind, len(r.returns)) == (agent, env, "best", 1)
    assert r.seed == 6007  # run seed 0: not the evaluation stream (5003) whose episodes chose it
    assert r.checkpoint == os.path.join(os.path.abspath(run_dir), BEST_CHECKPOINT)
    assert r.chosen_by == dataclasses.asdict(_result(-5.0, 0, episodes=2))
    j = r.to_json()
    assert j["checkpoint_kind"] == "best" and j["chosen_by"]["mean"] == -5.0
    assert "chosen by its periodic evaluation of -5.00 over 2 episodes" in r.summary()
    last = evaluate_run(run_dir, episodes=1)
    assert (last.checkpoint_kind, last.chosen_by, last.seed) == ("last", None, 5003)
    assert load_checkpoint(os.path.join(run_dir, BEST_CHECKPOINT))[1]["agent"] == agent
