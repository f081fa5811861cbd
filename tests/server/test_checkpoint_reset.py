"""CHECKPOINT and RESET (Reverb's ``Client.checkpoint`` / ``Client.reset``) against real server processes on
127.0.0.1: a checkpoint is the snapshot a restart after ``kill -9`` restores; a reset empties one table (items,
keys, rate limiter counts) and nothing else; a failed checkpoint is answered with the reason and the server
serves on; malformed requests are refused and change nothing. The roles (an actor may not) are checked under
CURVE in tests/security/test_tables_roles.py."""

from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest

from apexrl.errors import ServerError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.schema import HEADER, MAGIC, PROTOCOL_VERSION, Status

TABLES = [
    {"name": "default", "capacity": 1000},
    {
        "name": "onpolicy",
        "sampler": "fifo",
        "capacity": 100,
        "max_times_sampled": 1,
        "rate_limiter": {"kind": "queue", "size": 100},
    },
]


@pytest.fixture
def tables_json(tmp_path):
    path = tmp_path / "tables.json"
    path.write_text(json.dumps(TABLES))
    return str(path)


def _sizes(client: ReplayClient) -> dict[str, int]:
    return {name: t["size"] for name, t in client.tables().items()}


def test_checkpoint_is_what_a_restart_after_kill_9_restores(tmp_path, start_server, tables_json):
    snap = str(tmp_path / "run" / "replay.snap")
    os.mkdir(tmp_path / "run")
    args = ("--tables", tables_json, "--snapshot", snap)
    server = start_server(*args)
    with ReplayClient(server.endpoint, timeout=30) as c:
        keys = c.insert(np.array([1.0, 2.0, 3.0]), [b"a", b"b", b"c"])
        c.insert(np.ones(2), [b"q0", b"q1"], table="onpolicy")
        assert c.checkpoint() == os.path.abspath(snap)
        c.insert(np.ones(1), [b"after"])  # not in the checkpoint: lost with the kill
        assert c.stats()["requests_checkpoint"] == 1
    with open(snap) as f:
        manifest = json.load(f)
    assert {t["name"]: t["items"] for t in manifest["tables"]} == {"default": 3, "onpolicy": 2}
    server.kill9()

    server = start_server(*args)
    with ReplayClient(server.endpoint, timeout=30) as c:
        assert _sizes(c) == {"default": 3, "onpolicy": 2}
        assert c.update_priorities(keys, np.full(3, 5.0)) == 3  # restored items keep their keys
        popped = c.sample(2, table="onpolicy")
        assert [bytes(x) for x in popped.items] == [b"q0", b"q1"]


def test_reset_empties_one_table_and_a_failed_checkpoint_leaves_the_server_serving(tmp_path, start_server, tables_json):
    os.mkdir(tmp_path / "run")
    snap = str(tmp_path / "run" / "replay.snap")
    server = start_server("--tables", tables_json, "--snapshot", snap)
    with ReplayClient(server.endpoint, timeout=30) as c:
        keys = c.insert(np.full(4, 7.0), [b"d0", b"d1", b"d2", b"d3"])
        q_keys = c.insert(np.ones(3), [b"q0", b"q1", b"q2"], table="onpolicy")
        c.sample(2)
        before = c.tables()
        assert before["default"]["rate_limiter_inserted_items"] == 4
        assert before["default"]["rate_limiter_sampled_items"] == 2

        assert c.reset() == 4  # this client's table, `default`
        after = c.tables()
        assert {n: t["size"] for n, t in after.items()} == {"default": 0, "onpolicy": 3}
        d = after["default"]
        assert (d["rate_limiter_inserted_items"], d["rate_limiter_sampled_items"]) == (0, 0)
        assert (d["resets"], d["erased"], d["bytes_held"]) == (1, 4, 0)
        assert after["onpolicy"]["rate_limiter_inserted_items"] == 3  # the other table is untouched
        assert after["onpolicy"]["resets"] == 0
        assert c.update_priorities(keys, np.ones(4)) == 0  # the old keys are stale
        assert c.erase(keys) == 0
        new = c.insert(np.ones(1), [b"new"])
        assert not set(new.tolist()) & set(keys.tolist())
        assert [bytes(x) for x in c.sample(1).items] == [b"new"]

        assert c.reset(table="onpolicy") == 3
        assert c.reset(table="onpolicy") == 0  # already empty
        assert c.update_priorities(q_keys, np.ones(3), table="onpolicy") == 0
        assert _sizes(c) == {"default": 1, "onpolicy": 0}
        with pytest.raises(ValueError, match="no table 'nope'"):
            c.reset(table="nope")

        shutil.rmtree(tmp_path / "run")  # the snapshot's directory is gone: the save fails
        with pytest.raises(ServerError) as info:
            c.checkpoint()
        assert info.value.status == Status.INTERNAL
        assert "checkpoint failed" in info.value.message and "the previous snapshot is kept" in info.value.message
        assert _sizes(c) == {"default": 1, "onpolicy": 0}  # and it serves on
        os.mkdir(tmp_path / "run")
        assert c.checkpoint() == os.path.abspath(snap)
        assert c.stats()["errors_checkpoint"] == 1


def _header(op: int, rid: int, *, count: int = 0, table: int = 0, param: float = 0.0, timeout_ms: int = 0) -> bytes:
    return HEADER.pack(MAGIC, PROTOCOL_VERSION, op, rid, 0, 0, count, param, timeout_ms, table)


MALFORMED = [
    ([_header(P.Op.RESET, 1, table=5)], Status.INVALID_ARGUMENT, "unknown table index 5"),
    ([_header(P.Op.RESET, 2, count=3)], Status.BAD_MESSAGE, "header count is 3, must be 0"),
    ([_header(P.Op.RESET, 3, timeout_ms=10)], Status.BAD_MESSAGE, "header timeout_ms is 10, must be 0"),
    ([_header(P.Op.RESET, 4), b"x"], Status.BAD_MESSAGE, "must have 1 frames"),
    ([_header(P.Op.CHECKPOINT, 5, table=1)], Status.BAD_MESSAGE, "must be 0 (CHECKPOINT names no table)"),
    ([_header(P.Op.CHECKPOINT, 6, param=0.5)], Status.BAD_MESSAGE, "header param is 0.5, must be 0.0"),
    ([_header(P.Op.CHECKPOINT, 7), b""], Status.BAD_MESSAGE, "must have 1 frames"),
]


def test_malformed_reset_and_checkpoint_requests_are_refused_and_change_nothing(
    tmp_path, start_server, tables_json, raw_socket
):
    server = start_server("--tables", tables_json, "--snapshot", str(tmp_path / "replay.snap"))
    sock = raw_socket(server.endpoint)
    with ReplayClient(server.endpoint, timeout=30) as c:
        c.insert(np.ones(2), [b"a", b"b"])
        for frames, status, words in MALFORMED:
            sock.send_multipart(frames)
            assert sock.poll(30_000), f"no reply to {frames!r}"
            op, rid = int.from_bytes(frames[0][6:8], "little"), int.from_bytes(frames[0][8:16], "little")
            reply = P.decode_reply(sock.recv_multipart(), P.Op(op), rid)
            assert reply.status == status and words in (reply.message or ""), (words, reply.message)
        assert _sizes(c) == {"default": 2, "onpolicy": 0}
        assert c.tables()["default"]["resets"] == 0
    assert not os.path.exists(tmp_path / "replay.snap")  # no checkpoint was written either
