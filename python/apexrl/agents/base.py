"""The agent seam: what the actor and the learner call (``Policy``, ``Agent``), and the registry of agents.

An agent is one module that defines a config class, a learner side, an actor side and the environments it
accepts, and ends with an :class:`AgentDef`; one line in :mod:`apexrl.agents` (or, outside this package, one
``apexrl.agents`` entry point naming the ``AgentDef``) registers it. The actor, the learner, the presets, the
run plan and every command line then know it by name: nothing else lists agents.

The replay never sees an agent: actors encode transitions with the agent's :class:`TransitionSpec` and the
learner decodes them with the same spec, so fields, dtypes and compression are the agent's choice.

Beside its networks and losses an agent declares its replay path (:class:`ReplayPath`, ``AgentDef.replay``):
the tables it needs, what its actors write and how its learner reads. The default is Ape-X's: n-step
transitions of its TransitionSpec into the table ``default`` (or another it declares), sampled by priority. An agent that learns from
sequences (R2D2) declares the ``"sequences"`` reader, an adder that writes them and the function that turns
sampled items into its batch; an on-policy one the ``"queue"`` reader and a queue table. Nothing outside the
agent's module branches on which agent it is: the actor, the learner and the run plan read the declaration.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch

    from apexrl.envs import EnvSpec
    from apexrl.replay.tables import TableConfig
    from apexrl.replay.wire.codec import TransitionSpec

__all__ = [
    "AGENTS",
    "ENTRY_POINT_GROUP",
    "Agent",
    "APEX_TRANSITIONS",
    "AgentDef",
    "Policy",
    "PolicyBatch",
    "READERS",
    "ReplayPath",
    "agent_names",
    "batch_policy",
    "get_agent",
]

ENTRY_POINT_GROUP = "apexrl.agents"
"""Entry points of this group name an :class:`AgentDef` of another distribution (loaded on first lookup)."""


@runtime_checkable
class Policy(Protocol):
    """The actor's side of an agent: acts, scores its own transitions, loads the learner's weights.

    Single-threaded: one actor (or evaluation process) owns it.
    """

    transition_spec: TransitionSpec
    """Fields of the transitions this policy's actor inserts (the learner decodes with the same spec)."""

    @property
    def exploration(self) -> float:
        """How much this actor explores (epsilon, noise sigma, ...): smaller is greedier. Written to episodes.csv;
        ``apexrl plot`` draws the greediest actor's training returns. Read-only (a property or an attribute)."""
        ...

    def act(self, obs: np.ndarray, explore: bool = True) -> Any:
        """The action for one observation; ``explore=False`` is the evaluation action (DQN: epsilon 0.001 as
        in the evaluation protocol; DPG: noiseless)."""
        ...

    # A policy that acts for the K environments of a vectorised actor (``AgentDef.make_batch_policy``) also has
    #   explorations: Sequence[float]      one per environment (written to episodes.csv)
    #   act_batch(obs, explore=True)       obs stacked (K, *obs_shape) -> K actions, one forward pass, each
    #                                      environment with its own exploration
    # An agent without ``make_batch_policy`` gets :class:`PolicyBatch`: K of its policies, one ``act`` each.
    # A batched policy may also score transitions from the values of its acting forward pass (no second pass over
    # every observation at each insert; Ape-X DQN does, see apexrl.agents.dqn):
    #   act_batch_values(obs, explore=True) -> (actions, values)   values: (K, V) float32, one row per observation
    #   values(obs) -> (M, V)                                      for observations never acted on
    #   priorities_from_values(batch, obs_values, next_values)     = initial_priorities(batch) for those weights

    def initial_priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """Priorities (float64, finite, >= 0) of a batch of transitions, computed with the local networks."""
        ...

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights an actor needs, as flat named CPU tensors."""
        ...

    def load_policy_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        """Load the learner's ``policy_state_dict``; ValueError (changing nothing) on names/shapes/dtypes."""
        ...


@runtime_checkable
class Agent(Protocol):
    """The learner's side of an agent: one gradient step per sampled batch, weights for actors, checkpoints.

    Single-threaded: the learner's loop owns it.
    """

    transition_spec: TransitionSpec
    metric_names: tuple[str, ...]
    """Keys of the metrics dict ``update`` returns: fixed columns of metrics.csv."""
    steps: int
    """Updates done (restored from checkpoints)."""

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """One step on a decoded batch with IS weights; returns (new priorities float64, metrics)."""
        ...

    def invalid_items(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
        """Which items of a decoded batch ``update`` must not train on (a bool mask, and a message naming the
        first), or (None, None): the values this agent accepts (action indices, bounds, finiteness; see
        :mod:`apexrl.agents.validity`). The learner erases such items from the replay instead of crashing.
        An agent without this method gets :func:`apexrl.agents.validity.finite` on every field."""
        ...

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """What ``Policy.load_policy_state_dict`` loads."""
        ...

    def policy_modules(self) -> dict[str, torch.nn.Module]:
        """``{prefix: live module}`` of the networks the policy acts with, whose parameters are the
        ``prefix/...`` entries of :meth:`policy_state_dict`: what the learner's ``eval_weights="polyak"`` averages
        in place (:mod:`apexrl.apex.polyak`). The other entries (critics kept for initial priorities, observation
        statistics, versions) are taken as they are."""
        ...

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything a checkpoint needs to resume (networks, optimisers, ``steps``), flat named tensors."""
        ...

    def load_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        """Restore a ``state_dict``; ValueError (changing nothing) on a mismatch."""
        ...


READERS = ("transitions", "sequences", "queue")
"""How a learner reads its table (``ReplayPath.reader``):

- ``"transitions"``: prioritized n-step transitions of the agent's TransitionSpec (Ape-X), through the
  prefetching sampler; new priorities go back after each update.
- ``"sequences"``: prioritized sequence items of a trajectory writer, sampled as ``.fields`` (n, T, ...),
  ``.mask`` (n, T) and ``.extras`` and handed to ``ReplayPath.make_batch``; new priorities go back.
- ``"queue"``: as ``"sequences"``, from a table that hands each item out once (``max_times_sampled=1``, a
  ``Queue`` limiter), in whole batches (the learner samples once the table holds ``batch_size`` items): the
  learner sends no priorities back.
"""


@dataclass(frozen=True)
class ReplayPath:
    """An agent's replay path: the tables it needs, what its actors write, how its learner reads.

    ``ReplayPath()`` is Ape-X's (every feed-forward agent here): the actor's n-step transition adder (scored by
    the policy's ``initial_priorities``, encoded with its TransitionSpec, vectorised over the actor's K
    environments), the table ``default`` built from the preset's replay settings, the prefetching sampler.
    """

    reader: str = "transitions"
    """One of :data:`READERS`."""
    tables: tuple[TableConfig, ...] = ()
    """The tables a run of this agent starts when neither ``--tables`` nor the preset gives any (they must hold
    ``table``); empty: the one table ``default`` of the preset's replay settings."""
    table: str = "default"
    """The table the actors write and the learner reads: the learner waits for its size, samples it, sends it
    priorities and reports its counters; a run pins the agent's TransitionSpec on it (``"transitions"``).
    Another than ``default`` must be among ``tables``, since the preset's replay settings build ``default``
    only."""
    make_adder: Callable[[Any, str, EnvSpec, Any, int], Sequence[Any]] | None = None
    """``(client, table, env_spec, config, num_envs) -> adders``: one adder per environment of an actor
    (:class:`~apexrl.replay.adders.SequenceAdder` or :class:`~apexrl.replay.adders.EpisodeAdder` on ``client``,
    or anything with their ``add_first``, ``add(..., extras=)``, ``reset``, ``flush``, ``close``, ``counters``
    and ``discard``). Each step's ``extras`` are what the policy's ``act_batch_extras(obs, first)`` hands out
    for that environment (None for a policy without it). Required by the ``"sequences"`` and ``"queue"``
    readers; None with ``"transitions"`` (the actor's own n-step adder)."""
    make_batch: Callable[[Mapping[str, Any], np.ndarray, Mapping[str, Any], Any], dict[str, np.ndarray]] | None = None
    """``(fields, mask, extras, config) -> batch``: sampled sequence items (the writer's steps (n, T, ...), the
    mask (n, T), the items' extras) as the batch the agent's ``update`` takes; KeyError/TypeError/ValueError
    for items of another structure (the learner erases them). Required by ``"sequences"`` and ``"queue"``."""
    steps_per_item: Callable[[Any], int] | None = None
    """``(config) -> agent steps one item stands for`` (metrics.csv's ``env_frames``: items received times
    this); None: 1, one transition per agent step."""
    one_server: str | None = None
    """Why the agent runs on one replay server only (``--replay-servers`` > 1 is refused with it); None: any."""
    wait_for_weights: Callable[[Any], bool] | None = None
    """``(config) -> bool``: True makes the actors synchronous (Tonic's on-policy loop): once each of its
    environments has made an item since the last wait, an actor sends what its writers hold and waits for weights
    newer than those it acted with. None or False: actors never wait (the queue's limiter bounds the lag)."""

    def __post_init__(self) -> None:
        if self.reader not in READERS:
            raise ValueError(f"ReplayPath.reader must be one of {', '.join(READERS)}, got {self.reader!r}")
        object.__setattr__(self, "tables", tuple(self.tables))
        if self.reader == "transitions":
            if self.make_adder is not None or self.make_batch is not None:
                raise ValueError(
                    "ReplayPath: the transitions reader uses the actor's n-step adder and the agent's TransitionSpec; "
                    "make_adder and make_batch belong to the sequences and queue readers"
                )
        elif self.make_adder is None or self.make_batch is None:
            raise ValueError(f"ReplayPath: the {self.reader} reader needs make_adder and make_batch")
        if self.table != "default" and not self.tables:
            raise ValueError(
                f"ReplayPath: the table {self.table!r} is not among the tables declared (none): without tables a "
                "run starts only the table 'default' of the preset's replay settings"
            )
        if self.transitions and self.wait_for_weights is not None:
            raise ValueError("ReplayPath: wait_for_weights counts the items of a sequence or queue reader's adders")
        if self.tables and self.table not in [t.name for t in self.tables]:
            raise ValueError(
                f"ReplayPath: the tables ({', '.join(t.name for t in self.tables)}) do not hold the table "
                f"{self.table!r} that the actors write and the learner reads"
            )

    @property
    def transitions(self) -> bool:
        """True when items are n-step transitions of the agent's TransitionSpec (the run pins that spec)."""
        return self.reader == "transitions"

    def synchronous(self, config: Any) -> bool:
        """Whether the actors wait for new weights after each item per environment (``wait_for_weights``)."""
        return self.wait_for_weights is not None and bool(self.wait_for_weights(config))

    def items_to_steps(self, config: Any) -> int:
        """Agent steps one item stands for (see ``steps_per_item``)."""
        return 1 if self.steps_per_item is None else int(self.steps_per_item(config))


APEX_TRANSITIONS = ReplayPath()
"""The default replay path: Ape-X's n-step transitions (:class:`ReplayPath`)."""


@dataclass(frozen=True)
class AgentDef:
    """One registered agent: everything the actor, the learner, the presets and the CLIs need to know."""

    name: str
    """``--agent`` value, a key of :data:`AGENTS`."""
    description: str
    """One line for ``--help``."""
    config_class: type
    """Frozen dataclass of the agent's hyper-parameters; must have ``n_step``, ``gamma`` and ``batch_size``
    (the actor's n-step adder and the learner's sampler read them) and validate itself on construction."""
    check_env: Callable[[EnvSpec], object]  # its return value is ignored
    """Raises ValueError saying why when the agent cannot run on an environment."""
    make_learner: Callable[[EnvSpec, Any, torch.device, int], Agent]
    """``(env_spec, config, device, seed) -> Agent``."""
    make_policy: Callable[[EnvSpec, Any, int, int, int], Policy]
    """``(env_spec, config, index, num_actors, seed) -> Policy`` for actor ``index`` of ``num_actors`` (its
    exploration); the evaluation process asks for actor 0 of 1 and acts with ``explore=False``."""
    make_batch_policy: Callable[[EnvSpec, Any, Sequence[int], int, int], Policy] | None = None
    """Optional ``(env_spec, config, slots, num_slots, seed) -> Policy`` with ``act_batch`` and ``explorations``
    for the environments ``slots`` of the run's ``num_slots`` (actors x environments per actor): one policy and
    one batched forward pass for a vectorised actor. None: :func:`batch_policy` wraps ``make_policy``."""
    replay: ReplayPath = APEX_TRANSITIONS
    """The agent's replay path (:class:`ReplayPath`): the tables it needs, what its actors write, how its
    learner reads. The default: Ape-X's n-step transitions."""
    presets: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """The agent's presets as data, by name: each entry the fields of ``apexrl.launch.presets.Preset`` (``replay``
    may be the keyword arguments of its ``ReplaySettings``, each of ``tables`` those of a ``TableConfig``). They
    join ``apexrl.launch.presets.PRESETS`` after the built-in presets, in the agents' registration order."""
    sources: Mapping[str, str] = field(default_factory=dict)
    """Source keys the agent's presets and ``field_sources`` name, with their citations: they join
    ``apexrl.launch.preset_table.SOURCES`` (a key another agent gives a different citation is an error)."""
    field_sources: Mapping[str, str] = field(default_factory=dict)
    """Where each default of ``config_class`` comes from (source keys), by field: registering the agent sets
    ``apexrl.agents.config.FIELD_SOURCES[config_class]`` to it, which the preset table reads."""

    def __post_init__(self) -> None:
        for preset, entry in self.presets.items():
            if entry.get("agent", self.name) != self.name:
                raise ValueError(
                    f"agent {self.name}: its preset {preset!r} is for agent {entry['agent']!r}; an agent declares "
                    "its own presets only"
                )

    def accepts(self, env_spec: EnvSpec) -> str | None:
        """None when the agent runs on ``env_spec``, else the reason it does not."""
        try:
            self.check_env(env_spec)
        except ValueError as e:
            return str(e)
        return None


class PolicyBatch:
    """The default batched policy for an agent without ``make_batch_policy``: one policy per environment, each
    made for its own exploration slot, each acting on its own observation with ``act`` (no batched forward
    pass). Weights load into every one; priorities come from the first (they share the weights)."""

    def __init__(self, policies: Sequence[Policy]):
        if not policies:
            raise ValueError("PolicyBatch needs at least one policy")
        self.policies = list(policies)
        self.transition_spec = self.policies[0].transition_spec

    @property
    def explorations(self) -> list[float | None]:
        return [getattr(p, "exploration", None) for p in self.policies]

    def act_batch(self, obs: np.ndarray, explore: bool = True) -> list[Any]:
        if len(obs) != len(self.policies):
            raise ValueError(f"{len(obs)} observations for {len(self.policies)} environments")
        return [p.act(o, explore=explore) for p, o in zip(self.policies, obs)]

    def act(self, obs: np.ndarray, explore: bool = True) -> Any:
        return self.policies[0].act(obs, explore=explore)

    def initial_priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        return self.policies[0].initial_priorities(batch)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        return self.policies[0].policy_state_dict()

    def load_policy_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        self.policies[0].load_policy_state_dict(d)  # ValueError here changes nothing anywhere
        for p in self.policies[1:]:
            p.load_policy_state_dict(d)


def batch_policy(
    agent: AgentDef, env_spec: EnvSpec, config: Any, index: int, num_actors: int, k: int, seed: int
) -> Any:
    """The policy of actor ``index`` of ``num_actors`` stepping ``k`` environments: environment ``j`` explores as
    slot ``index * k + j`` of ``num_actors * k`` (so with k = 1 exactly as ``make_policy(index, num_actors)``)."""
    slots = [index * k + j for j in range(k)]
    if agent.make_batch_policy is not None:
        return agent.make_batch_policy(env_spec, config, slots, num_actors * k, seed)
    return PolicyBatch([agent.make_policy(env_spec, config, s, num_actors * k, seed + j) for j, s in enumerate(slots)])


class _Registry(dict):
    """``dict[str, AgentDef]`` that also loads the ``apexrl.agents`` entry points on first lookup."""

    def __init__(self) -> None:
        super().__init__()
        self._plugins_loaded = False
        self._lock = threading.Lock()

    def register(self, agent: AgentDef) -> AgentDef:
        if not isinstance(agent, AgentDef):
            raise TypeError(f"expected an AgentDef, got {type(agent).__name__}")
        known = dict.get(self, agent.name)
        if known is not None and known is not agent:
            raise ValueError(f"agent {agent.name!r} is already registered")
        if known is None and agent.field_sources:
            from apexrl.agents.config import FIELD_SOURCES

            FIELD_SOURCES[agent.config_class] = agent.field_sources
        self[agent.name] = agent
        return agent

    def load_plugins(self) -> None:
        with self._lock:
            if self._plugins_loaded:
                return
            self._plugins_loaded = True
            from importlib.metadata import entry_points

            for ep in entry_points(group=ENTRY_POINT_GROUP):
                agent = ep.load()
                if not isinstance(agent, AgentDef) or agent.name != ep.name:
                    raise TypeError(f"entry point {ep.name} = {ep.value} must name an AgentDef called {ep.name!r}")
                self.register(agent)


AGENTS = _Registry()
"""Every known agent by name; :mod:`apexrl.agents` registers the built-in ones."""


def agent_names() -> list[str]:
    """Names of every registered agent (built-in first, then plugins)."""
    import apexrl.agents  # noqa: F401  (registers the built-in agents)

    AGENTS.load_plugins()
    return list(AGENTS)


def get_agent(name: str) -> AgentDef:
    """The agent called ``name``; ValueError listing the valid names otherwise."""
    names = agent_names()
    if name not in AGENTS:
        raise ValueError(f"unknown agent {name!r}; valid agents: {', '.join(names)}")
    return AGENTS[name]
