"""TRPO's learner: one trust-region step of the actor per popped batch (:mod:`~apexrl.agents.trpo.optimizer`)
on the surrogate ``-mean(exp(logp - logp_behaviour) A)`` under ``mean KL(pi || pi_behaviour) <= max_kl``, the
behaviour distribution rebuilt from the parameters the actors stored (Tonic's ``TrustRegionPolicyGradient``),
then the shared critic regression."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from torch import Tensor

from apexrl.agents.onpolicy.learner import OnPolicyLearner, Steps
from apexrl.agents.onpolicy.nets import entropy, log_prob, make_distribution
from apexrl.agents.trpo.optimizer import trust_region_step

if TYPE_CHECKING:
    from apexrl.agents.trpo.config import TRPOConfig

__all__ = ["TRPOLearner"]


class TRPOLearner(OnPolicyLearner):
    config: TRPOConfig
    actor_metrics = ("actor_loss", "kl", "step_fraction", "backtrack_steps")

    def _train_actor(self, steps: Steps) -> dict[str, float]:
        cfg = self.config
        if bool((steps["adv"] == 0).all()):  # nothing to learn from (Tonic skips the step too)
            return dict(actor_loss=0.0, kl=0.0, step_fraction=0.0, backtrack_steps=0.0)
        names = ("logits",) if self.discrete else ("loc", "scale")
        behaviour = make_distribution({n: steps[n] for n in names})

        def loss_fn() -> Tensor:
            dist = self.actor(steps["obs"])
            ratio = torch.exp(log_prob(dist, steps["action"]) - steps["logp"])
            return -(ratio * steps["adv"]).mean() - cfg.entropy_coeff * entropy(dist)

        def kl_fn() -> Tensor:
            kl = torch.distributions.kl_divergence(self.actor(steps["obs"]), behaviour)
            return (kl if self.discrete else kl.sum(-1)).mean()

        result = trust_region_step(
            loss_fn,
            kl_fn,
            list(self.actor.parameters()),
            cg_steps=cfg.cg_steps,
            damping=cfg.damping,
            max_kl=cfg.max_kl,
            backtrack_steps=cfg.backtrack_steps,
            backtrack_coeff=cfg.backtrack_coeff,
        )
        return dict(
            actor_loss=result.loss,
            kl=result.kl,
            step_fraction=result.fraction,
            backtrack_steps=float(result.trials),
        )
