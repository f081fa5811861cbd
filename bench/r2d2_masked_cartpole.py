"""R2D2 on masked CartPole in one process, before the replay stores sequences: a check of the agent alone.

Not the issue's benchmark (``apexrl run`` with actors and a replay server; that needs sequence replay): here one
process steps ``--envs`` masked CartPoles with :class:`~apexrl.agents.r2d2.RecurrentPolicy` (the epsilon ladder's
first rungs of a 2-actor run), cuts each environment's stream into items as a sequence adder will (burn-in +
trace + 1 steps, a new one every ``sequence_period`` steps, the input state of each item's first step stored
with it, padded past an episode's end), keeps them in a numpy proportional-priority buffer (alpha, beta, capacity
and warm-up of the ``r2d2-cpu`` preset) and takes one learner step of a batch of sequences per vector step; the
policy pulls the learner's weights every ``params_every_frames`` frames. Every 30 s, and at the end, the greedy
policy (epsilon 0) plays evaluation episodes.

    python bench/r2d2_masked_cartpole.py --seconds 300 --seeds 0 1 2
"""

from __future__ import annotations

import argparse
import dataclasses
import time

import numpy as np
import torch

from apexrl.agents.r2d2 import (
    R2D2_PRESETS,
    R2D2Config,
    R2D2Learner,
    RecurrentPolicy,
    empty_sequences,
    recurrent_batch_policy,
)
from apexrl.envs import env_spec, make_env, make_vec_env
from apexrl.envs.masked import NAME

PRESET = R2D2_PRESETS["r2d2-cpu"]


class Buffer:
    """Sequences in numpy arrays, sampled in proportion to priority ** alpha, IS weights normalised by their max."""

    def __init__(self, capacity: int, template: dict[str, np.ndarray], alpha: float, beta: float, seed: int):
        self.arrays = {k: np.zeros((capacity, *v.shape[1:]), v.dtype) for k, v in template.items()}
        self.priorities = np.zeros(capacity)
        self.capacity, self.size, self.head = capacity, 0, 0
        self.alpha, self.beta = alpha, beta
        self.rng = np.random.default_rng(seed)

    def add(self, item: dict[str, np.ndarray], priority: float) -> None:
        for k, v in self.arrays.items():
            v[self.head] = item[k][0]
        self.priorities[self.head] = priority
        self.head = (self.head + 1) % self.capacity
        self.size = min(self.size + 1, self.capacity)

    def sample(self, n: int) -> tuple[np.ndarray, dict[str, np.ndarray], np.ndarray]:
        p = self.priorities[: self.size] ** self.alpha
        p /= p.sum()
        idx = self.rng.choice(self.size, n, p=p)
        w = (self.size * p[idx]) ** -self.beta
        return idx, {k: v[idx] for k, v in self.arrays.items()}, w / w.max()


class SequenceCutter:
    """One environment's stream -> items of ``length`` steps, one starting every ``period`` steps of an episode."""

    def __init__(self, config: R2D2Config, obs_shape, obs_dtype):
        self.config, self.obs_shape, self.obs_dtype = config, obs_shape, obs_dtype
        self.length = config.min_sequence_length
        self.steps: list[dict] = []
        self.next_start = 0

    def step(self, obs, action, reward, terminated, h, c, final_obs=None) -> list[dict[str, np.ndarray]]:
        """Record one step (its input state h, c); the items it completes. ``final_obs``: the episode ended."""
        self.steps.append(dict(obs=obs, action=action, reward=reward, discount=0.0 if terminated else 1.0, h=h, c=c))
        items = []
        while len(self.steps) >= self.next_start + self.length:
            items.append(self._item(self.next_start))
            self.next_start += self.config.sequence_period
        if final_obs is not None:
            self.steps.append(dict(obs=final_obs))
            while self.next_start < len(self.steps) - 1:
                items.append(self._item(self.next_start))
                self.next_start += self.config.sequence_period
            self.steps, self.next_start = [], 0
        return [i for i in items if i["mask"][0, : self.config.burn_in + 2].all()]  # at least one trained step

    def _item(self, t0: int) -> dict[str, np.ndarray]:
        item = empty_sequences(1, self.length, self.obs_shape, self.obs_dtype, self.config.lstm_size)
        item["state_h"][0], item["state_c"][0] = self.steps[t0]["h"], self.steps[t0]["c"]
        for i, rec in enumerate(self.steps[t0 : t0 + self.length]):
            item["obs"][0, i], item["mask"][0, i] = rec["obs"], True
            if "action" in rec:
                item["action"][0, i], item["reward"][0, i] = rec["action"], rec["reward"]
                item["discount"][0, i] = rec["discount"]
        return item


def evaluate(learner: R2D2Learner, config: R2D2Config, episodes: int) -> float:
    spec = learner.env_spec
    policy = RecurrentPolicy(spec, dataclasses.replace(config, eval_epsilon=0.0), epsilons=[0.0])
    policy.load_policy_state_dict(learner.policy_state_dict())
    returns = []
    for e in range(episodes):
        env = make_env(NAME, 10_000 + e)
        obs, total = env.reset(), 0.0
        policy.reset()
        while True:
            r = env.step(policy.act(obs, explore=False))
            total, obs = total + r.reward, r.obs
            if r.terminated or r.truncated:
                break
        returns.append(total)
    return float(np.mean(returns))


def run(seconds: float, seed: int, k: int) -> list[tuple[float, float]]:
    config = R2D2Config(**PRESET["agent_overrides"])
    spec = env_spec(NAME)
    learner = R2D2Learner(spec, config, seed=seed)
    policy = recurrent_batch_policy(spec, config, list(range(k)), 2 * k, seed)  # actor 0 of a 2-actor run
    policy.load_policy_state_dict(learner.policy_state_dict())
    template = empty_sequences(1, config.min_sequence_length, spec.obs_shape, spec.obs_dtype, config.lstm_size)
    table = PRESET["tables"][0]
    buffer = Buffer(table["capacity"], template, table["alpha"], PRESET["learner"]["beta"], seed)
    cutters = [SequenceCutter(config, spec.obs_shape, spec.obs_dtype) for _ in range(k)]
    pull_every = max(1, PRESET["actor"]["params_every_frames"] // k)
    vec = make_vec_env(NAME, [seed * 100 + j for j in range(k)])
    obs, first = vec.reset(), np.ones(k, bool)
    start = last = time.monotonic()
    curve, vector_steps = [], 0
    while time.monotonic() - start < seconds:
        actions, _, (h, c) = policy.act_batch_values(obs, first)
        step = vec.step(actions)
        vector_steps += 1
        for j, cutter in enumerate(cutters):
            for item in cutter.step(
                obs[j], actions[j], step.reward[j], step.terminated[j], h[j], c[j], step.final_obs.get(j)
            ):
                buffer.add(item, float(policy.initial_priorities(item)[0]))
        first, obs = step.terminated | step.truncated, step.obs
        if buffer.size >= PRESET["learner"]["min_replay_size"]:
            idx, batch, weights = buffer.sample(config.batch_size)
            buffer.priorities[idx], _ = learner.update(batch, weights)
        if vector_steps % pull_every == 0:
            policy.load_policy_state_dict(learner.policy_state_dict())
        if time.monotonic() - last >= 30:
            last = time.monotonic()
            curve.append((last - start, evaluate(learner, config, 5)))
            print(f"seed {seed}  {curve[-1][0]:5.0f} s  {learner.steps:6d} updates  greedy return {curve[-1][1]:.1f}")
    curve.append((time.monotonic() - start, evaluate(learner, config, 20)))
    print(f"seed {seed}  final greedy return over 20 episodes: {curve[-1][1]:.1f}")
    return curve


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=300.0)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--envs", type=int, default=4)
    args = parser.parse_args()
    torch.set_num_threads(1)
    for seed in args.seeds:
        run(args.seconds, seed, args.envs)


if __name__ == "__main__":
    main()
