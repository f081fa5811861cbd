"""R2D2's loss on a batch of sequences, and its learner.

On a batch in the format of :mod:`apexrl.agents.r2d2.sequences` (``B`` sequences of ``L`` steps, stored state
``(h0, c0)``), with ``s = burn_in`` and ``T = trace_length``::

    burn-in    (h_s, c_s)   = LSTM_online(obs[0:s]   from (h0, c0))      no gradient
               (h'_s, c'_s) = LSTM_target(obs[0:s]   from (h0, c0))      (the target net always: no gradient)
    unroll     Q[t]  = online(obs[s:L]  from (h_s, c_s)),  t = s .. L-1  gradient flows from here on
               Q'[t] = target(obs[s:L]  from (h'_s, c'_s))
    valid      v[t]  = step t is a transition of the item's episode: the mask's prefix holds at t and t + 1,
                       and no step before t ended the episode (sequences.py)
    n-step     for each trained step t in [s, s + T) with v[t]: k_t = the largest k <= n such that
               v[t .. t+k-1] all hold (a sequence's end or an episode's end shortens it), and
               G_t  = sum_{j<k_t} gamma^j D_{t,j} r[t+j],   D_{t,j} = prod_{i<j} discount[t+i]
               a*   = argmax_a Q[t+k_t, a]                           double Q: the online net picks,
               y_t  = h(G_t + gamma^k_t D_{t,k_t} h^-1(Q'[t+k_t, a*]))   the target net evaluates
    error      delta_t = y_t - Q[t, action[t]]                       0 where t is not valid
    loss       = mean_b w_b * sum_t 1/2 delta_t^2                    w: IS weights
    priority   = eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t| + priority_eps   over the valid t of a
                 sequence (``invalid_items`` keeps out sequences without one: step s is valid in every other)

h is the invertible value rescaling (:func:`apexrl.agents.r2d2.nets.value_rescale`); rewards are not clipped.
The loss sums over the time steps of a sequence and averages over sequences (apexrl's choice; the paper does
not say). Optimiser: Adam (lr 1e-4, eps 1e-3); the target network is a hard copy of the online one after every
``target_update_period``-th update.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.agents.common import (
    as_tensor,
    check_steps,
    check_tensors,
    expected_optimizer_tensors,
    finite_priorities,
    load_module_tensors,
    load_optimizer_tensors,
    module_layout,
    module_tensors,
    optimizer_tensors,
)
from apexrl.agents.r2d2.config import R2D2Config
from apexrl.agents.r2d2.nets import RecurrentQNetwork, inverse_value_rescale, make_recurrent_q_network, value_rescale
from apexrl.agents.r2d2.sequences import check_sequences
from apexrl.agents.validity import Rule, finite, in_range, invalid_items
from apexrl.nets import build_seeded

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["R2D2Learner", "SequenceLoss", "sequence_loss", "sequence_priorities", "valid_steps"]


def valid_steps(mask: Tensor, discount: Tensor) -> Tensor:
    """``(B, L)`` bool: observation t is one of the item's episode -- ``mask`` holds at every step up to t and no
    step before t - 1 ended the episode (a terminal step's next observation is still valid: the target
    bootstraps from it with weight 0)."""
    prefix = torch.cumprod(mask.to(torch.int32), dim=1).bool()
    ended = (discount == 0).to(torch.int32)
    ended_before = torch.zeros_like(prefix)
    if mask.shape[1] > 2:
        # ended_before[t] = any(discount[j] == 0 for j <= t - 2)
        ended_before[:, 2:] = torch.cumsum(ended, dim=1)[:, :-2] > 0
    return prefix & ~ended_before


def sequence_priorities(td_abs: Tensor, valid: Tensor, eta: float) -> Tensor:
    """``eta * max_t |delta_t| + (1 - eta) * mean_t |delta_t|`` over the steps where ``valid`` (B, T) holds; 0
    for a sequence with none."""
    v = valid.to(td_abs.dtype)
    count = v.sum(dim=1)
    mean = (td_abs * v).sum(dim=1) / count.clamp(min=1)
    peak = torch.where(valid, td_abs, torch.zeros_like(td_abs)).amax(dim=1)
    return eta * peak + (1.0 - eta) * mean


class SequenceLoss(NamedTuple):
    """What :func:`sequence_loss` returns; every tensor but ``loss`` is detached."""

    loss: Tensor
    """Scalar: mean_b w_b * sum_t 1/2 delta_t^2 (differentiable w.r.t. the online network)."""
    delta: Tensor
    """(B, T) TD errors of the trained steps in the rescaled space, 0 where not valid."""
    valid: Tensor
    """(B, T) bool: the trained steps that count."""
    q_taken: Tensor
    """(B, T) Q_online(obs[t], action[t])."""
    priorities: Tensor
    """(B,) sequence priorities (without priority_eps)."""


def _unroll(net: RecurrentQNetwork, obs: Tensor, state: tuple[Tensor, Tensor], burn_in: int) -> Tensor:
    """Q over ``obs[:, burn_in:]``, the first ``burn_in`` steps unrolled from ``state`` without gradient."""
    if burn_in > 0:
        with torch.no_grad():
            _, state = net(obs[:, :burn_in], state)
        state = (state[0].detach(), state[1].detach())
    q, _ = net(obs[:, burn_in:], state)
    return q


def sequence_loss(
    online: RecurrentQNetwork,
    target: RecurrentQNetwork,
    batch: Mapping[str, Tensor],
    weights: Tensor,
    config: R2D2Config,
) -> SequenceLoss:
    """The loss of the module docstring on a batch of tensors (fields of apexrl.agents.r2d2.sequences, on the
    networks' device; ``obs`` uint8 or float32, ``action`` int64, the rest float32/bool). ``target`` may be
    ``online`` (an actor scoring its own sequences: then its target is the same network's unroll)."""
    s, n_trained, n, gamma = config.burn_in, config.trace_length, config.n_step, config.gamma
    obs, action = batch["obs"], batch["action"]
    reward, discount = batch["reward"], batch["discount"]
    state = (batch["state_h"], batch["state_c"])
    b, length = obs.shape[:2]
    rest = length - s  # steps from the burn-in's end to the sequence's end (>= T + 1)

    valid_obs = valid_steps(batch["mask"], discount)
    step_ok = torch.zeros_like(valid_obs)  # transition t -> t + 1 lies inside the episode
    step_ok[:, :-1] = valid_obs[:, :-1] & valid_obs[:, 1:]

    q = _unroll(online, obs, state, s)  # (B, rest, A), gradient
    with torch.no_grad():
        q_target = _unroll(target, obs, state, s)  # (B, rest, A)
        q_online = q.detach()

        # n-step returns inside the sequence, shortened at the sequence's or the episode's end.
        t = torch.arange(s, s + n_trained, device=obs.device)  # absolute indices of the trained steps
        ret = torch.zeros(b, n_trained, device=obs.device)
        scale = torch.ones(b, n_trained, device=obs.device)  # gamma^j D_{t,j} of the next reward
        boot_scale = torch.zeros(b, n_trained, device=obs.device)
        boot_at = t.expand(b, n_trained).clone()
        alive = torch.ones(b, n_trained, dtype=torch.bool, device=obs.device)
        for j in range(n):
            at = t + j
            inside = at <= length - 2
            at_c = at.clamp(max=length - 2)
            ok = alive & inside & step_ok[:, at_c]
            ret = ret + torch.where(ok, scale * reward[:, at_c], torch.zeros_like(ret))
            scale = torch.where(ok, scale * gamma * discount[:, at_c], scale)
            boot_scale = torch.where(ok, scale, boot_scale)
            boot_at = torch.where(ok, at_c + 1, boot_at)
            alive = ok
        rel = (boot_at - s).clamp(min=0, max=rest - 1)  # bootstrap step relative to the unroll
        a_star = q_online.gather(1, rel.unsqueeze(-1).expand(-1, -1, q.shape[-1])).argmax(dim=-1)
        q_boot = q_target.gather(1, rel.unsqueeze(-1).expand(-1, -1, q.shape[-1]))
        q_boot = q_boot.gather(2, a_star.unsqueeze(-1)).squeeze(-1)
        eps = config.rescale_eps
        y = value_rescale(ret + boot_scale * inverse_value_rescale(q_boot, eps), eps)

    valid = step_ok[:, s : s + n_trained]
    q_taken = q[:, :n_trained].gather(2, action[:, s : s + n_trained].unsqueeze(-1)).squeeze(-1)
    delta = torch.where(valid, y - q_taken, torch.zeros_like(q_taken))
    loss = (weights * (0.5 * delta.square()).sum(dim=1)).mean()
    td = delta.detach()
    return SequenceLoss(loss, td, valid, q_taken.detach(), sequence_priorities(td.abs(), valid, config.priority_eta))


def sequences_to_tensors(batch: Mapping[str, np.ndarray], device: torch.device) -> dict[str, Tensor]:
    """A numpy sequence batch as the tensors :func:`sequence_loss` takes."""
    obs = np.asarray(batch["obs"])
    return {
        "obs": as_tensor(obs, device, None if obs.dtype == np.uint8 else torch.float32),
        "action": as_tensor(batch["action"], device, torch.int64),
        "reward": as_tensor(batch["reward"], device, torch.float32),
        "discount": as_tensor(batch["discount"], device, torch.float32),
        "mask": as_tensor(batch["mask"], device, torch.bool),
        "state_h": as_tensor(batch["state_h"], device, torch.float32),
        "state_c": as_tensor(batch["state_c"], device, torch.float32),
    }


def sequence_rules(config: R2D2Config, num_actions: int) -> tuple[Rule, ...]:
    """The values a sequence must hold to be trained on (``R2D2Learner.invalid_items``)."""
    s = config.burn_in

    def trains(mask: np.ndarray) -> np.ndarray:
        # At least one trained step: the mask holds up to step s + 1 (a prefix), so step s is a transition.
        m = np.asarray(mask, dtype=bool)
        if m.shape[1] < s + 2:
            return np.zeros(len(m), dtype=bool)
        return np.asarray(m[:, : s + 2].all(axis=1), dtype=bool)

    def lives_through_burn_in(discount: np.ndarray) -> np.ndarray:
        return np.asarray((np.asarray(discount)[:, :s] != 0).all(axis=1), dtype=bool)

    return (
        in_range("action", 0, num_actions - 1),
        finite("reward"),
        in_range("discount", 0, 1),
        Rule("discount", lives_through_burn_in, f"must not be 0 before step burn_in = {s} (no trained step)"),
        finite("obs"),
        finite("state_h"),
        finite("state_c"),
        Rule("mask", trains, f"must hold at steps 0 .. burn_in + 1 = {s + 1} (no trained step otherwise)"),
    )


class R2D2Learner:
    """The learner's side of R2D2: online and target recurrent dueling networks, Adam, the sequence loss.

    Args:
      env_spec: the environment (obs shape/dtype, number of actions).
      config: hyper-parameters (paper defaults).
      device: torch device of the networks and the update.
      seed: initialises the networks (through a torch.Generator; the global RNG is not used).

    ``update`` takes a sequence batch (apexrl.agents.r2d2.sequences) and IS weights, as ``Agent.update`` takes a
    transition batch (``--agent r2d2``, :mod:`apexrl.agents.r2d2.agent`; the run's learner feeds it through its
    prefetching sampler with a :class:`apexrl.apex.sequences.SequenceDecoder`).
    """

    metric_names: tuple[str, ...] = ("loss", "td_abs_mean", "q_mean", "grad_norm", "valid_steps")
    """Keys of the metrics dict ``update`` returns."""

    def __init__(
        self, env_spec: EnvSpec, config: R2D2Config | None = None, device: str | torch.device = "cpu", seed: int = 0
    ):
        self.config = config = config or R2D2Config()
        self.env_spec = env_spec
        self.device = torch.device(device)
        generator = torch.Generator().manual_seed(seed)
        self.q_net = build_seeded(lambda: make_recurrent_q_network(env_spec, config), generator, self.device)
        self.target_q_net = copy.deepcopy(self.q_net).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.q_net.parameters(), lr=config.lr, eps=config.adam_eps)
        self.steps = 0
        assert env_spec.num_actions is not None  # make_recurrent_q_network checked it
        self._rules = sequence_rules(config, env_spec.num_actions)

    def invalid_items(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
        """Sequences ``update`` must not see: an action without a Q output, a non-finite reward, observation or
        state, a discount outside [0, 1], or no trained step (``mask`` False before step burn_in + 2, or the
        episode ending before step burn_in)."""
        return invalid_items(batch, self._rules)

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """One gradient step on a sequence batch with IS weights (formulas in the module docstring).

        Returns the new sequence priorities (float64, ``priority_eps`` added) and the metrics, computed before
        the step. Copies the target network after every ``target_update_period``-th update."""
        check_sequences(batch, self.config, self.env_spec.obs_shape, weights)
        tensors = sequences_to_tensors(batch, self.device)
        w = as_tensor(weights, self.device, torch.float32)
        out = sequence_loss(self.q_net, self.target_q_net, tensors, w, self.config)

        self.optimizer.zero_grad(set_to_none=True)
        out.loss.backward()
        max_norm = self.config.grad_clip_norm if self.config.grad_clip_norm is not None else float("inf")
        grad_norm = nn.utils.clip_grad_norm_(self.q_net.parameters(), max_norm)
        # The schedule is a function of the update count, which checkpoints keep: a resumed run goes on with it.
        lr = self.config.lr_at(self.steps)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        self.optimizer.step()

        self.steps += 1
        if self.steps % self.config.target_update_period == 0:
            self.target_q_net.load_state_dict(self.q_net.state_dict())

        v = out.valid.to(torch.float32)
        count = v.sum().clamp(min=1)
        stats = torch.stack(
            [
                out.loss.detach(),
                (out.delta.abs() * v).sum() / count,
                (out.q_taken * v).sum() / count,
                grad_norm.detach(),
                v.sum(),
            ]
        ).tolist()
        return finite_priorities(out.priorities, self.config.priority_eps), dict(zip(self.metric_names, stats))

    # -- weights for actors, checkpoints ---------------------------------------------------------------------

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """The online network's weights as CPU tensors named ``q_net/...``: what ``RecurrentPolicy`` loads."""
        return module_tensors("q_net", self.q_net)

    def policy_modules(self) -> dict[str, nn.Module]:
        """The live network the policy acts with, under its :meth:`policy_state_dict` prefix."""
        return {"q_net": self.q_net}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat checkpoint: ``q_net/*``, ``target_q_net/*``, ``optim/q_net/<i>/<key>``, ``steps`` (int64)."""
        return {
            **module_tensors("q_net", self.q_net),
            **module_tensors("target_q_net", self.target_q_net),
            **optimizer_tensors("q_net", self.optimizer),
            "steps": torch.tensor(self.steps, dtype=torch.int64),
        }

    def load_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        """Restore a ``state_dict``; ValueError naming missing/unexpected/mismatched entries changes nothing."""
        expected = {
            **module_layout("q_net", self.q_net),
            **module_layout("target_q_net", self.target_q_net),
            **(expected_optimizer_tensors("q_net", self.optimizer, d) if isinstance(d, Mapping) else {}),
            "steps": torch.tensor(0, dtype=torch.int64),
        }
        check_tensors(expected, d, "R2D2 checkpoint")
        check_steps(d["steps"])
        load_module_tensors("q_net", self.q_net, d)
        load_module_tensors("target_q_net", self.target_q_net, d)
        self.optimizer = torch.optim.Adam(self.q_net.parameters(), lr=self.config.lr, eps=self.config.adam_eps)
        load_optimizer_tensors("q_net", self.optimizer, d)
        self.steps = int(d["steps"])
