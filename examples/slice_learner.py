"""Windows chosen at sample time: the recurrent Q-learner of ``sequence_learner.py`` on a :class:`SliceTable`.

``sequence_learner.py`` cuts its sequences when it writes them (``SequenceAdder``: ``--length`` steps every
``--period``). Here each finished episode is stored once, whole, in an in-process
:class:`apexrl.replay.slices.SliceTable`, and every sample chooses its windows: ``--burn-in`` steps that only warm
up the GRU from the state the actor had at the window's first step (stored with every step, so any step can start a
window), then ``--length`` trained steps, at any start, drawn by priority. Each trained step keeps its own priority
(its last |TD|); a window's is R2D2's 0.9 * max + 0.1 * mean of its trained steps'. Windows may run past an episode's
end (``span=True``: at least one trained step), where ``.mask`` is False.

    python examples/slice_learner.py                   # 40k environment steps
    python examples/slice_learner.py --steps 2000 --burn-in 4 --length 8
    python examples/slice_learner.py --server          # the same table served by a replay server

``--server``: the table is a replay server's slices table (``TableConfig(kind="slices")``, its server in this
process on 127.0.0.1): episodes go in with ``client.insert_episode``, windows come out with ``client.sample`` (its
``.sequences`` are what ``SliceTable.sample`` gives as ``.steps``), and their priorities go back one per window,
R2D2's 0.9 * max + 0.1 * mean of the trained steps' (the server takes one value per window key).
"""

from __future__ import annotations

import argparse
from types import SimpleNamespace
from typing import Any

import gymnasium as gym
import numpy as np
import torch
from sequence_learner import RecurrentQ
from torch import nn

import apexrl.envs.masked  # registers MaskedCartPole-v1 with gymnasium
from apexrl.replay import ReplayClient, ReplayServer, ServerConfig, TableConfig
from apexrl.replay.slices import SliceTable


class ServerTable:
    """``--server``: a replay server's slices table behind SliceTable's calls."""

    def __init__(self, client: ReplayClient) -> None:
        self.client = client

    def insert_episode(self, steps: dict[str, np.ndarray]) -> None:
        self.client.insert_episode(steps, priorities=None, table="episodes")

    def sample(self, n: int, beta: float) -> SimpleNamespace:
        batch = self.client.sample(n, beta=beta, table="episodes")
        return SimpleNamespace(keys=batch.keys, weights=batch.weights, steps=batch.sequences)

    def update_priorities(self, keys: np.ndarray, step_priorities: np.ndarray) -> None:
        window_priorities = 0.9 * step_priorities.max(1) + 0.1 * step_priorities.mean(1)
        self.client.update_priorities(keys, window_priorities, table="episodes")

    def stats(self) -> dict[str, Any]:
        return self.client.tables()["episodes"]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default=apexrl.envs.masked.ENV_ID, help="a gymnasium id with a Discrete action space")
    p.add_argument("--steps", type=int, default=40_000, help="environment steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="windows per batch")
    p.add_argument("--burn-in", type=int, default=5, help="steps that warm up the GRU, not trained")
    p.add_argument("--length", type=int, default=15, help="trained steps per window")
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--train-every", type=int, default=4, help="environment steps per update")
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--server", action="store_true", help="the table served by a replay server (module docstring)")
    args = p.parse_args(argv)
    if not args.server:
        table = SliceTable(50_000, args.length, burn_in=args.burn_in, span=True, strict_length=False, seed=args.seed)
        run(table, args)
        return
    tables = [TableConfig("default"), TableConfig("episodes", kind="slices", capacity=50_000, length=args.length,
                                                  burn_in=args.burn_in, span=args.length - 1, strict_length=False)]  # fmt: skip
    with ReplayServer(ServerConfig(port=0, seed=args.seed, tables=tables)) as server:
        with ReplayClient(server.endpoint) as client:
            run(ServerTable(client), args)


def run(table: SliceTable | ServerTable, args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)

    env = gym.make(args.env)
    assert isinstance(env.action_space, gym.spaces.Discrete), f"{args.env} has no Discrete action space"
    obs_dim, n_actions = gym.spaces.flatdim(env.observation_space), int(env.action_space.n)
    net, target = RecurrentQ(obs_dim, n_actions), RecurrentQ(obs_dim, n_actions)
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    obs, _ = env.reset(seed=args.seed)
    h = torch.zeros(1, net.hidden)
    steps: dict[str, list] = {"obs": [], "action": [], "reward": [], "discount": [], "h": []}
    episode, episode_return, updates = 0, 0.0, 0
    for step in range(1, args.steps + 1):
        epsilon = max(0.05, 1.0 - step / (0.5 * args.steps))
        with torch.no_grad():
            q, h_next = net.step(torch.as_tensor(obs, dtype=torch.float32)[None], h)
        action = int(rng.integers(n_actions)) if rng.random() < epsilon else int(q.argmax())
        next_obs, reward, terminated, truncated, _ = env.step(action)
        # Step t: obs_t, a_t, r_{t+1}, discount (0 where a_t terminated), and the state the actor had before obs_t.
        for key, value in zip(steps, (obs, action, reward, 0.0 if terminated else 1.0, h[0].numpy()), strict=True):
            steps[key].append(value)
        obs, h, episode_return = next_obs, h_next, episode_return + float(reward)
        if terminated or truncated:
            # The episode's last observation is a step of its own (no action), so the last action bootstraps.
            for key, value in zip(steps, (obs, 0, 0.0, 0.0, h[0].numpy()), strict=True):
                steps[key].append(value)
            table.insert_episode(
                {
                    "obs": np.asarray(steps["obs"], dtype=np.float32),
                    "action": np.asarray(steps["action"], dtype=np.int64),
                    "reward": np.asarray(steps["reward"], dtype=np.float32),
                    "discount": np.asarray(steps["discount"], dtype=np.float32),
                    "h": np.asarray(steps["h"], dtype=np.float32),
                }
            )  # new steps get the largest priority so far
            steps = {key: [] for key in steps}
            episode += 1
            print(f"episode {episode}  step {step}  return {episode_return:.0f}", flush=True)
            obs, _ = env.reset()
            h, episode_return = torch.zeros(1, net.hidden), 0.0

        if step > args.learning_starts and step % args.train_every == 0 and table.stats()["windows"]:
            loss = train_step(table, net, target, opt, args)
            updates += 1
            if updates % 500 == 0:
                target.load_state_dict(net.state_dict())
            if updates % 250 == 0:
                print(f"update {updates}  step {step}  loss {loss:.4f}", flush=True)
    stats = table.stats()
    print(f"done: {args.steps} steps, {episode} episodes, {updates} updates, {stats['steps']} steps held")


def train_step(
    table: SliceTable | ServerTable, net: RecurrentQ, target: RecurrentQ, opt: torch.optim.Optimizer, args
) -> float:
    """One update on a batch of windows; sends each trained step's new priority back."""
    batch = table.sample(args.batch_size, beta=0.4)
    f, b = batch.steps.fields, args.burn_in  # each (n, B + L, ...)
    obs = torch.as_tensor(f["obs"])
    action = torch.as_tensor(f["action"])
    reward, discount = torch.as_tensor(f["reward"]), torch.as_tensor(f["discount"])
    mask = torch.as_tensor(batch.steps.mask)  # False past the episode's end
    h0 = torch.as_tensor(f["h"][:, 0])  # the actor's state at the window's first step
    with torch.no_grad():  # burn-in: the state only
        for t in range(b):
            _, h0 = net.step(obs[:, t], h0)
    q = net.unroll(obs[:, b:], h0)  # (n, L, A)
    with torch.no_grad():
        q_target = target.unroll(obs[:, b:], h0)
        bootstrap = q_target.gather(-1, q.argmax(-1, keepdim=True)).squeeze(-1)
        y = reward[:, b:-1] + args.gamma * discount[:, b:-1] * bootstrap[:, 1:]
    q_taken = q[:, :-1].gather(-1, action[:, b:-1, None]).squeeze(-1)
    valid = (mask[:, b:-1] & mask[:, b + 1 :]).float()  # a step trains where it and the next are real
    td = (q_taken - y) * valid
    weights = torch.as_tensor(batch.weights)
    loss = (weights[:, None] * td.pow(2)).sum() / valid.sum().clamp(min=1)
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(net.parameters(), 10.0)
    opt.step()
    # One priority per trained step: |TD| (the last trained step has no target inside the window: its mean).
    abs_td = td.detach().abs().numpy().astype(np.float64)
    last = abs_td.sum(1, keepdims=True) / np.maximum(valid.sum(1, keepdim=True).numpy(), 1)
    table.update_priorities(batch.keys, np.concatenate([abs_td, last], axis=1) + 1e-3)
    return float(loss)


if __name__ == "__main__":
    main()
