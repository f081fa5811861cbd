"""What the replay helpers need from a replay: the :class:`Replay` Protocol, and two optional extensions.

:class:`~apexrl.replay.client.replay_client.ReplayClient` implements all three; a test checks that its signatures match. The
helpers (:class:`~apexrl.replay.client.sampler.PrefetchingSampler`, :class:`~apexrl.replay.client.updater.AsyncUpdater`,
:class:`~apexrl.replay.client.inserter.PipelinedInserter`) are written against these Protocols only, so another
implementation -- a sharded client spreading keys over several servers, an in-process store for tests -- can
stand in for the client.

The helpers take a **zero-argument factory** returning a Replay (``ReplayClient.sampler()`` passes one that
opens a new client on the same endpoint), not a Replay: each runs its requests on a connection of its own --
the sampler and the updater in a background thread, and a ZeroMQ socket must not be used by two threads; the
inserter keeps several requests in flight, whose replies must not be taken for late replies by the caller's
own calls. The helper calls the factory once, in the caller's thread (so a bad endpoint fails there), and
closes what it got when it is closed (when that has a ``close()``).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np

__all__ = [
    "BackgroundHelper",
    "Interruptible",
    "PipelinedReplay",
    "Replay",
    "ReplayFactory",
    "close_replay",
    "interrupt_and_join",
]


@runtime_checkable
class Replay(Protocol):
    """A prioritized replay: the five operations of the replay service.

    ``timeout`` of ``insert`` / ``sample``: seconds the replay may hold the call (rate limiter, minimum size);
    None answers at once. Errors: :class:`~apexrl.errors.ReplayTimeout` (no answer in time, or the replay
    could not serve within ``timeout``), :class:`~apexrl.errors.ServerClosedError` (closed or shutting down),
    :class:`~apexrl.errors.ServerError` (refused), ValueError (bad arguments, nothing done).
    """

    def insert(
        self,
        priorities: Any,
        items: Sequence[Any] | None = None,
        *,
        data: Any = None,
        offsets: Any = None,
        timeout: float | None = None,
        insert_id: tuple[int, int] | None = None,
        chunks: Any = None,
    ) -> np.ndarray:
        """Store items (bytes-like ``items``, or ``data`` + ``offsets``) -> their keys (u64[n]). ``insert_id``:
        pass the id of a batch's first attempt to each retry of it, so it is stored once (None: a new batch).
        ``chunks``: the frame chunks the items reference (a ``protocol.FrameChunks``; None: none)."""
        ...

    def sample(self, n: int, beta: float = 0.4, timeout: float | None = None, *, sequences: bool = True) -> Any:
        """n items -> a batch with ``keys``, ``weights``, ``probabilities``, ``data``, ``offsets``, ``items``.
        ``sequences=False``: a TrajectoryWriter's sequence items are left undecoded (the sampler passes it only
        for a decoder that decodes them itself: a replay without sequence items may ignore it)."""
        ...

    def update_priorities(self, keys: Any, priorities: Any) -> int:
        """New priorities -> how many keys were still present."""
        ...

    def remove_to_fit(self) -> int:
        """Evict down to capacity -> how many were removed."""
        ...

    def stats(self) -> dict[str, int | float]:
        """Counters of the replay (over the network a STATS request, which can time out like any other call)."""
        ...


@runtime_checkable
class Interruptible(Protocol):
    """A Replay whose call in progress another thread can abandon: after ``interrupt()`` that call and every
    later one raise :class:`~apexrl.errors.Interrupted`. The background helpers call it from ``close()`` so
    that they stop promptly even while a request waits on a server that does not answer; without it,
    ``close()`` waits for the call in progress to end."""

    def interrupt(self) -> None: ...


@runtime_checkable
class PipelinedReplay(Protocol):
    """A Replay that can have several inserts outstanding at once (what the inserter uses when it can; over a
    plain :class:`Replay` it inserts one call at a time).

    Its calls are the pipeline's, not the user's: they carry a leading underscore so that they stay out of a
    client's public surface (a user inserts through ``insert`` or an ``inserter()``), and only
    :class:`~apexrl.replay.client.inserter.PipelinedInserter` calls them."""

    def _prepare_insert(
        self,
        priorities: Any,
        data: Any,
        offsets: Any,
        *,
        timeout: float | None = None,
        insert_id: tuple[int, int] | None = None,
        chunks: Any = None,
    ) -> Any:
        """Validate one insert (ValueError, nothing sent) -> the message for :meth:`_send_insert`. A replay with
        a request size limit may also offer ``_insert_limit() -> int`` (bytes); the inserter then splits a
        batch over it."""
        ...

    def _send_insert(self, message: Any) -> tuple[int, int]:
        """Send a prepared insert without waiting -> ``(request id, items)``; ReplayTimeout if it could not be
        sent."""
        ...

    def _receive_insert(self, wait: float) -> tuple[int, Any] | None:
        """The next insert reply within ``wait`` seconds -> ``(request id, keys or the error it carried)``;
        None if none came."""
        ...

    def _forget_inserts(self) -> None:
        """Drop every reply still due: the requests in flight will not be answered to this replay. A replay of
        several servers may also offer ``_insert_unanswered(request_id)``, which the inserter (``resend``) calls
        first with the oldest request that expired: its server is taken as lost, so the resends of batches that
        went there go to another server (at-least-once across a server's loss, as a retried ``insert``)."""
        ...


ReplayFactory = Callable[[], Replay]


class BackgroundHelper:
    """Base of the helpers whose requests run in threads of their own (sampler, updater): ``connect()`` runs in
    the caller's thread, once per thread (so a bad endpoint fails there); each thread alone uses the Replay it
    was given (``_run(replay)``) and closes it when it ends; :meth:`_interrupt_and_join` stops them promptly."""

    _replays: list[Any]
    _threads: list[threading.Thread]
    endpoint: str | None

    def _run(self, replay: Any) -> None:  # pragma: no cover - every subclass has its own
        raise NotImplementedError

    def _start(self, connect: ReplayFactory, name: str, count: int = 1) -> None:
        replays: list[Any] = []
        try:
            for _ in range(count):
                replays.append(connect())
        except BaseException:
            for replay in replays:
                close_replay(replay)
            raise
        self._replays = replays
        self.endpoint = getattr(replays[0], "endpoint", None)
        self._threads = [
            threading.Thread(target=self._run, args=(replay,), name=name if count == 1 else f"{name}-{i}", daemon=True)
            for i, replay in enumerate(replays)
        ]
        for thread in self._threads:
            thread.start()

    def _interrupt_and_join(self) -> None:
        for replay in self._replays:  # every call first, so that the threads stop side by side
            _interrupt(replay)
        for thread in self._threads:
            _join(thread)


def interrupt_and_join(replay: Any, thread: threading.Thread) -> None:
    """Abandon ``replay``'s call in progress (when it is Interruptible) and join ``thread`` (unless it is this
    one). The thread closes ``replay`` itself: only the thread that uses a connection closes it."""
    _interrupt(replay)
    _join(thread)


def _interrupt(replay: Any) -> None:
    if isinstance(replay, Interruptible):
        replay.interrupt()


def _join(thread: threading.Thread) -> None:
    if thread.is_alive() and thread is not threading.current_thread():
        thread.join()


def close_replay(replay: Any) -> None:
    """``replay.close()`` when it has one (a client does; an in-process stand-in may not)."""
    close = getattr(replay, "close", None)
    if callable(close):
        close()
