"""d4pg-small, td3-small, sac-small, mpo-small, dmpo-small: sized for 2 cores and 2 actors, the rate limiter holding Acme's replay ratio,
observation normalisation on; each plans, and its learner trains on real walker-stand transitions."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from apexrl.agents import get_agent
from apexrl.launch import preset_table
from apexrl.launch.plan import Overrides, plan
from apexrl.launch.presets import PRESETS, default_preset_for
from tests.torch_helpers import one_thread  # noqa: F401 - one_thread is an autouse fixture

SMALL = {"d4pg-small": "d4pg", "td3-small": "td3", "sac-small": "sac", "mpo-small": "mpo", "dmpo-small": "dmpo"}


@pytest.mark.parametrize("name", SMALL)
def test_small_presets_are_sized_for_two_cores(name):
    preset = PRESETS[name]
    assert preset.agent == SMALL[name] and preset.env == "dmc:walker-stand"
    assert preset.actors == 2 and preset.minutes == 20.0
    # the rate limiter holds the learner's share: Acme's 32 samples per insert, dmpo-small's tuned 16
    spi = 16.0 if name == "dmpo-small" else 32.0
    assert preset.replay.samples_per_insert == spi
    config = preset.agent_config()
    assert config.obs_norm is True and config.batch_size == 256
    assert max(config.actor_hidden) <= 256 and max(config.critic_hidden) <= 256
    p = plan(name, Overrides())
    assert p.server.table().rate_limiter.samples_per_insert == spi and len(p.actors) == 2
    assert p.learner.agent_config == config and all(a.agent_config == config for a in p.actors)
    rows = {setting: source for setting, _, source, _ in preset_table.settings(preset)}
    assert rows["samples_per_insert"] == {"mpo-small": "Acme MPO", "dmpo-small": "tuned"}.get(name, "Acme")
    assert rows["obs_norm"] == "apexrl"
    assert any("sized for 2 cores" in note for note in preset.unmatched)


def test_the_paper_presets_stay_the_default_for_their_agents():
    assert default_preset_for("d4pg", "dmc:walker-stand").name == "apex-d4pg-control"
    assert default_preset_for("td3", "dmc:cheetah-run").name == "td3-small"
    assert default_preset_for("sac", "dmc:cheetah-run").name == "sac-small"
    assert default_preset_for("mpo", "dmc:cheetah-run").name == "mpo-small"
    assert default_preset_for("dmpo", "dmc:cheetah-run").name == "dmpo-small"


@pytest.mark.parametrize(("agent", "batch_size", "envs_per_actor"), [("impala", 16, None), ("ppo", 8, 4)])
def test_an_on_policy_agent_without_a_preset_for_the_family_gets_defaults_that_fit_its_queue(
    agent, batch_size, envs_per_actor
):
    """An on-policy agent on a family none of its presets is for (a plugged-in family: "chain" here; the preset
    is chosen by the family's name alone) falls back to the agent's defaults, whose learner waits for one batch of
    the queue (1,024 items), not for the 50,000 transitions of Ape-X's warm-up, and publishes every update; PPO's
    synchronous actors (2) get as many environments as a batch has items, IMPALA's (acting on) the default."""
    preset = default_preset_for(agent, "chain:4")
    assert preset.name == f"{agent}-defaults"
    assert preset.learner == {"min_replay_size": batch_size, "publish_every": 1}
    assert preset.actor.get("envs_per_actor") == envs_per_actor and preset.actors == 2


@pytest.mark.parametrize("name", SMALL)
def test_the_learner_of_each_small_preset_trains_on_walker_stand(name):
    from apexrl.envs import env_spec, make_env

    preset = PRESETS[name]
    spec = env_spec("dmc:walker-stand")
    agent = get_agent(preset.agent)
    config = preset.agent_config()
    learner = agent.make_learner(spec, config, torch.device("cpu"), 0)
    policy = agent.make_policy(spec, config, 0, 2, 0)
    policy.load_policy_state_dict(learner.policy_state_dict())
    env = make_env("dmc:walker-stand", seed=0)
    obs = env.reset()
    rows: dict[str, list] = {k: [] for k in ("obs", "action", "reward", "discount", "next_obs")}
    for _ in range(config.batch_size):
        action = policy.act(obs)
        step = env.step(action)
        for k, v in zip(rows, (obs, action, step.reward, 0.99, step.obs)):
            rows[k].append(v)
        obs = step.obs
    batch = {k: np.asarray(v, np.float32) for k, v in rows.items()}
    for _ in range(2):
        priorities, metrics = learner.update(batch, np.ones(config.batch_size))
    assert priorities.shape == (config.batch_size,) and np.all(priorities > 0)
    assert all(np.isfinite(v) for v in metrics.values())
    assert learner.obs_norm.count.item() == 2 * config.batch_size
    policy.load_policy_state_dict(learner.policy_state_dict())
    assert np.all(np.abs(policy.act(obs, explore=False)) <= 1.0)
