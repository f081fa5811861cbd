"""PrefetchingSampler: a learner's iterator of sampled batches, fed by a background thread.

Written against :class:`~apexrl.replay.api.Replay` (see that module for why it takes a factory).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from apexrl.errors import Interrupted, ReplayTimeout, ServerShuttingDownError
from apexrl.replay import protocol as P
from apexrl.replay.api import BackgroundHelper, ReplayFactory, close_replay

__all__ = ["LearnerBatch", "PrefetchingSampler"]

_RETRY_BACKOFF_MIN = 0.02
_RETRY_BACKOFF_MAX = 0.5


@dataclass
class LearnerBatch:
    """One prefetched batch. ``raw`` is the sampled batch when the sampler has no ``decode`` hook, else None
    and ``decoded`` holds what ``decode(raw)`` returned (e.g. a dict of field arrays)."""

    keys: np.ndarray  # u64[n]
    weights: np.ndarray  # f32[n]
    probabilities: np.ndarray  # f64[n]
    raw: Any = None
    decoded: Any = None

    def __len__(self) -> int:
        return int(self.keys.shape[0])


class PrefetchingSampler(BackgroundHelper, Iterator[LearnerBatch]):
    """Keeps up to ``prefetch`` sampled batches ready for a learner, as the Ape-X learner does.

    ``connect()`` is called once, here, for the Replay the background thread samples from (its own
    connection: a ZeroMQ socket must not be shared between threads). The thread waits for room in a bounded
    queue, samples ``batch_size`` items, applies ``decode`` (if given), and queues a :class:`LearnerBatch`. At
    most ``prefetch`` batches are ever queued, and no request is sent while the queue is full, so at most
    ``prefetch`` batches exist ahead of the consumer.

    Failures:

    * :class:`~apexrl.errors.ReplayTimeout` (server down or restarting, which includes TIMEOUT replies for
      a store still below min_size_to_sample) and SHUTTING_DOWN replies are **retried until closed**, with a
      short back-off: the learner simply keeps waiting for a (re)starting server. ``retries`` counts them
      and ``last_retry_error`` keeps the latest.
    * Any other error in the background thread (a :class:`~apexrl.errors.ServerError`, an exception from
      ``decode``, ...) stops the thread and is re-raised by the consumer's next ``next()`` (queued batches
      are discarded); after that the iterator is exhausted.

    ``close()`` (or leaving the ``with`` block) stops the thread promptly -- even while it waits on the
    server (the Replay is interrupted, when it is :class:`~apexrl.replay.api.Interruptible`) or on a full
    queue -- joins it, and the thread closes its Replay; iterating a closed sampler ends.
    """

    def __init__(
        self,
        connect: ReplayFactory,
        batch_size: int,
        *,
        beta: float = 0.4,
        prefetch: int = 16,
        decode: Callable[[Any], Any] | None = None,
        timeout: float | None = None,
    ):
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {prefetch!r}")
        _wait_s, timeout_ms = P.server_wait(timeout)
        P.encode_sample(0, batch_size, beta, timeout_ms)  # validate here, in the caller's thread
        if decode is not None and not callable(decode):
            raise TypeError("decode must be callable or None")
        self.batch_size = batch_size
        self.beta = float(beta)
        self.prefetch = prefetch
        self._timeout = timeout
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
        self._start(connect, "apexrl-sampler")

    # ------------------------------------------------------------------------------------------ worker

    def _run(self) -> None:
        replay = self._replay
        backoff = _RETRY_BACKOFF_MIN
        n, beta, timeout = self.batch_size, self.beta, self._timeout
        try:
            while not self._stop.is_set():
                with self._cond:  # wait for room before sampling: at most `prefetch` batches exist
                    while len(self._queue) >= self.prefetch and not self._stop.is_set():
                        self._cond.wait()
                if self._stop.is_set():
                    break
                try:
                    raw = replay.sample(n, beta, timeout=timeout)
                except (ReplayTimeout, ServerShuttingDownError) as exc:
                    self.retries += 1
                    self.last_retry_error = exc
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, _RETRY_BACKOFF_MAX)
                    continue
                backoff = _RETRY_BACKOFF_MIN
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
        except Interrupted:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            with self._cond:
                self._error = exc
        finally:
            close_replay(replay)
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
        """Stop and join the background thread (it closes its Replay); idempotent. Queued batches are dropped."""
        self._stop.set()
        with self._cond:
            self._closed = True
            self._queue.clear()
            self._cond.notify_all()
        self._interrupt_and_join()

    def __enter__(self) -> PrefetchingSampler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
