"""The R2D2 presets as data: ``apexrl.launch.presets.PRESETS`` holds them as :class:`~apexrl.launch.presets.Preset`.

Each entry holds the fields of ``Preset`` by name -- ``tables`` as the keyword arguments of each
:class:`~apexrl.replay.tables.TableConfig` (one prioritized table ``default`` that the actors' sequence adders
write to and the learner samples). The R2D2 ``AgentDef`` declares them (``presets``) with ``R2D2_SOURCE``
(``sources``, joining ``apexrl.launch.preset_table.SOURCES``) and ``R2D2_FIELD_SOURCES`` (``field_sources``,
``apexrl.agents.config.FIELD_SOURCES[R2D2Config]`` once registered); ``apexrl.launch.presets.preset_from_data``
makes each a ``Preset``. Every setting an entry sets names its source in ``sources``; the settings it leaves at
their defaults take ``R2D2_FIELD_SOURCES`` (agent) or the preset table's defaults (learner, actor).
tests/agents/test_r2d2.py checks both.
"""

from __future__ import annotations

from typing import Any

__all__ = ["R2D2", "R2D2_PRESETS", "R2D2_SOURCE"]

R2D2 = "R2D2 paper (Kapturowski et al. 2019, Recurrent Experience Replay in Distributed Reinforcement Learning)"
R2D2_SOURCE: dict[str, str] = {
    "R2D2": "Kapturowski et al. 2019, Recurrent Experience Replay in Distributed Reinforcement Learning (ICLR 2019)"
}
"""The source key the R2D2 settings name, with its citation (to join ``preset_table.SOURCES``)."""

_PAPER_LEARNER = dict(
    min_replay_size=5_000,
    beta=0.6,
    publish_every=10,
    checkpoint_every=10_000,
    eval_every=600.0,
    eval_episodes=10,
    metrics_every=30.0,
)

R2D2_PRESETS: dict[str, dict[str, Any]] = {
    "r2d2-atari": dict(
        description="R2D2 with the paper's settings (Atari: Pong by default)",
        source=f"R2D2 as in the {R2D2}: Nature torso + LSTM(512) + dueling heads, double Q, n = 5, gamma 0.997, "
        "value rescaling, stored state with burn-in 40 and 80 trained steps, sequence priorities (eta 0.9)",
        agent="r2d2",
        env="atari:Pong",
        agent_overrides={},  # R2D2Config's defaults are the paper's
        tables=(dict(name="default", sampler="prioritized", remover="fifo", capacity=100_000, alpha=0.9),),
        learner=_PAPER_LEARNER,
        actor=dict(params_every_frames=400),
        actors=8,
        minutes=60.0,
        sources=dict(
            tables="R2D2",
            min_replay_size="apexrl",
            beta="R2D2",
            eval_episodes="Ape-X",
            params_every_frames="R2D2",
            actors="apexrl",
        ),
        unmatched=(
            "256 actors in the paper, 8 here by default",
            "the paper feeds the LSTM the previous step's action (one-hot) and reward beside the torso's "
            "features; this network does not (the sequence format would need the action and reward before "
            "step 0)",
            "capacity counts sequences: the paper's 100,000 part-overlapping sequences (4 million "
            "observations); an item holds burn-in + trace + 1 = 121 steps of 4-frame stacks",
            "no replay-ratio limit: the paper reports no samples-per-insert ratio to hold the learner to; "
            "the wiring measures one before choosing",
            "eviction is FIFO and the warm-up is 5,000 sequences: apexrl's choices, the paper does not give them",
            "items of burn-in + trace + 1 steps (the +1: the last trained step's next observation), so the "
            "last 4 trained steps' n-step returns are shortened by the sequence's end and bootstrap from "
            "its last observation",
            "the parameter pull is every 400 frames as Ape-X counts them; if the paper's 400 are agent steps "
            "(4 frames each), params_every_frames=1600 matches it",
            "rewards are not clipped (value rescaling instead): the adder stores StepResult.raw_reward",
            "the loss sums 1/2 delta^2 over a sequence's trained steps and averages over sequences (the paper "
            "does not say how it reduces over time)",
            "apexrl's Atari preprocessing (4-frame stacks, 30 no-ops, life loss not terminal) as for Ape-X "
            "DQN; the paper's frame stacking is not checked here",
            "each actor environment's sequence writer sends its items 8 at a time (the writer's flush_items; "
            "flush_every does not apply), at the table's largest priority so far rather than one the actor "
            "computes",
        ),
    ),
    "r2d2-cpu": dict(
        description="R2D2 sized for a 2-core machine (masked CartPole: CartPole without its velocities)",
        source="apexrl's choices for a 2-core machine (its masked-CartPole runs are in bench/README.md); "
        "otherwise R2D2",
        agent="r2d2",
        env="gym:apexrl.envs.masked:MaskedCartPole-v1",
        agent_overrides=dict(
            gamma=0.99,
            batch_size=32,
            burn_in=10,
            trace_length=20,
            sequence_period=10,
            lr=1e-3,
            lr_end=1e-4,
            lr_decay_steps=15_000,
            target_update_period=200,
            lstm_size=64,
            hidden=(64,),
            stream_hidden=64,
            eval_epsilon=0.0,
        ),
        tables=(dict(name="default", sampler="prioritized", remover="fifo", capacity=20_000, alpha=0.9),),
        learner=dict(
            min_replay_size=200,
            beta=0.6,
            publish_every=5,
            checkpoint_every=2_000,
            eval_every=20.0,
            eval_episodes=10,
            metrics_every=5.0,
            eval_weights="polyak",
            polyak_tau=0.002,
        ),
        actor=dict(params_every_frames=200, envs_per_actor=4),
        actors=2,
        minutes=20.0,
        sources={
            "*": "apexrl",
            "beta": "R2D2",
            "lr_end": "tuned",
            "lr_decay_steps": "tuned",
        },
        unmatched=(
            "the table's alpha 0.9 is R2D2's; its capacity and FIFO remover are apexrl's",
            "sized for a 2-core machine (a small LSTM, short sequences, gamma 0.99 for 500-step episodes); the "
            "learning rate falls linearly from 1e-3 to 1e-4 over the first 15,000 updates and the evaluations "
            "score a Polyak average of the weights (tau 0.002, about 500 updates), tuned on masked CartPole so "
            "that a run ends as well as it peaks (R2D2 keeps 1e-4 throughout and evaluates the online weights)",
        ),
    ),
}
"""The R2D2 presets by name: the fields of ``apexrl.launch.presets.Preset`` (module docstring)."""
