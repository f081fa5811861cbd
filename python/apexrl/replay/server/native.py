"""Binding the native serving loop to the libzmq that pyzmq loaded.

pyzmq's wheel bundles libzmq under a hashed name (``pyzmq.libs/libzmq-<hash>.so.5``) and loads it privately,
so the extension cannot link it. The loop binds the few C functions it calls by ``dlopen(RTLD_NOLOAD)`` of the
exact file this process already mapped for pyzmq (found in ``/proc/self/maps``), and drives the socket pyzmq
created (``Socket.underlying``). If that file cannot be found or bound, the server refuses to start with
:class:`NativeLoopError` saying why; it never falls back to another libzmq.
"""

from __future__ import annotations

import os

import zmq

from apexrl.errors import ApexRLError

__all__ = ["NativeLoopError", "libzmq_path"]


class NativeLoopError(ApexRLError):
    """The native serving loop cannot run in this process (no libzmq to bind, too old a libzmq, ...)."""


def libzmq_path() -> str:
    """The file of the libzmq that pyzmq loaded in this process; NativeLoopError when there is none to find."""
    zmq.zmq_version()  # the backend (and with it libzmq) is loaded
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as f:
            lines = f.read().splitlines()
    except OSError as exc:
        raise NativeLoopError(f"cannot read /proc/self/maps to find pyzmq's libzmq: {exc}") from None
    found: list[str] = []
    for line in lines:
        parts = line.split(maxsplit=5)
        if len(parts) == 6 and os.path.basename(parts[5]).startswith("libzmq") and parts[5] not in found:
            found.append(parts[5])
    if not found:
        raise NativeLoopError(
            f"pyzmq {zmq.__version__} has no libzmq shared library mapped in this process (a statically linked "
            "build?); the replay server's native loop needs pyzmq's wheel, which bundles libzmq as a shared library"
        )
    bundled = [p for p in found if "pyzmq.libs" in p]
    return (bundled or found)[0]
