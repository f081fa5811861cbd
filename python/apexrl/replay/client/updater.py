"""AsyncUpdater: a learner's non-blocking priority updates, sent by a background thread.

Written against :class:`~apexrl.replay.client.api.Replay` (see that module for why it takes a factory).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

import numpy as np

from apexrl.errors import Interrupted, ReplayTimeout, ServerClosedError
from apexrl.replay.client.api import BackgroundHelper, ReplayFactory, close_replay
from apexrl.replay.wire import protocol as P

__all__ = ["AsyncUpdater"]


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
            except Exception:  # noqa: BLE001 - the exception in flight is the one to see
                pass


class AsyncUpdater(BackgroundHelper, _ClosingContext):
    """Non-blocking priority updates: ``update()`` copies the arrays and returns; a background thread sends
    them in order through the Replay that ``connect()`` (called once, here) returns.

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
    * ``close(timeout)`` waits up to ``timeout`` (default ``close_timeout``) for the pending updates.
    """

    def __init__(self, connect: ReplayFactory, max_pending: int = 64, *, close_timeout: float = 10.0):
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ValueError(f"max_pending must be an integer >= 1, got {max_pending!r}")
        self.max_pending = max_pending
        self.timeout = float(close_timeout)
        self._cond = threading.Condition()
        self._queue: deque[tuple[np.ndarray, np.ndarray]] = deque()
        self._pending = 0
        self._errors: list[BaseException] = []
        self._stop = threading.Event()
        self._closed = False
        self._counts = {"submitted": 0, "sent": 0, "updated": 0, "failed": 0, "dropped": 0}
        self._start(connect, "apexrl-updater")

    def _run(self, replay: Any) -> None:
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
                    count = int(replay.update_priorities(keys, prio))
                except Interrupted:
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
            close_replay(replay)
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
            while self._pending > 0 and self._threads[0].is_alive():
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

    def counters(self) -> dict[str, int]:
        """submitted / sent / updated / failed / dropped update counts, ``pending`` (local: no request)."""
        with self._cond:
            return dict(self._counts, pending=self._pending)

    def stats(self) -> dict[str, int]:
        """Alias of :meth:`counters`, kept for the scripts written against it (local: no request is sent)."""
        return self.counters()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self, timeout: float | None = None) -> None:
        """Flush for up to ``timeout`` seconds (default: ``close_timeout``), drop what is left (counted in
        ``dropped``), stop the thread (it closes its Replay); then raise the first pending error. Idempotent."""
        wait = self.timeout if timeout is None else max(0.0, float(timeout))
        deadline = time.monotonic() + wait
        with self._cond:
            self._closed = True
            self._cond.notify_all()  # wake callers blocked on max_pending
            while self._pending > 0 and self._threads[0].is_alive():
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self._cond.wait(remaining)
        self._stop.set()
        with self._cond:
            self._cond.notify_all()
        self._interrupt_and_join()
        with self._cond:
            self._raise_pending()
