"""MPO's and DMPO's hyper-parameters and where each default comes from.

The defaults are Acme's (its TensorFlow MPO and DMPO agents and their Control Suite launchers; its JAX
``MPOConfig`` and ``GaussianPolicyLossConfig`` give the same values) where Acme gives them; the critic's
torso is the one the other actor-critic agents here share (DPG's two layers, D4PG's categorical head for DMPO).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from apexrl.agents.config import (
    _check_bool,
    _check_layers,
    _check_positive_floats,
    _check_positive_ints,
    _check_unit,
)

__all__ = ["DMPOConfig", "DMPO_FIELD_SOURCES", "MPOConfig", "MPO_FIELD_SOURCES", "MPO_SOURCES"]

MPO_SOURCES: dict[str, str] = {
    "MPO": "Abdolmaleki et al. 2018, Maximum a Posteriori Policy Optimisation (ICLR 2018), and its decoupled "
    "follow-up, Relative Entropy Regularized Policy Iteration (arXiv:1812.02256)",
    "Acme MPO": "Acme's MPO and DMPO (Hoffman et al. 2020, arXiv:2006.00979): the TensorFlow agents and loss "
    "(acme/agents/tf/mpo, acme/agents/tf/dmpo, acme/tf/losses/mpo.py), their Control Suite launchers "
    "(examples/tf/control_suite/lp_mpo.py, lp_dmpo.py) and the same values in its JAX MPOConfig",
}
"""The source keys MPO's settings name, with their citations (the MPO and DMPO ``AgentDef``'s ``sources``)."""


@dataclass(frozen=True)
class MPOConfig:
    """MPO (Abdolmaleki et al. 2018) with decoupled KL constraints on the mean and the covariance of a diagonal
    Gaussian policy, a scalar n-step critic and periodically copied target networks (Acme's settings)."""

    n_step: int = 5
    """n of the n-step return the actors' adder writes and the critic bootstraps from (Acme's MPO)."""
    gamma: float = 0.99
    """Discount per agent step."""
    batch_size: int = 256
    """Transitions per learner update."""
    num_samples: int = 20
    """Actions sampled from the target policy at each state (the E-step's N; also the bootstrap's average)."""
    policy_lr: float = 1e-4
    """Adam learning rate of the policy."""
    critic_lr: float = 1e-4
    """Adam learning rate of the critic."""
    dual_lr: float = 1e-2
    """Adam learning rate of the dual variables (the temperatures and the Lagrange multipliers)."""
    adam_eps: float = 1e-8
    """Adam epsilon, every optimiser."""
    grad_clip_norm: float | None = 40.0
    """Clip the global norm of the policy's and of the critic's gradients to this (the duals': never);
    None: no clipping."""
    actor_hidden: tuple[int, ...] = (256, 256, 256)
    """Policy torso: Linear -> LayerNorm -> tanh, then Linear -> ELU for each further layer; then the mean and
    scale heads."""
    critic_hidden: tuple[int, ...] = (400, 300)
    """Critic torso: obs -> h0 -> tanh -> [concat action] -> h1 -> tanh -> head (MPO: 1 value; DMPO: atoms)."""
    init_scale: float = 0.7
    """The policy's standard deviation where its scale layer outputs 0 (softplus(x) * init_scale / softplus(0))."""
    min_scale: float = 1e-6
    """Added to the policy's standard deviation."""
    epsilon: float = 0.1
    """KL bound between the E-step's non-parametric policy and the target policy (the temperature's dual)."""
    epsilon_mean: float = 2.5e-3
    """KL bound on the policy's mean per update (the multiplier alpha_mean's constraint)."""
    epsilon_stddev: float = 1e-6
    """KL bound on the policy's standard deviation per update (alpha_stddev's constraint)."""
    epsilon_penalty: float = 1e-3
    """KL bound of the action penalisation's non-parametric policy (its own temperature)."""
    init_log_temperature: float = 10.0
    """Initial temperature in log space (the value is softplus(log) + 1e-8)."""
    init_log_alpha_mean: float = 10.0
    """Initial alpha_mean in log space (softplus)."""
    init_log_alpha_stddev: float = 1000.0
    """Initial alpha_stddev in log space (softplus): the standard deviation starts nearly frozen."""
    per_dim_constraining: bool = True
    """Constrain the KL of every action dimension on its own (one multiplier per dimension) rather than the
    sum over dimensions (one multiplier)."""
    action_penalization: bool = True
    """Penalise sampled actions outside [-1, 1] as a second objective (MO-MPO): quadratic cost beyond the
    bounds, with its own temperature and KL bound ``epsilon_penalty``."""
    target_policy_update_period: int = 100
    """Learner updates between hard copies of the policy into the target policy."""
    target_critic_update_period: int = 100
    """Learner updates between hard copies of the critic into the target critic."""
    priority_eps: float = 1e-6
    """Added to every new priority (MPO: |TD error|; DMPO: the KL of the projected target) so that it is > 0."""
    obs_norm: bool = False
    """Normalise observations by the learner's running mean and variance (apexrl.agents.normalize)."""

    def __post_init__(self) -> None:
        _check_bool(self, "obs_norm", "per_dim_constraining", "action_penalization")
        _check_positive_ints(
            self, "n_step", "batch_size", "num_samples", "target_policy_update_period", "target_critic_update_period"
        )
        _check_unit(self, "gamma")
        _check_positive_floats(
            self,
            "policy_lr",
            "critic_lr",
            "dual_lr",
            "adam_eps",
            "init_scale",
            "min_scale",
            "epsilon",
            "epsilon_mean",
            "epsilon_stddev",
            "epsilon_penalty",
            "priority_eps",
        )
        _check_positive_floats(self, "grad_clip_norm", allow_none=True)
        _check_layers(self, "actor_hidden", "critic_hidden")
        if len(self.critic_hidden) != 2:
            raise ValueError(
                f"{type(self).__name__}.critic_hidden must have two layers (the action enters the second), got "
                f"{self.critic_hidden}"
            )
        if not self.actor_hidden:
            raise ValueError(f"{type(self).__name__}.actor_hidden needs at least one layer (the layer-normed one)")
        for name in ("init_log_temperature", "init_log_alpha_mean", "init_log_alpha_stddev"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"{type(self).__name__}.{name} must be a finite number, got {v!r}")


@dataclass(frozen=True)
class DMPOConfig(MPOConfig):
    """DMPO: MPO with D4PG's categorical critic (51 atoms on Acme's Control Suite support [-150, 150])."""

    num_atoms: int = 51
    """Atoms of the categorical value distribution, evenly spaced on [v_min, v_max]."""
    v_min: float = -150.0
    """Lowest atom."""
    v_max: float = 150.0
    """Highest atom."""

    def __post_init__(self) -> None:
        super().__post_init__()
        _check_positive_ints(self, "num_atoms")
        if self.num_atoms < 2:
            raise ValueError(f"DMPOConfig.num_atoms must be >= 2, got {self.num_atoms}")
        for name in ("v_min", "v_max"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
                raise ValueError(f"DMPOConfig.{name} must be a finite number, got {v!r}")
        if not self.v_min < self.v_max:
            raise ValueError(f"DMPOConfig needs v_min < v_max, got v_min={self.v_min!r}, v_max={self.v_max!r}")


MPO_FIELD_SOURCES: dict[str, str] = dict(
    dict.fromkeys(
        (
            "n_step",
            "gamma",
            "batch_size",
            "num_samples",
            "policy_lr",
            "critic_lr",
            "dual_lr",
            "grad_clip_norm",
            "actor_hidden",
            "init_scale",
            "min_scale",
            "epsilon",
            "epsilon_mean",
            "epsilon_stddev",
            "epsilon_penalty",
            "init_log_temperature",
            "init_log_alpha_mean",
            "init_log_alpha_stddev",
            "per_dim_constraining",
            "action_penalization",
            "target_policy_update_period",
            "target_critic_update_period",
        ),
        "Acme MPO",
    ),
    adam_eps="apexrl",
    critic_hidden="Ape-X",
    priority_eps="apexrl",
    obs_norm="apexrl",
)
"""Where each MPOConfig default comes from (keys of ``apexrl.launch.preset_table.SOURCES``)."""

DMPO_FIELD_SOURCES: dict[str, str] = dict(MPO_FIELD_SOURCES, num_atoms="Acme MPO", v_min="Acme MPO", v_max="Acme MPO")
"""Where each DMPOConfig default comes from."""
