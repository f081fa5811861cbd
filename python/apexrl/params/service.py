"""The apexrl parameter service: the learner serves versioned weights, actors pull them.

::

    learner process                                   actor process(es)
    ParamServer.publish(state_dict) -> version        ParamClient.fetch(have_version)
      serialise once (safetensors bytes)               DEALER ──tcp──► ROUTER (server thread)
      swap (version, bytes) in atomically              ◄── (latest version, server_id, weights or nothing)

* **No pickle.** Weights travel as one `safetensors <https://github.com/huggingface/safetensors>`_ frame: an
  8-byte length, a JSON header (names, dtypes, shapes, offsets) and the raw tensor bytes. The client parses
  it with ``safetensors.torch.load``, which never executes anything.
* **Cheap for the learner.** :meth:`ParamServer.publish` serialises in the caller (a few ms for an Atari
  network) and swaps a reference under a lock; the sockets are touched only by the server thread, which
  sends the same bytes object to every actor without copying it (``copy=False``).
* **Versions** are 1, 2, ... per :class:`ParamServer` instance. Each instance also draws a random non-zero
  32-bit ``server_id``; a request carries the version *and* the server_id of the weights the actor holds,
  and the server answers UNCHANGED only when both match its latest. So an actor that still holds version 7
  of a learner that was restarted (and counts from 1 again) gets the new weights, never a false UNCHANGED.
* **Validation** on both sides: the server checks every header field and the frame count of a request and
  answers an error reply (it keeps serving after any garbage); the client checks every field of the reply,
  its size against its own cap, and optionally the names/dtypes/shapes of the tensors (``expected``).
* **One protocol, one request loop** with the replay service: the messages are the GET_PARAMS kind of
  :mod:`apexrl.replay.wire.schema` (same header, statuses and validation), and :class:`ParamClient` sends them
  through the replay client's :class:`~apexrl.replay.wire.transport.Transport`: request ids are matched (a late
  reply to a timed-out request is discarded), a timeout raises :class:`ParamsTimeout` and resets the socket,
  so a learner restarted on the same endpoint is reached by the next call.
* :class:`ParamPoller` is the actor-loop helper: it fetches at most every ``every_frames`` env frames, loads
  new weights through a callback, and never raises on a timeout or a refused message (it counts them).

The wire format is specified in docs/protocol.md (the GET_PARAMS rows, and section "Parameter service").
"""

from __future__ import annotations

import logging
import math
import operator
import random
import threading
from collections.abc import Callable, Mapping
from enum import IntEnum
from typing import Any

import safetensors.torch
import torch
import zmq

from apexrl.errors import ProtocolError, ReplayTimeout, ServerClosedError, ServerError
from apexrl.params.tensors import TensorSpec, describe_mismatch, spec_of
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.roles import may
from apexrl.replay.wire.schema import HEADER_SIZE, PARAMS_MAX_REQUEST_BYTES, Op, Status
from apexrl.replay.wire.transport import Transport, TransportClient
from apexrl.security import (
    SERVICE_HWM,
    ClientKeys,
    ServerKeys,
    limit_idle_connections,
    secure_server_socket,
    server_keys,
    warn_if_exposed,
)

__all__ = [
    "FetchStatus",
    "ParamClient",
    "ParamPoller",
    "ParamServer",
    "ParamsTimeout",
    "TensorSpec",
    "check_tensors",
    "deserialize_tensors",
    "serialize_tensors",
    "spec_of",
]

log = logging.getLogger("apexrl.params.service")

_U32 = 0xFFFF_FFFF
_U64 = 0xFFFF_FFFF_FFFF_FFFF
_POLL_MS = 50  # server thread: longest it takes to notice close()
_PARKED_POLL_MS = 5  # server thread: how often parked weights replies are looked at


class FetchStatus(IntEnum):
    """What :meth:`ParamClient.fetch` got (a client-side outcome, not a wire status: on the wire all three
    are an OK reply to GET_PARAMS, told apart by its version and whether its weights frame is empty)."""

    PARAMS = 0  # new weights
    UNCHANGED = 1  # the requester already holds the latest version
    NOT_READY = 2  # nothing published yet


class ParamsTimeout(ReplayTimeout):
    """A parameter fetch got no reply within the client's timeout (also a ``TimeoutError``)."""


# --------------------------------------------------------------------------------------------- tensors


def check_tensors(tensors: Mapping[str, torch.Tensor], expected: Mapping[str, tuple[torch.dtype, Any]]) -> None:
    """ValueError naming the missing, unexpected and mismatched (dtype/shape) names; None if all match."""
    msg = describe_mismatch(expected, tensors)
    if msg:
        raise ValueError(f"weights do not match the expected tensors: {msg}")


def serialize_tensors(tensors: Mapping[str, torch.Tensor]) -> bytes:
    """safetensors bytes of named tensors (moved to CPU, made contiguous, shared storage de-duplicated)."""
    if not isinstance(tensors, Mapping):
        raise TypeError(f"tensors must be a mapping of str -> torch.Tensor, got {type(tensors).__name__}")
    flat: dict[str, torch.Tensor] = {}
    storages: set[int] = set()
    for name, t in tensors.items():
        if not isinstance(name, str) or not name or name == "__metadata__":
            raise ValueError(f"tensor names must be non-empty str other than '__metadata__', got {name!r}")
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensors[{name!r}] must be a torch.Tensor, got {type(t).__name__}")
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if t.numel() and ptr in storages:  # safetensors refuses tensors that share memory (tied weights)
            t = t.clone()
            ptr = t.untyped_storage().data_ptr()
        storages.add(ptr)
        flat[name] = t
    return safetensors.torch.save(flat)


def deserialize_tensors(data: bytes) -> dict[str, torch.Tensor]:
    """Named CPU tensors from safetensors bytes (they own their memory); ProtocolError if malformed."""
    try:
        return safetensors.torch.load(bytes(data))
    except Exception as exc:  # noqa: BLE001 - SafetensorError, KeyError (dtype), ... : all "bad message"
        raise ProtocolError(
            Status.BAD_MESSAGE, f"weights frame is not valid safetensors: {type(exc).__name__}: {exc}"
        ) from None


# ---------------------------------------------------------------------------------------------- server


class ParamServer:
    """Serves the latest published weights on ``tcp://bind:port`` (port 0: ephemeral, see :attr:`endpoint`).

    ``publish`` may be called from any thread (before or after ``start``); the ROUTER socket is owned by one
    background thread, which answers each GET at once (no request waits on another: an answer is a header
    plus a reference to the current bytes). A peer that does not read its replies pins at most two weights
    replies (:class:`_WeightsSender`); the others are dropped and counted in ``stats()["dropped"]``.
    ``max_message_mb`` caps what ``publish`` accepts (clients
    refuse bigger replies with their own cap, default the same). Requests are capped by ZMQ_MAXMSGSIZE
    (``PARAMS_MAX_REQUEST_BYTES`` bytes per frame): libzmq disconnects a peer that sends a bigger frame.
    ``curve`` (a key directory or :class:`~apexrl.security.ServerKeys`) turns on CURVE and the client allow-list.
    If its ZAP handler dies (nobody could authenticate any more) the service logs a CRITICAL line, stops,
    sets :attr:`failure` and calls ``on_failure(reason)`` (from another thread): the learner stops with it.

    Nothing is served until it is started: ``with ParamServer() as params:`` starts it (and closes it at the
    block's end), or call :meth:`start` and :meth:`close`. Then ``params.endpoint`` is the address actors give
    :class:`ParamClient`, and ``params.publish(model.state_dict())`` makes new weights their latest;
    :class:`ParamPoller` fetches them in an actor's loop.
    """

    def __init__(
        self,
        bind: str = "127.0.0.1",
        port: int = 0,
        max_message_mb: float = 512,
        *,
        curve: ServerKeys | str | None = None,
        on_failure: Callable[[str], None] | None = None,
    ):
        if not 0 <= int(port) <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {port}")
        if not (max_message_mb > 0 and math.isfinite(max_message_mb)):
            raise ValueError(f"max_message_mb must be > 0, got {max_message_mb}")
        self.bind = bind
        self.port = int(port)
        self.max_bytes = int(max_message_mb * (1 << 20))
        self.curve = server_keys(curve)
        self.server_id = random.randrange(1, _U32 + 1)
        self._lock = threading.Lock()
        self._version = 0
        self._current: tuple[int, bytes] | None = None
        self._endpoint: str | None = None
        self._ctx: zmq.Context | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.failure: str | None = None  # why the service stopped on its own (its ZAP handler died)
        self._on_failure = on_failure
        self._counts = {
            "requests": 0,
            "params": 0,
            "unchanged": 0,
            "not_ready": 0,
            "errors": 0,
            "dropped": 0,
            "parked": 0,
            "forbidden": 0,
        }

    @property
    def endpoint(self) -> str:
        """The bound endpoint, e.g. ``tcp://127.0.0.1:40123`` (after :meth:`start`)."""
        if self._endpoint is None:
            raise RuntimeError("ParamServer is not started: call start() first")
        return self._endpoint

    @property
    def version(self) -> int:
        """The latest published version (0 = nothing published)."""
        return self._version

    def start(self) -> ParamServer:
        """Bind and start the server thread; returns self. RuntimeError if already started."""
        if self._thread is not None:
            raise RuntimeError("ParamServer already started")
        self._ctx = zmq.Context()
        sock = self._ctx.socket(zmq.ROUTER)
        try:
            # CURVE + allow-list when keys are configured; fails closed when the ZAP handler dies.
            secure_server_socket(sock, self.curve, on_zap_failure=self._zap_failed)
            sock.setsockopt(zmq.LINGER, 0)
            sock.setsockopt(zmq.MAXMSGSIZE, PARAMS_MAX_REQUEST_BYTES)
            sock.setsockopt(zmq.SNDHWM, SERVICE_HWM)  # low: libzmq counts messages, not bytes
            sock.setsockopt(zmq.RCVHWM, SERVICE_HWM)
            limit_idle_connections(sock)  # the replay server's handshake and heartbeat settings
            # Sends never block and fail visibly (EAGAIN: the peer's queue is full; EHOSTUNREACH: it left): the
            # reply is dropped and counted. Weights replies are limited per peer by _WeightsSender.
            sock.setsockopt(zmq.ROUTER_MANDATORY, 1)
            if ":" in self.bind:
                sock.setsockopt(zmq.IPV6, 1)
                host = f"[{self.bind}]"
            else:
                host = self.bind
            sock.bind(f"tcp://{host}:{self.port}")
            self._endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
            warn_if_exposed(self.bind, self.curve, f"the parameter service ({self._endpoint})")
        except BaseException:
            sock.close(linger=0)
            self._ctx.term()
            self._ctx = None
            raise
        # The socket is handed to the thread here (Thread.start is a full memory barrier) and never used again
        # by this thread.
        self._thread = threading.Thread(target=self._serve, args=(sock,), name="apexrl-param-server", daemon=True)
        self._thread.start()
        return self

    def publish(self, tensors: Mapping[str, torch.Tensor]) -> int:
        """Serialise ``tensors`` once and make them the latest weights; returns the new version (1, 2, ...).

        TypeError/ValueError (nothing changes) for non-tensors, bad names, or bytes over ``max_message_mb``.
        """
        blob = serialize_tensors(tensors)
        if len(blob) > self.max_bytes:
            raise ValueError(
                f"weights are {len(blob)} bytes, over max_message_mb={self.max_bytes / (1 << 20):g} "
                f"({self.max_bytes} bytes)"
            )
        with self._lock:
            self._version += 1
            self._current = (self._version, blob)
            return self._version

    def counters(self) -> dict[str, int]:
        """Request counters (requests, params, unchanged, not_ready, errors, dropped, forbidden: refused by the
        client's role), parked (weights replies waiting for the previous one to the same peer to leave),
        version and bytes."""
        with self._lock:
            out = dict(self._counts)
            out["version"] = self._version
            out["bytes"] = 0 if self._current is None else len(self._current[1])
        return out

    def stats(self) -> dict[str, int]:
        """Alias of :meth:`counters`, kept for the scripts written against it (local: no request is sent)."""
        return self.counters()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (within ~50 ms) and close the socket; idempotent."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():  # pragma: no cover - the loop polls every 50 ms
                raise RuntimeError(f"parameter server thread did not stop within {timeout}s")
            self._thread = None
        if self._ctx is not None:
            self._ctx.term()
            self._ctx = None

    def __enter__(self) -> ParamServer:
        if self._thread is None:
            self.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ thread

    def _serve(self, sock: zmq.Socket) -> None:
        sender = _WeightsSender(sock, self._dropped)
        try:
            while not self._stop.is_set():
                if not sock.poll(_PARKED_POLL_MS if sender.parked else _POLL_MS, zmq.POLLIN):
                    sender.send_parked()
                    continue
                for _ in range(1000):  # drain, but look at the stop flag now and then
                    try:
                        msg = sock.recv_multipart(zmq.NOBLOCK, copy=False)
                    except zmq.Again:
                        break
                    reply, kind = self._answer(msg[1:], self._user_id(msg))
                    with self._lock:  # counted before sending: stats() never lags a reply already received
                        self._counts["requests"] += 1
                        self._counts[kind] += 1
                    sender.send(msg[0], reply, weights=kind == "params")
                sender.send_parked()
                with self._lock:
                    self._counts["parked"] = len(sender.parked)
        except Exception:  # pragma: no cover - a bug, not bad input (that is answered in _answer)
            log.exception("parameter server thread crashed")
        finally:
            sock.close(linger=0)

    def _zap_failed(self, reason: str) -> None:
        """The ZAP handler died: every client is refused now, so say so loudly and stop serving."""
        log.critical(
            "parameter service on %s stops: its ZAP handler is gone (%s), no client can authenticate",
            self._endpoint,
            reason,
        )
        self.failure = f"the parameter service's ZAP handler is gone ({reason})"
        self._stop.set()
        if self._on_failure is not None:
            self._on_failure(self.failure)

    def _dropped(self) -> None:
        with self._lock:
            self._counts["dropped"] += 1

    def _user_id(self, msg: list[Any]) -> str | None:
        """The CURVE client's User-Id (set by the ZAP handler: ``learner``, ``actor:NAME``), None without CURVE."""
        if self.curve is None or len(msg) < 2:
            return None
        try:
            return msg[1].get("User-Id")
        except zmq.ZMQError:  # a message without metadata: no identity, no rights
            return ""

    def _answer(self, frames: list[Any], user: str | None = None) -> tuple[list[Any], str]:
        """The reply frames for one request and the counter to bump; never raises."""
        try:
            req = P.decode_request(frames, PARAMS_MAX_REQUEST_BYTES, service="params")
        except ProtocolError as exc:
            return P.encode_protocol_error(exc), "errors"
        rid = req.request_id
        if user is not None and not may(user, req.header.op):  # the roles of apexrl.replay.wire.roles.ROLE_OPS
            return P.encode_error(
                req.header.op,
                rid,
                Status.INVALID_ARGUMENT,
                f"permission denied: client {user!r} may not send {Op(req.header.op).name} "
                "(see ROLE_OPS in apexrl.security)",
            ), "forbidden"
        try:
            held = tuple(req.arrays["held"].tolist())  # (version, server_id) the requester holds
            current = self._current  # one atomic read: (version, bytes) always belong together
            if current is None:
                return P.encode_get_params_reply(rid, 0, self.server_id), "not_ready"
            version, blob = current
            if held == (version, self.server_id):
                return P.encode_get_params_reply(rid, version, self.server_id), "unchanged"
            return P.encode_get_params_reply(rid, version, self.server_id, blob), "params"
        except Exception as exc:  # noqa: BLE001 - defence in depth: keep serving
            return P.encode_error(
                req.header.op, rid, Status.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"
            ), "errors"


class _WeightsSender:
    """Sends the server thread's replies so that a peer that never reads pins at most two copies of the
    weights: its last weights reply in flight, and one more parked until libzmq has handed that one to the
    kernel (a MessageTracker tells); a newer request of that peer replaces the parked reply (the older one is
    dropped and counted). Replies without weights (UNCHANGED, NOT_READY, errors) are small and go at once,
    bounded by ZMQ_SNDHWM. Sends never block (ROUTER_MANDATORY): a peer that left (EHOSTUNREACH) or whose queue
    is full (EAGAIN) loses the reply, counted."""

    def __init__(self, sock: zmq.Socket, dropped: Callable[[], None]):
        self.sock, self.dropped = sock, dropped
        self.in_flight: dict[bytes, zmq.MessageTracker] = {}  # peer -> tracker of its last weights reply
        self.parked: dict[bytes, tuple[Any, list[Any]]] = {}  # peer -> (identity, reply) waiting for that one
        self.prune_at = 64

    def send(self, ident: Any, reply: list[Any], weights: bool) -> None:
        peer = ident.bytes
        if weights:
            tracker = self.in_flight.get(peer)
            if tracker is not None and not tracker.done:
                if peer in self.parked:
                    self.dropped()
                self.parked[peer] = (ident, reply)
                return
        self._send(peer, ident, reply, weights)

    def send_parked(self) -> None:
        """Send the parked replies whose peer's previous weights reply has left (O(parked peers))."""
        for peer in [p for p in self.parked if self.in_flight[p].done]:
            ident, reply = self.parked.pop(peer)
            self._send(peer, ident, reply, True)
        if len(self.in_flight) > self.prune_at:  # forget finished ones (amortised O(1) per reply)
            self.in_flight = {p: t for p, t in self.in_flight.items() if not t.done or p in self.parked}
            self.prune_at = max(64, 2 * len(self.in_flight))

    def _send(self, peer: bytes, ident: Any, reply: list[Any], weights: bool) -> None:
        try:
            if weights:  # only the last frame (the weights) is tracked: the identity frame was received
                *head, last = [ident, *reply]
                for frame in head:  # the identity frame fails, or all of the message is queued
                    self.sock.send(frame, zmq.NOBLOCK | zmq.SNDMORE, copy=False)
                tracker = self.sock.send(last, zmq.NOBLOCK, copy=False, track=True)
            else:
                tracker = self.sock.send_multipart([ident, *reply], flags=zmq.NOBLOCK, copy=False)
        except zmq.ZMQError:  # EAGAIN: its queue is full (it does not read); EHOSTUNREACH: it left
            self.dropped()
            return
        if weights and tracker is not None:
            self.in_flight[peer] = tracker


# ---------------------------------------------------------------------------------------------- client


class ParamClient(TransportClient):
    """Fetches weights from a :class:`ParamServer` at ``endpoint`` (``tcp://host:port``).

    ``fetch(have_version)`` returns ``(version, tensors)`` when the server has other weights than the ones
    this client last returned as ``have_version``, and ``None`` otherwise; :attr:`last_status` says which
    ``None`` it was (``FetchStatus.UNCHANGED`` or ``FetchStatus.NOT_READY``) and :attr:`latest_version`
    the server's latest version (0 = nothing published). With ``expected`` (``{name: (dtype, shape)}``, see
    :func:`spec_of`) weights with other names/dtypes/shapes raise ValueError and are not returned.

    Requests go through a :class:`~apexrl.replay.wire.transport.Transport` (the replay client's request loop):
    ``timeout`` (seconds) bounds each call; on expiry :class:`ParamsTimeout` is raised and the socket is
    reset. Replies over ``max_message_mb`` are refused by libzmq before allocation (ZMQ_MAXMSGSIZE: the
    connection is dropped, the call times out) and checked again before parsing. Thread-safe (one lock).
    ``curve`` (a key directory or :class:`~apexrl.security.ClientKeys`) turns on CURVE.
    """

    def __init__(
        self,
        endpoint: str,
        timeout: float = 5.0,
        *,
        expected: Mapping[str, tuple[torch.dtype, Any]] | None = None,
        max_message_mb: float = 512,
        curve: ClientKeys | str | None = None,
    ):
        if not (timeout > 0 and math.isfinite(timeout)):
            raise ValueError(f"timeout must be > 0 seconds, got {timeout}")
        if not (max_message_mb > 0 and math.isfinite(max_message_mb)):
            raise ValueError(f"max_message_mb must be > 0, got {max_message_mb}")
        self.endpoint = endpoint
        self.timeout = float(timeout)
        self.max_bytes = int(max_message_mb * (1 << 20))
        self.expected = None if expected is None else {k: (d, tuple(s)) for k, (d, s) in expected.items()}
        self.last_status: FetchStatus | None = None
        self.latest_version = 0
        self._given: tuple[int, int] | None = None  # (version, server_id) of the weights last returned
        self._lock = threading.Lock()
        self.transport = Transport(
            endpoint,
            max_message_bytes=self.max_bytes + HEADER_SIZE,
            timeout_error=ParamsTimeout,
            peer="learner",
            name="parameter client",
            curve=curve,
        )
        self._late_hint = (
            f" (learner unreachable, or weights over this client's max_message_mb="
            f"{self.max_bytes / (1 << 20):g} were dropped)"
        )

    def fetch(self, have_version: int) -> tuple[int, dict[str, torch.Tensor]] | None:
        """New weights as ``(version, tensors)``, or None (see :attr:`last_status`).

        Raises ParamsTimeout (no reply in time; socket reset), ServerError (the server's error reply),
        ProtocolError (malformed or oversized reply; socket reset), ValueError (``expected`` mismatch:
        nothing returned, the caller keeps its weights), ServerClosedError (this client is closed).
        """
        if isinstance(have_version, bool) or not hasattr(have_version, "__index__"):
            raise ValueError(f"have_version must be an integer, got {have_version!r}")
        have_version = operator.index(have_version)
        if not 0 <= have_version <= _U64:
            raise ValueError(f"have_version must be in [0, 2**64), got {have_version}")
        with self._lock:
            if self.transport.closed:
                raise ServerClosedError("the parameter client is closed")
            given = self._given
            server_id = given[1] if given is not None and given[0] == have_version else 0
            rid, frames = self.transport.request(
                lambda rid: P.encode_get_params(rid, have_version, server_id),
                self.timeout,
                "GET",
                self._late_hint,
            )
            try:
                status, sid, version, payload = self._decode(frames, rid, (have_version, server_id))
            except ProtocolError:
                self.transport.reset()
                raise
            self.last_status = status
            self.latest_version = version
            if status != FetchStatus.PARAMS:
                return None
            tensors = deserialize_tensors(payload)
            if self.expected is not None:
                check_tensors(tensors, self.expected)
            self._given = (version, sid)
            return version, tensors

    def forget(self) -> None:
        """The caller did not keep the weights last returned: never answer UNCHANGED on their behalf."""
        with self._lock:
            self._given = None

    def _decode(self, frames: list[zmq.Frame], rid: int, held: tuple[int, int]) -> tuple[FetchStatus, int, int, bytes]:
        """(status, server_id, version, payload) of a valid reply; ServerError / ProtocolError otherwise."""
        reply = P.decode_reply(frames, Op.GET_PARAMS, rid)
        if not reply.ok:
            raise ServerError(reply.status, reply.message or "")
        version, server_id = (int(v) for v in reply.arrays["latest"])
        weights = reply.arrays["weights"]
        if server_id == 0:
            raise _bad_reply("reply server_id is 0")
        if weights.nbytes == 0:
            if version == 0:
                return FetchStatus.NOT_READY, server_id, 0, b""
            if (version, server_id) != held:
                raise _bad_reply(
                    f"no weights for version {version} of server {server_id}, but this client holds "
                    f"version {held[0]} of server {held[1]}"
                )
            return FetchStatus.UNCHANGED, server_id, version, b""
        if weights.nbytes > self.max_bytes:
            raise ProtocolError(
                Status.BAD_MESSAGE,
                f"weights are {weights.nbytes} bytes, over this client's max_message_mb={self.max_bytes / (1 << 20):g}",
            )
        if version == 0:
            raise _bad_reply("weights with version 0")
        return FetchStatus.PARAMS, server_id, version, bytes(weights)


def _bad_reply(message: str) -> ProtocolError:
    return ProtocolError(Status.BAD_MESSAGE, f"malformed reply: {message}")


# ---------------------------------------------------------------------------------------------- poller


class ParamPoller:
    """Actor-loop helper: fetch at most every ``every_frames`` env frames, load new weights, never stall.

    ``maybe_fetch(env_frames)`` takes the actor's running env-frame count. The first call fetches at once;
    later calls fetch when ``every_frames`` frames have passed since the last attempt. New weights are
    passed to ``load`` (e.g. ``policy.load_policy_state_dict``) and returned; otherwise it returns None.

    Never raises for a slow or absent learner or a bad message; it counts instead (see :meth:`stats`):

    * timeout (at most ``client.timeout`` seconds blocked) -> ``timeouts``; after k failures in a row the
      next attempt waits ``every_frames * min(2**k, max_backoff)`` frames, so a dead learner costs an actor
      at most one timeout per that many frames;
    * an error reply or a malformed reply -> ``errors``;
    * weights refused by the client's ``expected`` or by ``load`` (ValueError) -> ``mismatches``: the old
      weights and :attr:`version` stay, a warning is logged once per distinct message, and the next attempt
      fetches the latest again (a fixed learner is picked up).

    ``ServerClosedError`` (the client was closed) and other exceptions from ``load`` propagate.
    """

    def __init__(
        self,
        client: ParamClient,
        load: Callable[[dict[str, torch.Tensor]], Any] | None = None,
        *,
        every_frames: int = 400,
        version: int = 0,
        max_backoff: int = 16,
    ):
        if every_frames < 1:
            raise ValueError(f"every_frames must be >= 1, got {every_frames}")
        if max_backoff < 1:
            raise ValueError(f"max_backoff must be >= 1, got {max_backoff}")
        self.client = client
        self.load = load
        self.every_frames = int(every_frames)
        self.max_backoff = int(max_backoff)
        self.version = int(version)
        self._next_frames: int | None = None  # None: fetch at the next call
        self._failures = 0
        self._warned: set[str] = set()
        self.counts = {
            "fetches": 0,
            "updates": 0,
            "unchanged": 0,
            "not_ready": 0,
            "timeouts": 0,
            "errors": 0,
            "mismatches": 0,
        }

    def maybe_fetch(self, env_frames: int) -> dict[str, torch.Tensor] | None:
        """New weights (already passed to ``load``) if a fetch was due and brought some, else None."""
        if self._next_frames is not None and env_frames < self._next_frames:
            return None
        tensors = self.fetch_now()
        wait = self.every_frames * min(2**self._failures, self.max_backoff)
        self._next_frames = env_frames + wait
        return tensors

    def fetch_now(self) -> dict[str, torch.Tensor] | None:
        """One fetch attempt now, with the same accounting as :meth:`maybe_fetch`."""
        self.counts["fetches"] += 1
        try:
            got = self.client.fetch(self.version)
        except ParamsTimeout:
            self._failed("timeouts")
            return None
        except ServerClosedError:
            raise
        except (ServerError, ProtocolError) as exc:
            self._warn_once(f"parameter fetch from {self.client.endpoint} failed: {exc}")
            self._failed("errors")
            return None
        except ValueError as exc:
            self._mismatch(exc)
            return None
        self._failures = 0
        if got is None:
            key = "not_ready" if self.client.last_status == FetchStatus.NOT_READY else "unchanged"
            self.counts[key] += 1
            return None
        version, tensors = got
        if self.load is not None:
            try:
                self.load(tensors)
            except ValueError as exc:
                self.client.forget()
                self._mismatch(exc)
                return None
        self.version = version
        self.counts["updates"] += 1
        return tensors

    def counters(self) -> dict[str, int]:
        """Counters (fetches, updates, unchanged, not_ready, timeouts, errors, mismatches) and version."""
        return {**self.counts, "version": self.version}

    def stats(self) -> dict[str, int]:
        """Alias of :meth:`counters`, kept for the scripts written against it (local: no request is sent)."""
        return self.counters()

    def _failed(self, key: str) -> None:
        self.counts[key] += 1
        self._failures += 1
        return None

    def _mismatch(self, exc: ValueError) -> None:
        self.counts["mismatches"] += 1
        self._warn_once(f"refused weights from {self.client.endpoint}, keeping version {self.version}: {exc}")
        return None

    def _warn_once(self, message: str) -> None:
        if message not in self._warned and len(self._warned) < 100:
            self._warned.add(message)
            log.warning("%s", message)
