"""The adders (apexrl.replay.adders) against plain reference implementations written here with simple loops.

The adders are driven through a recording client and writer defined here, which store every call (insert,
writer, append, create_item, end_episode, flush, close): these tests hold the adders' logic -- which items, with
which steps, values, extras and priorities, in which order and when. tests/replay/test_adders_e2e.py holds the
same adders, through a real server and the real writer, to the reference loops defined here.

Episodes are scripts: observations ``[episode, t]`` (or a nested mapping of arrays), actions ``10 + t`` (or a
small array), rewards from the script, extras ``{"h": [episode, t, 7]}`` or None, and how the episode ends:
terminated, truncated, dropped with ``reset()`` after its steps, or (transition adders) ended with ``truncate()``.
"""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl.replay.adders import (
    EndBehavior,
    EpisodeAdder,
    NStepTransitionAdder,
    SequenceAdder,
    Step,
    TransitionAdder,
    VecNStepTransitionAdder,
)
from apexrl.replay.adders.base import stack

# --------------------------------------------------------------------------------------------- recording doubles


class RecordingWriter:
    """Stores every call; ``items`` holds, per create_item, (table, the step mappings it covers, priority,
    extras). Fails a test on a call the real writer would refuse (an item longer than the current episode's
    steps or than max_sequence_length, a call after close)."""

    def __init__(self, max_sequence_length: int):
        self.max_sequence_length = max_sequence_length
        self.calls: list[tuple] = []
        self.steps: list[dict] = []  # every step appended, all episodes
        self.episode_start = 0
        self.items: list[tuple[str, list[dict], Any, Any]] = []
        self.closed = False

    def append(self, step: dict) -> None:
        assert not self.closed
        assert set(step) - {"extras", "start_of_episode"} == {"obs", "action", "reward", "discount"}
        self.calls.append(("append",))
        self.steps.append(step)

    def create_item(self, table: str, num_timesteps: int, priority: Any, extras: Any = None) -> None:
        assert not self.closed
        episode_steps = len(self.steps) - self.episode_start
        assert 1 <= num_timesteps <= min(episode_steps, self.max_sequence_length), (num_timesteps, episode_steps)
        self.calls.append(("create_item", table, num_timesteps))
        self.items.append((table, self.steps[len(self.steps) - num_timesteps :], priority, extras))

    def end_episode(self) -> None:
        assert not self.closed
        self.calls.append(("end_episode",))
        self.episode_start = len(self.steps)

    def flush(self, timeout: float | None = None) -> None:
        self.calls.append(("flush", timeout))

    def close(self) -> None:
        self.calls.append(("close",))
        self.closed = True


class RecordingClient:
    def __init__(self) -> None:
        self.inserts: list[tuple[Any, dict, str]] = []
        self.writers: list[RecordingWriter] = []
        self.fail_next = 0  # inserts to refuse (raise) before storing one

    def insert(self, priorities: Any, items: dict, table: str = "default") -> None:
        if self.fail_next:
            self.fail_next -= 1
            raise ConnectionError("server unreachable")
        self.inserts.append((None if priorities is None else np.array(priorities), items, table))

    def writer(self, max_sequence_length: int) -> RecordingWriter:
        w = RecordingWriter(max_sequence_length)
        self.writers.append(w)
        return w

    def inserted_rows(self) -> list[dict]:
        """Every inserted item, unstacked, in insert order."""
        rows = []
        for _, batch, _ in self.inserts:
            n = len(batch["action"])
            rows += [_row(batch, i) for i in range(n)]
        return rows


def _row(tree: Any, i: int) -> Any:
    if isinstance(tree, dict):
        return {k: _row(v, i) for k, v in tree.items()}
    return tree[i]


def canon(x: Any) -> Any:
    """A comparable form of a nested structure (dicts, lists) of arrays/numbers: dtype, shape and values."""
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: canon(v) for k, v in sorted(x.items())}
    if isinstance(x, list):
        return [canon(v) for v in x]
    a = np.asarray(x)
    return (str(a.dtype), a.shape, a.tolist())


# --------------------------------------------------------------------------------------------- episode scripts

ENDS = ("terminated", "truncated", "reset", "truncate")


class Episode:
    def __init__(self, index: int, rewards: list[float], end: str, obs_kind: str, extras: bool, vector_action: bool):
        self.index, self.rewards, self.end = index, rewards, end
        self.T = len(rewards)
        self.obs = [self._obs(t, obs_kind) for t in range(self.T + 1)]
        self.actions = [np.array([10 + t, index], np.int32) if vector_action else 10 + t for t in range(self.T)]
        self.extras = [{"h": np.array([index, t, 7], np.float32)} if extras else None for t in range(self.T)]

    def _obs(self, t: int, kind: str) -> Any:
        if kind == "array":
            return np.array([self.index, t], np.float32)
        return {"pixels": np.full((2, 2), t, np.uint8), "state": {"ep": np.array([self.index, t], np.int64)}}

    @property
    def ended(self) -> bool:
        return self.end in ("terminated", "truncated")


@st.composite
def episodes(draw, max_len: int = 12, ends: tuple[str, ...] = ENDS) -> list[Episode]:
    obs_kind = draw(st.sampled_from(["array", "mapping"]))
    extras = draw(st.booleans())  # the same for a whole run: items of one table share one structure
    vector_action = draw(st.booleans())
    out = []
    for i in range(draw(st.integers(1, 4))):
        length = draw(st.integers(1, max_len))
        rewards = draw(st.lists(st.sampled_from([0.0, 1.0, -2.0, 0.5, 4.0]), min_size=length, max_size=length))
        out.append(Episode(i, rewards, draw(st.sampled_from(ends)), obs_kind, extras, vector_action))
    return out


def play(adder: Any, eps: list[Episode], after_add=None) -> None:
    """Feed the scripts to an adder, calling ``after_add(episode, t)`` after every add."""
    for ep in eps:
        adder.add_first(ep.obs[0])
        for t in range(ep.T):
            last = t == ep.T - 1
            adder.add(
                ep.actions[t],
                ep.rewards[t],
                ep.obs[t + 1],
                terminated=last and ep.end == "terminated",
                truncated=last and ep.end == "truncated",
                extras=ep.extras[t],
            )
            if after_add is not None:
                after_add(ep, t)
        if ep.end == "reset":
            adder.reset()
        elif ep.end == "truncate":
            adder.truncate()


# --------------------------------------------------------------------------------------------- references


def ref_transitions(eps: list[Episode], n: int, gamma: float) -> list[tuple[dict, float]]:
    """Every transition the n-step adder must emit, in order, each with when it is due: the count of adds of
    the run after which it has been emitted (x.5: by the ``truncate()`` after that add)."""
    out, adds = [], 0
    for ep in eps:
        for t in range(ep.T):
            if t + n <= ep.T:
                m, due = n, adds + t + n  # a full horizon, due at the add that completes it
            elif ep.end in ("terminated", "truncated"):
                m, due = ep.T - t, adds + ep.T  # cut at the episode's end, due at its last add
            elif ep.end == "truncate":
                m, due = ep.T - t, adds + ep.T + 0.5
            else:
                continue  # reset: dropped
            reward = 0.0
            for k in range(m):
                reward += gamma**k * ep.rewards[t + k]
            terminal = ep.end == "terminated" and t + m == ep.T
            item = {
                "obs": ep.obs[t],
                "action": ep.actions[t],
                "reward": np.float32(reward),
                "discount": np.float32(0.0 if terminal else gamma**m),
                "next_obs": ep.obs[t + m],
            }
            if ep.extras[t] is not None:
                item["extras"] = ep.extras[t]
            out.append((item, due))
        adds += ep.T
    return out


def ref_steps(ep: Episode, upto: int | None = None) -> list[dict]:
    """The step mappings of an episode (the last observation's zero-filled step where it ended)."""
    steps = []
    for t in range(ep.T if upto is None else upto):
        terminal = ep.end == "terminated" and t == ep.T - 1
        steps.append(
            {
                "obs": ep.obs[t],
                "action": ep.actions[t],
                "reward": np.float32(ep.rewards[t]),
                "discount": np.float32(0.0 if terminal else 1.0),
            }
        )
    if upto is None and ep.ended:
        steps.append(
            {
                "obs": ep.obs[ep.T],
                "action": np.zeros_like(np.asarray(ep.actions[-1])),
                "reward": np.float32(0.0),
                "discount": np.float32(0.0),
            }
        )
    return steps


def zero(x: Any) -> Any:
    if x is None:
        return None
    if isinstance(x, dict):
        return {k: zero(v) for k, v in x.items()}
    return np.zeros_like(np.asarray(x))


def ref_sequences(eps: list[Episode], length: int, period: int, pad: bool) -> list[tuple[list[dict], Any]]:
    """(steps, extras) of every item, in order: a write each ``period`` steps from ``length`` on, then at an
    episode's end the item a periodic write would make at the first write point at or after its last step."""
    out = []
    for ep in eps:
        steps = ref_steps(ep)
        real = ep.T  # steps with an action
        t = length
        while t <= real:
            out.append((steps[t - length : t], ep.extras[t - length]))
            t += period
        if not ep.ended:
            continue
        e = ep.T + 1
        w = length
        while w < e:
            w += period
        start = w - length
        extras = ep.extras[start] if start < ep.T else zero(ep.extras[-1])
        if pad:
            zero_step = {
                "obs": zero(ep.obs[ep.T]),
                "action": zero(ep.actions[-1]),
                "reward": np.float32(0.0),
                "discount": np.float32(0.0),
            }
            out.append((steps[start:] + [zero_step] * (w - e), extras))
        else:
            out.append((steps[start:], extras))
    return out


# --------------------------------------------------------------------------------------------- n-step transitions


@settings(max_examples=150, deadline=None)
@given(
    eps=episodes(),
    n=st.integers(1, 5),
    gamma=st.sampled_from([0.0, 0.5, 0.9, 1.0]),
    insert_batch=st.integers(1, 5),
    priority_kind=st.sampled_from(["none", "float", "callable"]),
)
def test_nstep_adder_matches_reference(eps, n, gamma, insert_batch, priority_kind):
    client = RecordingClient()
    priority: Any = {"none": None, "float": 0.25, "callable": lambda b: np.abs(b["reward"]).astype(np.float64) + 1}[
        priority_kind
    ]
    adder = NStepTransitionAdder(client, "replay", n, gamma, priority, insert_batch=insert_batch)
    expected = ref_transitions(eps, n, gamma)
    adds = [0]

    def after_add(ep, t):
        adds[0] += 1
        due = sum(1 for _, d in expected if d <= adds[0])
        inserted = sum(len(b["reward"]) for _, b, _ in client.inserts)
        assert inserted == due - due % insert_batch  # whole batches, as soon as one is full
        assert adder.buffered == due % insert_batch

    play(adder, eps, after_add)
    adder.flush()
    got = client.inserted_rows()
    assert [canon(r) for r in got] == [canon(item) for item, _ in expected]
    for priorities, batch, table in client.inserts:
        assert table == "replay"
        assert batch["reward"].dtype == np.float32 and batch["discount"].dtype == np.float32
        size = len(batch["reward"])
        assert size <= insert_batch
        if priority_kind == "none":
            assert priorities is None
        elif priority_kind == "float":
            assert priorities.tolist() == [0.25] * size
        else:
            assert priorities.tolist() == (np.abs(batch["reward"]).astype(np.float64) + 1).tolist()
    assert all(len(b["reward"]) == insert_batch for _, b, _ in client.inserts[:-1])


@settings(max_examples=60, deadline=None)
@given(eps=episodes(ends=("terminated", "truncated")), gamma=st.sampled_from([0.5, 0.9]))
def test_transition_adder_is_one_step(eps, gamma):
    """TransitionAdder: n = 1; discount 1 (or 0 at a termination) by default, gamma with discount=gamma."""
    for discount in (1.0, gamma):
        client = RecordingClient()
        adder = TransitionAdder(client, "t", discount=discount, insert_batch=3)
        play(adder, eps)
        adder.close()
        expected = [item for item, _ in ref_transitions(eps, 1, discount)]
        assert [canon(r) for r in client.inserted_rows()] == [canon(item) for item in expected]
        assert {d for item in expected for d in [float(item["discount"])]} <= {0.0, float(np.float32(discount))}


def test_nstep_adder_core_is_the_actors():
    """One n-step implementation: the Ape-X actors insert through the adders (K = 1: NStepTransitionAdder, K > 1
    its vectorised form), whose cores are the classes apexrl.apex.nstep names."""
    from apexrl.apex import actor, nstep
    from apexrl.replay.adders import transition

    adder = NStepTransitionAdder(RecordingClient(), "t", 3, 0.9)
    assert type(adder._core) is transition.NStepBuffer is nstep.NStepBuffer
    assert type(VecNStepTransitionAdder(RecordingClient(), "t", 3, 0.9, 2)._core) is transition.VecNStep
    assert nstep.VecNStep is transition.VecNStep and nstep.Transition is transition.Transition
    assert (
        actor.NStepTransitionAdder is NStepTransitionAdder and actor.VecNStepTransitionAdder is VecNStepTransitionAdder
    )


def test_nstep_adder_keeps_a_batch_whose_insert_failed():
    client = RecordingClient()
    adder = NStepTransitionAdder(client, "t", 1, 0.5, insert_batch=2)
    adder.add_first(np.zeros(1))
    adder.add(0, 1.0, np.ones(1), False, False)
    client.fail_next = 1
    with pytest.raises(ConnectionError):
        adder.add(1, 2.0, np.full(1, 2.0), False, False)  # completes the batch of 2; the insert fails
    assert adder.buffered == 2 and adder.in_episode and client.inserts == []
    client.fail_next = 1
    with pytest.raises(ConnectionError):
        adder.add(2, 4.0, np.full(1, 3.0), True, False)  # ends the episode; the insert fails again
    assert adder.buffered == 3 and not adder.in_episode  # the step is recorded, the episode over
    adder.add_first(np.zeros(1))  # the next episode starts as usual; its first full batch goes with the rest
    adder.add(3, 8.0, np.ones(1), False, False)
    assert client.inserts and adder.buffered == 0
    assert [float(r["reward"]) for r in client.inserted_rows()] == [1.0, 2.0, 4.0, 8.0]


def test_nstep_adder_truncate_and_close():
    client = RecordingClient()
    adder = NStepTransitionAdder(client, "t", 3, 0.5, insert_batch=100)
    adder.add_first(np.zeros(1))
    for t in range(2):
        adder.add(t, 1.0, np.full(1, t + 1.0), False, False)
    assert adder.pending == 2 and adder.buffered == 0
    adder.truncate()  # a time-limit cut here: shorter horizons bootstrapping from the latest observation
    assert not adder.in_episode
    adder.truncate()  # between episodes: nothing
    adder.close()
    rows = client.inserted_rows()
    assert [(float(r["reward"]), float(r["discount"]), float(r["next_obs"][0])) for r in rows] == [
        (1.5, 0.25, 2.0),
        (1.0, 0.5, 2.0),
    ]
    for call in (lambda: adder.add_first(np.zeros(1)), adder.truncate):
        with pytest.raises(RuntimeError, match="closed"):
            call()
    adder.close()  # idempotent


# --------------------------------------------------------------------------------------------- vectorised n-step


@st.composite
def lockstep_runs(draw) -> tuple[int, list[list[tuple[float, str]]], list[tuple[int, list[int]]]]:
    """K environments stepped ``steps`` times in lockstep: per environment and step, (reward, how it ends:
    "" / "terminated" / "truncated"); and resets: (after which step, the environments whose episode is dropped)."""
    k, steps = draw(st.integers(1, 5)), draw(st.integers(1, 25))
    ends = st.sampled_from(["", "", "", "terminated", "truncated"])
    script = [[(draw(st.sampled_from([0.0, 1.0, -2.0, 0.5])), draw(ends)) for _ in range(k)] for _ in range(steps)]
    resets = draw(st.lists(st.tuples(st.integers(0, steps - 1), st.lists(st.integers(0, k - 1), unique=True))))
    return k, script, resets


@settings(max_examples=150, deadline=None)
@given(
    run=lockstep_runs(),
    n=st.integers(1, 4),
    gamma=st.sampled_from([0.5, 0.9]),
    insert_batch=st.integers(1, 7),
    vector_obs=st.booleans(),
)
def test_vectorised_nstep_adder_is_k_nstep_adders(run, n, gamma, insert_batch, vector_obs):
    """VecNStepTransitionAdder over K environments = K NStepTransitionAdders fed one environment after another at
    every step into one buffer: the same items (values bit for bit), order, batches and priorities, across
    episode ends, resets of some environments and the final truncate."""
    k, script, resets = run
    client = RecordingClient()
    adder = VecNStepTransitionAdder(
        client, "replay", n, gamma, k, lambda b: np.abs(b["reward"]).astype(np.float64), insert_batch=insert_batch
    )
    ref_client = RecordingClient()
    # The reference: one NStepTransitionAdder per environment, each inserting single items into one list.
    refs = [NStepTransitionAdder(ref_client, "replay", n, gamma, insert_batch=1) for _ in range(k)]
    t_env = [0] * k  # each environment's step count, for distinct observations

    def obs(j: int) -> np.ndarray:
        return np.array([j, t_env[j]], np.float32) if vector_obs else np.int64(1000 * j + t_env[j])

    adder.add_first(np.stack([obs(j) for j in range(k)]))
    for j in range(k):
        refs[j].add_first(obs(j))
    for i, row in enumerate(script):
        actions = np.array([10 * i + j for j in range(k)])
        for j in range(k):
            t_env[j] += 1
        nexts = np.stack([obs(j) for j in range(k)])
        terminated = np.array([e == "terminated" for _, e in row])
        truncated = np.array([e == "truncated" for _, e in row])
        adder.add(actions, np.array([r for r, _ in row]), nexts, terminated, truncated)
        for j in range(k):
            refs[j].add(actions[j], row[j][0], nexts[j], bool(terminated[j]), bool(truncated[j]))
        ended = np.flatnonzero(terminated | truncated)
        dropped = sorted({j for at, envs in resets if at == i for j in envs} - set(ended.tolist()))
        adder.reset(dropped)
        for j in dropped:
            refs[j].reset()
        restart = sorted(set(ended.tolist()) | set(dropped))
        for j in restart:
            t_env[j] += 1
        if restart:
            adder.add_first(np.stack([obs(j) for j in restart]), restart)
            for j in restart:
                refs[j].add_first(obs(j))
        assert adder.buffered == len(ref_client.inserts) - sum(len(b["reward"]) for _, b, _ in client.inserts)
        assert adder.pending == sum(r.pending for r in refs)
    adder.truncate()
    for r in refs:
        r.truncate()
    adder.close()
    got, want = client.inserted_rows(), ref_client.inserted_rows()
    assert [canon(r) for r in got] == [canon(r) for r in want]
    for priorities, batch, table in client.inserts:
        assert table == "replay" and batch["reward"].dtype == np.float32 and batch["discount"].dtype == np.float32
        assert priorities.tolist() == np.abs(batch["reward"]).astype(np.float64).tolist()
    sizes = [len(b["reward"]) for _, b, _ in client.inserts]
    assert all(size == insert_batch for size in sizes[:-1]) and all(0 < size <= insert_batch for size in sizes)


def test_vectorised_nstep_adder_refuses_bad_calls_and_changes_nothing():
    client = RecordingClient()
    adder = VecNStepTransitionAdder(client, "t", 2, 0.5, 3, insert_batch=100)
    with pytest.raises(RuntimeError, match=r"environments \[0, 1, 2\] not in an episode"):
        adder.add([0, 0, 0], [1.0, 1.0, 1.0], np.zeros((3, 1)), [False] * 3, [False] * 3)
    adder.add_first(np.zeros((2, 1)), [0, 2])
    with pytest.raises(RuntimeError, match=r"environments \[1\] not in an episode"):
        adder.add([0, 0, 0], [1.0, 1.0, 1.0], np.zeros((3, 1)), [False] * 3, [False] * 3)
    with pytest.raises(RuntimeError, match=r"environments \[2\] whose episode is still open"):
        adder.add_first(np.zeros((2, 1)), [1, 2])
    for envs in ([3], [-1], [1, 1]):
        with pytest.raises(ValueError, match="distinct indices in"):
            adder.add_first(np.zeros((len(envs), 1)), envs)
    adder.add_first(np.ones((1, 1)), [1])
    with pytest.raises(ValueError, match="rewards has 2 rows, expected one per environment"):
        adder.add([0, 0, 0], [1.0, 1.0], np.zeros((3, 1)), [False] * 3, [False] * 3)
    with pytest.raises(ValueError, match="reward must be finite"):
        adder.add([0, 0, 0], [1.0, math.nan, 1.0], np.zeros((3, 1)), [False] * 3, [False] * 3)
    assert adder.pending == 0 and adder.in_episode.tolist() == [True] * 3  # nothing recorded by the refusals
    adder.add([0, 1, 2], [1.0, 2.0, 4.0], np.ones((3, 1)), [True, False, False], [False] * 3)
    assert adder.buffered == 1 and adder.pending == 2 and adder.in_episode.tolist() == [False, True, True]
    assert adder.discard() == 3 and adder.buffered == 0 and adder.pending == 0
    assert adder.in_episode.tolist() == [False] * 3
    for bad in (
        dict(num_envs=0),
        dict(n=0),
        dict(discount=1.5),
        dict(priority=-1.0),
        dict(insert_batch=0),
    ):
        args: dict[str, Any] = dict(n=2, discount=0.5, num_envs=2, priority=None, insert_batch=1) | bad
        with pytest.raises(ValueError):
            VecNStepTransitionAdder(client, "t", **args)
    adder.close()
    with pytest.raises(RuntimeError, match="closed"):
        adder.add_first(np.zeros((3, 1)))


def test_vectorised_nstep_adder_keeps_a_batch_whose_insert_failed():
    client = RecordingClient()
    adder = VecNStepTransitionAdder(client, "t", 1, 0.5, 2, insert_batch=3)
    adder.add_first(np.zeros((2, 1)))
    adder.add([0, 1], [1.0, 2.0], np.ones((2, 1)), [False] * 2, [False] * 2)
    client.fail_next = 1
    with pytest.raises(ConnectionError):
        adder.add([2, 3], [4.0, 8.0], np.ones((2, 1)), [False, True], [False] * 2)  # a batch of 3: refused
    assert adder.buffered == 4 and adder.in_episode.tolist() == [True, False] and client.inserts == []
    adder.add_first(np.zeros((1, 1)), [1])  # the step was recorded: environment 1's episode ended
    adder.flush()
    assert [float(r["reward"]) for r in client.inserted_rows()] == [1.0, 2.0, 4.0, 8.0]
    assert [len(b["reward"]) for _, b, _ in client.inserts] == [3, 1]


def test_nstep_adder_discard_counts_what_it_drops():
    adder = NStepTransitionAdder(RecordingClient(), "t", 3, 0.5, insert_batch=100)
    adder.add_first(np.zeros(1))
    for t in range(5):
        adder.add(t, 1.0, np.ones(1), False, False)
    assert (adder.buffered, adder.pending) == (3, 2)
    assert adder.discard() == 5 and (adder.buffered, adder.pending) == (0, 0) and not adder.in_episode


# --------------------------------------------------------------------------------------------- sequences


@settings(max_examples=200, deadline=None)
@given(
    eps=episodes(max_len=14, ends=("terminated", "truncated", "reset")),
    length=st.integers(1, 6),
    period_frac=st.integers(1, 6),
    pad=st.booleans(),
    priority=st.sampled_from([None, 2.5]),
)
def test_sequence_adder_matches_reference(eps, length, period_frac, pad, priority):
    period = min(period_frac, length)
    client = RecordingClient()
    adder = SequenceAdder(client, "seq", length, period, pad_end_of_episode=pad, priority=priority)
    play(adder, eps)
    adder.flush(timeout=3.0)
    (w,) = client.writers
    assert w.max_sequence_length == length
    expected = ref_sequences(eps, length, period, pad)
    got = [(steps, extras) for _, steps, _, extras in w.items]
    assert [canon(s) for s, _ in got] == [canon(s) for s, _ in expected]
    assert [canon(e) for _, e in got] == [canon(e) for _, e in expected]
    assert {(table, prio) for table, _, prio, _ in w.items} <= {("seq", priority)}
    if pad:
        assert all(len(s) == length for s, _ in got)
    # With period <= sequence_length no step of a finished episode is left out of every item (its last
    # observation included); the items hold the adder's own observation objects (steps kept by reference).
    held = {id(s["obs"]) for _, steps, _, _ in w.items for s in steps}
    for ep in eps:
        if ep.ended:
            assert all(id(o) in held for o in ep.obs)
    # Each step is appended once: the episode's steps (+ its last observation, + padding where padded).
    assert len(w.steps) == sum(
        len(ref_steps(ep)) + (len(expected_pad(ep, length, period)) if pad else 0) if ep.ended else ep.T for ep in eps
    )
    assert [c for c in w.calls if c[0] == "end_episode"] == [("end_episode",)] * len(eps)
    assert w.calls[-1] == ("flush", 3.0)
    adder.close()
    assert w.closed


def expected_pad(ep: Episode, length: int, period: int) -> list[int]:
    w, e = length, ep.T + 1
    while w < e:
        w += period
    return list(range(w - e))


def test_sequence_adder_acme_example():
    """Acme's EndBehavior docstring: sequence_length 3, period 2, steps 1..6 (6 the last observation)."""
    client = RecordingClient()
    for pad in (True, False):
        adder = SequenceAdder(client, "s", 3, 2, pad_end_of_episode=pad)
        adder.add_first(np.array([1]))
        for t in range(2, 7):
            adder.add(0, float(t), np.array([t]), False, t == 6)
        w = client.writers[-1]
        obs = [[int(np.asarray(s["obs"])[0]) for s in steps] for _, steps, _, _ in w.items]
        assert obs == ([[1, 2, 3], [3, 4, 5], [5, 6, 0]] if pad else [[1, 2, 3], [3, 4, 5], [5, 6]])


# --------------------------------------------------------------------------------------------- episodes


@settings(max_examples=100, deadline=None)
@given(eps=episodes(ends=("terminated", "truncated", "reset")), priority=st.sampled_from([None, 1.5]))
def test_episode_adder_matches_reference(eps, priority):
    client = RecordingClient()
    adder = EpisodeAdder(client, "ep", 13, priority=priority)  # every script fits: at most 12 actions
    play(adder, eps)
    (w,) = client.writers
    expected = [(ref_steps(ep), ep.extras[0]) for ep in eps if ep.ended]
    assert [canon(steps) for _, steps, _, _ in w.items] == [canon(s) for s, _ in expected]
    assert [canon(extras) for _, _, _, extras in w.items] == [canon(e) for _, e in expected]
    assert all(table == "ep" and prio == priority for table, _, prio, _ in w.items)


def test_episode_adder_refuses_a_too_long_episode_and_changes_nothing():
    client = RecordingClient()
    adder = EpisodeAdder(client, "ep", 3)  # two actions and the last observation at most
    w = client.writers[0]
    adder.add_first(np.zeros(1))
    adder.add(0, 1.0, np.ones(1), False, False)
    adder.add(1, 1.0, np.ones(1), False, False)
    with pytest.raises(ValueError, match="max_sequence_length=3"):
        adder.add(2, 1.0, np.ones(1), False, False)
    assert len(w.steps) == 2 and w.items == [] and adder.in_episode
    with pytest.raises(ValueError, match="max_sequence_length=3"):
        adder.add(2, 1.0, np.ones(1), True, False)  # ending it there would need 4 steps as well
    adder.reset()
    assert w.calls[-1] == ("end_episode",)
    adder.add_first(np.zeros(1))
    adder.add(0, 1.0, np.ones(1), False, False)
    adder.add(1, 1.0, np.ones(1), True, False)  # exactly 3 steps: stored
    assert len(w.items) == 1 and len(w.items[0][1]) == 3


# --------------------------------------------------------------------------------------------- call order, args


def _adders():
    return [
        lambda c: NStepTransitionAdder(c, "t", 2, 0.9),
        lambda c: TransitionAdder(c, "t"),
        lambda c: SequenceAdder(c, "t", 3, 1),
        lambda c: EpisodeAdder(c, "t", 100),
    ]


@pytest.mark.parametrize("make", _adders())
def test_call_order_rules(make):
    client = RecordingClient()
    adder = make(client)
    with pytest.raises(RuntimeError, match="add_first"):
        adder.add(0, 1.0, np.zeros(1), False, False)
    adder.add_first(np.zeros(1))
    with pytest.raises(RuntimeError, match="reset"):
        adder.add_first(np.zeros(1))  # an open episode is never dropped silently
    for bad in (math.nan, math.inf):
        with pytest.raises(ValueError, match="finite"):
            adder.add(0, bad, np.zeros(1), False, False)
    adder.add(0, 1.0, np.ones(1), False, False)
    adder.reset()  # dropped on purpose
    assert not adder.in_episode
    adder.reset()  # a no-op between episodes
    adder.add_first(np.zeros(1))
    adder.add(0, 1.0, np.ones(1), True, True)  # terminated and truncated: terminated, the episode ends
    with pytest.raises(RuntimeError, match="add_first"):
        adder.add(0, 1.0, np.zeros(1), False, False)
    adder.add_first(np.zeros(1))  # the next episode
    adder.close()
    with pytest.raises(RuntimeError, match="closed"):
        adder.add(0, 1.0, np.zeros(1), False, False)


def test_terminated_and_truncated_counts_as_terminated_everywhere():
    c1, c2 = RecordingClient(), RecordingClient()
    nstep, seq = NStepTransitionAdder(c1, "t", 3, 0.5), SequenceAdder(c2, "t", 4, 2, pad_end_of_episode=False)
    for adder in (nstep, seq):
        adder.add_first(np.zeros(1))
        adder.add(0, 1.0, np.ones(1), False, False)
        adder.add(1, 1.0, np.ones(1), True, True)
    nstep.flush()
    assert [float(r["discount"]) for r in c1.inserted_rows()] == [0.0, 0.0]
    (_, steps, _, _) = c2.writers[0].items[-1]
    assert [float(s["discount"]) for s in steps] == [1.0, 0.0, 0.0]  # the last one: the zero-filled last obs


@pytest.mark.parametrize(
    "make",
    [
        lambda c: NStepTransitionAdder(c, "t", 0, 0.9),
        lambda c: NStepTransitionAdder(c, "t", 2, 1.5),
        lambda c: NStepTransitionAdder(c, "t", 2, 0.9, priority=-1.0),
        lambda c: NStepTransitionAdder(c, "t", 2, 0.9, priority=math.nan),
        lambda c: NStepTransitionAdder(c, "t", 2, 0.9, insert_batch=0),
        lambda c: SequenceAdder(c, "t", 0, 1),
        lambda c: SequenceAdder(c, "t", 3, 0),
        lambda c: SequenceAdder(c, "t", 3, 4),
        lambda c: SequenceAdder(c, "t", 3, 1, priority=-2),
        lambda c: EpisodeAdder(c, "t", 1),
        lambda c: EpisodeAdder(c, "t", 10, priority=math.inf),
        lambda c: SequenceAdder(c, "t", 3, 1, end_of_episode_behavior="bogus"),
        lambda c: SequenceAdder(c, "t", 3, 1, False, end_of_episode_behavior="write"),
        lambda c: SequenceAdder(c, "t", 3, 1, extras_per="first"),
        lambda c: EpisodeAdder(c, "t", 10, padding_fn=3),
        lambda c: EpisodeAdder(c, "t", 10, extras_per=None),
    ],
)
def test_bad_arguments(make):
    client = RecordingClient()
    with pytest.raises(ValueError):
        make(client)
    assert client.writers == []  # nothing made


def test_priority_function_must_return_one_priority_per_item():
    client = RecordingClient()
    adder = NStepTransitionAdder(client, "t", 1, 0.9, priority=lambda batch: [1.0], insert_batch=2)
    adder.add_first(np.zeros(1))
    adder.add(0, 1.0, np.ones(1), False, False)
    with pytest.raises(ValueError, match="2 finite priorities"):
        adder.add(0, 1.0, np.ones(1), False, False)
    assert adder.buffered == 2 and client.inserts == []


def test_stack_names_the_field_that_differs():
    assert stack([{"a": {"b": 1}}, {"a": {"b": 2}}])["a"]["b"].tolist() == [1, 2]
    with pytest.raises(ValueError, match="item/a/b"):
        stack([{"a": {"b": np.zeros(2)}}, {"a": {"b": np.zeros(3)}}])
    with pytest.raises(ValueError, match="item/a"):
        stack([{"a": {"b": 1}}, {"a": {"c": 1}}])
    with pytest.raises(ValueError, match="None"):
        stack([{"e": None}, {"e": 1}])


def test_step_layout():
    assert Step._fields == ("observation", "action", "reward", "discount", "extras")


def test_adders_do_not_import_torch():
    code = (
        "import sys, apexrl.replay; from apexrl.replay import SequenceAdder, EpisodeAdder, TransitionAdder, "
        "NStepTransitionAdder; import apexrl.replay.adders; assert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


# ------------------------------------------------------------------------------------------------------- Acme's inputs


@pytest.mark.parametrize("make", _adders())
def test_bad_rewards_and_discounts_are_refused_naming_the_field_and_change_nothing(make):
    client = RecordingClient()
    adder = make(client)
    adder.add_first(np.zeros(1))
    for kwargs, field in (
        (dict(reward=1.0, discount=1.5), "discount"),
        (dict(reward=1.0, discount=-0.1), "discount"),
        (dict(reward=1.0, discount={"a": np.array([0.5, math.nan])}), "discount/a"),
        (dict(reward={"a": np.array([1.0, math.inf])}), "reward/a"),
        (dict(reward=np.array([1.0, math.nan])), "reward"),
        (dict(reward="x"), "reward"),
    ):
        with pytest.raises(ValueError, match=field):
            adder.add(0, next_observation=np.ones(1), terminated=False, truncated=False, **kwargs)
        assert adder.in_episode
    adder.add(0, 1.0, np.ones(1), True, False, discount=0.5)  # terminated: the discount is 0 whatever was given
    adder.close()
    if client.inserts:
        assert [float(r["discount"]) for r in client.inserted_rows()] == [0.0]
    else:
        (_, steps, _, _) = client.writers[0].items[-1]
        assert float(steps[0]["discount"]) == 0.0


def test_nstep_discount_input_gives_acmes_return_and_discount_times_gamma():
    client = RecordingClient()
    adder = NStepTransitionAdder(client, "t", 3, 0.9, insert_batch=1)
    adder.add_first(0)
    rewards, discounts = [1.0, 2.0, 4.0, 8.0], [0.5, 0.8, 1.0, 0.7]
    for t, (r, d) in enumerate(zip(rewards, discounts, strict=True)):
        adder.add(t, r, t + 1, False, t == 3, discount=d)
    rows = client.inserted_rows()
    assert [int(r["obs"]) for r in rows] == [0, 1, 2, 3]
    g = 0.9
    # s_0 over 3 steps: r0 + g d0 r1 + g^2 d0 d1 r2; D = g^3 d0 d1 d2
    assert float(rows[0]["reward"]) == pytest.approx(1.0 + g * 0.5 * 2.0 + g * g * 0.5 * 0.8 * 4.0, rel=1e-6)
    assert float(rows[0]["discount"]) == pytest.approx(g**3 * 0.5 * 0.8 * 1.0, rel=1e-6)
    # the truncated end: s_3 over 1 step bootstraps with g d3
    assert float(rows[3]["reward"]) == 8.0 and float(rows[3]["discount"]) == pytest.approx(g * 0.7, rel=1e-6)


def test_nstep_without_discounts_is_unchanged_by_a_discount_of_one():
    """discount=1.0 given at every step (the general path) gives what no discount gives (the scalar path)."""
    a, b = RecordingClient(), RecordingClient()
    plain, given = (
        NStepTransitionAdder(a, "t", 3, 0.9, insert_batch=1),
        NStepTransitionAdder(b, "t", 3, 0.9, insert_batch=1),
    )
    for adder, kw in ((plain, {}), (given, {"discount": 1.0})):
        adder.add_first(0)
        for t in range(5):
            adder.add(t, float(t), t + 1, t == 4, False, **kw)
    for x, y in zip(a.inserted_rows(), b.inserted_rows(), strict=True):
        assert set(x) == set(y)
        for k in x:
            np.testing.assert_allclose(x[k], y[k], rtol=1e-6)


@pytest.mark.parametrize("n", [1, 2, 3, 5])
@pytest.mark.parametrize("T", [1, 2, 3, 6])
def test_shorter_at_start_adds_min_n_T_minus_one_transitions_from_s0(n, T):
    a, b = RecordingClient(), RecordingClient()
    apex, acme = (
        NStepTransitionAdder(c, "t", n, 0.5, insert_batch=1, shorter_at_start=s) for c, s in ((a, False), (b, True))
    )
    for adder in (apex, acme):
        adder.add_first(0)
        for t in range(T):
            adder.add(t, 1.0, t + 1, t == T - 1, False, extras={"e": np.array([t])})
    extra = acme_rows = b.inserted_rows()
    k = min(n, T) - 1
    assert len(acme_rows) == len(a.inserted_rows()) + k == T + k
    for m, row in enumerate(extra[:k], start=1):  # s_0 -> s_m, the extras of s_0
        assert (int(row["obs"]), int(row["next_obs"]), int(row["extras"]["e"][0])) == (0, m, 0)
        assert float(row["discount"]) == pytest.approx(0.5**m)
    assert canon(acme_rows[k:]) == canon(a.inserted_rows())


def test_structured_rewards_and_discounts_broadcast_as_acme():
    client = RecordingClient()
    adder = NStepTransitionAdder(client, "t", 2, 1.0, insert_batch=1)
    adder.add_first(0)
    adder.add(0, {"a": np.array([1.0, 2.0]), "b": 3.0}, 1, False, False, discount={"a": 0.5, "b": np.array([0.1, 1.0])})
    adder.add(0, {"a": np.array([1.0, 2.0]), "b": 3.0}, 2, False, True, discount={"a": 0.5, "b": np.array([0.1, 1.0])})
    rows = client.inserted_rows()
    np.testing.assert_allclose(rows[0]["reward"]["a"], [1.5, 3.0])
    np.testing.assert_allclose(rows[0]["reward"]["b"], [3.3, 6.0])  # r broadcast with d: shape (2,)
    np.testing.assert_allclose(rows[0]["discount"]["b"], [0.01, 1.0])
    assert rows[0]["reward"]["a"].dtype == np.float32
    with pytest.raises(ValueError, match="keys"):
        adder.add_first(0)
        adder.add(0, {"a": 1.0}, 1, False, True, discount={"b": 0.5})


def _vec_inputs(k: int, t: int, rng: np.random.Generator) -> dict:
    return dict(
        actions=[10 * t + j for j in range(k)],
        rewards={"r": rng.normal(size=(k, 2))},
        next_observations={"pix": np.full((k, 2), t + 1, np.uint8), "pos": rng.normal(size=(k, 3))},
        extras={"logp": rng.normal(size=k).astype(np.float32)},
        discounts=rng.uniform(0.5, 1.0, size=k),
    )


@pytest.mark.parametrize("shorter_at_start", [False, True])
def test_vectorised_adder_takes_every_input_as_k_nstep_adders(shorter_at_start):
    """Dict observations, extras, discounts and structured rewards: the same items, values and order as K
    NStepTransitionAdders fed one environment after another (their inserts of one item each, in order)."""
    k, n, steps = 3, 3, 9
    rng = np.random.default_rng(0)
    ends = {(2, 0): "terminated", (4, 1): "truncated", (6, 0): "truncated", (7, 2): "terminated"}
    vc, ref = RecordingClient(), RecordingClient()
    vec = VecNStepTransitionAdder(vc, "t", n, 0.9, k, insert_batch=2, shorter_at_start=shorter_at_start)
    singles = [
        NStepTransitionAdder(ref, "t", n, 0.9, insert_batch=1, shorter_at_start=shorter_at_start) for _ in range(k)
    ]
    first = {"pix": np.zeros((k, 2), np.uint8), "pos": np.zeros((k, 3))}
    vec.add_first(first)
    for j in range(k):
        singles[j].add_first({key: v[j] for key, v in first.items()})
    for t in range(steps):
        x = _vec_inputs(k, t, rng)
        term = np.array([ends.get((t, j)) == "terminated" for j in range(k)])
        trunc = np.array([ends.get((t, j)) == "truncated" for j in range(k)])
        vec.add(x["actions"], x["rewards"], x["next_observations"], term, trunc, x["extras"], discounts=x["discounts"])
        for j in range(k):
            singles[j].add(
                x["actions"][j],
                {"r": x["rewards"]["r"][j]},
                {key: v[j] for key, v in x["next_observations"].items()},
                term[j],
                trunc[j],
                {"logp": x["extras"]["logp"][j]},
                discount=x["discounts"][j],
            )
        ended = np.flatnonzero(term | trunc)
        if len(ended):
            reset_obs = {"pix": np.zeros((len(ended), 2), np.uint8), "pos": np.zeros((len(ended), 3))}
            vec.add_first(reset_obs, envs=ended)
            for i, j in enumerate(ended.tolist()):
                singles[j].add_first({key: v[i] for key, v in reset_obs.items()})
    assert vec.pending == sum(s.pending for s in singles)
    vec.truncate()
    for s in singles:
        s.truncate()
    vec.close()
    for s in singles:
        s.close()
    got, want = vc.inserted_rows(), ref.inserted_rows()
    assert len(got) == len(want) > 0
    assert canon(got) == canon(want)


def test_vectorised_adder_refuses_extras_after_plain_steps_and_changes_nothing():
    client = RecordingClient()
    vec = VecNStepTransitionAdder(client, "t", 2, 0.9, 2, insert_batch=1)
    vec.add_first(np.zeros((2, 1)))
    vec.add([0, 0], np.ones(2), np.ones((2, 1)), [False, False], [False, False])
    with pytest.raises(ValueError, match="from the first add on"):
        vec.add([0, 0], np.ones(2), np.ones((2, 1)), [False, False], [False, False], extras={"e": np.zeros(2)})
    with pytest.raises(ValueError, match="from the first add on"):
        vec.add([0, 0], np.ones(2), np.ones((2, 1)), [False, False], [False, False], discounts=np.ones(2))
    assert vec.pending == 2
    vec.add([0, 0], np.ones(2), np.ones((2, 1)), [True, False], [False, False])  # plain steps go on
    assert len(client.inserted_rows()) == 3  # env 0 ended: 2 items; env 1 full: 1
    other = VecNStepTransitionAdder(client, "t", 2, 0.9, 2)
    other.add_first({"o": np.zeros((2, 1))})
    with pytest.raises(ValueError, match=r"extras/e has shape \(3,\)"):
        other.add([0, 0], np.ones(2), {"o": np.ones((2, 1))}, [False] * 2, [False] * 2, extras={"e": np.zeros(3)})
    with pytest.raises(ValueError, match="discount"):
        other.add([0, 0], np.ones(2), {"o": np.ones((2, 1))}, [False] * 2, [False] * 2, discounts=np.array([0.5, 2.0]))
    assert other.pending == 0


def _episode(adder: Any, T: int, end: str = "terminated") -> None:
    adder.add_first(np.array([0.0], np.float32))
    for t in range(T):
        adder.add(
            t,
            float(t),
            np.array([t + 1.0], np.float32),
            end == "terminated" and t == T - 1,
            end == "truncated" and t == T - 1,
            extras={"logp": np.array([-t], np.float32)},
            discount=0.9,
        )


@pytest.mark.parametrize("extras_per", ["step", "both", "item"])
def test_sequence_adder_per_step_extras(extras_per):
    client = RecordingClient()
    adder = SequenceAdder(client, "t", 3, 2, extras_per=extras_per, start_of_episode=True)
    _episode(adder, 4)
    w = client.writers[0]
    assert len(w.items) == 2
    for (_, steps, _, item_extras), starts in zip(w.items, ([0, 1, 2], [2, 3, 4]), strict=True):
        assert [float(s["obs"][0]) for s in steps] == starts
        assert [bool(s["start_of_episode"]) for s in steps] == [t == 0 for t in starts]
        if extras_per == "item":
            assert all("extras" not in s for s in steps)
        else:  # every step's own, zeros on the last observation
            assert [float(s["extras"]["logp"][0]) for s in steps] == [-t if t < 4 else 0.0 for t in starts]
        if extras_per == "step":
            assert item_extras is None
        else:
            assert float(item_extras["logp"][0]) == (-starts[0] if starts[0] < 4 else 0.0)
    assert [float(s["discount"]) for s in w.items[0][1]] == pytest.approx([0.9, 0.9, 0.9])
    assert [float(s["discount"]) for s in w.items[1][1]] == pytest.approx([0.9, 0.0, 0.0])  # terminated, last obs


def test_sequence_adder_step_extras_need_not_be_a_mapping():
    client = RecordingClient()
    adder = SequenceAdder(client, "t", 2, 1, extras_per="step")
    adder.add_first(0)
    adder.add(0, 1.0, 1, False, False, extras=np.array([1.0, 2.0]))
    adder.add(0, 1.0, 2, True, False, extras=np.array([3.0, 4.0]))
    assert [s["extras"].tolist() for s in client.writers[0].items[-1][1]] == [[3.0, 4.0], [0.0, 0.0]]


@pytest.mark.parametrize("T", [1, 2, 3, 4, 5, 6])
def test_sequence_end_behaviors(T):
    """WRITE: the last L steps whatever the period (none when the episode is shorter than L); CONTINUE: no end
    item, no episode break, items every p steps of the stream across episodes."""
    L, p = 3, 2
    write, cont = RecordingClient(), RecordingClient()
    wa = SequenceAdder(write, "t", L, p, end_of_episode_behavior=EndBehavior.WRITE)
    ca = SequenceAdder(cont, "t", L, p, end_of_episode_behavior="continue")
    for adder in (wa, ca):
        _episode(adder, T)
        _episode(adder, T, "truncated")
    obs = lambda item: [float(s["obs"][0]) for s in item[1]]  # noqa: E731
    E = T + 1
    regular = [list(range(t - L, t)) for t in range(L, T + 1) if (t - L) % p == 0]
    end = [list(range(E - L, E))] if E >= L else []
    per_episode = regular + [x for x in end if x not in regular[-1:]]
    assert [obs(i) for i in write.writers[0].items] == [[float(v) for v in x] for x in per_episode * 2]
    stream = list(range(E)) * 2
    want = [stream[t - L : t] for t in range(L, 2 * E + 1) if (t - L) % p == 0]
    assert [obs(i) for i in cont.writers[0].items] == [[float(v) for v in x] for x in want]
    assert ("end_episode",) not in cont.writers[0].calls


def test_continue_reset_breaks_the_stream():
    client = RecordingClient()
    adder = SequenceAdder(client, "t", 2, 1, end_of_episode_behavior="continue")
    _episode(adder, 2)
    adder.add_first(np.zeros(1, np.float32))
    adder.add(0, 1.0, np.ones(1, np.float32), False, False, extras={"logp": np.zeros(1, np.float32)})
    adder.reset()
    assert client.writers[0].calls[-1] == ("end_episode",)


@pytest.mark.parametrize("extras_per", ["step", "both"])
def test_episode_adder_per_step_extras_and_padding(extras_per):
    client = RecordingClient()
    adder = EpisodeAdder(client, "t", 6, padding_fn=lambda s, d: np.full(s, 7, d), extras_per=extras_per)
    _episode(adder, 2)
    (_, steps, _, item_extras) = client.writers[0].items[0]
    assert len(steps) == 6
    assert [float(s["extras"]["logp"][0]) for s in steps] == [0.0, -1.0, 0.0, 7.0, 7.0, 7.0]
    assert [float(s["obs"][0]) for s in steps] == [0.0, 1.0, 2.0, 7.0, 7.0, 7.0]
    assert (item_extras is None) == (extras_per == "step")
