"""Your own on-policy learner on apexrl: PPO (clipped ratio, a value baseline, GAE) on CartPole with per-step
extras and a per-step discount.

An on-policy learner needs, at every step of what it trains on, what the *behaviour* policy computed when it
acted: its log-probability of the action taken (for PPO's ratio, or IMPALA's V-trace) and its value estimate. The
environment loop stores them as per-step extras:

- ``SequenceAdder(..., extras_per="step")`` writes every step once with its own ``extras={"logp", "value"}``;
  the learner samples them with a time axis, ``batch.fields["extras"]["logp"]`` of shape ``(n, T)``, beside
  ``.fields["obs"]``, ``["action"]``, ``["reward"]``, ``["discount"]`` and ``.mask``;
- the table is a FIFO queue whose items are handed out once (``sampler="fifo"``, ``max_times_sampled=1``): the
  loop collects ``--rollout`` steps, then trains on exactly those sequences, then collects again.

The per-step discount: the loop repeats each chosen action ``--action-repeat`` times (``k`` frames, fewer where
the episode ends inside them) and adds one step per decision, its reward the frames' rewards discounted within
the repeat, ``r = sum_i gamma^i r_i``, and ``discount=gamma^(k - 1)`` (the environment's discount of the step,
as dm_env's ``TimeStep.discount``): a learner that multiplies by ``gamma`` then discounts each decision by
``gamma^k``, the frames it lasted (a semi-MDP). A terminated step is stored with discount 0 whatever is passed.

What it learns and how to see it: the ``episode`` lines print returns in frames (random play on CartPole-v1:
about 20). With the defaults (seed 0) the mean return over 25 episodes rose from about 20 to about 60-80 by
30-40k frames; 40k frames took about 25 seconds on a loaded 2-core machine. It is an example of the data path,
not a tuned agent: far from CartPole's 500.

    python examples/onpolicy_learner.py                   # 40k frames
    python examples/onpolicy_learner.py --steps 5000 --action-repeat 1
"""

from __future__ import annotations

import argparse

import gymnasium as gym
import torch
from torch import nn

from apexrl.replay import MinSize, ReplayClient, ReplayServer, SequenceAdder, ServerConfig, TableConfig


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int, n_actions: int, hidden: int = 64):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, hidden), nn.Tanh(), nn.Linear(hidden, hidden), nn.Tanh())
        self.pi = nn.Linear(hidden, n_actions)
        self.v = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.distributions.Categorical, torch.Tensor]:
        x = self.body(obs)
        return torch.distributions.Categorical(logits=self.pi(x)), self.v(x).squeeze(-1)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="CartPole-v1", help="a gymnasium id with a Discrete action space")
    p.add_argument("--steps", type=int, default=40_000, help="environment frames")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int, default=4, help="sequences per minibatch")
    p.add_argument("--length", type=int, default=32, help="steps per sequence (T)")
    p.add_argument("--rollout", type=int, default=512, help="decisions collected between two trainings")
    p.add_argument("--epochs", type=int, default=10, help="passes over each rollout")
    p.add_argument("--action-repeat", type=int, default=2, help="frames per decision (k)")
    p.add_argument("--gamma", type=float, default=0.99, help="discount per frame")
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)

    env = gym.make(args.env)
    assert isinstance(env.action_space, gym.spaces.Discrete), f"{args.env} has no Discrete action space"
    net = ActorCritic(gym.spaces.flatdim(env.observation_space), int(env.action_space.n))
    opt = torch.optim.Adam(net.parameters(), lr=1e-3)

    # A queue of sequences, each handed out once: the learner trains on what the current policy collected.
    table = TableConfig("rollouts", sampler="fifo", capacity=100_000, max_times_sampled=1, rate_limiter=MinSize(1))
    with ReplayServer(ServerConfig(port=0, tables=[table])) as server, ReplayClient(server.endpoint) as client:
        adder = SequenceAdder(
            client, "rollouts", args.length, args.length, end_of_episode_behavior="truncate", extras_per="step"
        )
        obs, _ = env.reset(seed=args.seed)
        adder.add_first(obs)
        frames, decisions, episode, episode_return, updates = 0, 0, 0, 0.0, 0
        while frames < args.steps:
            with torch.no_grad():
                dist, value = net(torch.as_tensor(obs, dtype=torch.float32)[None])
                action = dist.sample()
            # k frames of one action: their rewards discounted within the repeat, discount gamma^(k - 1)
            reward, k, terminated, truncated = 0.0, 0, False, False
            while k < args.action_repeat and not (terminated or truncated):
                next_obs, r, terminated, truncated, _ = env.step(int(action))
                reward += args.gamma**k * float(r)
                k, frames, episode_return = k + 1, frames + 1, episode_return + float(r)
            extras = {"logp": dist.log_prob(action)[0].numpy(), "value": value[0].numpy()}
            discount = args.gamma ** (k - 1)  # the step's own discount: the learner's gamma makes it gamma^k
            adder.add(int(action), reward, next_obs, terminated, truncated, extras=extras, discount=discount)
            obs, decisions = next_obs, decisions + 1
            if terminated or truncated:
                episode += 1
                print(f"episode {episode}  step {frames}  return {episode_return:.0f}", flush=True)
                obs, _ = env.reset()
                adder.add_first(obs)
                episode_return = 0.0
            if decisions % args.rollout == 0:
                adder.flush()  # the sequences the writer still holds
                updates += train(client, net, opt, args)
        adder.close()
        print(f"done: {frames} frames, {decisions} decisions, {episode} episodes, {updates} updates")


def train(client: ReplayClient, net: ActorCritic, opt: torch.optim.Optimizer, args) -> int:
    """PPO on the sequences in the queue (each sampled once); returns the number of updates."""
    size = client.tables()["rollouts"]["size"]
    if size == 0:
        return 0
    batch = client.sample(size, table="rollouts")
    f = batch.fields  # each (n, T, ...): the steps, and the behaviour policy's per-step extras
    obs = torch.as_tensor(f["obs"], dtype=torch.float32)
    action = torch.as_tensor(f["action"], dtype=torch.int64)
    reward = torch.as_tensor(f["reward"])
    discount = args.gamma * torch.as_tensor(f["discount"])  # gamma^k per decision, 0 where it terminated
    logp_old = torch.as_tensor(f["extras"]["logp"])  # (n, T): log pi_behaviour(a_t | s_t)
    value_old = torch.as_tensor(f["extras"]["value"])  # (n, T): V_behaviour(s_t)
    mask = torch.as_tensor(batch.mask)  # (n, T): False past the episode's end

    # A step trains where it and the step after it are real: the last step of a sequence only bootstraps.
    valid = mask[:, :-1] & mask[:, 1:]
    with torch.no_grad():  # GAE(lambda = 0.95) over each sequence from the stored values
        delta = reward[:, :-1] + discount[:, :-1] * value_old[:, 1:] - value_old[:, :-1]
        adv = torch.zeros_like(delta)
        running = torch.zeros(delta.shape[0])
        for t in reversed(range(delta.shape[1])):
            running = torch.where(valid[:, t], delta[:, t] + 0.95 * discount[:, t] * running, torch.zeros(()))
            adv[:, t] = running
        returns = adv + value_old[:, :-1]
        adv = (adv - adv[valid].mean()) / (adv[valid].std() + 1e-8)

    updates = 0
    for _ in range(args.epochs):
        for idx in torch.randperm(obs.shape[0]).split(args.batch_size):
            dist, value = net(obs[idx, :-1])
            ratio = torch.exp(dist.log_prob(action[idx, :-1]) - logp_old[idx, :-1])
            surrogate = torch.min(ratio * adv[idx], ratio.clamp(0.8, 1.2) * adv[idx])
            m = valid[idx].float()
            loss = -(surrogate * m).sum() + 0.5 * ((value - returns[idx]).pow(2) * m).sum()
            loss = (loss - 0.01 * (dist.entropy() * m).sum()) / m.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            nn.utils.clip_grad_norm_(net.parameters(), 0.5)
            opt.step()
            updates += 1
    return updates


if __name__ == "__main__":
    main()
