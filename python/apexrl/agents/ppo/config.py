"""PPO's hyper-parameters (Schulman et al. 2017, as Tonic's torch PPO) and where each default comes from."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.agents.config import _check_nonneg_floats, _check_positive_floats
from apexrl.agents.onpolicy.config import ONPOLICY_FIELD_SOURCES, OnPolicyConfig

__all__ = ["PPOConfig", "PPO_FIELD_SOURCES"]


@dataclass(frozen=True)
class PPOConfig(OnPolicyConfig):
    """PPO: the clipped probability-ratio objective, GAE, ``critic_iterations`` passes over each popped batch
    for the critic and for the actor until its KL from the behaviour policy passes ``kl_threshold``."""

    ratio_clip: float = 0.2
    """epsilon of the clipped objective: ratios outside [1 - epsilon, 1 + epsilon] give no gradient."""
    kl_threshold: float = 0.015
    """The actor's passes stop once the mean of ``logp_behaviour - logp`` over the batch exceeds this."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus in the actor's loss."""
    value_clip: float | None = None
    """Clip the critic's change from its value before the update to this (the PPO2 value loss); None: plain
    regression (Tonic)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive_floats(self, "ratio_clip", "kl_threshold")
        _check_positive_floats(self, "value_clip", allow_none=True)
        _check_nonneg_floats(self, "entropy_coeff")


PPO_FIELD_SOURCES: dict[str, str] = dict(
    ONPOLICY_FIELD_SOURCES,
    ratio_clip="Tonic",
    kl_threshold="Tonic",
    entropy_coeff="Tonic",
    value_clip="Tonic",
)
"""Where each PPOConfig default comes from (keys of ``apexrl.launch.preset_table.SOURCES``)."""
