"""The agent seam: what the actor and the learner call (``Policy``, ``Agent``), and the registry of agents.

An agent is one module that defines a config class, a learner side, an actor side and the environments it
accepts, and ends with an :class:`AgentDef`; one line in :mod:`apexrl.agents` (or, outside this package, one
``apexrl.agents`` entry point naming the ``AgentDef``) registers it. The actor, the learner, the presets, the
run plan and every command line then know it by name: nothing else lists agents.

The replay never sees an agent: actors encode transitions with the agent's :class:`TransitionSpec` and the
learner decodes them with the same spec, so fields, dtypes and compression are the agent's choice.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

import numpy as np

if TYPE_CHECKING:
    import torch

    from apexrl.envs import EnvSpec
    from apexrl.replay.wire.codec import TransitionSpec

__all__ = [
    "AGENTS",
    "ENTRY_POINT_GROUP",
    "Agent",
    "AgentDef",
    "Policy",
    "PolicyBatch",
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

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Everything a checkpoint needs to resume (networks, optimisers, ``steps``), flat named tensors."""
        ...

    def load_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        """Restore a ``state_dict``; ValueError (changing nothing) on a mismatch."""
        ...


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
    recurrent: bool = False
    """True for an agent that learns from sequences (R2D2): its actors carry the policy's recurrent state and
    write overlapping sequences with a :class:`~apexrl.replay.adders.SequenceAdder` (extras: the state at each
    item's first step), its learner samples them as ``.fields``/``.mask``/``.extras`` and its runs pin no
    TransitionSpec (:mod:`apexrl.apex.recurrent`). False: one n-step transition per item, as Ape-X."""

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
