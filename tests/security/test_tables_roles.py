"""Roles under CURVE on a server with several tables (roles and CURVE work per table
unchanged): a real `apexrl.cli.server` on 127.0.0.1 with a prioritized table and a queue, keys from the real
`apexrl keygen`. An actor's key inserts into both tables and may not sample or update either; the learner's key
samples and updates both; each table's counters move by what was done to it alone; a request naming a table the
server does not have is refused, under CURVE as without, and changes nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zmq

from apexrl.errors import ServerError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.schema import Status
from apexrl.security import secure_client_socket

DEADLINE_MS = 30_000

TABLES = [
    {"name": "default", "capacity": 1000},  # prioritized, the Ape-X table
    {
        "name": "onpolicy",
        "sampler": "fifo",
        "capacity": 100,
        "max_times_sampled": 1,
        "rate_limiter": {"kind": "queue", "size": 100},
    },
]


def _keygen(*args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "apexrl", "keygen", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.fixture
def curve_tables_server(tmp_path, start_server):
    """(server, the learner's key directory, an actor's key directory): CURVE on, two tables."""
    keys = str(tmp_path / "keys")
    _keygen(keys)
    _keygen(keys, "--role", "actor", "--name", "a1")
    tables = tmp_path / "tables.json"
    tables.write_text(json.dumps(TABLES))
    server = start_server("--curve-dir", keys, "--tables", str(tables))
    return server, keys, os.path.join(keys, "actors", "a1")


def _raw_call(endpoint: str, curve: str, frames: list, op: P.Op, rid: int) -> P.Reply:
    """One request on a CURVE DEALER of its own, as a client that names any table index would send it."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.DEALER)
    try:
        sock.setsockopt(zmq.LINGER, 0)
        secure_client_socket(sock, curve)
        sock.connect(endpoint)
        sock.send_multipart(frames)
        assert sock.poll(DEADLINE_MS), f"no reply to {op.name}"
        return P.decode_reply(sock.recv_multipart(), op, rid)
    finally:
        sock.close(0)
        ctx.term()


def _sizes(client: ReplayClient) -> dict[str, int]:
    return {name: t["size"] for name, t in client.tables().items()}


def test_roles_hold_on_every_table_and_a_missing_table_is_refused_under_curve(curve_tables_server):
    server, learner_keys, actor_keys = curve_tables_server
    with ReplayClient(server.endpoint, timeout=30, curve=actor_keys) as actor:
        assert [t["name"] for t in actor.hello().tables] == ["default", "onpolicy"]
        d_keys = actor.insert(np.ones(3), [b"d0", b"d1", b"d2"])
        q_keys = actor.insert(np.ones(4), [b"q0", b"q1", b"q2", b"q3"], table="onpolicy")
        assert len(d_keys) == 3 and len(q_keys) == 4
        for table, keys in (("default", d_keys), ("onpolicy", q_keys)):
            for op, call in (
                ("SAMPLE", lambda t=table: actor.sample(1, table=t)),
                (
                    "UPDATE_PRIORITIES",
                    lambda t=table, k=keys: actor.update_priorities(k, np.full(len(k), 5.0), table=t),
                ),
                ("RESET", lambda t=table: actor.reset(t)),
                ("CHECKPOINT", actor.checkpoint),
            ):
                with pytest.raises(ServerError) as info:
                    call()
                assert info.value.status == Status.INVALID_ARGUMENT
                assert info.value.message == f"permission denied: client 'actor:a1' (role 'actor') may not send {op}"
        s = actor.stats()  # the refusals changed nothing: nothing sampled, reset or removed from the queue
        assert s["requests_refused_role"] == 8, s
        assert s["table.default.resets"] == s["table.onpolicy.resets"] == 0, s
        assert (s["table.default.size"], s["table.onpolicy.size"]) == (3, 4), s
        with pytest.raises(ValueError, match=r"no table 'nope'.*\['default', 'onpolicy'\]"):
            actor.insert(np.ones(1), [b"x"], table="nope")

    with ReplayClient(server.endpoint, timeout=30, curve=learner_keys) as learner:
        before = learner.tables()
        assert {n: t["size"] for n, t in before.items()} == {"default": 3, "onpolicy": 4}
        assert before["default"]["rate_limiter_inserted_items"] == 3
        assert before["onpolicy"]["rate_limiter_inserted_items"] == 4

        batch = learner.sample(5)  # prioritized, with replacement, from `default` only
        assert len(batch) == 5 and set(batch.keys.tolist()) <= set(d_keys.tolist())
        assert learner.update_priorities(d_keys, np.full(3, 2.0)) == 3
        assert learner.update_priorities(d_keys, np.full(3, 2.0), table="onpolicy") == 0  # stale on the queue

        popped = learner.sample(3, table="onpolicy")  # oldest first, each once
        assert popped.keys.tolist() == q_keys[:3].tolist()
        assert [bytes(popped.data[popped.offsets[i] : popped.offsets[i + 1]]) for i in range(3)] == [
            b"q0",
            b"q1",
            b"q2",
        ]
        assert learner.update_priorities(q_keys, np.full(4, 3.0), table="onpolicy") == 1  # only q3 is still held
        assert learner.update_priorities(q_keys, np.full(4, 3.0)) == 0  # a queue's keys are stale on `default`
        assert _sizes(learner) == {"default": 3, "onpolicy": 1}

        after = learner.tables()
        assert after["default"]["rate_limiter_sampled_items"] - before["default"]["rate_limiter_sampled_items"] == 5
        assert after["onpolicy"]["rate_limiter_sampled_items"] - before["onpolicy"]["rate_limiter_sampled_items"] == 3
        assert after["default"]["rate_limiter_inserted_items"] == 3  # inserts of one table never count on another
        assert after["onpolicy"]["rate_limiter_inserted_items"] == 4

        # a table the server does not have: refused by name in the client, by index at the server, under CURVE
        with pytest.raises(ValueError, match=r"no table 'nope'.*\['default', 'onpolicy'\]"):
            learner.sample(1, table="nope")
        refused_before = learner.stats()["requests_refused_table"]
    calls = [
        (learner_keys, P.Op.SAMPLE, lambda rid: P.encode_sample(rid, 1, 0.4, table=2)),
        (learner_keys, P.Op.UPDATE_PRIORITIES, lambda rid: P.encode_update(rid, d_keys, np.ones(3), table=7)),
        (
            learner_keys,
            P.Op.INSERT,
            lambda rid: P.encode_insert(rid, np.ones(1), b"x", np.array([0, 1], np.uint64), table=2),
        ),
        (
            actor_keys,
            P.Op.INSERT,
            lambda rid: P.encode_insert(rid, np.ones(1), b"y", np.array([0, 1], np.uint64), table=9),
        ),
    ]
    for rid, (curve, op, encode) in enumerate(calls, start=1):
        reply = _raw_call(server.endpoint, curve, encode(rid), op, rid)
        assert reply.status == Status.INVALID_ARGUMENT, (op, reply.message)
        assert "unknown table index" in (reply.message or "") and "1 'onpolicy'" in (reply.message or ""), reply.message
    with ReplayClient(server.endpoint, timeout=30, curve=learner_keys) as learner:
        s = learner.stats()
        assert s["requests_refused_table"] - refused_before == len(calls), s
        assert _sizes(learner) == {"default": 3, "onpolicy": 1}  # nothing inserted, nothing taken
        assert len(learner.sample(1, table="onpolicy")) == 1  # and both tables still serve
        assert len(learner.insert(np.ones(1), [b"z"], table="onpolicy")) == 1
        # The learner may reset and checkpoint (this server has no --snapshot: refused for that, not the role).
        assert learner.reset("default") == 3
        assert _sizes(learner) == {"default": 0, "onpolicy": 1}
        with pytest.raises(ServerError, match="no snapshot path") as info:
            learner.checkpoint()
        assert info.value.status == Status.INVALID_ARGUMENT
        assert learner.stats()["requests_refused_role"] == 8
