"""The actor's side of the on-policy agents: a stochastic policy that hands each step's extras to its adder.

``act_batch_extras(obs, first)`` samples one action per environment from the local actor network and returns,
per environment, the extras its ``SequenceAdder`` stores beside the step: ``logp`` (log pi_behaviour(a|s), one
number), ``version`` (the learner's update count of the weights it acted with, so the learner measures the
policy lag) and, for an agent whose loss needs the behaviour distribution itself (``params=True``: TRPO's KL,
IMPALA), its ``logits`` or ``loc`` and ``scale``. Evaluation (``explore=False``) takes the most likely action or
the Gaussian's mean.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from apexrl.agents.common import check_tensors, load_module_tensors, module_layout, module_tensors
from apexrl.agents.normalize import apply, load_norm, make_obs_norm, norm_layout, norm_tensors
from apexrl.agents.onpolicy.nets import Actor, distribution_params, log_prob

if TYPE_CHECKING:
    from apexrl.agents.onpolicy.config import OnPolicyConfig
    from apexrl.envs import EnvSpec

__all__ = ["OnPolicyPolicy", "VERSION", "check_vector_env", "obs_dim"]

VERSION = "version"
"""The weights' entry holding the learner's update count they come from (int64 scalar)."""


def obs_dim(spec: EnvSpec) -> int:
    return int(np.prod(spec.obs_shape))


def check_vector_env(name: str, spec: EnvSpec) -> None:
    """The on-policy agents' MLPs take vector observations (discrete or continuous actions)."""
    if len(spec.obs_shape) != 1:
        raise ValueError(f"{name} needs vector observations (an MLP); {spec.name} has shape {spec.obs_shape}")


class OnPolicyPolicy:
    """One policy for the K environments of an actor (K = 1: the evaluation process's)."""

    def __init__(self, spec: EnvSpec, config: OnPolicyConfig, num_envs: int, seed: int, params: bool = False):
        self.spec, self.params = spec, params
        torch.manual_seed(seed)
        self.actor = Actor(obs_dim(spec), config.hidden, spec.num_actions, spec.action_dim)
        self.obs_norm = make_obs_norm(obs_dim(spec), config.obs_norm, torch.device("cpu"))
        self.version = 0
        self.explorations = [1.0] * num_envs  # every environment samples from the policy itself
        self.generator = torch.Generator().manual_seed(seed)

    @property
    def exploration(self) -> float:
        return 1.0

    def _dist(self, obs: np.ndarray) -> Any:
        x = torch.as_tensor(np.asarray(obs, np.float32).reshape(len(obs), -1))
        return self.actor(apply(self.obs_norm, x))

    def _sample(self, dist: Any) -> torch.Tensor:
        if self.actor.discrete:
            return torch.multinomial(dist.probs, 1, generator=self.generator).squeeze(-1)
        return dist.loc + dist.scale * torch.randn(dist.loc.shape, generator=self.generator)

    def _actions(self, a: torch.Tensor) -> list[Any]:
        if self.actor.discrete:
            return [int(x) for x in a]
        return list(a.numpy().astype(np.float32))

    @torch.inference_mode()
    def act_batch_extras(self, obs: np.ndarray, first: Sequence[bool]) -> tuple[list[Any], list[dict[str, Any]]]:
        del first  # no state across steps
        dist = self._dist(obs)
        a = self._sample(dist)
        logp = log_prob(dist, a).numpy().astype(np.float32)
        params = {k: v.numpy().astype(np.float32) for k, v in distribution_params(dist).items()} if self.params else {}
        version = np.int64(self.version)
        extras = [{"logp": logp[j], VERSION: version, **{k: v[j] for k, v in params.items()}} for j in range(len(logp))]
        return self._actions(a), extras

    @torch.inference_mode()
    def act_batch(self, obs: np.ndarray, explore: bool = True) -> list[Any]:
        dist = self._dist(obs)
        if explore:
            return self._actions(self._sample(dist))
        greedy = dist.probs.argmax(-1) if self.actor.discrete else dist.loc
        return self._actions(greedy)

    def act(self, obs: np.ndarray, explore: bool = True) -> Any:
        return self.act_batch(np.asarray(obs)[None], explore=explore)[0]

    def policy_state_dict(self) -> dict[str, torch.Tensor]:
        return policy_tensors(self.actor, self.obs_norm, self.version)

    def load_policy_state_dict(self, d: Mapping[str, torch.Tensor]) -> None:
        expected = {**module_layout("actor", self.actor), **norm_layout(self.obs_norm)}
        expected[VERSION] = torch.empty((), dtype=torch.int64, device="meta")
        check_tensors(expected, d, "policy weights")
        load_module_tensors("actor", self.actor, d)
        load_norm(self.obs_norm, d)
        self.version = int(d[VERSION])


def policy_tensors(actor: Actor, obs_norm: Any, version: int) -> dict[str, torch.Tensor]:
    """The weights an actor loads: the actor network, the observation statistics, the version."""
    return {
        **module_tensors("actor", actor),
        **norm_tensors(obs_norm),
        VERSION: torch.tensor(version, dtype=torch.int64),
    }
