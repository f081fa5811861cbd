"""Masked CartPole: CartPole-v1 seen through (x, theta) only, through the gym family and its vector form."""

from __future__ import annotations

import numpy as np

from apexrl.envs import env_spec, make_env, make_vec_env
from apexrl.envs.base import SerialVecEnv
from apexrl.envs.masked import KEPT, NAME


def test_the_name_resolves_through_the_gym_family_with_cartpoles_spec_less_two_dimensions():
    spec = env_spec(NAME)
    assert NAME == "gym:apexrl.envs.masked:MaskedCartPole-v1"
    assert spec.obs_shape == (2,) and spec.obs_dtype == np.float32
    assert spec.num_actions == 2 and spec.action_dim is None and spec.max_episode_steps == 500


def test_it_is_cartpole_v1_without_the_velocities_step_for_step():
    rng = np.random.default_rng(0)
    masked, full = make_env(NAME, 11), make_env("gym:CartPole-v1", 11)
    episodes = 0
    m_obs, f_obs = masked.reset(), full.reset()
    for _ in range(300):
        assert m_obs.dtype == np.float32 and m_obs.shape == (2,)
        np.testing.assert_array_equal(m_obs, f_obs[list(KEPT)])
        a = int(rng.integers(2))
        m, f = masked.step(a), full.step(a)
        assert (m.reward, m.terminated, m.truncated) == (f.reward, f.terminated, f.truncated)
        m_obs, f_obs = m.obs, f.obs
        if m.terminated or m.truncated:
            np.testing.assert_array_equal(m_obs, f_obs[list(KEPT)])
            m_obs, f_obs = masked.reset(), full.reset()
            episodes += 1
    assert episodes >= 5  # random actions drop the pole within a few dozen steps


def test_a_vectorised_actor_steps_masked_copies_not_cartpoles_numpy_twin():
    vec = make_vec_env(NAME, [3, 4, 5])
    assert isinstance(vec, SerialVecEnv)  # CartPoleVecEnv would give 4-dimensional observations
    obs = vec.reset()
    assert obs.shape == (3, 2)
    singles = [make_env(NAME, s) for s in (3, 4, 5)]
    np.testing.assert_array_equal(obs, np.stack([e.reset() for e in singles]))
    step = vec.step([0, 1, 0])
    assert step.obs.shape == (3, 2)
    np.testing.assert_array_equal(step.obs[1], singles[1].step(1).obs)
