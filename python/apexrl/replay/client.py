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

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import zmq

from apexrl.errors import ProtocolError, ReplayTimeout, ServerClosedError, ServerError
from apexrl.replay import protocol as P
from apexrl.replay.transport import DealerClient

__all__ = [
    "AsyncUpdater",
    "LearnerBatch",
    "PipelinedInserter",
    "PrefetchingSampler",
    "ReplayClient",
    "SampledBatch",
    "ServerShuttingDownError",
    "ServerTimeoutError",
]


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


def _server_wait(timeout: float | None) -> tuple[float, int]:
    """A call's server-side wait: ``(seconds, timeout_ms for the header)``; None means answer at once."""
    wait_s = 0.0 if timeout is None else float(timeout)
    if not wait_s >= 0:
        raise ValueError(f"timeout must be >= 0, got {timeout}")
    return wait_s, min(int(round(wait_s * 1000)), 0xFFFF_FFFF)


class ReplayClient(DealerClient):
    """Client of an apexrl replay server at ``endpoint`` (e.g. ``tcp://127.0.0.1:5555``).

    ``timeout`` (seconds) bounds the wait for each reply (for ``sample`` it is added to the server-side wait).
    """

    def __init__(self, endpoint: str, timeout: float = 10.0):
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        super().__init__(endpoint)
        self.timeout = float(timeout)

    # ------------------------------------------------------------------------------------------ calls

    def _call(self, op: P.Op, build: Any, wait: float, cancel: threading.Event | None = None) -> P.Reply:
        """Send build(request_id) and wait up to ``wait`` seconds for the matching reply.

        With ``cancel`` (the background threads of PrefetchingSampler / AsyncUpdater), the wait polls in
        short slices and raises :class:`_Cancelled` once the event is set, so their ``close()`` is prompt
        even while a request waits on an unreachable server (the socket is reset when cancelled).
        """
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

            def wait_for(event: int) -> bool:
                while True:
                    if cancel is not None and cancel.is_set():
                        self._reset()
                        raise _Cancelled()
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        return False
                    slice_ms = int(remaining * 1000)
                    if cancel is not None:
                        slice_ms = min(_CANCEL_POLL_MS, slice_ms)
                    if sock.poll(max(1, slice_ms), event):
                        return True

            try:
                sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                # DEALER blocks only when no peer is connected yet: wait for one within the deadline.
                if not wait_for(zmq.POLLOUT):
                    self._reset()
                    raise ReplayTimeout(
                        f"{op.name} to {self.endpoint}: could not send within {wait:.3f}s (server unreachable?)"
                    ) from None
                sock.send_multipart(frames, copy=False)
            while True:
                if not wait_for(zmq.POLLIN):
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
        timeout: float | None = None,
    ) -> np.ndarray:
        """Insert items (a list of bytes-like, or ``data`` + ``offsets``) with their priorities -> keys u64[n].

        ``timeout``: seconds the server may hold the insert while its rate limiter (samples_per_insert) says
        the inserters are too far ahead; None (default) answers at once. Raises ServerTimeoutError (a
        ReplayTimeout) when the samplers did not catch up in time.
        """
        if items is not None:
            if data is not None or offsets is not None:
                raise ValueError("pass either items or data and offsets, not both")
            data, offsets = P.pack_items(items)
        elif data is None or offsets is None:
            raise ValueError("pass items, or both data and offsets")
        wait_s, timeout_ms = _server_wait(timeout)
        frames = P.encode_insert(0, priorities, data, offsets, timeout_ms)  # validate before touching the socket
        reply = self._call(P.Op.INSERT, lambda rid: P.with_request_id(frames, rid), self.timeout + wait_s)
        return reply.arrays["keys"]

    def sample(self, n: int, beta: float = 0.4, timeout: float | None = None) -> SampledBatch:
        """Sample n items with IS exponent beta.

        ``timeout``: seconds the server may wait for the store to reach its min_size_to_sample; None (default)
        answers at once. Raises ServerTimeoutError (a ReplayTimeout) when the store is still too small.
        """
        wait_s, timeout_ms = _server_wait(timeout)
        P.encode_sample(0, n, beta, timeout_ms)
        reply = self._call(
            P.Op.SAMPLE, lambda rid: P.encode_sample(rid, n, beta, timeout_ms), self.timeout + wait_s
        )
        a = reply.arrays
        return SampledBatch(a["keys"], a["weights"], a["probabilities"], a["data"], a["offsets"])

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """Set new priorities; returns how many keys were still present (evicted keys are skipped)."""
        frames = P.encode_update(0, keys, priorities)  # validate before touching the socket
        reply = self._call(P.Op.UPDATE_PRIORITIES, lambda rid: P.with_request_id(frames, rid), self.timeout)
        return int(reply.header.count)

    def remove_to_fit(self) -> int:
        """Evict down to capacity with the server's policy; returns the number removed."""
        return int(self._call(P.Op.REMOVE_TO_FIT, P.encode_remove_to_fit, self.timeout).header.count)

    def stats(self) -> dict[str, int | float]:
        """The store's stats plus the server's per-op request/error counters and min_size_to_sample."""
        reply = self._call(P.Op.STATS, P.encode_stats, self.timeout)
        assert reply.stats is not None
        return reply.stats

    # ------------------------------------------------------------------------------------ learner helpers

    def sampler(
        self,
        batch_size: int,
        beta: float = 0.4,
        prefetch: int = 16,
        decode: Callable[[SampledBatch], Any] | None = None,
        timeout: float | None = None,
    ) -> PrefetchingSampler:
        """A :class:`PrefetchingSampler`: an iterator of :class:`LearnerBatch` fed by a background thread.

        The thread owns its own client (same endpoint and timeout; this client is not used) and keeps up to
        ``prefetch`` batches ready. ``decode`` (e.g. ``spec.decode_batch``) runs in that thread. ``timeout``
        is the per-request server-side wait for ``min_size_to_sample`` as in :meth:`sample`. ReplayTimeouts
        (server down or restarting, store too small) are retried until the sampler is closed; see
        :class:`PrefetchingSampler`.
        """
        return PrefetchingSampler(
            self.endpoint, batch_size, beta=beta, prefetch=prefetch, decode=decode, timeout=timeout,
            client_timeout=self.timeout,
        )

    def inserter(
        self,
        max_in_flight: int = 8,
        *,
        timeout: float | None = None,
        on_ack: Callable[[np.ndarray, float], Any] | None = None,
    ) -> PipelinedInserter:
        """A :class:`PipelinedInserter`: inserts that do not wait for their reply (for actors).

        Up to ``max_in_flight`` insert requests are outstanding at once; every reply is still received and
        counted, failures are raised by a later ``insert()`` / ``flush()`` / ``close()``. It owns its own
        socket (same endpoint and timeout); this client is not used. ``timeout`` is the server-side
        rate-limiter wait as in :meth:`insert`; ``on_ack(keys, seconds)`` is called for each acknowledged
        request with its keys and round-trip time.
        """
        return PipelinedInserter(
            self.endpoint, max_in_flight=max_in_flight, timeout=timeout, on_ack=on_ack, client_timeout=self.timeout
        )

    def updater(self, max_pending: int = 64) -> AsyncUpdater:
        """An :class:`AsyncUpdater`: non-blocking priority updates sent by a background thread.

        It owns its own client (same endpoint and timeout); this client is not used.
        """
        return AsyncUpdater(self.endpoint, max_pending=max_pending, client_timeout=self.timeout)


def _error_of(reply: P.Reply) -> ServerError:
    status, message = reply.status, reply.message or ""
    if status == P.Status.TIMEOUT:
        return ServerTimeoutError(status, message)
    if status == P.Status.SHUTTING_DOWN:
        return ServerShuttingDownError(status, message)
    return ServerError(status, message)


def _raise_error(reply: P.Reply) -> None:
    raise _error_of(reply)


# ------------------------------------------------------------------------------------------------ learner side

_CANCEL_POLL_MS = 50  # how often a background request checks for close(): bounds close() latency
_RETRY_BACKOFF_MIN = 0.02
_RETRY_BACKOFF_MAX = 0.5


class _ClosingContext:
    """``with`` calls the subclass's ``close()``; while an exception is in flight, one raised by ``close()``
    does not mask it."""

    close: Any

    def __enter__(self) -> Any:
        return self

    def __exit__(self, exc_type: Any, *exc: Any) -> None:
        if exc_type is None:
            self.close()
        else:  # don't mask the exception in flight with a background one
            try:
                self.close()
            except Exception:
                pass


class _Cancelled(Exception):
    """Raised inside a background thread when its owner was closed while a request was in flight."""


@dataclass
class LearnerBatch:
    """One prefetched batch. ``raw`` is the :class:`SampledBatch` when the sampler has no ``decode`` hook,
    else None and ``decoded`` holds what ``decode(raw)`` returned (e.g. a dict of field arrays)."""

    keys: np.ndarray  # u64[n]
    weights: np.ndarray  # f32[n]
    probabilities: np.ndarray  # f64[n]
    raw: SampledBatch | None = None
    decoded: Any = None

    def __len__(self) -> int:
        return int(self.keys.shape[0])


class PrefetchingSampler(Iterator[LearnerBatch]):
    """Keeps up to ``prefetch`` sampled batches ready for a learner, as the Ape-X learner does.

    A background thread with its **own** :class:`ReplayClient` (zmq sockets are not thread-safe) waits for
    room in a bounded queue, samples ``batch_size`` items, applies ``decode`` (if given), and queues a
    :class:`LearnerBatch`. At most ``prefetch`` batches are ever queued, and no request is sent while the
    queue is full, so at most ``prefetch`` batches exist ahead of the consumer.

    Failures:

    * :class:`~apexrl.errors.ReplayTimeout` (server down or restarting, which includes TIMEOUT replies for
      a store still below min_size_to_sample) and SHUTTING_DOWN replies are **retried until closed**, with a
      short back-off: the learner simply keeps waiting for a (re)starting server. ``retries`` counts them
      and ``last_retry_error`` keeps the latest.
    * Any other error in the background thread (a :class:`~apexrl.errors.ServerError`, an exception from
      ``decode``, ...) stops the thread and is re-raised by the consumer's next ``next()`` (queued batches
      are discarded); after that the iterator is exhausted.

    ``close()`` (or leaving the ``with`` block) stops the thread promptly -- even while it waits on the
    server or on a full queue -- joins it and closes its socket; iterating a closed sampler ends.
    """

    def __init__(
        self,
        endpoint: str,
        batch_size: int,
        *,
        beta: float = 0.4,
        prefetch: int = 16,
        decode: Callable[[SampledBatch], Any] | None = None,
        timeout: float | None = None,
        client_timeout: float = 10.0,
    ):
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {prefetch!r}")
        wait_s, self._timeout_ms = _server_wait(timeout)
        P.encode_sample(0, batch_size, beta, self._timeout_ms)  # validate here, in the caller's thread
        if decode is not None and not callable(decode):
            raise TypeError("decode must be callable or None")
        self.endpoint = endpoint
        self.batch_size = batch_size
        self.beta = float(beta)
        self.prefetch = prefetch
        self._wait_s = wait_s
        self._decode = decode
        self._cond = threading.Condition()
        self._queue: deque[LearnerBatch] = deque()
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._done = False  # the worker has finished (error, or closed)
        self._closed = False
        self.retries = 0
        self.last_retry_error: BaseException | None = None
        self.fetched = 0  # batches sampled (and decoded) by the worker
        self.max_queued = 0  # high-water mark of the queue (never above prefetch)
        # Create the client here so a bad endpoint/timeout fails in the caller; only the worker uses it.
        self._client = ReplayClient(endpoint, timeout=client_timeout)
        self._thread = threading.Thread(target=self._run, name="apexrl-sampler", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ worker

    def _run(self) -> None:
        client = self._client
        backoff = _RETRY_BACKOFF_MIN
        n, beta, timeout_ms = self.batch_size, self.beta, self._timeout_ms
        try:
            while not self._stop.is_set():
                with self._cond:  # wait for room before sampling: at most `prefetch` batches exist
                    while len(self._queue) >= self.prefetch and not self._stop.is_set():
                        self._cond.wait()
                if self._stop.is_set():
                    break
                try:
                    reply = client._call(
                        P.Op.SAMPLE,
                        lambda rid: P.encode_sample(rid, n, beta, timeout_ms),
                        client.timeout + self._wait_s,
                        self._stop,
                    )
                except (ReplayTimeout, ServerShuttingDownError) as exc:
                    self.retries += 1
                    self.last_retry_error = exc
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, _RETRY_BACKOFF_MAX)
                    continue
                backoff = _RETRY_BACKOFF_MIN
                a = reply.arrays
                raw = SampledBatch(a["keys"], a["weights"], a["probabilities"], a["data"], a["offsets"])
                if self._decode is not None:
                    item = LearnerBatch(raw.keys, raw.weights, raw.probabilities, None, self._decode(raw))
                else:
                    item = LearnerBatch(raw.keys, raw.weights, raw.probabilities, raw, None)
                with self._cond:
                    if self._stop.is_set():
                        break
                    self._queue.append(item)
                    self.fetched += 1
                    self.max_queued = max(self.max_queued, len(self._queue))
                    self._cond.notify_all()
        except _Cancelled:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            with self._cond:
                self._error = exc
        finally:
            client.close()
            with self._cond:
                self._done = True
                self._cond.notify_all()

    # ---------------------------------------------------------------------------------------- consumer

    def __iter__(self) -> PrefetchingSampler:
        return self

    def __next__(self) -> LearnerBatch:
        return self.next()

    def next(self, timeout: float | None = None) -> LearnerBatch:
        """The next batch; waits up to ``timeout`` seconds (None: forever) -> ReplayTimeout when exceeded.

        Raises the background thread's error (once), StopIteration once closed or failed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    exc, self._error = self._error, None
                    self._queue.clear()
                    self._closed = True
                    self._stop.set()
                    self._cond.notify_all()
                    raise exc
                if self._closed:
                    raise StopIteration
                if self._queue:
                    item = self._queue.popleft()
                    self._cond.notify_all()
                    return item
                if self._done:
                    raise StopIteration
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ReplayTimeout(f"no batch from {self.endpoint} within {timeout:.3f}s")
                    self._cond.wait(remaining)

    def qsize(self) -> int:
        """Batches ready now."""
        with self._cond:
            return len(self._queue)

    def stats(self) -> dict[str, int]:
        with self._cond:
            return {
                "queued": len(self._queue),
                "max_queued": self.max_queued,
                "fetched": self.fetched,
                "retries": self.retries,
            }

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop and join the background thread (it closes its socket); idempotent. Queued batches are dropped."""
        self._stop.set()
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> PrefetchingSampler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class AsyncUpdater(_ClosingContext):
    """Non-blocking priority updates: ``update()`` copies the arrays and returns; a background thread with
    its **own** :class:`ReplayClient` sends them in order.

    * At most ``max_pending`` updates are outstanding (queued or awaiting the server's answer); ``update``
      blocks only while that bound is hit.
    * Arguments are validated (and copied) in the caller: bad shapes, NaN/negative priorities raise
      ValueError from ``update`` itself, and nothing is sent.
    * A request that fails in the background (a ServerError such as TOO_LARGE or SHUTTING_DOWN, or a
      ReplayTimeout when the server is unreachable) is **not retried** -- priority updates are advisory and
      a later update of the same keys supersedes it -- but counted in ``failed`` and re-raised by the next
      ``update()`` / ``flush()`` / ``close()`` (the first pending error is raised; all were counted).
    * ``stats()``: ``submitted`` (accepted by update), ``sent`` (acknowledged OK), ``updated`` (keys the
      server still held), ``failed``, ``dropped`` (abandoned by close), ``pending``.
    """

    def __init__(self, endpoint: str, max_pending: int = 64, *, client_timeout: float = 10.0):
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an integer >= 1, got {max_pending!r}")
        self.endpoint = endpoint
        self.max_pending = max_pending
        self._cond = threading.Condition()
        self._queue: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._pending = 0
        self._errors: list[BaseException] = []
        self._stop = threading.Event()
        self._closed = False
        self._counts = {"submitted": 0, "sent": 0, "updated": 0, "failed": 0, "dropped": 0}
        self._client = ReplayClient(endpoint, timeout=client_timeout)
        self.timeout = self._client.timeout
        self._thread = threading.Thread(target=self._run, name="apexrl-updater", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        client = self._client
        try:
            while True:
                with self._cond:
                    while not self._queue and not self._stop.is_set():
                        self._cond.wait()
                    if self._stop.is_set():
                        return
                    keys, prio = self._queue.popleft()
                error: BaseException | None = None
                count = 0
                try:
                    reply = client._call(
                        P.Op.UPDATE_PRIORITIES,
                        lambda rid: P.encode_update(rid, keys, prio),
                        client.timeout,
                        self._stop,
                    )
                    count = int(reply.header.count)
                except _Cancelled:
                    with self._cond:
                        self._counts["dropped"] += 1
                        self._pending -= 1
                        self._cond.notify_all()
                    return
                except Exception as exc:  # noqa: BLE001 - reported to the caller
                    error = exc
                with self._cond:
                    if error is None:
                        self._counts["sent"] += 1
                        self._counts["updated"] += count
                    else:
                        self._counts["failed"] += 1
                        self._errors.append(error)
                    self._pending -= 1
                    self._cond.notify_all()
        finally:
            client.close()
            with self._cond:  # whatever is still queued will never be sent
                self._counts["dropped"] += len(self._queue)
                self._pending -= len(self._queue)
                self._queue.clear()
                self._cond.notify_all()

    def _raise_pending(self) -> None:
        """Raise (and clear) the first collected background error; call with the lock held."""
        if self._errors:
            exc = self._errors[0]
            self._errors.clear()
            raise exc

    def update(self, keys: Any, priorities: Any) -> None:
        """Queue an update of ``keys`` to ``priorities`` (both copied); returns at once unless ``max_pending``
        updates are outstanding. Raises ValueError for bad arguments, ServerClosedError once closed, and a
        pending background error (also one arriving while blocked on ``max_pending``): whenever it raises,
        this update was **not** queued, so the caller may simply call again."""
        frames = P.encode_update(0, keys, priorities)  # validates; may return views of the caller's arrays
        k, p = np.array(frames[1], copy=True), np.array(frames[2], copy=True)
        with self._cond:
            self._raise_pending()
            while self._pending >= self.max_pending and not self._closed:
                self._cond.wait()
                self._raise_pending()
            if self._closed:
                raise ServerClosedError("the async updater is closed")
            self._queue.append((k, p))
            self._pending += 1
            self._counts["submitted"] += 1
            self._cond.notify_all()

    __call__ = update

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every update submitted so far was answered (acknowledged or failed), then raise the
        first pending background error, if any. ReplayTimeout if still outstanding after ``timeout`` s."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while self._pending > 0 and self._thread.is_alive():
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        self._raise_pending()
                        raise ReplayTimeout(
                            f"{self._pending} priority update(s) to {self.endpoint} still pending after {timeout}s"
                        )
                    self._cond.wait(remaining)
            self._raise_pending()

    @property
    def pending(self) -> int:
        with self._cond:
            return self._pending

    def stats(self) -> dict[str, int]:
        with self._cond:
            return dict(self._counts, pending=self._pending)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float | None = None) -> None:
        """Flush for up to ``timeout`` seconds (default: the client timeout), drop what is left (counted in
        ``dropped``), stop the thread and close its socket; then raise the first pending error. Idempotent."""
        wait = self.timeout if timeout is None else max(0.0, float(timeout))
        deadline = time.monotonic() + wait
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # wake callers blocked on max_pending
            while self._pending > 0 and self._thread.is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()
        with self._cond:
            self._raise_pending()



# -------------------------------------------------------------------------------------------------- actor side


class PipelinedInserter(_ClosingContext):
    """Inserts that do not wait for their reply, for actors: ``insert()`` sends and returns while up to
    ``max_in_flight`` requests are unanswered, and blocks only when that many are.

    Nothing is lost silently:

    * Every reply is received and matched to its request (by request id): ``stats()`` counts the requests
      and items ``submitted``, ``acked`` (stored; keys returned) and ``failed``, and ``in_flight``.
    * An error reply (TOO_LARGE, INVALID_ARGUMENT, a rate-limiter TIMEOUT, SHUTTING_DOWN, ...) is counted in
      ``failed`` and raised by the next ``insert()``, ``flush()`` or ``close()`` (the first error pending;
      all are counted). Whenever ``insert()`` raises, its own batch was **not** sent.
    * A request unanswered ``client_timeout`` seconds after it was sent (plus its server-side ``timeout``)
      expires: all requests then in flight are counted ``failed`` -- they may or may not have been stored --
      a :class:`~apexrl.errors.ReplayTimeout` saying how many is raised as above, and the socket is
      replaced (a restarted server is reached by the next insert).
    * ``flush()`` waits until every request sent so far was answered or expired, then raises the first
      pending error; ``close()`` (and leaving the ``with`` block) flushes, closes the socket and raises it.

    Arguments are validated in the caller (ValueError from ``insert`` itself, nothing sent). Not
    thread-safe: use one inserter per thread (an actor loop). Replies are read while ``insert``/``flush``
    run; ``on_ack(keys, seconds)`` is then called with each acknowledged request's keys (u64 view of the
    reply, copy to keep) and its round-trip time.
    """

    def __init__(
        self,
        endpoint: str,
        max_in_flight: int = 8,
        *,
        timeout: float | None = None,
        on_ack: Callable[[np.ndarray, float], Any] | None = None,
        client_timeout: float = 10.0,
    ):
        if isinstance(max_in_flight, bool) or not isinstance(max_in_flight, int) or max_in_flight < 1:
            raise ValueError(f"max_in_flight must be an integer >= 1, got {max_in_flight!r}")
        wait_s, timeout_ms = _server_wait(timeout)
        if on_ack is not None and not callable(on_ack):
            raise TypeError("on_ack must be callable or None")
        self.endpoint = endpoint
        self.max_in_flight = max_in_flight
        self._timeout_ms = timeout_ms
        self._on_ack = on_ack
        self._client = ReplayClient(endpoint, timeout=client_timeout)
        self._expiry = client_timeout + wait_s  # seconds after sending that a request expires
        self._in_flight: dict[int, tuple[int, float]] = {}  # request id -> (items, sent at); in send order
        self._errors: list[BaseException] = []
        self._counts = {"submitted": 0, "submitted_items": 0, "acked": 0, "acked_items": 0,
                        "failed": 0, "failed_items": 0}
        self._closed = False

    # ------------------------------------------------------------------------------------------ replies

    def _on_reply(self, frames: list[Any], now: float) -> None:
        try:
            header = P.Header.unpack(frames[0])
        except ProtocolError:
            return  # not a reply to us (or garbage): ignore
        rid = header.request_id
        entry = self._in_flight.pop(rid, None)
        if entry is None:
            return  # a late reply to a request that already expired: it was counted failed then
        n, sent = entry
        c = self._counts
        try:
            reply = P.decode_reply(frames, P.Op.INSERT, rid)
        except ProtocolError as exc:
            c["failed"] += 1
            c["failed_items"] += n
            self._errors.append(exc)
            return
        if not reply.ok:
            c["failed"] += 1
            c["failed_items"] += n
            self._errors.append(_error_of(reply))
            return
        c["acked"] += 1
        c["acked_items"] += n
        if self._on_ack is not None:
            self._on_ack(reply.arrays["keys"], now - sent)

    def _drain(self) -> None:
        """Handle every reply already received, without waiting."""
        sock = self._client._sock
        if sock is None:
            return
        while self._in_flight:
            try:
                frames = sock.recv_multipart(zmq.NOBLOCK, copy=False)
            except zmq.Again:
                return
            self._on_reply(frames, time.monotonic())

    def _wait_one(self, until: float | None = None) -> bool:
        """Wait for a reply until the oldest request expires (or ``until``, if sooner); handle what arrived.

        Returns False only when ``until`` passed first. Expiry fails every request in flight.
        """
        sock = self._client._sock
        assert sock is not None and self._in_flight
        _n, oldest = next(iter(self._in_flight.values()))
        expires = oldest + self._expiry
        end = expires if until is None else min(until, expires)
        remaining = end - time.monotonic()
        if remaining > 0 and sock.poll(max(1, int(remaining * 1000 + 0.999)), zmq.POLLIN):
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
        self._in_flight.clear()
        self._counts["failed"] += k
        self._counts["failed_items"] += items
        self._client._reset()  # late replies can no longer arrive; a restarted server is reached anew
        self._errors.append(ReplayTimeout(
            f"INSERT to {self.endpoint}: {k} request(s) ({items} items) unanswered {self._expiry:.3f}s after "
            "sending; they may or may not have been stored"
        ))

    def _raise_pending(self) -> None:
        if self._errors:
            exc = self._errors[0]
            self._errors.clear()
            raise exc

    # --------------------------------------------------------------------------------------------- API

    def insert(self, priorities: Any, items: Sequence[Any] | None = None, *, data: Any = None,
               offsets: Any = None) -> None:
        """Send one insert (a list of bytes-like ``items``, or ``data`` + ``offsets``) without waiting for its
        reply; blocks while ``max_in_flight`` requests are unanswered. Raises ValueError for bad arguments,
        ServerClosedError once closed, and any pending failure of an earlier request (then this batch was
        not sent)."""
        if items is not None:
            if data is not None or offsets is not None:
                raise ValueError("pass either items or data and offsets, not both")
            data, offsets = P.pack_items(items)
        elif data is None or offsets is None:
            raise ValueError("pass items, or both data and offsets")
        if self._closed:
            raise ServerClosedError("the pipelined inserter is closed")
        client = self._client
        rid = next(client._ids) & 0xFFFF_FFFF_FFFF_FFFF or 1
        frames = P.encode_insert(rid, priorities, data, offsets, self._timeout_ms)  # validates
        n = len(frames[1])  # the priorities array
        with client._lock:
            if client._ctx is None:
                raise ServerClosedError("the pipelined inserter is closed")
            if client._sock is None:
                client._connect()
            self._drain()
            self._raise_pending()
            while len(self._in_flight) >= self.max_in_flight:
                self._wait_one()
                self._raise_pending()
            sock = client._sock
            assert sock is not None
            try:
                sock.send_multipart(frames, copy=False, flags=zmq.NOBLOCK)
            except zmq.Again:
                # DEALER blocks only when no peer is connected yet: wait for one within the timeout.
                if not sock.poll(max(1, int(client.timeout * 1000)), zmq.POLLOUT):
                    client._reset()
                    self._expire_if_any()
                    raise ReplayTimeout(
                        f"INSERT to {self.endpoint}: could not send within {client.timeout:.3f}s "
                        "(server unreachable?); this batch was not sent"
                    ) from None
                sock.send_multipart(frames, copy=False)
            self._in_flight[rid] = (n, time.monotonic())
            self._counts["submitted"] += 1
            self._counts["submitted_items"] += n

    def _expire_if_any(self) -> None:
        if self._in_flight:
            self._expire()

    __call__ = insert

    def flush(self, timeout: float | None = None) -> None:
        """Wait until every request sent so far was answered (or expired), then raise the first pending
        error, if any. ReplayTimeout if requests are still in flight after ``timeout`` seconds (they stay in
        flight and are still counted when their replies arrive)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        client = self._client
        with client._lock:
            if client._sock is not None:
                self._drain()
            while self._in_flight:
                if not self._wait_one(deadline):
                    self._raise_pending()
                    raise ReplayTimeout(
                        f"{len(self._in_flight)} insert request(s) to {self.endpoint} still unanswered after "
                        f"{timeout}s"
                    )
            self._raise_pending()

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def stats(self) -> dict[str, int]:
        """submitted / acked / failed requests (and ``*_items``), ``in_flight``."""
        return dict(self._counts, in_flight=len(self._in_flight))

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Flush (every request answered or expired), close the socket, then raise the first pending error.
        Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            self.flush()
        finally:
            self._client.close()

