"""Your own SAC learner on apexrl: a uniform replay table, your own environment loop and networks.

What it shows (docs/own_learner.md walks through it): an in-process replay server with one uniform table, a
gymnasium loop that writes one-step transitions with ``TransitionAdder``, ``ReplayDataset`` feeding batches of
those transitions (``b["fields"]``: the mapping the adder inserted) to a plain PyTorch SAC (Haarnoja et al. 2018:
two Q critics with target copies, a tanh-Gaussian actor, the entropy temperature tuned to -|A|).

    python examples/uniform_sac.py                        # Pendulum-v1, 20k environment steps
    python examples/uniform_sac.py --env MountainCarContinuous-v0 --steps 50000 --seed 1

Progress: one line per finished episode, ``episode N  step S  return R``. On Pendulum-v1 the returns are about
-900..-1600 while it acts randomly (the first ``--learning-starts`` steps) and reach about -120..-250 within 5-10k
steps (seed 0: -118 at step 8200); 20k steps took about 10 minutes on a loaded 2-core machine.
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from apexrl.replay import MinSize, ReplayClient, ReplayDataset, ReplayServer, ServerConfig, TableConfig, TransitionAdder


def mlp(inp: int, out: int, hidden: int = 256) -> nn.Sequential:
    return nn.Sequential(
        nn.Linear(inp, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(), nn.Linear(hidden, out)
    )


class Actor(nn.Module):
    """A tanh-squashed Gaussian policy, scaled to the action bounds."""

    scale: torch.Tensor
    shift: torch.Tensor

    def __init__(self, obs_dim: int, act_dim: int, low: np.ndarray, high: np.ndarray):
        super().__init__()
        self.net = mlp(obs_dim, 2 * act_dim)
        self.register_buffer("scale", torch.as_tensor((high - low) / 2, dtype=torch.float32))
        self.register_buffer("shift", torch.as_tensor((high + low) / 2, dtype=torch.float32))

    def forward(self, obs: torch.Tensor, deterministic: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        mean, log_std = self.net(obs).chunk(2, dim=-1)
        std = log_std.clamp(-5, 2).exp()
        u = mean if deterministic else mean + std * torch.randn_like(mean)
        a = torch.tanh(u)
        # log pi(a|s) of the squashed Gaussian (the change of variables through tanh)
        logp = torch.distributions.Normal(mean, std).log_prob(u) - torch.log(1 - a.pow(2) + 1e-6)
        return a * self.scale + self.shift, logp.sum(-1)


class Critic(nn.Module):
    """Two Q networks: the target takes their minimum (clipped double-Q)."""

    def __init__(self, obs_dim: int, act_dim: int):
        super().__init__()
        self.q1, self.q2 = mlp(obs_dim + act_dim, 1), mlp(obs_dim + act_dim, 1)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, act], -1)
        return self.q1(x).squeeze(-1), self.q2(x).squeeze(-1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="Pendulum-v1", help="a gymnasium id with a Box action space")
    p.add_argument("--steps", type=int, default=20_000, help="environment steps")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=256)
    p.add_argument("--learning-starts", type=int, default=1000, help="random actions before learning starts")
    p.add_argument("--gamma", type=float, default=0.99)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    # Small networks: one thread is fastest, and leaves the other cores to the replay server and sampler threads.
    torch.set_num_threads(1)
    np.random.seed(args.seed)

    env = gym.make(args.env)
    assert isinstance(env.action_space, gym.spaces.Box), f"{args.env} has no continuous (Box) action space"
    obs_dim, act_dim = gym.spaces.flatdim(env.observation_space), gym.spaces.flatdim(env.action_space)
    actor = Actor(obs_dim, act_dim, env.action_space.low, env.action_space.high)
    critic = Critic(obs_dim, act_dim)
    target = Critic(obs_dim, act_dim)
    target.load_state_dict(critic.state_dict())
    log_alpha = torch.zeros((), requires_grad=True)
    actor_opt = torch.optim.Adam(actor.parameters(), lr=3e-4)
    critic_opt = torch.optim.Adam(critic.parameters(), lr=3e-4)
    alpha_opt = torch.optim.Adam([log_alpha], lr=3e-4)

    # 1. A replay server in this process: one uniform table, sampled once it holds a batch.
    table = TableConfig("replay", sampler="uniform", capacity=100_000, rate_limiter=MinSize(args.batch_size))
    with ReplayServer(ServerConfig(port=0, tables=[table])) as server, ReplayClient(server.endpoint) as client:
        # 2. The adder turns the environment loop into items {obs, action, reward, discount, next_obs}.
        adder = TransitionAdder(client, "replay")
        # 3. Batches of those items, sampled and decoded in background threads; created when learning starts.
        dataset = ReplayDataset(client, args.batch_size, decode="structure", table="replay")
        batches = None

        obs, _ = env.reset(seed=args.seed)
        adder.add_first(obs)
        episode, episode_return = 0, 0.0
        for step in range(1, args.steps + 1):
            if step <= args.learning_starts:
                action = env.action_space.sample()
            else:
                with torch.no_grad():
                    action = actor(torch.as_tensor(obs, dtype=torch.float32)[None])[0][0].numpy()
            next_obs, reward, terminated, truncated, _ = env.step(action)
            adder.add(action, reward, next_obs, terminated, truncated)
            episode_return += float(reward)
            obs = next_obs
            if terminated or truncated:
                episode += 1
                print(f"episode {episode}  step {step}  return {episode_return:.1f}", flush=True)
                obs, _ = env.reset()
                adder.add_first(obs)
                episode_return = 0.0

            if step > args.learning_starts:
                if batches is None:
                    adder.flush()  # the transitions still buffered by the adder
                    batches = iter(dataset)
                opts = (actor_opt, critic_opt, alpha_opt)
                train_step(next(batches)["fields"], actor, critic, target, log_alpha, act_dim, args.gamma, opts)
        adder.close()
        print(f"done: {args.steps} steps, {episode} episodes, {client.tables()['replay']['size']} transitions stored")


def train_step(fields, actor, critic, target, log_alpha, act_dim, gamma, opts) -> None:
    """One SAC update from a batch of transitions (numpy arrays with a leading batch dimension)."""
    actor_opt, critic_opt, alpha_opt = opts
    obs = torch.as_tensor(fields["obs"], dtype=torch.float32)
    act = torch.as_tensor(fields["action"], dtype=torch.float32)
    rew = torch.as_tensor(fields["reward"])
    # discount: 1.0, or 0.0 where the action terminated the episode (a time limit still bootstraps)
    disc = gamma * torch.as_tensor(fields["discount"])
    next_obs = torch.as_tensor(fields["next_obs"], dtype=torch.float32)
    alpha = log_alpha.exp().detach()

    with torch.no_grad():
        next_act, next_logp = actor(next_obs)
        q_next = torch.min(*target(next_obs, next_act)) - alpha * next_logp
        y = rew + disc * q_next
    q1, q2 = critic(obs, act)
    critic_loss = (q1 - y).pow(2).mean() + (q2 - y).pow(2).mean()
    critic_opt.zero_grad()
    critic_loss.backward()
    critic_opt.step()

    new_act, logp = actor(obs)
    actor_loss = (alpha * logp - torch.min(*critic(obs, new_act))).mean()
    actor_opt.zero_grad()
    actor_loss.backward()
    actor_opt.step()

    alpha_loss = -(log_alpha * (logp.detach() - act_dim)).mean()  # target entropy -|A|
    alpha_opt.zero_grad()
    alpha_loss.backward()
    alpha_opt.step()

    with torch.no_grad():  # Polyak averaging of the target critics
        for t, s in zip(target.parameters(), critic.parameters()):
            t.mul_(0.995).add_(s, alpha=0.005)


if __name__ == "__main__":
    main()
