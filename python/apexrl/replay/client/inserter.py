"""PipelinedInserter: an actor's inserts that do not wait for their reply.

Written against :class:`~apexrl.replay.client.api.PipelinedReplay`; over a plain :class:`~apexrl.replay.client.api.Replay`
each insert is one synchronous call (acknowledged at once). See that module for why it takes a factory.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np

from apexrl.errors import (
    ApexRLError,
    Interrupted,
    ReplayTimeout,
    ServerClosedError,
    ServerShuttingDownError,
    ServerTimeoutError,
)
from apexrl.replay.client.api import PipelinedReplay, ReplayFactory, close_replay
from apexrl.replay.client.updater import _ClosingContext
from apexrl.replay.wire import protocol as P

__all__ = ["InsertTooLargeError", "PipelinedInserter"]


class InsertTooLargeError(ApexRLError, ValueError):
    """An INSERT over the server's announced request limit, refused before sending: libzmq would drop the
    connection, and the call would only time out."""


@dataclass
class _Held:
    """A batch the inserter keeps until the server stored it (``resend=True``): what it resends, with the insert
    id of its first attempt."""

    insert_id: tuple[int, int]
    priorities: Any
    data: Any
    offsets: Any
    chunks: P.FrameChunks | None
    items: int
    sent: bool = False  # sent at least once: a later send is a resend


def _resendable(exc: BaseException) -> bool:
    """Whether a failed attempt is worth repeating with the same insert id: the rate limiter (or a repeat of an id
    still being served) held it past its wait (TIMEOUT), the server is shutting down, or no answer came."""
    return isinstance(exc, (ReplayTimeout, ServerShuttingDownError))


class PipelinedInserter(_ClosingContext):
    """Inserts that do not wait for their reply, for actors: ``insert()`` sends and returns while up to
    ``max_in_flight`` requests are unanswered, and blocks only when that many are.

    ``connect()`` is called once, here, for the Replay this inserter sends through (its own connection: the
    replies it waits for must not reach another caller's calls).

    Nothing is lost silently:

    * Every reply is received and matched to its request (by request id): ``stats()`` counts the requests
      and items ``submitted``, ``acked`` (stored; keys returned) and ``failed``, and ``in_flight``.
    * An error reply (TOO_LARGE, INVALID_ARGUMENT, a rate-limiter TIMEOUT, SHUTTING_DOWN, ...) is counted in
      ``failed`` and raised by the next ``insert()``, ``flush()`` or ``close()`` (the first error pending;
      all are counted). Whenever ``insert()`` raises, its own batch was **not** sent.
    * A request unanswered ``client_timeout`` seconds after it was sent (plus its server-side ``timeout``)
      expires: all requests then in flight are counted ``failed`` -- they may or may not have been stored --
      a :class:`~apexrl.errors.ReplayTimeout` saying how many is raised as above, and the connection is
      replaced (a restarted server is reached by the next insert).
    * A batch over the server's announced request limit (``_insert_limit()`` of the Replay, from its HELLO)
      is split into parts that fit, each its own request (``split_requests`` counts the extra ones); an
      item too big to fit alone raises :class:`InsertTooLargeError` and nothing of the batch is sent.
    * ``flush()`` waits until every request sent so far was answered or expired, then raises the first
      pending error; ``close()`` (and leaving the ``with`` block) flushes, closes the Replay and raises it.

    Arguments are validated in the caller (ValueError from ``insert`` itself, nothing sent). Not
    thread-safe: use one inserter per thread (an actor loop). Replies are read while ``insert``/``flush``
    run; ``on_ack(keys, seconds)`` is then called with each acknowledged request's keys (u64 view of the
    reply, copy to keep; None over a plain Replay that returns none) and its round-trip time.

    ``resend=True`` (what an actor uses) keeps every batch until the server stored it, and resends it with the
    insert id of its first attempt, so that it is stored exactly once (the server answers a repeated id with
    the first attempt's keys and stores nothing):

    * A batch is held from ``insert()`` until its OK reply: at most ``max_in_flight`` batches are held, in
      flight or waiting to be resent (``insert()`` blocks while that many are; ``held_items``); each batch is
      one request (not split: InsertTooLargeError, as :meth:`ReplayClient.insert`, raised by a later call).
    * A held batch is resent after a TIMEOUT reply (the rate limiter held it past ``timeout``), a
      SHUTTING_DOWN reply, no reply within the expiry (then every request in flight is resent, on a new
      connection), or a send or HELLO that timed out. ``on_retry(error, requests)`` is called, in the
      caller's thread from ``insert()`` / ``flush()``, once per kind of such failure seen (TIMEOUT replies;
      lost connections), with the first error and how many attempts it covers, before anything is resent:
      it may wait (back-off) and may raise to stop resending, and what it raises propagates with every batch
      still held (``held_items``; :meth:`discard` drops them). ``counters()`` adds ``resent``.
    * Other error replies (INVALID_ARGUMENT, TOO_LARGE, ...) are not resent: counted ``failed`` and raised
      later, as without ``resend``. Interrupted propagates from the call it interrupts (batches stay held).
    * ``insert()`` raises only before it took its batch: when it returns the batch is held (and sent, or
      queued for resending after a failure the next call reports).
    """

    def __init__(
        self,
        connect: ReplayFactory,
        max_in_flight: int = 8,
        *,
        timeout: float | None = None,
        on_ack: Callable[[np.ndarray, float], Any] | None = None,
        client_timeout: float = 10.0,
        resend: bool = False,
        on_retry: Callable[[BaseException, int], Any] | None = None,
    ):
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an integer >= 1, got {max_in_flight!r}")
        wait_s, _timeout_ms = P.server_wait(timeout)
        if on_ack is not None and not callable(on_ack):
            raise TypeError("on_ack must be callable or None")
        if on_retry is not None and not callable(on_retry):
            raise TypeError("on_retry must be callable or None")
        self.resend = bool(resend)
        self._on_retry = on_retry
        self._held: dict[int, _Held] = {}  # resend: request id -> its batch, for the requests in flight
        self._queue: deque[_Held] = deque()  # resend: held batches not in flight (to be sent or resent)
        self._retries: list[BaseException] = []  # resend: failed attempts not yet reported to on_retry
        self.max_in_flight = max_in_flight
        self._timeout = timeout
        self._on_ack = on_ack
        self._expiry = client_timeout + wait_s  # seconds after sending that a request expires
        self._in_flight: dict[int, tuple[int, float]] = {}  # request id -> (items, sent at); in send order
        self._errors: list[BaseException] = []
        self._counts = {
            "submitted": 0,
            "submitted_items": 0,
            "acked": 0,
            "acked_items": 0,
            "failed": 0,
            "failed_items": 0,
            "split_requests": 0,
            "resent": 0,
        }
        self._closed = False
        self._replay = connect()
        self.endpoint = getattr(self._replay, "endpoint", None)
        # The same object, typed for the pipelined calls; None over a plain Replay (one insert at a time).
        self._pipe: PipelinedReplay | None = self._replay if isinstance(self._replay, PipelinedReplay) else None
        self._pipelined = self._pipe is not None
        self._next_id: Callable[[], tuple[int, int]] | None = getattr(self._replay, "next_insert_id", None)
        if self.resend and self._next_id is None:
            close_replay(self._replay)
            raise TypeError("resend=True needs a replay with next_insert_id() (insert ids)")

    # ------------------------------------------------------------------------------------------ replies

    def _on_reply(self, rid: int, result: Any, now: float) -> None:
        entry = self._in_flight.pop(rid, None)
        if entry is None:
            return  # a late reply to a request that already expired: it was counted failed then
        n, sent = entry
        held = self._held.pop(rid, None)
        if isinstance(result, BaseException):
            if held is not None and _resendable(result):
                self._queue.append(held)
                self._retries.append(result)
            else:
                self._fail(n, result)
        else:
            self._ack(n, result, now - sent)

    def _ack(self, n: int, keys: np.ndarray, seconds: float) -> None:
        self._counts["acked"] += 1
        self._counts["acked_items"] += n
        if self._on_ack is not None:
            self._on_ack(keys, seconds)

    def _fail(self, n: int, error: BaseException) -> None:
        self._counts["failed"] += 1
        self._counts["failed_items"] += n
        self._errors.append(error)

    def _drain(self) -> None:
        """Handle every reply already received, without waiting."""
        while self._in_flight:
            assert self._pipe is not None  # requests are in flight only in pipelined mode
            got = self._pipe._receive_insert(0)
            if got is None:
                return
            self._on_reply(*got, time.monotonic())

    def _wait_one(self, until: float | None = None) -> bool:
        """Wait for a reply until the oldest request expires (or ``until``, if sooner); handle what arrived.

        Returns False only when ``until`` passed first. Expiry fails every request in flight.
        """
        _n, oldest = next(iter(self._in_flight.values()))
        expires = oldest + self._expiry
        end = expires if until is None else min(until, expires)
        remaining = end - time.monotonic()
        if remaining > 0:
            assert self._pipe is not None  # requests are in flight only in pipelined mode
            got = self._pipe._receive_insert(remaining)
            if got is not None:
                self._on_reply(*got, time.monotonic())
                self._drain()
                return True
        if until is not None and until < expires:
            return False
        if time.monotonic() >= expires:
            self._expire()
        return True

    def _expire(self) -> None:
        k = len(self._in_flight)
        items = sum(n for n, _t in self._in_flight.values())
        rids = list(self._in_flight)
        self._in_flight.clear()
        assert self._pipe is not None  # requests are in flight only in pipelined mode
        unanswered = getattr(self._pipe, "_insert_unanswered", None)
        if self.resend and unanswered is not None:  # a set of servers: the oldest one's server is lost
            unanswered(rids[0])
        self._pipe._forget_inserts()  # late replies can no longer arrive; a restarted server is reached anew
        error = ReplayTimeout(
            f"INSERT to {self.endpoint}: {k} request(s) ({items} items) unanswered {self._expiry:.3f}s after "
            "sending; they may or may not have been stored"
        )
        if self.resend:  # every one is resent (in send order, before those already waiting) with its own id
            self._queue.extendleft(reversed([self._held.pop(rid) for rid in rids]))
            self._retries.extend([error] * k)
            return
        self._counts["failed"] += k
        self._counts["failed_items"] += items
        self._errors.append(error)

    def _raise_pending(self) -> None:
        self._report_retries()
        if self._errors:
            exc = self._errors[0]
            self._errors.clear()
            raise exc

    def _report_retries(self) -> None:
        """resend: report the failed attempts to on_retry (which may wait, or raise to stop) before any resend."""
        if self._retries:
            retries, self._retries = self._retries, []
            limited = [e for e in retries if isinstance(e, ServerTimeoutError)]
            lost = [e for e in retries if not isinstance(e, ServerTimeoutError)]
            if self._on_retry is not None:
                for group in (limited, lost):
                    if group:
                        self._on_retry(group[0], len(group))

    # --------------------------------------------------------------------------------------------- API

    def insert(
        self,
        priorities: Any,
        items: Sequence[Any] | None = None,
        *,
        data: Any = None,
        offsets: Any = None,
        chunks: P.FrameChunks | None = None,
    ) -> None:
        """Send one insert (a list of bytes-like ``items``, or ``data`` + ``offsets``) without waiting for its
        reply; blocks while ``max_in_flight`` requests are unanswered. Raises ValueError for bad arguments,
        ServerClosedError once closed, and any pending failure of an earlier request (then this batch was
        not sent). ``chunks``: the frame chunks the items reference; such a batch is sent whole (chunks never
        span two inserts), InsertTooLargeError when it is over the server's limit."""
        if items is not None:
            if data is not None or offsets is not None:
                raise ValueError("pass either items or data and offsets, not both")
            data, offsets = P.pack_items(items)
        elif data is None or offsets is None:
            raise ValueError("pass items, or both data and offsets")
        if self._closed:
            raise ServerClosedError("the pipelined inserter is closed")
        if self.resend:
            self._insert_held(priorities, data, offsets, chunks)
            return
        if self._pipe is None:
            self._insert_now(priorities, data, offsets, chunks)
            return
        replay = self._pipe
        if chunks is not None:
            messages = [replay._prepare_insert(priorities, data, offsets, timeout=self._timeout, chunks=chunks)]
        else:
            messages = [
                replay._prepare_insert(p, d, o, timeout=self._timeout)  # validates every part first
                for p, d, o in self._split(priorities, data, offsets)
            ]
        for i, message in enumerate(messages):
            self._drain()
            self._raise_pending()
            while len(self._in_flight) >= self.max_in_flight:
                self._wait_one()
                self._raise_pending()
            try:
                rid, n = replay._send_insert(message)
            except ReplayTimeout as exc:
                if self._in_flight:
                    self._expire()
                what = (
                    "this batch was not sent"
                    if i == 0
                    else f"parts {i + 1}-{len(messages)} of this batch were not sent"
                )
                raise ReplayTimeout(f"{exc}; {what}") from None
            self._in_flight[rid] = (n, time.monotonic())
            self._counts["submitted"] += 1
            self._counts["submitted_items"] += n
            if i:
                self._counts["split_requests"] += 1

    # ------------------------------------------------------------------------------------------ resend

    def _insert_held(self, priorities: Any, data: Any, offsets: Any, chunks: P.FrameChunks | None) -> None:
        """``insert`` with ``resend``: validate, make room (at most max_in_flight held), then hold and send."""
        n = len(P.encode_insert(0, priorities, data, offsets, chunks=chunks)[1])  # validates; nothing sent
        if self._pipe is None:
            self._insert_now_held(priorities, data, offsets, chunks, n)
            return
        self._drain()
        self._raise_pending()
        while len(self._in_flight) + len(self._queue) >= self.max_in_flight:
            self._progress()
            self._raise_pending()
        assert self._next_id is not None  # checked in __init__
        self._queue.append(_Held(self._next_id(), priorities, data, offsets, chunks, n))
        self._counts["submitted"] += 1
        self._counts["submitted_items"] += n
        self._send_queued()  # never raises: what went wrong is reported by the next call

    def _progress(self) -> None:
        """Send what waits to be (re)sent, else wait for one reply (or the oldest request's expiry)."""
        if self._queue:
            self._send_queued()
        elif self._in_flight:
            self._wait_one()

    def _send_queued(self) -> None:
        """Send the held batches not in flight, oldest first, each with its own insert id. Never raises: a lost
        connection (every request in flight then goes back to the queue) is kept for on_retry, any other error
        for the next call to raise (a batch refused before sending, e.g. too large, is dropped and counted
        failed; an Interrupted keeps it held)."""
        assert self._pipe is not None
        replay = self._pipe
        while self._queue:
            held = self._queue[0]
            try:
                message = replay._prepare_insert(
                    held.priorities,
                    held.data,
                    held.offsets,
                    timeout=self._timeout,
                    insert_id=held.insert_id,
                    chunks=held.chunks,
                )
                rid, n = replay._send_insert(message)
            except Interrupted as exc:
                self._errors.append(exc)
                return
            except Exception as exc:  # noqa: BLE001 - kept: reported by the next call
                if not _resendable(exc):
                    self._queue.popleft()
                    self._fail(held.items, exc)
                    continue
                if self._in_flight:  # the connection was replaced: their replies can no longer come
                    self._expire()
                self._retries.append(exc)
                return
            self._queue.popleft()
            if held.sent:
                self._counts["resent"] += 1
            held.sent = True
            self._held[rid] = held
            self._in_flight[rid] = (n, time.monotonic())

    def _insert_now_held(self, priorities: Any, data: Any, offsets: Any, chunks: P.FrameChunks | None, n: int) -> None:
        """A plain Replay with ``resend``: one synchronous insert, repeated with its insert id until stored."""
        self._raise_pending()
        assert self._next_id is not None
        insert_id = self._next_id()
        self._counts["submitted"] += 1
        self._counts["submitted_items"] += n
        attempts = 0
        while True:
            t0 = time.monotonic()
            try:
                keys = self._replay.insert(
                    priorities, data=data, offsets=offsets, timeout=self._timeout, insert_id=insert_id, chunks=chunks
                )
            except Exception as exc:
                if not _resendable(exc):
                    self._counts["failed"] += 1
                    self._counts["failed_items"] += n
                    raise
                if attempts:
                    self._counts["resent"] += 1
                attempts += 1
                self._retries.append(exc)
                try:
                    self._raise_pending()
                except BaseException:
                    self._counts["failed"] += 1
                    self._counts["failed_items"] += n
                    raise
                continue
            if attempts:
                self._counts["resent"] += 1
            self._ack(n, keys, time.monotonic() - t0)
            return

    @property
    def held_items(self) -> int:
        """Items of the batches held (``resend``): in flight, or waiting to be resent."""
        return sum(n for n, _t in self._in_flight.values()) + sum(h.items for h in self._queue)

    def discard(self) -> int:
        """Drop every batch held or in flight (their replies are no longer awaited) -> their items. For a caller
        that gives up (an actor stopping); the batches may or may not have been stored."""
        items = self.held_items
        if self._in_flight and self._pipe is not None:
            self._pipe._forget_inserts()
        self._in_flight.clear()
        self._held.clear()
        self._queue.clear()
        self._retries.clear()
        return items

    def _split(self, priorities: Any, data: Any, offsets: Any) -> list[tuple[Any, Any, Any]]:
        """The batch as parts that each fit the server's announced request limit (``_insert_limit()``, when the
        Replay has one): one part when it fits; InsertTooLargeError (nothing sent) for an item that cannot fit
        alone."""
        limit_of = getattr(self._replay, "_insert_limit", None)
        if limit_of is None:
            return [(priorities, data, offsets)]
        frames = P.encode_insert(0, priorities, data, offsets)  # validated views
        prio, offs, view = cast(np.ndarray, frames[1]), cast(np.ndarray, frames[2]), cast(np.ndarray, frames[3])
        n = offs.shape[0] - 1
        if n < 1 or P.insert_message_bytes(n, int(offs[-1])) <= (limit := limit_of()):
            return [(priorities, data, offsets)]
        # Bytes of items [0, i) plus their priority, offset and (empty) item_chunk_offsets entries; a part
        # [lo, hi) costs cost[hi] - cost[lo] + the fixed part of a message.
        cost = offs.astype(np.int64) + 24 * np.arange(n + 1, dtype=np.int64)
        fixed = P.insert_message_bytes(0, 0)
        parts, lo = [], 0
        while lo < n:
            hi = int(np.searchsorted(cost, cost[lo] + limit - fixed, side="right")) - 1
            if hi <= lo:
                size = int(offs[lo + 1] - offs[lo])
                raise InsertTooLargeError(
                    f"item {lo} of the batch is {size} bytes: an INSERT of it alone would be "
                    f"{P.insert_message_bytes(1, size)} bytes, over the server's limit of {limit} bytes "
                    "(its --max-message-mb); nothing was sent"
                )
            start, end = int(offs[lo]), int(offs[hi])
            parts.append((prio[lo:hi], view[start:end], offs[lo : hi + 1] - offs[lo]))
            lo = hi
        return parts

    def _insert_now(self, priorities: Any, data: Any, offsets: Any, chunks: P.FrameChunks | None = None) -> None:
        """A plain Replay: one synchronous insert, counted like a pipelined one."""
        self._raise_pending()
        n = len(P.encode_insert(0, priorities, data, offsets, chunks=chunks)[1])  # validates
        self._counts["submitted"] += 1
        self._counts["submitted_items"] += n
        t0 = time.monotonic()
        try:
            keys = self._replay.insert(
                priorities,
                data=data,
                offsets=offsets,
                timeout=self._timeout,
                **({"chunks": chunks} if chunks is not None else {}),  # type: ignore[arg-type]  # only with chunks
            )
        except Exception as exc:  # noqa: BLE001 - counted, raised by the next call as in pipelined mode
            self._fail(n, exc)
            return
        self._ack(n, keys, time.monotonic() - t0)

    __call__ = insert

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every request sent so far was answered (or expired), then raise the first pending
        error, if any. ReplayTimeout if requests are still in flight after ``timeout`` seconds (they stay in
        flight and are still counted when their replies arrive). With ``resend``: until every batch held was
        stored (resending as needed; on_retry may raise to stop)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._in_flight:
            self._drain()
        self._report_retries()
        while self._in_flight or self._queue:
            if self._queue:  # resend: held batches to (re)send first
                self._send_queued()
                self._raise_pending()
                if deadline is not None and time.monotonic() >= deadline and self._queue:
                    raise ReplayTimeout(
                        f"{self.held_items} items held for {self.endpoint} still not stored after {timeout}s"
                    )
                continue
            if not self._wait_one(deadline):
                self._raise_pending()
                raise ReplayTimeout(
                    f"{len(self._in_flight)} insert request(s) to {self.endpoint} still unanswered after {timeout}s"
                )
        self._raise_pending()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def counters(self) -> dict[str, int]:
        """submitted / acked / failed requests (and ``*_items``), ``in_flight``."""
        return dict(self._counts, in_flight=len(self._in_flight))

    def stats(self) -> dict[str, int]:
        """Alias of :meth:`counters`, kept for the scripts written against it (local: no request is sent)."""
        return self.counters()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush (every request answered or expired), close the Replay, then raise the first pending error.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            close_replay(self._replay)
