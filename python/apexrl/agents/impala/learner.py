"""IMPALA's learner: per popped batch, one Adam step on Acme's IMPALA loss over the trained steps::

    -mean(pg_adv log pi(a|s)) + baseline_cost 1/2 mean((v_s - V(s))^2) - entropy_cost mean(entropy)

with the V-trace targets ``v_s`` and advantages ``pg_adv`` (:func:`apexrl.agents.onpolicy.returns.vtrace`) of
the learner's policy pi against the behaviour policy mu that acted (the logits or Gaussian the actors stored),
computed without gradient. ``vtrace=False`` sets every ratio to 1 (no correction)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch

from apexrl.agents.normalize import apply
from apexrl.agents.onpolicy.lag import policy_lag
from apexrl.agents.onpolicy.learner import OnPolicyLearner
from apexrl.agents.onpolicy.nets import entropy, log_prob
from apexrl.agents.onpolicy.returns import vtrace

if TYPE_CHECKING:
    from apexrl.agents.impala.config import IMPALAConfig

__all__ = ["IMPALALearner"]


class IMPALALearner(OnPolicyLearner):
    config: IMPALAConfig
    actor_metrics = ("loss", "pg_loss", "rho_mean", "entropy")

    def _make_optimizers(self) -> None:
        params = [*self.actor.parameters(), *self.critic.parameters()]
        self.opt = torch.optim.Adam(params, lr=self.config.lr, betas=(0.0, 0.99))

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {"model": self.opt}

    def update(self, batch: Mapping[str, np.ndarray], weights: np.ndarray) -> tuple[np.ndarray, dict[str, float]]:
        del weights
        cfg = self.config
        trained_np = np.asarray(batch["trained"], bool)
        metrics = policy_lag(self.steps, batch["version"], trained_np)
        if trained_np.any():
            trained = torch.as_tensor(trained_np, device=self.device)
            raw = self._raw_obs(batch)
            n, t = trained.shape
            obs = apply(self.obs_norm, raw).reshape(n * t, -1)
            dist = self.actor(obs)
            action = self._tensor(batch["action"], torch.int64 if self.discrete else torch.float32)
            logp = log_prob(dist, action.reshape(n * t, *action.shape[2:])).reshape(n, t)
            value = self.critic(obs).reshape(n, t)
            log_rho = (logp.detach() - self._tensor(batch["logp"])) if cfg.vtrace else torch.zeros_like(logp)
            log_rho = torch.where(trained, log_rho, torch.zeros_like(log_rho))
            with torch.no_grad():
                vs, pg_adv = vtrace(
                    self._tensor(batch["reward"]),
                    self._tensor(batch["discount"]),
                    value.detach(),
                    trained,
                    log_rho,
                    cfg.gamma,
                    rho_bar=cfg.rho_bar,
                    c_bar=cfg.c_bar,
                    lam=cfg.lam,
                )
            pg_loss = -(pg_adv * logp)[trained].mean()
            critic_loss = 0.5 * (vs - value)[trained].pow(2).mean()
            ent = entropy(dist)  # over every step of the batch; the untrained ones are few
            loss = pg_loss + cfg.baseline_cost * critic_loss - cfg.entropy_cost * ent
            self._step(self.opt, loss, [*self.actor.parameters(), *self.critic.parameters()])
            if self.obs_norm is not None:
                self.obs_norm.update(raw[trained])
            metrics.update(
                loss=loss.item(),
                pg_loss=pg_loss.item(),
                rho_mean=float(torch.exp(log_rho)[trained].clamp(max=cfg.rho_bar).mean()),
                entropy=ent.item(),
                critic_loss=critic_loss.item(),
                value_mean=float(value.detach()[trained].mean()),
            )
        self.steps += 1
        return np.ones(len(trained_np)), metrics
