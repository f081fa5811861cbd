"""D4PG (Barth-Maron et al. 2018): distributed distributional deterministic policy gradients on Ape-X's replay.

The actor is DPG's (:class:`~apexrl.agents.dpg.DPGActor`, same transitions); the critic is categorical::

    critic  p(s, a)  = softmax(W3 tanh(W2 [tanh(W1 s), a]))        400 -> 300 -> num_atoms (51)
    Z(s, a) takes the value z_i = v_min + i * (v_max - v_min) / (num_atoms - 1) with probability p_i;
    Q(s, a) = sum_i p_i z_i

Learner update on a batch (s, a, R, D, s') with IS weights w (R the n-step return, D = gamma^n or 0)::

    p'     = p_target(s', pi_target(s'))                  target critic at the target actor's action
    m      = project(R + D * z, p')                        onto the support (below)
    CE_i   = -sum_j m_ij log p_ij(s_i, a_i)
    H_i    = -sum_j m_ij log m_ij                          entropy of the projected target
    critic_loss = mean_i w_i * CE_i                                  -> Adam step of the critic
    actor_loss  = -mean_i Q(s_i, pi(s_i))  (updated critic)          -> Adam step of the actor, dQ/da clipped
                                                                        as DPG's (``dqda_clip``/``dqda_clip_norm``)
    priorities  = KL_i + priority_eps,  KL_i = CE_i - H_i

Projection (Bellemare et al. 2017, C51): each atom's shifted value Tz_j = clip(R + D z_j, v_min, v_max) sits at
b_j = (Tz_j - v_min) / dz between atoms l = floor(b_j) and u = ceil(b_j); its mass p'_j goes (u - b_j) to l and
(b_j - l) to u, all of it to l when b_j lands on an atom (l == u). At a terminal (D = 0) all mass lands at
clip(R).

Priorities are the per-item KL divergence KL(m_i || p_i) = CE_i - H_i: what the critic still has to learn about
item i. The cross-entropy the critic minimises has the same gradient (H_i does not depend on the critic), but
as a priority it floors at the target's entropy: with targets spread over a few atoms every item keeps a
priority near H, sampling is nearly uniform (a mean IS weight of 0.90-0.93 was measured with CE priorities)
and the items the critic already fits are sampled as often as the ones it does not. KL is 0 for a perfect fit,
so it plays the role |TD error| plays in DPG; priority_eps keeps every priority > 0.

Targets are hard copies every ``target_update_period`` (100) updates: the paper's Algorithm 1 copies the
online networks into the targets every t_target steps (no Polyak averaging), and Acme's D4PG copies every 100.
The actor loss is not IS-weighted (as DPG's); the options DPG has (``dqda_clip_norm``, ``grad_clip_norm``,
``actor_loss_state``, ``actor_weights``) apply the same way. Exploration: actor i of N adds Gaussian noise
N(0, sigma_i^2), sigma_i on a ladder from ``noise_sigma_max`` (actor 0) down to ``noise_sigma_min`` (actor
N - 1), geometric or linear (``noise_sigma_spacing``); a single actor uses ``noise_sigma_max``. The default
is 0.3 on every actor (Acme's fixed D4PG sigma); ``apex-d4pg-control`` spreads sigma from 1 down to 1/32
(the Control Suite paper's range). Evaluation is noiseless.
Actors (``D4PGPolicy``) compute initial priorities with their local actor and critic standing in for the
targets.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.agents.base import AgentDef
from apexrl.agents.common import check_actor_index, check_batch, finite_priorities
from apexrl.agents.config import D4PGConfig
from apexrl.agents.dpg import (
    FINAL_LAYER_INIT,
    DPGLearner,
    DPGPolicy,
    _dims,
    _f32,
    actor_obs,
    actor_step,
    critic_step,
)
from apexrl.agents.normalize import apply

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["D4PGCritic", "D4PGLearner", "D4PGPolicy", "categorical_projection", "sigma_ladder", "support"]


def support(config: D4PGConfig, device: str | torch.device = "cpu") -> Tensor:
    """The atoms z_0..z_{K-1}: ``num_atoms`` values evenly spaced on [v_min, v_max] (float32)."""
    return torch.linspace(config.v_min, config.v_max, config.num_atoms, dtype=torch.float32, device=device)


def categorical_projection(reward: Tensor, discount: Tensor, probs: Tensor, z: Tensor) -> Tensor:
    """Project the distribution of ``reward + discount * Z`` (Z: ``probs`` over atoms ``z``) onto ``z``.

    Args:
      reward, discount: shape ``(B,)``.
      probs: shape ``(B, K)``, rows summing to 1.
      z: shape ``(K,)``, evenly spaced, increasing.
    Returns:
      ``(B, K)``: rows summing to 1 (see the module docstring for the rule).
    """
    k = z.shape[0]
    v_min, v_max = z[0], z[-1]
    dz = (v_max - v_min) / (k - 1)
    tz = (reward[:, None] + discount[:, None] * z[None, :]).clamp(v_min, v_max)
    b = ((tz - v_min) / dz).clamp(0, k - 1)
    lower, upper = b.floor(), b.ceil()
    # On an atom (lower == upper) both weights below would be 0: the whole mass goes to that atom instead.
    w_lower = probs * (upper - b + (lower == upper).to(probs.dtype))
    w_upper = probs * (b - lower)
    out = torch.zeros_like(probs)
    out.scatter_add_(1, lower.long(), w_lower)
    out.scatter_add_(1, upper.long(), w_upper)
    return out


def cross_entropy(target: Tensor, logits: Tensor) -> Tensor:
    """Per-row ``-sum_j target_j log softmax(logits)_j``, shape ``(B,)``."""
    return -(target * torch.log_softmax(logits, dim=1)).sum(dim=1)


def entropy(probs: Tensor) -> Tensor:
    """Per-row ``-sum_j p_j log p_j`` (0 log 0 = 0), shape ``(B,)``."""
    return -torch.special.xlogy(probs, probs).sum(dim=1)


def kl_priorities(target: Tensor, ce: Tensor, eps: float) -> np.ndarray:
    """``KL(target || p) + eps`` from the cross-entropy ``ce`` (float64): ``ce - entropy(target)``, clamped at 0
    against rounding."""
    return finite_priorities((ce - entropy(target)).clamp_min(0.0), eps)


def sigma_ladder(i: int, n: int, sigma_min: float, sigma_max: float, spacing: str = "geometric") -> float:
    """Noise std of actor ``i`` of ``n``, from ``sigma_max`` (actor 0) down to ``sigma_min`` (actor ``n - 1``):
    ``sigma_max * (sigma_min / sigma_max) ** (i / (n - 1))`` (``geometric``) or
    ``sigma_max + (sigma_min - sigma_max) * i / (n - 1)`` (``linear``); ``n == 1`` gives ``sigma_max``.

    Raises:
      ValueError: ``n < 1``, ``i`` outside ``[0, n)`` or an unknown ``spacing``.
    """
    check_actor_index(i, n)
    if spacing not in ("geometric", "linear"):
        raise ValueError(f"sigma spacing must be geometric or linear, got {spacing!r}")
    if n == 1:
        return float(sigma_max)
    if spacing == "linear":
        return float(sigma_max + (sigma_min - sigma_max) * i / (n - 1))
    return float(sigma_max * (sigma_min / sigma_max) ** (i / (n - 1)))


class D4PGCritic(nn.Module):
    """Categorical ``Z(s, a)``: DPG's critic torso with a ``num_atoms``-logit head; ``forward`` returns the
    logits ``(B, K)``, ``q`` the mean ``sum_i p_i z_i`` ``(B,)``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, int], config: D4PGConfig):
        super().__init__()
        self.obs_layer = nn.Linear(obs_dim, hidden[0])
        self.joint_layer = nn.Linear(hidden[0] + action_dim, hidden[1])
        self.out = nn.Linear(hidden[1], config.num_atoms)
        # Not a buffer: the support comes from the config, so checkpoints and weight messages do not carry it.
        self.config = config

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        h = torch.tanh(self.obs_layer(obs))
        h = torch.tanh(self.joint_layer(torch.cat([h, action], dim=1)))
        return self.out(h)

    @property
    def z(self) -> Tensor:
        """The atoms, on the head's device."""
        return support(self.config, self.out.weight.device)

    def q(self, obs: Tensor, action: Tensor) -> Tensor:
        return (torch.softmax(self(obs, action), dim=1) * self.z).sum(dim=1)

    def reset_from(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.out.weight.uniform_(-FINAL_LAYER_INIT, FINAL_LAYER_INIT, generator=generator)
            self.out.bias.uniform_(-FINAL_LAYER_INIT, FINAL_LAYER_INIT, generator=generator)


def _d4pg_critic(obs_dim: int, action_dim: int, config: D4PGConfig) -> D4PGCritic:
    return D4PGCritic(obs_dim, action_dim, config.critic_hidden, config)


def _batch_tensors(batch: Mapping[str, np.ndarray], device: torch.device) -> list[Tensor]:
    return [_f32(batch[k], device) for k in ("obs", "action", "reward", "discount", "next_obs")]


class D4PGLearner(DPGLearner):
    """The learner's side of D4PG: DPG's learner (networks, targets, Adam, checkpoints) with a categorical
    critic and the update of the module docstring.

    Args:
      env_spec: the environment (obs_dim, action_dim).
      config: hyper-parameters (paper defaults).
      device: torch device of the networks and the update.
      seed: initialises the networks (through a torch.Generator; the global RNG is not used).
    """

    metric_names: tuple[str, ...] = ("critic_loss", "actor_loss", "q_mean", "priority_mean")
    """``critic_loss``: mean_i w_i CE_i; ``actor_loss``: -mean Q(s, pi(s)); ``q_mean``: mean of the predicted
    distributions' means at (s, a) before the step; ``priority_mean``: mean new priority (KL + eps)."""
    label = "D4PG"
    make_critic = staticmethod(_d4pg_critic)  # type: ignore[assignment]  # takes the D4PGConfig it is given

    def __init__(
        self, env_spec: EnvSpec, config: D4PGConfig | None = None, device: str | torch.device = "cpu", seed: int = 0
    ):
        # DPG's learner, run with D4PG's config (a sibling of DPGConfig: the fields DPG reads are common).
        super().__init__(env_spec, config or D4PGConfig(), device=device, seed=seed)  # type: ignore[arg-type]

    @property
    def _z(self) -> Tensor:
        """The critic's atoms: ``self.critic`` is the D4PGCritic that ``make_critic`` built."""
        return cast(D4PGCritic, self.critic).z

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """One critic step then one actor step (module docstring); returns (priorities float64, metrics).
        Copies both target networks after every ``target_update_period``-th update."""
        check_batch(batch, self.transition_spec.names, weights)
        obs, action, reward, discount, next_obs = _batch_tensors(batch, self.device)
        obs, next_obs = self.normalise(obs, next_obs)
        w = _f32(weights, self.device)
        c = self.config

        with torch.no_grad():
            next_probs = torch.softmax(self.target_critic(next_obs, self.target_actor(next_obs)), dim=1)
            target = categorical_projection(reward, discount, next_probs, self._z)
        logits = self.critic(obs, action)
        ce = cross_entropy(target, logits)
        critic_loss = (w * ce).mean()
        critic_step(self.critic, critic_loss, self.critic_optimizer, c)

        actor_loss = actor_step(self.actor, self.critic.q, actor_obs(obs, next_obs, c), self.actor_optimizer, c)

        self.steps += 1
        if self.steps % c.target_update_period == 0:
            self.target_actor.load_state_dict(self.actor.state_dict())
            self.target_critic.load_state_dict(self.critic.state_dict())

        priorities = kl_priorities(target, ce.detach(), c.priority_eps)
        q_mean = (torch.softmax(logits.detach(), dim=1) * self._z).sum(dim=1).mean()
        stats = torch.stack([critic_loss.detach(), actor_loss, q_mean]).tolist()
        metrics = dict(zip(self.metric_names, [*stats, float(priorities.mean())]))
        return priorities, metrics


class D4PGPolicy(DPGPolicy):
    """An actor's local D4PG policy: ``clip(pi(s) + sigma * N(0, I), -1, 1)``, or ``pi(s)`` in evaluation.

    Args:
      env_spec, config: as for the learner (same networks).
      sigma: std of this actor's exploration noise (see :func:`sigma_ladder`); None: ``noise_sigma_max``.
      seed: initial weights (until the first ``load_policy_state_dict``) and the noise draws.
      device: torch device of the local networks.
    """

    label = "D4PG"
    make_critic = staticmethod(_d4pg_critic)  # type: ignore[assignment]  # takes the D4PGConfig it is given

    def __init__(
        self,
        env_spec: EnvSpec,
        config: D4PGConfig | None = None,
        *,
        sigma: float | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        sigmas: Sequence[float] | None = None,
    ):
        config = config or D4PGConfig()
        if sigma is None and sigmas is None:
            sigma = config.noise_sigma_max
        # DPG's policy, run with D4PG's config (a sibling of DPGConfig: the fields DPG reads are common).
        super().__init__(env_spec, config, sigma=sigma, seed=seed, device=device, sigmas=sigmas)  # type: ignore[arg-type]

    @property
    def _z(self) -> Tensor:
        """The critic's atoms: ``self.critic`` is the D4PGCritic that ``make_critic`` built."""
        return cast(D4PGCritic, self.critic).z

    @property
    def exploration(self) -> float:
        """This actor's noise std sigma (smaller = greedier; written to episodes.csv)."""
        return self.sigma

    @exploration.setter
    def exploration(self, value: float) -> None:
        self.sigma = float(value)

    @torch.inference_mode()
    def initial_priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """The learner's priority, KL + priority_eps, with the local actor and critic standing in for the
        target networks, for a whole batch at once (float64)."""
        check_batch(batch, self.transition_spec.names)
        obs, action, reward, discount, next_obs = _batch_tensors(batch, self.device)
        obs, next_obs = apply(self.obs_norm, obs), apply(self.obs_norm, next_obs)
        next_probs = torch.softmax(self.critic(next_obs, self.actor(next_obs)), dim=1)
        target = categorical_projection(reward, discount, next_probs, self._z)
        return kl_priorities(target, cross_entropy(target, self.critic(obs, action)), self.config.priority_eps)


def _policy(env_spec: EnvSpec, config: D4PGConfig, index: int, num_actors: int, seed: int) -> D4PGPolicy:
    sigma = sigma_ladder(index, num_actors, config.noise_sigma_min, config.noise_sigma_max, config.noise_sigma_spacing)
    return D4PGPolicy(env_spec, config, sigma=sigma, seed=seed)


def _batch_policy(env_spec: EnvSpec, config: D4PGConfig, slots: Sequence[int], num_slots: int, seed: int) -> D4PGPolicy:
    """The sigma ladder runs over every environment of the run (``slots`` of ``num_slots``)."""
    sigmas = [
        sigma_ladder(s, num_slots, config.noise_sigma_min, config.noise_sigma_max, config.noise_sigma_spacing)
        for s in slots
    ]
    return D4PGPolicy(env_spec, config, sigmas=sigmas, seed=seed)


AGENT = AgentDef(
    name="d4pg",
    description=(
        "D4PG: deterministic actor, categorical critic (51 atoms unless the preset says), n-step targets "
        "(continuous actions)"
    ),
    config_class=D4PGConfig,
    check_env=_dims,
    make_learner=lambda env_spec, config, device, seed: D4PGLearner(env_spec, config, device=device, seed=seed),
    make_policy=_policy,
    make_batch_policy=_batch_policy,
)
