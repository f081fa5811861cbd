"""The two critics MPO and DMPO differ by: what the critic outputs, its loss and priority, the values the E-step
weighs. Both bootstrap from N actions a'_j ~ pi_target(s') valued by the target critic (``sampled``: the target
critic's read of the N samples at each state, ``(N, B, ...)``), which are the E-step's samples too.

MPO (:class:`ScalarCritic`, DPG's critic Q(s, a)); ``sampled`` holds Q'(s', a'_j)::

    y = R + D * mean_j Q'(s', a'_j)          delta = y - Q(s, a)
    per-item loss delta^2 / 2                priority |delta|

DMPO (:class:`CategoricalCritic`, D4PG's categorical critic, Acme's DMPO); ``sampled`` holds the probabilities
softmax(Z'(s', a'_j)), computed once for the bootstrap and the E-step's values::

    p'  = mean_j softmax(Z'(s', a'_j))       the mixture of the N next-state distributions
    m   = project(R + D * z, p')             onto the atoms (D4PG's projection)
    per-item loss CE(m, Z(s, a))             priority KL(m || p(s, a)) (D4PG's)

Each gives the E-step's values ``(N, B)``: Q'(s', a'_j), or the mean of Z'(s', a'_j).

Both torsos take the action at their second layer (``tanh(W1 [tanh(W0 s), a] + b1)``), so the N samples at one
state share ``tanh(W0 s)`` and its product with W1's observation columns: :func:`sampled_head` computes those
once per state and only ``a'_j``'s columns (``action_dim`` wide) per sample, the same sums as the critic's forward
over the N-fold tiled states (Acme and Tonic tile the states; their critics concatenate s and a at the input).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from apexrl.agents.d4pg import D4PGCritic, categorical_projection, cross_entropy, entropy, support
from apexrl.agents.dpg import DPGCritic

if TYPE_CHECKING:
    from apexrl.agents.config import D4PGConfig
    from apexrl.agents.mpo.config import DMPOConfig, MPOConfig

__all__ = ["CategoricalCritic", "CriticKind", "ScalarCritic", "sampled_head", "tanh_by_sigmoid_"]


def tanh_by_sigmoid_(x: Tensor) -> Tensor:
    """``tanh(x) = 2 sigmoid(2x) - 1`` in place (no autograd): torch's CPU tanh takes about twice (loaded) to four
    times (idle) its sigmoid's time on 2-core AVX2 machines, and the N x B x hidden activation of the sampled actions
    is the largest elementwise op of an update; the two forms differ by float rounding (~1e-7)."""
    return torch.sigmoid_(x.mul_(2.0)).mul_(2.0).sub_(1.0)


def sampled_head(critic: DPGCritic | D4PGCritic, obs: Tensor, actions: Tensor) -> Tensor:
    """The output layer of ``critic`` ``(N, B, out_features)`` at ``obs`` ``(B, obs_dim)`` for each of ``actions``
    ``(N, B, action_dim)``, as ``critic(obs, actions[j])`` computes it for every j but with the observation's part
    of the first two layers computed once per state (module docstring). ``critic``: DPG's or D4PG's
    (``obs_layer``, ``joint_layer``, ``out``); call under ``torch.no_grad``."""
    hidden = critic.obs_layer.out_features
    joint = critic.joint_layer
    per_state = F.linear(torch.tanh(critic.obs_layer(obs)), joint.weight[:, :hidden], joint.bias)
    return critic.out(tanh_by_sigmoid_(F.linear(actions, joint.weight[:, hidden:]).add_(per_state)))


class CriticKind(Protocol):
    """How an MPO learner builds, trains and reads its critic."""

    def build(self, obs_dim: int, action_dim: int) -> nn.Module:
        """The critic network (called twice with the same generator state for online and target)."""
        ...

    def sampled(self, critic: nn.Module, obs: Tensor, actions: Tensor) -> Tensor:
        """``critic``'s read ``(N, B, ...)`` of N actions ``actions`` ``(N, B, action_dim)`` at each state ``obs``
        ``(B, obs_dim)`` (:func:`sampled_head`), as :meth:`sampled_values` and :meth:`td` take it (no gradient)."""
        ...

    def sampled_values(self, sampled: Tensor) -> Tensor:
        """The E-step's values ``(N, B)`` from :meth:`sampled`'s read."""
        ...

    def values(self, out: Tensor) -> Tensor:
        """Q from the critic's outputs: shape ``out.shape[:-1]`` for logits, ``out.shape`` for values."""
        ...

    def td(self, out: Tensor, sampled: Tensor, reward: Tensor, discount: Tensor) -> tuple[Tensor, Tensor]:
        """``(per-item loss (B,), per-item priority (B,) without the eps)`` from the online critic's outputs at
        (s, a) and the target critic's read of (s', a'_j) (:meth:`sampled`)."""
        ...


class ScalarCritic:
    """MPO's critic: DPG's Q(s, a) (module docstring)."""

    def __init__(self, config: MPOConfig):
        self.config = config

    def build(self, obs_dim: int, action_dim: int) -> nn.Module:
        return DPGCritic(obs_dim, action_dim, cast("tuple[int, int]", self.config.critic_hidden))

    def sampled(self, critic: nn.Module, obs: Tensor, actions: Tensor) -> Tensor:
        return sampled_head(cast(DPGCritic, critic), obs, actions).squeeze(-1)

    def sampled_values(self, sampled: Tensor) -> Tensor:
        return sampled

    def values(self, out: Tensor) -> Tensor:
        return out

    def td(self, out: Tensor, sampled: Tensor, reward: Tensor, discount: Tensor) -> tuple[Tensor, Tensor]:
        delta = reward + discount * sampled.detach().mean(dim=0) - out
        return 0.5 * delta.square(), delta.detach().abs()


class CategoricalCritic:
    """DMPO's critic: D4PG's categorical Z(s, a) on ``num_atoms`` atoms of [v_min, v_max] (module docstring)."""

    def __init__(self, config: DMPOConfig):
        self.config = config
        self._support = support(cast("D4PGConfig", config))

    def build(self, obs_dim: int, action_dim: int) -> nn.Module:
        # D4PGCritic reads num_atoms, v_min and v_max, which DMPOConfig has under the same names.
        d4pg_like = cast("D4PGConfig", self.config)
        return D4PGCritic(obs_dim, action_dim, cast("tuple[int, int]", self.config.critic_hidden), d4pg_like)

    def sampled(self, critic: nn.Module, obs: Tensor, actions: Tensor) -> Tensor:
        return torch.softmax(sampled_head(cast(D4PGCritic, critic), obs, actions), dim=-1)

    def _z(self, like: Tensor) -> Tensor:
        if self._support.device != like.device:
            self._support = self._support.to(like.device)
        return self._support

    def sampled_values(self, sampled: Tensor) -> Tensor:
        return (sampled * self._z(sampled)).sum(dim=-1)

    def values(self, out: Tensor) -> Tensor:
        return self.sampled_values(torch.softmax(out, dim=-1))

    def td(self, out: Tensor, sampled: Tensor, reward: Tensor, discount: Tensor) -> tuple[Tensor, Tensor]:
        with torch.no_grad():
            target = categorical_projection(reward, discount, sampled.mean(dim=0), self._z(out))
        ce = cross_entropy(target, out)
        return ce, (ce.detach() - entropy(target)).clamp_min(0.0)
