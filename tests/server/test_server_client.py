"""End-to-end tests of apexrl-replay-server and ReplayClient with real server processes."""

from __future__ import annotations

import json
import os
import random
import struct
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest
import zmq

from apexrl.errors import ReplayTimeout, ServerError, ServerShuttingDownError, ServerTimeoutError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from tests.helpers import wait_until


def recv(sock: zmq.Socket, timeout: float = 5.0) -> list[bytes] | None:
    if not sock.poll(int(timeout * 1000)):
        return None
    return sock.recv_multipart()


def raw_header(frame: bytes) -> P.Header:
    """Unpack a reply header without validating op (error replies echo op 0 when it was unreadable)."""
    magic, version, op, rid, status, flags, count, param, timeout_ms = struct.unpack("<4sHHQHHIdI4x", frame)
    assert magic == P.MAGIC and version == P.PROTOCOL_VERSION and flags == 0
    return P.Header(op, rid, P.Status(status), count, param, timeout_ms, version)


def error_reply(frames: list[bytes]) -> tuple[P.Header, str]:
    header = raw_header(frames[0])
    assert header.status != P.Status.OK, frames
    assert len(frames) == 2
    return header, frames[1].decode()


def items_for(tag: str, n: int) -> list[bytes]:
    return [f"{tag}-{i}-".encode() + bytes([i % 251]) * (i % 37) for i in range(n)]


def check_batch(batch, by_key: dict[int, bytes]) -> None:
    assert len(batch) == len(batch.items)
    for key, item in zip(batch.keys.tolist(), batch.items):
        assert bytes(item) == by_key[key]


# ------------------------------------------------------------------------------------------------ round trip


def test_round_trip_of_every_request(start_server):
    server = start_server("--capacity", "50", "--shards", "4")
    with ReplayClient(server.endpoint, timeout=5) as client:
        items = items_for("a", 80)
        prios = np.linspace(0.1, 3.0, 80)
        keys = client.insert(prios, items)
        assert keys.dtype == np.uint64 and keys.shape == (80,) and len(set(keys.tolist())) == 80
        by_key = dict(zip(keys.tolist(), items))
        # data/offsets form, including empty items
        data, offsets = P.pack_items([b"", b"xyz", b""])
        keys2 = client.insert([1.0, 1.0, 1.0], data=data, offsets=offsets)
        by_key.update(zip(keys2.tolist(), [b"", b"xyz", b""]))
        assert client.insert([], []).shape == (0,)

        batch = client.sample(256, beta=0.4)
        assert len(batch) == 256
        assert batch.weights.dtype == np.float32 and batch.probabilities.dtype == np.float64
        assert np.all(batch.weights > 0) and np.all(batch.weights <= 1) and np.all(batch.probabilities > 0)
        check_batch(batch, by_key)

        assert client.update_priorities(keys[:10], np.full(10, 5.0)) == 10
        stats = client.stats()
        assert stats["size"] == 83 and stats["inserted"] == 83 and stats["updated"] == 10
        removed = client.remove_to_fit()
        assert removed == 33  # FIFO down to capacity 50
        remaining = client.stats()
        assert remaining["size"] == 50 and remaining["evicted"] == 33
        # the 33 oldest are gone (FIFO): updating them counts 0 (stale), the rest still update
        assert client.update_priorities(keys[:33], np.ones(33)) == 0
        assert client.update_priorities(keys[33:], np.ones(47)) == 47
        check_batch(client.sample(100), by_key)
        s = client.stats()
        for name in ("insert", "sample", "update_priorities", "remove_to_fit", "stats"):
            assert s[f"requests_{name}"] >= 1 and s[f"errors_{name}"] == 0
        assert s["requests_insert"] == 3 and s["requests_stats"] == 3 and s["min_size_to_sample"] == 1
    assert server.terminate() == 0


def test_store_errors_surface_as_server_error_with_message(start_server):
    server = start_server("--alpha", "3")
    with ReplayClient(server.endpoint, timeout=5) as client:
        keys = client.insert([1.0], [b"x"])
        with pytest.raises(ServerError, match="above the limit MAX_MASS") as info:
            client.update_priorities(keys, [1e300])
        assert info.value.status == P.Status.INVALID_ARGUMENT
        assert "priorities[0]" in info.value.message
        with pytest.raises(ServerError, match="MAX_MASS"):
            client.insert([1e300], [b"y"])
        # caller mistakes are caught before the wire
        with pytest.raises(ValueError, match="priorities"):
            client.insert([float("nan")], [b"z"])
        with pytest.raises(ValueError):
            client.sample(0)
        # the server is fine afterwards
        assert client.stats()["size"] == 1
        assert client.stats()["errors_update_priorities"] == 1


# --------------------------------------------------------------------------------------------- bad messages


def _valid_requests(rid: int) -> list[list[bytes]]:
    data, offsets = P.pack_items([b"abc", b"", b"defgh"])
    msgs = [
        P.encode_insert(rid, [1.0, 2.0, 3.0], data, offsets),
        P.encode_sample(rid, 4, 0.4),
        P.encode_update(rid, np.array([1, 2], dtype=np.uint64), [1.0, 2.0]),
        P.encode_remove_to_fit(rid),
        P.encode_stats(rid),
    ]
    return [[bytes(memoryview(f).cast("B")) for f in m] for m in msgs]


def test_malformed_messages_get_error_replies_and_server_keeps_serving(start_server, raw_socket):
    server = start_server("--max-message-mb", "1")
    with ReplayClient(server.endpoint, timeout=5) as client:
        items = items_for("m", 40)
        keys = client.insert(np.ones(40), items)
        by_key = dict(zip(keys.tolist(), items))
    sock = raw_socket(server.endpoint)
    header = P.Header(P.Op.STATS, 77).pack()

    def expect(frames, status, rid=None, match=None):
        sock.send_multipart(frames)
        reply = recv(sock)
        assert reply is not None, f"no reply to {frames!r}"
        h, msg = error_reply(reply)
        assert h.status == status, msg
        if rid is not None:
            assert h.request_id == rid
        if match is not None:
            assert match in msg, msg

    expect([b""], P.Status.BAD_MESSAGE)
    expect([b"APX"], P.Status.BAD_MESSAGE, 0)
    expect([b"XXXX" + header[4:]], P.Status.BAD_MESSAGE)
    expect([header[:20]], P.Status.BAD_MESSAGE, 77, "expected 40")
    expect([header + b"\0"], P.Status.BAD_MESSAGE, 77)
    v7 = bytearray(header)
    v7[4:6] = struct.pack("<H", 7)
    expect([bytes(v7) + b"more"], P.Status.UNSUPPORTED_VERSION, 77, "protocol version 7 is not supported")
    v5 = bytearray(header)  # a client of the protocol before chunk keys is told both versions
    v5[4:6] = struct.pack("<H", 5)
    expect([bytes(v5)], P.Status.UNSUPPORTED_VERSION, 77, "protocol version 5 is not supported; supported versions: 6")
    expect([P.Header(99, 78).pack()], P.Status.UNKNOWN_OP, 78)
    expect([header, b"extra"], P.Status.BAD_MESSAGE, 77, "frames")
    ins = _valid_requests(79)[0]
    expect(ins[:3], P.Status.BAD_MESSAGE, 79)  # truncated: data frame missing
    expect([ins[0], ins[1][:-1], *ins[2:]], P.Status.BAD_MESSAGE, 79, "priorities")
    expect([ins[0], ins[1], ins[2], ins[3] + b"!", *ins[4:]], P.Status.BAD_MESSAGE, 79, "offsets")
    nan = np.array([1.0, float("nan"), 1.0]).tobytes()
    expect([ins[0], nan, *ins[2:]], P.Status.INVALID_ARGUMENT, 79, "priorities")
    big_count = bytearray(P.Header(P.Op.SAMPLE, 80, count=P.MAX_BATCH + 1, param=0.4).pack())
    expect([bytes(big_count)], P.Status.TOO_LARGE, 80)
    # total over --max-message-mb 1 with every frame under it: TOO_LARGE reply
    half = b"\0" * (600 * 1024)
    n = len(half) // 8
    expect([P.Header(P.Op.UPDATE_PRIORITIES, 81, count=n).pack(), half, half], P.Status.TOO_LARGE, 81, "max_bytes")
    # one frame over ZMQ_MAXMSGSIZE: libzmq disconnects that peer, nothing is answered, no crash
    hog = raw_socket(server.endpoint)
    hog.send_multipart([P.Header(P.Op.INSERT, 82, count=1).pack(), b"\0" * 8, b"\0" * 16, b"\0" * (2 << 20)])
    assert recv(hog, timeout=0.5) is None
    expect([b"still"], P.Status.BAD_MESSAGE)

    # ~2000 random mutations of valid requests, pipelined in chunks: exactly one reply each
    rng = random.Random(1234)
    sent = 0
    for _chunk in range(20):
        batch = []
        for _ in range(100):
            rid = rng.randrange(1, 1 << 40)
            frames = [bytearray(f) for f in rng.choice(_valid_requests(rid))]
            kind = rng.random()
            if kind < 0.5:  # flip bytes in the header (keep the magic half of the time)
                for _ in range(rng.randint(1, 4)):
                    i = rng.randrange(4 if rng.random() < 0.5 else 0, len(frames[0]))
                    frames[0][i] = rng.randrange(256)
            elif kind < 0.65:
                frames.pop(rng.randrange(len(frames)))
            elif kind < 0.75:
                frames.insert(rng.randrange(len(frames) + 1), bytearray(rng.randbytes(rng.randrange(0, 64))))
            elif kind < 0.9:
                f = rng.randrange(len(frames))
                frames[f] = frames[f][: rng.randrange(len(frames[f]) + 1)]
            else:
                f = rng.randrange(len(frames))
                if frames[f]:
                    frames[f][rng.randrange(len(frames[f]))] ^= 1 << rng.randrange(8)
            if not frames:
                frames = [bytearray()]
            batch.append([bytes(f) for f in frames])
        for frames in batch:
            sock.send_multipart(frames)
        for _ in batch:
            reply = recv(sock, timeout=10)
            assert reply is not None, "server stopped answering mutated messages"
            raw_header(reply[0])  # every reply is a well-formed header
            sent += 1
    assert sent == 2000
    assert server.proc.poll() is None
    with ReplayClient(server.endpoint, timeout=5) as client:
        batch = client.sample(500)
        known = [k in by_key for k in batch.keys.tolist()]
        assert any(known)
        for key, item in zip(batch.keys.tolist(), batch.items):
            if key in by_key:
                assert bytes(item) == by_key[key]
        stats = client.stats()
        assert stats["errors_total"] >= 500 and stats["requests_total"] >= 2000
    assert server.terminate() == 0


# ---------------------------------------------------------------------------------- min size and timeouts


def test_min_size_to_sample_times_out_then_succeeds(start_server):
    server = start_server("--min-size-to-sample", "5", "--workers", "2")
    with ReplayClient(server.endpoint, timeout=5) as client:
        t0 = time.monotonic()
        with pytest.raises(ReplayTimeout, match="min_size_to_sample=5") as info:
            client.sample(4, timeout=None)
        assert isinstance(info.value, ServerTimeoutError) and time.monotonic() - t0 < 4  # not the client's 5 s
        t0 = time.monotonic()
        with pytest.raises(ServerTimeoutError):
            client.sample(4, timeout=0.3)
        assert 0.28 <= time.monotonic() - t0 < 3

        # more waiting samplers than workers: inserts still go through at once
        results: list[object] = []

        def sampler():
            with ReplayClient(server.endpoint, timeout=10) as c:
                try:
                    results.append(len(c.sample(8, timeout=8)))
                except Exception as exc:  # noqa: BLE001
                    results.append(exc)

        threads = [threading.Thread(target=sampler) for _ in range(4)]
        for t in threads:
            t.start()
        wait_until(lambda: client.stats()["deferred"] == 4, 10, "the 4 samplers waiting in the server")
        t0 = time.monotonic()
        client.insert(np.ones(4), items_for("x", 4))
        assert client.stats()["size"] == 4
        client.insert(np.ones(1), [b"fifth"])
        assert time.monotonic() - t0 < 6  # not held until the samplers' 8 s timeouts
        for t in threads:
            t.join(15)
        assert results == [8, 8, 8, 8]
        assert len(client.sample(3)) == 3


def test_client_times_out_and_reconnects_after_server_restart(start_server):
    server = start_server()
    port = server.port
    with ReplayClient(server.endpoint, timeout=1.0) as client:
        client.insert([1.0], [b"before"])
        assert client.stats()["size"] == 1
        server.kill()
        t0 = time.monotonic()
        with pytest.raises(ReplayTimeout):
            client.stats()
        assert time.monotonic() - t0 < 3
        with pytest.raises(ReplayTimeout):
            client.insert([1.0], [b"lost"])
        restarted = start_server(port=port)
        assert restarted.port == port
        deadline = time.monotonic() + 10
        while True:  # the first call may race the new server's bind
            try:
                stats = client.stats()
                break
            except ReplayTimeout:
                assert time.monotonic() < deadline
        assert stats["size"] == 0
        keys = client.insert([1.0], [b"after"])
        batch = client.sample(2)
        assert batch.keys.tolist() == [keys[0]] * 2 and [bytes(i) for i in batch.items] == [b"after"] * 2
    assert restarted.terminate() == 0


# --------------------------------------------------------------------------------------------- snapshots


def test_sigterm_writes_snapshot_and_restart_restores_it(start_server, tmp_path):
    snap = str(tmp_path / "replay.snap")
    server = start_server("--snapshot", snap, "--seed", "7")
    items = items_for("s", 300)
    with ReplayClient(server.endpoint, timeout=5) as client:
        keys = client.insert(np.linspace(0.5, 2.0, 300), items)
        client.update_priorities(keys[:50], np.full(50, 9.0))
        before = client.stats()
    assert server.terminate() == 0
    assert os.path.exists(snap)
    by_key = dict(zip(keys.tolist(), items))

    restarted = start_server("--snapshot", snap)
    with ReplayClient(restarted.endpoint, timeout=5) as client:
        after = client.stats()
        for name in ("size", "bytes_held", "inserted", "updated"):
            assert after[name] == before[name], name
        assert after["total_priority"] == pytest.approx(before["total_priority"])
        for _ in range(5):
            check_batch(client.sample(256), by_key)
        assert client.update_priorities(keys, np.ones(300)) == 300
    assert restarted.terminate() == 0


def test_periodic_snapshot_and_corrupt_snapshot_is_a_startup_error(start_server, tmp_path):
    snap = str(tmp_path / "periodic.snap")
    server = start_server("--snapshot", snap, "--snapshot-every", "0.2")
    with ReplayClient(server.endpoint, timeout=5) as client:
        client.insert([1.0, 2.0], [b"p", b"q"])
    deadline = time.monotonic() + 10
    while not os.path.exists(snap):
        assert time.monotonic() < deadline, "no periodic snapshot written"
        time.sleep(0.05)
    server.kill()  # no graceful stop: the periodic snapshot must be loadable on its own
    time.sleep(0.3)

    with open(snap, "r+b") as f:
        f.seek(os.path.getsize(snap) // 2)
        f.write(b"\xff\xfe\xfd\xfc")
    proc = subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", "--port", "0", "--snapshot", snap],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode == 1
    assert "cannot load snapshot" in proc.stderr and snap in proc.stderr
    assert "listening" not in proc.stdout


# -------------------------------------------------------------------------------------------- concurrency

_INSERTER = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    from apexrl.replay.client.replay_client import ReplayClient
    endpoint, tag, batches, size = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    out = {}
    with ReplayClient(endpoint, timeout=10) as c:
        for b in range(batches):
            items = [f"{tag}:{b}:{i}".encode() * (1 + i % 3) for i in range(size)]
            keys = c.insert(np.full(size, 1.0 + b % 5), items)
            out.update({str(k): it.decode() for k, it in zip(keys.tolist(), items)})
    print(json.dumps(out))
    """
)


def test_concurrent_inserting_processes_and_sampler_exact_accounting(start_server):
    server = start_server("--workers", "3", "--shards", "4")
    n_procs, batches, size = 3, 40, 25
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _INSERTER, server.endpoint, f"p{p}", str(batches), str(size)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in range(n_procs)
    ]
    sampled: list[tuple[int, bytes]] = []
    stop = threading.Event()
    errors: list[BaseException] = []

    def sampler():
        with ReplayClient(server.endpoint, timeout=10) as c:
            try:
                while not stop.is_set():
                    b = c.sample(64, timeout=5)
                    sampled.extend(zip(b.keys.tolist(), (bytes(i) for i in b.items)))
            except BaseException as exc:  # noqa: BLE001
                errors.append(exc)

    t = threading.Thread(target=sampler)
    t.start()
    by_key: dict[int, bytes] = {}
    try:
        for proc in procs:
            out, err = proc.communicate(timeout=60)
            assert proc.returncode == 0, err
            by_key.update({int(k): v.encode() for k, v in json.loads(out).items()})
    finally:
        stop.set()
        t.join(20)
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    assert not errors, errors
    total = n_procs * batches * size
    assert len(by_key) == total  # keys are unique across processes
    with ReplayClient(server.endpoint, timeout=5) as client:
        stats = client.stats()
    assert stats["inserted"] == total and stats["size"] == total
    assert stats["requests_insert"] == n_procs * batches and stats["errors_total"] == 0
    assert len(sampled) > 0
    for key, item in sampled:
        assert by_key[key] == item
    assert server.terminate() == 0


def test_sigterm_answers_waiting_samplers_shutting_down_and_exits_0(start_server, tmp_path):
    snap = str(tmp_path / "s.snap")
    server = start_server("--min-size-to-sample", "10", "--snapshot", snap)
    results: list[object] = []

    def sampler():
        with ReplayClient(server.endpoint, timeout=10) as c:
            try:
                results.append(c.sample(4, timeout=30))
            except Exception as exc:  # noqa: BLE001
                results.append(exc)

    with ReplayClient(server.endpoint, timeout=5) as client:
        client.insert([1.0], [b"only"])
        threads = [threading.Thread(target=sampler) for _ in range(3)]
        for t in threads:
            t.start()
        time.sleep(0.3)
        t0 = time.monotonic()
        assert server.terminate() == 0
        for t in threads:
            t.join(10)
        assert time.monotonic() - t0 < 5
    assert len(results) == 3
    for r in results:
        assert isinstance(r, ServerShuttingDownError) and isinstance(r, ServerError), r
        assert isinstance(r, ConnectionError) and "shutting down" in r.message
    assert os.path.exists(snap)


# ---------------------------------------------------------------------------------------------------- CLI


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "apexrl.cli.server", *args], capture_output=True, text=True, timeout=30
    )


def test_cli_help_and_bad_flags():
    helped = _cli("--help")
    assert helped.returncode == 0
    for flag in ("--port", "--endpoint", "--capacity", "--min-size-to-sample", "--snapshot-every", "--workers"):
        assert flag in helped.stdout
    cases = {
        ("--port", "70000"): "out of range",
        ("--port", "-1"): "out of range",
        ("--port", "0", "--capacity", "0"): "must be an int in [1, 9223372036854775807]",
        ("--port", "0", "--eviction", "lru"): "invalid choice",
        ("--port", "0", "--alpha", "nan"): "finite",
        ("--port", "0", "--snapshot-every", "5"): "needs --snapshot",
        ("--port", "0", "--max-message-mb", "0"): "must be a finite number > 0",
        ("--endpoint", "udp://x:1"): "tcp://HOST:PORT",
        (
            "--capacity",
            "10",
        ): "--port is required",
    }
    for args, reason in cases.items():
        res = _cli(*args)
        assert res.returncode == 2, (args, res.stderr)
        assert reason in res.stderr, (args, res.stderr)
