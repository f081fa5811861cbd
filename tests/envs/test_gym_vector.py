"""The numpy twins of gymnasium environments (``apexrl.envs.gym_vector``) against gymnasium itself: copy ``j``
of a twin gives the episodes of the single environment seeded ``seeds[j]``, bit for bit, for any actions; a twin
is used only where it is exact, and bad actions are refused as a single environment refuses them."""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from apexrl.envs import make_env, make_vec_env
from apexrl.envs.base import SerialVecEnv, backend_seed
from apexrl.envs.gym_vector import CartPoleVecEnv, vector_twin


def _same_step(got, want, t):
    for field in ("obs", "reward", "terminated", "truncated", "raw_reward"):
        a, b = getattr(got, field), getattr(want, field)
        assert a.dtype == b.dtype and a.shape == b.shape and a.tobytes() == b.tobytes(), (t, field, a, b)
    assert got.final_obs.keys() == want.final_obs.keys(), t
    for j, last in got.final_obs.items():
        assert last.tobytes() == want.final_obs[j].tobytes(), (t, j)


def _balance(obs):
    """Push the cart under the pole: long episodes that reach the 500-step time limit."""
    return [int(o[2] + 0.5 * o[3] > 0) for o in obs]


@pytest.mark.parametrize("policy", ["random", "balance"])
def test_cartpole_twin_replays_each_single_environment_bit_for_bit(policy):
    seeds = [0, 3, 7, 2**40 + 5, 12345]
    twin = make_vec_env("gym:CartPole-v1", seeds)
    assert isinstance(twin, CartPoleVecEnv)
    ref = SerialVecEnv([make_env("gym:CartPole-v1", s) for s in seeds])
    obs, ref_obs = twin.reset(), ref.reset()
    assert obs.dtype == ref_obs.dtype == np.float32 and obs.tobytes() == ref_obs.tobytes()
    rng = np.random.default_rng(1)
    ends = truncations = 0
    for t in range(3000):
        actions = rng.integers(0, 2, len(seeds)).tolist() if policy == "random" else _balance(obs)
        step, want = twin.step(actions), ref.step(actions)
        _same_step(step, want, t)
        obs = step.obs
        ends += len(step.final_obs)
        truncations += int(step.truncated.sum())
    assert ends > 20 if policy == "random" else truncations >= len(seeds)  # both kinds of episode end crossed
    twin.close()
    ref.close()


@settings(max_examples=25, deadline=None)
@given(
    seed=st.integers(0, 2**63 - 1),
    actions=st.lists(st.integers(0, 1), min_size=1, max_size=400),
    semi_implicit=st.booleans(),
    sutton_barto=st.booleans(),
)
def test_cartpole_twin_matches_gymnasium_for_any_actions_and_settings(seed, actions, semi_implicit, sutton_barto):
    """One copy against gymnasium's own CartPoleEnv (made as gymnasium.make makes it), for both integrators and
    both reward rules, stepping through episode ends with the copy resetting itself as gymnasium's reset does."""
    env = gymnasium.make("CartPole-v1", sutton_barto_reward=sutton_barto, disable_env_checker=True)
    if semi_implicit:
        env.unwrapped.kinematics_integrator = "semi-implicit"
    spec = make_env("gym:CartPole-v1", 0).spec
    twin = vector_twin(env, spec, [seed])
    assert twin is not None
    want_obs, _ = env.reset(seed=backend_seed(seed))
    got_obs = twin.reset()
    assert got_obs[0].tobytes() == want_obs.tobytes()
    for t, a in enumerate(actions):
        step = twin.step([a])
        obs, reward, terminated, truncated, _ = env.step(a)
        assert (bool(step.terminated[0]), bool(step.truncated[0])) == (terminated, truncated and not terminated), t
        assert step.reward[0] == reward and step.raw_reward[0] == reward, t
        if terminated or truncated:
            assert step.final_obs[0].tobytes() == obs.tobytes(), t
            obs, _ = env.reset()
        assert step.obs[0].tobytes() == obs.tobytes(), t
    env.close()


def test_a_twin_only_where_it_is_exact():
    spec = make_env("gym:CartPole-v1", 0).spec
    plain = gymnasium.make("CartPole-v1", disable_env_checker=True)
    assert isinstance(vector_twin(plain, spec, [1, 2]), CartPoleVecEnv)
    # A wrapper gymnasium.make does not add changes what the environment returns: no twin.
    scaled = gymnasium.wrappers.TransformReward(
        gymnasium.make("CartPole-v1", disable_env_checker=True), lambda r: 2 * r
    )
    assert vector_twin(scaled, spec, [1, 2]) is None

    class Harder(gymnasium.envs.classic_control.cartpole.CartPoleEnv):
        """A subclass may change anything: no twin."""

    assert vector_twin(gymnasium.wrappers.TimeLimit(Harder(), 500), spec, [1, 2]) is None
    # Another gymnasium id steps its K environments one after another.
    assert isinstance(make_vec_env("gym:Acrobot-v1", [1, 2]), SerialVecEnv)
    for env in (plain, scaled):
        env.close()


def test_the_twin_refuses_what_a_single_environment_refuses():
    twin = make_vec_env("gym:CartPole-v1", [1, 2])
    with pytest.raises(RuntimeError, match="before reset"):
        twin.step([0, 1])
    twin.reset()
    with pytest.raises(ValueError, match="3 actions for 2 environments"):
        twin.step([0, 1, 1])
    with pytest.raises(ValueError, match=r"action 2 out of range \[0, 2\)"):
        twin.step([0, 2])
    with pytest.raises(TypeError, match="must be an int, got float"):
        twin.step([0, 1.0])
    with pytest.raises(TypeError, match="must be an int, got bool"):
        twin.step([True, 0])
    # Refused actions changed nothing: the next step is the one a fresh pair takes.
    ref = SerialVecEnv([make_env("gym:CartPole-v1", s) for s in (1, 2)])
    ref.reset()
    _same_step(twin.step([np.int64(1), 0]), ref.step([1, 0]), 0)
