"""What the on-policy agents' CartPole presets share: the queue, the learner's and the actors' settings for 2
actors of 4 environments on a 2-core machine, synchronous (one round of 8 items per update)."""

from __future__ import annotations

from typing import Any

from apexrl.replay.tables import Queue, TableConfig

__all__ = ["cartpole_preset", "queue_table"]


def queue_table(size: int) -> TableConfig:
    """The on-policy presets' one table: the queue ``default`` (FIFO, each item handed out once), whose limiter
    holds the actors once ``size`` items wait for the learner."""
    return TableConfig(
        name="default", sampler="fifo", remover="fifo", capacity=1_024, max_times_sampled=1, rate_limiter=Queue(size)
    )


def cartpole_preset(agent: str, description: str, source: str, unmatched: tuple[str, ...]) -> dict[str, Any]:
    """A preset entry (the fields of ``apexrl.launch.presets.Preset``) of ``agent`` on gym:CartPole-v1."""
    return dict(
        description=description,
        source=source,
        agent=agent,
        env="gym:CartPole-v1",
        agent_overrides=dict(batch_size=8, unroll=64),
        # 4 rounds of the 8 environments' items: a synchronous run holds about one.
        tables=(queue_table(32),),
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
            *unmatched,
        ),
    )
