"""R2D2's recurrent acting policy on a real vectorised gymnasium environment (masked CartPole): one state per
environment, reset at episode starts, one batched forward pass, the epsilon ladder per environment, and the
input state it returns being the one a learner's unroll must start from to see what the actor saw."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
import torch

from apexrl.agents import epsilon_ladder
from apexrl.agents.r2d2 import (
    R2D2Config,
    R2D2Learner,
    RecurrentPolicy,
    empty_sequences,
    recurrent_batch_policy,
    sequence_loss,
)
from apexrl.agents.r2d2.learner import sequences_to_tensors
from apexrl.envs import env_spec, make_vec_env
from apexrl.envs.masked import NAME
from tests.torch_helpers import one_thread  # noqa: F401 - one_thread is an autouse fixture

CONFIG = R2D2Config(burn_in=4, trace_length=8, n_step=3, gamma=0.99, lstm_size=16, hidden=(16,), stream_hidden=16)
K = 3


def roll(policy: RecurrentPolicy, steps: int, seeds=(0, 1, 2), explore: bool = True):
    """Step a vectorised masked CartPole with ``policy``; per environment j the list of steps
    (obs, first, action, q, input state h and c, h after the step, reward, terminated, truncated, final_obs)."""
    vec = make_vec_env(NAME, list(seeds))
    obs = vec.reset()
    first = np.ones(len(seeds), bool)
    log: list[list[dict]] = [[] for _ in seeds]
    for _ in range(steps):
        actions, q, (h, c) = policy.act_batch_values(obs, first, explore)
        h_out, _ = policy.state()
        step = vec.step(actions)
        for j in range(len(seeds)):
            log[j].append(
                dict(
                    obs=obs[j],
                    first=bool(first[j]),
                    action=actions[j],
                    q=q[j],
                    h=h[j],
                    c=c[j],
                    h_out=h_out[j],
                    reward=step.reward[j],
                    terminated=bool(step.terminated[j]),
                    truncated=bool(step.truncated[j]),
                    final_obs=step.final_obs.get(j),
                )
            )
        first = step.terminated | step.truncated
        obs = step.obs
    vec.close()
    return log


def test_one_state_per_environment_reset_at_each_episode_start_and_one_batched_pass():
    spec = env_spec(NAME)
    policy = recurrent_batch_policy(spec, CONFIG, slots=[0, 1, 2], num_slots=K, seed=0)
    assert policy.explorations == [epsilon_ladder(i, K) for i in range(K)]
    log = roll(policy, 60)
    net = policy.q_net
    starts = 0
    for j in range(K):
        episode: list[np.ndarray] = []
        for t, rec in enumerate(log[j]):
            if rec["first"]:
                starts += 1
                episode = []
                assert not rec["h"].any() and not rec["c"].any()  # zeroed at the episode's first step
            else:
                np.testing.assert_array_equal(rec["h"], log[j][t - 1]["h_out"])  # carried over from the last step
            episode.append(rec["obs"])
            # The batched step's Q and state equal this environment's own unroll from its episode's start.
            with torch.no_grad():
                q, (h, _) = net(torch.as_tensor(np.stack(episode))[None], net.initial_state(1))
            np.testing.assert_allclose(rec["q"], q[0, -1].numpy(), rtol=1e-5, atol=1e-6)
            np.testing.assert_allclose(rec["h_out"], h[0].numpy(), rtol=1e-5, atol=1e-6)
    assert starts > K  # some episode ended and the next one started from a zero state


def test_the_state_returned_with_a_step_lets_a_learner_see_what_the_actor_saw():
    policy = RecurrentPolicy(env_spec(NAME), CONFIG, epsilons=[0.5] * K, seed=1)
    log = roll(policy, 40, seeds=(7, 8, 9))
    net = policy.q_net
    for j in range(K):
        # a window inside one episode, not at its start: the unroll from the stored state gives the actor's Q
        ends = [t for t, rec in enumerate(log[j]) if rec["first"]] + [len(log[j])]
        a, b = max(itertools.pairwise(ends), key=lambda ab: ab[1] - ab[0])
        t0, t1 = a + 2, min(b, a + 12)
        assert t1 - t0 >= 3
        obs = torch.as_tensor(np.stack([rec["obs"] for rec in log[j][t0:t1]]))[None]
        state = (torch.as_tensor(log[j][t0]["h"])[None], torch.as_tensor(log[j][t0]["c"])[None])
        with torch.no_grad():
            q, _ = net(obs, state)
        np.testing.assert_allclose(q[0].numpy(), np.stack([rec["q"] for rec in log[j][t0:t1]]), rtol=1e-5, atol=1e-6)


def test_epsilon_greedy_per_environment_and_evaluation_epsilon():
    spec = env_spec(NAME)
    policy = RecurrentPolicy(spec, CONFIG, epsilons=[1.0, 0.0, 0.0], seed=2)
    log = roll(policy, 200)
    greedy = [[rec["action"] == int(np.argmax(rec["q"])) for rec in log[j]] for j in range(K)]
    assert all(greedy[1]) and all(greedy[2])
    assert 0.3 < np.mean(greedy[0]) < 0.7  # uniform random over 2 actions
    # explore=False: config.eval_epsilon for every environment (0 here: greedy everywhere)
    evaluation = RecurrentPolicy(spec, dataclasses.replace(CONFIG, eval_epsilon=0.0), epsilons=[1.0] * K)
    log = roll(evaluation, 50, explore=False)
    assert all(rec["action"] == int(np.argmax(rec["q"])) for j in range(K) for rec in log[j])


def test_act_for_one_environment_reset_and_refusals():
    spec = env_spec(NAME)
    one = RecurrentPolicy(spec, CONFIG, epsilons=[0.0], seed=3)
    obs = np.array([0.01, -0.02], np.float32)
    a = one.act(obs)
    assert a in (0, 1) and one.state()[0].any()
    one.reset()
    assert not one.state()[0].any() and not one.state()[1].any()
    many = RecurrentPolicy(spec, CONFIG, epsilons=[0.1, 0.2], seed=3)
    with pytest.raises(ValueError, match="one environment"):
        many.act(obs)
    with pytest.raises(ValueError, match="observations for 2"):
        many.act_batch(np.zeros((3, 2), np.float32))
    with pytest.raises(ValueError, match="epsilons"):
        RecurrentPolicy(spec, CONFIG, epsilons=[1.5])
    many.act_batch(np.zeros((2, 2), np.float32))
    many.reset([1])
    h, _ = many.state()
    assert h[0].any() and not h[1].any()


def test_weights_from_the_learner_and_priorities_of_sequences_cut_from_a_real_rollout():
    spec = env_spec(NAME)
    learner = R2D2Learner(spec, CONFIG, seed=4)
    policy = recurrent_batch_policy(spec, CONFIG, slots=[0, 1, 2], num_slots=K, seed=5)
    policy.load_policy_state_dict(learner.policy_state_dict())
    for a, b in zip(policy.q_net.parameters(), learner.q_net.parameters()):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="R2D2 policy weights"):
        policy.load_policy_state_dict({"q_net/nothing": torch.zeros(1)})

    # A minimal adder: items of burn-in + trace + 1 steps every 4 steps of each environment's stream, each
    # with the input state of its first step, padded past the episode's end (its last observation included).
    log = roll(policy, 60)
    length, period = CONFIG.min_sequence_length, 4
    items = []
    for j in range(K):
        for t0 in range(0, len(log[j]) - length, period):
            seq = empty_sequences(1, length, spec.obs_shape, spec.obs_dtype, CONFIG.lstm_size)
            seq["state_h"][0], seq["state_c"][0] = log[j][t0]["h"], log[j][t0]["c"]
            for i in range(length):
                rec = log[j][t0 + i]
                if i > 0 and rec["first"]:
                    break  # the next episode: padding from here on
                seq["obs"][0, i], seq["action"][0, i], seq["reward"][0, i] = rec["obs"], rec["action"], rec["reward"]
                seq["discount"][0, i] = 0.0 if rec["terminated"] else 1.0
                seq["mask"][0, i] = True
                if rec["final_obs"] is not None and i + 1 < length:
                    seq["obs"][0, i + 1], seq["mask"][0, i + 1] = rec["final_obs"], True
                    break
            items.append(seq)
    batch = {k: np.concatenate([s[k] for s in items]) for k in items[0]}
    assert len(items) >= 20 and (~batch["mask"]).any()  # some items reach an episode's end
    trainable, _ = learner.invalid_items(batch)
    keep = np.ones(len(items), bool) if trainable is None else ~trainable
    batch = {k: v[keep] for k, v in batch.items()}

    priorities = policy.initial_priorities(batch)
    tensors = sequences_to_tensors(batch, learner.device)
    out = sequence_loss(learner.q_net, learner.q_net, tensors, torch.ones(len(priorities)), CONFIG)
    np.testing.assert_allclose(priorities, out.priorities.numpy() + CONFIG.priority_eps, rtol=1e-6)
    new_priorities, metrics = learner.update(batch, np.ones(len(priorities)))
    assert np.all(np.isfinite(new_priorities)) and np.all(new_priorities > 0) and metrics["valid_steps"] > 0
