"""An actor and a learner in two processes: n-step DQN with prioritized replay on CartPole.

The learner process (this script without ``--role``) starts a replay server and a parameter server in-process,
both on 127.0.0.1 on free ports, then starts the actor as a second process (this script with ``--role actor``)
and hands it the two endpoints on its command line:

- the actor steps CartPole epsilon-greedily and writes 3-step transitions with ``NStepTransitionAdder``; a
  ``ParamPoller`` fetches the learner's latest weights every ``--fetch-every`` env frames;
- the table's ``SampleToInsertRatio`` keeps the two in step: an actor far ahead of the learner has its inserts
  held by the server (they wait, ``insert(timeout=...)``) until the learner has sampled enough, so it
  cannot fill the table with experience nobody learns from; a learner far ahead waits for new items;
- the learner samples through ``ReplayDataset`` with a beta schedule (``linear_beta``: 0.4 to 1 over the run),
  trains a double-Q network on the importance-weighted n-step TD error, sends priorities back, and publishes
  its weights every ``--publish-every`` updates;
- at the end the learner stops the actor with SIGTERM and waits for it to exit.

What to expect: ``actor episode`` lines with the weights version the actor acts with (returns about 10 with
the first weights, about 25-40 by update 3000, 24k env frames, with the defaults and seed 0), ``learner update``
lines with the mean |TD error| and the weights version, and a ``done`` line from each process. 3000 updates took
about 30 s on a loaded 2-core machine. It shows the two-process data path, not a tuned agent.

    python examples/two_process_dqn.py                    # 3000 updates
    python examples/two_process_dqn.py --updates 500 --seed 1
"""

from __future__ import annotations

import argparse
import copy
import os
import signal
import subprocess
import sys
import threading

import gymnasium as gym
import numpy as np
import torch
from torch import nn

from apexrl.errors import ServerTimeoutError
from apexrl.params.service import ParamClient, ParamPoller, ParamServer
from apexrl.replay import (
    NStepTransitionAdder,
    ReplayClient,
    ReplayDataset,
    ReplayServer,
    SampleToInsertRatio,
    ServerConfig,
    TableConfig,
    linear_beta,
)


def q_network(env: gym.Env) -> nn.Module:
    assert isinstance(env.action_space, gym.spaces.Discrete), f"{env.spec} has no Discrete action space"
    obs_dim, n_actions = gym.spaces.flatdim(env.observation_space), int(env.action_space.n)
    return nn.Sequential(nn.Linear(obs_dim, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, n_actions))


class WaitingInserts:
    """The adder's client: each insert lets the server hold it for up to a second at a time while the rate
    limiter holds the actor back, and tries again until it goes in or the actor is told to stop."""

    def __init__(self, client: ReplayClient, stop: threading.Event):
        self.client, self.stop = client, stop

    def insert(self, priorities, items, *, table):
        while True:
            try:
                return self.client.insert(priorities, items, timeout=1.0, table=table)
            except ServerTimeoutError:
                if self.stop.is_set():
                    raise


def run_actor(args: argparse.Namespace) -> None:
    torch.set_num_threads(1)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())  # the learner's "enough"
    env = gym.make(args.env)
    env.action_space.seed(args.seed + 1)
    net = q_network(env)
    rng = np.random.default_rng(args.seed + 1)
    with ReplayClient(args.replay) as client, ParamClient(args.params) as params:
        poller = ParamPoller(params, load=net.load_state_dict, every_frames=args.fetch_every)
        adder = NStepTransitionAdder(WaitingInserts(client, stop), "replay", n=args.n, discount=args.gamma)
        obs, _ = env.reset(seed=args.seed)
        adder.add_first(obs)
        steps = episodes = 0
        episode_return = 0.0
        while not stop.is_set():
            poller.maybe_fetch(steps)
            if rng.random() < args.epsilon:
                action = int(env.action_space.sample())
            else:
                with torch.no_grad():
                    action = int(net(torch.as_tensor(obs, dtype=torch.float32)[None]).argmax())
            obs, reward, terminated, truncated, _ = env.step(action)
            steps += 1
            episode_return += float(reward)
            try:
                adder.add(action, reward, obs, terminated, truncated)
            except ServerTimeoutError:  # stopped while the limiter held an insert back
                break
            if terminated or truncated:
                episodes += 1
                print(
                    f"actor episode {episodes}  step {steps}  return {episode_return:.0f}  weights {poller.version}",
                    flush=True,
                )
                episode_return = 0.0
                obs, _ = env.reset()
                adder.add_first(obs)
    print(f"actor done: {steps} steps, {episodes} episodes, weights version {poller.version}", flush=True)


def train_step(batch, net, target, opt) -> np.ndarray:
    """One double-Q update on an n-step batch; returns each item's new priority (|TD error|)."""
    f = batch["fields"]
    obs = torch.as_tensor(f["obs"], dtype=torch.float32)
    action = torch.as_tensor(f["action"], dtype=torch.int64)
    reward = torch.as_tensor(f["reward"], dtype=torch.float32)
    discount = torch.as_tensor(f["discount"], dtype=torch.float32)  # gamma^m, 0 where the episode terminated
    next_obs = torch.as_tensor(f["next_obs"], dtype=torch.float32)
    weights = torch.as_tensor(batch["weights"])  # importance weights for the batch's beta
    with torch.no_grad():
        best = net(next_obs).argmax(1, keepdim=True)
        y = reward + discount * target(next_obs).gather(1, best).squeeze(1)
    td = y - net(obs).gather(1, action[:, None]).squeeze(1)
    loss = (weights * nn.functional.smooth_l1_loss(td, torch.zeros_like(td), reduction="none")).mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    return td.detach().abs().numpy().astype(np.float64) + 1e-3


def run_learner(args: argparse.Namespace) -> None:
    torch.manual_seed(args.seed)
    torch.set_num_threads(1)
    env = gym.make(args.env)
    net = q_network(env)
    target = copy.deepcopy(net)
    opt = torch.optim.Adam(net.parameters(), lr=args.lr)
    limiter = SampleToInsertRatio(
        samples_per_insert=args.samples_per_insert, min_size_to_sample=args.min_size, error_buffer=args.min_size
    )
    table = TableConfig("replay", capacity=args.capacity, max_size=args.capacity, rate_limiter=limiter)
    with (
        ReplayServer(ServerConfig(port=0, tables=[table])) as server,
        ReplayClient(server.endpoint) as client,
        ParamServer() as params,  # `with` starts it: params.endpoint is bound from here on
    ):
        version = params.publish(net.state_dict())  # version 1: the actor acts with these until the next publish
        actor = subprocess.Popen(
            [sys.executable, os.path.abspath(__file__), "--role", "actor", "--replay", server.endpoint,
             "--params", params.endpoint, "--env", args.env, "--seed", str(args.seed), "--n", str(args.n),
             "--gamma", str(args.gamma), "--fetch-every", str(args.fetch_every)]
        )  # fmt: skip
        try:
            beta = linear_beta(0.4, 1.0, steps=args.updates)
            dataset = ReplayDataset(client, args.batch_size, beta=beta, decode="structure", table="replay")
            batches = iter(dataset)
            for update in range(1, args.updates + 1):
                batch = next(batches)
                priorities = train_step(batch, net, target, opt)
                client.update_priorities(batch["keys"], priorities, table="replay")
                if update % args.target_every == 0:
                    target.load_state_dict(net.state_dict())
                if update % args.publish_every == 0:
                    version = params.publish(net.state_dict())
                if update % args.log_every == 0:
                    print(f"learner update {update}  weights {version}  |td| {priorities.mean():.3f}", flush=True)
            batches.close()
        finally:
            actor.send_signal(signal.SIGTERM)
            code = actor.wait(timeout=120)
        size = client.tables()["replay"]["size"]
    print(f"learner done: {args.updates} updates, weights version {params.version}, {size} items held", flush=True)
    if code != 0:
        sys.exit(f"the actor exited with {code}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--role", choices=("learner", "actor"), default="learner")
    p.add_argument("--replay", help="actor: the replay server's endpoint (the learner passes it)")
    p.add_argument("--params", help="actor: the parameter server's endpoint (the learner passes it)")
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--updates", type=int, default=3000)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--gamma", type=float, default=0.99)
    p.add_argument("--n", type=int, default=3, help="n-step returns")
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--epsilon", type=float, default=0.1, help="the actor's exploration")
    p.add_argument("--capacity", type=int, default=50_000)
    p.add_argument("--min-size", type=int, default=500, help="items before the first sample")
    p.add_argument("--samples-per-insert", type=float, default=8.0)
    p.add_argument("--target-every", type=int, default=100)
    p.add_argument("--publish-every", type=int, default=50)
    p.add_argument("--fetch-every", type=int, default=100, help="actor: env frames between weight fetches")
    p.add_argument("--log-every", type=int, default=250)
    args = p.parse_args()
    if args.role == "actor":
        if not (args.replay and args.params):
            p.error("--role actor needs --replay and --params")
        run_actor(args)
    else:
        run_learner(args)


if __name__ == "__main__":
    main()
