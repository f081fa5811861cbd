"""PrefetchingSampler: a learner's iterator of sampled batches, fed by a sampling thread and decode threads.

Written against :class:`~apexrl.replay.client.api.Replay` (see that module for why it takes a factory).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from apexrl.errors import Interrupted, ReplayTimeout, ServerShuttingDownError
from apexrl.replay.client.api import BackgroundHelper, ReplayFactory, close_replay
from apexrl.replay.client.beta import Beta, beta_at
from apexrl.replay.wire import protocol as P

__all__ = ["MAX_SAMPLE_THREADS", "LearnerBatch", "PrefetchingSampler", "SlotDecoder"]

MAX_SAMPLE_THREADS = 16
"""Most SAMPLE requests a sampler keeps in flight (one connection each)."""
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


class SlotDecoder(Protocol):
    """A decode hook that writes into preallocated batches (e.g. :class:`~apexrl.replay.wire.codec.BatchDecoder`).

    ``allocate()`` makes one slot of the sampler's ring; ``decode_into(raw, slot)`` decodes a sampled batch into
    that slot and returns what the consumer receives as ``LearnerBatch.decoded``. ``decode_into`` is called from
    several threads at once (each with its own slot), so it must be thread-safe; it should release the GIL
    while it works (the native decoder does) for the threads to run side by side.

    A decoder with ``decodes_sequences = True`` decodes a TrajectoryWriter's sequence items itself (into its
    slot): the sampling threads then ask the replay for batches that leave them undecoded
    (``sample(..., sequences=False)``), so that the steps are copied once, in a decode thread."""

    def allocate(self) -> Any: ...

    def decode_into(self, raw: Any, slot: Any) -> Any: ...


class PrefetchingSampler(BackgroundHelper, Iterator[LearnerBatch]):
    """Keeps up to ``prefetch`` sampled batches ready for a learner, as the Ape-X learner does.

    ``connect()`` is called here, once for each of the ``sample_threads`` sampling threads, for the Replay that
    thread samples from (its own connection: a ZeroMQ socket must not be shared between threads). A sampling
    thread waits until fewer than ``prefetch`` batches are ahead of the consumer, samples ``batch_size`` items
    and, without a decode hook, queues a :class:`LearnerBatch`. At most ``prefetch`` batches (requested,
    sampled, being decoded or ready) ever exist ahead of the consumer, and no request is sent while there are
    that many.

    ``sample_threads`` > 1 keeps that many SAMPLE requests in flight at once, each on its own connection, so
    the round trips overlap: a learner whose batches come from several replay servers (a
    :class:`~apexrl.replay.client.sharded.ShardedReplayClient` waits for every server's part of a batch) or over a
    slow link gets them at the rate of the servers rather than one round trip at a time. Batches are numbered
    in the order their replies came and handed to the consumer in that order.

    With a decode hook, ``decode_threads`` more threads decode the sampled batches side by side while the
    sampling thread fetches the next ones; the consumer still receives the batches in the order they were
    sampled. Two kinds of hook:

    * ``decode(raw)``, any callable: its result becomes ``LearnerBatch.decoded``.
    * ``decoder``, a :class:`SlotDecoder`: ``decoder.decode_into(raw, slot)`` writes each batch into a slot of
      a ring of at most ``prefetch + 1`` preallocated batches (``decoder.allocate()``, made as needed), so a
      learner allocates nothing per batch; a :class:`~apexrl.replay.wire.codec.BatchDecoder` decodes natively with
      the GIL released, so the threads use more cores. **A slot is reused**: the arrays of a batch stay valid
      until the consumer's next ``next()``; copy what must outlive it.

    Failures:

    * :class:`~apexrl.errors.ReplayTimeout` (server down or restarting, which includes TIMEOUT replies for
      a store still below min_size_to_sample) and SHUTTING_DOWN replies are **retried until closed**, with a
      short back-off: the learner simply keeps waiting for a (re)starting server. ``retries`` counts them
      and ``last_retry_error`` keeps the latest.
    * Any other error in a background thread (a :class:`~apexrl.errors.ServerError`, an exception from the
      decode hook, ...) stops every thread and is re-raised by the consumer's next ``next()`` (batches ahead
      are discarded); after that the iterator is exhausted.

    ``close()`` (or leaving the ``with`` block) stops the threads promptly -- even while the sampling thread
    waits on the server (the Replay is interrupted, when it is :class:`~apexrl.replay.client.api.Interruptible`) or for
    room -- joins them, and the sampling thread closes its Replay; iterating a closed sampler ends.
    """

    def __init__(
        self,
        connect: ReplayFactory,
        batch_size: int,
        *,
        beta: Beta = 0.4,
        prefetch: int = 16,
        decode: Callable[[Any], Any] | None = None,
        timeout: float | None = None,
        decoder: SlotDecoder | None = None,
        decode_threads: int = 1,
        sample_threads: int = 1,
    ):
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {prefetch!r}")
        if isinstance(decode_threads, bool) or not isinstance(decode_threads, int) or not 1 <= decode_threads <= 64:
            raise ValueError(f"decode_threads must be an integer from 1 to 64, got {decode_threads!r}")
        if (
            isinstance(sample_threads, bool)
            or not isinstance(sample_threads, int)
            or not 1 <= sample_threads <= MAX_SAMPLE_THREADS
        ):
            raise ValueError(
                f"sample_threads must be an integer from 1 to {MAX_SAMPLE_THREADS}, got {sample_threads!r}"
            )
        _wait_s, timeout_ms = P.server_wait(timeout)
        P.encode_sample(0, batch_size, beta_at(beta, 0), timeout_ms)  # validate here, in the caller's thread
        if decode is not None and not callable(decode):
            raise TypeError("decode must be callable or None")
        if decoder is not None:
            if decode is not None:
                raise ValueError("give decode or decoder, not both")
            if not callable(getattr(decoder, "allocate", None)) or not callable(getattr(decoder, "decode_into", None)):
                raise TypeError("decoder must have allocate() and decode_into(raw, slot) methods")
        self.batch_size = batch_size
        self.beta: Beta = beta if callable(beta) else float(beta)
        self._issued = 0  # batch indices handed to the sampling threads: a beta schedule's argument
        self.prefetch = prefetch
        self.decode_threads = decode_threads
        self.sample_threads = sample_threads
        self._timeout = timeout
        self._decode = decode
        self._decoder = decoder
        self._sample_kwargs = {"sequences": False} if getattr(decoder, "decodes_sequences", False) else {}
        self._cond = threading.Condition()
        self._jobs: deque[tuple[int, Any]] = deque()  # sampled, waiting for a decode thread: (sequence, raw)
        self._ready: dict[int, LearnerBatch] = {}  # by sequence number
        self._slot_of: dict[int, Any] = {}  # the ring slot of each ready batch (decoder only)
        self._free_slots: list[Any] = []
        self._held_slot: Any = None  # the slot of the batch the consumer holds now
        self._sampled = 0  # sequence number of the next sampled batch
        self._requested = 0  # SAMPLE requests in flight (they count against prefetch)
        self._sampling = sample_threads  # sampling threads still running
        self._taken = 0  # sequence number of the next batch for the consumer
        self._decoding = 0  # batches a decode thread is working on
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._done = False  # every sampling thread has finished (error, or closed)
        self._closed = False
        self.retries = 0
        self.last_retry_error: BaseException | None = None
        self.fetched = 0  # batches sampled (and decoded) and ready
        self.max_queued = 0  # high-water mark of the ready batches (never above prefetch)
        self.slots = 0  # ring slots allocated so far (at most prefetch + 1)
        self._workers: list[threading.Thread] = []
        if decode is not None or decoder is not None:
            for i in range(decode_threads):
                t = threading.Thread(target=self._decode_loop, name=f"apexrl-decode-{i}", daemon=True)
                self._workers.append(t)
        self._start(connect, "apexrl-sampler", sample_threads)
        for t in self._workers:
            t.start()

    # ------------------------------------------------------------------------------------------ workers

    def _fail(self, exc: BaseException) -> None:
        with self._cond:
            if self._error is None and not self._closed:  # the first error only, raised once
                self._error = exc
            self._stop.set()
            self._cond.notify_all()

    def _publish(self, seq: int, item: LearnerBatch, slot: Any = None) -> None:
        """Hand batch ``seq`` to the consumer (called with the lock held)."""
        self._ready[seq] = item
        if slot is not None:
            self._slot_of[seq] = slot
        self.fetched += 1
        self.max_queued = max(self.max_queued, len(self._ready))
        self._cond.notify_all()

    def _run(self, replay: Any) -> None:
        backoff = _RETRY_BACKOFF_MIN
        n, beta, timeout = self.batch_size, self.beta, self._timeout
        decoding = bool(self._workers)
        index: int | None = None  # this thread's batch index; a retried request keeps its index
        try:
            while not self._stop.is_set():
                with self._cond:  # wait for room before sampling: at most `prefetch` batches exist ahead
                    while self._sampled + self._requested - self._taken >= self.prefetch and not self._stop.is_set():
                        self._cond.wait()
                    if self._stop.is_set():
                        break
                    self._requested += 1
                    if index is None:
                        index, self._issued = self._issued, self._issued + 1
                try:
                    raw = replay.sample(n, beta_at(beta, index), timeout=timeout, **self._sample_kwargs)
                except (ReplayTimeout, ServerShuttingDownError) as exc:
                    with self._cond:
                        self._requested -= 1
                        self.retries += 1
                        self.last_retry_error = exc
                        self._cond.notify_all()
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, _RETRY_BACKOFF_MAX)
                    continue
                except BaseException:
                    with self._cond:
                        self._requested -= 1
                    raise
                backoff = _RETRY_BACKOFF_MIN
                index = None
                with self._cond:
                    self._requested -= 1
                    if self._stop.is_set():
                        break
                    seq, self._sampled = self._sampled, self._sampled + 1
                    if decoding:
                        self._jobs.append((seq, raw))
                        self._cond.notify_all()
                    else:
                        self._publish(seq, LearnerBatch(raw.keys, raw.weights, raw.probabilities, raw, None))
        except Interrupted:
            pass
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            self._fail(exc)
        finally:
            close_replay(replay)
            with self._cond:
                self._sampling -= 1
                self._done = self._sampling == 0
                self._cond.notify_all()

    def _decode_loop(self) -> None:
        decoder = self._decoder
        while True:
            with self._cond:
                while not self._jobs and not self._stop.is_set() and not self._done:
                    self._cond.wait()
                if self._stop.is_set() or not self._jobs:
                    return
                seq, raw = self._jobs.popleft()
                self._decoding += 1
                slot = self._free_slots.pop() if decoder is not None and self._free_slots else None
                if decoder is not None and slot is None:
                    self.slots += 1
            try:
                if decoder is not None:
                    if slot is None:
                        slot = decoder.allocate()
                    decoded = decoder.decode_into(raw, slot)
                else:
                    decoded = self._decode(raw)  # type: ignore[misc]
            except BaseException as exc:  # noqa: BLE001 - handed to the consumer
                with self._cond:
                    self._decoding -= 1
                self._fail(exc)
                return
            with self._cond:
                self._decoding -= 1
                if self._stop.is_set():
                    return
                self._publish(seq, LearnerBatch(raw.keys, raw.weights, raw.probabilities, None, decoded), slot)

    def _join(self) -> None:
        self._interrupt_and_join()
        for t in self._workers:
            if t.is_alive() and t is not threading.current_thread():
                t.join()

    # ---------------------------------------------------------------------------------------- consumer

    def __iter__(self) -> PrefetchingSampler:
        return self

    def __next__(self) -> LearnerBatch:
        return self.next()

    def next(self, timeout: float | None = None) -> LearnerBatch:
        """The next batch, in the order they were sampled; waits up to ``timeout`` seconds (None: forever) ->
        ReplayTimeout when exceeded. With a ``decoder``, the previous batch's slot is reused from now on.

        Raises a background thread's error (once, after stopping the threads), StopIteration once closed or
        failed.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    exc, self._error = self._error, None
                    self._drop()
                    self._closed = True
                    self._stop.set()
                    self._cond.notify_all()
                    break
                if self._closed:
                    raise StopIteration
                item = self._ready.pop(self._taken, None)
                if item is not None:
                    slot = self._slot_of.pop(self._taken, None)
                    if self._held_slot is not None:
                        self._free_slots.append(self._held_slot)
                    self._held_slot = slot
                    self._taken += 1
                    self._cond.notify_all()
                    return item
                if self._done and not self._jobs and not self._decoding:
                    raise StopIteration
                if deadline is None:
                    self._cond.wait()
                else:
                    remaining = deadline - time.monotonic()
                    if remaining <= 0:
                        raise ReplayTimeout(f"no batch from {self.endpoint} within {timeout:.3f}s")
                    self._cond.wait(remaining)
        self._join()
        raise exc

    def _drop(self) -> None:
        """Forget every batch ahead of the consumer (called with the lock held)."""
        self._jobs.clear()
        self._ready.clear()
        self._slot_of.clear()

    def qsize(self) -> int:
        """Batches ready now."""
        with self._cond:
            return len(self._ready)

    def counters(self) -> dict[str, int]:
        """queued (ready batches), in_flight (SAMPLE requests waiting for their reply), max_queued, slots (ring
        slots allocated), fetched, retries."""
        with self._cond:
            return {
                "queued": len(self._ready),
                "in_flight": self._requested,
                "max_queued": self.max_queued,
                "slots": self.slots,
                "fetched": self.fetched,
                "retries": self.retries,
            }

    def stats(self) -> dict[str, int]:
        """Alias of :meth:`counters`, kept for the scripts written against it (local: no request is sent)."""
        return self.counters()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Stop and join the background thread (it closes its Replay); idempotent. Queued batches are dropped."""
        self._stop.set()
        with self._cond:
            self._closed = True
            self._drop()
            self._cond.notify_all()
        self._join()

    def __enter__(self) -> PrefetchingSampler:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
