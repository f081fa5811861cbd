"""The learner's readers of sequence items (``ReplayPath.reader`` ``"sequences"`` or ``"queue"``; R2D2).

Both hand the learner's loop the agent's batch (``ReplayPath.make_batch`` of the items' ``.fields``/``.mask``/
``.extras``) with the same ``decoded`` tuple the transition decoders give (the good items' fields, which items
did not decode, which decoded ones the agent refuses), so the loop, its erasures and its counters are the
transition path's:

- :class:`SequenceDecoder`, the ``"sequences"`` reader's: the hook of the transition path's
  :class:`~apexrl.replay.client.sampler.PrefetchingSampler`, whose sampling threads keep batches ahead of the
  learner and whose decode threads copy each batch's steps natively (the GIL released) into a ring of
  preallocated batches.
- :class:`SequenceSampler`, the ``"queue"`` reader's: one request at a time in the learner's thread, once the
  queue holds a whole batch (prefetching would take items of a round before the round is complete).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from apexrl.errors import ReplayTimeout
from apexrl.replay.client.replay_client import sequences_of
from apexrl.replay.wire.steps import SequenceBatch

__all__ = ["SequenceDecoder", "SequenceSampler", "agent_batch"]

_WHOLE_POLL = 0.005  # seconds between the size checks of a queue that does not hold a whole batch yet


class _Sampled:
    """What the learner's loop reads of a sampled batch: keys, IS weights and ``decoded``."""

    def __init__(self, keys: np.ndarray, weights: np.ndarray, decoded: tuple):
        self.keys, self.weights, self.decoded = keys, weights, decoded


Decoded = tuple[dict[str, np.ndarray], np.ndarray | None, str | None, np.ndarray | None, str | None]
ToBatch = Callable[[Any, np.ndarray, Any], dict[str, np.ndarray]]


def agent_batch(seq: SequenceBatch | None, n: int, to_batch: ToBatch, invalid: Any) -> Decoded:
    """The ``decoded`` tuple of a sampled batch of ``n`` items whose sequences decoded to ``seq`` (None: the items
    are not a writer's sequences, none can be trained on)."""
    every = np.ones(n, bool)
    if seq is None:
        return {}, every, "not a sequence item (inserted without a writer)", None, None
    valid = np.asarray(seq.valid, bool)
    try:
        fields = to_batch(seq.fields, np.asarray(seq.mask, bool), seq.extras)
    except (KeyError, TypeError, ValueError) as e:
        return {}, every, f"sequence items of another structure: {e}", None, None
    bad = None if valid.all() else ~valid
    if bad is not None:
        fields = {name: v[valid] for name, v in fields.items()}
    message = None if bad is None else "a sequence item that could not be decoded"
    bad_values, why = invalid(fields) if valid.any() else (None, None)
    return fields, bad, message, bad_values, why


class SequenceDecoder:
    """The ``"sequences"`` reader: a :class:`~apexrl.replay.client.sampler.SlotDecoder` whose slots are the step
    arrays of one batch, reused batch after batch (allocated on a slot's first batch, or again when the items'
    structure changes). The sampling threads leave the sequences undecoded (``decodes_sequences``); a decode
    thread copies the steps into the slot (``_core.decode_steps``, the GIL released) and makes the agent's batch
    (``to_batch``, which may hand on the slot's arrays: they stay valid until the learner's next batch)."""

    decodes_sequences = True

    def __init__(self, to_batch: ToBatch, invalid: Any):
        self._to_batch, self._invalid = to_batch, invalid

    def allocate(self) -> dict[str, np.ndarray]:
        return {}

    def decode_into(self, raw: Any, slot: dict[str, np.ndarray]) -> Decoded:
        seq = raw.sequences
        if seq is None:
            seq = sequences_of(raw.data, raw.offsets, raw.chunks, reuse=slot)
        return agent_batch(seq, len(raw.keys), self._to_batch, self._invalid)


class SequenceSampler:
    """``next(timeout)`` samples ``batch_size`` sequences of ``table`` and returns them as the learner's loop
    takes a prefetched batch, ``to_batch(fields, mask, extras)`` making the agent's batch of them (module
    docstring); TimeoutError when none came in time. One request at a time, in the learner's thread. ``whole``
    (the queue reader): sample only once the table holds ``batch_size`` items."""

    def __init__(
        self,
        replay: Any,
        batch_size: int,
        beta: float,
        to_batch: ToBatch,
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
        return _Sampled(keys, weights, agent_batch(batch.sequences, len(keys), self._to_batch, self._invalid))

    def close(self) -> None:
        pass
