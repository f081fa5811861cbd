"""Your own sequence learner on apexrl: a recurrent Q-learner (R2D2-style, much reduced) on Masked CartPole.

MaskedCartPole-v1 (``apexrl.envs.masked``) is CartPole without its two velocities in the observation: a policy
that sees one observation cannot balance the pole for long, one with memory can infer the velocities from the
last few. So the learner trains on sequences, not transitions:

- the environment loop steps a GRU Q-network (epsilon-greedy) and writes every step once with ``SequenceAdder``:
  items of ``--length`` steps starting every ``--period`` steps (overlapping), each with the GRU state the actor
  had at its first step as the item's ``extras`` (R2D2's "stored state");
- the learner samples ``(n, T, ...)`` batches from a prioritized table with ``client.sample``: ``.fields`` (the
  steps), ``.mask`` (False past an episode's end: no padding is stored, ``pad_end_of_episode=False``) and
  ``.extras`` (the stored states), unrolls the GRU from the stored state, and minimises the masked, importance-
  weighted one-step double-Q TD error;
- each sequence's new priority is R2D2's mix 0.9 * max |TD| + 0.1 * mean |TD| over its valid steps, sent with
  ``client.update_priorities``.

What it learns and how to see it: Q-values of observation *histories*; the ``episode`` lines print the returns
of the epsilon-greedy actor (random play: about 20) and the ``update`` lines the masked TD loss. With the
defaults (seed 0) the mean return over 4k steps stayed about 20 while epsilon was high, then rose to about 80-100
by steps 28-40k (single episodes up to about 190); 40k steps took about 6 minutes on a loaded 2-core machine. It
is an example of the data path, not a tuned agent: far from CartPole's 500.

    python examples/sequence_learner.py                   # 40k environment steps
    python examples/sequence_learner.py --steps 2000 --seed 3
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn

import apexrl.envs.masked  # registers MaskedCartPole-v1 with gymnasium
from apexrl.replay import MinSize, ReplayClient, ReplayServer, SequenceAdder, ServerConfig, TableConfig


class RecurrentQ(nn.Module):
    """obs -> MLP -> GRU cell -> Q(history, .)."""

    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.hidden = hidden
        self.embed = nn.Sequential(nn.Linear(obs_dim, hidden), nn.ReLU())
        self.gru = nn.GRUCell(hidden, hidden)
        self.head = nn.Linear(hidden, n_actions)

    def step(self, obs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h = self.gru(self.embed(obs), h)
        return self.head(h), h

    def unroll(self, obs: torch.Tensor, h: torch.Tensor) -> torch.Tensor:
        """obs (n, T, obs_dim), h (n, hidden) the state before obs[:, 0] -> Q (n, T, actions)."""
        qs = []
        for t in range(obs.shape[1]):
            q, h = self.step(obs[:, t], h)
            qs.append(q)
        return torch.stack(qs, 1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default=apexrl.envs.masked.ENV_ID, help="a gymnasium id with a Discrete action space")
    p.add_argument("--steps", type=int, default=40_000, help="environment steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=32, help="sequences per batch")
    p.add_argument("--length", type=int, default=20, help="steps per sequence (T)")
    p.add_argument("--period", type=int, default=10, help="steps between the starts of two sequences")
    p.add_argument("--learning-starts", type=int, default=1000)
    p.add_argument("--train-every", type=int, default=4, help="environment steps per update")
    p.add_argument("--gamma", type=float, default=0.99)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    # Small networks: one thread is fastest, and leaves the other cores to the replay server and sampler threads.
    torch.set_num_threads(1)
    rng = np.random.default_rng(args.seed)

    env = gym.make(args.env)
    assert isinstance(env.action_space, gym.spaces.Discrete), f"{args.env} has no Discrete action space"
    obs_dim, n_actions = gym.spaces.flatdim(env.observation_space), int(env.action_space.n)
    net, target = RecurrentQ(obs_dim, n_actions), RecurrentQ(obs_dim, n_actions)
    target.load_state_dict(net.state_dict())
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    # A prioritized table of sequences (alpha 0.6, as R2D2's 0.9 max + 0.1 mean priorities expect).
    table = TableConfig("sequences", capacity=5_000, rate_limiter=MinSize(args.batch_size))
    with ReplayServer(ServerConfig(port=0, tables=[table])) as server, ReplayClient(server.endpoint) as client:
        adder = SequenceAdder(client, "sequences", args.length, args.period, pad_end_of_episode=False)
        obs, _ = env.reset(seed=args.seed)
        adder.add_first(obs)
        h = torch.zeros(1, net.hidden)
        episode, episode_return, updates = 0, 0.0, 0
        for step in range(1, args.steps + 1):
            epsilon = max(0.05, 1.0 - step / (0.5 * args.steps))
            with torch.no_grad():
                q, h_next = net.step(torch.as_tensor(obs, dtype=torch.float32)[None], h)
            action = int(rng.integers(n_actions)) if rng.random() < epsilon else int(q.argmax())
            next_obs, reward, terminated, truncated, _ = env.step(action)
            # extras: the state the actor had before this step's observation; each item keeps its first step's
            adder.add(action, reward, next_obs, terminated, truncated, extras={"h": h[0].numpy()})
            obs, h, episode_return = next_obs, h_next, episode_return + float(reward)
            if terminated or truncated:
                episode += 1
                print(f"episode {episode}  step {step}  return {episode_return:.0f}", flush=True)
                obs, _ = env.reset()
                adder.add_first(obs)
                h, episode_return = torch.zeros(1, net.hidden), 0.0

            if step > args.learning_starts and step % args.train_every == 0:
                if updates == 0:
                    adder.flush()  # the items the writer still holds
                loss = train_step(client, net, target, opt, args)
                updates += 1
                if updates % 500 == 0:
                    target.load_state_dict(net.state_dict())
                if updates % 250 == 0:
                    print(f"update {updates}  step {step}  loss {loss:.4f}", flush=True)
        adder.close()
        print(f"done: {args.steps} steps, {episode} episodes, {updates} updates")


def train_step(client: ReplayClient, net: RecurrentQ, target: RecurrentQ, opt: torch.optim.Optimizer, args) -> float:
    """One update on a batch of sequences; sends the sequences' new priorities back."""
    batch = client.sample(args.batch_size, table="sequences")
    f = batch.fields  # each (n, T, ...): obs_t, action a_t, reward r_{t+1}, discount (0 where a_t terminated)
    obs = torch.as_tensor(f["obs"], dtype=torch.float32)
    action = torch.as_tensor(f["action"], dtype=torch.int64)
    reward = torch.as_tensor(f["reward"])
    discount = torch.as_tensor(f["discount"])
    mask = torch.as_tensor(batch.mask)  # (n, T): False past the episode's end
    h0 = torch.as_tensor(batch.extras["h"], dtype=torch.float32)  # (n, hidden): the actor's state at step 0

    q = net.unroll(obs, h0)  # (n, T, A)
    with torch.no_grad():
        q_target = target.unroll(obs, h0)
        best = q.argmax(-1, keepdim=True)  # double Q: the online net picks, the target net evaluates
        bootstrap = q_target.gather(-1, best).squeeze(-1)
        y = reward[:, :-1] + args.gamma * discount[:, :-1] * bootstrap[:, 1:]
    q_taken = q[:, :-1].gather(-1, action[:, :-1, None]).squeeze(-1)
    # A step trains where it and the step after it are real (the episode's last observation has no action).
    valid = (mask[:, :-1] & mask[:, 1:]).float()
    td = (q_taken - y) * valid
    weights = torch.as_tensor(batch.weights, dtype=torch.float32)
    loss = (weights[:, None] * td.pow(2)).sum() / valid.sum().clamp(min=1)
    opt.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(net.parameters(), 10.0)
    opt.step()

    abs_td = td.detach().abs()
    mean_td = abs_td.sum(1) / valid.sum(1).clamp(min=1)
    priorities = 0.9 * abs_td.max(1).values + 0.1 * mean_td + 1e-3
    client.update_priorities(batch.keys, priorities.numpy().astype(np.float64), table="sequences")
    return float(loss)


if __name__ == "__main__":
    main()
