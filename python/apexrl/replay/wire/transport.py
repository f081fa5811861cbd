"""The one request/reply loop of every apexrl client: a ZeroMQ DEALER to one endpoint.

:class:`Transport` is used by :class:`~apexrl.replay.client.replay_client.ReplayClient` and :class:`~apexrl.params.service.ParamClient`
(and, through the replay client, by the sampler, updater and inserter helpers). It owns:

* **request ids**: every request gets a fresh one (:meth:`Transport.next_request_id`); the counter starts at a
  random point so that ids of an earlier client process never collide with this one's;
* **the wait**: :meth:`Transport.request` sends and waits for the reply *whose request id matches* until a
  deadline; replies with another id (late answers to an earlier request that timed out) and frames that are
  not an apexrl header are discarded;
* **socket reset**: a request that times out (or a reply that fails to decode, see :meth:`reset`) drops the
  socket and any late reply queued on it; the next call connects a new one, so a server restarted on the same
  endpoint is reached again;
* **interruption**: :meth:`interrupt` may be called from any other thread (a ZeroMQ socket itself is not
  thread-safe); the call in progress and every later one raise :class:`~apexrl.errors.Interrupted` within
  ``POLL_SLICE_S``. Background helpers use it to make ``close()`` prompt while a request waits on a server
  that does not answer;
* **the size cap**: ``max_message_bytes`` sets ZMQ_MAXMSGSIZE, so libzmq drops a larger reply (and the
  connection) before allocating it; the call then times out.
* **CURVE** (``curve``: a key directory or :class:`~apexrl.security.ClientKeys`): the socket encrypts and
  authenticates with the client's key pair and the server's public key. libzmq hides a failed handshake (the
  request just gets no reply), so a socket monitor watches for it: a server that refuses this client's key
  raises :class:`~apexrl.errors.AuthenticationError` at once; any other failed handshake (no keys against a
  CURVE server, keys against a plain one, the wrong server key) is named in the timeout's message. Those
  are kept as timeouts because a peer killed mid-handshake looks the same.

Pipelined use (several requests outstanding, for the inserter) goes through :meth:`send` and :meth:`receive`,
which share the socket, the ids and the reset of the same transport. Calls are serialised by a lock.
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Callable
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from apexrl.errors import (
    AuthenticationError,
    Interrupted,
    ReplayTimeout,
    ServerClosedError,
)
from apexrl.replay.wire.schema import peek_ids
from apexrl.security import ENV_VAR, ClientKeys, client_keys, secure_client_socket

__all__ = ["POLL_SLICE_S", "Transport", "TransportClient"]

POLL_SLICE_S = 0.05
"""Longest a wait polls before it looks at :meth:`Transport.interrupt` again."""
_U64 = 0xFFFF_FFFF_FFFF_FFFF
_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL | zmq.EVENT_HANDSHAKE_FAILED_AUTH
)
_MONITORED = _HANDSHAKE_FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED


class Transport:
    """One DEALER socket to ``endpoint``, replaced after a timeout; see the module docstring.

    ``timeout_error`` is the exception class raised on a timeout (a :class:`~apexrl.errors.ReplayTimeout`
    subclass); ``peer`` names the other end and ``name`` this client in messages. ``curve`` (a key directory
    or ClientKeys; None: no encryption) turns on CURVE (CurveKeyError, a ValueError, if the keys are bad).
    """

    def __init__(
        self,
        endpoint: str,
        *,
        max_message_bytes: int | None = None,
        timeout_error: type[ReplayTimeout] = ReplayTimeout,
        peer: str = "server",
        name: str = "client",
        curve: ClientKeys | str | None = None,
    ):
        self.endpoint = endpoint
        self.curve = client_keys(curve)
        self.name = name
        self._max_message_bytes = max_message_bytes
        self._timeout_error = timeout_error
        self._peer = peer
        self._lock = threading.RLock()
        self._interrupted = threading.Event()
        self._ctx: zmq.Context | None = zmq.Context()
        self._sock: zmq.Socket | None = None
        self._monitor: zmq.Socket | None = None
        self._handshake_failures = 0  # failed handshakes since the last one that succeeded
        self._ids = itertools.count(random.randrange(1, 1 << 62))
        self._connect()

    # ------------------------------------------------------------------------------------------ socket

    def _connect(self) -> zmq.Socket:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if self._max_message_bytes is not None:
            sock.setsockopt(zmq.MAXMSGSIZE, self._max_message_bytes)
        secure_client_socket(sock, self.curve)
        self._monitor = sock.get_monitor_socket(_MONITORED)
        self._handshake_failures = 0
        sock.connect(self.endpoint)
        self._sock = sock
        return sock

    def _close_socket(self) -> None:
        if self._sock is not None:
            if self._monitor is not None:
                self._sock.disable_monitor()
                self._monitor.close(linger=0)
                self._monitor = None
            self._sock.close(linger=0)
            self._sock = None

    def _check_handshakes(self) -> None:
        """Read the monitor's events: AuthenticationError (socket reset) when the server refused this client's
        key; other failures are counted for the timeout message (see :meth:`_handshake_hint`)."""
        mon = self._monitor
        while mon is not None and mon.poll(0):
            event = parse_monitor_message(mon.recv_multipart())
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._handshake_failures = 0
            elif event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
                self.reset()
                raise AuthenticationError(
                    f"{self._peer} at {self.endpoint} refused this {self.name}'s CURVE key (ZAP status "
                    f"{event['value']}): its public key is not in the server's authorized/ directory; check "
                    f"--curve-dir / {ENV_VAR}"
                )
            elif event["event"] & _HANDSHAKE_FAILED:
                self._handshake_failures += 1

    def _handshake_hint(self) -> str:
        """Why a request may have timed out, when handshakes with the server failed meanwhile."""
        if not self._handshake_failures:
            return ""
        if self.curve is None:
            why = (
                f"the {self._peer} probably requires CURVE: give --curve-dir DIR (or set {ENV_VAR}) with the "
                "keys of `apexrl keygen`"
            )
        else:
            why = (
                f"the server public key in {self.curve.directory} is not this {self._peer}'s, or the "
                f"{self._peer} does not use CURVE"
            )
        return f"; the connection handshake failed {self._handshake_failures} times: {why}"

    def pollable(self) -> zmq.Socket | None:
        """The socket of the current connection, to poll together with others' (None before the first send or
        after a reset); receive with :meth:`receive`."""
        return self._sock

    def _socket(self) -> zmq.Socket:
        """The socket to use now (connecting a new one after a reset); ServerClosedError once closed."""
        if self._ctx is None:
            raise ServerClosedError(f"the {self.name} is closed")
        if self._interrupted.is_set():
            raise Interrupted(f"the {self.name} was interrupted")
        return self._sock if self._sock is not None else self._connect()

    def reset(self) -> None:
        """Drop the socket (and every reply still due on it); the next call connects a new one."""
        with self._lock:
            self._close_socket()

    def next_request_id(self) -> int:
        """A fresh non-zero request id."""
        return next(self._ids) & _U64 or 1

    def interrupt(self) -> None:
        """From any thread: the call in progress and every later one raise Interrupted (it stays so)."""
        self._interrupted.set()

    # ------------------------------------------------------------------------------------------ waiting

    def _wait(self, sock: zmq.Socket, event: int, deadline: float) -> bool:
        """Poll ``sock`` for ``event`` until ``deadline``; Interrupted (socket reset) if interrupted meanwhile."""
        while True:
            if self._interrupted.is_set():
                self.reset()
                raise Interrupted(f"the {self.name} was interrupted")
            remaining = deadline - time.monotonic()
            if remaining <= 0:  # what is already there still counts (several replies collected in turn)
                return bool(sock.poll(0, event))
            if sock.poll(max(1, int(min(remaining, POLL_SLICE_S) * 1000 + 0.999)), event):
                return True
            self._check_handshakes()

    def send(self, frames: list[Any], timeout: float, what: str) -> None:
        """Send one request without waiting for its reply. DEALER blocks only while no peer is connected: wait
        up to ``timeout`` seconds for one, else reset and raise the timeout error."""
        with self._lock:
            sock = self._socket()
            try:
                sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                if not self._wait(sock, zmq.POLLOUT, time.monotonic() + timeout):
                    hint = self._handshake_hint()
                    self.reset()
                    raise self._timeout_error(
                        f"{what} to {self.endpoint}: could not send within {timeout:.3f}s ({self._peer} "
                        f"unreachable?){hint}"
                    ) from None
                sock.send_multipart(frames, copy=False)

    def receive(self, timeout: float) -> list[zmq.Frame] | None:
        """The next message that arrives within ``timeout`` seconds (0: only one already there), else None."""
        with self._lock:
            sock = self._socket()
            if timeout > 0 and not self._wait(sock, zmq.POLLIN, time.monotonic() + timeout):
                return None
            try:
                return sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return None

    def request(
        self, build: Callable[[int], list[Any]], timeout: float, what: str, late_hint: str = ""
    ) -> tuple[int, list[zmq.Frame]]:
        """Send ``build(request_id)`` and wait up to ``timeout`` seconds for the reply with that request id;
        returns ``(request_id, reply frames)``. On timeout the socket is reset and the timeout error raised
        (its message ends with ``late_hint``, if given)."""
        with self._lock:
            rid = self.next_request_id()
            frames = build(rid)
            deadline = time.monotonic() + timeout
            self.send(frames, timeout, what)
            return rid, self.wait_reply(rid, deadline, what, late_hint, timeout)

    def wait_reply(
        self, rid: int, deadline: float, what: str, late_hint: str = "", timeout: float | None = None
    ) -> list[zmq.Frame]:
        """The reply to request ``rid`` (sent with :meth:`send`), waiting until ``deadline`` (time.monotonic);
        replies with other ids are discarded. On timeout the socket is reset and the timeout error raised. With
        it a caller can send requests over several transports first and then collect their replies, so the
        waits overlap (:class:`~apexrl.replay.client.sharded.ShardedReplayClient`)."""
        with self._lock:
            sock = self._socket()
            while True:
                if not self._wait(sock, zmq.POLLIN, deadline):
                    hint = self._handshake_hint()
                    self.reset()
                    within = f" within {timeout:.3f}s" if timeout is not None else " in time"
                    raise self._timeout_error(f"{what} to {self.endpoint}: no reply{within}{late_hint}{hint}")
                reply = sock.recv_multipart(copy=False)
                if peek_ids(memoryview(reply[0].buffer))[1] == rid:
                    return reply
                # a late reply to an earlier request, or not an apexrl header: discard

    def try_send(self, frames: list[Any]) -> bool:
        """Queue one request without waiting at all and without a reset when it cannot be: True if it was
        queued (for probing a peer that may be down while the socket keeps reconnecting in the background)."""
        with self._lock:
            try:
                self._socket().send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
                return True
            except zmq.Again:
                return False

    # ------------------------------------------------------------------------------------------ lifetime

    def close(self) -> None:
        """Close the socket and context (idempotent)."""
        with self._lock:
            self._close_socket()
            if self._ctx is not None:
                self._ctx.term()
                self._ctx = None

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def __enter__(self) -> Transport:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() explicitly
        try:
            if self._ctx is not None:
                self.close()
        except Exception:  # noqa: BLE001 - __del__ must not raise
            pass


class TransportClient:
    """Base of the clients that own a :class:`Transport` (``self.transport``): closing and ``with``."""

    transport: Transport

    def close(self) -> None:
        """Close the socket and context (idempotent)."""
        self.transport.close()

    @property
    def closed(self) -> bool:
        return self.transport.closed

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
