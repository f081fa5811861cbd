"""Memory attacks on the replay server, black-box: real server processes on
127.0.0.1, raw DEALER (or raw ZMTP) peers, and the server's RSS held to the configured caps plus a stated margin.

Each attack test prints one ``RSS`` line (baseline, peak, cap, margin, after; MiB): run with ``-s`` or ``-rP`` to
see them. The peak is the kernel's high-water mark of the server's RSS (``VmHWM``, reset through
``/proc/PID/clear_refs`` just before the attack), so no spike between two reads is missed; where that reset is
not allowed the highest RSS read while waiting is used instead.

The numbers are the issue's, scaled to a 2-core CI machine: (a) 200 unread SAMPLE replies of 1 MiB against
``--max-unread-mb 32`` (the issue: 200 of 16 MiB held +2.9 GB); (b) 200 rate-limited 1 MiB INSERTs with insert
ids whose waits expire, ``--max-waiting-mb 16 --max-wait 1`` (the issue: 500 held +0.5 GB); (c) 66,000 empty
INSERTs from one identity against another identity's insert id; (d) roles; (e) a multipart message whose last
frame never comes (libzmq buffers it out of the server's sight; it comes back when the peer leaves).

Every wait is on a condition (a STATS counter, RSS under a bound) with a generous deadline; nothing is timed.
"""

from __future__ import annotations

import os
import socket
import struct
import subprocess
import sys

import numpy as np
import pytest
import zmq

from apexrl.errors import ServerError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.schema import REQUESTS
from tests.helpers import wait_until
from tests.server.test_server_limits import replies

MiB = 1 << 20
DEADLINE = 60.0
U32_MAX = 2**32 - 1
AFTER_MARGIN = 12
"""MiB over the baseline the RSS may stay once an attacker left (allocator noise; each attack holds more)."""


# ------------------------------------------------------------------------------------------- helpers


class Rss:
    """The server's resident memory in MiB: now, and the peak since ``reset_peak``."""

    def __init__(self, pid: int):
        self.pid = pid
        self._polled_max = 0.0
        self._hwm_ok = False

    def _status(self, key: str) -> float:
        with open(f"/proc/{self.pid}/status", encoding="ascii") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1]) / 1024
        raise AssertionError(f"no {key} line")

    def now(self) -> float:
        value = self._status("VmRSS")
        self._polled_max = max(self._polled_max, value)
        return value

    def reset_peak(self) -> None:
        self._polled_max = 0.0
        try:  # "5": reset the peak RSS (VmHWM) to the current RSS (Linux >= 4.0)
            with open(f"/proc/{self.pid}/clear_refs", "w", encoding="ascii") as f:
                f.write("5")
            self._hwm_ok = True
        except OSError:
            self._hwm_ok = False
        self.now()

    def peak(self) -> float:
        self.now()
        return max(self._polled_max, self._status("VmHWM")) if self._hwm_ok else self._polled_max


def rss_back(rss: Rss, baseline: float) -> float:
    """Wait until the RSS is back within AFTER_MARGIN of ``baseline``; returns it."""
    return wait_until(
        lambda: (lambda r: r if r <= baseline + AFTER_MARGIN else None)(rss.now()),
        DEADLINE,
        "RSS back near the baseline",
        interval=0.02,
    )


def report(name: str, **mib: float) -> str:
    line = f"RSS {name}: " + ", ".join(f"{k} {v:.1f} MiB" for k, v in mib.items())
    print(line)
    return line


@pytest.fixture
def dealers():
    """make(endpoint, curve=None, **sockopts) -> a DEALER with the options set *before* it connects (a peer that
    never reads keeps its own receive queue small: RCVHWM 1 and a small kernel buffer, so what piles up is the
    server's)."""
    ctx = zmq.Context()
    socks: list[zmq.Socket] = []

    def make(endpoint: str, curve=None, **opts: int) -> zmq.Socket:
        from apexrl.security import secure_client_socket

        s = ctx.socket(zmq.DEALER)
        s.setsockopt(zmq.LINGER, 0)
        for name, value in opts.items():
            s.setsockopt(getattr(zmq, name), value)
        secure_client_socket(s, curve)
        s.connect(endpoint)
        socks.append(s)
        return s

    yield make
    for s in socks:
        s.close(linger=0)
    ctx.destroy(linger=0)


def read_replies(sock: zmq.Socket, count: int, timeout: float = DEADLINE) -> list[tuple[int, int, str, list[bytes]]]:
    """(request_id, status, error message, frames) of ``count`` replies."""
    return replies(sock, count, timeout, frames=True)


def insert_frames(rid: int, items: list[bytes], insert_id=(0, 0), timeout_ms: int = 0) -> list:
    data, offsets = P.pack_items(items)
    return P.encode_insert(rid, np.ones(len(items)), data, offsets, timeout_ms, insert_id)


# ---------------------------------------------------------------------- (a) unread SAMPLE replies


def test_a_peer_that_never_reads_its_sample_replies_holds_at_most_max_unread_mb(start_server, dealers):
    cap, margin = 32, 16
    server = start_server("--max-unread-mb", str(cap))
    rss = Rss(server.pid)
    item = 64 << 10
    with ReplayClient(server.endpoint, timeout=30) as good:
        good.insert(np.ones(16), [bytes([i]) * item for i in range(16)])
        for _ in range(5):  # warm: the sampling path's own buffers are part of the baseline
            assert len(good.sample(16)) == 16
        before = good.stats()
        baseline = rss.now()
        rss.reset_peak()

        # 200 SAMPLEs of 16 x 64 KiB (a reply of ~1 MiB each: 200 MiB if all were kept), never read
        hog = dealers(server.endpoint, RCVHWM=1, RCVBUF=4096)
        for rid in range(1, 201):
            hog.send_multipart(P.encode_sample(rid, 16, 0.4))
        s = wait_until(
            lambda: (lambda s: s if s["requests_sample"] - before["requests_sample"] >= 200 else None)(good.stats()),
            DEADLINE,
            "the 200 SAMPLEs served or refused",
            interval=0.02,
            on_poll=rss.now,
        )
        held = rss.now()
        peak = rss.peak()
        assert s["unread_reply_bytes_peer_max"] <= cap * MiB, s
        assert 0 < s["unread_reply_bytes"] <= cap * MiB, s
        # most of them were refused (TIMEOUT, unread over the cap), not queued
        refused = s["replies_refused_unread"] - before["replies_refused_unread"]
        assert refused >= 200 - cap - 8, s
        assert peak <= baseline + cap + margin, report(
            "unread replies", baseline=baseline, peak=peak, cap=cap, margin=margin
        )
        assert len(good.sample(16)) == 16  # a good client is served meanwhile

        # the peer leaves: libzmq frees what it held, the count returns to 0 and the memory to the OS
        hog.close(linger=0)
        wait_until(
            lambda: good.stats()["unread_reply_bytes"] == 0, DEADLINE, "unread_reply_bytes back to 0", interval=0.02
        )
        after = rss_back(rss, baseline)
        report("unread replies", baseline=baseline, peak=peak, held=held, cap=cap, margin=margin, after=after)
        assert len(good.sample(16)) == 16

        # what such a peer reads when it does read: the replies that fit, then TIMEOUT naming the cap
        reader = dealers(server.endpoint, RCVHWM=1, RCVBUF=4096)
        n0 = good.stats()["requests_sample"]
        for rid in range(1, 61):
            reader.send_multipart(P.encode_sample(rid, 16, 0.4))
        wait_until(
            lambda: good.stats()["requests_sample"] - n0 >= 60,
            DEADLINE,
            "the 60 SAMPLEs served or refused",
            interval=0.02,
        )
        got = read_replies(reader, 60)
    statuses = [status for _r, status, _m, _f in got]
    assert [rid for rid, *_ in got] == list(range(1, 61))
    first_refused = statuses.index(P.Status.TIMEOUT)
    assert 0 < first_refused <= cap + 1 and all(st == P.Status.OK for st in statuses[:first_refused]), statuses
    assert all(st == P.Status.TIMEOUT for st in statuses[first_refused:]), statuses
    assert all("has not read yet" in m and f"max_unread_mb={cap}" in m for _r, st, m, _f in got if st), got[-1][2]
    assert server.alive()


# -------------------------------------------------------------- (b) rate-limited inserts, ids expire


def test_rate_limited_inserts_whose_waits_expire_release_their_ids_and_memory(start_server, dealers):
    cap, margin, n, size, window = 16, 16, 200, 1 * MiB, 10
    server = start_server(
        "--samples-per-insert", "1", "--error-buffer", "100", "--max-waiting-mb", str(cap), "--max-wait", "1"
    )
    rss = Rss(server.pid)
    with ReplayClient(server.endpoint, timeout=30) as good:
        good.insert(np.ones(101), [b"seed"] * 101)  # (I - 1) * spi - S = 100 = error_buffer: every insert waits
        before = good.stats()
        baseline = rss.now()
        rss.reset_peak()
        hog = dealers(server.endpoint)
        blob = b"\xee" * size
        sent = 0
        while sent < n:  # in windows, each taken in (queued or refused) before the next: what piles up beyond one
            for _ in range(
                window
            ):  # window (which libzmq's I/O thread may hold in the server's memory) is the server's
                sent += 1
                hog.send_multipart(insert_frames(sent, [blob], (0xA77AC, sent), U32_MAX))
            wait_until(
                lambda: (lambda s: s["requests_insert"] - before["requests_insert"] + s["deferred"] >= sent)(
                    good.stats()
                ),
                DEADLINE,
                f"{sent} inserts taken in",
                interval=0.02,
                on_poll=rss.now,
            )
            assert good.stats()["deferred_bytes"] <= cap * MiB
        # every one is answered TIMEOUT: at once (no room), or when its wait (clipped to 1 s) expires
        got = read_replies(hog, n)
        assert sorted(rid for rid, *_ in got) == list(range(1, n + 1))
        assert all(st == P.Status.TIMEOUT for _r, st, _m, _f in got), {m for _r, _s, m, _f in got}
        s = wait_until(
            lambda: (lambda s: s if s["insert_ids_pending"] == 0 and s["deferred"] == 0 else None)(good.stats()),
            DEADLINE,
            "every insert id released",
            interval=0.02,
        )
        peak = rss.peak()
        assert s["deferred_bytes"] == 0 and s["size"] == 101 and s["deferred_refused"] > 0, s
        # the cap, plus the window in flight (on a loaded machine libzmq receives a whole window before the serving
        # thread takes one in: CI measured +39.6 MiB with windows of 20), plus allocator noise
        in_flight = window * size / MiB
        assert peak <= baseline + cap + in_flight + margin, report(
            "expired inserts", baseline=baseline, peak=peak, cap=cap, in_flight=in_flight, margin=margin
        )
        after = rss_back(rss, baseline)
        report("expired inserts", baseline=baseline, peak=peak, cap=cap, margin=margin, after=after)

        # the released ids are free again: once samples make room, a retry with an expired id is stored
        assert len(good.sample(60)) == 60
        hog.send_multipart(insert_frames(9001, [b"retry"], (0xA77AC, 1), 5000))
        [(rid, status, message, _frames)] = read_replies(hog, 1)
        assert (rid, status) == (9001, P.Status.OK), message
        assert good.stats()["size"] == 102


# ------------------------------------------------------- (c) one identity floods the insert-id window


def _keygen(*args: str) -> None:
    out = subprocess.run([sys.executable, "-m", "apexrl", "keygen", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


@pytest.fixture
def role_keys(tmp_path):
    """(key directory with the server's and the learner's keys, an actor's directory), from `apexrl keygen`."""
    keys = str(tmp_path / "keys")
    _keygen(keys)
    _keygen(keys, "--role", "actor", "--name", "flood")
    return keys, os.path.join(keys, "actors", "flood")


def test_one_identity_flooding_empty_inserts_cannot_push_out_anothers_insert_ids(start_server, dealers, role_keys):
    keys, actor = role_keys
    server = start_server("--curve-dir", keys)
    rss = Rss(server.pid)
    learner = dealers(server.endpoint, curve=keys)
    learner.send_multipart(insert_frames(1, [b"learner item"], (0x1EA, 1)))
    [(_r, status, message, frames)] = read_replies(learner, 1)
    assert status == 0, message
    first_keys = np.frombuffer(frames[1], "<u8").tolist()
    baseline = rss.now()
    rss.reset_peak()

    # 66,000 empty, never rate-limited INSERTs, each with a new id: more than the 65,536 one identity may keep
    flood, total, window = dealers(server.endpoint, curve=actor), 66_000, 2000
    empty = insert_frames(0, [], (0xF100D, 1))
    header = bytearray(empty[0])
    at_ids = [f.name for f in REQUESTS[P.Op.INSERT].frames].index("insert_id") + 1  # frame 0 is the header
    ids = np.zeros(2, "<u8")
    ids[0] = 0xF100D
    sent = 0
    while sent < total:
        batch = min(window, total - sent)
        for _ in range(batch):
            sent += 1
            struct.pack_into("<Q", header, 8, sent)  # request_id
            ids[1] = sent
            flood.send_multipart([bytes(header), *empty[1:at_ids], ids.tobytes(), *empty[at_ids + 1 :]])
        got = read_replies(flood, batch)
        assert all(st == 0 for _r, st, _m, _f in got), got[0][2]
    with ReplayClient(server.endpoint, timeout=30, curve=keys) as probe:
        s = probe.stats()
    peak = rss.peak()
    margin = 16
    ids_mib = s["insert_ids_bytes"] / MiB  # bounded by DEDUP_MAX_BYTES (64 MiB) and 65,536 ids per identity
    report("insert-id flood", baseline=baseline, peak=peak, insert_ids=ids_mib, margin=margin)
    assert ids_mib <= 64 and peak <= baseline + ids_mib + margin, (baseline, peak, ids_mib)
    assert s["insert_id_identities"] == 2, s
    assert s["insert_ids_forgotten"] >= total - 65_536, s  # the flooder pushed out its own ids only
    assert s["insert_ids_pending"] == 0 and s["requests_insert"] == total + 1, s

    # the learner's retry of its first insert is still recognised: same keys back, nothing stored again
    learner.send_multipart(insert_frames(2, [b"learner item"], (0x1EA, 1)))
    [(rid, status, message, frames)] = read_replies(learner, 1)
    assert (rid, status) == (2, 0), message
    assert np.frombuffer(frames[1], "<u8").tolist() == first_keys
    with ReplayClient(server.endpoint, timeout=30, curve=keys) as probe:
        s2 = probe.stats()
    assert s2["duplicate_inserts"] == s["duplicate_inserts"] + 1 and s2["size"] == 1, s2


# ----------------------------------------------------------------------------------------- (d) roles


def test_an_actor_key_may_hello_insert_and_stats_only_a_learner_key_everything(start_server, role_keys):
    keys, actor_dir = role_keys
    server = start_server("--curve-dir", keys)
    with ReplayClient(server.endpoint, timeout=30, curve=actor_dir) as actor:
        assert actor.hello().max_request_bytes > 0
        inserted = actor.insert(np.ones(3), [b"a", b"b", b"c"])
        assert len(inserted) == 3 and actor.stats()["size"] == 3
        denied = {
            "UPDATE_PRIORITIES": lambda: actor.update_priorities(inserted, np.full(3, 9.0)),
            "SAMPLE": lambda: actor.sample(2),
            "REMOVE_TO_FIT": actor.remove_to_fit,
            "ERASE": lambda: actor.erase(inserted),
        }
        for op, call in denied.items():
            with pytest.raises(ServerError) as info:
                call()
            assert info.value.status == P.Status.INVALID_ARGUMENT
            assert info.value.message == (
                f"permission denied: client 'actor:flood' (role 'actor') may not send {op}"
            ), info.value.message
        s = actor.stats()
        assert s["requests_refused_role"] == 4 and s["size"] == 3, s
    with ReplayClient(server.endpoint, timeout=30, curve=keys) as learner:
        assert learner.hello().max_request_bytes > 0
        more = learner.insert(np.ones(2), [b"d", b"e"])
        batch = learner.sample(4)
        assert len(batch) == 4 and set(batch.keys.tolist()) <= set(inserted.tolist()) | set(more.tolist())
        assert learner.update_priorities(inserted, np.full(3, 2.0)) == 3
        assert learner.remove_to_fit() == 0
        assert learner.erase(more) == 2
        s = learner.stats()
        assert s["requests_refused_role"] == 4 and s["size"] == 3 and s["errors_total"] == 4, s


# -------------------------------------------------------------- (e) a multipart message never finished


class RawZmtpPeer:
    """A DEALER spoken by hand over TCP (ZMTP 3.0, NULL mechanism): it can send frames with MORE set and never
    the last one, which no libzmq socket would put on the wire (libzmq sends a message once it is complete)."""

    def __init__(self, endpoint: str):
        host, port = endpoint.removeprefix("tcp://").rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=DEADLINE)
        self.sock.sendall(b"\xff" + b"\0" * 8 + b"\x7f" + bytes([3, 0]) + b"NULL".ljust(20, b"\0") + b"\0" * 32)
        self._read_exactly(64)  # the server's greeting
        ready = b"\x05READY" + b"\x0bSocket-Type" + struct.pack(">I", 6) + b"DEALER"
        self.sock.sendall(bytes([0x04, len(ready)]) + ready)
        (flags,) = self._read_exactly(1)
        size = struct.unpack(">Q", self._read_exactly(8))[0] if flags & 0x02 else self._read_exactly(1)[0]
        body = self._read_exactly(size)
        assert flags & 0x04 and body.startswith(b"\x05READY"), (flags, body[:16])

    def _read_exactly(self, n: int) -> bytes:
        out = b""
        while len(out) < n:
            chunk = self.sock.recv(n - len(out))
            assert chunk, "the server closed the connection"
            out += chunk
        return out

    def send_frame(self, data: bytes, more: bool) -> None:
        self.sock.sendall(bytes([0x02 | int(more)]) + struct.pack(">Q", len(data)) + data)

    def close(self) -> None:
        self.sock.close()


def test_an_unfinished_multipart_message_is_buffered_by_libzmq_and_freed_when_its_peer_leaves(start_server):
    """Every frame is under ZMQ_MAXMSGSIZE (1 MiB) and the last never comes: libzmq keeps the parts until the
    message is complete, out of the server's sight, so no server cap applies (docs/running.md, "Security", says
    how to contain it: CURVE keeps strangers out, a memory limit on the process bounds the rest). Shown here:
    the server keeps serving meanwhile, and the memory comes back once the peer leaves."""
    frames, frame = 48, 1 * MiB - 64
    server = start_server("--max-message-mb", "1")
    rss = Rss(server.pid)
    with ReplayClient(server.endpoint, timeout=30) as good:
        good.insert(np.ones(4), [b"x" * 1000] * 4)
        assert len(good.sample(4)) == 4
        baseline = rss.now()
        rss.reset_peak()
        peer = RawZmtpPeer(server.endpoint)
        try:
            peer.send_frame(P.Header(P.Op.INSERT, 1, count=1).pack(), more=True)
            for _ in range(frames):
                peer.send_frame(b"\xcd" * frame, more=True)
            # libzmq holds the parts: the RSS grows by about what was sent (no server counter sees it)
            held = wait_until(
                lambda: (lambda r: r if r >= baseline + frames * 3 // 4 else None)(rss.now()),
                DEADLINE,
                "the parts buffered in the server",
                interval=0.02,
            )
            s = good.stats()
            assert s["requests_insert"] == 1 and s["errors_total"] == 0, s  # the message never reached the loop
            assert len(good.sample(4)) == 4 and len(good.insert(np.ones(1), [b"y"])) == 1  # still serving
        finally:
            peer.close()
        peak = rss.peak()
        after = rss_back(rss, baseline)
        report("unfinished multipart", baseline=baseline, peak=peak, held=held, sent=frames, after=after)
        assert len(good.sample(4)) == 4 and good.stats()["size"] == 5
    assert server.alive()
