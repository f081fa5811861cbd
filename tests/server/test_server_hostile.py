"""Hostile-environment tests of apexrl-replay-server: fuzzing, oversized frames, kill -9, many clients.

Every test runs real ``python -m apexrl.cli.server --port 0`` processes on 127.0.0.1; every loop is bounded
both in iterations and in wall-clock time.
"""

from __future__ import annotations

import collections
import glob
import hashlib
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

from apexrl.errors import ProtocolError
from apexrl.replay.client.inserter import InsertTooLargeError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P
from tests.helpers import wait_until

MiB = 1 << 20


# ------------------------------------------------------------------------------------------- helpers


def peek_ids(frame: bytes) -> tuple[int, int]:
    """(op, request_id) the server should echo for a request whose frame 0 is ``frame``."""
    if len(frame) >= 16 and frame[:4] == P.MAGIC:
        _v, op, rid = struct.unpack_from("<HHQ", frame, 4)
        return op, rid
    return 0, 0


def raw_reply_header(frame: bytes) -> tuple[int, int, int, int]:
    """(op, request_id, status, count) of a reply header (op unvalidated: errors echo raw ops)."""
    magic, version, op, rid, status, flags, count, _param, _t = struct.unpack("<4sHHQHHIdI4x", frame)
    assert magic == P.MAGIC and version == P.PROTOCOL_VERSION and flags == 0, frame
    return op, rid, status, count


def checked_item(rng: random.Random, tag: bytes) -> bytes:
    """An item whose last 8 bytes are a BLAKE2b digest of the rest: corruption is detectable anywhere."""
    body = tag + b"|" + rng.randbytes(rng.randrange(0, 200))
    return body + hashlib.blake2b(body, digest_size=8).digest()


def item_ok(item: bytes) -> bool:
    return len(item) >= 8 and hashlib.blake2b(item[:-8], digest_size=8).digest() == item[-8:]


# --------------------------------------------------------------------------------------------- 1. fuzz


def _valid_request(rng: random.Random, rid: int, keys: list[int]) -> list[bytes]:
    kind = rng.randrange(5)
    if kind == 0:
        n = rng.randrange(0, 9)
        items = [rng.randbytes(rng.randrange(0, 64)) for _ in range(n)]
        data, offsets = P.pack_items(items)
        frames = P.encode_insert(rid, [rng.uniform(0.1, 10.0) for _ in range(n)], data, offsets)
    elif kind == 1:
        frames = P.encode_sample(rid, rng.randrange(1, 17), rng.uniform(0, 1))
    elif kind == 2:
        n = rng.randrange(0, 9)
        ks = [rng.choice(keys) if keys and rng.random() < 0.8 else rng.getrandbits(64) for _ in range(n)]
        frames = P.encode_update(rid, np.array(ks, dtype=np.uint64), [rng.uniform(0.1, 10.0) for _ in range(n)])
    elif kind == 3:
        frames = P.encode_remove_to_fit(rid)
    else:
        frames = P.encode_stats(rid)
    return [bytes(memoryview(f).cast("B")) if not isinstance(f, bytes) else f for f in frames]


def _flip(rng: random.Random, frame: bytes, lo: int = 0, hi: int | None = None) -> bytes:
    if not frame:
        return rng.randbytes(rng.randrange(1, 8))
    b = bytearray(frame)
    hi = len(b) if hi is None else min(hi, len(b))
    lo = min(lo, hi - 1)
    for _ in range(rng.randrange(1, 4)):
        i = rng.randrange(lo, hi)
        b[i] ^= rng.randrange(1, 256)
    return bytes(b)


def _mutate(rng: random.Random, frames: list[bytes]) -> list[bytes]:
    frames = list(frames)
    kind = rng.randrange(12)
    if kind == 0:  # byte flips in the header
        frames[0] = _flip(rng, frames[0])
    elif kind == 1:  # byte flips in a payload frame (or header if none)
        i = rng.randrange(1, len(frames)) if len(frames) > 1 else 0
        frames[i] = _flip(rng, frames[i])
    elif kind == 2:  # truncate a frame
        i = rng.randrange(len(frames))
        frames[i] = frames[i][: rng.randrange(0, len(frames[i]) + 1)]
    elif kind == 3 and len(frames) > 1:  # drop a frame
        del frames[rng.randrange(len(frames))]
    elif kind == 4:  # duplicate a frame
        i = rng.randrange(len(frames))
        frames.insert(rng.randrange(len(frames) + 1), frames[i])
    elif kind == 5 and len(frames) > 1:  # reorder frames
        rng.shuffle(frames)
        if rng.random() < 0.5:
            frames[0], frames[-1] = frames[-1], frames[0]
    elif kind == 6:  # oversized count
        h = bytearray(frames[0].ljust(P.HEADER_SIZE, b"\0"))
        struct.pack_into(
            "<I", h, 20, rng.choice([P.MAX_BATCH + 1, 0xFFFF_FFFF, rng.randrange(P.MAX_BATCH + 1, 1 << 32)])
        )
        frames[0] = bytes(h)
    elif kind == 7:  # count off by a little (mismatching the frame lengths)
        h = bytearray(frames[0].ljust(P.HEADER_SIZE, b"\0"))
        (c,) = struct.unpack_from("<I", h, 20)
        struct.pack_into("<I", h, 20, min(0xFFFF_FFFF, max(0, c + rng.choice([-2, -1, 1, 2, 1000]))))
        frames[0] = bytes(h)
    elif kind == 8:  # wrong version, sometimes with a longer header
        h = bytearray(frames[0].ljust(P.HEADER_SIZE, b"\0"))
        struct.pack_into("<H", h, 4, rng.choice([0, 2, 3, 0xFFFF, rng.randrange(2, 1 << 16)]))
        frames[0] = bytes(h) + (rng.randbytes(rng.randrange(1, 40)) if rng.random() < 0.5 else b"")
    elif kind == 9:  # flips in the reserved / flags / status / op fields
        frames[0] = _flip(rng, frames[0], rng.choice([6, 16, 18, 36]), rng.choice([8, 18, 20, 40]))
    elif kind == 10:  # extra random frames appended
        frames += [rng.randbytes(rng.randrange(0, 64)) for _ in range(rng.randrange(1, 4))]
    else:  # two mutations stacked
        frames = _mutate(rng, _mutate(rng, frames))
    return frames or [b""]


def _random_message(rng: random.Random) -> list[bytes]:
    kind = rng.randrange(4)
    if kind == 0:  # pure random frames
        return [rng.randbytes(rng.randrange(0, 80)) for _ in range(rng.randrange(1, 6))]
    if kind == 1:  # right magic, random rest
        return [P.MAGIC + rng.randbytes(36)] + [rng.randbytes(rng.randrange(0, 80)) for _ in range(rng.randrange(0, 5))]
    if kind == 2:  # right magic and version, random op / fields
        h = bytearray(P.MAGIC + rng.randbytes(36))
        struct.pack_into("<H", h, 4, 1)
        return [bytes(h)]
    return [b""] * rng.randrange(1, 4)


def _expected(frames: list[bytes]) -> tuple[int, int, int] | None:
    """(request_id, status, op) the server must answer, by the reference decoder; None: do not send."""
    try:
        req = P.decode_request(frames, 256 * MiB)
    except ProtocolError as exc:
        return (exc.request_id or 0, int(exc.status), exc.op or 0)
    if req.op == P.Op.SAMPLE and req.header.count > 64:
        return None  # a valid but expensive sample (a flipped count byte): not fuzz, leave it out
    if req.header.table != 0:  # a flipped table field: the server has one table (index 0), so no such table
        return (req.request_id, int(P.Status.INVALID_ARGUMENT), int(req.op))
    return (req.request_id, int(P.Status.OK), int(req.op))


def test_fuzz_ten_thousand_hostile_messages(start_server, raw_socket):
    server = start_server("--workers", "2")
    rng = random.Random(20240601)
    with ReplayClient(server.endpoint, timeout=10) as client:
        seed_items = [rng.randbytes(32) for _ in range(64)]
        keys = client.insert(np.ones(64), seed_items).tolist()
        all_keys = list(keys)
        stats0 = client.stats()
    sock = raw_socket(server.endpoint)

    total_target = 10_000
    window = 200
    sent = answered = 0
    counts = collections.Counter()
    n_errors = n_insert_items = 0
    rss: dict[str, int] = {}
    deadline = time.monotonic() + 60
    rid_seq = 1
    while sent < total_target:
        assert time.monotonic() < deadline, f"fuzz too slow: {sent} sent"
        expected: collections.Counter = collections.Counter()
        batch = 0
        while batch < window and sent + batch < total_target:
            r = rng.random()
            if r < 0.10:
                frames = _random_message(rng)
            elif r < 0.15:
                frames = _valid_request(rng, rid_seq, keys)  # some valid traffic mixed in
            else:
                frames = _mutate(rng, _valid_request(rng, rid_seq, keys))
            rid_seq += 1
            exp = _expected(frames)
            if exp is None:
                continue
            expected[exp[:2]] += 1
            counts["ok" if exp[1] == 0 else P.Status(exp[1]).name] += 1
            sock.send_multipart(frames)
            batch += 1
        # every message sent must be answered: exactly one reply each, (request_id, status) as expected
        got: collections.Counter = collections.Counter()
        t_end = time.monotonic() + 15
        for _ in range(batch):
            remaining = t_end - time.monotonic()
            assert remaining > 0 and sock.poll(int(remaining * 1000)), (
                f"only {sum(got.values())}/{batch} replies in window after {sent} messages; missing {expected - got}"
            )
            reply = sock.recv_multipart()
            op, rid, status, count = raw_reply_header(reply[0])
            got[(rid, status)] += 1
            if status != 0:
                n_errors += 1
                assert len(reply) == 2
                reply[1].decode("utf-8")  # error text is valid UTF-8
            elif op == P.Op.INSERT:
                n_insert_items += count
                new_keys = np.frombuffer(reply[1], dtype="<u8").tolist()
                all_keys.extend(new_keys)
                keys.extend(new_keys[:2])
            elif op == P.Op.SAMPLE:
                dec = P.decode_reply(reply, P.Op.SAMPLE, rid)
                assert dec.ok
        assert got == expected, f"replies differ: missing {expected - got}, unexpected {got - expected}"
        assert sock.poll(0) == 0, "more replies than requests"
        sent += batch
        answered += batch
        if "half" not in rss and sent >= total_target // 2:
            rss["half"] = server.rss_kib()
        if "warm" not in rss and sent >= total_target // 10:
            rss["warm"] = server.rss_kib()
    rss["end"] = server.rss_kib()

    assert server.alive()
    assert answered == sent >= total_target
    # a wide mix of outcomes was exercised
    for name in ("ok", "BAD_MESSAGE", "UNSUPPORTED_VERSION", "UNKNOWN_OP", "TOO_LARGE", "INVALID_ARGUMENT"):
        assert counts[name] > 0, counts

    with ReplayClient(server.endpoint, timeout=10) as client:
        item = bytes(range(256)) * 3 + b"\0\xff exact"
        # fuzzed inserts may carry any finite priority: zero every other item so only ours can be sampled
        assert client.update_priorities(all_keys, np.zeros(len(all_keys))) == len(all_keys)
        k = client.insert([1.0], [item])
        batch = client.sample(4, 0.4)
        assert batch.keys.tolist() == k.tolist() * 4
        assert all(bytes(it) == item for it in batch.items)
        stats1 = client.stats()
    # exact accounting of errors and requests (+1 update, +1 hello and +1 insert, +1 sample, +1 stats after stats0)
    assert stats1["errors_total"] - stats0["errors_total"] == n_errors, (stats0, stats1)
    assert stats1["requests_total"] - stats0["requests_total"] == sent + 5
    assert stats1["size"] - stats0["size"] == n_insert_items + 1
    assert stats1["size"] == len(all_keys) + 1
    assert stats1["errors_total"] >= 0.5 * total_target
    # memory does not grow with the number of hostile messages
    assert rss["end"] <= rss["half"] + 8 * 1024, rss
    log = server.log()
    assert "Traceback" not in log and " ERROR " not in log, log


# --------------------------------------------------------------------------------- 2. over the size cap


def test_frames_over_the_size_cap_neither_crash_nor_inflate_the_server(start_server, raw_socket):
    server = start_server("--max-message-mb", "1")
    stop = threading.Event()
    hold = threading.Event()  # set: the good client parks between requests (so the RSS reads see no growth of it)
    parked = threading.Event()
    errors: list[BaseException] = []
    served = [0]

    def good_client() -> None:
        r = random.Random(1)
        try:
            with ReplayClient(server.endpoint, timeout=10) as c:
                by_key: dict[int, bytes] = {}
                t_end = time.monotonic() + 60
                while not stop.is_set() and time.monotonic() < t_end:
                    if hold.is_set():
                        parked.set()
                        stop.wait(0.01)
                        continue
                    parked.clear()
                    if served[0] < 50:  # then only samples: the store stops growing, so RSS reads compare
                        items = [checked_item(r, b"good") for _ in range(4)]
                        by_key.update(zip(c.insert(np.ones(4), items).tolist(), items))
                    b = c.sample(8, 0.4)
                    for key, it in zip(b.keys.tolist(), b.items):
                        assert bytes(it) == by_key[key]
                    served[0] += 1
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)
        finally:
            parked.set()

    def quiet_rss() -> tuple[int, int]:
        """(RSS KiB, KiB the server says it holds: store reservations and remembered insert ids) with the good
        client parked, so the difference of two reads is what the hog frames cost, not the good client's data."""
        hold.set()
        assert parked.wait(30), "the good client did not park"
        with ReplayClient(server.endpoint, timeout=10) as probe:
            st = probe.stats()
        rss = server.rss_kib()
        hold.clear()
        return rss, (st["bytes_reserved"] + st["insert_ids_bytes"]) // 1024

    t = threading.Thread(target=good_client, daemon=True)
    t.start()
    wait_until(lambda: served[0] >= 50, 30, "the good client to be served", interval=0.5)
    hog_frame = b"\xab" * (2 * MiB)

    def hogs(first_id: int) -> None:
        for i in range(20):  # each from a fresh socket: libzmq disconnects the offender
            hog = raw_socket(server.endpoint)
            hdr = P.Header(P.Op.INSERT, first_id + i, count=1).pack()
            hog.send_multipart([hdr, np.ones(1).tobytes(), np.array([0, len(hog_frame)], "<u8").tobytes(), hog_frame])
            assert hog.poll(100) == 0, "an over-cap frame must not be answered (the peer is disconnected)"
            hog.close(linger=0)
        during = served[0]
        wait_until(lambda: served[0] > during, 30, "the good client to be served after the hogs", interval=0.5)

    hogs(1000)  # the first round warms up what any connection costs once (libzmq's buffers, thread arenas)
    rss0, held0 = quiet_rss()
    hogs(2000)
    rss1, held1 = quiet_rss()
    assert server.alive()
    # 20 frames of 2 MiB were refused: they must not stay in the server. Allowance: what it now holds for the
    # good client, plus allocator noise.
    assert rss1 - rss0 <= (held1 - held0) + 4 * 1024, (rss0, rss1, held0, held1)

    # every frame under the cap, the total over it: a TOO_LARGE reply
    sock = raw_socket(server.endpoint)
    half = b"\0" * (600 * 1024)
    sock.send_multipart([P.Header(P.Op.UPDATE_PRIORITIES, 5, count=len(half) // 8).pack(), half, half])
    assert sock.poll(5000)
    op, rid, status, _ = raw_reply_header(sock.recv_multipart()[0])
    assert (op, rid, status) == (P.Op.UPDATE_PRIORITIES, 5, P.Status.TOO_LARGE)

    # a ReplayClient refuses an over-cap insert before sending it (it knows the cap from HELLO), and goes on
    with ReplayClient(server.endpoint, timeout=1.0) as c:
        with pytest.raises(InsertTooLargeError, match=r"2097\d+ bytes, over the server's limit of 1048576 bytes"):
            c.insert([1.0], [hog_frame])
        assert c.stats()["size"] > 0

    before = served[0]
    time.sleep(0.5)
    stop.set()
    t.join(15)
    assert not t.is_alive() and not errors, errors
    assert served[0] > before > 0, "the good client kept being served"
    assert server.alive()


# ------------------------------------------------------------------------------------- 3. kill -9


def _snapshot_identity(path: str) -> tuple[int, int] | None:
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns)


def _wait_two_new_snapshots(path: str, timeout: float = 10.0) -> None:
    """Wait until the snapshot file was replaced twice: one save *started* after this call."""
    seen = _snapshot_identity(path)
    changes = 0
    t_end = time.monotonic() + timeout
    while changes < 2:
        assert time.monotonic() < t_end, "no periodic snapshot written"
        time.sleep(0.01)
        now = _snapshot_identity(path)
        if now is not None and now != seen:
            seen = now
            changes += 1


def _temp_files(path: str) -> list[str]:
    # PATH.epoch is the server's key-epoch record (docs/protocol.md, "Keys"), not a temporary.
    return sorted(p for p in glob.glob(path + "*") if p not in (path, path + ".epoch"))


def test_kill9_after_snapshot_keeps_the_first_set(start_server, tmp_path):
    snap = str(tmp_path / "store.snap")
    rng = random.Random(7)
    server = start_server("--snapshot", snap, "--snapshot-every", "0.3")
    with ReplayClient(server.endpoint, timeout=10) as c:
        first = [checked_item(rng, b"first") for _ in range(300)]
        first_keys = c.insert(np.ones(300), first).tolist()
        _wait_two_new_snapshots(snap)
        second = [checked_item(rng, b"second") for _ in range(300)]
        second_keys = c.insert(np.ones(300), second).tolist()
    server.kill9()
    assert len(_temp_files(snap)) <= 1

    by_key = dict(zip(first_keys, first)) | dict(zip(second_keys, second))
    server = start_server("--snapshot", snap)
    with ReplayClient(server.endpoint, timeout=10) as c:
        size = c.stats()["size"]
        assert 300 <= size <= 600
        # every key of the first set is still there
        assert c.update_priorities(first_keys, np.ones(300)) == 300
        seen = set()
        for _ in range(20):
            b = c.sample(256, 0.4)
            for key, item in zip(b.keys.tolist(), b.items):
                assert bytes(item) == by_key[key]  # same keys sample the same bytes
                seen.add(key)
        assert seen & set(first_keys)
        # new keys do not collide with restored ones
        new = c.insert([1.0], [b"after"]).tolist()
        assert new[0] not in first_keys
    server.terminate()


_INSERTER = textwrap.dedent(
    """
    import hashlib, random, sys, time
    import numpy as np
    from apexrl.replay.client.replay_client import ReplayClient
    r = random.Random(int(sys.argv[2]))
    with ReplayClient(sys.argv[1], timeout=2) as c:
        t_end = time.monotonic() + 20
        while time.monotonic() < t_end:
            items = []
            for _ in range(200):
                body = b"kill|" + r.randbytes(r.randrange(100, 1000))
                items.append(body + hashlib.blake2b(body, digest_size=8).digest())
            try:
                c.insert(np.ones(len(items)), items)
            except Exception:
                break
    """
)


def test_repeated_kill9_during_inserts_never_corrupts_the_snapshot(start_server, tmp_path):
    snap = str(tmp_path / "busy.snap")
    rng = random.Random(11)
    sizes: list[int] = []
    stale: list[list[str]] = []
    t_end = time.monotonic() + 40
    for round_ in range(10):
        assert time.monotonic() < t_end, f"too slow at round {round_}"
        server = start_server("--snapshot", snap, "--snapshot-every", "0.02")  # loads cleanly (no SnapshotError)
        with ReplayClient(server.endpoint, timeout=10) as c:
            size = c.stats()["size"]
            if size:
                b = c.sample(min(256, size), 0.4)
                bad = [k for k, it in zip(b.keys.tolist(), b.items) if not item_ok(bytes(it))]
                assert not bad, f"corrupt items after restart {round_}: {bad[:5]}"
        sizes.append(size)
        writer = subprocess.Popen([sys.executable, "-c", _INSERTER, server.endpoint, str(round_)])
        try:
            time.sleep(rng.uniform(0.3, 0.9))
            server.kill9()
        finally:
            if writer.poll() is None:
                writer.kill()  # its pending insert would only time out
            writer.wait(30)
        stale.append([f"{os.path.basename(f)} ({os.path.getsize(f)} B)" for f in _temp_files(snap)])
    server = start_server("--snapshot", snap)
    with ReplayClient(server.endpoint, timeout=10) as c:
        sizes.append(c.stats()["size"])
    server.terminate()
    assert sizes == sorted(sizes), f"a restart lost snapshotted items: {sizes}"
    assert sizes[-1] > 0
    assert all(len(s) <= 1 for s in stale), (
        f"stale snapshot temp files accumulate across kill -9 restarts (one per dead pid); "
        f"after each kill: {[len(s) for s in stale]}; finally: {stale[-1]}"
    )


# ------------------------------------------------------------------------------------- 4. many clients


_MIXED = textwrap.dedent(
    """
    import hashlib, json, random, sys, time
    import numpy as np
    from apexrl.replay.client.replay_client import ReplayClient

    def run(endpoint, seed, seconds):
        r = random.Random(seed)
        out = {"inserted": 0, "insert_calls": 0, "calls": 0, "requests": 0, "errors": []}
        with ReplayClient(endpoint, timeout=15) as c:
            t_end = time.monotonic() + seconds
            while time.monotonic() < t_end and out["calls"] < 100000:
                op = r.randrange(10)
                try:
                    if op < 4:
                        n = r.randrange(1, 20)
                        items = []
                        for _ in range(n):
                            body = b"mix|" + r.randbytes(r.randrange(0, 300))
                            items.append(body + hashlib.blake2b(body, digest_size=8).digest())
                        out["requests"] += 1
                        keys = c.insert([r.uniform(0.1, 5) for _ in range(n)], items)
                        assert len(keys) == n
                        out["inserted"] += n
                        out["insert_calls"] += 1
                    elif op < 7:
                        out["requests"] += 1
                        b = c.sample(r.randrange(1, 33), 0.4)
                        for it in b.items:
                            it = bytes(it)
                            assert hashlib.blake2b(it[:-8], digest_size=8).digest() == it[-8:], "corrupt"
                        if r.random() < 0.5:
                            out["requests"] += 1
                            c.update_priorities(b.keys, [r.uniform(0.1, 5) for _ in range(len(b))])
                    elif op < 9:
                        out["requests"] += 1
                        s = c.stats()
                        assert s["size"] > 0
                    else:
                        out["requests"] += 1
                        assert c.remove_to_fit() == 0
                except Exception as exc:
                    out["errors"].append(f"{type(exc).__name__}: {exc}")
                out["calls"] += 1
        return out

    if __name__ == "__main__":
        print(json.dumps(run(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))), flush=True)
    """
)


def test_many_clients_threads_and_processes_exact_accounting(start_server):
    server = start_server("--workers", "4", "--capacity", "10000000")
    seconds = 4.0
    ns: dict = {}
    exec(compile(_MIXED, "<mixed>", "exec"), ns)  # noqa: S102 - our own constant source
    run = ns["run"]
    with ReplayClient(server.endpoint, timeout=10) as c:
        body = b"mix|seed"
        c.insert([1.0], [body + hashlib.blake2b(body, digest_size=8).digest()])
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _MIXED, server.endpoint, str(100 + i), str(seconds)], stdout=subprocess.PIPE
        )
        for i in range(2)
    ]
    results: list[dict] = []
    lock = threading.Lock()

    def thread_main(i: int) -> None:
        try:
            res = run(server.endpoint, i, seconds)
        except BaseException as exc:  # noqa: BLE001
            res = {"inserted": 0, "insert_calls": 0, "calls": 0, "requests": 0, "errors": [repr(exc)]}
        with lock:
            results.append(res)

    threads = [threading.Thread(target=thread_main, args=(i,), daemon=True) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + 30)
        assert not t.is_alive()
    for p in procs:
        out, _ = p.communicate(timeout=seconds + 30)
        assert p.returncode == 0
        results.append(json.loads(out.decode().strip().splitlines()[-1]))
    assert len(results) == 10
    errs = [e for r in results for e in r["errors"]]
    assert not errs, errs[:10]
    assert all(r["calls"] > 0 for r in results)
    inserted = 1 + sum(r["inserted"] for r in results)
    insert_calls = 1 + sum(r["insert_calls"] for r in results)
    with ReplayClient(server.endpoint, timeout=10) as c:
        stats = c.stats()
    assert stats["size"] == inserted and stats["inserted"] == inserted, (stats, inserted)
    assert stats["requests_insert"] == insert_calls
    assert stats["errors_total"] == 0
    # + one HELLO per inserting client (it learns the server's limits before its first insert)
    assert stats["requests_hello"] <= len(results) + 1
    assert stats["requests_total"] == 1 + sum(r["requests"] for r in results) + 1 + stats["requests_hello"]
    assert server.alive()


def test_out_of_descriptors_is_said_plainly_and_the_server_recovers(tmp_path):
    """At its descriptor limit the server cannot accept connections (libzmq then retries accept() at full
    speed): it logs a WARNING saying so and what to do, keeps serving its existing client, and accepts again
    once descriptors are free."""
    import resource
    import socket

    log_path = tmp_path / "server.log"

    def few_descriptors() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (48, 48))

    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "apexrl.cli.server", "--port", "0", "--handshake-timeout", "1"],
            stdout=subprocess.PIPE,
            stderr=log,
            preexec_fn=few_descriptors,
        )
    try:
        endpoint = proc.stdout.readline().decode().strip().rsplit(" ", 1)[1]
        port = int(endpoint.rsplit(":", 1)[1])
        with ReplayClient(endpoint, timeout=20) as good:
            good.insert(np.ones(2), [b"a", b"b"])
            raw = []
            try:
                for _ in range(80):  # more TCP connections than descriptors
                    s = socket.create_connection(("127.0.0.1", port), timeout=5)
                    raw.append(s)
                wait_until(
                    lambda: "cannot accept new connections" in log_path.read_text(),
                    60,
                    "the descriptor warning",
                    interval=0.5,
                )
                assert good.stats()["size"] == 2  # the connected client is still served
            finally:
                for s in raw:
                    s.close()
        with ReplayClient(endpoint, timeout=30) as fresh:  # descriptors free again: a new client is accepted
            assert fresh.stats()["size"] == 2
        text = log_path.read_text()
        assert "Too many open files" in text and "ulimit -Hn" in text, text
    finally:
        proc.terminate()
        assert proc.wait(30) == 0
        proc.stdout.close()
