"""Learner-side client features with real server processes: PrefetchingSampler and AsyncUpdater."""

from __future__ import annotations

import socket
import threading
import time

import numpy as np
import pytest
import zmq

from apexrl.errors import ReplayTimeout, ServerClosedError, ServerError
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.client.sampler import LearnerBatch, PrefetchingSampler
from apexrl.replay.client.updater import AsyncUpdater
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.codec import TransitionSpec
from tests.helpers import wait_until

# ------------------------------------------------------------- process helper (copied from test_server_client)


def items_for(prefix: str, n: int) -> list[bytes]:
    return [f"{prefix}-{i}".encode() * (1 + i % 3) for i in range(n)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def connect(endpoint: str, timeout: float):
    """A factory of clients of ``endpoint``: what the helpers take."""
    return lambda: ReplayClient(endpoint, timeout=timeout)


def check_raw(batch: LearnerBatch, by_key: dict[int, bytes], n: int) -> None:
    assert len(batch) == n and batch.decoded is None and batch.raw is not None
    assert batch.weights.shape == (n,) and batch.probabilities.shape == (n,)
    assert np.all(batch.weights > 0) and np.all(batch.weights <= 1.0)
    for key, item in zip(batch.keys.tolist(), batch.raw.items):
        assert bytes(item) == by_key[key]


@pytest.fixture
def error_stub():
    """A tiny ROUTER 'server' answering every request with INVALID_ARGUMENT (a real server never rejects a
    well-formed SAMPLE), to check that ServerErrors reach the consumer."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port = sock.bind_to_random_port("tcp://127.0.0.1")
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            if not sock.poll(20):
                continue
            ident, *frames = sock.recv_multipart()
            req = P.decode_request(frames)
            sock.send_multipart(
                [ident, *P.encode_error(req.header.op, req.request_id, P.Status.INVALID_ARGUMENT, "nope")]
            )

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    yield f"tcp://127.0.0.1:{port}"
    stop.set()
    t.join(5)
    sock.close(linger=0)
    ctx.term()


# ------------------------------------------------------------------------------------------------- sampler


def test_sampler_yields_inserted_items_and_ends_after_close(start_server):
    server = start_server("--capacity", "1000")
    items = items_for("a", 300)
    with ReplayClient(server.endpoint, timeout=5) as client:
        keys = client.insert(np.linspace(0.5, 3.0, 300), items)
        by_key = dict(zip(keys.tolist(), items))
        sampler = client.sampler(32, beta=0.5, prefetch=4)
        assert isinstance(sampler, PrefetchingSampler)
        with sampler:
            for i, batch in enumerate(sampler):
                check_raw(batch, by_key, 32)
                if i == 9:
                    break
            assert sampler.stats()["retries"] == 0
        assert sampler.closed and not any(t.is_alive() for t in sampler._threads)
        assert all(r.closed for r in sampler._replays)  # the background client (socket and context) was closed
        with pytest.raises(StopIteration):
            next(sampler)
        assert list(sampler) == []
        sampler.close()  # idempotent
        # the caller's client is untouched by the sampler
        assert client.stats()["requests_sample"] >= 10


def test_prefetch_bound_is_respected(start_server):
    server = start_server()
    with ReplayClient(server.endpoint, timeout=5) as client:
        client.insert(np.ones(50), items_for("p", 50))
        with client.sampler(8, prefetch=3) as sampler:
            wait_until(lambda: sampler.qsize() == 3, 5.0, "a full queue", interval=0.01)
            time.sleep(0.3)  # the worker must not sample while the queue is full
            st = sampler.stats()
            assert st["queued"] == 3 and st["max_queued"] == 3 and st["fetched"] == 3
            assert client.stats()["requests_sample"] == 3
            for _ in range(5):
                assert len(sampler.next(timeout=5)) == 8
            wait_until(lambda: sampler.qsize() == 3, 5.0, "a refilled queue", interval=0.01)
            time.sleep(0.1)
            st = sampler.stats()
            assert st["max_queued"] == 3 and st["fetched"] == 8
            assert client.stats()["requests_sample"] == 8


def test_close_is_prompt_while_waiting_on_a_dead_server_or_a_full_queue(start_server):
    server = start_server()
    with ReplayClient(server.endpoint, timeout=5) as client:
        client.insert(np.ones(20), items_for("c", 20))
    # full queue: the worker waits for room
    full = PrefetchingSampler(connect(server.endpoint, 30), 4, prefetch=2)
    wait_until(lambda: full.qsize() == 2, 5.0, "a full queue", interval=0.01)
    # server gone: the worker waits for a reply that never comes (client timeout 30 s)
    gone = PrefetchingSampler(connect(server.endpoint, 30), 4, prefetch=2)
    wait_until(lambda: gone.qsize() == 2, 5.0, "a full queue", interval=0.01)
    server.kill()
    gone.next(timeout=5)  # room for one more: the worker now sends to a dead server
    time.sleep(0.3)
    for s in (full, gone):
        t0 = time.monotonic()
        s.close()
        assert time.monotonic() - t0 < 10.0  # not the 30 s client timeout
        assert not any(t.is_alive() for t in s._threads) and all(r.closed for r in s._replays)
    # never any server: timeouts are retried (and counted) until closed
    nobody = PrefetchingSampler(connect(f"tcp://127.0.0.1:{free_port()}", 0.2), 4)
    wait_until(lambda: nobody.retries >= 2, 5.0, "retries", interval=0.01)
    assert isinstance(nobody.last_retry_error, ReplayTimeout)
    with pytest.raises(ReplayTimeout):
        nobody.next(timeout=0.1)  # the consumer's own optional wait bound
    t0 = time.monotonic()
    nobody.close()
    assert time.monotonic() - t0 < 10.0
    with pytest.raises(StopIteration):
        next(nobody)


def test_background_errors_are_reraised_in_the_consumer(start_server, error_stub):
    server = start_server()
    with ReplayClient(server.endpoint, timeout=5) as client:
        client.insert(np.ones(10), items_for("e", 10))
        calls = [0]

        def decode(batch):
            calls[0] += 1
            if calls[0] == 3:
                raise RuntimeError("decode failed")
            return {"n": len(batch)}

        with client.sampler(4, prefetch=1, decode=decode) as sampler:
            assert sampler.next(timeout=5).decoded == {"n": 4}
            assert sampler.next(timeout=5).decoded == {"n": 4}
            with pytest.raises(RuntimeError, match="decode failed"):
                sampler.next(timeout=5)
            with pytest.raises(StopIteration):  # raised once, then exhausted
                sampler.next(timeout=5)
            assert not any(t.is_alive() for t in sampler._threads)

    with ReplayClient(error_stub, timeout=5) as client, client.sampler(4) as sampler:
        with pytest.raises(ServerError, match="nope") as info:
            next(sampler)
        assert info.value.status == P.Status.INVALID_ARGUMENT
        assert sampler.retries == 0

    with pytest.raises(ValueError):  # bad arguments fail in the caller, no thread started
        PrefetchingSampler(connect(error_stub, 5), 0)
    with pytest.raises(ValueError):
        PrefetchingSampler(connect(error_stub, 5), 4, prefetch=0)


def test_decode_hook_with_a_transition_spec(start_server):
    spec = TransitionSpec.dpg(obs_dim=3, act_dim=2)
    n = 64
    rng = np.random.default_rng(0)
    batch = {
        "obs": rng.standard_normal((n, 3)).astype(np.float32),
        "action": rng.standard_normal((n, 2)).astype(np.float32),
        "reward": np.arange(n, dtype=np.float32),
        "discount": np.full(n, 0.99, np.float32),
        "next_obs": rng.standard_normal((n, 3)).astype(np.float32),
    }
    data, offsets = spec.encode(batch)
    server = start_server()
    with ReplayClient(server.endpoint, timeout=5) as client:
        keys = client.insert(np.ones(n), data=data, offsets=offsets)
        row = {k: i for i, k in enumerate(keys.tolist())}
        with client.sampler(16, prefetch=2, decode=spec.decode_batch, timeout=1.0) as sampler:
            for _ in range(4):
                b = sampler.next(timeout=5)
                assert b.raw is None and set(b.decoded) == set(spec.names)
                idx = [row[k] for k in b.keys.tolist()]
                for name in spec.names:
                    np.testing.assert_array_equal(b.decoded[name], batch[name][idx])


def test_sampler_keeps_going_after_a_server_restart(start_server, tmp_path):
    snap = str(tmp_path / "replay.snap")
    server = start_server("--snapshot", snap)
    items = items_for("r", 100)
    with ReplayClient(server.endpoint, timeout=5) as client:
        keys = client.insert(np.ones(100), items)
    by_key = dict(zip(keys.tolist(), items))
    with PrefetchingSampler(connect(server.endpoint, 0.5), 8, prefetch=2) as sampler:
        check_raw(sampler.next(timeout=5), by_key, 8)
        assert server.terminate() == 0  # writes the snapshot
        while sampler.qsize():
            sampler.next(timeout=1)
        wait_until(lambda: sampler.retries >= 1, 5.0, "a retry while the server is down", interval=0.01)
        restarted = start_server("--snapshot", snap, port=server.port)
        for _ in range(5):
            check_raw(sampler.next(timeout=10), by_key, 8)
        assert sampler.retries >= 1
    assert restarted.terminate() == 0


def test_sampler_waits_for_min_size_to_sample(start_server):
    server = start_server("--min-size-to-sample", "20")
    with ReplayClient(server.endpoint, timeout=5) as client, client.sampler(4, prefetch=2) as sampler:
        wait_until(lambda: sampler.retries >= 1, 5.0, "a TIMEOUT retry", interval=0.01)  # store too small: retried
        assert sampler.qsize() == 0
        client.insert(np.ones(20), items_for("m", 20))
        assert len(sampler.next(timeout=5)) == 4


# ------------------------------------------------------------------------------------------------- updater


def test_async_updates_are_applied_and_arrays_copied(start_server):
    server = start_server("--alpha", "1.0")
    with ReplayClient(server.endpoint, timeout=5) as client:
        keys = client.insert(np.ones(100), items_for("u", 100))
        updater = client.updater(max_pending=4)
        assert isinstance(updater, AsyncUpdater)
        with updater:
            prio = np.full(10, 5.0)
            for i in range(10):
                updater.update(keys[i * 10 : (i + 1) * 10], prio)
                prio[:] = 7.0 if i == 9 else 5.0  # mutating after the call must not change what is sent
            updater.update(np.array([123456789], np.uint64), [1.0])  # unknown key: sent, not updated
            updater.flush(timeout=5)
            st = updater.stats()
            assert st == {"submitted": 11, "sent": 11, "updated": 100, "failed": 0, "dropped": 0, "pending": 0}
        s = client.stats()
        assert s["requests_update_priorities"] == 11
        assert s["total_priority"] == pytest.approx(500.0)
        assert (
            updater.closed
            and not any(t.is_alive() for t in updater._threads)
            and all(r.closed for r in updater._replays)
        )
        with pytest.raises(ServerClosedError):
            updater.update(keys[:1], [1.0])


def test_async_update_failures_are_reported(start_server):
    # max_bytes = 10485: a 1000-key update (two 8000-byte frames) is rejected as TOO_LARGE by the server.
    server = start_server("--max-message-mb", "0.01")
    with ReplayClient(server.endpoint, timeout=5) as client:
        keys = client.insert(np.ones(10), items_for("f", 10))
        with client.updater() as updater:
            with pytest.raises(ValueError, match="finite"):  # validated in the caller: nothing sent
                updater.update(keys[:2], [1.0, float("nan")])
            with pytest.raises(ValueError):
                updater.update(keys[:2], [1.0])
            assert updater.stats()["submitted"] == 0
            updater.update(np.arange(1000, dtype=np.uint64), np.ones(1000))
            updater.update(keys, np.full(10, 2.0))
            with pytest.raises(ServerError) as info:
                updater.flush(timeout=5)
            assert info.value.status == P.Status.TOO_LARGE
            assert updater.stats() == {
                "submitted": 2,
                "sent": 1,
                "updated": 10,
                "failed": 1,
                "dropped": 0,
                "pending": 0,
            }
            updater.flush(timeout=5)  # the error was reported once
            # reported by the next update() as well
            updater.update(np.arange(1000, dtype=np.uint64), np.ones(1000))
            wait_until(lambda: updater.stats()["failed"] == 2, 5.0, "the second failure", interval=0.01)
            with pytest.raises(ServerError):
                updater.update(keys, np.full(10, 3.0))
            updater.update(keys, np.full(10, 3.0))
        assert updater.stats()["sent"] == 2


def test_flush_waits_and_max_pending_blocks_on_a_dead_server(start_server):
    server = start_server()
    with ReplayClient(server.endpoint, timeout=5) as client:
        keys = client.insert(np.ones(10), items_for("w", 10))
    updater = AsyncUpdater(connect(server.endpoint, 2.0), max_pending=2, close_timeout=0.5)
    for _ in range(5):
        updater.update(keys, np.full(10, 2.0))
    updater.flush()  # everything sent so far was acknowledged
    assert updater.stats()["sent"] == 5 and updater.pending == 0
    server.kill()
    t0 = time.monotonic()
    updater.update(keys, np.ones(10))
    updater.update(keys, np.ones(10))
    assert time.monotonic() - t0 < 1.0  # under max_pending: never blocks (a block lasts the 2 s client timeout)
    with pytest.raises(ReplayTimeout):
        updater.flush(timeout=0.1)  # still outstanding
    with pytest.raises(ReplayTimeout):  # blocked at max_pending until the first failure, which it reports
        updater.update(keys, np.ones(10))
    assert 1.5 < time.monotonic() - t0 < 10.0
    assert updater.stats()["submitted"] == 7  # the update that raised was not queued
    updater.update(keys, np.ones(10))
    t0 = time.monotonic()
    updater.close(timeout=0)  # drop what is left (one in flight, one queued) without waiting for the server
    assert time.monotonic() - t0 < 1.9  # less than the in-flight request's 2 s timeout
    st = updater.stats()
    assert st == {"submitted": 8, "sent": 5, "updated": 50, "failed": 1, "dropped": 2, "pending": 0}
    assert not any(t.is_alive() for t in updater._threads) and all(r.closed for r in updater._replays)
