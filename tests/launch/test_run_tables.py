"""``--tables FILE`` on the command lines: ``apexrl-replay-server --tables`` through its real parser,
and ``apexrl run --tables`` / a preset's tables through the plan to the servers' command lines."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest

from apexrl.cli import server as server_cli
from apexrl.launch.plan import Overrides, RunPlan, plan, run_spec
from apexrl.launch.presets import ReplaySettings, get_preset
from apexrl.replay import MinSize, Queue, SampleToInsertRatio, TableConfig
from apexrl.replay.tables import load_tables, tables_from_json

TABLES = [
    {"name": "default", "capacity": 100_000},
    {"name": "aux", "sampler": "uniform", "capacity": 5000},
    {"name": "onpolicy", "sampler": "fifo", "capacity": 64, "max_times_sampled": 1,
     "rate_limiter": {"kind": "queue", "size": 64}},
]  # fmt: skip


def _file(tmp_path, tables=TABLES, name="tables.json"):
    path = tmp_path / name
    path.write_text(json.dumps(tables))
    return str(path)


def _server_error(capsys, argv):
    with pytest.raises(SystemExit) as e:
        server_cli.parse_args(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


# -- apexrl-replay-server --------------------------------------------------------------------------------------


def test_the_server_takes_its_tables_from_the_file(tmp_path):
    args = server_cli.parse_args(["--port", "0", "--tables", _file(tmp_path), "--shards", "4"])
    assert [t.name for t in args.config.tables] == ["default", "aux", "onpolicy"]
    assert args.config.table("onpolicy") == TableConfig(
        "onpolicy", sampler="fifo", capacity=64, max_times_sampled=1, rate_limiter=Queue(64)
    )
    assert args.config.shards == 4  # server-wide flags stay


def test_without_tables_the_flags_configure_the_table_default():
    args = server_cli.parse_args(
        ["--port", "0", "--capacity", "50", "--eviction", "uniform", "--samples-per-insert", "2"]
    )
    assert args.config.tables == [
        TableConfig("default", capacity=50, remover="uniform", rate_limiter=SampleToInsertRatio(2.0, 1, 200.0))
    ]


@pytest.mark.parametrize(
    "flags, named",
    [
        (["--capacity", "5"], "--capacity"),
        (["--capacity", "1000000"], "--capacity"),  # given explicitly, even at its default
        (["--eviction", "fifo", "--alpha", "0.5"], "--alpha, --eviction"),
        (["--min-size-to-sample", "10"], "--min-size-to-sample"),
        (["--samples-per-insert", "2", "--error-buffer", "10"], "--samples-per-insert, --error-buffer"),
        (["--spec", "{}"], "--spec"),
        (["--max-size", "9", "--alpha-evict", "1"], "--max-size, --alpha-evict"),
    ],
)
def test_tables_beside_a_table_flag_is_refused_with_the_reason(tmp_path, capsys, flags, named):
    err = _server_error(capsys, ["--port", "0", "--tables", _file(tmp_path), *flags])
    assert f"--tables sets every table: leave out {named} (the flags of the one table 'default'" in err, err


@pytest.mark.parametrize(
    "tables, message",
    [
        ([{"name": "a"}, {"name": "b", "sampler": "random"}], "table 1 ('b'): sampler: must be one of prioritized"),
        (
            [{"name": "a", "remover": "lru"}],
            "table 0 ('a'): remover: must be one of fifo, prioritized, lowest_priority",
        ),
        ([{"name": "a", "rate_limiter": {"kind": "fifo"}}], "table 0 ('a'): rate_limiter: unknown kind 'fifo' (valid"),
        ([{"name": "a"}, {"name": "a"}], "tables 0 and 1 are both named 'a'"),
        ([{"nam": "a"}], "table 0: nam: no such field (the fields: name, sampler, remover,"),
    ],
)
def test_a_bad_tables_file_exits_2_naming_the_file_table_and_field(tmp_path, capsys, tables, message):
    path = _file(tmp_path, tables)
    err = _server_error(capsys, ["--port", "0", "--tables", path])
    assert f"error: --tables {path}: {message}" in err, err


def test_a_table_too_large_for_the_shards_exits_2(tmp_path, capsys):
    path = _file(tmp_path, [{"name": "big", "capacity": 2**27}])
    err = _server_error(capsys, ["--port", "0", "--tables", path, "--shards", "1"])
    assert "table 'big': max_size 268435456 (default 2 * capacity) over 1 shards needs" in err, err


def test_the_help_explains_the_format_with_an_example_that_parses():
    text = server_cli.build_parser().format_help()
    assert "--tables FILE" in text and '"kind": "sample_to_insert_ratio"' in text and "Reverb's max_size" in text
    example = text.split("example:\n", 1)[1].split("\nWithout --tables", 1)[0]
    tables = tables_from_json(json.loads(example))
    assert [t.name for t in tables] == ["default", "aux", "onpolicy"]


def test_the_real_command_refuses_a_bad_tables_file(tmp_path):
    path = _file(tmp_path, [{"name": "q", "capacity": 4, "rate_limiter": {"kind": "queue", "size": 8}}])
    out = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--port", "0", "--tables", path],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert f"--tables {path}: table 0 ('q'): rate_limiter: Queue.size 8 exceeds capacity 4" in out.stderr


# -- apexrl run -------------------------------------------------------------------------------------------------


def _launch(argv):
    from apexrl.launch.start import launch_plan

    p, _, _ = launch_plan(argv)
    return p


def _launch_error(capsys, argv):
    with pytest.raises(SystemExit) as e:
        _launch(argv)
    assert e.value.code == 2
    return capsys.readouterr().err


def test_run_tables_reach_the_plan_and_the_servers_command_line(tmp_path):
    from apexrl.launch.local import child_specs

    (tmp_path / "run").mkdir()  # the server checks its snapshot directory
    p = _launch(["--preset", "cartpole", "--run-dir", str(tmp_path / "run"), "--tables", _file(tmp_path)])
    tables = p.server.tables
    assert [t.name for t in tables] == ["default", "aux", "onpolicy"]
    default = p.server.table()
    # the learner's and actors' table: the run's spec, a min size that follows the learner's min_replay_size
    assert default.spec is not None and default.rate_limiter == MinSize(p.learner.min_replay_size)
    assert default.capacity == 100_000 and tables[1:] == tables_from_json(TABLES[1:])
    assert p.server.snapshot is not None  # server-wide: the run's
    placed = p.placed(replay="tcp://127.0.0.1:5", server_port=5, params="tcp://127.0.0.1:6", params_port=6)
    path = str(tmp_path / "plan.json")
    placed.save(path)
    assert RunPlan.load(path) == placed
    spec = child_specs(placed, path, "WARNING")[0]
    assert spec.module == "apexrl.cli.server" and spec.args[:2] == ["--plan", path]
    config = server_cli.parse_args(spec.args).config  # what the server child runs
    assert config == placed.server and config.tables == placed.server.tables


def test_run_tables_keep_the_default_tables_own_rate_limiter(tmp_path):
    ratio = {
        "kind": "sample_to_insert_ratio",
        "samples_per_insert": 4.0,
        "min_size_to_sample": 100,
        "error_buffer": 400,
    }
    path = _file(tmp_path, [{"name": "default", "capacity": 10_000, "rate_limiter": ratio}])
    p = plan("cartpole", Overrides(tables=load_tables(path), run_dir=str(tmp_path)))
    assert p.server.table().rate_limiter == SampleToInsertRatio(4.0, 100, 400.0)
    # the rate limiter's deadlock rule between the learner's batch and the actors' inserts holds for it too
    small = [{"name": "default", "rate_limiter": {**ratio, "error_buffer": 20}}]
    with pytest.raises(
        ValueError, match=r"deadlock: a learner batch of 128 plus an actor insert of 50 x samples_per_insert 4 = 328 "
    ):
        plan("cartpole", Overrides(tables=tables_from_json(small)))


def test_without_tables_a_run_plans_as_before(tmp_path):
    p = plan("cartpole", Overrides(run_dir=str(tmp_path)))
    replay = get_preset("cartpole").replay
    assert p.learner.min_replay_size == 2000
    assert p.server.tables == [
        TableConfig(
            "default",
            capacity=replay.capacity,
            remover=replay.eviction,
            alpha=replay.alpha,
            alpha_evict=replay.alpha_evict,
            rate_limiter=MinSize(2000),
            spec=run_spec("dqn", "gym:CartPole-v1", p.learner.agent_config),
        )
    ]


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--server-args", "--capacity 5"], "--server-args --capacity: the run's tables (--tables or the preset's)"),
        (["--server-args", "--samples-per-insert 2"], "--server-args --samples-per-insert: the run's tables"),
        (["--server-args", "--tables x.json"], "--server-args: --tables is set by `apexrl run`"),
    ],
)
def test_run_tables_beside_a_table_flag_are_refused(tmp_path, capsys, extra, message):
    err = _launch_error(capsys, ["--run-dir", str(tmp_path / "r"), "--tables", _file(tmp_path), *extra])
    assert message in err, err


def test_run_tables_need_the_table_default(tmp_path, capsys):
    path = _file(tmp_path, TABLES[1:])
    err = _launch_error(capsys, ["--run-dir", str(tmp_path / "r"), "--tables", path])
    assert "the run's learner and actors use the table 'default'; the run's tables (aux, onpolicy) have none" in err


def test_run_tables_with_another_spec_on_default_are_refused(tmp_path, capsys):
    import numpy as np

    from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

    spec = json.loads(TransitionSpec([FieldSpec("x", np.float32, (3,))]).to_json())
    path = _file(tmp_path, [{"name": "default", "spec": spec}])
    err = _launch_error(capsys, ["--run-dir", str(tmp_path / "r"), "--tables", path])
    assert "table 'default': " in err and "its spec is not the spec of the run" in err, err


def test_a_bad_run_tables_file_exits_2_naming_it(tmp_path, capsys):
    path = _file(tmp_path, [{"name": "default", "capacity": 0}])
    err = _launch_error(capsys, ["--run-dir", str(tmp_path / "r"), "--tables", path])
    assert f"--tables {path}: table 0 ('default'): capacity: must be an int in [1, " in err, err


def test_a_preset_may_declare_its_tables_and_run_tables_replace_them(tmp_path):
    declared = (
        TableConfig("default", capacity=20_000, sampler="uniform"),
        TableConfig("q", sampler="fifo", capacity=32, rate_limiter=Queue(32), max_times_sampled=1),
    )
    base = get_preset("cartpole")
    preset = dataclasses.replace(
        base, name="cartpole-tables", replay=ReplaySettings(capacity=2_000_000), tables=declared
    )
    p = plan(preset, Overrides(run_dir=str(tmp_path)))
    assert [t.name for t in p.server.tables] == ["default", "q"]
    assert p.server.table().sampler == "uniform" and p.server.table("q") == declared[1]
    given = [TableConfig("default", capacity=30_000)]
    assert plan(preset, Overrides(tables=given, run_dir=str(tmp_path))).server.table().capacity == 30_000
    with pytest.raises(ValueError, match="give the replay as tables or as replay settings, not both"):
        dataclasses.replace(base, tables=declared)
    with pytest.raises(ValueError, match="tables 0 and 1 are both named 'default'"):
        dataclasses.replace(preset, tables=(declared[0], declared[0]))


def test_several_servers_split_each_table(tmp_path):
    tables = [
        TableConfig("default", capacity=100_001, max_size=300_000),
        TableConfig("q", sampler="fifo", capacity=99, rate_limiter=Queue(99)),
        TableConfig("r", rate_limiter=SampleToInsertRatio(2.0, 1001, 500.0)),
    ]
    p = plan("cartpole", Overrides(tables=tables, replay_servers=2, run_dir=str(tmp_path)))
    for s in p.servers:
        default, q, r = s.tables
        assert (default.capacity, default.max_size, default.rate_limiter) == (50_001, 150_000, MinSize(1000))
        assert (q.capacity, q.rate_limiter) == (50, Queue(50))
        assert (r.capacity, r.rate_limiter) == (500_000, SampleToInsertRatio(2.0, 501, 500.0))
    assert len({s.seed for s in p.servers}) == 2 and len({s.snapshot for s in p.servers}) == 2


def test_an_offline_run_refuses_a_ratio_limiter_on_default():
    from apexrl.launch.plan import run_tables

    tables = [TableConfig("default", rate_limiter=SampleToInsertRatio(2.0, 1, 200.0))]
    with pytest.raises(ValueError, match="--offline runs no actors: the sample_to_insert_ratio rate limiter"):
        run_tables(tables, {}, 100, _cartpole_spec(), offline=True)


def _cartpole_spec() -> str:
    from apexrl.launch.plan import run_spec

    return run_spec("dqn", "gym:CartPole-v1", get_preset("cartpole").agent_config())


def test_apexrl_run_help_names_tables():
    import argparse

    from apexrl.launch.start import fill_run_parser, run_kwargs

    text = fill_run_parser(argparse.ArgumentParser(prog="apexrl run", **run_kwargs())).format_help()
    assert re.search(r"--tables FILE\s+the replay servers' tables from a JSON file", text), text


def test_the_preset_table_lists_a_presets_tables_instead_of_its_replay_settings():
    from apexrl.launch.preset_table import settings

    declared = (TableConfig("default", capacity=20_000, sampler="uniform"), TableConfig("aux"))
    base = get_preset("cartpole")
    preset = dataclasses.replace(base, replay=ReplaySettings(capacity=2_000_000), tables=declared)
    rows = {name: value for name, value, _, _ in settings(preset)}
    assert "capacity" not in rows and "eviction" not in rows
    assert "default(sampler='uniform', capacity=20000)" in rows["tables"] and "aux()" in rows["tables"]


def test_apexrl_run_from_python_takes_tables_as_a_keyword():
    from apexrl.api import to_argv

    assert to_argv({"tables": "tables.json", "preset": "cartpole"}) == ["--tables=tables.json", "--preset=cartpole"]
