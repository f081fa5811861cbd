"""apexrl.envs against the real backends (gymnasium, ale-py, dm-control): specs, episode ends, preprocessing,
action rescaling, seeding and the name registry."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from apexrl.envs import EnvSpec, StepResult, env_names, env_spec, make_env
from apexrl.envs import atari as atari_family
from apexrl.envs import dmc as dmc_family
from apexrl.envs.atari import AtariEnv, clip_reward
from apexrl.envs.base import backend_seed, rescale_action

SPECS = {
    # name: (obs_shape, obs_dtype, num_actions, action_dim, frames_per_step, max_episode_steps)
    "gym:CartPole-v1": ((4,), np.float32, 2, None, 1, 500),
    "gym:Pendulum-v1": ((3,), np.float32, None, 1, 1, 200),
    "gym:Acrobot-v1": ((6,), np.float32, 3, None, 1, 500),
    "gym:MountainCar-v0": ((2,), np.float32, 3, None, 1, 200),
    "gym:MountainCarContinuous-v0": ((2,), np.float32, None, 1, 1, 999),
    "gym:HalfCheetah-v5": ((17,), np.float32, None, 6, 1, 1000),  # MuJoCo, from the control extra
    "atari:Pong": ((4, 84, 84), np.uint8, 6, None, 4, 12_500),
    "atari:Breakout": ((4, 84, 84), np.uint8, 4, None, 4, 12_500),
    "dmc:cartpole-swingup": ((5,), np.float32, None, 1, 1, 1000),
    "dmc:humanoid-run": ((67,), np.float32, None, 21, 1, 1000),
    "dmc:ball_in_cup-catch": ((8,), np.float32, None, 2, 1, 1000),
    "dmc:point_mass-easy": ((4,), np.float32, None, 2, 1, 1000),
}


def random_action(spec: EnvSpec, rng: np.random.Generator):
    if spec.num_actions is not None:
        return int(rng.integers(spec.num_actions))
    return rng.uniform(-1, 1, spec.action_dim).astype(np.float32)


def rollout(name: str, seed: int, steps: int, action_seed: int = 7) -> tuple[np.ndarray, np.ndarray]:
    """Observations and rewards of `steps` steps with a fixed action sequence, resetting at episode ends."""
    rng = np.random.default_rng(action_seed)
    with make_env(name, seed) as env:
        obs, rewards = [env.reset()], []
        for _ in range(steps):
            r = env.step(random_action(env.spec, rng))
            obs.append(r.obs)
            rewards.append(r.reward)
            if r.terminated or r.truncated:
                obs.append(env.reset())
    return np.stack(obs), np.array(rewards)


# --- specs and shapes -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", SPECS)
def test_spec_and_steps_match_the_table(name):
    shape, dtype, num_actions, action_dim, frames, max_steps = SPECS[name]
    expected = EnvSpec(name, shape, np.dtype(dtype), num_actions, action_dim, frames, max_steps)
    assert env_spec(name) == expected
    rng = np.random.default_rng(0)
    with make_env(name, seed=0) as env:
        assert env.spec == expected
        obs = env.reset()
        assert obs.shape == shape and obs.dtype == dtype
        for _ in range(3):
            r = env.step(random_action(env.spec, rng))
            assert isinstance(r, StepResult)
            assert r.obs.shape == shape and r.obs.dtype == dtype
            assert type(r.reward) is float and type(r.raw_reward) is float
            assert type(r.terminated) is bool and type(r.truncated) is bool


def test_returned_observations_are_fresh_arrays():
    for name in ("gym:CartPole-v1", "atari:Pong", "dmc:cartpole-swingup"):
        rng = np.random.default_rng(0)
        with make_env(name, 0) as env:
            first = env.reset()
            kept = first.copy()
            second = env.step(random_action(env.spec, rng)).obs
            env.step(random_action(env.spec, rng))
            assert np.array_equal(first, kept), name
            assert not np.shares_memory(first, second), name


# --- registry -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name",
    ["foo", "gym:Nope-v0", "atari:Pongg", "dmc:cartpole-nope", "dmc:cartpole", "CartPole-v1", "gym:", "nofamily:x", ""],
)
def test_unknown_names_raise_listing_the_families_with_examples(name):
    with pytest.raises(ValueError) as err:
        make_env(name, 0)
    message = str(err.value)
    assert repr(name) in message
    for family in (
        "gym:<id>",
        "gym:CartPole-v1",
        "gym:<module>:<id>",
        "atari:<Game>",
        "atari:Pong",
        "dmc:<domain>-<task>",
        "dmc:cartpole-swingup",
    ):
        assert family in message
    with pytest.raises(ValueError):
        env_spec(name)


@pytest.mark.parametrize(
    "name, why",
    [
        ("gym:Nope-v0", "gymnasium has no environment 'Nope-v0'"),
        ("atari:Pongg", "games: Adventure"),
        ("dmc:cartpole", "tasks: acrobot-swingup"),
    ],
)
def test_an_unknown_id_of_a_known_family_says_what_the_family_offers(name, why):
    with pytest.raises(ValueError, match=why):
        env_spec(name)


def test_env_names_give_examples_of_every_family():
    names = env_names()
    assert len(names) == len(set(names))
    assert {"gym:CartPole-v1", "gym:HalfCheetah-v5", "atari:Pong", "dmc:cartpole-swingup"} <= set(names)
    for name in names:  # every example is a valid name
        assert env_spec(name).name == name
    # Multiplayer-only ROMs ale-py cannot load are not offered.
    with pytest.raises(ValueError, match="no single-player game 'Combat'"):
        env_spec("atari:Combat")


def test_any_registered_gymnasium_id_is_accepted():
    # Not in any list of apexrl's: a toy-text task with a Discrete observation (one-hot) and a limit of 100.
    assert env_spec("gym:FrozenLake-v1") == EnvSpec("gym:FrozenLake-v1", (16,), np.dtype(np.float32), 4, None, 1, 100)
    with make_env("gym:FrozenLake-v1", 0) as env:
        obs = env.reset()
        assert obs.shape == (16,) and obs.sum() == 1.0


def test_importing_the_package_does_not_import_the_backends():
    code = "import sys, apexrl.envs; print(sorted(m for m in ('ale_py', 'dm_control', 'mujoco') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_missing_optional_package_names_the_pip_extra(monkeypatch):
    # sys.modules[x] = None makes `import x` raise ImportError, as if the package were not installed.
    monkeypatch.setitem(sys.modules, "ale_py", None)
    monkeypatch.setitem(sys.modules, "dm_control", None)
    atari_family._games.cache_clear()
    dmc_family._tasks.cache_clear()
    try:
        with pytest.raises(ImportError, match=r"pip install 'apexrl\[atari\]'"):
            make_env("atari:Pong", 0)
        with pytest.raises(ImportError, match=r"pip install 'apexrl\[control\]'"):
            make_env("dmc:cartpole-swingup", 0)
        assert all(n.startswith("gym:") for n in env_names())
        with pytest.raises(ValueError, match=r"apexrl\[atari\].*apexrl\[control\]"):
            make_env("foo", 0)
    finally:
        atari_family._games.cache_clear()
        dmc_family._tasks.cache_clear()


# --- episode protocol -----------------------------------------------------------------------------------------


def test_step_before_reset_or_after_the_end_raises():
    with make_env("gym:CartPole-v1", 0) as env:
        with pytest.raises(RuntimeError, match="reset"):
            env.step(0)
        env.reset()
        while not env.step(0).terminated:
            pass
        with pytest.raises(RuntimeError, match="reset"):
            env.step(0)
        env.reset()
        env.step(0)


@pytest.mark.parametrize(
    "name, action, error",
    [
        ("gym:CartPole-v1", 2, ValueError),
        ("gym:CartPole-v1", -1, ValueError),
        ("gym:CartPole-v1", 0.5, TypeError),
        ("atari:Pong", 6, ValueError),
        ("gym:Pendulum-v1", np.zeros(2, np.float32), ValueError),
        ("gym:Pendulum-v1", np.array([np.nan], np.float32), ValueError),
        ("dmc:cartpole-swingup", np.zeros(3, np.float32), ValueError),
    ],
)
def test_invalid_actions_are_refused(name, action, error):
    with make_env(name, 0) as env:
        env.reset()
        with pytest.raises(error):
            env.step(action)


def test_negative_seed_is_refused():
    with pytest.raises(ValueError, match="seed"):
        make_env("gym:CartPole-v1", -1)
    assert 0 <= backend_seed(2**40) < 2**31


# --- gym --------------------------------------------------------------------------------------------------------


def test_cartpole_pole_falling_is_terminal_and_the_time_limit_is_truncation():
    with make_env("gym:CartPole-v1", 0) as env:
        env.reset()
        steps = 0
        while True:  # always push right: the pole falls within a few dozen steps
            r = env.step(1)
            steps += 1
            if r.terminated or r.truncated:
                break
        assert r.terminated and not r.truncated and steps < 100

        obs = env.reset()
        steps = 0
        while True:  # a simple balancing controller holds the pole until the 500-step limit
            r = env.step(int(obs[2] + 0.5 * obs[3] > 0))
            obs = r.obs
            steps += 1
            if r.terminated or r.truncated:
                break
        assert r.truncated and not r.terminated and steps == 500


def test_pendulum_actions_are_rescaled_from_unit_to_torque_bounds():
    import gymnasium

    # Against the raw gymnasium task seeded the same way: unit action a must act as torque 2a, clipped.
    for unit, torque in [(1.0, 2.0), (-0.5, -1.0), (0.0, 0.0), (3.0, 2.0), (-7.0, -2.0)]:
        raw = gymnasium.make("Pendulum-v1", disable_env_checker=True)
        raw_obs, _ = raw.reset(seed=backend_seed(3))
        with make_env("gym:Pendulum-v1", 3) as env:
            assert np.allclose(env.reset(), raw_obs)
            ours = env.step(np.array([unit], np.float32))
        raw_obs, raw_reward, *_ = raw.step(np.array([torque], np.float32))
        raw.close()
        assert np.allclose(ours.obs, raw_obs) and ours.reward == pytest.approx(raw_reward), unit


def test_rescale_action_maps_the_unit_interval_onto_the_bounds():
    low, high = np.array([-2.0, 0.0, 10.0]), np.array([2.0, 1.0, 30.0])
    assert np.allclose(rescale_action(np.array([-1.0, -1.0, -1.0]), low, high), low)
    assert np.allclose(rescale_action(np.array([1.0, 1.0, 1.0]), low, high), high)
    assert np.allclose(rescale_action(np.array([0.0, 0.5, -0.5]), low, high), [0.0, 0.75, 15.0])


# --- atari ------------------------------------------------------------------------------------------------------


def test_atari_frame_stack_shifts_with_the_newest_frame_last():
    rng = np.random.default_rng(1)
    with make_env("atari:Breakout", 0) as env:
        obs = env.reset()
        # Before the episode's first frame the stack holds zeros.
        assert not obs[:3].any() and obs[3].any()
        for _ in range(20):
            new = env.step(int(rng.integers(4))).obs
            assert np.array_equal(new[:3], obs[1:])
            obs = new


def area_resize(frame: np.ndarray, size: int = 84) -> np.ndarray:
    """Reference area (box-filter) resize: each output pixel is the mean of the input area it covers."""

    def weights(n_in: int) -> np.ndarray:
        scale, w = n_in / size, np.zeros((size, n_in))
        for o in range(size):
            lo, hi = o * scale, (o + 1) * scale
            for i in range(int(lo), int(np.ceil(hi))):
                w[o, i] = (min(hi, i + 1) - max(lo, i)) / scale
        return w

    return weights(frame.shape[0]) @ frame @ weights(frame.shape[1]).T


def test_atari_frame_is_the_max_of_the_last_two_raw_frames_grey_and_area_resized():
    from ale_py import ALEInterface, LoggerMode, roms

    # Reference: drive the emulator frame by frame (no no-ops, so both start from the power-on state).
    ALEInterface.setLoggerMode(LoggerMode.Error)
    ale = ALEInterface()
    ale.setFloat("repeat_action_probability", 0.0)
    ale.loadROM(roms.get_rom_path("breakout"))
    minimal = ale.getMinimalActionSet()
    rng = np.random.default_rng(0)
    with AtariEnv("Breakout", 0, noop_max=0) as env:
        env.reset()
        for _ in range(30):
            action = int(rng.integers(4))
            frames = []
            for _ in range(4):
                ale.act(minimal[action])
                frames.append(ale.getScreenGrayscale().astype(np.float64))
            expected = np.clip(np.round(area_resize(np.maximum(frames[2], frames[3]))), 0, 255)
            newest = env.step(action).obs[-1].astype(np.float64)
            assert np.abs(newest - expected).max() <= 1  # rounding differences only


def test_atari_reward_is_clipped_and_raw_reward_is_the_score():
    assert [clip_reward(r) for r in (-5.0, -1.0, -0.5, 0.0, 0.5, 1.0, 30.0)] == [-1.0, -1.0, -0.5, 0.0, 0.5, 1.0, 1.0]
    # Space Invaders scores 5-30 points per alien; firing from the start hits one within ~100 steps.
    with make_env("atari:SpaceInvaders", 0) as env:
        env.reset()
        big = None
        for _ in range(500):
            r = env.step(1)  # FIRE
            assert r.reward == clip_reward(r.raw_reward)
            if abs(r.raw_reward) > 1:
                big = r
                break
    assert big is not None and big.raw_reward > 1 and big.reward == 1.0


def test_atari_game_over_is_terminal():
    rng = np.random.default_rng(0)
    score = 0.0
    with make_env("atari:Pong", 0) as env:
        env.reset()
        for _ in range(env.spec.max_episode_steps):
            r = env.step(int(rng.integers(6)))
            assert r.reward == r.raw_reward  # Pong's scores are +-1: nothing to clip
            score += r.raw_reward
            if r.terminated or r.truncated:
                break
    # Game over: one side reached 21 points; the random player loses.
    assert r.terminated and not r.truncated
    assert -21 <= score < 0


def test_atari_frame_limit_is_truncation_counted_in_agent_steps():
    # The same env with a 400-frame limit instead of 50 000: 400 frames = 100 agent steps of 4 frames.
    with AtariEnv("Pong", 0, max_episode_frames=400) as env:
        assert env.spec.frames_per_step == 4 and env.spec.max_episode_steps == 100
        env.reset()
        for step in range(1, 101):
            r = env.step(0)
            assert not r.terminated
            assert r.truncated == (step == 100)
        with pytest.raises(RuntimeError):
            env.step(0)


# --- dm-control ---------------------------------------------------------------------------------------------------


def test_dmc_time_limit_is_truncation_not_termination():
    with make_env("dmc:cartpole-swingup", 0) as env:
        env.reset()
        zero = np.zeros(1, np.float32)
        for step in range(1, 1001):
            r = env.step(zero)
            assert not r.terminated
            assert r.truncated == (step == 1000), step


def test_dmc_observations_are_flattened_in_sorted_key_order():
    from dm_control import suite

    raw = suite.load("humanoid", "run", task_kwargs={"random": backend_seed(5)})
    observation = raw.reset().observation
    assert list(observation) != sorted(observation)  # the dict order differs, so the test means something
    expected = np.concatenate([np.asarray(observation[k], np.float32).ravel() for k in sorted(observation)])
    with make_env("dmc:humanoid-run", 5) as env:
        assert np.array_equal(env.reset(), expected)


# --- seeding ------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "name, steps",
    [
        ("gym:CartPole-v1", 300),
        ("gym:Pendulum-v1", 250),
        ("atari:Pong", 150),
        ("dmc:cartpole-swingup", 200),
    ],
)
def test_same_seed_gives_the_same_trajectory(name, steps):
    obs_a, rew_a = rollout(name, seed=11, steps=steps)
    obs_b, rew_b = rollout(name, seed=11, steps=steps)
    assert np.array_equal(obs_a, obs_b) and np.array_equal(rew_a, rew_b)
    obs_c, _ = rollout(name, seed=12, steps=steps)
    assert obs_c.shape != obs_a.shape or not np.array_equal(obs_a, obs_c)
