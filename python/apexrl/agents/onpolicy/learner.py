"""The learner's side shared by the on-policy agents (:class:`OnPolicyLearner`): from a popped batch to the
flat trained steps with their advantages and returns, the critic's regression, the policy lag, weights and
checkpoints. Each agent adds its actor update (``_train_actor``); IMPALA replaces the advantage estimate.

One ``update`` per popped batch, as Tonic's ``_update`` per segment: values of every step from the current
critic, GAE advantages and lambda-returns, advantages normalised over the batch, the agent's actor update, then
``critic_iterations`` regression steps of the critic on the returns (full batch, or shuffled minibatches of
``minibatch_size`` steps), then the observation statistics take the batch's observations.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.agents.common import learner_state, load_learner_state
from apexrl.agents.normalize import apply, make_obs_norm
from apexrl.agents.onpolicy.lag import LAG_METRICS, policy_lag
from apexrl.agents.onpolicy.nets import Actor, Critic
from apexrl.agents.onpolicy.policy import obs_dim, policy_tensors
from apexrl.agents.onpolicy.returns import gae
from apexrl.agents.validity import finite, in_range, invalid_items

if TYPE_CHECKING:
    from apexrl.agents.onpolicy.config import OnPolicyConfig
    from apexrl.envs import EnvSpec

__all__ = ["OnPolicyLearner", "Steps"]


class Steps(dict):
    """The trained steps of a batch, flat: ``obs`` (M, obs_dim) (normalised), ``action``, ``logp`` (behaviour),
    ``adv``, ``ret``, ``value`` (the critic's before the update) and any behaviour distribution parameters."""

    @property
    def size(self) -> int:
        return int(self["adv"].shape[0])


class OnPolicyLearner:
    """An on-policy learner (module docstring); subclasses set ``actor_metrics`` and ``_train_actor``."""

    actor_metrics: tuple[str, ...] = ()

    def __init__(self, spec: EnvSpec, config: OnPolicyConfig, device: torch.device, seed: int):
        torch.manual_seed(seed)
        self.spec, self.config, self.device = spec, config, device
        self.discrete = spec.num_actions is not None
        self.actor = Actor(obs_dim(spec), config.hidden, spec.num_actions, spec.action_dim).to(device)
        self.critic = Critic(obs_dim(spec), config.hidden).to(device)
        self.obs_norm = make_obs_norm(obs_dim(spec), config.obs_norm, device)
        self.rng = np.random.default_rng(seed)
        self.steps = 0
        self.metric_names = (*self.actor_metrics, "critic_loss", "value_mean", *LAG_METRICS)
        self._make_optimizers()

    def _make_optimizers(self) -> None:
        self.critic_opt = torch.optim.Adam(self.critic.parameters(), lr=self.config.critic_lr)

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"critic": self.critic_opt}

    def _nets(self) -> dict[str, nn.Module]:
        nets: dict[str, nn.Module] = {"actor": self.actor, "critic": self.critic}
        if self.obs_norm is not None:
            nets["obs_norm"] = self.obs_norm
        return nets

    # ------------------------------------------------------------------------------------------ update

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        """One update on a popped batch (module docstring); the priorities returned are ones (a queue takes
        none back)."""
        del weights  # a queue pops uniformly: every IS weight is 1
        trained = np.asarray(batch["trained"], bool)
        metrics = policy_lag(self.steps, batch["version"], trained)
        if trained.any():
            steps = self._steps(batch, trained)
            metrics.update(self._train_actor(steps))
            metrics.update(self._train_critic(steps))
            if self.obs_norm is not None:
                self.obs_norm.update(self._raw_obs(batch)[torch.as_tensor(trained, device=self.device)])
        self.steps += 1
        return np.ones(len(trained)), metrics

    def _raw_obs(self, batch: Mapping[str, np.ndarray]) -> Tensor:
        obs = np.asarray(batch["obs"], np.float32)
        return torch.as_tensor(obs.reshape(*obs.shape[:2], -1), device=self.device)

    def _tensor(self, x: np.ndarray, dtype: torch.dtype = torch.float32) -> Tensor:
        return torch.as_tensor(np.asarray(x), device=self.device).to(dtype)

    @torch.no_grad()
    def _values(self, obs: Tensor) -> Tensor:
        """V of every step of the batch (n, T) with the current critic (Tonic evaluates its segment so too)."""
        n, t = obs.shape[:2]
        return self.critic(obs.reshape(n * t, -1)).reshape(n, t)

    def _advantages(
        self, batch: Mapping[str, np.ndarray], obs: Tensor, trained: Tensor
    ) -> tuple[Tensor, Tensor, Tensor]:
        """(advantages, returns, values) (n, T): GAE, the lambda-returns and the critic's values."""
        cfg = self.config
        value = self._values(obs)
        reward, discount = self._tensor(batch["reward"]), self._tensor(batch["discount"])
        adv = gae(reward, discount, value, trained, cfg.gamma, cfg.lam)
        return adv, adv + value, value

    def _steps(self, batch: Mapping[str, np.ndarray], trained_np: np.ndarray) -> Steps:
        trained = torch.as_tensor(trained_np, device=self.device)
        obs = apply(self.obs_norm, self._raw_obs(batch))
        adv, ret, value = self._advantages(batch, obs, trained)
        adv, ret = adv[trained], ret[trained]
        if self.config.normalize_advantages and adv.numel() > 1:
            std = adv.std(unbiased=False)
            if std > 0:
                adv = (adv - adv.mean()) / std
        action = self._tensor(batch["action"], torch.int64 if self.discrete else torch.float32)[trained]
        out = Steps(
            obs=obs[trained],
            action=action,
            logp=self._tensor(batch["logp"])[trained],
            adv=adv,
            ret=ret,
            value=value[trained],
        )
        for name in ("logits", "loc", "scale"):
            if name in batch:
                out[name] = self._tensor(batch[name])[trained]
        return out

    def _train_actor(self, steps: Steps) -> dict[str, float]:
        raise NotImplementedError

    def _minibatches(self, size: int) -> Iterator[np.ndarray | slice]:
        """One pass over ``size`` steps: the whole batch, or shuffled minibatches of ``minibatch_size``."""
        mb = self.config.minibatch_size
        if mb is None or mb >= size:
            yield slice(None)
            return
        order = self.rng.permutation(size)
        for lo in range(0, size, mb):
            yield order[lo : lo + mb]

    def _step(self, opt: torch.optim.Optimizer, loss: Tensor, params: Any) -> None:
        opt.zero_grad()
        loss.backward()
        if self.config.gradient_clip is not None:
            nn.utils.clip_grad_norm_(params, self.config.gradient_clip)
        opt.step()

    def _critic_loss(self, steps: Steps, idx: np.ndarray | slice) -> Tensor:
        return (self.critic(steps["obs"][idx]) - steps["ret"][idx]).pow(2).mean()

    def _train_critic(self, steps: Steps) -> dict[str, float]:
        """``critic_iterations`` passes of mean-squared regression on the returns (Tonic's ``VRegression``)."""
        losses = []
        for _ in range(self.config.critic_iterations):
            for idx in self._minibatches(steps.size):
                loss = self._critic_loss(steps, idx)
                self._step(self.critic_opt, loss, self.critic.parameters())
                losses.append(loss.item())
        with torch.no_grad():
            value = float(self.critic(steps["obs"]).mean())
        return {"critic_loss": float(np.mean(losses)), "value_mean": value}

    # ------------------------------------------------------------------------------------------ seam

    def invalid_items(self, batch: Mapping[str, np.ndarray]) -> tuple[np.ndarray | None, str | None]:
        rules = [finite(name) for name in batch if name != "action"]
        if self.discrete:
            assert self.spec.num_actions is not None
            rules.append(in_range("action", 0, self.spec.num_actions - 1))
        else:
            rules.append(finite("action"))
        return invalid_items(batch, rules)

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        return policy_tensors(self.actor, self.obs_norm, self.steps)

    def policy_modules(self) -> dict[str, nn.Module]:
        """The live network the policy acts with, under its :meth:`policy_state_dict` prefix."""
        return {"actor": self.actor}

    def state_dict(self) -> dict[str, torch.Tensor]:
        return learner_state(self._nets(), self._optimizers(), self.steps)

    def load_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        self.steps = load_learner_state(d, self._nets(), self._optimizers, self._make_optimizers, "checkpoint")
