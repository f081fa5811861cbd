"""The rare requests the native loop hands to Python: HELLO (the run's spec, the server's limits, its tables),
STATS (every table's counters) and CHECKPOINT (the snapshot of every table, written now).

They keep one definition each here: the protocol module decodes and encodes them, :class:`SpecGate` keeps the
spec (and tells the loop the item layout to check inserts against), and STATS merges the store's counters
with the loop's. Runs on the server's control thread; the loop sends the replies.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable
from typing import Any

import numpy as np

from apexrl.errors import ProtocolError
from apexrl.replay.server.config import ServerConfig
from apexrl.replay.server.insert_guard import SpecGate
from apexrl.replay.server.tables import ServerTable, table_description
from apexrl.replay.wire import protocol as P

__all__ = ["TABLE_TOTALS", "ControlHandler"]

TABLE_TOTALS = (
    "size",
    "bytes_held",
    "inserted",
    "sampled",
    "evicted",
    "erased",
    "stale_updates",
    "rate_limiter_inserted_items",
    "rate_limiter_sampled_items",
    "deferred",
)
"""STATS counters also summed over every table, as ``tables_total.<name>``."""

log = logging.getLogger("apexrl.replay.server")


def _plain(v: Any) -> int | float:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return 0.0
    return v


class ControlHandler:
    """Serves HELLO, STATS and CHECKPOINT for one server (``loop`` is its native ServeLoop, ``tables`` its tables,
    ``checkpoint`` writes its snapshot now and returns the path, or raises what the stores raise when the save
    fails)."""

    def __init__(
        self,
        config: ServerConfig,
        tables: list[ServerTable],
        spec_gates: dict[int, SpecGate],
        loop: Any,
        checkpoint: Callable[[], str],
    ):
        self.config, self.tables, self.spec_gates, self.loop = config, tables, spec_gates, loop
        self.checkpoint = checkpoint
        self.default = next((t for t in tables if t.name == "default"), tables[0])
        assert self.default.store is not None  # the main table holds items (ServerConfig checks it)
        self.store = self.default.store
        self.spec_gate = spec_gates[self.default.index]  # today's STATS spec_declared / spec_fingerprint
        self._tables_json()

    def _tables_json(self) -> None:
        """HELLO's ``tables``, rebuilt when a table's structure is pinned (control thread only)."""
        self.tables_json = json.dumps(
            [table_description(t, self.spec_gates[t.index].spec) for t in self.tables], allow_nan=False
        )

    def serve(self, frames: list[bytes]) -> list[Any]:
        """The reply frames to one HELLO or STATS request (an error reply for a bad one)."""
        try:
            req = P.decode_request(frames, self.config.max_bytes)
        except ProtocolError as exc:
            return P.encode_protocol_error(exc)
        op, rid = int(req.header.op), req.request_id
        try:
            if op == P.Op.HELLO:
                # The header's table (the loop refused an unknown index) is the one whose spec is declared; the
                # control thread serves HELLOs one at a time, so of two different declarations one pins the
                # table and the other is refused naming both.
                gate = self.spec_gates[int(req.header.table)]
                if self.tables[int(req.header.table)].slices is not None and len(req.arrays["spec"]):
                    raise ValueError(
                        f"HELLO refused: table {self.tables[int(req.header.table)].name!r} is a slices table, whose "
                        "episodes' steps carry their own structure: it takes no spec"
                    )
                before = gate.spec
                spec = gate.declare(req.arrays["spec"])
                if spec is not None and before is None:
                    self.loop.set_layout(spec.native_layout(), int(req.header.table))
                    self._tables_json()
                return P.encode_hello_reply(
                    rid, self.hello_info(), spec.to_json() if spec is not None else "", self.tables_json
                )
            if op == P.Op.STATS:
                return P.encode_stats_reply(rid, self.stats_reply())
            if op == P.Op.CHECKPOINT:
                return self._checkpoint(rid)
            return P.encode_error(op, rid, P.Status.UNKNOWN_OP, f"op {op} is not served here")
        except ValueError as exc:
            return P.encode_error(op, rid, P.Status.INVALID_ARGUMENT, str(exc) or type(exc).__name__)
        except Exception as exc:  # the server must keep serving
            log.exception("internal error serving %s request %d", P.Op(op).name, rid)
            return P.encode_error(op, rid, P.Status.INTERNAL, f"{type(exc).__name__}: {exc}")

    def _checkpoint(self, rid: int) -> list[Any]:
        """CHECKPOINT: the snapshot written now, or why not (a failed save keeps the previous snapshot)."""
        if self.config.snapshot is None:
            raise ValueError(
                "CHECKPOINT refused: this server has no snapshot path (start it with --snapshot PATH to checkpoint)"
            )
        try:
            path = self.checkpoint()
        except Exception as exc:  # noqa: BLE001 - OSError, SnapshotError: the client is told, the server serves on
            log.warning("CHECKPOINT request %d failed: %s: %s", rid, type(exc).__name__, exc)
            return P.encode_error(
                P.Op.CHECKPOINT,
                rid,
                P.Status.INTERNAL,
                f"checkpoint failed ({type(exc).__name__}: {exc}); the previous snapshot is kept",
            )
        return P.encode_checkpoint_reply(rid, path)

    def stats_reply(self) -> dict[str, int | float]:
        """The STATS reply's body: the store's counters and the loop's (this STATS request included). Today's
        names describe the table ``default`` (else the first); every table's also appear as ``table.<name>.<key>``
        and the counters of TABLE_TOTALS summed over the tables as ``tables_total.<key>``."""
        stats: dict[str, Any] = dict(self.store.stats())
        # One value, two names (docs/protocol.md, "STATS names"): total_mass and num_shards are canonical (the
        # SAMPLE reply's and HELLO's names); the store's total_priority and shards stay for older clients.
        stats["total_mass"] = stats["total_priority"]
        stats["num_shards"] = stats["shards"]
        loop = self.loop.stats()
        loop["requests_stats"] += 1  # the loop counts a control request when its reply goes out
        loop["requests_total"] += 1
        stats.update(loop)
        totals = dict.fromkeys(TABLE_TOTALS, 0)
        for t in self.tables:
            prefix = f"table.{t.name}."
            for key, value in t.stats().items():
                stats[prefix + key] = value
            stats[prefix + "total_mass"] = stats[prefix + "total_priority"]
            for key in TABLE_TOTALS:
                totals[key] += stats.get(prefix + key, 0)
        for key, value in totals.items():
            stats["tables_total." + key] = value
        spec = self.spec_gate.spec
        stats["spec_declared"] = int(spec is not None)
        stats["spec_fingerprint"] = spec.fingerprint if spec is not None else 0
        return {k: _plain(v) for k, v in stats.items()}

    def hello_info(self) -> dict[str, int | float]:
        """The HELLO reply's numbers: the limits a client must respect, the protocol version, the store's
        lock-shard count and its key epoch."""
        cfg = self.config
        store_stats = self.store.stats()
        info: dict[str, int | float] = {
            "protocol_version": P.PROTOCOL_VERSION,
            "max_request_bytes": int(cfg.max_bytes),
            "max_reply_bytes": int(cfg.max_reply_bytes),
            "num_shards": int(store_stats["shards"]),
        }
        if store_stats.get("epoch") is not None:
            info["epoch"] = _plain(store_stats["epoch"])
        return info
