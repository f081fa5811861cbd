"""SAC (Haarnoja et al. 2018, Soft Actor-Critic Algorithms and Applications) on Ape-X's replay.

Networks (ReLU)::

    policy  (mu, log_std)(s) = W3 relu(W2 relu(W1 s))       256 -> 256 -> 2 x action_dim, log_std clamped to
                                                            [log_std_min, log_std_max]
            a = tanh(u),  u = mu + exp(log_std) * N(0, I)   squashed Gaussian, actions in (-1, 1)
            log pi(a|s) = sum_k [log N(u_k; mu_k, std_k) - log(1 - tanh(u_k)^2)]     (tanh correction)
    critics Q_j(s, a), j = 1, 2: TD3's twin critics (:class:`apexrl.agents.td3.TwinCritic`), 256 -> 256 -> 1

``log(1 - tanh(u)^2)`` is computed as ``2 (log 2 - u - softplus(-2u))``, the same value without the
cancellation of 1 - tanh(u)^2 near |a| = 1.

Learner update on a batch (s, a, R, D, s') with IS weights w; alpha = exp(log_alpha) at the start of the step::

    a', logp'  ~ pi(.|s')                                             fresh sample
    y          = R + D * (min(Q'_1(s', a'), Q'_2(s', a')) - alpha * logp')       soft clipped double-Q target
    delta_j    = y - Q_j(s, a)
    critic_loss = mean_i w_i * (delta_1i^2 + delta_2i^2) / 2                 -> Adam step of both critics
    a~, logp   ~ pi(.|s)   (reparameterised)
    actor_loss = mean_i alpha * logp_i - min_j Q_j(s_i, a~_i)  (updated critics)  -> Adam step of the policy
    alpha_loss = -mean_i log_alpha * (logp_i + target_entropy)   (logp detached)  -> Adam step of log_alpha
    target critics <- (1 - tau) target + tau online
    priorities = (|delta_1| + |delta_2|) / 2 + priority_eps

The temperature's gradient, d alpha_loss / d log_alpha = -mean(logp + target_entropy), is negative when the
policy's entropy -mean(logp) is below the target (default -|A|): gradient descent then raises alpha, and lowers
it when the entropy is above. Priorities are the mean over the two critics of |delta_j|, as TD3's (both critics
train on every item). The actor and temperature losses are not IS-weighted.

Actors (:class:`SACPolicy`) act by sampling from the policy, with no added noise; evaluation is deterministic,
``tanh(mu(s))``. Initial priorities on actors use the local policy and critics in place of the targets, with
the learner's alpha, which travels with the weights (``temperature/log_alpha``). Every actor explores the same
way, so ``exploration`` is 1 for all of them.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apexrl.agents.base import AgentDef
from apexrl.agents.common import (
    check_batch,
    check_tensors,
    learner_state,
    load_learner_state,
    load_module_tensors,
    module_layout,
    module_tensors,
)
from apexrl.agents.config import SACConfig
from apexrl.agents.normalize import ObsNormalizer, apply, load_norm, make_obs_norm, norm_layout, norm_tensors
from apexrl.agents.optim import make_adam
from apexrl.agents.td3 import (
    CONTINUOUS_RULES,
    TwinCritic,
    _f32,
    batch_tensors,
    continuous_dims,
    polyak_,
    step_adam,
    twin_priorities,
)
from apexrl.agents.validity import invalid_items
from apexrl.nets import MLP, build_seeded
from apexrl.replay.wire.codec import TransitionSpec

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = [
    "SACActor",
    "SACLearner",
    "SACPolicy",
    "Temperature",
    "soft_target",
    "squashed_log_prob",
    "temperature_loss",
]

_HALF_LOG_2PI = 0.5 * math.log(2 * math.pi)


def _dims(env_spec: EnvSpec) -> tuple[int, int]:
    return continuous_dims(env_spec, "SAC")


class SACActor(nn.Module):
    """Gaussian policy head: ``forward`` returns ``(mu, log_std)``, each ``(B, action_dim)``, log_std clamped."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], log_std_range: tuple[float, float]):
        super().__init__()
        self.body = MLP(obs_dim, hidden, 2 * action_dim, activation=nn.ReLU)
        self.log_std_range = log_std_range

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        mu, log_std = self.body(obs).chunk(2, dim=1)
        return mu, log_std.clamp(*self.log_std_range)


class Temperature(nn.Module):
    """``log_alpha``, the learned temperature's logarithm (a scalar parameter)."""

    def __init__(self, init_alpha: float):
        super().__init__()
        self.log_alpha = nn.Parameter(torch.tensor(math.log(init_alpha), dtype=torch.float32))

    @property
    def alpha(self) -> Tensor:
        return self.log_alpha.detach().exp()


def squashed_log_prob(u: Tensor, mu: Tensor, log_std: Tensor) -> Tensor:
    """``log pi(tanh(u) | s)`` per row ``(B,)``: the Gaussian log-density of ``u`` minus
    ``sum_k log(1 - tanh(u_k)^2)``, the log-determinant of the tanh squashing."""
    z = (u - mu) * torch.exp(-log_std)
    gaussian = (-0.5 * z.square() - log_std - _HALF_LOG_2PI).sum(dim=1)
    log_det = (2.0 * (math.log(2.0) - u - F.softplus(-2.0 * u))).sum(dim=1)
    return gaussian - log_det


def sample(mu: Tensor, log_std: Tensor, normal: Tensor) -> tuple[Tensor, Tensor]:
    """``(tanh(u), log pi)`` with ``u = mu + exp(log_std) * normal`` (reparameterised: differentiable in mu and
    log_std)."""
    u = mu + log_std.exp() * normal
    return torch.tanh(u), squashed_log_prob(u, mu, log_std)


def soft_target(
    reward: Tensor, discount: Tensor, q1_next: Tensor, q2_next: Tensor, alpha: Tensor, logp_next: Tensor
) -> Tensor:
    """``R + D * (min(Q'_1, Q'_2) - alpha * log pi(a'|s'))``: the soft clipped double-Q target."""
    return reward + discount * (torch.minimum(q1_next, q2_next) - alpha * logp_next)


def temperature_loss(log_alpha: Tensor, logp: Tensor, target_entropy: float) -> Tensor:
    """``-mean(log_alpha * (logp + target_entropy))`` with ``logp`` detached: its gradient in log_alpha is
    ``-mean(logp + target_entropy)`` (module docstring)."""
    return -(log_alpha * (logp.detach() + target_entropy)).mean()


def _build(env_spec: EnvSpec, config: SACConfig, seed: int, device: torch.device) -> tuple[SACActor, TwinCritic]:
    obs_dim, action_dim = _dims(env_spec)
    generator = torch.Generator().manual_seed(seed)
    log_std_range = (config.log_std_min, config.log_std_max)
    actor = build_seeded(lambda: SACActor(obs_dim, action_dim, config.actor_hidden, log_std_range), generator, device)
    critic = build_seeded(lambda: TwinCritic(obs_dim, action_dim, config.critic_hidden), generator, device)
    return actor, critic


class SACLearner:
    """The learner's side of SAC: policy, twin critics and their Polyak targets, the temperature, three Adam
    optimisers.

    Args:
      env_spec: the environment (obs_dim, action_dim).
      config: hyper-parameters (the paper's by default).
      device: torch device of the networks and the update.
      seed: initialises the networks and the policy's samples (the global RNG is not used).
    """

    metric_names: tuple[str, ...] = ("critic_loss", "actor_loss", "q_mean", "td_abs_mean", "alpha", "entropy")
    """``critic_loss``: mean_i w_i (delta_1^2 + delta_2^2) / 2; ``actor_loss``: mean alpha logp - min Q;
    ``q_mean``: mean Q_1(s, a) before the step; ``td_abs_mean``: mean (|delta_1| + |delta_2|) / 2; ``alpha``:
    the temperature after the step; ``entropy``: -mean logp of the policy's samples at s."""

    def __init__(
        self, env_spec: EnvSpec, config: SACConfig | None = None, device: str | torch.device = "cpu", seed: int = 0
    ):
        self.config = config = config or SACConfig()
        self.env_spec = env_spec
        self.device = torch.device(device)
        obs_dim, action_dim = _dims(env_spec)
        self.transition_spec = TransitionSpec.dpg(obs_dim, action_dim)
        self.target_entropy = float(-action_dim if config.target_entropy is None else config.target_entropy)
        self.actor, self.critic = _build(env_spec, config, seed, self.device)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.temperature = Temperature(config.init_alpha).to(self.device)
        self.obs_norm: ObsNormalizer | None = make_obs_norm(obs_dim, config.obs_norm, self.device)
        self.noise = torch.Generator(device=self.device).manual_seed(seed + 1)
        """Draws the policy's samples in the update."""
        self._make_optimizers()
        self.steps = 0

    def invalid_items(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
        """Items ``update`` must not see (as DPG's)."""
        return invalid_items(batch, CONTINUOUS_RULES)

    def _make_optimizers(self) -> None:
        c = self.config
        self.actor_optimizer = make_adam(self.actor.parameters(), lr=c.actor_lr, eps=c.adam_eps)
        self.critic_optimizer = make_adam(self.critic.parameters(), lr=c.critic_lr, eps=c.adam_eps)
        self.alpha_optimizer = make_adam(self.temperature.parameters(), lr=c.alpha_lr, eps=c.adam_eps)

    def normalise(self, obs: Tensor, next_obs: Tensor) -> tuple[Tensor, Tensor]:
        """With ``obs_norm``: fold ``obs`` into the statistics, then normalise both; without: unchanged."""
        if self.obs_norm is None:
            return obs, next_obs
        self.obs_norm.update(obs)
        return self.obs_norm(obs), self.obs_norm(next_obs)

    def _normal(self, like: Tensor) -> Tensor:
        return torch.randn(like.shape, generator=self.noise, device=self.device)

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """One step of the critics, the policy and the temperature, then a Polyak step of the target critics
        (module docstring). Returns (priorities float64, metrics)."""
        check_batch(batch, self.transition_spec.names, weights)
        c = self.config
        obs, action, reward, discount, next_obs = batch_tensors(batch, self.device)
        obs, next_obs = self.normalise(obs, next_obs)
        w = _f32(weights, self.device)
        alpha = self.temperature.alpha

        with torch.no_grad():
            mu, log_std = self.actor(next_obs)
            next_action, logp_next = sample(mu, log_std, self._normal(mu))
            q1_next, q2_next = self.target_critic(next_obs, next_action)
            y = soft_target(reward, discount, q1_next, q2_next, alpha, logp_next)
        q1, q2 = self.critic(obs, action)
        delta1, delta2 = y - q1, y - q2
        critic_loss = (w * 0.5 * (delta1.square() + delta2.square())).mean()
        step_adam(list(self.critic.parameters()), critic_loss, self.critic_optimizer)

        mu, log_std = self.actor(obs)
        new_action, logp = sample(mu, log_std, self._normal(mu))
        actor_loss = (alpha * logp - torch.minimum(*self.critic(obs, new_action))).mean()
        step_adam(list(self.actor.parameters()), actor_loss, self.actor_optimizer)

        alpha_loss = temperature_loss(self.temperature.log_alpha, logp, self.target_entropy)
        step_adam(list(self.temperature.parameters()), alpha_loss, self.alpha_optimizer)

        polyak_(self.target_critic, self.critic, c.tau)
        self.steps += 1

        priorities = twin_priorities(delta1, delta2, c.priority_eps)
        stats = torch.stack(
            [
                critic_loss.detach(),
                actor_loss.detach(),
                q1.detach().mean(),
                self.temperature.alpha,
                -logp.detach().mean(),
            ]
        ).tolist()
        metrics = {
            "critic_loss": stats[0],
            "actor_loss": stats[1],
            "q_mean": stats[2],
            "td_abs_mean": float(priorities.mean() - c.priority_eps),
            "alpha": stats[3],
            "entropy": stats[4],
        }
        return priorities, metrics

    # -- weights for actors, checkpoints ---------------------------------------------------------------------

    def policy_state_dict(self) -> dict[str, Tensor]:
        """``actor/...``, ``critic/...``, ``temperature/log_alpha`` (actors' initial priorities need the critics
        and alpha) and, with ``obs_norm``, ``obs_norm/...``: what :class:`SACPolicy` loads."""
        return {
            **module_tensors("actor", self.actor),
            **module_tensors("critic", self.critic),
            **module_tensors("temperature", self.temperature),
            **norm_tensors(self.obs_norm),
        }

    def policy_modules(self) -> dict[str, nn.Module]:
        """The live network the policy acts with, under its :meth:`policy_state_dict` prefix (the critics and
        the temperature there serve only the actors' initial priorities)."""
        return {"actor": self.actor}

    def _nets(self) -> dict[str, nn.Module]:
        nets: dict[str, nn.Module] = {
            "actor": self.actor,
            "critic": self.critic,
            "target_critic": self.target_critic,
            "temperature": self.temperature,
        }
        if self.obs_norm is not None:
            nets["obs_norm"] = self.obs_norm
        return nets

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer, "alpha": self.alpha_optimizer}

    def state_dict(self) -> dict[str, Tensor]:
        """Flat checkpoint: the networks, the temperature (and ``obs_norm/...``), the three optimisers,
        ``steps`` (int64)."""
        return learner_state(self._nets(), self._optimizers(), self.steps)

    def load_state_dict(self, d: Mapping[str, Tensor]) -> None:
        """Restore a ``state_dict``; ValueError naming missing/unexpected/mismatched entries changes nothing."""
        self.steps = load_learner_state(d, self._nets(), self._optimizers, self._make_optimizers, "SAC checkpoint")


class SACPolicy:
    """An actor's local SAC policy: ``tanh(u)``, u drawn from the Gaussian policy, or ``tanh(mu(s))`` in
    evaluation.

    Args:
      env_spec, config: as for the learner (same networks).
      num_envs: environments of a vectorised actor (``act_batch``).
      seed: initial weights (until the first ``load_policy_state_dict``) and the policy's draws.
      device: torch device of the local networks.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        config: SACConfig | None = None,
        *,
        num_envs: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ):
        self.config = config = config or SACConfig()
        self.device = torch.device(device)
        obs_dim, action_dim = _dims(env_spec)
        self.transition_spec = TransitionSpec.dpg(obs_dim, action_dim)
        self.actor, self.critic = _build(env_spec, config, seed, self.device)
        self.temperature = Temperature(config.init_alpha).to(self.device)
        for net in (self.actor, self.critic, self.temperature):
            net.requires_grad_(False)
        self.obs_norm = make_obs_norm(obs_dim, config.obs_norm, self.device)
        self.num_envs = int(num_envs)
        self.noise = torch.Generator(device=self.device).manual_seed(seed)

    exploration = 1.0
    """Every SAC actor samples from the same policy: one exploration level for all (episodes.csv)."""

    @property
    def explorations(self) -> list[float]:
        return [1.0] * self.num_envs

    def _actions(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        mu, log_std = self.actor(apply(self.obs_norm, _f32(obs, self.device)))
        if explore:
            action = sample(mu, log_std, torch.randn(mu.shape, generator=self.noise, device=self.device))[0]
        else:
            action = torch.tanh(mu)
        return action.cpu().numpy().astype(np.float32)

    @torch.inference_mode()
    def act_batch(self, obs: np.ndarray, explore: bool = True) -> list[np.ndarray]:
        """Actions for stacked observations in one forward pass (each environment its own draw)."""
        return list(self._actions(np.asarray(obs), explore))

    @torch.inference_mode()
    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        """Action for one observation: float32 ``(action_dim,)`` in [-1, 1]; a draw from the policy when
        ``explore``, ``tanh(mu(s))`` otherwise."""
        return self._actions(np.asarray(obs)[None], explore)[0]

    @torch.inference_mode()
    def initial_priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """The learner's priority with the local policy and critics standing in for the targets:
        ``(|y - Q_1(s, a)| + |y - Q_2(s, a)|) / 2 + eps``, y the soft target with one draw a' ~ pi(.|s')."""
        check_batch(batch, self.transition_spec.names)
        obs, action, reward, discount, next_obs = batch_tensors(batch, self.device)
        obs, next_obs = apply(self.obs_norm, obs), apply(self.obs_norm, next_obs)
        mu, log_std = self.actor(next_obs)
        next_action, logp_next = sample(mu, log_std, torch.randn(mu.shape, generator=self.noise, device=self.device))
        q1_next, q2_next = self.critic(next_obs, next_action)
        y = soft_target(reward, discount, q1_next, q2_next, self.temperature.alpha, logp_next)
        q1, q2 = self.critic(obs, action)
        return twin_priorities(y - q1, y - q2, self.config.priority_eps)

    def _parts(self) -> dict[str, nn.Module]:
        return {"actor": self.actor, "critic": self.critic, "temperature": self.temperature}

    def policy_state_dict(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for name, net in self._parts().items():
            out.update(module_tensors(name, net))
        return {**out, **norm_tensors(self.obs_norm)}

    def load_policy_state_dict(self, d: Mapping[str, Tensor]) -> None:
        """Load the learner's ``policy_state_dict``; ValueError naming wrong names/shapes changes nothing."""
        expected: dict[str, Tensor] = dict(norm_layout(self.obs_norm))
        for name, net in self._parts().items():
            expected.update(module_layout(name, net))
        check_tensors(expected, d, "SAC policy weights")
        for name, net in self._parts().items():
            load_module_tensors(name, net, d)
        load_norm(self.obs_norm, d)


def _policy(env_spec: EnvSpec, config: SACConfig, index: int, num_actors: int, seed: int) -> SACPolicy:
    return SACPolicy(env_spec, config, seed=seed)


def _batch_policy(env_spec: EnvSpec, config: SACConfig, slots: Sequence[int], num_slots: int, seed: int) -> SACPolicy:
    return SACPolicy(env_spec, config, num_envs=len(slots), seed=seed)


AGENT = AgentDef(
    name="sac",
    description="SAC: squashed Gaussian policy, twin critics, learned temperature (target entropy -|A|) "
    "(continuous actions)",
    config_class=SACConfig,
    check_env=_dims,
    make_learner=lambda env_spec, config, device, seed: SACLearner(env_spec, config, device=device, seed=seed),
    make_policy=_policy,
    make_batch_policy=_batch_policy,
)
