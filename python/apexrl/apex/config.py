"""Typed configuration of the actor and learner processes (the CLIs parse flags into these).

Agent hyperparameters (network sizes, n-step, γ, optimiser) live in the agents' own configs
(:class:`apexrl.agents.DQNConfig`, :class:`apexrl.agents.DPGConfig`); a :mod:`preset <apexrl.launch.presets>` fills
all of them with coherent values, and flags override single fields.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class ActorConfig:
    agent: str
    """"dqn" or "dpg"."""
    env: str
    """Environment name, e.g. "gym:CartPole-v1" (see apexrl.envs.env_names())."""
    replay: str
    """Replay server endpoint, tcp://HOST:PORT."""
    params: str
    """The learner's parameter service endpoint, tcp://HOST:PORT."""
    index: int = 0
    """This actor's index i in [0, num_actors): sets ε_i = 0.4^(1 + 7·i/(N−1)) and the seed offset."""
    num_actors: int = 1
    """N, the number of actors in the run."""
    seed: int = 0
    """Base seed; the actor uses seed * 10007 + index for its environment and exploration."""
    agent_config: Any = None
    """The agent's config (DQNConfig / DPGConfig); must match the learner's networks."""
    flush_every: int = 50
    """B: transitions per insert request (the paper's local buffer size)."""
    params_every_frames: int = 400
    """Ask the learner for new weights every this many environment frames."""
    max_steps: int = 0
    """Stop after this many agent steps (0: run until SIGTERM/SIGINT)."""
    replay_timeout: float = 10.0
    """Seconds to wait for one reply from the replay server before retrying."""
    params_timeout: float = 5.0
    """Seconds to wait for one reply from the parameter service."""
    wait_for_params: float = 120.0
    """Seconds to wait for the learner's first weights before acting with the actor's own initial ones."""
    log_every: float = 10.0
    """Seconds between progress lines on stdout."""
    episodes_csv: str | None = None
    """If set, append one row per finished episode (time_s, env_frames, episode, return, length) here."""
    torch_threads: int = 1
    """torch intra-op threads (actors are many small processes: one thread each)."""


@dataclass
class LearnerConfig:
    agent: str
    """"dqn" or "dpg"."""
    env: str
    """Environment name (the learner builds one for its networks' shapes and for evaluation episodes)."""
    replay: str
    """Replay server endpoint, tcp://HOST:PORT."""
    params_port: int = 0
    """TCP port of the parameter service the actors poll (0: pick a free one and print it)."""
    params_bind: str = "127.0.0.1"
    """Address the parameter service binds (0.0.0.0 to serve actors on other machines)."""
    run_dir: str = ""
    """Where metrics.csv and checkpoints go (default: runs/<env>/<agent>/<seed>)."""
    resume: bool = False
    """Continue from <run_dir>/checkpoint.safetensors (networks, optimisers, counters)."""
    seed: int = 0
    """Seed of the networks' initialisation, the evaluation environment and the learner's RNGs."""
    agent_config: Any = None
    """The agent's config (DQNConfig / DPGConfig)."""
    beta: float = 0.4
    """Importance-sampling exponent β."""
    prefetch: int = 16
    """Decoded batches kept ready by the sampler thread."""
    min_replay_size: int = 50_000
    """Wait until the replay holds this many transitions before the first update."""
    remove_to_fit_every: int = 100
    """Ask the replay server to evict down to its capacity every this many learner steps."""
    publish_every: int = 10
    """Publish new weights to the parameter service every this many learner steps."""
    checkpoint_every: int = 5000
    """Write a checkpoint every this many learner steps (and on SIGTERM/SIGINT and at the end)."""
    metrics_every: float = 10.0
    """Seconds between rows of metrics.csv."""
    eval_every: float = 60.0
    """Seconds between starts of an evaluation (greedy / noiseless episodes in a child process); 0: none."""
    eval_episodes: int = 5
    """Episodes per evaluation."""
    max_steps: int = 0
    """Stop after this many learner steps (0: no limit)."""
    max_minutes: float = 0.0
    """Stop after this many minutes of wall time (0: no limit)."""
    device: str = "auto"
    """"cpu", "cuda", "cuda:N" or "auto" (cuda when available)."""
    replay_timeout: float = 10.0
    """Seconds to wait for one reply from the replay server."""
    torch_threads: int = 1
    """torch intra-op threads on CPU."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form values recorded in the checkpoint metadata (e.g. the preset name)."""
