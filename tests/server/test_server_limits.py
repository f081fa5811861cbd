"""Limits of the replay server and the parameter service against peers that wait, hoard, leave or never read.

Unbounded waiting requests, a rate-limiter deadlock, the snapshot path, SAMPLE replies, idle connections and
params peers that never read. Every test runs real processes or a real ParamServer on
127.0.0.1 and waits for conditions (counters, log lines, EOF) with generous deadlines; no time is asserted.
"""

from __future__ import annotations

import re
import resource
import signal
import socket
import struct
import subprocess
import sys
import time

import numpy as np
import pytest
import zmq

from apexrl import PrioritizedStore
from apexrl.errors import ServerError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from tests.helpers import wait_until

DEADLINE = 60.0
U32_MAX = 2**32 - 1


def stats_until(client: ReplayClient, what: str, cond, timeout: float = DEADLINE) -> dict:
    return wait_until(lambda: (lambda s: s if cond(s) else None)(client.stats()), timeout, what)


def replies(sock: zmq.Socket, count: int, timeout: float = DEADLINE, *, frames: bool = False) -> list[tuple]:
    """(request_id, status, message) of ``count`` replies read from a raw DEALER (and each reply's frames, as a
    fourth element, with ``frames``)."""
    out = []
    deadline = time.monotonic() + timeout
    while len(out) < count:
        left = deadline - time.monotonic()
        if left <= 0 or not sock.poll(int(left * 1000)):
            raise AssertionError(f"got {len(out)} of {count} replies: {[o[:3] for o in out[-3:]]}")
        got = sock.recv_multipart()
        _m, _v, _op, rid, status, _f, _c, _p, _t = struct.unpack("<4sHHQHHIdI4x", got[0])
        message = got[1].decode() if status != 0 and len(got) > 1 else ""
        out.append((rid, status, message, got) if frames else (rid, status, message))
    return out


def insert(client: ReplayClient, n: int, size: int = 8) -> None:
    client.insert(np.ones(n), [bytes([i % 251]) * size for i in range(n)])


# ------------------------------------------------------------------------------ case 3: waiting requests


def test_one_peer_cannot_pile_up_waiting_samples_and_the_release_check_stays_cheap(start_server, raw_socket):
    """The issue's 60,000 SAMPLEs with timeout_ms = 2^32-1, scaled down: the peer keeps at most its cap waiting
    (the oldest are answered TIMEOUT), and with hundreds waiting each release check looks at O(1) entries."""
    srv = start_server("--min-size-to-sample", "5", "--max-waiting-per-peer", "300")
    sock = raw_socket(srv.endpoint)
    for rid in range(1, 2001):
        sock.send_multipart(P.encode_sample(rid, 1, 0.4, U32_MAX))
    evicted = replies(sock, 1700)
    assert all(status == P.Status.TIMEOUT and "max_waiting_per_peer=300" in msg for _rid, status, msg in evicted)
    assert sorted(rid for rid, _s, _m in evicted) == list(range(1, 1701))  # the oldest go first
    with ReplayClient(srv.endpoint, timeout=30) as client:
        s = stats_until(client, "1700 evicted", lambda s: s["deferred_evicted"] == 1700)
        assert s["deferred"] == 300 and s["deferred_peers"] == 1
        for _ in range(200):  # each served request triggers a release check
            client.update_priorities(np.zeros(0, np.uint64), np.zeros(0))
        s = client.stats()
        assert s["deferred"] == 300
        assert s["deferred_examined_max"] <= 2, s  # the heads of the two queues, not the 300 that wait
        insert(client, 5)  # min size reached: the waiting samples are served, in order
    got = replies(sock, 300)
    assert [rid for rid, _s, _m in got] == list(range(1701, 2001)) and all(s == 0 for _r, s, _m in got)


def test_a_huge_timeout_is_clipped_to_the_servers_max_wait(start_server, raw_socket):
    srv = start_server("--min-size-to-sample", "5", "--max-wait", "1")
    sock = raw_socket(srv.endpoint)
    sock.send_multipart(P.encode_sample(7, 1, 0.4, U32_MAX))
    [(rid, status, message)] = replies(sock, 1)
    assert (rid, status) == (7, P.Status.TIMEOUT)
    assert "max_wait_s=1" in message and "clipped" in message and "min_size_to_sample=5" in message


def test_a_peer_that_leaves_loses_its_waiting_requests(start_server):
    srv = start_server("--min-size-to-sample", "5", "--max-wait", "2")
    ctx = zmq.Context()
    try:
        sock = ctx.socket(zmq.DEALER)
        sock.connect(srv.endpoint)
        for rid in range(1, 101):
            sock.send_multipart(P.encode_sample(rid, 1, 0.4, U32_MAX))
        with ReplayClient(srv.endpoint, timeout=30) as client:
            stats_until(client, "100 waiting", lambda s: s["deferred"] == 100)
            sock.close(linger=0)
            s = stats_until(client, "the departed peer's requests dropped", lambda s: s["deferred"] == 0)
            assert s["deferred_dropped"] == 100 and s["deferred_peers"] == 0, s
            insert(client, 5)
            assert len(client.sample(3)) == 3  # still serving
    finally:
        ctx.destroy(linger=0)


def test_waiting_inserts_hold_at_most_max_waiting_mb(start_server, raw_socket):
    """Rate-limited INSERTs hold their data while they wait (150 x 1 MiB held 150 MB): capped."""
    srv = start_server("--samples-per-insert", "1", "--error-buffer", "100", "--max-waiting-mb", "1")
    with ReplayClient(srv.endpoint, timeout=30) as client:
        insert(client, 101)  # (I - min size) * spi - S = 100 = error_buffer: the next insert must wait
        sock = raw_socket(srv.endpoint)
        big = b"x" * (256 << 10)
        data, offsets = P.pack_items([big])
        for rid in range(1, 11):
            sock.send_multipart(P.encode_insert(rid, [1.0], data, offsets, U32_MAX))
        refused = replies(sock, 7)  # 3 x 256 KiB wait; a 4th would be over 1 MiB
        assert all(status == P.Status.TIMEOUT and "max_waiting_mb=1" in msg for _r, status, msg in refused)
        s = stats_until(client, "3 inserts waiting", lambda s: s["deferred"] == 3)
        assert 3 * len(big) <= s["deferred_bytes"] <= 1 << 20 and s["deferred_refused"] == 7
        assert len(client.sample(3)) == 3  # samples make room: the waiting inserts go through
        assert [status for _r, status, _m in replies(sock, 3)] == [0, 0, 0]


# ------------------------------------------------------------------------------ case 5: deadlock refused


def test_a_request_the_rate_limiter_could_never_admit_is_refused_at_once(start_server):
    """The issue's numbers: --samples-per-insert 1, default error buffer (100), sampling 256, inserting 50."""
    srv = start_server("--samples-per-insert", "1")
    with ReplayClient(srv.endpoint, timeout=30) as client:
        insert(client, 50)
        with pytest.raises(ServerError) as info:
            client.sample(256, timeout=20)  # refused at once, not after waiting
        assert info.value.status == P.Status.INVALID_ARGUMENT
        msg = info.value.message
        assert "256" in msg and "2 x error_buffer = 200" in msg and "samples_per_insert=1" in msg, msg
        with pytest.raises(ServerError, match=r"insert of 201 x samples_per_insert 1 = 201 exceeds 2 x error_buffer"):
            client.insert(np.ones(201), [b"i"] * 201, timeout=20)
        assert len(client.sample(149)) == 149  # within the bound, (50 - min size 1) * 1 + 100: served
        assert client.stats()["size"] == 50


# ------------------------------------------------------------------------------ case 8: reply cap


def test_sample_replies_over_the_cap_are_refused_before_sampling(start_server, raw_socket):
    srv = start_server("--max-reply-mb", "1")
    with ReplayClient(srv.endpoint, timeout=30) as client:
        insert(client, 100, size=1000)
        with pytest.raises(ServerError) as info:
            client.sample(2000)
        assert info.value.status == P.Status.TOO_LARGE
        assert re.search(
            r"SAMPLE of 2000 items .* about \d+ bytes.*largest item stored 1000.* 1048576 bytes", info.value.message
        ), info.value.message
        sock = raw_socket(srv.endpoint)  # the 40-byte request for 2^18 items
        sock.send_multipart(P.encode_sample(5, 1 << 18, 0.4, 0))
        [(rid, status, message)] = replies(sock, 1)
        assert (rid, status) == (5, P.Status.TOO_LARGE) and str(1 << 18) in message
        assert len(client.sample(500)) == 500  # under the cap: served
        assert client.stats()["errors_sample"] == 2


# ------------------------------------------------------------------------------ case 7: snapshot path


def test_a_snapshot_path_that_cannot_be_written_is_refused_at_start(tmp_path):
    proc = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--port", "0", "--snapshot", str(tmp_path / "no/such/dir/r.snap")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "does not exist" in proc.stderr and "no/such/dir" in proc.stderr, proc.stderr


def _limit_file_size() -> None:  # in the server process: writes past 200 KB fail with EFBIG instead of killing it
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))


def test_a_failing_save_keeps_the_old_snapshot_and_the_server_serving(tmp_path):
    """A full disk, emulated with RLIMIT_FSIZE: periodic saves fail (logged), the server keeps serving, the
    previous snapshot still loads; the failed final save exits 1 saying what was not saved, no traceback."""
    snap = tmp_path / "r.snap"
    log_path = tmp_path / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "apexrl.cli.server",
                "--port",
                "0",
                "--snapshot",
                str(snap),
                "--snapshot-every",
                "0.3",
                "--log-level",
                "INFO",
            ],
            stdout=subprocess.PIPE,
            stderr=log,
            preexec_fn=_limit_file_size,
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().decode()
        endpoint = line.strip().rsplit(" ", 1)[1]
        with ReplayClient(endpoint, timeout=30) as client:
            insert(client, 10)
            wait_until(
                lambda: snap.exists() and len(PrioritizedStore.load(str(snap))) == 10,
                DEADLINE,
                "a snapshot of 10 items",
            )
            insert(client, 100, size=4000)  # 400 KB: every later save is over the file size limit
            wait_until(lambda: re.search(r"periodic snapshot.*failed", log_path.read_text()), DEADLINE, "a failed save")
            insert(client, 5)
            assert len(client.sample(20)) == 20 and client.stats()["size"] == 115
        assert len(PrioritizedStore.load(str(snap))) == 10
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(DEADLINE) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
        proc.stdout.close()
    text = log_path.read_text()
    assert "Traceback" not in text, text
    assert re.search(
        r"final snapshot .* failed .* the 115 items held now were not saved; the previous snapshot "
        r"holds 10 items",
        text,
    ), text


# ------------------------------------------------------------------------------ case 11: idle connections


def _limit_fds() -> None:  # in the server process: the small descriptor limit
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))


def test_connections_that_never_send_are_closed_after_the_handshake_interval(tmp_path):
    """150 idle TCP connections locked real clients out of a 128-fd server. Here 100 of them against a server
    limited to 64 descriptors: libzmq closes each one that has not completed the ZMTP handshake within
    --handshake-timeout (EOF on it), so descriptors come back and a real client gets in."""
    with open(tmp_path / "server.log", "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "apexrl.cli.server", "--port", "0", "--handshake-timeout", "1"],
            stdout=subprocess.PIPE,
            stderr=log,
            preexec_fn=_limit_fds,
        )
    idle: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        endpoint = proc.stdout.readline().decode().strip().rsplit(" ", 1)[1]
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        idle = [socket.create_connection((host, int(port)), timeout=DEADLINE) for _ in range(100)]
        with ReplayClient(endpoint, timeout=20) as client:  # (libzmq's default handshake interval is 30 s)
            insert(client, 3)
            assert client.stats()["size"] == 3
        for s in idle:  # the server sent its greeting, then closed: read until EOF
            while s.recv(4096):
                pass
    finally:
        for s in idle:
            s.close()
        proc.kill()
        proc.wait(10)
        if proc.stdout is not None:
            proc.stdout.close()


def test_a_params_peer_that_never_reads_pins_a_bounded_number_of_replies():
    from apexrl.params.service import ParamServer

    torch = pytest.importorskip("torch")
    with ParamServer() as server:
        server.publish({"w": torch.zeros(1 << 20)})  # 4 MiB of weights per reply
        ctx = zmq.Context()
        try:
            sock = ctx.socket(zmq.DEALER)
            sock.setsockopt(zmq.RCVHWM, 1)  # a peer that does not read: its own queue does not drain the server's
            sock.setsockopt(zmq.RCVBUF, 4096)
            sock.connect(server.endpoint)
            for rid in range(1, 65):
                sock.send_multipart(P.encode_get_params(rid, 0, 0))
            s = wait_until(
                lambda: (lambda s: s if s["requests"] == 64 else None)(server.stats()),
                DEADLINE,
                "64 requests answered or dropped",
            )
            queued = s["params"] - s["dropped"]
            assert s["dropped"] >= 48 and queued <= 16 and s["parked"] <= 1, s  # not 64 copies
        finally:
            ctx.destroy(linger=0)
