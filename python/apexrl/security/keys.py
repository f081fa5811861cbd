"""Key files: ``apexrl keygen``, reading and checking key directories, and the identities their files name.

A key directory (``apexrl keygen DIR``) holds, in pyzmq's certificate format (``zmq.auth``)::


    server.key          the server's public key              every client needs it
    server.key_secret   the server's key pair (mode 0600)     the replay server and the learner
    client.key          the learner's public key
    client.key_secret   the learner's key pair (mode 0600)    the learner (a replay client)
    authorized/*.key    public keys of the clients allowed to connect, named by identity: learner.key,
                        actor.NAME.key (client.key: a directory made before roles)
    actors/NAME/        one actor host's directory (keygen --role actor --name NAME): server.key and its
                        own client.key(_secret), never a server secret

Secret key files must not be readable by group or others: they are refused (like ssh refuses such private
keys), so a key copied with the wrong mode is noticed before it is relied upon. Key directories (0700 when
keygen creates them) and key files must be owned by the user (or root) and not writable by group or others:
whoever can write there could swap the server's key or add a client to the allow-list.

Each allowed key's file name gives its connection's identity, the ZMQ User-Id (:func:`user_id_of_file`:
``learner``, ``actor:NAME``); which ops each identity's role may send is protocol policy
(:mod:`apexrl.replay.wire.roles`).
"""

from __future__ import annotations

import datetime
import os
import re
import stat
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Union

import zmq
from zmq.auth.certs import load_certificate

__all__ = [
    "ACTOR",
    "AUTHORIZED",
    "CLIENT",
    "ENV_VAR",
    "LEARNER",
    "ROLES",
    "SERVER",
    "ClientKeys",
    "CurveKeyError",
    "PathLike",
    "ServerKeys",
    "client_keys",
    "curve_dir_from_env",
    "keygen",
    "load_client_keys",
    "load_server_keys",
    "server_keys",
    "user_id_of_file",
]

ENV_VAR = "APEXRL_CURVE_DIR"
"""Environment variable read as the default of every command's ``--curve-dir``."""
SERVER, CLIENT, AUTHORIZED = "server", "client", "authorized"

# ------------------------------------------------------------------------------------------ identities

LEARNER, ACTOR = "learner", "actor"
"""The two roles a client key is issued for (``keygen --role``); ``client`` (:data:`CLIENT`), the shared key of
a directory made before roles, acts as the learner."""
ROLES = (LEARNER, ACTOR)

_NAME = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,63}")
"""An actor's name (its host, say): also part of a file name, so no '/' and no leading '.' or '-'."""


def user_id_of_file(file_name: str) -> str | None:
    """The User-Id of an ``authorized/`` file: ``learner.key`` -> ``learner``, ``actor.host3.key`` ->
    ``actor:host3``, ``client.key`` -> ``client``; None when the name says no role."""
    stem = file_name[: -len(".key")] if file_name.endswith(".key") else None
    if stem in (LEARNER, CLIENT):
        return stem
    if stem is not None and stem.startswith(ACTOR + ".") and _NAME.fullmatch(stem[len(ACTOR) + 1 :]):
        return f"{ACTOR}:{stem[len(ACTOR) + 1 :]}"
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
    if role not in ROLES:
        raise CurveKeyError(f"unknown role {role!r}; roles: {', '.join(ROLES)}")
    if role == LEARNER:
        if name is not None:
            raise CurveKeyError("the learner's key has no --name (a run has one learner)")
        return _keygen_server_and_learner(directory)
    if name is None or not _NAME.fullmatch(name):
        raise CurveKeyError(
            f"an actor key needs --name: letters, digits, '.', '_' or '-', not starting with '.' "
            f"or '-' (e.g. its host name), got {name!r}"
        )
    server_public = os.path.join(directory, f"{SERVER}.key")
    if not os.path.exists(server_public) or not os.path.isdir(os.path.join(directory, AUTHORIZED)):
        raise CurveKeyError(f"{directory} holds no server keys: create them first with `apexrl keygen {directory}`")
    node = os.path.join(directory, "actors", name)
    targets = [
        os.path.join(node, f"{SERVER}.key"),
        os.path.join(node, f"{CLIENT}.key"),
        os.path.join(node, f"{CLIENT}.key_secret"),
        os.path.join(directory, AUTHORIZED, f"{role}.{name}.key"),
    ]
    _refuse_existing(directory, targets)
    _private_dirs(os.path.join(directory, "actors"), node)
    with tempfile.TemporaryDirectory(dir=directory, prefix=".keygen-") as tmp:
        public, secret = zmq.curve_keypair()
        _write_key(os.path.join(tmp, "server.key"), _read(server_public)[0], None, 0o644)
        _write_key(os.path.join(tmp, "client.key"), public, None, 0o644)
        _write_key(os.path.join(tmp, "client.key_secret"), public, secret, 0o600)
        _write_key(os.path.join(tmp, "authorized.key"), public, None, 0o644)
        for src, dst in zip(("server.key", "client.key", "client.key_secret", "authorized.key"), targets, strict=True):
            os.replace(os.path.join(tmp, src), dst)
    return targets


def _keygen_server_and_learner(directory: str) -> list[str]:
    targets = [
        os.path.join(directory, n)
        for n in (f"{SERVER}.key", f"{SERVER}.key_secret", f"{CLIENT}.key", f"{CLIENT}.key_secret")
    ]
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
        _write_key(
            os.path.join(tmp, "authorized.key"), load_certificate(os.path.join(tmp, f"{CLIENT}.key"))[0], None, 0o644
        )
        for src, dst in zip(
            (f"{SERVER}.key", f"{SERVER}.key_secret", f"{CLIENT}.key", f"{CLIENT}.key_secret", "authorized.key"),
            targets,
            strict=True,
        ):
            os.replace(os.path.join(tmp, src), dst)
    return targets


def _refuse_existing(directory: str, targets: list[str]) -> None:
    held = [p for p in targets if os.path.exists(p)]
    if held:
        raise CurveKeyError(
            f"{directory} already holds keys ({', '.join(held)}): remove them or choose another "
            "directory or name (keys are never overwritten)"
        )


def _private_dirs(*dirs: str) -> None:
    for d in dirs:  # 0700: only the owner lists or adds keys
        if not os.path.isdir(d):
            os.makedirs(d, mode=0o700)
            os.chmod(d, 0o700)


def _write_key(path: str, public: bytes, secret: bytes | None, mode: int) -> None:
    """One certificate file in pyzmq's format (``zmq.auth.load_certificate`` reads it), created with ``mode``."""
    kind = "**Secret**" if secret is not None else "Public"
    lines = [
        f"#   ****  Generated on {datetime.datetime.now()} by apexrl keygen  ****",
        f"#   ZeroMQ CURVE {kind} Certificate",
        "",
        "metadata",
        "curve",
        f'    public-key = "{public.decode("ascii")}"',
    ]
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
        raise CurveKeyError(
            f"{path} is owned by uid {st.st_uid}, not by this user (uid {os.geteuid()}) or root: "
            "another user could replace the keys; copy them into a directory of your own"
        )
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CurveKeyError(
            f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): run `chmod go-w {path}`"
        )


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
        raise CurveKeyError(
            f"cannot read CURVE secret key {path}: {e.strerror} (create keys with `apexrl keygen DIR`)"
        ) from None
    _check_trusted(path, st)
    if st.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise CurveKeyError(
            f"CURVE secret key {path} is accessible by group or others (mode "
            f"{stat.S_IMODE(st.st_mode):04o}): run `chmod 600 {path}`"
        )
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
            raise CurveKeyError(
                f"{os.path.join(auth_dir, n)}: an allow-list file is named learner.key, "
                "actor.NAME.key (its role, see `apexrl keygen --role`) or client.key (a key "
                "directory made before roles; the learner's rights): rename it"
            )
        key = _read(os.path.join(auth_dir, n))[0]
        if key in identities:
            raise CurveKeyError(f"{auth_dir}: the same key is authorized as {identities[key]!r} and {user_id!r}")
        identities[key] = user_id
    return ServerKeys(
        public=public, secret=secret, allowed=frozenset(identities), directory=directory, identities=identities
    )


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
