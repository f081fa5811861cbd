"""CURVE encryption and a client allow-list for both apexrl services (the replay server and the learner's
parameter service); see docs/running.md, section "Security".

A key directory (``apexrl keygen DIR``) holds, in pyzmq's certificate format (``zmq.auth``)::

    server.key          the server's public key              every client needs it
    server.key_secret   the server's key pair (mode 0600)     the replay server and the learner
    client.key          the learner's public key
    client.key_secret   the learner's key pair (mode 0600)    the learner (a replay client)
    authorized/*.key    public keys of the clients allowed to connect, named by identity: learner.key,
                        actor.NAME.key (client.key: a directory made before roles)
    actors/NAME/        one actor host's directory (keygen --role actor --name NAME): server.key and its
                        own client.key(_secret), never a server secret

The ZAP handler gives each connection its key's identity as the ZMQ User-Id (``learner``, ``actor:NAME``);
:data:`ROLE_OPS` says which ops each role may send (:func:`role_of`, :func:`may`).

A server socket (:func:`secure_server_socket`) turns on CURVE with the server's key pair and asks a ZAP
handler (one thread per ZeroMQ context, :class:`ZapHandler`) about every connecting client: a client whose
public key is not in ``authorized/`` is refused during the handshake, before any request reaches the
service. It fails closed: the socket sets ZMQ_ZAP_ENFORCE_DOMAIN, so if the handler thread is gone libzmq
refuses every client (without that option it would let every key in), and the service is told to stop
(``on_zap_failure``). A client socket (:func:`secure_client_socket`) needs its own key pair and the server's
public key.

Secret key files must not be readable by group or others: they are refused (like ssh refuses such private
keys), so a key copied with the wrong mode is noticed before it is relied upon. Key directories (0700 when
keygen creates them) and key files must be owned by the user (or root) and not writable by group or others:
whoever can write there could swap the server's key or add a client to the allow-list.

Binding beyond loopback without keys is refused unless ``insecure`` is set (:func:`check_exposure`, called
by ServerConfig and LearnerConfig validation: every CLI refuses it with exit status 2).
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import re
import stat
import tempfile
import threading
from dataclasses import dataclass
from collections.abc import Callable, Mapping
from typing import Union

import zmq
from zmq.auth.certs import load_certificate
from zmq.utils import z85

from apexrl.replay.schema import Op

__all__ = [
    "ACTOR",
    "AUTHORIZED",
    "CLIENT",
    "LEARNER",
    "ROLE_OPS",
    "SERVICE_HWM",
    "ENV_VAR",
    "SERVER",
    "ClientKeys",
    "CurveKeyError",
    "ServerKeys",
    "ZapHandler",
    "check_exposure",
    "client_keys",
    "curve_dir_from_env",
    "is_loopback",
    "keygen",
    "limit_idle_connections",
    "load_client_keys",
    "load_server_keys",
    "may",
    "raise_nofile_limit",
    "role_of",
    "secure_client_socket",
    "secure_server_socket",
    "server_keys",
    "user_id_of_file",
    "warn_if_exposed",
]

log = logging.getLogger("apexrl.security")

ENV_VAR = "APEXRL_CURVE_DIR"
"""Environment variable read as the default of every command's ``--curve-dir``."""
SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized"
ZAP_ENDPOINT = "inproc://zeromq.zap.01"  # fixed by the ZAP specification (RFC 27), one per context
_ZAP_POLL_MS = 200


# ------------------------------------------------------------------------------------------ roles

LEARNER, ACTOR = "learner", "actor"
ROLE_OPS: dict[str, frozenset[int]] = {
    LEARNER: frozenset(int(op) for op in Op),
    ACTOR: frozenset({int(Op.HELLO), int(Op.INSERT), int(Op.STATS), int(Op.GET_PARAMS)}),
}
"""The ops (:class:`apexrl.replay.schema.Op` values) each role may send, on either service: an actor inserts
experience, says hello, reads STATS (the sharded client needs it) and fetches weights; the learner may do
everything. The one definition both services enforce (see :func:`may`)."""

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""An actor's name (its host, say): also part of a file name, so no '/' and no leading '.' or '-'."""


def role_of(user_id: str) -> str:
    """The role of a ZAP User-Id: ``learner`` -> learner, ``actor:NAME`` -> actor, ``client`` (the shared key of
    a key directory made before roles) -> learner. ValueError for anything else."""
    if user_id in (LEARNER, CLIENT):
        return LEARNER
    role, sep, name = user_id.partition(":")
    if role == ACTOR and sep and _NAME.fullmatch(name):
        return ACTOR
    raise ValueError(f"unknown client identity {user_id!r}")


def may(user_id: str, op: int) -> bool:
    """Whether the client ``user_id`` may send ``op`` (False for an unknown identity)."""
    try:
        return int(op) in ROLE_OPS[role_of(user_id)]
    except ValueError:
        return False


def user_id_of_file(file_name: str) -> str | None:
    """The User-Id of an ``authorized/`` file: ``learner.key`` -> ``learner``, ``actor.host3.key`` ->
    ``actor:host3``, ``client.key`` -> ``client``; None when the name says no role."""
    stem = file_name[:-len(".key")] if file_name.endswith(".key") else None
    if stem in (LEARNER, CLIENT):
        return stem
    if stem is not None and stem.startswith(ACTOR + ".") and _NAME.fullmatch(stem[len(ACTOR) + 1:]):
        return f"{ACTOR}:{stem[len(ACTOR) + 1:]}"
    return None


class CurveKeyError(ValueError):
    """A key directory or key file is missing, malformed or too widely readable."""


@dataclass(frozen=True)
class ServerKeys:
    """What a CURVE server needs: its key pair and the allow-list of client public keys (Z85 bytes)."""

    public: bytes
    secret: bytes
    allowed: frozenset[bytes]
    directory: str
    identities: Mapping[bytes, str] | None = None
    """User-Id of each allowed key (from its file name in ``authorized/``); None: every key is ``learner``."""


@dataclass(frozen=True)
class ClientKeys:
    """What a CURVE client needs: its key pair and the server's public key (Z85 bytes)."""

    public: bytes
    secret: bytes
    server_public: bytes
    directory: str


PathLike = Union[str, "os.PathLike[str]"]


# ------------------------------------------------------------------------------------------ key files


def keygen(directory: PathLike, role: str = LEARNER, name: str | None = None) -> list[str]:
    """Issue keys into ``directory``; returns the paths written (keys are never overwritten).

    ``role="learner"`` (the default): a new directory with the server's key pair and the learner's client
    pair (``client.key(_secret)``, authorized as ``authorized/learner.key``, User-Id ``learner``): what the
    replay server and the learner use. ``role="actor"``, ``name="host3"``: one more client pair, for one actor
    host, into ``directory/actors/host3/`` with a copy of ``server.key`` (copy that directory to the host and
    give it as its ``--curve-dir``: it holds no server secret), authorized as ``authorized/actor.host3.key``
    (User-Id ``actor:host3``); ``directory`` must hold the server's keys already. CurveKeyError (nothing
    written) if a target exists, the name is not valid, or the role is unknown.
    """
    directory = os.fspath(directory)
    if role not in ROLE_OPS:
        raise CurveKeyError(f"unknown role {role!r}; roles: {', '.join(ROLE_OPS)}")
    if role == LEARNER:
        if name is not None:
            raise CurveKeyError("the learner's key has no --name (a run has one learner)")
        return _keygen_server_and_learner(directory)
    if name is None or not _NAME.fullmatch(name):
        raise CurveKeyError(f"an actor key needs --name: letters, digits, '.', '_' or '-', not starting with '.' "
                            f"or '-' (e.g. its host name), got {name!r}")
    server_public = os.path.join(directory, f"{SERVER}.key")
    if not os.path.exists(server_public) or not os.path.isdir(os.path.join(directory, AUTHORIZED)):
        raise CurveKeyError(f"{directory} holds no server keys: create them first with `apexrl keygen {directory}`")
    node = os.path.join(directory, "actors", name)
    targets = [os.path.join(node, f"{SERVER}.key"), os.path.join(node, f"{CLIENT}.key"),
               os.path.join(node, f"{CLIENT}.key_secret"), os.path.join(directory, AUTHORIZED, f"{role}.{name}.key")]
    _refuse_existing(directory, targets)
    _private_dirs(os.path.join(directory, "actors"), node)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".keygen-") as tmp:
        public, secret = zmq.curve_keypair()
        _write_key(os.path.join(tmp, "server.key"), _read(server_public)[0], None, 0o644)
        _write_key(os.path.join(tmp, "client.key"), public, None, 0o644)
        _write_key(os.path.join(tmp, "client.key_secret"), public, secret, 0o600)
        _write_key(os.path.join(tmp, "authorized.key"), public, None, 0o644)
        for src, dst in zip(("server.key", "client.key", "client.key_secret", "authorized.key"), targets,
                            strict=True):
            os.replace(os.path.join(tmp, src), dst)
    return targets


def _keygen_server_and_learner(directory: str) -> list[str]:
    targets = [os.path.join(directory, n) for n in (f"{SERVER}.key", f"{SERVER}.key_secret", f"{CLIENT}.key",
                                                    f"{CLIENT}.key_secret")]
    targets.append(os.path.join(directory, AUTHORIZED, f"{LEARNER}.key"))
    _refuse_existing(directory, [*targets, os.path.join(directory, AUTHORIZED, f"{CLIENT}.key")])
    _private_dirs(directory, os.path.join(directory, AUTHORIZED))
    # Written in a private (0700) temporary directory, then moved into place: a secret is never readable by
    # others, not even for a moment.
    with tempfile.TemporaryDirectory(dir=directory, prefix=".keygen-") as tmp:
        for name in (SERVER, CLIENT):
            public, secret = zmq.curve_keypair()
            _write_key(os.path.join(tmp, f"{name}.key"), public, None, 0o644)
            _write_key(os.path.join(tmp, f"{name}.key_secret"), public, secret, 0o600)
        _write_key(os.path.join(tmp, "authorized.key"), load_certificate(os.path.join(tmp, f"{CLIENT}.key"))[0],
                   None, 0o644)
        for src, dst in zip((f"{SERVER}.key", f"{SERVER}.key_secret", f"{CLIENT}.key", f"{CLIENT}.key_secret",
                             "authorized.key"), targets, strict=True):
            os.replace(os.path.join(tmp, src), dst)
    return targets


def _refuse_existing(directory: str, targets: list[str]) -> None:
    held = [p for p in targets if os.path.exists(p)]
    if held:
        raise CurveKeyError(f"{directory} already holds keys ({', '.join(held)}): remove them or choose another "
                            "directory or name (keys are never overwritten)")


def _private_dirs(*dirs: str) -> None:
    for d in dirs:  # 0700: only the owner lists or adds keys
        if not os.path.isdir(d):
            os.makedirs(d, mode=0o700)
            os.chmod(d, 0o700)


def _write_key(path: str, public: bytes, secret: bytes | None, mode: int) -> None:
    """One certificate file in pyzmq's format (``zmq.auth.load_certificate`` reads it), created with ``mode``."""
    kind = "**Secret**" if secret is not None else "Public"
    lines = [f"#   ****  Generated on {datetime.datetime.now()} by apexrl keygen  ****",
             f"#   ZeroMQ CURVE {kind} Certificate", "", "metadata", "curve",
             f'    public-key = "{public.decode("ascii")}"']
    if secret is not None:
        lines.append(f'    secret-key = "{secret.decode("ascii")}"')
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, mode)
    with os.fdopen(fd, "w", encoding="ascii") as f:
        f.write("\n".join(lines) + "\n")
    os.chmod(path, mode)  # exactly ``mode``, whatever the umask


def _check_trusted(path: str, st: os.stat_result) -> None:
    """CurveKeyError unless ``path`` (a key file or key directory) is owned by this user (or root) and not
    writable by group or others: whoever can write there can swap a key or add one to the allow-list."""
    if st.st_uid not in (os.geteuid(), 0):
        raise CurveKeyError(f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}) or root: "
                            "another user could replace the keys; copy them into a directory of your own")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CurveKeyError(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                            f"run `chmod go-w {path}`")


def _check_dir(path: str) -> None:
    """:func:`_check_trusted` for a key directory (a missing one is reported by the first file read in it)."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise CurveKeyError(f"cannot read the key directory {path}: {e.strerror}") from None
    _check_trusted(path, st)


def _read_pair(path: str) -> tuple[bytes, bytes]:
    """(public, secret) of a secret key file; CurveKeyError if missing, malformed, group/other-readable, or
    not owned by this user."""
    try:
        st = os.stat(path)
    except OSError as e:
        raise CurveKeyError(f"cannot read CURVE secret key {path}: {e.strerror} (create keys with "
                            "`apexrl keygen DIR`)") from None
    _check_trusted(path, st)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CurveKeyError(f"CURVE secret key {path} is accessible by group or others (mode "
                            f"{stat.S_IMODE(st.st_mode):04o}): run `chmod 600 {path}`")
    public, secret = _read(path)
    if secret is None:
        raise CurveKeyError(f"{path} holds no secret-key")
    return public, secret


def _read(path: str) -> tuple[bytes, bytes | None]:
    try:
        st = os.stat(path)
    except OSError as e:
        raise CurveKeyError(f"cannot read CURVE key {path}: {e.strerror}") from None
    _check_trusted(path, st)
    try:
        public, secret = load_certificate(path)
    except (OSError, ValueError) as e:
        raise CurveKeyError(f"cannot read CURVE key {path}: {e}") from None
    for key in (public, secret):
        if key is not None and len(key) != 40:
            raise CurveKeyError(f"{path}: a CURVE key is 40 Z85 characters, got {len(key)}")
    return public, secret


def load_server_keys(directory: PathLike) -> ServerKeys:
    """The server's key pair and ``authorized/*.key`` of ``directory``; CurveKeyError naming what is missing."""
    directory = os.path.abspath(os.fspath(directory))
    _check_dir(directory)
    public, secret = _read_pair(os.path.join(directory, f"{SERVER}.key_secret"))
    auth_dir = os.path.join(directory, AUTHORIZED)
    _check_dir(auth_dir)
    try:
        names = sorted(n for n in os.listdir(auth_dir) if n.endswith(".key"))
    except OSError as e:
        raise CurveKeyError(f"cannot read the allow-list {auth_dir}: {e.strerror}") from None
    if not names:
        raise CurveKeyError(f"the allow-list {auth_dir} holds no client key (*.key): no client could connect")
    identities: dict[bytes, str] = {}
    for n in names:
        user_id = user_id_of_file(n)
        if user_id is None:
            raise CurveKeyError(f"{os.path.join(auth_dir, n)}: an allow-list file is named learner.key, "
                                "actor.NAME.key (its role, see `apexrl keygen --role`) or client.key (a key "
                                "directory made before roles; the learner's rights): rename it")
        key = _read(os.path.join(auth_dir, n))[0]
        if key in identities:
            raise CurveKeyError(f"{auth_dir}: the same key is authorized as {identities[key]!r} and {user_id!r}")
        identities[key] = user_id
    return ServerKeys(public=public, secret=secret, allowed=frozenset(identities), directory=directory,
                      identities=identities)


def load_client_keys(directory: PathLike) -> ClientKeys:
    """The client's key pair and the server's public key of ``directory``; CurveKeyError naming what is missing."""
    directory = os.path.abspath(os.fspath(directory))
    _check_dir(directory)
    public, secret = _read_pair(os.path.join(directory, f"{CLIENT}.key_secret"))
    server_public, _ = _read(os.path.join(directory, f"{SERVER}.key"))
    return ClientKeys(public=public, secret=secret, server_public=server_public, directory=directory)


def server_keys(curve: ServerKeys | PathLike | None) -> ServerKeys | None:
    """``curve`` as ServerKeys: loaded from a directory, kept, or None (no CURVE)."""
    if curve is None or isinstance(curve, ServerKeys):
        return curve
    return load_server_keys(curve)


def client_keys(curve: ClientKeys | PathLike | None) -> ClientKeys | None:
    """``curve`` as ClientKeys: loaded from a directory, kept, or None (no CURVE)."""
    if curve is None or isinstance(curve, ClientKeys):
        return curve
    return load_client_keys(curve)


def curve_dir_from_env() -> str | None:
    """``$APEXRL_CURVE_DIR`` as an absolute path, or None when unset or empty (the commands' default)."""
    value = os.environ.get(ENV_VAR, "")
    return os.path.abspath(value) if value else None


# ------------------------------------------------------------------------------------------ exposure


def is_loopback(host: str) -> bool:
    """True for ``localhost``, 127.0.0.0/8 and ::1 (bracketed or not); False for anything else, including
    ``*``, 0.0.0.0, interface names and other host names."""
    host = host.strip("[]")
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_exposure(bind: str, curve_dir: PathLike | None, insecure: bool, what: str) -> None:
    """ValueError saying why, when ``bind`` is not loopback, no keys are given and ``insecure`` is not set.

    The one place this rule is written: ServerConfig (``bind``) and LearnerConfig (``params_bind``) call it.
    """
    if curve_dir is not None or insecure or is_loopback(bind):
        return
    raise ValueError(
        f"{what} {bind!r} is not a loopback address and no CURVE keys are given: without them anyone who can "
        "reach this port can insert and read all experience and weights, rewrite priorities and stop the "
        "service. Create keys with `apexrl keygen DIR` and pass --curve-dir DIR (or set "
        f"{ENV_VAR}=DIR), or pass --insecure if every host that can reach it is trusted"
    )


# ------------------------------------------------------------------------------------------ sockets

SERVICE_HWM = 100
"""ZMQ_SNDHWM/ZMQ_RCVHWM of the parameter service's ROUTER: messages queued per peer (libzmq counts messages,
not bytes; a weights reply is large, and the service parks at most two of them per peer anyway)."""


def limit_idle_connections(sock: zmq.Socket, handshake_s: float = 5.0, heartbeat_s: float = 10.0) -> None:
    """Close connections that hold a file descriptor and do nothing (both services, before bind): one that has
    not completed the ZMTP handshake in ``handshake_s`` (a raw TCP connection that never sends; 0: no limit),
    and, with ZMTP heartbeats every ``heartbeat_s`` (0: none), one whose peer stopped answering for three of
    them (a host that vanished without a FIN). libzmq has no per-socket connection cap: these, the process's
    file-descriptor limit (:func:`raise_nofile_limit`) and the network in front of the port bound connections."""
    sock.setsockopt(zmq.HANDSHAKE_IVL, int(handshake_s * 1000))
    if heartbeat_s > 0:
        ivl = int(heartbeat_s * 1000)
        sock.setsockopt(zmq.HEARTBEAT_IVL, ivl)
        sock.setsockopt(zmq.HEARTBEAT_TIMEOUT, 3 * ivl)
        sock.setsockopt(zmq.HEARTBEAT_TTL, min(3 * ivl, 6_553_500))


def raise_nofile_limit(what: str) -> tuple[int, int]:
    """Raise the soft RLIMIT_NOFILE to the hard limit (every connection costs a descriptor) and log both at INFO
    for ``what`` (the service); returns (soft, hard). Never raises: a limit that cannot be raised is logged."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else max(soft, 1 << 20)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as e:
            log.warning("%s: could not raise the open-file limit from %d to %d: %s", what, soft, target, e)
    log.info("%s: open-file limit %s (hard %s): it bounds the connections, with the handshake and heartbeat "
             "timeouts; libzmq has no per-socket connection cap", what, soft, hard)
    return soft, hard


def warn_if_exposed(bind: str, curve: object, what: str) -> bool:
    """Log a WARNING when ``what`` listens on ``bind`` beyond loopback without CURVE (``--insecure``): anyone who
    can reach it can use it. Returns whether it did."""
    if curve is not None or is_loopback(bind):
        return False
    log.warning("%s listens on %s WITHOUT CURVE (--insecure): every host that can reach it can use it, "
                "unauthenticated and unencrypted", what, bind)
    return True



def secure_server_socket(sock: zmq.Socket, curve: ServerKeys | PathLike | None, *,
                         on_zap_failure: Callable[[str], None] | None = None) -> ServerKeys | None:
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
    _by_context: dict[int, ZapHandler] = {}

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
            log.critical("ZAP handler crashed (%s): every CURVE client is refused from now on", reason,
                         exc_info=True)
        finally:
            sock.close(linger=0)  # unbinds ZAP_ENDPOINT: libzmq then refuses every handshake
            with self._lock:
                if self._by_context.get(id(self.ctx)) is self:
                    del self._by_context[id(self.ctx)]
                if reason is not None:
                    self.failure = reason
                callbacks, self._callbacks = self._callbacks, []
            for callback in callbacks if reason is not None else ():
                try:
                    callback(reason)
                except Exception:  # noqa: BLE001 - one service's callback must not keep the others from theirs
                    log.exception("a ZAP failure callback raised")

    def _answer(self, msg: list[bytes]) -> list[bytes]:
        """The reply to one ZAP request (RFC 27): envelope, version, request id, status, text, user, metadata."""
        try:
            delim = msg.index(b"")
        except ValueError:
            return msg  # not a ZAP request (libzmq is the only peer of this socket): echo, it is dropped
        envelope, body = msg[:delim + 1], msg[delim + 1:]
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
