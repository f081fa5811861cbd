"""Parameter service: ParamServer / ParamClient / ParamPoller over real sockets on 127.0.0.1."""

from __future__ import annotations

import random
import socket
import threading
import time

import numpy as np
import pytest
import torch
import zmq

from apexrl.errors import ProtocolError, ServerError
from apexrl.params.service import (
    FetchStatus,
    ParamClient,
    ParamPoller,
    ParamServer,
    ParamsTimeout,
    check_tensors,
    spec_of,
)
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.schema import (
    HEADER,
    HEADER_SIZE,
    MAGIC,
    PARAMS_MAX_REQUEST_BYTES,
    Op,
    Status,
)
from apexrl.security import SERVICE_HWM
from tests.helpers import wait_until

HDR = HEADER  # the params service speaks the replay protocol's header


def state_dict(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {
        "torso.weight": torch.randn(8, 4, generator=g),
        "torso.bias": torch.randn(8, generator=g),
        "head.weight": torch.randn(3, 8, generator=g, dtype=torch.float64),
        "steps": torch.tensor([seed, 2**40 + seed], dtype=torch.int64),
        "mask": torch.randint(0, 255, (2, 3), generator=g, dtype=torch.uint8),
        "scalar": torch.tensor(float(seed), dtype=torch.float16),
        "empty": torch.zeros(0, 5, dtype=torch.int32),
    }


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert sorted(a) == sorted(b)
    for name in a:
        assert a[name].dtype == b[name].dtype, name
        assert a[name].shape == b[name].shape, name
        # bitwise: compare the raw bytes, not values (NaN-safe, -0.0 vs 0.0)
        assert a[name].reshape(-1).view(torch.uint8).equal(b[name].reshape(-1).view(torch.uint8)), name


@pytest.fixture
def server():
    srv = ParamServer().start()
    yield srv
    srv.close()


@pytest.fixture
def client(server):
    c = ParamClient(server.endpoint, timeout=5.0)
    yield c
    c.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def header(
    rid: int = 7,
    *,
    version: int = P.PROTOCOL_VERSION,
    op: int = Op.GET_PARAMS,
    status: int = 0,
    flags: int = 0,
    count: int = 0,
    param: float = 0.0,
    timeout_ms: int = 0,
    magic: bytes = MAGIC,
    table: int = 0,
) -> bytes:
    return HDR.pack(magic, version, op, rid, status, flags, count, param, timeout_ms, table)


def get(rid: int = 7, have: int = 0, server_id: int = 0, **fields) -> list[bytes]:
    """A GET_PARAMS request with header ``fields`` changed."""
    return [header(rid, **fields), np.array([have, server_id], "<u8").tobytes()]


def reply(rid: int, version: int, server_id: int, weights: bytes = b"") -> list[bytes]:
    return [bytes(memoryview(f).cast("B")) for f in P.encode_get_params_reply(rid, version, server_id, weights)]


# ------------------------------------------------------------------------------------------- round trip


def test_round_trip_keeps_names_dtypes_shapes_and_bits(server, client):
    sd = state_dict(1)
    sd["nan"] = torch.tensor([float("nan"), -0.0, float("inf")])
    assert server.publish(sd) == 1
    got = client.fetch(0)
    assert got is not None
    version, tensors = got
    assert version == 1 and client.last_status == FetchStatus.PARAMS
    assert_same(sd, tensors)
    tensors["torso.bias"] += 1  # the received tensors own writable memory
    assert server.endpoint.startswith("tcp://127.0.0.1:")


def test_publish_accepts_non_contiguous_and_tied_tensors(server, client):
    w = torch.arange(12.0).reshape(3, 4)
    server.publish({"t": w.t(), "a": w, "b": w})  # a transposed view, and two names sharing one storage
    _, tensors = client.fetch(0)
    assert tensors["t"].equal(w.t()) and tensors["a"].equal(w) and tensors["b"].equal(w)


def test_same_version_is_unchanged_and_a_publish_brings_the_next(server, client):
    server.publish(state_dict(1))
    v1, _ = client.fetch(0)
    assert client.fetch(v1) is None
    assert client.fetch(np.int64(v1)) is None  # numpy counters are fine
    with pytest.raises(ValueError):
        client.fetch(-1)
    assert client.last_status == FetchStatus.UNCHANGED and client.latest_version == v1
    assert server.publish(state_dict(2)) == 2
    v2, tensors = client.fetch(v1)
    assert v2 == 2
    assert_same(tensors, state_dict(2))
    assert client.fetch(2) is None
    assert server.stats()["unchanged"] == 3 and server.stats()["params"] == 2


def test_not_ready_before_the_first_publish(server, client):
    assert client.fetch(0) is None
    assert client.last_status == FetchStatus.NOT_READY and client.latest_version == 0
    server.publish(state_dict())
    assert client.fetch(0)[0] == 1


def test_a_restarted_learner_is_never_mistaken_for_the_old_one():
    """Versions restart at 1 with a new server; an actor holding the old v2 must still get the new v2."""
    old = ParamServer().start()
    port = int(old.endpoint.rsplit(":", 1)[1])
    client = ParamClient(old.endpoint, timeout=2.0)
    try:
        old.publish(state_dict(1))
        old.publish(state_dict(2))
        assert client.fetch(0)[0] == 2
        old.close()
        new = ParamServer(port=port).start()
        try:
            new.publish(state_dict(10))
            new.publish(state_dict(20))
            got = client.fetch(2)
            assert got is not None and got[0] == 2
            assert_same(got[1], state_dict(20))
            assert client.fetch(2) is None
        finally:
            new.close()
    finally:
        client.close()
        old.close()


def test_many_concurrent_clients_all_reach_the_latest_version(server):
    server.publish(state_dict(0))
    final = 5
    results: dict[int, int] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(17)

    def actor(i: int) -> None:
        try:
            with ParamClient(server.endpoint, timeout=5.0) as c:
                have = 0
                start.wait()
                deadline = time.monotonic() + 10
                while time.monotonic() < deadline:
                    got = c.fetch(have)
                    if got is not None:
                        have, tensors = got
                        assert_same(tensors, state_dict(have - 1))
                    if have == final:
                        break
                results[i] = have
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=actor, args=(i,)) for i in range(16)]
    for t in threads:
        t.start()
    start.wait()
    for v in range(1, final):
        time.sleep(0.02)
        assert server.publish(state_dict(v)) == v + 1
    for t in threads:
        t.join(15)
    assert not errors, errors
    assert results == dict.fromkeys(range(16), final)


# ------------------------------------------------------------------------------------------- mismatch


def test_expected_mismatch_is_refused_naming_the_names_and_nothing_is_replaced(server):
    good = state_dict(0)
    bad = dict(good)
    del bad["torso.bias"]
    bad["extra"] = torch.zeros(1)
    bad["torso.weight"] = torch.zeros(8, 5)
    bad["steps"] = bad["steps"].to(torch.int32)
    server.publish(good)
    loaded = []
    with ParamClient(server.endpoint, expected=spec_of(good)) as c:
        poller = ParamPoller(c, loaded.append, every_frames=10)
        assert poller.maybe_fetch(0) is not None and poller.version == 1 and len(loaded) == 1
        server.publish(bad)
        with pytest.raises(ValueError) as info:
            c.fetch(1)
        msg = str(info.value)
        assert "missing ['torso.bias']" in msg and "unexpected ['extra']" in msg
        assert "torso.weight: got torch.float32 (8, 5), expected torch.float32 (8, 4)" in msg
        assert "steps: got torch.int32" in msg
        assert poller.maybe_fetch(10) is None  # refused: old weights and version stay
        assert poller.version == 1 and len(loaded) == 1 and poller.stats()["mismatches"] == 1
        server.publish(state_dict(3))  # a fixed learner is picked up
        assert poller.maybe_fetch(20) is not None and poller.version == 3 and len(loaded) == 2


def test_check_tensors_accepts_matching_and_refuses_shape():
    sd = state_dict()
    check_tensors(sd, spec_of(sd))
    with pytest.raises(ValueError, match="mismatched torso.bias"):
        check_tensors({**sd, "torso.bias": torch.zeros(9)}, spec_of(sd))


def test_poller_load_refusal_keeps_the_old_version(server):
    server.publish(state_dict(0))

    def load(tensors):
        raise ValueError("wrong shapes")

    with ParamClient(server.endpoint) as c:
        poller = ParamPoller(c, load, version=0)
        assert poller.maybe_fetch(0) is None
        assert poller.version == 0 and poller.stats()["mismatches"] == 1
        assert c.fetch(0) is not None  # still offered: the client forgot what it handed out


def test_publish_refuses_bad_input_and_over_cap_weights():
    srv = ParamServer(max_message_mb=0.01)
    with pytest.raises(ValueError, match="max_message_mb"):
        srv.publish({"w": torch.zeros(10_000)})
    with pytest.raises(TypeError):
        srv.publish({"w": [1.0, 2.0]})
    with pytest.raises(ValueError):
        srv.publish({"__metadata__": torch.zeros(1)})
    assert srv.version == 0
    with pytest.raises(RuntimeError):
        srv.endpoint  # noqa: B018 - not started
    srv.close()


# ------------------------------------------------------------------------------------------- hostile input


def hostile_messages(rng: random.Random) -> list[list[bytes]]:
    ok = get(rid=1)
    msgs: list[list[bytes]] = []
    for i in range(1200):
        kind = i % 13
        rid = 1000 + i
        if kind == 0:
            msgs.append([rng.randbytes(rng.randrange(0, 100))])
        elif kind == 1:
            msgs.append(get(rid, magic=b"APXP"))  # the parameter service's former magic
        elif kind == 2:
            msgs.append(get(rid, version=rng.choice([0, 1, 7, 65535])))
        elif kind == 3:
            msgs.append([get(rid)[0][: rng.randrange(0, HEADER_SIZE)], get(rid)[1]])
        elif kind == 4:
            msgs.append([*get(rid), b"extra"] + [b""] * rng.randrange(0, 3))
        elif kind == 5:
            msgs.append(get(rid, op=rng.choice([0, 2, 99, 65535])))  # 2: a replay op, not served here
        elif kind == 6:
            msgs.append(get(rid, status=rng.randrange(1, 65536)))
        elif kind == 7:
            msgs.append(get(rid, flags=rng.randrange(1, 65536)))
        elif kind == 8:
            msgs.append(get(rid, count=rng.randrange(1, 2**32)))
        elif kind == 9:
            msgs.append([get(rid)[0] + b"\0" * rng.randrange(1, 50), get(rid)[1]])
        elif kind == 10:
            b = bytearray(ok[0])
            for _ in range(3):
                b[rng.randrange(16, HEADER_SIZE)] = rng.randrange(256)
            b[16:20] = b"\xff\xff\xff\xff"  # status and flags always invalid: answer must be an error
            msgs.append([bytes(b), ok[1]])
        elif kind == 11:
            msgs.append([get(rid)[0], b"\0" * rng.choice([0, 8, 15, 17, 24])])  # held is not u64[2]
        else:
            msgs.append([b"", *get(rid)])  # REQ-style empty delimiter first
    return msgs


def error_reply_status(frames: list[bytes]) -> Status:
    """The status of one reply to a hostile request: a well-formed error reply, never OK."""
    assert len(frames) == 2 and len(frames[0]) == HEADER_SIZE
    status = HDR.unpack(frames[0])[4]
    assert status != Status.OK
    frames[1].decode("utf-8")
    return Status(status)


def test_hostile_input_is_answered_with_errors_and_the_server_keeps_serving(server, client):
    """Every hostile request gets exactly one error reply. The client keeps at most WINDOW requests unanswered,
    well under the service's SERVICE_HWM, so no reply can be dropped for a full queue whatever the timing (the
    drop path has its own test below)."""
    window = SERVICE_HWM // 4
    server.publish(state_dict(0))
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(server.endpoint)
    try:
        msgs = hostile_messages(random.Random(0))
        replies: list[list[bytes]] = []
        sent = 0
        deadline = time.monotonic() + 120  # generous: a loaded 2-core machine; an idle one takes ~1 s
        while len(replies) < len(msgs):
            while sent < len(msgs) and sent - len(replies) < window:
                raw.send_multipart(msgs[sent])
                sent += 1
            left = deadline - time.monotonic()
            assert left > 0 and raw.poll(int(left * 1000)), (
                f"{len(replies)} replies to {sent} requests sent; stats {server.stats()}"
            )
            replies.append(raw.recv_multipart())
        statuses = {error_reply_status(frames) for frames in replies}
        assert statuses >= {Status.BAD_MESSAGE, Status.UNSUPPORTED_VERSION, Status.UNKNOWN_OP}
        stats = server.stats()
        assert stats["errors"] == stats["requests"] == len(msgs) and stats["dropped"] == 0, stats
        assert raw.poll(0) == 0, "more replies than requests"

        raw.send_multipart(get(rid=42, version=1))
        assert raw.poll(30_000)
        frames = raw.recv_multipart()
        _m, _v, op, rid, status, *_ = HDR.unpack(frames[0])
        assert (op, rid, status) == (Op.GET_PARAMS, 42, Status.UNSUPPORTED_VERSION)
        assert frames[1].decode() == "protocol version 1 is not supported; supported versions: 6"

        raw.send_multipart([b"x" * (PARAMS_MAX_REQUEST_BYTES + 1)])  # over ZMQ_MAXMSGSIZE: the peer is dropped
        version, tensors = client.fetch(0)
        assert version == 1
        assert_same(tensors, state_dict(0))
    finally:
        raw.close()
        ctx.term()


def test_a_peer_that_floods_without_reading_loses_replies_not_its_requests(server, client):
    """What the service promises a peer that sends without reading: every request is read and answered, and a
    reply that finds the peer's queue full (SERVICE_HWM) is dropped and counted, never blocking the service.
    Whether any are dropped depends on how fast this process drains its socket, so the test checks the
    accounting (replies received + dropped = requests sent), not a count of either."""
    server.publish(state_dict(0))
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.setsockopt(zmq.RCVHWM, 1)  # a slow reader: make the drop path likely, not certain
    raw.connect(server.endpoint)
    try:
        msgs = hostile_messages(random.Random(1))
        for m in msgs:
            raw.send_multipart(m)
        wait_until(lambda: server.stats()["requests"] == len(msgs), 60, "every request read and answered or dropped")
        replies: list[list[bytes]] = []

        def drained() -> bool:
            while raw.poll(0):
                replies.append(raw.recv_multipart())
            return len(replies) + server.stats()["dropped"] >= len(msgs)

        wait_until(drained, 60, "replies received + dropped = requests sent", interval=0.02)
        stats = server.stats()
        assert stats["errors"] == stats["requests"] == len(msgs), stats
        assert len(replies) + stats["dropped"] == len(msgs), (len(replies), stats)
        print(f"flood: {len(replies)} replies received, {stats['dropped']} dropped")
        for frames in replies:
            error_reply_status(frames)
        # the service kept serving: a well-behaved client is answered meanwhile and afterwards
        version, tensors = client.fetch(0)
        assert version == 1
        assert_same(tensors, state_dict(0))
    finally:
        raw.close()
        ctx.term()


# ------------------------------------------------------------------------------------------- client side


def fake_server(handler, ready: threading.Event, stop: threading.Event, port_box: list[int]) -> None:
    """A raw ROUTER that answers each request with handler(header_fields) -> list of frames (or [])."""
    ctx = zmq.Context()
    sock = ctx.socket(zmq.ROUTER)
    sock.setsockopt(zmq.LINGER, 0)
    port_box.append(sock.bind_to_random_port("tcp://127.0.0.1"))
    ready.set()
    try:
        while not stop.is_set():
            if sock.poll(20):
                ident, *frames = sock.recv_multipart()
                for answer in handler(HDR.unpack(frames[0])):
                    sock.send_multipart([ident, *answer])
    finally:
        sock.close()
        ctx.term()


@pytest.fixture
def fake():
    stop = threading.Event()
    threads = []

    def start(handler) -> str:
        ready, box = threading.Event(), []
        t = threading.Thread(target=fake_server, args=(handler, ready, stop, box), daemon=True)
        t.start()
        threads.append(t)
        assert ready.wait(5)
        return f"tcp://127.0.0.1:{box[0]}"

    yield start
    stop.set()
    for t in threads:
        t.join(5)


def test_replies_to_other_request_ids_are_discarded(fake):
    def handler(h):
        rid = h[3]
        return [
            reply(rid + 1, 9, 5),  # a late reply: ignored
            [b"garbage"],  # ignored
            reply(rid, 0, 5),
        ]

    with ParamClient(fake(handler), timeout=2.0) as c:
        assert c.fetch(9) is None and c.last_status == FetchStatus.NOT_READY and c.latest_version == 0


@pytest.mark.parametrize(
    "answer",
    [
        lambda rid: reply(rid, 0, 5, b"abcd"),  # weights with version 0
        lambda rid: reply(rid, 1, 5, b"abcd"),  # not safetensors
        lambda rid: reply(rid, 1, 0),  # server_id 0
        lambda rid: reply(rid, 3, 5),  # "unchanged" for weights this client does not hold
        lambda rid: [*reply(rid, 0, 5), b"extra"],
        lambda rid: [reply(rid, 0, 5)[0], b"\0" * 8, b""],  # latest is not u64[2]
        lambda rid: [header(rid, op=3), *reply(rid, 0, 5)[1:]],  # a replay op
        lambda rid: [header(rid, count=1), *reply(rid, 0, 5)[1:]],  # an unused header field set
    ],
)
def test_malformed_replies_raise_protocol_error(fake, answer):
    with ParamClient(fake(lambda h: [answer(h[3])]), timeout=2.0) as c:
        with pytest.raises(ProtocolError):
            c.fetch(0)


def test_error_reply_raises_server_error(fake):
    def handler(h):
        return [P.encode_error(Op.GET_PARAMS, h[3], Status.BAD_MESSAGE, "nope")]

    with ParamClient(fake(handler), timeout=2.0) as c:
        with pytest.raises(ServerError, match="BAD_MESSAGE: nope"):
            c.fetch(0)


def test_timeout_when_nothing_listens_then_reconnects_to_a_server_on_that_port():
    port = free_port()
    client = ParamClient(f"tcp://127.0.0.1:{port}", timeout=0.3)
    try:
        t0 = time.monotonic()
        with pytest.raises(ParamsTimeout) as info:
            client.fetch(0)
        assert isinstance(info.value, TimeoutError)
        assert 0.25 < time.monotonic() - t0 < 4.0
        with ParamServer(port=port) as srv:
            srv.publish(state_dict(4))
            client.timeout = 5.0
            version, tensors = client.fetch(0)
            assert version == 1
            assert_same(tensors, state_dict(4))
    finally:
        client.close()


def test_replies_over_the_client_cap_are_refused(server):
    server.publish({"w": torch.zeros(50_000)})
    with ParamClient(server.endpoint, timeout=0.5, max_message_mb=0.05) as c:
        with pytest.raises(ParamsTimeout, match="max_message_mb"):
            c.fetch(0)
    with ParamClient(server.endpoint, timeout=5.0) as c:
        assert c.fetch(0)[0] == 1


def test_close_is_prompt_and_frees_the_port():
    srv = ParamServer().start()
    port = int(srv.endpoint.rsplit(":", 1)[1])
    with ParamClient(srv.endpoint) as c:
        srv.publish(state_dict())
        assert c.fetch(0) is not None
        t0 = time.monotonic()
        srv.close()
        assert time.monotonic() - t0 < 4.0  # the thread polls every 50 ms; close() gives up (raises) after 5 s
    srv.close()  # idempotent
    ParamServer(port=port).start().close()


# ------------------------------------------------------------------------------------------- poller


def test_poller_fetches_at_most_every_n_frames(server):
    server.publish(state_dict(0))
    loaded = []
    with ParamClient(server.endpoint) as c:
        poller = ParamPoller(c, loaded.append, every_frames=400)
        assert poller.maybe_fetch(0) is not None and poller.version == 1
        server.publish(state_dict(1))
        assert poller.maybe_fetch(399) is None and poller.stats()["fetches"] == 1
        got = poller.maybe_fetch(400)
        assert got is not None and poller.version == 2 and len(loaded) == 2
        assert poller.maybe_fetch(800) is None and poller.stats()["unchanged"] == 1


def test_poller_survives_an_absent_learner_and_backs_off():
    port = free_port()
    with ParamClient(f"tcp://127.0.0.1:{port}", timeout=0.1) as c:
        poller = ParamPoller(c, every_frames=10, max_backoff=4)
        t0 = time.monotonic()
        assert poller.maybe_fetch(0) is None  # timeout: counted, not raised
        assert time.monotonic() - t0 < 3.0
        assert poller.maybe_fetch(19) is None and poller.stats()["fetches"] == 1  # backoff: 2 * 10
        assert poller.maybe_fetch(20) is None and poller.stats()["timeouts"] == 2
        assert poller.maybe_fetch(59) is None and poller.stats()["fetches"] == 2  # backoff: 4 * 10
        with ParamServer(port=port) as srv:
            srv.publish(state_dict(0))
            c.timeout = 5.0
            assert poller.maybe_fetch(60) is not None and poller.version == 1
        assert poller.stats()["timeouts"] == 2 and poller.stats()["updates"] == 1
