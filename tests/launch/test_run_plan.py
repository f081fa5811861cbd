"""The typed run plan and the config ranges: validated once, equal to what the native store accepts."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from apexrl import PrioritizedStore
from apexrl.launch.plan import Overrides, RunPlan, plan
from apexrl.replay.server.config import MAX_SHARDS, MAX_SLOTS_PER_SHARD, STORE_INT_MAX, ServerConfig
from apexrl.replay.server.table_flags import EVICTION_POLICIES
from apexrl.replay.tables import MinSize, TableConfig
from apexrl.validate import range_of


@pytest.mark.parametrize(
    "field, ok, bad",
    [("shards", MAX_SHARDS, MAX_SHARDS + 1), ("seed", STORE_INT_MAX, -1)],
)
def test_server_config_ranges_are_the_stores(field, ok, bad):
    kwargs = {"capacity": 10, "shards": 1, "seed": 0}
    PrioritizedStore(**{**kwargs, field: ok})
    ServerConfig(**{field: ok})
    with pytest.raises((ValueError, OverflowError)):
        PrioritizedStore(**{**kwargs, field: bad})
    with pytest.raises(ValueError, match=f"ServerConfig.{field} must be"):
        ServerConfig(**{field: bad})
    assert not range_of(ServerConfig, field).ok(bad)


def test_table_capacity_range_is_the_stores():
    # the largest capacity one shard takes with the default max_size (2 * capacity; keys have 28 slot bits)
    ok, bad = MAX_SLOTS_PER_SHARD // 2, 0
    PrioritizedStore(capacity=ok, shards=1)
    ServerConfig(tables=[TableConfig("default", capacity=ok)], shards=1)
    with pytest.raises((ValueError, OverflowError)):
        PrioritizedStore(capacity=bad, shards=1)
    with pytest.raises(ValueError, match="table 'default': capacity: must be"):
        ServerConfig(tables=[TableConfig("default", capacity=bad)])
    assert not range_of(TableConfig, "capacity").ok(bad)


def test_eviction_policies_are_the_stores():
    for name in EVICTION_POLICIES:
        PrioritizedStore(capacity=10, eviction=name)
    with pytest.raises(ValueError):
        PrioritizedStore(capacity=10, eviction="lifo-that-does-not-exist")


@pytest.mark.parametrize(
    "flags, reason",
    [
        (["--shards", "4096"], "must be an int in [1, 256]"),
        (["--seed", str(2**64 - 1)], "must be an int in [0, 9223372036854775807]"),
        (["--samples-per-insert", "4", "--error-buffer", "2"], "error_buffer must be >= max(1, samples_per_insert)"),
    ],
)
def test_server_flags_the_store_would_reject_exit_2(flags, reason):
    out = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--port", "0", *flags], capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 2 and reason in out.stderr, out.stderr


def test_plan_fills_every_process_and_round_trips_through_json(tmp_path):
    p = plan("cartpole", Overrides(seed=3, actors=3, run_dir=str(tmp_path)))
    assert (p.agent, p.env, len(p.actors)) == ("dqn", "gym:CartPole-v1", 3)
    assert p.server.table().rate_limiter == MinSize(p.learner.min_replay_size) == MinSize(2000)  # follows the learner
    assert p.server.seed == p.learner.seed == 3 and [a.index for a in p.actors] == [0, 1, 2]
    assert all(a.agent_config == p.learner.agent_config for a in p.actors)
    placed = p.placed(
        replay="tcp://127.0.0.1:5", server_port=5, params="tcp://127.0.0.1:6", params_port=6, logs=str(tmp_path)
    )
    placed.save(str(tmp_path / "plan.json"))
    assert RunPlan.load(str(tmp_path / "plan.json")) == placed
    assert placed.actors[2].progress_path.endswith("actor2.progress.jsonl")


def test_plan_refuses_a_rate_limiter_that_cannot_make_progress():
    with pytest.raises(
        ValueError,
        match=r"deadlock: a learner batch of 512 plus an actor insert of 50 x "
        r"samples_per_insert 1 = 562 exceeds 2 x error_buffer = 200",
    ):
        plan("cartpole", Overrides(agent_fields={"batch_size": 512}, server={"samples_per_insert": 1.0}))
    plan(
        "cartpole", Overrides(agent_fields={"batch_size": 512}, server={"samples_per_insert": 1.0, "error_buffer": 281})
    )


def test_a_vectorised_actors_flush_goes_in_requests_the_rate_limiter_can_admit():
    # d4pg-acme: samples_per_insert 32, error buffer 3200, batch 256: one request may carry at most
    # (2 * 3200 - 256) / 32 = 192 transitions; B = 50 per environment fits, B·K = 200 (K = 4) does not.
    p = plan("d4pg-acme", Overrides(actors=2, actor={"envs_per_actor": 4}))
    assert [(a.flush_every, a.envs_per_actor, a.insert_max) for a in p.actors] == [(50, 4, 192)] * 2
    assert plan("d4pg-acme", Overrides(actor={"envs_per_actor": 3})).actors[0].insert_max == 0  # 150 fits
    assert plan("apex-dqn-atari", Overrides(actor={"envs_per_actor": 64})).actors[0].insert_max == 0  # no limit hit
    # A B that alone cannot be admitted is still refused, with the arithmetic.
    with pytest.raises(ValueError, match=r"an actor insert of 200 x samples_per_insert 32"):
        plan("d4pg-acme", Overrides(actor={"flush_every": 200}))


def test_plan_refuses_a_warm_up_larger_than_the_replay():
    with pytest.raises(ValueError, match="min_replay_size 200000 exceeds the replay capacity 100000"):
        plan("cartpole", Overrides(learner={"min_replay_size": 200_000}))


def test_plan_picks_the_agent_from_the_environment():
    assert plan(None, Overrides(env="gym:Pendulum-v1")).preset == "pendulum"
    assert plan(None, Overrides(agent="dpg")).env == "gym:Pendulum-v1"
    with pytest.raises(ValueError, match="agent dqn cannot run on gym:Pendulum-v1"):
        plan(None, Overrides(agent="dqn", env="gym:Pendulum-v1"))


def test_placement_keeps_the_addresses_the_plan_binds():
    # Placement fills in endpoints; a bind the user asked for (--server-args '--bind ...') stays.
    p = plan("cartpole", Overrides(server={"bind": "0.0.0.0"}, learner={"params_bind": "0.0.0.0"}, insecure=True))
    placed = p.placed(replay="tcp://127.0.0.1:5", server_port=5, params="tcp://127.0.0.1:6", params_port=6)
    assert (placed.server.bind, placed.server.port) == ("0.0.0.0", 5)
    assert (placed.learner.params_bind, placed.learner.params_port) == ("0.0.0.0", 6)


@pytest.mark.parametrize(
    "module, flags",
    [
        ("apexrl.cli.server", ["--port", "5"]),
        ("apexrl.cli.learner", ["--replay", "tcp://127.0.0.1:5"]),
        ("apexrl.cli.actor", ["--index", "0", "--flush-every", "3"]),
    ],
)
def test_a_flag_beside_plan_is_refused_not_ignored(tmp_path, module, flags):
    path = str(tmp_path / "plan.json")
    plan("cartpole", Overrides(run_dir=str(tmp_path))).save(path)
    out = subprocess.run(
        [sys.executable, "-m", module, "--plan", path, *flags], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2 and "--plan takes every setting from the plan; also given:" in out.stderr, out.stderr


def test_several_replay_servers_split_the_replay_and_each_has_its_own_snapshot_and_seed(tmp_path):
    p = plan("cartpole", Overrides(seed=2, replay_servers=3, run_dir=str(tmp_path), server={"capacity": 100_000}))
    assert len(p.servers) == 3 and p.server is p.servers[0]
    assert [s.table().capacity for s in p.servers] == [33_334] * 3  # rounded up: together at least the whole
    assert [s.table().rate_limiter for s in p.servers] == [MinSize(667)] * 3  # 2000 / 3, rounded up
    assert len({s.seed for s in p.servers}) == 3
    assert [s.snapshot for s in p.servers] == [str(tmp_path / f"replay{i}.snap") for i in range(3)]
    ends = [f"tcp://127.0.0.1:{port}" for port in (5, 6, 7)]
    with pytest.raises(ValueError, match="3 replay servers need as many endpoints and ports, got 2 and 3"):
        p.placed(replay=ends[:2], server_port=[5, 6, 7], params="tcp://127.0.0.1:8", params_port=8)
    placed = p.placed(replay=ends, server_port=[5, 6, 7], params="tcp://127.0.0.1:8", params_port=8)
    assert [s.port for s in placed.servers] == [5, 6, 7]
    assert placed.learner.replay == placed.actors[0].replay == ",".join(ends)
    placed.save(str(tmp_path / "plan.json"))
    assert RunPlan.load(str(tmp_path / "plan.json")) == placed
    from apexrl.launch.plan import server_config_from_plan

    assert server_config_from_plan(str(tmp_path / "plan.json"), 2) == placed.servers[2]
    with pytest.raises(ValueError, match="the plan has 3 replay server.s.; there is no server 3"):
        server_config_from_plan(str(tmp_path / "plan.json"), 3)


def test_one_replay_server_keeps_the_single_server_plan():
    p = plan("cartpole", Overrides(run_dir="/tmp/x"))
    assert len(p.servers) == 1 and p.server.snapshot == "/tmp/x/replay.snap" and p.server.seed == 0


def test_a_plan_refuses_more_lock_shards_than_server_keys_leave_room_for():
    # 32 servers take 5 of a key's 8 shard bits: 8 lock shards each at most.
    plan("cartpole", Overrides(replay_servers=32, server={"shards": 8}))
    with pytest.raises(ValueError, match="32 replay servers allow at most 8 lock shards each .--shards., got 16"):
        plan("cartpole", Overrides(replay_servers=32, server={"shards": 16}))
    with pytest.raises(ValueError, match="replay_servers must be in 1..32, got 33"):
        plan("cartpole", Overrides(replay_servers=33))


def test_the_server_cli_runs_the_plans_server_by_index(tmp_path):
    path = str(tmp_path / "plan.json")
    plan("cartpole", Overrides(run_dir=str(tmp_path), replay_servers=2)).save(path)
    out = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--plan", path, "--index", "2"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "the plan has 2 replay server(s); there is no server 2" in out.stderr
    out = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--port", "0", "--index", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 2 and "--index selects a server of --plan" in out.stderr


def test_the_plan_pins_the_runs_transition_spec_on_every_replay_server(tmp_path):
    """The launcher gives every replay server the run's spec (the server's --spec), so no client can declare
    another first: a HELLO with a foreign spec is refused, the actors' own spec is accepted."""
    import dataclasses

    import numpy as np

    from apexrl.agents import get_agent
    from apexrl.envs import env_spec
    from apexrl.errors import ServerError
    from apexrl.replay.client.replay_client import ReplayClient
    from apexrl.replay.server import ReplayServer
    from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

    p = plan("cartpole", Overrides(run_dir=str(tmp_path), replay_servers=2))
    actors_spec = get_agent(p.agent).make_policy(env_spec(p.env), p.actors[0].agent_config, 0, 1, 0).transition_spec
    assert [s.table().spec for s in p.servers] == [actors_spec] * 2
    path = str(tmp_path / "plan.json")
    p.save(path)
    assert RunPlan.load(path).servers[1].table().spec == actors_spec

    foreign = TransitionSpec([FieldSpec("obs", "f4", (3,)), FieldSpec("action", "i4")])
    with pytest.raises(ValueError, match="is not the spec of dqn on gym:CartPole-v1"):
        plan("cartpole", Overrides(run_dir=str(tmp_path), server={"spec": foreign.to_json()}))
    assert (
        plan("cartpole", Overrides(run_dir=str(tmp_path), server={"spec": actors_spec.to_json()})).server.table().spec
    )

    with ReplayServer(dataclasses.replace(p.servers[0], port=0, snapshot=None, snapshot_every=None)) as server:
        with ReplayClient(server.endpoint, timeout=30) as intruder:
            with pytest.raises(ServerError, match="declared spec .* differs from the server's spec"):
                intruder.hello(foreign)
            assert intruder.stats()["spec_declared"] == 1
            assert intruder.stats()["spec_fingerprint"] == actors_spec.fingerprint
        with ReplayClient(server.endpoint, timeout=30) as actor:
            actor.hello(actors_spec)
            batch = {
                "obs": np.zeros((2, 4), "f4"),
                "action": np.zeros(2, "i4"),
                "reward": np.zeros(2, "f4"),
                "discount": np.ones(2, "f4"),
                "next_obs": np.zeros((2, 4), "f4"),
            }
            data, offsets = actors_spec.encode(batch)
            assert len(actor.insert(np.ones(2), data=data, offsets=offsets)) == 2


def test_the_actors_of_a_plan_use_their_own_actor_key_when_the_key_directory_has_one(tmp_path):
    import dataclasses

    from apexrl.security import keygen

    keys = str(tmp_path / "keys")
    keygen(keys)
    p = plan("cartpole", Overrides(run_dir=str(tmp_path / "run"), actors=2, curve_dir=keys))
    assert p.server.curve_dir == p.learner.curve_dir == keys and {a.curve_dir for a in p.actors} == {keys}
    keygen(keys, "actor", "run")
    p = plan("cartpole", Overrides(run_dir=str(tmp_path / "run"), actors=2, curve_dir=keys))
    assert p.server.curve_dir == p.learner.curve_dir == keys
    assert {a.curve_dir for a in p.actors} == {os.path.join(keys, "actors", "run")}
    keygen(str(tmp_path / "other"))
    stray = dataclasses.replace(p.actors[1], curve_dir=str(tmp_path / "other"))
    from apexrl.launch.plan import check_rules

    with pytest.raises(ValueError, match="every process of a run uses the same CURVE keys"):
        check_rules(dataclasses.replace(p, actors=[p.actors[0], stray]))


def test_a_run_starts_the_tables_its_agent_declares_unless_tables_are_given():
    """The tables: --tables, else the preset's, else the agent's declared ones (ReplayPath.tables), else the one
    table of the preset's replay settings."""
    import dataclasses

    from apexrl.agents import get_agent
    from apexrl.launch.presets import get_preset
    from apexrl.replay.tables import TableConfig

    declared = get_agent("r2d2").replay.tables
    assert [t.name for t in declared] == ["default"] and declared[0].sampler == "prioritized"
    with_preset = plan("r2d2-cpu")  # the preset's own tables
    assert [t.capacity for t in with_preset.server.tables] == [get_preset("r2d2-cpu").tables[0].capacity]
    bare = dataclasses.replace(get_preset("r2d2-cpu"), name="r2d2-bare", tables=None)
    p = plan(bare)
    (table,) = p.server.tables
    assert (table.name, table.sampler, table.capacity, table.alpha) == ("default", "prioritized", 100_000, 0.9)
    assert table.spec is None  # sequence items: the table pins their structure at the first insert
    given = plan(bare, Overrides(tables=[TableConfig(name="default", sampler="uniform", capacity=1000)]))
    assert [(t.sampler, t.capacity) for t in given.server.tables] == [("uniform", 1000)]
    cartpole = get_preset("cartpole").replay  # Ape-X agents declare none: the preset's replay settings
    (table,) = plan("cartpole").server.tables
    assert (table.capacity, table.remover, table.alpha) == (cartpole.capacity, cartpole.eviction, cartpole.alpha)


def test_a_run_refuses_what_its_agents_replay_path_cannot_do_and_says_why():
    with pytest.raises(ValueError, match="--replay-servers 2: an on-policy agent reads one queue"):
        plan("ppo-cartpole", Overrides(replay_servers=2))
    assert len(plan("r2d2-cpu", Overrides(replay_servers=2)).servers) == 2  # sequences spread over servers
    with pytest.raises(ValueError, match="--offline: r2d2 reads sequences its actors write"):
        plan("r2d2-cpu", Overrides(offline="nowhere"))
