"""The replay clients' public surface is the user's API, about the size of Reverb's ``Client``: the calls on items
and tables, the helpers, the client's lifetime and the settings it was made with. What the sharded client and the
inserter call to pipeline requests carries a leading underscore, so a new public name is a deliberate change of
this list, not a side effect."""

from __future__ import annotations

import inspect

import pytest

from apexrl.replay.client.api import PipelinedReplay
from apexrl.replay.client.replay_client import ReplayClient
from apexrl.replay.client.sharded import ShardedReplayClient

COMMON = {
    # items: Reverb's insert, sample and mutate_priorities, plus erase, eviction and the id of a retried insert
    "insert",
    "sample",
    "update_priorities",
    "erase",
    "remove_to_fit",
    "next_insert_id",
    # a slices table's whole episode (a set of servers refuses it: a slices table lives on one server)
    "insert_episode",
    # Reverb's reset and checkpoint: one server's table and snapshot, or every server's of a set
    "reset",
    "checkpoint",
    # the replay: its tables (configuration and counters) and its STATS
    "tables",
    "stats",
    # the helpers, each on connections of its own
    "sampler",
    "inserter",
    "updater",
    "writer",
    # lifetime: abandon a call from another thread, close (also by `with`)
    "interrupt",
    "close",
    "closed",
    # what the client was made with
    "endpoint",
    "table",
    "timeout",
}
ONE_SERVER = {
    "hello",  # declare a table's item structure; one server's answer (a set has one per server)
    "server_info",  # that answer: limits, tables, specs
    "transport",  # the connection, shared with the parameter client's base (TransportClient)
}
SET_OF_SERVERS = {"endpoints", "retry_s"}

# Nothing listens on these ports: both clients connect lazily, so nothing is sent.
NOWHERE = ["tcp://127.0.0.1:9", "tcp://127.0.0.1:11"]


def public(obj: object) -> set[str]:
    return {name for name in dir(obj) if not name.startswith("_")}


def test_the_public_names_are_the_users_api():
    with ReplayClient(NOWHERE[0], timeout=1.0) as one, ShardedReplayClient(NOWHERE, timeout=1.0) as many:
        assert public(one) == COMMON | ONE_SERVER, "a new public name on ReplayClient: add it here on purpose"
        assert public(many) == COMMON | SET_OF_SERVERS, "a new public name on ShardedReplayClient: add it here"


CALLS = sorted(name for name in COMMON if callable(getattr(ReplayClient, name, None)))


@pytest.mark.parametrize("name", CALLS)
def test_both_clients_take_the_same_arguments(name):
    def params(cls: type) -> list[tuple[str, object, object]]:
        return [(p.name, p.kind, p.default) for p in inspect.signature(getattr(cls, name)).parameters.values()]

    assert params(ReplayClient) == params(ShardedReplayClient)


def test_the_pipelines_calls_are_underscored_and_both_clients_have_them():
    calls = [n for n, v in vars(PipelinedReplay).items() if inspect.isfunction(v) and not n.startswith("__")]
    assert calls and all(n.startswith("_") for n in calls)
    with ReplayClient(NOWHERE[0], timeout=1.0) as one, ShardedReplayClient(NOWHERE, timeout=1.0) as many:
        assert isinstance(one, PipelinedReplay) and isinstance(many, PipelinedReplay)
        for client in (one, many):  # the inserter's optional calls: split over the limit, a set's lost server
            assert callable(client._insert_limit)
        assert callable(many._insert_unanswered)
