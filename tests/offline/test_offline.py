"""Offline data (docs/offline.md): recording the episodes actors play as Minari datasets, training a learner from
one with no actors (``apexrl run --offline``), and exporting a replay snapshot (``apexrl export``).

The main test records a real 2-actor x 2-environment CartPole run, trains offline from the recording, and exports
the offline run's snapshot: the replay must hold exactly the recording's n-step transitions, in order, as the
actor's own n-step adder computes them.
"""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
import warnings

import numpy as np
import pytest

from apexrl._core import PrioritizedStore
from apexrl.apex.metrics import read_csv
from apexrl.apex.nstep import stack_transitions
from apexrl.envs import env_spec, make_env
from apexrl.offline.export import ExportError, export_snapshot, load_export
from apexrl.offline.loader import episode_transitions, open_dataset, space_mismatch, transition_batches
from apexrl.offline.record import EpisodeRecorder, env_spaces
from apexrl.replay.server.insert_guard import spec_sidecar
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

minari = pytest.importorskip("minari", reason="pip install 'apexrl[offline]'")

FAST_LEARNER = "--min-replay-size 250 --eval-every 3 --eval-episodes 1 --metrics-every 1 --checkpoint-every 100"
OFFLINE_LEARNER = "--eval-every 3 --eval-episodes 1 --metrics-every 1 --checkpoint-every 100"
CARTPOLE_SPEC = TransitionSpec(
    [
        FieldSpec("obs", "f4", (4,)),
        FieldSpec("action", "i4"),
        FieldSpec("reward", "f4"),
        FieldSpec("discount", "f4"),
        FieldSpec("next_obs", "f4", (4,)),
    ]
)
ARRAYS = ("observations", "actions", "rewards", "terminations", "truncations")


def _apexrl(*args: str, timeout: float = 180) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "apexrl", *args], capture_output=True, text=True, timeout=timeout)


def _episodes(path: str) -> list:
    dataset = minari.MinariDataset(path)
    return [dataset[i] for i in range(dataset.total_episodes)]


@pytest.mark.slow
def test_record_a_cartpole_run_train_offline_from_it_and_export_its_replay(tmp_path):
    data, run1, run2 = str(tmp_path / "data"), str(tmp_path / "run1"), str(tmp_path / "run2")
    # Each actor plays 150 steps (75 per environment) and exits; the learner cannot start before both inserted.
    out = _apexrl(
        "run",
        "--run-dir",
        run1,
        "--minutes",
        "0",
        "--steps",
        "30",
        "--final-eval",
        "0",
        "--actors",
        "2",
        "--envs-per-actor",
        "2",
        "--quiet",
        "--record-dataset",
        data,
        "--actor-args=--max-steps 150",
        f"--learner-args={FAST_LEARNER}",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert sorted(os.listdir(data)) == ["actor0", "actor1"]  # one dataset per actor: nobody clobbers another
    # episodes.csv read row by row: two actors starting at the same moment may both write its header.
    with open(os.path.join(run1, "episodes.csv"), encoding="utf-8") as f:
        rows = [row for row in csv.DictReader(f) if row["actor"] != "actor"]
    total = 0
    for actor in (0, 1):
        episodes = _episodes(os.path.join(data, f"actor{actor}"))
        assert episodes
        for ep in episodes:
            t = len(ep.rewards)
            assert ep.observations.shape == (t + 1, 4) and ep.observations.dtype == np.float32
            assert ep.actions.shape == (t,) and set(np.unique(ep.actions)) <= {0, 1}
            assert np.all(ep.rewards == 1.0)
            ended = ep.terminations | ep.truncations
            assert ended[-1] and not ended[:-1].any()  # one episode each, never two environments' steps mixed
            assert not ep.terminations[-1] or t < 500
        # Every finished episode in episodes.csv is in the dataset; at most one per environment more (the
        # episodes still open at the stop, recorded as truncated where the actor stopped).
        lengths = sorted(len(ep.rewards) for ep in episodes)
        finished = sorted(int(row["length"]) for row in rows if int(row["actor"]) == actor)
        rest = list(lengths)
        for n in finished:
            rest.remove(n)
        assert len(rest) <= 2
        assert sum(lengths) == 150
        total += sum(lengths)

    # The learner's min_replay_size becomes the dataset's size: it learns once the whole dataset is in.
    out = _apexrl(
        "run",
        "--run-dir",
        run2,
        "--minutes",
        "0",
        "--steps",
        "40",
        "--final-eval",
        "1",
        "--quiet",
        "--offline",
        data,
        f"--learner-args={OFFLINE_LEARNER}",
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "no actors: offline from" in out.stdout
    metrics = read_csv(os.path.join(run2, "metrics.csv"))
    assert metrics["learner_steps"][-1] == 40 and metrics["replay_size"][-1] == total
    with open(os.path.join(run2, "final_eval.json"), encoding="utf-8") as f:
        assert json.load(f)["learner_steps"] == 40
    with open(os.path.join(run2, "logs", "loader.log"), encoding="utf-8") as f:
        assert f"loader done: {total} transitions inserted" in f.read()

    # The replay holds the recording's n-step transitions in order: actor0's episodes, then actor1's.
    exported = str(tmp_path / "replay.npz")
    out = _apexrl("export", os.path.join(run2, "replay.snap"), "--out", exported)
    assert out.returncode == 0 and f"wrote {total} items" in out.stdout, out.stdout + out.stderr
    got = load_export(exported)
    spec = TransitionSpec.from_json(got["spec"])
    n, gamma = 3, 0.99  # the cartpole preset's
    want = [
        t
        for actor in (0, 1)
        for ep in _episodes(os.path.join(data, f"actor{actor}"))
        for t in episode_transitions({name: getattr(ep, name) for name in ARRAYS}, n, gamma)
    ]
    want = stack_transitions(want, spec)
    for name in spec.names:
        np.testing.assert_array_equal(got[name], want[name], err_msg=name)
    assert np.all(got["priorities"] > 0) and np.all(np.diff(got["insertion"].astype(np.int64)) > 0)


def test_recording_appends_after_a_restart_and_refuses_other_spaces(tmp_path):
    spec = env_spec("gym:CartPole-v1")
    env = make_env("gym:CartPole-v1", 3)
    for steps in (7, 5):  # two lives of one actor: the second appends
        recorder = EpisodeRecorder(str(tmp_path), 0, spec, 1)
        obs = env.reset()
        recorder.start(0, obs)
        for _ in range(steps):
            step = env.step(0)
            recorder.step([0], [step.reward], [step.obs], [step.terminated], [step.truncated])
            if step.terminated or step.truncated:
                recorder.start(0, env.reset())
        recorder.close()
    lengths = [len(ep.rewards) for ep in _episodes(str(tmp_path / "actor0"))]
    assert sum(lengths) == 12 and len(lengths) >= 2
    # A restarted loader skips the transitions the replay holds: batches after `skip` are the rest, in order.
    storages = open_dataset(str(tmp_path))

    def rows(skip: int) -> np.ndarray:
        batches = list(transition_batches(storages, 3, 0.9, CARTPOLE_SPEC, skip=skip, batch=4))
        return np.concatenate([np.column_stack([b["obs"], b["reward"], b["discount"]]) for b in batches])

    whole = rows(0)
    assert len(whole) == 12
    for skip in (1, 5, 11):
        np.testing.assert_array_equal(rows(skip), whole[skip:])
    assert list(transition_batches(storages, 3, 0.9, CARTPOLE_SPEC, skip=12)) == []
    with pytest.raises(ValueError, match="other spaces"):
        EpisodeRecorder(str(tmp_path), 0, env_spec("gym:Acrobot-v1"), 1)


def _refused(capsys, *argv: str) -> str:
    """``apexrl run ARGV``'s refusal (exit 2), in this process: its message."""
    from apexrl.cli.main import launch_plan

    with pytest.raises(SystemExit) as exit_info:
        launch_plan(list(argv[1:]))
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_offline_refuses_a_dataset_whose_spaces_do_not_match_the_task(tmp_path, capsys):
    spec = env_spec("gym:CartPole-v1")
    recorder = EpisodeRecorder(str(tmp_path / "data"), 0, spec, 1)
    recorder.start(0, np.zeros(4, np.float32))
    recorder.step([1], [1.0], [np.ones(4, np.float32)], [True], [False])
    recorder.close()
    run = str(tmp_path / "run")
    err = _refused(capsys, "run", "--run-dir", run, "--offline", str(tmp_path / "data"), "--env", "gym:Acrobot-v1")
    assert "does not match the task" in err and "shape (6,)" in err, err
    assert "never downloads" in _refused(capsys, "run", "--run-dir", run, "--offline", "apexrl-test/none-v0")
    assert "leave out --actors" in _refused(
        capsys, "run", "--run-dir", run, "--offline", str(tmp_path / "data"), "--actors", "2"
    )
    err = _refused(
        capsys, "run", "--run-dir", run, "--offline", str(tmp_path / "data"), "--learner-args=--min-replay-size 5"
    )
    assert "gives 1 transitions, fewer than the learner's min_replay_size 5" in err, err
    # A recording directory of another task is refused before anything starts (not by crash-looping actors).
    err = _refused(
        capsys, "run", "--run-dir", run, "--record-dataset", str(tmp_path / "data"), "--env", "gym:Acrobot-v1"
    )
    assert "holds episodes of other spaces" in err, err
    assert not os.path.exists(run)
    # Continuous actions must be in apexrl's [-1, 1] units.
    from gymnasium import spaces

    pendulum = env_spec("gym:Pendulum-v1")
    obs, act = env_spaces(pendulum)
    assert space_mismatch(obs, act, pendulum) is None
    assert space_mismatch(spaces.Box(-np.inf, np.inf, (3,), np.float64), act, pendulum) is None  # cast to float32
    assert "dtype uint8" in space_mismatch(spaces.Box(0, 255, (3,), np.uint8), act, pendulum)
    assert "[-1, 1]" in space_mismatch(obs, spaces.Box(-2.0, 2.0, (1,), np.float32), pendulum)
    assert "Discrete(2)" in space_mismatch(env_spaces(spec)[0], spaces.Discrete(3), spec)


def _recorded(path: str, steps: int) -> None:
    """A CartPole dataset of ``steps`` steps (episodes of 7) at ``path``."""
    recorder = EpisodeRecorder(path, 0, env_spec("gym:CartPole-v1"), 1)
    recorder.start(0, np.zeros(4, np.float32))
    for t in range(steps):
        end = t % 7 == 6 or t == steps - 1
        recorder.step([t % 2], [1.0], [np.full(4, t, np.float32)], [end], [False])
        if end and t != steps - 1:
            recorder.start(0, np.zeros(4, np.float32))
    recorder.close()


def test_offline_sizes_the_replay_to_the_dataset_unless_a_capacity_is_given(tmp_path, capsys):
    from apexrl.cli.main import launch_plan

    data, run = str(tmp_path / "data"), str(tmp_path / "run")
    _recorded(data, 40)
    p, _level, _args = launch_plan(["--run-dir", run, "--offline", data])
    assert p.server.table().capacity == 40 and p.learner.min_replay_size == 40
    # with 2 replay servers each holds its half (rounded up), as the one table's capacity is split
    p, _level, _args = launch_plan(["--run-dir", run, "--offline", data, "--replay-servers", "2"])
    assert [s.table().capacity for s in p.servers] == [20, 20]
    # an explicit capacity wins; one too small for the dataset keeps its clear refusal
    p, _level, _args = launch_plan(["--run-dir", run, "--offline", data, "--server-args=--capacity 500"])
    assert p.server.table().capacity == 500
    err = _refused(capsys, "run", "--run-dir", run, "--offline", data, "--server-args=--capacity 30")
    assert "gives 40 transitions, more than the replay capacity 30" in err, err
    assert "--server-args '--capacity 40'" in err, err
    assert not os.path.exists(run)


def test_a_dataset_made_by_minari_itself_is_found_by_id_in_the_local_store(tmp_path, monkeypatch):
    import gymnasium as gym
    from minari.data_collector.episode_buffer import EpisodeBuffer

    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path))
    env = gym.make("CartPole-v1")  # gymnasium's own spaces (bounded Box), as a user's dataset has them
    obs, _ = env.reset(seed=1)
    observations, actions, rewards, term, trunc = [obs], [], [], [], []
    while not (term and term[-1]):
        action = len(actions) % 2
        obs, reward, terminated, truncated, _ = env.step(action)
        observations.append(obs)
        actions.append(action)
        rewards.append(reward)
        term.append(terminated)
        trunc.append(truncated)
    episode = EpisodeBuffer(
        observations=np.stack(observations),
        actions=np.array(actions),
        rewards=np.array(rewards),
        terminations=np.array(term),
        truncations=np.array(trunc),
    )
    with warnings.catch_warnings():  # Minari's advice on metadata a test dataset leaves out (eval_env, ...)
        warnings.simplefilter("ignore", UserWarning)
        minari.create_dataset_from_buffers(
            "apexrl-test/cartpole/alternating-v0",
            [episode],
            env="CartPole-v1",
            algorithm_name="alternating",
            data_format="hdf5",
        )
    storages = open_dataset("apexrl-test/cartpole/alternating-v0")
    spec = env_spec("gym:CartPole-v1")
    from apexrl.offline.loader import dataset_steps

    assert dataset_steps(storages, spec, "id") == len(actions)
    ts = episode_transitions(next(iter(storages[0].get_episodes([0]))), 3, 0.9)
    assert len(ts) == len(actions) and ts[-1].discount == 0.0  # it terminated: no bootstrap
    np.testing.assert_array_equal(np.stack([t.obs for t in ts]), np.stack(observations[:-1]))


def test_a_missing_minari_is_refused_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "minari", None)  # import minari raises ImportError
    err = _refused(capsys, "run", "--run-dir", str(tmp_path / "run"), "--record-dataset", str(tmp_path / "x"))
    assert "pip install 'apexrl[offline]'" in err, err
    err = _refused(capsys, "run", "--run-dir", str(tmp_path / "run"), "--offline", str(tmp_path))
    assert "pip install 'apexrl[offline]'" in err, err
    monkeypatch.undo()
    with pytest.raises(ValueError, match="holds no Minari dataset"):
        open_dataset(str(tmp_path))


# ---------------------------------------------------------------------------------------------- export

SPEC = TransitionSpec(
    [
        FieldSpec("obs", "u1", (2, 6, 6), compress=True),
        FieldSpec("action", "i4"),
        FieldSpec("reward", "f4"),
        FieldSpec("discount", "f4"),
        FieldSpec("next_obs", "u1", (2, 6, 6), compress=True),
    ]
)


def _snapshot(tmp_path) -> tuple[str, dict[int, tuple[float, dict]]]:
    """A saved store with history on every shard (inserts, updates, erasures, an eviction) and its sidecar; the
    live items by key: (priority, fields)."""
    rng = np.random.default_rng(7)
    store = PrioritizedStore(capacity=150, alpha=0.6, shards=3, eviction="fifo", seed=1)
    live: dict[int, tuple[float, dict]] = {}
    for n in (40, 1, 64, 70):
        batch = {
            "obs": rng.integers(0, 4, (n, 2, 6, 6), dtype=np.uint8),
            "action": rng.integers(0, 5, n, dtype=np.int32),
            "reward": rng.normal(size=n).astype(np.float32),
            "discount": rng.random(n).astype(np.float32),
            "next_obs": rng.integers(0, 256, (n, 2, 6, 6), dtype=np.uint8),
        }
        prios = rng.choice([0.0, 0.25, 1.0, 7.5], size=n)
        data, offsets = SPEC.encode(batch)
        keys = store.insert(prios, data, offsets).tolist()
        for i, key in enumerate(keys):
            live[key] = (float(prios[i]), {name: batch[name][i] for name in SPEC.names})
    first = list(live)[:10]
    assert store.update_priorities(first, [3.0] * 10) == 10
    for key in first:
        live[key] = (3.0, live[key][1])
    assert store.erase(list(live)[20:25]) == 5
    for key in list(live)[20:25]:
        del live[key]
    evicted = store.remove_to_fit()
    assert evicted > 0
    for key in list(live)[:evicted]:  # fifo: the oldest go
        del live[key]
    path = str(tmp_path / "replay.snap")
    store.save(path)
    with open(spec_sidecar(path), "w", encoding="utf-8") as f:
        f.write(SPEC.to_json())
    assert len(store) == len(live)
    return path, live


def test_export_writes_every_live_item_its_key_and_priority_field_by_field(tmp_path):
    path, live = _snapshot(tmp_path)
    out = str(tmp_path / "export.npz")
    assert export_snapshot(path, out) == len(live)
    got = load_export(out)
    assert TransitionSpec.from_json(got["spec"]) == SPEC
    assert json.loads(got["store"])["capacity"] == 150 and json.loads(got["store"])["shards"] == 3
    assert got["keys"].dtype == np.uint64 and got["priorities"].dtype == np.float64
    assert got["keys"].tolist() == list(live)  # every live item once, oldest first
    for row, key in enumerate(got["keys"].tolist()):
        priority, fields = live[key]
        assert got["priorities"][row] == priority
        for name in SPEC.names:
            np.testing.assert_array_equal(got[name][row], fields[name], err_msg=f"{name} of key {key}")
    # The keys still address the same items in the store restored from the snapshot.
    restored = PrioritizedStore.load(path)
    assert restored.update_priorities(got["keys"], got["priorities"] + 1.0) == len(live)


def test_export_refuses_a_missing_or_corrupt_snapshot_or_sidecar_and_writes_nothing(tmp_path):
    path, _ = _snapshot(tmp_path)
    out = tmp_path / "out.npz"
    with open(path, "rb") as f:
        good = f.read()
    cases = []
    for name, content in (
        ("truncated.snap", good[:-40]),
        ("flipped.snap", good[:300] + bytes([good[300] ^ 1]) + good[301:]),
    ):
        bad = str(tmp_path / name)
        with open(bad, "wb") as f:
            f.write(content)
        with open(spec_sidecar(bad), "w", encoding="utf-8") as f:
            f.write(SPEC.to_json())
        cases.append((bad, None, "cannot be read"))
    os.unlink(spec_sidecar(path))
    cases += [
        (str(tmp_path / "none.snap"), None, "does not exist"),
        (path, None, "spec sidecar"),
        (path, "{not json", "spec"),
    ]
    for snapshot, spec, message in cases:
        with pytest.raises(ExportError, match=message):
            export_snapshot(snapshot, str(out), spec=spec)
        assert not out.exists()
    result = _apexrl("export", path, "--out", str(out), timeout=60)
    assert result.returncode == 2 and "spec sidecar" in result.stderr and not out.exists()
    assert export_snapshot(path, str(out), spec=SPEC.to_json()) > 0  # --spec stands in for the sidecar
