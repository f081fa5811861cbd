"""The apexrl replay client: a blocking request/reply client over a ZeroMQ DEALER socket.

* Every request carries a fresh request id; a reply with another id (a late answer to an earlier request
  that timed out) is discarded.
* A reply not received within ``timeout`` seconds raises :class:`~apexrl.errors.ReplayTimeout`, and the
  client closes its socket and opens a new one: stale replies can never confuse a later call, and a server
  that was restarted (same endpoint) is reached again by the next call.
* Error replies raise :class:`~apexrl.errors.ServerError` carrying the server's status and message; TIMEOUT
  raises :class:`ServerTimeoutError` (a ServerError *and* a ReplayTimeout) and SHUTTING_DOWN raises
  :class:`ServerShuttingDownError` (a ServerError *and* a ServerClosedError).

Thread-safety: a client serialises its calls with a lock, so sharing one between threads is safe but the
calls then run one at a time. For throughput use one client per thread (each has its own socket).
"""

from __future__ import annotations

import itertools
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from apexrl import protocol as P
from apexrl.errors import ProtocolError, ReplayTimeout, ServerClosedError, ServerError

__all__ = ["ReplayClient", "SampledBatch", "ServerShuttingDownError", "ServerTimeoutError"]


class ServerTimeoutError(ServerError, ReplayTimeout):
    """The server answered TIMEOUT (e.g. the store stayed below min_size_to_sample for timeout_ms)."""


class ServerShuttingDownError(ServerError, ServerClosedError):
    """The server answered SHUTTING_DOWN."""


@dataclass
class SampledBatch:
    """A sampled batch; arrays are read-only views of the received frames (copy before mutating)."""

    keys: np.ndarray  # u64[n]
    weights: np.ndarray  # f32[n], importance-sampling weights normalised by the max
    probabilities: np.ndarray  # f64[n]
    data: memoryview  # the items concatenated
    offsets: np.ndarray  # u64[n+1]; item i is data[offsets[i]:offsets[i+1]]

    @property
    def items(self) -> list[memoryview]:
        return P.split_items(self.offsets, self.data)

    def __len__(self) -> int:
        return int(self.keys.shape[0])


class ReplayClient:
    """Client of an apexrl replay server at ``endpoint`` (e.g. ``tcp://127.0.0.1:5555``).

    ``timeout`` (seconds) bounds the wait for each reply (for ``sample`` it is added to the server-side wait).
    """

    def __init__(self, endpoint: str, timeout: float = 10.0):
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        self.endpoint = endpoint
        self.timeout = float(timeout)
        self._lock = threading.Lock()
        self._ctx: zmq.Context | None = zmq.Context()
        self._sock: zmq.Socket | None = None
        # Random start: request ids from a previous client process on the same server never collide.
        self._ids = itertools.count(random.randrange(1, 1 << 62))
        self._connect()

    # ------------------------------------------------------------------------------------------ socket

    def _connect(self) -> None:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        sock.connect(self.endpoint)
        self._sock = sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self._connect()

    def close(self) -> None:
        """Close the socket and context (idempotent)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close(linger=0)
                self._sock = None
            if self._ctx is not None:
                self._ctx.term()
                self._ctx = None

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def __enter__(self) -> ReplayClient:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() explicitly
        try:
            if self._ctx is not None:
                self.close()
        except Exception:
            pass

    # ------------------------------------------------------------------------------------------ calls

    def _call(self, op: P.Op, build: Any, wait: float) -> P.Reply:
        """Send build(request_id) and wait up to ``wait`` seconds for the matching reply."""
        with self._lock:
            if self._ctx is None:
                raise ServerClosedError("the replay client is closed")
            if self._sock is None:
                self._connect()
            sock = self._sock
            assert sock is not None
            rid = next(self._ids) & 0xFFFF_FFFF_FFFF_FFFF or 1
            frames = build(rid)
            deadline = time.monotonic() + wait
            try:
                sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                # DEALER blocks only when no peer is connected yet: wait for one within the deadline.
                if not sock.poll(max(1, int(wait * 1000)), zmq.POLLOUT):
                    self._reset()
                    raise ReplayTimeout(
                        f"{op.name} to {self.endpoint}: could not send within {wait:.3f}s (server unreachable?)"
                    ) from None
                sock.send_multipart(frames, copy=False)
            while True:
                remaining = deadline - time.monotonic()
                if remaining <= 0 or not sock.poll(max(1, int(remaining * 1000)), zmq.POLLIN):
                    self._reset()
                    raise ReplayTimeout(f"{op.name} to {self.endpoint}: no reply within {wait:.3f}s")
                reply_frames = sock.recv_multipart(copy=False)
                try:
                    header = P.Header.unpack(reply_frames[0])
                except ProtocolError:
                    continue  # not a reply to us (or garbage): ignore
                if header.request_id != rid:
                    continue  # a late reply to an earlier request: discard
                try:
                    reply = P.decode_reply(reply_frames, op, rid)
                except ProtocolError:
                    self._reset()
                    raise
                break
        if not reply.ok:
            _raise_error(reply)
        return reply

    def insert(
        self,
        priorities: Any,
        items: Sequence[Any] | None = None,
        *,
        data: Any = None,
        offsets: Any = None,
    ) -> np.ndarray:
        """Insert items (a list of bytes-like, or ``data`` + ``offsets``) with their priorities -> keys u64[n]."""
        if items is not None:
            if data is not None or offsets is not None:
                raise ValueError("pass either items or data and offsets, not both")
            data, offsets = P.pack_items(items)
        elif data is None or offsets is None:
            raise ValueError("pass items, or both data and offsets")
        P.encode_insert(0, priorities, data, offsets)  # validate before touching the socket
        reply = self._call(P.Op.INSERT, lambda rid: P.encode_insert(rid, priorities, data, offsets), self.timeout)
        return reply.arrays["keys"]

    def sample(self, n: int, beta: float = 0.4, timeout: float | None = None) -> SampledBatch:
        """Sample n items with IS exponent beta.

        ``timeout``: seconds the server may wait for the store to reach its min_size_to_sample; None (default)
        answers at once. Raises ServerTimeoutError (a ReplayTimeout) when the store is still too small.
        """
        wait_s = 0.0 if timeout is None else float(timeout)
        if not wait_s >= 0:
            raise ValueError(f"timeout must be >= 0, got {timeout}")
        timeout_ms = min(int(round(wait_s * 1000)), 0xFFFF_FFFF)
        P.encode_sample(0, n, beta, timeout_ms)
        reply = self._call(
            P.Op.SAMPLE, lambda rid: P.encode_sample(rid, n, beta, timeout_ms), self.timeout + wait_s
        )
        a = reply.arrays
        return SampledBatch(a["keys"], a["weights"], a["probabilities"], a["data"], a["offsets"])

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set new priorities; returns how many keys were still present (evicted keys are skipped)."""
        P.encode_update(0, keys, priorities)
        reply = self._call(
            P.Op.UPDATE_PRIORITIES, lambda rid: P.encode_update(rid, keys, priorities), self.timeout
        )
        return int(reply.header.count)

    def remove_to_fit(self) -> int:
        """Evict down to capacity with the server's policy; returns the number removed."""
        return int(self._call(P.Op.REMOVE_TO_FIT, P.encode_remove_to_fit, self.timeout).header.count)

    def stats(self) -> dict[str, int | float]:
        """The store's stats plus the server's per-op request/error counters and min_size_to_sample."""
        reply = self._call(P.Op.STATS, P.encode_stats, self.timeout)
        assert reply.stats is not None
        return reply.stats


def _raise_error(reply: P.Reply) -> None:
    status, message = reply.status, reply.message or ""
    if status == P.Status.TIMEOUT:
        raise ServerTimeoutError(status, message)
    if status == P.Status.SHUTTING_DOWN:
        raise ServerShuttingDownError(status, message)
    raise ServerError(status, message)
