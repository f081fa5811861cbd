"""Key epochs of a replay server's lives (docs/protocol.md, "Keys"), and the errors of its snapshot files.

Each life of the server gives its store a new key epoch, recorded in ``PATH.epoch`` beside the snapshot before
the server binds, so keys of an earlier life never address an item of this one.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets

from apexrl import PrioritizedStore
from apexrl.durable import remove_stale_temporaries, write_atomically
from apexrl.errors import ApexRLError

__all__ = ["SnapshotLoadError", "SnapshotSaveError", "choose_epoch"]

log = logging.getLogger("apexrl.replay.server")


class SnapshotLoadError(ApexRLError):
    """The configured snapshot file exists but cannot be loaded (corrupt, truncated, unreadable)."""


def _random_epoch(exclude: int = 0) -> int:
    """An epoch in 1..MAX_EPOCH from os.urandom (via secrets), other than `exclude`."""
    while True:
        epoch = secrets.randbelow(PrioritizedStore.MAX_EPOCH) + 1
        if epoch != exclude:
            return epoch


def _read_epoch_file(sidecar: str) -> int | None:
    """The epoch recorded in `sidecar`, None if there is none; SnapshotLoadError if it is unreadable."""
    try:
        with open(sidecar, encoding="ascii") as f:
            text = f.read().strip()
    except FileNotFoundError:
        return None
    except (OSError, UnicodeDecodeError) as exc:
        raise SnapshotLoadError(f"cannot read the key epoch file {sidecar!r}: {exc}") from exc
    if not text.isdigit() or not 1 <= int(text) <= PrioritizedStore.MAX_EPOCH:
        raise SnapshotLoadError(
            f"key epoch file {sidecar!r} holds {text[:40]!r}, not an epoch in 1..{PrioritizedStore.MAX_EPOCH} "
            "(it records the last epoch this server's keys used; delete it only if no client holds keys of it)"
        )
    return int(text)


def _write_epoch_file(sidecar: str, epoch: int) -> None:
    """Records `epoch` durably (apexrl.durable: temporary file, fsync, rename, fsync of the directory)."""
    remove_stale_temporaries(sidecar)  # of a life killed while writing it
    try:
        write_atomically(sidecar, f"{epoch}\n")
    except OSError as exc:
        raise SnapshotLoadError(f"cannot record the key epoch in {sidecar!r}: {exc}") from exc


def choose_epoch(snapshot: str | os.PathLike[str] | None) -> int:
    """The key epoch of a new server life (docs/protocol.md, "Keys").

    With a snapshot path, ``PATH.epoch`` records the epoch of the latest life and is rewritten (durably, before
    the server binds) with the next one, so consecutive lives never share an epoch. The sidecar alone decides:
    ``max(sidecar, snapshot's epoch)`` would go wrong at the wrap from 4095 to 1. A snapshot without its
    sidecar (deleted, or written elsewhere) gives a random epoch other than the snapshot's; no path at all, a
    random epoch (a 1 in 4095 chance of meeting the previous life's).
    """
    if snapshot is None:
        epoch = _random_epoch()
        log.info("no snapshot path: key epoch %d drawn at random", epoch)
        return epoch
    path = os.fspath(snapshot)
    sidecar = path + ".epoch"
    last = _read_epoch_file(sidecar)
    saved = 0
    if os.path.exists(path):
        with contextlib.suppress(Exception):  # an unreadable snapshot is reported when it is loaded
            saved = PrioritizedStore.snapshot_epoch(path)
    if last is not None:
        epoch = last % PrioritizedStore.MAX_EPOCH + 1
        if epoch == saved:  # only if the sidecar is 4094 lives behind: skip the snapshot's own epoch
            epoch = epoch % PrioritizedStore.MAX_EPOCH + 1
    else:
        epoch = _random_epoch(exclude=saved)
        if saved:
            log.warning("key epoch file %s is missing: epoch %d drawn at random", sidecar, epoch)
    _write_epoch_file(sidecar, epoch)
    return epoch


class SnapshotSaveError(ApexRLError):
    """The final snapshot at stop() could not be written; the message says how many items it would have held."""
