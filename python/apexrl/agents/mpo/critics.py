"""The two critics MPO and DMPO differ by: what the critic outputs, its loss and priority, the values the E-step
weighs. Both bootstrap from N actions a'_j ~ pi_target(s') valued by the target critic (``out_next``, the target
critic's outputs stacked ``(N, B, ...)``), which are the E-step's samples too.

MPO (:class:`ScalarCritic`, DPG's critic Q(s, a))::

    y = R + D * mean_j Q'(s', a'_j)          delta = y - Q(s, a)
    per-item loss delta^2 / 2                priority |delta|

DMPO (:class:`CategoricalCritic`, D4PG's categorical critic, Acme's DMPO)::

    p'  = mean_j softmax(Z'(s', a'_j))       the mixture of the N next-state distributions
    m   = project(R + D * z, p')             onto the atoms (D4PG's projection)
    per-item loss CE(m, Z(s, a))             priority KL(m || p(s, a)) (D4PG's)

Each gives the E-step's values ``(N, B)``: Q'(s', a'_j), or the mean of Z'(s', a'_j).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

import torch
from torch import Tensor, nn

from apexrl.agents.d4pg import D4PGCritic, categorical_projection, cross_entropy, entropy, support
from apexrl.agents.dpg import DPGCritic

if TYPE_CHECKING:
    from apexrl.agents.config import D4PGConfig
    from apexrl.agents.mpo.config import DMPOConfig, MPOConfig

__all__ = ["CategoricalCritic", "CriticKind", "ScalarCritic"]


class CriticKind(Protocol):
    """How an MPO learner builds, trains and reads its critic."""

    def build(self, obs_dim: int, action_dim: int) -> nn.Module:
        """The critic network (called twice with the same generator state for online and target)."""
        ...

    def values(self, out: Tensor) -> Tensor:
        """Q from the critic's outputs: shape ``out.shape[:-1]`` for logits, ``out.shape`` for values."""
        ...

    def td(self, out: Tensor, out_next: Tensor, reward: Tensor, discount: Tensor) -> tuple[Tensor, Tensor]:
        """``(per-item loss (B,), per-item priority (B,) without the eps)`` from the online critic's outputs at
        (s, a) and the target critic's at (s', a'_j) ``(N, B, ...)``."""
        ...


class ScalarCritic:
    """MPO's critic: DPG's Q(s, a) (module docstring)."""

    def __init__(self, config: MPOConfig):
        self.config = config

    def build(self, obs_dim: int, action_dim: int) -> nn.Module:
        return DPGCritic(obs_dim, action_dim, cast("tuple[int, int]", self.config.critic_hidden))

    def values(self, out: Tensor) -> Tensor:
        return out

    def td(self, out: Tensor, out_next: Tensor, reward: Tensor, discount: Tensor) -> tuple[Tensor, Tensor]:
        delta = reward + discount * out_next.detach().mean(dim=0) - out
        return 0.5 * delta.square(), delta.detach().abs()


class CategoricalCritic:
    """DMPO's critic: D4PG's categorical Z(s, a) on ``num_atoms`` atoms of [v_min, v_max] (module docstring)."""

    def __init__(self, config: DMPOConfig):
        self.config = config

    def build(self, obs_dim: int, action_dim: int) -> nn.Module:
        # D4PGCritic reads num_atoms, v_min and v_max, which DMPOConfig has under the same names.
        d4pg_like = cast("D4PGConfig", self.config)
        return D4PGCritic(obs_dim, action_dim, cast("tuple[int, int]", self.config.critic_hidden), d4pg_like)

    def _z(self, like: Tensor) -> Tensor:
        return support(cast("D4PGConfig", self.config), like.device)

    def values(self, out: Tensor) -> Tensor:
        return (torch.softmax(out, dim=-1) * self._z(out)).sum(dim=-1)

    def td(self, out: Tensor, out_next: Tensor, reward: Tensor, discount: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            mixture = torch.softmax(out_next, dim=-1).mean(dim=0)
            target = categorical_projection(reward, discount, mixture, self._z(out))
        ce = cross_entropy(target, out)
        return ce, (ce.detach() - entropy(target)).clamp_min(0.0)
