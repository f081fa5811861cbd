"""Vectorised actors (``--envs-per-actor K``): batched acting with per-environment exploration, the fallback for
agents without a batched policy, and a real run of K environments per actor started with ``apexrl.run`` from a
thread on a gymnasium MuJoCo task."""

from __future__ import annotations

import csv
import os
import threading

import numpy as np
import pytest

from apexrl.agents import epsilon_ladder, get_agent
from apexrl.agents.base import AgentDef, PolicyBatch, batch_policy
from apexrl.agents.d4pg import sigma_ladder
from apexrl.apex.actor import env_seed
from apexrl.envs import env_spec

CUSTOM = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "custom_envs")


def test_the_epsilon_ladder_runs_over_every_environment_of_the_run():
    dqn, spec = get_agent("dqn"), env_spec("gym:CartPole-v1")
    config = dqn.config_class()
    policies = [batch_policy(dqn, spec, config, i, 3, 4, seed=i) for i in range(3)]
    eps = [e for p in policies for e in p.explorations]
    assert eps == [epsilon_ladder(s, 12, config.epsilon_base, config.epsilon_alpha) for s in range(12)]
    # K = 1 is the actor's own rung, as without vectorising.
    assert batch_policy(dqn, spec, config, 2, 3, 1, seed=0).explorations == [epsilon_ladder(2, 3)]


def test_a_batched_act_explores_per_environment():
    dqn = get_agent("dqn")
    spec = env_spec("gym:CartPole-v1")
    policy = dqn.make_batch_policy(spec, dqn.config_class(), [0, 1], 2, 0)
    policy.epsilons = np.array([1.0, 0.0])  # env 0 always random, env 1 always greedy
    obs = np.zeros((2, 4), np.float32)
    greedy = policy.act(obs[1], explore=False)
    actions = np.array([policy.act_batch(obs) for _ in range(200)])
    assert set(actions[:, 0]) == {0, 1} and set(actions[:, 1]) == {greedy}

    d4pg = get_agent("d4pg")
    pend = env_spec("gym:Pendulum-v1")
    config = d4pg.config_class(noise_sigma_max=1.0, noise_sigma_min=1 / 32)  # apex-d4pg-control's spread
    policy = d4pg.make_batch_policy(pend, config, [0, 1, 2], 3, 0)
    assert policy.explorations == pytest.approx(
        [sigma_ladder(s, 3, config.noise_sigma_min, config.noise_sigma_max) for s in range(3)]
    )
    assert len(set(policy.explorations)) == 3
    policy.sigmas = np.array([0.0, 0.5, 0.0])
    a = np.array(policy.act_batch(np.zeros((3, 3), np.float32)))
    mean = policy.act(np.zeros(3, np.float32), explore=False)
    assert a.shape == (3, 1) and a[0] == pytest.approx(mean) and a[2] == pytest.approx(mean) and a[1] != a[0]


def test_an_agent_without_a_batched_policy_gets_one_policy_per_environment():
    dqn = get_agent("dqn")
    plain = AgentDef(
        "plain", "dqn without make_batch_policy", dqn.config_class, dqn.check_env, dqn.make_learner, dqn.make_policy
    )
    spec = env_spec("gym:CartPole-v1")
    policy = batch_policy(plain, spec, dqn.config_class(), 1, 2, 3, seed=5)
    assert isinstance(policy, PolicyBatch) and len(policy.policies) == 3
    assert policy.explorations == [epsilon_ladder(s, 6) for s in (3, 4, 5)]
    assert len(policy.act_batch(np.zeros((3, 4), np.float32))) == 3
    weights = batch_policy(dqn, spec, dqn.config_class(), 0, 1, 1, seed=9).policy_state_dict()
    policy.load_policy_state_dict(weights)
    for p in policy.policies:
        assert all(np.array_equal(weights[k], v) for k, v in p.policy_state_dict().items())


def test_environment_seeds_are_the_actors_first_then_distinct():
    assert env_seed(12345, 0) == 12345
    seeds = {env_seed(a, j) for a in range(50) for j in range(1, 20)}
    assert len(seeds) == 50 * 19 and not seeds & set(range(50))


def test_apexrl_run_from_a_thread_trains_vectorised_actors_on_a_mujoco_task(tmp_path):
    import apexrl

    out = tmp_path / "out.txt"
    result = {}

    def go():
        with open(out, "w") as f:
            result["r"] = apexrl.run(
                env="gym:InvertedPendulum-v5",
                actors=1,
                envs_per_actor=3,
                steps=30,
                minutes=4,
                final_eval=2,
                run_dir=str(tmp_path / "run"),
                out=f,
                learner_args=["--min-replay-size", "300", "--eval-every", "0"],
            )

    thread = threading.Thread(target=go)
    thread.start()
    thread.join(300)
    assert not thread.is_alive()
    text = out.read_text()
    r = result["r"]
    assert r.exit_status == 0, text
    assert "agent dpg, env gym:InvertedPendulum-v5, 1 actors x 3 environments" in text  # DPG by its Box actions
    assert r.run_dir == str(tmp_path / "run") and "reached --steps 30" in text
    assert r.final_eval is not None and r.final_eval["episodes"] == 2 and np.isfinite(r.final_eval["mean"])
    with open(os.path.join(r.run_dir, "episodes.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert {row["env"] for row in rows} == {"0", "1", "2"}  # every environment finished episodes
    assert {row["exploration"] for row in rows} == {"0.3"}  # DPG: the config's sigma in every environment


def test_apexrl_run_refuses_bad_arguments_and_stops_on_request(tmp_path):
    import apexrl

    with pytest.raises(ValueError, match="envs-per-actor: 0 is out of range"):
        apexrl.run(env="gym:CartPole-v1", envs_per_actor=0)
    with pytest.raises(TypeError, match="unexpected keyword argument 'actor'"):
        apexrl.run(actor=2)
    stop = threading.Event()
    stop.set()  # stopping before the first progress line: the run ends cleanly at once
    with open(tmp_path / "out.txt", "w") as f:
        r = apexrl.run(env="gym:CartPole-v1", actors=1, run_dir=str(tmp_path / "run"), stop=stop, out=f)
    assert r.exit_status == 0 and r.final_eval is None
    assert "stopping: stop requested" in (tmp_path / "out.txt").read_text()


# -- Atari through ale-py's vector environment --------------------------------------------------------------------


def _random_actions(steps, k, n, seed=0):
    return np.random.default_rng(seed).integers(n, size=(steps, k))


def test_atari_vector_env_plays_the_single_games_episodes_across_autoresets():
    pytest.importorskip("ale_py")
    from apexrl.envs.atari import AtariEnv, AtariVecEnv

    seeds, cap, steps = [7, 123456789, 2**40 + 3], 160, 100  # 40 agent steps per episode: two autoresets each
    vec = AtariVecEnv("Pong", seeds, max_episode_frames=cap, num_threads=2)
    singles = [AtariEnv("Pong", s, max_episode_frames=cap) for s in seeds]
    try:
        actions = _random_actions(steps, len(seeds), vec.spec.num_actions)
        obs = vec.reset()
        assert vec.spec == singles[0].spec
        for j, env in enumerate(singles):
            assert np.array_equal(obs[j], env.reset())
        ends = 0
        for t in range(steps):
            step = vec.step(actions[t])
            for j, env in enumerate(singles):
                r = env.step(int(actions[t, j]))
                assert (step.reward[j], step.raw_reward[j]) == (r.reward, r.raw_reward)
                assert (step.terminated[j], step.truncated[j]) == (r.terminated, r.truncated)
                if r.terminated or r.truncated:
                    ends += 1
                    assert np.array_equal(step.final_obs[j], r.obs)  # the last frame stack, not the reset one
                    assert np.array_equal(step.obs[j], env.reset())  # no-op start drawn as the single game's
                else:
                    assert j not in step.final_obs and np.array_equal(step.obs[j], r.obs)
        assert ends == 2 * len(seeds)
        with pytest.raises(ValueError, match="out of range"):
            vec.step(np.full(len(seeds), vec.spec.num_actions))
    finally:
        vec.close()
        for env in singles:
            env.close()


class _RecordingReplay:
    """Stands in for the replay client: keeps every insert's decoded transitions and priorities."""

    def __init__(self, spec):
        from apexrl.replay.wire.codec import TransitionSpec
        from apexrl.replay.wire.frames import FrameStackCodec

        self.spec, self.batches, self.priorities, self._id = spec, [], [], 0
        # An Atari actor declares the items of its frame codec (stacks as references into frame chunks): the
        # stacks are rebuilt from the chunks each insert carries, as a learner would.
        self.codec = FrameStackCodec(TransitionSpec.atari()) if "obs_frames" in spec.names else None
        if self.codec is not None:
            assert spec == self.codec.item_spec

    def next_insert_id(self):
        self._id += 1
        return (1, self._id)

    def insert(self, priorities, *, data, offsets, timeout, insert_id, chunks):
        assert insert_id == (1, self._id)  # each request its own id, the one just issued
        if self.codec is not None:
            self.batches.append(self.codec.decode(data, offsets, chunks))
        else:
            assert chunks is None
            self.batches.append(self.spec.decode(data, offsets))
        self.priorities.append(np.asarray(priorities))

    def interrupt(self):
        pass

    def close(self):
        pass


@pytest.mark.parametrize(
    ("env", "k", "n", "flush", "insert_max"),
    [
        ("atari:Pong", 3, 3, 7, 0),
        ("gym:CartPole-v1", 3, 3, 7, 0),
        ("gym:CartPole-v1", 1, 3, 7, 0),
        ("gym:CartPole-v1", 5, 9, 1, 0),
        ("gym:corridor_envs:Corridor-v0", 4, 6, 2, 0),
        ("gym:CartPole-v1", 4, 3, 7, 9),
    ],
)
def test_a_vectorised_actor_inserts_what_k_single_environments_give(
    env, k, n, flush, insert_max, tmp_path, monkeypatch
):
    """Bit for bit: the transitions (frame stacks included) and episodes.csv rows of an actor stepping K
    environments in one vector environment (CartPole: its numpy twin; the corridor: K gymnasium environments in
    turn) are those of K single environments stepped in turn with the same seeds and actions, across episode ends
    (autoresets) and the final truncation. Long n-step windows against small inserts check that the actor's ring
    of observations never drops one a pending transition still needs."""
    import apexrl.apex.actor as actor_mod
    from apexrl.apex.actor import Actor
    from apexrl.apex.config import ActorConfig
    from apexrl.apex.nstep import NStepBuffer
    from apexrl.envs import make_env

    if env.startswith("atari"):
        pytest.importorskip("ale_py")
        import apexrl.envs.atari as atari

        monkeypatch.setattr(atari, "MAX_EPISODE_FRAMES", 120)  # 30 agent steps per episode
    replays = []
    monkeypatch.setattr(
        actor_mod, "connect_replay", lambda *a, spec, **kw: replays.append(_RecordingReplay(spec)) or replays[-1]
    )
    loops = 70
    if env.startswith("gym:corridor_envs"):
        monkeypatch.syspath_prepend(CUSTOM)
    config = ActorConfig(
        agent="dqn",
        env=env,
        replay="tcp://127.0.0.1:9",
        params="tcp://127.0.0.1:9",
        index=1,
        num_actors=2,
        seed=4,
        envs_per_actor=k,
        wait_for_params=0.0,
        params_every_frames=10**15,
        params_timeout=0.05,
        flush_every=flush,
        max_steps=k * loops,
        insert_max=insert_max,
        agent_config=get_agent("dqn").config_class(n_step=n),
        episodes_csv=str(tmp_path / "episodes.csv"),
        log_every=3600.0,
    )
    actor = Actor(config)
    taken = []
    if k == 1:  # one environment acts with act, as before vectorised actors
        act = actor.policy.act
        monkeypatch.setattr(
            actor.policy, "act", lambda obs, explore=True: taken.append([act(obs, explore)]) or taken[-1][0]
        )
    else:
        act_batch_values = actor.policy.act_batch_values  # a DQN actor keeps the acting pass's Q-values

        def record(obs, explore=True):
            actions, values = act_batch_values(obs, explore)
            taken.append(actions)
            return actions, values

        monkeypatch.setattr(actor.policy, "act_batch_values", record)
    try:
        actor.run()
    finally:
        actor.close()
    assert len(taken) == loops

    # The reference: K single environments stepped in turn, as an actor did before vectorising.
    envs = [make_env(env, actor_mod.env_seed(actor.seed, j)) for j in range(k)]
    buffers = [NStepBuffer(actor.config.agent_config.n_step, actor.config.agent_config.gamma) for _ in range(k)]
    expected, episodes = [], []
    ret, length = [0.0] * k, [0] * k
    for j, e in enumerate(envs):
        buffers[j].add_first(e.reset())
    for _t, actions in enumerate(taken):
        for j, e in enumerate(envs):
            r = e.step(actions[j])
            expected += buffers[j].add(actions[j], r.reward, r.obs, r.terminated, r.truncated)
            ret[j] += r.raw_reward
            length[j] += 1
            if r.terminated or r.truncated:
                episodes.append((j, ret[j], length[j]))
                ret[j], length[j] = 0.0, 0
                buffers[j].add_first(e.reset())
    for b in buffers:
        expected += b.truncate()
    for e in envs:
        e.close()

    names = list(replays[0].batches[0])  # the agent's fields (an Atari actor's stacks rebuilt from its chunks)
    got = {name: np.concatenate([b[name] for b in replays[0].batches]) for name in names}
    assert len(got["obs"]) == len(expected) == k * loops
    for name in names:
        want = np.stack([np.asarray(getattr(tr, name), got[name].dtype) for tr in expected])
        assert np.array_equal(got[name], want), name
    sizes = [len(b["obs"]) for b in replays[0].batches]
    if insert_max:  # a flush of B·K = 28 in requests of at most 9: 9, 9, 9 and the rest
        assert max(sizes) == insert_max and len(sizes) > -(-len(expected) // (flush * k))
    else:
        assert all(size >= flush * k for size in sizes[:-1])  # B per environment: B·K per insert
    # Priorities from the acting pass's Q-values (and one pass over the last observations of episodes): those of
    # the policy's own formula on the inserted batch, the weights being unchanged (no learner).
    for batch, priorities in zip(replays[0].batches, replays[0].priorities):
        np.testing.assert_allclose(priorities, actor.policy.initial_priorities(batch), rtol=1e-5, atol=1e-6)

    with open(tmp_path / "episodes.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert len(episodes) >= k  # every environment crossed at least one episode end
    assert sorted((int(r["env"]), r["return"], int(r["length"])) for r in rows) == sorted(
        (j, f"{ret:.6g}", length) for j, ret, length in episodes
    )
