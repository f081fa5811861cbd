"""The apexrl replay server: a ZeroMQ front-end around the native :class:`~apexrl.PrioritizedStore`.

Threading model
---------------
::

    clients (DEALER) ──tcp──► ROUTER "front-end" ◄──► broker thread ──queue──► worker 0..W-1
                                                            ▲                        │
                                                            └──── replies (+ an inproc wake-up) ┘

* The **broker** thread owns the front-end socket. It decodes every request with
  :func:`apexrl.replay.protocol.decode_request` (which validates everything; nothing is ever unpickled or evaluated)
  and serves the short ones itself: INSERT, UPDATE_PRIORITIES and SAMPLEs of at most ``inline_sample_max``
  items (default 1024, ~0.2 ms of store time for DPG items). Each is one store call that releases the GIL,
  then the reply goes straight back: no hop through another thread, which on a 2-core machine cost more
  than the store call itself (GIL hand-offs and inproc messages per request).
* Larger SAMPLEs, REMOVE_TO_FIT, STATS, HELLO and ERASE go to a queue served by the **worker** threads, which call the
  thread-safe store (GIL released) and hand the reply back to the broker (it alone sends on the
  front-end). So an INSERT never waits for a large SAMPLE except on a shard lock inside the store, and it
  waits behind a small inline SAMPLE for at most that sample's store call. The broker reads the front-end
  only while fewer than ``8 * workers`` requests wait for or sit in the workers, so back-pressure stays in
  ZeroMQ's receive queue (bounded by its high-water mark) instead of growing a Python list.
* Several requests of one client may be in flight at once (``ReplayClient.inserter()`` pipelines inserts);
  replies carry the request id and may come back in another order than the requests were sent.
* A SAMPLE that arrives while the store holds fewer than ``min_size_to_sample`` items and carries a
  ``timeout_ms`` is *deferred*: the broker keeps it (no worker is held) and serves or dispatches it as soon as
  the store is large enough (checked after each request served) or answers it TIMEOUT when its deadline
  passes: ``timeout_ms`` clipped to ``max_wait_s``. ``timeout_ms == 0`` answers TIMEOUT at once.
* Waiting requests are bounded (:class:`_Waitlist`): ``max_waiting`` in all and ``max_waiting_mb`` of waiting
  INSERTs (over them: TIMEOUT at once), ``max_waiting_per_peer`` per peer (over it: the peer's oldest is
  answered TIMEOUT), and a peer that left loses them all when a reply to it fails (ROUTER_MANDATORY:
  EHOSTUNREACH). They sit in one FIFO queue per op (the rate limiter looks only at the heads) and a heap of
  deadlines, so checking them costs O(released + log waiting), never a scan of all of them.
* A request the rate limiter could never admit (:func:`~apexrl.replay.rate_limiter.deadlock_reason`) is
  answered INVALID_ARGUMENT at once, and a SAMPLE whose reply would be over ``max_reply_mb`` (estimated from
  the largest item stored) TOO_LARGE, before any store call.
* The same deferral serves the **rate limiter** (below): an INSERT or SAMPLE that is too far ahead of the
  other side is kept by the broker until the other side has caught up or its deadline passes. A waiting
  request never holds a worker, and never blocks the requests behind it.
* The broker's loop is :meth:`_Broker.run`; each step is a method of its own: ``read_front_burst`` (decode,
  then ``dispatch``: serve inline or queue for the workers), ``send_worker_replies``, ``release_deferred``
  (answers expired requests, asks :meth:`RateLimiter.release` which waiting requests may go) and
  ``refuse_pending`` (when stopping).
* Idle connections: ZMQ_HANDSHAKE_IVL (``handshake_s``) closes a connection that never completes the ZMTP
  handshake (a raw TCP socket that never sends), ZMTP heartbeats (``heartbeat_s``) one whose peer vanished.

Rate limiting: Reverb's SampleToInsertRatio
-------------------------------------------
With ``samples_per_insert`` set, an INSERT or SAMPLE that is too far ahead of the other side waits; the
rules, and why they cannot deadlock, are in :mod:`apexrl.replay.rate_limiter`, the one place they are
written. A request that may not be served yet waits (without holding a worker) until it may, or until its
``timeout_ms`` passes, then it is answered TIMEOUT; it never fails early (``timeout_ms == 0``: TIMEOUT at
once). Admission reserves its items under a lock, so concurrent workers never overshoot the bounds.

Size caps: ``max_message_mb`` vs ZMQ_MAXMSGSIZE
-----------------------------------------------
``max_bytes = max_message_mb * 2**20`` is enforced twice:

* ``zmq.MAXMSGSIZE = max_bytes`` on the front-end: libzmq checks it **per frame** while reading from the
  wire, before allocating, and *disconnects* a peer that sends a bigger frame. No reply is possible (the
  message never reaches the application); the client sees a timeout. This is what protects the server's
  memory from a single huge frame.
* ``decode_request(..., max_bytes)`` checks the **total** of all frames of a message: a multipart message
  whose frames are each under the cap but whose sum is over it gets a TOO_LARGE error reply.

Shutdown
--------
:meth:`ReplayServer.stop`: stop reading new requests (those already queued in the front-end socket are
answered SHUTTING_DOWN, as are deferred requests), let the requests in flight in the workers finish and
deliver their replies, stop the workers, write the snapshot (if configured), close the sockets.

Snapshots: ``start()`` refuses (ValueError) a snapshot path whose directory is missing or not writable. On
start, ``config.snapshot`` is loaded if the file exists (an unreadable/corrupt file raises
:class:`SnapshotLoadError` - never silently ignored); every ``snapshot_every`` seconds a background thread
saves it (the store writes ``PATH.tmp.<pid>.<n>`` and renames it, so a crash never leaves a half-written
snapshot; the next save removes temporaries left by a killed process).

Keys: each life of the server gives its store a new key epoch, recorded in ``PATH.epoch`` beside the snapshot
before the server binds, so keys of an earlier life never address an item of this one (``_choose_epoch``;
docs/protocol.md, "Keys").

A failed periodic save is logged and keeps the previous snapshot; the server keeps serving. A failed final
save makes ``stop()`` raise :class:`SnapshotSaveError` saying how many items were not saved.
"""

from __future__ import annotations

import contextlib
import heapq
import logging
import math
import os
import queue
import secrets
import threading
import time
from collections import deque
from typing import Any

import numpy as np
import zmq

from apexrl import PrioritizedStore
from apexrl.durable import remove_stale_temporaries, write_atomically
from apexrl.errors import ApexRLError, ProtocolError
from apexrl.replay import protocol as P
from apexrl.replay.config import ServerConfig, check_snapshot_dir
from apexrl.replay.insert_guard import BUSY, DONE, InsertWindow, SpecGate
from apexrl.replay.rate_limiter import RateLimiter
from apexrl.security import secure_server_socket

__all__ = ["ReplayServer", "ServerConfig", "SnapshotLoadError", "SnapshotSaveError", "check_snapshot_dir"]

log = logging.getLogger("apexrl.replay.server")

# Ops the receiving (broker) thread serves itself: short store calls that release the GIL. SAMPLE too when it
# asks for at most ServerConfig.inline_sample_max items.
_INLINE_OPS = frozenset({int(P.Op.INSERT), int(P.Op.UPDATE_PRIORITIES)})
_SAMPLE = int(P.Op.SAMPLE)
_INSERT = int(P.Op.INSERT)
_JOBS_PER_WORKER = 8  # requests queued for the workers (per worker) before the front-end is no longer read
_FRONT_BURST = 16  # front-end messages read per round before finished worker replies are sent


class SnapshotLoadError(ApexRLError):
    """The configured snapshot file exists but cannot be loaded (corrupt, truncated, unreadable)."""


def _random_epoch(exclude: int = 0) -> int:
    """An epoch in 1..MAX_EPOCH from os.urandom (via secrets), other than `exclude`."""
    while True:
        epoch = secrets.randbelow(PrioritizedStore.MAX_EPOCH) + 1
        if epoch != exclude:
            return epoch


def _read_epoch_file(sidecar: str) -> int | None:
    """The epoch recorded in `sidecar`, None if there is none; SnapshotLoadError if it is unreadable."""
    try:
        with open(sidecar, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotLoadError(f"cannot read the key epoch file {sidecar!r}: {exc}") from exc
    if not text.isdigit() or not 1 <= int(text) <= PrioritizedStore.MAX_EPOCH:
        raise SnapshotLoadError(
            f"key epoch file {sidecar!r} holds {text[:40]!r}, not an epoch in 1..{PrioritizedStore.MAX_EPOCH} "
            "(it records the last epoch this server's keys used; delete it only if no client holds keys of it)"
        )
    return int(text)


def _write_epoch_file(sidecar: str, epoch: int) -> None:
    """Records `epoch` durably (apexrl.durable: temporary file, fsync, rename, fsync of the directory)."""
    remove_stale_temporaries(sidecar)  # of a life killed while writing it
    try:
        write_atomically(sidecar, f"{epoch}\n")
    except OSError as exc:
        raise SnapshotLoadError(f"cannot record the key epoch in {sidecar!r}: {exc}") from exc


def _choose_epoch(snapshot: str | os.PathLike[str] | None) -> int:
    """The key epoch of a new server life (docs/protocol.md, "Keys").

    With a snapshot path, ``PATH.epoch`` records the epoch of the latest life and is rewritten (durably, before
    the server binds) with the next one, so consecutive lives never share an epoch. The sidecar alone decides:
    ``max(sidecar, snapshot's epoch)`` would go wrong at the wrap from 4095 to 1. A snapshot without its
    sidecar (deleted, or written elsewhere) gives a random epoch other than the snapshot's; no path at all, a
    random epoch (a 1 in 4095 chance of meeting the previous life's).
    """
    if snapshot is None:
        epoch = _random_epoch()
        log.info("no snapshot path: key epoch %d drawn at random", epoch)
        return epoch
    path = os.fspath(snapshot)
    sidecar = path + ".epoch"
    last = _read_epoch_file(sidecar)
    saved = 0
    if os.path.exists(path):
        with contextlib.suppress(Exception):  # an unreadable snapshot is reported when it is loaded
            saved = PrioritizedStore.snapshot_epoch(path)
    if last is not None:
        epoch = last % PrioritizedStore.MAX_EPOCH + 1
        if epoch == saved:  # only if the sidecar is 4094 lives behind: skip the snapshot's own epoch
            epoch = epoch % PrioritizedStore.MAX_EPOCH + 1
    else:
        epoch = _random_epoch(exclude=saved)
        if saved:
            log.warning("key epoch file %s is missing: epoch %d drawn at random", sidecar, epoch)
    _write_epoch_file(sidecar, epoch)
    return epoch


class SnapshotSaveError(ApexRLError):
    """The final snapshot at stop() could not be written; the message says how many items it would have held."""


class _Counters:
    """Per-op request / error counters, shared by the workers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._requests: dict[str, int] = {}
        self._errors: dict[str, int] = {}
        for op in P.Op:
            self._requests[op.name.lower()] = 0
            self._errors[op.name.lower()] = 0
        self._requests["unknown"] = 0
        self._errors["unknown"] = 0
        self._erased = 0

    _NAMES = {int(o): o.name.lower() for o in P.Op}

    @classmethod
    def name(cls, op: int | None) -> str:
        return cls._NAMES.get(op, "unknown")  # type: ignore[arg-type]

    def count(self, op: int | None, error: bool) -> None:
        name = self._NAMES.get(op, "unknown")  # type: ignore[arg-type]
        with self._lock:
            self._requests[name] += 1
            if error:
                self._errors[name] += 1

    def erased_items(self, n: int) -> None:
        with self._lock:
            self._erased += n

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            out = {f"requests_{k}": v for k, v in self._requests.items()}
            out["erased_items"] = self._erased
            out.update({f"errors_{k}": v for k, v in self._errors.items()})
            out["requests_total"] = sum(self._requests.values())
            out["errors_total"] = sum(self._errors.values())
        return out


class ReplayServer:
    """A replay server; ``start()`` binds and returns at once (threads serve), ``stop()`` shuts down.

    Usable as a context manager. ``endpoint`` is the bound ``tcp://host:port`` (real port when port=0).
    """

    def __init__(self, config: ServerConfig):
        config.validate()
        self.config = config
        self.store = self._open_store(config)
        self.spec_gate = SpecGate(config.spec, config.snapshot)  # the run's TransitionSpec, once known
        self.insert_window = InsertWindow()  # exactly-once inserts across retries
        self.counters = _Counters()
        self.rate_limiter = RateLimiter(config.samples_per_insert, config.effective_error_buffer,
                                        config.min_size_to_sample)
        self.endpoint: str | None = None
        self._ctx: zmq.Context | None = None
        self._frontend: zmq.Socket | None = None
        self._wake: zmq.Socket | None = None
        self._wake_addr = f"inproc://apexrl-wake-{id(self):x}"
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self._done: deque[Any] = deque()  # (client, req, t_arrival, waited, reply frames or None)
        self._threads: list[threading.Thread] = []
        self._broker: threading.Thread | None = None
        self._snapshotter: threading.Thread | None = None
        self._stopping = threading.Event()
        self._stopped = threading.Event()
        self._snapshot_lock = threading.Lock()
        self._saved_items: int | None = len(self.store) if config.snapshot is not None and os.path.exists(
            config.snapshot) else None  # items in the last snapshot written (or loaded)
        self._started = False

    # ------------------------------------------------------------------------------------------ setup

    @staticmethod
    def _open_store(config: ServerConfig) -> PrioritizedStore:
        """The store of this life, with a key epoch no earlier life of this server used (docs/protocol.md, "Keys")."""
        path = config.snapshot
        restore = path is not None and os.path.exists(path)
        epoch = _choose_epoch(path)
        if restore:
            try:
                store = PrioritizedStore.load(path, epoch)
            except Exception as exc:  # SnapshotError, OSError, ...
                raise SnapshotLoadError(
                    f"cannot load snapshot {os.fspath(path)!r}: {type(exc).__name__}: {exc} "
                    "(move or delete the file to start with an empty store)"
                ) from exc
            log.info("restored %d items from snapshot %s; new keys carry epoch %d", len(store), os.fspath(path),
                     store.epoch)
            for name in ("capacity", "max_size", "alpha", "eviction", "alpha_evict", "shards"):
                wanted = getattr(config, name)
                if name == "max_size" and wanted is None:
                    wanted = 2 * config.capacity
                if getattr(store, name) != wanted:
                    log.warning(
                        "snapshot %s has %s=%r, configuration says %r: the snapshot's value is used",
                        os.fspath(path), name, getattr(store, name), wanted,
                    )
            return store
        log.info("new store; its keys carry epoch %d", epoch)
        return PrioritizedStore(
            capacity=config.capacity,
            max_size=config.max_size,
            alpha=config.alpha,
            shards=config.shards,
            eviction=config.eviction,
            alpha_evict=config.alpha_evict,
            seed=config.seed,
            epoch=epoch,
        )

    def start(self) -> ReplayServer:
        """Bind and start serving; ValueError when the snapshot path could never be written."""
        if self._started:
            raise RuntimeError("server already started")
        cfg = self.config
        if cfg.snapshot is not None:
            check_snapshot_dir(cfg.snapshot)
        self._started = True
        self._ctx = zmq.Context()
        try:
            front = self._ctx.socket(zmq.ROUTER)
            self._frontend = front
            secure_server_socket(front, cfg.curve_dir)  # CURVE + allow-list when keys are configured
            front.setsockopt(zmq.LINGER, 2000)
            front.setsockopt(zmq.MAXMSGSIZE, cfg.max_bytes)
            # Sends never block and fail visibly: EHOSTUNREACH tells the broker a peer left (its waiting requests
            # are dropped), EAGAIN that a peer's send queue is full (it does not read; the reply is dropped).
            front.setsockopt(zmq.ROUTER_MANDATORY, 1)
            _limit_idle_connections(front, cfg)
            port = "*" if int(cfg.port) == 0 else str(int(cfg.port))
            host = f"[{cfg.bind}]" if ":" in cfg.bind else cfg.bind
            if ":" in cfg.bind:
                front.setsockopt(zmq.IPV6, 1)
            front.bind(f"tcp://{host}:{port}")
            self.endpoint = front.getsockopt_string(zmq.LAST_ENDPOINT)
            wake = self._ctx.socket(zmq.PULL)
            self._wake = wake
            wake.setsockopt(zmq.LINGER, 0)
            wake.bind(self._wake_addr)
        except Exception:
            self._close_sockets()
            self._ctx.term()
            self._ctx = None
            raise
        for i in range(cfg.workers):
            t = threading.Thread(target=self._worker, args=(i,), name=f"apexrl-worker-{i}", daemon=True)
            t.start()
            self._threads.append(t)
        self._broker = threading.Thread(target=_Broker(self).run, name="apexrl-broker", daemon=True)
        self._broker.start()
        if cfg.snapshot is not None and cfg.snapshot_every is not None:
            self._snapshotter = threading.Thread(target=self._snapshot_loop, name="apexrl-snapshot", daemon=True)
            self._snapshotter.start()
        log.info("listening on %s (%d workers)", self.endpoint, cfg.workers)
        return self

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
            n = len(self.store)
            self.store.save(self.config.snapshot)
            self._saved_items = n
            log.info("snapshot of %d items saved to %s in %.3fs", n, os.fspath(self.config.snapshot),
                     time.monotonic() - t0)

    def _snapshot_loop(self) -> None:
        assert self.config.snapshot_every is not None
        while not self._stopping.wait(self.config.snapshot_every):
            try:
                self.save_snapshot()
            except Exception as exc:  # keep serving: the previous snapshot stays; the next period tries again
                log.error("periodic snapshot to %s failed (the previous snapshot, of %s items, is kept; "
                          "retrying in %gs): %s: %s", os.fspath(self.config.snapshot),
                          "no" if self._saved_items is None else self._saved_items, self.config.snapshot_every,
                          type(exc).__name__, exc)

    # --------------------------------------------------------------------------------------- shutdown

    def stop(self, timeout: float = 30.0) -> None:
        """Graceful stop: finish in-flight requests, save the snapshot (if configured), close. Idempotent."""
        if not self._started or self._stopped.is_set():
            return
        self._stopping.set()
        if self._broker is not None:
            self._broker.join(timeout)
            if self._broker.is_alive():
                log.error("broker did not stop within %.1fs", timeout)
        for t in self._threads:
            t.join(timeout)
        if self._snapshotter is not None:
            self._snapshotter.join(timeout)
        try:
            if self.config.snapshot is not None:
                self._final_snapshot()
        finally:
            self._stopped.set()
            if self._ctx is not None:
                if self._broker is not None and self._broker.is_alive():
                    self._ctx.destroy(linger=0)
                else:
                    self._ctx.term()
                self._ctx = None
            log.info("stopped")

    def _final_snapshot(self) -> None:
        """The snapshot at stop; SnapshotSaveError (no traceback worth showing) saying what is lost if it fails."""
        try:
            self.save_snapshot()
        except Exception as exc:
            held = len(self.store)
            kept = ("no previous snapshot exists" if self._saved_items is None
                    else f"the previous snapshot holds {self._saved_items} items")
            raise SnapshotSaveError(
                f"final snapshot to {os.fspath(self.config.snapshot)!r} failed ({type(exc).__name__}: {exc}): "
                f"the {held} items held now were not saved; {kept}"
            ) from exc

    def _close_sockets(self) -> None:
        for sock in (self._frontend, self._wake):
            if sock is not None and not sock.closed:
                sock.close()

    def _stop_workers(self) -> None:
        """The broker's last step: stop and join the workers, close the sockets."""
        for _ in self._threads:
            self._jobs.put(None)
        for t in self._threads:
            t.join(5.0)
        self._close_sockets()

    # ----------------------------------------------------------------------------------------- worker

    def _worker(self, index: int) -> None:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.PUSH)
        try:
            sock.setsockopt(zmq.LINGER, 0)
            sock.connect(self._wake_addr)
            while True:
                job = self._jobs.get()
                if job is None:
                    break
                client, req, t_arrival, waited = job
                try:
                    out, waited = self._serve(req, t_arrival, waited)
                except Exception as exc:  # noqa: BLE001 - _serve catches everything; belt and braces
                    log.exception("worker %d failed serving a request", index)
                    out = P.encode_error(int(req.header.op), req.request_id, P.Status.INTERNAL,
                                         f"{type(exc).__name__}: {exc}")
                self._done.append((client, req, t_arrival, waited, out))
                sock.send(b"", copy=True)  # wake the broker: it sends the reply (it owns the front-end)
        except zmq.ContextTerminated:
            pass
        except Exception:
            log.exception("worker %d failed", index)
        finally:
            sock.close()

    def _serve(self, req: P.Request, t_arrival: float, waited: bool) -> tuple[list[Any] | None, bool]:
        """(reply frames, waited) for one decoded request; frames None = defer it (min size or rate limiter).

        ``waited``: whether the request was already counted in rate_limiter_waits_* (counted once).
        """
        h = req.header
        op, rid = h.op, h.request_id
        rl = self.rate_limiter
        can_wait = h.timeout_ms > 0 and time.monotonic() < t_arrival + h.timeout_ms / 1000.0

        def rate_limited() -> tuple[list[Any] | None, bool]:
            if can_wait:
                if not waited:
                    rl.count_wait(op)
                return None, True
            self.counters.count(op, True)
            side = "samplers are" if op == P.Op.INSERT else "inserters are"
            return P.encode_error(
                op, rid, P.Status.TIMEOUT,
                f"rate limited: {P.Op(op).name} of {int(h.count)} items must wait until the {side} caught up "
                f"({rl.describe()}), after waiting {h.timeout_ms} ms",
            ), waited

        try:
            if op == P.Op.INSERT:
                return self._serve_insert(req, t_arrival, can_wait, waited, rate_limited)
            elif op == P.Op.SAMPLE:
                if not rl.big_enough(len(self.store)):
                    if can_wait:
                        return None, waited
                    self.counters.count(op, True)
                    return P.encode_error(
                        op, rid, P.Status.TIMEOUT,
                        f"store holds {len(self.store)} items, fewer than min_size_to_sample={rl.need}, "
                        f"after waiting {h.timeout_ms} ms",
                    ), waited
                n = h.count
                if not rl.try_sample(n, len(self.store)):
                    if not rl.big_enough(len(self.store)):  # shrank meanwhile: wait for min size again
                        return (None, waited) if can_wait else rate_limited()
                    return rate_limited()
                try:
                    batch = self.store.sample(n, h.param)
                except BaseException:
                    rl.undo(sampled=n)
                    raise
                out = P.encode_sample_reply(
                    rid, batch.keys, batch.weights, batch.probabilities, batch.offsets, batch.data,
                    np.array((batch.total_mass, batch.min_mass), dtype="<f8"), np.array((batch.size,), dtype="<u8"),
                )
            elif op == P.Op.UPDATE_PRIORITIES:
                n = self.store.update_priorities(req.arrays["keys"], req.arrays["priorities"])
                out = P.encode_count_reply(op, rid, int(n))
            elif op == P.Op.REMOVE_TO_FIT:
                n = self.store.remove_to_fit()
                out = P.encode_count_reply(op, rid, int(n))
            elif op == P.Op.ERASE:
                n = self.store.erase(req.arrays["keys"])
                self.counters.erased_items(int(n))
                out = P.encode_count_reply(op, rid, int(n))
            elif op == P.Op.HELLO:
                spec = self.spec_gate.declare(req.arrays["spec"])
                out = P.encode_hello_reply(rid, self.hello_info(), spec.to_json() if spec is not None else "")
            else:  # STATS
                self.counters.count(op, False)  # this STATS request is included in the counters
                stats: dict[str, Any] = dict(self.store.stats())
                stats["total_mass"] = stats["total_priority"]  # the names of the SAMPLE reply's totals
                stats["num_shards"] = stats["shards"]
                stats.update(self.counters.snapshot())
                stats["min_size_to_sample"] = int(self.config.min_size_to_sample)
                stats["workers"] = int(self.config.workers)
                stats.update(rl.stats())
                stats.update(self.spec_gate.stats())
                stats.update(self.insert_window.stats())
                return P.encode_stats_reply(rid, {k: _plain(v) for k, v in stats.items()}), waited
        except ValueError as exc:  # the store (or an encoder) rejected the values
            self.counters.count(op, True)
            return P.encode_error(op, rid, P.Status.INVALID_ARGUMENT, str(exc) or type(exc).__name__), waited
        except Exception as exc:  # noqa: BLE001 - the server must keep serving
            log.exception("internal error serving %s request %d", P.Op(op).name, rid)
            self.counters.count(op, True)
            return P.encode_error(op, rid, P.Status.INTERNAL, f"{type(exc).__name__}: {exc}"), waited
        self.counters.count(op, False)
        return out, waited

    def _serve_insert(self, req: P.Request, t_arrival: float, can_wait: bool, waited: bool,
                      rate_limited: Any) -> tuple[list[Any] | None, bool]:
        """INSERT: once per insert_id (a retry gets the first request's keys), every item checked against the
        spec (a bad one refuses the batch whole), then the rate limiter and the store."""
        h, a = req.header, req.arrays
        op, rid, n = h.op, h.request_id, h.count
        session, sequence = a["insert_id"].tolist()
        insert_id = (session, sequence) if session or sequence else None
        window = self.insert_window
        if insert_id is not None:
            state, keys = window.claim(insert_id, req, t_arrival + h.timeout_ms / 1000.0)
            if state == DONE:
                self.counters.count(op, False)
                return P.encode_insert_reply(rid, keys), waited
            if state == BUSY:  # its first request waits or is being served: answer this one after it
                if can_wait:
                    return None, waited
                self.counters.count(op, True)
                return P.encode_error(op, rid, P.Status.TIMEOUT, f"INSERT {session:#x}/{sequence}: a request with "
                                      "this insert_id is still waiting to be served; retry with the same id"), waited
        keep_id = False  # this request still owns its insert_id: stored, or deferred
        try:
            self.spec_gate.check(a["data"], a["offsets"])
            if not self.rate_limiter.try_insert(n, len(self.store)):
                out, waited = rate_limited()
                keep_id = out is None
                return out, waited
            try:
                keys = self.store.insert(a["priorities"], a["data"], a["offsets"])
            except BaseException:
                self.rate_limiter.undo(inserted=n)
                raise
            keep_id = True
            if insert_id is not None:
                window.finish(insert_id, req, keys)
        finally:
            if insert_id is not None and not keep_id:
                window.release(insert_id, req)
        self.counters.count(op, False)
        return P.encode_insert_reply(rid, keys), waited

    def hello_info(self) -> dict[str, int | float]:
        """The HELLO reply's numbers: the limits a client must respect, the protocol version, the store's
        lock-shard count (and its epoch when it has one)."""
        cfg = self.config
        info: dict[str, int | float] = {
            "protocol_version": P.PROTOCOL_VERSION,
            "max_request_bytes": int(cfg.max_bytes),
            "max_reply_bytes": int(getattr(cfg, "max_reply_bytes", cfg.max_bytes)),
        }
        store_stats = self.store.stats()
        info["num_shards"] = int(store_stats["shards"])
        epoch = store_stats.get("epoch")
        if epoch is not None:
            info["epoch"] = _plain(epoch)
        return info


def _limit_idle_connections(sock: zmq.Socket, cfg: ServerConfig) -> None:
    """Close connections that hold a file descriptor and do nothing: ZMQ_HANDSHAKE_IVL closes one that has not
    completed the ZMTP handshake in ``handshake_s`` (a raw TCP connection that never sends); ZMTP heartbeats
    close one whose peer stopped answering for 3 x ``heartbeat_s`` (a host that vanished without a FIN)."""
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(cfg.handshake_s * 1000))
    if cfg.heartbeat_s > 0:
        ivl = int(cfg.heartbeat_s * 1000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)
        sock.setsockopt(zmq.HEARTBEAT_TTL, min(3 * ivl, 6_553_500))


class _Deferred:
    """A request the broker keeps until it may be served (see :meth:`RateLimiter.release`) or its deadline
    passes. It sits in one FIFO queue of its op, in the deadline heap and in its peer's queue; when it leaves
    (served, timed out, dropped) ``live`` turns False and the other structures discard it lazily."""

    __slots__ = ("client", "deadline", "live", "n", "nbytes", "op", "peer", "req", "seq", "t_arrival", "waited")

    def __init__(self, client: Any, req: P.Request, t_arrival: float, waited: bool, max_wait_s: float, seq: int):
        h = req.header
        self.client, self.req, self.t_arrival, self.waited, self.seq = client, req, t_arrival, waited, seq
        self.peer: bytes = client.bytes if isinstance(client, zmq.Frame) else bytes(client)
        self.op, self.n = int(h.op), int(h.count)
        self.deadline = t_arrival + min(h.timeout_ms / 1000.0, max_wait_s)
        self.nbytes = sum(memoryview(a).nbytes for a in req.arrays.values()) if self.op == _INSERT else 0
        self.live = True

    def __lt__(self, other: _Deferred) -> bool:  # heap order: deadline, then arrival
        return (self.deadline, self.seq) < (other.deadline, other.seq)


class _Waitlist:
    """The requests that wait, with bounds (ServerConfig.max_waiting*, max_wait_s) and no scan of them all:

    * one FIFO per op (INSERT, SAMPLE): the rate limiter looks only at their heads (O(released + 2));
    * a heap of deadlines: the broker pops what expired (O(log waiting) each);
    * per peer, its entries in arrival order: over max_waiting_per_peer its oldest is answered TIMEOUT (a client
      that retries after its own timeout has given up on its oldest requests), and when a reply cannot be
      delivered because the peer left (ROUTER_MANDATORY: EHOSTUNREACH) all its waiting requests are dropped.

    Entries that left stay as husks (``live`` False, request released) until a queue reaches them; the queues
    are compacted when husks outnumber live entries, so their size stays O(live + arrivals per max_wait_s).
    """

    def __init__(self, cfg: ServerConfig):
        self.max_wait_s = float(cfg.max_wait_s)
        self.max_total, self.max_peer, self.max_bytes = cfg.max_waiting, cfg.max_waiting_per_peer, cfg.max_waiting_bytes
        self.inserts: deque[_Deferred] = deque()
        self.samples: deque[_Deferred] = deque()
        self.heap: list[_Deferred] = []
        self.peers: dict[bytes, deque[_Deferred]] = {}
        self.peer_count: dict[bytes, int] = {}
        self.count = 0
        self.bytes = 0
        self.seq = 0
        self.dropped = 0  # waiting requests of departed peers, dropped unanswered
        self.refused = 0  # requests answered TIMEOUT at once because the caps were reached
        self.evicted = 0  # oldest requests of a peer over its cap, answered TIMEOUT

    def __len__(self) -> int:
        return self.count

    def stats(self) -> dict[str, int]:
        return {"deferred": self.count, "deferred_bytes": self.bytes, "deferred_peers": len(self.peer_count),
                "deferred_dropped": self.dropped, "deferred_refused": self.refused,
                "deferred_evicted": self.evicted}

    def make(self, client: Any, req: P.Request, t_arrival: float, waited: bool) -> _Deferred:
        self.seq += 1
        return _Deferred(client, req, t_arrival, waited, self.max_wait_s, self.seq)

    def full_reason(self, e: _Deferred) -> str | None:
        """Why ``e`` may not wait (total count or bytes cap reached), or None."""
        if self.count >= self.max_total:
            return f"{self.count} requests already wait on the server (max_waiting={self.max_total})"
        if e.nbytes and self.bytes + e.nbytes > self.max_bytes:
            return (f"waiting inserts already hold {self.bytes} bytes, this one {e.nbytes} more, over "
                    f"max_waiting_mb={self.max_bytes / (1 << 20):g}")
        return None

    def add(self, e: _Deferred, front: bool = False) -> _Deferred | None:
        """Let ``e`` wait (at the head of its queue when ``front``: it was released, then refused again); returns
        the peer's oldest waiting request when the peer is now over its cap (taken out: answer it)."""
        q = self.inserts if e.op == _INSERT else self.samples
        q.appendleft(e) if front else q.append(e)
        heapq.heappush(self.heap, e)
        peer = self.peers.setdefault(e.peer, deque())
        peer.append(e)
        count = self.peer_count[e.peer] = self.peer_count.get(e.peer, 0) + 1
        if len(peer) > 2 * count + 64:
            peer = self.peers[e.peer] = deque(x for x in peer if x.live)
        self.count += 1
        self.bytes += e.nbytes
        self._compact()
        if self.peer_count[e.peer] > self.max_peer:
            while not peer[0].live:
                peer.popleft()
            oldest = peer[0]
            self.remove(oldest)
            self.evicted += 1
            return oldest
        return None

    def remove(self, e: _Deferred) -> None:
        """Take ``e`` out (lazily from the queues)."""
        e.live = False
        self.count -= 1
        self.bytes -= e.nbytes
        left = self.peer_count[e.peer] - 1
        if left:
            self.peer_count[e.peer] = left
        else:
            del self.peer_count[e.peer], self.peers[e.peer]

    def release(self, limiter: RateLimiter, size: int) -> list[_Deferred]:
        ready = limiter.release(self.inserts, self.samples, size)
        for e in ready:
            self.remove(e)
        return ready

    def expired(self, now: float) -> list[_Deferred]:
        out = []
        while self.heap and self.heap[0].deadline <= now:
            e = heapq.heappop(self.heap)
            if e.live:
                self.remove(e)
                out.append(e)
        return out

    def next_deadline(self) -> float | None:
        while self.heap and not self.heap[0].live:
            heapq.heappop(self.heap)
        return self.heap[0].deadline if self.heap else None

    def drop_peer(self, peer: bytes) -> int:
        """Drop every waiting request of a departed peer; how many."""
        entries = [e for e in self.peers.get(peer, ()) if e.live]
        for e in entries:
            self.remove(e)
            e.req = None  # type: ignore[assignment]  # the husk keeps no data
        self.dropped += len(entries)
        return len(entries)

    def take_all(self) -> list[_Deferred]:
        out = sorted((e for e in self.heap if e.live), key=lambda e: e.seq)
        for e in out:
            self.remove(e)
        self.inserts.clear(), self.samples.clear(), self.heap.clear(), self.peers.clear()
        return out

    def _compact(self) -> None:
        """Rebuild a queue when husks outnumber live entries (amortised O(1) per request)."""
        if len(self.heap) > 2 * self.count + 64:
            self.heap = [e for e in self.heap if e.live]
            heapq.heapify(self.heap)
        for name in ("inserts", "samples"):
            q = getattr(self, name)
            if len(q) > 2 * self.count + 64:
                setattr(self, name, deque(e for e in q if e.live))


_OK_STATUS = int(P.Status.OK)
# A SAMPLE reply's bytes besides its items: the header, offsets[0] (and slack), totals f64[2] and store_size u64[1].
_REPLY_FIXED = P.HEADER_SIZE + 16 + 24
_REPLY_PER_ITEM = 8 + 4 + 8 + 8  # key u64, weight f32, probability f64, offset u64


class _Broker:
    """The broker thread's state and its steps (see the module docstring): read a burst of the front-end and
    serve each request inline or hand it to the workers, send the workers' replies, release deferred
    requests, refuse what is left when stopping. Only this thread touches the front-end socket."""

    def __init__(self, server: ReplayServer):
        assert server._frontend is not None and server._wake is not None
        cfg = server.config
        self.server = server
        self.front, self.wake = server._frontend, server._wake
        self.jobs, self.done = server._jobs, server._done
        self.counters, self.rate_limiter, self.store = server.counters, server.rate_limiter, server.store
        self.max_bytes = cfg.max_bytes
        self.max_reply_bytes = cfg.max_reply_bytes
        self.inline_sample_max = cfg.inline_sample_max
        self.outstanding = 0  # requests handed to the workers and not yet answered
        self.max_outstanding = _JOBS_PER_WORKER * cfg.workers
        self.waiting = _Waitlist(cfg)
        self.recheck = False  # something was served since the waiting requests were last checked
        # Largest item stored, for the reply-size estimate: only grows (inserts), starts at the mean item of a
        # restored snapshot (its largest is unknown; replies are also checked after sampling).
        self.max_item = _mean_item(self.store)
        self.replies_dropped = 0  # replies to a peer whose send queue is full (ZMQ_SNDHWM): it reads too slowly
        self.replies_refused = 0  # SAMPLE replies over max_reply_bytes (TOO_LARGE)
        self.poll_both = zmq.Poller()
        self.poll_both.register(self.front, zmq.POLLIN)
        self.poll_both.register(self.wake, zmq.POLLIN)
        self.poll_wake = zmq.Poller()
        self.poll_wake.register(self.wake, zmq.POLLIN)
        self.rate_limiter.waiting_stats = self.stats

    def stats(self) -> dict[str, int]:
        """The broker's counters for STATS (read from a worker thread: plain ints, a moment stale at most)."""
        return self.waiting.stats() | {"replies_dropped": self.replies_dropped,
                                       "replies_refused_too_large": self.replies_refused,
                                       "max_item_bytes": self.max_item}

    def run(self) -> None:
        stopping_event = self.server._stopping
        try:
            while True:
                stopping = stopping_event.is_set()
                if stopping:
                    self.refuse_pending()
                    if self.outstanding == 0:
                        break
                poll_ms = 100
                if len(self.waiting):
                    self.release_deferred()
                    deadline = self.waiting.next_deadline()
                    if deadline is not None:
                        poll_ms = max(0, min(100, math.ceil((deadline - time.monotonic()) * 1000)))
                if stopping:
                    poll_ms = min(poll_ms, 10)
                reading = self.outstanding < self.max_outstanding and not stopping
                events = dict((self.poll_both if reading else self.poll_wake).poll(poll_ms))
                if self.wake in events:
                    self.send_worker_replies()
                if self.front in events:
                    self.read_front_burst()
        except Exception:
            log.exception("broker loop failed")
        finally:
            self.server._stop_workers()

    # ------------------------------------------------------------------------------------ sending

    def send(self, client: Any, frames: list[Any]) -> bool:
        """Send a reply without ever blocking (ROUTER_MANDATORY is on); False when the peer left, and then its
        waiting requests are dropped. A peer whose send queue is full (it does not read) loses this reply."""
        try:
            self.front.send_multipart([client, *frames], flags=zmq.NOBLOCK, copy=False)
        except zmq.Again:
            self.replies_dropped += 1
        except zmq.ZMQError as exc:
            if exc.errno != zmq.EHOSTUNREACH:
                raise
            peer = client.bytes if isinstance(client, zmq.Frame) else bytes(client)
            n = self.waiting.drop_peer(peer)
            self.replies_dropped += 1
            if n:
                log.info("a peer left: dropped its %d waiting requests", n)
            return False
        return True

    def error(self, client: Any, req: P.Request, status: P.Status, message: str) -> bool:
        self.counters.count(int(req.header.op), True)
        return self.send(client, P.encode_error(int(req.header.op), req.request_id, status, message))

    # ------------------------------------------------------------------------------------ dispatch

    def early_refusal(self, req: P.Request) -> tuple[P.Status, str] | None:
        """A request refused before any store call: one the rate limiter could never admit (INVALID_ARGUMENT,
        with the arithmetic) or a SAMPLE whose reply would be over max_reply_bytes (TOO_LARGE)."""
        h = req.header
        op, n = int(h.op), int(h.count)
        if op in (_INSERT, _SAMPLE):
            reason = self.rate_limiter.never_admitted(op, n, len(self.store))
            if reason is not None:
                return P.Status.INVALID_ARGUMENT, f"{P.Op(op).name} of {n} items refused: {reason}"
        if op == _SAMPLE:
            estimate = _REPLY_FIXED + n * (_REPLY_PER_ITEM + self.max_item)
            if estimate > self.max_reply_bytes:
                return P.Status.TOO_LARGE, (
                    f"SAMPLE of {n} items refused: its reply would be about {estimate} bytes ({n} x (largest item "
                    f"stored {self.max_item} + {_REPLY_PER_ITEM}) bytes), over the reply cap of "
                    f"{self.max_reply_bytes} bytes (max_reply_mb); sample fewer items per request")
        return None

    def dispatch(self, client: Any, req: P.Request, t_arrival: float, waited: bool,
                 entry: _Deferred | None = None) -> None:
        """Serve INSERT / UPDATE_PRIORITIES / small SAMPLEs here (one store call that releases the GIL, then the
        reply: no hop through a worker); queue everything else for the workers. ``entry``: the request was
        waiting (released now); if it must wait again it goes back to the head of its queue."""
        refusal = self.early_refusal(req)
        if refusal is not None:
            self.error(client, req, *refusal)
            return
        h = req.header
        if h.op in _INLINE_OPS or (h.op == _SAMPLE and h.count <= self.inline_sample_max):
            out, waited = self.server._serve(req, t_arrival, waited)
            self.recheck = True
            if out is None:  # deferred (min size or rate limiter)
                self.defer(client, req, t_arrival, waited, front=entry is not None)
            else:
                self.deliver(client, req, out)
        else:
            self.jobs.put((client, req, t_arrival, waited))
            self.outstanding += 1

    def deliver(self, client: Any, req: P.Request, out: list[Any]) -> None:
        """Send a served request's reply; note the largest item of an INSERT stored, and refuse a SAMPLE reply
        that came out over the cap anyway (items of a restored snapshot larger than its mean)."""
        op = int(req.header.op)
        if op == _INSERT and len(out[0]) >= 18 and int.from_bytes(bytes(out[0][16:18]), "little") == _OK_STATUS:
            offsets = req.arrays["offsets"]
            if len(offsets) > 1:
                self.max_item = max(self.max_item, int((offsets[1:] - offsets[:-1]).max()))  # np.diff: 2x slower
        elif op == _SAMPLE and len(out) > 1:
            size = sum(memoryview(f).nbytes for f in out)
            if size > self.max_reply_bytes:
                self.rate_limiter.undo(sampled=int(req.header.count))
                self.replies_refused += 1  # (counted as served by _serve; this counter tells it apart)
                self.send(client, P.encode_error(op, req.request_id, P.Status.TOO_LARGE,
                          f"SAMPLE of {req.header.count} items refused: its reply is {size} bytes, over the reply "
                           f"cap of {self.max_reply_bytes} bytes (max_reply_mb); sample fewer items per request"))
                return
        self.send(client, out)

    def defer(self, client: Any, req: P.Request, t_arrival: float, waited: bool, front: bool = False) -> None:
        """Let a request wait, within the caps (answered TIMEOUT at once when they are reached)."""
        e = self.waiting.make(client, req, t_arrival, waited)
        if e.deadline <= time.monotonic():  # clipped to max_wait_s and already past it
            self.expire(e)
            return
        full = self.waiting.full_reason(e)
        if full is not None:
            self.waiting.refused += 1
            self.error(client, req, P.Status.TIMEOUT,
                       f"{P.Op(e.op).name} of {e.n} items not queued: it would have to wait, and {full}; retry later")
            return
        evicted = self.waiting.add(e, front)
        if evicted is not None:
            self.error(evicted.client, evicted.req, P.Status.TIMEOUT,
                       f"{P.Op(evicted.op).name} of {evicted.n} items given up: this peer has more than "
                       f"max_waiting_per_peer={self.waiting.max_peer} requests waiting, the oldest is answered")
            evicted.req = None  # type: ignore[assignment]  # the husk keeps no data

    def expire(self, e: _Deferred) -> None:
        """Answer a waiting request whose (clipped) deadline passed: TIMEOUT, saying what it waited for."""
        h = e.req.header
        if e.op == _SAMPLE and not self.rate_limiter.big_enough(len(self.store)):
            why = (f"the store holds {len(self.store)} items, fewer than min_size_to_sample="
                   f"{self.rate_limiter.need}")
        else:
            side = "samplers are" if e.op == _INSERT else "inserters are"
            why = f"rate limited until the {side} caught up ({self.rate_limiter.describe()})"
        waited_ms = round((time.monotonic() - e.t_arrival) * 1000)
        clip = "" if h.timeout_ms / 1000.0 <= self.waiting.max_wait_s else (
            f", the server's max_wait_s={self.waiting.max_wait_s:g} (timeout_ms={h.timeout_ms} clipped)")
        if not self.error(e.client, e.req, P.Status.TIMEOUT,
                          f"{P.Op(e.op).name} of {e.n} items: {why}, after waiting {waited_ms} ms{clip}"):
            self.waiting.dropped += 1  # its peer left: counted with the others it had waiting
        e.req = None  # type: ignore[assignment]

    def read_front_burst(self) -> None:
        """Decode and dispatch up to _FRONT_BURST requests (so worker replies are not held back by a stream);
        a request that fails to decode is answered with its error at once."""
        front, stopping = self.front, self.server._stopping
        for _ in range(_FRONT_BURST):
            if self.outstanding >= self.max_outstanding or stopping.is_set():
                break
            try:
                msg = front.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            t_arrival = time.monotonic()
            try:
                req = P.decode_request(msg[1:], self.max_bytes)
            except ProtocolError as exc:
                self.counters.count(exc.op, True)
                log.debug("bad request: %s", exc.message)
                self.send(msg[0], P.encode_protocol_error(exc))
                continue
            self.dispatch(msg[0], req, t_arrival, False)

    def send_worker_replies(self) -> None:
        """Send the replies the workers finished (they wake this thread through the inproc socket)."""
        while True:
            try:
                self.wake.recv(zmq.NOBLOCK, copy=True)
            except zmq.Again:
                break
        done = self.done
        while done:
            client, req, t_arrival, waited, out = done.popleft()
            self.outstanding -= 1
            self.recheck = True
            if out is None:  # deferred by the worker (min size or rate limiter)
                self.defer(client, req, t_arrival, waited)
            else:
                self.deliver(client, req, out)

    def release_deferred(self) -> None:
        """Answer the waiting requests whose deadline passed (heap), and dispatch again those the rate limiter
        admits now (heads of the FIFO queues), after something was served."""
        for e in self.waiting.expired(time.monotonic()):
            self.expire(e)
        if not self.recheck:
            return
        self.recheck = False
        for e in self.waiting.release(self.rate_limiter, len(self.store)):
            req, e.req = e.req, None  # type: ignore[assignment]
            self.dispatch(e.client, req, e.t_arrival, e.waited, entry=e)

    def refuse_pending(self) -> None:
        """While stopping: answer waiting requests and requests queued in the front-end SHUTTING_DOWN."""
        for e in self.waiting.take_all():
            self.error(e.client, e.req, P.Status.SHUTTING_DOWN, "the replay server is shutting down")
            e.req = None  # type: ignore[assignment]
        while True:
            try:
                msg = self.front.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                break
            self.refuse(msg[0], msg[1:])

    def refuse(self, client: Any, frames: list[Any]) -> None:
        try:
            req = P.decode_request(frames, self.max_bytes)
            reply = P.encode_error(int(req.header.op), req.request_id, P.Status.SHUTTING_DOWN,
                                   "the replay server is shutting down")
            self.counters.count(req.header.op, True)
        except ProtocolError as exc:
            reply = P.encode_protocol_error(exc)
            self.counters.count(exc.op, True)
        self.send(client, reply)


def _mean_item(store: PrioritizedStore) -> int:
    """The mean item size of a (restored) store, rounded up; 0 when empty."""
    n = len(store)
    return 0 if n == 0 else -(-int(store.stats().get("bytes_held", 0)) // n)


def _plain(v: Any) -> int | float:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return 0.0
    return v
