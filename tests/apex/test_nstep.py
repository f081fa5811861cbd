"""NStepBuffer against hand-computed n-step returns and discounts (table-driven, acme-style).

Every case uses observations s_t = [t] and actions a_t = 10 + t, so an expected transition is written as
(t of obs, reward, discount, t of next_obs). gamma = 0.5 and rewards that are powers of two keep the sums exact:
R = sum_{k<m} gamma^k r_{t+k}, D = gamma^m, or 0 when the episode terminated within the m steps.
"""

from __future__ import annotations

import numpy as np
import pytest

from apexrl.apex.nstep import NStepBuffer, Transition, stack_transitions
from apexrl.replay.wire.codec import FieldSpec, TransitionSpec

# step = (reward, terminated, truncated); expected[i] = transitions returned by the i-th add().
CASES = [
    dict(
        name="episode start and middle: nothing until n steps, then one per step",
        n=3,
        gamma=0.5,
        steps=[(1, False, False), (2, False, False), (4, False, False), (8, False, False), (16, False, False)],
        expected=[
            [],
            [],
            [(0, 1 + 0.5 * 2 + 0.25 * 4, 0.125, 3)],  # 3.0
            [(1, 2 + 0.5 * 4 + 0.25 * 8, 0.125, 4)],  # 6.0
            [(2, 4 + 0.5 * 8 + 0.25 * 16, 0.125, 5)],  # 12.0
        ],
    ),
    dict(
        name="termination: every horizon that reaches the terminal has discount 0",
        n=3,
        gamma=0.5,
        steps=[(1, False, False), (2, False, False), (4, False, False), (8, True, False)],
        expected=[
            [],
            [],
            [(0, 3.0, 0.125, 3)],
            [(1, 2 + 2 + 2, 0.0, 4), (2, 4 + 4, 0.0, 4), (3, 8, 0.0, 4)],
        ],
    ),
    dict(
        name="truncation: shorter horizons bootstrap with gamma^m from the last obs",
        n=3,
        gamma=0.5,
        steps=[(1, False, False), (2, False, False), (4, False, False), (8, False, True)],
        expected=[
            [],
            [],
            [(0, 3.0, 0.125, 3)],
            [(1, 6.0, 0.125, 4), (2, 8.0, 0.25, 4), (3, 8.0, 0.5, 4)],
        ],
    ),
    dict(
        name="terminated and truncated on the same step counts as terminated",
        n=2,
        gamma=0.5,
        steps=[(2, False, False), (4, True, True)],
        expected=[[], [(0, 2 + 2, 0.0, 2), (1, 4, 0.0, 2)]],
    ),
    dict(
        name="n larger than the episode, terminated",
        n=5,
        gamma=0.5,
        steps=[(1, False, False), (2, False, False), (4, True, False)],
        expected=[[], [], [(0, 1 + 1 + 1, 0.0, 3), (1, 2 + 2, 0.0, 3), (2, 4, 0.0, 3)]],
    ),
    dict(
        name="n larger than the episode, truncated",
        n=5,
        gamma=0.5,
        steps=[(1, False, False), (2, False, False), (4, False, True)],
        expected=[[], [], [(0, 3.0, 0.125, 3), (1, 4.0, 0.25, 3), (2, 4.0, 0.5, 3)]],
    ),
    dict(
        name="episode ends exactly at n steps",
        n=2,
        gamma=0.5,
        steps=[(1, False, False), (2, True, False)],
        expected=[[], [(0, 1 + 1, 0.0, 2), (1, 2, 0.0, 2)]],
    ),
    dict(
        name="one-step episode",
        n=3,
        gamma=0.5,
        steps=[(-1, True, False)],
        expected=[[(0, -1.0, 0.0, 1)]],
    ),
    dict(
        name="n = 1: one-step transitions",
        n=1,
        gamma=0.5,
        steps=[(1, False, False), (2, False, False), (4, True, False)],
        expected=[[(0, 1.0, 0.5, 1)], [(1, 2.0, 0.5, 2)], [(2, 4.0, 0.0, 3)]],
    ),
    dict(
        name="n = 1 truncated keeps gamma",
        n=1,
        gamma=0.5,
        steps=[(1, False, False), (2, False, True)],
        expected=[[(0, 1.0, 0.5, 1)], [(1, 2.0, 0.5, 2)]],
    ),
    dict(
        name="gamma = 0: only the first reward, no bootstrap",
        n=3,
        gamma=0.0,
        steps=[(1, False, False), (2, False, False), (4, False, False), (8, False, True)],
        expected=[[], [], [(0, 1.0, 0.0, 3)], [(1, 2.0, 0.0, 4), (2, 4.0, 0.0, 4), (3, 8.0, 0.0, 4)]],
    ),
    dict(
        name="gamma = 1: plain sums",
        n=2,
        gamma=1.0,
        steps=[(1, False, False), (2, False, False), (4, False, True)],
        expected=[[], [(0, 3.0, 1.0, 2)], [(1, 6.0, 1.0, 3), (2, 4.0, 1.0, 3)]],
    ),
]


def obs(t: int) -> np.ndarray:
    return np.array([t], dtype=np.float32)


def run_episode(buf: NStepBuffer, steps, t0: int = 0) -> list[list[Transition]]:
    buf.add_first(obs(t0))
    out = []
    for k, (r, term, trunc) in enumerate(steps):
        t = t0 + k
        out.append(buf.add(10 + t, r, obs(t + 1), term, trunc))
    return out


def check(got: list[list[Transition]], expected, t0: int = 0) -> None:
    assert [len(g) for g in got] == [len(e) for e in expected]
    for g_step, e_step in zip(got, expected):
        for tr, (t, reward, discount, t_next) in zip(g_step, e_step):
            assert tr.obs[0] == t + t0
            assert tr.action == 10 + t + t0
            assert tr.reward == pytest.approx(reward, abs=1e-12)
            assert tr.discount == pytest.approx(discount, abs=1e-12)
            assert tr.next_obs[0] == t_next + t0


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_nstep_cases(case):
    buf = NStepBuffer(case["n"], case["gamma"])
    check(run_episode(buf, case["steps"]), case["expected"])
    ended = case["steps"][-1][1] or case["steps"][-1][2]
    assert len(buf) == (0 if ended else case["n"] - 1)
    assert buf.in_episode == (not ended)


@pytest.mark.parametrize("case", [c for c in CASES if c["steps"][-1][1] or c["steps"][-1][2]], ids=lambda c: c["name"])
def test_second_episode_starts_clean(case):
    """Nothing of the first episode leaks into the second (same expectations, shifted by 100)."""
    buf = NStepBuffer(case["n"], case["gamma"])
    run_episode(buf, case["steps"])
    check(run_episode(buf, case["steps"], t0=100), case["expected"], t0=100)


def test_emitted_count_equals_steps():
    buf = NStepBuffer(3, 0.9)
    total = emitted = 0
    for length in [1, 2, 3, 4, 7]:
        got = run_episode(buf, [(1.0, False, False)] * (length - 1) + [(1.0, False, True)])
        total += length
        emitted += sum(len(g) for g in got)
        assert [tr.obs[0] for g in got for tr in g] == list(range(length))  # oldest first, each once
    assert emitted == total


def test_truncate_mid_episode_emits_pending_steps_as_a_time_limit_cut():
    buf = NStepBuffer(3, 0.5)
    obs = [np.array([float(t)]) for t in range(4)]
    buf.add_first(obs[0])
    assert buf.add(0, 1.0, obs[1], False, False) == []
    assert buf.add(1, 2.0, obs[2], False, False) == []
    got = buf.truncate()
    # t=0: R = 1 + 0.5*2 = 2, D = 0.5^2, next = s_2; t=1: R = 2, D = 0.5, next = s_2 (bootstraps: not terminal)
    assert [(tr.obs[0], tr.reward, tr.discount, tr.next_obs[0]) for tr in got] == [
        (0.0, 2.0, 0.25, 2.0),
        (1.0, 2.0, 0.5, 2.0),
    ]
    assert not buf.in_episode and buf.truncate() == []
    buf.add_first(obs[3])  # a new episode may start


def test_discount_is_python_float_and_exact_power():
    buf = NStepBuffer(3, 0.99)
    got = run_episode(buf, [(0.0, False, False)] * 3)
    tr = got[2][0]
    assert isinstance(tr.reward, float) and isinstance(tr.discount, float)
    assert tr.discount == 0.99**3


# -- stack_transitions ----------------------------------------------------------------------------------------


def transitions(obs_fn, action_fn, k=3):
    return [Transition(obs_fn(i), action_fn(i), 0.5 * i, 0.25 * i, obs_fn(i + 1)) for i in range(k)]


def test_stack_dpg_spec():
    spec = TransitionSpec.dpg(3, 2)
    ts = transitions(lambda i: np.full(3, i, np.float64), lambda i: np.full(2, -i, np.float32))
    b = stack_transitions(ts, spec)
    assert list(b) == ["obs", "action", "reward", "discount", "next_obs"]
    for k, dt, shape in [
        ("obs", np.float32, (3, 3)),
        ("action", np.float32, (3, 2)),
        ("reward", np.float32, (3,)),
        ("discount", np.float32, (3,)),
        ("next_obs", np.float32, (3, 3)),
    ]:
        assert b[k].dtype == dt and b[k].shape == shape, k
    np.testing.assert_array_equal(b["reward"], [0.0, 0.5, 1.0])
    np.testing.assert_array_equal(b["discount"], [0.0, 0.25, 0.5])
    np.testing.assert_array_equal(b["next_obs"][:, 0], [1, 2, 3])
    np.testing.assert_array_equal(b["action"][2], [-2, -2])
    data, offsets = spec.encode(b)  # the codec takes it as is
    np.testing.assert_array_equal(spec.decode(data, offsets)["obs"], b["obs"])


def test_stack_atari_spec():
    spec = TransitionSpec.atari(4, 84, 84)
    ts = transitions(lambda i: np.full((4, 84, 84), i, np.uint8), lambda i: i, k=2)
    b = stack_transitions(ts, spec)
    assert b["obs"].dtype == np.uint8 and b["obs"].shape == (2, 4, 84, 84)
    assert b["action"].dtype == np.int32 and b["action"].shape == (2,)
    assert b["reward"].dtype == np.float32 and b["discount"].dtype == np.float32
    assert b["next_obs"][1, 3, 83, 83] == 2


def test_stack_vector_dqn_spec():
    spec = TransitionSpec(
        [
            FieldSpec("obs", "f4", (2,)),
            FieldSpec("action", "i4"),
            FieldSpec("reward", "f4"),
            FieldSpec("discount", "f4"),
            FieldSpec("next_obs", "f4", (2,)),
        ]
    )
    b = stack_transitions(transitions(lambda i: np.array([i, i], np.float32), lambda i: np.int64(i)), spec)
    assert b["action"].dtype == np.int32
    np.testing.assert_array_equal(b["action"], [0, 1, 2])


def test_stack_rejects_wrong_shape_and_fields():
    spec = TransitionSpec.dpg(3, 2)
    with pytest.raises(ValueError, match="transition 0: field 'obs' has shape"):
        stack_transitions(transitions(lambda i: np.zeros(4), lambda i: np.zeros(2)), spec)
    with pytest.raises(ValueError, match=r"spec fields \['x'\] are not n-step transition fields"):
        stack_transitions([], TransitionSpec([FieldSpec("x", "f4")]))


def test_stack_takes_only_the_fields_the_spec_names():
    # An agent's spec decides the fields: one that stores no next_obs (e.g. frames rebuilt elsewhere) is fine.
    spec = TransitionSpec([FieldSpec("obs", "f4", (2,)), FieldSpec("reward", "f4")])
    b = stack_transitions(transitions(lambda i: np.array([i, i], np.float32), lambda i: i), spec)
    assert list(b) == ["obs", "reward"]
    np.testing.assert_array_equal(b["reward"], [0.0, 0.5, 1.0])


# -- errors -----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", [0, -1, 1.5, True, "3"])
def test_bad_n(n):
    with pytest.raises(ValueError, match="n must be an int >= 1"):
        NStepBuffer(n, 0.9)


@pytest.mark.parametrize("gamma", [-0.1, 1.01, float("nan"), float("inf"), None])
def test_bad_gamma(gamma):
    with pytest.raises(ValueError, match=r"gamma must be a float in \[0, 1\]"):
        NStepBuffer(3, gamma)


def test_add_before_add_first():
    with pytest.raises(RuntimeError, match="call add_first"):
        NStepBuffer(3, 0.9).add(0, 1.0, obs(1), False, False)


def test_add_after_episode_end():
    buf = NStepBuffer(3, 0.9)
    run_episode(buf, [(1.0, True, False)])
    with pytest.raises(RuntimeError, match="call add_first"):
        buf.add(0, 1.0, obs(1), False, False)


def test_add_first_twice_is_an_error_and_reset_drops_the_episode():
    buf = NStepBuffer(3, 0.5)
    buf.add_first(obs(0))
    buf.add(0, 1.0, obs(1), False, False)
    with pytest.raises(RuntimeError, match="episode is still open"):
        buf.add_first(obs(0))
    assert len(buf) == 1  # the failed call changed nothing
    buf.reset()
    assert len(buf) == 0 and not buf.in_episode
    check(run_episode(buf, CASES[1]["steps"]), CASES[1]["expected"])


def test_non_finite_reward():
    buf = NStepBuffer(3, 0.9)
    buf.add_first(obs(0))
    with pytest.raises(ValueError, match="reward must be finite"):
        buf.add(0, float("nan"), obs(1), False, False)
    assert len(buf) == 0


@pytest.mark.parametrize("n", [1, 3, 5])
def test_vec_nstep_gives_k_buffers_transitions_in_their_order(n):
    """VecNStep over K environments = K NStepBuffers fed one environment after another: same values (bit for
    bit), same order, across terminations, truncations and the final truncate()."""
    from apexrl.apex.nstep import VecNStep

    k, gamma, rng = 4, 0.97, np.random.default_rng(n)
    vec, buffers = VecNStep(k, n, gamma), [NStepBuffer(n, gamma) for _ in range(k)]
    handle = iter(range(10**6))
    first = [next(handle) for _ in range(k)]
    vec.add_first(range(k), first)
    for b, h in zip(buffers, first):
        b.add_first(h)
    got, want = [], []
    for _ in range(200):
        actions = rng.integers(5, size=k)
        rewards = rng.normal(size=k) * 10
        ends = rng.random(k)
        terminated, truncated = ends < 0.06, (ends >= 0.06) & (ends < 0.1)
        nexts = np.array([next(handle) for _ in range(k)])
        for j, b in enumerate(buffers):
            want += b.add(int(actions[j]), rewards[j], int(nexts[j]), terminated[j], truncated[j])
        out = vec.add(actions, rewards, nexts, terminated, truncated)
        if out is not None:
            got += [Transition(*row) for row in zip(*(out[f].tolist() for f in Transition._fields))]
        ended = np.flatnonzero(terminated | truncated)
        if ended.size:
            starts = [next(handle) for _ in ended]
            vec.add_first(ended, starts)
            for j, h in zip(ended, starts):
                buffers[j].add_first(h)
    for b in buffers:
        want += b.truncate()
    tail = vec.truncate()
    assert (tail is None) == (n == 1)  # n = 1: nothing is ever pending
    if tail is not None:
        got += [Transition(*row) for row in zip(*(tail[f].tolist() for f in Transition._fields))]
    assert len(want) == 200 * k and got == want
