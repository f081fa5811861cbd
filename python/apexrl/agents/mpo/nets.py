"""MPO's policy network: a diagonal Gaussian on a layer-normed torso (Acme's ``LayerNormMLP`` and
``MultivariateNormalDiagHead``)::

    h     = tanh(LayerNorm(W0 s)),  then h = elu(Wi h) for each further layer
    mean  = Wm h                                         (no tanh: the mean may leave [-1, 1]; the action
                                                          penalisation pulls its samples back inside)
    std   = softplus(Ws h) * init_scale / softplus(0) + min_scale

The heads start with weights of std sqrt(1e-4 / fan_in) (Acme's ``VarianceScaling(1e-4)``) and zero biases, so
every state starts at mean ~0 and std ~init_scale. The critics are DPG's (MPO) and D4PG's (DMPO), imported.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apexrl.nets import MLP

__all__ = ["GaussianPolicy"]

_HEAD_VARIANCE_SCALE = 1e-4


class GaussianPolicy(nn.Module):
    """``forward(obs) -> (mean, std)``, each ``(B, action_dim)``, std > 0 (module docstring)."""

    def __init__(self, obs_dim: int, action_dim: int, hidden: tuple[int, ...], init_scale: float, min_scale: float):
        super().__init__()
        self.first = nn.Linear(obs_dim, hidden[0])
        self.norm = nn.LayerNorm(hidden[0])
        self.rest = MLP(hidden[0], hidden[1:], activation=nn.ELU)
        self.mean = nn.Linear(self.rest.out_features, action_dim)
        self.scale = nn.Linear(self.rest.out_features, action_dim)
        self.scale_factor = init_scale / math.log(2.0)  # softplus(0) = log 2
        self.min_scale = min_scale

    def forward(self, obs: Tensor) -> tuple[Tensor, Tensor]:
        h = self.rest(torch.tanh(self.norm(self.first(obs))))
        return self.mean(h), F.softplus(self.scale(h)) * self.scale_factor + self.min_scale

    def reset_from(self, generator: torch.Generator) -> None:
        """LayerNorm to identity (``build_seeded`` only draws Linear layers), the heads near zero."""
        with torch.no_grad():
            self.norm.weight.fill_(1.0)
            self.norm.bias.zero_()
            for head in (self.mean, self.scale):
                std = math.sqrt(_HEAD_VARIANCE_SCALE / head.in_features)
                head.weight.normal_(0.0, std, generator=generator).clamp_(-2 * std, 2 * std)
                head.bias.zero_()
