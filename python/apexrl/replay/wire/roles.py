"""Which ops each client role may send: the one protocol policy both services enforce.

The ZAP handler (:mod:`apexrl.security.zap`) gives each connection its key's identity as the ZMQ User-Id
(``learner``, ``actor:NAME``; :func:`apexrl.security.keys.user_id_of_file`); :data:`ROLE_OPS` says which ops
(:class:`apexrl.replay.wire.schema.Op`) each role may send (:func:`role_of`, :func:`may`).
"""

from __future__ import annotations

from apexrl.replay.wire.schema import Op
from apexrl.security.keys import _NAME, ACTOR, CLIENT, LEARNER, ROLES

__all__ = ["ROLE_OPS", "may", "role_of"]


ROLE_OPS: dict[str, frozenset[int]] = {
    LEARNER: frozenset(int(op) for op in Op),
    ACTOR: frozenset({int(Op.HELLO), int(Op.INSERT), int(Op.STATS), int(Op.GET_PARAMS)}),
}
"""The ops (:class:`apexrl.replay.wire.schema.Op` values) each role may send, on either service: an actor inserts
experience, says hello, reads STATS (the sharded client needs it) and fetches weights; the learner may do
everything, CHECKPOINT and RESET included. The one definition both services enforce (see :func:`may`)."""
assert tuple(ROLE_OPS) == ROLES  # the roles keygen issues keys for


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
