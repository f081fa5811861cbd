"""CURVE on a socket and the ZAP handler: the allow-list of client keys each secured server socket enforces.

A server socket (:func:`secure_server_socket`) turns on CURVE with the server's key pair and asks a ZAP
handler (one thread per ZeroMQ context, :class:`ZapHandler`) about every connecting client: a client whose
public key is not in ``authorized/`` is refused during the handshake, before any request reaches the
service. It fails closed: the socket sets ZMQ_ZAP_ENFORCE_DOMAIN, so if the handler thread is gone libzmq
refuses every client (without that option it would let every key in), and the service is told to stop
(``on_zap_failure``). A client socket (:func:`secure_client_socket`) needs its own key pair and the server's
public key. The handler gives each connection its key's identity as the ZMQ User-Id.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping
from typing import ClassVar

import zmq
from zmq.utils import z85

from apexrl.security.keys import LEARNER, ClientKeys, PathLike, ServerKeys, client_keys, server_keys

__all__ = ["ZAP_ENDPOINT", "ZapHandler", "secure_client_socket", "secure_server_socket"]

log = logging.getLogger("apexrl.security")

ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP specification (RFC 27), one per context
_ZAP_POLL_MS = 200


def secure_server_socket(
    sock: zmq.Socket, curve: ServerKeys | PathLike | None, *, on_zap_failure: Callable[[str], None] | None = None
) -> ServerKeys | None:
    """Turn on CURVE and the allow-list on a server socket (before it binds); no-op for ``curve=None``.

    Starts the ZAP handler of the socket's context if it has none yet; the handler's thread ends, closing its
    socket, when the context is terminated (so ``ctx.term()`` of the owner works unchanged). Sets
    ZMQ_ZAP_ENFORCE_DOMAIN: while the handler is gone every client is refused. ``on_zap_failure(reason)`` is
    called (from the dying handler thread) if it ever crashes: the service should log it and stop, since it
    can accept nobody any more (:meth:`ZapHandler.on_failure`).
    """
    keys = server_keys(curve)
    if keys is None:
        return None
    handler, domain = ZapHandler.register(sock.context, keys.identities or dict.fromkeys(keys.allowed, LEARNER))
    if on_zap_failure is not None:
        handler.on_failure(on_zap_failure)
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain)
    # Fail closed: without it libzmq lets every CURVE client in when no ZAP handler is bound (a dead thread).
    sock.setsockopt(zmq.ZAP_ENFORCE_DOMAIN, 1)
    return keys


def secure_client_socket(sock: zmq.Socket, curve: ClientKeys | PathLike | None) -> ClientKeys | None:
    """Turn on CURVE on a client socket (before it connects); no-op for ``curve=None``."""
    keys = client_keys(curve)
    if keys is None:
        return None
    sock.setsockopt(zmq.CURVE_SERVERKEY, keys.server_public)
    sock.setsockopt(zmq.CURVE_PUBLICKEY, keys.public)
    sock.setsockopt(zmq.CURVE_SECRETKEY, keys.secret)
    return keys


class ZapHandler:
    """The ZAP handler of one ZeroMQ context: allows a CURVE client iff its public key is on the allow-list
    of the domain (one domain per secured socket) it connects to; refuses everything else.

    Every secured socket sets ZMQ_ZAP_ENFORCE_DOMAIN, so while no handler is bound (its thread is gone)
    libzmq refuses every client instead of letting every key in. A service learns of that through
    :meth:`alive` (poll it) or :meth:`on_failure` (a callback from the dying thread; ``on_zap_failure`` of
    :func:`secure_server_socket`) and stops.
    """

    _lock = threading.Lock()
    _by_context: ClassVar[dict[int, ZapHandler]] = {}

    def __init__(self, ctx: zmq.Context):
        self.ctx = ctx
        self.domains: dict[bytes, dict[bytes, bytes]] = {}  # domain -> raw public key -> User-Id
        self.allowed = 0
        self.denied = 0
        self.failure: str | None = None  # why the thread ended, when it was not the context's termination
        self._callbacks: list[Callable[[str], None]] = []
        self._logged: set[bytes] = set()
        sock = ctx.socket(zmq.ROUTER)
        sock.setsockopt(zmq.LINGER, 0)
        sock.bind(ZAP_ENDPOINT)  # bound before any server socket exists: no handshake goes unanswered
        # Handed to the thread here (Thread.start is a memory barrier), never used by this thread again.
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="apexrl-zap", daemon=True)
        self._thread.start()

    @classmethod
    def register(cls, ctx: zmq.Context, allowed: Mapping[bytes, str]) -> tuple[ZapHandler, bytes]:
        """The handler of ``ctx`` (started if it has none, or a dead one) and the ZAP domain under which
        ``allowed`` (Z85 public key -> User-Id) is the allow-list."""
        with cls._lock:
            handler = cls._by_context.get(id(ctx))
            if handler is None or handler.ctx is not ctx or not handler.alive():
                handler = cls._by_context[id(ctx)] = ZapHandler(ctx)
            domain = f"apexrl-{len(handler.domains)}".encode()
            handler.domains[domain] = {z85.decode(k): user.encode() for k, user in allowed.items()}
            return handler, domain

    @classmethod
    def of(cls, ctx: zmq.Context) -> ZapHandler | None:
        """The live handler of ``ctx``, or None (none was started, or it is gone)."""
        with cls._lock:
            handler = cls._by_context.get(id(ctx))
        return handler if handler is not None and handler.ctx is ctx else None

    def alive(self) -> bool:
        """True while the handler thread answers ZAP requests."""
        return self._thread.is_alive()

    def on_failure(self, callback: Callable[[str], None]) -> None:
        """Call ``callback(reason)`` once if the thread ends for any reason but its context's termination
        (at once, in this thread, if it already did); otherwise in the dying handler thread."""
        with self._lock:
            if self.failure is None:
                self._callbacks.append(callback)
                return
            reason = self.failure
        callback(reason)

    def _serve(self, sock: zmq.Socket) -> None:
        reason: str | None = None
        try:
            while True:
                if sock.poll(_ZAP_POLL_MS):
                    sock.send_multipart(self._answer(sock.recv_multipart()))
        except zmq.ContextTerminated:
            pass
        except BaseException as exc:  # a bug: every later client is refused (ZMQ_ZAP_ENFORCE_DOMAIN)
            reason = f"{type(exc).__name__}: {exc}"
            log.critical("ZAP handler crashed (%s): every CURVE client is refused from now on", reason, exc_info=True)
        finally:
            sock.close(linger=0)  # unbinds ZAP_ENDPOINT: libzmq then refuses every handshake
            with self._lock:
                if self._by_context.get(id(self.ctx)) is self:
                    del self._by_context[id(self.ctx)]
                if reason is not None:
                    self.failure = reason
                callbacks, self._callbacks = self._callbacks, []
            if reason is not None:
                for callback in callbacks:
                    try:
                        callback(reason)
                    except Exception:  # one service's callback must not keep the others from theirs
                        log.exception("a ZAP failure callback raised")

    def _answer(self, msg: list[bytes]) -> list[bytes]:
        """The reply to one ZAP request (RFC 27): envelope, version, request id, status, text, user, metadata."""
        try:
            delim = msg.index(b"")
        except ValueError:
            return msg  # not a ZAP request (libzmq is the only peer of this socket): echo, it is dropped
        envelope, body = msg[: delim + 1], msg[delim + 1 :]
        request_id = body[1] if len(body) > 1 else b""
        user = None
        if len(body) >= 7 and body[0] == b"1.0" and body[5] == b"CURVE":
            user = self.domains.get(body[2], {}).get(body[6])
        if user is not None:  # its User-Id: every message of the connection carries it (role_of, may)
            self.allowed += 1
            return [*envelope, b"1.0", request_id, b"200", b"OK", user, b""]
        self.denied += 1
        self._log_denial(body)
        return [*envelope, b"1.0", request_id, b"400", b"client key not authorized", b"", b""]

    def _log_denial(self, body: list[bytes]) -> None:
        key = body[6] if len(body) >= 7 else b""
        if key in self._logged or len(self._logged) >= 100:  # bounded: a hostile peer cannot flood the log
            return
        self._logged.add(key)
        address = body[3].decode(errors="replace") if len(body) > 3 else "?"
        mechanism = body[5].decode(errors="replace") if len(body) > 5 else "?"
        shown = z85.encode(key).decode() if len(key) == 32 else "none"
        log.warning("refused a %s client from %s: key %s is not in the allow-list", mechanism, address, shown)
