"""TD3 (Fujimoto et al. 2018): twin delayed deep deterministic policy gradients on Ape-X's replay.

Networks (ReLU, as in the paper)::

    actor   pi(s)        = tanh(W3 relu(W2 relu(W1 s)))             400 -> 300 -> action_dim, in [-1, 1]
    critics Q_j(s, a)    = w3 . relu(W2 relu(W1 [s, a]))   j = 1, 2   400 -> 300 -> 1, the action at the input

Learner update on a batch (s, a, R, D, s') with IS weights w (R the n-step return, D = gamma^n or 0)::

    eps        = clip(target_noise * N(0, I), -target_noise_clip, target_noise_clip)    target policy smoothing
    a'         = clip(pi'(s') + eps, -1, 1)
    y          = R + D * min(Q'_1(s', a'), Q'_2(s', a'))                               clipped double Q
    delta_j    = y - Q_j(s, a)
    critic_loss = mean_i w_i * (delta_1i^2 + delta_2i^2) / 2                 -> Adam step of both critics
    every policy_delay-th update (delayed policy updates):
        actor_loss = -mean_i Q_1(s_i, pi(s_i))    (updated critic)           -> Adam step of the actor
        targets    <- (1 - tau) targets + tau online       (actor and both critics, Polyak)
    priorities = (|delta_1| + |delta_2|) / 2 + priority_eps

Priorities: the mean over the two critics of |delta_j|, both taken against the one clipped double-Q target.
Both critics are trained on every sampled item, so the item's priority is what both still have to learn; the
first critic alone would ignore half of the loss the step reduces. The actor loss is not IS-weighted (as DPG's).
``metrics["actor_loss"]`` is the latest actor loss (it only changes at delayed updates).

Actors (:class:`TD3Policy`) add Gaussian noise N(0, noise_sigma^2) (0.1 in the paper), clip to [-1, 1], and
compute initial priorities with their local actor and critics standing in for the targets (no smoothing noise);
evaluation is noiseless. With ``obs_norm`` every network sees normalised observations (apexrl.agents.normalize).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.agents.base import AgentDef
from apexrl.agents.common import (
    as_tensor,
    check_batch,
    check_tensors,
    finite_priorities,
    learner_state,
    load_learner_state,
    load_module_tensors,
    module_layout,
    module_tensors,
)
from apexrl.agents.config import TD3Config
from apexrl.agents.normalize import ObsNormalizer, apply, load_norm, make_obs_norm, norm_layout, norm_tensors
from apexrl.agents.optim import make_adam
from apexrl.agents.validity import finite, in_range, invalid_items
from apexrl.nets import MLP, build_seeded
from apexrl.replay.wire.codec import TransitionSpec

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = [
    "TD3Actor",
    "TD3Learner",
    "TD3Policy",
    "TwinCritic",
    "clipped_double_q_target",
    "polyak_",
    "smoothed_target_action",
]


class TD3Actor(nn.Module):
    """Deterministic policy ``tanh(MLP_relu(s))`` with actions in [-1, 1]."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...]):
        super().__init__()
        self.body = MLP(obs_dim, hidden, action_dim, activation=nn.ReLU)

    def forward(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.body(obs))


class TwinCritic(nn.Module):
    """Two independent critics ``Q_j([s, a])`` (ReLU MLPs, the action at the input); ``forward`` returns both,
    each shaped ``(B,)``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...]):
        super().__init__()
        self.q1 = MLP(obs_dim + action_dim, hidden, 1, activation=nn.ReLU)
        self.q2 = MLP(obs_dim + action_dim, hidden, 1, activation=nn.ReLU)

    def forward(self, obs: Tensor, action: Tensor) -> tuple[Tensor, Tensor]:
        x = torch.cat([obs, action], dim=1)
        return self.q1(x).squeeze(1), self.q2(x).squeeze(1)

    def first(self, obs: Tensor, action: Tensor) -> Tensor:
        """``Q_1(s, a)`` alone (TD3's actor loss)."""
        return self.q1(torch.cat([obs, action], dim=1)).squeeze(1)


def continuous_dims(env_spec: EnvSpec, label: str) -> tuple[int, int]:
    """(obs_dim, action_dim); ValueError unless vector observations and continuous actions."""
    if not env_spec.action_dim or env_spec.action_dim < 1 or len(env_spec.obs_shape) != 1:
        raise ValueError(
            f"{label} needs vector observations and continuous actions; {env_spec.name} has obs_shape "
            f"{env_spec.obs_shape}, action_dim={env_spec.action_dim}"
        )
    return env_spec.obs_shape[0], env_spec.action_dim


def _dims(env_spec: EnvSpec) -> tuple[int, int]:
    return continuous_dims(env_spec, "TD3")


def smoothed_target_action(target_action: Tensor, normal: Tensor, config: TD3Config) -> Tensor:
    """``clip(target_action + clip(target_noise * normal, -c, c), -1, 1)``, ``normal`` standard normal draws
    shaped like the action, c = ``target_noise_clip`` (target policy smoothing)."""
    eps = (config.target_noise * normal).clamp(-config.target_noise_clip, config.target_noise_clip)
    return (target_action + eps).clamp(-1.0, 1.0)


def clipped_double_q_target(reward: Tensor, discount: Tensor, q1_next: Tensor, q2_next: Tensor) -> Tensor:
    """``R + D * min(Q'_1, Q'_2)``: the clipped double-Q target."""
    return reward + discount * torch.minimum(q1_next, q2_next)


@torch.no_grad()
def polyak_(target: nn.Module, online: nn.Module, tau: float) -> None:
    """``target <- (1 - tau) target + tau online``, parameter by parameter."""
    for t, p in zip(target.parameters(), online.parameters()):
        t.lerp_(p, tau)


def step_adam(params: Sequence[Tensor], loss: Tensor, optimizer: torch.optim.Optimizer) -> None:
    """One optimiser step of ``params`` down ``loss`` (gradients of other tensors untouched)."""
    grads = torch.autograd.grad(loss, list(params))
    for p, g in zip(params, grads):
        p.grad = g
    optimizer.step()


def twin_priorities(delta1: Tensor, delta2: Tensor, eps: float) -> np.ndarray:
    """``(|delta_1| + |delta_2|) / 2 + eps`` as float64 (ValueError if not finite)."""
    return finite_priorities(0.5 * (delta1.detach().abs() + delta2.detach().abs()), eps)


def _f32(x: np.ndarray, device: torch.device) -> Tensor:
    return as_tensor(x, device, torch.float32)


def batch_tensors(batch: Mapping[str, np.ndarray], device: torch.device) -> list[Tensor]:
    """obs, action, reward, discount, next_obs as float32 tensors on ``device``."""
    return [_f32(batch[k], device) for k in ("obs", "action", "reward", "discount", "next_obs")]


CONTINUOUS_RULES = (
    in_range("action", -1, 1),
    finite("reward"),
    in_range("discount", 0, 1),
    finite("obs"),
    finite("next_obs"),
)
"""The values a continuous-control agent trains on (as DPG's)."""


class TD3Learner:
    """The learner's side of TD3: actor, twin critics, their Polyak targets, two Adam optimisers.

    Args:
      env_spec: the environment (obs_dim, action_dim).
      config: hyper-parameters (the paper's by default).
      device: torch device of the networks and the update.
      seed: initialises the networks and the smoothing noise (the global RNG is not used).
    """

    metric_names: tuple[str, ...] = ("critic_loss", "actor_loss", "q_mean", "td_abs_mean")
    """``critic_loss``: mean_i w_i (delta_1^2 + delta_2^2) / 2; ``actor_loss``: the latest -mean Q_1(s, pi(s));
    ``q_mean``: mean Q_1(s, a) before the step; ``td_abs_mean``: mean (|delta_1| + |delta_2|) / 2."""

    def __init__(
        self, env_spec: EnvSpec, config: TD3Config | None = None, device: str | torch.device = "cpu", seed: int = 0
    ):
        self.config = config = config or TD3Config()
        self.env_spec = env_spec
        self.device = torch.device(device)
        obs_dim, action_dim = _dims(env_spec)
        self.transition_spec = TransitionSpec.dpg(obs_dim, action_dim)
        generator = torch.Generator().manual_seed(seed)
        self.actor = build_seeded(lambda: TD3Actor(obs_dim, action_dim, config.actor_hidden), generator, self.device)
        self.critic = build_seeded(
            lambda: TwinCritic(obs_dim, action_dim, config.critic_hidden), generator, self.device
        )
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.obs_norm: ObsNormalizer | None = make_obs_norm(obs_dim, config.obs_norm, self.device)
        self.noise = torch.Generator(device=self.device).manual_seed(seed + 1)
        """Draws the target policy smoothing noise."""
        self._make_optimizers()
        self.steps = 0
        self.last_actor_loss = float("nan")

    def invalid_items(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
        """Items ``update`` must not see (as DPG's): actions outside [-1, 1], non-finite rewards or observations,
        discounts outside [0, 1]."""
        return invalid_items(batch, CONTINUOUS_RULES)

    def _make_optimizers(self) -> None:
        c = self.config
        self.actor_optimizer = make_adam(self.actor.parameters(), lr=c.actor_lr, eps=c.adam_eps)
        self.critic_optimizer = make_adam(self.critic.parameters(), lr=c.critic_lr, eps=c.adam_eps)

    def normalise(self, obs: Tensor, next_obs: Tensor) -> tuple[Tensor, Tensor]:
        """With ``obs_norm``: fold ``obs`` into the statistics, then normalise both; without: unchanged."""
        if self.obs_norm is None:
            return obs, next_obs
        self.obs_norm.update(obs)
        return self.obs_norm(obs), self.obs_norm(next_obs)

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """One critic step, and every ``policy_delay``-th call an actor step and a Polyak step of the targets
        (module docstring). Returns (priorities float64, metrics)."""
        check_batch(batch, self.transition_spec.names, weights)
        c = self.config
        obs, action, reward, discount, next_obs = batch_tensors(batch, self.device)
        obs, next_obs = self.normalise(obs, next_obs)
        w = _f32(weights, self.device)

        with torch.no_grad():
            target_action = self.target_actor(next_obs)
            normal = torch.randn(target_action.shape, generator=self.noise, device=self.device)
            next_action = smoothed_target_action(target_action, normal, c)
            y = clipped_double_q_target(reward, discount, *self.target_critic(next_obs, next_action))
        q1, q2 = self.critic(obs, action)
        delta1, delta2 = y - q1, y - q2
        critic_loss = (w * 0.5 * (delta1.square() + delta2.square())).mean()
        step_adam(list(self.critic.parameters()), critic_loss, self.critic_optimizer)

        self.steps += 1
        if self.steps % c.policy_delay == 0:
            # Gradients of the actor's parameters only: the critics' are neither computed nor touched.
            actor_loss = -self.critic.first(obs, self.actor(obs)).mean()
            step_adam(list(self.actor.parameters()), actor_loss, self.actor_optimizer)
            self.last_actor_loss = float(actor_loss.detach())
            polyak_(self.target_actor, self.actor, c.tau)
            polyak_(self.target_critic, self.critic, c.tau)

        priorities = twin_priorities(delta1, delta2, c.priority_eps)
        stats = torch.stack([critic_loss.detach(), q1.detach().mean()]).tolist()
        metrics = {
            "critic_loss": stats[0],
            "actor_loss": self.last_actor_loss,
            "q_mean": stats[1],
            "td_abs_mean": float(priorities.mean() - c.priority_eps),
        }
        return priorities, metrics

    # -- weights for actors, checkpoints ---------------------------------------------------------------------

    def policy_state_dict(self) -> dict[str, Tensor]:
        """``actor/...``, ``critic/...`` (actors need both critics for initial priorities) and, with
        ``obs_norm``, ``obs_norm/...``: what :class:`TD3Policy` loads."""
        return {
            **module_tensors("actor", self.actor),
            **module_tensors("critic", self.critic),
            **norm_tensors(self.obs_norm),
        }

    def policy_modules(self) -> dict[str, nn.Module]:
        """The live network the policy acts with, under its :meth:`policy_state_dict` prefix (the critics there
        serve only the actors' initial priorities)."""
        return {"actor": self.actor}

    def _nets(self) -> dict[str, nn.Module]:
        nets: dict[str, nn.Module] = {
            "actor": self.actor,
            "critic": self.critic,
            "target_actor": self.target_actor,
            "target_critic": self.target_critic,
        }
        if self.obs_norm is not None:
            nets["obs_norm"] = self.obs_norm
        return nets

    def state_dict(self) -> dict[str, Tensor]:
        """Flat checkpoint: the networks (and ``obs_norm/...``), both optimisers, ``steps`` (int64)."""
        return learner_state(self._nets(), self._optimizers(), self.steps)

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer}

    def load_state_dict(self, d: Mapping[str, Tensor]) -> None:
        """Restore a ``state_dict``; ValueError naming missing/unexpected/mismatched entries changes nothing."""
        self.steps = load_learner_state(d, self._nets(), self._optimizers, self._make_optimizers, "TD3 checkpoint")


class TD3Policy:
    """An actor's local TD3 policy: ``clip(pi(s) + sigma * N(0, I), -1, 1)``, or ``pi(s)`` in evaluation.

    Args:
      env_spec, config: as for the learner (same networks).
      sigmas: one noise std per environment of a vectorised actor; None: ``[config.noise_sigma]``.
      seed: initial weights (until the first ``load_policy_state_dict``) and the noise draws.
      device: torch device of the local networks.
    """

    def __init__(
        self,
        env_spec: EnvSpec,
        config: TD3Config | None = None,
        *,
        sigmas: Sequence[float] | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
    ):
        self.config = config = config or TD3Config()
        self.device = torch.device(device)
        obs_dim, action_dim = _dims(env_spec)
        self.transition_spec = TransitionSpec.dpg(obs_dim, action_dim)
        self.sigmas = np.asarray([config.noise_sigma] if sigmas is None else sigmas, np.float64)
        if not (np.all(np.isfinite(self.sigmas)) and np.all(self.sigmas >= 0)):
            raise ValueError(f"noise sigmas must be finite numbers >= 0, got {sigmas!r}")
        generator = torch.Generator().manual_seed(seed)
        self.actor = build_seeded(lambda: TD3Actor(obs_dim, action_dim, config.actor_hidden), generator, self.device)
        self.critic = build_seeded(
            lambda: TwinCritic(obs_dim, action_dim, config.critic_hidden), generator, self.device
        )
        self.actor.requires_grad_(False)
        self.critic.requires_grad_(False)
        self.obs_norm = make_obs_norm(obs_dim, config.obs_norm, self.device)
        self.rng = np.random.default_rng(seed)

    @property
    def exploration(self) -> float:
        """The first environment's noise sigma (smaller is greedier)."""
        return float(self.sigmas[0])

    @property
    def explorations(self) -> list[float]:
        return self.sigmas.tolist()

    @torch.inference_mode()
    def act_batch(self, obs: np.ndarray, explore: bool = True) -> list[np.ndarray]:
        """Actions for stacked observations in one forward pass, environment ``j`` with noise ``sigmas[j]``."""
        obs = np.asarray(obs)
        if explore and len(obs) != len(self.sigmas):
            raise ValueError(f"{len(obs)} observations for {len(self.sigmas)} sigmas")
        actions = self.actor(apply(self.obs_norm, _f32(obs, self.device))).cpu().numpy().astype(np.float64)
        if explore:
            actions += self.sigmas[:, None] * self.rng.standard_normal(actions.shape)
        return list(np.clip(actions, -1.0, 1.0).astype(np.float32))

    @torch.inference_mode()
    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        """Action for one observation: float32 ``(action_dim,)`` in [-1, 1]; noise (``sigmas[0]``) only when
        ``explore``."""
        x = apply(self.obs_norm, _f32(np.asarray(obs)[None], self.device))
        action = self.actor(x)[0].cpu().numpy().astype(np.float64)
        if explore and self.sigmas[0] > 0:
            action += self.sigmas[0] * self.rng.standard_normal(action.shape)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    @torch.inference_mode()
    def initial_priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """The learner's priority with the local actor and critics standing in for the targets and no smoothing
        noise: ``(|y - Q_1(s, a)| + |y - Q_2(s, a)|) / 2 + eps``, ``y = R + D min_j Q_j(s', pi(s'))``."""
        check_batch(batch, self.transition_spec.names)
        obs, action, reward, discount, next_obs = batch_tensors(batch, self.device)
        obs, next_obs = apply(self.obs_norm, obs), apply(self.obs_norm, next_obs)
        y = clipped_double_q_target(reward, discount, *self.critic(next_obs, self.actor(next_obs)))
        q1, q2 = self.critic(obs, action)
        return twin_priorities(y - q1, y - q2, self.config.priority_eps)

    def policy_state_dict(self) -> dict[str, Tensor]:
        return {
            **module_tensors("actor", self.actor),
            **module_tensors("critic", self.critic),
            **norm_tensors(self.obs_norm),
        }

    def load_policy_state_dict(self, d: Mapping[str, Tensor]) -> None:
        """Load the learner's ``policy_state_dict``; ValueError naming wrong names/shapes changes nothing."""
        expected = {
            **module_layout("actor", self.actor),
            **module_layout("critic", self.critic),
            **norm_layout(self.obs_norm),
        }
        check_tensors(expected, d, "TD3 policy weights")
        load_module_tensors("actor", self.actor, d)
        load_module_tensors("critic", self.critic, d)
        load_norm(self.obs_norm, d)


def _policy(env_spec: EnvSpec, config: TD3Config, index: int, num_actors: int, seed: int) -> TD3Policy:
    """Every actor uses the config's noise (the paper's fixed N(0, 0.1)); evaluation acts without it."""
    return TD3Policy(env_spec, config, seed=seed)


def _batch_policy(env_spec: EnvSpec, config: TD3Config, slots: Sequence[int], num_slots: int, seed: int) -> TD3Policy:
    return TD3Policy(env_spec, config, sigmas=[config.noise_sigma] * len(slots), seed=seed)


AGENT = AgentDef(
    name="td3",
    description="TD3: deterministic actor, twin critics (clipped double Q), delayed policy updates, target "
    "policy smoothing (continuous actions)",
    config_class=TD3Config,
    check_env=_dims,
    make_learner=lambda env_spec, config, device, seed: TD3Learner(env_spec, config, device=device, seed=seed),
    make_policy=_policy,
    make_batch_policy=_batch_policy,
)
