"""Named presets: coherent settings for the replay server, the learner, the actors and the agent.

Every preset says what it follows: ``source`` cites the paper or code base, ``sources`` names the source of
each setting it sets (the agent config classes name the sources of their defaults,
``apexrl.agents.config.FIELD_SOURCES``) and ``unmatched`` lists the details of that source it does not match.
``apexrl.launch.preset_table`` prints all of it as the presets table of docs/running.md and the epilog of
``apexrl run --help``; tests/launch/test_preset_table.py fails when the documentation and the presets disagree.

- ``apex-dqn-atari`` and ``apex-dpg-control``: the Ape-X paper's settings (Horgan et al. 2018, appendix),
  replay ratio included: the replay server's samples-per-insert rate limiter holds the learner to the paper's
  sampled/inserted ratio whatever the number of cores (DQN: 19 batches of 512 per second against 12,500
  inserts, 0.78; DPG: about 22,000 sampled against 14,000 inserted per second, 1.57), and evaluation follows
  the paper's protocol (10 episodes per point, 30 at the end).
- ``apex-d4pg-control``: the Control Suite paper's D4PG (Tassa et al. 2018); ``d4pg-acme``: Acme's D4PG.
- ``d4pg-small``, ``td3-small``, ``sac-small``, ``mpo-small``, ``dmpo-small``: D4PG, TD3, SAC, MPO and DMPO sized
  for a 2-core machine and 2 actors (Acme's replay ratio of 32 samples per insert, so that the learner gets most
  of the CPU; networks sized for a CPU learner; observation normalisation); each lists what it changes from its
  source.
- The other small presets are tuned, and say what differs in their descriptions: they shrink what only pays off at
  the paper's scale (replay size, warm-up, batch, target period) and let the learner sample as fast as it can,
  so that a 2-core machine learns CartPole, Pendulum or cartpole-swingup in minutes.

The presets of DQN, DPG, D4PG, TD3 and SAC are written here; every other agent declares its own as data on its
``AgentDef`` (``presets``), and :data:`PRESETS` lists them after these, in the agents' registration order.

Every process of a run resolves the same preset, so the actors' networks match the learner's; flags given on
a command line override single fields (see ``apexrl-learner --help``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from apexrl.agents.small_presets import (
    ACME_ERROR_BUFFER,
    ACME_MIN_REPLAY,
    ACME_SAMPLES_PER_INSERT,
    SMALL_LEARNER,
    SMALL_REPLAY_SETTINGS,
    SMALL_SOURCES,
    SMALL_UNMATCHED,
)

if TYPE_CHECKING:
    from apexrl.replay.tables import TableConfig

__all__ = [
    "OFF",
    "PRESETS",
    "Preset",
    "ReplaySettings",
    "default_preset_for",
    "env_family",
    "get_preset",
    "preset_from_data",
]


OFF = "none"
"""An override that sets an optional agent setting to None (``--dqda-clip none``): None itself means "not
given" in :meth:`Preset.agent_config`."""


@dataclass(frozen=True)
class ReplaySettings:
    """Table flags (:class:`~apexrl.replay.server.table_flags.TableFlags`) a preset sets for the table ``default``
    (the run plan adds the spec and makes ``min_size_to_sample`` follow the learner's ``min_replay_size``)."""

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
    source: str = ""
    """What the preset follows, with the citation (``tuned``: a preset tuned here, bench/README.md)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Source (a key of ``apexrl.launch.preset_table.SOURCES``) of each setting the preset sets, by setting name
    (agent config fields, ``capacity``, ``eviction``, ``alpha``, ``alpha_evict``, ``samples_per_insert``,
    ``error_buffer``, ``min_replay_size``, ``eval_episodes``, ``final_eval_episodes``, ``actors``, ...);
    ``"*"``: the source of every setting the preset sets and does not name."""
    unmatched: tuple[str, ...] = ()
    """Details of its source the preset does not match, one sentence each."""
    tables: tuple[TableConfig, ...] | None = None
    """The replay servers' tables (:class:`~apexrl.replay.tables.TableConfig`; ``apexrl run --tables FILE``
    replaces them); None: the one table ``default`` that ``replay`` configures. A preset with tables leaves
    ``replay`` at its default; the run's learner and actors use the agent's table (``ReplayPath.table``,
    ``default`` unless it names another), which it must hold (:func:`apexrl.launch.plan.plan` pins the run's
    spec on it, and a min size that follows the learner's ``min_replay_size`` where its rate limiter is None)."""

    def __post_init__(self) -> None:
        if self.tables is not None:
            from apexrl.replay.tables import check_table_names

            object.__setattr__(self, "tables", tuple(self.tables))
            check_table_names(self.tables)
            if self.replay != _field_default_replay():
                raise ValueError(
                    f"preset {self.name}: give the replay as tables or as replay settings, not both (the tables "
                    "configure every table)"
                )

    def agent_config(self, **overrides: Any) -> Any:
        """The agent's config: its class's defaults, then the preset's overrides, then ``overrides`` (None
        values ignored, :data:`OFF` sets None); ValueError from the config class on a bad value, or naming a
        field the agent does not have."""
        from apexrl.agents import get_agent

        values = {**self.agent_overrides, **{k: v for k, v in overrides.items() if v is not None}}
        values = {k: None if v == OFF else v for k, v in values.items()}
        config_class = get_agent(self.agent).config_class
        known = {f.name for f in fields(config_class)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(
                f"agent {self.agent} has no setting {', '.join(unknown)} (preset {self.name}); "
                f"its settings: {', '.join(sorted(known))}"
            )
        return config_class(**values)


def _field_default_replay() -> ReplaySettings:
    return next(f.default for f in fields(Preset) if f.name == "replay")  # type: ignore[return-value]


DQN_SAMPLES_PER_INSERT = 19 * 512 / 12_500
"""Ape-X DQN: the learner's ~19 batches of 512 per second against the actors' ~12,500 transitions per second."""
DPG_SAMPLES_PER_INSERT = 22_000 / 14_000
"""Ape-X DPG: ~22,000 transitions sampled against ~14,000 inserted per second."""

APEX = "Ape-X paper (Horgan et al. 2018, Distributed Prioritized Experience Replay, appendix)"
PAPER_DQN_REPLAY = ReplaySettings(
    capacity=2_000_000, eviction="fifo", samples_per_insert=DQN_SAMPLES_PER_INSERT, error_buffer=10 * 512
)  # ten learner batches of slack
PAPER_DQN_LEARNER = dict(
    min_replay_size=50_000,
    publish_every=10,
    checkpoint_every=10_000,
    eval_every=600.0,
    eval_episodes=10,
    metrics_every=30.0,
)
"""Replay and learner settings of the paper's Ape-X DQN (apex-dqn-atari); apex-dqn-atari-cpu changes a few."""
PAPER_DQN_SOURCES = dict(
    optimizer="Ape-X",
    capacity="Ape-X",
    eviction="Ape-X",
    samples_per_insert="Ape-X",
    error_buffer="apexrl",
    min_replay_size="Ape-X",
    eval_episodes="Ape-X",
    actors="apexrl",
)
PAPER_DPG_REPLAY = ReplaySettings(
    capacity=1_000_000,
    eviction="prioritized",
    alpha_evict=-0.4,
    samples_per_insert=DPG_SAMPLES_PER_INSERT,
    error_buffer=10 * 256,
)  # ten learner batches of slack
PAPER_DPG_LEARNER = dict(
    min_replay_size=50_000,
    publish_every=10,
    checkpoint_every=10_000,
    eval_every=120.0,
    eval_episodes=10,
    metrics_every=30.0,
)
"""Replay and learner settings of the paper's Ape-X DPG (apex-dpg-control); apex-d4pg-control shares the
learner's."""
PAPER_DPG_SOURCES = dict(
    capacity="Ape-X",
    eviction="Ape-X",
    alpha_evict="Ape-X",
    samples_per_insert="Ape-X",
    error_buffer="apexrl",
    min_replay_size="Ape-X",
    eval_episodes="Ape-X",
    actors="apexrl",
)
SMALL_REPLAY = ReplaySettings(**SMALL_REPLAY_SETTINGS)
"""The small-machine presets' replay (:data:`apexrl.agents.small_presets.SMALL_REPLAY_SETTINGS`)."""

_BUILT_IN: dict[str, Preset] = {
    p.name: p
    for p in [
        Preset(
            name="apex-dqn-atari",
            description="Ape-X DQN with the paper's settings (Atari: Pong by default)",
            source=f"Ape-X DQN as in the {APEX}; the replay ratio is the paper's measured one",
            agent="dqn",
            env="atari:Pong",
            replay=PAPER_DQN_REPLAY,
            learner=PAPER_DQN_LEARNER,
            actor=dict(flush_every=50, params_every_frames=400),
            actors=8,
            minutes=60.0,
            agent_overrides=dict(optimizer="rmsprop_tf"),  # the paper's (TensorFlow's) centered RMSProp
            sources=PAPER_DQN_SOURCES,
            unmatched=(
                "360 actors in the paper, 8 here by default (the rate limiter keeps the paper's replay "
                "ratio whatever the number)",
            ),
        ),
        Preset(
            name="apex-dqn-atari-cpu",
            description="Ape-X DQN sized for a CPU-only machine of a few cores (Atari: Pong by default)",
            source=f"Ape-X DQN as in the {APEX}, sized for a CPU learner: a batch of 64 and 2 actor processes of "
            "4 games each; every change is listed as unmatched",
            agent="dqn",
            env="atari:Pong",
            replay=dataclasses.replace(PAPER_DQN_REPLAY, error_buffer=10 * 64),  # ten learner batches of slack
            learner=dict(PAPER_DQN_LEARNER, eval_every=300.0),
            actor=dict(flush_every=50, params_every_frames=400, envs_per_actor=4),
            actors=2,
            minutes=60.0,
            agent_overrides=dict(optimizer="rmsprop_tf", batch_size=64),
            sources=dict(PAPER_DQN_SOURCES, batch_size="apexrl", envs_per_actor="apexrl"),
            unmatched=(
                "a batch of 64, not the paper's 512: a CPU learner takes a step of 512 in about a second "
                "on 2 cores; with the paper's replay ratio kept, each transition is sampled as often, in "
                "8x more, smaller steps",
                "2 actor processes of 4 games each (--envs-per-actor 4): the 8 environments of "
                "apex-dqn-atari's 8 actors, on the same epsilon ladder, in 2 processes; the paper has 360",
                "an evaluation every 5 minutes rather than 10, for a curve of an hour's run",
            ),
        ),
        Preset(
            name="apex-dpg-control",
            description="Ape-X DPG with the paper's settings (Control Suite: cartpole-swingup by default)",
            source=f'Ape-X DPG as in the {APEX}: n = 3 ("hyperparameters are otherwise as per DQN"; 5 is '
            "D4PG's); the replay ratio is the paper's measured one",
            agent="dpg",
            env="dmc:cartpole-swingup",
            agent_overrides=dict(n_step=3),
            replay=PAPER_DPG_REPLAY,
            learner=PAPER_DPG_LEARNER,
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=45.0,
            sources=dict(PAPER_DPG_SOURCES, n_step="Ape-X"),
            unmatched=(
                "the paper's exploration noise is not given here: sigma 0.3, Acme's",
                "a few actors on one machine rather than the paper's many (the rate limiter keeps its replay ratio)",
            ),
        ),
        Preset(
            name="cartpole",
            description="Ape-X DQN tuned for gym:CartPole-v1 on a laptop (batch 128, lr 5e-4, target period 200, "
            "128x128 MLP, 100k replay, greedy evaluation, no replay-ratio limit)",
            source="tuned here for gym:CartPole-v1 on a laptop (results: bench/README.md); otherwise Ape-X DQN",
            agent="dqn",
            env="gym:CartPole-v1",
            agent_overrides=dict(
                batch_size=128, lr=5e-4, target_update_period=200, hidden=(128, 128), eval_epsilon=0.0
            ),
            replay=ReplaySettings(capacity=100_000, eviction="fifo"),
            learner=dict(
                min_replay_size=2_000,
                publish_every=5,
                checkpoint_every=2_000,
                eval_every=20.0,
                eval_episodes=20,
                metrics_every=5.0,
            ),
            actor=dict(flush_every=50, params_every_frames=200),
            actors=2,
            minutes=5.0,
            sources={"*": "tuned"},
        ),
        Preset(
            name="cartpole-swingup",
            description="Ape-X DPG tuned for dmc:cartpole-swingup on a 2-core machine (n=3, critic lr 3e-4, "
            "parameter-gradient clipping, 300k replay, no replay-ratio limit)",
            source="tuned here for dmc:cartpole-swingup on a 2-core machine (bench/README.md); otherwise Ape-X DPG",
            agent="dpg",
            env="dmc:cartpole-swingup",
            # Its measured result (bench/README.md) is with the actor's parameter gradients clipped, not dQ/da.
            agent_overrides=dict(n_step=3, critic_lr=3e-4, actor_lr=1e-4, dqda_clip=None, actor_grad_clip=1.0),
            replay=ReplaySettings(capacity=300_000, eviction="prioritized", alpha_evict=-0.4),
            learner=dict(
                min_replay_size=10_000,
                publish_every=10,
                checkpoint_every=5_000,
                eval_every=60.0,
                eval_episodes=10,
                metrics_every=10.0,
            ),
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=45.0,
            sources={"*": "tuned", "n_step": "Ape-X", "actor_lr": "Ape-X", "alpha_evict": "Ape-X"},
        ),
        Preset(
            name="pendulum",
            description="Ape-X DPG tuned for gym:Pendulum-v1 (quick continuous-control check: n=3, batch 128, "
            "critic lr 1e-3, parameter-gradient clipping, no replay-ratio limit)",
            source="tuned here for gym:Pendulum-v1 (a quick continuous-control check); otherwise Ape-X DPG",
            agent="dpg",
            env="gym:Pendulum-v1",
            # Pendulum's rewards (down to -16 a step) make |dQ/da| >> 1: clipping it to 1 learnt worse in a 5-minute
            # side-by-side run (eval -957 vs -117 at the end); the actor's parameter gradients are clipped instead.
            agent_overrides=dict(
                n_step=3, batch_size=128, critic_lr=1e-3, actor_lr=1e-4, dqda_clip=None, actor_grad_clip=1.0
            ),
            replay=ReplaySettings(capacity=100_000, eviction="fifo"),
            learner=dict(
                min_replay_size=2_000,
                publish_every=5,
                checkpoint_every=2_000,
                eval_every=30.0,
                eval_episodes=5,
                metrics_every=5.0,
            ),
            actor=dict(flush_every=50, params_every_frames=200),
            actors=2,
            minutes=10.0,
            sources={"*": "tuned", "n_step": "Ape-X", "actor_lr": "Ape-X"},
        ),
        Preset(
            name="apex-d4pg-control",
            description="D4PG with the Control Suite paper's settings (101 atoms on [-150, 150], n=5, batch 256, "
            "Adam 1e-4, sigma 1..1/32 across actors; Control Suite: cartpole-swingup by default)",
            source="D4PG as the Control Suite paper benchmarks it (Tassa et al. 2018, DeepMind Control Suite, "
            "its D4PG paragraph); what that paragraph does not give follows Ape-X DPG",
            agent="d4pg",
            env="dmc:cartpole-swingup",
            agent_overrides=dict(
                num_atoms=101,
                v_min=-150.0,
                v_max=150.0,
                n_step=5,
                batch_size=256,
                actor_lr=1e-4,
                critic_lr=1e-4,
                target_update_period=100,
                noise_sigma_max=1.0,
                noise_sigma_min=1 / 32,
            ),
            # The paper prints alpha_evict = 0.6 for an eviction that removes low-priority items first; apexrl draws
            # eviction victims with probability proportional to p ** alpha_evict, so the same rule is -0.6.
            replay=ReplaySettings(
                capacity=1_000_000,
                eviction="prioritized",
                alpha=0.6,
                alpha_evict=-0.6,
                samples_per_insert=DPG_SAMPLES_PER_INSERT,
                error_buffer=10 * 256,
            ),
            learner=PAPER_DPG_LEARNER,
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=45.0,
            sources=dict(
                PAPER_DPG_SOURCES,
                num_atoms="Control Suite",
                v_min="Control Suite",
                v_max="Control Suite",
                n_step="Control Suite",
                batch_size="Control Suite",
                actor_lr="Control Suite",
                critic_lr="Control Suite",
                target_update_period="Control Suite",
                noise_sigma_max="Control Suite",
                noise_sigma_min="Control Suite",
                alpha="Control Suite",
                alpha_evict="Control Suite",
            ),
            unmatched=(
                "the paper prints alpha_evict = 0.6 for eviction that favours low priorities; apexrl evicts with "
                "probability proportional to p^alpha_evict, so the same rule is alpha_evict = -0.6",
                "the paper gives sigma's range across actors (1/32 to 1), not its spacing: apexrl spaces it "
                "geometrically from 1 (actor 0) to 1/32 (the last actor); noise_sigma_spacing=linear is the other "
                "reading",
                "the replay capacity, the replay ratio (1.57) and the warm-up (50 000) are Ape-X DPG's: the "
                "paragraph gives none",
                "a few actors on one machine rather than the paper's many",
            ),
        ),
        Preset(
            name="d4pg-acme",
            description="D4PG with Acme's settings (51 atoms, uniform replay, 32 samples per insert, sigma 0.3, "
            "dQ/da norm clipping, gradient norm 40, actors on the target networks)",
            source="Acme's D4PG (Hoffman et al. 2020, Acme: a research framework for distributed reinforcement "
            "learning): its TensorFlow agent, acme/agents/tf/d4pg, and the config and replay table its JAX "
            "agent shares",
            agent="d4pg",
            env="dmc:cartpole-swingup",
            agent_overrides=dict(
                num_atoms=51,
                v_min=-150.0,
                v_max=150.0,
                n_step=5,
                gamma=0.99,
                batch_size=256,
                actor_lr=1e-4,
                critic_lr=1e-4,
                target_update_period=100,
                noise_sigma_max=0.3,
                noise_sigma_min=0.3,
                dqda_clip=None,
                dqda_clip_norm=1.0,
                grad_clip_norm=40.0,
                actor_weights="target",
                actor_loss_state="next_obs",
            ),
            # Uniform sampling (alpha 0: every priority^0 = 1, every IS weight 1) and FIFO eviction, as Acme's
            # Reverb table (Uniform sampler, Fifo remover).
            replay=ReplaySettings(
                capacity=1_000_000,
                eviction="fifo",
                alpha=0.0,
                samples_per_insert=ACME_SAMPLES_PER_INSERT,
                error_buffer=ACME_ERROR_BUFFER,
            ),
            learner=dict(
                min_replay_size=ACME_MIN_REPLAY,
                publish_every=10,
                checkpoint_every=10_000,
                eval_every=120.0,
                eval_episodes=10,
                metrics_every=30.0,
            ),
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=45.0,
            sources={
                **dict.fromkeys(
                    (
                        "num_atoms",
                        "v_min",
                        "v_max",
                        "n_step",
                        "gamma",
                        "batch_size",
                        "actor_lr",
                        "critic_lr",
                        "target_update_period",
                        "noise_sigma_max",
                        "noise_sigma_min",
                        "dqda_clip",
                        "dqda_clip_norm",
                        "grad_clip_norm",
                        "actor_weights",
                        "actor_loss_state",
                        "capacity",
                        "eviction",
                        "alpha",
                        "samples_per_insert",
                        "error_buffer",
                        "min_replay_size",
                    ),
                    "Acme",
                ),
                "eval_episodes": "Ape-X",
                "actors": "apexrl",
            },
            unmatched=(
                "Acme's networks (layer-normalised MLPs; its critic takes the action with the observation at its "
                "input) are not used: the actor (300-200) and the critic (400-300) are Ape-X DPG's tanh networks, "
                "the action entering the critic's second layer",
                "Acme computes the critic's and the actor's losses from the same parameters before either step; "
                "apexrl steps the critic first and takes the actor's loss through the updated critic",
                "Acme's actors insert at priority 1; apexrl's actors still compute initial priorities (unused: "
                "uniform sampling ignores them)",
                "Acme inserts transitions one at a time; apexrl's actors insert 50 at a time",
                "Acme's JAX agent clips dQ/da element-wise (rlax) where its TensorFlow agent, followed here, clips "
                "each sample's norm",
            ),
        ),
        Preset(
            name="d4pg-cartpole-swingup",
            description="D4PG tuned for dmc:cartpole-swingup on a 2-core machine (vs the paper: n=3, critic lr "
            "3e-4, support [0, 100], tuned sigma ladder 0.3..0.1, parameter-gradient clipping, smaller "
            "replay)",
            source="tuned here for dmc:cartpole-swingup on a 2-core machine (bench/README.md); otherwise D4PG",
            agent="d4pg",
            env="dmc:cartpole-swingup",
            # The DPG cartpole-swingup preset's tuning; the support is exactly the range of returns-to-go of
            # per-step rewards in [0, 1] at gamma 0.99, so the 51 atoms are 2 apart rather than 6.
            agent_overrides=dict(
                n_step=3,
                critic_lr=3e-4,
                actor_lr=1e-4,
                dqda_clip=None,
                actor_grad_clip=1.0,
                v_min=0.0,
                v_max=100.0,
                noise_sigma_max=0.3,
                noise_sigma_min=0.1,
            ),
            replay=ReplaySettings(capacity=300_000, eviction="prioritized", alpha_evict=-0.4),
            learner=dict(
                min_replay_size=10_000,
                publish_every=10,
                checkpoint_every=5_000,
                eval_every=60.0,
                eval_episodes=10,
                metrics_every=10.0,
            ),
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=20.0,
            sources={"*": "tuned", "actor_lr": "D4PG", "alpha_evict": "Ape-X"},
        ),
        Preset(
            name="d4pg-small",
            description="D4PG sized for 2 cores and 2 actors (Control Suite: walker-stand by default): 32 samples "
            "per insert, 256-256 networks, support [0, 100], observation normalisation",
            source="D4PG (Barth-Maron et al. 2018) with Acme's replay ratio and defaults, sized for a 2-core "
            "machine; every change is listed as unmatched",
            agent="d4pg",
            env="dmc:walker-stand",
            # The support is the range of returns-to-go of per-step rewards in [0, 1] at gamma 0.99 (every Control
            # Suite task), so the 51 atoms are 2 apart rather than 6 on Acme's [-150, 150].
            agent_overrides=dict(
                v_min=0.0,
                v_max=100.0,
                actor_hidden=(256, 256),
                critic_hidden=(256, 256),
                obs_norm=True,
            ),
            replay=SMALL_REPLAY,
            learner=SMALL_LEARNER,
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=20.0,
            sources=dict(SMALL_SOURCES, v_min="apexrl", v_max="apexrl"),
            unmatched=(
                *SMALL_UNMATCHED,
                "support [0, 100], the returns-to-go of rewards in [0, 1] at gamma 0.99, rather than Acme's "
                "[-150, 150]",
            ),
        ),
        Preset(
            name="td3-small",
            description="TD3 sized for 2 cores and 2 actors (Control Suite: walker-stand by default): 32 samples "
            "per insert, batch 256, 256-256 networks, n=3, observation normalisation",
            source="TD3 (Fujimoto et al. 2018) with Acme's D4PG replay ratio, sized for a 2-core machine; every "
            "change is listed as unmatched",
            agent="td3",
            env="dmc:walker-stand",
            agent_overrides=dict(
                n_step=3,
                batch_size=256,
                actor_hidden=(256, 256),
                critic_hidden=(256, 256),
                obs_norm=True,
            ),
            replay=SMALL_REPLAY,
            learner=SMALL_LEARNER,
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=20.0,
            sources=dict(SMALL_SOURCES, n_step="Ape-X", batch_size="apexrl"),
            unmatched=(
                *SMALL_UNMATCHED,
                "3-step returns (Ape-X DPG's) rather than the paper's one-step target: many actors' transitions "
                "come from older policies, and n-step returns carry rewards back faster",
                "a batch of 256 rather than 100: a CPU learner takes more transitions per second in fewer, larger "
                "steps",
            ),
        ),
        Preset(
            name="sac-small",
            description="SAC sized for 2 cores and 2 actors (Control Suite: walker-stand by default): 32 samples "
            "per insert, the paper's 256-256 networks and batch 256, n=3, observation normalisation",
            source="SAC (Haarnoja et al. 2018, Soft Actor-Critic Algorithms and Applications) with Acme's D4PG "
            "replay ratio, sized for a 2-core machine; every change is listed as unmatched",
            agent="sac",
            env="dmc:walker-stand",
            agent_overrides=dict(n_step=3, obs_norm=True),
            replay=SMALL_REPLAY,
            learner=SMALL_LEARNER,
            actor=dict(flush_every=50, params_every_frames=400),
            actors=2,
            minutes=20.0,
            sources=dict(SMALL_SOURCES, n_step="Ape-X"),
            unmatched=(
                *SMALL_UNMATCHED[:1],
                *SMALL_UNMATCHED[2:],
                "3-step returns (Ape-X DPG's) rather than the paper's one-step soft target: many actors' "
                "transitions come from older policies, and n-step returns carry rewards back faster; the "
                "entropy bonus enters only at the bootstrap",
            ),
        ),
    ]
}
"""The presets written here: those of the Ape-X agents (DQN, DPG, D4PG, TD3, SAC). The other agents declare
theirs as data on their ``AgentDef`` (``presets``)."""


def preset_from_data(name: str, entry: Mapping[str, Any]) -> Preset:
    """The :class:`Preset` ``name`` of an agent's preset data (``AgentDef.presets``): the fields of ``Preset`` by
    name, ``replay`` a :class:`ReplaySettings` or its keyword arguments, each of ``tables`` a ``TableConfig`` or
    its keyword arguments. ValueError naming the preset on a field ``Preset`` does not have or a bad value."""
    from apexrl.replay.tables import TableConfig

    values = dict(entry)
    try:
        if isinstance(values.get("replay"), Mapping):
            values["replay"] = ReplaySettings(**values["replay"])
        if values.get("tables") is not None:
            values["tables"] = tuple(t if isinstance(t, TableConfig) else TableConfig(**t) for t in values["tables"])
        return Preset(name=name, **values)
    except TypeError as e:  # an unknown or missing field: the dataclasses' message names it
        raise ValueError(f"preset {name}: {e}") from None


class _Presets(Mapping[str, Preset]):
    """:data:`PRESETS`: the presets written here, then each registered agent's (``AgentDef.presets``) in the
    order the agents are registered. Built on first use, after the built-in agents and the ``apexrl.agents``
    entry points are loaded, and again whenever the registry has changed since, so neither import order nor a
    plugin agent leaves one out."""

    def __init__(self, built_in: Mapping[str, Preset]) -> None:
        self._built_in = dict(built_in)
        self._state: tuple[tuple[int, ...], dict[str, Preset]] = ((), {})

    def _presets(self) -> dict[str, Preset]:
        from apexrl.agents import AGENTS, agent_names

        agent_names()  # registers the built-in agents and loads the plugins
        agents = list(AGENTS.values())
        key = tuple(map(id, agents))
        if key != self._state[0]:
            presets = dict(self._built_in)
            for agent in agents:
                for name, entry in agent.presets.items():
                    if name in presets:
                        raise ValueError(
                            f"agent {agent.name}: preset {name!r} is already defined (for agent {presets[name].agent})"
                        )
                    presets[name] = preset_from_data(name, {"agent": agent.name, **entry})
            self._state = (key, presets)  # one assignment: a reader on another thread sees the old or the new
        return self._state[1]

    def __getitem__(self, name: str) -> Preset:
        return self._presets()[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self._presets())

    def __len__(self) -> int:
        return len(self._presets())


PRESETS: Mapping[str, Preset] = _Presets(_BUILT_IN)
"""Every preset by name, in a stable order: those written here, then the registered agents' (:class:`_Presets`)."""


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
    with no such preset runs on its config class's defaults and the processes' default settings (an agent reading a
    queue, the on-policy ones, with the learner waiting for one batch rather than Ape-X's warm-up, publishing
    every update and, for synchronous actors, with as many environments as one batch has items)."""
    from apexrl.agents import get_agent

    agent_def = get_agent(agent)  # ValueError naming the valid agents
    for preset in PRESETS.values():
        if preset.agent == agent and env_family(preset.env) == env_family(env):
            return preset
    actors = 2
    learner: dict[str, Any] = {}
    actor: dict[str, Any] = {}
    replay = agent_def.replay
    if replay.reader == "queue":
        config = agent_def.config_class()
        # An agent reading a queue (the on-policy ones: 1,024 items, each popped once) learns from its first
        # batch: the learner's default warm-up of 50,000 transitions is for Ape-X's table and never fits the queue.
        # It publishes every update, as the on-policy presets: the actors' next items come from the newest policy.
        learner.update(min_replay_size=config.batch_size, publish_every=1)
        if replay.wait_for_weights is not None and replay.wait_for_weights(config):
            # Synchronous actors wait for new weights after each item of each environment: unless one round of
            # all the actors' environments fills a batch, every round waits out the actors' timeout.
            actor["envs_per_actor"] = -(-config.batch_size // actors)
    return Preset(
        name=f"{agent}-defaults",
        description=f"{agent_def.description}, default settings",
        agent=agent,
        env=env,
        replay=ReplaySettings(capacity=1_000_000),
        learner=learner,
        actor=actor,
        actors=actors,
        minutes=10.0,
    )
