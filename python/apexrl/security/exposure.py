"""Exposure checks: the loopback-or-keys rule every service's configuration applies, the warning of an
``--insecure`` service beyond loopback, and the bounds on what idle or vanished peers may hold."""

from __future__ import annotations

import ipaddress
import logging

import zmq

from apexrl.security.keys import ENV_VAR, PathLike

__all__ = [
    "SERVICE_HWM",
    "check_exposure",
    "is_loopback",
    "limit_idle_connections",
    "raise_nofile_limit",
    "warn_if_exposed",
]

log = logging.getLogger("apexrl.security")


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
    log.info(
        "%s: open-file limit %s (hard %s): it bounds the connections, with the handshake and heartbeat "
        "timeouts; libzmq has no per-socket connection cap",
        what,
        soft,
        hard,
    )
    return soft, hard


def warn_if_exposed(bind: str, curve: object, what: str) -> bool:
    """Log a WARNING when ``what`` listens on ``bind`` beyond loopback without CURVE (``--insecure``): anyone who
    can reach it can use it. Returns whether it did."""
    if curve is not None or is_loopback(bind):
        return False
    log.warning(
        "%s listens on %s WITHOUT CURVE (--insecure): every host that can reach it can use it, "
        "unauthenticated and unencrypted",
        what,
        bind,
    )
    return True
