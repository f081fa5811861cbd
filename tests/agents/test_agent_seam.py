"""The agent seam: the Protocols the actor and learner call, the registry, and a third agent plugged in from
outside the package (one module plus one entry-point line) running end to end through `apexrl run`."""

from __future__ import annotations

import csv
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

from apexrl.agents import AGENTS, Agent, Policy, agent_names, get_agent
from apexrl.envs import env_spec
from tests.torch_helpers import one_thread  # noqa: F401  (fixture)

ENVS = {"dqn": "gym:CartPole-v1", "dpg": "gym:Pendulum-v1", "mpo": "gym:Pendulum-v1", "dmpo": "gym:Pendulum-v1"}


@pytest.mark.parametrize("name", list(ENVS))
def test_registered_agents_satisfy_the_protocols(name):
    agent = get_agent(name)
    spec = env_spec(ENVS[name])
    learner = agent.make_learner(spec, agent.config_class(), __import__("torch").device("cpu"), 0)
    policy = agent.make_policy(spec, agent.config_class(), 0, 2, 0)
    assert isinstance(learner, Agent) and isinstance(policy, Policy)
    for proto, obj in ((Agent, learner), (Policy, policy)):
        for method in (
            "update",
            "state_dict",
            "load_state_dict",
            "policy_state_dict",
            "act",
            "initial_priorities",
            "load_policy_state_dict",
        ):
            if hasattr(proto, method):  # same parameters as the Protocol declares
                want = list(inspect.signature(getattr(proto, method)).parameters)
                assert list(inspect.signature(getattr(type(obj), method)).parameters) == want, method
    assert learner.transition_spec == policy.transition_spec


def test_registry_lists_agents_and_checks_environments():
    assert agent_names()[:2] == ["dqn", "dpg"]
    assert AGENTS["dqn"].accepts(env_spec("gym:CartPole-v1")) is None
    assert "discrete" in AGENTS["dqn"].accepts(env_spec("gym:Pendulum-v1"))
    assert "continuous" in AGENTS["dpg"].accepts(env_spec("gym:CartPole-v1"))
    with pytest.raises(ValueError, match="unknown agent 'nope'; valid agents: dqn, dpg"):
        get_agent("nope")


def test_every_agent_declares_its_replay_path():
    from apexrl.agents.base import APEX_TRANSITIONS

    for name in ("dqn", "dpg", "d4pg", "td3", "sac", "mpo", "dmpo"):  # Ape-X's n-step transitions, scored by the policy
        assert get_agent(name).replay is APEX_TRANSITIONS and APEX_TRANSITIONS.transitions
    r2d2 = get_agent("r2d2").replay
    assert r2d2.reader == "sequences" and not r2d2.transitions and r2d2.table == "default"
    assert r2d2.make_adder is not None and r2d2.make_batch is not None and r2d2.one_server is None
    assert r2d2.items_to_steps(get_agent("r2d2").config_class()) == get_agent("r2d2").config_class().sequence_period


def test_a_replay_path_refuses_what_its_reader_cannot_use():
    from apexrl.agents.base import ReplayPath
    from apexrl.replay.tables import TableConfig

    def adder(client, table, env, config, num_envs):
        return []

    def batch(fields, mask, extras, config):
        return {}

    with pytest.raises(ValueError, match="reader must be one of transitions, sequences, queue"):
        ReplayPath(reader="episodes")
    with pytest.raises(ValueError, match="the sequences reader needs make_adder and make_batch"):
        ReplayPath(reader="sequences", make_adder=adder)
    with pytest.raises(ValueError, match="make_adder and make_batch belong to the sequences and queue readers"):
        ReplayPath(make_adder=adder)
    with pytest.raises(ValueError, match="do not hold the table 'onpolicy'"):
        ReplayPath(
            reader="queue", table="onpolicy", make_adder=adder, make_batch=batch, tables=[TableConfig("default")]
        )
    path = ReplayPath(
        reader="queue", table="onpolicy", make_adder=adder, make_batch=batch, tables=[TableConfig("onpolicy")]
    )
    assert path.tables == (TableConfig("onpolicy"),) and path.items_to_steps(None) == 1
    # Another table than `default` must be declared: a preset's replay settings build `default` only.
    with pytest.raises(ValueError, match="the table 'apex' is not among the tables declared"):
        ReplayPath(table="apex")
    assert ReplayPath(table="apex", tables=[TableConfig("apex")]).transitions


def test_the_registry_joins_each_agents_presets_sources_and_field_sources():
    from apexrl.agents.config import FIELD_SOURCES
    from apexrl.launch import preset_table
    from apexrl.launch.presets import PRESETS

    names = list(PRESETS)
    for agent in AGENTS.values():
        # Each agent's presets in PRESETS, in the order it declares them, built with their agent filled in.
        assert [n for n in names if n in agent.presets] == list(agent.presets)
        assert all(PRESETS[n].agent == agent.name for n in agent.presets)
        assert all(preset_table.SOURCES[k] == v for k, v in agent.sources.items())
        if agent.field_sources:
            assert FIELD_SOURCES[agent.config_class] is agent.field_sources
    declared = [n for a in AGENTS.values() for n in a.presets]
    assert {"mpo-small", "dmpo-small", "r2d2-atari", "r2d2-cpu", "ppo-cartpole", "impala-cartpole"} <= set(declared)
    assert names[len(names) - len(declared) :] == declared  # after the presets written in apexrl.launch.presets
    assert names == list(PRESETS)  # stable: building it again gives the same order


def test_an_agents_preset_data_is_checked():
    from apexrl.agents.base import AgentDef
    from apexrl.launch.presets import preset_from_data

    dqn = get_agent("dqn")
    with pytest.raises(ValueError, match="its preset 'theirs' is for agent 'dpg'"):
        AgentDef(
            "mine",
            "a test agent",
            dqn.config_class,
            dqn.check_env,
            dqn.make_learner,
            dqn.make_policy,
            presets={"theirs": dict(agent="dpg", description="", env="gym:Pendulum-v1")},
        )
    with pytest.raises(ValueError, match="preset typo: .*'replay_size'"):
        preset_from_data("typo", dict(agent="dqn", description="", env="gym:CartPole-v1", replay_size=5))
    with pytest.raises(ValueError, match="preset small: .*'capacty'"):
        preset_from_data("small", dict(agent="dqn", description="", env="gym:CartPole-v1", replay=dict(capacty=5)))
    preset = preset_from_data(
        "ok", dict(agent="dqn", description="", env="gym:CartPole-v1", replay=dict(capacity=5), tables=None)
    )
    assert preset.replay.capacity == 5 and preset.tables is None


def test_an_agent_cannot_redefine_a_preset_or_recite_a_source(monkeypatch):
    from apexrl.launch import preset_table
    from apexrl.launch.presets import PRESETS, _Presets

    clash = _Presets({"r2d2-cpu": PRESETS["cartpole"]})
    with pytest.raises(ValueError, match="agent r2d2: preset 'r2d2-cpu' is already defined"):
        list(clash)
    monkeypatch.setitem(preset_table._BUILT_IN_SOURCES, "R2D2", "another paper")
    with pytest.raises(ValueError, match="agent r2d2: source 'R2D2' is already cited otherwise: another paper"):
        dict(preset_table.SOURCES)


# A throwaway agent: random actions, a learner that only counts. Its whole code is this module; the one
# registry line is the entry point below. Nothing in apexrl is edited for it.
RANDOM_AGENT = textwrap.dedent("""
    from dataclasses import dataclass

    import numpy as np
    import torch

    from apexrl.agents.base import AgentDef
    from apexrl.replay.wire.codec import FieldSpec, TransitionSpec


    @dataclass(frozen=True)
    class RandomConfig:
        n_step: int = 1
        gamma: float = 0.99
        batch_size: int = 32
        target_update_period: int = 1


    def spec(env):
        d = env.obs_shape[0]
        return TransitionSpec([FieldSpec("obs", "f4", (d,)), FieldSpec("action", "i4"), FieldSpec("reward", "f4")])


    def check_env(env):
        if not env.num_actions:
            raise ValueError(f"random needs discrete actions; {env.name} has none")


    class RandomPolicy:
        def __init__(self, env, seed):
            self.env, self.rng, self.transition_spec = env, np.random.default_rng(seed), spec(env)
            self.bias = torch.zeros(1)

        def act(self, obs, explore=True):
            return int(self.rng.integers(self.env.num_actions))

        def initial_priorities(self, batch):
            return np.ones(len(batch["reward"]))

        def policy_state_dict(self):
            return {"bias": self.bias.clone()}

        def load_policy_state_dict(self, d):
            self.bias = d["bias"].clone()


    class CountingLearner:
        metric_names = ("reward_mean",)

        def __init__(self, env):
            self.transition_spec, self.steps = spec(env), 0

        def update(self, batch, weights):
            self.steps += 1
            return np.ones(len(weights)), {"reward_mean": float(np.mean(batch["reward"]))}

        def policy_state_dict(self):
            return {"bias": torch.full((1,), float(self.steps))}

        def state_dict(self):
            return {"steps": torch.tensor(self.steps, dtype=torch.int64)}

        def load_state_dict(self, d):
            self.steps = int(d["steps"])


    # Its preset, as data (the fields of apexrl.launch.presets.Preset; replay as ReplaySettings' arguments), the
    # source it names and where its config's defaults come from: PRESETS, the preset table and --preset read them.
    PRESETS = {
        "random-cartpole": dict(
            description="random actions on CartPole (a test preset)",
            source="a coin (a test source)",
            env="gym:CartPole-v1",
            agent_overrides=dict(batch_size=16),
            replay=dict(capacity=5_000),
            learner=dict(min_replay_size=200, eval_every=0.0, eval_episodes=1, metrics_every=1.0),
            actors=1,
            minutes=4.0,
            sources={"*": "Coin"},
        ),
    }


    AGENT = AgentDef(
        name="random", description="random actions, a learner that counts (a test agent)",
        config_class=RandomConfig, check_env=check_env,
        make_learner=lambda env, config, device, seed: CountingLearner(env),
        make_policy=lambda env, config, index, num_actors, seed: RandomPolicy(env, seed),
        presets=PRESETS,
        sources={"Coin": "a fair coin, tossed once per action (a test citation)"},
        field_sources=dict(n_step="Coin", gamma="Coin", batch_size="Coin", target_update_period="apexrl"),
    )


    # A second one through the replay path's other readers: its actors write sequences of 8 steps with a
    # per-step extra (the behaviour policy's log-probability, as an on-policy agent's would) into the queue table
    # it declares; its learner pops them (no priorities go back) and reports the extras it read.
    from apexrl.agents.base import ReplayPath
    from apexrl.replay.adders import SequenceAdder
    from apexrl.replay.tables import Queue, TableConfig


    class RolloutPolicy(RandomPolicy):
        def __init__(self, env, seed, k):
            super().__init__(env, seed)
            self.explorations = [1.0] * k

        def act_batch(self, obs, explore=True):
            return [self.act(o) for o in obs]

        def act_batch_extras(self, obs, first):
            logp = np.float32(-np.log(self.env.num_actions))
            return self.act_batch(obs), [{"logp": logp} for _ in obs]


    class PoppingLearner(CountingLearner):
        # An episode's last observation is a step of its own (no action, reward 0, extras zeros): max and min.
        metric_names = ("reward_max", "logp_min")

        def update(self, batch, weights):
            self.steps += 1
            m = batch["mask"]
            return np.ones(len(weights)), {
                "reward_max": float(batch["reward"][m].max()), "logp_min": float(batch["logp"][m].min())
            }

        def invalid_items(self, batch):
            return None, None


    def sequences(client, table, env, config, num_envs):
        return [
            SequenceAdder(client, table, 8, 8, end_of_episode_behavior="truncate", extras_per="step")
            for _ in range(num_envs)
        ]


    def popped(fields, mask, extras, config):
        return {"reward": np.asarray(fields["reward"]), "logp": np.asarray(fields["extras"]["logp"]), "mask": mask}


    ROLLOUT = AgentDef(
        name="rollout", description="random actions into a queue of sequences (a test agent)",
        config_class=RandomConfig, check_env=check_env,
        make_learner=lambda env, config, device, seed: PoppingLearner(env),
        make_policy=lambda env, config, index, num_actors, seed: RolloutPolicy(env, seed, 1),
        make_batch_policy=lambda env, config, slots, num_slots, seed: RolloutPolicy(env, seed, len(slots)),
        replay=ReplayPath(
            reader="queue",
            table="onpolicy",
            tables=(TableConfig("onpolicy", sampler="fifo", remover="fifo", capacity=10_000, max_times_sampled=1,
                                rate_limiter=Queue(2_000)),),
            make_adder=sequences,
            make_batch=popped,
            steps_per_item=lambda config: 8,
        ),
    )


    # A third on a table other than `default`: Ape-X's n-step transitions into the table "apex" it declares
    # beside an empty `default`; its learner sends back priority 7, which no actor gives.
    class SevenLearner(CountingLearner):
        def update(self, batch, weights):
            self.steps += 1
            return np.full(len(weights), 7.0), {"reward_mean": float(np.mean(batch["reward"]))}


    ELSEWHERE = AgentDef(
        name="elsewhere", description="random actions into the table 'apex' (a test agent)",
        config_class=RandomConfig, check_env=check_env,
        make_learner=lambda env, config, device, seed: SevenLearner(env),
        make_policy=lambda env, config, index, num_actors, seed: RandomPolicy(env, seed),
        replay=ReplayPath(table="apex", tables=(TableConfig("default", capacity=1_000), TableConfig("apex"))),
    )
""")


@pytest.fixture
def plugin_path(tmp_path):
    root = tmp_path / "plugin"
    (root / "random_agent-0.1.dist-info").mkdir(parents=True)
    (root / "random_agent.py").write_text(RANDOM_AGENT)
    (root / "random_agent-0.1.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: random-agent\nVersion: 0.1\n"
    )
    (root / "random_agent-0.1.dist-info" / "entry_points.txt").write_text(
        "[apexrl.agents]\nrandom = random_agent:AGENT\nrollout = random_agent:ROLLOUT\nelsewhere = random_agent:ELSEWHERE\n"
    )
    return str(root)


def test_a_third_agent_runs_end_to_end_through_apexrl_run(plugin_path, tmp_path):
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([plugin_path, os.environ.get("PYTHONPATH", "")])}
    helptext = subprocess.run(
        [sys.executable, "-m", "apexrl", "run", "--help"], env=env, capture_output=True, text=True, timeout=120
    ).stdout
    words = " ".join(helptext.split())
    assert "random: random actions" in words  # the CLI lists the registry's names
    # The plugin's preset, its source and its defaults' sources are in the epilog the preset table prints.
    assert "random-cartpole random actions on CartPole (a test preset) [gym:CartPole-v1, 1 actors, 4 min]" in words
    assert "sets: batch_size=16 [Coin], capacity=5000 [Coin]" in words
    assert "random: n_step=1 [Coin], gamma=0.99 [Coin], batch_size=32 [Coin], target_update_period=1 [apexrl]" in words
    assert "Coin: a fair coin, tossed once per action (a test citation)" in words
    presets = subprocess.run(
        [sys.executable, "-c", "from apexrl.launch.presets import PRESETS; print(' '.join(PRESETS))"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert presets.stdout.split()[-1] == "random-cartpole", presets.stdout + presets.stderr  # after the built-in ones
    run_dir = str(tmp_path / "run")
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "apexrl",
            "run",
            "--final-eval",
            "0",
            "--preset",
            "random-cartpole",  # the agent, the environment, one actor, the learner's warm-up and metrics period
            "--steps",
            "40",
            "--run-dir",
            run_dir,
            "--progress-every",
            "2",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reached --steps 40" in out.stdout
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert int(rows[-1]["learner_steps"]) >= 40
    assert any(r["reward_mean"] == "1" for r in rows)  # CartPole pays 1 per step: the batches were decoded
    with open(os.path.join(run_dir, "plan.json"), encoding="utf-8") as f:
        plan = __import__("json").load(f)
    assert plan["servers"][0]["tables"][0]["capacity"] == 5_000  # the preset's replay capacity


def test_an_agent_with_its_own_replay_path_runs_end_to_end_through_apexrl_run(plugin_path, tmp_path):
    """The declaration alone: the run starts the agent's queue table, the generic actor writes its sequences with
    the policy's per-step extras, the learner pops them into the agent's batch."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([plugin_path, os.environ.get("PYTHONPATH", "")])}
    run_dir = str(tmp_path / "run")
    args = ["--agent", "rollout", "--env", "gym:CartPole-v1", "--actors", "1", "--steps", "20", "--minutes", "4"]
    args += ["--envs-per-actor", "2", "--batch-size", "4", "--progress-every", "2"]
    args += ["--learner-args", "--min-replay-size 8 --eval-every 0 --metrics-every 1"]
    out = subprocess.run(
        [sys.executable, "-m", "apexrl", "run", "--final-eval", "0", "--run-dir", run_dir, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reached --steps 20" in out.stdout
    with open(os.path.join(run_dir, "plan.json"), encoding="utf-8") as f:
        tables = __import__("json").load(f)["servers"][0]["tables"]
    assert [(t["name"], t["sampler"], t["max_times_sampled"]) for t in tables] == [("onpolicy", "fifo", 1)]
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert int(rows[-1]["learner_steps"]) >= 20
    assert any(r["reward_max"] == "1" for r in rows)  # CartPole pays 1 per step
    assert any(abs(float(r["logp_min"]) + 0.693147) < 1e-4 for r in rows if r["logp_min"])  # log(1/2) per step


def test_an_agent_on_a_table_other_than_default_runs_end_to_end_through_apexrl_run(plugin_path, tmp_path):
    """ReplayPath(table="apex") beside an empty `default`: the run pins the agent's spec and the learner's min
    size on "apex", the actors write there, the learner waits for that table's size (the STATS reply's own names
    are the empty `default`'s: it would wait forever), samples it, sends its priorities there, and metrics.csv
    reports that table's counters."""
    from apexrl.offline.export import read_snapshot
    from apexrl.replay.server.tables import read_tables_manifest

    env = {**os.environ, "PYTHONPATH": os.pathsep.join([plugin_path, os.environ.get("PYTHONPATH", "")])}
    run_dir = str(tmp_path / "run")
    args = ["--agent", "elsewhere", "--env", "gym:CartPole-v1", "--actors", "1", "--steps", "30", "--minutes", "4"]
    args += ["--progress-every", "2", "--learner-args", "--min-replay-size 200 --eval-every 0 --metrics-every 1"]
    out = subprocess.run(
        [sys.executable, "-m", "apexrl", "run", "--final-eval", "0", "--run-dir", run_dir, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert "reached --steps 30" in out.stdout
    with open(os.path.join(run_dir, "plan.json"), encoding="utf-8") as f:
        tables = {t["name"]: t for t in __import__("json").load(f)["servers"][0]["tables"]}
    assert tables["default"]["spec"] is None and tables["default"]["rate_limiter"] is None
    assert tables["apex"]["spec"] is not None and tables["apex"]["rate_limiter"]["min_size"] == 200
    with open(os.path.join(run_dir, "metrics.csv"), newline="") as f:
        rows = list(csv.DictReader(f))
    assert int(rows[-1]["learner_steps"]) >= 30
    sizes = [int(r["replay_size"]) for r in rows if r["replay_size"]]
    assert sizes and min(sizes) >= 200  # apex's (the learner trained once it held 200), never default's 0
    manifest = read_tables_manifest(os.path.join(run_dir, "replay.snap"))
    snapshot = {e["name"]: read_snapshot(e["file"]) for e in manifest["tables"]}
    assert len(snapshot["default"].keys) == 0 and len(snapshot["apex"].keys) >= 200
    assert (snapshot["apex"].priorities == 7.0).any()  # the learner's priorities reached the actors' items
