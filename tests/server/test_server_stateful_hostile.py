"""Hostile requests that depend on the server's state, against a real apexrl-replay-server process.

The decoder fuzz feeds one message at a time; these need a first request to change the server's state (an
insert id remembered, a rate limiter that holds inserts back) before the second one does harm:

* a repeated insert id whose chunk frames reference a chunk the request does not carry killed the server
  (SIGSEGV: the reply-size accounting read the request's chunk offsets at that reference);
* an invalid chunk reference under the rate limiter was answered TIMEOUT (and waited, its bytes held)
  instead of INVALID_ARGUMENT, because chunk references were checked only after admission.

Every invalid chunk reference is refused INVALID_ARGUMENT when the request is decoded, before the insert-id
window and the rate limiter see it, and the message names the value sent.
"""

from __future__ import annotations

import time

import numpy as np
import pytest
import zmq

from apexrl.replay.wire import protocol as P

DEADLINE_S = 60.0  # a loaded 2-core CI machine: generous, never slept through when the reply comes


class Peer:
    """A raw DEALER talking to one server process: a request fails at once if the server has died."""

    def __init__(self, srv, sock: zmq.Socket):
        self.srv, self.sock = srv, sock

    def request(self, frames, op: P.Op, rid: int) -> P.Reply:
        self.sock.send_multipart(frames)
        deadline = time.monotonic() + DEADLINE_S
        while not self.sock.poll(200, zmq.POLLIN):
            if not self.srv.alive():
                raise AssertionError(f"the server died (exit status {self.srv.proc.returncode}) on {op.name} {rid}")
            if time.monotonic() > deadline:
                raise AssertionError(f"no reply to {op.name} {rid} within {DEADLINE_S} s")
        return P.decode_reply(self.sock.recv_multipart(), op, rid)

    def stats(self, rid: int) -> dict:
        reply = self.request(P.encode_stats(rid), P.Op.STATS, rid).raise_for_status()
        assert reply.stats is not None
        return reply.stats


def chunked_insert(rid: int, refs: list[list[int]], *, insert_id=(0, 0), timeout_ms: int = 0, nchunks: int = 2):
    """An INSERT of len(refs) items whose item i references chunks refs[i] (any u64) of `nchunks` chunks."""
    items = [b"item-%d" % i for i in range(len(refs))]
    data, offsets = P.pack_items(items)
    flat = np.array([c for r in refs for c in r], dtype=np.uint64)
    item_chunk_offsets = np.cumsum([0] + [len(r) for r in refs]).astype(np.uint64)
    chunk_data, chunk_offsets = P.pack_items([b"chunk-%d" % c * 8 for c in range(nchunks)])
    chunks = P.FrameChunks(flat, item_chunk_offsets, chunk_data, chunk_offsets)
    return P.encode_insert(
        rid, np.ones(len(refs)), data, offsets, timeout_ms=timeout_ms, insert_id=insert_id, chunks=chunks
    )


# Since protocol 6 a reference past the request's chunks may be a chunk key (docs/protocol.md, "Step chunks and
# sequence items"); these are none (a tag of epoch or generation 0), so they stay INVALID_ARGUMENT at decode time.
@pytest.mark.parametrize("bad_ref", [2**40, 2, 2**32, 2**63], ids=["2^40", "2", "2^32", "2^63"])
def test_a_repeated_insert_id_with_a_bad_chunk_reference_is_refused_and_the_server_keeps_serving(
    start_server, raw_socket, bad_ref
):
    srv = start_server()
    peer = Peer(srv, raw_socket(srv.endpoint))
    first = peer.request(chunked_insert(1, [[0], [0, 1]], insert_id=(0xA, 1)), P.Op.INSERT, 1).raise_for_status()
    keys = [int(k) for k in first.arrays["keys"]]
    assert len(keys) == 2
    before = peer.stats(2)

    # The same insert id; the frames pass the framing rules, but item 1 names a chunk the request lacks.
    again = peer.request(chunked_insert(3, [[0], [1, bad_ref]], insert_id=(0xA, 1)), P.Op.INSERT, 3)
    assert again.status == P.Status.INVALID_ARGUMENT, (again.status, again.message)
    assert f"references chunk {bad_ref}: neither one of the 2 chunks sent nor a chunk key" in (again.message or "")

    after = peer.stats(4)
    assert after["size"] == before["size"] == 2 and after["bytes_held"] == before["bytes_held"]
    assert after["max_item_bytes"] == before["max_item_bytes"]  # nothing stored: no reply-size estimate grows
    # The id still gives the first request's keys back; the server serves on.
    retry = peer.request(chunked_insert(5, [[0], [0, 1]], insert_id=(0xA, 1)), P.Op.INSERT, 5).raise_for_status()
    assert [int(k) for k in retry.arrays["keys"]] == keys
    sample = peer.request(P.encode_sample(6, 4, 0.4), P.Op.SAMPLE, 6).raise_for_status()
    assert {int(k) for k in sample.arrays["keys"]} <= set(keys)


@pytest.mark.parametrize("timeout_ms", [0, 1000])
def test_an_invalid_chunk_reference_under_the_rate_limiter_is_invalid_argument_at_once(
    start_server, raw_socket, timeout_ms
):
    srv = start_server("--samples-per-insert", "1", "--error-buffer", "10")
    peer = Peer(srv, raw_socket(srv.endpoint))
    data, offsets = P.pack_items([b"x" * 8] * 11)
    peer.request(P.encode_insert(1, np.ones(11), data, offsets), P.Op.INSERT, 1).raise_for_status()
    # The limiter now holds inserts back (no sampler): a valid INSERT is TIMEOUT at once ...
    data, offsets = P.pack_items([b"y"])
    held = peer.request(P.encode_insert(2, np.ones(1), data, offsets), P.Op.INSERT, 2)
    assert held.status == P.Status.TIMEOUT and "rate limited" in (held.message or ""), held.message
    waits = peer.stats(3)["rate_limiter_waits_insert"]

    # ... but an INSERT that references chunk 2 of 2 can never be served: INVALID_ARGUMENT, without waiting.
    bad = peer.request(chunked_insert(4, [[0, 1], [2]], timeout_ms=timeout_ms), P.Op.INSERT, 4)
    assert bad.status == P.Status.INVALID_ARGUMENT, (bad.status, bad.message)
    assert "references chunk 2: neither one of the 2 chunks sent nor a chunk key" in (bad.message or "")
    s = peer.stats(5)
    assert s["rate_limiter_waits_insert"] == waits and s["deferred"] == 0 and s["size"] == 11


@pytest.mark.parametrize("bad_ref", [2**32, 2**63])
def test_the_refusal_names_the_chunk_reference_sent(start_server, raw_socket, bad_ref):
    srv = start_server()
    peer = Peer(srv, raw_socket(srv.endpoint))
    bad = peer.request(chunked_insert(1, [[0, 1], [bad_ref]]), P.Op.INSERT, 1)
    assert bad.status == P.Status.INVALID_ARGUMENT
    assert f"references chunk {bad_ref}: neither one of the 2 chunks sent" in (bad.message or ""), bad.message
    assert "4294967295" not in (bad.message or "")
