"""ReplayClient.inserter(): pipelined inserts for actors, against real server processes. Also the server's
split between inline requests and worker requests (--inline-sample-max)."""

from __future__ import annotations

import os
import signal
import time

import numpy as np
import pytest
import zmq

from apexrl.errors import ReplayTimeout, ServerClosedError, ServerTimeoutError
from apexrl.replay.client.inserter import PipelinedInserter
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.wire import protocol as P


def batch(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() for i in range(n)]


def test_pipelined_inserts_are_all_acknowledged_and_stored(start_server):
    server = start_server()
    acks: list[tuple[np.ndarray, float]] = []
    with ReplayClient(server.endpoint, timeout=10) as c:
        with c.inserter(max_in_flight=4, on_ack=lambda keys, s: acks.append((keys.copy(), s))) as ins:
            assert isinstance(ins, PipelinedInserter)
            for b in range(60):
                ins.insert(np.full(7, 1.0 + b), batch(f"b{b}", 7))
                assert 1 <= ins.in_flight <= 4
            ins.flush()
            assert ins.in_flight == 0
            st = ins.stats()
        assert st["submitted"] == st["acked"] == 60 and st["failed"] == 0
        assert st["submitted_items"] == st["acked_items"] == 420 and st["failed_items"] == 0
        keys = np.concatenate([k for k, _ in acks])
        assert len(acks) == 60 and len(np.unique(keys)) == 420
        assert all(s >= 0 for _, s in acks)
        assert c.stats()["size"] == 420
        # data + offsets form too, and the store holds exactly what was sent
        with c.inserter(max_in_flight=2) as ins:
            ins.insert([0.5, 0.5], data=b"xxyyy", offsets=[0, 2, 5])
        assert c.stats()["size"] == 422
        got = c.sample(2000, 0.4)
        assert set(map(bytes, got.items)) <= {x for b in range(60) for x in batch(f"b{b}", 7)} | {b"xx", b"yyy"}


def test_bad_arguments_raise_in_the_caller_and_nothing_is_sent(start_server):
    server = start_server()
    with ReplayClient(server.endpoint) as c, c.inserter() as ins:
        with pytest.raises(ValueError, match="priorities"):
            ins.insert([1.0, float("nan")], [b"a", b"b"])
        with pytest.raises(ValueError, match="entries"):
            ins.insert([1.0], [b"a", b"b"])
        with pytest.raises(ValueError):
            ins.insert([1.0], [b"a"], data=b"a", offsets=[0, 1])
        assert ins.stats()["submitted"] == 0
        assert c.stats()["size"] == 0
    with pytest.raises(ValueError):
        ReplayClient(server.endpoint).inserter(max_in_flight=0)


def test_server_errors_are_counted_and_raised_later_and_the_failing_batch_is_not_resent(start_server):
    # rate limiter: with samples_per_insert 1 and error_buffer 100, the third batch of 50 is too far ahead
    server = start_server("--samples-per-insert", "1", "--error-buffer", "100")
    with ReplayClient(server.endpoint) as c:
        ins = c.inserter(max_in_flight=8)
        for b in range(3):
            ins.insert(np.ones(50), batch(f"r{b}", 50))
        with pytest.raises(ServerTimeoutError, match="rate limited"):
            ins.flush()
        st = ins.stats()
        assert st["acked"] == 2 and st["failed"] == 1 and st["failed_items"] == 50 and st["in_flight"] == 0
        assert c.stats()["size"] == 100
        # the error was raised once; the inserter keeps working once the samplers caught up
        c.sample(60, 0.4)
        ins.insert(np.ones(10), batch("ok", 10))
        ins.close()
        assert ins.stats()["acked_items"] == 110
        assert c.stats()["size"] == 110
        # a failure pending at the next insert() is raised there, and that batch is not sent
        ins = c.inserter(max_in_flight=8)
        for b in range(5):  # the first fits the budget (110 + 50 - 1 - 60 <= 100), the other four do not
            try:
                ins.insert(np.ones(50), batch(f"s{b}", 50))
            except ServerTimeoutError:  # a failure of an earlier batch came back already: this one was not sent
                break
        deadline = time.monotonic() + 10
        sent_before = None
        with pytest.raises(ServerTimeoutError):
            while time.monotonic() < deadline:
                sent_before = ins.stats()["submitted"]
                ins.insert(np.ones(50), batch("extra", 50))
                time.sleep(0.01)
        assert ins.stats()["submitted"] == sent_before  # the raising call sent nothing
        try:
            ins.close()  # raises only if an "extra" batch sent before the first error came back failed too
        except ServerTimeoutError:
            pass
        st = ins.stats()
        assert st["acked"] >= 1 and st["failed"] >= 2
        assert st["acked"] + st["failed"] == st["submitted"] and st["in_flight"] == 0
        assert c.stats()["size"] == 110 + 50 * st["acked"]
        with pytest.raises(ServerClosedError):
            ins.insert(np.ones(1), [b"z"])


def wait_stopped(pid: int, timeout: float = 10.0) -> None:
    """Until every thread of ``pid`` is stopped: SIGSTOP is delivered asynchronously."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/stat", encoding="ascii") as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(st in ("T", "t") for st in states):
            return
        time.sleep(0.01)
    raise AssertionError(f"process {pid} did not stop within {timeout}s")


def test_unanswered_inserts_expire_with_a_timeout_and_the_inserter_recovers(start_server):
    server = start_server()
    with ReplayClient(server.endpoint, timeout=0.5) as c:
        ins = c.inserter(max_in_flight=4)
        ins.insert(np.ones(3), batch("a", 3))
        ins.flush()
        os.kill(server.pid, signal.SIGSTOP)  # connected but silent
        wait_stopped(server.pid)  # else a thread still running may answer the first "lost" insert
        try:
            for b in range(3):
                ins.insert(np.ones(3), batch(f"lost{b}", 3))
            t0 = time.monotonic()
            with pytest.raises(ReplayTimeout, match=r"3 request\(s\) \(9 items\) unanswered"):
                ins.flush()
            assert time.monotonic() - t0 < 5
            st = ins.stats()
            assert st["failed"] == 3 and st["failed_items"] == 9 and st["in_flight"] == 0
        finally:
            os.kill(server.pid, signal.SIGCONT)
        # a fresh socket: the late replies of the expired requests are never mistaken for new ones
        ins.insert(np.ones(2), batch("b", 2))
        ins.close()
        st = ins.stats()
        assert st["acked"] == 2 and st["acked_items"] == 5
        # the server stored the "lost" batches after all (they were only unanswered in time): 3 + 9 + 2
        assert c.stats()["size"] == 14


def test_close_without_a_server_fails_the_in_flight_requests(start_server):
    server = start_server()
    c = ReplayClient(server.endpoint, timeout=0.5)
    ins = c.inserter(max_in_flight=4)
    ins.insert(np.ones(2), batch("a", 2))
    ins.flush()
    server.kill()
    ins.insert(np.ones(2), batch("b", 2))
    with pytest.raises(ReplayTimeout):
        ins.close()
    assert ins.closed and ins.stats()["failed"] == 1
    ins.close()  # idempotent
    c.close()


@pytest.mark.parametrize("inline_max", ["0", "4", "1024"])
def test_samples_inline_or_in_the_workers_and_large_samples_do_not_block_inserts(start_server, inline_max):
    server = start_server("--inline-sample-max", inline_max, "--min-size-to-sample", "20", "--workers", "1")
    ctx = zmq.Context()
    with ReplayClient(server.endpoint, timeout=10) as c:
        # deferred SAMPLEs (store below min size) hold neither a worker nor the receiving thread
        sock = ctx.socket(zmq.DEALER)
        sock.connect(server.endpoint)
        sock.send_multipart(P.encode_sample(1, 8, 0.4, timeout_ms=5000), copy=False)
        sock2 = ctx.socket(zmq.DEALER)
        sock2.connect(server.endpoint)
        sock2.send_multipart(P.encode_sample(2, 2, 0.4, timeout_ms=5000), copy=False)
        keys = c.insert(np.ones(10), batch("x", 10))
        assert len(keys) == 10
        with c.inserter(max_in_flight=3) as ins:
            for b in range(4):
                ins.insert(np.ones(5), batch(f"y{b}", 5))
        assert sock.poll(5000)
        r1 = P.decode_reply(sock.recv_multipart(), P.Op.SAMPLE, 1)
        assert sock2.poll(5000)
        r2 = P.decode_reply(sock2.recv_multipart(), P.Op.SAMPLE, 2)
        assert r1.ok and r1.header.count == 8 and r2.ok and r2.header.count == 2
        sock.close(linger=0)
        sock2.close(linger=0)
        ctx.term()
        for n in (1, 4, 5, 30):
            assert len(c.sample(n, 0.4)) == n
        st = c.stats()
        assert st["size"] == 30 and st["requests_sample"] == 6 and st["errors_total"] == 0


def test_resend_keeps_batches_until_stored_and_resends_them_with_their_insert_ids(start_server):
    """``resend=True``: requests unanswered while the server is silent are resent, each with the insert id of its
    first attempt, on a new connection; every batch is stored once; on_retry is told before each resend."""
    server = start_server()
    retries: list[tuple[type, int]] = []
    with ReplayClient(server.endpoint, timeout=0.5) as c:
        ins = c.inserter(max_in_flight=4, resend=True, on_retry=lambda e, n: retries.append((type(e), n)))
        ins.insert(np.ones(3), batch("a", 3))
        ins.flush()
        os.kill(server.pid, signal.SIGSTOP)
        wait_stopped(server.pid)
        try:
            for b in range(4):  # four held: the fifth waits for room, resending until the server answers
                ins.insert(np.ones(3), batch(f"held{b}", 3))
            assert ins.held_items == 12
            with pytest.raises(ReplayTimeout, match="still not stored|still unanswered"):
                ins.flush(timeout=2.0)  # gives up waiting, keeps every batch
            assert ins.held_items == 12
            assert retries and all(issubclass(t, ReplayTimeout) for t, _n in retries)
        finally:
            os.kill(server.pid, signal.SIGCONT)
        ins.insert(np.ones(3), batch("b", 3))
        ins.close()
        st = ins.stats()
        assert st["submitted"] == st["acked"] == 6 and st["failed"] == 0 and st["resent"] >= 4
        assert ins.held_items == 0
        assert c.stats()["size"] == 18  # each batch once, whether its first attempt reached the server or not
        got = c.sample(200, 0.4)
        assert set(map(bytes, got.items)) == {
            x for p in ("a", "held0", "held1", "held2", "held3", "b") for x in batch(p, 3)
        }


def test_resend_repeats_batches_the_rate_limiter_refused_until_stored(start_server):
    server = start_server("--samples-per-insert", "1", "--error-buffer", "100", "--max-wait", "0.2")
    limited: list[int] = []

    def on_retry(error: BaseException, attempts: int) -> None:
        assert isinstance(error, ServerTimeoutError)
        limited.append(attempts)

    with ReplayClient(server.endpoint) as c:
        ins = c.inserter(max_in_flight=3, resend=True, timeout=0.2, on_retry=on_retry)
        for b in range(3):  # the third batch of 50 is too far ahead: refused, resent, refused ...
            ins.insert(np.ones(50), batch(f"r{b}", 50))
        with pytest.raises(ReplayTimeout, match="still not stored|still unanswered"):
            ins.flush(timeout=1.5)
        assert sum(limited) >= 2 and ins.held_items == 50
        c.sample(60, 0.4)  # the sampler catches up: the next resend is admitted
        ins.flush()
        st = ins.stats()
        assert st["acked"] == 3 and st["failed"] == 0 and st["resent"] >= 2
        assert c.stats()["size"] == 150


def test_resend_stops_when_on_retry_raises_and_keeps_what_it_holds(start_server):
    server = start_server()

    class Stop(Exception):
        pass

    def on_retry(_error: BaseException, _attempts: int) -> None:
        raise Stop

    with ReplayClient(server.endpoint, timeout=0.3) as c:
        ins = c.inserter(max_in_flight=2, resend=True, on_retry=on_retry)
        ins.insert(np.ones(2), batch("a", 2))
        ins.flush()
        server.kill()
        ins.insert(np.ones(2), batch("b", 2))
        with pytest.raises(Stop):
            ins.flush()  # b is not answered: on_retry stops the resending, b stays held
        assert ins.held_items == 2
        ins.insert(np.ones(2), batch("d", 2))  # taken (held) even though its send fails
        assert ins.held_items == 4
        with pytest.raises(Stop):
            ins.insert(np.ones(2), batch("e", 2))  # the failure is reported first: e was not taken
        assert ins.held_items == 4
        assert ins.discard() == 4 and ins.held_items == 0
        assert ins.stats()["submitted"] == 3 and ins.stats()["acked"] == 1
        ins.close()
