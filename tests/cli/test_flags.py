"""Each flag that sets a config field is declared once (apexrl.cli.flags): its type, range, choices and default
come from the field, its help says them, and a flag two commands take is one declaration with one help."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field

import pytest

from apexrl.cli import actor as actor_cli
from apexrl.cli import learner as learner_cli
from apexrl.cli import server as server_cli
from apexrl.cli.flags import Flag, add_flags, values
from apexrl.launch.start import fill_run_parser, run_kwargs
from apexrl.replay.server.config import ServerConfig
from apexrl.replay.server.table_flags import TABLE_FLAGS, TableFlags
from apexrl.validate import Range


def _action(parser: argparse.ArgumentParser, option: str) -> argparse.Action:
    return next(a for a in parser._actions if option in a.option_strings)


def test_the_server_declares_a_flag_for_every_config_field_and_every_table_flag():
    declared = {f.field for f in server_cli.SERVER_FLAG_DECLS}
    set_by_hand = {"port", "tables", "drop_tables", "curve_dir", "insecure"}  # --endpoint, --tables FILE, security
    assert declared | set_by_hand == {f.name for f in dataclasses.fields(ServerConfig)}
    assert {f.field: f.name for f in server_cli.TABLE_FLAG_DECLS} == TABLE_FLAGS


def test_the_servers_defaults_are_the_configs():
    args = server_cli.parse_args(["--port", "0"])
    assert ServerConfig(**values(args, server_cli.SERVER_FLAG_DECLS)) == ServerConfig()
    assert values(args, server_cli.TABLE_FLAG_DECLS) == dataclasses.asdict(TableFlags())
    assert args.config == ServerConfig()


def test_the_help_says_each_flags_range_and_default():
    parser = server_cli.build_parser()
    assert _action(parser, "--shards").help.endswith("(an int in [1, 256]; default 8)")
    assert _action(parser, "--max-size").help.endswith("; default 2 * capacity)")
    assert _action(parser, "--alpha").help.endswith("(a finite number >= 0; default 0.6)")
    assert _action(parser, "--port").help.endswith("(an int in [0, 65535]; required unless --endpoint)")
    assert (
        _action(parser, "--eviction").choices
        == TableFlags.__dataclass_fields__["eviction"].metadata["apexrl_range"].choices
    )
    learner = learner_cli.build_parser()
    assert _action(learner, "--prefetch").help.endswith("(an int in [1, 1024]; default: the preset's, else 16)")
    assert _action(learner, "--prefetch").default is None  # only a given flag overrides the preset


@pytest.mark.parametrize(
    "option, other",
    [("--envs-per-actor", actor_cli.build_parser), ("--decode-threads", learner_cli.build_parser)],
)
def test_a_flag_of_two_commands_has_one_help(option, other):
    run = fill_run_parser(argparse.ArgumentParser(prog="apexrl run", **run_kwargs()))
    a, b = _action(run, option), _action(other(), option)
    assert (a.help, a.metavar, a.default, a.dest) == (b.help, b.metavar, b.default, b.dest)
    assert a.type("3") == b.type("3") == 3


def test_a_bad_value_is_refused_with_the_reason(capsys):
    with pytest.raises(SystemExit) as e:
        server_cli.parse_args(["--port", "0", "--shards", "0"])
    assert e.value.code == 2
    assert "--shards: 0 is out of range, must be an int in [1, 256]" in capsys.readouterr().err


@dataclass
class _Config:
    count: int = field(default=3, metadata=Range.int(1, 9))
    mode: str = field(default="a", metadata=Range.choice("a", "b"))
    loud: bool = False
    name: str | None = None


def test_a_flag_takes_its_kind_from_the_field():
    parser = argparse.ArgumentParser(exit_on_error=False)
    flags = (
        Flag(_Config, "count", "how many"),
        Flag(_Config, "mode", "which", option="--kind"),
        Flag(_Config, "loud", "say more"),
        Flag(_Config, "name", "what to call it", none="unnamed"),
    )
    add_flags(parser, flags)
    assert values(parser.parse_args([]), flags) == dataclasses.asdict(_Config())
    args = parser.parse_args(["--count", "9", "--kind", "b", "--loud", "--name", "x"])
    assert values(args, flags) == {"count": 9, "mode": "b", "loud": True, "name": "x"}
    assert _action(parser, "--name").help == "what to call it (default unnamed)"
    assert _action(parser, "--loud").help == "say more"
    with pytest.raises(argparse.ArgumentError, match="out of range, must be an int in \\[1, 9\\]"):
        parser.parse_args(["--count", "10"])
    with pytest.raises(argparse.ArgumentError, match="invalid choice"):
        parser.parse_args(["--kind", "c"])
    with pytest.raises(KeyError, match="_Config has no field 'size'"):
        Flag(_Config, "size", "no such field").add(parser)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """Every command's parser: the three processes and each ``apexrl`` subcommand."""
    from apexrl.cli import main as main_cli

    parsers = {
        "apexrl-learner": learner_cli.build_parser(),
        "apexrl-actor": actor_cli.build_parser(),
        "apexrl-replay-server": server_cli.build_parser(),
    }
    top = main_cli.build_parser()
    sub = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction))
    parsers.update({f"apexrl {name}": p for name, p in sub.choices.items()})
    return parsers


HOMONYMS = {
    # One name, several meanings, each one declaration of its own: (what each means, ...).
    "--device": ("the learner's training device", "evaluate's device to load a checkpoint on (default cpu)"),
    "--index": ("the actor's index in the run", "the replay server's index in a plan"),
    "--max-steps": ("learner steps", "actor (environment) steps"),
    "--minutes": ("a run's limit (default: the preset's)", "bench-suite's per run, which it requires"),
    "--out": ("plot's PNG", "bench-suite's directory", "export's .npz"),
    "--plan": ("the learner's part of a plan", "an actor's part", "the replay server's part"),
    "--resume": ("the learner resumes its checkpoint", "the run resumes every process"),
    "--run-dir": ("the learner's metrics and checkpoint", "the run's whole directory"),
    "--seed": ("the agent's (learner, actor, run)", "the store's", "evaluate's environment seed"),
    "--snapshot-every": ("the server's (default: only at shutdown)", "the run's (default 300, 0: none)"),
    "--spec": ("the server checks inserts against it", "export decodes with it"),
    "--tables": ("the server's tables", "the run's servers' tables"),
    "--tensorboard": ("the learner's metrics.csv rows", "the run's metrics.csv and episodes.csv rows"),
}
"""Flag names with more than one meaning, and what tells them apart."""


def _declaration(action: argparse.Action) -> tuple:
    kind = getattr(action.type, "__qualname__", action.type)
    return (action.help, kind, tuple(action.choices or ()), repr(action.default), action.dest, action.nargs)


def test_a_flag_name_has_one_declaration_across_every_command():
    declared: dict[str, dict[tuple, list[str]]] = {}
    for command, parser in _commands().items():
        for action in parser._actions:
            for option in action.option_strings:
                if option.startswith("--") and option != "--help":
                    declared.setdefault(option, {}).setdefault(_declaration(action), []).append(command)
    two = {o: d for o, d in declared.items() if len(d) > 1 and o not in HOMONYMS}
    assert not two, f"one flag declared differently by several commands: {two}"
    for option in HOMONYMS:
        meanings = declared[option]
        assert len(meanings) == len(HOMONYMS[option]), f"{option}: {list(meanings.values())}"
    shared = {o for o, d in declared.items() if sum(map(len, d.values())) > 1}
    assert {"--agent", "--preset", "--actors", "--steps", "--episodes", "--log-level", "--record-dataset"} <= shared


def test_apexrl_run_takes_its_limits_from_the_run_settings(capsys):
    run = fill_run_parser(argparse.ArgumentParser(prog="apexrl run", **run_kwargs()))
    assert _action(run, "--ports").help.endswith("(an int in [0, 65535]; default 0)")
    assert _action(run, "--final-eval").help.endswith("(an int in [0, 100000]; default: the preset's, 30)")
    assert _action(run, "--replay-servers").type("2") == 2
    args = run.parse_args(["--max-restarts", "2", "--ports", "7000", "--final-eval", "3"])
    assert (args.max_restarts, args.ports, args.final_eval, args.snapshot_every) == (2, 7000, 3, 300.0)
    with pytest.raises(SystemExit):
        run.parse_args(["--actors", "257"])
    assert "--actors: 257 is out of range, must be an int in [1, 256]" in capsys.readouterr().err


def test_bench_suite_refuses_what_apexrl_run_refuses(capsys):
    suite = _commands()["apexrl bench-suite"]
    for bad, reason in ((["--preset", "nope"], "valid presets: "), (["--actors", "0"], "must be an int in [1, 256]")):
        with pytest.raises(SystemExit):
            suite.parse_args(["--tasks", "gym:CartPole-v1", "--minutes", "1", *bad])
        assert reason in capsys.readouterr().err


def test_the_agent_overrides_are_one_flag_each_with_the_range_they_accept(capsys):
    from apexrl.cli.args import AGENT_FLAGS
    from apexrl.launch.plan import AGENT_FIELDS

    assert tuple(flag.field for flag in AGENT_FLAGS) == AGENT_FIELDS
    learner = learner_cli.build_parser()
    assert _action(learner, "--n-step").help == "n of the n-step return (an int in [1, 100]; default: the preset's)"
    args = learner.parse_args(["--dqda-clip", "none", "--obs-norm", "off", "--gamma", "1"])
    assert (args.dqda_clip, args.obs_norm, args.gamma, args.n_step) == ("none", False, 1.0, None)
    with pytest.raises(SystemExit):
        learner.parse_args(["--n-step", "101"])
    assert "--n-step: 101 is out of range, must be an int in [1, 100]" in capsys.readouterr().err
