"""ReplayDataset: a replay server read as a ``torch.utils.data.IterableDataset`` of prefetched batches.

Imported only on first use of ``apexrl.replay.ReplayDataset`` (it imports torch; the rest of
``apexrl.replay`` does not).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import torch.utils.data

from apexrl.replay.client.beta import Beta, beta_at
from apexrl.replay.wire.codec import TransitionSpec
from apexrl.replay.wire.frames import frame_codec
from apexrl.replay.wire.steps import SequenceBatch
from apexrl.replay.wire.structure import unflatten

__all__ = ["ReplayDataset"]

_WORKERS_REFUSED = (
    "ReplayDataset refuses DataLoader worker processes (num_workers > 0): it already samples and decodes in "
    "background threads of the main process ({prefetch} batches prefetched, natively decoded without the GIL), "
    "so workers would add nothing but copies through shared memory; and every worker would open its own sampler, "
    "so the replay server would count each worker's samples against its rate limit and the keys of the "
    "workers' batches would interleave with no order the learner controls. Use "
    "DataLoader(dataset, batch_size=None, num_workers=0); give the dataset decode_threads=N for more cores."
)


class ReplayDataset(torch.utils.data.IterableDataset):
    """Prioritized batches from a replay server, as a torch ``IterableDataset``.

    ``endpoint_or_client`` is an endpoint (``tcp://HOST:PORT``; several, comma-separated, for a sharded
    replay) or a :class:`~apexrl.replay.ReplayClient` / :class:`~apexrl.replay.ShardedReplayClient` (the
    dataset samples over its own connection to the same servers; the given client is not used or closed).
    Each ``iter()`` starts a :class:`~apexrl.replay.client.sampler.PrefetchingSampler` that keeps up to ``prefetch``
    batches of ``batch_size`` items, drawn with IS exponent ``beta``, ready; it is closed when the iteration
    ends (the loop breaks, or the iterator is garbage-collected). Iteration never ends by itself: it waits for
    a server that is down or still below its ``min_size_to_sample``, like the learner.

    Every batch is a dict of fresh, writable numpy arrays (a ``DataLoader`` turns them into tensors):

    * ``keys`` (u64[n]), ``weights`` (f32[n], the IS weights), ``probabilities`` (f64[n]): always. Send new
      priorities back with the client's ``update_priorities(keys, priorities)``.
    * ``decode=None``: ``data`` (u8, the n items back to back) and ``offsets`` (u64[n + 1]; item ``i`` is
      ``data[offsets[i]:offsets[i + 1]]``), the raw items as the actors inserted them. A replay of frame
      stacks stored once (Atari) also returns the frame chunks the items reference, as the protocol's
      ``FrameChunks`` does: ``item_chunks`` (u64), ``item_chunk_offsets`` (u64[n + 1]), ``chunk_data`` (u8) and
      ``chunk_offsets`` (u64); ``apexrl.replay.wire.frames.frame_codec(spec).decode`` rebuilds the stacks.
    * ``decode=`` a :class:`~apexrl.replay.TransitionSpec`: ``fields``, a dict of the spec's fields, each
      ``(n, *shape)``; items are decoded natively, with the GIL released, in ``decode_threads`` threads. A
      spec with frame stacks (``TransitionSpec.atari()``, which actors store once) is rebuilt natively from the
      sampled chunks (``apexrl.replay.wire.frames``). A bad item (foreign spec, corrupted) raises ValueError from
      the iterator.
    * ``decode=`` a callable: ``decoded``, what ``decode(sampled_batch)`` returns (run in the decode threads;
      ``sampled_batch`` is a :class:`~apexrl.replay.client.replay_client.SampledBatch`).
    * ``decode="structure"``: ``fields``, the items in the table's pinned structure (``client.insert`` of a
      mapping pins it): the nested mapping of arrays they were inserted as, each ``(n, *shape)``, decoded
      natively as with a spec. The structure is asked of the server when the first batch comes (and again
      when items carry another spec's fingerprint); ValueError from the iterator when the table has none.
      On a table of sequence items (a TrajectoryWriter's, ``client.writer``; also through a
      ShardedReplayClient): ``fields``, the appended steps' nesting with arrays ``(n, T, *shape)`` (T: the
      longest ``max_sequence_length`` among the batch's items), ``mask`` (bool ``(n, T)``: an item's valid
      steps; an item shorter than T, an episode's end, is padded with zeros), ``extras`` (the per-item extras'
      nesting, arrays ``(n, *shape)``; zeros where an item has none) and ``valid`` (bool ``(n,)``: False for an
      item that could not be decoded, whose mask is all False and its steps zeros; ``erase`` its key, or let
      the mask keep it out of the loss), decoded natively with the GIL released.

    ``table``: the server's table it samples (default ``"default"``).

    ``beta``: the importance-sampling exponent, a number or a schedule: a callable of the batch index (0, 1, ...
    per ``iter()``; with one update per batch, the learner step) such as
    :func:`~apexrl.replay.client.beta.linear_beta`, asked when the batch is requested (up to ``prefetch``
    batches before it is taken). A value that is not a finite number >= 0 raises ValueError from the iterator.

    Use it with ``DataLoader(dataset, batch_size=None, num_workers=0)``: the dataset yields whole batches
    (``batch_size=None`` keeps the DataLoader from stacking several). Worker processes (``num_workers > 0``)
    are refused with a RuntimeError that says why: the sampler's threads already prefetch and decode in this
    process, and each worker would open a sampler of its own, whose samples the server would count against its
    rate limit and whose batches would interleave in no order the consumer controls.
    """

    def __init__(
        self,
        endpoint_or_client: Any,
        batch_size: int,
        beta: Beta = 0.4,
        decode: TransitionSpec | str | Callable[[Any], Any] | None = None,
        prefetch: int = 16,
        *,
        decode_threads: int = 1,
        timeout: float = 10.0,
        table: str = "default",
    ):
        super().__init__()
        if isinstance(endpoint_or_client, str):
            from apexrl.replay.client.sharded import split_endpoints  # only here

            split_endpoints(endpoint_or_client)  # a malformed endpoint fails here, not at the first batch
        elif not callable(getattr(endpoint_or_client, "sampler", None)):
            raise TypeError(
                "endpoint_or_client must be an endpoint string or a ReplayClient / ShardedReplayClient, "
                f"got {type(endpoint_or_client).__name__}"
            )
        if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
        if isinstance(prefetch, bool) or not isinstance(prefetch, int) or prefetch < 1:
            raise ValueError(f"prefetch must be an integer >= 1, got {prefetch!r}")
        if isinstance(decode_threads, bool) or not isinstance(decode_threads, int) or not 1 <= decode_threads <= 64:
            raise ValueError(f"decode_threads must be an integer from 1 to 64, got {decode_threads!r}")
        if (
            decode is not None
            and decode != "structure"
            and not isinstance(decode, TransitionSpec)
            and not callable(decode)
        ):
            raise TypeError(
                f"decode must be None, a TransitionSpec, 'structure' or a callable, got {type(decode).__name__}"
            )
        self.endpoint_or_client = endpoint_or_client
        self.batch_size = batch_size
        beta_at(beta, 0)  # a bad beta or schedule fails here, not at the first batch
        self.beta: Beta = beta if callable(beta) else float(beta)
        self.decode = decode
        self.prefetch = prefetch
        self.decode_threads = decode_threads
        self.timeout = float(timeout)
        if not isinstance(table, str) or not table:
            raise ValueError(f"table must be a table's name, got {table!r}")
        self.table = table

    def _hook(self, client: Any) -> Callable[[Any], Any] | None:
        decode = self.decode
        if isinstance(decode, str):  # "structure", the one string __init__ accepts
            return _StructureHook(client, self.table)
        if isinstance(decode, TransitionSpec):
            spec = decode
            codec = frame_codec(spec)
            stored_once = codec.item_spec.fingerprint if codec is not None else None

            def fields(raw: Any) -> dict[str, np.ndarray]:  # fresh arrays per batch: the consumer may keep them
                # The items say which layout they are in (their fingerprint): frame stacks stored once are
                # rebuilt from the chunks the sample carries; items in the spec's own layout decode natively.
                if stored_once is not None and _first_fingerprint(raw) == stored_once:
                    assert codec is not None  # stored_once comes from it
                    fields, bad, message = codec.decode_valid_into(
                        raw.data, raw.offsets, getattr(raw, "chunks", None), codec.empty_batch(len(raw))
                    )
                    if bad is not None:
                        raise ValueError(message)
                    return {name: fields[name] for name in spec.names}
                return spec.decode_into(raw.data, raw.offsets, spec.empty_batch(len(raw)))

            return fields
        return decode

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if torch.utils.data.get_worker_info() is not None:
            raise RuntimeError(_WORKERS_REFUSED.format(prefetch=self.prefetch))
        return self._batches()

    def _batches(self) -> Iterator[dict[str, Any]]:
        owned = None
        client = self.endpoint_or_client
        if isinstance(client, str):
            from apexrl.replay.client.sharded import connect  # only here

            client = owned = connect(client, self.timeout)
        mode = (
            "raw"
            if self.decode is None
            else "fields"
            if isinstance(self.decode, TransitionSpec) or self.decode == "structure"
            else "decoded"
        )
        try:
            sampler = client.sampler(
                self.batch_size,
                beta=self.beta,
                prefetch=self.prefetch,
                decode=self._hook(client),
                decode_threads=self.decode_threads,
                table=self.table,
            )
            with sampler:
                for batch in sampler:
                    out: dict[str, Any] = {
                        "keys": np.array(batch.keys, dtype=np.uint64),
                        "weights": np.array(batch.weights, dtype=np.float32),
                        "probabilities": np.array(batch.probabilities, dtype=np.float64),
                    }
                    if mode == "raw":
                        out["data"] = np.frombuffer(batch.raw.data, dtype=np.uint8).copy()
                        out["offsets"] = np.array(batch.raw.offsets, dtype=np.uint64)
                        chunks = getattr(batch.raw, "chunks", None)
                        if chunks is not None and len(chunks.chunk_offsets) > 1:
                            out["item_chunks"] = np.array(chunks.item_chunks, dtype=np.uint64)
                            out["item_chunk_offsets"] = np.array(chunks.item_chunk_offsets, dtype=np.uint64)
                            out["chunk_data"] = np.frombuffer(chunks.chunk_data, dtype=np.uint8).copy()
                            out["chunk_offsets"] = np.array(chunks.chunk_offsets, dtype=np.uint64)
                    elif isinstance(batch.decoded, SequenceBatch):  # decode="structure" on sequence items
                        seq = batch.decoded
                        out.update(fields=seq.fields, mask=seq.mask, extras=seq.extras, valid=seq.valid)
                    else:
                        out[mode] = batch.decoded
                    yield out
        finally:
            if owned is not None:
                owned.close()

    def __repr__(self) -> str:
        target = (
            self.endpoint_or_client
            if isinstance(self.endpoint_or_client, str)
            else type(self.endpoint_or_client).__name__
        )
        return (
            f"ReplayDataset({target!r}, batch_size={self.batch_size}, beta={self.beta}, "
            f"decode={self.decode!r}, prefetch={self.prefetch}, decode_threads={self.decode_threads})"
        )


def _first_fingerprint(raw: Any) -> int | None:
    """The spec fingerprint the first sampled item starts with (None for an empty batch or a short item)."""
    offsets = raw.offsets
    if len(offsets) < 2 or int(offsets[1]) - int(offsets[0]) < 4:
        return None
    start = int(offsets[0])
    return int.from_bytes(bytes(memoryview(raw.data).cast("B")[start : start + 4]), "little")


class _StructureHook:
    """``decode="structure"``: sampled items decoded into their table's pinned structure, which is asked of the
    server (``client.tables()``) on the first batch and whenever items carry another fingerprint; sequence items
    come decoded with the sampled batch (its ``sequences``, fresh arrays) and are handed on as they are. Called
    from the decode threads: the lookup holds a lock (the client is not used by anything else meanwhile)."""

    def __init__(self, client: Any, table: str):
        self.client, self.table = client, table
        self.spec: TransitionSpec | None = None
        self.lock = threading.Lock()

    def _spec_for(self, fingerprint: int | None) -> TransitionSpec:
        with self.lock:
            spec = self.spec
            if spec is None or (fingerprint is not None and spec.fingerprint != fingerprint):
                pinned = self.client.tables()[self.table].get("spec")
                if not isinstance(pinned, dict):
                    raise ValueError(
                        f"table {self.table!r} has no pinned structure (insert a mapping of arrays, or configure "
                        "or declare a spec): decode='structure' cannot decode its items"
                    )
                spec = self.spec = TransitionSpec.from_json(json.dumps(pinned))
            return spec

    def __call__(self, raw: Any) -> dict[str, Any] | SequenceBatch:
        sequences = getattr(raw, "sequences", None)
        if sequences is not None:
            return sequences
        spec = self._spec_for(_first_fingerprint(raw))
        return unflatten(spec.decode_into(raw.data, raw.offsets, spec.empty_batch(len(raw))))
