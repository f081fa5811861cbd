"""PPO's learner: the clipped ratio objective (Tonic's ``ClippedRatio``) over the popped batch's trained steps."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor

from apexrl.agents.onpolicy.learner import OnPolicyLearner, Steps
from apexrl.agents.onpolicy.nets import entropy, log_prob

if TYPE_CHECKING:
    from apexrl.agents.ppo.config import PPOConfig

__all__ = ["PPOLearner", "clipped_objective"]


def clipped_objective(logp: Tensor, logp_behaviour: Tensor, adv: Tensor, clip: float) -> tuple[Tensor, Tensor]:
    """``mean(min(rho A, clip(rho, 1 - clip, 1 + clip) A))`` with ``rho = exp(logp - logp_behaviour)``, and the
    fraction of steps whose ratio lies outside the clip range."""
    ratio = torch.exp(logp - logp_behaviour)
    surrogate = torch.min(ratio * adv, ratio.clamp(1 - clip, 1 + clip) * adv)
    clipped = (ratio > 1 + clip) | (ratio < 1 - clip)
    return surrogate.mean(), clipped.float().mean()


class PPOLearner(OnPolicyLearner):
    config: PPOConfig
    actor_metrics = ("actor_loss", "kl", "clip_fraction", "entropy", "actor_iterations")

    def _make_optimizers(self) -> None:
        super()._make_optimizers()
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=self.config.actor_lr)

    def _optimizers(self) -> dict[str, torch.optim.Optimizer]:
        return {**super()._optimizers(), "actor": self.actor_opt}

    def _train_actor(self, steps: Steps) -> dict[str, float]:
        """Up to ``critic_iterations`` passes (Tonic runs actor and critic in one loop of ``batch_iterations``),
        stopping after the pass whose KL from the behaviour policy exceeds ``kl_threshold``."""
        cfg = self.config
        losses, kls, clips, entropies, passes = [], [], [], [], 0
        if bool((steps["adv"] == 0).all()):  # nothing to learn from (Tonic skips the step too)
            return dict(actor_loss=0.0, kl=0.0, clip_fraction=0.0, entropy=0.0, actor_iterations=0.0)
        for _ in range(cfg.critic_iterations):
            passes += 1
            for idx in self._minibatches(steps.size):
                dist = self.actor(steps["obs"][idx])
                logp = log_prob(dist, steps["action"][idx])
                objective, clip_fraction = clipped_objective(
                    logp, steps["logp"][idx], steps["adv"][idx], cfg.ratio_clip
                )
                ent = entropy(dist)
                loss = -objective - cfg.entropy_coeff * ent
                self._step(self.actor_opt, loss, self.actor.parameters())
                with torch.no_grad():
                    kls.append(float((steps["logp"][idx] - logp).mean()))
                losses.append(loss.item())
                clips.append(float(clip_fraction))
                entropies.append(ent.item())
            if kls[-1] > cfg.kl_threshold:
                break
        return dict(
            actor_loss=float(np.mean(losses)),
            kl=kls[-1],
            clip_fraction=float(np.mean(clips)),
            entropy=float(np.mean(entropies)),
            actor_iterations=float(passes),
        )

    def _critic_loss(self, steps: Steps, idx: np.ndarray | slice) -> Tensor:
        if self.config.value_clip is None:
            return super()._critic_loss(steps, idx)
        value, old, ret = self.critic(steps["obs"][idx]), steps["value"][idx], steps["ret"][idx]
        clipped = old + (value - old).clamp(-self.config.value_clip, self.config.value_clip)
        return torch.max((value - ret).pow(2), (clipped - ret).pow(2)).mean()
