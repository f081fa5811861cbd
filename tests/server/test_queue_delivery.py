"""A queue table (FIFO sampler, max_times_sampled 1, Queue rate limiter) on a real server process, drained by
4 consumer processes: every inserted item is handed out exactly once -- none lost, none twice -- also across a
graceful restart (SIGTERM: the server answers what it serves, snapshots every table, exits; then it restarts
from the snapshot). After a crash (kill -9) the queue restarts from its last snapshot: every item of that
snapshot not yet handed out when it was written is handed out again after the restart (at least once), and
nothing outside it reappears (docs/running.md, "Tables": what a queue guarantees)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import zmq

from apexrl.errors import ServerTimeoutError
from apexrl.replay import ReplayClient
from apexrl.replay.wire import protocol as P
from tests.conftest import free_port
from tests.helpers import wait_until

QUEUE = {
    "name": "queue",
    "sampler": "fifo",
    "remover": "fifo",
    "capacity": 100_000,
    "max_times_sampled": 1,
    "rate_limiter": {"kind": "queue", "size": 400},
}
CONSUMERS = 4
DEADLINE = 60.0

# A consumer: samples batches of up to 16 from the queue (waiting up to 0.5 s for items), appends each batch
# to its file (one line, its items' texts in batch order), and stops once the stop file exists and a wait
# found the queue empty. A server that
# restarts under it (a timeout, a refused connection, SHUTTING_DOWN) is retried on a new connection: the
# requests it retries are SAMPLEs, which hand out nothing unless they are answered.
CONSUMER = r"""
import os, sys, time
from apexrl.errors import ApexRLError
from apexrl.replay import ReplayClient
endpoint, out_path, stop_path = sys.argv[1:4]
client = None
with open(out_path, "a", encoding="ascii") as out:
    while True:
        try:
            if client is None:
                client = ReplayClient(endpoint, timeout=30, table="queue")
            batch = client.sample(16, timeout=0.5)
        except ApexRLError as exc:
            if os.path.exists(stop_path):
                break
            if type(exc).__name__ != "ServerTimeoutError":
                if client is not None:
                    client.close()
                client = None
                time.sleep(0.05)
            continue
        if len(batch.items):
            out.write(" ".join(bytes(item).decode("ascii") for item in batch.items) + "\n")
            out.flush()
if client is not None:
    client.close()
"""


def tables_file(tmp_path) -> str:
    path = tmp_path / "tables.json"
    path.write_text(json.dumps([{"name": "default"}, QUEUE]))
    return str(path)


def produce(endpoint: str, first: int, count: int) -> None:
    """Inserts items first .. first + count - 1 into the queue, 50 a request, each waiting while the queue
    is full (the Queue limiter); the client's insert ids make every item stored once whatever is retried."""
    with ReplayClient(endpoint, timeout=30, table="queue") as client:
        for start in range(first, first + count, 50):
            ids = range(start, min(start + 50, first + count))
            client.insert(np.ones(len(ids)), [f"item{i}".encode() for i in ids], timeout=60)


class Consumers:
    """CONSUMERS consumer processes on the queue of `endpoint`, each appending to a file of its own; killed on
    leaving the `with` block if still running."""

    def __init__(self, endpoint: str, tmp_path, tag: str):
        self.stop_path = str(tmp_path / f"stop-{tag}")
        self.outs = [str(tmp_path / f"consumer-{tag}-{k}.txt") for k in range(CONSUMERS)]
        self.procs = [
            subprocess.Popen([sys.executable, "-c", CONSUMER, endpoint, out, self.stop_path]) for out in self.outs
        ]

    def received(self) -> list[str]:
        return received(self.outs)

    def finish(self) -> None:
        """Tells them to stop once the queue is empty, and waits until they have."""
        with open(self.stop_path, "w"):
            pass
        for p in self.procs:
            assert p.wait(120) == 0

    def __enter__(self) -> Consumers:
        return self

    def __exit__(self, *exc: object) -> None:
        for p in self.procs:
            if p.poll() is None:
                p.kill()
            p.wait(30)


def batches(outs: list[str]) -> list[list[str]]:
    got: list[list[str]] = []
    for path in outs:
        if os.path.exists(path):
            with open(path, encoding="ascii") as f:
                got.extend(line.split() for line in f if line.endswith("\n") and line.strip())
    return got


def received(outs: list[str]) -> list[str]:
    return [item for batch in batches(outs) for item in batch]


def queue_size(endpoint: str) -> int:
    with ReplayClient(endpoint, timeout=30) as client:
        return int(client.tables()["queue"]["size"])


@pytest.mark.slow
def test_four_consumers_get_every_item_exactly_once_across_a_graceful_restart(start_server, tmp_path):
    port, snapshot = free_port(), str(tmp_path / "replay.snap")
    flags = ("--tables", tables_file(tmp_path), "--snapshot", snapshot)
    server = start_server(*flags, port=port)
    with Consumers(server.endpoint, tmp_path, "a") as consumers:
        produce(server.endpoint, 0, 1500)
        wait_until(lambda: len(consumers.received()) >= 500, 120, "the consumers to take 500 items")
        assert server.terminate() == 0  # answers what it serves, snapshots every table, exits
        server = start_server(*flags, port=port)  # the consumers reconnect to the same endpoint
        produce(server.endpoint, 1500, 1500)
        wait_until(lambda: len(consumers.received()) >= 3000, 180, "the consumers to take all 3000 items")
        consumers.finish()
    got = consumers.received()
    assert sorted(got) == sorted(f"item{i}" for i in range(3000)), "an item was lost or handed out twice"
    assert queue_size(server.endpoint) == 0
    # FIFO: every batch holds its items oldest first
    for batch in batches(consumers.outs):
        ids = [int(s[4:]) for s in batch]
        assert ids == sorted(ids), f"a batch out of insertion order: {batch}"


def test_after_a_crash_the_queue_hands_out_again_what_its_last_snapshot_held(start_server, tmp_path):
    port, snapshot = free_port(), str(tmp_path / "replay.snap")
    flags = ("--tables", tables_file(tmp_path), "--snapshot", snapshot)
    server = start_server(*flags, port=port)
    produce(server.endpoint, 0, 300)
    assert server.terminate() == 0  # a snapshot holding items 0..299
    server = start_server(*flags, port=port)
    assert queue_size(server.endpoint) == 300
    with Consumers(server.endpoint, tmp_path, "before") as consumers:
        wait_until(lambda: len(consumers.received()) >= 100, 120, "the consumers to take 100 items")
    # the consumers are gone (killed on leaving the block): nothing they would still take is part of this test
    server.proc.kill()  # kill -9: what was handed out since the snapshot is recorded nowhere
    server.proc.wait(30)
    server = start_server(*flags, port=port)
    assert queue_size(server.endpoint) == 300  # the last snapshot, whole
    with Consumers(server.endpoint, tmp_path, "after") as consumers:
        wait_until(lambda: len(consumers.received()) >= 300, 120, "the restarted queue to be drained")
        consumers.finish()
    after = consumers.received()
    assert sorted(after) == sorted(f"item{i}" for i in range(300)), "the snapshot's items, each once more"
    assert queue_size(server.endpoint) == 0


def server_connections(port: int) -> int:
    """TCP connections whose server end (local port `port`) is still open: ESTABLISHED, or CLOSE_WAIT (the peer
    closed, the server has not yet); read from /proc/net/tcp{,6}."""
    count = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(path):
            continue
        with open(path, encoding="ascii") as f:
            for line in f.readlines()[1:]:
                fields = line.split()
                if int(fields[1].rsplit(":", 1)[1], 16) == port and fields[3] in ("01", "08"):
                    count += 1
    return count


def test_a_consumer_that_vanishes_while_its_sample_waits_loses_no_item(start_server, tmp_path):
    """A raw consumer sends a SAMPLE that waits on the empty queue, then closes its socket. The server's reply to
    it fails (EHOSTUNREACH): the item goes back to the front of the queue, and the next consumer gets every
    item, each once, in order (docs/running.md, what a queue guarantees).

    The server learns of the departure only once its ROUTER has processed the connection's end, which libzmq
    does on its own thread: if the reply still went out (``replies_dropped`` unchanged: libzmq took it, and the
    server cannot know it was never read, which the docs say), the attempt proves nothing and is made again, up
    to 5 times. Every attempt whose reply was dropped must have returned its item."""
    server = start_server("--tables", tables_file(tmp_path))
    ctx = zmq.Context()
    proved = 0
    try:
        with ReplayClient(server.endpoint, timeout=30, table="queue") as client:
            index = int(client.tables()["queue"]["index"])
            for attempt in range(5):
                before = server_connections(server.port)
                start = client.stats()
                gone = ctx.socket(zmq.DEALER)
                gone.connect(server.endpoint)
                gone.send_multipart(P.encode_sample(1, 1, 0.4, timeout_ms=600_000, table=index))
                wait_until(lambda: client.stats()["table.queue.deferred"] == 1, DEADLINE, "the SAMPLE waiting")
                gone.close(linger=0)
                # The server's end closes once libzmq has seen the peer go; a few round trips through the serving
                # loop then give its ROUTER time to process the pipe's end.
                wait_until(lambda: server_connections(server.port) == before, DEADLINE, "the server to close its end")
                for _ in range(3):
                    client.stats()
                items = [f"{attempt}{x}".encode() for x in "ABC"]
                client.insert(np.ones(3), items, timeout=30)
                wait_until(lambda: client.stats()["table.queue.deferred"] == 0, DEADLINE, "the SAMPLE served")
                s = client.stats()
                dropped = s["replies_dropped"] - start["replies_dropped"]
                returned = s["table.queue.items_returned"] - start["table.queue.items_returned"]
                if dropped == 0:  # libzmq took the reply before it knew the peer had gone: not this test's case
                    assert returned == 0 and s["table.queue.size"] == 2, s
                    client.sample(2, timeout=30)
                    continue
                assert dropped == 1 and returned == 1 and s["table.queue.size"] == 3, s
                batch = client.sample(3, timeout=30)
                assert [bytes(item) for item in batch.items] == items
                with pytest.raises(ServerTimeoutError):
                    client.sample(1, timeout=0.2)
                proved += 1
                break
    finally:
        ctx.destroy(linger=0)
    assert proved == 1, "in 5 attempts the server never saw the consumer go before replying"
