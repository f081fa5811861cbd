"""Advantage estimates over popped sequences: GAE (Schulman et al. 2016) as Tonic computes its lambda-returns,
and V-trace (Espeholt et al. 2018) as ``rlax.vtrace`` does.

Both work on a batch of items ``(n, T)``: step ``t`` holds ``r_t`` (the reward of its action), the environment's
discount ``d_t`` of that action (0 where it terminated the episode, 1 otherwise: a time limit still bootstraps)
and ``V_t = V(s_t)``; ``trained[t]`` says whether step ``t`` is an action the loss trains on (its next step
``t + 1`` is in the item: the item's last step only bootstraps, and an episode's last observation is a step of
its own that trains nothing). A trained step whose next step is not trained (the item's end, an episode's
last observation) bootstraps from ``V_{t+1}`` alone: Tonic's ``lambda_returns`` at a segment's end and at a
reset.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["gae", "vtrace"]


def gae(reward: Tensor, discount: Tensor, value: Tensor, trained: Tensor, gamma: float, lam: float) -> Tensor:
    """Generalised advantage estimates ``A_t`` (n, T), 0 where ``trained`` is False::

        delta_t = r_t + gamma d_t V_{t+1} - V_t
        A_t     = delta_t + gamma lam d_t A_{t+1}      (A_{t+1} = 0 where step t + 1 is not trained)

    ``A_t + V_t`` is Tonic's lambda-return (trace decay ``lam``)."""
    _check(reward, discount, value, trained)
    adv = torch.zeros_like(value)
    nxt = torch.zeros_like(value[:, 0])
    for t in range(value.shape[1] - 2, -1, -1):
        gd = gamma * discount[:, t]
        delta = reward[:, t] + gd * value[:, t + 1] - value[:, t]
        cont = torch.where(trained[:, t + 1], nxt, torch.zeros_like(nxt))
        nxt = torch.where(trained[:, t], delta + gd * lam * cont, torch.zeros_like(nxt))
        adv[:, t] = nxt
    return adv


def vtrace(
    reward: Tensor,
    discount: Tensor,
    value: Tensor,
    trained: Tensor,
    log_rho: Tensor,
    gamma: float,
    rho_bar: float = 1.0,
    c_bar: float = 1.0,
    lam: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """V-trace targets ``v_s`` and policy-gradient advantages (n, T), 0 where ``trained`` is False (Espeholt et
    al. 2018, eq. 1; ``rlax.vtrace_td_error_and_advantage``)::

        rho_t   = min(rho_bar, pi(a_t|s_t) / mu(a_t|s_t))          c_t = lam min(c_bar, pi / mu)
        delta_t = rho_t (r_t + gamma d_t V_{t+1} - V_t)
        v_t - V_t = delta_t + gamma d_t c_t (v_{t+1} - V_{t+1})    (0 past a step that is not trained)
        pg_adv_t  = rho_t (r_t + gamma d_t v_{t+1} - V_t)          (v_{t+1} = V_{t+1} where t + 1 is not trained)

    ``log_rho``: ``log pi(a_t|s_t) - log mu(a_t|s_t)`` of the learner's policy pi and the behaviour policy mu."""
    _check(reward, discount, value, trained)
    ratio = torch.exp(log_rho)
    rho = torch.clamp(ratio, max=rho_bar)
    c = lam * torch.clamp(ratio, max=c_bar)
    corr = torch.zeros_like(value)  # v_t - V_t
    nxt = torch.zeros_like(value[:, 0])
    for t in range(value.shape[1] - 2, -1, -1):
        gd = gamma * discount[:, t]
        delta = rho[:, t] * (reward[:, t] + gd * value[:, t + 1] - value[:, t])
        cont = torch.where(trained[:, t + 1], nxt, torch.zeros_like(nxt))
        nxt = torch.where(trained[:, t], delta + gd * c[:, t] * cont, torch.zeros_like(nxt))
        corr[:, t] = nxt
    vs = value + corr
    vs_next = torch.cat([vs[:, 1:], value[:, -1:]], dim=1)
    gd = gamma * discount
    pg_adv = torch.where(trained, rho * (reward + gd * vs_next - value), torch.zeros_like(value))
    return torch.where(trained, vs, torch.zeros_like(vs)), pg_adv


def _check(reward: Tensor, discount: Tensor, value: Tensor, trained: Tensor) -> None:
    if value.dim() != 2 or not (reward.shape == discount.shape == value.shape == trained.shape):
        raise ValueError(
            f"reward, discount, value and trained must share one (n, T) shape, got {tuple(reward.shape)}, "
            f"{tuple(discount.shape)}, {tuple(value.shape)}, {tuple(trained.shape)}"
        )
    if trained[:, -1].any():
        raise ValueError("an item's last step only bootstraps: trained[:, -1] must be False")
