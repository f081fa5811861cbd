"""Spec-valid items with values an agent cannot train on, with real processes.

* The real apexrl-learner leaves such items out of the update, erases them from the replay, counts them
  (``invalid_items`` in metrics.csv) and keeps training to its step budget.
* Each agent's rules (``Agent.invalid_items``) name what they refuse.
* The replay server refuses non-finite and negative priorities (INSERT and UPDATE_PRIORITIES) and stores nothing.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from apexrl.agents import get_agent
from apexrl.apex.metrics import read_csv
from apexrl.envs import env_spec
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec
from tests.e2e.test_apex_processes import start_learner

CARTPOLE = TransitionSpec(
    [
        FieldSpec("obs", "f4", (4,)),
        FieldSpec("action", "i4"),
        FieldSpec("reward", "f4"),
        FieldSpec("discount", "f4"),
        FieldSpec("next_obs", "f4", (4,)),
    ]
)


def cartpole_batch(n: int, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "obs": rng.normal(size=(n, 4)).astype(np.float32),
        "action": rng.integers(0, 2, n).astype(np.int32),
        "reward": np.ones(n, np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": rng.normal(size=(n, 4)).astype(np.float32),
    }


def test_the_learner_erases_and_counts_items_with_bad_values_and_keeps_training(start_server, spawn, tmp_path):
    """The issue's items (action 99, NaN reward; and an inf observation) at priority 1e6, so that the first
    batches hold them, through a server that knows the spec (they are structurally valid): the learner trains
    to --max-steps and exits 0, and the items are gone from the replay."""
    spec_path = tmp_path / "spec.json"
    spec_path.write_text(CARTPOLE.to_json(), encoding="utf-8")
    srv = start_server("--capacity", "20000", "--min-size-to-sample", "300", "--spec", str(spec_path))
    batch = cartpole_batch(1000)
    batch["action"][7] = 99
    batch["reward"][8] = np.nan
    batch["next_obs"][9, 2] = np.inf
    priorities = np.ones(1000)
    priorities[7:10] = 1e6
    with ReplayClient(srv.endpoint, timeout=20, spec=CARTPOLE) as client:
        data, offsets = CARTPOLE.encode(batch)
        keys = client.insert(priorities, data=data, offsets=offsets)
        assert client.stats()["size"] == 1000  # the server's structural checks let them through
    run_dir = str(tmp_path / "run")
    learner, _ = start_learner(spawn, srv.endpoint, run_dir, "--max-steps", "60", "--eval-every", "0")
    assert learner.proc.wait(300) == 0, learner.log()[-4000:]
    log = learner.log()
    assert "Traceback" not in log and "diverged" not in log, log[-4000:]
    assert "erasing" in log and "invalid item(s)" in log and "action must be in [0, 1], got 99" in log, log[-4000:]
    cols = read_csv(os.path.join(run_dir, "metrics.csv"))
    assert cols["learner_steps"][-1] >= 60
    assert cols["invalid_items"][-1] >= 3  # each counted when sampled (a prefetched batch may hold one again)
    assert cols["undecodable_items"][-1] == 0
    with ReplayClient(srv.endpoint, timeout=20) as client:
        stats = client.stats()
        assert stats["size"] == 997 and stats["erased_items"] == 3
        assert client.update_priorities(keys[7:10], np.ones(3)) == 0  # their keys address nothing
        assert client.update_priorities(keys[:7], np.ones(7)) == 7


@pytest.mark.parametrize(
    ("agent", "env"), [("dqn", "gym:CartPole-v1"), ("dpg", "gym:Pendulum-v1"), ("d4pg", "gym:Pendulum-v1")]
)
def test_each_agent_names_the_values_it_refuses(agent, env):
    a = get_agent(agent)
    spec = env_spec(env)
    learner = a.make_learner(spec, a.config_class(), __import__("torch").device("cpu"), 0)
    rng = np.random.default_rng(0)
    d = spec.obs_shape[0]
    batch = {
        "obs": rng.normal(size=(6, d)).astype(np.float32),
        "reward": np.zeros(6, np.float32),
        "discount": np.full(6, 0.99, np.float32),
        "next_obs": rng.normal(size=(6, d)).astype(np.float32),
    }
    if agent == "dqn":
        batch["action"] = np.array([0, 1, 2, -1, 0, 1], np.int32)  # CartPole has actions 0 and 1
        wrong = {2, 3}
        why = "item 2: action must be in [0, 1], got 2"
    else:
        batch["action"] = np.array([[0.0], [1.0], [1.5], [np.nan], [-1.0], [0.5]], np.float32)
        wrong = {2, 3}
        why = "item 2: action must be in [-1, 1], got 1.5"
    batch["reward"][4] = np.inf
    batch["discount"][5] = 1.5
    assert learner.invalid_items({k: v[:2] for k, v in batch.items()}) == (None, None)
    bad, message = learner.invalid_items(batch)
    assert set(np.flatnonzero(bad)) == wrong | {4, 5}
    assert message == why
    before = {k: v.copy() for k, v in batch.items()}
    learner.invalid_items(batch)
    assert all(np.array_equal(before[k], batch[k], equal_nan=True) for k in batch)  # nothing changes


def test_the_server_refuses_non_finite_and_negative_priorities_and_stores_nothing(start_server, raw_socket):
    srv = start_server("--capacity", "100")
    sock = raw_socket(srv.endpoint)
    data, offsets = CARTPOLE.encode(cartpole_batch(3))
    for rid, bad in enumerate((np.nan, np.inf, -np.inf, -1.0), start=1):
        frames = P.encode_insert(rid, np.ones(3), data, offsets)  # the encoder refuses them: patch the frame
        frames[1] = np.array([1.0, bad, 1.0]).tobytes()
        sock.send_multipart(frames, copy=False)
        assert sock.poll(20_000), f"no reply to INSERT with priority {bad}"
        reply = P.decode_reply(sock.recv_multipart(), P.Op.INSERT, rid)
        assert reply.status == P.Status.INVALID_ARGUMENT and "priorit" in reply.message, (bad, reply.message)
    with ReplayClient(srv.endpoint, timeout=20) as client:
        assert client.stats()["size"] == 0
        keys = client.insert(np.ones(3), data=data, offsets=offsets)
        for rid, bad in enumerate((np.nan, np.inf, -1.0), start=100):
            frames = P.encode_update(rid, keys, np.full(3, 5.0))
            frames[2] = np.array([5.0, bad, 5.0]).tobytes()
            sock.send_multipart(frames, copy=False)
            assert sock.poll(20_000), f"no reply to UPDATE_PRIORITIES with priority {bad}"
            reply = P.decode_reply(sock.recv_multipart(), P.Op.UPDATE_PRIORITIES, rid)
            assert reply.status == P.Status.INVALID_ARGUMENT and "priorit" in reply.message, (bad, reply.message)
        assert client.stats()["size"] == 3
        got = client.sample(16)
        assert np.allclose(got.probabilities, 1 / 3)  # no priority of a refused update was applied
        assert client.update_priorities(keys, np.full(3, 2.0)) == 3  # it keeps serving
