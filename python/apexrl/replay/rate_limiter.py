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
from collections import deque
from collections.abc import Callable
from typing import Protocol, TypeVar

from apexrl.replay.schema import Op

__all__ = ["RateLimiter", "Waiting", "deadlock_reason"]

_EPS = 1e-9
_INSERT = int(Op.INSERT)


class Waiting(Protocol):
    """A request waiting for admission: its op, its item count, its deadline (monotonic seconds) and whether it
    still waits (False once answered or dropped; such entries are discarded lazily)."""

    op: int
    n: int
    deadline: float
    live: bool


W = TypeVar("W", bound=Waiting)


def deadlock_reason(n: float, m: float, spi: float, eb: float, *, sample: str = "a sample",
                    insert: str = "an insert", flag: str = "the error buffer") -> str | None:
    """None when SAMPLEs of n items and INSERTs of m items can always make progress together, else why not.

    With the store at min size and ``d = I * spi - S``, a SAMPLE of n is blocked iff ``d < n - eb`` and an INSERT
    of m iff ``d > eb - m * spi``; both at once needs ``n + m * spi > 2 * eb``. The one place this arithmetic is
    written: ``apexrl run`` (:func:`apexrl.launch.plan.check_rules`) checks the learner's batch against the
    actors' inserts with it, and the server refuses a single request that could never be admitted (m or n 0).
    """
    need = n + m * spi
    if need <= 2 * eb + _EPS:
        return None
    parts = [f"{sample} of {n:g}" if n else "", f"{insert} of {m:g} x samples_per_insert {spi:g}" if m else ""]
    what = " plus ".join(p for p in parts if p)
    return (f"rate limiter deadlock: {what} = {need:g} exceeds 2 x error_buffer = {2 * eb:g}, so "
            f"{'samples and inserts can both be blocked for good' if n and m else 'it could never be admitted'}"
            f" (samples_per_insert={spi:g}, error_buffer={eb:g}); raise {flag} to at least {need / 2:g} or use "
            f"smaller batches")


def _drop_dead(q: deque[W]) -> None:
    while q and not q[0].live:
        q.popleft()


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
        self.examined_max = 0  # most waiting requests checked by one release() (its cost)
        self.examined_total = 0
        self.waiting_stats: Callable[[], dict[str, int]] | None = None  # the server's waiting-request counters

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

    def release(self, inserts: deque[W], samples: deque[W], size: int) -> list[W]:
        """Pop from the heads of the two FIFO queues of waiting requests (INSERTs, SAMPLEs) those the rules
        admit now, in turn, and return them. Admissions are simulated, so one released slot does not wake every
        waiter at once; nothing is counted here (serving the request admits it for real). Entries whose
        ``live`` is False (answered or dropped meanwhile) are discarded from the heads. The cost is
        O(released + 2): only heads are ever looked at; ``examined`` counts the live entries checked."""
        with self.lock:
            inserted, sampled = self.inserted, self.sampled
        ready: list[W] = []
        examined = 0
        while True:
            _drop_dead(inserts)
            _drop_dead(samples)
            if inserts:
                examined += 1
                head = inserts[0]
                if self.insert_ok(head.n, size, inserted, sampled):
                    ready.append(inserts.popleft())
                    inserted, size = inserted + head.n, size + head.n
                    continue
            if samples:
                examined += 1
                head = samples[0]
                if self.sample_ok(head.n, size, inserted, sampled):
                    ready.append(samples.popleft())
                    sampled += head.n
                    continue
            break
        self.examined_max = max(self.examined_max, examined)
        self.examined_total += examined
        return ready

    def never_admitted(self, op: int, n: int, size: int) -> str | None:
        """Why a request of n items, which the rules do not admit now (store at ``size``), could never be
        admitted once the store is at min size, or None.

        A SAMPLE of n needs ``I * spi - S >= n - eb`` and inserts can raise ``I * spi - S`` to ``eb`` at most, so
        it needs ``n <= 2 * eb``; an INSERT of m needs ``m * spi <= 2 * eb`` (samples lower it to ``-eb`` at
        most). Both are :func:`deadlock_reason` with the other side's batch at 0 (the same arithmetic
        ``apexrl run`` checks before it starts anything). A request admitted now is never refused: inserts while
        the store fills up, or a sample served from the head start of that fill-up."""
        if self.spi is None or n == 0:
            return None
        with self.lock:
            inserted, sampled = self.inserted, self.sampled
        if op == _INSERT:
            return None if self.insert_ok(n, size, inserted, sampled) else deadlock_reason(0, n, self.spi, self.eb)
        if not self.big_enough(size) or self.sample_ok(n, size, inserted, sampled):
            return None  # waiting for min size first; or admitted now
        return deadlock_reason(n, 0, self.spi, self.eb)

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
                "deferred_examined_max": self.examined_max,
                "deferred_examined_total": self.examined_total,
            } | ({} if self.waiting_stats is None else self.waiting_stats())
