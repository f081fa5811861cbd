"""MPO's and DMPO's learner: one critic step and one policy-and-duals step per sampled batch.

On a batch (s, a, R, D, s') with IS weights w (R the n-step return, D = gamma^n or 0)::

    a'_j ~ pi_target(. | s'), j = 1..N                         the target policy's samples (unclipped)
    read_j = critic_target(s', clip(a'_j, -1, 1))              the target critic sees actions in bounds (its
                                                                values, or its atoms' probabilities)
    critic_loss = mean_i w_i * per-item loss                   (apexrl.agents.mpo.critics)  -> Adam, norm clip
    policy and dual losses at s' (apexrl.agents.mpo.loss) with the values of the same samples
                                                                -> Adam on the policy (norm clip), Adam on the duals
    priorities = per-item priority + priority_eps

As Acme's MPO and DMPO learners: the policy's loss is taken at s', the n-step transition's last state, so that
one set of N samples and one pass of the target critic serve both the bootstrap and the E-step; the critic
clips the sampled actions to the bounds (Acme's ``ClipToSpec`` in the critic), while the policy loss and the
action penalisation see them unclipped; the target policy and critic are hard copies of the online ones every
``target_policy_update_period`` / ``target_critic_update_period`` updates; actors and evaluation get the target
networks. The policy and dual losses are not IS-weighted (as the other agents' actor losses).

Why n-step rather than retrace: the Ape-X actors write n-step transitions (s, a, R, D, s'), which hold neither
the intermediate actions nor the behaviour policy's log-probabilities that retrace's importance weights need;
Acme's MPO and DMPO agents and its JAX MPO (``use_retrace=False``) default to n-step transitions too.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.agents.common import (
    check_batch,
    finite_priorities,
    learner_state,
    load_learner_state,
    module_tensors,
)
from apexrl.agents.mpo.config import MPOConfig
from apexrl.agents.mpo.critics import CriticKind, ScalarCritic
from apexrl.agents.mpo.loss import Duals, mpo_loss
from apexrl.agents.mpo.nets import GaussianPolicy
from apexrl.agents.normalize import ObsNormalizer, make_obs_norm, norm_tensors
from apexrl.agents.optim import make_adam
from apexrl.agents.td3 import CONTINUOUS_RULES, _f32, batch_tensors, continuous_dims
from apexrl.agents.validity import invalid_items
from apexrl.nets import build_seeded
from apexrl.replay.wire.codec import TransitionSpec

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["MPOLearner", "build_networks", "sample_next"]


def build_networks(
    env_spec: EnvSpec, config: MPOConfig, kind: CriticKind, seed: int, device: torch.device, label: str
) -> tuple[GaussianPolicy, nn.Module]:
    """The policy and the critic, their weights drawn from ``seed``."""
    obs_dim, action_dim = continuous_dims(env_spec, label)
    generator = torch.Generator().manual_seed(seed)
    policy = build_seeded(
        lambda: GaussianPolicy(obs_dim, action_dim, config.actor_hidden, config.init_scale, config.min_scale),
        generator,
        device,
    )
    critic = build_seeded(lambda: kind.build(obs_dim, action_dim), generator, device)
    return policy, critic


def sample_next(
    policy: GaussianPolicy,
    critic: nn.Module,
    kind: CriticKind,
    next_obs: Tensor,
    num_samples: int,
    generator: torch.Generator,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """``(mean, std, actions (N, B, D), the critic's read (N, B, ...))``: N draws from ``policy`` at each
    ``next_obs``, valued by ``critic`` (``kind.sampled``) with the actions clipped to [-1, 1] (call under
    ``torch.no_grad``)."""
    mean, std = policy(next_obs)
    normal = torch.randn((num_samples, *mean.shape), generator=generator, device=mean.device)
    actions = mean + std * normal
    return mean, std, actions, kind.sampled(critic, next_obs, actions.clamp(-1.0, 1.0))


class MPOLearner:
    """The learner's side of MPO (and of DMPO with ``kind=CategoricalCritic(config)``): the Gaussian policy, the
    critic, their target copies, the dual variables and three Adam optimisers.

    Args:
      env_spec: the environment (obs_dim, action_dim).
      config: hyper-parameters (Acme's by default).
      device: torch device of the networks and the update.
      seed: initialises the networks and the update's samples (the global RNG is not used).
      kind: the critic (:class:`~apexrl.agents.mpo.critics.ScalarCritic` for MPO by default).
    """

    metric_names: tuple[str, ...] = (
        "critic_loss",
        "policy_loss",
        "q_mean",
        "priority_mean",
        "temperature",
        "alpha_mean",
        "alpha_stddev",
        "kl_q_rel",
        "kl_mean_rel",
        "kl_stddev_rel",
        "policy_std",
    )
    """``critic_loss``: mean_i w_i (per-item loss); ``policy_loss``: the M-step's loss with its KL penalties;
    ``q_mean``: mean Q(s, a) before the step; ``priority_mean``: mean new priority; ``temperature``, ``alpha_mean``,
    ``alpha_stddev``: the dual variables used (means over dimensions); ``kl_*_rel``: the KLs over their bounds
    (the E-step's, the mean's, the std's); ``policy_std``: the online policy's mean standard deviation at s'."""
    label = "MPO"

    def __init__(
        self,
        env_spec: EnvSpec,
        config: MPOConfig | None = None,
        device: str | torch.device = "cpu",
        seed: int = 0,
        kind: CriticKind | None = None,
    ):
        self.config = config = config or MPOConfig()
        self.kind = kind or ScalarCritic(config)
        self.device = torch.device(device)
        obs_dim, action_dim = continuous_dims(env_spec, self.label)
        self.transition_spec = TransitionSpec.dpg(obs_dim, action_dim)
        self.policy, self.critic = build_networks(env_spec, config, self.kind, seed, self.device, self.label)
        self.target_policy = copy.deepcopy(self.policy).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.duals = Duals(
            action_dim,
            init_log_temperature=config.init_log_temperature,
            init_log_alpha_mean=config.init_log_alpha_mean,
            init_log_alpha_stddev=config.init_log_alpha_stddev,
            per_dim_constraining=config.per_dim_constraining,
            action_penalization=config.action_penalization,
        ).to(self.device)
        self.obs_norm: ObsNormalizer | None = make_obs_norm(obs_dim, config.obs_norm, self.device)
        self.noise = torch.Generator(device=self.device).manual_seed(seed + 1)
        """Draws the target policy's samples in the update."""
        self._make_optimizers()
        self.steps = 0

    def invalid_items(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
        """Items ``update`` must not see (as DPG's): actions outside [-1, 1], non-finite values, discounts
        outside [0, 1]."""
        return invalid_items(batch, CONTINUOUS_RULES)

    def _make_optimizers(self) -> None:
        c = self.config
        self.policy_optimizer = make_adam(self.policy.parameters(), lr=c.policy_lr, eps=c.adam_eps)
        self.critic_optimizer = make_adam(self.critic.parameters(), lr=c.critic_lr, eps=c.adam_eps)
        self.dual_optimizer = make_adam(self.duals.parameters(), lr=c.dual_lr, eps=c.adam_eps)

    def normalise(self, obs: Tensor, next_obs: Tensor) -> tuple[Tensor, Tensor]:
        """With ``obs_norm``: fold ``obs`` into the statistics, then normalise both; without: unchanged."""
        if self.obs_norm is None:
            return obs, next_obs
        self.obs_norm.update(obs)
        return self.obs_norm(obs), self.obs_norm(next_obs)

    def _step(self, net: nn.Module, loss: Tensor, optimizer: torch.optim.Optimizer, clip: bool) -> None:
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if clip and self.config.grad_clip_norm is not None:
            nn.utils.clip_grad_norm_(net.parameters(), self.config.grad_clip_norm)
        optimizer.step()

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """One critic step, then one step of the policy and of the duals (module docstring); copies the targets
        on their periods. Returns (priorities float64, metrics)."""
        check_batch(batch, self.transition_spec.names, weights)
        c = self.config
        obs, action, reward, discount, next_obs = batch_tensors(batch, self.device)
        obs, next_obs = self.normalise(obs, next_obs)
        w = _f32(weights, self.device)

        with torch.no_grad():
            target_mean, target_std, actions, sampled = sample_next(
                self.target_policy, self.target_critic, self.kind, next_obs, c.num_samples, self.noise
            )
            sampled_q = self.kind.sampled_values(sampled)
        out = self.critic(obs, action)
        per_item, priority = self.kind.td(out, sampled, reward, discount)
        critic_loss = (w * per_item).mean()
        self._step(self.critic, critic_loss, self.critic_optimizer, clip=True)

        self.duals.project_()
        online_mean, online_std = self.policy(next_obs)
        policy_loss, dual_loss, stats = mpo_loss(
            self.duals,
            online_mean=online_mean,
            online_std=online_std,
            target_mean=target_mean,
            target_std=target_std,
            actions=actions,
            q=sampled_q,
            epsilon=c.epsilon,
            epsilon_mean=c.epsilon_mean,
            epsilon_stddev=c.epsilon_stddev,
            epsilon_penalty=c.epsilon_penalty,
        )
        self._step(self.policy, policy_loss, self.policy_optimizer, clip=True)
        self._step(self.duals, dual_loss, self.dual_optimizer, clip=False)

        self.steps += 1
        if self.steps % c.target_policy_update_period == 0:
            self.target_policy.load_state_dict(self.policy.state_dict())
        if self.steps % c.target_critic_update_period == 0:
            self.target_critic.load_state_dict(self.critic.state_dict())

        priorities = finite_priorities(priority, c.priority_eps)
        head = torch.stack([critic_loss.detach(), policy_loss.detach(), self.kind.values(out.detach()).mean()])
        critic_value, policy_value, q_mean = head.tolist()
        metrics = {
            "critic_loss": critic_value,
            "policy_loss": policy_value,
            "q_mean": q_mean,
            "priority_mean": float(priorities.mean()),
            "temperature": stats.temperature,
            "alpha_mean": stats.alpha_mean,
            "alpha_stddev": stats.alpha_stddev,
            "kl_q_rel": stats.kl_q_rel,
            "kl_mean_rel": stats.kl_mean_rel,
            "kl_stddev_rel": stats.kl_stddev_rel,
            "policy_std": stats.policy_std,
        }
        return priorities, metrics

    # -- weights for actors, checkpoints ---------------------------------------------------------------------

    def policy_state_dict(self) -> dict[str, Tensor]:
        """The *target* policy and critic as ``policy/...``, ``critic/...`` (Acme's MPO learners serve their
        target networks; actors need the critic for their initial priorities) and, with ``obs_norm``,
        ``obs_norm/...``: what :class:`~apexrl.agents.mpo.policy.MPOPolicy` loads."""
        return {
            **module_tensors("policy", self.target_policy),
            **module_tensors("critic", self.target_critic),
            **norm_tensors(self.obs_norm),
        }

    def policy_modules(self) -> dict[str, nn.Module]:
        """The live network the policy acts with, under its :meth:`policy_state_dict` prefix: the target policy
        (the critic there serves only the actors' initial priorities)."""
        return {"policy": self.target_policy}

    def _nets(self) -> dict[str, nn.Module]:
        nets: dict[str, nn.Module] = {
            "policy": self.policy,
            "critic": self.critic,
            "target_policy": self.target_policy,
            "target_critic": self.target_critic,
            "duals": self.duals,
        }
        if self.obs_norm is not None:
            nets["obs_norm"] = self.obs_norm
        return nets

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"policy": self.policy_optimizer, "critic": self.critic_optimizer, "dual": self.dual_optimizer}

    def state_dict(self) -> dict[str, Tensor]:
        """Flat checkpoint: the four networks, the duals (and ``obs_norm/...``), the three optimisers, ``steps``."""
        return learner_state(self._nets(), self._optimizers(), self.steps)

    def load_state_dict(self, d: Mapping[str, Tensor]) -> None:
        """Restore a ``state_dict``; ValueError naming missing/unexpected/mismatched entries changes nothing."""
        self.steps = load_learner_state(
            d, self._nets(), self._optimizers, self._make_optimizers, f"{self.label} checkpoint"
        )
