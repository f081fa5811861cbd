"""Flags that set a config field, each declared once: its type, range, choices and default come from the field.

A :class:`Flag` names the dataclass field it sets and says what it means; :meth:`Flag.add` puts it on a parser
with the field's range (``apexrl.validate``) as its argparse type or choices and the field's default, and ends
its help with both, so ``--help`` shows what the config accepts and never restates a default by hand. A
command lists its flags in a table and builds its config from the same table (:func:`values`); a flag that two
commands take (``--decode-threads``: the learner's and ``apexrl run``'s) is one Flag both add.

A flag that sets no config field (a path, an endpoint, a name checked against a registry, a pass-through) is
declared by hand: with :class:`Option` when two commands take it (``--log-level``, ``--agent``, ``--preset``,
``--episodes``), so it still has one declaration and one help, else with a plain ``add_argument`` in the one
parser that takes it. The agent overrides (``--n-step``, ``--gamma``, ...) are Flags of
:class:`apexrl.launch.plan.AgentOverrides`: each sets the same-named field of whichever agent config the preset
picks, whose defaults differ by agent, so their ranges live there and their default is the preset's.
tests/cli/test_flags.py walks every command's parser and fails when one flag name carries two helps, types,
choices or defaults beyond the homonyms it lists (``--seed`` of the agent, of the store and of evaluate).

Why not a flags library (jsonargparse, simple-parsing, cyclopts): none reads the ranges and choices the fields
declare, none keeps the pinned flag names without a rename per flag, and each imports slower than argparse with
this module (bench/README.md, "Flags declared once"; ``bench/compare_flag_libraries.py``).
"""

from __future__ import annotations

import argparse
import importlib
from collections.abc import Callable, Iterable
from dataclasses import MISSING, dataclass, fields
from typing import Any

__all__ = ["FIELD_DEFAULT", "Flag", "Option", "add_flags", "values"]

FIELD_DEFAULT: Any = object()
"""``Flag.add(default=...)`` left out: the field's own default."""


def _field(config: type | str, name: str) -> Any:
    cls: Any = config
    if isinstance(config, str):
        module, _, qualname = config.partition(":")
        cls = getattr(importlib.import_module(module), qualname)
    for f in fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no field {name!r}")


@dataclass(frozen=True)
class Flag:
    """One flag setting ``config.field``: ``help`` says what it does, not its range or default (added here)."""

    config: type | str
    """The config dataclass, or ``"module:Class"`` for one whose module is slow to import (imported when the
    flag is added to a parser, not when it is declared)."""
    field: str
    help: str
    option: str = ""
    """The flag's name when it is not ``--`` + the field's name with dashes (``--max-wait`` for max_wait_s)."""
    metavar: str | None = None
    none: str = ""
    """What the default None means, shown as the default (``2 * capacity``); empty: ``none``."""
    parse: Callable[[str], Any] | None = None
    """The argparse type of a field whose values no range says (a number or ``none``; ``on``/``off``)."""
    dest: str = ""
    """The parsed attribute when it is not the field's name: ``apexrl.run()``'s keywords are ``apexrl run``'s
    dests, so ``--max-restarts`` keeps ``max_restarts`` though it sets ``max_restarts_per_minute``."""

    @property
    def key(self) -> str:
        return self.dest or self.field

    @property
    def name(self) -> str:
        return self.option or "--" + self.field.replace("_", "-")

    def add_preset(self, parser: Any, *, shown: str = "") -> argparse.Action:
        """Add the flag with the default None, the preset's value (the field's default where the preset sets
        none), so that only a given flag overrides the preset; ``shown``: what the help says instead."""
        f = _field(self.config, self.field)
        if not shown:
            value = f"{f.default:g}" if isinstance(f.default, float) else str(f.default)
            shown = "default: the preset's" + ("" if f.default is None else f", else {value}")
        return self.add(parser, default=None, shown=shown)

    def add(
        self, parser: Any, *, default: Any = FIELD_DEFAULT, shown: str = "", required: bool = False
    ) -> argparse.Action:
        """Add the flag to ``parser`` (a parser or an argument group) with ``default`` (left out: the field's);
        ``shown``: what the help says instead of ``default X``, for a default that is not the field's
        (``default: the preset's``); ``required``: the command needs it (the help says so)."""
        if required:
            default, shown = None, "required"
        f = _field(self.config, self.field)
        rng = f.metadata.get("apexrl_range")
        if default is FIELD_DEFAULT:
            default = None if f.default is MISSING else f.default
        kwargs: dict[str, Any] = {"dest": self.key, "default": default, "metavar": self.metavar}
        accepts = ""
        if self.parse is not None:
            kwargs["type"] = self.parse
        elif rng is not None and rng.kind == "choice":
            kwargs["choices"] = rng.choices
        elif rng is not None:
            kwargs["type"] = rng.parse
            accepts = rng.describe()
        elif f.type in (bool, "bool"):
            kwargs = {"dest": self.key, "action": "store_true"}
        if not shown and "action" not in kwargs:
            value = f"{default:g}" if isinstance(default, float) else str(default)
            shown = f"default {(self.none or 'none') if default is None else value}"
        tail = "; ".join(part for part in (accepts, shown) if part)
        help_text = f"{self.help} ({tail})" if tail else self.help
        return parser.add_argument(self.name, help=help_text.replace("%", "%%"), required=required, **kwargs)


def add_flags(parser: Any, flags: Iterable[Flag]) -> None:
    """Add every flag of ``flags`` with its field's default."""
    for flag in flags:
        flag.add(parser)


def values(args: argparse.Namespace, flags: Iterable[Flag]) -> dict[str, Any]:
    """``{field: parsed value}`` of ``flags``: the keyword arguments of their config."""
    return {flag.field: getattr(args, flag.key) for flag in flags}


class Option:
    """A flag that sets no config field, declared once for every command that takes it: ``add_argument``'s
    keywords, with ``help`` a string or a function giving it when the parser is built (for a help listing a
    registry, such as the presets, that is imported only then)."""

    def __init__(self, name: str, help: str | Callable[[], str], **kwargs: Any) -> None:
        self.name, self.help, self.kwargs = name, help, kwargs

    def add(self, parser: Any) -> argparse.Action:
        text = self.help if isinstance(self.help, str) else self.help()
        return parser.add_argument(self.name, help=text, **self.kwargs)
