"""Durable file replacement: the one write-temporary, fsync, rename, fsync-directory sequence.

Used for everything apexrl must find intact after a crash or a full disk: learner checkpoints, the replay
server's key-epoch and spec sidecars. A reader sees the old file or the new one, never a torn one; a write
that fails (ENOSPC, EFBIG, EIO, a signal) removes its temporary and leaves ``path`` untouched. Temporaries are
named ``<path>.tmp.<pid>``, so one left by a writer killed mid-write is recognised and removed by the next
(:func:`remove_stale_temporaries`). Imports nothing from apexrl, and never torch.
"""

from __future__ import annotations

import contextlib
import glob
import os

__all__ = ["remove_stale_temporaries", "write_atomically"]


def write_atomically(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace ``path`` with ``data`` (str: UTF-8) durably; OSError (``path`` untouched) if that fails."""
    path = os.fspath(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open(tmp, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    dir_fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def remove_stale_temporaries(path: str | os.PathLike[str]) -> None:
    """Remove ``<path>.tmp.<pid>`` files whose writer is gone (killed mid-write); live writers' are kept."""
    for stale in glob.glob(glob.escape(os.fspath(path)) + ".tmp.*"):
        pid = stale.rsplit(".", 1)[-1]
        if pid.isdigit() and int(pid) != os.getpid() and not _alive(int(pid)):
            with contextlib.suppress(OSError):
                os.unlink(stale)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
