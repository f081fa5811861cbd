"""The PPO presets as data (``apexrl.launch.presets.PRESETS`` holds them as ``Preset``s, as the R2D2 ones):
each entry holds the fields of ``Preset`` by name, its one table the queue ``default``."""

from __future__ import annotations

from typing import Any

from apexrl.replay.tables import Queue, TableConfig

__all__ = ["PPO_PRESETS"]

PPO_PRESETS: dict[str, dict[str, Any]] = {
    "ppo-cartpole": dict(
        description="PPO on CartPole-v1 sized for a 2-core machine: 2 actors x 4 environments, synchronous",
        source="Tonic's torch PPO and its defaults (clipped ratio 0.2, KL stop 0.015, GAE lambda 0.97, gamma "
        "0.99, actor and critic MLPs 64-64 tanh, Adam 3e-4 / 1e-3, 80 full-batch iterations, advantage and "
        "observation normalisation), with smaller segments to learn CartPole in minutes",
        agent="ppo",
        env="gym:CartPole-v1",
        agent_overrides=dict(batch_size=8, unroll=64),
        tables=(
            # 4 rounds of the 8 environments' items: a synchronous run holds about one.
            TableConfig(
                name="default",
                sampler="fifo",
                remover="fifo",
                capacity=1_024,
                max_times_sampled=1,
                rate_limiter=Queue(32),
            ),
        ),
        learner=dict(
            min_replay_size=8,
            publish_every=1,
            checkpoint_every=200,
            eval_every=20.0,
            eval_episodes=10,
            metrics_every=5.0,
        ),
        actor=dict(envs_per_actor=4, params_every_frames=64),
        actors=2,
        minutes=5.0,
        final_eval_episodes=10,
        sources={"*": "apexrl"},
        unmatched=(
            "segments of 8 x 64 = 512 steps per update (Tonic: 4096 steps per worker), so that the 2-core "
            "machine updates every few seconds",
            "the learner pops items of 64 trained steps from a queue (Tonic keeps its segment in the agent's "
            "own process); synchronous actors wait for the weights trained on their items",
        ),
    ),
}
"""The PPO presets by name: the fields of ``apexrl.launch.presets.Preset`` (module docstring)."""
