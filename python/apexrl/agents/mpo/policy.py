"""MPO's and DMPO's actor side: act by sampling the Gaussian policy, score transitions with the local critic."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import numpy as np
import torch
from torch import Tensor, nn

from apexrl.agents.common import (
    check_batch,
    check_tensors,
    finite_priorities,
    load_module_tensors,
    module_layout,
    module_tensors,
)
from apexrl.agents.mpo.config import MPOConfig
from apexrl.agents.mpo.critics import CriticKind, ScalarCritic
from apexrl.agents.mpo.learner import build_networks, sample_next
from apexrl.agents.normalize import apply, load_norm, make_obs_norm, norm_layout, norm_tensors
from apexrl.agents.td3 import _f32, batch_tensors, continuous_dims
from apexrl.replay.wire.codec import TransitionSpec

if TYPE_CHECKING:
    from apexrl.envs import EnvSpec

__all__ = ["MPOPolicy"]


class MPOPolicy:
    """An actor's local MPO (or DMPO) policy: ``clip(a, -1, 1)``, a drawn from ``N(mean(s), std(s)^2)``, or
    ``clip(mean(s), -1, 1)`` in evaluation (Acme's evaluator: the mean, clipped to the bounds). Actions are
    clipped because the environment takes actions in bounds and the replay keeps what the environment took (Acme
    clips in its environment wrapper); the learner's action penalisation keeps the policy's samples inside.

    Args:
      env_spec, config: as for the learner (same networks).
      num_envs: environments of a vectorised actor (``act_batch``).
      seed: initial weights (until the first ``load_policy_state_dict``) and the policy's draws.
      device: torch device of the local networks.
      kind: the critic (MPO's scalar one by default; DMPO's categorical one).
    """

    label = "MPO"

    def __init__(
        self,
        env_spec: EnvSpec,
        config: MPOConfig | None = None,
        *,
        num_envs: int = 1,
        seed: int = 0,
        device: str | torch.device = "cpu",
        kind: CriticKind | None = None,
    ):
        self.config = config = config or MPOConfig()
        self.kind = kind or ScalarCritic(config)
        self.device = torch.device(device)
        obs_dim, action_dim = continuous_dims(env_spec, self.label)
        self.transition_spec = TransitionSpec.dpg(obs_dim, action_dim)
        self.policy, self.critic = build_networks(env_spec, config, self.kind, seed, self.device, self.label)
        self.policy.requires_grad_(False)
        self.critic.requires_grad_(False)
        self.obs_norm = make_obs_norm(obs_dim, config.obs_norm, self.device)
        self.num_envs = int(num_envs)
        self.noise = torch.Generator(device=self.device).manual_seed(seed)

    exploration = 1.0
    """Every MPO actor samples from the same policy: one exploration level for all (episodes.csv)."""

    @property
    def explorations(self) -> list[float]:
        return [1.0] * self.num_envs

    def _actions(self, obs: np.ndarray, explore: bool) -> np.ndarray:
        mean, std = self.policy(apply(self.obs_norm, _f32(obs, self.device)))
        action = mean + std * torch.randn(mean.shape, generator=self.noise, device=self.device) if explore else mean
        return action.clamp(-1.0, 1.0).cpu().numpy().astype(np.float32)

    @torch.inference_mode()
    def act_batch(self, obs: np.ndarray, explore: bool = True) -> list[np.ndarray]:
        """Actions for stacked observations in one forward pass (each environment its own draw)."""
        return list(self._actions(np.asarray(obs), explore))

    @torch.inference_mode()
    def act(self, obs: np.ndarray, explore: bool = True) -> np.ndarray:
        """Action for one observation: float32 ``(action_dim,)`` in [-1, 1]."""
        return self._actions(np.asarray(obs)[None], explore)[0]

    @torch.inference_mode()
    def initial_priorities(self, batch: Mapping[str, np.ndarray]) -> np.ndarray:
        """The learner's priority with the local policy and critic standing in for the targets (which they are:
        the learner sends its target networks), from ``num_samples`` draws at each s' (float64)."""
        check_batch(batch, self.transition_spec.names)
        obs, action, reward, discount, next_obs = batch_tensors(batch, self.device)
        obs, next_obs = apply(self.obs_norm, obs), apply(self.obs_norm, next_obs)
        *_, sampled = sample_next(self.policy, self.critic, self.kind, next_obs, self.config.num_samples, self.noise)
        _, priority = self.kind.td(self.critic(obs, action), sampled, reward, discount)
        return finite_priorities(priority, self.config.priority_eps)

    def _parts(self) -> dict[str, nn.Module]:
        return {"policy": self.policy, "critic": self.critic}

    def policy_state_dict(self) -> dict[str, Tensor]:
        out: dict[str, Tensor] = {}
        for name, net in self._parts().items():
            out.update(module_tensors(name, net))
        return {**out, **norm_tensors(self.obs_norm)}

    def load_policy_state_dict(self, d: Mapping[str, Tensor]) -> None:
        """Load the learner's ``policy_state_dict``; ValueError naming wrong names/shapes changes nothing."""
        expected: dict[str, Tensor] = dict(norm_layout(self.obs_norm))
        for name, net in self._parts().items():
            expected.update(module_layout(name, net))
        check_tensors(expected, d, f"{self.label} policy weights")
        for name, net in self._parts().items():
            load_module_tensors(name, net, d)
        load_norm(self.obs_norm, d)
