"""ReplayServer: the thin Python side of the replay server.

It opens the store (restoring the snapshot, choosing the key epoch), creates and configures the ROUTER socket
(bind address, CURVE keys and the ZAP allow-list, high-water marks, ZMQ_MAXMSGSIZE, ROUTER_MANDATORY, idle
connection limits) and hands it to the native serving loop (``apexrl._core.ServeLoop``,
cpp/apexrl/serve/serve_loop.h), which serves every data request with the GIL released. Python keeps what is
rare: HELLO, STATS and CHECKPOINT (:mod:`.control`, on a control thread fed by the loop's queue, which also carries the
loop's log lines), the periodic and final snapshots, and start/stop. docs/architecture.md draws the threads.

Size caps: ``max_bytes = max_message_mb * 2**20`` is enforced twice. ``zmq.MAXMSGSIZE`` makes libzmq drop a
peer that sends a bigger *frame* before allocating it (no reply is possible; the client sees a timeout). The
loop refuses a message whose frames *together* are over it with a TOO_LARGE reply. Replies: a SAMPLE whose
reply would be over ``max_reply_mb`` is refused TOO_LARGE, and one that would take a client's unread replies
(sent, not yet taken by the client) over ``max_unread_mb`` is refused TIMEOUT.

Shutdown (:meth:`ReplayServer.stop`): the loop stops reading; requests waiting or still queued in the socket
are answered SHUTTING_DOWN, requests in service finish and are answered; then the final snapshot (if
configured) and the sockets close. A failed final save raises :class:`SnapshotSaveError` saying how many items
were not saved; a failed periodic save is logged and the previous snapshot kept.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any

import zmq
from zmq.utils.monitor import recv_monitor_message  # at import: the watcher runs when no descriptor is left

from apexrl import _core
from apexrl.replay.server.config import ServerConfig, check_snapshot_dir
from apexrl.replay.server.control import ControlHandler
from apexrl.replay.server.epoch import SnapshotSaveError
from apexrl.replay.server.insert_guard import DEDUP_MAX_BYTES, DEDUP_MAX_IDS, SpecGate
from apexrl.replay.server.native import NativeLoopError, libzmq_path
from apexrl.replay.server.tables import ServerTable, open_tables, save_tables
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.roles import ROLE_OPS
from apexrl.security import CLIENT, LEARNER, limit_idle_connections, secure_server_socket

__all__ = ["ReplayServer"]

log = logging.getLogger("apexrl.replay.server")

RCVHWM = 64
"""ZMQ_RCVHWM of the replay socket: messages libzmq queues from one peer before TCP back-pressure holds the peer
back (nothing is lost). The send side has no message-count limit (ZMQ_SNDHWM 0): the loop caps the *bytes* of
the replies each peer leaves unread (``max_unread_mb``), which libzmq cannot, and drops a reply that would go
over it (``replies_dropped``)."""


def role_masks() -> dict[str, int]:
    """security.ROLE_OPS as the loop takes it: the role (a ZAP User-Id before ':') -> bit mask of its ops. The
    shared key of a key directory made before roles (User-Id ``client``) has the learner's rights."""
    masks = {role: sum(1 << op for op in ops) for role, ops in ROLE_OPS.items()}
    masks[CLIENT] = masks[LEARNER]
    return masks


ACCEPT_LOG_S = 10.0
"""Least seconds between two warnings about connections that cannot be accepted."""

_LEVELS = {"DEBUG": logging.DEBUG, "INFO": logging.INFO, "WARNING": logging.WARNING, "ERROR": logging.ERROR}


class ReplayServer:
    """A replay server; ``start()`` binds and returns at once (native threads serve), ``stop()`` shuts down.

    Usable as a context manager. ``endpoint`` is the bound ``tcp://host:port`` (real port when port=0).
    """

    def __init__(self, config: ServerConfig):
        config.validate()
        self.config = config
        # One store per table (server/tables.py), restored from the snapshot; `store` is the table `default`'s
        # (else the first table's), the one today's names describe.
        self.tables: list[ServerTable] = open_tables(config)
        self.table_index = {t.name: t.index for t in self.tables}
        main = self.tables[self.table_index.get("default", 0)].store
        assert main is not None  # the main table holds items (ServerConfig checks it)
        self.store = main
        # Each table's TransitionSpec (its item structure), once configured, restored from its sidecar or declared
        # by a HELLO naming the table; `spec_gate` is the table `default`'s (else the first's), the run's spec.
        self.spec_gates = {t.index: SpecGate(t.config.spec, config.snapshot, t.name) for t in self.tables}
        self.spec_gate = self.spec_gates[self.table_index.get("default", 0)]
        self.endpoint: str | None = None
        self._ctx: zmq.Context | None = None
        self._socket: zmq.Socket | None = None
        self._loop: Any = None
        self._control: threading.Thread | None = None
        self._watcher: threading.Thread | None = None
        self._monitor: zmq.Socket | None = None
        self._snapshotter: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._snapshot_lock = threading.Lock()
        self._saved_items: int | None = (
            self.held_items() if config.snapshot is not None and os.path.exists(config.snapshot) else None
        )  # items in the last snapshot written (or loaded)
        self._started = False
        self.failure: str | None = None  # set when the server must stop (its ZAP handler died)
        self.accept_failures = 0  # connections libzmq could not accept (set when the server stops)
        self.failed = threading.Event()

    def _on_zap_failure(self, reason: str) -> None:
        self.failure = f"the ZAP handler died ({reason}): the replay server stops rather than serve unauthenticated"
        log.critical("%s", self.failure)
        self.failed.set()

    # ------------------------------------------------------------------------------------------ setup

    def held_items(self) -> int:
        """Items held now, every table together."""
        return sum(t.held() for t in self.tables)

    def _open_socket(self) -> zmq.Socket:
        cfg = self.config
        assert self._ctx is not None
        front = self._ctx.socket(zmq.ROUTER)
        self._socket = front
        # CURVE + allow-list when keys are configured; a dead ZAP handler stops the server (ZAP fails closed)
        secure_server_socket(front, cfg.curve_dir, on_zap_failure=self._on_zap_failure)
        front.setsockopt(zmq.LINGER, 2000)
        front.setsockopt(zmq.MAXMSGSIZE, cfg.max_bytes)
        front.setsockopt(zmq.SNDHWM, 0)
        front.setsockopt(zmq.RCVHWM, RCVHWM)
        # Sends never block and fail visibly: EHOSTUNREACH tells the loop a peer left (its waiting requests are
        # dropped).
        front.setsockopt(zmq.ROUTER_MANDATORY, 1)
        limit_idle_connections(front, cfg.handshake_s, cfg.heartbeat_s)
        port = "*" if int(cfg.port) == 0 else str(int(cfg.port))
        host = f"[{cfg.bind}]" if ":" in cfg.bind else cfg.bind
        if ":" in cfg.bind:
            front.setsockopt(zmq.IPV6, 1)
        front.bind(f"tcp://{host}:{port}")
        self.endpoint = front.getsockopt_string(zmq.LAST_ENDPOINT)
        # Failed accepts are reported to a thread of ours (a monitor is its own socket): at the descriptor limit
        # libzmq's listener retries accept() at full speed, which the server can only say plainly (below).
        self._monitor = front.get_monitor_socket(zmq.EVENT_ACCEPT_FAILED)
        return front

    def _make_loop(self, front: zmq.Socket) -> Any:
        cfg = self.config
        try:
            loop = _core.ServeLoop(
                front.underlying,
                libzmq_path(),
                self.store,
                max_bytes=cfg.max_bytes,
                max_reply_bytes=cfg.max_reply_bytes,
                workers=cfg.workers,
                inline_sample_max=cfg.inline_sample_max,
                max_wait_s=cfg.max_wait_s,
                max_waiting=cfg.max_waiting,
                max_waiting_per_peer=cfg.max_waiting_per_peer,
                max_waiting_bytes=cfg.max_waiting_bytes,
                max_unread_bytes=cfg.max_unread_bytes,
                samples_per_insert=0.0,  # each table's limiter comes with it (tables=)
                error_buffer=0.0,
                min_size_to_sample=1,
                dedup_max_ids=DEDUP_MAX_IDS,
                dedup_max_bytes=DEDUP_MAX_BYTES,
                role_ops=role_masks() if cfg.curve_dir is not None else {},
                tables=[(t.name, t.native, t.limiter, t.disk) for t in self.tables],
            )
        except ImportError as exc:
            raise NativeLoopError(f"the replay server's native loop cannot start: {exc}") from None
        for index, gate in self.spec_gates.items():
            if gate.spec is not None:
                loop.set_layout(gate.spec.native_layout(), index)
        return loop

    def start(self) -> ReplayServer:
        """Bind and start serving; ValueError when the snapshot path could never be written, NativeLoopError
        when the native loop cannot bind pyzmq's libzmq."""
        if self._started:
            raise RuntimeError("server already started")
        cfg = self.config
        if cfg.snapshot is not None:
            check_snapshot_dir(cfg.snapshot)
        self._started = True
        self._ctx = zmq.Context()
        try:
            front = self._open_socket()
            self._loop = self._make_loop(front)
        except Exception:
            self._close()
            raise
        handler = ControlHandler(cfg, self.tables, self.spec_gates, self._loop, self.checkpoint)
        self._control = threading.Thread(target=self._control_loop, args=(handler,), name="apexrl-control", daemon=True)
        self._control.start()
        self._watcher = threading.Thread(target=self._watch_accepts, name="apexrl-accepts", daemon=True)
        self._watcher.start()
        self._loop.start()
        if cfg.snapshot is not None and cfg.snapshot_every is not None:
            self._snapshotter = threading.Thread(target=self._snapshot_loop, name="apexrl-snapshot", daemon=True)
            self._snapshotter.start()
        log.info(
            "listening on %s (native loop, %d workers; tables: %s)",
            self.endpoint,
            cfg.workers,
            ", ".join(f"{t.index} {t.name!r}" for t in self.tables),
        )
        return self

    def _control_loop(self, handler: ControlHandler) -> None:
        """Serve the loop's control queue (HELLO, STATS, CHECKPOINT, log lines) until the loop has stopped."""
        loop = self._loop
        while True:
            item = loop.next_control(0.5)
            if item is None:
                continue
            if item == "closed":
                return
            peer, identity, op, frames = item
            if op == 0:  # a line the loop logs
                log.log(_LEVELS.get(identity, logging.ERROR), "%s", frames[0].decode("utf-8", "replace"))
                continue
            try:
                reply = handler.serve(frames)
            except Exception as exc:  # handler.serve catches everything; belt and braces
                log.exception("control request failed")
                reply = P.encode_error(op, 0, P.Status.INTERNAL, f"{type(exc).__name__}: {exc}")
            loop.control_reply(peer, [bytes(memoryview(f)) for f in reply])

    def _watch_accepts(self) -> None:
        """Log a WARNING (at most every ACCEPT_LOG_S) while new connections cannot be accepted: out of file
        descriptors, libzmq's listener busy-loops on its listening socket until descriptors free up."""
        monitor = self._monitor
        assert monitor is not None
        failed, logged_at = 0, -ACCEPT_LOG_S
        while not self._stopping.is_set():
            if not monitor.poll(250):
                continue
            event = recv_monitor_message(monitor)
            failed += 1
            now = time.monotonic()
            if now - logged_at >= ACCEPT_LOG_S:
                errno_value = int(event.get("value", 0))
                why = os.strerror(errno_value) if errno_value else "unknown error"
                log.warning(
                    "cannot accept new connections (%s; %d failed accepts so far): libzmq retries at full "
                    "speed while this lasts. Raise the hard descriptor limit (ulimit -Hn; the server "
                    "already raised its soft limit to it) or connect fewer clients",
                    why,
                    failed,
                )
                logged_at = now
        self.accept_failures = failed

    def __enter__(self) -> ReplayServer:
        if not self._started:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -------------------------------------------------------------------------------------- snapshots

    def save_snapshot(self) -> None:
        """Write the snapshot now (atomic: the store writes a temporary file and renames it, so a failed save
        keeps the previous snapshot). Raises what the store raises (OSError, SnapshotError)."""
        if self.config.snapshot is None:
            raise ValueError("no snapshot path configured")
        with self._snapshot_lock:
            t0 = time.monotonic()
            n = save_tables(self.tables, self.config.snapshot, self._table_specs())
            self._saved_items = n
            log.info(
                "snapshot of %d items saved to %s in %.3fs", n, os.fspath(self.config.snapshot), time.monotonic() - t0
            )

    def checkpoint(self) -> str:
        """Write the snapshot of every table now (a client's CHECKPOINT) and return its absolute path, the file a
        server started with ``--snapshot`` at that path restores. ValueError without a snapshot path; what
        :meth:`save_snapshot` raises when the save fails (the previous snapshot kept)."""
        if self.config.snapshot is None:
            raise ValueError("no snapshot path configured (--snapshot): nothing to checkpoint to")
        self.save_snapshot()
        return os.path.abspath(os.fspath(self.config.snapshot))

    def _table_specs(self) -> dict[str, str | None]:
        """Each table's spec JSON (configured or declared; None while unpinned), for a tables snapshot's manifest."""
        specs: dict[str, str | None] = {}
        for t in self.tables:
            spec = self.spec_gates[t.index].spec
            specs[t.name] = None if spec is None else spec.to_json()
        return specs

    def _snapshot_loop(self) -> None:
        assert self.config.snapshot_every is not None and self.config.snapshot is not None
        while not self._stopping.wait(self.config.snapshot_every):
            try:
                self.save_snapshot()
            except Exception as exc:  # noqa: BLE001 - keep serving: the previous snapshot stays; the next period tries again
                log.error(
                    "periodic snapshot to %s failed (the previous snapshot, of %s items, is kept; "
                    "retrying in %gs): %s: %s",
                    os.fspath(self.config.snapshot),
                    "no" if self._saved_items is None else self._saved_items,
                    self.config.snapshot_every,
                    type(exc).__name__,
                    exc,
                )

    # --------------------------------------------------------------------------------------- shutdown

    def counters(self) -> dict[str, int | float]:
        """The loop's counters (requests, errors, waiting requests, rate limiter, insert ids, unread replies), read
        in this process; a client's STATS request gets these and the store's (ControlHandler.stats_reply)."""
        return dict(self._loop.stats()) if self._loop is not None else {}

    def stats(self) -> dict[str, int | float]:
        """Alias of :meth:`counters`, kept for the scripts written against it (local: no request is sent)."""
        return self.counters()

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop: finish in-flight requests, save the snapshot (if configured), close. Idempotent."""
        if not self._started or self._stopped.is_set():
            return
        self._stopping.set()
        if self._loop is not None:
            self._loop.stop()  # the control thread keeps serving what the loop waits for
        if self._control is not None:
            self._control.join(timeout)
        if self._watcher is not None:
            self._watcher.join(timeout)
        if self._snapshotter is not None:
            self._snapshotter.join(timeout)
        try:
            if self.config.snapshot is not None:
                self._final_snapshot()
        finally:
            self._stopped.set()
            self._close()
            log.info("stopped")

    def _close(self) -> None:
        if self._socket is not None and not self._socket.closed and self._monitor is not None:
            self._socket.disable_monitor()
        if self._monitor is not None:
            self._monitor.close(linger=0)
            self._monitor = None
        if self._socket is not None and not self._socket.closed:
            self._socket.close()
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def _final_snapshot(self) -> None:
        """The snapshot at stop; SnapshotSaveError (no traceback worth showing) saying what is lost if it fails."""
        assert self.config.snapshot is not None  # stop() calls this only with a snapshot path
        try:
            self.save_snapshot()
        except Exception as exc:
            held = self.held_items()
            kept = (
                "no previous snapshot exists"
                if self._saved_items is None
                else f"the previous snapshot holds {self._saved_items} items"
            )
            raise SnapshotSaveError(
                f"final snapshot to {os.fspath(self.config.snapshot)!r} failed ({type(exc).__name__}: {exc}): "
                f"the {held} items held now were not saved; {kept}"
            ) from exc
