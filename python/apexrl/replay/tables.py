"""STAND-IN (branch tables37) for branch tablecfg37's ``apexrl.replay.tables``: the names and fields the
server consumes, nothing more. Replaced by that branch's module when it lands on main."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["MinSize", "Queue", "SampleToInsertRatio", "TableConfig"]


@dataclass(frozen=True)
class MinSize:
    min_size: int = 1


@dataclass(frozen=True)
class SampleToInsertRatio:
    samples_per_insert: float
    min_size_to_sample: int = 1
    error_buffer: float | None = None


@dataclass(frozen=True)
class Queue:
    size: int


@dataclass
class TableConfig:
    name: str
    sampler: str = "prioritized"
    remover: str = "fifo"
    capacity: int = 1_000_000
    max_size: int | None = None
    alpha: float = 0.6
    alpha_evict: float = -0.4
    max_times_sampled: int = 0
    rate_limiter: Any = None
    spec: str | None = None
