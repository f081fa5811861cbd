"""Named presets: coherent settings for the replay server, the learner, the actors and the agent.

``apex-dqn-atari`` and ``apex-dpg-control`` are the Ape-X paper's settings (Horgan et al. 2018,
appendix), replay ratio included: the replay server's samples-per-insert rate limiter holds the learner to the
paper's sampled/inserted ratio whatever the number of cores (DQN: 19 batches of 512 per second against 12,500
inserts, 0.78; DPG: about 22,000 sampled against 14,000 inserted per second, 1.57), and evaluation follows
the paper's protocol (10 episodes per point, 30 at the end). The small presets are tuned, and say what differs
in their descriptions: they shrink what only pays off at the paper's scale (replay size, warm-up, batch, target
period) and let the learner sample as fast as it can, so that a 2-core machine learns CartPole, Pendulum or
cartpole-swingup in minutes.

Every process of a run resolves the same preset, so the actors' networks match the learner's; flags given on
a command line override single fields (see ``apexrl-learner --help``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["PRESETS", "Preset", "ReplaySettings", "default_preset_for", "env_family", "get_preset"]


@dataclass(frozen=True)
class ReplaySettings:
    """Fields of :class:`~apexrl.replay.config.ServerConfig` a preset sets (the run plan adds the seed and makes
    ``min_size_to_sample`` follow the learner's ``min_replay_size``)."""

    capacity: int
    eviction: str = "fifo"
    alpha: float = 0.6
    alpha_evict: float = -0.4
    samples_per_insert: float | None = None
    error_buffer: float | None = None
    """Slack of the samples-per-insert limiter in items (None: the server's default); it must cover a learner
    batch plus an actor's insert (``apexrl run`` checks that)."""


@dataclass(frozen=True)
class Preset:
    name: str
    description: str
    agent: str
    """A registered agent's name."""
    env: str
    """Default environment (``--env`` may name another of the same kind)."""
    agent_overrides: dict[str, Any] = field(default_factory=dict)
    """Fields of DQNConfig / DPGConfig that differ from the paper defaults."""
    replay: ReplaySettings = ReplaySettings(capacity=2_000_000)
    learner: dict[str, Any] = field(default_factory=dict)
    """Fields of LearnerConfig."""
    actor: dict[str, Any] = field(default_factory=dict)
    """Fields of ActorConfig."""
    actors: int = 2
    """Actors the launcher starts by default."""
    minutes: float = 10.0
    """Run length the launcher uses by default."""
    final_eval_episodes: int = 30
    """Episodes of the evaluation of the final checkpoint when a run reaches its length (the Ape-X evaluation
    protocol's final evaluation has at least 30)."""

    def agent_config(self, **overrides: Any) -> Any:
        """The agent's config: its class's defaults, then the preset's overrides, then ``overrides`` (None
        values ignored); ValueError from the config class on a bad value."""
        from apexrl.agents import get_agent

        values = {**self.agent_overrides, **{k: v for k, v in overrides.items() if v is not None}}
        return get_agent(self.agent).config_class(**values)


DQN_SAMPLES_PER_INSERT = 19 * 512 / 12_500
"""Ape-X DQN: the learner's ~19 batches of 512 per second against the actors' ~12,500 transitions per second."""
DPG_SAMPLES_PER_INSERT = 22_000 / 14_000
"""Ape-X DPG: ~22,000 transitions sampled against ~14,000 inserted per second."""

PAPER_DPG_REPLAY = ReplaySettings(capacity=1_000_000, eviction="prioritized", alpha_evict=-0.4,
                                  samples_per_insert=DPG_SAMPLES_PER_INSERT,
                                  error_buffer=10 * 256)  # ten learner batches of slack
PAPER_DPG_LEARNER = dict(min_replay_size=50_000, publish_every=10, checkpoint_every=10_000, eval_every=120.0,
                         eval_episodes=10, metrics_every=30.0)
"""Replay and learner settings of the paper's Ape-X DPG (apex-dpg-control), shared by apex-d4pg-control."""

PRESETS: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            name="apex-dqn-atari",
            description="Ape-X DQN with the paper's settings (Atari: Pong by default)",
            agent="dqn",
            env="atari:Pong",
            replay=ReplaySettings(capacity=2_000_000, eviction="fifo", samples_per_insert=DQN_SAMPLES_PER_INSERT,
                                  error_buffer=10 * 512),  # ten learner batches of slack
            learner=dict(min_replay_size=50_000, publish_every=10, checkpoint_every=10_000, eval_every=600.0,
                         eval_episodes=10, metrics_every=30.0),
            actor=dict(flush_every=50, params_every_frames=400),
            actors=8,
            minutes=60.0,
            agent_overrides=dict(optimizer="rmsprop_tf"),  # the paper's (TensorFlow's) centered RMSProp
        ),
        Preset(
            name="apex-dpg-control",
            description="Ape-X DPG with the paper's settings (Control Suite: cartpole-swingup by default)",
            agent="dpg",
            env="dmc:cartpole-swingup",
            agent_overrides=dict(n_step=5),
            replay=PAPER_DPG_REPLAY,
            learner=PAPER_DPG_LEARNER,
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=45.0,
        ),
        Preset(
            name="cartpole",
            description="Ape-X DQN tuned for gym:CartPole-v1 on a laptop (batch 128, lr 5e-4, target period 200, "
                        "128x128 MLP, 100k replay, greedy evaluation, no replay-ratio limit)",
            agent="dqn",
            env="gym:CartPole-v1",
            agent_overrides=dict(batch_size=128, lr=5e-4, target_update_period=200, hidden=(128, 128),
                                 eval_epsilon=0.0),
            replay=ReplaySettings(capacity=100_000, eviction="fifo"),
            learner=dict(min_replay_size=2_000, publish_every=5, checkpoint_every=2_000, eval_every=20.0,
                         eval_episodes=20, metrics_every=5.0),
            actor=dict(flush_every=50, params_every_frames=200),
            actors=2,
            minutes=5.0,
        ),
        Preset(
            name="cartpole-swingup",
            description="Ape-X DPG tuned for dmc:cartpole-swingup on a 2-core machine (n=3, critic lr 3e-4, "
                        "parameter-gradient clipping, 300k replay, no replay-ratio limit)",
            agent="dpg",
            env="dmc:cartpole-swingup",
            # Its measured result (bench/README.md) is with the actor's parameter gradients clipped, not dQ/da.
            agent_overrides=dict(n_step=3, critic_lr=3e-4, actor_lr=1e-4, dqda_clip=None, actor_grad_clip=1.0),
            replay=ReplaySettings(capacity=300_000, eviction="prioritized", alpha_evict=-0.4),
            learner=dict(min_replay_size=10_000, publish_every=10, checkpoint_every=5_000, eval_every=60.0,
                         eval_episodes=10, metrics_every=10.0),
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=45.0,
        ),
        Preset(
            name="pendulum",
            description="Ape-X DPG tuned for gym:Pendulum-v1 (quick continuous-control check: n=3, batch 128, "
                        "critic lr 1e-3, parameter-gradient clipping, no replay-ratio limit)",
            agent="dpg",
            env="gym:Pendulum-v1",
            # Pendulum's rewards (down to -16 a step) make |dQ/da| >> 1: clipping it to 1 learnt worse in a 5-minute
            # side-by-side run (eval -957 vs -117 at the end); the actor's parameter gradients are clipped instead.
            agent_overrides=dict(n_step=3, batch_size=128, critic_lr=1e-3, actor_lr=1e-4, dqda_clip=None,
                                 actor_grad_clip=1.0),
            replay=ReplaySettings(capacity=100_000, eviction="fifo"),
            learner=dict(min_replay_size=2_000, publish_every=5, checkpoint_every=2_000, eval_every=30.0,
                         eval_episodes=5, metrics_every=5.0),
            actor=dict(flush_every=50, params_every_frames=200),
            actors=2,
            minutes=10.0,
        ),
        Preset(
            name="apex-d4pg-control",
            description="D4PG with the paper's settings (n=5, 51 atoms on [-150, 150], batch 256, Adam 1e-4; "
                        "apex-dpg-control's replay; Control Suite: cartpole-swingup by default)",
            agent="d4pg",
            env="dmc:cartpole-swingup",
            replay=PAPER_DPG_REPLAY,
            learner=PAPER_DPG_LEARNER,
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=45.0,
        ),
        Preset(
            name="d4pg-cartpole-swingup",
            description="D4PG tuned for dmc:cartpole-swingup on a 2-core machine (vs the paper: n=3, critic lr "
                        "3e-4, support [0, 100], sigma ladder 0.3..0.1, parameter-gradient clipping, smaller replay)",
            agent="d4pg",
            env="dmc:cartpole-swingup",
            # The DPG cartpole-swingup preset's tuning; the support is exactly the range of returns-to-go of
            # per-step rewards in [0, 1] at gamma 0.99, so the 51 atoms are 2 apart rather than 6.
            agent_overrides=dict(n_step=3, critic_lr=3e-4, actor_lr=1e-4, dqda_clip=None, actor_grad_clip=1.0,
                                 v_min=0.0, v_max=100.0, noise_sigma_max=0.3, noise_sigma_min=0.1),
            replay=ReplaySettings(capacity=300_000, eviction="prioritized", alpha_evict=-0.4),
            learner=dict(min_replay_size=10_000, publish_every=10, checkpoint_every=5_000, eval_every=60.0,
                         eval_episodes=10, metrics_every=10.0),
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=20.0,
        ),
    ]
}


def get_preset(name: str) -> Preset:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}; valid presets: {', '.join(PRESETS)}") from None


def env_family(env: str) -> str:
    """``gym``, ``atari`` or ``dmc``: the part of an environment name before the colon."""
    return env.split(":", 1)[0]


def default_preset_for(agent: str, env: str) -> Preset:
    """The preset an actor, learner or run uses when none is named: the first preset of ``agent`` for
    ``env``'s family (the paper's for Atari and the Control Suite, the small ones for gymnasium tasks). An agent
    with no such preset runs on its config class's defaults and the processes' default settings."""
    from apexrl.agents import get_agent

    agent_def = get_agent(agent)  # ValueError naming the valid agents
    for preset in PRESETS.values():
        if preset.agent == agent and env_family(preset.env) == env_family(env):
            return preset
    return Preset(name=f"{agent}-defaults", description=f"{agent_def.description}, default settings",
                  agent=agent, env=env, replay=ReplaySettings(capacity=1_000_000), actors=2, minutes=10.0)
