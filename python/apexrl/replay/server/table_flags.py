"""The table flags: ``apexrl-replay-server --capacity, --eviction, ...``, shortcuts that build the one table
``default`` for a server without ``--tables``.

They are flat settings (a rate limiter as ``--samples-per-insert`` and ``--min-size-to-sample``), so that a
command line, a preset's replay settings and a run plan written before tables existed can set the table without
writing JSON. :class:`TableFlags` holds them and :meth:`TableFlags.table` turns them into a
:class:`~apexrl.replay.tables.TableConfig`, which validates them: the flags declare their ranges only to type
their argparse values, reusing the declarations of TableConfig and its rate limiters.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from apexrl.replay.tables import (
    DEFAULT_TABLE,
    REMOVER_ALIASES,
    REMOVERS,
    STORE_INT_MAX,
    MinSize,
    RateLimiter,
    SampleToInsertRatio,
    TableConfig,
)
from apexrl.validate import Range, check_fields, range_of

__all__ = ["EVICTION_POLICIES", "TABLE_FLAGS", "TableFlags", "table_from_flags"]

EVICTION_POLICIES = (*REMOVERS, *REMOVER_ALIASES)
"""``--eviction`` values, the store's remover names then their aliases (the store's kind table, as
:data:`~apexrl.replay.tables.REMOVERS`). A table stores an alias by its name (min_heap as lowest_priority)."""


def _range(cls: type, name: str, *, optional: bool = False) -> dict[str, Range]:
    """The range metadata of field ``cls.name`` (``optional``: None accepted too), declared there once."""
    rng = range_of(cls, name)
    return {"apexrl_range": dataclasses.replace(rng, optional=True) if optional else rng}


@dataclass(frozen=True)
class TableFlags:
    """The flat settings of the table ``default``; at their defaults they build exactly ``TableConfig("default")``.

    ``eviction`` is the table's remover; ``min_size_to_sample`` and ``samples_per_insert`` / ``error_buffer`` its
    rate limiter: ``SampleToInsertRatio`` with ``samples_per_insert`` (``error_buffer`` default
    ``max(1, samples_per_insert) * 100``), else ``MinSize(min_size_to_sample)`` where that is over 1. A min size
    of 0 counts as 1, as the native limiter always took it."""

    capacity: int = field(default=TableConfig.capacity, metadata=_range(TableConfig, "capacity"))
    max_size: int | None = field(default=TableConfig.max_size, metadata=_range(TableConfig, "max_size"))
    """Hard ceiling (>= capacity); None: 2 * capacity."""
    alpha: float = field(default=TableConfig.alpha, metadata=_range(TableConfig, "alpha"))
    eviction: str = field(default=TableConfig.remover, metadata=Range.choice(*EVICTION_POLICIES))
    alpha_evict: float = field(default=TableConfig.alpha_evict, metadata=_range(TableConfig, "alpha_evict"))
    min_size_to_sample: int = field(default=1, metadata=Range.int(0, STORE_INT_MAX))
    samples_per_insert: float | None = field(
        default=None, metadata=_range(SampleToInsertRatio, "samples_per_insert", optional=True)
    )
    """None: no rate limiting."""
    error_buffer: float | None = field(
        default=None, metadata=_range(SampleToInsertRatio, "error_buffer", optional=True)
    )
    """None: max(1, samples_per_insert) * 100."""
    spec: str | None = None
    """The items' TransitionSpec: its JSON, or the path of a JSON file; None: learnt from the first HELLO."""
    storage: str = field(default=TableConfig.storage, metadata=_range(TableConfig, "storage"))
    """memory, or disk: every change logged under --storage-path before it is acknowledged (docs/running.md)."""
    storage_path: str | None = None
    """A disk table's directory (created if missing; its parent must exist); TableConfig's ``path``."""
    durability: str | None = field(default=None, metadata=_range(TableConfig, "durability"))
    """A disk table's: sync (fdatasync before each reply) or interval (within 10 ms); None: sync."""
    cache_bytes: int | None = field(default=None, metadata=_range(TableConfig, "cache_bytes"))
    """A disk table's log tail kept in memory for its reads; None: 1 GiB."""

    def rate_limiter(self) -> RateLimiter | None:
        """The limiter the flags describe (class docstring); ValueError on a min size out of range or an
        error_buffer without samples_per_insert."""
        # min_size_to_sample: the one range no TableConfig field holds (0 counts as 1); samples_per_insert before
        # the error_buffer default is computed from it.
        check_fields(self, ["min_size_to_sample", "samples_per_insert"])
        min_size = max(1, int(self.min_size_to_sample))
        if self.samples_per_insert is None:
            if self.error_buffer is not None:
                raise ValueError("error_buffer needs samples_per_insert (it is the slack of that rate limiter)")
            return None if min_size == 1 else MinSize(min_size)
        spi = self.samples_per_insert
        eb = max(1.0, float(spi)) * 100.0 if self.error_buffer is None else self.error_buffer
        return SampleToInsertRatio(spi, min_size, eb)

    def table(self, name: str = DEFAULT_TABLE) -> TableConfig:
        """The TableConfig of these flags (prioritized sampler); ValueError naming the first bad value."""
        return TableConfig(
            name,
            remover=self.eviction,
            capacity=self.capacity,
            max_size=self.max_size,
            alpha=self.alpha,
            alpha_evict=self.alpha_evict,
            rate_limiter=self.rate_limiter(),
            spec=self.spec,
            storage=self.storage,
            path=self.storage_path,
            durability=self.durability,
            cache_bytes=self.cache_bytes,
        )


TABLE_FLAGS: dict[str, str] = {f.name: "--" + f.name.replace("_", "-") for f in fields(TableFlags)}
"""Each TableFlags field and its flag on ``apexrl-replay-server`` (``--capacity``, ``--max-size``, ...), refused
beside ``--tables``."""


def table_from_flags(values: Mapping[str, Any], name: str = DEFAULT_TABLE) -> TableConfig:
    """The table of ``values``, a mapping of TableFlags fields (left out: the default); ValueError naming an
    unknown one or the first bad value."""
    unknown = sorted(set(values) - set(TABLE_FLAGS))
    if unknown:
        raise ValueError(f"no table flag {', '.join(unknown)} (the table flags: {', '.join(TABLE_FLAGS)})")
    return TableFlags(**values).table(name)
