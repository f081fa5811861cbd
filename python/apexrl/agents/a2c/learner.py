"""A2C's learner: one step of the stochastic policy gradient ``-mean(A log pi(a|s))`` on the whole popped batch
(Tonic's ``StochasticPolicyGradient``), then the shared critic regression."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from apexrl.agents.onpolicy.learner import OnPolicyLearner, Steps
from apexrl.agents.onpolicy.nets import entropy, log_prob

if TYPE_CHECKING:
    from apexrl.agents.a2c.config import A2CConfig

__all__ = ["A2CLearner"]


class A2CLearner(OnPolicyLearner):
    config: A2CConfig
    actor_metrics = ("actor_loss", "kl", "entropy")

    def _make_optimizers(self) -> None:
        super()._make_optimizers()
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=self.config.actor_lr)

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super()._optimizers(), "actor": self.actor_opt}

    def _train_actor(self, steps: Steps) -> dict[str, float]:
        if bool((steps["adv"] == 0).all()):  # nothing to learn from (Tonic skips the step too)
            return dict(actor_loss=0.0, kl=0.0, entropy=0.0)
        dist = self.actor(steps["obs"])
        logp = log_prob(dist, steps["action"])
        ent = entropy(dist)
        loss = -(steps["adv"] * logp).mean() - self.config.entropy_coeff * ent
        self._step(self.actor_opt, loss, self.actor.parameters())
        kl = float((steps["logp"] - logp.detach()).mean())
        return dict(actor_loss=loss.item(), kl=kl, entropy=ent.item())
