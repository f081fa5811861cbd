"""Exceptions raised by the apexrl wire protocol, replay server and replay client."""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover - import only for annotations, avoids a cycle
    from apexrl.replay.protocol import Status

__all__ = ["ApexRLError", "ProtocolError", "ReplayTimeout", "ServerClosedError", "ServerError"]


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


class ServerClosedError(ApexRLError, ConnectionError):
    """The replay server is shutting down or the connection to it was closed."""
