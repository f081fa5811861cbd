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
  the store is large enough or its deadline passes (checked after each request served and every ~10 ms); at
  the deadline it is answered TIMEOUT. ``timeout_ms == 0`` answers TIMEOUT at once.
* The same deferral serves the **rate limiter** (below): an INSERT or SAMPLE that is too far ahead of the
  other side is kept by the broker until the other side has caught up or its deadline passes. A waiting
  request never holds a worker, and never blocks the requests behind it.
* The broker's loop is :meth:`_Broker.run`; each step is a method of its own: ``read_front_burst`` (decode,
  then ``dispatch``: serve inline or queue for the workers), ``send_worker_replies``, ``release_deferred``
  (asks :meth:`RateLimiter.release` which waiting requests may go) and ``refuse_pending`` (when stopping).

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

Snapshots: on start, ``config.snapshot`` is loaded if the file exists (an unreadable/corrupt file raises
:class:`SnapshotLoadError` - never silently ignored); every ``snapshot_every`` seconds a background thread
saves it (the store writes ``PATH.tmp.<pid>.<n>`` and renames it, so a crash never leaves a half-written
snapshot; the next save removes temporaries left by a killed process).

Keys: each life of the server gives its store a new key epoch, recorded in ``PATH.epoch`` beside the snapshot
before the server binds, so keys of an earlier life never address an item of this one (``_choose_epoch``;
docs/protocol.md, "Keys").
"""

from __future__ import annotations

import contextlib
import glob
import logging
import math
import os
import queue
import secrets
import threading
import time
from collections import deque
from typing import Any, NamedTuple

import numpy as np
import zmq

from apexrl import PrioritizedStore
from apexrl.errors import ApexRLError, ProtocolError
from apexrl.replay import protocol as P
from apexrl.replay.config import ServerConfig
from apexrl.replay.insert_guard import BUSY, DONE, InsertWindow, SpecGate
from apexrl.replay.rate_limiter import RateLimiter
from apexrl.security import secure_server_socket

__all__ = ["ReplayServer", "ServerConfig", "SnapshotLoadError"]

log = logging.getLogger("apexrl.replay.server")

_DEFER_POLL_S = 0.01
# Ops the receiving (broker) thread serves itself: short store calls that release the GIL. SAMPLE too when it
# asks for at most ServerConfig.inline_sample_max items.
_INLINE_OPS = frozenset({int(P.Op.INSERT), int(P.Op.UPDATE_PRIORITIES)})
_SAMPLE = int(P.Op.SAMPLE)
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
    """Records `epoch` durably: temporary file, fsync, rename, fsync of the directory."""
    directory = os.path.dirname(os.path.abspath(sidecar))
    tmp = f"{sidecar}.tmp.{os.getpid()}"
    for leftover in glob.glob(glob.escape(sidecar) + ".tmp.*"):  # of a life killed while writing it
        with contextlib.suppress(OSError):
            os.remove(leftover)
    try:
        with open(tmp, "w", encoding="ascii") as f:
            f.write(f"{epoch}\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, sidecar)
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.remove(tmp)
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
        if self._started:
            raise RuntimeError("server already started")
        self._started = True
        cfg = self.config
        self._ctx = zmq.Context()
        try:
            front = self._ctx.socket(zmq.ROUTER)
            self._frontend = front
            secure_server_socket(front, cfg.curve_dir)  # CURVE + allow-list when keys are configured
            front.setsockopt(zmq.LINGER, 2000)
            front.setsockopt(zmq.MAXMSGSIZE, cfg.max_bytes)
            front.setsockopt(zmq.ROUTER_MANDATORY, 0)
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
        """Write the snapshot now (atomic: the store writes a temporary file and renames it)."""
        if self.config.snapshot is None:
            raise ValueError("no snapshot path configured")
        with self._snapshot_lock:
            t0 = time.monotonic()
            self.store.save(self.config.snapshot)
            log.info("snapshot of %d items saved to %s in %.3fs", len(self.store),
                     os.fspath(self.config.snapshot), time.monotonic() - t0)

    def _snapshot_loop(self) -> None:
        assert self.config.snapshot_every is not None
        while not self._stopping.wait(self.config.snapshot_every):
            try:
                self.save_snapshot()
            except Exception:  # keep serving; the next period tries again
                log.exception("periodic snapshot failed")

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
                self.save_snapshot()
        finally:
            self._stopped.set()
            if self._ctx is not None:
                if self._broker is not None and self._broker.is_alive():
                    self._ctx.destroy(linger=0)
                else:
                    self._ctx.term()
                self._ctx = None
            log.info("stopped")

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
                    rid, batch.keys, batch.weights, batch.probabilities, batch.offsets, batch.data
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
        """The HELLO reply's numbers: the limits a client must respect, the protocol version (and the store's
        epoch when it has one)."""
        cfg = self.config
        info: dict[str, int | float] = {
            "protocol_version": P.PROTOCOL_VERSION,
            "max_request_bytes": int(cfg.max_bytes),
            "max_reply_bytes": int(getattr(cfg, "max_reply_bytes", cfg.max_bytes)),
        }
        epoch = self.store.stats().get("epoch")
        if epoch is not None:
            info["epoch"] = _plain(epoch)
        return info


class _Deferred(NamedTuple):
    """A request the broker keeps until it may be served (see :meth:`RateLimiter.release`) or times out."""

    deadline: float
    op: int
    n: int
    waited: bool
    client: Any
    req: P.Request
    t_arrival: float


def _deferred(client: Any, req: P.Request, t_arrival: float, waited: bool) -> _Deferred:
    h = req.header
    return _Deferred(t_arrival + h.timeout_ms / 1000.0, int(h.op), int(h.count), waited, client, req, t_arrival)


class _Broker:
    """The broker thread's state and its steps (see the module docstring): read a burst of the front-end and
    serve each request inline or hand it to the workers, send the workers' replies, release deferred
    requests, refuse what is left when stopping. Only this thread touches the front-end socket."""

    def __init__(self, server: ReplayServer):
        assert server._frontend is not None and server._wake is not None
        self.server = server
        self.front, self.wake = server._frontend, server._wake
        self.jobs, self.done = server._jobs, server._done
        self.counters, self.rate_limiter, self.store = server.counters, server.rate_limiter, server.store
        self.max_bytes = server.config.max_bytes
        self.inline_sample_max = server.config.inline_sample_max
        self.outstanding = 0  # requests handed to the workers and not yet answered
        self.max_outstanding = _JOBS_PER_WORKER * server.config.workers
        self.deferred: list[_Deferred] = []
        self.recheck = False  # something was served since the deferred requests were last checked
        self.next_tick = 0.0
        self.poll_both = zmq.Poller()
        self.poll_both.register(self.front, zmq.POLLIN)
        self.poll_both.register(self.wake, zmq.POLLIN)
        self.poll_wake = zmq.Poller()
        self.poll_wake.register(self.wake, zmq.POLLIN)

    def run(self) -> None:
        stopping_event = self.server._stopping
        try:
            while True:
                stopping = stopping_event.is_set()
                if stopping:
                    self.refuse_pending()
                    if self.outstanding == 0:
                        break
                if self.deferred:
                    self.release_deferred()
                poll_ms = int(_DEFER_POLL_S * 1000) if (self.deferred or stopping) else 100
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

    def dispatch(self, client: Any, req: P.Request, t_arrival: float, waited: bool) -> None:
        """Serve INSERT / UPDATE_PRIORITIES / small SAMPLEs here (one store call that releases the GIL, then the
        reply: no hop through a worker); queue everything else for the workers."""
        h = req.header
        if h.op in _INLINE_OPS or (h.op == _SAMPLE and h.count <= self.inline_sample_max):
            out, waited = self.server._serve(req, t_arrival, waited)
            self.recheck = True
            if out is None:  # deferred (min size or rate limiter)
                self.deferred.append(_deferred(client, req, t_arrival, waited))
            else:
                self.front.send_multipart([client, *out], copy=False)
        else:
            self.jobs.put((client, req, t_arrival, waited))
            self.outstanding += 1

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
                front.send_multipart([msg[0], *P.encode_protocol_error(exc)], copy=False)
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
                self.deferred.append(_deferred(client, req, t_arrival, waited))
            else:
                self.front.send_multipart([client, *out], copy=False)

    def release_deferred(self) -> None:
        """Dispatch again the deferred requests that may now be served (min size reached, the other side of the
        rate limiter caught up) or whose deadline passed; checked after something was served and every
        _DEFER_POLL_S."""
        now = time.monotonic()
        if not (self.recheck or now >= self.next_tick):
            return
        self.recheck, self.next_tick = False, now + _DEFER_POLL_S
        ready, self.deferred = self.rate_limiter.release(self.deferred, len(self.store), now)
        for entry in ready:
            self.dispatch(entry.client, entry.req, entry.t_arrival, entry.waited)

    def refuse_pending(self) -> None:
        """While stopping: answer deferred requests and requests queued in the front-end SHUTTING_DOWN."""
        for entry in self.deferred:
            self.counters.count(entry.op, True)
            self.front.send_multipart(
                [entry.client, *P.encode_error(entry.op, entry.req.request_id, P.Status.SHUTTING_DOWN,
                                               "the replay server is shutting down")],
                copy=False,
            )
        self.deferred = []
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
        self.front.send_multipart([client, *reply], copy=False)


def _plain(v: Any) -> int | float:
    if isinstance(v, np.generic):
        v = v.item()
    if isinstance(v, float) and not math.isfinite(v):
        return 0.0
    return v
