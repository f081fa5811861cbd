"""Table configuration: TableConfig and its rate limiters, their JSON, ``--tables FILE``, ServerConfig's tables,
and the table flags that build the one table ``default`` (also from a run plan written with them flat)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl._core import PrioritizedStore
from apexrl.replay import MinSize, Queue, SampleToInsertRatio, ServerConfig, TableConfig
from apexrl.replay.server.config import server_config_from_dict, server_config_to_dict
from apexrl.replay.server.table_flags import EVICTION_POLICIES, TABLE_FLAGS, TableFlags, table_from_flags
from apexrl.replay.tables import (
    MAX_TIMES_SAMPLED,
    REMOVER_ALIASES,
    REMOVERS,
    SAMPLER_ALIASES,
    SAMPLERS,
    TableConfigError,
    load_tables,
    rate_limiter_from_json,
    tables_from_json,
)
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

SPECS = [
    TransitionSpec([FieldSpec("obs", np.float32, (4,)), FieldSpec("action", np.int64)]),
    TransitionSpec([FieldSpec("frame", np.uint8, (84, 84), compress=True)]),
]

names = st.text(alphabet="abcXYZ019_.-", min_size=1, max_size=64)
finite = st.floats(allow_nan=False, allow_infinity=False, width=64)
sizes = st.integers(1, 2**63 - 1)


@st.composite
def ratio_limiters(draw: st.DrawFn) -> SampleToInsertRatio:
    spi = draw(st.floats(min_value=1e-6, max_value=1e6, allow_nan=False))
    eb = draw(st.floats(min_value=max(1.0, spi), max_value=1e9, allow_nan=False))
    return SampleToInsertRatio(spi, draw(sizes), eb)


@st.composite
def tables(draw: st.DrawFn) -> TableConfig:
    capacity = draw(st.integers(1, 2**62))
    limiter = draw(
        st.one_of(
            st.none(),
            sizes.map(MinSize),
            ratio_limiters(),
            st.integers(1, capacity).map(Queue),
        )
    )
    return TableConfig(
        draw(names),
        sampler=draw(st.sampled_from(SAMPLERS)),
        remover=draw(st.sampled_from(REMOVERS)),
        capacity=capacity,
        max_size=draw(st.one_of(st.none(), st.integers(capacity, 2**63 - 1))),
        alpha=draw(st.floats(min_value=0.0, max_value=1e6)),
        alpha_evict=draw(finite),
        max_times_sampled=draw(st.integers(0, MAX_TIMES_SAMPLED)),
        rate_limiter=limiter,
        spec=draw(st.sampled_from([None, *SPECS])),
    )


@settings(max_examples=300, deadline=None)
@given(tables())
def test_a_table_round_trips_through_json(table):
    text = json.dumps(table.to_json())  # the form a --tables file holds
    assert TableConfig.from_json(json.loads(text)) == table
    if table.rate_limiter is not None:
        assert rate_limiter_from_json(table.rate_limiter.to_json()) == table.rate_limiter


@settings(max_examples=50, deadline=None)
@given(st.lists(tables(), min_size=1, max_size=4, unique_by=lambda t: t.name))
def test_a_tables_file_round_trips(tmp_path_factory, many):
    path = tmp_path_factory.mktemp("t") / "tables.json"
    path.write_text(json.dumps([t.to_json() for t in many]))
    assert load_tables(path) == many


def test_defaults_are_the_pinned_ones():
    t = TableConfig("default")
    assert (t.sampler, t.remover, t.capacity, t.max_size, t.alpha, t.alpha_evict) == (
        "prioritized",
        "fifo",
        1_000_000,
        None,
        0.6,
        -0.4,
    )
    assert (t.max_times_sampled, t.rate_limiter, t.spec) == (0, None, None)
    assert t.effective_rate_limiter == MinSize(1) and t.effective_max_size == 2_000_000
    assert TableConfig.from_json({"name": "default"}) == t


def test_the_spec_is_a_transition_spec_whatever_form_it_was_given_in(tmp_path):
    spec = SPECS[0]
    path = tmp_path / "spec.json"
    path.write_text(spec.to_json())
    for given_as in (spec, spec.to_json(), str(path)):
        assert TableConfig("t", spec=given_as).spec == spec
    assert TableConfig.from_json({"name": "t", "spec": json.loads(spec.to_json())}).spec == spec
    tables_file = tmp_path / "tables.json"
    tables_file.write_text(json.dumps([{"name": "t", "spec": "spec.json"}]))  # relative to the tables file
    assert load_tables(tables_file)[0].spec == spec


def test_min_heap_is_an_alias_of_lowest_priority_as_in_the_store():
    assert TableConfig("t", remover="min_heap") == TableConfig("t", remover="lowest_priority")
    assert TableConfig("t", remover="min_heap").to_json()["remover"] == "lowest_priority"
    assert PrioritizedStore(capacity=4, eviction="min_heap").eviction == "lowest_priority"


def test_sampler_and_remover_names_and_defaults_are_the_stores():
    """The store's kind tables (through the binding) are the one list: every name and alias a table accepts
    builds a store, a table stores the name the store reports back, and a table's defaults are the store's."""
    for sampler in (*SAMPLERS, *SAMPLER_ALIASES):
        table = TableConfig("t", sampler=sampler)
        assert PrioritizedStore(capacity=4, sampler=sampler).sampler == table.sampler
    for remover in (*REMOVERS, *REMOVER_ALIASES):
        table = TableConfig("t", remover=remover)
        assert PrioritizedStore(capacity=4, eviction=remover).eviction == table.remover
    assert REMOVER_ALIASES == {"min_heap": "lowest_priority"}
    default = PrioritizedStore(capacity=4)
    assert (TableConfig("t").sampler, TableConfig("t").remover) == (default.sampler, default.eviction)
    assert TableFlags().eviction == default.eviction
    assert set(EVICTION_POLICIES) == {*REMOVERS, *REMOVER_ALIASES}
    with pytest.raises(ValueError):
        PrioritizedStore(capacity=4, sampler="random")


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"name": ""}, "name: must be 1 to 64 characters of letters, digits, '_', '.' and '-', got ''"),
        ({"name": "a" * 65}, "name: must be 1 to 64 characters"),
        ({"name": "a b"}, "name: must be 1 to 64 characters of letters, digits, '_', '.' and '-', got 'a b'"),
        ({"name": 3}, "name: must be 1 to 64 characters of letters, digits, '_', '.' and '-', got 3"),
        (
            {"sampler": "random"},
            "table 't': sampler: must be one of prioritized, uniform, fifo, lifo, max_heap, min_heap, got 'random'",
        ),
        (
            {"remover": "lru"},
            "table 't': remover: must be one of fifo, prioritized, lowest_priority, lifo, uniform, max_heap, got 'lru' "
            "(min_heap: an alias of lowest_priority)",
        ),
        ({"capacity": 0}, "table 't': capacity: must be an int in [1, 9223372036854775807], got 0"),
        ({"capacity": True}, "table 't': capacity: must be an int in [1, 9223372036854775807], got True"),
        ({"capacity": 1.5}, "table 't': capacity: must be an int in [1, 9223372036854775807], got 1.5"),
        ({"capacity": 10, "max_size": 9}, "table 't': max_size: must be >= capacity = 10, got 9"),
        ({"max_size": 0}, "table 't': max_size: must be an int in [1, 9223372036854775807] (or null), got 0"),
        ({"alpha": -0.1}, "table 't': alpha: must be a finite number >= 0, got -0.1"),
        ({"alpha": float("nan")}, "table 't': alpha: must be a finite number >= 0, got nan"),
        ({"alpha_evict": float("inf")}, "table 't': alpha_evict: must be a finite number, got inf"),
        ({"max_times_sampled": -1}, "table 't': max_times_sampled: must be an int in [0, 2147483647], got -1"),
        (
            {"rate_limiter": {"kind": "queue", "size": 3}},
            "table 't': rate_limiter: must be MinSize, SampleToInsertRatio, Queue or None, got {'kind': 'queue', "
            "'size': 3} (a JSON object goes through TableConfig.from_json or rate_limiter_from_json)",
        ),
        (
            {"capacity": 10, "rate_limiter": Queue(11)},
            "table 't': rate_limiter: Queue.size 11 exceeds capacity 10: the remover would drop items the queue "
            "holds (give capacity >= the queue size)",
        ),
        ({"spec": 5}, "table 't': spec: must be a TransitionSpec, its JSON (an object or a string) or the path"),
        ({"spec": "/no/such/spec.json"}, "table 't': spec: spec '/no/such/spec.json' is neither spec JSON nor"),
        ({"spec": "{}"}, "table 't': spec: spec '{}': "),
    ],
)
def test_every_table_error_names_the_table_the_field_and_what_it_accepts(kwargs, message):
    with pytest.raises(TableConfigError) as e:
        TableConfig(**{"name": "t", **kwargs})
    assert str(e.value).startswith(message), str(e.value)
    assert isinstance(e.value, ValueError)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: MinSize(0), "MinSize.min_size must be an int in [1, 9223372036854775807], got 0"),
        (lambda: Queue(0), "Queue.size must be an int in [1, 9223372036854775807], got 0"),
        (
            lambda: SampleToInsertRatio(0.0, 1, 100.0),
            "SampleToInsertRatio.samples_per_insert must be a finite number > 0, got 0.0",
        ),
        (
            lambda: SampleToInsertRatio(1.0, 0, 100.0),
            "SampleToInsertRatio.min_size_to_sample must be an int in [1, 9223372036854775807], got 0",
        ),
        (
            lambda: SampleToInsertRatio(1.0, 1, -1.0),
            "SampleToInsertRatio.error_buffer must be a finite number >= 0, got -1.0",
        ),
        (  # the deadlock check of --error-buffer
            lambda: SampleToInsertRatio(4.0, 1, 3.9),
            "SampleToInsertRatio.error_buffer must be >= max(1, samples_per_insert) = 4, got 3.9 (a smaller "
            "buffer could block both inserts and samples for good)",
        ),
        (
            lambda: SampleToInsertRatio(0.5, 1, 0.5),
            "SampleToInsertRatio.error_buffer must be >= max(1, samples_per_insert) = 1, got 0.5",
        ),
    ],
)
def test_every_rate_limiter_error(make, message):
    with pytest.raises(ValueError) as e:
        make()
    assert str(e.value).startswith(message), str(e.value)


def test_the_limiter_checks_are_the_servers():
    """SampleToInsertRatio accepts exactly what the server's --samples-per-insert/--error-buffer accept."""
    for spi, eb in [(1.0, 1.0), (4.0, 4.0), (4.0, 3.99), (0.25, 0.99), (0.25, 1.0), (32.0, 3200.0)]:
        try:
            table_from_flags({"samples_per_insert": spi, "error_buffer": eb})
            server_ok = True
        except ValueError:
            server_ok = False
        try:
            SampleToInsertRatio(spi, 1, eb)
            table_ok = True
        except ValueError:
            table_ok = False
        assert server_ok == table_ok, (spi, eb)


@pytest.mark.parametrize(
    "obj, message",
    [
        ([], "a rate limiter is a JSON object with a 'kind' (min_size, sample_to_insert_ratio, queue), got []"),
        ({"size": 3}, "no 'kind' (valid kinds: min_size, sample_to_insert_ratio, queue)"),
        ({"kind": "fifo"}, "unknown kind 'fifo' (valid kinds: min_size, sample_to_insert_ratio, queue)"),
        ({"kind": 1}, "unknown kind 1 (valid kinds: min_size, sample_to_insert_ratio, queue)"),
        (
            {"kind": "queue", "size": 3, "min_size": 2},
            "Queue ('queue') has no field 'min_size' (its fields: kind, size)",
        ),
        ({"kind": "min_size"}, "MinSize ('min_size') needs 'min_size'"),
        (
            {"kind": "sample_to_insert_ratio", "samples_per_insert": 2.0},
            "SampleToInsertRatio ('sample_to_insert_ratio') needs 'min_size_to_sample', 'error_buffer'",
        ),
        ({"kind": "min_size", "min_size": "10"}, "MinSize.min_size must be an int"),
    ],
)
def test_every_rate_limiter_json_error_names_the_valid_kinds_or_fields(obj, message):
    with pytest.raises(ValueError) as e:
        rate_limiter_from_json(obj)
    assert str(e.value).startswith(message), str(e.value)


def test_rate_limiter_json_forms():
    assert rate_limiter_from_json({"kind": "min_size", "min_size": 5}) == MinSize(5)
    assert rate_limiter_from_json({"kind": "queue", "size": 7}) == Queue(7)
    ratio = {"kind": "sample_to_insert_ratio", "samples_per_insert": 8.0, "min_size_to_sample": 100, "error_buffer": 80}
    assert rate_limiter_from_json(ratio) == SampleToInsertRatio(8.0, 100, 80)
    assert SampleToInsertRatio(8.0, 100, 80).to_json() == ratio


@pytest.mark.parametrize(
    "obj, message",
    [
        (
            {"name": "a", "capcity": 3},
            "table 'a': capcity: no such field (the fields: name, sampler, remover, capacity, ",
        ),
        ({"capacity": 3}, "name: is required"),
        (["a"], "table: must be a JSON object with the TableConfig fields, got list"),
        (
            {"name": "a", "rate_limiter": {"kind": "priority"}},
            "table 'a': rate_limiter: unknown kind 'priority' (valid kinds: min_size, sample_to_insert_ratio, queue)",
        ),
        ({"name": "a", "rate_limiter": {"kind": "queue", "size": 0}}, "table 'a': rate_limiter: Queue.size must be"),
        ({"name": "a", "spec": {"fields": 1}}, "table 'a': spec: "),
    ],
)
def test_every_table_json_error(obj, message):
    with pytest.raises(TableConfigError) as e:
        TableConfig.from_json(obj)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize(
    "content, message",
    [
        ("", "not valid JSON: Expecting value: line 1 column 1"),
        ('[{"name": "a",}]', "not valid JSON: "),
        ('{"name": "a"}', "must be a JSON list of table objects (at least one), got a JSON dict"),
        ("[]", "must be a JSON list of table objects (at least one), got an empty list"),
        # NaN and Infinity (not strict JSON) are refused by the field they were given for, named with its table
        ('[{"name": "a", "alpha": NaN}]', "table 0 ('a'): alpha: must be a finite number >= 0, got nan"),
        ('[{"name": "a", "alpha": -Infinity}]', "table 0 ('a'): alpha: must be a finite number >= 0, got -inf"),
        (
            '[{"name": "r", "rate_limiter": {"kind": "sample_to_insert_ratio", "samples_per_insert": NaN, '
            '"min_size_to_sample": 1, "error_buffer": 2}}]',
            "table 0 ('r'): rate_limiter: SampleToInsertRatio.samples_per_insert must be a finite number > 0, got nan",
        ),
        (
            '[{"name": "r", "rate_limiter": {"kind": "sample_to_insert_ratio", "samples_per_insert": 1, '
            '"min_size_to_sample": 1, "error_buffer": Infinity}}]',
            "table 0 ('r'): rate_limiter: SampleToInsertRatio.error_buffer must be a finite number >= 0, got inf",
        ),
        (
            '[{"name": "r", "rate_limiter": {"kind": "sample_to_insert_ratio", "samples_per_insert": 1, '
            '"min_size_to_sample": NaN, "error_buffer": 2}}]',
            "table 0 ('r'): rate_limiter: SampleToInsertRatio.min_size_to_sample must be an int in [1, ",
        ),
        (
            '[{"name": "r", "rate_limiter": {"kind": "min_size", "min_size": Infinity}}]',
            "table 0 ('r'): rate_limiter: MinSize.min_size must be an int in [1, 9223372036854775807], got inf",
        ),
        (
            '[{"name": "q", "rate_limiter": {"kind": "queue", "size": NaN}}]',
            "table 0 ('q'): rate_limiter: Queue.size must be an int in [1, 9223372036854775807], got nan",
        ),
        ('[{"name": "a", "alpha": ' + "[" * 100_000 + "]" * 100_000 + "}]", "maximum recursion depth exceeded"),
        (
            '[{"name": "a"}, {"name": "b", "capacity": -1}]',
            "table 1 ('b'): capacity: must be an int in [1, 9223372036854775807], got -1",
        ),
        ('[{"name": "a"}, {"capacity": 5}]', "table 1: name: is required"),
        ('[{"name": "a"}, 7]', "table 1: table: must be a JSON object with the TableConfig fields, got int"),
        (
            '[{"name": "a"}, {"name": "b"}, {"name": "a"}]',
            "tables 0 and 2 are both named 'a' (names are unique per server)",
        ),
        (
            '[{"name": "q", "capacity": 8, "rate_limiter": {"kind": "queue", "sise": 8}}]',
            "table 0 ('q'): rate_limiter: Queue ('queue') has no field 'sise' (its fields: kind, size)",
        ),
    ],
)
def test_every_tables_file_error_names_the_file_the_table_and_the_field(tmp_path, content, message):
    path = tmp_path / "tables.json"
    path.write_text(content)
    with pytest.raises(ValueError) as e:
        load_tables(path)
    assert str(e.value).startswith(f"{path}: {message}"), str(e.value)


def test_a_missing_tables_file_is_named(tmp_path):
    with pytest.raises(ValueError, match=r"/nope.json: cannot read the tables file: No such file"):
        load_tables(tmp_path / "nope.json")


# -- ServerConfig ---------------------------------------------------------------------------------------------


def test_a_default_server_holds_exactly_the_default_table():
    assert ServerConfig().tables == [TableConfig("default")]
    assert ServerConfig().table() == TableConfig("default") and ServerConfig().table("other") is None
    assert ServerConfig().tables is not ServerConfig().tables  # a list of its own per config


def test_the_table_flags_at_their_defaults_build_exactly_the_default_table():
    """Field by field: each flag's default is the default of the TableConfig field it sets."""
    assert TableFlags().table() == TableConfig("default") == table_from_flags({})
    flags, table = TableFlags(), TableConfig("default")
    for flag, field_ in [("capacity",) * 2, ("max_size",) * 2, ("alpha",) * 2, ("alpha_evict",) * 2,
                         ("eviction", "remover"), ("spec",) * 2]:  # fmt: skip
        assert getattr(flags, flag) == getattr(table, field_), flag
    assert (flags.min_size_to_sample, flags.samples_per_insert, flags.error_buffer) == (1, None, None)
    assert flags.rate_limiter() is None and table.rate_limiter is None  # MinSize(1), said as None
    assert (flags.storage, flags.storage_path, flags.durability, flags.cache_bytes) == (
        table.storage, table.path, table.durability, table.cache_bytes
    )  # fmt: skip
    assert set(TABLE_FLAGS) == {
        "capacity", "max_size", "alpha", "eviction", "alpha_evict", "min_size_to_sample", "samples_per_insert",
        "error_buffer", "spec", "storage", "storage_path", "durability", "cache_bytes",
    }  # fmt: skip


@pytest.mark.parametrize(
    "fields_, table",
    [
        ({"capacity": 10}, TableConfig("default", capacity=10)),
        ({"capacity": 10, "max_size": 15}, TableConfig("default", capacity=10, max_size=15)),
        ({"alpha": 0.0, "alpha_evict": 1.5}, TableConfig("default", alpha=0.0, alpha_evict=1.5)),
        ({"eviction": "prioritized"}, TableConfig("default", remover="prioritized")),
        ({"eviction": "min_heap"}, TableConfig("default", remover="lowest_priority")),
        ({"min_size_to_sample": 0}, TableConfig("default")),  # 0 counts as 1, as the native limiter took it
        ({"min_size_to_sample": 1}, TableConfig("default")),
        ({"min_size_to_sample": 500}, TableConfig("default", rate_limiter=MinSize(500))),
        (  # error_buffer's default: max(1, spi) * 100
            {"samples_per_insert": 4.0},
            TableConfig("default", rate_limiter=SampleToInsertRatio(4.0, 1, 400.0)),
        ),
        (
            {"samples_per_insert": 0.5},
            TableConfig("default", rate_limiter=SampleToInsertRatio(0.5, 1, 100.0)),
        ),
        (
            {"samples_per_insert": 0.5, "min_size_to_sample": 1000, "error_buffer": 7.0},
            TableConfig("default", rate_limiter=SampleToInsertRatio(0.5, 1000, 7.0)),
        ),
        ({"spec": SPECS[0].to_json()}, TableConfig("default", spec=SPECS[0])),
    ],
)
def test_the_table_flags_configure_the_table_default(fields_, table):
    assert table_from_flags(fields_) == table
    assert table_from_flags(fields_, "other") == dataclasses.replace(table, name="other")


@pytest.mark.parametrize(
    "fields_, message",
    [
        ({"error_buffer": 300.0}, "error_buffer needs samples_per_insert"),
        ({"min_size_to_sample": -1}, "TableFlags.min_size_to_sample must be an int in [0, "),
        ({"samples_per_insert": 0.0}, "TableFlags.samples_per_insert must be a finite number > 0 (or None), got 0.0"),
        ({"samples_per_insert": 4.0, "error_buffer": 3.0}, "SampleToInsertRatio.error_buffer must be >= max(1, "),
        ({"capacity": 0}, "table 'default': capacity: must be an int in [1, "),
        ({"capacity": 10, "max_size": 5}, "table 'default': max_size: must be >= capacity = 10, got 5"),
        ({"eviction": "random"}, "table 'default': remover: must be one of "),
        ({"spec": '{"fields": []}'}, "table 'default': spec: "),
        ({"sampler": "fifo"}, "no table flag sampler (the table flags: capacity, max_size, alpha, eviction, "),
    ],
)
def test_bad_table_flags_are_refused_with_the_reason(fields_, message):
    with pytest.raises(ValueError) as e:
        table_from_flags(fields_)
    assert str(e.value).startswith(message), str(e.value)


@pytest.mark.parametrize(
    "eviction", ["fifo", "prioritized", "lowest_priority", "lifo", "uniform", "max_heap", "min_heap"]
)
def test_every_eviction_policy_is_a_remover(eviction):
    remover = table_from_flags({"eviction": eviction}).remover
    assert remover in REMOVERS and remover == ("lowest_priority" if eviction == "min_heap" else eviction)


def test_tables_replace_the_default_table_and_server_wide_fields_stay():
    tabs = [TableConfig("replay"), TableConfig("queue", sampler="fifo", capacity=64, rate_limiter=Queue(64))]
    cfg = ServerConfig(tables=tabs, shards=4, workers=3, max_wait_s=5.0)
    assert cfg.tables == tabs and cfg.table("queue") == tabs[1] and cfg.table() is None
    assert (cfg.shards, cfg.workers, cfg.max_wait_s) == (4, 3, 5.0)
    assert ServerConfig(tables=tuple(tabs)).tables == tabs  # kept as a list


@pytest.mark.parametrize("name", sorted(TABLE_FLAGS))
def test_server_config_has_no_table_field(name):
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{name}'"):
        ServerConfig(**{name: getattr(TableFlags(), name)})


@pytest.mark.parametrize(
    "tabs, message",
    [
        ([], "tables must hold at least one TableConfig"),
        ([TableConfig("a"), {"name": "b"}], "tables[1] must be a TableConfig, got dict"),
        ([TableConfig("a"), TableConfig("a", capacity=5)], "tables 0 and 1 are both named 'a' (names are unique"),
        ("a", "ServerConfig.tables must be a list of TableConfig, got 'a'"),
        (None, "ServerConfig.tables must be a list of TableConfig, got None"),
    ],
)
def test_server_tables_errors(tabs, message):
    with pytest.raises(ValueError) as e:
        ServerConfig(tables=tabs)
    assert str(e.value).startswith(message), str(e.value)


def test_a_table_too_large_for_the_servers_shards_is_refused():
    # a key has 28 slot bits: a shard holds at most 2**28 - 1 items (ServerConfig's own check, per table)
    ServerConfig(tables=[TableConfig("big", capacity=2**27 - 1)], shards=1)
    with pytest.raises(ValueError, match=r"table 'big': max_size 268435456 \(default 2 \* capacity\) over 1 shards"):
        ServerConfig(tables=[TableConfig("big", capacity=2**27)], shards=1)
    ServerConfig(tables=[TableConfig("default", capacity=2**27 - 1)], shards=1)  # the table default alike
    with pytest.raises(ValueError, match=r"table 'default': max_size 268435456"):
        ServerConfig(tables=[TableConfig("default", capacity=2**27)], shards=1)


def test_a_server_config_round_trips_through_its_dict(tmp_path):
    tabs = [
        TableConfig("default", spec=SPECS[1], rate_limiter=SampleToInsertRatio(2.0, 10, 50.0)),
        TableConfig("q", sampler="fifo", capacity=9, max_times_sampled=1, rate_limiter=Queue(9)),
    ]
    for cfg in (ServerConfig(tables=tabs, port=5), ServerConfig(tables=[TableConfig("default", capacity=7)])):
        d = json.loads(json.dumps(server_config_to_dict(cfg)))
        assert server_config_from_dict(d) == cfg
    assert server_config_to_dict(ServerConfig())["tables"] == [TableConfig("default").to_json()]


# A run plan's server entry as the versions before ServerConfig held only tables wrote it: every table flag at
# its top level, and "tables" only where the run had tables.
OLD_SERVER_ENTRY = {
    "bind": "127.0.0.1", "port": 0, "capacity": 1000000, "max_size": None, "alpha": 0.6, "eviction": "fifo",
    "alpha_evict": -0.4, "shards": 8, "seed": 3, "min_size_to_sample": 1, "snapshot": None, "snapshot_every": None,
    "max_message_mb": 256, "workers": 2, "inline_sample_max": 1024, "samples_per_insert": None,
    "error_buffer": None, "spec": None, "curve_dir": None, "insecure": False, "max_wait_s": 60.0,
    "max_waiting": 16384, "max_waiting_per_peer": 1024, "max_waiting_mb": 256, "max_reply_mb": None,
    "max_unread_mb": 256, "handshake_s": 5.0, "heartbeat_s": 10.0, "drop_tables": [],
}  # fmt: skip


def test_an_old_plans_flat_table_fields_become_the_table_default():
    assert server_config_from_dict(OLD_SERVER_ENTRY) == ServerConfig(seed=3)
    old = {
        **OLD_SERVER_ENTRY,
        "capacity": 7,
        "eviction": "min_heap",
        "min_size_to_sample": 5,
        "samples_per_insert": 2.0,
        "spec": SPECS[0].to_json(),
    }
    cfg = server_config_from_dict(old)
    assert cfg.tables == [
        TableConfig(
            "default",
            capacity=7,
            remover="lowest_priority",
            rate_limiter=SampleToInsertRatio(2.0, 5, 200.0),
            spec=SPECS[0],
        )
    ]
    assert (cfg.seed, cfg.shards) == (3, 8)
    assert server_config_from_dict(json.loads(json.dumps(server_config_to_dict(cfg)))) == cfg


def test_an_old_plans_tables_beside_default_flat_fields_are_read_and_set_flat_fields_refused():
    tabs = [TableConfig("default"), TableConfig("q", sampler="fifo", capacity=9, rate_limiter=Queue(9))]
    old = {**OLD_SERVER_ENTRY, "tables": [t.to_json() for t in tabs]}
    assert server_config_from_dict(old).tables == tabs
    with pytest.raises(ValueError) as e:
        server_config_from_dict({**old, "capacity": 10, "samples_per_insert": 2.0})
    assert str(e.value).startswith(
        "server tables and the table flags of the one table 'default' (capacity, samples_per_insert) are given together"
    ), str(e.value)


def test_the_module_exports_and_does_not_import_torch():
    code = (
        "import sys, apexrl.replay as r; r.TableConfig, r.MinSize, r.Queue, r.SampleToInsertRatio, r.load_tables;"
        "import apexrl.replay.tables; assert 'torch' not in sys.modules, 'torch imported'"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr


def test_the_table_fields_are_the_pinned_ones():
    assert [f.name for f in dataclasses.fields(TableConfig)] == [
        "name",
        "sampler",
        "remover",
        "capacity",
        "max_size",
        "alpha",
        "alpha_evict",
        "max_times_sampled",
        "rate_limiter",
        "spec",
        "storage",  # tables on disk: storage, path, durability, cache_bytes
        "path",
        "durability",
        "cache_bytes",
        "kind",  # slices tables: kind, length, burn_in, eta, strict_length, span
        "length",
        "burn_in",
        "eta",
        "strict_length",
        "span",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        TableConfig("a").capacity = 3  # type: ignore[misc]
    assert tables_from_json([{"name": "a"}]) == [TableConfig("a")]
