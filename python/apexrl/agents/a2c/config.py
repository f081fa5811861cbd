"""A2C's hyper-parameters (synchronous advantage actor-critic, as Tonic's torch A2C) and their sources."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.agents.config import _check_nonneg_floats
from apexrl.agents.onpolicy.config import ONPOLICY_FIELD_SOURCES, OnPolicyConfig

__all__ = ["A2CConfig", "A2C_FIELD_SOURCES"]


@dataclass(frozen=True)
class A2CConfig(OnPolicyConfig):
    """A2C: one policy-gradient step of the actor per popped batch, ``critic_iterations`` of the critic."""

    entropy_coeff: float = 0.0
    """Weight of the entropy bonus in the actor's loss."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_nonneg_floats(self, "entropy_coeff")


A2C_FIELD_SOURCES: dict[str, str] = dict(ONPOLICY_FIELD_SOURCES, entropy_coeff="Tonic")
"""Where each A2CConfig default comes from (keys of ``apexrl.launch.preset_table.SOURCES``)."""
