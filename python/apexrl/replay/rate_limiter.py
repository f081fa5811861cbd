"""The replay server's admission rules: the minimum size to sample and Reverb's SampleToInsertRatio.

With ``samples_per_insert`` (spi) set, the limiter counts the items inserted (I) and sampled (S) since the
server started (items, not calls). With ``eb = error_buffer``:

* a SAMPLE of n may be served when the store holds >= ``min_size_to_sample`` items (at least 1) and
  ``S + n <= I * spi + eb``;
* an INSERT of n may be served when the store holds fewer than ``min_size_to_sample`` items (filling up is
  never limited), or when ``(I + n) * spi - S <= eb``.

Without spi only the minimum size applies (to SAMPLEs). These two rules are written once, in
:meth:`RateLimiter.insert_ok` and :meth:`RateLimiter.sample_ok`; admitting a request (:meth:`try_insert`,
:meth:`try_sample`: check and count under one lock, so concurrent workers never overshoot) and releasing the
requests that wait (:meth:`release`) both go through them.

Deadlock freedom: with the store at min size, let ``d = I * spi - S``. A SAMPLE of n is blocked iff
``d < n - eb``, an INSERT of m iff ``d > eb - m * spi``; both at once needs ``n + m * spi > 2 * eb``. So
whenever every sample batch n and insert batch m satisfy ``n + m * spi <= 2 * eb``, at least one side can
always proceed. Hence ``error_buffer >= max(1, spi)`` is required (ServerConfig validates it; single-item
calls on both sides can always move, the same rule as Reverb) and larger batches need a proportionally larger
buffer. Unlike Reverb there is no ``spi * min_size_to_sample`` offset: the items inserted while filling up
count in I, so after a long fill-up inserts pause until the samplers have consumed that head start.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar

from apexrl.replay.schema import Op

__all__ = ["RateLimiter", "Waiting"]

_EPS = 1e-9
_INSERT = int(Op.INSERT)


class Waiting(Protocol):
    """A request waiting for admission: its op, its item count and its deadline (monotonic seconds)."""

    op: int
    n: int
    deadline: float


W = TypeVar("W", bound=Waiting)


class RateLimiter:
    """Items inserted / sampled since start and the admission rules (see the module docstring)."""

    def __init__(self, spi: float | None, eb: float | None, min_size: int):
        self.spi = None if spi is None else float(spi)
        self.eb = 0.0 if eb is None else float(eb)
        self.need = max(int(min_size), 1)
        self.lock = threading.Lock()
        self.inserted = 0
        self.sampled = 0
        self.waits_insert = 0
        self.waits_sample = 0

    # ------------------------------------------------------------------------------------------- the rules

    def big_enough(self, size: int) -> bool:
        """A store of ``size`` items may be sampled (min_size_to_sample, at least 1)."""
        return size >= self.need

    def insert_ok(self, n: int, size: int, inserted: int, sampled: int) -> bool:
        """May an INSERT of n be served, with the store at ``size`` and the counts given?"""
        if self.spi is None or n == 0 or size < self.need:
            return True
        return (inserted + n) * self.spi - sampled <= self.eb + _EPS

    def sample_ok(self, n: int, size: int, inserted: int, sampled: int) -> bool:
        """May a SAMPLE of n be served, with the store at ``size`` and the counts given?"""
        if size < self.need:
            return False
        return self.spi is None or sampled + n <= inserted * self.spi + self.eb + _EPS

    # --------------------------------------------------------------------------------------- admission

    def try_insert(self, n: int, size: int) -> bool:
        """Admit an INSERT of n (count it) if the rule allows it now."""
        return self._admit(self.insert_ok, n, size, "inserted")

    def try_sample(self, n: int, size: int) -> bool:
        """Admit a SAMPLE of n (count it) if the rule allows it now."""
        return self._admit(self.sample_ok, n, size, "sampled")

    def _admit(self, rule: Callable[[int, int, int, int], bool], n: int, size: int, counter: str) -> bool:
        with self.lock:
            if not rule(n, size, self.inserted, self.sampled):
                return False
            setattr(self, counter, getattr(self, counter) + n)
            return True

    def undo(self, inserted: int = 0, sampled: int = 0) -> None:
        """Take back an admission whose store call failed."""
        with self.lock:
            self.inserted -= inserted
            self.sampled -= sampled

    def release(self, waiting: Iterable[W], size: int, now: float) -> tuple[list[W], list[W]]:
        """Split waiting requests into (ready to serve again, still waiting). A request is ready when its
        deadline has passed (it will be answered TIMEOUT) or when the rules would admit it after the ones
        released before it: admissions are simulated in order, so one released slot does not wake every
        waiter at once. Nothing is counted here; serving the request admits it for real."""
        with self.lock:
            inserted, sampled = self.inserted, self.sampled
        ready: list[W] = []
        keep: list[W] = []
        for entry in waiting:
            go = now >= entry.deadline
            if not go and entry.op == _INSERT:
                if self.insert_ok(entry.n, size, inserted, sampled):
                    go, inserted, size = True, inserted + entry.n, size + entry.n
            elif not go and self.sample_ok(entry.n, size, inserted, sampled):
                go, sampled = True, sampled + entry.n
            (ready if go else keep).append(entry)
        return ready, keep

    # ------------------------------------------------------------------------------------------ counters

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.inserted, self.sampled

    def count_wait(self, op: int) -> None:
        with self.lock:
            if op == _INSERT:
                self.waits_insert += 1
            else:
                self.waits_sample += 1

    def describe(self) -> str:
        return (f"{self.inserted} items inserted and {self.sampled} sampled, "
                f"samples_per_insert={self.spi}, error_buffer={self.eb}")

    def stats(self) -> dict[str, int | float]:
        with self.lock:
            return {
                "rate_limiter_waits_insert": self.waits_insert,
                "rate_limiter_waits_sample": self.waits_sample,
                "rate_limiter_inserted_items": self.inserted,
                "rate_limiter_sampled_items": self.sampled,
                "samples_per_insert": 0.0 if self.spi is None else self.spi,
                "error_buffer": self.eb,
            }
