"""Bounded stops: a process told to stop (SIGTERM/SIGINT) exits within a few seconds whatever its peers do.

``docker compose down``, a Kubernetes pod deletion or Ctrl-C in one terminal group deliver SIGTERM to every
apexrl process at once, so an actor's last insert or a learner's last priority update may be addressed to a
server that is stopping too. Waiting out request timeouts then (10-15 s) gets processes SIGKILLed by their
supervisor with nothing said. Instead, on the first signal:

* ``on_stop()`` runs (the loop's stop flag); the process hands over what it can (last insert, last updates,
  checkpoint) within ``grace`` seconds;
* after ``grace`` seconds every registered ``interrupt`` callable runs (the replay and params clients'
  ``interrupt()``), so a request still blocked on a silent peer raises :class:`~apexrl.errors.Interrupted` at
  once and the caller reports what it could not hand over;
* a second signal interrupts at once.

Handlers only set flags and start a timer; the work happens in the interrupted thread.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["STOP_GRACE_S", "StopOnSignal"]

STOP_GRACE_S = 2.0
"""Seconds between the stop signal and the interruption of blocked requests: with the local work after it
(checkpoint, closing sockets) a process exits well within 5 s of SIGTERM."""

_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class StopOnSignal:
    """Context manager installing the SIGTERM/SIGINT handlers described in the module docstring."""

    def __init__(
        self, on_stop: Callable[[], None], interrupt: Sequence[Callable[[], None]], grace: float = STOP_GRACE_S
    ):
        self._on_stop = on_stop
        self._interrupt = list(interrupt)
        self.grace = float(grace)
        self._timer: threading.Timer | None = None
        self._previous: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._interrupted = False
        self.signalled_at: float | None = None
        """time.monotonic() of the first signal, None if none came."""

    def remaining(self, default: float) -> float:
        """Seconds left of the grace period (at most ``default``); ``default`` when no signal came."""
        if self.signalled_at is None:
            return default
        return max(0.0, min(default, self.signalled_at + self.grace - time.monotonic()))

    def interrupt_now(self) -> None:
        with self._lock:
            if self._interrupted:
                return
            self._interrupted = True
        for fn in self._interrupt:
            fn()

    def _handle(self, _signum: int, _frame: object) -> None:
        if self.signalled_at is not None:  # a second signal: no more waiting
            self.interrupt_now()
            return
        self.signalled_at = time.monotonic()
        self._on_stop()
        self._timer = threading.Timer(self.grace, self.interrupt_now)
        self._timer.daemon = True
        self._timer.start()

    def __enter__(self) -> StopOnSignal:
        self._previous = {s: signal.signal(s, self._handle) for s in _SIGNALS}
        return self

    def __exit__(self, *exc: Any) -> None:
        for s, h in self._previous.items():
            signal.signal(s, h)
        if self._timer is not None:
            self._timer.cancel()
