"""MPO's policy loss (Abdolmaleki et al. 2018), with decoupled KL constraints on a diagonal Gaussian.

Shapes: N sampled actions per state, B states, D action dimensions. Per update, at each state s the target policy
pi_old (mean mu_old, std sigma_old) gives N actions a_j and the target critic their values Q_j:

E-step (the non-parametric policy q(a_j|s) = w_j, the temperature eta by its dual)::

    w_j  = softmax_j(Q_j / eta)                                   (no gradient)
    g(eta) = eta * epsilon + eta * mean_s log( (1/N) sum_j exp(Q_j / eta) )        the temperature's dual

    dg/deta = epsilon + mean_s [ log mean_j exp(Q_j / eta) - sum_j w_j Q_j / eta ]
            = epsilon - mean_s KL(q || pi_old),   KL(q || pi_old) = sum_j w_j log(N w_j)

  g is convex in eta and minimised where KL(q || pi_old) = epsilon: descending it raises eta when q strays too
  far from pi_old (w too peaked) and lowers it when q stays too close.

M-step (fit pi to q, split into the mean's and the standard deviation's part)::

    pi_mean = N(mu, sigma_old)     pi_std = N(mu_old, sigma)          (the other part held at the target's)
    L_mean  = -mean_s sum_j w_j log pi_mean(a_j|s)      L_std = -mean_s sum_j w_j log pi_std(a_j|s)
    C_mean  = mean_s KL(pi_old || pi_mean)              C_std = mean_s KL(pi_old || pi_std)   (per dimension,
                                                         or summed over dimensions without per_dim_constraining)
    policy loss = L_mean + L_std + sum alpha_mean C_mean + sum alpha_std C_std      (alphas without gradient)
    dual loss   = sum alpha_mean (epsilon_mean - C_mean) + sum alpha_std (epsilon_std - C_std) + g(eta)
                                                                                      (the C's without gradient)

  A constraint's multiplier has gradient epsilon - C: descending it raises alpha where the KL exceeds its bound
  (the penalty grows) and lowers it where the KL stays below.

Action penalisation (MO-MPO, Abdolmaleki et al. 2020): a second objective, the cost -||a - clip(a, -1, 1)||, gets
its own temperature (bound ``epsilon_penalty``) and weights; the M-step fits the sum of both objectives' weights.

Every dual variable lives in log space: its value is softplus(log) + 1e-8 (softplus rather than exp, as Acme and
Tonic, for stability), and after each step the log is projected to >= -18, so the value stays positive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = [
    "Duals",
    "FLOAT_EPSILON",
    "MIN_LOG_DUAL",
    "MPOLossStats",
    "gaussian_kl",
    "gaussian_log_prob",
    "kl_penalty_and_dual",
    "mpo_loss",
    "nonparametric_kl",
    "positive",
    "temperature_dual",
    "weighted_nll",
]

FLOAT_EPSILON = 1e-8
"""Added to every dual variable's softplus (Acme's and Tonic's)."""
MIN_LOG_DUAL = -18.0
"""Every dual variable's log is projected to at least this after each step (Acme's and Tonic's)."""
_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def positive(log_value: Tensor) -> Tensor:
    """A dual variable's value from its log-space parameter: ``softplus(log_value) + FLOAT_EPSILON``."""
    return F.softplus(log_value) + FLOAT_EPSILON


def temperature_dual(q: Tensor, epsilon: float, temperature: Tensor) -> tuple[Tensor, Tensor]:
    """The E-step: ``(weights, g(temperature))`` for values ``q`` of shape ``(N, B)``.

    ``weights`` ``(N, B)``: softmax over the N actions of ``q / temperature`` (no gradient; each column sums to
    1). ``g``: the temperature's dual ``temperature * (epsilon + mean_b logsumexp_j(q / temperature) - log N)``,
    differentiable in ``temperature`` only.
    """
    tempered = q.detach() / temperature
    weights = torch.softmax(tempered, dim=0).detach()
    log_mean_exp = torch.logsumexp(tempered, dim=0).mean() - math.log(q.shape[0])
    return weights, temperature * (epsilon + log_mean_exp)


def nonparametric_kl(weights: Tensor) -> Tensor:
    """``KL(q || pi_old)`` per state ``(B,)`` estimated from the E-step's weights ``(N, B)``:
    ``sum_j w_j log(N w_j)`` (the actions are pi_old's samples; a diagnostic)."""
    n = weights.shape[0]
    return (weights * torch.log(n * weights + FLOAT_EPSILON)).sum(dim=0)


def gaussian_log_prob(x: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """Elementwise log-density of ``N(mean, std^2)`` at ``x`` (broadcast; not summed over dimensions)."""
    z = (x - mean) / std
    return -0.5 * z.square() - torch.log(std) - _HALF_LOG_2PI


def gaussian_kl(mean_p: Tensor, std_p: Tensor, mean_q: Tensor, std_q: Tensor) -> Tensor:
    """Elementwise ``KL(N(mean_p, std_p^2) || N(mean_q, std_q^2))``:
    ``log(std_q / std_p) + (std_p^2 + (mean_p - mean_q)^2) / (2 std_q^2) - 1/2``."""
    return (
        torch.log(std_q) - torch.log(std_p) + (std_p.square() + (mean_p - mean_q).square()) / (2 * std_q.square()) - 0.5
    )


def weighted_nll(actions: Tensor, weights: Tensor, mean: Tensor, std: Tensor) -> Tensor:
    """The M-step's loss ``-mean_b sum_j w_jb log N(a_jb; mean_b, std_b)`` (the diagonal Gaussian's log-density
    summed over dimensions); ``actions`` ``(N, B, D)``, ``weights`` ``(N, B)``, ``mean`` and ``std`` ``(B, D)``."""
    log_prob = gaussian_log_prob(actions, mean.unsqueeze(0), std.unsqueeze(0)).sum(dim=-1)
    return -(weights * log_prob).sum(dim=0).mean()


def kl_penalty_and_dual(kl: Tensor, alpha: Tensor, epsilon: float) -> tuple[Tensor, Tensor]:
    """``(penalty, dual loss)`` of one KL constraint: ``kl`` ``(B, K)`` (K: action dimensions, or 1), ``alpha``
    ``(K,)``. ``penalty = sum_k alpha_k mean_b kl_bk`` (alpha without gradient, for the policy);
    ``dual = sum_k alpha_k (epsilon - mean_b kl_bk)`` (the KL without gradient, for alpha)."""
    mean_kl = kl.mean(dim=0)
    return (alpha.detach() * mean_kl).sum(), (alpha * (epsilon - mean_kl.detach())).sum()


class Duals(nn.Module):
    """MPO's dual variables in log space: the temperature, the mean's and the std's multipliers (one per action
    dimension with ``per_dim_constraining``, else one) and, with ``action_penalization``, the penalty's
    temperature."""

    def __init__(
        self,
        action_dim: int,
        *,
        init_log_temperature: float,
        init_log_alpha_mean: float,
        init_log_alpha_stddev: float,
        per_dim_constraining: bool,
        action_penalization: bool,
    ):
        super().__init__()
        k = action_dim if per_dim_constraining else 1
        self.log_temperature = nn.Parameter(torch.full((1,), float(init_log_temperature)))
        self.log_alpha_mean = nn.Parameter(torch.full((k,), float(init_log_alpha_mean)))
        self.log_alpha_stddev = nn.Parameter(torch.full((k,), float(init_log_alpha_stddev)))
        self.log_penalty_temperature = (
            nn.Parameter(torch.full((1,), float(init_log_temperature))) if action_penalization else None
        )
        self.per_dim_constraining = per_dim_constraining

    @torch.no_grad()
    def project_(self) -> None:
        """Every log to at least :data:`MIN_LOG_DUAL` (the values stay clear of 0)."""
        for p in self.parameters():
            p.clamp_(min=MIN_LOG_DUAL)


@dataclass(frozen=True)
class MPOLossStats:
    """Diagnostics of one policy loss (plain floats)."""

    temperature: float
    alpha_mean: float
    """Mean over the multipliers of the mean's constraint."""
    alpha_stddev: float
    kl_q_rel: float
    """KL(q || pi_old) / epsilon, mean over states: 1 when the E-step's constraint is met exactly."""
    kl_mean_rel: float
    """KL of the mean's part / epsilon_mean (mean over states and constraints)."""
    kl_stddev_rel: float
    policy_std: float
    """Mean standard deviation of the online policy."""


def mpo_loss(
    duals: Duals,
    *,
    online_mean: Tensor,
    online_std: Tensor,
    target_mean: Tensor,
    target_std: Tensor,
    actions: Tensor,
    q: Tensor,
    epsilon: float,
    epsilon_mean: float,
    epsilon_stddev: float,
    epsilon_penalty: float,
) -> tuple[Tensor, Tensor, MPOLossStats]:
    """``(policy loss, dual loss, stats)`` (module docstring): the policy loss's gradient goes to the online
    policy (``online_mean``, ``online_std`` ``(B, D)``), the dual loss's to ``duals``. ``target_mean``,
    ``target_std`` ``(B, D)``: the target policy that sampled ``actions`` ``(N, B, D)`` (unclipped), valued ``q``
    ``(N, B)`` by the target critic. Call ``duals.project_()`` before (as the sources do)."""
    target_mean, target_std = target_mean.detach(), target_std.detach()
    temperature = positive(duals.log_temperature)
    weights, loss_temperature = temperature_dual(q, epsilon, temperature)
    kl_q = nonparametric_kl(weights)
    if duals.log_penalty_temperature is not None:
        out_of_bounds = -torch.linalg.vector_norm(actions - actions.clamp(-1.0, 1.0), dim=-1)
        penalty_weights, loss_penalty = temperature_dual(
            out_of_bounds, epsilon_penalty, positive(duals.log_penalty_temperature)
        )
        weights = weights + penalty_weights
        loss_temperature = loss_temperature + loss_penalty

    loss_mean = weighted_nll(actions, weights, online_mean, target_std)
    loss_std = weighted_nll(actions, weights, target_mean, online_std)
    kl_mean = gaussian_kl(target_mean, target_std, online_mean, target_std)
    kl_std = gaussian_kl(target_mean, target_std, target_mean, online_std)
    if not duals.per_dim_constraining:
        kl_mean, kl_std = kl_mean.sum(dim=-1, keepdim=True), kl_std.sum(dim=-1, keepdim=True)
    alpha_mean, alpha_std = positive(duals.log_alpha_mean), positive(duals.log_alpha_stddev)
    penalty_mean, loss_alpha_mean = kl_penalty_and_dual(kl_mean, alpha_mean, epsilon_mean)
    penalty_std, loss_alpha_std = kl_penalty_and_dual(kl_std, alpha_std, epsilon_stddev)

    policy_loss = loss_mean + loss_std + penalty_mean + penalty_std
    dual_loss = loss_alpha_mean + loss_alpha_std + loss_temperature.sum()
    values = torch.stack(
        [
            temperature.detach().mean(),
            alpha_mean.detach().mean(),
            alpha_std.detach().mean(),
            kl_q.mean() / epsilon,
            kl_mean.detach().mean() / epsilon_mean,
            kl_std.detach().mean() / epsilon_stddev,
            online_std.detach().mean(),
        ]
    ).tolist()
    return policy_loss, dual_loss, MPOLossStats(*values)
