"""TRPO's hyper-parameters (Schulman et al. 2015, as Tonic's torch TRPO and its ``ConjugateGradient``) and their
sources."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.agents.config import _check_nonneg_floats, _check_positive_floats, _check_positive_ints, _check_unit
from apexrl.agents.onpolicy.config import ONPOLICY_FIELD_SOURCES, OnPolicyConfig

__all__ = ["TRPOConfig", "TRPO_FIELD_SOURCES"]


@dataclass(frozen=True)
class TRPOConfig(OnPolicyConfig):
    """TRPO: a natural-gradient step of the actor under a KL constraint per popped batch (conjugate gradient,
    then a backtracking line search), ``critic_iterations`` of the critic."""

    cg_steps: int = 10
    """Conjugate-gradient iterations solving ``H x = g`` (H: the KL's Hessian, damped)."""
    damping: float = 0.1
    """Added to the Hessian's diagonal: ``(H + damping I) x``."""
    max_kl: float = 0.01
    """The KL constraint: a step is accepted when the mean KL(new || behaviour) stays within it."""
    backtrack_steps: int = 10
    """Line-search trials, each shrinking the step by ``backtrack_coeff``; none accepted: no step."""
    backtrack_coeff: float = 0.8
    """Factor of each backtracking trial."""
    entropy_coeff: float = 0.0
    """Weight of the entropy bonus in the surrogate loss."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive_ints(self, "cg_steps", "backtrack_steps")
        _check_positive_floats(self, "max_kl")
        _check_nonneg_floats(self, "damping", "entropy_coeff")
        _check_unit(self, "backtrack_coeff")


TRPO_FIELD_SOURCES: dict[str, str] = dict(
    ONPOLICY_FIELD_SOURCES,
    cg_steps="Tonic",
    damping="Tonic",
    max_kl="Tonic",
    backtrack_steps="Tonic",
    backtrack_coeff="Tonic",
    entropy_coeff="Tonic",
)
"""Where each TRPOConfig default comes from (keys of ``apexrl.launch.preset_table.SOURCES``)."""
