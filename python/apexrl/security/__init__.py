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
:data:`~apexrl.replay.wire.roles.ROLE_OPS` (protocol policy, beside the schema) says which ops each role may
send (:func:`~apexrl.replay.wire.roles.role_of`, :func:`~apexrl.replay.wire.roles.may`).

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

The package by concept: :mod:`.keys` (key files, keygen, identities), :mod:`.zap` (CURVE on sockets, the ZAP
handler), :mod:`.exposure` (the loopback-or-keys rule, connection bounds). ``apexrl.security`` was one module:
its names, the role policy's included, are all importable from here as before.
"""

from __future__ import annotations

import importlib
from typing import Any

from apexrl.security.exposure import (
    SERVICE_HWM,
    check_exposure,
    is_loopback,
    limit_idle_connections,
    raise_nofile_limit,
    warn_if_exposed,
)
from apexrl.security.keys import (
    ACTOR,
    AUTHORIZED,
    CLIENT,
    ENV_VAR,
    LEARNER,
    SERVER,
    ClientKeys,
    CurveKeyError,
    ServerKeys,
    client_keys,
    curve_dir_from_env,
    keygen,
    load_client_keys,
    load_server_keys,
    server_keys,
    user_id_of_file,
)
from apexrl.security.keys import (
    ROLES as ROLES,
)
from apexrl.security.keys import (
    PathLike as PathLike,
)
from apexrl.security.zap import ZAP_ENDPOINT as ZAP_ENDPOINT
from apexrl.security.zap import ZapHandler, secure_client_socket, secure_server_socket

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

_POLICY = ("ROLE_OPS", "may", "role_of")  # apexrl.replay.wire.roles imports .keys: re-exported on first use


def __getattr__(name: str) -> Any:
    if name in _POLICY:
        value = getattr(importlib.import_module("apexrl.replay.wire.roles"), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'apexrl.security' has no attribute {name!r}")
