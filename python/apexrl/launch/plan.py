"""The typed run plan: every process of an Ape-X run and its settings, validated once, before anything starts.

``plan(preset, overrides)`` resolves the agent, the environment and the preset, fills one
:class:`~apexrl.replay.server.config.ServerConfig`, one :class:`~apexrl.apex.config.LearnerConfig` and N
:class:`~apexrl.apex.config.ActorConfig` (each config class checks its own value ranges, which are the native
store's where they reach it), then checks the rules *between* processes:

* the table ``default``'s min size to sample follows the learner's ``min_replay_size`` (so a restarted, empty server
  makes the learner wait again instead of training on a handful of transitions);
* ``min_replay_size <= capacity`` (else the learner's first eviction would empty the replay below the size
  the server lets it sample at, and the run would stall);
* with a rate limiter, a learner batch n and an actor insert m must satisfy ``n + m * spi <= 2 * error_buffer``
  (when neither side may move the run deadlocks; the server's documentation derives the bound);
* every replay server is given the run's TransitionSpec (:func:`run_spec`), so no client can declare another
  one first (the server refuses any other spec, and every insert that does not fit it);
* CURVE is on for every process or for none (one key directory, ``Overrides.curve_dir``: a server with keys
  refuses plain clients, a client with keys cannot reach a plain server); the actors use their own actor key
  ``DIR/actors/run`` when it exists (:func:`actor_curve_dir`; ``apexrl run`` issues it), the learner's else.

Several replay servers (``Overrides.replay_servers``, ``apexrl run --replay-servers K``): one ServerConfig per
server, equal but for what :func:`split_server` divides -- the capacity (and ``max_size``) and the minimum size
to sample split evenly, one snapshot file and one seed each. The learner and the actors reach them all through a
:class:`~apexrl.replay.client.sharded.ShardedReplayClient` (their ``replay`` is the servers' endpoints joined by
commas), which samples globally proportionally across them; rate limiting stays per server.

Durability by default: the server snapshots its store to ``RUN_DIR/replay.snap`` every ``snapshot_every``
seconds (``DEFAULT_SNAPSHOT_EVERY``; 0 turns it off) and on a clean stop, and a restarted server restores it,
so a server crash loses at most one interval of experience. ``--server-args '--snapshot PATH'`` moves it.

A plan says *what* runs, not *where*: endpoints are empty until a launcher places the processes
(:meth:`RunPlan.placed`). The local launcher and a cluster launcher consume the same plan; it round-trips
through JSON (``RUN_DIR/plan.json``) so each child process reads its own config from it.
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from apexrl.agents.config import ACTOR_LOSS_STATES, ACTOR_WEIGHTS, SIGMA_SPACINGS
from apexrl.apex.config import (
    ActorConfig,
    LearnerConfig,
    config_from_dict,
    config_to_dict,
    default_run_dir,
)
from apexrl.durable import write_atomically
from apexrl.launch.presets import Preset, default_preset_for, get_preset
from apexrl.replay.client.sharded import max_lock_shards
from apexrl.replay.server.config import (
    MAX_REPLAY_SERVERS,
    ServerConfig,
    server_config_from_dict,
    server_config_to_dict,
)
from apexrl.replay.server.rate_limiter import deadlock_reason
from apexrl.replay.server.table_flags import TABLE_FLAGS, table_from_flags
from apexrl.replay.tables import DEFAULT_TABLE, MinSize, Queue, SampleToInsertRatio, TableConfig
from apexrl.replay.wire.schema import MAX_BATCH
from apexrl.validate import Range, check_fields

__all__ = [
    "AgentOverrides",
    "DEFAULT_SNAPSHOT_EVERY",
    "MAX_REPLAY_SERVERS",
    "PLAN_NAME",
    "RUN_ACTOR_KEY",
    "SNAPSHOT_NAME",
    "Overrides",
    "RunPlan",
    "RunSettings",
    "actor_curve_dir",
    "default_run_dir",
    "plan",
    "ratio_limiter",
    "resolve_preset",
    "run_spec",
    "run_table",
    "run_tables",
    "server_config_from_plan",
    "snapshot_name",
    "split_server",
    "split_table",
]

PLAN_NAME = "plan.json"
SNAPSHOT_NAME = "replay.snap"
DEFAULT_SNAPSHOT_EVERY = 300.0
"""Seconds between the replay server's snapshots in a run (``apexrl run --snapshot-every``)."""


@dataclass(frozen=True)
class AgentOverrides:
    """The agent settings a run's command line may override (actors and learner always get the same values);
    None: the preset's. Each sets the same-named field of the agent's config class (DQNConfig, D4PGConfig, ...),
    whose defaults differ by agent; the ranges here are what the command lines accept, and the agent's config
    refuses a field it has not."""

    n_step: int | None = field(default=None, metadata=Range.int(1, 100, optional=True))
    gamma: float | None = field(default=None, metadata=Range.float(0.0, 1.0, optional=True))
    batch_size: int | None = field(default=None, metadata=Range.int(1, 1 << 16, optional=True))
    target_update_period: int | None = field(default=None, metadata=Range.int(1, optional=True))
    lr: float | None = field(default=None, metadata=Range.float(0.0, lo_open=True, optional=True))
    """The one learning rate of the agents that have one (DQN, R2D2, IMPALA); the others refuse it."""
    dqda_clip: float | str | None = None
    """A threshold > 0, or ``none`` (:data:`apexrl.launch.presets.OFF`): off."""
    dqda_clip_norm: float | str | None = None
    grad_clip_norm: float | str | None = None
    actor_loss_state: str | None = field(default=None, metadata=Range.choice(*ACTOR_LOSS_STATES))
    actor_weights: str | None = field(default=None, metadata=Range.choice(*ACTOR_WEIGHTS))
    noise_sigma_max: float | None = field(default=None, metadata=Range.float(0.0, lo_open=True, optional=True))
    noise_sigma_min: float | None = field(default=None, metadata=Range.float(0.0, lo_open=True, optional=True))
    noise_sigma_spacing: str | None = field(default=None, metadata=Range.choice(*SIGMA_SPACINGS))
    obs_norm: bool | None = None
    vtrace: bool | None = None


AGENT_FIELDS = tuple(f.name for f in dataclasses.fields(AgentOverrides))
"""Agent settings a run's command line may override."""


@dataclass(frozen=True)
class RunSettings:
    """The launcher's own settings."""

    run_dir: str
    minutes: float = field(default=0.0, metadata=Range.float(0.0))
    """Stop after this many minutes of wall time (0: no limit)."""
    steps: int = field(default=0, metadata=Range.int(0))
    """Stop once the learner has done this many steps (0: no limit)."""
    resume: bool = False
    """Start the learner from the run directory's checkpoint."""
    progress_every: float = field(default=5.0, metadata=Range.float(0.0, lo_open=True))
    """Seconds between progress lines (and between the actors' progress records)."""
    quiet: bool = False
    max_restarts_per_minute: int = field(default=5, metadata=Range.int(0))
    """Exits of one process within 60 s beyond which the run is given up."""
    port_base: int = field(default=0, metadata=Range.int(0, 65535))
    """The services' TCP ports: the replay servers' from here, then the learner's parameter service (for a
    firewall); 0: free ports picked at start."""
    final_eval_episodes: int = field(default=0, metadata=Range.int(0, 100_000))
    """Evaluation episodes of the final checkpoint once the run reached its --minutes/--steps
    (``apexrl evaluate``, written to RUN_DIR/final_eval.json); 0: none."""
    offline: str | None = None
    """``apexrl run --offline DATASET``: no actors; a loader child fills the replay from this Minari dataset
    (apexrl.cli.loader)."""

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass
class Overrides:
    """What a user changes relative to a preset (``apexrl run`` flags); None or empty: the preset's."""

    agent: str | None = None
    env: str | None = None
    seed: int = 0
    agent_fields: dict[str, Any] = field(default_factory=dict)
    """Fields of the agent's config class (``n_step``, ``gamma``, ...)."""
    agent_settings: dict[str, Any] = field(default_factory=dict)
    """Any other field of the agent's config class (``apexrl run --agent-set NAME=VALUE``): every process of the
    run gets it through the plan."""
    server: dict[str, Any] = field(default_factory=dict)
    """Fields of ServerConfig and of TableFlags (``--server-args``; the table flags build the table ``default``
    when the run has no tables)."""
    learner: dict[str, Any] = field(default_factory=dict)
    """Fields of LearnerConfig."""
    actor: dict[str, Any] = field(default_factory=dict)
    """Fields of ActorConfig (every actor)."""
    actors: int | None = field(default=None, metadata=Range.int(1, 256))
    minutes: float | None = None
    steps: int = 0
    final_eval: int | None = None
    """Episodes of the final evaluation (None: the preset's)."""
    run_dir: str | None = None
    resume: bool = False
    progress_every: float = 5.0
    quiet: bool = False
    max_restarts_per_minute: int = 5
    snapshot_every: float = field(default=DEFAULT_SNAPSHOT_EVERY, metadata=Range.float(0.0))
    """Seconds between replay snapshots in the run directory; 0: no snapshots."""
    curve_dir: str | None = None
    """Key directory of `apexrl keygen`: CURVE on both services for every process (None: plain TCP)."""
    insecure: bool = False
    """Let the server and the parameter service bind beyond loopback without keys."""
    replay_servers: int = field(default=1, metadata=Range.int(1, MAX_REPLAY_SERVERS))
    """Replay servers sharing the replay (capacity split evenly; one learner samples across them)."""
    port_base: int = 0
    """First of the services' fixed ports (RunSettings.port_base); 0: free ports."""
    offline: str | None = None
    """A Minari dataset (path or local id) to train from with no actors (RunSettings.offline)."""
    tables: list[TableConfig] | None = None
    """The replay servers' tables (``apexrl run --tables FILE``); None: the preset's, else the one table
    ``default`` of the preset's replay settings and the table flags."""


def snapshot_name(index: int, count: int) -> str:
    """The snapshot file of replay server ``index`` of ``count`` in a run directory (``replay.snap`` for one)."""
    return SNAPSHOT_NAME if count == 1 else f"replay{index}.snap"


def split_server(config: ServerConfig, index: int, count: int) -> ServerConfig:
    """Server ``index``'s share of ``config`` among ``count`` servers: each table split (:func:`split_table`),
    its own seed and snapshot file (next to the one ``config`` names)."""
    if count == 1:
        return config
    changes: dict[str, Any] = {"seed": config.seed * count + index}
    changes["tables"] = [split_table(t, count) for t in config.tables]
    if config.snapshot is not None:
        changes["snapshot"] = os.path.join(os.path.dirname(os.fspath(config.snapshot)), snapshot_name(index, count))
    return dataclasses.replace(config, **changes)


def split_table(table: TableConfig, count: int) -> TableConfig:
    """One server's share of ``table`` among ``count``: capacity, max_size and the rate limiter's sizes (min
    size, queue size) divided evenly, rounded up; samples_per_insert and error_buffer stay (per server)."""
    share = lambda v: -(-v // count)  # noqa: E731 - ceil division
    limiter = table.rate_limiter
    if isinstance(limiter, MinSize):
        limiter = MinSize(share(limiter.min_size))
    elif isinstance(limiter, SampleToInsertRatio):
        limiter = dataclasses.replace(limiter, min_size_to_sample=share(limiter.min_size_to_sample))
    elif isinstance(limiter, Queue):
        limiter = Queue(share(limiter.size))
    return dataclasses.replace(
        table,
        capacity=share(table.capacity),
        max_size=None if table.max_size is None else share(table.max_size),
        rate_limiter=limiter,
    )


def run_table(server: ServerConfig, name: str = DEFAULT_TABLE) -> TableConfig:
    """The table ``name`` of ``server``: the one the run's learner and actors use (the agent's
    ``ReplayPath.table``, :attr:`RunPlan.table`; a run's tables hold it)."""
    table = server.table(name)
    if table is None:
        raise ValueError(f"the replay server has no table {name!r}")
    return table


def ratio_limiter(server: ServerConfig, name: str = DEFAULT_TABLE) -> SampleToInsertRatio | None:
    """The samples-per-insert limiter of the run's table ``name``, or None."""
    limiter = run_table(server, name).rate_limiter
    return limiter if isinstance(limiter, SampleToInsertRatio) else None


def run_tables(
    tables: Sequence[TableConfig],
    server: dict[str, Any],
    min_replay_size: int,
    spec: str | None,
    offline: bool,
    table: str = DEFAULT_TABLE,
) -> list[TableConfig]:
    """A run's tables (``--tables`` or the preset's) made to fit the run, as its one table ``default`` would be:
    the table ``table`` (the learner's and actors', the agent's ``ReplayPath.table``) gets the run's spec and,
    without a rate limiter of its own, a min size that follows the learner's ``min_replay_size``. ValueError
    when the tables do not hold ``table``, when its spec is another one, or when ``--server-args`` sets a
    table flag beside them."""
    from apexrl.replay.server.insert_guard import load_spec

    clash = [flag for name, flag in TABLE_FLAGS.items() if name in server]
    if clash:
        raise ValueError(
            f"--server-args {', '.join(clash)}: the run's tables (--tables or the preset's) set every table; "
            "give those settings in the tables"
        )
    names = [t.name for t in tables]
    if table not in names:
        raise ValueError(
            f"the run's learner and actors use the table {table!r}; the run's tables ({', '.join(names)}) have none"
        )
    out = []
    for t in tables:
        if t.name == table:
            run_spec_ = load_spec(spec) if spec is not None else None  # None: an agent's sequence items
            if t.spec is not None and t.spec != run_spec_:
                raise ValueError(
                    f"table {table!r}: its spec is not the spec of the run ({spec}): the run's actors would "
                    "insert nothing the server accepts; leave its spec out (the run pins its own)"
                )
            limiter = t.rate_limiter
            if limiter is None and min_replay_size > 1:
                limiter = MinSize(min_replay_size)
            if offline and isinstance(limiter, SampleToInsertRatio):
                raise ValueError(
                    f"--offline runs no actors: the sample_to_insert_ratio rate limiter of table {table!r} "
                    "would stop the learner once the dataset is loaded; leave it out"
                )
            t = dataclasses.replace(t, spec=run_spec_, rate_limiter=limiter)
        out.append(t)
    return out


@dataclass
class RunPlan:
    """K replay servers (usually one), one learner and N actors, with every setting; see the module
    docstring."""

    preset: str
    servers: list[ServerConfig]
    learner: LearnerConfig
    actors: list[ActorConfig]
    run: RunSettings

    @property
    def server(self) -> ServerConfig:
        """The first replay server's config (all servers share every setting :func:`split_server` does not
        divide)."""
        return self.servers[0]

    @property
    def agent(self) -> str:
        return self.learner.agent

    @property
    def env(self) -> str:
        return self.learner.env

    @property
    def seed(self) -> int:
        return self.learner.seed

    @property
    def table(self) -> str:
        """The table the run's actors write and its learner reads: the agent's ``ReplayPath.table``."""
        from apexrl.agents import get_agent

        return get_agent(self.agent).replay.table

    def placed(
        self,
        *,
        replay: str | Sequence[str],
        server_port: int | Sequence[int],
        params: str,
        params_port: int,
        logs: str | None = None,
    ) -> RunPlan:
        """This plan with the endpoints of one placement filled in: ``replay`` and ``server_port`` give one
        endpoint and port per replay server (a single one as a plain value), and with ``logs`` each child's
        progress records go to ``logs/NAME.progress.jsonl``. The addresses the servers and the parameter service
        bind stay the plan's (127.0.0.1 unless set)."""
        endpoints = [replay] if isinstance(replay, str) else list(replay)
        ports = [server_port] if isinstance(server_port, int) else list(server_port)
        if not len(endpoints) == len(ports) == len(self.servers):
            raise ValueError(
                f"{len(self.servers)} replay servers need as many endpoints and ports, got "
                f"{len(endpoints)} and {len(ports)}"
            )
        replay = ",".join(endpoints)
        progress = (lambda name: os.path.join(logs, f"{name}.progress.jsonl")) if logs else (lambda name: None)
        return dataclasses.replace(
            self,
            servers=[dataclasses.replace(s, port=port) for s, port in zip(self.servers, ports)],
            learner=dataclasses.replace(
                self.learner, replay=replay, params_port=params_port, progress_path=progress("learner")
            ),
            actors=[
                dataclasses.replace(a, replay=replay, params=params, progress_path=progress(f"actor{a.index}"))
                for a in self.actors
            ],
        )

    def to_json(self) -> str:
        return json.dumps(
            {
                "format": 2,
                "preset": self.preset,
                "servers": [server_config_to_dict(s) for s in self.servers],
                "learner": config_to_dict(self.learner),
                "actors": [config_to_dict(a) for a in self.actors],
                "run": config_to_dict(self.run),
            },
            indent=1,
        )

    @classmethod
    def from_json(cls, text: str) -> RunPlan:
        """The plan ``to_json`` wrote; ValueError when it is not one (every config is validated again)."""
        try:
            d = json.loads(text)
            if d.get("format") not in (1, 2):
                raise ValueError(f"unknown plan format {d.get('format')!r}")
            return cls(
                preset=d["preset"],
                servers=_servers(d),
                learner=config_from_dict(LearnerConfig, d["learner"]),
                actors=[config_from_dict(ActorConfig, a) for a in d["actors"]],
                run=RunSettings(**d["run"]),
            )
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a run plan: {type(e).__name__}: {e}") from None

    def save(self, path: str) -> None:
        write_atomically(path, self.to_json())

    @classmethod
    def load(cls, path: str) -> RunPlan:
        with open(path, encoding="utf-8") as f:
            return cls.from_json(f.read())


def _servers(d: dict[str, Any]) -> list[ServerConfig]:
    """The server configs of a plan's JSON (format 1 had one, as "server")."""
    servers = (
        [server_config_from_dict(s) for s in d["servers"]]
        if d["format"] == 2
        else [server_config_from_dict(d["server"])]
    )
    if not servers:
        raise ValueError("not a run plan: no replay server")
    return servers


def server_config_from_plan(path: str, index: int = 0) -> ServerConfig:
    """Replay server ``index``'s config in a plan file, read without the agents (so without torch)."""
    with open(path, encoding="utf-8") as f:
        try:
            servers = _servers(json.load(f))
        except (KeyError, TypeError, AttributeError, json.JSONDecodeError) as e:
            raise ValueError(f"not a run plan: {type(e).__name__}: {e}") from None
    if not 0 <= index < len(servers):
        raise ValueError(f"the plan has {len(servers)} replay server(s); there is no server {index}")
    return servers[index]


def resolve_preset(preset: Preset | str | None, o: Overrides) -> tuple[Preset, str, str]:
    """(preset, agent, env): a named preset fills what the overrides leave open; with none, the agent comes
    from the environment's action space (the first registered agent that accepts it) and the preset from the
    agent and the environment's family."""
    from apexrl.agents import AGENTS, agent_names, get_agent
    from apexrl.envs import env_spec

    if isinstance(preset, str):
        preset = get_preset(preset)
    if preset is None:
        if o.env is None:
            if o.agent is None:
                preset = get_preset("cartpole")
            else:
                preset = default_preset_for(o.agent, get_preset("cartpole").env)
                if preset.name.endswith("-defaults"):
                    raise ValueError(f"agent {o.agent!r} has no preset: give --env too")
        else:
            agent = o.agent
            if agent is None:
                spec = env_spec(o.env)
                accepting = [name for name in agent_names() if AGENTS[name].accepts(spec) is None]
                if not accepting:
                    raise ValueError(f"no agent accepts {o.env}")
                agent = accepting[0]
            preset = default_preset_for(agent, o.env)
    agent, env = o.agent or preset.agent, o.env or preset.env
    if agent != preset.agent:
        raise ValueError(f"agent {agent} does not match preset {preset.name!r} (agent {preset.agent})")
    reason = get_agent(agent).accepts(env_spec(env))
    if reason is not None:
        raise ValueError(f"agent {agent} cannot run on {env}: {reason}")
    return preset, agent, env


def plan(preset: Preset | str | None = None, overrides: Overrides | None = None) -> RunPlan:
    """The validated plan of a run; ValueError naming the first setting (or rule) that does not hold."""
    o = overrides or Overrides()
    preset, agent, env = resolve_preset(preset, o)
    unknown = set(o.agent_fields) - set(AGENT_FIELDS)
    if unknown:
        raise ValueError(f"agent fields {sorted(unknown)} cannot be overridden; these can: {list(AGENT_FIELDS)}")
    flagged = sorted(set(o.agent_settings) & set(AGENT_FIELDS))
    if flagged:
        raise ValueError(
            f"--agent-set {flagged[0]}=...: {flagged[0]} has its own flag, --{flagged[0].replace('_', '-')}; give it there"
        )
    agent_config = preset.agent_config(**o.agent_settings, **o.agent_fields)
    curve_dir = None if o.curve_dir is None else os.path.abspath(o.curve_dir)  # children may run elsewhere
    run = RunSettings(
        run_dir=o.run_dir or default_run_dir(env, agent, o.seed),
        minutes=preset.minutes if o.minutes is None else o.minutes,
        steps=o.steps,
        resume=o.resume,
        progress_every=o.progress_every,
        quiet=o.quiet,
        max_restarts_per_minute=o.max_restarts_per_minute,
        port_base=o.port_base,
        final_eval_episodes=preset.final_eval_episodes if o.final_eval is None else o.final_eval,
        offline=o.offline if o.offline is None or not os.path.exists(o.offline) else os.path.abspath(o.offline),
    )
    if o.port_base and o.port_base + o.replay_servers > 65535:
        raise ValueError(
            f"--ports {o.port_base} leaves no room for {o.replay_servers} replay server port(s) and the "
            "learner's parameter port below 65536"
        )
    learner = LearnerConfig(
        **{
            **preset.learner,
            **o.learner,
            "agent": agent,
            "env": env,
            "replay": "",
            "seed": o.seed,
            "agent_config": agent_config,
            "run_dir": run.run_dir,
            "resume": run.resume,
            "max_steps": run.steps,
            "extra": {"preset": preset.name},
            "curve_dir": curve_dir,
            "insecure": o.insecure,
        }
    )
    if o.snapshot_every < 0:
        raise ValueError(f"snapshot_every must be >= 0 (0: no snapshots), got {o.snapshot_every}")
    durable = (
        {"snapshot": os.path.join(run.run_dir, SNAPSHOT_NAME), "snapshot_every": o.snapshot_every}
        if o.snapshot_every > 0
        else {}
    )
    if not 1 <= o.replay_servers <= MAX_REPLAY_SERVERS:
        raise ValueError(f"replay_servers must be in 1..{MAX_REPLAY_SERVERS}, got {o.replay_servers}")
    from apexrl.agents import get_agent

    spec = run_spec(agent, env, agent_config, o.seed)
    path = get_agent(agent).replay
    if o.replay_servers > 1 and path.one_server is not None:
        raise ValueError(f"--replay-servers {o.replay_servers}: {path.one_server}; leave it out")
    if o.offline is not None and not path.transitions:
        # An offline dataset holds transitions; this agent's learner reads its own items.
        raise ValueError(f"--offline: {agent} reads {path.reader} its actors write, not a dataset's transitions")
    if spec is None and o.server.get("spec") is not None:
        raise ValueError(f"--spec: {agent} inserts sequences of steps, not items of a TransitionSpec; leave --spec out")
    if spec is not None and o.server.get("spec") is not None:
        from apexrl.replay.server.insert_guard import load_spec

        if load_spec(o.server["spec"]) != load_spec(spec):
            raise ValueError(
                f"--spec {o.server['spec']!r} is not the spec of {agent} on {env} ({spec}): the run's "
                "actors would insert nothing the server accepts; leave --spec out (the run pins its own)"
            )
    offline = {}
    if o.offline is not None:  # no actors insert: a rate limiter would stop the learner once the data is in
        if o.server.get("samples_per_insert") is not None:
            raise ValueError(
                "--offline runs no actors: --samples-per-insert would stop the learner once the "
                "dataset is loaded; leave it out"
            )
        offline = {"samples_per_insert": None}
    # The tables: --tables, else the preset's, else those the agent declares, else the preset's replay settings.
    tables = o.tables if o.tables is not None else preset.tables
    if tables is None and path.tables:
        tables = path.tables
    server_wide = {k: v for k, v in o.server.items() if k not in TABLE_FLAGS}
    if tables is None:  # the table default of the preset's replay settings and the table flags of --server-args
        flags = {
            **dataclasses.asdict(preset.replay),
            "min_size_to_sample": learner.min_replay_size,
            **{k: v for k, v in o.server.items() if k in TABLE_FLAGS},
            **offline,
            "spec": spec,
        }
        tables = [table_from_flags(flags)]
    else:  # the tables replace the preset's replay settings and every table flag
        tables = run_tables(tables, o.server, learner.min_replay_size, spec, o.offline is not None, path.table)
    server = ServerConfig(
        **{
            "seed": o.seed,
            **durable,
            **server_wide,
            "tables": list(tables),
            "curve_dir": curve_dir,
            "insecure": o.insecure,
        }
    )
    servers = [split_server(server, i, o.replay_servers) for i in range(o.replay_servers)]
    num_actors = 0 if o.offline is not None else o.actors or preset.actors
    actors = [
        ActorConfig(
            **{
                **preset.actor,
                "log_every": run.progress_every,
                **o.actor,
                "agent": agent,
                "env": env,
                "replay": "",
                "params": "",
                "index": i,
                "num_actors": num_actors,
                "seed": o.seed,
                "agent_config": agent_config,
                "episodes_csv": os.path.join(run.run_dir, "episodes.csv"),
                "curve_dir": actor_curve_dir(curve_dir),
            }
        )
        for i in range(num_actors)
    ]
    fit_inserts_to_limiter(server, learner.agent_config.batch_size, actors, path.table)
    p = RunPlan(preset=preset.name, servers=servers, learner=learner, actors=actors, run=run)
    check_rules(p)
    return p


RUN_ACTOR_KEY = "run"
"""Name of the actor key ``apexrl run`` gives its actors (``DIR/actors/run``, User-Id ``actor:run``)."""


def actor_curve_dir(curve_dir: str | None) -> str | None:
    """The key directory of a run's actors: ``DIR/actors/run`` when it exists (an actor key, role ``actor``: it
    may insert, not sample, update, evict or erase), else ``DIR`` itself (the learner's key, every right)."""
    if curve_dir is None:
        return None
    node = os.path.join(curve_dir, "actors", RUN_ACTOR_KEY)
    return node if os.path.isdir(node) else curve_dir


def run_spec(agent: str, env: str, agent_config: Any, seed: int = 0) -> str | None:
    """The TransitionSpec JSON of the items the run's actors insert (actor 0's policy says it: the agent and the
    environment define it). The plan pins it on every replay server (the spec of its table ``default``, the server's
    ``--spec``), so no client can declare another spec first. None for an agent whose replay path writes
    sequences (R2D2): their structure the table pins at their first insert."""
    from apexrl.agents import get_agent
    from apexrl.envs import env_spec
    from apexrl.replay.wire.frames import wire_spec

    if not get_agent(agent).replay.transitions:
        return None  # sequence items of a trajectory writer: their structure is pinned by the table's first insert
    spec = get_agent(agent).make_policy(env_spec(env), agent_config, 0, 1, seed).transition_spec
    return wire_spec(spec).to_json()  # the items the replay holds: Atari's reference frame chunks


def request_size(a: ActorConfig) -> int:
    """The most transitions one insert request of actor ``a`` carries: its flush, B per environment (B·K), or
    ``insert_max`` where that is smaller."""
    return min(a.flush_every * a.envs_per_actor, a.insert_max or a.flush_every * a.envs_per_actor)


def fit_inserts_to_limiter(
    server: ServerConfig, batch: int, actors: list[ActorConfig], table: str = DEFAULT_TABLE
) -> None:
    """Where the rate limiter could never admit a flush of B·K transitions as one request beside a learner batch
    (``deadlock_reason``) but could admit B, cap the actors' requests (``insert_max``) at the largest size it can:
    a vectorised actor's flush then goes in several requests. An actor whose B alone is too large is left as is,
    for :func:`check_rules` to refuse with the arithmetic."""
    limiter = ratio_limiter(server, table)
    if limiter is None:
        return
    eb, spi = limiter.error_buffer, limiter.samples_per_insert
    largest = int((2 * eb - batch) / spi)  # m with batch + m * spi <= 2 * eb
    while largest > 0 and deadlock_reason(batch, largest, spi, eb) is not None:  # float edge
        largest -= 1
    for a in actors:
        if a.flush_every <= largest < request_size(a):
            a.insert_max = min(largest, MAX_BATCH)


def check_rules(p: RunPlan) -> None:
    """The rules between the processes' settings (module docstring); ValueError with the arithmetic."""
    s, batch = p.server, p.learner.agent_config.batch_size
    dirs = {"server": s.curve_dir, "learner": p.learner.curve_dir, **{f"actor{a.index}": a.curve_dir for a in p.actors}}
    actor_dir = actor_curve_dir(s.curve_dir)
    if {s.curve_dir, p.learner.curve_dir} != {s.curve_dir} or any(
        a.curve_dir not in (s.curve_dir, actor_dir) for a in p.actors
    ):
        raise ValueError(
            f"every process of a run uses the same CURVE keys (the actors: their own actor key in "
            f"DIR/actors/{RUN_ACTOR_KEY} when there is one) or none; got curve_dir {dirs}"
        )
    table = p.table
    capacity = sum(run_table(server, table).capacity for server in p.servers)
    if p.learner.min_replay_size > capacity:
        raise ValueError(
            f"the learner's min_replay_size {p.learner.min_replay_size} exceeds the replay capacity "
            f"{capacity}: after its first eviction the learner could never sample again"
        )
    if len(p.servers) > 1:
        most = max_lock_shards(len(p.servers))
        if s.shards > most:
            raise ValueError(
                f"{len(p.servers)} replay servers allow at most {most} lock shards each (--shards), "
                f"got {s.shards}: a key carries its server and lock shard in 8 bits"
            )
    limiter = ratio_limiter(s, table)
    if limiter is not None:
        eb, spi = limiter.error_buffer, limiter.samples_per_insert
        insert = max(request_size(a) for a in p.actors)
        reason = deadlock_reason(
            batch, insert, spi, eb, sample="a learner batch", insert="an actor insert", flag="--error-buffer"
        )
        if reason is not None:
            raise ValueError(reason)
