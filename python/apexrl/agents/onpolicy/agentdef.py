"""The :class:`~apexrl.agents.base.AgentDef` of an on-policy agent from its name, config class and learner class:
vector observations, discrete or continuous actions, :class:`OnPolicyPolicy` on the actors, the queue path of
:mod:`apexrl.agents.onpolicy.replay`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from apexrl.agents.base import AgentDef
from apexrl.agents.onpolicy.config import ONPOLICY_SOURCES
from apexrl.agents.onpolicy.policy import OnPolicyPolicy, check_vector_env
from apexrl.agents.onpolicy.replay import REPLAY

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["onpolicy_agent"]


def onpolicy_agent(
    name: str,
    description: str,
    config_class: type,
    learner_class: type,
    params: bool = False,
    presets: Mapping[str, Mapping[str, Any]] | None = None,
    field_sources: Mapping[str, str] | None = None,
) -> AgentDef:
    """``params``: the actors store the behaviour distribution's parameters per step (its loss needs them).
    ``presets`` and ``field_sources``: the agent's (:class:`AgentDef`); the source keys are the on-policy ones,
    :data:`~apexrl.agents.onpolicy.config.ONPOLICY_SOURCES`."""

    def check_env(spec: EnvSpec) -> None:
        check_vector_env(name, spec)

    # Return types Any: no TransitionSpec (items are sequences), as R2D2's.
    def make_learner(spec: EnvSpec, config: Any, device: Any, seed: int) -> Any:
        return learner_class(spec, config, device, seed)

    def make_policy(spec: EnvSpec, config: Any, index: int, num_actors: int, seed: int) -> Any:
        return OnPolicyPolicy(spec, config, 1, seed, params=params)

    def make_batch_policy(spec: EnvSpec, config: Any, slots: Sequence[int], num_slots: int, seed: int) -> Any:
        return OnPolicyPolicy(spec, config, len(slots), seed, params=params)

    return AgentDef(
        name=name,
        description=description,
        config_class=config_class,
        check_env=check_env,
        make_learner=make_learner,
        make_policy=make_policy,
        make_batch_policy=make_batch_policy,
        replay=REPLAY,
        presets=presets or {},
        sources=ONPOLICY_SOURCES,
        field_sources=field_sources or {},
    )
