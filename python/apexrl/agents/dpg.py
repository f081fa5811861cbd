"""Ape-X DPG (Horgan et al. 2018): deterministic policy gradients with n-step targets and prioritized replay.

Networks (tanh everywhere, as in the paper)::

    actor   pi(s)    = tanh(W3 tanh(W2 tanh(W1 s)))                 300 -> 200 -> action_dim, in [-1, 1]
    critic  Q(s, a)  = w3 . tanh(W2 [tanh(W1 s), a])                400 -> 300 -> 1

The action enters the critic at its second layer, concatenated with the first layer's output (as in DDPG,
Lillicrap et al. 2016). The last layer of both networks starts in U(-3e-3, 3e-3) (DDPG), so initial actions
and values are near 0 rather than saturated.

Learner update on a batch (s, a, R, D, s') with IS weights w (R the n-step return, D = gamma^n or 0)::

    q_next_target = Q'(s', pi'(s'))                  target critic at the target actor's action
    td_target     = R + D * q_next_target
    delta         = td_target - Q(s, a)
    critic_loss   = mean_i w_i * delta_i^2 / 2                       -> Adam step of the critic
    actor_loss    = -mean_i Q(s_i, pi(s_i))     (updated critic)     -> Adam step of the actor, with
                    dQ/da clipped before it flows into the actor
    priorities    = |delta| + priority_eps

dQ/da is clipped element-wise to [-1, 1] by default (``dqda_clip``: the Ape-X paper's "clipped to [-1, 1],
element-wise", trfl's ``dqda_clipping``), or per sample to an L2 norm of at most c (``dqda_clip_norm``: trfl's
``clip_norm=True``, Acme's D4PG). ``actor_grad_clip`` clips the actor's parameter gradients element-wise and
``grad_clip_norm`` both networks' gradients by global norm (Acme: 40). ``actor_loss_state="next_obs"`` takes
the actor's loss at s' instead of s (Acme's D4PG); ``actor_weights="target"`` sends actors the target networks
instead of the online ones (Acme's D4PG).

The actor loss is not IS-weighted (the IS correction is for the TD targets' sampling bias; the paper and D4PG
weight only the critic). Target networks are hard copies, refreshed after every ``target_update_period``-th
update (100 in the paper). Actors (``DPGPolicy``) add Gaussian noise N(0, sigma^2) and clip to [-1, 1], and
compute initial priorities with their local actor and critic standing in for the target networks.

``obs_norm=True`` (``--obs-norm on``; D4PG too): every network sees observations normalised by the running mean
and variance the learner keeps of its sampled batches, sent to actors with the weights and saved in checkpoints
(:mod:`apexrl.agents.normalize`). Off by default: the papers' raw observations.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, cast

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
from apexrl.agents.config import DPGConfig
from apexrl.agents.normalize import apply, load_norm, make_obs_norm, norm_layout, norm_tensors
from apexrl.agents.optim import make_adam
from apexrl.agents.validity import finite, in_range, invalid_items
from apexrl.nets import MLP, build_seeded
from apexrl.replay.wire.codec import TransitionSpec

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = [
    "DPGActor",
    "DPGCritic",
    "DPGLearner",
    "DPGPolicy",
    "actor_step",
    "clip_dqda",
    "critic_step",
    "dpg_transition_spec",
]

FINAL_LAYER_INIT = 3e-3
"""Final layers start in U(-3e-3, 3e-3) (DDPG)."""


class DPGActor(nn.Module):
    """Deterministic policy ``pi(s) = tanh(MLP_tanh(s))`` with actions in [-1, 1]."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...]):
        super().__init__()
        self.body = MLP(obs_dim, hidden, action_dim, activation=nn.Tanh)

    def forward(self, obs: Tensor) -> Tensor:
        return torch.tanh(self.body(obs))

    def reset_from(self, generator: torch.Generator) -> None:
        out = cast(nn.Linear, self.body.layers[-1])
        with torch.no_grad():
            out.weight.uniform_(-FINAL_LAYER_INIT, FINAL_LAYER_INIT, generator=generator)
            out.bias.uniform_(-FINAL_LAYER_INIT, FINAL_LAYER_INIT, generator=generator)


class DPGCritic(nn.Module):
    """``Q(s, a)``: ``s -> 400 -> tanh -> [., a] -> 300 -> tanh -> 1``; returns shape ``(B,)``."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, int]):
        super().__init__()
        self.obs_layer = nn.Linear(obs_dim, hidden[0])
        self.joint_layer = nn.Linear(hidden[0] + action_dim, hidden[1])
        self.out = nn.Linear(hidden[1], 1)

    def forward(self, obs: Tensor, action: Tensor) -> Tensor:
        h = torch.tanh(self.obs_layer(obs))
        h = torch.tanh(self.joint_layer(torch.cat([h, action], dim=1)))
        return self.out(h).squeeze(1)

    def reset_from(self, generator: torch.Generator) -> None:
        with torch.no_grad():
            self.out.weight.uniform_(-FINAL_LAYER_INIT, FINAL_LAYER_INIT, generator=generator)
            self.out.bias.uniform_(-FINAL_LAYER_INIT, FINAL_LAYER_INIT, generator=generator)


def _dims(env_spec: EnvSpec) -> tuple[int, int]:
    if not env_spec.action_dim or env_spec.action_dim < 1 or len(env_spec.obs_shape) != 1:
        raise ValueError(
            f"DPG needs vector observations and continuous actions; {env_spec.name} has obs_shape "
            f"{env_spec.obs_shape}, action_dim={env_spec.action_dim}"
        )
    return env_spec.obs_shape[0], env_spec.action_dim


def dpg_transition_spec(env_spec: EnvSpec) -> TransitionSpec:
    """``TransitionSpec.dpg(obs_dim, action_dim)``: float32 fields, no compression."""
    return TransitionSpec.dpg(*_dims(env_spec))


def _dpg_critic(obs_dim: int, action_dim: int, config: DPGConfig) -> nn.Module:
    return DPGCritic(obs_dim, action_dim, config.critic_hidden)


def _build(
    env_spec: EnvSpec, config: DPGConfig, seed: int, device: torch.device, make_critic=_dpg_critic
) -> tuple[DPGActor, nn.Module]:
    """The actor and ``make_critic(obs_dim, action_dim, config)`` (D4PG passes its distributional critic)."""
    obs_dim, action_dim = _dims(env_spec)
    generator = torch.Generator().manual_seed(seed)
    actor = build_seeded(lambda: DPGActor(obs_dim, action_dim, config.actor_hidden), generator, device)
    critic = build_seeded(lambda: make_critic(obs_dim, action_dim, config), generator, device)
    return actor, critic


def clip_dqda(dqda: Tensor, config: DPGConfig) -> Tensor:
    """dQ/da ``(B, action_dim)`` clipped as ``config`` says: every element to [-dqda_clip, dqda_clip], or each
    row scaled to an L2 norm of at most ``dqda_clip_norm`` (``row * c / max(|row|, c)``, trfl's
    ``clip_by_norm``)."""
    if config.dqda_clip is not None:
        dqda = dqda.clamp(-config.dqda_clip, config.dqda_clip)
    if config.dqda_clip_norm is not None:
        c = config.dqda_clip_norm
        dqda = dqda * (c / dqda.norm(dim=-1, keepdim=True).clamp_min(c))
    return dqda


def actor_step(actor: nn.Module, q_of, obs: Tensor, optimizer: torch.optim.Optimizer, config: DPGConfig) -> Tensor:
    """One Adam step of ``actor`` ascending ``mean_i q_of(s_i, pi(s_i))``; returns the loss ``-mean Q``.

    The gradient of -mean Q with respect to each action, -dQ/da / B, is clipped (:func:`clip_dqda`) before it
    flows on into the actor; ``actor_grad_clip`` then clips the actor's parameter gradients element-wise and
    ``grad_clip_norm`` their global norm.
    """
    action = actor(obs)
    q_pi = q_of(obs, action)
    dqda = clip_dqda(torch.autograd.grad(q_pi.sum(), action, retain_graph=True)[0], config)
    params = list(actor.parameters())
    grads = torch.autograd.grad(action, params, grad_outputs=-dqda / action.shape[0])
    param_clip = config.actor_grad_clip
    for p, g in zip(params, grads):
        p.grad = g if param_clip is None else g.clamp(-param_clip, param_clip)
    if config.grad_clip_norm is not None:
        nn.utils.clip_grad_norm_(params, config.grad_clip_norm)
    optimizer.step()
    return -q_pi.detach().mean()


def critic_step(critic: nn.Module, loss: Tensor, optimizer: torch.optim.Optimizer, config: DPGConfig) -> None:
    """One Adam step of ``critic`` down ``loss``, its gradient's global norm clipped to ``grad_clip_norm``."""
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if config.grad_clip_norm is not None:
        nn.utils.clip_grad_norm_(critic.parameters(), config.grad_clip_norm)
    optimizer.step()


def actor_obs(batch_obs: Tensor, batch_next_obs: Tensor, config: DPGConfig) -> Tensor:
    """The states the actor's loss is taken at (``actor_loss_state``)."""
    return batch_next_obs if config.actor_loss_state == "next_obs" else batch_obs


def _f32(x: np.ndarray, device: torch.device) -> Tensor:
    return as_tensor(x, device, torch.float32)


class DPGLearner:
    """The learner's side of Ape-X DPG: actor, critic, their target copies and two Adam optimisers.

    Args:
      env_spec: the environment (obs_dim, action_dim).
      config: hyper-parameters (paper defaults).
      device: torch device of the networks and the update.
      seed: initialises the networks (through a torch.Generator; the global RNG is not used).
    """

    metric_names: tuple[str, ...] = ("critic_loss", "actor_loss", "q_mean", "td_abs_mean")
    """Keys of the metrics dict ``update`` returns (columns of the learner's metrics.csv)."""
    label = "DPG"
    """Names the agent in error messages (D4PG subclasses this learner)."""
    make_critic = staticmethod(_dpg_critic)

    def __init__(
        self, env_spec: EnvSpec, config: DPGConfig | None = None, device: str | torch.device = "cpu", seed: int = 0
    ):
        self.config = config = config or DPGConfig()
        self.env_spec = env_spec
        self.device = torch.device(device)
        self.transition_spec = dpg_transition_spec(env_spec)
        self.actor, self.critic = _build(env_spec, config, seed, self.device, self.make_critic)
        self.target_actor = copy.deepcopy(self.actor).requires_grad_(False)
        self.target_critic = copy.deepcopy(self.critic).requires_grad_(False)
        self.obs_norm = make_obs_norm(_dims(env_spec)[0], config.obs_norm, self.device)
        """Running observation statistics (``obs_norm=True``; apexrl.agents.normalize), else None."""
        self._make_optimizers()
        self.steps = 0

    def normalise(self, obs: Tensor, next_obs: Tensor) -> tuple[Tensor, Tensor]:
        """With ``obs_norm``: fold the batch's ``obs`` into the running statistics, then normalise ``obs`` and
        ``next_obs`` with them; without: both unchanged."""
        if self.obs_norm is None:
            return obs, next_obs
        self.obs_norm.update(obs)
        return self.obs_norm(obs), self.obs_norm(next_obs)

    _rules = (
        in_range("action", -1, 1),
        finite("reward"),
        in_range("discount", 0, 1),
        finite("obs"),
        finite("next_obs"),
    )

    def invalid_items(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
        """Items ``update`` must not see: an action outside the actions' bounds [-1, 1] (or NaN), a non-finite
        reward or observation, a discount outside [0, 1] (it is gamma^n or 0). D4PG inherits them."""
        return invalid_items(batch, self._rules)

    def _make_optimizers(self) -> None:
        c = self.config
        self.actor_optimizer = make_adam(self.actor.parameters(), lr=c.actor_lr, eps=c.adam_eps)
        self.critic_optimizer = make_adam(self.critic.parameters(), lr=c.critic_lr, eps=c.adam_eps)

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """One critic step then one actor step (formulas in the module docstring).

        Returns the new priorities ``|delta| + priority_eps`` (float64) and the metrics ``critic_loss``,
        ``actor_loss``, ``q_mean`` (mean Q(s, a) before the step) and ``td_abs_mean``. Copies both target
        networks after every ``target_update_period``-th update.
        """
        check_batch(batch, self.transition_spec.names, weights)
        dev = self.device
        obs, action, next_obs = _f32(batch["obs"], dev), _f32(batch["action"], dev), _f32(batch["next_obs"], dev)
        reward, discount, w = _f32(batch["reward"], dev), _f32(batch["discount"], dev), _f32(weights, dev)
        obs, next_obs = self.normalise(obs, next_obs)

        # Critic: IS-weighted squared n-step TD error.
        with torch.no_grad():
            q_next_target = self.target_critic(next_obs, self.target_actor(next_obs))
            td_target = reward + discount * q_next_target
        q = self.critic(obs, action)
        delta = td_target - q
        critic_loss = (w * 0.5 * delta.square()).mean()
        c = self.config
        critic_step(self.critic, critic_loss, self.critic_optimizer, c)

        # Actor: ascend Q(s, pi(s)) through the updated critic, dQ/da clipped (dqda_clip / dqda_clip_norm).
        actor_loss = actor_step(self.actor, self.critic, actor_obs(obs, next_obs, c), self.actor_optimizer, c)

        self.steps += 1
        if self.steps % self.config.target_update_period == 0:
            self.target_actor.load_state_dict(self.actor.state_dict())
            self.target_critic.load_state_dict(self.critic.state_dict())

        td_abs = delta.detach().abs()
        stats = torch.stack([critic_loss.detach(), actor_loss.detach(), q.detach().mean(), td_abs.mean()]).tolist()
        metrics = dict(zip(self.metric_names, stats))
        return finite_priorities(td_abs, self.config.priority_eps), metrics

    # -- weights for actors, checkpoints ---------------------------------------------------------------------

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        """Actor and critic weights (``actor/...``, ``critic/...``), CPU: what ``DPGPolicy`` loads. Actors need
        the critic too, for their initial priorities. ``actor_weights="target"``: the target networks' weights
        under the same names."""
        norm = norm_tensors(self.obs_norm)
        if self.config.actor_weights == "target":
            return {
                **module_tensors("actor", self.target_actor),
                **module_tensors("critic", self.target_critic),
                **norm,
            }
        return {**module_tensors("actor", self.actor), **module_tensors("critic", self.critic), **norm}

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

    def policy_modules(self) -> dict[str, nn.Module]:
        """The live network the policy acts with, under its :meth:`policy_state_dict` prefix (the target actor
        with ``actor_weights="target"``); the critic there serves only the actors' initial priorities."""
        return {"actor": self.target_actor if self.config.actor_weights == "target" else self.actor}

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Flat checkpoint: the four networks, ``optim/actor/...``, ``optim/critic/...``, ``steps`` (int64), and
        with ``obs_norm`` the observation statistics ``obs_norm/...``."""
        return learner_state(self._nets(), self._optimizers(), self.steps)

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"actor": self.actor_optimizer, "critic": self.critic_optimizer}

    def load_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        """Restore a ``state_dict``; ValueError naming missing/unexpected/mismatched entries changes nothing."""
        self.steps = load_learner_state(
            d, self._nets(), self._optimizers, self._make_optimizers, f"{self.label} checkpoint"
        )


class DPGPolicy:
    """An actor's local Ape-X DPG policy: ``clip(pi(s) + sigma * N(0, I), -1, 1)``, or ``pi(s)`` in evaluation.

    Args:
      env_spec, config: as for the learner (same networks).
      sigma: std of the exploration noise; None: ``config.noise_sigma``.
      seed: initial weights (until the first ``load_policy_state_dict``) and the noise draws.
      device: torch device of the local networks (actors normally run on the CPU).
    """

    label = "DPG"
    make_critic = staticmethod(_dpg_critic)

    def __init__(
        self,
        env_spec: EnvSpec,
        config: DPGConfig | None = None,
        *,
        sigma: float | None = None,
        seed: int = 0,
        device: str | torch.device = "cpu",
        sigmas: Sequence[float] | None = None,
    ):
        self.config = config = config or DPGConfig()
        self.env_spec = env_spec
        self.device = torch.device(device)
        if sigmas is not None and sigma is None:
            sigma = sigmas[0]
        self.sigma = float(config.noise_sigma if sigma is None else sigma)
        self.sigmas = np.asarray([self.sigma] if sigmas is None else sigmas, np.float64)
        """One noise std per environment of a vectorised actor (``act_batch``)."""
        if not (
            np.isfinite(self.sigma)
            and self.sigma >= 0
            and np.all(np.isfinite(self.sigmas))
            and np.all(self.sigmas >= 0)
        ):
            raise ValueError(f"sigma must be a finite number >= 0, got {sigma!r} / {sigmas!r}")
        self.transition_spec = dpg_transition_spec(env_spec)
        self.actor, self.critic = _build(env_spec, config, seed, self.device, self.make_critic)
        self.actor.requires_grad_(False)
        self.critic.requires_grad_(False)
        self.obs_norm = make_obs_norm(_dims(env_spec)[0], config.obs_norm, self.device)
        """The learner's observation statistics, loaded with the weights (``obs_norm=True``), else None."""
        self.rng = np.random.default_rng(seed)

    @property
    def exploration(self) -> float:
        """This actor's noise sigma: smaller is greedier (``apexrl plot`` picks the greediest actor by it)."""
        return self.sigma

    @property
    def explorations(self) -> list[float]:
        return self.sigmas.tolist()

    @torch.inference_mode()
    def act_batch(self, obs: np.ndarray, explore: bool = True) -> list[np.ndarray]:
        """Actions for a stack of observations in one forward pass: environment ``j`` adds noise of std
        ``sigmas[j]`` (``explore=False``: none)."""
        obs = np.asarray(obs)
        if explore and len(obs) != len(self.sigmas):
            raise ValueError(f"{len(obs)} observations for {len(self.sigmas)} sigmas")
        actions = self.actor(apply(self.obs_norm, _f32(obs, self.device))).cpu().numpy().astype(np.float64)
        if explore:
            actions += self.sigmas[:, None] * self.rng.standard_normal(actions.shape)
        return list(np.clip(actions, -1.0, 1.0).astype(np.float32))

    @torch.inference_mode()
    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        """Action for one observation: float32 ``(action_dim,)`` in [-1, 1]; noise only when ``explore``."""
        action = self.actor(apply(self.obs_norm, _f32(np.asarray(obs)[None], self.device)))[0].cpu().numpy()
        if explore and self.sigma > 0:
            action = action + self.sigma * self.rng.standard_normal(action.shape)
        return np.clip(action, -1.0, 1.0).astype(np.float32)

    @torch.inference_mode()
    def initial_priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """``|R + D * Q(s', pi(s')) - Q(s, a)| + priority_eps`` with the local actor and critic (no target
        networks on actors), for a whole batch at once (float64)."""
        check_batch(batch, self.transition_spec.names)
        dev = self.device
        next_obs = apply(self.obs_norm, _f32(batch["next_obs"], dev))
        q_next = self.critic(next_obs, self.actor(next_obs))
        td_target = _f32(batch["reward"], dev) + _f32(batch["discount"], dev) * q_next
        q = self.critic(apply(self.obs_norm, _f32(batch["obs"], dev)), _f32(batch["action"], dev))
        return finite_priorities((td_target - q).abs(), self.config.priority_eps)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        return {
            **module_tensors("actor", self.actor),
            **module_tensors("critic", self.critic),
            **norm_tensors(self.obs_norm),
        }

    def load_policy_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        """Load the learner's ``policy_state_dict``; ValueError naming wrong names/shapes changes nothing."""
        expected = {
            **module_layout("actor", self.actor),
            **module_layout("critic", self.critic),
            **norm_layout(self.obs_norm),
        }
        check_tensors(expected, d, f"{self.label} policy weights")
        load_module_tensors("actor", self.actor, d)
        load_module_tensors("critic", self.critic, d)
        load_norm(self.obs_norm, d)


def _policy(env_spec: EnvSpec, config: DPGConfig, index: int, num_actors: int, seed: int) -> DPGPolicy:
    """Every actor uses the config's noise; evaluation acts without it (``explore=False``)."""
    return DPGPolicy(env_spec, config, sigma=config.noise_sigma, seed=seed)


def _batch_policy(env_spec: EnvSpec, config: DPGConfig, slots: Sequence[int], num_slots: int, seed: int) -> DPGPolicy:
    return DPGPolicy(env_spec, config, sigmas=[config.noise_sigma] * len(slots), seed=seed)


AGENT = AgentDef(
    name="dpg",
    description="Ape-X DPG: deterministic actor-critic, n-step targets (continuous actions)",
    config_class=DPGConfig,
    check_env=_dims,
    make_learner=lambda env_spec, config, device, seed: DPGLearner(env_spec, config, device=device, seed=seed),
    make_policy=_policy,
    make_batch_policy=_batch_policy,
)
