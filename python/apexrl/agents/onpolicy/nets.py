"""The actor-critic networks of the on-policy agents, as Tonic's ``a2c.default_model``: separate actor and critic
MLPs (64, 64) with tanh, a categorical head on logits for discrete actions or, for continuous ones, a Gaussian
with a tanh mean and one learned scale per action dimension shared by every state (Tonic's
``DetachedScaleGaussianPolicyHead``: ``softplus(log_scale)`` clamped to [1e-4, 1], ``log_scale`` starting at 0).
"""

from __future__ import annotations

import itertools

import torch
from torch import Tensor, nn
from torch.distributions import Categorical, Distribution, Normal

__all__ = ["Actor", "Critic", "distribution_params", "entropy", "log_prob", "make_distribution"]

SCALE_MIN, SCALE_MAX = 1e-4, 1.0


def _mlp(sizes: tuple[int, ...]) -> nn.Sequential:
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(sizes):
        layers += [nn.Linear(a, b), nn.Tanh()]
    return nn.Sequential(*layers)


class Actor(nn.Module):
    """``forward(obs) -> distribution``: Categorical over ``num_actions`` or a diagonal Normal of ``action_dim``."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...], num_actions: int | None, action_dim: int | None):
        super().__init__()
        self.discrete = num_actions is not None
        self.torso = _mlp((obs_dim, *hidden))
        width = hidden[-1] if hidden else obs_dim
        self.head: nn.Module
        if self.discrete:
            assert num_actions is not None
            self.head = nn.Linear(width, num_actions)
        else:
            assert action_dim is not None
            self.head = nn.Sequential(nn.Linear(width, action_dim), nn.Tanh())
            self.log_scale = nn.Parameter(torch.zeros(action_dim))

    def forward(self, obs: Tensor) -> Distribution:
        out = self.head(self.torso(obs))
        if self.discrete:
            return Categorical(logits=out)
        scale = (nn.functional.softplus(self.log_scale) + 1e-8).clamp(SCALE_MIN, SCALE_MAX)
        return Normal(out, scale.expand_as(out))

    @torch.no_grad()
    def greedy(self, obs: Tensor) -> Tensor:
        """The evaluation action: the most likely action, or the Gaussian's mean."""
        dist = self(obs)
        return dist.probs.argmax(-1) if isinstance(dist, Categorical) else dist.mean


class Critic(nn.Module):
    """``forward(obs) -> V(obs)`` (one value per observation)."""

    def __init__(self, obs_dim: int, hidden: tuple[int, ...]):
        super().__init__()
        self.torso = _mlp((obs_dim, *hidden))
        self.head = nn.Linear(hidden[-1] if hidden else obs_dim, 1)

    def forward(self, obs: Tensor) -> Tensor:
        return self.head(self.torso(obs)).squeeze(-1)


def log_prob(dist: Distribution, action: Tensor) -> Tensor:
    """log pi(a|s), summed over a continuous action's dimensions (one number per action)."""
    lp = dist.log_prob(action)
    return lp if isinstance(dist, Categorical) else lp.sum(-1)


def entropy(dist: Distribution) -> Tensor:
    """The mean entropy of a batch of distributions (a continuous action's summed over its dimensions)."""
    e = dist.entropy()
    return (e if isinstance(dist, Categorical) else e.sum(-1)).mean()


def distribution_params(dist: Distribution) -> dict[str, Tensor]:
    """What the behaviour policy's distribution is made of, for a loss that needs it (TRPO's KL, IMPALA):
    ``logits`` (…, A), or ``loc`` and ``scale`` (…, D)."""
    if isinstance(dist, Categorical):
        return {"logits": dist.logits}
    assert isinstance(dist, Normal)
    return {"loc": dist.loc, "scale": dist.scale}


def make_distribution(params: dict[str, Tensor]) -> Distribution:
    """The distribution :func:`distribution_params` describes."""
    if "logits" in params:
        return Categorical(logits=params["logits"])
    return Normal(params["loc"], params["scale"])
