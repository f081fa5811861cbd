"""``--agent mpo`` and ``--agent dmpo``: the :class:`~apexrl.agents.base.AgentDef` of each, on Ape-X's replay path
(n-step transitions, TD-error priorities). DMPO is MPO with D4PG's categorical critic."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from apexrl.agents.base import AgentDef
from apexrl.agents.mpo.config import DMPO_FIELD_SOURCES, MPO_FIELD_SOURCES, MPO_SOURCES, DMPOConfig, MPOConfig
from apexrl.agents.mpo.critics import CategoricalCritic
from apexrl.agents.mpo.learner import MPOLearner
from apexrl.agents.mpo.policy import MPOPolicy
from apexrl.agents.mpo.presets import DMPO_PRESETS, MPO_PRESETS
from apexrl.agents.td3 import continuous_dims

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["DMPO_AGENT", "DMPOLearner", "DMPOPolicy", "MPO_AGENT"]


class DMPOLearner(MPOLearner):
    """MPO's learner with D4PG's categorical critic (:class:`~apexrl.agents.mpo.critics.CategoricalCritic`)."""

    label = "DMPO"

    def __init__(
        self, env_spec: EnvSpec, config: DMPOConfig | None = None, device: str | torch.device = "cpu", seed: int = 0
    ):
        config = config or DMPOConfig()
        super().__init__(env_spec, config, device=device, seed=seed, kind=CategoricalCritic(config))


class DMPOPolicy(MPOPolicy):
    """MPO's actor side with D4PG's categorical critic for the initial priorities."""

    label = "DMPO"

    def __init__(
        self,
        env_spec: EnvSpec,
        config: DMPOConfig | None = None,
        *,
        num_envs: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ):
        config = config or DMPOConfig()
        super().__init__(env_spec, config, num_envs=num_envs, seed=seed, device=device, kind=CategoricalCritic(config))


def _mpo_dims(env_spec: EnvSpec) -> tuple[int, int]:
    return continuous_dims(env_spec, "MPO")


def _dmpo_dims(env_spec: EnvSpec) -> tuple[int, int]:
    return continuous_dims(env_spec, "DMPO")


# Every actor samples the same policy (no exploration ladder): index, num_actors and slots only set the count.
MPO_AGENT = AgentDef(
    name="mpo",
    description="MPO: Gaussian policy fitted by the E-step's weights under decoupled KL constraints (mean, std), "
    "n-step critic (continuous actions)",
    config_class=MPOConfig,
    check_env=_mpo_dims,
    make_learner=lambda env_spec, config, device, seed: MPOLearner(env_spec, config, device=device, seed=seed),
    make_policy=lambda env_spec, config, index, num_actors, seed: MPOPolicy(env_spec, config, seed=seed),
    make_batch_policy=lambda env_spec, config, slots, num_slots, seed: MPOPolicy(
        env_spec, config, num_envs=len(slots), seed=seed
    ),
    presets=MPO_PRESETS,
    sources=MPO_SOURCES,
    field_sources=MPO_FIELD_SOURCES,
)

DMPO_AGENT = AgentDef(
    name="dmpo",
    description="DMPO: MPO with D4PG's categorical critic (51 atoms unless the preset says) (continuous actions)",
    config_class=DMPOConfig,
    check_env=_dmpo_dims,
    make_learner=lambda env_spec, config, device, seed: DMPOLearner(env_spec, config, device=device, seed=seed),
    make_policy=lambda env_spec, config, index, num_actors, seed: DMPOPolicy(env_spec, config, seed=seed),
    make_batch_policy=lambda env_spec, config, slots, num_slots, seed: DMPOPolicy(
        env_spec, config, num_envs=len(slots), seed=seed
    ),
    presets=DMPO_PRESETS,
    sources=MPO_SOURCES,
    field_sources=DMPO_FIELD_SOURCES,
)
