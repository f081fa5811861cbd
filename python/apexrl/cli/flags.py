"""Flags that set a config field, each declared once: its type, range, choices and default come from the field.

A :class:`Flag` names the dataclass field it sets and says what it means; :meth:`Flag.add` puts it on a parser
with the field's range (``apexrl.validate``) as its argparse type or choices and the field's default, and ends
its help with both, so ``--help`` shows what the config accepts and never restates a default by hand. A
command lists its flags in a table and builds its config from the same table (:func:`values`); a flag that two
commands take (``--decode-threads``: the learner's and ``apexrl run``'s) is one Flag both add.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import MISSING, dataclass, fields
from typing import Any

__all__ = ["FIELD_DEFAULT", "Flag", "add_flags", "values"]

FIELD_DEFAULT: Any = object()
"""``Flag.add(default=...)`` left out: the field's own default."""


def _field(cls: type, name: str) -> Any:
    for f in fields(cls):
        if f.name == name:
            return f
    raise KeyError(f"{cls.__name__} has no field {name!r}")


@dataclass(frozen=True)
class Flag:
    """One flag setting ``config.field``: ``help`` says what it does, not its range or default (added here)."""

    config: type
    field: str
    help: str
    option: str = ""
    """The flag's name when it is not ``--`` + the field's name with dashes (``--max-wait`` for max_wait_s)."""
    metavar: str | None = None
    none: str = ""
    """What the default None means, shown as the default (``2 * capacity``); empty: ``none``."""

    @property
    def name(self) -> str:
        return self.option or "--" + self.field.replace("_", "-")

    def add_preset(self, parser: Any) -> argparse.Action:
        """Add the flag with the default None, the preset's value (the field's default where the preset sets
        none), so that only a given flag overrides the preset."""
        f = _field(self.config, self.field)
        value = f"{f.default:g}" if isinstance(f.default, float) else str(f.default)
        return self.add(parser, default=None, shown=f"default: the preset's, else {value}")

    def add(self, parser: Any, *, default: Any = FIELD_DEFAULT, shown: str = "") -> argparse.Action:
        """Add the flag to ``parser`` (a parser or an argument group) with ``default`` (left out: the field's);
        ``shown``: what the help says instead of ``default X``, for a default that is not the field's
        (``default: the preset's``)."""
        f = _field(self.config, self.field)
        rng = f.metadata.get("apexrl_range")
        if default is FIELD_DEFAULT:
            default = None if f.default is MISSING else f.default
        kwargs: dict[str, Any] = {"dest": self.field, "default": default, "metavar": self.metavar}
        accepts = ""
        if rng is not None and rng.kind == "choice":
            kwargs["choices"] = rng.choices
        elif rng is not None:
            kwargs["type"] = rng.parse
            accepts = rng.describe()
        elif f.type in (bool, "bool"):
            kwargs = {"dest": self.field, "action": "store_true"}
        if not shown and "action" not in kwargs:
            value = f"{default:g}" if isinstance(default, float) else str(default)
            shown = f"default {(self.none or 'none') if default is None else value}"
        tail = "; ".join(part for part in (accepts, shown) if part)
        help_text = f"{self.help} ({tail})" if tail else self.help
        return parser.add_argument(self.name, help=help_text.replace("%", "%%"), **kwargs)


def add_flags(parser: Any, flags: Iterable[Flag]) -> None:
    """Add every flag of ``flags`` with its field's default."""
    for flag in flags:
        flag.add(parser)


def values(args: argparse.Namespace, flags: Iterable[Flag]) -> dict[str, Any]:
    """``{field: parsed value}`` of ``flags``: the keyword arguments of their config."""
    return {flag.field: getattr(args, flag.field) for flag in flags}
