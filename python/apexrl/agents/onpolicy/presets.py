"""What the on-policy agents' presets share: the queue, the learner's and the actors' settings for 2 actors of 4
environments on a 2-core machine, synchronous (one round of 8 items per update), on gym:CartPole-v1 and on the
Control Suite's cartpole-swingup."""

from __future__ import annotations

from typing import Any

from apexrl.replay.tables import Queue, TableConfig

__all__ = ["cartpole_preset", "queue_table", "swingup_preset"]


def queue_table(size: int) -> TableConfig:
    """The on-policy presets' one table: the queue ``default`` (FIFO, each item handed out once), whose limiter
    holds the actors once ``size`` items wait for the learner."""
    return TableConfig(
        name="default", sampler="fifo", remover="fifo", capacity=1_024, max_times_sampled=1, rate_limiter=Queue(size)
    )


def cartpole_preset(agent: str, description: str, source: str, unmatched: tuple[str, ...]) -> dict[str, Any]:
    """A preset entry (the fields of ``apexrl.launch.presets.Preset``) of ``agent`` on gym:CartPole-v1: items of
    64 steps, 5 minutes."""
    return _preset(agent, description, source, unmatched, env="gym:CartPole-v1", unroll=64, minutes=5.0)


def swingup_preset(agent: str, description: str, source: str, unmatched: tuple[str, ...]) -> dict[str, Any]:
    """A preset entry of ``agent`` on dmc:cartpole-swingup (the Control Suite's family: ``--agent AGENT`` on any
    ``dmc:`` task starts from it): items of 512 steps, so that an update trains on 8 x 512 = 4,096 steps, Tonic's
    segment (with items of 256 steps, half that, PPO peaked at 740 and ended a 20-minute run at 172: bench/README
    "apexrl's PPO beside Tonic's own"); evaluations of 5 episodes (Tonic's) every 30 s; 20 minutes."""
    return _preset(
        agent,
        description,
        source,
        unmatched,
        env="dmc:cartpole-swingup",
        unroll=512,
        minutes=20.0,
        learner=dict(checkpoint_every=50, eval_every=30.0, eval_episodes=5, metrics_every=10.0),
    )


def _preset(
    agent: str,
    description: str,
    source: str,
    unmatched: tuple[str, ...],
    *,
    env: str,
    unroll: int,
    minutes: float,
    learner: dict[str, Any] | None = None,
) -> dict[str, Any]:
    batch = 8  # one item per environment: a synchronous round is one update
    return dict(
        description=description,
        source=source,
        agent=agent,
        env=env,
        agent_overrides=dict(batch_size=batch, unroll=unroll),
        # 4 rounds of the 8 environments' items: a synchronous run holds about one.
        tables=(queue_table(4 * batch),),
        learner=dict(
            dict(
                min_replay_size=batch,
                publish_every=1,
                checkpoint_every=200,
                eval_every=20.0,
                eval_episodes=10,
                metrics_every=5.0,
            ),
            **(learner or {}),
        ),
        actor=dict(envs_per_actor=4, params_every_frames=unroll),
        actors=2,
        minutes=minutes,
        final_eval_episodes=10,
        sources={"*": "apexrl"},
        unmatched=(
            f"segments of {batch} environments x {unroll} = {batch * unroll:,} steps per update (Tonic: 4,096 "
            "steps of one environment)"
            + (", so that the 2-core machine updates every few seconds" if batch * unroll < 4_096 else ""),
            f"the learner pops items of {unroll} trained steps from a queue (Tonic keeps its segment in the "
            "agent's own process); synchronous actors wait for the weights trained on their items",
            *unmatched,
        ),
    )
