"""Exceptions raised by the apexrl wire protocol, its servers and its clients.

Imports only the schema (for :class:`Status`); the protocol, transport and clients import this module.
"""

from __future__ import annotations

from apexrl.replay.wire.schema import Status

__all__ = [
    "ApexRLError",
    "AuthenticationError",
    "Interrupted",
    "ProtocolError",
    "ReplayTimeout",
    "ServerClosedError",
    "ServerError",
    "ServerShuttingDownError",
    "ServerTimeoutError",
    "StaleChunksError",
    "error_of",
]


class ApexRLError(Exception):
    """Base class of every apexrl-specific error."""


class ProtocolError(ApexRLError):
    """A message broke the wire protocol; ``status`` is the error code to answer it with.

    ``op`` and ``request_id`` are the raw values read from the offending header when it was readable
    enough (at least 16 bytes with the right magic), else ``None``; a server echoes them in its error reply.
    """

    def __init__(self, status: Status, message: str, *, op: int | None = None, request_id: int | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.op = op
        self.request_id = request_id

    def __repr__(self) -> str:
        return f"ProtocolError({self.status!r}, {self.message!r})"


class ServerError(ApexRLError):
    """The server answered a request with an error reply; ``status`` is the code it sent."""

    def __init__(self, status: Status, message: str):
        super().__init__(f"{getattr(status, 'name', status)}: {message}")
        self.status = status
        self.message = message


class ReplayTimeout(ApexRLError, TimeoutError):
    """A replay request did not complete within its timeout."""


class AuthenticationError(ApexRLError, PermissionError):
    """The server refused this client's CURVE key during the handshake (not on its allow-list)."""


class ServerClosedError(ApexRLError, ConnectionError):
    """The replay server is shutting down or the connection to it was closed."""


class ServerTimeoutError(ServerError, ReplayTimeout):
    """The server answered TIMEOUT (e.g. the store stayed below min_size_to_sample for timeout_ms)."""


class ServerShuttingDownError(ServerError, ServerClosedError):
    """The server answered SHUTTING_DOWN."""


class StaleChunksError(ServerError):
    """The server answered STALE_CHUNKS: an INSERT referenced stored chunks that are gone (every item
    referencing them was removed, or the server restarted without them). Nothing was stored; ``keys`` lists the
    stale chunk keys the message names (the sender sends those chunks again)."""

    def __init__(self, status: Status, message: str):
        super().__init__(status, message)
        tail = message.split(":")[-1]
        # The server lists the first 64 keys, then "... (N in all)": `complete` says whether all are here.
        self.complete = "in all" not in tail
        self.keys = [int(t) for t in tail.split("...")[0].split() if t.isdigit()]


def error_of(status: Status, message: str) -> ServerError:
    """The exception for an error reply: ServerTimeoutError (TIMEOUT), ServerShuttingDownError
    (SHUTTING_DOWN), StaleChunksError (STALE_CHUNKS), else ServerError."""
    if status == Status.STALE_CHUNKS:
        return StaleChunksError(status, message)
    if status == Status.TIMEOUT:
        return ServerTimeoutError(status, message)
    if status == Status.SHUTTING_DOWN:
        return ServerShuttingDownError(status, message)
    return ServerError(status, message)


class Interrupted(ApexRLError):
    """A call was abandoned because its client was interrupted (:meth:`Transport.interrupt`) from another
    thread: how a background helper's ``close()`` stops a request that is still waiting for its reply."""
