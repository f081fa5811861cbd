"""The learner's reader of sequence items (``ReplayPath.reader`` ``"sequences"`` or ``"queue"``; R2D2).

:class:`SequenceSampler` samples the path's table and hands the learner's loop the agent's batch
(``ReplayPath.make_batch`` of the items' ``.fields``/``.mask``/``.extras``) with the same ``decoded`` tuple the
transition decoders give (the good items' fields, which items did not decode, which decoded ones the agent
refuses), so the loop, its erasures and its counters are the transition path's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from apexrl.errors import ReplayTimeout

__all__ = ["SequenceSampler"]

_WHOLE_POLL = 0.005  # seconds between the size checks of a queue that does not hold a whole batch yet


class _Sampled:
    """What the learner's loop reads of a sampled batch: keys, IS weights and ``decoded``."""

    def __init__(self, keys: np.ndarray, weights: np.ndarray, decoded: tuple):
        self.keys, self.weights, self.decoded = keys, weights, decoded


class SequenceSampler:
    """``next(timeout)`` samples ``batch_size`` sequences of ``table`` and returns them as the learner's loop
    takes a prefetched batch, ``to_batch(fields, mask, extras)`` making the agent's batch of them (module
    docstring); TimeoutError when none came in time. One request at a time, in the learner's thread (no
    prefetching yet). ``whole`` (the queue reader): sample only once the table holds ``batch_size`` items."""

    def __init__(
        self,
        replay: Any,
        batch_size: int,
        beta: float,
        to_batch: Callable[[Any, np.ndarray, Any], dict[str, np.ndarray]],
        invalid: Any,
        table: str | None = None,
        whole: bool = False,
    ):
        self.replay, self.batch_size, self.beta, self.table = replay, batch_size, beta, table
        self._to_batch, self._invalid = to_batch, invalid
        self.whole = whole

    def _wait_whole(self, timeout: float | None) -> None:
        """A queue hands out what it holds, fewer than asked when it holds fewer: wait until it holds a whole
        batch, so that a batch is the items of every actor's round rather than of the first to send (TimeoutError
        when it does not within ``timeout``)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        name = self.table or "default"
        while True:
            try:
                size = self.replay.stats().get(f"table.{name}.size")  # one request
            except ReplayTimeout as e:
                raise TimeoutError(str(e)) from None
            if size is None or int(size) >= self.batch_size:  # None: a client that does not say, sample
                return
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"the queue {name} holds fewer than {self.batch_size} items")
            time.sleep(_WHOLE_POLL)

    def next(self, timeout: float | None = None) -> _Sampled:
        if self.whole:
            self._wait_whole(timeout)
        try:
            batch = self.replay.sample(self.batch_size, beta=self.beta, timeout=timeout, table=self.table)
        except ReplayTimeout as e:
            raise TimeoutError(str(e)) from None
        keys = np.ascontiguousarray(batch.keys)
        weights = np.asarray(batch.weights, np.float32)
        seq = batch.sequences
        every = np.ones(len(keys), bool)
        if seq is None:  # items that are not a writer's sequences: none of them can be trained on
            return _Sampled(keys, weights, ({}, every, "not a sequence item (inserted without a writer)", None, None))
        valid = np.asarray(seq.valid, bool)
        try:
            fields = self._to_batch(seq.fields, np.asarray(seq.mask, bool), seq.extras)
        except (KeyError, TypeError, ValueError) as e:
            return _Sampled(keys, weights, ({}, every, f"sequence items of another structure: {e}", None, None))
        bad = None if valid.all() else ~valid
        if bad is not None:
            fields = {name: v[valid] for name, v in fields.items()}
        message = None if bad is None else "a sequence item that could not be decoded"
        invalid, why = self._invalid(fields) if valid.any() else (None, None)
        return _Sampled(keys, weights, (fields, bad, message, invalid, why))

    def close(self) -> None:
        pass
