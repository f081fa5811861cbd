"""Numpy twins of gymnasium environments for vectorised actors: K copies of one task stepped as arrays, each
producing exactly the episodes of its own :class:`~apexrl.envs.gym.GymEnv` (same seed, same actions: the same
observations, rewards and ends, bit for bit; ``tests/envs/test_gym_vector.py`` holds them to gymnasium's own classes).

Why: a gymnasium step of a classic-control task costs a few microseconds of arithmetic inside ~8 µs of Python
calls (wrappers, the action-space check, tuple packing). Stepped one after another, K of them cost K times that
however the actor batches the rest; as arrays, K steps cost about one. gymnasium's own vector classes
(``CartPoleVectorEnv``) draw every copy's resets from one generator, so copy ``j`` would not replay the episodes
of the single environment seeded ``seeds[j]``; the twins here keep one generator per copy, seeded as GymEnv seeds
its environment, and draw from it exactly when and what gymnasium's ``reset`` draws.

A twin is used only where it is exact: the unwrapped class is gymnasium's (not a subclass) and the wrappers are
the ones ``gymnasium.make`` adds (the time limit, which the twin applies, order enforcing and the disabled
environment checker). Every other id steps through :class:`~apexrl.envs.base.SerialVecEnv`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from apexrl.envs.base import EnvSpec, VecEnv, VecStep, backend_seed

__all__ = ["CartPoleVecEnv", "vector_twin"]

_STANDARD_WRAPPERS = ("TimeLimit", "OrderEnforcing", "PassiveEnvChecker")


def _standard_chain(env) -> bool:
    """True when the wrappers around ``env.unwrapped`` are only those gymnasium.make adds by default."""
    while hasattr(env, "env") and env is not env.unwrapped:
        if type(env).__name__ not in _STANDARD_WRAPPERS or type(env).__module__.split(".")[0] != "gymnasium":
            return False
        env = env.env
    return True


def vector_twin(gym_env, spec: EnvSpec, seeds: Sequence[int]) -> VecEnv | None:
    """The numpy twin of ``gym_env`` (a gymnasium environment as ``gymnasium.make`` returned it) for K copies
    seeded ``seeds``, or None when it has none or it would not be exact."""
    if not _standard_chain(gym_env):
        return None
    for cls, make in _twins().items():
        if type(gym_env.unwrapped) is cls:
            return make(gym_env.unwrapped, spec, seeds)
    return None


def _twins() -> dict[type, Callable]:
    from gymnasium.envs.classic_control.cartpole import CartPoleEnv

    return {CartPoleEnv: CartPoleVecEnv}


class CartPoleVecEnv(VecEnv):
    """K copies of gymnasium's ``CartPoleEnv`` (its physics constants, integrator and reward rule) as arrays.

    The state is four contiguous float64 arrays, and every expression is gymnasium's, in its order, over them:
    IEEE arithmetic is the same elementwise, and numpy's cos and sin take the same kernel for one contiguous
    element as for K. Resets draw ``uniform(-0.05, 0.05, size=4)`` from the copy's own generator, seeded once with
    ``backend_seed(seeds[j])`` as GymEnv seeds its environment's first reset."""

    def __init__(self, cartpole, spec: EnvSpec, seeds: Sequence[int]):
        from gymnasium.utils import seeding

        k = len(seeds)
        if k < 1:
            raise ValueError("a vector environment needs at least one environment")
        self.spec, self.num_envs = spec, k
        c = cartpole
        self._force_mag, self._polemass_length, self._total_mass = c.force_mag, c.polemass_length, c.total_mass
        self._gravity, self._length, self._masspole, self._tau = c.gravity, c.length, c.masspole, c.tau
        self._euler = c.kinematics_integrator == "euler"
        self._x_threshold, self._theta_threshold = c.x_threshold, c.theta_threshold_radians
        sutton_barto = bool(getattr(c, "_sutton_barto_reward", False))
        # A live step and the step on which the pole falls (gymnasium's rewards; no step follows a terminal here).
        self._live_reward, self._end_reward = (0.0, -1.0) if sutton_barto else (1.0, 1.0)
        self._rngs = [seeding.np_random(backend_seed(s))[0] for s in seeds]
        self._x, self._x_dot = np.zeros(k), np.zeros(k)
        self._theta, self._theta_dot = np.zeros(k), np.zeros(k)
        self._elapsed = np.zeros(k, np.int64)
        self._started = False

    def _reset_one(self, j: int) -> None:
        self._x[j], self._x_dot[j], self._theta[j], self._theta_dot[j] = self._rngs[j].uniform(
            low=-0.05, high=0.05, size=(4,)
        )
        self._elapsed[j] = 0

    def _obs(self) -> np.ndarray:
        return np.stack((self._x, self._x_dot, self._theta, self._theta_dot), axis=1).astype(np.float32)

    def reset(self) -> np.ndarray:
        for j in range(self.num_envs):
            self._reset_one(j)
        self._started = True
        return self._obs()

    def _actions(self, actions: Sequence) -> np.ndarray:
        k = self.num_envs
        if len(actions) != k:
            raise ValueError(f"{len(actions)} actions for {k} environments")
        a = np.asarray(actions)
        # As a single environment: ints and numpy integers, not bools (a list mixing them makes an int array).
        mixed = not isinstance(actions, np.ndarray) and any(isinstance(x, (bool, np.bool_)) for x in actions)
        if mixed or a.dtype == np.bool_ or not np.issubdtype(a.dtype, np.integer) or a.shape != (k,):
            bad = next(
                (x for x in actions if isinstance(x, (bool, np.bool_)) or not isinstance(x, (int, np.integer))),
                actions[0],
            )
            raise TypeError(f"{self.spec.name}: discrete action must be an int, got {type(bad).__name__}")
        out = (a < 0) | (a >= 2)
        if out.any():
            raise ValueError(f"{self.spec.name}: action {a[out][0]} out of range [0, 2)")
        return a

    def step(self, actions: Sequence) -> VecStep:
        if not self._started:
            raise RuntimeError(f"{self.spec.name}: step() called before reset()")
        a = self._actions(actions)
        x, x_dot, theta, theta_dot = self._x, self._x_dot, self._theta, self._theta_dot
        force = np.where(a == 1, self._force_mag, -self._force_mag)
        costheta = np.cos(theta)
        sintheta = np.sin(theta)
        temp = (force + self._polemass_length * np.square(theta_dot) * sintheta) / self._total_mass
        thetaacc = (self._gravity * sintheta - costheta * temp) / (
            self._length * (4.0 / 3.0 - self._masspole * np.square(costheta) / self._total_mass)
        )
        xacc = temp - self._polemass_length * thetaacc * costheta / self._total_mass
        tau = self._tau
        if self._euler:
            x = x + tau * x_dot
            x_dot = x_dot + tau * xacc
            theta = theta + tau * theta_dot
            theta_dot = theta_dot + tau * thetaacc
        else:  # semi-implicit euler
            x_dot = x_dot + tau * xacc
            x = x + tau * x_dot
            theta_dot = theta_dot + tau * thetaacc
            theta = theta + tau * theta_dot
        self._x, self._x_dot, self._theta, self._theta_dot = x, x_dot, theta, theta_dot
        terminated = (
            (x < -self._x_threshold)
            | (x > self._x_threshold)
            | (theta < -self._theta_threshold)
            | (theta > self._theta_threshold)
        )
        reward = np.where(terminated, self._end_reward, self._live_reward)
        self._elapsed += 1
        truncated = (self._elapsed >= self.spec.max_episode_steps) & ~terminated  # gymnasium's TimeLimit
        obs = self._obs()
        final: dict[int, np.ndarray] = {}
        for j in np.flatnonzero(terminated | truncated).tolist():
            final[j] = obs[j].copy()
            self._reset_one(j)
            obs[j] = (self._x[j], self._x_dot[j], self._theta[j], self._theta_dot[j])
        return VecStep(obs, reward, terminated, truncated, reward.copy(), final)
