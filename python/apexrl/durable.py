"""Durable file replacement: the one write-temporary, fsync, rename, fsync-directory sequence.

Used for everything apexrl must find intact after a crash or a full disk: learner checkpoints, the replay
server's key-epoch and spec sidecars. A reader sees the old file or the new one, never a torn one; a write
that fails (ENOSPC, EFBIG, EIO, a signal) removes its temporary and leaves ``path`` untouched. Temporaries are
named ``<path>.tmp.<pid>``, so one left by a writer killed mid-write is recognised and removed by the next
(:func:`remove_stale_temporaries`). Imports nothing from apexrl, and never torch.

Every temporary is created by :func:`create_private`: exclusively (``O_EXCL``), never through a symbolic link
(``O_NOFOLLOW``) and readable by its owner only (0600), so another local user cannot plant a link that makes
apexrl write elsewhere, nor read a file while it is written. :func:`make_private_dirs` creates run
directories 0700.
"""

from __future__ import annotations

import contextlib
import glob
import os
from typing import IO

__all__ = [
    "append_private",
    "create_private",
    "make_private_dirs",
    "open_private",
    "remove_stale_temporaries",
    "write_atomically",
]

_CREATE = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def create_private(path: str | os.PathLike[str]) -> int:
    """A write-only descriptor of a new file at ``path``, mode 0600, created exclusively and never through a
    symbolic link. Something already there (the temporary of a killed writer that had this pid, or a link
    someone planted) is unlinked first -- the link itself, never its target -- and creation tried once more;
    OSError if that fails too."""
    try:
        return os.open(path, _CREATE, 0o600)
    except FileExistsError:
        os.unlink(path)
        return os.open(path, _CREATE, 0o600)


def open_private(path: str | os.PathLike[str], text: bool = True, **kwargs) -> IO:
    """:func:`create_private` as a file object (``open``'s ``newline``, ``encoding``... in ``kwargs``)."""
    fd = create_private(path)
    try:
        return os.fdopen(fd, "w" if text else "wb", **kwargs)
    except BaseException:
        os.close(fd)
        raise


def append_private(path: str | os.PathLike[str], **kwargs) -> IO:
    """A text file object appending to ``path`` (created 0600 if missing; several writers may share it, e.g. the
    actors' episodes.csv), never through a symbolic link (OSError ELOOP if ``path`` is one)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        return os.fdopen(fd, "a", **kwargs)
    except BaseException:
        os.close(fd)
        raise


def make_private_dirs(path: str | os.PathLike[str]) -> None:
    """Create directory ``path`` and its missing parents with mode 0700; existing ones keep their mode (a
    directory the user chose, such as ``--run-dir .``, is not changed)."""
    path = os.path.abspath(os.fspath(path))
    if os.path.isdir(path):
        return
    parent = os.path.dirname(path)
    if parent != path:
        make_private_dirs(parent)
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        if not os.path.isdir(path):
            raise
        return
    os.chmod(path, 0o700)  # exactly, whatever the umask


def write_atomically(path: str | os.PathLike[str], data: bytes | str) -> None:
    """Replace ``path`` with ``data`` (str: UTF-8) durably; OSError (``path`` untouched) if that fails."""
    path = os.fspath(path)
    payload = data.encode("utf-8") if isinstance(data, str) else data
    tmp = f"{path}.tmp.{os.getpid()}"
    try:
        with open_private(tmp, text=False) as f:
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
