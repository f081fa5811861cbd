"""Value ranges of config fields, declared once as data and used by both the configs and the command lines.

A config dataclass declares a field's range in its metadata (``field(default=8, metadata=Range.int(1, 256))``);
``check_fields(self)`` in its ``__post_init__`` enforces every declared range (ValueError naming the class,
field and value), and the CLIs build their argparse types from the same declaration (``Range.parse``), so a
flag accepts exactly what the config, and behind it the native store, accepts. Torch-free.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any

import numpy as np

__all__ = ["Range", "check_fields", "range_of"]

_KEY = "apexrl_range"


def _is_int(v: Any) -> bool:
    return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_))


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, (bool, np.bool_))


@dataclass(frozen=True)
class Range:
    """The values a field accepts: ints or finite numbers within bounds, or one of a few strings."""

    kind: str  # "int", "float" or "choice"
    lo: float | None = None
    hi: float | None = None
    lo_open: bool = False  # (lo, hi] instead of [lo, hi]
    optional: bool = False  # None is accepted too
    choices: tuple[str, ...] = ()

    @staticmethod
    def int(lo: int | None = None, hi: int | None = None, *, optional: bool = False) -> Mapping[str, Range]:
        return {_KEY: Range("int", lo, hi, optional=optional)}

    @staticmethod
    def float(
        lo: float | None = None, hi: float | None = None, *, lo_open: bool = False, optional: bool = False
    ) -> Mapping[str, Range]:
        return {_KEY: Range("float", lo, hi, lo_open=lo_open, optional=optional)}

    @staticmethod
    def choice(*choices: str, optional: bool = False) -> Mapping[str, Range]:
        return {_KEY: Range("choice", choices=tuple(choices), optional=optional)}

    def describe(self) -> str:
        if self.kind == "choice":
            return "one of " + ", ".join(self.choices)
        what = "an int" if self.kind == "int" else "a finite number"
        fmt = (lambda x: f"{int(x)}") if self.kind == "int" else (lambda x: f"{x:g}")
        if self.lo is not None and self.hi is not None:
            return f"{what} in {'(' if self.lo_open else '['}{fmt(self.lo)}, {fmt(self.hi)}]"
        if self.lo is not None:
            return f"{what} {'>' if self.lo_open else '>='} {fmt(self.lo)}"
        if self.hi is not None:
            return f"{what} <= {fmt(self.hi)}"
        return what

    def ok(self, v: Any) -> bool:
        if v is None:
            return self.optional
        if self.kind == "choice":
            return isinstance(v, str) and v in self.choices
        if self.kind == "int" and not _is_int(v):
            return False
        if self.kind == "float" and not (_is_number(v) and math.isfinite(float(v))):
            return False
        if self.lo is not None and (v <= self.lo if self.lo_open else v < self.lo):
            return False
        return self.hi is None or v <= self.hi

    def check(self, owner: str, name: str, v: Any) -> None:
        if not self.ok(v):
            none = " (or None)" if self.optional else ""
            raise ValueError(f"{owner}.{name} must be {self.describe()}{none}, got {v!r}")

    def parse(self, text: str) -> Any:
        """argparse ``type=``: the value of ``text``, or ArgumentTypeError saying what is accepted."""
        value: Any = text
        if self.kind == "int":
            try:
                value = int(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        elif self.kind == "float":
            try:
                value = float(text)
            except ValueError:
                raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
        if not self.ok(value):
            raise argparse.ArgumentTypeError(f"{text} is out of range, must be {self.describe()}")
        return value


def range_of(cls: type, name: str) -> Range:
    """The declared range of field ``name`` of dataclass ``cls`` (KeyError if it declares none)."""
    for f in fields(cls):
        if f.name == name and _KEY in f.metadata:
            return f.metadata[_KEY]
    raise KeyError(f"{cls.__name__}.{name} declares no range")


def check_fields(obj: Any, names: Sequence[str] | None = None) -> None:
    """Check every field of dataclass ``obj`` that declares a range (or only ``names``); ValueError on the
    first value out of range."""
    owner = type(obj).__name__
    for f in fields(obj):
        if _KEY in f.metadata and (names is None or f.name in names):
            f.metadata[_KEY].check(owner, f.name, getattr(obj, f.name))
