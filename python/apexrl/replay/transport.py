"""A request/reply client's socket: one ZeroMQ DEALER to one endpoint, replaced after a timeout.

Shared by :class:`apexrl.client.ReplayClient` and :class:`apexrl.params.ParamClient`. A client that got no reply
in time calls :meth:`DealerClient._reset`: the old socket (and any late reply queued on it) is dropped, and the
new one reconnects, so a server restarted on the same endpoint is reached by the next call. Request ids start
at a random point so that ids of an earlier client process never collide with this one's.
"""

from __future__ import annotations

import itertools
import random
import threading
from typing import Any

import zmq

__all__ = ["DealerClient"]


class DealerClient:
    """Owns the context, the socket, the call lock and the request-id counter; subclasses add the calls.

    ``max_message_bytes`` sets ZMQ_MAXMSGSIZE: a larger reply drops the connection before it is allocated.
    """

    def __init__(self, endpoint: str, *, max_message_bytes: int | None = None):
        self.endpoint = endpoint
        self._max_message_bytes = max_message_bytes
        self._lock = threading.Lock()
        self._ctx: zmq.Context | None = zmq.Context()
        self._sock: zmq.Socket | None = None
        self._ids = itertools.count(random.randrange(1, 1 << 62))
        self._connect()

    def _connect(self) -> None:
        assert self._ctx is not None
        sock = self._ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.RECONNECT_IVL, 50)
        sock.setsockopt(zmq.RECONNECT_IVL_MAX, 1000)
        if self._max_message_bytes is not None:
            sock.setsockopt(zmq.MAXMSGSIZE, self._max_message_bytes)
        sock.connect(self.endpoint)
        self._sock = sock

    def _reset(self) -> None:
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = None
        self._connect()

    def close(self) -> None:
        """Close the socket and context (idempotent)."""
        with self._lock:
            if self._sock is not None:
                self._sock.close(linger=0)
                self._sock = None
            if self._ctx is not None:
                self._ctx.term()
                self._ctx = None

    @property
    def closed(self) -> bool:
        return self._ctx is None

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:  # best effort; close() explicitly
        try:
            if self._ctx is not None:
                self.close()
        except Exception:
            pass
