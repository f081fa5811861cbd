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
