"""Typed configuration of the actor and learner processes (the CLIs parse flags into these).

Agent hyperparameters (network sizes, n-step, γ, optimiser) live in the agents' own configs
(:class:`apexrl.agents.DQNConfig`, :class:`apexrl.agents.DPGConfig`); a :mod:`preset <apexrl.launch.presets>` fills
all of them with coherent values, and flags override single fields.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from typing import Any

from apexrl.replay.server.config import STORE_INT_MAX
from apexrl.security import check_exposure, load_client_keys, load_server_keys
from apexrl.validate import Range, check_fields

__all__ = [
    "EPISODE_COLUMNS",
    "MAX_ACTORS",
    "RUN_SEED_MAX",
    "ActorConfig",
    "LearnerConfig",
    "agent_config_from_dict",
    "config_from_dict",
    "config_to_dict",
    "default_run_dir",
]

MAX_ACTORS = 4096
"""Most actors one run addresses (the exploration ladder and the actors' seeds are per index)."""
MAX_ENVS_PER_ACTOR = 1024
"""Most environments one actor steps in lockstep."""
RUN_SEED_MAX = 2**32 - 1
"""A run's seed is 32-bit, so every seed derived from it (actor i: seed * 10007 + i, the store's, the learner's)
fits the 64-bit generators of numpy, torch and the store."""


EPISODE_COLUMNS = ("time_s", "actor", "env_frames", "episode", "return", "length", "exploration", "env")
"""The header of an actor's episodes.csv (``--episodes-csv``); the Ray launcher writes the same one."""


@dataclass
class ActorConfig:
    agent: str
    """A registered agent's name (``apexrl.agents.agent_names()``)."""
    env: str
    """Environment name, e.g. "gym:CartPole-v1" (see apexrl.envs.env_names())."""
    replay: str
    """Replay server endpoint, tcp://HOST:PORT."""
    params: str
    """The learner's parameter service endpoint, tcp://HOST:PORT."""
    index: int = field(default=0, metadata=Range.int(0, MAX_ACTORS - 1))
    """This actor's index i in [0, num_actors): sets ε_i = 0.4^(1 + 7·i/(N−1)) and the seed offset."""
    num_actors: int = field(default=1, metadata=Range.int(1, MAX_ACTORS))
    """N, the number of actors in the run."""
    envs_per_actor: int = field(default=1, metadata=Range.int(1, MAX_ENVS_PER_ACTOR))
    """K, environments this actor steps in lockstep with one batched forward pass; environment j of actor i
    explores as slot i·K + j of the run's N·K (the ε/σ ladder runs over every environment of the run)."""
    seed: int = field(default=0, metadata=Range.int(0, RUN_SEED_MAX))
    """Base seed; the actor uses seed * 10007 + index for its environment and exploration."""
    agent_config: Any = None
    """The agent's config (an instance of its ``config_class``; None: its defaults); must match the learner's."""
    flush_every: int = field(default=50, metadata=Range.int(1, 100_000))
    """B: transitions per environment per insert request (the paper's local buffer size of one actor). An actor
    of K environments, K of the paper's actors, inserts every B agent steps: B·K transitions per request, so that
    a transition waits at most B of its environment's steps before it reaches the replay, whatever K."""
    insert_max: int = field(default=0, metadata=Range.int(0, 1 << 20))  # schema.MAX_BATCH
    """Most transitions in one insert request; 0: a flush's B·K in one. Over it, a flush goes in several requests,
    each with its own insert id (exactly-once each). ``apexrl run`` sets it where the replay's rate limiter could
    never admit a flush of B·K as one request (``--samples-per-insert`` with a small ``--error-buffer``)."""
    inserts_in_flight: int = field(default=1, metadata=Range.int(1, 64))
    """Most insert requests an actor keeps unanswered while it steps on. 1: each insert waits for its reply
    before the actor steps on. More: the actor holds up to this many sent batches (their encoded bytes and insert
    ids) until the server stored them, and resends one with its own insert id after a reconnect or a
    rate-limiter refusal (exactly-once as with 1); it pauses stepping only while that many are held."""
    params_every_frames: int = field(default=400, metadata=Range.int(1))
    """Ask the learner for new weights every this many environment frames."""
    max_steps: int = field(default=0, metadata=Range.int(0))
    """Stop after this many agent steps (0: run until SIGTERM/SIGINT)."""
    replay_timeout: float = field(default=10.0, metadata=Range.float(0.0, lo_open=True))
    """Seconds to wait for one reply from the replay server before retrying."""
    params_timeout: float = field(default=5.0, metadata=Range.float(0.0, lo_open=True))
    """Seconds to wait for one reply from the parameter service."""
    wait_for_params: float = field(default=120.0, metadata=Range.float(0.0))
    """Seconds to wait for the learner's first weights before acting with the actor's own initial ones."""
    log_every: float = field(default=10.0, metadata=Range.float(0.0, lo_open=True))
    """Seconds between progress lines on stdout."""
    episodes_csv: str | None = None
    """If set, append one row per finished episode (time_s, actor, env_frames, episode, return, length,
    exploration: that environment's epsilon or sigma, smaller is greedier; env: the environment's index within
    this actor) here."""
    torch_threads: int = field(default=1, metadata=Range.int(1, 256))
    """torch intra-op threads (actors are many small processes: one thread each)."""
    progress_path: str | None = None
    """If set, append one JSON progress record per ``log_every`` here (the launcher reads them)."""
    curve_dir: str | None = None
    """Key directory of `apexrl keygen`: both connections use CURVE with its client keys (None: plain TCP)."""
    record_dataset: str | None = None
    """If set, record the episodes played as a Minari dataset in ``DIR/actor<index>/`` (apexrl.offline.record)."""

    def __post_init__(self) -> None:
        check_fields(self)
        _check_agent(self)
        if self.curve_dir is not None:
            load_client_keys(self.curve_dir)  # CurveKeyError (a ValueError) naming the missing or unsafe file
        if self.index >= self.num_actors:
            raise ValueError(f"ActorConfig.index {self.index} must be < num_actors {self.num_actors}")


IS_WEIGHT_MODES = ("global_min", "batch_max")
"""Normalisations of the importance-sampling weights (LearnerConfig.is_weights)."""
EVAL_WEIGHTS = ("online", "polyak")
"""Weights the learner's evaluations score (LearnerConfig.eval_weights)."""


@dataclass
class LearnerConfig:
    agent: str
    """A registered agent's name (``apexrl.agents.agent_names()``)."""
    env: str
    """Environment name (the learner builds one for its networks' shapes and for evaluation episodes)."""
    replay: str
    """Replay server endpoint, tcp://HOST:PORT."""
    params_port: int = field(default=0, metadata=Range.int(0, 65535))
    """TCP port of the parameter service the actors poll (0: pick a free one and print it)."""
    params_bind: str = "127.0.0.1"
    """Address the parameter service binds (0.0.0.0 to serve actors on other machines)."""
    run_dir: str = ""
    """Where metrics.csv and checkpoints go (default: runs/<env>/<agent>/<seed>)."""
    resume: bool = False
    """Continue from <run_dir>/checkpoint.safetensors (networks, optimisers, counters)."""
    seed: int = field(default=0, metadata=Range.int(0, RUN_SEED_MAX))
    """Seed of the networks' initialisation, the evaluation environment and the learner's RNGs."""
    agent_config: Any = None
    """The agent's config (an instance of its ``config_class``; None: its defaults)."""
    beta: float = field(default=0.4, metadata=Range.float(0.0))
    """Importance-sampling exponent β."""
    is_weights: str = "global_min"
    """How IS weights (N·P(k))^-β are normalised (the Ape-X paper does not say): ``global_min`` divides by the
    weight of the replay's lowest-probability item, so every weight is <= 1 everywhere in the replay;
    ``batch_max`` divides by the largest weight of the batch, so each batch's largest weight is exactly 1 (as
    most open-source PER code does). global_min gives smaller steps when the replay holds rare, low-priority
    items; batch_max keeps the step size independent of the rest of the replay. The default and its reason:
    docs/running.md, "IS weights"."""
    prefetch: int = field(default=16, metadata=Range.int(1, 1024))
    """Decoded batches kept ready by the sampler thread."""
    decode_threads: int = field(default=1, metadata=Range.int(1, 64))
    """Threads that decode sampled batches (natively, with the GIL released) into the sampler's ring of
    preallocated batches, in page-locked memory when the learner is on a GPU; more threads use more cores for
    image observations."""
    sample_threads: int = field(default=0, metadata=Range.int(0, 16))
    """SAMPLE requests the sampler keeps in flight, each thread on a connection of its own; 0: one per replay
    server (a sharded batch waits for every server's part, so with one request at a time a learner gets one
    batch per slowest round trip)."""
    min_replay_size: int = field(default=50_000, metadata=Range.int(0, STORE_INT_MAX))
    """Wait until the replay holds this many transitions before the first update."""
    remove_to_fit_every: int = field(default=100, metadata=Range.int(1))
    """Ask the replay server to evict down to its capacity every this many learner steps."""
    publish_every: int = field(default=10, metadata=Range.int(1))
    """Publish new weights to the parameter service every this many learner steps."""
    checkpoint_every: int = field(default=5000, metadata=Range.int(1))
    """Write a checkpoint every this many learner steps (and on SIGTERM/SIGINT and at the end)."""
    metrics_every: float = field(default=10.0, metadata=Range.float(0.0, lo_open=True))
    """Seconds between rows of metrics.csv."""
    eval_every: float = field(default=60.0, metadata=Range.float(0.0))
    """Seconds between starts of an evaluation (greedy / noiseless episodes in a child process); 0: none."""
    eval_episodes: int = field(default=5, metadata=Range.int(1))
    """Episodes per evaluation."""
    eval_weights: str = field(default="online", metadata=Range.choice(*EVAL_WEIGHTS))
    """Which weights evaluations score (periodic, best checkpoint, final): ``online``, the weights the actors
    act with; ``polyak``, an exponential moving average of them updated after every learner step with rate
    ``polyak_tau`` (:mod:`apexrl.apex.polyak`), stored in the checkpoints. The actors act with the online
    weights either way."""
    polyak_tau: float = field(default=0.005, metadata=Range.float(0.0, 1.0, lo_open=True))
    """Rate of the ``polyak`` average: ``average += tau * (online - average)`` per learner step, about
    ``1 / tau`` steps remembered. 0.005: the soft-update rate of TD3 and SAC (Fujimoto et al. 2018, Haarnoja et
    al. 2018) for the same exponential form of Polyak-Juditsky averaging."""
    max_steps: int = field(default=0, metadata=Range.int(0))
    """Stop after this many learner steps (0: no limit)."""
    max_minutes: float = field(default=0.0, metadata=Range.float(0.0))
    """Stop after this many minutes of wall time (0: no limit)."""
    device: str = "auto"
    """"cpu", "cuda", "cuda:N" or "auto" (cuda when available)."""
    replay_timeout: float = field(default=10.0, metadata=Range.float(0.0, lo_open=True))
    """Seconds to wait for one reply from the replay server."""
    torch_threads: int = field(default=1, metadata=Range.int(1, 256))
    """torch intra-op threads on CPU."""
    progress_path: str | None = None
    """If set, append one JSON progress record per metrics row here (the launcher reads them)."""
    tensorboard: str | None = None
    """If set, also write each metrics row to a TensorBoard event file in this directory (apexrl.tensorboard;
    needs the ``tensorboard`` extra)."""
    extra: dict[str, Any] = field(default_factory=dict)
    """Free-form JSON values recorded in the checkpoint metadata (e.g. the preset name)."""
    curve_dir: str | None = None
    """Key directory of `apexrl keygen`: CURVE on the parameter service (with the client allow-list) and on the
    replay connections (None: plain TCP)."""
    insecure: bool = False
    """Allow params_bind beyond loopback without curve_dir (apexrl.security.check_exposure)."""

    def __post_init__(self) -> None:
        check_fields(self)
        if self.is_weights not in IS_WEIGHT_MODES:
            raise ValueError(f"is_weights must be one of {', '.join(IS_WEIGHT_MODES)}, got {self.is_weights!r}")
        _check_agent(self)
        check_exposure(self.params_bind, self.curve_dir, self.insecure, "params_bind")
        if self.curve_dir is not None:
            load_server_keys(self.curve_dir)  # CurveKeyError (a ValueError) naming the missing or unsafe file
            load_client_keys(self.curve_dir)


def default_run_dir(env: str, agent: str, seed: int) -> str:
    """Tonic-style ``runs/<env>/<agent>/<seed>`` (":" in env names becomes "-": a portable path)."""
    return os.path.join("runs", env.replace(":", "-").replace("/", "-"), agent, str(seed))


def _check_agent(cfg: Any) -> None:
    """``cfg.agent`` is registered; ``cfg.agent_config`` is its config class (its defaults when None)."""
    from apexrl.agents import get_agent

    agent = get_agent(cfg.agent)
    if cfg.agent_config is None:
        cfg.agent_config = agent.config_class()
    elif not isinstance(cfg.agent_config, agent.config_class):
        raise ValueError(
            f"{type(cfg).__name__}.agent_config must be a {agent.config_class.__name__} for agent "
            f"{agent.name!r}, got {type(cfg.agent_config).__name__}"
        )


def config_to_dict(cfg: Any) -> dict[str, Any]:
    """A plain JSON-able dict of a config dataclass (nested configs as dicts, tuples as lists)."""
    return json.loads(json.dumps(dataclasses.asdict(cfg)))


def _tupled(cls: type, d: dict[str, Any]) -> dict[str, Any]:
    unknown = set(d) - {f.name for f in dataclasses.fields(cls)}
    if unknown:
        raise ValueError(f"{cls.__name__}: unknown field(s) {sorted(unknown)}")
    defaults = cls()
    return {k: tuple(v) if isinstance(getattr(defaults, k), tuple) and isinstance(v, list) else v for k, v in d.items()}


def agent_config_from_dict(config_class: type, d: dict[str, Any]) -> Any:
    """An agent's config from its :func:`config_to_dict` form (lists back to tuples; validated)."""
    return config_class(**_tupled(config_class, d))


def config_from_dict(cls: type, d: dict[str, Any]) -> Any:
    """Inverse of :func:`config_to_dict` for :class:`ActorConfig` and :class:`LearnerConfig` (validated)."""
    from apexrl.agents import get_agent

    d = dict(d)
    agent_config = d.pop("agent_config", None)
    if agent_config is not None:
        config_class = get_agent(d["agent"]).config_class
        agent_config = agent_config_from_dict(config_class, agent_config)
    return cls(**d, agent_config=agent_config)
