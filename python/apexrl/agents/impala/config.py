"""IMPALA's hyper-parameters (Espeholt et al. 2018, as Acme's IMPALA) and where each default comes from."""

from __future__ import annotations

from dataclasses import dataclass

from apexrl.agents.config import _check_bool, _check_nonneg_floats, _check_positive_floats
from apexrl.agents.onpolicy.config import ONPOLICY_FIELD_SOURCES, OnPolicyConfig

__all__ = ["IMPALAConfig", "IMPALA_FIELD_SOURCES"]


@dataclass(frozen=True)
class IMPALAConfig(OnPolicyConfig):
    """IMPALA: one step of the V-trace actor-critic loss per popped batch; actors act on (not synchronous), V-trace
    corrects for the lag."""

    batch_size: int = 16
    """Items per update (Acme's)."""
    unroll: int = 19
    """Trained steps per item: Acme's sequences of 20 steps, the last one bootstrapping."""
    lr: float = 1e-3
    """Adam learning rate of the one optimiser over actor and critic (Acme: b1 0, b2 0.99)."""
    entropy_cost: float = 0.01
    """Weight of the entropy bonus."""
    baseline_cost: float = 0.5
    """Weight of the critic's loss ``1/2 mean (v_s - V(s))^2``."""
    rho_bar: float = 1.0
    """Clip of the importance weights rho in the V-trace targets and the policy-gradient advantages."""
    c_bar: float = 1.0
    """Clip of the trace-cutting weights c."""
    vtrace: bool = True
    """False: no off-policy correction (rho = c = 1: the n-step bootstrapped return), to show what V-trace buys."""
    synchronous: bool = False
    """IMPALA's actors act on; the queue's limiter bounds the lag and V-trace corrects it."""
    lam: float = 1.0
    """The V-trace lambda (1: Espeholt et al.'s)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive_floats(self, "lr", "rho_bar", "c_bar")
        _check_nonneg_floats(self, "entropy_cost", "baseline_cost")
        _check_bool(self, "vtrace")


IMPALA_FIELD_SOURCES: dict[str, str] = dict(
    ONPOLICY_FIELD_SOURCES,
    batch_size="Acme IMPALA",
    unroll="Acme IMPALA",
    lr="Acme IMPALA",
    entropy_cost="Acme IMPALA",
    baseline_cost="Acme IMPALA",
    rho_bar="Acme IMPALA",
    c_bar="Acme IMPALA",
    vtrace="Acme IMPALA",
    synchronous="Acme IMPALA",
    lam="Acme IMPALA",
)
"""Where each IMPALAConfig default comes from (keys of ``apexrl.launch.preset_table.SOURCES``); the fields IMPALA
does not use keep the shared sources."""
