"""Structured items on real replay servers on 127.0.0.1: a nested mapping of numpy arrays
or torch tensors goes in with ``client.insert``, pins its table's structure (a TransitionSpec, one per table,
through HELLO's table index), comes back as ``batch.fields`` / ``ReplayDataset(decode="structure")``; a batch
of another structure is refused client-side naming the field, with nothing sent; two clients declaring at once:
one wins; the structure survives a snapshot and restart; ``priorities=None`` gives each item the table's largest
priority so far (held to a reference model); the old call forms are unchanged."""

from __future__ import annotations

import json
import os
import threading

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from apexrl.errors import ServerError
from apexrl.offline.export import read_snapshot
from apexrl.replay import ReplayClient, ReplayServer, ServerConfig
from apexrl.replay.server.insert_guard import spec_sidecar
from apexrl.replay.tables import TableConfig
from apexrl.replay.wire import protocol as P
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec
from apexrl.replay.wire.schema import Status
from apexrl.replay.wire.structure import flatten, infer_spec, structure_mismatch, unflatten

DTYPES = ("bool", "uint8", "int8", "int16", "int32", "int64", "uint16", "float16", "float32", "float64")


def fifo_tables(prefix: str, count: int) -> list[TableConfig]:
    """FIFO tables: a sample of n returns the n oldest items, in order (a round trip compares exactly)."""
    return [TableConfig(f"{prefix}{i}", sampler="fifo", capacity=10_000) for i in range(count)]


def nested_equal(a, b) -> None:
    assert isinstance(a, dict) == isinstance(b, dict), (a, b)
    if isinstance(a, dict):
        assert set(a) == set(b)
        for k in a:
            nested_equal(a[k], b[k])
    else:
        want = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
        assert b.dtype == want.dtype and b.shape == want.shape
        np.testing.assert_array_equal(b, want)


def random_array(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "f":
        return rng.standard_normal(shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), size=shape, dtype=dtype)


@st.composite
def structures(draw):
    """A nested mapping description: {key: (dtype, per-item shape) or {key: (dtype, shape)}}."""
    names = st.sampled_from(["obs", "action", "reward", "pixels", "state", "h", "c", "extras", "x1"])
    leaf = st.tuples(st.sampled_from(DTYPES), st.lists(st.integers(0, 3), max_size=3).map(tuple))
    inner = st.dictionaries(names, leaf, min_size=1, max_size=3)
    return draw(st.dictionaries(names, st.one_of(leaf, inner), min_size=1, max_size=4))


def build(desc, n: int, rng: np.random.Generator, as_torch: bool):
    out = {}
    for k, v in desc.items():
        if isinstance(v, dict):
            out[k] = build(v, n, rng, as_torch)
        else:
            arr = random_array(rng, v[0], (n, *v[1]))
            # torch has no uint16 arithmetic worth testing here; keep those numpy in a torch batch
            out[k] = torch.from_numpy(arr) if as_torch and v[0] != "uint16" else arr
    return out


# ---------------------------------------------------------------------------------- the codec, without a server


@settings(max_examples=200, deadline=None)
@given(structures(), st.integers(1, 6), st.integers(0, 2**32 - 1), st.booleans())
def test_flatten_infer_encode_decode_unflatten_round_trips(desc, n, seed, as_torch):
    batch = build(desc, n, np.random.default_rng(seed), as_torch)
    flat = flatten(batch)
    spec = infer_spec(flat)
    assert structure_mismatch(spec, flat) is None
    assert list(spec.names) == sorted(flat)  # key order does not change the spec
    assert infer_spec(dict(reversed(list(flat.items())))) == spec
    data, offsets = spec.encode(flat)
    nested_equal(batch, unflatten(spec.decode(data, offsets)))
    nested_equal(batch, unflatten(spec.decode_into(data, offsets, spec.empty_batch(n))))


def test_dotted_names_are_allowed_and_old_fingerprints_are_unchanged():
    # the Ape-X presets' specs: the same JSON, so the same fingerprints as before dotted names existed
    assert (
        TransitionSpec.dpg(3, 1).fingerprint == TransitionSpec.from_json(TransitionSpec.dpg(3, 1).to_json()).fingerprint
    )
    assert "." not in TransitionSpec.atari().to_json().split('"name"')[1].split(",")[0]
    assert FieldSpec("obs.pixels.left", "u1", (2,)).name == "obs.pixels.left"
    for bad in ("obs.", ".obs", "obs..x", "1obs.x", "obs.1x", "a" * 65, "o" * 30 + "." + "p" * 34):
        with pytest.raises(ValueError, match="field name"):
            FieldSpec(bad, "f4")
    with pytest.raises(ValueError, match="not an ASCII identifier"):
        flatten({"obs": {"a-b": np.zeros(1)}})
    with pytest.raises(ValueError, match="empty mapping"):
        flatten({"obs": {}})
    with pytest.raises(ValueError, match="numeric or bool"):
        flatten({"obs": np.array(["x"])})


def test_an_old_spec_fingerprint_is_pinned():
    # this crc32 is what every server and snapshot since format version 1 has for the DPG preset at (3, 1)
    spec = TransitionSpec.dpg(3, 1)
    import zlib

    assert spec.fingerprint == zlib.crc32(spec.to_json().encode("ascii")) & 0xFFFFFFFF
    assert spec.to_json().startswith('{"fields":[{"compress":false,"dtype":"<f4","name":"obs","shape":[3]}')


# ------------------------------------------------------------------------------------------- on a real server


@pytest.fixture(scope="module")
def many():
    """One server with 40 FIFO tables (a fresh table per hypothesis example: a table's structure is pinned for
    the server's life), a raw-bytes `default`."""
    with ReplayServer(ServerConfig(port=0, tables=[TableConfig("default"), *fifo_tables("t", 40)])) as srv:
        yield srv


_next_table = iter(range(40))


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(structures(), st.integers(1, 5), st.integers(0, 2**32 - 1), st.booleans())
def test_a_nested_mapping_round_trips_through_a_server(many, desc, n, seed, as_torch):
    table = f"t{next(_next_table)}"
    rng = np.random.default_rng(seed)
    first, second = build(desc, n, rng, as_torch), build(desc, n + 1, rng, not as_torch)
    with ReplayClient(many.endpoint, timeout=10, table=table) as c:
        assert c.tables()[table]["spec"] is None
        assert len(c.insert(np.ones(n), first)) == n
        assert len(c.insert(np.ones(n + 1), second)) == n + 1
        pinned = TransitionSpec.from_json(json.dumps(c.tables()[table]["spec"]))
        assert pinned == infer_spec(flatten(first))
        batch = c.sample(2 * n + 1)  # FIFO: every item once, in insertion order
        assert batch.spec == pinned and len(batch.weights) == len(batch.probabilities) == 2 * n + 1
        got = batch.fields
        nested_equal(first, _rows(got, 0, n))
        nested_equal(second, _rows(got, n, 2 * n + 1))


def _rows(tree, lo: int, hi: int):
    return {k: _rows(v, lo, hi) if isinstance(v, dict) else v[lo:hi] for k, v in tree.items()}


def test_mismatches_are_refused_naming_the_field_and_nothing_is_sent(many):
    table = f"t{next(_next_table)}"
    good = {"obs": {"pixels": np.zeros((2, 3, 3), np.uint8), "vec": np.zeros((2, 4), np.float32)}, "r": np.ones(2)}
    with ReplayClient(many.endpoint, timeout=10) as c:
        c.insert(np.ones(2), good, table=table)
        before = c.stats()
        cases = {
            "missing field(s) ['obs.vec']": {"obs": {"pixels": good["obs"]["pixels"]}, "r": good["r"]},
            "extra field(s) ['obs.depth']": {"obs": {**good["obs"], "depth": np.zeros((2, 1))}, "r": good["r"]},
            "field 'obs.vec': dtype float64, the table's structure has float32": {
                "obs": {**good["obs"], "vec": np.zeros((2, 4))},
                "r": good["r"],
            },
            "field 'obs.pixels': per-item shape (3, 4), the table's structure has (3, 3)": {
                "obs": {**good["obs"], "pixels": np.zeros((2, 3, 4), np.uint8)},
                "r": good["r"],
            },
            "field 'r': leading (batch) dimension 3": {"obs": good["obs"], "r": np.ones(3)},
        }
        for message, batch in cases.items():
            with pytest.raises(ValueError, match=r"table 't\d+' refused, nothing sent: .*" + _re(message)):
                c.insert(np.ones(2), batch, table=table)
        # a dtype that casts safely (uint8 into float32) fits, as TransitionSpec.encode casts it
        c.insert(np.ones(2), {"obs": {**good["obs"], "vec": np.ones((2, 4), np.uint8)}, "r": good["r"]}, table=table)
        after = c.stats()
        assert after[f"table.{table}.inserted"] == before[f"table.{table}.inserted"] + 2
        assert after["requests_insert"] == before["requests_insert"] + 1  # the refused ones never left


def _re(text: str) -> str:
    import re

    return re.escape(text)


def test_two_tables_of_different_structures_and_a_raw_table_on_one_server(many):
    a, b = f"t{next(_next_table)}", f"t{next(_next_table)}"
    with ReplayClient(many.endpoint, timeout=10) as c:
        c.insert(np.ones(3), {"obs": np.arange(6, dtype=np.float32).reshape(3, 2), "a": np.arange(3)}, table=a)
        c.insert(np.ones(2), {"state": {"h": torch.ones(2, 5), "c": torch.zeros(2, 5)}, "t": torch.arange(2)}, table=b)
        c.insert(np.ones(2), [b"raw0", b"raw1"])  # `default`: no structure, bytes as today
        tables = c.tables()
        assert [f["name"] for f in tables[a]["spec"]["fields"]] == ["a", "obs"]
        assert [f["name"] for f in tables[b]["spec"]["fields"]] == ["state.c", "state.h", "t"]
        assert tables["default"]["spec"] is None
        fa, fb = c.sample(3, table=a).fields, c.sample(2, table=b).fields
        np.testing.assert_array_equal(fa["obs"], np.arange(6, dtype=np.float32).reshape(3, 2))
        assert set(fb) == {"state", "t"} and fb["state"]["h"].shape == (2, 5) and fb["t"].dtype == np.int64
        raw = c.sample(4)
        assert raw.spec is None and {bytes(x) for x in raw.items} <= {b"raw0", b"raw1"}
        with pytest.raises(ValueError, match="no pinned structure"):
            _ = raw.fields
        # a's structure does not fit b, and the server refuses a HELLO that declares another one for a
        with pytest.raises(ValueError, match=r"missing field\(s\) \['state.c', 'state.h', 't'\]"):
            c.insert(np.ones(1), {"obs": np.zeros((1, 2), np.float32), "a": np.zeros(1, np.int64)}, table=b)
        other = TransitionSpec([FieldSpec("x", "f4")])
        with pytest.raises(ServerError, match=rf"differs from the server's spec .* for table '{a}'") as info:
            c.hello(other, table=a)
        assert info.value.status == Status.INVALID_ARGUMENT


def test_two_clients_declaring_different_structures_at_once_one_wins(many):
    for _round in range(3):
        table = f"t{next(_next_table)}"
        barrier = threading.Barrier(2)
        outcome: dict[int, object] = {}

        def declare(i: int) -> None:
            batch = {"x": np.full((2, 1 + i), i, np.float32)}
            with ReplayClient(many.endpoint, timeout=10) as c:
                c.server_info  # noqa: B018 - connect and learn the tables before the race
                barrier.wait()
                try:
                    c.insert(np.ones(2), batch, table=table)
                    outcome[i] = "stored"
                except ValueError as exc:
                    outcome[i] = exc

        threads = [threading.Thread(target=declare, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        assert sorted(str(type(v).__name__) for v in outcome.values()) == ["ValueError", "str"], outcome
        winner = next(i for i, v in outcome.items() if v == "stored")
        loser = outcome[1 - winner]
        assert f"per-item shape ({2 - winner},), the table's structure has ({1 + winner},)" in str(loser)
        with ReplayClient(many.endpoint, timeout=10) as c:
            assert c.tables()[table]["spec"]["fields"][0]["shape"] == [1 + winner]
            assert c.tables()[table]["size"] == 2
            assert (c.sample(2, table=table).fields["x"] == winner).all()


def test_a_raw_hello_naming_an_unknown_table_is_refused(many):
    import zmq

    sock = zmq.Context.instance().socket(zmq.DEALER)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(many.endpoint)
    try:
        sock.send_multipart(P.encode_hello(3, TransitionSpec([FieldSpec("x", "f4")]).to_json(), table=999))
        assert sock.poll(10_000)
        reply = P.decode_reply(sock.recv_multipart(), P.Op.HELLO, 3)
        assert reply.status == Status.INVALID_ARGUMENT and "unknown table index 999" in (reply.message or "")
    finally:
        sock.close()


def test_the_structure_survives_a_snapshot_and_restart(tmp_path):
    snap = str(tmp_path / "replay.snap")
    tables = [TableConfig("default"), TableConfig("seq", sampler="fifo")]
    batch = {"obs": {"pixels": np.arange(24, dtype=np.uint8).reshape(2, 3, 4)}, "done": np.array([True, False])}
    with ReplayServer(ServerConfig(port=0, tables=tables, snapshot=snap)) as srv:
        with ReplayClient(srv.endpoint, timeout=10) as c:
            c.insert(np.ones(2), batch, table="seq")
            c.insert(np.ones(1), {"v": np.ones((1, 2), np.float32)})  # `default` pinned too
    assert os.path.exists(spec_sidecar(snap, "seq")) and spec_sidecar(snap, "seq").endswith(".table-seq.spec.json")
    assert spec_sidecar(snap) == snap + ".spec.json" and os.path.exists(snap + ".spec.json")  # the old name
    with ReplayServer(ServerConfig(port=0, tables=tables, snapshot=snap)) as srv:
        with ReplayClient(srv.endpoint, timeout=10) as c:
            tables_now = c.tables()
            assert [f["name"] for f in tables_now["seq"]["spec"]["fields"]] == ["done", "obs.pixels"]
            assert [f["name"] for f in tables_now["default"]["spec"]["fields"]] == ["v"]
            nested_equal(batch, c.sample(2, table="seq").fields)
            with pytest.raises(ValueError, match="missing field"):
                c.insert(np.ones(1), {"obs": {"pixels": np.zeros((1, 3, 4), np.uint8)}}, table="seq")
            # the server's own check: a foreign item sent as bytes is refused there too
            with pytest.raises(ServerError, match="INSERT refused, nothing stored"):
                c.insert(np.ones(1), [b"\0" * 9], table="seq")
    # a configured spec that differs from the one kept with the snapshot is refused at start
    other = [TableConfig("default"), TableConfig("seq", spec=TransitionSpec([FieldSpec("x", "f4")]))]
    with pytest.raises(ValueError, match="table 'seq': spec .* differs from the spec .* kept with the snapshot"):
        ReplayServer(ServerConfig(port=0, tables=other, snapshot=snap))


def test_a_table_configured_with_a_spec_starts_pinned():
    spec = TransitionSpec([FieldSpec("obs.x", "f4", (2,)), FieldSpec("a", "i8")])
    tables = [TableConfig("default"), TableConfig("cfg", sampler="fifo", spec=spec)]
    with ReplayServer(ServerConfig(port=0, tables=tables)) as srv, ReplayClient(srv.endpoint, timeout=10) as c:
        assert TransitionSpec.from_json(json.dumps(c.tables()["cfg"]["spec"])) == spec
        with pytest.raises(ValueError, match=r"field 'a': dtype float32, the table's structure has int64"):
            c.insert(
                np.ones(1), {"obs": {"x": np.zeros((1, 2), np.float32)}, "a": np.zeros(1, np.float32)}, table="cfg"
            )
        c.insert(np.ones(1), {"obs": {"x": np.ones((1, 2), np.float32)}, "a": np.array([7])}, table="cfg")
        assert c.sample(1, table="cfg").fields["a"].tolist() == [7]


# ------------------------------------------------------------------------------------------- priorities=None


def held_priorities(srv: ReplayServer, table: str, tmp_path) -> dict[int, float]:
    """Every item's priority in a table of an in-process server, read from a snapshot of its store."""
    path = str(tmp_path / f"{table}.prio.snap")
    next(t for t in srv.tables if t.name == table).store.save(path)
    items = read_snapshot(path)
    return dict(zip(items.keys.tolist(), items.priorities.tolist()))


OPS = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(0, 50).map(float), min_size=1, max_size=4)),
        st.tuples(st.just("insert_max"), st.integers(1, 4)),
        st.tuples(st.just("update"), st.integers(0, 10_000), st.integers(0, 60).map(float)),
    ),
    min_size=1,
    max_size=12,
)


@pytest.fixture(scope="module")
def prio():
    tables = [TableConfig("default"), *[TableConfig(f"p{i}", capacity=10_000) for i in range(30)]]
    with ReplayServer(ServerConfig(port=0, tables=tables)) as srv:
        yield srv


_next_prio = iter(range(30))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(OPS)
def test_priorities_none_gives_the_largest_priority_so_far(prio, tmp_path, ops):
    """Reference model: the largest priority the table was given (INSERT or UPDATE_PRIORITIES), 1.0 before any."""
    table = f"p{next(_next_prio)}"
    largest: float | None = None
    want: dict[int, float] = {}
    item = {"x": np.zeros((1, 2), np.float32)}
    with ReplayClient(prio.endpoint, timeout=10, table=table) as c:
        for op in ops:
            if op[0] == "insert":
                ps = op[1]
                keys = c.insert(np.array(ps), {"x": np.zeros((len(ps), 2), np.float32)})
                want.update(zip(keys.tolist(), ps))
                largest = max([*ps, largest] if largest is not None else ps)
            elif op[0] == "insert_max":
                keys = c.insert(None, {"x": np.zeros((op[1], 2), np.float32)})
                value = 1.0 if largest is None else largest
                want.update(dict.fromkeys(keys.tolist(), value))
            elif want:
                key = sorted(want)[op[1] % len(want)]
                assert c.update_priorities(np.array([key], np.uint64), np.array([op[2]])) == 1
                want[key] = op[2]
                largest = op[2] if largest is None else max(largest, op[2])
        c.insert(None, item)  # one more, so the last state is checked too
    assert set(held_priorities(prio, table, tmp_path).values()) >= {1.0 if largest is None else largest}
    held = held_priorities(prio, table, tmp_path)
    for key, value in want.items():
        assert held[key] == value, (key, held[key], value)


def test_priorities_none_with_concurrent_inserters(prio, tmp_path):
    """4 threads insert explicit priorities and priorities=None at once: every None item gets a priority given
    before it (or 1.0), at least the largest acknowledged before its request went out; the largest is never lost."""
    table = f"p{next(_next_prio)}"
    lock = threading.Lock()
    acked: list[float] = []  # explicit priorities acknowledged so far
    none_items: list[tuple[list[int], float]] = []  # (keys, the largest acknowledged before sending)
    given: set[float] = {1.0}

    def work(i: int) -> None:
        rng = np.random.default_rng(i)
        with ReplayClient(prio.endpoint, timeout=30, table=table) as c:
            for step in range(40):
                if step % 2:
                    with lock:
                        floor = max(acked, default=1.0)
                    keys = c.insert(None, {"x": np.zeros((3, 2), np.float32)})
                    with lock:
                        none_items.append((keys.tolist(), floor))
                else:
                    ps = rng.integers(1, 1000, size=2).astype(float) + i / 10
                    with lock:
                        given.update(ps.tolist())
                    c.insert(ps, {"x": np.zeros((2, 2), np.float32)})
                    with lock:
                        acked.extend(ps.tolist())

    threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not any(t.is_alive() for t in threads)
    with ReplayClient(prio.endpoint, timeout=10, table=table) as c:
        last = c.insert(None, {"x": np.zeros((1, 2), np.float32)})
    held = held_priorities(prio, table, tmp_path)
    assert held[int(last[0])] == max(acked)
    for keys, floor in none_items:
        for key in keys:
            assert held[key] in given and held[key] >= floor


def test_priorities_none_on_the_old_call_forms_and_the_old_forms_unchanged(prio, tmp_path):
    table = f"p{next(_next_prio)}"
    spec = TransitionSpec([FieldSpec("obs", "f4", (2,))])
    with ReplayClient(prio.endpoint, timeout=10, table=table) as c:
        k1 = c.insert(None, [b"a", b"bb"])  # empty table: 1.0
        k2 = c.insert(np.array([3.0]), [b"c"])
        data, offsets = spec.encode({"obs": np.zeros((2, 2), np.float32)})
        k3 = c.insert(None, data=data, offsets=offsets)
        assert c.update_priorities(k1[:1], np.array([8.0])) == 1
        k4 = c.insert(None, items=[b"d"])
        with pytest.raises(ValueError, match="either items or data and offsets"):
            c.insert(None, {"x": np.zeros(1)}, data=data, offsets=offsets)
    held = held_priorities(prio, table, tmp_path)
    assert [held[k] for k in k1.tolist()] == [8.0, 1.0]
    assert held[int(k2[0])] == 3.0 and [held[k] for k in k3.tolist()] == [3.0, 3.0] and held[int(k4[0])] == 8.0


def test_replay_dataset_yields_the_tables_structure(many):
    from apexrl.replay import ReplayDataset

    table = f"t{next(_next_table)}"
    batch = {"obs": {"a": np.arange(8, dtype=np.float32).reshape(4, 2)}, "act": np.arange(4, dtype=np.int32)}
    with ReplayClient(many.endpoint, timeout=10) as c:
        c.insert(None, batch, table=table)
        got = next(iter(ReplayDataset(c, 4, decode="structure", prefetch=1, table=table)))
    assert set(got) == {"keys", "weights", "probabilities", "fields"}
    nested_equal(batch, got["fields"])
    with pytest.raises(TypeError, match="decode must be"):
        ReplayDataset(many.endpoint, 4, decode="atari")


def test_a_client_that_learned_the_tables_before_the_pinning_still_gets_fields(many):
    table = f"t{next(_next_table)}"
    with ReplayClient(many.endpoint, timeout=10) as learner, ReplayClient(many.endpoint, timeout=10) as actor:
        assert learner.tables()[table]["spec"] is None  # learned before any structure
        actor.insert(None, {"obs": np.arange(3, dtype=np.int16)}, table=table)
        before = learner.stats()["requests_hello"]
        batch = learner.sample(3, table=table)
        assert batch.spec is None  # a sample sends nothing more than it always did ...
        assert learner.stats()["requests_hello"] == before
        assert batch.fields["obs"].tolist() == [0, 1, 2]  # ... and .fields asks once
        assert batch.spec is not None and learner.sample(3, table=table).spec == batch.spec
