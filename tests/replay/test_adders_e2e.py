"""The adders (apexrl.replay.adders) end to end: into tables of a real in-process ReplayServer on 127.0.0.1, then
sampled back and held to the plain reference loops of tests/replay/test_adders.py (imported, not copied).

- TransitionAdder / NStepTransitionAdder into a FIFO table (a sample of every item returns them oldest first: the
  reference's items in its order) and into a uniform table (draws with replacement: every sampled key's fields
  equal the reference item inserted under that key, recorded by a pass-through client).
- ``priority=None``: each item gets the table's largest priority so far (read back from a snapshot of the store).
- SequenceAdder / EpisodeAdder through the real writer into a FIFO table: sampled ``.fields`` / ``.mask`` /
  extras equal the reference's items (sequences shorter than the table's length padded, mask False there).

Each hypothesis example gets a fresh table: a table's structure is pinned by its first insert.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apexrl.replay import (
    EpisodeAdder,
    NStepTransitionAdder,
    ReplayClient,
    ReplayServer,
    SequenceAdder,
    ServerConfig,
    TableConfig,
    TransitionAdder,
)
from tests.replay.test_adders import canon, episodes, play, ref_sequences, ref_steps, ref_transitions
from tests.server.test_structured import held_priorities

EXAMPLES = 15  # per hypothesis test; a fresh table each


class KeyRecordingClient:
    """Passes ``insert`` to a real client and records the keys each insert returned, in order (the adders
    discard them): key i belongs to the i-th item the adder inserted."""

    def __init__(self, client: ReplayClient):
        self.client = client
        self.keys: list[int] = []

    def insert(self, priorities: Any, items: Any, table: str = "default") -> np.ndarray:
        keys = self.client.insert(priorities, items, table=table)
        self.keys += [int(k) for k in keys]
        return keys


def rows(fields: Any, n: int) -> list[Any]:
    """Unstack a sampled ``.fields`` mapping into n items."""

    def row(tree: Any, i: int) -> Any:
        return {k: row(v, i) for k, v in tree.items()} if isinstance(tree, dict) else tree[i]

    return [row(fields, i) for i in range(n)]


def item_canon(item: Any) -> Any:
    """canon() of an item, actions and observations as the server returns them: numbers as numpy arrays of the
    dtype numpy.asarray gives them (a Python int action comes back int64)."""
    if isinstance(item, dict):
        return {k: item_canon(v) for k, v in sorted(item.items())}
    return canon(np.asarray(item))


_tables = {"fifo": iter(range(100)), "uniform": iter(range(100)), "prio": iter(range(100))}


@pytest.fixture(scope="module")
def server():
    tables = [TableConfig("default")]
    for kind in ("fifo", "uniform"):
        tables += [TableConfig(f"{kind}{i}", sampler=kind, capacity=10_000) for i in range(4 * EXAMPLES)]
    tables += [TableConfig(f"prio{i}", sampler="uniform", capacity=10_000) for i in range(4)]
    with ReplayServer(ServerConfig(port=0, tables=tables)) as srv:
        yield srv


def _run_transitions(server, kind, eps, n, gamma, insert_batch, priority):
    table = f"{kind}{next(_tables[kind])}"
    expected = [item for item, _ in ref_transitions(eps, n, gamma)]
    with ReplayClient(server.endpoint, timeout=30) as real:
        client = KeyRecordingClient(real)
        if n == 1 and gamma == 1.0:
            adder: NStepTransitionAdder = TransitionAdder(client, table, priority, insert_batch=insert_batch)
        else:
            adder = NStepTransitionAdder(client, table, n, gamma, priority, insert_batch=insert_batch)
        play(adder, eps)
        adder.close()
        assert len(client.keys) == len(expected) == real.tables()[table]["size"]
        if not expected:
            return
        want = {key: item_canon(item) for key, item in zip(client.keys, expected)}
        if kind == "fifo":
            batch = real.sample(len(expected), table=table)  # FIFO: every item once, oldest first
            assert [int(k) for k in batch.keys] == client.keys
            assert [item_canon(r) for r in rows(batch.fields, len(expected))] == [item_canon(i) for i in expected]
        else:
            batch = real.sample(4 * len(expected), table=table)  # with replacement: each draw one of the items
            for key, got in zip(batch.keys.tolist(), rows(batch.fields, len(batch.keys))):
                assert item_canon(got) == want[int(key)]
            assert np.all(batch.weights == 1.0)


TRANSITION_ARGS = dict(
    eps=episodes(max_len=8, ends=("terminated", "truncated", "reset", "truncate")),
    n=st.integers(1, 4),
    gamma=st.sampled_from([0.5, 0.9, 1.0]),
    insert_batch=st.integers(1, 4),
    priority=st.sampled_from([None, 0.5]),
)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**TRANSITION_ARGS)
def test_transition_adders_into_a_fifo_table_give_the_reference_items_in_order(
    server, eps, n, gamma, insert_batch, priority
):
    _run_transitions(server, "fifo", eps, n, gamma, insert_batch, priority)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(**TRANSITION_ARGS)
def test_transition_adders_into_a_uniform_table_give_the_reference_items_by_key(
    server, eps, n, gamma, insert_batch, priority
):
    _run_transitions(server, "uniform", eps, n, gamma, insert_batch, priority)


def test_priority_none_gives_the_tables_largest_priority_so_far(server, tmp_path):
    table = f"prio{next(_tables['prio'])}"
    obs = [np.array([t, 0.5], np.float32) for t in range(7)]
    with ReplayClient(server.endpoint, timeout=30) as real:
        client = KeyRecordingClient(real)
        adder = TransitionAdder(client, table, None, insert_batch=2)
        adder.add_first(obs[0])
        adder.add(0, 1.0, obs[1], False, False)
        adder.add(1, 1.0, obs[2], False, False)  # 2 items: an empty table gives 1.0
        first = list(client.keys)
        explicit = TransitionAdder(client, table, 7.5, insert_batch=1)  # a larger priority given to the table
        explicit.add_first(obs[0])
        explicit.add(0, 0.0, obs[1], True, False)
        adder.add(2, 1.0, obs[3], False, False)
        adder.add(3, 1.0, obs[4], False, False)  # 2 more items: 7.5 now
        second = client.keys[len(first) + 1 :]
        assert real.update_priorities(np.array(first[:1], np.uint64), np.array([9.25]), table=table) == 1
        adder.add(4, 1.0, obs[5], False, False)
        adder.add(5, 1.0, obs[6], True, False)  # 2 more: 9.25, given by update_priorities
        adder.close()
        third = client.keys[len(first) + 1 + len(second) :]
    held = held_priorities(server, table, tmp_path)
    assert [held[k] for k in first] == [9.25, 1.0]
    assert [held[k] for k in second] == [7.5, 7.5]
    assert [held[k] for k in third] == [9.25, 9.25]


# --------------------------------------------------------------------------------------------- through the writer


def sequence_rows(batch: Any, i: int, length: int) -> list[Any]:
    """Item i of a sampled sequence batch as its first ``length`` step mappings."""

    def at(tree: Any, j: int) -> Any:
        return {k: at(v, j) for k, v in tree.items()} if isinstance(tree, dict) else tree[i, j]

    return [at(batch.fields, j) for j in range(length)]


def extras_row(batch: Any, i: int) -> Any:
    def at(tree: Any) -> Any:
        return {k: at(v) for k, v in tree.items()} if isinstance(tree, dict) else tree[i]

    return at(batch.extras) if batch.extras else None


def check_sequence_items(client: ReplayClient, table: str, expected: list[tuple[list[dict], Any]], t_max: int):
    """Sample every item of a FIFO table (oldest first) and hold each to its reference (steps, extras)."""
    assert client.tables()[table]["size"] == len(expected)
    if not expected:
        return
    batch = client.sample(len(expected), table=table)
    assert batch.mask.shape == (len(expected), t_max)
    for i, (steps, extras) in enumerate(expected):
        assert batch.mask[i].tolist() == [True] * len(steps) + [False] * (t_max - len(steps))
        assert [item_canon(s) for s in sequence_rows(batch, i, len(steps))] == [item_canon(s) for s in steps]
        if extras is None:
            assert extras_row(batch, i) in (None, {})
        else:
            assert item_canon(extras_row(batch, i)) == item_canon(extras)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    eps=episodes(max_len=10, ends=("terminated", "truncated", "reset")),
    length=st.integers(1, 5),
    period_frac=st.integers(1, 5),
    pad=st.booleans(),
)
def test_sequence_adder_through_the_writer_gives_the_reference_items(server, eps, length, period_frac, pad):
    period = min(period_frac, length)
    table = f"fifo{next(_tables['fifo'])}"
    with ReplayClient(server.endpoint, timeout=30) as client:
        adder = SequenceAdder(client, table, length, period, pad_end_of_episode=pad)
        play(adder, eps)
        adder.flush(timeout=30)
        adder.close()
        check_sequence_items(client, table, ref_sequences(eps, length, period, pad), length)


@settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(eps=episodes(max_len=10, ends=("terminated", "truncated", "reset")), priority=st.sampled_from([None, 1.5]))
def test_episode_adder_through_the_writer_gives_the_reference_items(server, eps, priority):
    table = f"fifo{next(_tables['fifo'])}"
    with ReplayClient(server.endpoint, timeout=30) as client:
        adder = EpisodeAdder(client, table, 11, priority=priority)  # every script fits: at most 10 actions
        play(adder, eps)
        adder.flush(timeout=30)
        adder.close()
        check_sequence_items(client, table, [(ref_steps(ep), ep.extras[0]) for ep in eps if ep.ended], 11)


def test_writer_items_with_priority_none_get_the_tables_largest_priority(server, tmp_path):
    """The sequence adders' default priority (None) through the writer: items of one flush that mix None and
    numbers each get what insert would give them, in order (a request per run of either kind)."""
    table = f"fifo{next(_tables['fifo'])}"
    with ReplayClient(server.endpoint, timeout=30) as client:
        with client.writer(max_sequence_length=2, flush_items=100) as w:
            for t, priority in enumerate((None, 3.0, None, None, 5.0, None)):
                w.append({"x": np.full(2, t, np.float32)})
                w.create_item(table, 1, priority)  # pending until the flush: one flush, several kinds
            w.flush(timeout=30)
        batch = client.sample(6, table=table)  # FIFO: oldest first
        assert batch.fields["x"][:, 0, 0].tolist() == [0, 1, 2, 3, 4, 5]
        held = held_priorities(server, table, tmp_path)
    assert [held[int(k)] for k in batch.keys] == [1.0, 3.0, 3.0, 3.0, 5.0, 5.0]


@pytest.mark.parametrize("make", [lambda c, t: SequenceAdder(c, t, 3, 1), lambda c, t: EpisodeAdder(c, t, 10)])
def test_writer_adders_refuse_extras_the_writer_cannot_store_and_change_nothing(server, make):
    table = f"fifo{next(_tables['fifo'])}"
    with ReplayClient(server.endpoint, timeout=30) as client:
        adder = make(client, table)
        adder.add_first(np.zeros(2, np.float32))
        adder.add(0, 1.0, np.ones(2, np.float32), False, False, extras={"h": np.zeros(2, np.float32)})
        with pytest.raises(ValueError, match="extras must be None or a mapping"):
            adder.add(1, 1.0, np.ones(2, np.float32), False, False, extras=np.zeros(2, np.float32))
        assert adder.in_episode
        adder.add(1, 2.0, np.full(2, 2.0, np.float32), True, False, extras={"h": np.ones(2, np.float32)})
        adder.flush(timeout=30)
        adder.close()
        size = client.tables()[table]["size"]
        batch = client.sample(size, table=table)
        assert batch.fields["reward"][-1][:2].tolist() == [1.0, 2.0]  # the refused step left no trace


def test_per_step_extras_and_discounts_through_the_writer(server):
    """extras_per="both": every step's extras sampled with a time axis (``.fields["extras"]``, zeros on the last
    observation and the padding) and the first step's as the per-item ``.extras``; the discount input per step."""
    table = f"fifo{next(_tables['fifo'])}"
    with ReplayClient(server.endpoint, timeout=30) as client:
        adder = SequenceAdder(client, table, 3, 3, extras_per="both", start_of_episode=True)
        adder.add_first(np.zeros(2, np.float32))
        for t in range(4):
            logits = np.array([t, -t], np.float32)
            adder.add(t, 1.0, np.full(2, t + 1, np.float32), t == 3, False, extras={"logits": logits}, discount=0.5)
        adder.flush(timeout=30)
        adder.close()
        batch = client.sample(2, table=table)  # FIFO: steps 0-2, then 3, the last observation, one padding step
    f = batch.fields
    assert f["extras"]["logits"].shape == (2, 3, 2)
    assert f["extras"]["logits"][:, :, 0].tolist() == [[0, 1, 2], [3, 0, 0]]
    assert batch.extras["logits"].tolist() == [[0, 0], [3, -3]]  # the first step's, once per item
    assert f["discount"].tolist() == [[0.5, 0.5, 0.5], [0.0, 0.0, 0.0]]
    assert f["start_of_episode"].tolist() == [[True, False, False], [False, False, False]]
    assert f["action"].tolist() == [[0, 1, 2], [3, 0, 0]]
